// tetherd's start failures, one row each: a clear message naming what is wrong and a non-zero exit, at
// once, never a process that logs the error and stays up (its Redis connections used to keep it alive).
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { spawn } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { bin } from '../lib/binaries';
import { startDaemon, removeDaemonDir } from '../lib/daemon';
import { startRedis, type TestRedis } from '../lib/redis';

let dir: string;
let redis: TestRedis;

const EGRESS_CONFIG = `
apiVersion: tether.dev/v1alpha1
kind: AddressPool
metadata: { name: float }
spec: { usage: floating, ipv4: { cidr: 198.18.0.200/29 } }
---
apiVersion: tether.dev/v1alpha1
kind: Egress
metadata: { name: out, namespace: shop }
spec:
  clients: { podSelector: { matchLabels: { app: web } } }
  gateways: { podSelector: { matchLabels: { role: egress-gw } } }
  addresses: { pool: float, count: 1 }
`;

test.before(async () => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tetherd-start-'));
  fs.writeFileSync(path.join(dir, 'egress.yaml'), EGRESS_CONFIG);
  fs.writeFileSync(path.join(dir, 'key'), 'ab'.repeat(32));
  fs.writeFileSync(path.join(dir, 'short-key'), 'ab'.repeat(8));
  fs.writeFileSync(path.join(dir, 'bad.yaml'), 'apiVersion: tether.dev/v1alpha1\nkind: AddressPool\nmetadata: { name: p }\nspec: { usage: pod, ipv4: { cidr: 10.0.0.1/8 } }\n');
  fs.writeFileSync(path.join(dir, 'a-file'), '');
  redis = await startRedis();
});
test.after(async () => {
  await redis?.stop();
  fs.rmSync(dir, { recursive: true, force: true });
});

/** Runs tetherd with `args` (own socket and state dir unless given) and waits for it to exit, or kills it after `hangMs`. */
function runTetherd(args: string[], hangMs = 8000): Promise<{ code: number | null; out: string; ms: number; hung: boolean }> {
  const n = Math.random().toString(16).slice(2, 8);
  const base = ['--node-name', 'start-test', '--socket', path.join(dir, `s-${n}.sock`), '--state-dir', path.join(dir, `state-${n}`), '--bpf-pin-dir', `/sys/fs/bpf/tetherd-start-${n}`];
  const override = (flag: string) => args.includes(flag);
  const merged = [...base.filter((_, i, a) => !(override(a[i]) || (i > 0 && override(a[i - 1])))), ...args];
  return new Promise((resolve) => {
    const t0 = Date.now();
    const p = spawn(bin('tetherd'), merged, { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, TETHER_RUNTIME_DIR: path.join(dir, 'rt') } });
    let out = '';
    p.stdout.on('data', (b: Buffer) => (out += b));
    p.stderr.on('data', (b: Buffer) => (out += b));
    let hung = false;
    const timer = setTimeout(() => {
      hung = true;
      p.kill('SIGKILL');
    }, hangMs);
    p.on('exit', (code) => {
      clearTimeout(timer);
      fs.rmSync(`/sys/fs/bpf/tetherd-start-${n}`, { recursive: true, force: true });
      resolve({ code, out, ms: Date.now() - t0, hung });
    });
  });
}

const egress = (extra: string[]) => ['--config', path.join(dir, 'egress.yaml'), '--redis', `unix://${redis.socketPath}`, '--cluster-key-file', path.join(dir, 'key'), ...extra];

