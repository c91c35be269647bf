// Kubernetes Events from tetherd, against the FAKE API server (test/lib/fake-apiserver.ts): a failover
// decided by this node's real election (Election among the controller's parts, whose kernel side and store are
// recording stand-ins) is one Event on the Egress with the fields kubectl shows; the same move repeated is
// one Event whose series counts it; a storm of 1,000 takeovers costs a bounded number of requests (each
// object's token bucket) and never makes the caller wait, even with the API server not answering (the
// queue is bounded); a refusal is one Event, written by the leader's status pass once, and not again by a
// new leader; a health-check answer flipping is an Event on the Service.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import * as fs from 'node:fs';
import * as net from 'node:net';
import * as os from 'node:os';
import * as path from 'node:path';
import { Writable } from 'node:stream';
import * as k8s from '@kubernetes/client-node';
import { apiWithSource } from '../lib/kube-fixture';
import { kubeconfigFor } from '../lib/fake-apiserver';
import { captureLogger } from '../lib/log-capture';
import { waitFor } from '../lib/wait';
import { makeLogger } from '../../lib/log';
import { EventRecorder, REPORTING_CONTROLLER } from '../../daemon/kube/event-recorder';
import { KubeReporting } from '../../daemon/parts/kube-reporting';
import { StatusController } from '../../daemon/kube/status-controller';
import { ownershipEvent } from '../../daemon/kube/tether-events';
import type { OwnershipChange } from '../../daemon/egress/egress-state';
import { egressParts, type EgressParts } from '../../daemon/egress/egress-controller';
import { addressSlots, type ResolvedEgress } from '../../daemon/egress/egress-spec';
import type { GatewayInfo, OwnershipStore } from '../../daemon/egress/ownership-store';
import type { GatewayDatapath } from '../../daemon/egress/gateway-datapath';
import type { ClusterAddresses } from '../../ipam/cluster-addresses';
import type { AttachService } from '../../daemon/pod/attach-service';
import { HealthController } from '../../daemon/health/health-controller';
import type { ResolvedLoadBalancer } from '../../daemon/lb/lb-spec';
import { freePort } from '../lib/ports';

type Obj = Record<string, any>;
const quiet = makeLogger({ level: 'error', stream: new Writable({ write: (_c, _e, cb) => cb() }) });
const V = 'tether.dev/v1alpha1';
const MICRO = /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$/;

const egressObj = (name: string, ns = 'shop') => ({
  apiVersion: V, kind: 'Egress', metadata: { name, namespace: ns },
  spec: { clients: { podSelector: { matchLabels: { app: 'web' } } }, gateways: { podSelector: { matchLabels: { app: 'gw' } } }, addresses: { pool: 'float' } },
});
const node = { apiVersion: 'v1', kind: 'Node', metadata: { name: 'n1' } };
const events = (api: { list(kind: string): Obj[] }) => api.list('Event');
const eventCalls = (api: { requests: string[] }) => api.requests.filter((r) => r.includes('/apis/events.k8s.io/'));

const EGRESS: ResolvedEgress = {
  key: 'shop/out', name: 'out', namespace: 'shop',
  clients: { matchLabels: { app: 'web' } }, gateways: { matchLabels: { app: 'gw' } },
  families: [4], destinations: ['203.0.113.0/24'], excluded: [], addresses: [{ pool: 'float', count: 1 }], zonePolicy: 'any',
  failover: { intervalMs: 50, detectMultiplier: 3 }, announce: { mode: 'l2' },
};

/**
 * Node n1's egress controller parts around the real Election, with gateway shop/gw-a here and the
 * address owned (epoch 3) by shop/gw-b on n2, whose BFD session was Up and went Down.
 */
