// tetherd's /metrics, scraped over HTTP from the metrics part started as tetherd starts it, reading real
// parts against a real redis-server: IPAM (a pod pool and a floating pool), the load balancer controller
// (every Service has a target on this node: it holds every VIP), the health checks of a Local Service, and
// the socket API counting CNI requests. Egress is its controller's status (it needs BPF, a BFD thread and
// gateway pods: the testbed's). The scrape follows Prometheus's naming rules and agrees with the status
// the same parts give `tetherctl status`, read over the socket as tetherctl reads it.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { Writable } from 'node:stream';
import { makeLogger, setLogger } from '../../lib/log';
import { validatePools } from '../../ipam/pool';
import { RedisStore } from '../../ipam/store/redis-store';
import { LazyStore } from '../../ipam/store/lazy-store';
import { LbController } from '../../daemon/lb/lb-controller';
import { connectLbStore } from '../../daemon/lb/lb-store';
import { resolveLoadBalancers } from '../../daemon/lb/lb-spec';
import { PodStore } from '../../daemon/state/pod-store';
import { AttachService } from '../../daemon/pod/attach-service';
import { Ipam } from '../../daemon/parts/ipam';
import { Egress } from '../../daemon/parts/egress';
import { Health, LoadBalancer } from '../../daemon/parts/lb';
import { apiServer } from '../../daemon/parts/api';
import { CurrentConfig } from '../../daemon/parts/source';
import { metricsServer, type MetricsServer } from '../../daemon/parts/metrics';
import { TetherMetrics } from '../../daemon/metrics/tether-metrics';
import { LoopLag } from '../../daemon/util/loop-lag';
import { call } from '../../lib/api/client';
import type { ApiServer } from '../../daemon/server';
import type { ConfigObjects } from '../../daemon/config/objects';
import type { ConfigSource } from '../../daemon/config/source';
import type { EgressController } from '../../daemon/egress/egress-controller';
import type { Options } from '../../daemon/options';
import { lbServiceObjects } from '../lib/lb-objects';
import { startRedis, type TestRedis } from '../lib/redis';
import { compareWithStatus, expectedFromStatus, namingProblems, parseExposition, scrapeMetrics } from '../lib/metrics';
import { freePort } from '../lib/ports';

const quiet = makeLogger({ level: 'error', stream: new Writable({ write: (_c, _e, cb) => cb() }) });
setLogger(quiet);

/** What EgressController reports on a node owning one address and standing by for another (field for field). */
const egressController = {
  status: (o: { observe?: boolean } = {}) => {
    observed.push(o.observe !== false);
    return [
      {
        egress: 'shop/out', address: '198.51.100.9', pool: 'float', owner: 'shop/gw-1', ownerNode: 'n1', ownerZone: 'a', epoch: 3,
        flows: 12, packets: 3400, bytes: 512000, clusterFlows: undefined, clusterBytes: undefined, ownedHere: true, recorded: true, storeReachable: true,
        inSync: ['n2'], candidates: [], takeovers: { initial: 1, failover: 1 },
        sync: [{ peer: '10.0.0.2', state: 'streaming', entriesSent: 340, lagEntries: 2, lagMs: 4, resyncs: 1 }],
        lastTakeover: { at: '2025-01-01T00:00:00.000Z', cause: 'failover: owner shop/gw-2 on n2 is down', ms: 12, epoch: 3, from: 'shop/gw-2', to: 'shop/gw-1', decidedBy: 'n1' },
      },
      {
        egress: 'shop/out', address: '198.51.100.10', pool: 'float', owner: 'shop/gw-2', ownerNode: 'n2', epoch: 1,
        flows: 3, packets: 30, bytes: 4000, ownedHere: false, recorded: true, storeReachable: true, inSync: ['n1'], candidates: [], takeovers: {},
        sync: [{ from: 'n2', entriesApplied: 77, resyncs: 2 }],
        standbySync: { inSync: false, ownerNode: 'n2', reason: 'version', message: 'its sync connection was refused (version)', since: '2025-01-01T00:00:00.000Z', reported: true },
      },
    ];
  },
  egressSummary: () => ({ 'shop/out': { asked: 2, allocated: 2, owned: 2, ownerNodes: 2, capLimited: false } }),
  security: () => ({
    bfdRejected: { malformed: 1, noSession: 0, wrongSource: 0, authMismatch: 0, badKeyId: 0, badDigest: 2, replay: 0 },
    syncRejected: { auth: 1, replay: 0, malformed: 0, oversize: 0, stale: 0, timeout: 0, version: 2 },
    noticesRejected: { malformed: 0, badMac: 3, replay: 0, stale: 0, oversize: 0 }, notices: { rx: 10, tx: 10, accepted: 7 }, guard: {},
  }),
  bfdStatus: () => ({ threadLagMaxMs: 7, threadLagMaxPerSecondMs: [], sessions: [{ peer: '10.0.0.2', state: 'Up', ups: 2, downs: 1, rx: 900, tx: 910 }] }),
  storeReachable: () => true,
};
const observed: boolean[] = [];
/** The error code tetherd answered a malformed cni.add with. */
let refusedCode = '';
/** The health-check port of the Local Service. */
let healthPort = 0;

