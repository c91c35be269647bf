// Install and uninstall at the node's boundary, in the DaemonSets' own containers (issue 19, items 5 and 6):
// the tetherd DaemonSet's init containers `mount-bpf-fs` and `install-cni`, then its `cni-watch` container,
// beside a tetherd that itself runs in its container (Testbed.up(…, { containers: true })); later the
// uninstall DaemonSet's `uninstall-cni`, `clean-node --wait` and `hold`, in the order of docs/install.md's
// removal steps. Every container is the manifest's (kubectl kustomize): its capabilities, seccomp, no_new_privs,
// hostNetwork (the node's namespace) and hostPath volumes, here the node's own stand-in directories. The
// commands are the manifest's, flags included (watch checks every 5 s, clean-node waits 15 s), except where
// the testbed's layout differs from a node's (each named where it is given).
//
// A pod is created and deleted through the node's CNI directory at every step (uninstall-steps.ts), and the
// end state is checked as uninstall.test.ts checks it (there the same steps run as plain processes). The
// host's own /etc/cni/net.d and /opt/cni/bin are never touched: every hostPath volume of these containers
// maps to a node directory, or to a host path that is shared on purpose (bpffs, /run/netns, /proc/sys/net).
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { createHash } from 'node:crypto';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { withTestbed, type Testbed } from './testbed';
import { bpfDir } from './cleanup';
import { sleep } from './proc';
import { until } from '../lib/wait';
import { imageRootfs, type ExitStatus, type NodeContainer, type NodeRuntime } from '../lib/container/node-runtime';
import { containerOf, daemonSetPodSpec, type ContainerSpec, type PodSpec } from '../lib/container/pod-spec';
import { dirBytes, filesUnder, oneNodeEgressTopology, podRoundTrip, putTetherToWork, snapshotNode, writePrimary, type NodeDirs } from './uninstall-steps';

const NODE = 'n1';
/** The primary's owner and mode, as its agent left them: install and uninstall must keep both. */
const PRIMARY_UID = 1000;
const PRIMARY_MODE = 0o600;

// ---- the host's own CNI directories ----------------------------------------------------------------------

const HOST_CNI_PATHS = ['/etc/cni', '/etc/cni/net.d', '/opt/cni', '/opt/cni/bin'];

/** Everything stat says of the host's CNI directories and what is in them (absent is a state too). */
function hostCniState(): Record<string, string> {
  const out: Record<string, string> = {};
  const describe = (p: string) => {
    let st: fs.Stats;
    try {
      st = fs.lstatSync(p);
    } catch (e) {
      out[p] = (e as NodeJS.ErrnoException).code ?? 'error';
      return;
    }
    out[p] = `ino ${st.ino} mode ${st.mode.toString(8)} uid ${st.uid} size ${st.size} mtime ${st.mtimeMs} ctime ${st.ctimeMs}`;
    if (st.isDirectory()) for (const n of fs.readdirSync(p)) describe(path.join(p, n));
  };
  for (const p of HOST_CNI_PATHS) if (!(p in out)) describe(p);
  return out;
}

// ---- the DaemonSets' containers on this node -------------------------------------------------------------

/** hostPath volumes that are the host's own on every testbed node (shared on purpose; pins are per prefix). */
const HOST_SHARED = new Set(['bpffs', 'netns', 'proc-sys-net', 'modules']);

/**
 * The node's directory behind each hostPath volume; a volume neither mapped here nor shared on purpose is
 * an error, never the host's own path (that would be the host's /opt/cni/bin).
 */
function nodeVolumes(dirs: Record<string, string>) {
  return (volume: string, manifestPath: string): string => {
    const d = dirs[volume];
    if (d) {
      fs.mkdirSync(d, { recursive: true }); // type: DirectoryOrCreate
      return d;
    }
    if (HOST_SHARED.has(volume)) return manifestPath;
    throw new Error(`hostPath volume ${volume} (${manifestPath}) has no node directory in this test`);
  };
}

/** The manifest's command with some flags' values replaced (or added): the testbed's layout, not a node's. */
function withFlags(command: string[], flags: Record<string, string>): string[] {
  const out = command.filter((a) => !(a.split('=')[0] in flags));
  return [...out, ...Object.entries(flags).map(([k, v]) => `${k}=${v}`)];
}

