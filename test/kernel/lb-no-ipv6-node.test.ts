// An IPv6 VIP selected by an LB pod on a node without an IPv6 address (no --node-address-6), with the real
// lb.bpf.o (pinned under a unique bpffs directory) and a real redis-server: the node cannot forward it (FoU
// to IPv6 targets leaves from the node's IPv6 address), so nothing of it is programmed — no slot, no entry in
// the datapath's maps, no mapping-store subscription, no route in the main or export table — while the
// Service's IPv4 VIP on the same LB pod is programmed as usual. The node reports it by name: its status
// (nodeProblem), the report the health checks publish for tether-operator's status (notForwarded), one
// error line, and the Event hook once. The LB pod's interface does not exist, so its set-up fails before
// touching the kernel (a role problem): slots, maps and routes are what is under test.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { setLogger } from '../../lib/log';
import { withLbControllerBed } from '../lib/lb-controller-bed';
import { LbDatapath } from '../../daemon/bpf/lb';
import type { NotForwardedVip } from '../../daemon/lb/lb-state';
import { resolveLoadBalancers } from '../../daemon/lb/lb-spec';
import { NetlinkHandle } from '../../daemon/netlink';
import { LB_CLASS } from '../../daemon/objects/names';

const EXPORT_TABLE = 4242;

function objects(): Array<Record<string, unknown>> {
  return [
    {
      apiVersion: 'v1', kind: 'Service', metadata: { name: 'web', namespace: 'shop' },
      spec: { type: 'LoadBalancer', loadBalancerClass: LB_CLASS, ipFamilyPolicy: 'RequireDualStack', ipFamilies: ['IPv4', 'IPv6'], ports: [{ port: 80, protocol: 'TCP' }] },
    },
    {
      apiVersion: 'discovery.k8s.io/v1', kind: 'EndpointSlice', metadata: { name: 'web-4', namespace: 'shop', labels: { 'kubernetes.io/service-name': 'web' } },
      addressType: 'IPv4', endpoints: [{ addresses: ['10.244.9.2'], conditions: { ready: true }, nodeName: 'n2' }],
    },
    {
      apiVersion: 'discovery.k8s.io/v1', kind: 'EndpointSlice', metadata: { name: 'web-6', namespace: 'shop', labels: { 'kubernetes.io/service-name': 'web' } },
      addressType: 'IPv6', endpoints: [{ addresses: ['fd00:10:244:9::2'], conditions: { ready: true }, nodeName: 'n2' }],
    },
  ];
}

test('an IPv6 VIP on a node without IPv6: nothing of it programmed, reported by name; its IPv4 VIP served', async () => {
  const told: NotForwardedVip[] = [];
  const pools = [{
    apiVersion: 'tether.dev/v1alpha1', kind: 'AddressPool', metadata: { name: 'lb' },
    spec: { usage: 'loadBalancer', ipv4: { cidr: '198.18.9.0/28' }, ipv6: { cidr: '2001:db8:18:9::/124' } },
  }];
  // No address6 for the node: it forwards no IPv6 VIP.
  await withLbControllerBed({ name: 'lbno6', pools, podIps: ['10.244.0.9', 'fd00:10:244::9'], controller: { maxVips: 4, exportTable: EXPORT_TABLE, onNotForwarded: (n) => told.push(n) } }, async ({ ctl, store, pools, pinDir, logger, logText }) => {
    setLogger(logger);
  const r = resolveLoadBalancers(objects(), pools);
  assert.equal(r.loadBalancers.map((l) => l.key), ['shop/web', 'shop/web#IPv6']);
  await ctl.apply(r);
  await ctl.kick(); // a second pass: the report and the Event are not repeated
  const st = ctl.status();
  const v4 = st.find((s) => s.service === 'shop/web' && s.family === 'IPv4')!;
  const v6 = st.find((s) => s.service === 'shop/web#IPv6')!;
  const vip4 = String(v4.vip);
  const vip6 = String(v6.vip);
  assert.ok(vip4.startsWith('198.18.9.'), `IPv4 VIP allocated: ${vip4}`);
  assert.ok(vip6.startsWith('2001:db8:18:9::'), `IPv6 VIP known (the Service's, allocated cluster-wide): ${vip6}`);
  // The IPv4 VIP is programmed as usual; the IPv6 one has no slot and is not announced.
  assert.is(v4.slot, 0);
  assert.is(v4.nodeProblem, undefined);
  assert.is(v6.slot, undefined, 'no slot for the IPv6 VIP');
  assert.is(v6.announced, false);
  assert.is(v6.problem, undefined, 'the Service itself has no problem (nodes with IPv6 serve it)');
  const why = String(v6.nodeProblem);
  for (const part of ['node n1', `IPv6 VIP ${vip6}`, '--node-address-6', 'shop/lb']) assert.ok(why.includes(part), `nodeProblem names ${part}: ${why}`);
  assert.equal(ctl.slotBudget(), { used: 1, max: 4 });
  // Not in the datapath's maps, no subscription to its mappings.
  const dp = LbDatapath.load({ pinDir, maxVips: 4, maglevSize: 251 });
  try {
    assert.equal([...dp.services()], [[vip4, 0]], 'the datapath holds the IPv4 VIP only');
  } finally {
    dp.close();
  }
  assert.equal(store.notices.subscriptions(), [store.notices.channel(vip4)], 'only the IPv4 VIP\'s channel');
  // No route for the IPv6 VIP in the main or export table.
  const routes = NetlinkHandle.with(undefined, (h) => [254, EXPORT_TABLE].flatMap((table) => h.listRoutes({ family: 6, table }).filter((x) => x.dst === vip6 && x.dstLen === 128)));
  assert.equal(routes, [], 'the IPv6 VIP is routed nowhere');
  // Reported by name: for tether-operator's status, to the Event hook once, and one error line.
  const report = ctl.notForwarded();
  assert.equal(report, [{ key: 'shop/web#IPv6', service: 'shop/web', family: 'IPv6', vip: vip6, problem: why }]);
  assert.equal(told, [{ key: 'shop/web#IPv6', service: 'shop/web', family: 'IPv6', vip: vip6, node: 'n1', problem: why }], 'told once');
  const errors = logText().trim().split('\n').map((l) => JSON.parse(l) as Record<string, unknown>).filter((l) => /not forwarded/.test(String(l.message)));
  assert.is(errors.length, 1, 'one error line');
  assert.is(errors[0].vip, vip6);
  // The Service goes IPv4-only: the report goes.
  const v4Only = objects().map((o) => (o.kind === 'Service' ? { ...o, spec: { ...(o.spec as object), ipFamilyPolicy: 'SingleStack', ipFamilies: ['IPv4'] } } : o));
  await ctl.apply(resolveLoadBalancers(v4Only, pools));
  assert.equal(ctl.notForwarded(), []);
  });
});

