// tetherd and its init container as the DaemonSet runs them (install/'s manifest, the image, containerd +
// runc with the runtime's defaults), at the node's boundary: the host's bpffs mounted by the privileged
// init container and seen on the host; a tetherd that finds no host bpffs refuses to start, naming what
// mounts it; the probes kubelet uses; and /proc/sys read-only without the host's /proc/sys/net mounted:
// a pod whose setup needs a sysctl fails its ADD naming it, a gateway whose role cannot be set up keeps
// tetherd not ready naming the pod — never a silent success.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { NodeRuntime } from '../lib/container/node-runtime';
import { containerOf, tetherdPodSpec, type ContainerSpec, type PodSpec } from '../lib/container/pod-spec';
import { addNetns, delNetns, uniqueName } from '../lib/netns';
import { until } from '../lib/wait';
import { mustRun, run } from './proc';
import { withTestbed } from './testbed';
import { topology as egressTopology } from './egress-scenario';

let rt: NodeRuntime;
let pod: PodSpec;

test.before(async () => {
  rt = new NodeRuntime();
  await rt.start();
  pod = tetherdPodSpec();
});

test.after(async () => {
  const left = await rt?.destroy();
  assert.equal(left ?? [], [], 'the runtime left nothing behind');
});

/** A scratch directory standing for one of the host's: volumes not named here map to the host's own path. */
function hostDirs(dirs: Record<string, string>) {
  return (volume: string, p: string) => {
    const d = dirs[volume] ?? p;
    fs.mkdirSync(d, { recursive: true });
    return d;
  };
}

/** The manifest's tetherd flags without those that need a cluster (service account, Secret, node address). */
function standaloneArgv(c: ContainerSpec, node: string): string[] {
  const drop = ['--kubernetes', '--cluster-key-secret', '--redis-password-secret', '--node-name', '--node-address'];
  return [...c.command.filter((a) => !drop.includes(a.split('=')[0])), `--node-name=${node}`];
}

function isBpffs(p: string): boolean {
  return fs.readFileSync('/proc/self/mountinfo', 'utf8').split('\n').some((l) => l.split(' ')[4] === p && l.includes(' - bpf '));
}

/** GET on the node's loopback (the probes are bound to 127.0.0.1 of the node's namespace). */
async function probe(nsPath: string, port: number, p: string): Promise<{ status: number; body: string }> {
  const js = `fetch('http://127.0.0.1:${port}${p}').then(async (r) => process.stdout.write(JSON.stringify({ status: r.status, body: await r.text() })), (e) => { process.stdout.write(JSON.stringify({ status: 0, body: String(e) })); })`;
  const r = await run(['nsenter', `--net=${nsPath}`, process.execPath, '-e', js], { timeoutMs: 10_000 });
  return JSON.parse(r.stdout || '{"status":0,"body":"no output"}');
}

test('mount-bpf-fs: on a host without bpffs the privileged init container mounts one that the host sees (Bidirectional); run again it changes nothing', async () => {
  const name = uniqueName('tnc');
  const nsPath = addNetns(name);
  const scratch = fs.mkdtempSync(path.join(os.tmpdir(), 'tether-host-bpf-'));
  const log = path.join(scratch, '..', `${path.basename(scratch)}.log`);
  // The host's /sys/fs/bpf stand-in, in a shared peer group as systemd makes every mount on a real node.
  await mustRun(['mount', '--bind', scratch, scratch]);
  await mustRun(['mount', '--make-shared', scratch]);
  try {
    assert.not.ok(isBpffs(scratch));
    const c = containerOf(pod, 'mount-bpf-fs');
    const input = { pod, container: c, nodeNetns: nsPath, hostPath: hostDirs({ bpffs: scratch }), argv: c.command, env: {} };
    const st = await rt.runToEnd('mount-bpf-fs', input, log);
    assert.equal(st, { code: 0, signal: null }, fs.readFileSync(log, 'utf8'));
    assert.ok(isBpffs(scratch), 'the host sees a bpffs where the init container mounted it');
    const mounts = () => fs.readFileSync('/proc/self/mountinfo', 'utf8').split('\n').filter((l) => l.split(' ')[4] === scratch).length;
    const before = mounts();
    assert.equal(await rt.runToEnd('mount-bpf-fs', input, log), { code: 0, signal: null });
    assert.is(mounts(), before, 'a node that has its bpffs gets no second one');
  } finally {
    for (let i = 0; i < 4 && fs.readFileSync('/proc/self/mountinfo', 'utf8').includes(` ${scratch} `); i++) await run(['umount', '-l', scratch]);
    fs.rmSync(scratch, { recursive: true, force: true });
    fs.rmSync(log, { force: true });
    delNetns(name);
  }
});

