// Benchmark (not a test): egress failover in IPv6 beside IPv4, in one run on one dual-stack testbed (pods
// and the floating pool dual-stack, an Egress with one address of each family; nodes talk IPv4). Trials
// alternate the families: each runs long-lived connections of one family through its floating address,
// makes that address's owner fail (its gateway pod killed, or its whole node lost) and measures the longest
// gap any connection saw and how many survived, as test/bench/egress-failover.ts does for IPv4 alone.
// Writes results/bench-egress-families.json and the docs/performance.md block, with IPv6 ÷ IPv4 ratios.
import * as fs from 'node:fs';
import * as path from 'node:path';
import { withTestbed } from '../testbed/testbed';
import { topology } from '../testbed/egress-scenario';
import type { IpFamily } from '../../lib/ip';
import { machine, updateReadme } from './stats';
import { summarise, trials, type Trial } from './egress-failover';

const TRIALS = Number(process.env.BENCH_FAILOVER_TRIALS ?? 10);
const NODE_TRIALS = Number(process.env.BENCH_FAILOVER_NODE_TRIALS ?? 6);
const CONNS = Number(process.env.BENCH_FAILOVER_CONNS ?? 50);
const repo = path.resolve(__dirname, '../..');

async function main() {
  const podKill = await withTestbed(topology([], [4, 6]), (tb) => trials(tb, TRIALS, 'podKill', true, [4, 6]));
  const nodeDown = await withTestbed(topology([], [4, 6]), (tb) => trials(tb, NODE_TRIALS, 'nodeDown', true, [4, 6]));
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
