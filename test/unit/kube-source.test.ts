// The Kubernetes config source against the FAKE API server (no kube-apiserver on these machines): the
// first list, events applied live, this node's pods only, invalid objects refused one by one (their last
// accepted version stays), overlapping pools, dropped watches, 410 Gone after compaction, and the watchdog
// that resumes a watch that stalled silently (from its resourceVersion: no relist).
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { Writable } from 'node:stream';
import { FakeApiServer, kubeconfigFor } from '../lib/fake-apiserver';
import { KubeSource } from '../../daemon/config/kube-source';
import type { ConfigObjects } from '../../daemon/config/objects';
import { makeLogger } from '../../lib/log';

const lines: string[] = [];
const logger = makeLogger({ level: 'info', node: 'n1', stream: new Writable({ write: (c, _e, cb) => (lines.push(String(c)), cb()) }) });
const V = 'tether.dev/v1alpha1';
const pool = (name: string, cidr: string, usage = 'floating') => ({ apiVersion: V, kind: 'AddressPool', metadata: { name }, spec: { usage, ipv4: { cidr } } });
const egress = (name: string, spec: Record<string, unknown> = {}) => ({
  apiVersion: V, kind: 'Egress', metadata: { name, namespace: 'shop' },
  spec: { clients: { podSelector: { matchLabels: { app: 'web' } } }, gateways: { podSelector: { matchLabels: { role: 'gw' } } }, addresses: { pool: 'float' }, ...spec },
});
const pod = (name: string, node: string, labels: Record<string, string>, ready = true) => ({
  apiVersion: 'v1', kind: 'Pod', metadata: { name, namespace: 'shop', labels }, spec: { nodeName: node }, status: { conditions: [{ type: 'Ready', status: ready ? 'True' : 'False' }] },
});

async function setup(watchIdleMs = 150_000) {
  const api = new FakeApiServer('fake-token');
  const url = (await api.listen({ port: 0 }))!;
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tether-kube-'));
  const kubeconfig = path.join(dir, 'kubeconfig');
  fs.writeFileSync(kubeconfig, kubeconfigFor(url));
  api.apply(pool('float', '198.51.100.0/28'));
  api.apply(egress('out'));
  api.apply({ apiVersion: 'v1', kind: 'Node', metadata: { name: 'n1', labels: { 'topology.kubernetes.io/zone': 'a' } } });
  api.apply({ apiVersion: 'v1', kind: 'Node', metadata: { name: 'n2' } });
  api.apply(pod('web', 'n1', { app: 'web' }));
  api.apply(pod('elsewhere', 'n2', { app: 'web' }));
  const src = new KubeSource({ kubeconfig, nodeName: 'n1', logger, watchIdleMs, syncTimeoutMs: 5000, backoffMinMs: 50, backoffMaxMs: 400 });
  const done = async () => {
    await src.stop();
    await api.close();
    fs.rmSync(dir, { recursive: true, force: true });
  };
  return { api, src, done };
}

/** Waits for an update that satisfies `ok` (updates that do not are skipped). */
function updateWhere(src: KubeSource, ok: (c: ConfigObjects) => boolean, timeoutMs = 5000): Promise<ConfigObjects> {
  return new Promise((resolve, reject) => {
    const t = setTimeout(() => {
      src.off('update', on);
      reject(new Error(`no matching update within ${timeoutMs} ms`));
    }, timeoutMs);
    const on = (c: ConfigObjects) => {
      if (!ok(c)) return;
      clearTimeout(t);
      src.off('update', on);
      resolve(c);
    };
    src.on('update', on);
  });
}

test('first list: pools, Egresses, this node only (zone from its label), its pods with readiness', async () => {
  const { src, done } = await setup();
  try {
    const c = await src.start();
    assert.equal(c.pools.map((p) => p.name), ['float']);
    assert.equal(c.others.map((o) => (o.metadata as { name: string }).name), ['out']);
    assert.equal(Object.keys(c.nodes), ['n1']);
    assert.is(c.nodes.n1.zone, 'a');
    assert.equal(c.pods, { 'shop/web': { labels: { app: 'web' }, ready: true, deleting: false } });
  } finally {
    await done();
  }
});

