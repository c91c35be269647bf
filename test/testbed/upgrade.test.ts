// A rolling upgrade from the previous release (release/previous, built from this repository's history) to this
// tree, and the rollback to it, under traffic, with every tetherd in the DaemonSet's container of its own
// release's image and every node's CNI executables of the release its tetherd runs. The testbed of the rolling
// restart (egress: gateways n1 and n2, client n3; LB: LB pods on n1 and n2, targets on n4 and n5) starts on the
// previous release; the upgrade goes node by node as a DaemonSet's RollingUpdate does, the egress owner's node
// last (its address is handed from an old owner to a new standby); the rollback goes the owner's node first (a
// new owner hands over to a new standby, which later hands over to an old one). While 200 egress and 200 LB
// connections run, after every node's turn 10 more of each are opened and kept to the end. Pass: every
// connection intact, no gap longer than the failover bound, no node refusing another's frames, notices or
// packets, and pods made under one release deleted cleanly under the other.
import * as fs from 'node:fs';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { withTestbed, type Testbed } from './testbed';
import * as egress from './egress-scenario';
import * as lb from './lb-scenario';
import {
  AFTER_MS, GATEWAYS, LB_NODES, NODES, TARGETS, TRAFFIC_MAX_MS, configure, egressReady, nodeReady, other, phaseOf, restartNode, topology, vipServed, type Step,
} from './rolling-scenario';
import { currentRelease, previousRelease, type Release } from '../lib/releases';
import { TRAFFIC_CLIENT, type TrafficReport } from '../lib/traffic';

const CONNS = Number(process.env.UPGRADE_TEST_CONNS ?? 200);
/** Connections opened after each node's turn and kept to the end. */
const BATCH = 10;
/** The egress batches' echo server (the long-lived run has PORT). */
const BATCH_PORT = egress.PORT + 1;
/**
 * The longest a connection may go without an echo during the roll. A segment sent to a node as it stops is lost,
 * and Linux resends it after its RTO (at least 200 ms) plus the request spacing: the failover figures' node-lost
 * gap (docs/performance.md: 263 ms p50, 304 ms max), seen here at 200–300 ms on a quiet machine and up to ~800 ms
 * (a second retransmission) with other work on its two cores. A connection moved to a node that never learned it
 * waits out every retransmission or dies, and a new connection whose SYN is lost waits 1 s: both fail this bound.
 */
const MAX_GAP_MS = 1000;
/**
 * How long a turn waits for the connections opened after the previous one to connect. Opened in the very
 * millisecond of an owner's handover, a handshake can hang for good (seen once in about 12 runs: a batch
 * opened 11 ms before the owner's SIGTERM, 0/10 ever answered): a known defect of the planned handover (the
 * closing note of issue 29), not of the skew. The wait keeps this test on what it is about, connections opened during the
 * roll kept across the turns that follow.
 */
const CONNECT_WAIT_MS = 5000;
/** TCP's initial retransmission timeout: a lost SYN is resent after it. */
const SYN_RTO_MS = 1000;
/** What a node must never log about another (a release refusing the other's format). */
const REFUSALS = /conntrack sync: frame rejected|ownership notice refused|gateway announcement refused|protocol version/;

interface Batch {
  kind: string;
  /** The turn it was opened after. */
  after: string;
  openedAt: number;
  report: TrafficReport;
}

interface Phase {
  name: string;
  to: Release;
  /** The egress owner's node last (upgrade) or first (rollback). */
  ownerLast: boolean;
}

/** A batch of connections opened during the roll: `connected` once all are (or the client ended), `report` at its end. */
interface OpenBatch {
  connected: Promise<void>;
  report: Promise<TrafficReport>;
}

/**
 * Opens `n` connections from `host` to ip:port (through the Egress from the client pod, or to the VIP from the
 * external client), kept until `end`.
 */
function openBatch(tb: Testbed, host: string, ip: string, port: number, n: number, end: Promise<void>): OpenBatch {
  const client = tb.spawn(host, [process.execPath, '-e', TRAFFIC_CLIENT, ip, String(port), String(n), String(TRAFFIC_MAX_MS), '50', '0']);
  let text = '';
  const connected = new Promise<void>((resolve) => {
    client.stdout?.on('data', (b: Buffer) => (text += b.toString()).includes('connected') && resolve());
    client.once('exit', () => resolve());
  });
  const out = egress.collect(client);
  const report = (async () => {
    await end;
    client.kill('SIGINT');
    const all = await out;
    const line = all.split('\n').find((l) => l.startsWith('{'));
    if (!line) throw new Error(`batch client in ${host} printed no report: ${all.slice(0, 400)}`);
    return JSON.parse(line) as TrafficReport;
  })();
  return { connected, report };
}

