// Benchmark (not a test): tetherd's start to ready in the DaemonSet's container (install/'s manifest, the
// image, containerd + runc, the host's bpffs) against the same executable started as a plain process in the
// same kind of namespace, in the same run, alternating. Ready = /readyz answers 200 on the probe port (the
// runtime's conflist chains tether), which is what kubelet's readinessProbe waits for.
// Writes results/bench-node-container.json and the README block bench:node-container.
import { spawn } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { NodeRuntime } from '../lib/container/node-runtime';
import { containerOf, tetherdPodSpec } from '../lib/container/pod-spec';
import { addNetns, delNetns, uniqueName } from '../lib/netns';
import { run } from '../testbed/proc';
import { machine, summary, updateReadme } from './stats';

const repo = path.resolve(__dirname, '../..');
const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 7);

async function readyz(nsPath: string, port: number): Promise<boolean> {
  const js = `fetch('http://127.0.0.1:${port}/readyz').then((r) => process.exit(r.status === 200 ? 0 : 1), () => process.exit(1))`;
  return (await run(['nsenter', `--net=${nsPath}`, process.execPath, '-e', js], { timeoutMs: 5000 })).code === 0;
}

async function waitReady(nsPath: string, port: number, alive: () => boolean): Promise<void> {
  const end = Date.now() + 60_000;
  while (!(await readyz(nsPath, port))) {
    if (!alive()) throw new Error('tetherd exited before ready');
    if (Date.now() > end) throw new Error('not ready after 60 s');
    await new Promise((r) => setTimeout(r, 20));
  }
}

async function main(): Promise<void> {
  const pod = tetherdPodSpec();
  const c = containerOf(pod, 'tetherd');
  const port = Number(c.command.find((a) => a.startsWith('--probe-port='))!.split('=')[1]);
  const rt = new NodeRuntime();
  await rt.start();
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tether-bench-ctr-'));
  const ns = uniqueName('tnc');
  const nsPath = addNetns(ns);
  const pins = `/sys/fs/bpf/${ns}`;
  const inContainer: number[] = [];
  const plain: number[] = [];
  try {
    const netDir = path.join(dir, 'net.d');
    fs.mkdirSync(netDir);
    fs.writeFileSync(path.join(netDir, '10-ptp.conflist'), JSON.stringify({ cniVersion: '1.0.0', name: 'podnet', plugins: [{ type: 'ptp', ipam: { type: 'host-local', subnet: '10.99.0.0/24' } }, { type: 'tether' }] }));
    const drop = ['--kubernetes', '--cluster-key-secret', '--node-name', '--node-address', '--bpf-pin-dir'];
    const flags = c.command.slice(1).filter((a) => !drop.includes(a.split('=')[0]));
    for (let i = 0; i < ROUNDS; i++) {
      // In the container, as the DaemonSet runs it.
      const dirs: Record<string, string> = { 'run-tether': path.join(dir, `run-${i}`), state: path.join(dir, `state-${i}`), 'cni-net': netDir };
      let t0 = process.hrtime.bigint();
      const box = rt.run('tetherd', {
        pod, container: c, nodeNetns: nsPath, env: {},
        hostPath: (v, p) => { const d = dirs[v] ?? p; fs.mkdirSync(d, { recursive: true }); return d; },
        argv: [c.command[0], ...flags, `--node-name=${ns}`, `--bpf-pin-dir=${pins}`],
      }, path.join(dir, 'container.log'));
      await waitReady(nsPath, port, () => box.running);
      inContainer.push(Number(process.hrtime.bigint() - t0) / 1e6);
      box.kill('SIGTERM');
      await box.exited;
      // The same executable as a plain process in the same namespace, paths on the host.
      const sock = path.join(dir, `plain-${i}`, 'tetherd.sock');
      fs.mkdirSync(path.dirname(sock), { recursive: true });
      t0 = process.hrtime.bigint();
      const argv = [path.join(repo, 'dist/bin/tetherd'), `--node-name=${ns}`, `--socket=${sock}`, `--state-dir=${path.dirname(sock)}/state`, `--bpf-pin-dir=${pins}`, `--probe-port=${port}`, `--cni-net-dir=${netDir}`];
      const child = spawn('nsenter', [`--net=${nsPath}`, ...argv], { stdio: 'ignore' });
      await waitReady(nsPath, port, () => child.exitCode === null);
      plain.push(Number(process.hrtime.bigint() - t0) / 1e6);
      child.kill('SIGTERM');
      await new Promise((r) => child.once('exit', r));
    }
  } finally {
    await rt.destroy();
    fs.rmSync(pins, { recursive: true, force: true });
    fs.rmSync(dir, { recursive: true, force: true });
    delNetns(ns);
  }
  const container = summary(inContainer);
  const process_ = summary(plain);
  const result = {
    benchmark: 'node-container',
    machine: machine(),
    note: 'ms from start to /readyz 200 on the probe port; container = ctr run of the manifest\'s tetherd container from the image (containerd + runc: spec, namespaces, mounts, seccomp) ; process = the same dist/bin/tetherd under nsenter; alternating rounds',
    container,
    process: process_,
    ratioP50: Math.round((container.p50 / process_.p50) * 100) / 100,
  };
  fs.mkdirSync(path.join(repo, 'results'), { recursive: true });
  fs.writeFileSync(path.join(repo, 'results/bench-node-container.json'), JSON.stringify(result, null, 2) + '\n');
  const m = result.machine as Record<string, unknown>;
  const md = [
    `tetherd start → ready (/readyz 200), ${ROUNDS} rounds alternating (\`test/bench/node-container.ts\`, ${m.cores} cores ${m.cpu}, ${new Date().toISOString().slice(0, 10)}):`,
    '',
    '| | p50 ms | p95 ms |',
    '|---|---|---|',
    `| in the DaemonSet's container (containerd + runc, image, manifest) | ${container.p50} | ${container.p95} |`,
    `| same executable as a plain process (baseline) | ${process_.p50} | ${process_.p95} |`,
    '',
    `The container costs ${result.ratioP50}× the plain start at p50.`,
  ].join('\n');
  updateReadme(path.join(repo, 'README.md'), 'node-container', md);
  process.stdout.write(md + '\n');
}

main().catch((e) => {
  process.stderr.write(`${(e as Error).stack}\n`);
  process.exit(1);
});
