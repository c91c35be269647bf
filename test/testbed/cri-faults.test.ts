// Faults on kubelet's path: a private containerd (Debian's 1.6, its CRI plugin) runs the conflists
// `tether-install` wrote against a real tetherd (with a pod pool and a real Redis for its block claims), and
// the test breaks things around it as a node does: tether-ipam as the primary's IPAM; tetherd uninstalled
// under running pods; containerd SIGKILLed while ADDs are in flight; tetherd SIGKILLed while DELs are in
// flight. After each, whatever kubelet would do next is done over CRI, and nothing may be left: no
// sandbox, veth, netns, host-local or tetherd allocation, tetherd record, or queued DEL.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { bin } from '../lib/binaries';
import { Containerd } from '../lib/cri/containerd';
import { hostLocalAllocations, prepareNodeCni, type NodeCni } from '../lib/cri/tether-cni';
import { removeDaemonDir, startDaemon, type TestDaemon } from '../lib/daemon';
import { startRedis, type TestRedis } from '../lib/redis';

// Subnets of their own per run (pid-derived) so a concurrent run's host routes never overlap ours:
// host-local's for the ptp + host-local network, tetherd's pod pool for the ptp + tether-ipam network.
const N = process.pid % 250;
const HL_SUBNET = `10.236.${N}.0/24`;
const POOL_CIDR = `10.237.${N}.0/24`;
const POOL = 'cri-faults';
const OURS = [`10.236.${N}.`, `10.237.${N}.`];
const ours = (ip: string) => OURS.some((p) => ip.startsWith(p));

let root = '';
let redis: TestRedis | undefined;
let d: TestDaemon | undefined;
let hl: NodeCni; // ptp + host-local, then tether
let ti: NodeCni; // ptp + tether-ipam, then tether
let cdHl: Containerd | undefined;
let cdTi: Containerd | undefined;
/** /run/netns entries present before the file ran: never ours. */
let netnsBefore = new Set<string>();

const daemon = () => d as TestDaemon;
const queueDir = (x: TestDaemon) => path.join(x.stateDir, 'delete-queue');
const queued = (x: TestDaemon) => (fs.existsSync(queueDir(x)) ? fs.readdirSync(queueDir(x)).filter((f) => f.endsWith('.json')).sort() : []);

interface Status {
  pods: { containerId: string; pod?: string; netns: string }[];
  ipam: { pods: { pool: string; families: { allocated: number }[] }[] };
}

function status(): Status {
  const r = spawnSync(bin('tetherctl'), ['--socket', daemon().socket, 'status'], { encoding: 'utf8', timeout: 20_000 });
  if (r.status !== 0) throw new Error(`tetherctl status: ${r.stderr}`);
  return JSON.parse(r.stdout) as Status;
}
const allocated = (s: Status) => (s.ipam.pods.find((p) => p.pool === POOL)?.families ?? []).reduce((k, f) => k + f.allocated, 0);

/** Host routes to our pods' addresses, with the veth ptp made for each. */
function ourRoutes(): { dst: string; dev: string }[] {
  const r = spawnSync('ip', ['-j', 'route', 'show'], { encoding: 'utf8' });
  return (JSON.parse(r.stdout || '[]') as { dst: string; dev: string }[]).filter((x) => ours(x.dst));
}

function linkExists(dev: string): boolean {
  return spawnSync('ip', ['link', 'show', 'dev', dev], { stdio: 'ignore' }).status === 0;
}

const cniNetnsNames = () => (fs.existsSync('/run/netns') ? fs.readdirSync('/run/netns').filter((n) => n.startsWith('cni-')) : []);

/** The IPv4 addresses (lo excluded) and the links (lo excluded) in a netns; undefined if it is gone. */
function netnsContent(p: string): { addrs: string[]; links: string[] } | undefined {
  const r = spawnSync('nsenter', [`--net=${p}`, 'ip', '-j', 'addr', 'show'], { encoding: 'utf8', timeout: 10_000 });
  if (r.status !== 0) return undefined; // gone meanwhile, or not a netns mount
  const ls = (JSON.parse(r.stdout || '[]') as { ifname: string; addr_info: { family: string; local: string }[] }[]).filter((l) => l.ifname !== 'lo');
  return { links: ls.map((l) => l.ifname), addrs: ls.flatMap((l) => l.addr_info.filter((a) => a.family === 'inet').map((a) => a.local)) };
}

