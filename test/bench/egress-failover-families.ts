// Benchmark (not a test): egress failover in IPv6 beside IPv4, in one run on one dual-stack testbed (pods
// and the floating pool dual-stack, an Egress with one address of each family; nodes talk IPv4). Trials
// alternate the families: each runs long-lived connections of one family through its floating address,
// makes that address's owner fail (its gateway pod killed, or its whole node lost) and measures the longest
// gap any connection saw and how many survived, as test/bench/egress-failover.ts does for IPv4 alone.
// Writes results/bench-egress-families.json and the docs/performance.md block, with IPv6 ÷ IPv4 ratios.
import * as fs from 'node:fs';
import * as path from 'node:path';
import { withTestbed, type Testbed } from '../testbed/testbed';
import { runTraffic, topology, waitOwner, waitStandbyReady } from '../testbed/egress-scenario';
import type { IpFamily } from '../../lib/ip';
import { machine, percentile, updateReadme } from './stats';

const TRIALS = Number(process.env.BENCH_FAILOVER_TRIALS ?? 10);
const NODE_TRIALS = Number(process.env.BENCH_FAILOVER_NODE_TRIALS ?? 6);
const CONNS = Number(process.env.BENCH_FAILOVER_CONNS ?? 50);
const repo = path.resolve(__dirname, '../..');

interface Trial {
  family: IpFamily;
  gapMs: number;
  survived: number;
  takeover?: string;
}

type Failure = 'podKill' | 'nodeDown';

async function trials(tb: Testbed, n: number, failure: Failure): Promise<Trial[]> {
  const out: Trial[] = [];
  let seq = 0;
  for (let i = 0; i < 2 * n; i++) {
    const family: IpFamily = i % 2 ? 6 : 4;
    const owner = await waitOwner(tb, undefined, 15000, true, family);
    const standby = owner.node === 'n1' ? 'n2' : 'n1';
    await waitStandbyReady(tb, owner.node, standby, 20_000, true, undefined, family);
    const podKey = `${owner.node}-${owner.st.owner.split('/')[1]}`;
    const { report } = await runTraffic(tb, CONNS, 4500, async () => {
      if (failure === 'podKill') await tb.mustExec('router', ['ip', 'netns', 'del', tb.pod(podKey).ns]);
      else {
        await tb.killTetherd(owner.node, 'SIGKILL');
        await tb.setUplink(owner.node, 'down');
      }
    }, { family });
    const next = await waitOwner(tb, owner.st.owner, 15000, true, family);
    const gapMs = report.maxGapAfterMarkMs ?? report.maxGapMs;
    out.push({ family, gapMs, survived: report.intact / report.connections, takeover: next.st.lastTakeover?.cause });
    process.stdout.write(`  ${failure} IPv${family} trial ${Math.floor(i / 2) + 1}/${n}: longest gap ${gapMs} ms, ${report.intact}/${report.connections} survived\n`);
    if (failure === 'podKill') {
      await tb.addPod(owner.node, { name: `gw${owner.node.slice(1)}r${++seq}`, namespace: 'shop', tether: { labels: { role: 'egress-gw' } } });
    } else {
      await tb.setUplink(owner.node, 'up');
      await tb.tetherd(owner.node).start();
      await tb.syncBlockRoutes();
    }
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
  const podKill = await withTestbed(topology([], [4, 6]), (tb) => trials(tb, TRIALS, 'podKill'));
  const nodeDown = await withTestbed(topology([], [4, 6]), (tb) => trials(tb, NODE_TRIALS, 'nodeDown'));
  const by = (ts: Trial[], f: IpFamily) => summarise(ts.filter((t) => t.family === f));
  const r2 = (x: number) => Math.round(x * 100) / 100;
  const rows = { podKill: { ipv4: by(podKill, 4), ipv6: by(podKill, 6) }, nodeDown: { ipv4: by(nodeDown, 4), ipv6: by(nodeDown, 6) } };
  const ratio = (k: 'podKill' | 'nodeDown') => ({ p50: r2(rows[k].ipv6.gapMs.p50 / rows[k].ipv4.gapMs.p50), max: r2(rows[k].ipv6.gapMs.max / rows[k].ipv4.gapMs.max) });
  const result = { benchmark: 'egress-failover-families', machine: machine(), connectionsPerTrial: CONNS, ...rows, ratio: { podKill: ratio('podKill'), nodeDown: ratio('nodeDown') }, trials: { podKill, nodeDown } };
  fs.mkdirSync(path.join(repo, 'results'), { recursive: true });
  fs.writeFileSync(path.join(repo, 'results/bench-egress-families.json'), JSON.stringify(result, null, 2) + '\n');
  const m = result.machine as Record<string, unknown>;
  const line = (what: string, f: string, s: ReturnType<typeof summarise>) => `| ${what} | ${f} | ${s.trials} | ${s.gapMs.p50} | ${s.gapMs.p95} | ${s.gapMs.max} | ${s.survivalPct} % |`;
  const md = `Measured by \`npm run bench\` on ${m.cpu} (${m.cores} cores), kernel ${m.kernel}, ${String(m.date).slice(0, 10)}, on one dual-stack testbed (pods and the floating pool dual-stack, one address of each family; the nodes talk IPv4), under ${CONNS} long-lived TCP connections of the trial's family (50 ms request spacing); the families alternate trial by trial. The gap is the longest time any connection went without an echo, among gaps that ended after the failure began.

| failure | family | trials | gap p50 (ms) | gap p95 (ms) | gap max (ms) | connections surviving |
|---|---|---|---|---|---|---|
${line('owning gateway pod killed', 'IPv4', rows.podKill.ipv4)}
${line('owning gateway pod killed', 'IPv6', rows.podKill.ipv6)}
${line("owner's node lost", 'IPv4', rows.nodeDown.ipv4)}
${line("owner's node lost", 'IPv6', rows.nodeDown.ipv6)}

IPv6 ÷ IPv4: pod killed p50 ${result.ratio.podKill.p50}, max ${result.ratio.podKill.max}; node lost p50 ${result.ratio.nodeDown.p50}, max ${result.ratio.nodeDown.max} (target: within 10 %, ${[result.ratio.podKill.p50, result.ratio.nodeDown.p50].every((x) => x <= 1.1) ? 'met' : 'not met'} for p50). Raw figures: \`results/bench-egress-families.json\`.`;
  updateReadme(path.join(repo, 'README.md'), 'egress-families', md);
  process.stdout.write(md + '\n');
}

main().catch((e) => {
  process.stderr.write(`bench failed: ${(e as Error).stack ?? e}\n`);
  process.exit(1);
});