function egressNode(onOwnershipChanged: (c: OwnershipChange) => void, netns: string): EgressParts & { owned: string[] } {
  const owned: string[] = [];
  const ownership = { record: async () => 'recorded', get: async () => undefined, on: () => undefined } as unknown as OwnershipStore;
  const parts = egressParts({
    node: { name: 'n1', address: '10.1.0.1', uplink: 'eth0' }, pinDir: '/nonexistent', fouPort: 0, syncPort: 0, clusterKey: Buffer.alloc(32),
    egresses: [EGRESS], ownership, addresses: {} as ClusterAddresses, attach: {} as AttachService, logger: quiet, conntrackSync: false, onOwnershipChanged,
  });
  const { s } = parts;
  const gwA: GatewayInfo = { pod: 'shop/gw-a', node: 'n1', nodeAddress: '10.1.0.1', podIp: '10.244.1.5' };
  const gwB: GatewayInfo = { pod: 'shop/gw-b', node: 'n2', nodeAddress: '10.1.0.2', podIp: '10.244.2.5' };
  const datapath = { own: (a: string) => owned.push(a), takeUnannounced: () => undefined, release: () => undefined } as unknown as GatewayDatapath;
  s.gateways.set(gwA.pod, { info: gwA, datapath, egresses: new Set([EGRESS.key]), guarded: '', netns });
  s.registry.set(EGRESS.key, [gwB]);
  // n2's BFD session came Up once and is Down now.
  (parts.peers as unknown as { bfdInfo: Map<string, unknown> }).bfdInfo.set(gwB.nodeAddress, { everUp: true, createdAt: 0 });
  const st = s.track(EGRESS, '198.51.100.7', addressSlots(EGRESS)[0], { egress: EGRESS.key, address: '198.51.100.7', owner: gwB.pod, epoch: 3, ownerNode: 'n2', ownerNodeAddress: gwB.nodeAddress, ownerPodIp: gwB.podIp });
  st.inSync = new Set(['n1']);
  return { ...parts, owned };
}

test('a failover decided by this node is one Event on the Egress: reason, type, action, note naming address, nodes and cause, reporting fields, uid', async () => {
  const { api, source, close } = await apiWithSource([node, egressObj('out')], quiet);
  const netns = fs.mkdtempSync(path.join(os.tmpdir(), 'tether-events-netns-'));
  const reporting = new KubeReporting({ source, nodeName: 'n1', version: '9.9.9', storeConfigured: true, bpfPinDir: '/sys/fs/bpf/tether', roleProblems: () => [], logger: quiet });
  try {
    const { s, election, owned } = egressNode(reporting.onOwnershipChanged, netns);
    await election.tick();
    assert.equal(owned, ['198.51.100.7'], 'n1 took the address over (its gateway datapath holds it)');
    await reporting.events.flush();
    const list = events(api);
    assert.is(list.length, 1, JSON.stringify(list));
    const e = list[0];
    assert.is(e.metadata.namespace, 'shop');
    assert.is(e.reason, 'Takeover');
    assert.is(e.type, 'Warning');
    assert.is(e.action, 'Failover');
    assert.is(e.reportingController, REPORTING_CONTROLLER);
    assert.is(e.reportingInstance, 'n1');
    assert.equal(e.regarding, { apiVersion: V, kind: 'Egress', namespace: 'shop', name: 'out', uid: api.get('Egress', 'out', 'shop')!.metadata.uid });
    assert.match(e.eventTime, MICRO, 'eventTime is a MicroTime (six fractional digits, or the API refuses it)');
    assert.is(e.series, undefined);
    for (const part of ['198.51.100.7', 'shop/gw-b on node n2', 'shop/gw-a on node n1', 'failover: owner shop/gw-b on n2 is down']) assert.ok(e.note.includes(part), `note names ${part}: ${e.note}`);
    s.stopped = true;
  } finally {
    await reporting.stop();
    fs.rmSync(netns, { recursive: true, force: true });
    await close();
  }
});

const change = (i: number, egress = 'shop/out'): OwnershipChange => ({
  egress, address: `198.51.100.${i % 16}`, from: { pod: 'shop/gw-b', node: 'n2' }, to: { pod: 'shop/gw-a', node: 'n1' },
  cause: 'failover: owner shop/gw-b on n2 is down', epoch: 10 + i, decidedBy: 'n1',
});

