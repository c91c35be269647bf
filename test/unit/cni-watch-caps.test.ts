// cni-watch with exactly the capabilities its manifest gives it (read from `kubectl kustomize install`):
// `tether-install watch` runs as uid 0 under setpriv with only those in its bounding set (no others, no
// new privileges), over root-owned directories holding a primary conflist owned by another user with mode
// 0600 (as the testbed's). It chains tether keeping the primary's owner and mode, puts tether back after
// the primary's agent rewrites its file, and reinstalls a deleted executable. Without FOWNER the same run
// cannot write: the capabilities are each needed, not decoration.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { parseAllDocuments } from 'yaml';

const root = path.join(__dirname, '../..');
const PRIMARY_UID = 1000;
const PRIMARY = JSON.stringify({ cniVersion: '1.0.0', name: 'k8s', plugins: [{ type: 'ptp', ipam: { type: 'host-local', subnet: '10.1.0.0/24' } }] });

function cniWatchCaps(): string[] {
  const out = execFileSync('kubectl', ['kustomize', path.join(root, 'install')], { encoding: 'utf8' });
  const ds = parseAllDocuments(out).map((d) => d.toJS()).find((o) => o?.kind === 'DaemonSet' && o.metadata.name === 'tetherd');
  const c = ds.spec.template.spec.containers.find((x: { name: string }) => x.name === 'cni-watch');
  assert.equal(c.securityContext.capabilities.drop, ['ALL']);
  return c.securityContext.capabilities.add as string[];
}

function nodeDirs() {
  const d = fs.mkdtempSync(path.join(os.tmpdir(), 'tether-cni-caps-'));
  const dirs = { root: d, src: path.join(d, 'src'), bin: path.join(d, 'bin'), net: path.join(d, 'net'), state: path.join(d, 'state') };
  for (const x of [dirs.src, dirs.bin, dirs.net, dirs.state]) fs.mkdirSync(x, { mode: 0o755 });
  fs.writeFileSync(path.join(dirs.src, 'tether'), '#!/bin/sh\n', { mode: 0o755 });
  for (const x of ['ptp', 'host-local']) fs.writeFileSync(path.join(dirs.bin, x), x, { mode: 0o755 });
  const primary = path.join(dirs.net, '10-ptp.conflist');
  fs.writeFileSync(primary, PRIMARY);
  fs.chownSync(primary, PRIMARY_UID, PRIMARY_UID);
  fs.chmodSync(primary, 0o600);
  return { ...dirs, primary };
}

/** tether-install watch as uid 0 holding only `caps` (setpriv: bounding set, no inheritable or ambient ones, no_new_privs). */
function runWatch(dirs: ReturnType<typeof nodeDirs>, caps: string[]): { child: ChildProcess; log: () => string } {
  const bounding = ['-all', ...caps.map((c) => `+${c.toLowerCase()}`)].join(',');
  let out = '';
  const child = spawn('setpriv', ['--inh-caps=-all', '--ambient-caps=-all', `--bounding-set=${bounding}`, '--no-new-privs', '--',
    process.execPath, '-r', 'tsx/cjs', path.join(root, 'cmd/node.ts'), 'watch',
    `--src-bin-dir=${dirs.src}`, `--bin-dir=${dirs.bin}`, `--net-dir=${dirs.net}`, `--state-dir=${dirs.state}`, '--check-interval=300'],
  { cwd: root, env: { ...process.env, TETHER_CALLED_AS: 'tether-install' }, stdio: ['ignore', 'pipe', 'pipe'] });
  child.stdout!.on('data', (b) => (out += b));
  child.stderr!.on('data', (b) => (out += b));
  return { child, log: () => out };
}

async function until(what: string, fn: () => boolean, log: () => string, ms = 15_000): Promise<void> {
  const end = Date.now() + ms;
  while (!fn()) {
    if (Date.now() > end) throw new Error(`timed out: ${what}; watch said: ${log().slice(-1500)}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

async function stop(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const gone = new Promise((r) => child.once('exit', r));
  child.kill('SIGTERM');
  await gone;
}

const chained = (file: string) => (JSON.parse(fs.readFileSync(file, 'utf8')).plugins as Array<{ type: string }>).map((p) => p.type);

test('the test runs as root with setpriv (it needs both to drop to the manifest\'s capabilities)', () => {
  assert.is(process.getuid?.(), 0, 'run the unit tests as root');
  assert.ok(execFileSync('setpriv', ['--version'], { encoding: 'utf8' }).includes('setpriv'), 'setpriv (util-linux) is installed');
});

test('cni-watch with its manifest\'s capabilities: chains tether keeping the primary\'s owner and mode, repairs a rewrite and a deleted executable', async () => {
  const caps = cniWatchCaps();
  assert.not.ok(caps.includes('DAC_OVERRIDE'), 'no DAC_OVERRIDE: it cannot write what it does not own');
  const dirs = nodeDirs();
  const w = runWatch(dirs, caps);
  try {
    await until('tether chained', () => chained(dirs.primary).includes('tether'), w.log);
    assert.equal(chained(dirs.primary), ['ptp', 'tether']);
    const st = fs.statSync(dirs.primary);
    assert.equal({ uid: st.uid, gid: st.gid, mode: st.mode & 0o7777 }, { uid: PRIMARY_UID, gid: PRIMARY_UID, mode: 0o600 }, 'owner and mode kept');
    assert.ok(fs.existsSync(path.join(dirs.bin, 'tether')) && fs.lstatSync(path.join(dirs.bin, 'tether-ipam')).isSymbolicLink());
    // Held only these capabilities (CapEff of the watch process).
    const capEff = BigInt(`0x${/CapEff:\s*([0-9a-f]+)/.exec(fs.readFileSync(`/proc/${w.child.pid}/status`, 'utf8'))![1]}`);
    const bits: Record<string, number> = { CHOWN: 0, DAC_OVERRIDE: 1, DAC_READ_SEARCH: 2, FOWNER: 3 };
    assert.is(capEff, caps.reduce((m, c) => m | (1n << BigInt(bits[c])), 0n), 'exactly the manifest\'s capabilities');

    // The primary's agent rewrites its file; something deletes our executable.
    fs.writeFileSync(dirs.primary, PRIMARY);
    fs.rmSync(path.join(dirs.bin, 'tether'));
    await until('repaired', () => chained(dirs.primary).includes('tether') && fs.existsSync(path.join(dirs.bin, 'tether')), w.log);
    const st2 = fs.statSync(dirs.primary);
    assert.equal({ uid: st2.uid, mode: st2.mode & 0o7777 }, { uid: PRIMARY_UID, mode: 0o600 });
    assert.not.match(w.log(), /install check failed/);
  } finally {
    await stop(w.child);
    fs.rmSync(dirs.root, { recursive: true, force: true });
  }
});

test('without FOWNER the same watch cannot write the primary (each capability is needed)', async () => {
  const dirs = nodeDirs();
  const w = runWatch(dirs, cniWatchCaps().filter((c) => c !== 'FOWNER'));
  try {
    await until('the write refused', () => /install check failed.*|EPERM/.test(w.log()), w.log);
    assert.match(w.log(), /10-ptp\.conflist: EPERM/);
    assert.equal(chained(dirs.primary), ['ptp']);
  } finally {
    await stop(w.child);
    fs.rmSync(dirs.root, { recursive: true, force: true });
  }
});

test.run();
