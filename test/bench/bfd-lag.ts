// Benchmark (not a test): how busy tetherd's main thread gets, and whether BFD notices. On the testbed, with
// BFD between the two gateway nodes at the Egress default (50 ms × 3 = 150 ms detection), two loads:
//   - a 100-pod CNI ADD storm on the two gateway nodes (50 each, 5 at a time per node);
//   - 100k flows appearing in the owner's gateway at once (their events streamed live to the standby);
//   - a 100k-entry conntrack resync: 100k flows in the owner's gateway, the standby's tetherd restarted,
//     so the whole table streams to it and is applied.
// For each: the worst delay of tetherd's main event loop during the load (what an in-loop BFD would have
// been blind for: more than 150 ms means a false Down), the worst delay of the BFD thread's loop, and the
// BFD Downs seen (every one would be false: nothing fails). Writes results/bench-bfd-lag.json and the
// README section.
import * as fs from 'node:fs';
import * as path from 'node:path';
import { withTestbed, type Testbed } from '../testbed/testbed';
import { topology, waitOwner } from '../testbed/egress-scenario';
import { ConntrackHandle, IPS, type ConntrackEntry } from '../../daemon/conntrack';
import { machine, updateReadme } from './stats';

const STORM_PODS = Number(process.env.BENCH_BFD_STORM_PODS ?? 100);
const RESYNC_ENTRIES = Number(process.env.BENCH_BFD_RESYNC_ENTRIES ?? 100_000);
const repo = path.resolve(__dirname, '../..');
const DETECTION_MS = 150;

interface NodeView {
  eventLoop: { lagMaxMs: number; lagMaxPerSecondMs: number[] };
  bfd?: { threadLagMaxMs: number; threadLagMaxPerSecondMs: number[]; sessions: Array<{ peer: string; state: string; ups: number; downs: number }> };
}

interface Phase {
  load: string;
  seconds: number;
  /** Per node: worst main-loop delay during the load, the BFD thread's worst delay, Downs during the load. */
  nodes: Record<string, { mainLoopLagMaxMs: number; bfdThreadLagMaxMs: number; bfdDowns: number; bfdUpAtEnd: boolean }>;
}

const view = async (tb: Testbed, node: string) => (await tb.status(node)) as unknown as NodeView;
const downs = (v: NodeView) => (v.bfd?.sessions ?? []).reduce((a, s) => a + s.downs, 0);
const other = (node: string) => (node === 'n1' ? 'n2' : 'n1');

/** Runs `load` and reads, per node, the worst main-loop delay of the seconds it took. */
async function measure(tb: Testbed, nodes: string[], load: string, run: () => Promise<void>): Promise<Phase> {
  const before: Record<string, NodeView> = {};
  await new Promise((r) => setTimeout(r, 600)); // the BFD thread's counters are at most 500 ms old
  for (const n of nodes) before[n] = await view(tb, n);
  const t0 = Date.now();
  await run();
  const seconds = Math.ceil((Date.now() - t0) / 1000);
  // Let the BFD thread report (every 500 ms) and any late Down surface. The windows below cover the load
  // and this wait.
  await new Promise((r) => setTimeout(r, 1200));
  const phase: Phase = { load, seconds, nodes: {} };
  for (const n of nodes) {
    const v = await view(tb, n);
    const window = v.eventLoop.lagMaxPerSecondMs.slice(-(seconds + 3));
    phase.nodes[n] = {
      mainLoopLagMaxMs: Math.max(0, ...window),
      bfdThreadLagMaxMs: Math.max(0, ...(v.bfd?.threadLagMaxPerSecondMs ?? [NaN]).slice(-(seconds + 3))),
      bfdDowns: downs(v) - downs(before[n]),
      bfdUpAtEnd: (v.bfd?.sessions ?? []).every((s) => s.state === 'Up'),
    };
  }
  process.stdout.write(`  ${load} (${seconds} s): ${JSON.stringify(phase.nodes)}\n`);
  return phase;
}

