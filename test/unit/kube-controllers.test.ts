// Leader election over a Lease and the leader's controllers, against the FAKE API server: one leader at a
// time, a stopped leader hands over at once, a leader that cannot renew steps down; status written
// through the status subresource only when it changes (lastTransitionTime kept), refused objects with
// their reason, Egress addresses with owner and epoch; block claims of deleted nodes collected.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { Writable } from 'node:stream';
import * as k8s from '@kubernetes/client-node';
import { FakeApiServer, kubeconfigFor } from '../lib/fake-apiserver';
import { LeaderElection } from '../../daemon/kube/leader';
import { StatusController, type EgressAddressStatus } from '../../daemon/kube/status-controller';
import { mergeConditions } from '../../daemon/kube/conditions';
import type { Verdicts } from '../../daemon/config/kube-source';
import { makeLogger } from '../../lib/log';
import { awaitClusterSecret, ensureClusterSecret } from '../../daemon/kube/cluster-key';
import { schemaProblems } from '../../daemon/objects/schema';
import { CRDS } from '../../daemon/objects/crds';

const quiet = makeLogger({ level: 'error', stream: new Writable({ write: (_c, _e, cb) => cb() }) });
const V = 'tether.dev/v1alpha1';

async function setup() {
  const api = new FakeApiServer('fake-token');
  const url = (await api.listen({ port: 0 }))!;
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tether-ctl-'));
  fs.writeFileSync(path.join(dir, 'kubeconfig'), kubeconfigFor(url));
  const kc = new k8s.KubeConfig();
  kc.loadFromFile(path.join(dir, 'kubeconfig'));
  return { api, kc, done: async () => (await api.close(), fs.rmSync(dir, { recursive: true, force: true })) };
}

