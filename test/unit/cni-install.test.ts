// The CNI installer on temporary directories holding real-shaped configurations (Debian's bridge and ptp,
// Calico, Cilium and Flannel as their agents write them, as .conf and .conflist, beside files a runtime
// skips): golden results, idempotence (no byte and no mtime changes), byte-for-byte uninstall, atomicity
// under a reader looping on the directory, and the watch repairing what others change.
// Golden files: test/fixtures/cni-install/<case>/{in,out}; UPDATE_GOLDEN=1 rewrites out/ (review the diff).
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { spawn } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { makeLogger } from '../../daemon/log';
import { insertEntry, parseConf, pickPrimary } from '../../install/cni/conflist';
import { Installer, readiness, type InstallerOptions } from '../../install/cni/installer';
import { watch } from '../../install/cni/main';
import { waitFor } from '../lib/wait';

const FIXTURES = path.resolve(__dirname, '../fixtures/cni-install');
const CASES = fs.readdirSync(FIXTURES).sort();
const quiet = makeLogger({ level: 'error' });

interface Dirs extends InstallerOptions {
  root: string;
}

function dirs(fixture?: string): Dirs {
  const root = fs.mkdtempSync(path.join(os.tmpdir(), 'tether-cni-install-'));
  const netDir = path.join(root, 'net.d');
  const binDir = path.join(root, 'bin');
  const srcBinDir = path.join(root, 'src');
  fs.mkdirSync(netDir);
  fs.mkdirSync(binDir);
  fs.mkdirSync(srcBinDir);
  // Stand-ins for the executables: what matters is that their bytes arrive whole and executable.
  fs.writeFileSync(path.join(srcBinDir, 'tether'), `#!/bin/sh\n# tether ${'x'.repeat(200_000)}\n`, { mode: 0o755 });
  fs.symlinkSync('tether', path.join(srcBinDir, 'tether-ipam'));
  // Another project's executable must survive everything we do.
  fs.writeFileSync(path.join(binDir, 'bridge'), 'bridge', { mode: 0o755 });
  if (fixture) for (const f of fs.readdirSync(path.join(FIXTURES, fixture, 'in'))) fs.copyFileSync(path.join(FIXTURES, fixture, 'in', f), path.join(netDir, f));
  return { root, netDir, binDir, srcBinDir, stateDir: path.join(root, 'state'), log: quiet };
}

/** Name → bytes of a directory, temp files included (none may be left). */
function snapshot(dir: string): Record<string, string> {
  const out: Record<string, string> = {};
  for (const f of fs.readdirSync(dir).sort()) out[f] = fs.readFileSync(path.join(dir, f), 'utf8');
  return out;
}

function mtimes(dir: string): Record<string, number> {
  const out: Record<string, number> = {};
  for (const f of fs.readdirSync(dir).sort()) out[f] = fs.statSync(path.join(dir, f)).mtimeMs;
  return out;
}

function withDirs(fixture: string | undefined, body: (d: Dirs) => Promise<void> | void) {
  return async () => {
    const d = dirs(fixture);
    try {
      await body(d);
    } finally {
      fs.rmSync(d.root, { recursive: true, force: true });
    }
  };
}

test('the primary is the file the runtime would pick: sorted, unparsable, typeless, empty and list-in-.conf files skipped', () => {
  const f = (name: string, s: string) => ({ name, bytes: Buffer.from(s) });
  const r = pickPrimary([
    f('30-last.conflist', '{"name":"z","plugins":[{"type":"ptp"}]}'),
    f('00-broken.conf', '{"name":'),
    f('01-notype.conf', '{"name":"n"}'),
    f('02-empty.conflist', '{"name":"e","plugins":[]}'),
    f('03-list.conf', '{"name":"l","plugins":[{"type":"bridge"}]}'),
    f('04-ours.conflist', '{"name":"t","plugins":[{"type":"tether"}]}'),
    f('.tether-abc.tmp', '{"name":"x","type":"bridge"}'),
    f('05-readme.txt', '{"name":"x","type":"bridge"}'),
    f('10-bridge-tether.conflist', '{"name":"b","plugins":[{"type":"bridge"},{"type":"tether"}]}'),
    f('10-bridge.conf', '{"name":"b","type":"bridge"}'),
    f('20-ptp.conflist', '{"name":"p","plugins":[{"type":"ptp"}]}'),
  ]);
  assert.is(r.primary?.name, '10-bridge.conf');
  assert.equal(r.skipped.map((s) => s.name), ['00-broken.conf', '01-notype.conf', '02-empty.conflist', '03-list.conf', '04-ours.conflist']);
  assert.match(r.skipped[3].why, /list in a single-plugin file/);
  assert.is(pickPrimary([f('00-broken.conf', '{')]).primary, undefined);
});