let redis: TestRedis;
let dir: string;
let socket: string;
let metricsListener: MetricsServer;
let metricsUrl: string;
const cleanups: Array<() => Promise<void> | void> = [];


const cniParams = (id: string) => ({
  command: 'ADD', containerId: id, netns: '/proc/self/ns/net', ifName: 'eth0', args: { K8S_POD_NAMESPACE: 'shop', K8S_POD_NAME: id },
  config: { cniVersion: '1.0.0', name: 'podnet', type: 'ptp', ipam: { type: 'tether-ipam', pool: 'pods' } },
});

test.before(async () => {
  redis = await startRedis();
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tether-metrics-'));
  socket = path.join(dir, 'tetherd.sock');
  const pools = validatePools([
    { apiVersion: 'tether.dev/v1alpha1', kind: 'AddressPool', metadata: { name: 'pods' }, spec: { usage: 'pod', ipv4: { cidr: '10.70.0.0/24', blockSize: 28 } } },
    { apiVersion: 'tether.dev/v1alpha1', kind: 'AddressPool', metadata: { name: 'float' }, spec: { usage: 'floating', ipv4: { cidr: '198.51.100.0/28' }, reserved: ['198.51.100.2/31'] } },
    { apiVersion: 'tether.dev/v1alpha1', kind: 'AddressPool', metadata: { name: 'lb' }, spec: { usage: 'loadBalancer', ipv4: { cidr: '198.18.0.0/24' } } },
  ]);
  const config: ConfigObjects = { pools, nodes: { n1: { labels: {} } }, others: [] };
  const store = new LazyStore(() => RedisStore.connect(redis.url, { keyPrefix: 'm:' }));
  cleanups.push(() => store.close());
  const ipam = new Ipam({ nodeName: 'n1', config, source: {} as ConfigSource, store, stateDir: path.join(dir, 'state'), logger: quiet });
  await ipam.start();
  cleanups.push(() => ipam.stop());
  const mappings = await connectLbStore(redis.url, { keyPrefix: 'm:' });
  cleanups.push(() => mappings.connection.close());
  const podStore = new PodStore(path.join(dir, 'state'));
  const attach = new AttachService(podStore, quiet);
  const ctl = new LbController({
    node: { name: 'n1', address: '127.0.0.1' }, pinDir: path.join(dir, 'bpf'), fouPort: 5555, exportTable: 0, maxVips: 16,
    store: mappings, addresses: ipam.addresses, attach, logger: quiet,
  });
  cleanups.push(() => ctl.stop());
  // Three Services with their target here (so this node holds their VIPs), one with externalTrafficPolicy Local.
  const objects = lbServiceObjects(3, () => 'n1');
  const local = objects.find((o) => (o.metadata as { name: string }).name === 'svc-2')!;
  healthPort = await freePort();
  local.spec = { ...(local.spec as object), externalTrafficPolicy: 'Local', healthCheckNodePort: healthPort };
  await ctl.apply(resolveLoadBalancers(objects, pools));
  const health = new Health({ 'health-port': '0' } as Options, { lb: ctl, nodeName: 'n1', eligible: true, logger: quiet });
  await health.start();
  cleanups.push(() => health.stop());

  // A floating address held before the metrics start: the cluster-wide figure is read at start, then at most every 30 s.
  await ipam.addresses.allocate({ pool: 'float', owner: 'egress/shop/out#0', count: 1 });
  const metrics = new TetherMetrics(quiet);
  metricsListener = metricsServer({ address: { host: '127.0.0.1', port: 0 }, metrics, parts: { ipam, egress: egressController as unknown as EgressController, lb: ctl, health: () => health.checks, store }, logger: quiet });
  await metricsListener.start();
  cleanups.push(() => metricsListener.stop());
  metricsUrl = `http://127.0.0.1:${metricsListener.boundAddress()!.port}/metrics`;
  const server: ApiServer = apiServer({
    socket, nodeName: 'n1', stateDir: path.join(dir, 'state'), bpfPinDir: path.join(dir, 'bpf'), current: new CurrentConfig(config, 'n1'), podStore, attach, ipam,
    subsystems: [ipam, new Egress(egressController as unknown as EgressController, quiet), new LoadBalancer(ctl, quiet), health, metricsListener], loopLag: new LoopLag(), logger: quiet,
    cniAnswered: (plugin, command, seconds, code) => metrics.cniAnswered(plugin, command, seconds, code),
  });
  await server.listen();
  cleanups.push(() => server.close());
  // Through the socket, as the CNI executables send them: a pod address, a refused ADD.
  await call(socket, 'ipam.add', cniParams('c1'));
  refusedCode = await call(socket, 'cni.add', { config: {} }).then(() => 'answered', (e: { code?: string }) => String(e.code));
});

