// The stateful load balancer in both families on the testbed (topology families [4, 6]: pods dual-stack,
// the fabric carrying IPv6 beside the nodes' IPv4 underlay): a RequireDualStack Service gets an IPv4 and an
// IPv6 VIP; each LB node advertises both from its export table (IPv4 and IPv6 BGP sessions to the router),
// forwards the IPv6 VIP in FoU over outer IPv6 from its fabric IPv6 address (found on the uplink: the one
// global IPv6 address beside --node-address) to the targets' IPv6 addresses. The key rows of lb.test.ts's
// survival run with IPv6 connections through the IPv6 VIP: a target added, a target terminating, an LB node
// lost. Every connection is kept and the targets see the client's IPv6 address.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { withTestbed, type Testbed } from './testbed';
import { PORT, lbPodSpec, routerPaths, startBgp, startTargets, targetSpec, topology, traffic, until, type LbStatus } from './lb-scenario';
import { peerAddress } from '../lib/traffic';

const CONNS = Number(process.env.LB_TEST_CONNS ?? 200);
const LB_POOL6 = 'fd00:5100::/124';
const LB_POOL4 = '198.51.100.0/28';

const pool = { apiVersion: 'tether.dev/v1alpha1', kind: 'AddressPool', metadata: { name: 'lb' }, spec: { usage: 'loadBalancer', ipv4: { cidr: LB_POOL4 }, ipv6: { cidr: LB_POOL6 } } };
const service = {
  apiVersion: 'v1', kind: 'Service', metadata: { name: 'db', namespace: 'shop', annotations: { 'lb.tether.dev/affinity': 'flow' } },
  spec: {
    type: 'LoadBalancer', loadBalancerClass: 'tether.dev/lb', allocateLoadBalancerNodePorts: false, ipFamilyPolicy: 'RequireDualStack', ipFamilies: ['IPv4', 'IPv6'],
    ports: [{ name: 'tcp', port: PORT, protocol: 'TCP' }, { name: 'udp', port: PORT, protocol: 'UDP' }],
  },
};

/** One EndpointSlice per family: the pods' addresses of the family, ready unless terminating. */
function slices(tb: Testbed, targets: string[], terminating: string[] = []): Array<Record<string, unknown>> {
  return ([4, 6] as const).map((f) => ({
    apiVersion: 'discovery.k8s.io/v1', kind: 'EndpointSlice',
    metadata: { name: `db-${f}`, namespace: 'shop', labels: { 'kubernetes.io/service-name': 'db' } },
    addressType: f === 4 ? 'IPv4' : 'IPv6',
    ports: [{ name: 'tcp', port: PORT, protocol: 'TCP' }],
    endpoints: [
      ...targets.map((k) => ({ addresses: [f === 4 ? tb.podIp(k) : tb.podIp6(k)], conditions: { ready: true }, nodeName: tb.pod(k).node, targetRef: { kind: 'Pod', namespace: 'shop', name: tb.pod(k).name } })),
      ...terminating.map((k) => ({ addresses: [f === 4 ? tb.podIp(k) : tb.podIp6(k)], conditions: { ready: false, serving: true, terminating: true }, nodeName: tb.pod(k).node })),
    ],
  }));
}

function configure(tb: Testbed, targets: string[], terminating: string[] = []): void {
  tb.rewriteConfig({ extraObjects: [pool, service, ...slices(tb, targets, terminating)] });
}

async function status6(tb: Testbed, node: string): Promise<LbStatus | undefined> {
  return ((await tb.status(node)) as unknown as { loadBalancers: LbStatus[] }).loadBalancers.find((l) => l.service === 'shop/db#IPv6');
}