test('a single-plugin primary becomes a list in a file of ours that sorts just before it and keeps the network name', () => {
  const primary = { name: '10-flannel.conf', bytes: Buffer.from(''), parsed: parseConf('10-flannel.conf', Buffer.from('{"cniVersion":"0.3.1","name":"cbr0","type":"flannel"}')) as never };
  const ins = insertEntry(primary, { type: 'tether' });
  assert.is(ins.target, '10-flannel-tether.conflist');
  assert.ok(Buffer.compare(Buffer.from(ins.target), Buffer.from('10-flannel.conf')) < 0, 'sorts before the original');
  assert.equal(JSON.parse(ins.bytes.toString()), { cniVersion: '0.3.1', name: 'cbr0', plugins: [{ cniVersion: '0.3.1', name: 'cbr0', type: 'flannel' }, { type: 'tether' }] });
  assert.ok(parseConf(ins.target, ins.bytes).ok, 'the runtime loads it');
});

for (const c of CASES) {
  test(`${c}: golden result, idempotent, reversible byte for byte`, withDirs(c, (d) => {
    const before = snapshot(d.netDir);
    const out = new Installer(d).reconcile();
    assert.is(out.state, 'installed');
    const after = snapshot(d.netDir);
    const goldenDir = path.join(FIXTURES, c, 'out');
    if (process.env.UPDATE_GOLDEN) {
      fs.rmSync(goldenDir, { recursive: true, force: true });
      fs.mkdirSync(goldenDir);
      for (const [n, s] of Object.entries(after)) fs.writeFileSync(path.join(goldenDir, n), s);
    }
    assert.equal(after, snapshot(goldenDir), 'the directory equals the golden result');
    for (const [n, s] of Object.entries(before)) {
      if (!(n in after)) assert.unreachable(`${n} was renamed or deleted`);
      if (out.state === 'installed' && n !== out.target) assert.is(after[n], s, `${n} is not ours to change`);
    }
    assert.ok(readiness(d.netDir, d.binDir).ready, readiness(d.netDir, d.binDir).why);
    assert.is(fs.readFileSync(path.join(d.binDir, 'tether'), 'utf8'), fs.readFileSync(path.join(d.srcBinDir!, 'tether'), 'utf8'));
    assert.is(fs.statSync(path.join(d.binDir, 'tether')).mode & 0o777, 0o755);
    assert.is(fs.readlinkSync(path.join(d.binDir, 'tether-ipam')), 'tether', 'tether-ipam is tether under its own name');

    // A second run (the next init container, or the watch's next check) changes no byte and no mtime.
    const [m1, b1] = [mtimes(d.netDir), mtimes(d.binDir)];
    const again = new Installer(d).reconcile();
    assert.is(again.state === 'installed' && again.wrote, false);
    assert.equal(snapshot(d.netDir), after);
    assert.equal(mtimes(d.netDir), m1, 'no configuration rewritten');
    assert.equal(mtimes(d.binDir), b1, 'no executable rewritten');

    new Installer({ ...d, srcBinDir: undefined }).uninstall();
    const restored = snapshot(d.netDir);
    if (c === 'flannel-upgrade') {
      // An entry of an earlier installation whose state is lost: uninstall takes it out too.
      assert.not.match(restored['10-flannel.conflist'], /tether/);
      assert.equal(JSON.parse(restored['10-flannel.conflist']).plugins.map((p: { type: string }) => p.type), ['flannel', 'portmap']);
    } else {
      assert.equal(restored, before, 'uninstall restores the directory byte for byte');
    }
    assert.equal(fs.readdirSync(d.binDir), ['bridge'], 'only our executables are removed');
    assert.not.ok(fs.existsSync(path.join(d.stateDir, 'state.json')));
  }));
}

test('a reader looping on the directory during installs and uninstalls never sees an unparsable file', withDirs('calico', async (d) => {
  // Runtimes parse every .conf/.conflist/.json: this one does so as fast as it can, in another process.
  const reader = spawn(process.execPath, ['-e', `
    const fs = require('fs'), path = require('path'); const dir = process.argv[1];
    let reads = 0, bad = [];
    const end = Date.now() + 60000;
    process.stdin.on('data', () => { process.stdout.write(JSON.stringify({ reads, bad })); process.exit(0); });
    (function loop() {
      for (let i = 0; i < 50; i++) {
        for (const f of fs.readdirSync(dir)) {
          if (!/\\.(conf|conflist|json)$/.test(f) || f === '05-no-type.conf' || f === '06-empty.conflist') continue;
          let s; try { s = fs.readFileSync(path.join(dir, f), 'utf8'); } catch { continue; }
          reads++;
          try { const j = JSON.parse(s); if (!j.plugins || !j.plugins.length) bad.push(f + ': no plugins'); } catch (e) { bad.push(f + ': ' + e.message); }
        }
      }
      if (Date.now() < end) setImmediate(loop);
    })();`, d.netDir], { stdio: ['pipe', 'pipe', 'inherit'] });
  try {
    for (let i = 0; i < 40; i++) {
      new Installer(d).reconcile();
      // The primary's agent rewrites its file (as calico-node does at start; atomically, as it should),
      // then we insert again.
      fs.writeFileSync(path.join(d.root, 'agent.tmp'), fs.readFileSync(path.join(FIXTURES, 'calico/in/10-calico.conflist')));
      fs.renameSync(path.join(d.root, 'agent.tmp'), path.join(d.netDir, '10-calico.conflist'));
      new Installer(d).reconcile();
      new Installer({ ...d, srcBinDir: undefined }).uninstall();
    }
  } finally {
    let out = '';
    reader.stdout!.on('data', (b) => (out += b));
    const done = new Promise((r) => reader.on('exit', r));
    reader.stdin!.write('x');
    await done;
    const r = JSON.parse(out) as { reads: number; bad: string[] };
    assert.ok(r.reads > 100, `the reader read ${r.reads} times`);
    assert.equal(r.bad, [], 'torn reads (file: reason)');
  }
}));