/**
 * FoU packets refused for their outer source (not a registered node) by the decap programs of the LB targets
 * and, where the release shows them (0.2.0 on), of the egress gateways: per node and pod.
 */
async function fouRejections(tb: Testbed): Promise<Map<string, number>> {
  const out = new Map<string, number>();
  for (const node of Object.keys(TARGETS)) {
    const st = (await lb.lbStatus(tb, node)) as unknown as { targetFou?: Record<string, { rejectedSource: number } | undefined> };
    for (const [pod, f] of Object.entries(st.targetFou ?? {})) out.set(`${node} ${pod}`, f?.rejectedSource ?? 0);
  }
  for (const node of GATEWAYS) {
    const st = (await tb.status(node)) as unknown as { egressSecurity?: { decap?: Record<string, { rejectedSource: number } | undefined> } };
    for (const [pod, f] of Object.entries(st.egressSecurity?.decap ?? {})) out.set(`${node} ${pod}`, f?.rejectedSource ?? 0);
  }
  return out;
}

/** Adds what each counter grew by since `last` to `sum` (a counter that went down was reset by a restart: all of it). */
function addGrowth(sum: Map<string, number>, last: Map<string, number>, now: Map<string, number>): void {
  for (const [k, v] of now) {
    const before = last.get(k) ?? 0;
    sum.set(k, (sum.get(k) ?? 0) + (v >= before ? v - before : v));
  }
}

/** The version the node's tetherd logged at its last start. */
function startedVersion(tb: Testbed, node: string): string | undefined {
  const lines = fs.readFileSync(tb.tetherdLog(node), 'utf8').split('\n').filter((l) => l.includes('"tetherd started"'));
  return /"version":"([^"]+)"/.exec(lines[lines.length - 1] ?? '')?.[1];
}