/** The IPv6 VIP (read on nodes[0]) once the router spreads it over exactly `nodes` (their fabric IPv6 addresses). */
async function announced6On(tb: Testbed, nodes: string[]): Promise<string> {
  return until(`IPv6 VIP announced by exactly ${nodes.join(', ')}`, async () => {
    const st = await status6(tb, nodes[0]);
    if (!st?.vip) return undefined;
    const want = nodes.map((n) => tb.node(n).fabricIp6!).sort();
    return (await routerPaths(tb, st.vip)).join() === want.join() ? st.vip : undefined;
  }, 30_000);
}

test('dual-stack: IPv6 connections through the IPv6 VIP survive a target added, a target terminating and an LB node lost; targets see the client\'s IPv6 address', async () => {
  const topo = { ...topology(), families: [4, 6] as Array<4 | 6>, extraObjects: [pool] };
  await withTestbed(topo, async (tb) => {
    const bgp = await startBgp(tb, ['n1', 'n2', 'n3'], { ipv6: true });
    try {
      configure(tb, ['n4-t1', 'n4-t2', 'n5-t3']);
      const vip6 = await announced6On(tb, ['n1', 'n2']);
      assert.ok(vip6.startsWith('fd00:5100:'), `the IPv6 VIP ${vip6} is from ${LB_POOL6}`);
      const servers = await startTargets(tb, ['n4-t1', 'n4-t2', 'n5-t3'], vip6);
      let peers = new Map<string, string[]>();
      try {
        const report = await traffic(tb, vip6, CONNS, 60_000, async () => {
          process.stdout.write('  LB pod added on n3\n');
          await tb.addPod('n3', lbPodSpec);
          await announced6On(tb, ['n1', 'n2', 'n3']);
          await new Promise((r) => setTimeout(r, 2000));
          process.stdout.write('  target t4 added (scale-out)\n');
          await tb.addPod('n5', targetSpec('t4'));
          configure(tb, ['n4-t1', 'n4-t2', 'n5-t3', 'n5-t4']);
          await until('t4 ready as a target', async () => (await status6(tb, 'n5'))?.localTargets.includes('shop/t4'));
          await servers.add('n5-t4');
          await new Promise((r) => setTimeout(r, 3000));
          process.stdout.write('  target t3 terminating\n');
          configure(tb, ['n4-t1', 'n4-t2', 'n5-t4'], ['n5-t3']);
          await new Promise((r) => setTimeout(r, 3000));
          process.stdout.write('  LB node n2 killed\n');
          await tb.killTetherd('n2', 'SIGKILL');
          await tb.mustExec('n2', ['ip', 'link', 'set', 'eth0', 'down']);
          await announced6On(tb, ['n1', 'n3']);
          await new Promise((r) => setTimeout(r, 3000));
        }, true, { endWhenDone: true });
        peers = await servers.stop();
        const served = [...peers].map(([k, v]) => `${k} ${v.length}`).join(', ');
        process.stdout.write(`  IPv6: ${report.intact}/${CONNS} intact, longest gap ${report.maxGapAfterMarkMs} ms; UDP ${report.udp?.received}/${report.udp?.sent}; connections per target: ${served}\n`);
        const client6 = tb.externalIp6('client');
        const seen = [...peers.values()].flat();
        assert.ok(seen.length >= CONNS, `the targets saw the connections (${seen.length})`);
        for (const [pod, list] of peers) for (const p of list) assert.is(peerAddress(p), client6, `${pod} saw ${p}, not the client's IPv6 address`);
        assert.is(report.intact, CONNS, `${report.intact}/${CONNS} intact; ${report.errors.slice(0, 4).join('; ')}`);
        assert.ok((report.udp?.maxGapMs ?? 1e9) < 5000, `the IPv6 UDP stream resumed (longest gap ${report.udp?.maxGapMs} ms)`);
        const st = await status6(tb, 'n3');
        process.stdout.write(`  n3 IPv6 VIP counters: ${JSON.stringify(st?.counters)}\n`);
      } finally {
        await servers.stop().catch(() => undefined);
      }
    } finally {
      await bgp.stop();
    }
  });
});

test.run();
