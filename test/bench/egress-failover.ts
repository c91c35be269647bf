// Benchmark (not a test): egress failover on the testbed. Each trial runs long-lived connections through
// the floating address, kills the owning gateway pod abruptly and measures the longest gap any
// connection saw (kill → traffic flowing through the new owner) and how many connections survived; a new
// gateway pod then restores two candidates for the next trial. The same with conntrack sync disabled
// gives the survival baseline. Writes results/bench-egress.json and the README section.
import * as fs from 'node:fs';
import * as path from 'node:path';
import { withTestbed, type Testbed } from '../testbed/testbed';
import { runTraffic, topology, waitOwner } from '../testbed/egress-scenario';
import { machine, percentile, updateReadme } from './stats';

const TRIALS = Number(process.env.BENCH_FAILOVER_TRIALS ?? 20);
const BASELINE_TRIALS = Number(process.env.BENCH_FAILOVER_BASELINE_TRIALS ?? 5);
const CONNS = Number(process.env.BENCH_FAILOVER_CONNS ?? 50);
const repo = path.resolve(__dirname, '../..');

interface Trial {
  gapMs: number;
  survived: number;
  takeover?: string;
}

async function trials(tb: Testbed, n: number): Promise<Trial[]> {
  const out: Trial[] = [];
  let seq = 0;
  for (let i = 0; i < n; i++) {
    const owner = await waitOwner(tb, undefined, 15000, true);
    const podKey = `${owner.node}-${owner.st.owner.split('/')[1]}`;
    const { report } = await runTraffic(tb, CONNS, 4500, async () => {
      await tb.mustExec('router', ['ip', 'netns', 'del', tb.pod(podKey).ns]);
    });
    const next = await waitOwner(tb, owner.st.owner, 15000, true);
    // The gap of the failover: the longest one that ended after the kill began (set-up stalls excluded).
    const gapMs = report.maxGapAfterMarkMs ?? report.maxGapMs;
    out.push({ gapMs, survived: report.intact / report.connections, takeover: next.st.lastTakeover?.cause });
    process.stdout.write(`  trial ${i + 1}/${n}: longest gap ${gapMs} ms, ${report.intact}/${report.connections} survived\n`);
    // A replacement gateway on the node that lost its own, so every trial starts with two candidates.
    await tb.addPod(owner.node, { name: `gw${owner.node.slice(1)}r${++seq}`, namespace: 'shop', tether: { labels: { role: 'egress-gw' } } });
    await new Promise((r) => setTimeout(r, 1500));
  }
  return out;
}

function summarise(ts: Trial[]) {
  const gaps = ts.map((t) => t.gapMs);
  return {
    trials: ts.length,
    gapMs: { p50: percentile(gaps, 50), p95: percentile(gaps, 95), max: Math.max(...gaps) },
    survivalPct: Math.round((ts.reduce((a, t) => a + t.survived, 0) / ts.length) * 1000) / 10,
  };
}

async function main() {
  const withSync = await withTestbed(topology(), (tb) => trials(tb, TRIALS));
  const without = await withTestbed(topology(['--no-conntrack-sync']), (tb) => trials(tb, BASELINE_TRIALS));
  const a = summarise(withSync);
  const b = summarise(without);
  const result = { benchmark: 'egress-failover', machine: machine(), connectionsPerTrial: CONNS, withSync: a, withoutSync: b, trials: { withSync, withoutSync: without } };
  fs.mkdirSync(path.join(repo, 'results'), { recursive: true });
  fs.writeFileSync(path.join(repo, 'results/bench-egress.json'), JSON.stringify(result, null, 2) + '\n');
  const m = result.machine as Record<string, unknown>;
  const md = `Measured by \`npm run bench\` on ${m.cpu} (${m.cores} cores), kernel ${m.kernel}, ${String(m.date).slice(0, 10)}: the owning gateway pod killed abruptly (namespace deleted) under ${CONNS} long-lived TCP connections; the gap is the longest time any connection went without an echo, among gaps that ended after the kill began (kill → traffic through the new owner, at 50 ms request spacing).

| | trials | gap p50 (ms) | gap p95 (ms) | gap max (ms) | connections surviving |
|---|---|---|---|---|---|
| with conntrack sync | ${a.trials} | ${a.gapMs.p50} | ${a.gapMs.p95} | ${a.gapMs.max} | ${a.survivalPct} % |
| without (baseline) | ${b.trials} | ${b.gapMs.p50} | ${b.gapMs.p95} | ${b.gapMs.max} | ${b.survivalPct} % |

Targets: failover p50 ≤ 300 ms (${a.gapMs.p50 <= 300 ? 'met' : 'not met'}), p95 ≤ 500 ms (${a.gapMs.p95 <= 500 ? 'met' : 'not met'}), 100 % survival (${a.survivalPct === 100 ? 'met' : 'not met'}). Conntrack sync throughput against conntrackd: next section. Raw figures: \`results/bench-egress.json\`.`;
  updateReadme(path.join(repo, 'README.md'), 'egress', md);
  process.stdout.write(md + '\n');
}

main().catch((e) => {
  process.stderr.write(`bench failed: ${(e as Error).stack ?? e}\n`);
  process.exit(1);
});
