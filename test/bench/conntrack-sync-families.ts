// Benchmark (not a test): conntrack sync of IPv6 flows beside IPv4 ones, measured in the same run on the
// same pair of namespaces: the flows of conntrack-sync-vs-conntrackd.ts, SNATed to an IPv4 or an IPv6
// address, inserted into A at once; the clock stops when B holds them all (in its memory, and in its
// kernel). Trials alternate the families so both see the same machine. Writes `families` into
// results/bench-sync.json (the rest of the file is left as it is) and the README section.
// Run: node_modules/.bin/tsx test/bench/conntrack-sync-families.ts
import * as fs from 'node:fs';
import * as path from 'node:path';
import { median, tetherRun, withSyncPair, type Run } from './conntrack-sync-vs-conntrackd';
import { machine, updateReadme } from './stats';

const SIZES = (process.env.BENCH_SYNC_SIZES ?? '10000,100000').split(',').map(Number);
const TRIALS = Number(process.env.BENCH_SYNC_TRIALS ?? 3);
const repo = path.resolve(__dirname, '../..');


interface Row {
  size: number;
  ipv4: { memory: Run; kernel: Run };
  ipv6: { memory: Run; kernel: Run };
  /** IPv6 rate ÷ IPv4 rate (entries/s), per destination. */
  ratio: { memory: number; kernel: number };
  trials: unknown[];
}

async function main(): Promise<void> {
  const rows: Row[] = [];
  await withSyncPair('tbf', Math.max(...SIZES) + 20_000, async ({ a, b, bundle, flush }) => {
    let salt = 0;
    for (const size of SIZES) {
      const t: Array<Record<'v4m' | 'v4k' | 'v6m' | 'v6k', Run>> = [];
      for (let trial = 0; trial < TRIALS; trial++) {
        const one = async (into: 'memory' | 'kernel', family: 4 | 6) => {
          flush();
          return tetherRun(bundle, a, b, size, ++salt, into, family);
        };
        // Alternating order, so neither family always runs first.
        const first: 4 | 6 = trial % 2 ? 6 : 4;
        const second: 4 | 6 = first === 4 ? 6 : 4;
        const r: Partial<Record<'v4m' | 'v4k' | 'v6m' | 'v6k', Run>> = {};
        for (const into of ['memory', 'kernel'] as const) {
          for (const f of [first, second]) r[`v${f}${into[0]}` as 'v4m'] = await one(into, f);
        }
        t.push(r as Record<'v4m' | 'v4k' | 'v6m' | 'v6k', Run>);
        const s = (x: Run) => `${x.ms} ms (${x.perSec}/s${x.complete ? '' : ', INCOMPLETE'})`;
        process.stdout.write(`  ${size} #${trial + 1}: memory IPv4 ${s(r.v4m!)} IPv6 ${s(r.v6m!)}; kernel IPv4 ${s(r.v4k!)} IPv6 ${s(r.v6k!)}\n`);
      }
      const ipv4 = { memory: median(t.map((x) => x.v4m)), kernel: median(t.map((x) => x.v4k)) };
      const ipv6 = { memory: median(t.map((x) => x.v6m)), kernel: median(t.map((x) => x.v6k)) };
      const r2 = (x: number) => Math.round(x * 100) / 100;
      rows.push({ size, ipv4, ipv6, ratio: { memory: r2(ipv6.memory.perSec / ipv4.memory.perSec), kernel: r2(ipv6.kernel.perSec / ipv4.kernel.perSec) }, trials: t });
    }
  });
  const m = machine();
  const file = path.join(repo, 'results/bench-sync.json');
  const prev = fs.existsSync(file) ? JSON.parse(fs.readFileSync(file, 'utf8')) : {};
  fs.writeFileSync(file, JSON.stringify({ ...prev, families: { machine: m, trials: TRIALS, rows } }, null, 2) + '\n');
  const cell = (x: Run) => `${x.ms} ms, ${x.perSec}/s${x.complete ? '' : ' (incomplete)'}`;
  const md = `Conntrack sync of IPv6 flows beside IPv4 ones, on ${m.cpu} (${m.cores} cores), ${String(m.date).slice(0, 10)}: the same sender and receiver processes and flows as above, SNATed to an IPv4 or an IPv6 address (the stream's scope), N inserted into A at once; the clock stops when B holds all N; median of ${TRIALS} trials, the families alternating within each trial. The ratio is IPv6's rate over IPv4's (1 = the same).

| entries | IPv4 → memory | IPv6 → memory | ratio | IPv4 → kernel | IPv6 → kernel | ratio |
|---|---|---|---|---|---|---|
${rows.map((r) => `| ${r.size} | ${cell(r.ipv4.memory)} | ${cell(r.ipv6.memory)} | **${r.ratio.memory}** | ${cell(r.ipv4.kernel)} | ${cell(r.ipv6.kernel)} | **${r.ratio.kernel}** |`).join('\n')}

Raw figures: \`results/bench-sync.json\` (\`families\`).`;
  updateReadme(path.join(repo, 'README.md'), 'sync-families', md);
  process.stdout.write(md + '\n');
}

main().catch((e) => {
  process.stderr.write(`bench failed: ${(e as Error).stack ?? e}\n`);
  process.exit(1);
});