test('rolling upgrade from the previous release and rollback to it under traffic: every connection kept, new ones succeed, no release refuses the other', async () => {
  const cur = currentRelease();
  // UPGRADE_TEST_SAME_RELEASE=1 rolls this tree onto itself: the same roll without the skew, to compare with.
  const same = process.env.UPGRADE_TEST_SAME_RELEASE === '1';
  const prev = same ? cur : previousRelease();
  if (!same) assert.is.not(prev.version, cur.version, 'this tree carries a version of its own (package.json) beside release/previous');
  process.stdout.write(`  previous release ${prev.version} (${prev.tree}), this tree ${cur.version}\n`);
  await withTestbed(topology(), async (tb) => {
    const bgp = await lb.startBgp(tb, LB_NODES);
    try {
      assert.ok(tb.tetherd('n1').container, 'tetherd runs in the DaemonSet\'s container');
      for (const n of NODES) assert.is(startedVersion(tb, n), prev.version, `${n} starts on the previous release`);
      configure(tb);
      const vip = await vipServed(tb);
      for (const n of NODES) await nodeReady(tb, n, vip);
      const before = await egressReady(tb);
      const targets = Object.values(TARGETS).flat();
      const servers = await lb.startTargets(tb, targets, vip);
      const batchServer = await egress.startServer(tb, BATCH_PORT);
      // A pod made by the previous release's executables, deleted once its node runs this one (and back).
      const oldPod = (await tb.addPod('n3', { name: 'madeold', namespace: 'shop' })).key;
      const logFrom = new Map(NODES.map((n) => [n, fs.statSync(tb.tetherdLog(n)).size]));
      // Sampled after every turn: a restart may start a program's counters anew.
      let fouLast = await fouRejections(tb);
      const fouGrew = new Map<string, number>();
      process.stdout.write(`  VIP ${vip}, floating ${before.address} owned by ${before.owner}\n`);

      const phases: Phase[] = [
        { name: `upgrade ${prev.version} → ${cur.version}`, to: cur, ownerLast: true },
        { name: `rollback ${cur.version} → ${prev.version}`, to: prev, ownerLast: false },
      ];
      const steps: Array<Step & { phase: string }> = [];
      const batches: Array<Promise<Batch>> = [];
      let endBatches!: () => void;
      const batchesEnd = new Promise<void>((r) => (endBatches = r));
      let newPod: string | undefined;
      let eg: Awaited<ReturnType<typeof egress.runTraffic>> | undefined;
      let lbPeers = new Map<string, string[]>();
      let batchPeers: string[] = [];
      let batchReports: Batch[] = [];
      let lbReport: Awaited<ReturnType<typeof lb.traffic>>;
      try {
        lbReport = await lb.traffic(tb, vip, CONNS, TRAFFIC_MAX_MS, async () => {
          eg = await egress.runTraffic(tb, CONNS, TRAFFIC_MAX_MS, async () => {
            for (const ph of phases) {
              const owner = (await egressReady(tb)).node;
              const rest = NODES.filter((n) => !GATEWAYS.includes(n));
              const order = ph.ownerLast ? [other(owner), ...rest, owner] : [owner, other(owner), ...rest];
              process.stdout.write(`  ${ph.name}: ${order.join(', ')} (egress owner on ${owner})\n`);
              for (const n of order) {
                const s = await restartNode(tb, n, vip, ph.to);
                steps.push({ ...s, phase: ph.name });
                const fouNow = await fouRejections(tb);
                addGrowth(fouGrew, fouLast, fouNow);
                fouLast = fouNow;
                assert.is(startedVersion(tb, n), ph.to.version, `${n} runs ${ph.to.version} after its turn`);
                const after = `${n} → ${ph.to.version}`;
                const openedAt = Date.now();
                const opened = [
                  { kind: 'LB', b: openBatch(tb, 'client', vip, lb.PORT, BATCH, batchesEnd) },
                  { kind: 'egress', b: openBatch(tb, 'n3-web', tb.externalIp('server'), BATCH_PORT, BATCH, batchesEnd) },
                ];
                for (const o of opened) batches.push(o.b.report.then((report) => ({ kind: o.kind, after, openedAt, report })));
                // The next turn starts once these are connected (bounded: one that is not is reported at the end).
                // A handshake that meets the next owner's handover is another matter (CONNECT_WAIT_MS).
                await Promise.race([Promise.all(opened.map((o) => o.b.connected)), new Promise((r) => setTimeout(r, CONNECT_WAIT_MS))]);
              }
              if (ph.ownerLast) {
                // n3 runs this release now: its old pod goes with this release's executables, a new one comes.
                await tb.delPod(oldPod);
                newPod = (await tb.addPod('n3', { name: 'madenew', namespace: 'shop' })).key;
              }
            }
            await new Promise((r) => setTimeout(r, AFTER_MS));
            // The batches end before their servers stop (the LB targets' servers are the long-lived run's).
            endBatches();
            batchReports = await Promise.all(batches);
          }, { endWhenDone: true });
        }, true, { endWhenDone: true });
      } finally {
        endBatches();
        await Promise.allSettled(batches);
        lbPeers = await servers.stop().catch(() => lbPeers);
      }
      batchPeers = await batchServer.stop();
      const egReport = eg!.report;
      const after = await egressReady(tb);
      process.stdout.write(`  egress: ${egReport.intact}/${CONNS} intact, longest gap ${egReport.maxGapAfterMarkMs} ms during the roll, ended ${phaseOf(steps, egReport.maxGapAfterMarkEndedAt)}, UDP ${egReport.udp?.received}/${egReport.udp?.sent}; owner ${before.owner} → ${after.owner}\n`);
      process.stdout.write(`  LB: ${lbReport.intact}/${CONNS} intact, longest gap ${lbReport.maxGapAfterMarkMs} ms during the roll, ended ${phaseOf(steps, lbReport.maxGapAfterMarkEndedAt)}, UDP ${lbReport.udp?.received}/${lbReport.udp?.sent}; per target ${[...lbPeers].map(([k, v]) => `${k} ${v.length}`).join(', ')}\n`);
      const synLost = batchReports.filter((b) => (b.report.maxConnectMs ?? 0) >= SYN_RTO_MS);
      for (const b of batchReports) {
        if (b.report.intact !== BATCH || (b.report.maxGapEstablishedMs ?? 0) >= MAX_GAP_MS || synLost.includes(b)) {
          const next = steps.find((x) => x.at >= b.openedAt);
          const when = next ? `, opened ${next.at - b.openedAt} ms before ${next.node}'s SIGTERM` : '';
          process.stdout.write(`  batch ${b.kind} after ${b.after}${when}: ${b.report.intact}/${BATCH}, slowest connect ${b.report.maxConnectMs} ms, longest gap once connected ${b.report.maxGapEstablishedMs} ms; ${b.report.errors.slice(0, 3).join('; ')}\n`);
        }
      }

      // Every node went to this release and back, gracefully.
      assert.is(steps.length, NODES.length * 2);
      for (const s of steps) assert.equal(s.exit, { code: 0, signal: null }, `${s.node}'s tetherd stopped by itself on SIGTERM (${s.phase})`);

      // The connections open before the roll: every one kept, from the same floating address, to the real client.
      assert.is(egReport.intact, CONNS, `egress ${egReport.intact}/${CONNS} intact; ${egReport.errors.slice(0, 4).join('; ')}`);
      assert.is(lbReport.intact, CONNS, `LB ${lbReport.intact}/${CONNS} intact; ${lbReport.errors.slice(0, 4).join('; ')}`);
      const egPeers = eg!.peers.filter((p) => !p.startsWith('udp'));
      assert.ok(egPeers.every((p) => p.startsWith(`${before.address}:`)), `the server saw only the floating address: ${egPeers.filter((p) => !p.startsWith(`${before.address}:`)).slice(0, 3)}`);
      const clientIp = tb.externalIp('client');
      for (const [pod, list] of lbPeers) for (const p of list) assert.ok(p.startsWith(`${clientIp}:`), `${pod} saw ${p}, not the client`);
      assert.ok((egReport.udp?.received ?? 0) > 0 && (lbReport.udp?.received ?? 0) > 0, 'both UDP streams flowed');
      for (const [kind, r] of [['egress', egReport], ['LB', lbReport]] as const) {
        assert.ok(r.maxGapAfterMarkMs !== undefined && r.maxGapAfterMarkMs < MAX_GAP_MS, `${kind}: longest gap during the roll ${r.maxGapAfterMarkMs} ms (bound ${MAX_GAP_MS})`);
      }

      // The connections opened during the roll: each batch connected at once and stayed intact to the end.
      assert.is(batchReports.length, steps.length * 2);
      for (const b of batchReports) {
        assert.is(b.report.intact, BATCH, `${b.kind} connections opened after ${b.after}: ${b.report.intact}/${BATCH}; ${b.report.errors.slice(0, 3).join('; ')}`);
        assert.ok((b.report.maxGapEstablishedMs ?? Infinity) < MAX_GAP_MS, `${b.kind} connections opened after ${b.after}: longest gap once connected ${b.report.maxGapEstablishedMs} ms`);
        // One SYN lost at most: resent after 1 s, answered by the next (3 s would mean the new owner refused it too).
        assert.ok((b.report.maxConnectMs ?? Infinity) < 2 * SYN_RTO_MS, `${b.kind} connections opened after ${b.after}: slowest connect ${b.report.maxConnectMs} ms`);
      }
      process.stdout.write(`  connections opened during the roll: ${batchReports.length * BATCH}, all connected; ${synLost.length} of ${batchReports.length} batches had a SYN resent\n`);
      const batchTcp = batchPeers.filter((p) => !p.startsWith('udp'));
      assert.is(batchTcp.length, steps.length * BATCH, 'the batch server saw every egress batch connection');
      assert.ok(batchTcp.every((p) => p.startsWith(`${before.address}:`)), 'egress batches left from the floating address');

      // Neither release refused the other's frames, notices or packets.
      for (const n of NODES) {
        const text = fs.readFileSync(tb.tetherdLog(n)).subarray(logFrom.get(n)).toString('utf8');
        const bad = text.split('\n').filter((l) => REFUSALS.test(l)).map((l) => l.slice(0, 300));
        assert.equal(bad, [], `${n} refused nothing of another node's`);
      }
      addGrowth(fouGrew, fouLast, await fouRejections(tb));
      const refusedFou = [...fouGrew].filter(([, n]) => n > 0);
      process.stdout.write(`  FoU packets refused for their outer source during the roll, over ${fouGrew.size} decap programs (LB targets, egress gateways): ${refusedFou.length ? refusedFou.map(([k, n]) => `${k} ${n}`).join(', ') : 'none'}\n`);
      assert.equal(refusedFou, [], 'no decap program refused another node\'s FoU packets');

      // The pod made under this release goes under the previous one, releasing its address.
      const allocated = async () => (await tb.status('n3')).ipam.pods[0].families[0].allocated;
      const n0 = await allocated();
      await tb.delPod(newPod!);
      assert.is(await allocated(), n0 - 1, 'the previous release released the address of a pod this release made');
      assert.equal(await vipServed(tb), vip, 'the same VIP, announced by both LB nodes');
    } finally {
      await bgp.stop();
    }
  }, { containers: true, release: prev });
});

test.run();
