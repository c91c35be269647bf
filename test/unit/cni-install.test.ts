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
import { makeLogger } from '../../lib/log';
import { insertEntry, pickPrimary } from '../../install/cni/conflist';
import { loadFile } from '../../install/cni/libcni';
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

test('the primary is the file the runtime would pick: CRI-O passes over what libcni cannot load, containerd stops there', () => {
  const f = (name: string, s: string) => ({ name, bytes: Buffer.from(s) });
  const files = [
    f('30-last.conflist', '{"name":"z","cniVersion":"1.0.0","plugins":[{"type":"ptp"}]}'),
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
  ];
  const crio = pickPrimary(files, 'crio');
  assert.is(crio.primary?.name, '10-bridge.conf');
  assert.equal(crio.skipped.map((s) => s.name), ['00-broken.conf', '01-notype.conf', '02-empty.conflist', '03-list.conf', '04-ours.conflist', '10-bridge-tether.conflist']);
  assert.is(crio.skipped[3].why, "failed to load CNI config file 03-list.conf: error parsing configuration: missing 'type'");
  const containerd = pickPrimary(files, 'containerd');
  assert.is(containerd.primary, undefined, 'containerd loads nothing: the first file fails the directory');
  assert.is(containerd.why, 'containerd loads no network: failed to load CNI config file 00-broken.conf: error parsing configuration: unexpected end of JSON input');
  assert.is(pickPrimary([f('00-broken.conf', '{')], 'crio').primary, undefined);
});

test('fields libcni reads as Go does: "Type" is the type, a numeric cniVersion or string disableCheck fails the file', () => {
  const f = (name: string, s: string) => loadFile({ name, bytes: Buffer.from(s) });
  const typeCap = f('10-a.conf', '{"cniVersion":"0.3.1","Name":"n","Type":"bridge"}');
  assert.ok(typeCap.ok && typeCap.value.plugins[0].type === 'bridge' && typeCap.value.name === 'n');
  assert.ok(f('10-a.conflist', '{"cniVersion":"1.0.0","name":"","plugins":[{"type":"ptp"}]}').ok, '"name": "" loads');
  const num = f('10-a.conflist', '{"cniVersion":0.3,"name":"x","plugins":[{"type":"ptp"}]}');
  assert.is(!num.ok && num.error, 'failed to load CNI config list file 10-a.conflist: error parsing configuration list: invalid cniVersion type float64');
  const dc = f('10-a.conflist', '{"cniVersion":"1.0.0","name":"x","disableCheck":"true","plugins":[{"type":"ptp"}]}');
  assert.is(!dc.ok && dc.error, 'failed to load CNI config list file 10-a.conflist: error parsing configuration list: invalid disableCheck type string');
});

test('a single-plugin primary becomes a list in a file of ours that sorts just before it, holding the original text verbatim', () => {
  const text = '{"cniVersion":"0.3.1","name":"cbr0","type":"flannel","n":123456789012345678}\n';
  const l = loadFile({ name: '10-flannel.conf', bytes: Buffer.from(text) });
  assert.ok(l.ok);
  const ins = insertEntry({ name: '10-flannel.conf', bytes: Buffer.from(text), list: l.value }, { type: 'tether' });
  assert.is(ins.target, '10-flannel-tether.conflist');
  assert.ok(Buffer.compare(Buffer.from(ins.target), Buffer.from('10-flannel.conf')) < 0, 'sorts before the original');
  assert.ok(ins.bytes.includes(text.trim()), 'the original text, byte for byte');
  const chained = loadFile({ name: ins.target, bytes: ins.bytes });
  assert.ok(chained.ok, 'the runtime loads it');
  assert.equal([chained.value.name, chained.value.cniVersion, chained.value.plugins.map((p) => p.type)], ['cbr0', '0.3.1', ['flannel', 'tether']]);
});