test.after(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
  await redis?.stop();
  if (dir) fs.rmSync(dir, { recursive: true, force: true });
});

test('GET /metrics: the text format\'s content type; every family has HELP and TYPE, counters end in _total, names are tether_ (or prom-client\'s process_, nodejs_), labels bounded', async () => {
  const s = await scrapeMetrics(metricsUrl);
  assert.match(String(s.contentType), /^text\/plain; version=0\.0\.4/);
  assert.equal(namingProblems(s), []);
  const names = [...s.families.keys()];
  for (const n of ['tether_store_reachable', 'tether_ipam_pod_addresses_allocated', 'tether_egress_address_owner_info', 'tether_bfd_session_state', 'tether_conntrack_sync_lag_seconds', 'tether_lb_mappings', 'tether_health_service_healthy', 'tether_cni_requests_total', 'tether_cni_request_duration_seconds', 'process_cpu_seconds_total', 'nodejs_heap_size_used_bytes']) {
    assert.ok(names.includes(n), `${n} in the scrape`);
  }
  assert.is(s.families.get('tether_cni_request_duration_seconds')!.type, 'histogram');
  assert.equal(observed.filter((o) => o), [], 'a scrape does not have the Egress store pass read cluster-wide use on its account');
});

test('other paths are 404, other methods 405; HEAD answers without a body', async () => {
  const base = metricsUrl.replace('/metrics', '');
  assert.is((await fetch(`${base}/`)).status, 404);
  assert.is((await fetch(`${base}/metricsx`)).status, 404);
  const post = await fetch(metricsUrl, { method: 'POST' });
  assert.is(post.status, 405);
  assert.is(post.headers.get('allow'), 'GET, HEAD');
  const head = await fetch(metricsUrl, { method: 'HEAD' });
  assert.is(head.status, 200);
  assert.is(await head.text(), '');
});

test('the scrape agrees with tetherctl status: IPAM, Egress, BFD, conntrack sync, LB per VIP, health checks, store reachability', async () => {
  // A load balancer asking the Local Service's health check once.
  await fetch(`http://127.0.0.1:${healthPort}/healthz`).then((r) => r.text());
  const status = await call<Record<string, any>>(socket, 'status', {});
  const s = await scrapeMetrics(metricsUrl);
  const expected = expectedFromStatus(status);
  // The comparison covers every part (an empty status would agree with anything).
  const covered = new Set(expected.map((e) => e.name.split('_').slice(0, 2).join('_')));
  assert.equal([...covered].sort(), ['tether_bfd', 'tether_conntrack', 'tether_egress', 'tether_health', 'tether_ipam', 'tether_lb', 'tether_store']);
  assert.equal(compareWithStatus(status, s), []);
  // Spot checks against the status's own fields.
  assert.equal(status.storeReachable, { ipam: true, egress: true, lb: true });
  assert.is(s.value('tether_ipam_pod_addresses_allocated', { pool: 'pods', family: 'ipv4' }), 1, 'the ADD sent above');
  assert.is(s.value('tether_ipam_pod_addresses_capacity', { pool: 'pods', family: 'ipv4' }), 15, 'one /28 block: 16 less its first');
  assert.is(s.value('tether_ipam_cluster_addresses_allocated', { pool: 'float' }), 1);
  assert.is(s.value('tether_ipam_cluster_addresses_capacity', { pool: 'float' }), 12, '/28 less network, broadcast and 2 reserved');
  assert.is(s.value('tether_egress_address_takeovers_total', { address: '198.51.100.9', cause: 'failover' }), 1);
  assert.is(s.value('tether_egress_address_owner_info', { address: '198.51.100.10' , owner_node: 'n2' }), 1);
  assert.is(s.value('tether_conntrack_sync_lag_seconds', { address: '198.51.100.9', peer: '10.0.0.2' }), 0.004);
  assert.is(s.value('tether_conntrack_sync_applied_entries_total', { address: '198.51.100.10', peer: 'n2' }), 77);
  assert.is(s.value('tether_bfd_session_state', { peer: '10.0.0.2', state: 'Up' }), 1);
  assert.is(s.value('tether_bfd_session_state', { peer: '10.0.0.2', state: 'Down' }), 0);
  assert.is(s.value('tether_bfd_rejected_packets_total', { reason: 'badDigest' }), 2);
  const lbs = status.loadBalancers as Array<{ service: string; vip?: string }>;
  assert.is(lbs.filter((l) => l.vip).length, 3, 'every Service has its VIP (each has a target here)');
  assert.is(s.samples('tether_lb_vip_announced').length, 3);
  const local = (status.health.services as Array<{ service: string; localEndpoints: number; answer: number }>).find((x) => x.service === 'shop/svc-2')!;
  const answers = status.health.answers as Array<{ check: string; code: number; count: number }>;
  assert.equal(answers, [{ check: 'service', code: local.answer, count: 1 }], 'the one health check asked (before)');
  assert.is(s.value('tether_health_answers_total', { check: 'service', code: String(local.answer) }), 1);
  assert.is(local.localEndpoints, 1);
  assert.is(s.value('tether_health_service_local_endpoints', { service: 'shop/svc-2' }), 1);
  assert.is(s.value('tether_health_service_healthy', { service: 'shop/svc-2' }), local.answer === 200 ? 1 : 0);
  assert.equal(status.metrics, { address: `127.0.0.1:${metricsListener.boundAddress()!.port}`, listening: true });
});

