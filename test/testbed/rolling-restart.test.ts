// A DaemonSet RollingUpdate (maxUnavailable 1) of tetherd under traffic, with every tetherd in the
// DaemonSet's container: one testbed holds both the egress failover scenario (gateway pods on n1 and n2,
// the client pod on n3, conntrack sync) and the load balancer scenario (LB pods on n1 and n2, targets on n4
// and n5, BIRD, Redis). While 200 egress and 200 LB connections run, each node's tetherd container in turn
// gets SIGTERM (its graceful stop: an owner hands its address over), is waited for, and a new container
// starts; the next node waits until this one is ready again (its probe, both gateways Up and in sync, the
// VIP announced by both LB nodes, the node's roles back). Every connection must come through; the restart
// must reuse the pinned maps as they are (same ids, no libbpf complaint, nothing migrated or replaced).
import * as fs from 'node:fs';
import * as path from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { withTestbed, type Testbed } from './testbed';
import type { Topology } from './topology';
import type { ExitStatus } from './tetherd';
import { bpfDir } from './cleanup';
import { run } from './proc';
import * as egress from './egress-scenario';
import * as lb from './lb-scenario';
import { until } from '../lib/wait';

const CONNS = Number(process.env.ROLLING_TEST_CONNS ?? 200);
/** An upper bound for the traffic runs: they end once the rolling restart is over. */
const TRAFFIC_MAX_MS = 15 * 60_000;
/** The DaemonSet's terminationGracePeriodSeconds: SIGKILL after it, as kubelet would. */
const GRACE_MS = 30_000;
/** How long the traffic keeps running after the last node is ready (bytes must keep flowing). */
const AFTER_MS = 3000;
const NODES = ['n1', 'n2', 'n3', 'n4', 'n5'];
const GATEWAYS = ['n1', 'n2'];
const LB_NODES = ['n1', 'n2'];
/** Where the egress connections' ends live (the client pod, the external server). */
const EGRESS_HOSTS = ['n3-web', 'server'];
const TARGETS: Record<string, string[]> = { n4: ['n4-t1', 'n4-t2'], n5: ['n5-t3'] };

/** The egress topology's nodes and objects merged with the load balancer's (same node names). */
function topology(): Topology {
  const e = egress.topology();
  const l = lb.topology();
  const nodes = l.nodes.map((n) => {
    const en = e.nodes.find((x) => x.name === n.name);
    return { ...n, zone: en?.zone, pods: [...((en?.pods as object[]) ?? []), ...((n.pods as object[]) ?? [])] } as Topology['nodes'][number];
  });
  return { ...l, nodes, extraObjects: [...(e.extraObjects ?? []), ...(l.extraObjects ?? [])] };
}

/** The egress objects plus the Service and its EndpointSlice (lb.configure() would drop the Egress). */
function configure(tb: Testbed): void {
  const targets = Object.values(TARGETS).flat();
  tb.rewriteConfig({ extraObjects: [...(egress.topology().extraObjects ?? []), lb.pool, lb.service(), lb.slice(tb, targets)] });
}

const other = (gw: string) => GATEWAYS.find((g) => g !== gw)!;

/** The VIP once it is routed over exactly the LB nodes. */
async function vipServed(tb: Testbed, timeoutMs = 30_000): Promise<string> {
  const want = LB_NODES.map((n) => tb.node(n).fabricIp).sort().join();
  return until(`VIP announced by exactly ${LB_NODES.join(', ')}`, async () => {
    const st = await lb.lbStatus(tb, LB_NODES[0]).catch(() => undefined);
    return st?.vip && (await lb.routerPaths(tb, st.vip)).join() === want ? st.vip : undefined;
  }, timeoutMs);
}

/** The egress side is whole: one gateway owns the address, the other is Up and in sync, n3 knows the owner. */
async function egressReady(tb: Testbed): Promise<{ node: string; owner: string; address: string }> {
  const o = await egress.waitOwner(tb, undefined, 30_000);
  await egress.waitStandbyReady(tb, o.node, other(o.node), 30_000);
  await until('n3 knows the owner', async () => (await egress.egressOf(tb, 'n3').catch(() => undefined))?.owner === o.st.owner, 15_000);
  return { node: o.node, owner: o.st.owner, address: o.st.address };
}

