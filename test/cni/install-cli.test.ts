// The built installer, as the DaemonSet runs it: `tether-install install` puts the real executables and the
// chained configuration on a (temporary) node, `ready` and `tetherctl ready` answer what the readiness
// probe needs, `uninstall` leaves the node as it was. tetherctl ready runs against a real tetherd.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { spawn, spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { BIN_DIR, bin } from '../lib/binaries';
import { removeDaemonDir, startDaemon, type TestDaemon } from '../lib/daemon';
import { waitFor } from '../lib/wait';

const installer = path.join(BIN_DIR, 'tether-install');
const BRIDGE = JSON.stringify({ cniVersion: '1.0.0', name: 'podnet', type: 'bridge', bridge: 'cni0', ipam: { type: 'host-local', subnet: '10.88.0.0/16' } }, null, 2);

let root = '';
let d: TestDaemon | undefined;

function run(file: string, args: string[]) {
  return spawnSync(file, args, { encoding: 'utf8', timeout: 60_000 });
}

test.before(() => {
  root = fs.mkdtempSync(path.join(os.tmpdir(), 'tether-install-cli-'));
});

test.after(async () => {
  if (d) {
    await d.stop();
    removeDaemonDir(d);
  }
  fs.rmSync(root, { recursive: true, force: true });
});

test('tether-install --help and a bad command: usage; exit 0 and 2', () => {
  const h = run(installer, ['--help']);
  assert.is(h.status, 0, h.stderr);
  assert.match(h.stdout, /usage: tether-install install\|watch\|uninstall\|.*ready/);
  assert.is(h.stderr, '');
  const bad = run(installer, ['reinstall']);
  assert.is(bad.status, 2);
  assert.match(bad.stderr, /usage: tether-install/);
  assert.match(h.stdout, /--runtime containerd\|crio/);
  const badRuntime = run(installer, ['ready', '--runtime=docker', `--net-dir=${root}`]);
  assert.is(badRuntime.status, 2);
  assert.match(badRuntime.stderr, /--runtime docker: must be one of containerd, crio/);
});

