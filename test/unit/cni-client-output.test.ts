// The CNI executables (cmd/cni-plugin.ts, compiled with Bun) answer through Bun.write and never touch
// process.stdout or process.stderr: in Bun those build Node's stream objects, which cost a plugin's start more
// than its whole request (docs/performance.md). The entry runs here under the real Bun runtime (the npm
// package the build compiles with) with both properties trapped, against a fake tetherd on a Unix socket, for
// every way it answers: a result, an error from tetherd, a DEL queued while tetherd is away, --version, run by
// hand, and VERSION as tether-ipam. Each answer must also be whole and where the spec puts it.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { spawn } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { fakeTetherd, reply } from '../lib/fake-tetherd';

const repo = path.resolve(__dirname, '../..');
const BUN = path.join(repo, 'node_modules/.bin/bun');
const ENTRY = path.join(repo, 'cmd/cni-plugin.ts');

// Records every read of process.stdout / process.stderr the entry makes, and reports them at exit.
const TRAP = `
const touched = [];
for (const k of ['stdout', 'stderr']) {
  const d = Object.getOwnPropertyDescriptor(process, k);
  Object.defineProperty(process, k, { configurable: true, enumerable: true, get() { touched.push(k); return d.get ? d.get.call(process) : d.value; } });
}
process.on('exit', () => require('node:fs').writeFileSync(process.env.TRAP_REPORT, JSON.stringify(touched)));
require(process.env.TRAP_ENTRY);
`;

interface Ran {
  status: number | null;
  stdout: string;
  stderr: string;
  touched: string[];
}

let dir = '';

/** Runs the entry under Bun, as `name`, without blocking this process (the fake tetherd answers from here). */
function runEntry(name: 'tether' | 'tether-ipam', env: Record<string, string>, input: string, args: string[] = []): Promise<Ran> {
  const report = path.join(dir, `report-${Math.random().toString(36).slice(2)}.json`);
  const wrapper = path.join(dir, 'trap.js');
  if (!fs.existsSync(wrapper)) fs.writeFileSync(wrapper, TRAP);
  return new Promise((resolve, reject) => {
    const p = spawn(BUN, ['run', wrapper, ...args], {
      env: { PATH: process.env.PATH ?? '/usr/bin:/bin', TETHER_CALLED_AS: name, TRAP_REPORT: report, TRAP_ENTRY: ENTRY, ...env },
    });
    let stdout = '';
    let stderr = '';
    p.stdout.on('data', (b: Buffer) => (stdout += b));
    p.stderr.on('data', (b: Buffer) => (stderr += b));
    p.stdin.on('error', () => undefined);
    p.stdin.end(input);
    const timer = setTimeout(() => p.kill('SIGKILL'), 30_000);
    p.on('error', reject);
    p.on('close', (status) => {
      clearTimeout(timer);
      const touched = fs.existsSync(report) ? (JSON.parse(fs.readFileSync(report, 'utf8')) as string[]) : ['(no report: the entry did not exit normally)'];
      resolve({ status, stdout, stderr, touched });
    });
  });
}

const cniEnv = (command: string, netns = '/run/netns/none'): Record<string, string> => ({
  CNI_COMMAND: command,
  CNI_CONTAINERID: 'ctr-output-test',
  CNI_NETNS: netns,
  CNI_IFNAME: 'eth0',
  CNI_ARGS: 'IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=web',
  CNI_PATH: '/opt/cni/bin',
});

test.before(() => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tether-cni-output-'));
});
test.after(() => {
  fs.rmSync(dir, { recursive: true, force: true });
});