/** What the readiness of a node means here: its probe, then the roles the scenario gives it. */
async function nodeReady(tb: Testbed, node: string, vip: string): Promise<void> {
  await until(`${node} /readyz`, async () => (await tb.exec(node, ['curl', '-sf', '-m', '2', 'http://127.0.0.1:10267/readyz'])).code === 0, 30_000);
  await egressReady(tb);
  await vipServed(tb);
  await until(`${node}'s load balancer roles`, async () => {
    const st = await lb.lbStatus(tb, node).catch(() => undefined);
    // A node with neither an LB pod nor a target of the Service does not hold its VIP (it never asks).
    if (!LB_NODES.includes(node) && !TARGETS[node]) return !!st && st.vip === undefined && /not needed/.test(String((st as { vipHere?: string }).vipHere));
    if (st?.vip !== vip) return false;
    if (LB_NODES.includes(node)) return st.announced && st.localLbPods.includes('shop/lb');
    return (TARGETS[node] ?? []).every((k) => st.localTargets.includes(`shop/${tb.pod(k).name}`));
  }, 30_000);
}

/** Every pinned map of every node: pin path → map id (bpftool), and which pins are not maps. */
async function pinnedMaps(tb: Testbed): Promise<{ maps: Map<string, number>; others: string[] }> {
  const maps = new Map<string, number>();
  const others: string[] = [];
  const walk = (d: string): string[] => fs.readdirSync(d, { withFileTypes: true }).flatMap((e) => (e.isDirectory() ? walk(path.join(d, e.name)) : [path.join(d, e.name)]));
  for (const pin of walk(bpfDir(tb.prefix))) {
    const r = await run(['bpftool', '-j', 'map', 'show', 'pinned', pin]);
    if (r.code === 0) maps.set(pin, (JSON.parse(r.stdout) as { id: number }).id);
    else others.push(pin);
  }
  return { maps, others };
}

/** TCP segments retransmitted so far in each of these namespaces (their /proc/net/snmp), summed. */
async function retransmits(tb: Testbed, hosts: string[]): Promise<number> {
  let sum = 0;
  for (const h of hosts) {
    const lines = (await tb.mustExec(h, ['cat', '/proc/net/snmp'])).stdout.split('\n').filter((l) => l.startsWith('Tcp:'));
    const [names, values] = lines.map((l) => l.trim().split(/\s+/));
    sum += Number(values[names.indexOf('RetransSegs')]);
  }
  return sum;
}

interface Step {
  node: string;
  exit: ExitStatus;
  stopMs: number;
  startMs: number;
  readyMs: number;
  oldContainer?: string;
  newContainer?: string;
  /** Where the node's log stood when SIGTERM was sent. */
  logFrom: number;
  /** When SIGTERM was sent and when the node was ready again (Date.now()). */
  at: number;
  readyAt: number;
}

/** Which part of the roll a moment falls in (where a gap ended). */
function phaseOf(steps: Step[], t: number | undefined): string {
  if (t === undefined || !steps.length) return 'unknown';
  const s = [...steps].reverse().find((x) => x.at <= t);
  if (!s) return 'before the first restart';
  return t <= s.readyAt ? `while ${s.node} restarted` : `after ${s.node} was ready`;
}

/** One node's turn: SIGTERM, wait for the exit (SIGKILL after the grace period), a new container, ready. */
async function restartNode(tb: Testbed, node: string, vip: string): Promise<Step> {
  const d = tb.tetherd(node);
  const logFrom = fs.statSync(tb.tetherdLog(node)).size;
  const oldContainer = d.container?.id;
  const t0 = Date.now();
  const exit = await d.kill('SIGTERM', GRACE_MS);
  const t1 = Date.now();
  await d.start();
  const t2 = Date.now();
  await tb.syncBlockRoutes();
  await nodeReady(tb, node, vip);
  const t3 = Date.now();
  const step: Step = { node, exit, stopMs: t1 - t0, startMs: t2 - t1, readyMs: t3 - t2, oldContainer, newContainer: d.container?.id, logFrom, at: t0, readyAt: t3 };
  process.stdout.write(`  ${node}: exit ${JSON.stringify(exit)} after ${step.stopMs} ms, new container answered ping after ${step.startMs} ms, ready ${step.readyMs} ms later\n`);
  return step;
}