test('the same takeover repeated within the window is one Event whose series counts it; another address is another Event', async () => {
  const { api, source, close } = await apiWithSource([node, egressObj('out')], quiet);
  let now = Date.parse('2026-01-01T00:00:00Z');
  const rec = new EventRecorder({ kc: source.kc, nodeName: 'n1', logger: quiet, now: () => now });
  try {
    rec.emit(ownershipEvent(change(0)));
    await rec.flush();
    now += 1000;
    rec.emit(ownershipEvent(change(16))); // the same address, nodes and cause: another epoch only
    await rec.flush();
    now += 1000;
    rec.emit(ownershipEvent(change(32)));
    rec.emit(ownershipEvent(change(1)));
    await rec.flush();
    const list = events(api);
    assert.is(list.length, 2, JSON.stringify(list.map((e) => e.note)));
    const first = list.find((e) => e.note.includes('198.51.100.0 '))!;
    assert.equal(first.series, { count: 3, lastObservedTime: '2026-01-01T00:00:02.000000Z' });
    assert.is(first.eventTime, '2026-01-01T00:00:00.000000Z', 'the Event keeps its first time');
    assert.is(list.find((e) => e.note.includes('198.51.100.1 '))!.series, undefined);
    assert.equal(eventCalls(api).map((r) => r.split(' ')[0]), ['POST', 'PATCH', 'PATCH', 'POST'], 'each repeat written as the series (a PATCH), never a new Event');
    assert.is(rec.stats.aggregated, 2);
    // Past the window, the same takeover is a new Event.
    now += 11 * 60_000;
    rec.emit(ownershipEvent(change(48)));
    await rec.flush();
    assert.is(events(api).length, 3);
  } finally {
    await rec.stop();
    await close();
  }
});

test('a storm of 1,000 takeovers: a bounded number of requests (burst per object), the excess dropped with one debug line per object, repeats counted and written when the budget refills', async () => {
  const { api, source, close } = await apiWithSource([node, egressObj('out'), egressObj('out2')], quiet);
  const { logger, lines, settle } = captureLogger();
  let now = Date.parse('2026-01-01T00:00:00Z');
  // The clock stands still through the storm (no refill); the refill check runs every 200 ms.
  const rec = new EventRecorder({ kc: source.kc, nodeName: 'n1', logger, now: () => now, burst: 16, refillMs: 200 });
  // 40 addresses over 2 Egresses: 20 distinct takeovers each, each repeated 25 times.
  const storm = (i: number): OwnershipChange => ({ ...change(0, i % 2 ? 'shop/out' : 'shop/out2'), address: `198.51.100.${i % 40}` });
  try {
    const t0 = eventCalls(api).length;
    for (let batch = 0; batch < 10; batch++) {
      for (let i = batch * 100; i < (batch + 1) * 100; i++) {
        const r = rec.emit(ownershipEvent(storm(i))) as unknown;
        assert.is(r, undefined, 'emit returns nothing to wait for');
      }
      await rec.flush();
    }
    const calls = eventCalls(api).length - t0;
    assert.is(calls, 2 * 16, `exactly the burst of each of the 2 objects: ${calls} requests for 1,000 takeovers`);
    assert.is(events(api).length, 32, '16 Events per Egress; its 4 other takeovers dropped');
    assert.is(rec.stats.emitted, 1000);
    assert.is(rec.stats.created + rec.stats.aggregated + rec.stats.rateLimited, 1000, JSON.stringify(rec.stats));
    assert.is(rec.stats.rateLimited, 200, 'the 4 takeovers past the burst of each Egress, each time they came');
    await settle();
    const limited = lines.filter((l) => /rate-limited/.test(l.message));
    assert.equal(limited.map((l) => l.object).sort(), ['Egress shop/out', 'Egress shop/out2'], 'one debug line per object, not one per Event dropped');
    assert.ok(limited.every((l) => l.level === 'debug'));
    // Time passes, the budget refills: each series' count of the repeats folded meanwhile is written (one PATCH each).
    now += 10 * 60_000 - 1000;
    await waitFor(() => events(api).every((e) => e.series?.count === 25), 'every series written with its 25 occurrences', {
      describe: () => JSON.stringify(events(api).map((e) => e.series?.count)),
    });
    assert.is(eventCalls(api).length - t0, 64, 'one PATCH per Event');
  } finally {
    await rec.stop();
    await close();
  }
});