test('a VIP with no slot left on the node: reported by name as one it cannot forward (health report, Event once), as an IPv6 VIP on a node without IPv6 is', async () => {
  const told: Array<NotForwardedVip & { node: string }> = [];
  const pools = [{ apiVersion: 'tether.dev/v1alpha1', kind: 'AddressPool', metadata: { name: 'lb' }, spec: { usage: 'loadBalancer', ipv4: { cidr: '198.18.9.0/28' } } }];
  const svc = (name: string) => [
    { apiVersion: 'v1', kind: 'Service', metadata: { name, namespace: 'shop' }, spec: { type: 'LoadBalancer', loadBalancerClass: LB_CLASS, ports: [{ port: 80, protocol: 'TCP' }] } },
    {
      apiVersion: 'discovery.k8s.io/v1', kind: 'EndpointSlice', metadata: { name: `${name}-4`, namespace: 'shop', labels: { 'kubernetes.io/service-name': name } },
      addressType: 'IPv4', endpoints: [{ addresses: ['10.244.9.2'], conditions: { ready: true }, nodeName: 'n2' }],
    },
  ];
  // One slot for two VIPs the LB pod selects.
  await withLbControllerBed({ name: 'lbslot', pools, podIps: ['10.244.0.9'], controller: { maxVips: 1, exportTable: EXPORT_TABLE, onNotForwarded: (n) => told.push(n) } }, async ({ ctl, pools, logger }) => {
    setLogger(logger);
    await ctl.apply(resolveLoadBalancers([...svc('a'), ...svc('b')], pools));
    await ctl.kick();
    const st = ctl.status();
    const over = st.filter((x) => x.slot === undefined);
    assert.is(over.length, 1, `one VIP has no slot: ${JSON.stringify(st.map((x) => [x.service, x.slot]))}`);
    const why = String(over[0].nodeProblem);
    assert.ok(why.includes(String(over[0].vip)), `nodeProblem names the VIP: ${why}`);
    const report = ctl.notForwarded();
    assert.equal(report.map((r) => [r.service, r.vip, r.problem]), [[over[0].service, over[0].vip, why]], 'in the health report, by name');
    assert.equal(told.map((t) => [t.service, t.vip, t.node, t.problem]), [[over[0].service, over[0].vip, 'n1', why]], 'told once over two passes');
    // The other Service goes: the slot is free, the VIP served, the report empty.
    await ctl.apply(resolveLoadBalancers(svc(String(over[0].service).split('/')[1]), pools));
    await ctl.kick();
    assert.equal(ctl.notForwarded(), [], 'nothing left unforwarded');
  });
});

test.run();
