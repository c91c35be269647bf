// The stateful load balancer in both families on the testbed (topology families [4, 6]: pods dual-stack,
// the fabric carrying IPv6 beside the nodes' IPv4 underlay): a RequireDualStack Service gets an IPv4 and an
// IPv6 VIP; each LB node advertises both from its export table (IPv4 and IPv6 BGP sessions to the router),
// forwards the IPv6 VIP in FoU over outer IPv6 from its fabric IPv6 address (found on the uplink: the one
// global IPv6 address beside --node-address) to the targets' IPv6 addresses. lb.test.ts's survival table runs
// here whole, plus a target terminating, with IPv6 connections through the IPv6 VIP and IPv4 connections
// through the IPv4 VIP at once, so both families go through the same changes: every connection is kept and
// the targets see the client's address of the family; then removing a target breaks only its own.
// The same table runs again on the IPv6 node underlay (topology underlay 6) with IPv6-only pods and a
// SingleStack IPv6 Service: the LB nodes' node addresses, hence their mapping notices and the store's
// records of them, are IPv6.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { withTestbed, type Testbed } from './testbed';
import { PORT, announcedOn, baselineAnnounce, baselineWithdraw, lbPodSpec, lbStatus, routerPaths, startBgp, startTargets, targetSpec, topology, traffic, until, type Servers } from './lb-scenario';
import type { TrafficReport } from '../lib/traffic';
import { peerAddress } from '../lib/traffic';

const CONNS = Number(process.env.LB_TEST_CONNS ?? 200);
const LB_POOL6 = 'fd00:5100::/124';
const LB_POOL4 = '198.51.100.0/28';

const pool = { apiVersion: 'tether.dev/v1alpha1', kind: 'AddressPool', metadata: { name: 'lb' }, spec: { usage: 'loadBalancer', ipv4: { cidr: LB_POOL4 }, ipv6: { cidr: LB_POOL6 } } };

type Family = 4 | 6;
type ByFamily<T> = Partial<Record<Family, T>>;

/** The Service in the bed's families: RequireDualStack in both, SingleStack IPv6 on IPv6-only pods. */
function service(fams: Family[]): Record<string, unknown> {
  const dual = fams.length === 2;
  return {
    apiVersion: 'v1', kind: 'Service', metadata: { name: 'db', namespace: 'shop', annotations: { 'lb.tether.dev/affinity': 'flow' } },
    spec: {
      type: 'LoadBalancer', loadBalancerClass: 'tether.dev/lb', allocateLoadBalancerNodePorts: false,
      ipFamilyPolicy: dual ? 'RequireDualStack' : 'SingleStack', ipFamilies: fams.map((f) => `IPv${f}`),
      ports: [{ name: 'tcp', port: PORT, protocol: 'TCP' }, { name: 'udp', port: PORT, protocol: 'UDP' }],
    },
  };
}