const until = async (what: string, fn: () => boolean, ms = 5000) => {
  const end = Date.now() + ms;
  while (!fn()) {
    if (Date.now() > end) throw new Error(`timed out: ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
};

test('one leader; a stopped leader releases the Lease and the other takes over within one retry', async () => {
  const { api, kc, done } = await setup();
  const mk = (id: string) => new LeaderElection({ kc, namespace: 'tether-system', name: 'tether-controllers', identity: id, logger: quiet, leaseDurationSeconds: 3, retryMs: 100 });
  const a = mk('n1');
  const b = mk('n2');
  try {
    a.start();
    b.start();
    await until('a leader', () => a.isLeader() || b.isLeader());
    await new Promise((r) => setTimeout(r, 500));
    assert.ok(a.isLeader() !== b.isLeader(), 'exactly one leader');
    const [first, second] = a.isLeader() ? [a, b] : [b, a];
    const t0 = Date.now();
    await first.stop();
    await until('the other takes over', () => second.isLeader(), 2000);
    assert.ok(Date.now() - t0 < 1500, `took over in ${Date.now() - t0} ms (the lease lasts 3 s)`);
    const lease = api.get('Lease', 'tether-controllers', 'tether-system');
    assert.is(lease?.spec.holderIdentity, second === a ? 'n1' : 'n2');
    // MicroTime fields: the API server parses exactly six fractional digits (Go's RFC3339Micro), refusing three.
    for (const f of ['acquireTime', 'renewTime']) assert.match(String(lease?.spec[f]), /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$/, `${f}: ${lease?.spec[f]}`);
  } finally {
    await a.stop();
    await b.stop();
    await done();
  }
});

test('a leader that cannot renew steps down before its lease expires', async () => {
  const { api, kc, done } = await setup();
  const a = new LeaderElection({ kc, namespace: 'tether-system', name: 'l', identity: 'n1', logger: quiet, leaseDurationSeconds: 2, retryMs: 100 });
  try {
    a.start();
    await until('leader', () => a.isLeader());
    const lost = new Promise<number>((r) => a.once('lost', () => r(Date.now())));
    const t0 = Date.now();
    await api.close();
    const at = await lost;
    assert.ok(at - t0 < 2000, `stepped down after ${at - t0} ms, before the 2 s lease could expire`);
  } finally {
    await a.stop();
    await done().catch(() => {});
  }
});

test('status: pools and Egresses, refused ones with the reason; unchanged status is not rewritten; conditions keep their transition time', async () => {
  const { api, kc, done } = await setup();
  try {
    const good = api.apply({ apiVersion: V, kind: 'AddressPool', metadata: { name: 'float' }, spec: { usage: 'floating', ipv4: { cidr: '198.51.100.0/28' } } });
    const late = api.apply({ apiVersion: V, kind: 'AddressPool', metadata: { name: 'late' }, spec: { usage: 'floating', ipv4: { cidr: '198.51.100.8/29' } } });
    const eg = api.apply({ apiVersion: V, kind: 'Egress', metadata: { name: 'out', namespace: 'shop' }, spec: { addresses: { pool: 'float' } } });
    const verdicts: Verdicts = new Map([
      ['AddressPool float', { obj: good, problems: [] }],
      ['AddressPool late', { obj: late, problems: ['spec.ipv4.cidr 198.51.100.8/29 overlaps AddressPool "float" spec.ipv4.cidr 198.51.100.0/28'] }],
      ['Egress shop/out', { obj: eg, problems: [] }],
    ]);
    let addrs: EgressAddressStatus[] = [{ egress: 'shop/out', address: '198.51.100.1', owner: 'shop/gw1', ownerNode: 'n1', epoch: 3 }];
    const ctl = new StatusController({ kc, logger: quiet, verdicts: () => verdicts, egressAddresses: () => addrs, everyMs: 3_600_000, gcEveryMs: 3_600_000 });
    await ctl.pass();
    const pool = api.get('AddressPool', 'float')!;
    assert.is(pool.status.conditions[0].status, 'True');
    const lateStatus = api.get('AddressPool', 'late')!.status.conditions[0];
    assert.equal([lateStatus.status, lateStatus.reason], ['False', 'Overlaps']);
    assert.match(lateStatus.message, /overlaps AddressPool "float"/);
    const e = api.get('Egress', 'out', 'shop')!;
    assert.equal(e.status.addresses, [{ address: '198.51.100.1', ownerNode: 'n1', ownerPod: 'shop/gw1', epoch: 3 }]);
    assert.equal([e.status.conditions[0].status, e.status.conditions[0].reason], ['True', 'Owned']);
    assert.equal(e.spec, { addresses: { pool: 'float' } }, 'the spec is untouched by a status write');
    const writes = ctl.stats.statusWrites;
    await ctl.pass();
    assert.is(ctl.stats.statusWrites, writes, 'nothing changed: nothing written');
    const t0 = e.status.conditions[0].lastTransitionTime;
    await new Promise((r) => setTimeout(r, 10));
    addrs = [{ egress: 'shop/out', address: '198.51.100.1', owner: 'shop/gw2', ownerNode: 'n2', epoch: 4 }];
    await ctl.pass();
    const e2 = api.get('Egress', 'out', 'shop')!;
    assert.equal(e2.status.addresses[0], { address: '198.51.100.1', ownerNode: 'n2', ownerPod: 'shop/gw2', epoch: 4 });
    assert.is(e2.status.conditions[0].lastTransitionTime, t0, 'still Ready: transition time kept');
    addrs = [{ egress: 'shop/out', address: '198.51.100.1', owner: '', epoch: 4 }];
    await ctl.pass();
    const e3 = api.get('Egress', 'out', 'shop')!.status.conditions[0];
    assert.equal([e3.status, e3.reason], ['False', 'NoOwner']);
    assert.is.not(e3.lastTransitionTime, t0);
    // Accepted by the schema, refused by its subsystem (an unknown pool): the reason reaches status.
    const typo = api.apply({ apiVersion: V, kind: 'Egress', metadata: { name: 'typo', namespace: 'shop' }, spec: { addresses: { pool: 'flaot' } } });
    verdicts.set('Egress shop/typo', { obj: typo, problems: [] });
    const ctl2 = new StatusController({
      kc, logger: quiet, verdicts: () => verdicts, egressAddresses: () => [], everyMs: 3_600_000, gcEveryMs: 3_600_000,
      refused: () => ({ 'Egress shop/typo': 'spec.addresses.pool "flaot" is not a floating pool (floating pools: float, late)' }),
    });
    await ctl2.pass();
    const t = api.get('Egress', 'typo', 'shop')!.status.conditions[0];
    assert.equal([t.status, t.reason], ['False', 'Invalid']);
    assert.match(t.message, /"flaot" is not a floating pool/);
  } finally {
    await done();
  }
});

test("status: the counts kubectl's columns show (wanted, allocated, held, nodes), each a field of the schema", async () => {
  const { api, kc, done } = await setup();
  try {
    const eg = api.apply({ apiVersion: V, kind: 'Egress', metadata: { name: 'out', namespace: 'shop' }, spec: { addresses: { pool: 'float', count: 4 } } });
    const verdicts: Verdicts = new Map([['Egress shop/out', { obj: eg, problems: [] }]]);
    const a = (address: string, owner: string, ownerNode?: string): EgressAddressStatus => ({ egress: 'shop/out', address, owner, ...(ownerNode ? { ownerNode } : {}), epoch: 1 });
    let addrs = [a('198.51.100.1', 'shop/gw1', 'n1'), a('198.51.100.2', 'shop/gw2', 'n1'), a('198.51.100.3', '')];
    const summary = { 'shop/out': { asked: 4, allocated: 3, owned: 2, ownerNodes: 1, capLimited: false } };
    const ctl = new StatusController({ kc, logger: quiet, verdicts: () => verdicts, egressAddresses: () => addrs, egressSummary: () => summary, everyMs: 3_600_000, gcEveryMs: 3_600_000 });
    await ctl.pass();
    const counts = () => {
      const st = api.get('Egress', 'out', 'shop')!.status;
      return { wanted: st.wanted, allocated: st.allocated, held: st.held, nodes: st.nodes };
    };
    assert.equal(counts(), { wanted: 4, allocated: 3, held: 2, nodes: 1 });
    // An owner moves to another node and the third address gets one: the counts follow.
    addrs = [a('198.51.100.1', 'shop/gw1', 'n1'), a('198.51.100.2', 'shop/gw3', 'n2'), a('198.51.100.3', 'shop/gw4', 'n3')];
    await ctl.pass();
    assert.equal(counts(), { wanted: 4, allocated: 3, held: 3, nodes: 3 });
    // The fields are in the schema (the API server would prune them otherwise) and the columns name them.
    const st = api.get('Egress', 'out', 'shop')!.status;
    assert.equal(schemaProblems({ ...eg, spec: { clients: { podSelector: {} }, gateways: { podSelector: { matchLabels: { a: 'b' } } }, addresses: { pool: 'float', count: 4 } }, status: st }), []);
    const cols = CRDS.find((d) => d.kind === 'Egress')!.columns;
    assert.equal(cols.filter((c) => !c.priority).map((c) => c.jsonPath), ['.status.wanted', '.status.held', ".status.conditions[?(@.type=='Ready')].status", '.metadata.creationTimestamp']);
  } finally {
    await done();
  }
});

test('block claims of deleted nodes are collected; live nodes keep theirs', async () => {
  const { api, kc, done } = await setup();
  try {
    api.apply({ apiVersion: 'v1', kind: 'Node', metadata: { name: 'n1' } });
    const claim = (node: string, cidr: string) => api.apply({ apiVersion: V, kind: 'AddressBlock', metadata: { name: `default-${cidr.replace(/[./]/g, '-')}`, labels: { 'tether.dev/node': node } }, spec: { pool: 'default', cidr, node } });
    claim('n1', '10.244.0.0/26');
    claim('gone', '10.244.0.64/26');
    const ctl = new StatusController({ kc, logger: quiet, verdicts: () => new Map(), egressAddresses: () => [] });
    assert.is(await ctl.collectClaims(), 1);
    assert.equal(api.list('AddressBlock').map((c) => c.spec.node), ['n1']);
  } finally {
    await done();
  }
});

test('the cluster Secrets: operator replicas racing to create one all read one value, type Opaque; an existing Secret is used as is', async () => {
  const { api, kc, done } = await setup();
  try {
    const keys = await Promise.all([1, 2, 3, 4].map(() => ensureClusterSecret(kc, 'tether-system', 'tether-cluster-key', 'clusterKey')));
    assert.is(new Set(keys).size, 1, 'one key for every replica');
    assert.match(keys[0], /^[0-9a-f]{64}$/);
    assert.is(api.list('Secret').length, 1);
    assert.is(api.get('Secret', 'tether-cluster-key', 'tether-system')?.type, 'Opaque');
    api.remove('Secret', 'tether-cluster-key', 'tether-system');
    api.apply({ apiVersion: 'v1', kind: 'Secret', metadata: { name: 'tether-cluster-key', namespace: 'tether-system' }, data: { key: Buffer.from('b'.repeat(64)).toString('base64') } });
    assert.is(await ensureClusterSecret(kc, 'tether-system', 'tether-cluster-key', 'clusterKey'), 'b'.repeat(64));
    const pw = await ensureClusterSecret(kc, 'tether-system', 'tether-redis-auth', 'redisPassword');
    assert.match(pw, /^[A-Za-z0-9_-]{32}$/);
  } finally {
    await done();
  }
});

test('tetherd only reads a cluster Secret: it waits for the operator to create it, and never creates one', async () => {
  const { api, kc, done } = await setup();
  const lines: string[] = [];
  const logger = makeLogger({ level: 'warn', stream: new Writable({ write: (c, _e, cb) => (lines.push(String(c)), cb()) }) });
  try {
    let got: string | undefined;
    const waiting = awaitClusterSecret(kc, 'tether-system', 'tether-redis-auth', 'redisPassword', { logger, everyMs: 50, logEveryMs: 10_000 }).then((v) => (got = v));
    await new Promise((r) => setTimeout(r, 300));
    assert.is(got, undefined, 'still waiting');
    assert.equal(api.list('Secret'), [], 'tetherd created no Secret');
    assert.ok(lines.some((l) => l.includes('waiting for a cluster Secret') && l.includes('tether-system/tether-redis-auth')), lines.join(''));
    api.apply({ apiVersion: 'v1', kind: 'Secret', metadata: { name: 'tether-redis-auth', namespace: 'tether-system' }, type: 'Opaque', data: { password: Buffer.from('pw').toString('base64') } });
    await waiting;
    assert.is(got, 'pw');
    // A Secret without the entry is an error naming it, not a wait.
    api.apply({ apiVersion: 'v1', kind: 'Secret', metadata: { name: 'tether-cluster-key', namespace: 'tether-system' }, type: 'Opaque', data: { other: 'eA==' } });
    const e = await awaitClusterSecret(kc, 'tether-system', 'tether-cluster-key', 'clusterKey', { logger }).catch((x: Error) => x);
    assert.match(String(e), /has no "key" entry/);
  } finally {
    await done();
  }
});

test('mergeConditions keeps lastTransitionTime while the status holds', () => {
  const t = new Date('2026-01-01T00:00:00Z');
  const prev = mergeConditions(undefined, [{ type: 'Ready', status: 'True', reason: 'A', message: '' }], t);
  const same = mergeConditions(prev, [{ type: 'Ready', status: 'True', reason: 'B', message: 'x' }], new Date());
  assert.is(same[0].lastTransitionTime, t.toISOString());
  const flip = mergeConditions(prev, [{ type: 'Ready', status: 'False', reason: 'B', message: 'x' }], new Date('2026-02-01T00:00:00Z'));
  assert.is(flip[0].lastTransitionTime, '2026-02-01T00:00:00.000Z');
});

test.run();
