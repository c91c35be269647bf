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
import { withTestbed } from './testbed';
import { bpfDir } from './cleanup';
import * as egress from './egress-scenario';
import * as lb from './lb-scenario';
import {
  AFTER_MS, EGRESS_HOSTS, GATEWAYS, LB_NODES, NODES, TARGETS, TRAFFIC_MAX_MS, configure, egressReady, nodeReady, other, phaseOf, pinnedMaps,
  restartNode, retransmits, topology, vipServed, type Step,
} from './rolling-scenario';

const CONNS = Number(process.env.ROLLING_TEST_CONNS ?? 200);

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
      const heldBefore = new Map<string, number>();
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
            // What each LB node's map holds before the roll: the flows ECMP gave it (each LB node records only
            // its own while the target set holds still); its map only grows during the roll.
            for (const n of LB_NODES) heldBefore.set(n, (await lb.lbStatus(tb, n))?.mappings ?? 0);
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
        // An LB node's new tetherd finds the mappings its map held (the flows ECMP gave it) in the pinned map.
        const reused = /"message":"lb: datapath loaded".*?"reusedMappings":(\d+)/.exec(text)?.[1];
        if (LB_NODES.includes(s.node)) {
          process.stdout.write(`  ${s.node}: the restarted tetherd reused ${reused} LB mappings from the pins (${heldBefore.get(s.node)} held before the roll)\n`);
          assert.ok((heldBefore.get(s.node) ?? 0) > 0 && Number(reused) >= heldBefore.get(s.node)!, `${s.node} reused ${reused} LB mappings, held ${heldBefore.get(s.node)} before`);
        }
      }
    } finally {
      await bgp.stop();
    }
  }, { containers: true });
});

test.run();
