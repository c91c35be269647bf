// tetherd's socket API on a real Unix socket: root-only mode, typed errors for garbage, wrong protocol
// versions and unknown methods (the connection keeps serving), one daemon per socket, clean SIGTERM. A
// client that is not root gets a permission error naming the socket, from every client build.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import * as fs from 'node:fs';
import * as net from 'node:net';
import * as path from 'node:path';
import { spawnSync } from 'node:child_process';
import { bin } from '../lib/binaries';
import { removeDaemonDir, startDaemon, type TestDaemon } from '../lib/daemon';

let d: TestDaemon;

test.before(async () => {
  d = await startDaemon();
});
test.after(async () => {
  await d?.stop('SIGKILL');
  removeDaemonDir(d);
});

/** Sends raw lines on one connection and collects one answer per line. */
function exchange(lines: string[]): Promise<any[]> {
  return new Promise((resolve, reject) => {
    const s = net.createConnection({ path: d.socket });
    let buf = '';
    const answers: any[] = [];
    s.on('connect', () => s.write(lines.join('')));
    s.on('data', (c) => {
      buf += c.toString();
      let nl;
      while ((nl = buf.indexOf('\n')) >= 0) {
        answers.push(JSON.parse(buf.slice(0, nl)));
        buf = buf.slice(nl + 1);
      }
      if (answers.length === lines.length) {
        s.destroy();
        resolve(answers);
      }
    });
    s.on('error', reject);
    setTimeout(() => reject(new Error(`only ${answers.length} answers`)), 5000).unref();
  });
}

test('socket is root-only (mode 0600)', () => {
  assert.is(fs.statSync(d.socket).mode & 0o777, 0o600);
});

/** Runs a built executable as nobody (uid/gid 65534, no groups), as a non-root runtime or user would. */
function asNobody(argv: string[], env: Record<string, string> = {}, input = '') {
  const r = spawnSync('setpriv', ['--reuid', '65534', '--regid', '65534', '--clear-groups', ...argv], {
    input,
    encoding: 'utf8',
    timeout: 20_000,
    env: { PATH: process.env.PATH ?? '/usr/bin:/bin', ...env },
  });
  let json: Record<string, any> | undefined;
  try {
    json = JSON.parse(r.stdout);
  } catch {
    json = undefined;
  }
  return { status: r.status, stdout: r.stdout, stderr: r.stderr, json };
}

