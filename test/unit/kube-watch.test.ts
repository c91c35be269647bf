// The Kubernetes source at scale, against the FAKE API server (no kube-apiserver on these machines): the
// selectors each watch sends and that only tether's objects arrive; the leader's labeller that makes a
// tether Service and its slices visible to the nodes; a watch resumed from its resourceVersion (an event's or a bookmark's)
// after a disconnect, without a relist; a watch answering 410 in a loop (backed off with jitter, said once
// in the log and in status, the last state kept, recovery); 10k Services appearing at once (bounded work,
// the right set at the end); the jittered backoff itself.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import * as k8s from '@kubernetes/client-node';
import { FakeApiServer, kubeconfigFor, type Call } from '../lib/fake-apiserver';
import { captureLogger } from '../lib/log-capture';
import { KubeSource } from '../../daemon/config/kube-source';
import { feedResolved } from '../../daemon/config/source';
import type { ConfigObjects } from '../../daemon/config/objects';
import { ServiceLabeler } from '../../daemon/kube/service-labeler';
import { Backoff } from '../../lib/backoff';
import { TETHER_SERVICE_LABEL, TETHER_SERVICE_SELECTOR, LB_CLASS } from '../../daemon/objects/names';

const svc = (name: string, tether: boolean, labelled = tether, ns = 'shop') => ({
  apiVersion: 'v1', kind: 'Service', metadata: { name, namespace: ns, ...(labelled ? { labels: { [TETHER_SERVICE_LABEL]: 'true' } } : {}) },
  spec: { type: 'LoadBalancer', ...(tether ? { loadBalancerClass: LB_CLASS } : {}), ports: [{ port: 80, protocol: 'TCP' }], selector: { app: name } },
});
/** An EndpointSlice as Kubernetes' EndpointSlice controller writes it: the Service's labels copied (the fake does not copy them). */
const slice = (service: string, labelled: boolean, ns = 'shop') => ({
  apiVersion: 'discovery.k8s.io/v1', kind: 'EndpointSlice', metadata: { name: `${service}-abcde`, namespace: ns, labels: { 'kubernetes.io/service-name': service, ...(labelled ? { [TETHER_SERVICE_LABEL]: 'true' } : {}) } },
  addressType: 'IPv4', endpoints: [{ addresses: ['10.0.0.1'], conditions: { ready: true } }], ports: [{ port: 80, protocol: 'TCP' }],
});
const pod = (name: string, node: string) => ({ apiVersion: 'v1', kind: 'Pod', metadata: { name, namespace: 'shop', labels: { app: 'web' } }, spec: { nodeName: node }, status: {} });
const names = (c: ConfigObjects, kind: string) => c.others.filter((o) => o.kind === kind).map((o) => (o.metadata as { name: string }).name).sort();

async function setup(opts: { watchIdleMs?: number; backoffMinMs?: number; backoffMaxMs?: number } = {}) {
  const api = new FakeApiServer('fake-token');
  const url = (await api.listen({ port: 0 }))!;
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tether-kubew-'));
  const kubeconfig = path.join(dir, 'kubeconfig');
  fs.writeFileSync(kubeconfig, kubeconfigFor(url));
  api.apply({ apiVersion: 'v1', kind: 'Node', metadata: { name: 'n1' } });
  api.apply({ apiVersion: 'v1', kind: 'Node', metadata: { name: 'n2' } });
  api.apply(pod('here', 'n1'));
  api.apply(pod('there', 'n2'));
  api.apply(svc('web', true));
  api.apply(slice('web', true));
  api.apply(svc('other', false));
  api.apply(slice('other', false));
  const cap = captureLogger();
  const src = new KubeSource({ kubeconfig, nodeName: 'n1', logger: cap.logger, syncTimeoutMs: 5000, watchIdleMs: opts.watchIdleMs, backoffMinMs: opts.backoffMinMs ?? 50, backoffMaxMs: opts.backoffMaxMs ?? 400 });
  const kc = new k8s.KubeConfig();
  kc.loadFromFile(kubeconfig);
  const done = async () => {
    await src.stop();
    await api.close();
    fs.rmSync(dir, { recursive: true, force: true });
  };
  return { api, src, kc, lines: cap.lines, logger: cap.logger, done };
}