/**
 * Network namespaces containerd made (/run/netns/cni-*) since the file started that are ours: an address
 * of our subnets inside, or none at all (a sandbox whose ADD never finished). Concurrent tests' pods have
 * addresses of their own subnets and are not counted.
 */
function ourNetns(): string[] {
  return cniNetnsNames()
    .filter((n) => !netnsBefore.has(n))
    .map((n) => `/run/netns/${n}`)
    .filter((p) => {
      const c = netnsContent(p);
      return c !== undefined && (c.addrs.length === 0 || c.addrs.some(ours));
    });
}

function isMountPoint(p: string): boolean {
  return fs
    .readFileSync('/proc/self/mountinfo', 'utf8')
    .split('\n')
    .some((l) => l.split(' ')[4] === p);
}

/** /run/netns/cni-* files made since `since` that are no netns at all (nothing mounted on them). */
function deadNetnsFiles(since: Set<string>): string[] {
  return cniNetnsNames()
    .filter((n) => !since.has(n))
    .map((n) => `/run/netns/${n}`)
    .filter((p) => {
      try {
        return fs.statSync(p).isFile() && !isMountPoint(p);
      } catch {
        return false;
      }
    });
}

/** Empty netns a test proved to be its own (created in its window, by its containerd): sweep() removes them. */
const ownedNetns = new Set<string>();

function removeNetns(p: string): void {
  spawnSync('umount', ['-l', p], { stdio: 'ignore' });
  fs.rmSync(p, { force: true });
}

/** Everything of ours left on the host, named; empty when nothing leaked. */
function leaks(): string[] {
  const out: string[] = [];
  for (const r of ourRoutes()) out.push(`route ${r.dst} via ${r.dev}`);
  for (const ns of ourNetns()) out.push(`netns ${ns}`);
  for (const f of deadNetnsFiles(netnsBefore)) out.push(`netns file ${f} (nothing mounted)`);
  for (const a of hostLocalAllocations(hl)) out.push(`host-local ${a}`);
  const s = status();
  for (const p of s.pods) out.push(`tetherd record ${p.containerId} (${p.pod ?? '?'})`);
  if (allocated(s)) out.push(`tetherd pool ${POOL}: ${allocated(s)} allocated`);
  for (const f of queued(daemon())) out.push(`queued ${f}`);
  return out;
}

/** Removes what a failed test (or a runtime) left: our routes' veths and our netns. */
function sweep(): void {
  for (const r of ourRoutes()) spawnSync('ip', ['link', 'del', 'dev', r.dev], { stdio: 'ignore' });
  // Only netns holding our addresses or proven ours: an empty one may be a concurrent test's, mid-ADD.
  for (const ns of ourNetns()) if (ownedNetns.has(ns) || netnsContent(ns)?.addrs.some(ours)) removeNetns(ns);
  for (const f of deadNetnsFiles(netnsBefore)) if (ownedNetns.has(f)) removeNetns(f);
}

interface Pod {
  name: string;
  id: string;
  ip: string;
  netns: string | undefined;
  dev: string | undefined;
}

function hostDev(ip: string): string | undefined {
  return ourRoutes().find((r) => r.dst === ip)?.dev;
}

async function runPods(c: Containerd, prefix: string, n: number): Promise<Pod[]> {
  return Promise.all(
    Array.from({ length: n }, async (_, i) => {
      const name = `${prefix}-${i}`;
      const p = await c.runPod({ name, namespace: 'cri-faults' }, 120_000);
      return { name, ...p, dev: hostDev(p.ip) };
    }),
  );
}

/** Processes running `exe` (a CNI plugin of one of our bin dirs) with the given CNI_COMMAND. */
function pluginPids(exe: string, command: string): number[] {
  const pids: number[] = [];
  for (const e of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(e)) continue;
    try {
      if (fs.readlinkSync(`/proc/${e}/exe`) !== exe) continue;
      if (fs.readFileSync(`/proc/${e}/environ`, 'utf8').split('\0').includes(`CNI_COMMAND=${command}`)) pids.push(Number(e));
    } catch {
      /* exited while we looked */
    }
  }
  return pids;
}