test('rolling restart of every node\'s tetherd container under traffic: 200/200 egress and 200/200 LB connections intact, pins reused, no libbpf warning', async () => {
  await withTestbed(topology(), async (tb) => {
    const bgp = await lb.startBgp(tb, LB_NODES);
    try {
      assert.ok(tb.tetherd('n1').container, 'tetherd runs in the DaemonSet\'s container');
      configure(tb);
      const vip = await vipServed(tb);
      for (const n of NODES) await nodeReady(tb, n, vip);
      const before = await egressReady(tb);
      // The owner's node goes first: its address is handed over, then handed back when the other gateway's
      // node restarts (a DaemonSet's order is arbitrary; this one makes both gateways hand over).
      const order = [before.node, other(before.node), ...NODES.filter((n) => !GATEWAYS.includes(n))];
      const servers = await lb.startTargets(tb, Object.values(TARGETS).flat(), vip);
      const pinsBefore = await pinnedMaps(tb);
      process.stdout.write(`  VIP ${vip}, floating ${before.address} owned by ${before.owner}; ${pinsBefore.maps.size} pinned maps (${pinsBefore.others.length} other pins)\n`);
      assert.ok(pinsBefore.maps.size > 0, 'maps are pinned');

      const steps: Step[] = [];
      let eg: Awaited<ReturnType<typeof egress.runTraffic>> | undefined;
      const t0 = Date.now();
      let rollMs = 0;
      let retrans = { egress: 0, lb: 0, total: [0, 0] };
      const lbHosts = ['client', ...Object.values(TARGETS).flat()];
      let lbPeers = new Map<string, string[]>();
      let lbReport: Awaited<ReturnType<typeof lb.traffic>>;
      try {
        lbReport = await lb.traffic(tb, vip, CONNS, TRAFFIC_MAX_MS, async () => {
          eg = await egress.runTraffic(tb, CONNS, TRAFFIC_MAX_MS, async () => {
            const rt0 = await Promise.all([retransmits(tb, EGRESS_HOSTS), retransmits(tb, lbHosts)]);
            const r0 = Date.now();
            for (const n of order) steps.push(await restartNode(tb, n, vip));
            rollMs = Date.now() - r0;
            const rt1 = await Promise.all([retransmits(tb, EGRESS_HOSTS), retransmits(tb, lbHosts)]);
            retrans = { egress: rt1[0] - rt0[0], lb: rt1[1] - rt0[1], total: rt1 };
            await new Promise((r) => setTimeout(r, AFTER_MS));
          }, { endWhenDone: true });
        }, true, { endWhenDone: true });
      } finally {
        lbPeers = await servers.stop().catch(() => lbPeers);
      }
      const egReport = eg!.report;
      const after = await egressReady(tb);
      process.stdout.write(`  rolling restart of ${NODES.length} nodes: ${rollMs} ms (traffic ${Date.now() - t0} ms in all); TCP segments retransmitted during the roll: egress ${retrans.egress} (client pod + server), LB ${retrans.lb} (client + targets); since the hosts started ${retrans.total.join(', ')}\n`);
      process.stdout.write(`  egress: ${egReport.intact}/${CONNS} intact, longest gap ${egReport.maxGapAfterMarkMs} ms during the restarts, ended ${phaseOf(steps, egReport.maxGapAfterMarkEndedAt)} (${egReport.maxGapMs} ms over the run), ${egReport.echoes} echoes, UDP ${egReport.udp?.received}/${egReport.udp?.sent} (longest gap ${egReport.udp?.maxGapMs} ms); owner ${before.owner} → ${after.owner}\n`);
      process.stdout.write(`  LB: ${lbReport.intact}/${CONNS} intact, longest gap ${lbReport.maxGapAfterMarkMs} ms during the restarts, ended ${phaseOf(steps, lbReport.maxGapAfterMarkEndedAt)} (${lbReport.maxGapMs} ms over the run), ${lbReport.echoes} echoes, UDP ${lbReport.udp?.received}/${lbReport.udp?.sent} (longest gap ${lbReport.udp?.maxGapMs} ms); per target ${[...lbPeers].map(([k, v]) => `${k} ${v.length}`).join(', ')}\n`);

      // Every node was restarted gracefully, in a new container.
      assert.equal(steps.map((s) => s.node).sort(), NODES);
      for (const s of steps) {
        assert.equal(s.exit, { code: 0, signal: null }, `${s.node}'s tetherd stopped by itself on SIGTERM`);
        assert.ok(s.newContainer && s.newContainer !== s.oldContainer, `${s.node} runs in a new container (${s.oldContainer} → ${s.newContainer})`);
      }

      // Connections.
      assert.is(egReport.intact, CONNS, `egress ${egReport.intact}/${CONNS} intact; ${egReport.errors.slice(0, 4).join('; ')}`);
      assert.equal(egReport.errors, [], 'no egress connection error');
      const tcpPeers = eg!.peers.filter((p) => !p.startsWith('udp'));
      assert.is(tcpPeers.length, CONNS, 'the server saw every egress connection once');
      assert.ok(tcpPeers.every((p) => p.startsWith(`${before.address}:`)), `the server saw only the floating address: ${tcpPeers.filter((p) => !p.startsWith(`${before.address}:`)).slice(0, 3)}`);
      assert.is(after.address, before.address, 'the same floating address');
      assert.is(lbReport.intact, CONNS, `LB ${lbReport.intact}/${CONNS} intact; ${lbReport.errors.slice(0, 4).join('; ')}`);
      assert.equal(lbReport.errors, [], 'no LB connection error');
      const clientIp = tb.externalIp('client');
      for (const [pod, list] of lbPeers) for (const p of list) assert.ok(p.startsWith(`${clientIp}:`), `${pod} saw ${p}, not the client`);
      assert.ok((egReport.udp?.received ?? 0) > 0 && (lbReport.udp?.received ?? 0) > 0, 'both UDP streams flowed');
      // Bytes kept flowing: no connection waited out more than a couple of TCP retransmissions (1 s, 2 s).
      for (const [kind, r] of [['egress', egReport], ['LB', lbReport]] as const) {
        assert.ok(r.maxGapAfterMarkMs !== undefined && r.maxGapAfterMarkMs < 3000, `${kind}: longest gap during the restarts ${r.maxGapAfterMarkMs} ms`);
      }

      // Still served to new connections, by the same VIP and floating address.
      assert.is(await vipServed(tb), vip, 'the same VIP, announced by both LB nodes');
      const servers2 = await lb.startTargets(tb, Object.values(TARGETS).flat(), vip);
      let fresh;
      try {
        fresh = await lb.traffic(tb, vip, 20, 60_000, async () => undefined, false, { endWhenDone: true });
      } finally {
        await servers2.stop().catch(() => undefined);
      }
      const freshEg = await egress.runTraffic(tb, 20, 60_000, async () => undefined, { endWhenDone: true });
      process.stdout.write(`  afterwards, new connections: LB ${fresh.intact}/20, egress ${freshEg.report.intact}/20\n`);
      assert.is(fresh.intact, 20, `new LB connections: ${fresh.errors.slice(0, 3).join('; ')}`);
      assert.is(freshEg.report.intact, 20, `new egress connections: ${freshEg.report.errors.slice(0, 3).join('; ')}`);
      assert.ok(freshEg.peers.filter((p) => !p.startsWith('udp')).every((p) => p.startsWith(`${before.address}:`)), 'new egress connections leave from the floating address');

      // The same image: every pinned map reused as it was, nothing migrated, replaced or complained about.
      const pinsAfter = await pinnedMaps(tb);
      const changed = [...pinsBefore.maps].filter(([pin, id]) => pinsAfter.maps.get(pin) !== id).map(([pin, id]) => `${path.relative(bpfDir(tb.prefix), pin)} ${id} → ${pinsAfter.maps.get(pin) ?? 'gone'}`);
      const added = [...pinsAfter.maps.keys()].filter((p) => !pinsBefore.maps.has(p)).map((p) => path.relative(bpfDir(tb.prefix), p));
      process.stdout.write(`  pinned maps: ${pinsBefore.maps.size} before, ${pinsAfter.maps.size} after, ${changed.length} changed, ${added.length} new${added.length ? ` (${added.join(', ')})` : ''}\n`);
      assert.equal(changed, [], 'every pinned map keeps its id');
      for (const s of steps) {
        const text = fs.readFileSync(tb.tetherdLog(s.node)).subarray(s.logFrom).toString('utf8');
        const bad = text.split('\n').filter((l) => /libbpf:|bpf map migrated|bpf map replaced/.test(l));
        assert.equal(bad, [], `${s.node}'s log since its restart`);
        assert.match(text, /tetherd started/, `${s.node}'s log holds the new start`);
        // The first two (the owner's node, then the other gateway's, which owned the address by then) handed
        // the address over on SIGTERM.
        if (steps.indexOf(s) < 2) {
          assert.ok(text.split('\n').some((l) => l.includes('"egress: ownership changed"') && l.includes('tetherd stopping')), `${s.node} handed its address over as it stopped`);
        }
        // An LB node's new tetherd finds the connections' mappings in the pinned map (200 TCP + the UDP flow).
        const reused = /"message":"lb: datapath loaded".*?"reusedMappings":(\d+)/.exec(text)?.[1];
        if (LB_NODES.includes(s.node)) {
          process.stdout.write(`  ${s.node}: the restarted tetherd reused ${reused} LB mappings from the pins\n`);
          assert.ok(Number(reused) >= CONNS, `${s.node} reused ${reused} LB mappings`);
        }
      }
    } finally {
      await bgp.stop();
    }
  }, { containers: true });
});

test.run();