interface NodeBox {
  /** Starts one of the pod's containers with the manifest's command, or the given argv. */
  run(pod: PodSpec, name: string, argv?: string[]): { c: NodeContainer; log: string };
  /** An init container: runs it to its end, its status and output. */
  init(pod: PodSpec, name: string, argv?: string[], timeoutMs?: number): Promise<{ st: ExitStatus; out: string }>;
}

function nodeBox(tb: Testbed, rt: NodeRuntime, volumes: Record<string, string>, extraReadOnlyDirs: string[]): NodeBox {
  let n = 0;
  const start = (pod: PodSpec, name: string, argv?: string[]) => {
    const container: ContainerSpec = containerOf(pod, name);
    const log = tb.nodeDir(NODE, `container-${++n}-${name}.log`);
    const c = rt.run(name, {
      pod, container, nodeNetns: tb.nsPath(NODE), hostPath: nodeVolumes(volumes),
      argv: argv ?? container.command, env: {}, extraReadOnlyDirs,
    }, log);
    return { c, log };
  };
  return {
    run: start,
    async init(pod, name, argv, timeoutMs = 60_000) {
      const { c, log } = start(pod, name, argv);
      const st = await Promise.race([c.exited, sleep(timeoutMs).then(() => 'timeout' as const)]);
      if (st === 'timeout') {
        c.kill('SIGKILL');
        throw new Error(`${name} did not finish in ${timeoutMs} ms:\n${fs.readFileSync(log, 'utf8').slice(-3000)}`);
      }
      return { st, out: fs.readFileSync(log, 'utf8') };
    },
  };
}

/** Stops a container as kubelet does when its pod goes (SIGTERM), and its status. */
async function stop(c: NodeContainer, timeoutMs = 10_000): Promise<ExitStatus> {
  c.kill('SIGTERM');
  const st = await Promise.race([c.exited, sleep(timeoutMs).then(() => undefined)]);
  if (st) return st;
  c.kill('SIGKILL');
  throw new Error(`${c.id} did not stop on SIGTERM within ${timeoutMs} ms`);
}

const OK: ExitStatus = { code: 0, signal: null };

function sha256(file: string): string {
  return createHash('sha256').update(fs.readFileSync(file)).digest('hex');
}

interface CleanReport {
  livePods: string[]; executablesRemoved: boolean; filtersDetached: number; sysctlsRestored: number; routesDeleted: number; nftTablesDeleted: number; pinsRemoved: boolean;
}

function cleanReport(out: string): CleanReport {
  const line = out.split('\n').find((l) => l.startsWith('{"filtersDetached"'));
  if (!line) throw new Error(`clean-node printed no report:\n${out.slice(-3000)}`);
  return JSON.parse(line) as CleanReport;
}