/** CNI plugin processes (any plugin) a runtime started with `binDir` as CNI_PATH. */
function cniPids(binDir: string): number[] {
  const pids: number[] = [];
  for (const e of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(e)) continue;
    try {
      const env = fs.readFileSync(`/proc/${e}/environ`, 'utf8').split('\0');
      if (env.includes(`CNI_PATH=${binDir}`) && env.some((v) => v.startsWith('CNI_COMMAND='))) pids.push(Number(e));
    } catch {
      /* exited while we looked */
    }
  }
  return pids;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function waitFor(what: string, cond: () => boolean, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!cond()) {
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await sleep(20);
  }
}

async function cleanup(): Promise<void> {
  for (const c of [cdHl, cdTi]) {
    const problems = c ? await c.destroy() : [];
    if (problems.length) console.error('cri-faults teardown:', problems.join('; '));
  }
  sweep();
  if (d) {
    try {
      process.kill(d.proc.pid as number, 'SIGCONT'); // a failed test may have left it stopped
    } catch {
      /* gone */
    }
    await d.stop();
    fs.rmSync(`/sys/fs/bpf/${path.basename(d.dir)}`, { recursive: true, force: true });
    removeDaemonDir(d);
  }
  await redis?.stop();
  if (root) fs.rmSync(root, { recursive: true, force: true });
}

test.before(async () => {
  try {
    netnsBefore = new Set(fs.existsSync('/run/netns') ? fs.readdirSync('/run/netns') : []);
    root = fs.mkdtempSync(path.join(os.tmpdir(), 'tether-cri-faults-'));
    redis = await startRedis();
    const pools = path.join(root, 'pools.yaml');
    fs.writeFileSync(
      pools,
      `apiVersion: tether.dev/v1alpha1
kind: AddressPool
metadata: { name: ${POOL} }
spec: { usage: pod, ipv4: { cidr: ${POOL_CIDR}, blockSize: 28 } }
`,
    );
    d = await startDaemon({ dir: path.join(root, `tetherd-${path.basename(root).slice(-6)}`), node: 'cri-faults-node', extraArgs: ['--config', pools, '--redis', redis.url] });
    const socketPath = d.socket;
    const deleteQueueDir = queueDir(d);
    hl = prepareNodeCni({ dir: path.join(root, 'hl'), subnet: HL_SUBNET, tetherdSocket: socketPath, tetherEntry: { deleteQueueDir } });
    ti = prepareNodeCni({
      dir: path.join(root, 'ti'),
      subnet: POOL_CIDR,
      tetherdSocket: socketPath,
      tetherEntry: { deleteQueueDir },
      ipam: { type: 'tether-ipam', pool: POOL, socketPath, deleteQueueDir, routes: [{ dst: '0.0.0.0/0' }] },
    });
    cdHl = new Containerd({ dir: path.join(root, 'cd-hl'), cniBinDir: hl.binDir, cniConfDir: hl.confDir });
    cdTi = new Containerd({ dir: path.join(root, 'cd-ti'), cniBinDir: ti.binDir, cniConfDir: ti.confDir });
    await cdHl.start();
    await cdTi.start();
  } catch (e) {
    await cleanup();
    throw e;
  }
});

test.after(cleanup);

