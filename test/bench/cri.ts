// Benchmark (not a test): RunPodSandbox and StopPodSandbox+RemovePodSandbox through containerd's CRI, as
// kubelet calls them, with ptp + host-local alone versus ptp + host-local + tether (the conflist
// tether-install wrote, a real tetherd). Two private containerds run side by side, one per configuration,
// and pods alternate between them one at a time so both see the same machine load. What remains after
// the subtraction is tether's share of a pod start. Writes results/bench-cri.json and the README block.
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { Containerd } from '../lib/cri/containerd';
import { prepareNodeCni } from '../lib/cri/tether-cni';
import { removeDaemonDir, startDaemon, type TestDaemon } from '../lib/daemon';
import { machine, percentile, updateReadme } from './stats';

const PODS = Number(process.env.BENCH_CRI_PODS ?? 20);
const WARMUP = 2;
const repo = path.resolve(__dirname, '../..');

const ms = (t0: bigint) => Number(process.hrtime.bigint() - t0) / 1e6;
const r1 = (v: number) => Math.round(v * 10) / 10;
const stat = (xs: number[]) => ({ n: xs.length, p50: r1(percentile(xs, 50)), p90: r1(percentile(xs, 90)) });

async function main(): Promise<void> {
  const root = fs.mkdtempSync(path.join(os.tmpdir(), 'tether-bench-cri-'));
  let d: TestDaemon | undefined;
  const runtimes: Containerd[] = [];
  try {
    d = await startDaemon({ dir: path.join(root, `tetherd-bcri-${path.basename(root).slice(-6)}`), node: 'bench-cri', extraArgs: ['--log-level', 'info'] });
    const plainCni = prepareNodeCni({ dir: path.join(root, 'plain'), subnet: '10.232.1.0/24' });
    const tetherCni = prepareNodeCni({ dir: path.join(root, 'tether'), subnet: '10.232.2.0/24', tetherdSocket: d.socket });
    const plain = new Containerd({ dir: path.join(root, 'plain', 'containerd'), cniBinDir: plainCni.binDir, cniConfDir: plainCni.confDir });
    const withTether = new Containerd({ dir: path.join(root, 'tether', 'containerd'), cniBinDir: tetherCni.binDir, cniConfDir: tetherCni.confDir });
    runtimes.push(plain, withTether);
    await Promise.all(runtimes.map((c) => c.start()));
    const samples = { plainRun: [] as number[], tetherRun: [] as number[], plainRemove: [] as number[], tetherRemove: [] as number[] };
    const load0 = os.loadavg()[0];
    for (let i = 0; i < PODS + WARMUP; i++) {
      // Alternate which goes first, so neither always runs right after the other's teardown.
      const order: Array<['plain' | 'tether', Containerd]> = i % 2 ? [['tether', withTether], ['plain', plain]] : [['plain', plain], ['tether', withTether]];
      for (const [kind, c] of order) {
        let t0 = process.hrtime.bigint();
        const id = await c.client.runPodSandbox(c.podConfig({ name: `b${kind[0]}${i}`, namespace: 'bench' }));
        const run = ms(t0);
        const st = await c.client.podSandboxStatus(id);
        if (st.status.state !== 'SANDBOX_READY' || !st.status.network?.ip) throw new Error(`${kind} pod ${i} not ready: ${JSON.stringify(st.status)}`);
        t0 = process.hrtime.bigint();
        await c.removePod(id);
        const remove = ms(t0);
        if (i < WARMUP) continue;
        samples[`${kind}Run`].push(run);
        samples[`${kind}Remove`].push(remove);
      }
    }
    const S = Object.fromEntries(Object.entries(samples).map(([k, v]) => [k, stat(v)])) as Record<keyof typeof samples, ReturnType<typeof stat>>;
    const share = { run: r1(S.tetherRun.p50 - S.plainRun.p50), remove: r1(S.tetherRemove.p50 - S.plainRemove.p50) };
    const result = {
      benchmark: 'cri',
      machine: { ...machine(), loadAverage: [r1(load0), r1(os.loadavg()[0])] },
      pods: PODS,
      runtime: (await plain.client.version()).runtimeVersion,
      note: 'two private containerds (CRI v1 over their sockets), one per conflist; pods run and removed one at a time, alternating; RunPodSandbox includes the pause container start',
      ms: S,
      tetherShareP50: share,
    };
    fs.mkdirSync(path.join(repo, 'results'), { recursive: true });
    fs.writeFileSync(path.join(repo, 'results/bench-cri.json'), JSON.stringify(result, null, 2) + '\n');
    // machine() is loosely typed (Record<string, unknown>); name the fields the text uses.
    const m = result.machine as { cpu: string; cores: number; date: string; loadAverage: number[] };
    const row = (name: string, x: { p50: number; p90: number }) => `| ${name} | ${x.p50} | ${x.p90} |`;
    const md = `RunPodSandbox through containerd ${result.runtime}'s CRI, as kubelet calls it (\`test/bench/cri.ts\`), on ${m.cpu} (${m.cores} cores), ${m.date.slice(0, 10)}, load average ${m.loadAverage[0]}→${m.loadAverage[1]}; ${PODS} pods per configuration, one at a time, alternating between two containerds that differ only in their conflist.

| what (ms) | p50 | p90 |
|---|---|---|
${row('RunPodSandbox, ptp + host-local', S.plainRun)}
${row('RunPodSandbox, ptp + host-local + tether', S.tetherRun)}
${row('StopPodSandbox + RemovePodSandbox, ptp + host-local', S.plainRemove)}
${row('StopPodSandbox + RemovePodSandbox, ptp + host-local + tether', S.tetherRemove)}

tether's share at p50: **${share.run} ms** of a pod sandbox's start and ${share.remove} ms of its removal. Raw figures: \`results/bench-cri.json\`.`;
    updateReadme(path.join(repo, 'README.md'), 'cri', md);
    process.stdout.write(md + '\n');
  } finally {
    for (const c of runtimes) {
      const problems = await c.destroy();
      if (problems.length) process.stderr.write(`teardown: ${problems.join('; ')}\n`);
    }
    if (d) {
      await d.stop();
      fs.rmSync(`/sys/fs/bpf/${path.basename(d.dir)}`, { recursive: true, force: true });
      removeDaemonDir(d);
    }
    fs.rmSync(root, { recursive: true, force: true });
  }
}

main().catch((e) => {
  process.stderr.write(`bench failed: ${(e as Error).stack ?? e}\n`);
  process.exit(1);
});
