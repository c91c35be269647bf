// Benchmark (not a test): CNI ADD/DEL latency on the testbed of ptp+host-local alone versus
// ptp+host-local+tether, interleaved pod by pod so both see the same machine load, with a bare
// `node -e 0` start as the floor. Writes results/bench-cni.json and the README's performance section.
import { execFileSync, spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { withTestbed, type Testbed } from '../testbed/testbed';
import { CniChain } from '../testbed/cni-chain';
import { machine, summary, updateReadme } from './stats';

const PODS = Number(process.env.BENCH_PODS ?? 120);
const WARMUP = 5;
const repo = path.resolve(__dirname, '../..');

function timeSpawn(argv: string[]): number {
  const t0 = process.hrtime.bigint();
  const r = spawnSync(argv[0], argv.slice(1), { stdio: 'ignore' });
  if (r.status !== 0) throw new Error(`${argv.join(' ')} failed`);
  return Number(process.hrtime.bigint() - t0) / 1e6;
}

async function measure(tb: Testbed) {
  const full = tb.conflist('n1');
  const withTether = tb.chain('n1');
  const plain = new CniChain({ ...full, name: 'bench-plain', plugins: [full.plugins[0]] }, { ...withTether.opts });
  const s = { plainAdd: [] as number[], plainDel: [] as number[], tetherAdd: [] as number[], tetherDel: [] as number[], tetherOnlyAdd: [] as number[], tetherOnlyDel: [] as number[], floor: [] as number[], floorNsenter: [] as number[], tetherVersion: [] as number[] };
  const nodeNs = `/run/netns/${tb.nodeNs('n1')}`;
  for (let i = 0; i < PODS + WARMUP; i++) {
    const keep = i >= WARMUP;
    for (const [kind, chain] of (i % 2 ? [['tether', withTether], ['plain', plain]] : [['plain', plain], ['tether', withTether]]) as Array<[string, CniChain]>) {
      const ns = `${tb.prefix}-n1-b${kind[0]}${i}`;
      execFileSync('ip', ['netns', 'add', ns]);
      const att = { containerId: `bench-${kind}-${i}`, netns: `/run/netns/${ns}`, ifName: 'eth0', args: { IgnoreUnknown: '1', K8S_POD_NAMESPACE: 'bench', K8S_POD_NAME: `${kind}-${i}` } };
      const add = await chain.add(att);
      const del = await chain.del(att);
      execFileSync('ip', ['netns', 'del', ns]);
      if (!keep) continue;
      if (kind === 'plain') {
        s.plainAdd.push(add.ms);
        s.plainDel.push(del.ms);
      } else {
        s.tetherAdd.push(add.ms);
        s.tetherDel.push(del.ms);
        s.tetherOnlyAdd.push(add.invocations.find((x) => x.plugin === 'tether')!.ms);
        s.tetherOnlyDel.push(del.invocations.find((x) => x.plugin === 'tether')!.ms);
      }
    }
    if (keep) {
      s.floor.push(timeSpawn([process.execPath, '-e', '0']));
      s.floorNsenter.push(timeSpawn(['nsenter', `--net=${nodeNs}`, process.execPath, '-e', '0']));
      s.tetherVersion.push(timeSpawn(['nsenter', `--net=${nodeNs}`, path.join(repo, 'dist/bin/tether'), '--version']));
    }
  }
  return s;
}

async function main() {
  // host-local on both sides: the comparison is tether's own cost in the chain (IPAM has its own bench).
  const samples = await withTestbed({ nodes: [{ name: 'n1', tether: { encapOverhead: 28, vips: ['198.51.100.10'] } }], externals: [], tether: true, ipam: 'host-local' }, measure);
  const S = Object.fromEntries(Object.entries(samples).map(([k, v]) => [k, summary(v)])) as Record<keyof typeof samples, ReturnType<typeof summary>>;
  const addedAdd = Math.round((S.tetherAdd.p50 - S.plainAdd.p50) * 10) / 10;
  const addedDel = Math.round((S.tetherDel.p50 - S.plainDel.p50) * 10) / 10;
  // Issue target: tether adds at most what ptp + host-local take together (same run).
  const target = S.plainAdd.p50;
  const result = {
    benchmark: 'cni-latency',
    machine: machine(),
    pods: PODS,
    note: 'chains run as a runtime does: each plugin through nsenter --net into the node namespace; pods interleaved plain/tether',
    ms: S,
    tetherAddedP50: { add: addedAdd, del: addedDel },
    ratioToFloor: { add: Math.round((addedAdd / S.floor.p50) * 100) / 100, del: Math.round((addedDel / S.floor.p50) * 100) / 100 },
    ratioToPlain: { add: Math.round((addedAdd / S.plainAdd.p50) * 100) / 100, del: Math.round((addedDel / S.plainDel.p50) * 100) / 100 },
    target: { addedAddP50AtMost: target, met: addedAdd <= target },
  };
  fs.mkdirSync(path.join(repo, 'results'), { recursive: true });
  fs.writeFileSync(path.join(repo, 'results/bench-cni.json'), JSON.stringify(result, null, 2) + '\n');
  const m = result.machine as Record<string, unknown>;
  const row = (name: string, x: { p50: number; p95: number }) => `| ${name} | ${x.p50} | ${x.p95} |`;
  const md = `Measured by \`npm run bench\` on ${m.cpu} (${m.cores} cores, ${m.memoryGiB} GiB), kernel ${m.kernel}, Node ${m.node}, ${String(m.date).slice(0, 10)}; ${PODS} pods per chain, interleaved, each plugin run through \`nsenter --net\` as a node's runtime does.

| what (ms) | p50 | p95 |
|---|---|---|
${row('ptp + host-local ADD', S.plainAdd)}
${row('ptp + host-local + tether ADD', S.tetherAdd)}
${row('— of which the tether invocation', S.tetherOnlyAdd)}
${row('ptp + host-local DEL', S.plainDel)}
${row('ptp + host-local + tether DEL', S.tetherDel)}
${row('— of which the tether invocation', S.tetherOnlyDel)}
${row('floor: bare `node -e 0`', S.floor)}
${row('floor through nsenter', S.floorNsenter)}
${row('`tether --version` through nsenter (the executable\'s own start)', S.tetherVersion)}

tether (compiled with Bun) adds **${addedAdd} ms** to ADD and **${addedDel} ms** to DEL at p50: ${result.ratioToPlain.add}× and ${result.ratioToPlain.del}× what ptp + host-local take. Target (tether adds at most what ptp + host-local take, ${target} ms for ADD): **${result.target.met ? 'met' : 'not met'}**. Raw figures: \`results/bench-cni.json\`.`;
  updateReadme(path.join(repo, 'README.md'), 'cni', md);
  process.stdout.write(md + '\n');
}

main().catch((e) => {
  process.stderr.write(`bench failed: ${(e as Error).stack ?? e}\n`);
  process.exit(1);
});
