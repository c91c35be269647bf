// The Kubernetes side of /metrics, against the FAKE API server, scraped over HTTP from the metrics part:
// failed API requests by verb, resource and code (a client's 404, a watch's 410, an API server gone),
// Events the recorder dropped (an object's budget spent, a full queue, refused writes), and leadership
// (the gauge follows the Lease, transitions count each change); and pods whose datapath role failed, by role.
// Each appears and then moves.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { Writable } from 'node:stream';
import * as k8s from '@kubernetes/client-node';
import { FakeApiServer, kubeconfigFor } from '../lib/fake-apiserver';
import { makeLogger } from '../../lib/log';
import { KubeSource } from '../../daemon/config/kube-source';
import { KubeApiCalls, verbAndResource } from '../../daemon/config/kube-api-calls';
import { EventRecorder } from '../../daemon/kube/event-recorder';
import { LeaderElection } from '../../daemon/kube/leader';
import { TetherMetrics } from '../../daemon/metrics/tether-metrics';
import { metricsServer, type MetricsServer } from '../../daemon/parts/metrics';
import { namingProblems, scrapeMetrics } from '../lib/metrics';

const quiet = makeLogger({ level: 'error', stream: new Writable({ write: (_c, _e, cb) => cb() }) });

async function setup() {
  const api = new FakeApiServer('fake-token');
  const url = (await api.listen({ port: 0 }))!;
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tether-mk-'));
  const kubeconfig = path.join(dir, 'kubeconfig');
  fs.writeFileSync(kubeconfig, kubeconfigFor(url));
  return { api, kubeconfig, done: async () => (await api.close(), fs.rmSync(dir, { recursive: true, force: true })) };
}

async function serve(parts: Parameters<typeof metricsServer>[0]['parts']): Promise<{ server: MetricsServer; scrape: () => ReturnType<typeof scrapeMetrics> }> {
  const server = metricsServer({ address: { host: '127.0.0.1', port: 0 }, metrics: new TetherMetrics(quiet), parts, logger: quiet });
  await server.start();
  return { server, scrape: () => scrapeMetrics(`http://127.0.0.1:${server.boundAddress()!.port}/metrics`) };
}