test('a file libcni cannot load before the primary: containerd loads nothing, so install writes nothing and says why; CRI-O skips it', async () => {
  const net = path.join(root, 'broken.d');
  const common = [`--net-dir=${net}`, `--bin-dir=${path.join(root, 'broken-bin')}`, `--state-dir=${path.join(root, 'broken-state')}`, `--src-bin-dir=${BIN_DIR}`];
  fs.mkdirSync(net);
  fs.writeFileSync(path.join(net, '05-no-type.conf'), '{"cniVersion":"1.0.0","name":"no-type"}');
  fs.writeFileSync(path.join(net, '10-bridge.conf'), BRIDGE);
  const why = "failed to load CNI config file 05-no-type.conf: error parsing configuration: missing 'type'";
  const ready = run(installer, ['ready', ...common]);
  assert.is(ready.status, 1);
  assert.is(ready.stderr, `not ready: containerd loads no network: ${why}\n`);
  // install waits for a primary; it logs why at error level and writes nothing until stopped.
  const child = spawn(installer, ['install', '--check-interval=200', ...common], { stdio: ['ignore', 'ignore', 'pipe'] });
  let err = '';
  child.stderr!.on('data', (b) => (err += b));
  await waitFor(() => err.includes('05-no-type.conf'), 'install logs the reason', { timeoutMs: 20_000 });
  child.kill('SIGTERM');
  const code = await new Promise((r) => child.on('exit', r));
  assert.is(code, 1, 'stopped before anything was installed');
  const line = JSON.parse(err.trim().split('\n').find((l) => l.includes('05-no-type.conf'))!) as { level: string; why: string };
  assert.is(line.level, 'error');
  assert.is(line.why, `containerd loads no network: ${why}`);
  assert.equal(fs.readdirSync(net).sort(), ['05-no-type.conf', '10-bridge.conf'], 'nothing written');

  const crio = run(installer, ['install', '--runtime=crio', ...common]);
  assert.is(crio.status, 0, crio.stderr);
  const ok = run(installer, ['ready', '--runtime=crio', ...common]);
  assert.is(ok.status, 0, ok.stderr);
  assert.match(ok.stdout, /^ready: 10-bridge-tether\.conflist chains tether \(crio loads bridge → tether\) \(crio skips 05-no-type\.conf: /);
  assert.is(run(installer, ['ready', ...common]).status, 1, 'containerd would still load nothing');
  assert.is(run(installer, ['uninstall', ...common]).status, 0);
});

test('a primary below CNI 0.3.1: ready says why tether is not chained', () => {
  const net = path.join(root, 'old.d');
  fs.mkdirSync(net);
  fs.writeFileSync(path.join(net, '10-bridge.conf'), '{"cniVersion":"0.2.0","name":"podnet","type":"bridge"}');
  const r = run(installer, ['ready', `--net-dir=${net}`, `--bin-dir=${path.join(root, 'old-bin')}`]);
  assert.is(r.status, 1);
  assert.match(r.stderr, /^not ready: 10-bridge\.conf \(the runtime's choice\) does not chain tether: 10-bridge\.conf has cniVersion "0\.2\.0", older than chained plugins/);
});

test('install, ready, uninstall with the real executables on a temporary node', () => {
  const net = path.join(root, 'net.d');
  const binDir = path.join(root, 'opt-cni-bin');
  const state = path.join(root, 'state');
  fs.mkdirSync(net);
  fs.writeFileSync(path.join(net, '10-bridge.conf'), BRIDGE);
  const common = [`--net-dir=${net}`, `--bin-dir=${binDir}`, `--state-dir=${state}`];
  const notYet = run(installer, ['ready', ...common]);
  assert.is(notYet.status, 1);
  assert.match(notYet.stderr, /10-bridge\.conf \(the runtime's choice\) does not chain tether/);

  const inst = run(installer, ['install', `--src-bin-dir=${BIN_DIR}`, ...common]);
  assert.is(inst.status, 0, inst.stderr);
  const lines = inst.stderr.trim().split('\n').map((l) => JSON.parse(l) as { message: string; file?: string });
  assert.ok(lines.some((l) => l.message === 'wrote the chained CNI configuration' && l.file === path.join(net, '10-bridge-tether.conflist')), inst.stderr);
  // The installed executable is a real file (not a link into the image), tether-ipam a link beside it,
  // and both work as CNI plugins under their names.
  assert.not.ok(fs.lstatSync(path.join(binDir, 'tether')).isSymbolicLink());
  assert.is(fs.readlinkSync(path.join(binDir, 'tether-ipam')), 'tether');
  for (const name of ['tether', 'tether-ipam']) {
    const p = path.join(binDir, name);
    const v = spawnSync(p, [], { env: { CNI_COMMAND: 'VERSION' }, input: '{"cniVersion":"1.0.0"}', encoding: 'utf8' });
    assert.is(v.status, 0, v.stderr);
    assert.ok(JSON.parse(v.stdout).supportedVersions.includes('1.1.0'));
  }
  assert.is(run(installer, ['ready', ...common]).status, 0);
  assert.is(fs.readFileSync(path.join(net, '10-bridge.conf'), 'utf8'), BRIDGE, 'the primary is never rewritten');

  const un = run(installer, ['uninstall', ...common]);
  assert.is(un.status, 0, un.stderr);
  assert.equal(fs.readdirSync(net), ['10-bridge.conf']);
  // uninstall keeps the executables (a DEL of a pod created with tether still runs them); clean-node
  // removes them once no such pod is left.
  assert.equal(fs.readdirSync(binDir), ['tether', 'tether-ipam']);
});

test('tetherctl ready: false while tetherd does not answer or the conflist lacks tether, true with both', async () => {
  const net = path.join(root, 'ready.d');
  fs.mkdirSync(net);
  const sock = path.join(root, 'nobody.sock');
  const down = run(bin('tetherctl'), ['ready', `--socket=${sock}`, `--net-dir=${net}`, '--timeout=2000']);
  assert.is(down.status, 1);
  assert.match(down.stderr, /tetherd does not answer/);

  d = await startDaemon();
  fs.writeFileSync(path.join(net, '10-bridge.conf'), BRIDGE);
  const noEntry = run(bin('tetherctl'), ['ready', `--socket=${d.socket}`, `--net-dir=${net}`]);
  assert.is(noEntry.status, 1);
  assert.match(noEntry.stderr, /does not chain tether/);

  fs.writeFileSync(path.join(net, '10-bridge-tether.conflist'), JSON.stringify({ cniVersion: '1.0.0', name: 'podnet', plugins: [JSON.parse(BRIDGE), { type: 'tether' }] }));
  const ok = run(bin('tetherctl'), ['ready', `--socket=${d.socket}`, `--net-dir=${net}`]);
  assert.is(ok.status, 0, ok.stderr);
  assert.match(ok.stdout, /ready: 10-bridge-tether\.conflist chains tether/);
});

test.run();