test('install-cni, cni-watch, then the uninstall DaemonSet, each in its manifest container: pods work at every step, the node ends clean, the host CNI dirs untouched', async () => {
  const hostBefore = hostCniState();
  await withTestbed(oneNodeEgressTopology(NODE), async (tb) => {
    const tetherd = tb.tetherd(NODE);
    assert.ok(tetherd.container, 'tetherd runs in its DaemonSet container');
    const rt = tetherd.opts.container!.runtime;
    const tetherdPod = daemonSetPodSpec('install', 'tetherd');
    const uninstallPod = daemonSetPodSpec('install/uninstall', 'tether-uninstall');

    // The node's stand-ins for the hostPath volumes. The testbed's tetherd container already has its own
    // (run-tether is the node dir holding its socket, state its --state-dir, cni-net the dir below); the
    // installer's containers get the same ones, as on a node.
    const d: NodeDirs = {
      netDir: tb.nodeDir(NODE, 'cni-net.d'),
      binDir: tb.nodeDir(NODE, 'cni-bin'),
      installerState: tb.nodeDir(NODE, 'state', 'cni-install'), // /var/lib/tether/cni-install
      tetherdState: tb.nodeDir(NODE, 'state'),
      socket: tb.socketPath(NODE),
      pinDir: path.join(bpfDir(tb.prefix), NODE),
      primaryRange: '10.250.1.0/24',
    };
    const volumes = { 'cni-net': d.netDir, 'cni-bin': d.binDir, state: d.tetherdState, 'cni-install-state': d.installerState, 'run-tether': path.dirname(d.socket) };
    // tether's entry in the conflist must name the testbed's socket and deletion queue (the node's paths
    // as the plugin, run on the node, sees them): the testbed's --entry-file, in a read-only dir of its own.
    const entryDir = tb.nodeDir(NODE, 'entry');
    fs.mkdirSync(entryDir, { recursive: true });
    const entryFile = path.join(entryDir, 'tether-entry.json');
    fs.writeFileSync(entryFile, JSON.stringify({ type: 'tether', socketPath: d.socket, deleteQueueDir: path.join(d.tetherdState, 'delete-queue') }));
    const box = nodeBox(tb, rt, volumes, [entryDir]);
    const withEntry = (name: string) => withFlags(containerOf(tetherdPod, name).command, { '--entry-file': entryFile });

    const before = await snapshotNode(tb, NODE);
    const primaryFile = path.join(d.netDir, '10-primary.conflist');
    const primary = writePrimary(tb, NODE, d);
    fs.chownSync(primaryFile, PRIMARY_UID, PRIMARY_UID);
    fs.chmodSync(primaryFile, PRIMARY_MODE);
    const netBefore = dirBytes(d.netDir);
    const ownerMode = () => {
      const st = fs.statSync(primaryFile);
      return { uid: st.uid, gid: st.gid, mode: st.mode & 0o7777 };
    };
    const keptOwner = { uid: PRIMARY_UID, gid: PRIMARY_UID, mode: PRIMARY_MODE };
    assert.equal(filesUnder(d.binDir), [], 'the bin dir starts empty');
    // hold is its container's PID 1: a SIGTERM that comes before it set its handler is ignored (the kernel
    // drops default-action signals to a namespace's init), so it counts as started once it refreshed the
    // tombstone, which it does right before waiting for the signal.
    const tombstone = path.join(d.installerState, 'uninstall-tombstone');
    const startHold = async () => {
      const t0 = Date.now() - 5; // mtime is set from the clock; allow for its rounding
      const h = box.run(uninstallPod, 'hold');
      await until('hold refreshed the tombstone', async () => h.c.running && fs.existsSync(tombstone) && fs.statSync(tombstone).mtimeMs >= t0, 30_000);
      return h;
    };
    const step = async (label: string, tether: boolean) => {
      const p = await podRoundTrip(tb, NODE, d);
      assert.is(p.plugins.includes('tether'), tether, `${label}: the runtime's configuration ${p.configFile} runs ${p.plugins.join(' → ')}`);
      process.stdout.write(`  ${label}: pod created (${p.ip}) and deleted through ${p.configFile} (${p.plugins.join(' → ')})\n`);
    };

    // ---- the tetherd DaemonSet's init containers, in order, then cni-watch beside tetherd.
    const bpf = await box.init(tetherdPod, 'mount-bpf-fs');
    assert.equal(bpf.st, OK, `mount-bpf-fs: ${bpf.out}`);
    const inst = await box.init(tetherdPod, 'install-cni', withEntry('install-cni'));
    assert.equal(inst.st, OK, `install-cni: ${inst.out}`);
    const chained = JSON.parse(fs.readFileSync(primaryFile, 'utf8')) as { plugins: Array<{ type: string; socketPath?: string }> };
    assert.equal(chained.plugins.map((p) => p.type), ['ptp', 'tether'], 'tether chained into the primary list');
    assert.is(chained.plugins[1].socketPath, d.socket);
    assert.equal(ownerMode(), keptOwner, 'the primary keeps its owner and mode');
    assert.equal(fs.readdirSync(d.netDir).sort(), ['10-primary.conflist'], 'no other file in the CNI directory');
    const imageTether = path.join(imageRootfs().rootfs, 'opt/tether/bin/tether');
    assert.equal(filesUnder(d.binDir), ['tether', 'tether-ipam']);
    for (const x of ['tether', 'tether-ipam']) {
      const st = fs.statSync(path.join(d.binDir, x));
      assert.ok(st.isFile() && (st.mode & 0o111) === 0o111, `${x} is an executable file (mode ${st.mode.toString(8)})`);
    }
    assert.is(sha256(path.join(d.binDir, 'tether')), sha256(imageTether), 'tether is the image\'s /usr/local/bin/tether');
    const watch = box.run(tetherdPod, 'cni-watch', withEntry('cni-watch'));
    await step('installed', true);

    // Tether at work: a gateway and a client on the node, the floating address owned here.
    await putTetherToWork(tb, NODE, d, before);
    assert.ok(watch.c.running, `cni-watch runs: ${fs.readFileSync(watch.log, 'utf8').slice(-2000)}`);

    const runLib = tb.nodeDir(NODE, 'lib');
    assert.ok(filesUnder(runLib).length > 0, 'tetherd\'s container wrote its runtime files under its /run/tether');

    // ---- step 1: kubectl apply -k install/uninstall — init uninstall-cni, then init clean-node --wait.
    const un = await box.init(uninstallPod, 'uninstall-cni');
    assert.equal(un.st, OK, `uninstall-cni: ${un.out}`);
    assert.equal(dirBytes(d.netDir), netBefore, 'the CNI directory holds exactly what it held before install');
    assert.equal(ownerMode(), keptOwner, 'owner and mode kept by the uninstall');
    const clean = box.run(uninstallPod, 'clean-node', withFlags(containerOf(uninstallPod, 'clean-node').command, {
      // The testbed's pins are under its own prefix. Its socket shares the node dir with everything else of
      // the node, which the manifest's --run-dir (emptied) would take along: what tetherd's container wrote
      // under its /run/tether besides the socket (lib/, the FFI's runtime files) stands for it.
      '--pin-dir': d.pinDir,
      '--run-dir': '/host/run/tether/lib',
    }));
    // The primary's agent rewrites its file (same bytes): watch's file watch fires, and its periodic check
    // (5 s, the manifest's) runs at least once more. Neither may put tether back while the tombstone lives.
    fs.writeFileSync(primaryFile, primary);
    await sleep(6500);
    assert.equal(dirBytes(d.netDir), netBefore, `cni-watch did not put tether back after the tombstone; watch said: ${fs.readFileSync(watch.log, 'utf8').slice(-3000)}`);
    assert.match(fs.readFileSync(watch.log, 'utf8'), /uninstall in progress/);
    assert.ok(clean.c.running, `clean-node --wait waits while tetherd answers: ${fs.readFileSync(clean.log, 'utf8').slice(-2000)}`);
    assert.ok(fs.existsSync(path.join(d.binDir, 'tether')), 'the executables stay while pods created with tether exist');
    await step('step 1 (tether out of the configuration)', false);
    await tb.delPod('n1-web');
    await step('step 1, old pod deleted', false);

    // ---- step 2: kubectl -n tether-system delete daemonset tetherd — its containers, cni-watch and tetherd, get SIGTERM.
    const [watchEnd, tetherdEnd] = await Promise.all([stop(watch.c), tb.killTetherd(NODE, 'SIGTERM')]);
    assert.equal(watchEnd, OK, `cni-watch exits 0 on SIGTERM: ${fs.readFileSync(watch.log, 'utf8').slice(-2000)}`);
    assert.ok(tetherdEnd.code === 0 || tetherdEnd.signal === 'SIGTERM', `tetherd stopped on SIGTERM: ${JSON.stringify(tetherdEnd)}`);
    assert.equal(dirBytes(d.netDir), netBefore, 'stopping cni-watch wrote nothing');
    await step('step 2 (tetherd gone)', false);
    assert.ok(fs.existsSync(path.join(d.binDir, 'tether')));

    // ---- step 3: clean-node sees tetherd gone (15 s, the manifest's) and cleans; gw1, created with tether, still runs.
    const cleanEnd = await Promise.race([clean.c.exited, sleep(60_000).then(() => undefined)]);
    const cleanOut = fs.readFileSync(clean.log, 'utf8');
    assert.equal(cleanEnd, OK, `clean-node --wait: ${cleanOut.slice(-4000)}`);
    const report1 = cleanReport(cleanOut);
    process.stdout.write(`  clean-node (container): ${JSON.stringify(report1)}\n`);
    assert.equal(report1.livePods, ['shop/gw1']);
    assert.is(report1.executablesRemoved, false, 'a pod created with tether still runs: its DEL needs the executable');
    assert.ok(report1.filtersDetached >= 1 && report1.sysctlsRestored >= 1 && report1.routesDeleted >= 1 && report1.nftTablesDeleted === 1 && report1.pinsRemoved, JSON.stringify(report1));
    assert.not.match(cleanOut, /EPERM|EACCES|EROFS|Operation not permitted|Permission denied|Read-only file system/, 'clean-node had every permission it needed');
    const hold = await startHold();
    await step('step 3 (node cleaned, uninstall pod holding)', false);
    // The old pod goes (tetherd away: its DEL runs the configuration cached with it, tether included, and queues).
    await tb.delPod('n1-gw1');
    await step('step 3, last old pod deleted', false);

    // ---- the old pods gone: that node's uninstall pod deleted, the DaemonSet starts a new one (its init containers again).
    assert.equal(await stop(hold.c), OK, `hold: ${fs.readFileSync(hold.log, 'utf8').slice(-2000)}`);
    const un2 = await box.init(uninstallPod, 'uninstall-cni');
    assert.equal(un2.st, OK, `uninstall-cni again: ${un2.out}`);
    const clean2 = await box.init(uninstallPod, 'clean-node', withFlags(containerOf(uninstallPod, 'clean-node').command, { '--pin-dir': d.pinDir, '--run-dir': '/host/run/tether/lib' }), 60_000);
    assert.equal(clean2.st, OK, `clean-node again: ${clean2.out.slice(-4000)}`);
    const report2 = cleanReport(clean2.out);
    process.stdout.write(`  clean-node again (container): ${JSON.stringify(report2)}\n`);
    assert.equal(report2.livePods, []);
    assert.is(report2.executablesRemoved, true);
    assert.not.match(clean2.out, /EPERM|EACCES|EROFS|Operation not permitted|Permission denied|Read-only file system/);
    const hold2 = await startHold();
    await step('uninstall pod again, holding', false);

    // ---- step 4: kubectl delete -k install/uninstall: hold stops and lifts the tombstone.
    assert.equal(await stop(hold2.c), OK, `hold: ${fs.readFileSync(hold2.log, 'utf8').slice(-2000)}`);
    assert.not.ok(fs.existsSync(path.join(d.installerState, 'uninstall-tombstone')), 'tombstone removed');
    await step('step 4 (uninstall DaemonSet deleted)', false);

    // ---- the node is clean.
    const after = await snapshotNode(tb, NODE);
    assert.equal(filesUnder(path.join(d.tetherdState, 'pods')), [], 'no pod records');
    // /var/lib/tether is the clean-node container's hostPath mount: emptied, not removed (docs/install.md).
    assert.equal(filesUnder(d.tetherdState), [], 'nothing left in tetherd\'s state dir');
    assert.not.ok(fs.existsSync(d.pinDir), 'no pins');
    assert.not.ok(fs.existsSync(runLib), 'tetherd\'s runtime files removed');
    assert.not.ok(fs.existsSync(d.socket), 'no socket');
    assert.equal(after.links, before.links, 'the same interfaces as before');
    assert.equal(after.tc, before.tc, 'no tc filters of ours');
    assert.equal(after.nft, before.nft, 'no nft tables of ours');
    assert.equal(after.routes, before.routes, 'no routes of ours');
    assert.equal(after.rules, before.rules, 'no rules of ours');
    const changed = Object.keys(before.sysctls).filter((k) => after.sysctls[k] !== undefined && after.sysctls[k] !== before.sysctls[k]);
    assert.equal(changed.map((k) => `${k}: ${before.sysctls[k]} → ${after.sysctls[k]}`), [], 'sysctls as before');
    assert.equal(dirBytes(d.netDir), netBefore, 'the CNI directory byte for byte as before install');
    assert.equal(fs.readFileSync(primaryFile), primary);
    assert.equal(ownerMode(), keptOwner, 'the primary\'s owner and mode as its agent left them');
    assert.equal(filesUnder(d.binDir), [], 'no executables left');
    assert.equal(filesUnder(d.installerState), [], 'no installer state left');
    process.stdout.write(`  the node dir (/run/tether of tetherd's container) at the end: ${fs.readdirSync(tb.nodeDir(NODE)).sort().join(' ')}\n`);
  }, { containers: true });
  assert.equal(hostCniState(), hostBefore, 'the host\'s own /etc/cni/net.d and /opt/cni/bin were never touched');
  process.stdout.write(`  the host's CNI dirs, before and after: ${JSON.stringify(hostBefore)}\n`);
});

test.run();