test('every start failure: a message naming what is wrong and a non-zero exit, without hanging', async () => {
  const other = await startDaemon();
  try {
    const rows: Array<[string, string[], number, RegExp]> = [
      ['unknown option', ['--no-such-flag'], 2, /Unknown option '--no-such-flag'/],
      ['config file missing', ['--config', path.join(dir, 'missing.yaml')], 2, /config rejected.*missing\.yaml/],
      ['config invalid', ['--config', path.join(dir, 'bad.yaml')], 2, /config rejected.*10\.0\.0\.1\/8/],
      ['config empty (a truncated write)', ['--config', path.join(dir, 'a-file')], 2, /config rejected: .*a-file holds no objects .*To have no objects on purpose, write `apiVersion: v1` \/ `kind: List` \/ `items: \[\]`/],
      ['redis URL', ['--redis', 'http://localhost:6379'], 2, /--redis rejected/],
      ['fou port', ['--fou-port', 'abc'], 2, /--fou-port: \\?"abc\\?" is not a port number/],
      ['sync port', ['--sync-port', '70000'], 2, /--sync-port: \\?"70000\\?" is not a port number/],
      ['state dir under a file', ['--state-dir', path.join(dir, 'a-file', 'state')], 1, /--state-dir .*a-file\/state: (ENOTDIR|EEXIST)/],
      ['socket served by another tetherd', ['--socket', other.socket], 1, /another tetherd is already serving/],
      ['egress without the store', ['--config', path.join(dir, 'egress.yaml'), '--node-address', '127.0.0.1', '--cluster-key-file', path.join(dir, 'key')], 2, /Egress objects need the cluster store/],
      ['egress without a node address', egress([]), 2, /Egress objects need --node-address/],
      ['egress, node address not on this node', egress(['--node-address', '198.51.100.77']), 2, /--node-address: 198\.51\.100\.77 is not an address of any local interface/],
      ['egress, node address not an IP', egress(['--node-address', 'node-1']), 2, /--node-address: \\?"node-1\\?" is not an IP address/],
      ['egress, cluster key too short', egress(['--node-address', '127.0.0.1', '--cluster-key-file', path.join(dir, 'short-key')]), 2, /cluster key: 8 bytes; at least 32/],
      ['egress, cluster key unreadable', egress(['--node-address', '127.0.0.1', '--cluster-key-file', path.join(dir, 'nope')]), 2, /--cluster-key-file: cannot read .*nope: ENOENT/],
      ['egress, BFD port taken', egress(['--node-address', '127.0.0.1']), 1, /egress controller failed to start: bfd: cannot bind 127\.0\.0\.1 port 3784/],
    ];
    // The last row needs the BFD port busy: hold it the way another tetherd on this address would.
    const dgram = await import('node:dgram');
    const holder = dgram.createSocket('udp4');
    await new Promise<void>((r) => holder.bind({ address: '127.0.0.1', port: 3784, exclusive: true }, () => r()));
    const times: string[] = [];
    try {
      for (const [name, args, code, message] of rows) {
        const r = await runTetherd(args);
        assert.not.ok(r.hung, `${name}: tetherd did not exit (killed after 8 s); output:\n${r.out.slice(-600)}`);
        assert.is(r.code, code, `${name}: exit code ${r.code}; output:\n${r.out.slice(-600)}`);
        assert.match(r.out, message, `${name}: message; output:\n${r.out.slice(-600)}`);
        assert.not.match(r.out, /\n\s+at .*\(|write after end/, `${name}: no stack trace; output:\n${r.out.slice(-600)}`);
        times.push(`${name} ${r.ms} ms`);
      }
    } finally {
      holder.close();
    }
    process.stdout.write(`  start failures, time to exit: ${times.join('; ')}\n`);
  } finally {
    await other.stop('SIGKILL');
    removeDaemonDir(other);
  }
});

test('with Egress configured, tetherd starts while the cluster store is down, and stops cleanly', async () => {
  const d = await startDaemon({ extraArgs: ['--config', path.join(dir, 'egress.yaml'), '--redis', `unix://${path.join(dir, 'no-redis.sock')}`, '--cluster-key-file', path.join(dir, 'key'), '--node-address', '127.0.0.1'] });
  try {
    assert.match(d.log(), /ownership store unreachable at start; going on and reconnecting/);
    const code = await d.stop('SIGTERM');
    assert.is(code, 0, `exit code; log:\n${d.log().slice(-800)}`);
    assert.not.match(d.log(), /write after end|\n\s+at /);
  } finally {
    removeDaemonDir(d);
  }
});

test('a clean stop exits 0 and says so', async () => {
  const d = await startDaemon();
  try {
    const code = await d.stop('SIGTERM');
    assert.is(code, 0);
    assert.match(d.log(), /"message":"tetherd stopped"/);
    assert.not.match(d.log(), /write after end|\n\s+at /);
  } finally {
    removeDaemonDir(d);
  }
});

test.run();