function updateWhere(src: KubeSource, ok: (c: ConfigObjects) => boolean, timeoutMs = 5000): Promise<ConfigObjects> {
  return new Promise((resolve, reject) => {
    const t = setTimeout(() => (src.off('update', on), reject(new Error(`no matching update within ${timeoutMs} ms`))), timeoutMs);
    const on = (c: ConfigObjects) => {
      if (!ok(c)) return;
      clearTimeout(t);
      src.off('update', on);
      resolve(c);
    };
    src.on('update', on);
  });
}

const until = async (what: string, fn: () => boolean, ms = 5000) => {
  const end = Date.now() + ms;
  while (!fn()) {
    if (Date.now() > end) throw new Error(`timed out: ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
};

const of = (calls: Call[], p: string) => calls.filter((c) => c.path === p);

test('each watch sends its selector and bookmarks; only tether Services, their slices and this node\'s pods arrive', async () => {
  const { api, src, done } = await setup();
  try {
    const c = await src.start();
    const q = (p: string, watch: boolean) => of(api.calls, p).filter((x) => x.watch === watch).map((x) => x.query);
    for (const p of ['/api/v1/services', '/apis/discovery.k8s.io/v1/endpointslices']) {
      assert.equal(q(p, false).map((x) => x.labelSelector), [TETHER_SERVICE_SELECTOR], `${p} listed by label`);
      assert.equal(q(p, true).map((x) => [x.labelSelector, x.allowWatchBookmarks]), [[TETHER_SERVICE_SELECTOR, 'true']], `${p} watched by label, with bookmarks`);
    }
    assert.equal(q('/api/v1/pods', true).map((x) => x.fieldSelector), ['spec.nodeName=n1']);
    assert.equal(q('/api/v1/nodes', true).map((x) => x.fieldSelector), ['metadata.name=n1']);
    assert.ok(q('/api/v1/pods', true)[0].resourceVersion !== '', 'the watch starts from the list\'s resourceVersion');
    assert.equal(names(c, 'Service'), ['web']);
    assert.equal(names(c, 'EndpointSlice'), ['web-abcde']);
    assert.equal(Object.keys(c.pods ?? {}), ['shop/here']);
    // A labelled Service that is not of tether's class (labelled by hand) is held but not delivered.
    api.apply(svc('fake', false, true));
    api.apply(pod('here2', 'n1'));
    const c2 = await updateWhere(src, (x) => !!x.pods?.['shop/here2']);
    assert.equal(names(c2, 'Service'), ['web']);
  } finally {
    await done();
  }
});

test('the leader\'s labeller labels tether Services (nodes then see them) and unlabels others', async () => {
  const { api, src, kc, logger, done } = await setup();
  const labeler = new ServiceLabeler({ kc, logger, settleMs: 10 });
  try {
    await src.start();
    api.apply(svc('late', true, false));
    api.apply(slice('late', false));
    api.apply(svc('wrong', false, true));
    labeler.start();
    await until('labelled', () => api.get('Service', 'late', 'shop')?.metadata.labels?.[TETHER_SERVICE_LABEL] === 'true' && api.get('Service', 'wrong', 'shop')?.metadata.labels?.[TETHER_SERVICE_LABEL] === undefined);
    // The fake copies the label onto the slice as Kubernetes' EndpointSlice controller does.
    const c = await updateWhere(src, (x) => names(x, 'Service').includes('late') && names(x, 'EndpointSlice').includes('late-abcde'));
    assert.equal(names(c, 'Service'), ['late', 'web']);
    assert.equal(names(c, 'EndpointSlice'), ['late-abcde', 'web-abcde']);
    assert.equal(api.get('Service', 'late', 'shop')?.spec, svc('late', true).spec, 'only the label was patched');
    assert.equal(labeler.mismatches(), []);
    const patches = api.calls.filter((x) => x.method === 'PATCH').length;
    assert.is(patches, 2, 'one patch per Service that needed it');
  } finally {
    await labeler.stop();
    await done();
  }
});

test('after a disconnect each watch resumes from the last event\'s or bookmark\'s resourceVersion, without a relist', async () => {
  const { api, src, done } = await setup();
  try {
    await src.start();
    const lists = () => api.calls.filter((c) => !c.watch).length;
    const listed = lists();
    // Pods: an event, then changes elsewhere advance the cluster's version and a bookmark carries it.
    api.apply(pod('here2', 'n1'));
    await updateWhere(src, (x) => !!x.pods?.['shop/here2']);
    api.apply(pod('there2', 'n2'));
    api.apply(svc('other2', false));
    await until('bookmarks delivered', () => api.bookmark() >= 6);
    const bookmarked = String(api.resourceVersion);
    await new Promise((r) => setTimeout(r, 100));
    const before = api.calls.length;
    api.dropWatches();
    api.apply(pod('here3', 'n1'));
    await updateWhere(src, (x) => !!x.pods?.['shop/here3']);
    const resumed = api.calls.slice(before).filter((c) => c.watch);
    assert.ok(resumed.length >= 6, `every resource resumed (${resumed.length})`);
    for (const w of resumed.slice(0, 6)) assert.is(w.query.resourceVersion, bookmarked, `${w.path} resumed from the bookmark`);
    assert.is(lists(), listed, 'no relist');
  } finally {
    await done();
  }
});

test('a watch answering 410 in a loop: relists backed off with jitter, said once in the log and in status, last state served; then it recovers', async () => {
  const { api, src, lines, done } = await setup({ backoffMinMs: 100, backoffMaxMs: 800 });
  try {
    const first = await src.start();
    let updates = 0;
    src.on('update', () => updates++);
    api.goneLoop = true;
    const t0 = Date.now();
    api.dropWatches();
    await new Promise((r) => setTimeout(r, 3000));
    const svcLists = of(api.calls, '/api/v1/services').filter((c) => !c.watch && c.at >= t0).map((c) => c.at);
    // Without backoff this is thousands of lists; with 100 ms doubling to 800 ms (each 50-100 %), at most ~11 in 3 s.
    assert.ok(svcLists.length >= 3 && svcLists.length <= 12, `${svcLists.length} lists in 3 s`);
    const gaps = svcLists.slice(1).map((t, i) => t - svcLists[i]);
    assert.ok(gaps.slice(1).every((g) => g >= 40), `backed off: ${gaps}`);
    assert.ok(gaps[gaps.length - 1] > gaps[0], `growing: ${gaps}`);
    assert.ok(new Set(gaps.map((g) => Math.round(g / 10))).size > 1, `jittered: ${gaps}`);
    const warned = lines.filter((l) => String(l.message).includes('410 Gone in a loop') && l.resource === 'services' && l.level === 'warn');
    assert.is(warned.length, 1, 'said once in the log');
    assert.ok(src.problems().some((p) => p.startsWith('services: watch answers 410 Gone in a loop')), JSON.stringify(src.problems()));
    assert.is(updates, 0, 'the configuration in force did not change');
    assert.equal(names(first, 'Service'), ['web']);
    assert.is(src.stats().find((s) => s.resource === 'services')!.objects, 1, 'the last listed objects are held');
    // The API server recovers: a change is delivered and the problem is gone.
    api.goneLoop = false;
    api.apply(svc('new', true));
    await updateWhere(src, (x) => names(x, 'Service').includes('new'), 5000);
    await until('problem cleared', () => src.problems().length === 0);
    assert.ok(lines.some((l) => l.message === 'kube: following again' && l.resource === 'services'));
  } finally {
    api.goneLoop = false;
    await done();
  }
});

test('10k tether Services and their slices appearing at once: a few rebuilds and apply() calls, the right set at the end', async () => {
  const { api, src, logger, done } = await setup();
  try {
    await src.start();
    let applies = 0;
    let last: ConfigObjects | undefined;
    const feed = feedResolved(src, (c) => c, [{ name: 'counting', apply: async (c) => { applies++; last = c; await new Promise((r) => setTimeout(r, 20)); } }], logger);
    const N = 10_000;
    for (let i = 0; i < N; i++) {
      api.apply(svc(`s${i}`, true, true, `ns${i % 50}`));
      api.apply(slice(`s${i}`, true, `ns${i % 50}`));
    }
    await until('all delivered', () => !!last && names(last, 'Service').length === N + 1, 60_000);
    await new Promise((r) => setTimeout(r, 300));
    await feed.stop();
    assert.is(names(last!, 'Service').length, N + 1);
    assert.is(names(last!, 'EndpointSlice').length, N + 1);
    assert.ok(src.counts.builds <= 40, `${src.counts.builds} rebuilds for ${2 * N} events`);
    assert.ok(applies <= 40, `${applies} apply() calls for ${2 * N} events`);
    assert.is(api.calls.filter((c) => !c.watch && c.path === '/api/v1/services').length, 1, 'no relist');
  } finally {
    await done();
  }
});

test('backoff: doubles to its cap, half fixed and half random', () => {
  const at = (r: number) => {
    const b = new Backoff(100, 1000, () => r);
    return Array.from({ length: 6 }, () => b.next());
  };
  assert.equal(at(0), [50, 100, 200, 400, 500, 500]);
  assert.equal(at(1), [100, 200, 400, 800, 1000, 1000]);
  const b = new Backoff(100, 1000);
  const spread = new Set(Array.from({ length: 20 }, () => (b.reset(), b.next())));
  assert.ok(spread.size > 5, 'random jitter');
  b.reset();
  assert.is(b.failures, 0);
});

test("a Service's status written (the leader's conditions, the same VIP) is no new configuration: no update on the nodes; a new VIP in it is one", async () => {
  const { api, src, kc, done } = await setup();
  try {
    await src.start();
    let updates = 0;
    src.on('update', () => updates++);
    // Through the status subresource, as the leader writes it. The VIP it records is configuration (a node
    // serves it while the store is away): one update.
    const core = kc.makeApiClient(k8s.CoreV1Api);
    const cur = await core.readNamespacedService({ name: 'web', namespace: 'shop' });
    const status = (message: string) => ({ loadBalancer: { ingress: [{ ip: '198.51.100.7', ipMode: 'Proxy' }] }, conditions: [{ type: 'tether.dev/Ready', status: 'True', reason: 'Serving', message, lastTransitionTime: new Date() }] });
    await core.replaceNamespacedServiceStatus({ name: 'web', namespace: 'shop', body: { ...cur, status: status('ok') } });
    assert.is(api.get('Service', 'web', 'shop')?.status?.loadBalancer?.ingress?.[0]?.ip, '198.51.100.7', 'the status was written');
    await updateWhere(src, (c) => c.others.some((o) => o.kind === 'Service' && (o as { status?: { loadBalancer?: { ingress?: Array<{ ip?: string }> } } }).status?.loadBalancer?.ingress?.[0]?.ip === '198.51.100.7'));
    const after = updates;
    // The leader's next status write: other conditions, the same VIP.
    const builds = src.counts.builds;
    const cur2 = await core.readNamespacedService({ name: 'web', namespace: 'shop' });
    await core.replaceNamespacedServiceStatus({ name: 'web', namespace: 'shop', body: { ...cur2, status: status('still ok') } });
    await until('the event rebuilt the configuration', () => src.counts.builds > builds);
    await new Promise((r) => setTimeout(r, 300));
    assert.is(updates, after, 'the status write changed nothing a node reads');
    // A change of what a node reads still is one.
    api.apply({ ...svc('web', true), metadata: { ...svc('web', true).metadata, annotations: { 'lb.tether.dev/affinity': 'flow' } } });
    await updateWhere(src, (c) => c.others.some((o) => o.kind === 'Service' && (o.metadata as { annotations?: Record<string, string> }).annotations?.['lb.tether.dev/affinity'] === 'flow'));
  } finally {
    await done();
  }
});

test.run();