test('tetherd in its container: without the host bpffs it refuses to start and names the init container; with it, its probes answer kubelet: /livez 200, /readyz 503 naming the conflist until the runtime\'s configuration chains tether', async () => {
  const name = uniqueName('tnc');
  const nsPath = addNetns(name);
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tether-node-ctr-'));
  const plainBpf = path.join(dir, 'not-bpffs');
  const pinRoot = `/sys/fs/bpf/${name}`;
  const c = containerOf(pod, 'tetherd');
  const dirs = { 'run-tether': path.join(dir, 'run'), state: path.join(dir, 'state'), 'cni-net': path.join(dir, 'net.d') };
  const log = path.join(dir, 'tetherd.log');
  try {
    const noBpf = await rt.runToEnd('tetherd', { pod, container: c, nodeNetns: nsPath, hostPath: hostDirs({ ...dirs, bpffs: plainBpf }), argv: standaloneArgv(c, name), env: {} }, log);
    assert.equal(noBpf, { code: 2, signal: null });
    const text = fs.readFileSync(log, 'utf8');
    assert.match(text, /\/sys\/fs\/bpf is not a bpffs/);
    assert.match(text, /mount-bpf-fs/);
    assert.equal(fs.readdirSync(plainBpf), [], 'nothing pinned into a plain directory');

    const argv = [...standaloneArgv(c, name).filter((a) => !a.startsWith('--bpf-pin-dir')), `--bpf-pin-dir=${pinRoot}`];
    const t0 = Date.now();
    const box = rt.run('tetherd', { pod, container: c, nodeNetns: nsPath, hostPath: hostDirs(dirs), argv, env: {} }, log);
    const port = Number(c.command.find((a) => a.startsWith('--probe-port='))!.split('=')[1]);
    const ready = await until('tetherd /livez answers', async () => ((await probe(nsPath, port, '/livez')).status === 200 ? true : undefined), 30_000);
    assert.ok(ready && box.running);
    const notReady = await until('tetherd started', async () => {
      const r = await probe(nsPath, port, '/readyz');
      return r.status === 503 && !r.body.includes('starting') ? r : undefined;
    }, 30_000);
    assert.match(notReady.body, /CNI configuration: no CNI configuration in \/host\/etc\/cni\/net\.d|CNI configuration: .*/);
    fs.writeFileSync(path.join(dirs['cni-net'], '10-ptp.conflist'), JSON.stringify({
      cniVersion: '1.0.0', name: 'podnet', plugins: [{ type: 'ptp', ipam: { type: 'host-local', subnet: '10.99.0.0/24' } }, { type: 'tether' }],
    }));
    const r = await until('/readyz 200 once the conflist chains tether', async () => ((await probe(nsPath, port, '/readyz')).status === 200 ? true : undefined), 15_000);
    assert.ok(r);
    process.stdout.write(`  container start → ready: ${Date.now() - t0} ms\n`);
    // Its pins are on the host's bpffs, where they outlive the container.
    assert.ok(fs.existsSync(pinRoot), 'pin dir on the host bpffs');
    box.kill('SIGTERM');
    assert.equal(await box.exited, { code: 0, signal: null }, 'SIGTERM is a clean stop');
  } finally {
    fs.rmSync(pinRoot, { recursive: true, force: true });
    fs.rmSync(dir, { recursive: true, force: true });
    delNetns(name);
  }
});

test('/proc/sys read-only (the host\'s /proc/sys/net not used): a pod with a VIP fails its ADD naming the sysctl; a gateway whose role cannot be set up keeps tetherd not ready, naming the pod, until it goes', async () => {
  const topo = egressTopology();
  // Only the gateway on n1 starts with the testbed: the rest are added below.
  topo.nodes = [{ ...topo.nodes[0] }, { name: 'n2', pods: [] }];
  await withTestbed(topo, async (tb) => {
    const status = async () => (await tb.status('n1')) as unknown as { roleProblems: Array<{ pod: string; role: string; error: string }> };
    const problems = await until('the gateway\'s role problem is reported', async () => {
      const p = (await status()).roleProblems;
      return p.length ? p : undefined;
    });
    assert.equal(problems.map((p) => `${p.pod} ${p.role}`), ['shop/gw1 egress']);
    assert.match(problems[0].error, /EROFS|read-only/);
    const port = Number(containerOf(tetherdPodSpec(), 'tetherd').command.find((a) => a.startsWith('--probe-port='))!.split('=')[1]);
    const ready = await probe(tb.nsPath('n1'), port, '/readyz');
    assert.is(ready.status, 503);
    assert.match(ready.body, /pod shop\/gw1: egress role not set up since .*(EROFS|read-only)/);
    let added = true;
    try {
      await tb.addPod('n2', { name: 'lb', tether: { vips: ['203.0.113.10'] } });
    } catch (e) {
      added = false;
      assert.match((e as Error).message, /arp_ignore|arp_announce/);
      assert.match((e as Error).message, /EROFS|read-only/);
    }
    assert.not.ok(added, 'the ADD of a pod with a VIP fails');
    await tb.delPod('n1-gw1');
    await until('the problem goes with the pod', async () => ((await status()).roleProblems.length === 0 ? true : undefined));
  }, { containers: true, containerEnv: { TETHER_PROC_SYS_NET: '/proc/sys/net' } });
});

test.run();