const until = async (what: string, fn: () => boolean | Promise<boolean>, ms = 5000) => {
  const end = Date.now() + ms;
  while (!(await fn())) {
    if (Date.now() > end) throw new Error(`timed out: ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
};

test('verb and resource of a request, as Kubernetes names them', () => {
  const cases: Array<[string, string, string, string]> = [
    ['GET', 'https://h/api/v1/namespaces/tether-system/secrets/tether-redis-auth', 'get', 'secrets'],
    ['GET', 'https://h/api/v1/pods?fieldSelector=spec.nodeName%3Dn1', 'list', 'pods'],
    ['GET', 'https://h/api/v1/services?watch=true&resourceVersion=5', 'watch', 'services'],
    ['POST', 'https://h/apis/events.k8s.io/v1/namespaces/default/events', 'create', 'events'],
    ['PATCH', 'https://h/apis/events.k8s.io/v1/namespaces/default/events/x.1', 'patch', 'events'],
    ['PUT', 'https://h/apis/tether.dev/v1alpha1/tethernodes/n1/status', 'update', 'tethernodes/status'],
    ['PUT', 'https://h/apis/coordination.k8s.io/v1/namespaces/tether-system/leases/tether-operator', 'update', 'leases'],
    ['DELETE', 'https://h/apis/tether.dev/v1alpha1/addressblocks/b1', 'delete', 'addressblocks'],
    ['GET', 'https://h/api/v1/nodes/n1', 'get', 'nodes'],
    ['GET', 'https://h/api/v1/namespaces/tether-system', 'get', 'namespaces'],
  ];
  for (const [m, u, verb, resource] of cases) assert.equal(verbAndResource(m, u), { verb, resource }, `${m} ${u}`);
});

test('failed API requests: a client\'s 404, a watch\'s 410 and an API server gone are counted by verb, resource and code', async () => {
  const { api, kubeconfig, done } = await setup();
  const src = new KubeSource({ kubeconfig, nodeName: 'n1', logger: quiet, syncTimeoutMs: 5000, backoffMinMs: 50, backoffMaxMs: 200 });
  const { server, scrape } = await serve({ kube: { apiCalls: src.apiCalls } });
  try {
    await src.start();
    let s = await scrape();
    assert.equal(namingProblems(s), []);
    assert.is(s.samples('tether_kube_api_errors_total').length, 0, 'no error yet: no series');
    assert.is(s.families.get('tether_kube_api_errors_total')?.type, 'counter');

    const core = src.kc.makeApiClient(k8s.CoreV1Api);
    for (let i = 0; i < 2; i++) await core.readNamespacedSecret({ name: 'absent', namespace: 'tether-system' }).then(() => assert.unreachable('absent Secret read'), () => undefined);
    s = await scrape();
    assert.is(s.value('tether_kube_api_errors_total', { verb: 'get', resource: 'secrets', code: '404' }), 2);

    // The reflectors' watches (client-node's Watch, on its own fetch) answer 410 in a loop.
    api.goneLoop = true;
    api.dropWatches();
    await until('a watch 410 counted', async () => ((await scrape()).value('tether_kube_api_errors_total', { verb: 'watch', resource: 'services', code: '410' }) ?? 0) >= 2);
    api.goneLoop = false;

    // The API server gone: requests get no answer at all.
    await done();
    await core.readNamespacedSecret({ name: 'absent', namespace: 'tether-system' }).then(() => assert.unreachable('answered'), () => undefined);
    s = await scrape();
    assert.is(s.value('tether_kube_api_errors_total', { verb: 'get', resource: 'secrets', code: 'network' }), 1);
    assert.is(s.value('tether_kube_api_errors_total', { verb: 'get', resource: 'secrets', code: '404' }), 2, 'the 404s stay counted');
  } finally {
    await src.stop();
    await server.stop();
    await done().catch(() => undefined);
  }
});

test('a successful request is not an error; a request through an uninstrumented KubeConfig is not counted', async () => {
  const { api, kubeconfig, done } = await setup();
  try {
    api.apply({ apiVersion: 'v1', kind: 'Secret', metadata: { name: 'here', namespace: 'tether-system' }, type: 'Opaque', data: {} });
    const calls = new KubeApiCalls();
    const kc = new k8s.KubeConfig();
    kc.loadFromFile(kubeconfig);
    calls.instrument(kc);
    const got = await kc.makeApiClient(k8s.CoreV1Api).readNamespacedSecret({ name: 'here', namespace: 'tether-system' });
    assert.is(got.metadata?.name, 'here', 'the answer passes through unchanged');
    assert.equal(calls.list(), []);
    const plain = new k8s.KubeConfig();
    plain.loadFromFile(kubeconfig);
    await plain.makeApiClient(k8s.CoreV1Api).readNamespacedSecret({ name: 'absent', namespace: 'tether-system' }).catch(() => undefined);
    assert.equal(calls.list(), []);
    await kc.makeApiClient(k8s.CoreV1Api).readNamespacedSecret({ name: 'absent', namespace: 'tether-system' }).catch(() => undefined);
    assert.equal(calls.list(), [{ verb: 'get', resource: 'secrets', code: '404', count: 1 }]);
  } finally {
    await done();
  }
});

test('Events dropped by the recorder, by reason: every reason present at 0, then rate_limited, queue_full and failed move', async () => {
  const { api, kubeconfig, done } = await setup();
  const kc = new k8s.KubeConfig();
  kc.loadFromFile(kubeconfig);
  const events = new EventRecorder({ kc, nodeName: 'n1', logger: quiet, burst: 2, refillMs: 60_000, queueSize: 1 });
  const { server, scrape } = await serve({ kube: { events } });
  const ev = (name: string, reason: string) => ({ regarding: { apiVersion: 'tether.dev/v1alpha1', kind: 'Egress', name, namespace: 'shop' }, reason, type: 'Normal' as const, action: 'Test', note: reason });
  try {
    let s = await scrape();
    for (const reason of ['rate_limited', 'queue_full', 'failed']) assert.is(s.value('tether_kube_events_dropped_total', { reason }), 0, reason);
    // One object's budget is 2: the third new Event about it is dropped.
    for (const r of ['A', 'B', 'C']) events.emit(ev('out', r));
    await events.flush();
    s = await scrape();
    assert.ok(s.value('tether_kube_events_dropped_total', { reason: 'rate_limited' })! >= 1, 'rate_limited moved');
    // A queue of 1: Events about many objects at once overflow it.
    for (let i = 0; i < 5; i++) events.emit(ev(`o${i}`, 'Burst'));
    await events.flush();
    s = await scrape();
    assert.ok(s.value('tether_kube_events_dropped_total', { reason: 'queue_full' })! >= 1, 'queue_full moved');
    // The API server away: the write fails.
    await done();
    events.emit(ev('gone', 'Away'));
    await events.flush();
    s = await scrape();
    assert.ok(s.value('tether_kube_events_dropped_total', { reason: 'failed' })! >= 1, 'failed moved');
    assert.equal(namingProblems(s), []);
  } finally {
    await events.stop(100);
    await server.stop();
    await done().catch(() => undefined);
    void api;
  }
});

test('leadership: the gauge follows the Lease, transitions count each change', async () => {
  const { kubeconfig, done } = await setup();
  const kc = new k8s.KubeConfig();
  kc.loadFromFile(kubeconfig);
  const mk = (id: string) => new LeaderElection({ kc, namespace: 'tether-system', name: 'tether-operator', identity: id, logger: quiet, leaseDurationSeconds: 3, retryMs: 100 });
  const a = mk('op-a');
  const { server, scrape } = await serve({ kube: { elections: () => [a] } });
  const lease = { lease: 'tether-system/tether-operator' };
  try {
    let s = await scrape();
    assert.is(s.value('tether_leader', lease), 0);
    assert.is(s.value('tether_leader_transitions_total', lease), 0);
    a.start();
    await until('elected', () => a.isLeader());
    s = await scrape();
    assert.is(s.value('tether_leader', lease), 1);
    assert.is(s.value('tether_leader_transitions_total', lease), 1);
    await a.stop();
    s = await scrape();
    assert.is(s.value('tether_leader', lease), 0);
    assert.is(s.value('tether_leader_transitions_total', lease), 2);
    assert.is(s.families.get('tether_leader')?.type, 'gauge');
  } finally {
    await a.stop();
    await server.stop();
    await done();
  }
});

test('pods whose datapath role failed, by role: absent without the part, 0 series when none, counted by role', async () => {
  const problems: Array<{ pod: string; role: string }> = [];
  const { server, scrape } = await serve({ roleProblems: () => problems });
  try {
    let s = await scrape();
    assert.equal(s.samples('tether_pod_role_problems'), []);
    problems.push({ pod: 'shop/gw-1', role: 'egress' }, { pod: 'shop/gw-2', role: 'egress' }, { pod: 'web/lb-0', role: 'lb pod' });
    s = await scrape();
    assert.is(s.value('tether_pod_role_problems', { role: 'egress' }), 2);
    assert.is(s.value('tether_pod_role_problems', { role: 'lb pod' }), 1);
    problems.length = 0;
    s = await scrape();
    assert.equal(s.samples('tether_pod_role_problems'), [], 'solved: the series go');
  } finally {
    await server.stop();
  }
});

test.run();