test('CNI requests: counted by plugin, command and result (ok or the error code), their answer time in a histogram', async () => {
  await call(socket, 'cni.status', {});
  const s = await scrapeMetrics(metricsUrl);
  assert.is(s.value('tether_cni_requests_total', { plugin: 'tether-ipam', command: 'ADD', result: 'ok' }), 1);
  assert.is(refusedCode, 'INVALID_CONFIG', 'the network config without a name is refused');
  assert.is(s.value('tether_cni_requests_total', { plugin: 'tether', command: 'ADD', result: 'INVALID_CONFIG' }), 1);
  assert.is(s.value('tether_cni_requests_total', { plugin: 'tether', command: 'STATUS', result: 'ok' }), 1);
  assert.is(s.value('tether_cni_request_duration_seconds_count', { plugin: 'tether-ipam', command: 'ADD' }), 1);
  assert.is(s.value('tether_cni_request_duration_seconds_bucket', { plugin: 'tether-ipam', command: 'ADD', le: '+Inf' }), 1);
  assert.ok(s.value('tether_cni_request_duration_seconds_sum', { plugin: 'tether-ipam', command: 'ADD' })! > 0);
  assert.is(s.value('tether_cni_request_duration_seconds_count', { plugin: 'tether', command: 'ADD' }), 1, 'a refused request is timed too');
  // Methods that are not CNI requests are not counted.
  assert.equal(s.samples('tether_cni_requests_total').map((x) => x.labels.command).sort(), ['ADD', 'ADD', 'STATUS']);
});

test('the exposition parser refuses what is malformed (a test helper the testbed uses)', () => {
  assert.throws(() => parseExposition('# TYPE x counter\n# TYPE x gauge\nx 1\n'), /second TYPE/);
  assert.throws(() => parseExposition('x{a="1} 2\n'), /not closed/);
  assert.throws(() => parseExposition('x{a=1} 2\n'), /not quoted/);
  assert.throws(() => parseExposition('x one\n'), /not a sample value/);
  const p = parseExposition('# HELP x_total a \\\\ b\n# TYPE x_total counter\nx_total{a="q\\"\\n"} 3 1700000000\n');
  assert.equal(p.families.get('x_total'), { name: 'x_total', help: 'a \\ b', type: 'counter', samples: [{ name: 'x_total', labels: { a: 'q"\n' }, value: 3 }] });
  assert.equal(namingProblems(parseExposition('# HELP tether_x_ms t\n# TYPE tether_x_ms counter\ntether_x_ms{pod_ip="1"} 1\n')), [
    'tether_x_ms: a counter not ending in _total', 'tether_x_ms: a unit that is not a base unit (seconds, bytes, ratio)', 'tether_x_ms: label pod_ip is unbounded (per pod, flow or client)',
  ]);
});

test.run();