/** One EndpointSlice per family: the pods' addresses of the family, ready unless terminating. */
function slices(tb: Testbed, fams: Family[], targets: string[], terminating: string[] = []): Array<Record<string, unknown>> {
  return fams.map((f) => ({
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

function configure(tb: Testbed, fams: Family[], targets: string[], terminating: string[] = []): void {
  tb.rewriteConfig({ extraObjects: [pool, service(fams), ...slices(tb, fams, targets, terminating)] });
}

/** The VIP of `family` (read on nodes[0]) once the router spreads it over exactly `nodes` (their fabric address of the family). */
async function announcedFamilyOn(tb: Testbed, family: Family, nodes: string[]): Promise<string> {
  if (family === 4) return announcedOn(tb, nodes);
  return until(`IPv6 VIP announced by exactly ${nodes.join(', ')}`, async () => {
    const st = await lbStatus(tb, nodes[0], 6);
    if (!st?.vip) return undefined;
    const want = nodes.map((n) => tb.node(n).fabricIp6!).sort();
    return (await routerPaths(tb, st.vip)).join() === want.join() ? st.vip : undefined;
  }, 30_000);
}

/** The VIP of every family once the router spreads each over exactly `nodes`. */
async function announcedAll(tb: Testbed, fams: Family[], nodes: string[]): Promise<ByFamily<string>> {
  const out: ByFamily<string> = {};
  for (const f of fams) out[f] = await announcedFamilyOn(tb, f, nodes);
  return out;
}

/** `target` (a Service key, "shop/t4") is a target on `node` in every family. */
async function targetOnAll(tb: Testbed, fams: Family[], node: string, target: string): Promise<boolean> {
  for (const f of fams) if (!(await lbStatus(tb, node, f))?.localTargets.includes(target)) return false;
  return true;
}

/**
 * Long-lived traffic through every family's VIP at once while `during` runs: one client per family (its
 * connections and a UDP stream) from the external client, each started inside the one before's run, so each
 * is marked before `during` starts and ends when it does.
 */
async function trafficAll(tb: Testbed, fams: Family[], vips: ByFamily<string>, maxMs: number, during: () => Promise<void>): Promise<ByFamily<TrafficReport>> {
  const out: ByFamily<TrafficReport> = {};
  const run = async (i: number): Promise<void> => {
    if (i === fams.length) return during();
    const f = fams[i];
    out[f] = await traffic(tb, vips[f]!, CONNS, maxMs, () => run(i + 1), true, { endWhenDone: true });
  };
  await run(0);
  return out;
}

async function startTargetsAll(tb: Testbed, fams: Family[], pods: string[], vips: ByFamily<string>): Promise<ByFamily<Servers>> {
  const out: ByFamily<Servers> = {};
  for (const f of fams) out[f] = await startTargets(tb, pods, vips[f]!);
  return out;
}

async function stopAll(fams: Family[], servers: ByFamily<Servers>): Promise<ByFamily<Map<string, string[]>>> {
  const out: ByFamily<Map<string, string[]>> = {};
  for (const f of fams) out[f] = await servers[f]!.stop();
  return out;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/**
 * The survival table with connections through the VIP of each of `fams` at once, on a testbed whose pods
 * have `fams` and whose node underlay is `underlay` (6: every tetherd's node address is its fabric IPv6
 * address, so the mapping notices and sync between LB nodes run over IPv6).
 */
async function survivalTable(fams: Family[], underlay: 4 | 6): Promise<void> {
  const topo = { ...topology(), families: fams, ...(underlay === 6 ? { underlay: 6 as const } : {}), extraObjects: [pool] };
  await withTestbed(topo, async (tb) => {
    const client = (f: Family) => (f === 4 ? tb.externalIp('client') : tb.externalIp6('client'));
    const bgp = await startBgp(tb, ['n1', 'n2', 'n3'], { ipv6: true });
    try {
      if (underlay === 6) {
        // The LB nodes are registered (and so reached for mapping notices) at their fabric IPv6 addresses.
        const registry = await tb.withRedisClient((r) => r.hgetall(`{${tb.redisPrefix}nodes}`));
        for (const n of ['n1', 'n2', 'n3']) {
          const address = (JSON.parse(registry[n] ?? '{}') as { address?: string }).address;
          assert.is(address, `[${tb.node(n).fabricIp6}]`, `${n} is registered at its fabric IPv6 address`);
        }
      }
      configure(tb, fams, ['n4-t1', 'n4-t2', 'n5-t3']);
      const vips = await announcedAll(tb, fams, ['n1', 'n2']);
      if (vips[6]) assert.ok(vips[6].startsWith('fd00:5100:'), `the IPv6 VIP ${vips[6]} is from ${LB_POOL6}`);
      const servers = await startTargetsAll(tb, fams, ['n4-t1', 'n4-t2', 'n5-t3'], vips);
      try {
        const reports = await trafficAll(tb, fams, vips, 180_000, async () => {
          process.stdout.write('  LB pod added on n3\n');
          await tb.addPod('n3', lbPodSpec);
          await announcedAll(tb, fams, ['n1', 'n2', 'n3']);
          await sleep(2000);
          process.stdout.write('  LB pod on n1 removed gracefully\n');
          await tb.delPod('n1-lb');
          await announcedAll(tb, fams, ['n2', 'n3']);
          await sleep(2000);
          process.stdout.write('  target t4 added (scale-out)\n');
          await tb.addPod('n5', targetSpec('t4'));
          configure(tb, fams, ['n4-t1', 'n4-t2', 'n5-t3', 'n5-t4']);
          await until('t4 ready as a target in every family', () => targetOnAll(tb, fams, 'n5', 'shop/t4'));
          for (const f of fams) await servers[f]!.add('n5-t4');
          await sleep(2000);
          process.stdout.write('  target t3 terminating\n');
          configure(tb, fams, ['n4-t1', 'n4-t2', 'n5-t4'], ['n5-t3']);
          await sleep(3000);
          process.stdout.write('  tetherd restarted on n3\n');
          await tb.restartTetherd('n3');
          await sleep(2000);
          process.stdout.write('  Redis restarted empty\n');
          await tb.restartRedis();
          await sleep(3000);
          process.stdout.write('  LB node n2 killed\n');
          await tb.killTetherd('n2', 'SIGKILL');
          await tb.mustExec('n2', ['ip', 'link', 'set', 'eth0', 'down']);
          await announcedAll(tb, fams, ['n3']);
          await sleep(3000);
        });
        const peers = await stopAll(fams, servers);
        for (const f of fams) {
          const r = reports[f]!;
          const served = [...peers[f]!].map(([k, v]) => `${k} ${v.length}`).join(', ');
          process.stdout.write(`  IPv${f}: ${r.intact}/${CONNS} intact, longest gap ${r.maxGapAfterMarkMs} ms; UDP ${r.udp?.received}/${r.udp?.sent} (longest gap ${r.udp?.maxGapMs} ms); connections per target: ${served}\n`);
        }
        for (const f of fams) {
          const r = reports[f]!;
          const seen = [...peers[f]!.values()].flat();
          assert.ok(seen.length >= CONNS, `the targets saw the IPv${f} connections (${seen.length})`);
          for (const [pod, list] of peers[f]!) for (const p of list) assert.is(peerAddress(p), client(f), `${pod} saw ${p}, not the client's IPv${f} address`);
          assert.is(r.intact, CONNS, `IPv${f}: ${r.intact}/${CONNS} intact; ${r.errors.slice(0, 4).join('; ')}`);
          // As in lb.test.ts: the stream loses at most what was in flight to the killed node until BGP's 3 s
          // hold time withdrew it.
          assert.ok((r.udp?.maxGapMs ?? 1e9) < 5000, `the IPv${f} UDP stream resumed (longest gap ${r.udp?.maxGapMs} ms)`);
          assert.ok((r.udp?.received ?? 0) >= (r.udp?.sent ?? 1) * 0.85, `IPv${f} UDP ${r.udp?.received}/${r.udp?.sent}`);
        }
        for (const f of fams) process.stdout.write(`  n3 counters, IPv${f}: ${JSON.stringify((await lbStatus(tb, 'n3', f))?.counters)}\n`);
      } finally {
        for (const f of fams) await servers[f]!.stop().catch(() => undefined);
      }

      // Removing a target breaks only the connections it held, in every family, and they fail at once.
      const again = await startTargetsAll(tb, fams, ['n4-t1', 'n4-t2', 'n5-t3', 'n5-t4'], vips);
      try {
        const reports = await trafficAll(tb, fams, vips, 60_000, async () => {
          configure(tb, fams, ['n4-t2', 'n5-t4'], ['n5-t3']);
          await until('t1 no longer a target in any family', async () => {
            for (const f of fams) if ((await lbStatus(tb, 'n4', f))?.localTargets.includes('shop/t1')) return false;
            return true;
          });
          // The broken ones have reset by now (they exchange every 50 ms); the rest run on a while.
          await sleep(3000);
        });
        const served = await stopAll(fams, again);
        for (const f of fams) {
          const r = reports[f]!;
          const onT1 = served[f]!.get('n4-t1')?.length ?? 0;
          process.stdout.write(`  IPv${f}: target t1 removed: it held ${onT1} connections; ${r.intact}/${CONNS} intact; errors: ${r.errors.slice(0, 2).join('; ')}\n`);
          assert.ok(onT1 > 0, `t1 held some IPv${f} connections`);
          assert.is(r.intact, CONNS - onT1, `IPv${f}: exactly the connections on the removed target broke`);
          assert.not.ok(r.errors.some((e) => e.startsWith('watchdog')), `IPv${f}: the broken ones failed, none hung`);
        }
      } finally {
        for (const f of fams) await again[f]!.stop().catch(() => undefined);
      }
    } finally {
      await bgp.stop();
    }
  });
}

test('dual-stack: IPv6 and IPv4 connections through the VIPs survive the whole survival table (LB pod added, LB pod removed, target added, target terminating, tetherd restarted, Redis restarted empty, LB node lost); targets see the client\'s address; a removed target breaks only its own', async () => {
  await survivalTable([4, 6], 4);
});

test('IPv6 node underlay, IPv6-only pods: IPv6 connections through the IPv6 VIP survive the same survival table (the LB nodes\' mapping notices and sync over IPv6 node addresses); a removed target breaks only its own', async () => {
  await survivalTable([6], 6);
});

/** `vip` routed by the router over exactly `nodes` (their fabric address of the VIP's family). */
async function routedOver(tb: Testbed, vip: string, nodes: string[]): Promise<void> {
  const want = nodes.map((n) => (vip.includes(':') ? tb.node(n).fabricIp6! : tb.node(n).fabricIp)).sort().join();
  await until(`${vip} routed over exactly ${nodes.join(', ')}`, async () => (await routerPaths(tb, vip)).join() === want, 30_000);
}

test('baseline in the same family pair: the same LB node changes through a stateless ECMP + kube-proxy DNAT path (what MetalLB gives) lose IPv6 connections as IPv4 ones', async () => {
  const topo = { ...topology(), families: [4, 6] as Family[], extraObjects: [pool] };
  await withTestbed(topo, async (tb) => {
    const bgp = await startBgp(tb, ['n1', 'n2', 'n3'], { ipv6: true });
    try {
      // Outside the pools tetherd serves: no Service of tether's class names them.
      const vips: Record<Family, string> = { 4: '198.51.100.200', 6: 'fd00:5100::c8' };
      const targets = ['n4-t1', 'n4-t2', 'n5-t3'];
      const announce = async (node: string) => {
        for (const f of [4, 6] as Family[]) await baselineAnnounce(tb, node, vips[f], targets);
      };
      const routedBoth = async (nodes: string[]) => {
        for (const f of [4, 6] as Family[]) await routedOver(tb, vips[f], nodes);
      };
      for (const n of ['n1', 'n2']) await announce(n);
      await routedBoth(['n1', 'n2']);
      const servers = { 6: await startTargets(tb, targets, '::'), 4: await startTargets(tb, targets, '0.0.0.0') };
      try {
        let r4: TrafficReport | undefined;
        const r6 = await traffic(tb, vips[6], CONNS, 25_000, async () => {
          r4 = await traffic(tb, vips[4], CONNS, 25_000, async () => {
            await announce('n3');
            await routedBoth(['n1', 'n2', 'n3']);
            await sleep(2000);
            for (const f of [4, 6] as Family[]) await baselineWithdraw(tb, 'n1', vips[f]);
            await routedBoth(['n2', 'n3']);
            await sleep(2000);
            await tb.mustExec('n2', ['ip', 'link', 'set', 'eth0', 'down']);
            await routedBoth(['n3']);
          }, false, { endWhenDone: true });
        }, false, { endWhenDone: true });
        for (const [f, r] of [[6, r6], [4, r4!]] as const) {
          process.stdout.write(`  stateless baseline, IPv${f}: ${r.intact}/${CONNS} intact, ${CONNS - r.intact} lost (LB node added, one withdrawn, one lost); ${r.echoes} echoes; first errors: ${r.errors.slice(0, 2).join('; ')}\n`);
        }
        assert.ok(r6.echoes > 0 && r4!.echoes > 0, 'traffic flowed through the stateless path in both families');
        assert.ok(r6.intact < CONNS, `the stateless path loses IPv6 connections when ECMP moves them (${r6.intact}/${CONNS} intact)`);
        assert.ok(r4!.intact < CONNS, `the stateless path loses IPv4 connections when ECMP moves them (${r4!.intact}/${CONNS} intact)`);
      } finally {
        await servers[6].stop().catch(() => undefined);
        await servers[4].stop().catch(() => undefined);
      }
    } finally {
      await bgp.stop();
    }
  });
});

test.run();