for (const c of CASES) {
  test(`${c}: golden result, idempotent, reversible byte for byte`, withDirs(c, (d) => {
    const before = snapshot(d.netDir);
    // CRI-O's rules, under which every fixture has a primary (under containerd's, calico, debian-ptp and
    // flannel-conf load nothing: cni-install-libcni.test.ts checks both against libcni).
    d.runtime = 'crio';
    const out = new Installer(d).reconcile();
    assert.is(out.state, 'installed', JSON.stringify(out));
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
    assert.ok(readiness(d.netDir, d.binDir, 'crio').ready, readiness(d.netDir, d.binDir, 'crio').why);
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
  d.runtime = 'crio'; // the calico fixture's broken files would stop containerd before 10-calico.conflist
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
  d.runtime = 'crio'; // 01-list-in-conf.conf fails containerd's whole directory
  const w = watch(d, 1000);
  try {
    const first = await w.installed;
    assert.is(first.state === 'installed' && first.target, '10-flannel-tether.conflist');
    const ours = path.join(d.netDir, '10-flannel-tether.conflist');
    // Its agent rewrites the .conf: our list follows the new content.
    const conf = JSON.parse(fs.readFileSync(path.join(d.netDir, '10-flannel.conf'), 'utf8'));
    conf.delegate.mtu = 1400;
    fs.writeFileSync(path.join(d.netDir, '10-flannel.conf'), JSON.stringify(conf));
    await waitFor(() => /"mtu":\s*1400/.test(fs.readFileSync(ours, 'utf8')), 'our list follows the rewritten .conf', { timeoutMs: 10_000 });
    // Its agent replaces the .conf by a .conflist (istio/cni#85): tether goes into the new primary, our own
    // list goes away, and the agent's files are left as it made them.
    const list = { name: 'cbr0', cniVersion: '0.3.1', plugins: [{ type: 'flannel', delegate: { isDefaultGateway: true } }, { type: 'portmap', capabilities: { portMappings: true } }] };
    fs.writeFileSync(path.join(d.netDir, '10-flannel.conflist'), JSON.stringify(list));
    fs.rmSync(path.join(d.netDir, '10-flannel.conf'));
    const newPrimary = path.join(d.netDir, '10-flannel.conflist');
    await waitFor(() => /"type":\s*"tether"/.test(fs.readFileSync(newPrimary, 'utf8')) && !fs.existsSync(ours), 'tether chained into the new primary', { timeoutMs: 10_000 });
    assert.equal(JSON.parse(fs.readFileSync(newPrimary, 'utf8')).plugins.map((p: { type: string }) => p.type), ['flannel', 'portmap', 'tether']);
    // Its agent rewrites the list without us (as Cilium does on every restart).
    fs.writeFileSync(newPrimary, JSON.stringify(list));
    await waitFor(() => readiness(d.netDir, d.binDir, 'crio').ready, 'tether chained again', { timeoutMs: 10_000 });
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

test('no primary yet (CRI-O): install waits, then inserts when the primary appears beside a broken file', withDirs(undefined, async (d) => {
  d.runtime = 'crio';
  fs.writeFileSync(path.join(d.netDir, '00-broken.conflist'), '{"name": "x", "plugins": [');
  const w = watch(d, 1000);
  try {
    let done = false;
    void w.installed.then(() => (done = true));
    await new Promise((r) => setTimeout(r, 300));
    assert.not.ok(done, 'nothing to chain into yet');
    assert.not.ok(readiness(d.netDir, undefined, 'crio').ready);
    assert.equal(fs.readdirSync(d.netDir), ['00-broken.conflist'], 'nothing written while waiting');
    fs.copyFileSync(path.join(FIXTURES, 'debian-bridge/in/10-bridge.conf'), path.join(d.netDir, '10-bridge.conf'));
    const out = await w.installed;
    assert.is(out.state === 'installed' && out.target, '10-bridge-tether.conflist');
    assert.ok(readiness(d.netDir, d.binDir, 'crio').ready);
    assert.not.ok(readiness(d.netDir, d.binDir, 'containerd').ready, 'containerd would still stop at the broken file');
  } finally {
    await w.stop();
  }
}));

test('containerd: a broken file before the primary — not ready naming it, nothing written, chained once it is fixed', withDirs('calico', async (d) => {
  const lines: string[] = [];
  const { createLogger, transports } = await import('winston');
  const { Writable } = await import('node:stream');
  d.log = createLogger({ level: 'info', transports: [new transports.Stream({ stream: new Writable({ write(c, _e, cb) { lines.push(String(c)); cb(); } }) })] });
  const before = snapshot(d.netDir);
  const r = readiness(d.netDir, d.binDir, 'containerd');
  assert.not.ok(r.ready);
  assert.is(r.why, "containerd loads no network: failed to load CNI config file 05-no-type.conf: error parsing configuration: missing 'type'");
  const w = watch(d, 500);
  try {
    await waitFor(() => lines.some((l) => l.includes('05-no-type.conf')), 'the reason logged', { timeoutMs: 5000 });
    assert.ok(lines.some((l) => /"level":"error"/.test(l) && l.includes("missing 'type'")), lines.join(''));
    assert.equal(snapshot(d.netDir), before, 'nothing written while containerd loads nothing');
    fs.rmSync(path.join(d.netDir, '05-no-type.conf'));
    await new Promise((res) => setTimeout(res, 700));
    assert.match(readiness(d.netDir, d.binDir, 'containerd').why, /06-empty\.conflist: error parsing configuration list: no plugins in list/);
    fs.rmSync(path.join(d.netDir, '06-empty.conflist'));
    const out = await w.installed;
    assert.is(out.state === 'installed' && out.target, '10-calico.conflist');
    const ready = readiness(d.netDir, d.binDir, 'containerd');
    assert.ok(ready.ready, ready.why);
  } finally {
    await w.stop();
  }
}));

test('a primary below CNI 0.3.1 is refused, visibly: not ready with the reason, logged, nothing written', withDirs(undefined, (d) => {
  for (const [text, re] of [
    ['{"name":"podnet","type":"bridge"}', /10-bridge\.conf has no cniVersion: libcni runs it as CNI 0\.1\.0/],
    ['{"cniVersion":"0.2.0","name":"podnet","type":"bridge"}', /10-bridge\.conf has cniVersion "0\.2\.0", older than chained plugins/],
  ] as const) {
    fs.writeFileSync(path.join(d.netDir, '10-bridge.conf'), text);
    const out = new Installer(d).reconcile();
    assert.ok(out.state === 'waiting' && out.refused, JSON.stringify(out));
    assert.match(out.state === 'waiting' ? out.why : '', re);
    assert.equal(fs.readdirSync(d.netDir), ['10-bridge.conf'], 'nothing written');
    const r = readiness(d.netDir, d.binDir);
    assert.not.ok(r.ready);
    assert.match(r.why, re);
  }
}));

test('a rewritten primary keeps its mode, owner and symbolic link; uninstall gives the bytes back', withDirs(undefined, (d) => {
  const real = path.join(d.root, 'agent');
  fs.mkdirSync(real);
  const text = '{"cniVersion":"1.0.0","name":"podnet","plugins":[{"type":"ptp","mtu":123456789012345678}]}';
  fs.writeFileSync(path.join(real, 'ptp.conflist'), text, { mode: 0o600 });
  fs.chmodSync(path.join(real, 'ptp.conflist'), 0o600);
  fs.chownSync(path.join(real, 'ptp.conflist'), 1000, 1000);
  fs.symlinkSync(path.join(real, 'ptp.conflist'), path.join(d.netDir, '10-ptp.conflist'));
  // And a .conf of the same kind: our list beside it takes its mode and owner (it holds its whole text).
  fs.writeFileSync(path.join(d.netDir, '20-bridge.conf'), '{"cniVersion":"1.0.0","name":"b","type":"bridge"}', { mode: 0o640 });
  fs.chownSync(path.join(d.netDir, '20-bridge.conf'), 1000, 1001);
  const out = new Installer(d).reconcile();
  assert.is(out.state === 'installed' && out.target, '10-ptp.conflist');
  assert.ok(fs.lstatSync(path.join(d.netDir, '10-ptp.conflist')).isSymbolicLink(), 'still a link');
  const st = fs.statSync(path.join(real, 'ptp.conflist'));
  assert.equal([st.mode & 0o777, st.uid, st.gid], [0o600, 1000, 1000]);
  const after = fs.readFileSync(path.join(real, 'ptp.conflist'), 'utf8');
  assert.is(after, text.replace(']}', ', {"type":"tether","socketPath":"/run/tether/tetherd.sock"}]}'));
  assert.equal(fs.readdirSync(real), ['ptp.conflist'], 'no temp file left beside the target');
  assert.ok(readiness(d.netDir, d.binDir).ready);
  new Installer({ ...d, srcBinDir: undefined }).uninstall();
  assert.is(fs.readFileSync(path.join(real, 'ptp.conflist'), 'utf8'), text);
  assert.ok(fs.lstatSync(path.join(d.netDir, '10-ptp.conflist')).isSymbolicLink());
  const st2 = fs.statSync(path.join(real, 'ptp.conflist'));
  assert.equal([st2.mode & 0o777, st2.uid, st2.gid], [0o600, 1000, 1000]);

  fs.rmSync(path.join(d.netDir, '10-ptp.conflist'));
  const out2 = new Installer(d).reconcile();
  assert.is(out2.state === 'installed' && out2.target, '20-bridge-tether.conflist');
  const own = fs.statSync(path.join(d.netDir, '20-bridge-tether.conflist'));
  assert.equal([own.mode & 0o777, own.uid, own.gid], [0o640, 1000, 1001]);
}));

test.run();