test('ADD: the result on stdout, whole (a large one too), exit 0; process.stdout and process.stderr untouched', async () => {
  const sock = path.join(dir, 'add.sock');
  // Larger than a pipe's buffer (64 KiB): the write must go on until all of it is out.
  const routes = Array.from({ length: 3000 }, (_, i) => ({ dst: `10.${i >> 8}.${i & 255}.0/24` }));
  const result = { cniVersion: '1.0.0', ips: [{ address: '10.244.0.5/24' }], routes };
  // Answers cni.add with the result, anything else with {}.
  const close = await fakeTetherd(sock, (c, line) => reply(c, line, { result: JSON.parse(line).method === 'cni.add' ? result : {} }));
  try {
    const conf = { cniVersion: '1.0.0', name: 'net', type: 'tether', socketPath: sock, prevResult: { cniVersion: '1.0.0', ips: [] } };
    const r = await runEntry('tether', cniEnv('ADD'), JSON.stringify(conf));
    assert.is(r.status, 0, r.stderr);
    assert.ok(r.stdout.length > 65536, `the answer is large (${r.stdout.length} bytes)`);
    assert.equal(JSON.parse(r.stdout), result);
    assert.is(r.stderr, '');
    assert.equal(r.touched, []);
  } finally {
    await close();
  }
});

test('an error from tetherd: the CNI error object on stdout, exit 1; process streams untouched', async () => {
  const sock = path.join(dir, 'err.sock');
  const close = await fakeTetherd(sock, (c, line) => reply(c, line, { error: { code: 'NETNS_GONE', message: 'network namespace /run/netns/none does not exist' } }));
  try {
    const conf = { cniVersion: '1.0.0', name: 'net', type: 'tether', socketPath: sock, prevResult: { cniVersion: '1.0.0' } };
    const r = await runEntry('tether', cniEnv('ADD'), JSON.stringify(conf));
    assert.is(r.status, 1);
    const e = JSON.parse(r.stdout);
    assert.is(e.cniVersion, '1.0.0');
    assert.type(e.code, 'number');
    assert.match(e.msg, /does not exist/);
    assert.equal(r.touched, []);
  } finally {
    await close();
  }
});

test('a bad config: the CNI error (code 7) on stdout, exit 1, nothing sent; process streams untouched', async () => {
  const r = await runEntry('tether', cniEnv('ADD'), JSON.stringify({ cniVersion: '1.0.0', name: 'net', type: 'tether' }));
  assert.is(r.status, 1);
  assert.is(JSON.parse(r.stdout).code, 7);
  assert.match(JSON.parse(r.stdout).msg, /prevResult: missing/);
  assert.equal(r.touched, []);
});

test('DEL with tetherd away: queued, the line on stderr, exit 0; process streams untouched', async () => {
  const queue = path.join(dir, 'queue');
  const conf = { cniVersion: '1.0.0', name: 'net', type: 'tether', socketPath: path.join(dir, 'nobody.sock'), deleteQueueDir: queue };
  const r = await runEntry('tether', cniEnv('DEL'), JSON.stringify(conf));
  assert.is(r.status, 0, r.stdout);
  assert.is(r.stdout, '');
  assert.match(r.stderr, /DEL of container ctr-output-test eth0 \(pod ns\/web\) queued in /);
  assert.is(fs.readdirSync(queue).length, 1);
  assert.equal(r.touched, []);
});

test('--version, run by hand, and VERSION as tether-ipam: each where it belongs; process streams untouched', async () => {
  const v = await runEntry('tether', {}, '', ['--version']);
  assert.is(v.status, 0);
  assert.match(v.stdout, /CNI tether plugin .* v\d/);
  assert.equal(v.touched, []);
  const byHand = await runEntry('tether-ipam', {}, '');
  assert.is(byHand.status, 0);
  assert.is(byHand.stdout, '');
  assert.match(byHand.stderr, /CNI tether-ipam plugin/);
  assert.equal(byHand.touched, []);
  const version = await runEntry('tether-ipam', { CNI_COMMAND: 'VERSION' }, '{"cniVersion":"0.4.0"}');
  assert.is(version.status, 0);
  assert.equal(JSON.parse(version.stdout), { cniVersion: '0.4.0', supportedVersions: ['0.3.1', '0.4.0', '1.0.0', '1.1.0'] });
  assert.equal(version.touched, []);
});

test.run();
