// Benchmark (not a test): egress failover on the testbed. Each trial runs long-lived connections through
// the floating address, makes the owner fail and measures the longest gap any connection saw (failure →
// traffic flowing through the new owner) and how many connections survived. Two failures: the owning
// gateway pod killed abruptly (its node's tetherd hands over at once; a new gateway pod then restores two
// candidates), and the owner's whole node lost (tetherd killed, uplink down: the others detect it by BFD;
// the node then comes back for the next trial). The pod kill with conntrack sync disabled gives the
// survival baseline. Writes results/bench-egress.json and the README section.
import * as fs from 'node:fs';
import * as path from 'node:path';
import { withTestbed, type Testbed } from '../testbed/testbed';
import { runTraffic, topology, waitOwner, waitStandbyReady } from '../testbed/egress-scenario';
import type { IpFamily } from '../../lib/ip';
import { machine, percentile, updateReadme } from './stats';

const TRIALS = Number(process.env.BENCH_FAILOVER_TRIALS ?? 20);
const NODE_TRIALS = Number(process.env.BENCH_FAILOVER_NODE_TRIALS ?? 20);
const BASELINE_TRIALS = Number(process.env.BENCH_FAILOVER_BASELINE_TRIALS ?? 5);
const CONNS = Number(process.env.BENCH_FAILOVER_CONNS ?? 50);
const repo = path.resolve(__dirname, '../..');

export interface Trial {
  /** The family of the trial's address and connections (egress-failover-families.ts); none: the only one. */
  family?: IpFamily;
  gapMs: number;
  survived: number;
  takeover?: string;
}

export type Failure = 'podKill' | 'nodeDown';

/**
 * n trials of one failure. With families, n trials of each, alternating trial by trial: each makes the owner
 * of that family's address fail under connections of that family.
 */
export async function trials(tb: Testbed, n: number, failure: Failure = 'podKill', synced = true, families: IpFamily[] = []): Promise<Trial[]> {
  const out: Trial[] = [];
  let seq = 0;
  const total = n * Math.max(1, families.length);
  for (let i = 0; i < total; i++) {
    const family = families.length ? families[i % families.length] : undefined;
    const owner = await waitOwner(tb, undefined, 15000, true, family);
    // Every trial starts from a ready pair: the standby's node Up both ways and its conntrack in sync.
    await waitStandbyReady(tb, owner.node, owner.node === 'n1' ? 'n2' : 'n1', 20_000, synced, undefined, family);
    const podKey = `${owner.node}-${owner.st.owner.split('/')[1]}`;
    const { report } = await runTraffic(tb, CONNS, 4500, async () => {
      if (failure === 'podKill') await tb.mustExec('router', ['ip', 'netns', 'del', tb.pod(podKey).ns]);
      else {
        await tb.killTetherd(owner.node, 'SIGKILL');
        await tb.setUplink(owner.node, 'down');
      }
    }, family ? { family } : {});
    const next = await waitOwner(tb, owner.st.owner, 15000, true, family);
    // The gap of the failover: the longest one that ended after the failure began (set-up stalls excluded).
    const gapMs = report.maxGapAfterMarkMs ?? report.maxGapMs;
    out.push({ ...(family ? { family } : {}), gapMs, survived: report.intact / report.connections, takeover: next.st.lastTakeover?.cause });
    process.stdout.write(`  ${failure}${family ? ` IPv${family}` : ''} trial ${Math.floor(i / Math.max(1, families.length)) + 1}/${n}: longest gap ${gapMs} ms, ${report.intact}/${report.connections} survived\n`);
    if (failure === 'podKill') {
      // A replacement gateway on the node that lost its own, so every trial starts with two candidates.
      await tb.addPod(owner.node, { name: `gw${owner.node.slice(1)}r${++seq}`, namespace: 'shop', tether: { labels: { role: 'egress-gw' } } });
    } else {
      // The node comes back; its gateway pod is a standby again once BFD is Up and its sync has caught up.
      await tb.setUplink(owner.node, 'up');
      await tb.tetherd(owner.node).start();
      await tb.syncBlockRoutes();
    }
    await new Promise((r) => setTimeout(r, 1500));
  }
  return out;
}