test('tether-ipam as ptp\'s IPAM through CRI: 10 parallel pods get addresses of tetherd\'s pool; removed, tetherd holds none', async () => {
  const c = cdTi as Containerd;
  const conf = JSON.parse(fs.readFileSync(path.join(ti.confDir, ti.files[0]), 'utf8')) as { plugins: { type: string; ipam?: { type: string } }[] };
  assert.equal(conf.plugins.map((p) => p.type), ['ptp', 'tether'], `containerd's network is ${ti.files[0]}`);
  assert.is(conf.plugins[0].ipam?.type, 'tether-ipam');
  assert.ok(fs.existsSync(path.join(ti.binDir, 'tether-ipam')), 'tether-install put tether-ipam in the runtime bin dir');

  const pods = await runPods(c, 'ipam', 10);
  const ips = pods.map((p) => p.ip);
  assert.is(new Set(ips).size, 10, `distinct addresses: ${ips.join(' ')}`);
  for (const p of pods) {
    assert.ok(p.ip.startsWith(OURS[1]), `${p.name} has ${p.ip}, not of pool ${POOL_CIDR}`);
    assert.is((await c.client.podSandboxStatus(p.id)).status.state, 'SANDBOX_READY', p.name);
    assert.ok(p.dev && linkExists(p.dev), `${p.name} has a host veth routed to ${p.ip}`);
  }
  const s = status();
  assert.is(allocated(s), 10, 'tetherd\'s pool holds one address per pod');
  const recs = new Map(s.pods.map((r) => [r.containerId, r]));
  for (const p of pods) assert.is(recs.get(p.id)?.pod, `cri-faults/${p.name}`, `tetherd's record of ${p.name}`);
  assert.equal(hostLocalAllocations(ti), [], 'host-local was never used');

  await Promise.all(pods.map((p) => c.removePod(p.id, 120_000)));
  const after = status();
  assert.is(allocated(after), 0, 'tetherd\'s pool released every address');
  assert.equal(after.pods, [], 'no tetherd record left');
  for (const p of pods) if (p.dev) assert.not.ok(linkExists(p.dev), `veth ${p.dev} of ${p.name} left`);
  assert.equal(c.leftoverNetns(), []);
  assert.equal(leaks(), []);
});

test('tetherd uninstalled (stopped, socket and state dir removed): pods still stop and remove through containerd; ptp and host-local release all', async () => {
  const c = cdHl as Containerd;
  const pods = await runPods(c, 'gone', 3);
  assert.is(hostLocalAllocations(hl).length, 3);
  const x = daemon();
  await x.stop('SIGTERM');
  fs.rmSync(x.socket, { force: true });
  fs.rmSync(x.stateDir, { recursive: true, force: true });
  try {
    for (const p of pods) {
      await c.client.stopPodSandbox(p.id, 60_000);
      await c.client.removePodSandbox(p.id, 60_000);
    }
    const ids = new Set(pods.map((p) => p.id));
    assert.equal((await c.client.listPodSandbox()).filter((s) => ids.has(s.id)), [], 'containerd still lists the sandboxes');
    assert.equal(hostLocalAllocations(hl), [], 'host-local released the addresses');
    for (const p of pods) {
      assert.ok(p.dev, `${p.name} had a veth`);
      assert.not.ok(linkExists(p.dev as string), `veth ${p.dev} of ${p.name} left`);
      assert.is(hostDev(p.ip), undefined, `route to ${p.ip} left`);
    }
    assert.equal(c.leftoverNetns(), [], 'netns left');
    assert.not.ok(fs.existsSync(x.stateDir), 'tether recreated the uninstalled tetherd\'s state dir');
    assert.not.ok(fs.existsSync(x.socket), 'a socket file appeared');
  } finally {
    d = await x.restart();
  }
  assert.equal(leaks(), [], 'after the uninstalled tetherd\'s pods were deleted');
});

