// tetherd's socket API on a real Unix socket: root-only mode, typed errors for garbage, wrong protocol
// versions and unknown methods (the connection keeps serving), one daemon per socket, clean SIGTERM.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import * as fs from 'node:fs';
import * as net from 'node:net';
import { spawnSync } from 'node:child_process';
import { bin } from '../lib/binaries';
import { removeDaemonDir, startDaemon, type TestDaemon } from '../lib/daemon';

let d: TestDaemon;

test.before(async () => {
  d = await startDaemon();
});
test.after(async () => {
  await d.stop('SIGKILL');
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