export function summarise(ts: Trial[]) {
  const gaps = ts.map((t) => t.gapMs);
  return {
    trials: ts.length,
    gapMs: { p50: percentile(gaps, 50), p95: percentile(gaps, 95), max: Math.max(...gaps) },
    survivalPct: Math.round((ts.reduce((a, t) => a + t.survived, 0) / ts.length) * 1000) / 10,
  };
}

async function main() {
  const withSync = await withTestbed(topology(), (tb) => trials(tb, TRIALS));
  const nodeDown = await withTestbed(topology(), (tb) => trials(tb, NODE_TRIALS, 'nodeDown'));
  const without = await withTestbed(topology(['--no-conntrack-sync']), (tb) => trials(tb, BASELINE_TRIALS, 'podKill', false));
  const a = summarise(withSync);
  const c = summarise(nodeDown);
  const b = summarise(without);
  const result = { benchmark: 'egress-failover', machine: machine(), connectionsPerTrial: CONNS, withSync: a, nodeDown: c, withoutSync: b, trials: { withSync, nodeDown, withoutSync: without } };
  fs.mkdirSync(path.join(repo, 'results'), { recursive: true });
  fs.writeFileSync(path.join(repo, 'results/bench-egress.json'), JSON.stringify(result, null, 2) + '\n');
  const m = result.machine as Record<string, unknown>;
  const bfd = (topology().extraObjects?.find((o) => (o as { kind: string }).kind === 'Egress') as { spec: { failover?: { intervalMs?: number; detectMultiplier?: number } } } | undefined)?.spec.failover;
  const md = `Measured by \`npm run bench\` on ${m.cpu} (${m.cores} cores), kernel ${m.kernel}, ${String(m.date).slice(0, 10)}, under ${CONNS} long-lived TCP connections (50 ms request spacing); BFD ${bfd?.intervalMs ?? 50} ms × ${bfd?.detectMultiplier ?? 3}. The gap is the longest time any connection went without an echo, among gaps that ended after the failure began (failure → traffic through the new owner).

| failure | trials | gap p50 (ms) | gap p95 (ms) | gap max (ms) | connections surviving |
|---|---|---|---|---|---|
| owning gateway pod killed (namespace deleted) | ${a.trials} | ${a.gapMs.p50} | ${a.gapMs.p95} | ${a.gapMs.max} | ${a.survivalPct} % |
| owner's node lost (tetherd killed, uplink down) | ${c.trials} | ${c.gapMs.p50} | ${c.gapMs.p95} | ${c.gapMs.max} | ${c.survivalPct} % |
| pod killed, without conntrack sync (baseline) | ${b.trials} | ${b.gapMs.p50} | ${b.gapMs.p95} | ${b.gapMs.max} | ${b.survivalPct} % |

Targets: pod kill p50 ≤ 300 ms (${a.gapMs.p50 <= 300 ? 'met' : 'not met'}), p95 ≤ 500 ms (${a.gapMs.p95 <= 500 ? 'met' : 'not met'}); node lost p95 ≤ 200 ms (${c.gapMs.p95 <= 200 ? 'met' : 'not met'}); 100 % survival (${a.survivalPct === 100 && c.survivalPct === 100 ? 'met' : 'not met'}). Raw figures: \`results/bench-egress.json\`.`;
  updateReadme(path.join(repo, 'README.md'), 'egress', md);
  process.stdout.write(md + '\n');
}

if (require.main === module) {
  main().catch((e) => {
    process.stderr.write(`bench failed: ${(e as Error).stack ?? e}\n`);
    process.exit(1);
  });
}
