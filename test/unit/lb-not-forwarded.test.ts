// An IPv6 VIP that a node's LB pods select while the node has no IPv6 address is reported by name (the
// node programs nothing of it: test/kernel/lb-no-ipv6-node.test.ts): the node's health report carries it
// (lb-health-report's optional notForwarded, left out when there is none, so the report is byte for byte
// what a release before wrote), tether-operator's status pass turns every node's reports into the
// Service's tether.dev/Forwarding condition (added only on a Service some node reported; True, not gone,
// once none does; kept when the reports cannot be read), and the node's Event names the Service, VIP and node.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { Writable } from 'node:stream';
import { makeLogger, setLogger } from '../../lib/log';
import { ClusterAddresses } from '../../ipam/cluster-addresses';
import { validatePools } from '../../ipam/pool';
import { RedisStore } from '../../ipam/store/redis-store';
import { connectLbStore } from '../../daemon/lb/lb-store';
import { resolveLoadBalancers } from '../../daemon/lb/lb-spec';
import { noAddress6Problem } from '../../daemon/lb/lb-state';
import { FORWARDING_CONDITION, StatusController, forwardingCondition } from '../../daemon/kube/status-controller';
import { HealthController, type NodeHealthReport, type NotForwardedVip } from '../../daemon/health/health-controller';
import { HealthReports } from '../../daemon/health/health-reports';
import { notForwardedEvent } from '../../daemon/kube/tether-events';
import type { TetherEvent } from '../../daemon/kube/event-recorder';
import { LbView } from '../../operator/cluster-view';
import { LB_CLASS, TETHER_SERVICE_LABEL } from '../../daemon/objects/names';
import { apiWithSource } from '../lib/kube-fixture';
import { startRedis, type TestRedis } from '../lib/redis';

const quiet = makeLogger({ level: 'error', stream: new Writable({ write: (_c, _e, cb) => cb() }) });
setLogger(quiet);
const pools = validatePools([
  { apiVersion: 'tether.dev/v1alpha1', kind: 'AddressPool', metadata: { name: 'lb' }, spec: { usage: 'loadBalancer', ipv4: { cidr: '198.18.0.0/28' }, ipv6: { cidr: '2001:db8:18::/124' } } },
]);
const service = (name: string) => ({
  apiVersion: 'v1', kind: 'Service', metadata: { name, namespace: 'shop', labels: { [TETHER_SERVICE_LABEL]: 'true' } },
  spec: { type: 'LoadBalancer', loadBalancerClass: LB_CLASS, ipFamilyPolicy: 'RequireDualStack', ipFamilies: ['IPv4', 'IPv6'], ports: [{ port: 80, protocol: 'TCP' }] },
});
const slices = (name: string) => [
  { apiVersion: 'discovery.k8s.io/v1', kind: 'EndpointSlice', metadata: { name: `${name}-4`, namespace: 'shop', labels: { 'kubernetes.io/service-name': name } }, addressType: 'IPv4', endpoints: [{ addresses: ['10.244.1.5'] }] },
  { apiVersion: 'discovery.k8s.io/v1', kind: 'EndpointSlice', metadata: { name: `${name}-6`, namespace: 'shop', labels: { 'kubernetes.io/service-name': name } }, addressType: 'IPv6', endpoints: [{ addresses: ['fd00:244::5'] }] },
];

const VIP6 = '2001:db8:18::3';
const problem = noAddress6Problem('n2', VIP6, ['shop/lb-7f9c']);
const nf = (service: string) => ({ key: `${service}#IPv6`, service, family: 'IPv6', vip: VIP6, problem });
const report = (notForwarded?: NodeHealthReport['notForwarded']): NodeHealthReport => ({ eligible: true, healthy: true, services: {}, ...(notForwarded ? { notForwarded } : {}) });

let redis: TestRedis;
test.before(async () => {
  redis = await startRedis();
});
test.after(async () => {
  await redis?.stop();
});

test('the node\'s problem names the node, the VIP, why, and the LB pods', () => {
  for (const part of ['node n2', `IPv6 VIP ${VIP6}`, '--node-address-6', 'shop/lb-7f9c', 'not programmed or announced']) assert.ok(problem.includes(part), `${part}: ${problem}`);
  assert.match(noAddress6Problem('n2', VIP6, ['shop/a', 'shop/b']), /LB pods shop\/a, shop\/b select the Service/);
});

test('the Event: a Warning VIPNotForwarded on the Service, its note the node\'s problem', () => {
  const e = notForwardedEvent({ service: 'shop/web', problem });
  assert.equal(e, { regarding: { apiVersion: 'v1', kind: 'Service', namespace: 'shop', name: 'web' }, type: 'Warning', reason: 'VIPNotForwarded', action: 'Announce', note: problem });
});