test('watch: a primary rewritten by its agent gets tether back; a renamed primary moves tether with it; a deleted executable is reinstalled', withDirs('flannel-conf', async (d) => {
  const w = watch(d, 1000);
  try {
    const first = await w.installed;
    assert.is(first.state === 'installed' && first.target, '10-flannel-tether.conflist');
    const ours = path.join(d.netDir, '10-flannel-tether.conflist');
    // Its agent rewrites the .conf: our list follows the new content.
    const conf = JSON.parse(fs.readFileSync(path.join(d.netDir, '10-flannel.conf'), 'utf8'));
    conf.delegate.mtu = 1400;
    fs.writeFileSync(path.join(d.netDir, '10-flannel.conf'), JSON.stringify(conf));
    await waitFor(() => fs.readFileSync(ours, 'utf8').includes('"mtu": 1400'), 'our list follows the rewritten .conf', { timeoutMs: 10_000 });
    // Its agent replaces the .conf by a .conflist (istio/cni#85): tether goes into the new primary, our own
    // list goes away, and the agent's files are left as it made them.
    const list = { name: 'cbr0', cniVersion: '0.3.1', plugins: [{ type: 'flannel', delegate: { isDefaultGateway: true } }, { type: 'portmap', capabilities: { portMappings: true } }] };
    fs.writeFileSync(path.join(d.netDir, '10-flannel.conflist'), JSON.stringify(list));
    fs.rmSync(path.join(d.netDir, '10-flannel.conf'));
    const newPrimary = path.join(d.netDir, '10-flannel.conflist');
    await waitFor(() => /"type": "tether"/.test(fs.readFileSync(newPrimary, 'utf8')) && !fs.existsSync(ours), 'tether chained into the new primary', { timeoutMs: 10_000 });
    assert.equal(JSON.parse(fs.readFileSync(newPrimary, 'utf8')).plugins.map((p: { type: string }) => p.type), ['flannel', 'portmap', 'tether']);
    // Its agent rewrites the list without us (as Cilium does on every restart).
    fs.writeFileSync(newPrimary, JSON.stringify(list));
    await waitFor(() => readiness(d.netDir, d.binDir).ready, 'tether chained again', { timeoutMs: 10_000 });
    // Someone deletes our executables.
    fs.rmSync(path.join(d.binDir, 'tether'));
    fs.rmSync(path.join(d.binDir, 'tether-ipam'));
    await waitFor(() => fs.existsSync(path.join(d.binDir, 'tether')) && fs.existsSync(path.join(d.binDir, 'tether-ipam')), 'the executables reinstalled', { timeoutMs: 10_000 });
    assert.is(fs.readFileSync(path.join(d.binDir, 'tether'), 'utf8'), fs.readFileSync(path.join(d.srcBinDir!, 'tether'), 'utf8'));
    assert.equal(fs.readdirSync(d.netDir).filter((n) => n.endsWith('.tmp')), [], 'no temp file left');
  } finally {
    await w.stop();
  }
  // Uninstall after all that: the agent's last list comes back exactly as the agent wrote it.
  new Installer({ ...d, srcBinDir: undefined }).uninstall();
  assert.is(fs.readFileSync(path.join(d.netDir, '10-flannel.conflist'), 'utf8'), JSON.stringify({ name: 'cbr0', cniVersion: '0.3.1', plugins: [{ type: 'flannel', delegate: { isDefaultGateway: true } }, { type: 'portmap', capabilities: { portMappings: true } }] }));
}));

test('no primary yet: install waits, then inserts when the primary appears', withDirs(undefined, async (d) => {
  fs.writeFileSync(path.join(d.netDir, '00-broken.conflist'), '{"name": "x", "plugins": [');
  const w = watch(d, 1000);
  try {
    let done = false;
    void w.installed.then(() => (done = true));
    await new Promise((r) => setTimeout(r, 300));
    assert.not.ok(done, 'nothing to chain into yet');
    assert.not.ok(readiness(d.netDir).ready);
    assert.equal(fs.readdirSync(d.netDir), ['00-broken.conflist'], 'nothing written while waiting');
    fs.copyFileSync(path.join(FIXTURES, 'debian-bridge/in/10-bridge.conf'), path.join(d.netDir, '10-bridge.conf'));
    const out = await w.installed;
    assert.is(out.state === 'installed' && out.target, '10-bridge-tether.conflist');
    assert.ok(readiness(d.netDir, d.binDir).ready);
  } finally {
    await w.stop();
  }
}));

test.run();
