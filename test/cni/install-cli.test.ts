// The built installer, as the DaemonSet runs it: `tether-install install` puts the real executables and the
// chained configuration on a (temporary) node, `ready` and `tetherctl ready` answer what the readiness
// probe needs, `uninstall` leaves the node as it was. tetherctl ready runs against a real tetherd.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { BIN_DIR, bin } from '../lib/binaries';
import { removeDaemonDir, startDaemon, type TestDaemon } from '../lib/daemon';

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
  assert.match(h.stdout, /usage: tether-install install\|watch\|uninstall\|ready\|sleep/);
  assert.is(h.stderr, '');
  const bad = run(installer, ['reinstall']);
  assert.is(bad.status, 2);
  assert.match(bad.stderr, /usage: tether-install/);
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
  assert.equal(fs.readdirSync(binDir), []);
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