test('a client not allowed on the socket (not root): a permission error naming the socket and its mode, not 11 (try again)', () => {
  const queue = path.join(d.dir, 'queue');
  const conf = (type: string) =>
    JSON.stringify(type === 'tether'
      ? { cniVersion: '1.0.0', name: 'net1', type: 'tether', socketPath: d.socket, deleteQueueDir: queue, prevResult: { cniVersion: '1.0.0', interfaces: [], ips: [] } }
      : { cniVersion: '1.0.0', name: 'net1', type: 'ptp', ipam: { type: 'tether-ipam', pool: 'default', socketPath: d.socket, deleteQueueDir: queue } });
  const cniEnv = (command: string) => ({ CNI_COMMAND: command, CNI_CONTAINERID: 'perm1', CNI_IFNAME: 'eth0', CNI_NETNS: '/run/netns/perm1', CNI_PATH: '/opt/cni/bin' });
  const message = new RegExp(`permission denied connecting to tetherd's socket ${d.socket.replace(/[.]/g, '\\.')} \\(EACCES\\): the socket is root-only \\(mode 0600`);
  const mode = fs.statSync(d.dir).mode & 0o777;
  try {
    // Two ways in: the socket's own mode (its directory searchable by all), and a root-only directory.
    for (const dirMode of [0o711, 0o700]) {
      fs.chmodSync(d.dir, dirMode);
      const runs = [
        ['tether (Bun) ADD', [bin('tether')], cniEnv('ADD'), conf('tether')],
        ['tether (Bun) DEL', [bin('tether')], cniEnv('DEL'), conf('tether')],
        ['tether-ipam (Bun) ADD', [bin('tether-ipam')], cniEnv('ADD'), conf('ipam')],
        ['tether (Node build) ADD', [bin('tetherd')], { ...cniEnv('ADD'), TETHER_CALLED_AS: 'tether' }, conf('tether')],
      ] as const;
      for (const [what, argv, env, stdin] of runs) {
        const r = asNobody([...argv], env, stdin);
        assert.is(r.status, 1, `${what} (dir ${dirMode.toString(8)}): ${r.stdout} ${r.stderr}`);
        assert.is(r.json?.code, 5, `${what}: CNI code 5 (I/O failure, not 11 "try again later"): ${r.stdout}`);
        assert.match(String(r.json?.msg), message, what);
      }
      assert.not.ok(fs.existsSync(queue), 'a DEL refused the socket is not queued: tetherd may well be up');
      const ping = asNobody([bin('tetherctl'), '--socket', d.socket, 'ping']);
      assert.is(ping.status, 1, ping.stderr);
      assert.match(ping.stderr, /^tetherctl: \[PERMISSION_DENIED\] /);
      assert.match(ping.stderr, message);
      const ready = asNobody([bin('tetherctl'), '--socket', d.socket, 'ready']);
      assert.is(ready.status, 1, ready.stderr);
      assert.match(ready.stderr, /^not ready: permission denied connecting to tetherd's socket /);
    }
  } finally {
    fs.chmodSync(d.dir, mode);
  }
  // Root still gets in.
  assert.is(spawnSync(bin('tetherctl'), ['--socket', d.socket, 'ping']).status, 0);
});

test('garbage, wrong version and unknown method get typed errors; the connection keeps serving', async () => {
  const a = await exchange([
    'this is not json\n',
    JSON.stringify({ version: 99, id: 'v', method: 'ping', params: {} }) + '\n',
    JSON.stringify({ version: 1, id: 'm', method: 'frobnicate', params: {} }) + '\n',
    JSON.stringify({ version: 1, id: 'p', method: 'ping', params: {} }) + '\n',
  ]);
  assert.is(a[0].error.code, 'BAD_REQUEST');
  assert.match(a[0].error.message, /not valid JSON/);
  assert.is(a[1].error.code, 'PROTOCOL_VERSION');
  assert.match(a[1].error.message, /99/);
  assert.is(a[2].error.code, 'BAD_REQUEST');
  assert.match(a[2].error.message, /frobnicate/);
  assert.is(a[3].id, 'p');
  assert.equal(a[3].result, { pong: true, node: 'test-node' });
});

test('cni.add with params that are not an object is refused', async () => {
  const [a] = await exchange([JSON.stringify({ version: 1, id: 'x', method: 'cni.add', params: 'nope' }) + '\n']);
  assert.is(a.error.code, 'BAD_REQUEST');
});

test('a second tetherd on the same socket refuses to start', () => {
  const r = spawnSync(bin('tetherd'), ['--socket', d.socket, '--state-dir', `${d.dir}/state2`], { encoding: 'utf8', timeout: 10_000 });
  assert.is(r.status, 1);
  assert.match(r.stderr, /another tetherd is already serving/, r.stderr);
});

test('SIGTERM: clean exit 0 and the socket is removed; a stale socket after kill -9 is replaced', async () => {
  const code = await d.stop('SIGTERM');
  assert.is(code, 0);
  assert.not.ok(fs.existsSync(d.socket));
  d = await d.restart();
  await d.stop('SIGKILL');
  assert.ok(fs.existsSync(d.socket), 'kill -9 leaves the socket file');
  d = await d.restart();
  const [a] = await exchange([JSON.stringify({ version: 1, id: 'p', method: 'ping', params: {} }) + '\n']);
  assert.is(a.result.pong, true);
});

test.run();