async function waitBfdUp(tb: Testbed, node: string): Promise<void> {
  const end = Date.now() + 15_000;
  while (!((await view(tb, node)).bfd?.sessions ?? []).some((s) => s.state === 'Up')) {
    if (Date.now() > end) throw new Error(`BFD on ${node} never came Up`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

async function run(tb: Testbed): Promise<Phase[]> {
  const owner = await waitOwner(tb);
  const standby = other(owner.node);
  await waitBfdUp(tb, 'n1');
  await waitBfdUp(tb, 'n2');
  const phases: Phase[] = [];

  phases.push(
    await measure(tb, ['n1', 'n2'], `${STORM_PODS}-pod ADD storm`, async () => {
      const storm = async (node: string, from: number, n: number) => {
        for (let i = from; i < from + n; i += 5) {
          await Promise.all(Array.from({ length: Math.min(5, from + n - i) }, (_, k) => tb.addPod(node, { name: `storm${i + k}`, namespace: 'load' })));
        }
      };
      await Promise.all([storm('n1', 0, STORM_PODS / 2), storm('n2', STORM_PODS / 2, STORM_PODS / 2)]);
    }),
  );

  const floating = owner.st.address;
  const ownerNs = tb.pod(`${owner.node}-${owner.st.owner.split('/')[1]}`).nsPath;
  const standbyNs = tb.pod(`${standby}-gw${standby.slice(1)}`).nsPath;
  const entries: ConntrackEntry[] = Array.from({ length: RESYNC_ENTRIES }, (_, i) => ({
    // Reply tuples must be unique too (NAT): 60000 ports per server address.
    orig: { family: 4, proto: 17, src: `10.${240 + (i >> 16)}.${(i >> 8) & 255}.${i & 255}`, dst: `198.19.${1 + Math.floor(i / 60000)}.9`, sport: 2000 + (i % 60000), dport: 53 },
    reply: { family: 4, proto: 17, src: `198.19.${1 + Math.floor(i / 60000)}.9`, dst: floating, sport: 53, dport: 2000 + (i % 60000) },
    status: IPS.SEEN_REPLY,
    timeout: 1200,
  }));
  phases.push(
    await measure(tb, [owner.node, standby], `${RESYNC_ENTRIES / 1000}k new flows streamed live`, async () => {
      ConntrackHandle.with(ownerNs, (h) => h.insertMany(entries));
      await new Promise((r) => setTimeout(r, 3000));
    }),
  );
  // The standby leaves (a clean stop: its peer sees AdminDown now, not during the load) and loses what
  // it holds, so its next start must receive the whole table.
  await tb.killTetherd(standby, 'SIGTERM');
  ConntrackHandle.with(standbyNs, (h) => h.flush(4));
  await new Promise((r) => setTimeout(r, 1000));
  phases.push(
    await measure(tb, [owner.node], `${RESYNC_ENTRIES / 1000}k-entry resync (sender)`, async () => {
      await tb.tetherd(standby).start();
      const end = Date.now() + 120_000;
      let have = 0;
      while ((have = ConntrackHandle.with(standbyNs, (h) => h.dump({ family: 4 })).filter((e) => e.reply.dst === floating).length) < RESYNC_ENTRIES) {
        if (Date.now() > end) throw new Error(`the standby holds ${have}/${RESYNC_ENTRIES} synced flows after 120 s`);
        await new Promise((r) => setTimeout(r, 500));
      }
    }),
  );
  // The receiving side: its tetherd started with the load, so its whole run is the window.
  const recv = await view(tb, standby);
  phases.push({
    load: `${RESYNC_ENTRIES / 1000}k-entry resync (receiver, since its start)`,
    seconds: recv.eventLoop.lagMaxPerSecondMs.length,
    nodes: { [standby]: { mainLoopLagMaxMs: recv.eventLoop.lagMaxMs, bfdThreadLagMaxMs: recv.bfd?.threadLagMaxMs ?? NaN, bfdDowns: downs(recv), bfdUpAtEnd: (recv.bfd?.sessions ?? []).every((x) => x.state === 'Up') } },
  });
  process.stdout.write(`  receiver: ${JSON.stringify(phases[phases.length - 1])}\n`);
  return phases;
}

async function main(): Promise<void> {
  const phases = await withTestbed(topology(), run);
  const result = { benchmark: 'bfd-lag', machine: machine(), bfd: { intervalMs: 50, detectMultiplier: 3, detectionMs: DETECTION_MS }, phases };
  fs.mkdirSync(path.join(repo, 'results'), { recursive: true });
  fs.writeFileSync(path.join(repo, 'results/bench-bfd-lag.json'), JSON.stringify(result, null, 2) + '\n');
  const m = result.machine as Record<string, unknown>;
  const rows = phases.flatMap((p) =>
    Object.entries(p.nodes).map(([n, x]) => `| ${p.load} (${p.seconds} s) | ${n} | ${x.mainLoopLagMaxMs} | ${x.mainLoopLagMaxMs > DETECTION_MS ? 'yes' : 'no'} | ${x.bfdThreadLagMaxMs} | ${x.bfdDowns} |`),
  );
  const md = `Measured by \`npm run bench\` on ${m.cpu} (${m.cores} cores), kernel ${m.kernel}, ${String(m.date).slice(0, 10)}; BFD between the gateway nodes at 50 ms × 3 (${DETECTION_MS} ms detection). Nothing fails during these loads, so every Down would be false. "Main loop" is the worst delay of tetherd's event loop during the load: an in-loop BFD would have been deaf and mute that long.

| load | node | main loop worst delay (ms) | > detection time (in-loop BFD would go Down) | BFD thread worst delay (ms) | BFD Downs |
|---|---|---|---|---|---|
${rows.join('\n')}

Raw figures: \`results/bench-bfd-lag.json\`.`;
  updateReadme(path.join(repo, 'README.md'), 'bfd-lag', md);
  process.stdout.write(md + '\n');
}

main().catch((e) => {
  process.stderr.write(`${(e as Error).stack ?? e}\n`);
  process.exit(1);
});