test('containerd SIGKILLed while 10 ADDs wait in tether; restarted, kubelet stops and removes every sandbox: nothing leaks', async () => {
  const c = cdHl as Containerd;
  const x = daemon();
  const tetherExe = path.join(hl.binDir, 'tether');
  // tetherd stopped (SIGSTOP) keeps its socket accepting: each ADD runs ptp (veth, host-local address)
  // and then waits in tether for tetherd's answer, so every call is mid-ADD when containerd dies.
  process.kill(x.proc.pid as number, 'SIGSTOP');
  let cont = false;
  const names = Array.from({ length: 10 }, (_, i) => `midadd-${i}`);
  try {
    const calls = names.map((name) => c.runPod({ name, namespace: 'cri-faults' }, 120_000).then(
      (p) => p,
      (e: Error) => e,
    ));
    await waitFor('10 tether ADDs waiting on the stopped tetherd', () => pluginPids(tetherExe, 'ADD').length === 10, 60_000);
    // ptp has done its part for all ten: what the kill strands is real (and what the leak checks must see).
    assert.is(hostLocalAllocations(hl).length, 10, 'host-local holds an address per hanging ADD');
    assert.is(ourRoutes().length, 10, 'ptp routed a veth per hanging ADD');
    assert.is(ourNetns().length, 10, 'a netns per hanging ADD');
    const containerdPid = c.pid as number;
    process.kill(containerdPid, 'SIGKILL');
    await waitFor('containerd to exit', () => !c.running, 10_000);
    const outcomes = await Promise.all(calls);
    for (const o of outcomes) assert.instance(o, Error, `a RunPodSandbox succeeded while its ADD hung: ${JSON.stringify(o)}`);
    process.kill(x.proc.pid as number, 'SIGCONT');
    cont = true;
    // The orphaned tether ADDs get tetherd's answer now and exit (their runtime is gone).
    await waitFor('the orphaned tether ADDs to exit', () => pluginPids(tetherExe, 'ADD').length === 0, 60_000);
  } finally {
    if (!cont) process.kill(x.proc.pid as number, 'SIGCONT');
  }
  // tetherd answered the orphaned ADDs: it records ten pods no runtime was told about.
  assert.is(status().pods.filter((p) => p.pod?.startsWith('cri-faults/midadd-')).length, 10, 'tetherd recorded the ten orphaned ADDs');
  await c.stop(); // removes the stale socket (containerd is already gone)
  fs.rmSync(c.socket, { force: true });
  await c.start();

  // kubelet after a runtime restart: every sandbox the runtime lists, ready or not, is stopped and removed.
  const listed = await c.client.listPodSandbox();
  const mine = listed.filter((s) => names.includes(s.metadata.name));
  console.log(`  after containerd's restart it lists ${mine.length} of the 10 sandboxes (${mine.map((s) => s.state).join(' ') || 'none'})`);
  for (const s of mine) await c.removePod(s.id, 60_000);
  const left = leaks();
  if (left.length) {
    console.log(`  leaked after the mid-ADD kill (${left.length}):\n    ${left.join('\n    ')}`);
    const cdLog = fs.readFileSync(c.logFile, 'utf8').split('\n').filter((l) => /RunPodSandbox|midadd/.test(l));
    console.log(`  containerd log about the sandboxes (${cdLog.length} lines), first ones:\n    ${cdLog.slice(0, 6).join('\n    ')}`);
  }
  assert.equal(left, [], 'leaks after containerd was killed mid-ADD');
});