test('events apply live: a label change, a new pool and Egress, a deletion, a terminating pod', async () => {
  const { api, src, done } = await setup();
  try {
    await src.start();
    api.apply({ ...pod('web', 'n1', { app: 'other' }) });
    let c = await updateWhere(src, (x) => x.pods?.['shop/web']?.labels.app === 'other');
    api.apply(pool('float2', '198.51.100.16/28'));
    api.apply(egress('batch', { addresses: { pool: 'float2' } }));
    c = await updateWhere(src, (x) => x.others.length === 2 && x.pools.length === 2);
    api.remove('Egress', 'out', 'shop');
    c = await updateWhere(src, (x) => x.others.length === 1);
    assert.equal(c.others.map((o) => (o.metadata as { name: string }).name), ['batch']);
    const terminating = pod('web', 'n1', { app: 'other' });
    (terminating.metadata as Record<string, unknown>).deletionTimestamp = new Date().toISOString();
    api.apply(terminating);
    c = await updateWhere(src, (x) => !!x.pods?.['shop/web']?.deleting);
    api.remove('Pod', 'web', 'shop');
    c = await updateWhere(src, (x) => !x.pods?.['shop/web']);
  } finally {
    await done();
  }
});

test('an invalid object is refused alone, naming the field; its last accepted version stays; an overlapping pool is refused', async () => {
  const { api, src, done } = await setup();
  try {
    await src.start();
    api.apply(egress('out', { addresses: { pool: 'float', count: 99 } }));
    api.apply(egress('second'));
    const c = await updateWhere(src, (x) => x.others.length === 2);
    const out = c.others.find((o) => (o.metadata as { name: string }).name === 'out') as { spec: { addresses: Record<string, unknown> } };
    assert.equal(out.spec.addresses, { pool: 'float' }, 'the last accepted version of "out" stays');
    const v = src.currentVerdicts().get('Egress shop/out');
    assert.equal(v?.problems, ['spec.addresses.count 99 must be <= 16']);
    assert.ok(lines.some((l) => l.includes('kube: object refused') && l.includes('spec.addresses.count 99')));
    api.apply(pool('late', '198.51.100.8/29'));
    await new Promise((r) => setTimeout(r, 300));
    const late = src.currentVerdicts().get('AddressPool late');
    assert.ok(late?.problems.some((p) => /overlaps AddressPool "float"/.test(p)), JSON.stringify(late));
    api.apply(egress('out', { addresses: { pool: 'float', count: 2 } }));
    await updateWhere(src, (x) => x.others.some((o) => JSON.stringify(o.spec).includes('"count":2')));
    assert.equal(src.currentVerdicts().get('Egress shop/out')?.problems, []);
  } finally {
    await done();
  }
});

test('dropped watches are resumed; after compaction (410 Gone) a relist finds changes and deletions made meanwhile', async () => {
  const { api, src, done } = await setup();
  try {
    await src.start();
    assert.ok(api.dropWatches() >= 6, 'six watches were open');
    api.apply(pool('float2', '198.51.100.16/28'));
    await updateWhere(src, (x) => x.pools.length === 2, 10_000);
    // While disconnected: history compacted, an Egress deleted, another added.
    api.compact();
    api.dropWatches();
    api.remove('Egress', 'out', 'shop');
    api.apply(egress('later'));
    const c = await updateWhere(src, (x) => x.others.length === 1 && (x.others[0].metadata as { name: string }).name === 'later', 10_000);
    assert.ok(c);
  } finally {
    await done();
  }
});

test('a watch that stalls silently is resumed by the watchdog from its resourceVersion, without a relist', async () => {
  const { api, src, done } = await setup(800);
  try {
    await src.start();
    const lists = api.calls.filter((c) => !c.watch).length;
    api.muteWatches = true;
    api.apply(pool('float2', '198.51.100.16/28'));
    await updateWhere(src, (x) => x.pools.length === 2, 5000);
    assert.is(api.calls.filter((c) => !c.watch).length, lists, 'no list after the first');
  } finally {
    api.muteWatches = false;
    await done();
  }
});

test.run();