test('with the API server not answering, 1,000 takeovers over 100 Egresses return at once and the queue stays bounded', async () => {
  // A server that accepts connections and never answers.
  const sockets: net.Socket[] = [];
  const hung = net.createServer((c) => sockets.push(c));
  await new Promise<void>((r) => hung.listen(0, '127.0.0.1', r));
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tether-events-hung-'));
  fs.writeFileSync(path.join(dir, 'kubeconfig'), kubeconfigFor(`http://127.0.0.1:${(hung.address() as net.AddressInfo).port}`));
  const kc = new k8s.KubeConfig();
  kc.loadFromFile(path.join(dir, 'kubeconfig'));
  const rec = new EventRecorder({ kc, nodeName: 'n1', logger: quiet, queueSize: 64 });
  try {
    // 1,000 distinct takeovers (10 per Egress: within each one's burst), none answered.
    for (let i = 0; i < 1000; i++) rec.emit(ownershipEvent({ ...change(i, `shop/e-${i % 100}`), address: `10.0.${i >> 8}.${i & 255}` }));
    // Every call returned while not one request was answered.
    assert.ok(rec.stats.queued <= 64, `queue bounded: ${rec.stats.queued}`);
    assert.is(rec.stats.emitted, 1000);
    // The queue and the one request the worker has sent; the rest dropped.
    assert.is(rec.stats.queueFull, 1000 - 64 - 1, `the excess dropped: ${rec.stats.queueFull}`);
  } finally {
    await rec.stop(200);
    for (const c of sockets) c.destroy();
    await new Promise((r) => hung.close(r));
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test('a refusal is one Warning Event on the object, written by the leader\'s status pass once; a new leader does not repeat it; accepted again is a Normal Event', async () => {
  const pool = { apiVersion: V, kind: 'AddressPool', metadata: { name: 'float' }, spec: { usage: 'floating', ipv4: { cidr: '198.51.100.0/28' } } };
  const { api, source, close } = await apiWithSource([node, pool, egressObj('out')], quiet);
  let refused: Record<string, string> = { 'Egress shop/out': 'spec.addresses.pool: AddressPool "nope" does not exist' };
  const addrs = [{ egress: 'shop/out', address: '198.51.100.1', owner: 'shop/gw-a', ownerNode: 'n1', epoch: 1 }];
  const leader = (rec: EventRecorder) => new StatusController({
    kc: source.kc, logger: quiet, verdicts: () => source.currentVerdicts(), refused: () => refused, egressAddresses: () => addrs,
    everyMs: 3_600_000, gcEveryMs: 3_600_000, events: (e) => rec.emit(e),
  });
  const rec = new EventRecorder({ kc: source.kc, nodeName: 'n1', logger: quiet });
  try {
    const first = leader(rec);
    await first.pass();
    await first.pass();
    await rec.flush();
    let list = events(api);
    assert.is(list.length, 1, JSON.stringify(list.map((e) => `${e.reason}: ${e.note}`)));
    const e = list[0];
    assert.equal([e.reason, e.type, e.action], ['Refused', 'Warning', 'Validate']);
    assert.equal(e.regarding, { apiVersion: V, kind: 'Egress', namespace: 'shop', name: 'out', uid: api.get('Egress', 'out', 'shop')!.metadata.uid });
    assert.ok(e.note.includes('AddressPool "nope" does not exist'), e.note);
    // Leadership moves: the new leader finds the refusal in the status already and writes no Event.
    await waitFor(() => source.cachedObjects('egresses')[0]?.status?.conditions?.length > 0, 'the status back in the watch');
    await leader(rec).pass();
    await rec.flush();
    assert.is(events(api).length, 1, 'no second Event from the next leader');
    // Valid again (its address held: Ready True): one Normal Event, from the pass that writes it.
    refused = {};
    await leader(rec).pass();
    await leader(rec).pass();
    await rec.flush();
    list = events(api);
    assert.equal(list.map((x) => [x.reason, x.type]).sort(), [['Accepted', 'Normal'], ['Refused', 'Warning']]);
  } finally {
    await rec.stop();
    await close();
  }
});

test('a pool overlapping another is an AddressConflict Event on it', async () => {
  const pool = (name: string, cidr: string, t: string) => ({ apiVersion: V, kind: 'AddressPool', metadata: { name, creationTimestamp: t }, spec: { usage: 'floating', ipv4: { cidr } } });
  const { api, source, close } = await apiWithSource([node, pool('a', '198.51.100.0/28', '2026-01-01T00:00:00Z')], quiet);
  const rec = new EventRecorder({ kc: source.kc, nodeName: 'n1', logger: quiet });
  try {
    api.apply(pool('b', '198.51.100.0/29', '2026-01-01T00:00:01Z'));
    await waitFor(() => source.currentVerdicts().size === 2, 'both pools judged');
    const ctl = new StatusController({ kc: source.kc, logger: quiet, verdicts: () => source.currentVerdicts(), egressAddresses: () => [], everyMs: 3_600_000, gcEveryMs: 3_600_000, events: (e) => rec.emit(e) });
    await ctl.pass();
    await rec.flush();
    const list = events(api);
    assert.equal(list.map((e) => [e.reason, e.type, e.regarding.kind, e.regarding.name, e.metadata.namespace]), [['AddressConflict', 'Warning', 'AddressPool', 'b', 'default']]);
  } finally {
    await rec.stop();
    await close();
  }
});

test('a health-check answer flipping 200 → 503 → 200 on this node is an Event on the Service each time', async () => {
  const { api, source, close } = await apiWithSource([node, { apiVersion: 'v1', kind: 'Service', metadata: { name: 'web', namespace: 'shop' }, spec: {} }], quiet);
  const reporting = new KubeReporting({ source, nodeName: 'n1', version: '9.9.9', storeConfigured: false, bpfPinDir: '/x', roleProblems: () => [], logger: quiet });
  const port = await freePort();
  let healthy = true;
  const lb = { key: 'shop/web', externalTrafficPolicy: 'Local', healthCheckNodePort: port, targets: [{ address: '10.244.1.9', node: 'n1', state: 'active' }] } as unknown as ResolvedLoadBalancer;
  const services = [lb];
  const hc = new HealthController({ node: 'n1', port: 0, services: () => services, programming: () => ({ IPv4: healthy ? { lastUpdated: Date.now() } : { lastUpdated: Date.now() - 120_000, pendingSince: Date.now() - 120_000 } }), eligible: () => true, logger: quiet, onFlip: reporting.onHealthFlip });
  try {
    await hc.start();
    healthy = false;
    await hc.reconcile();
    healthy = true;
    await hc.reconcile();
    await reporting.events.flush();
    const list = events(api).sort((a, b) => a.metadata.creationTimestamp.localeCompare(b.metadata.creationTimestamp) || a.metadata.resourceVersion - b.metadata.resourceVersion);
    assert.equal(list.map((e) => [e.reason, e.type, e.regarding.kind, e.regarding.name]), [['HealthCheckFailing', 'Warning', 'Service', 'web'], ['HealthCheckPassing', 'Normal', 'Service', 'web']]);
    assert.ok(list[0].note.includes(`node n1 answers 503 on health-check port ${port}`), list[0].note);
  } finally {
    await hc.stop();
    await reporting.stop();
    await close();
  }
});


test.run();