test('containerd SIGKILLed as soon as the first of 10 ADDs starts (sandboxes at every stage); restarted, kubelet stops and removes every sandbox: no veth, address or record leaks', async () => {
  const c = cdHl as Containerd;
  const names = Array.from({ length: 10 }, (_, i) => `earlykill-${i}`);
  const nsBefore = new Set(cniNetnsNames());
  const calls = names.map((name) => c.runPod({ name, namespace: 'cri-faults' }, 120_000).then(
    (p) => p,
    (e: Error) => e,
  ));
  await waitFor('the first CNI plugin containerd runs', () => cniPids(hl.binDir).length > 0, 60_000);
  const inFlight = cniPids(hl.binDir).length;
  process.kill(c.pid as number, 'SIGKILL');
  await waitFor('containerd to exit', () => !c.running, 10_000);
  const outcomes = await Promise.all(calls);
  const succeeded = outcomes.filter((o) => !(o instanceof Error)).length;
  await waitFor('the orphaned plugins to exit', () => cniPids(hl.binDir).length === 0, 60_000);
  const nsAtKill = cniNetnsNames().filter((n) => !nsBefore.has(n));
  await c.stop();
  fs.rmSync(c.socket, { force: true });
  await c.start();
  const mine = (await c.client.listPodSandbox()).filter((s) => names.includes(s.metadata.name));
  // containerd 1.6 saves a sandbox before it makes its netns and records the netns path afterwards: a
  // sandbox it recovers without that path can never have its netns removed by Stop/RemovePodSandbox.
  let pathless = 0;
  for (const s of mine) {
    const st = await c.client.podSandboxStatus(s.id, true);
    const ns = JSON.parse(st.info.info ?? '{}') as { runtimeSpec?: { linux?: { namespaces?: { type: string; path?: string }[] } } };
    if (!ns.runtimeSpec?.linux?.namespaces?.find((n) => n.type === 'network')?.path) pathless++;
  }
  console.log(
    `  ${inFlight} plugin(s) running at the kill, ${succeeded} RunPodSandbox returned, ${nsAtKill.length} netns made; containerd lists ${mine.length} after its restart (${pathless} without a netns path)`,
  );
  for (const s of mine) await c.removePod(s.id, 60_000);
  // Under load containerd may not have taken all 10 requests by the kill; a request it never saved left
  // nothing behind. It saves a sandbox before making its netns, so each netns made marks one it must
  // recover, and so does each RunPodSandbox that returned.
  assert.ok(mine.length >= Math.max(nsAtKill.length, succeeded, 1), `containerd recovered ${mine.length} sandboxes; ${nsAtKill.length} netns had been made and ${succeeded} RunPodSandbox calls returned`);

  const left = leaks();
  // What is left may only be containerd's own: netns made in this window with nothing of CNI's in them
  // (no interface but lo), and files in /run/netns made in this window with no netns mounted on them; at
  // most one of either per sandbox recovered without its netns path.
  const strandedNetns = left.filter((l) => l.startsWith('netns /')).map((l) => l.slice('netns '.length));
  const deadFiles = deadNetnsFiles(nsBefore);
  assert.equal(left.filter((l) => !l.startsWith('netns /') && !l.startsWith('netns file ')), [], 'veths, addresses, records or queued DELs left after containerd was killed as its ADDs began');
  for (const p of [...strandedNetns, ...deadFiles]) {
    assert.ok(nsAtKill.includes(path.basename(p)), `${p} left, not made by this containerd in this window`);
    ownedNetns.add(p);
  }
  for (const p of strandedNetns) assert.equal(netnsContent(p)?.links, [], `${p} left holding interfaces`);
  const stranded = strandedNetns.length + deadFiles.length;
  assert.ok(stranded <= pathless, `${stranded} netns or netns files left but only ${pathless} sandboxes lost their netns path`);
  if (stranded) {
    console.log(
      `  containerd 1.6 left ${strandedNetns.length} empty netns and ${deadFiles.length} unmounted netns files (of sandboxes recovered without their netns path): ${[...strandedNetns, ...deadFiles].join(' ')}`,
    );
    for (const p of [...strandedNetns, ...deadFiles]) removeNetns(p);
  }
  assert.equal(leaks(), []);
  assert.equal(deadNetnsFiles(nsBefore), []);
});

test('tetherd SIGKILLed while 10 pods (tether-ipam) are removed in parallel through containerd: every remove succeeds; after restart nothing is left', async () => {
  const c = cdTi as Containerd;
  const pods = await runPods(c, 'middel', 10);
  assert.is(status().pods.length, 10);
  assert.is(allocated(status()), 10);
  const x = daemon();
  const logBefore = x.log().length;
  const removes = pods.map((p) => c.removePod(p.id, 120_000).then(
    () => undefined,
    (e: Error) => e,
  ));
  // Killed as soon as tetherd has handled the first DEL: the others are in flight or not yet connected.
  await waitFor('tetherd to detach the first pod', () => x.log().slice(logBefore).includes('"message":"pod detached"'), 60_000);
  await x.stop('SIGKILL');
  const outcomes = await Promise.all(removes);
  assert.equal(outcomes.filter((o) => o !== undefined).map(String), [], 'every StopPodSandbox/RemovePodSandbox succeeded');
  const queuedNow = queued(x);
  assert.ok(queuedNow.length > 0, 'no DEL found tetherd gone (the kill came after all of them): the test proved nothing');
  for (const p of pods) if (p.dev) assert.not.ok(linkExists(p.dev), `veth ${p.dev} of ${p.name} left`);
  assert.equal(c.leftoverNetns(), [], 'netns left');
  console.log(`  SIGKILL during 10 removes: ${queuedNow.length} DELs queued (${queuedNow.filter((f) => f.startsWith('cni.del')).length} tether, ${queuedNow.filter((f) => f.startsWith('ipam.del')).length} tether-ipam)`);

  d = await x.restart();
  assert.equal(queued(daemon()), [], 'the queue was drained at start');
  const s = status();
  assert.equal(s.pods, [], 'no tetherd record left');
  assert.is(allocated(s), 0, 'no pool address left allocated');
  assert.equal(leaks(), []);
});

test.run();