test('forwardingCondition: each reporting node by name; other Services\' entries and garbled ones passed over; none: undefined', () => {
  const reports: Record<string, NodeHealthReport> = {
    n3: report([{ ...nf('shop/web'), vip: '2001:db8:18::4', problem: noAddress6Problem('n3', '2001:db8:18::4', ['shop/lb-2']) }]),
    n2: report([nf('shop/web'), nf('shop/db')]),
    n4: { ...report(), notForwarded: [{ service: 'shop/web' } as never, null as never] },
    n5: { ...report(), notForwarded: 'garbled' as never },
    n1: report(),
  };
  const c = forwardingCondition('shop/web', reports)!;
  assert.equal([c.type, c.status, c.reason], [FORWARDING_CONDITION, 'False', 'NodeCannotForward']);
  assert.is(c.message, `${problem}; ${noAddress6Problem('n3', '2001:db8:18::4', ['shop/lb-2'])}`, 'node by node, in name order');
  assert.is(forwardingCondition('shop/other', reports), undefined);
  assert.is(forwardingCondition('shop/web', { n1: report() }), undefined);
});

test('the health report carries the VIPs not forwarded, and leaves the field out when there is none (as a release before wrote it)', async () => {
  let list: NotForwardedVip[] = [];
  const h = new HealthController({ node: 'n2', port: 0, services: () => [], programming: () => ({}), eligible: () => true, logger: quiet, notForwarded: () => list });
  assert.equal(Object.keys(h.report()).sort(), ['eligible', 'healthy', 'services']);
  list = [nf('shop/web')];
  assert.equal(h.report().notForwarded, [nf('shop/web')]);
  // Through the store as the leader reads it.
  const store = await connectLbStore(redis.url, { keyPrefix: 'nf-report:' });
  try {
    const reports = new HealthReports(store.connection);
    await reports.write('n2', h.report(), 30_000);
    assert.equal((await reports.read())['n2'].notForwarded, [nf('shop/web')]);
  } finally {
    await store.connection.close();
  }
});

test('the status pass: Forwarding False on the reported Service only (Ready as before), kept while unreadable, True once no node reports it', async () => {
  const objects = [service('web'), ...slices('web'), service('db'), ...slices('db')];
  const ipam = await RedisStore.connect(redis.url, { keyPrefix: 'nf-status:' });
  const store = await connectLbStore(redis.url, { keyPrefix: 'nf-status:' });
  const { api, source, close } = await apiWithSource(objects.filter((o) => o.kind === 'Service'), quiet);
  try {
    const view = new LbView({ identity: 'tether-operator-0', addresses: new ClusterAddresses(pools, ipam, quiet, { holdOffMs: 0 }), store, logger: quiet });
    await view.refresh(resolveLoadBalancers(objects, pools), pools);
    let reports: Record<string, NodeHealthReport> | undefined = { n1: report(), n2: report([nf('shop/web')]) };
    const events: TetherEvent[] = [];
    const ctl = new StatusController({
      kc: source.kc, logger: quiet, verdicts: () => new Map(), egressAddresses: () => [], everyMs: 3_600_000, gcEveryMs: 3_600_000,
      loadBalancers: () => view.status(), events: (e) => events.push(e),
      healthReports: () => (reports ? Promise.resolve(reports) : Promise.reject(new Error('store away'))),
    });
    const conditions = (n: string) => api.get('Service', n, 'shop')?.status?.conditions as Array<Record<string, string>>;
    const cond = (n: string, type: string) => conditions(n).find((c) => c.type === type);
    await ctl.pass();
    const f = cond('web', FORWARDING_CONDITION)!;
    assert.equal([f.status, f.reason, f.message], ['False', 'NodeCannotForward', problem]);
    assert.equal([cond('web', 'tether.dev/Ready')!.status, cond('web', 'tether.dev/Ready')!.reason], ['True', 'Serving'], 'Ready as before: other nodes serve the VIP');
    assert.equal(conditions('db').map((c) => c.type), ['tether.dev/Ready'], 'a Service no node reported: its conditions as before');
    assert.equal(api.get('Service', 'web', 'shop')?.status?.loadBalancer?.ingress.length, 2, 'both VIPs listed, as before');
    assert.equal(events, [], 'the Event is the node\'s (one per node), not the leader\'s');
    // The reports cannot be read: the condition stays as it was.
    reports = undefined;
    await ctl.pass();
    assert.equal(cond('web', FORWARDING_CONDITION)!.status, 'False');
    // No node reports it any more: True, not gone.
    reports = { n1: report(), n2: report() };
    await ctl.pass();
    const ok = cond('web', FORWARDING_CONDITION)!;
    assert.equal([ok.status, ok.reason], ['True', 'Forwarding']);
    assert.equal(conditions('db').map((c) => c.type), ['tether.dev/Ready']);
  } finally {
    await close();
    await store.connection.close();
    await ipam.close();
  }
});

test.run();
