// The command line of each name of the built executable: --help and --version answer on stdout with exit 0;
// tether and tether-ipam run by hand (no CNI_COMMAND) print what they are and the CNI versions they support
// on stderr, exit 0, as the reference plugins do; tetherd starts and stops without any runtime warning;
// tetherctl checks its whole command line before it sends anything to tetherd.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { spawn, spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { bin } from '../lib/binaries';
import { fakeTetherd, reply } from '../lib/fake-tetherd';
import { version } from '../../package.json';

type Name = 'tether' | 'tether-ipam' | 'tetherd' | 'tetherctl';
const NAMES: Name[] = ['tether', 'tether-ipam', 'tetherd', 'tetherctl'];
const CNI_VERSIONS = /CNI protocol versions supported: 0\.3\.1, 0\.4\.0, 1\.0\.0, 1\.1\.0/;

function run(name: Name, args: string[], env: Record<string, string> = {}) {
  return spawnSync(bin(name), args, { env: { PATH: process.env.PATH ?? '/usr/bin:/bin', ...env }, encoding: 'utf8', timeout: 20_000, input: '' });
}

for (const name of NAMES) {
  test(`${name} --version: its name and version on stdout, exit 0`, () => {
    const r = run(name, ['--version']);
    assert.is(r.status, 0, r.stderr);
    assert.match(r.stdout, new RegExp(`${name.replace('-', '\\-')}[^\\n]* v${version.replace(/\./g, '\\.')}`));
    if (name === 'tether' || name === 'tether-ipam') assert.match(r.stdout, CNI_VERSIONS);
    assert.is(r.stderr, '');
  });

  test(`${name} --help: usage on stdout, exit 0`, () => {
    const r = run(name, ['--help']);
    assert.is(r.status, 0, r.stderr);
    assert.match(r.stdout, /usage: /);
    assert.is(r.stderr, '');
  });
}

for (const name of ['tether', 'tether-ipam'] as const) {
  test(`${name} run by hand (no CNI_COMMAND): what it is and the spec versions on stderr, exit 0`, () => {
    for (const env of [{}, { CNI_COMMAND: '' }] as Array<Record<string, string>>) {
      const r = run(name, [], env);
      assert.is(r.status, 0, r.stdout);
      assert.is(r.stdout, '', 'nothing on stdout (a runtime reads results there)');
      assert.match(r.stderr, new RegExp(`CNI ${name} plugin[^\\n]* v${version.replace(/\./g, '\\.')}`));
      assert.match(r.stderr, CNI_VERSIONS);
    }
  });
}

test('tether and tether-ipam read no .env from the directory they are run in', () => {
  // Bun-compiled executables load .env (and bunfig.toml) from the working directory by default; a runtime
  // runs plugins wherever it is, so a stray .env there must not become the request's environment.
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tether-cwd-'));
  try {
    fs.writeFileSync(path.join(dir, '.env'), 'CNI_COMMAND=VERSION\n');
    for (const name of ['tether', 'tether-ipam'] as const) {
      const r = spawnSync(bin(name), [], { cwd: dir, env: { PATH: process.env.PATH ?? '/usr/bin:/bin' }, encoding: 'utf8', timeout: 20_000, input: '' });
      assert.is(r.status, 0, r.stdout);
      assert.is(r.stdout, '', `${name}: nothing on stdout (it answered VERSION from the directory's .env)`);
      assert.match(r.stderr, new RegExp(`CNI ${name} plugin`));
    }
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test('tetherctl with an unknown option still fails with exit 2 and the usage', () => {
  const r = run('tetherctl', ['--frobnicate']);
  assert.is(r.status, 2);
  assert.match(r.stderr, /Unknown option '--frobnicate'/);
  assert.match(r.stderr, /usage: tetherctl/);
});

/** Runs tetherctl without blocking (a fake tetherd in this process must be able to answer). */
function ctl(args: string[]): Promise<{ status: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    const p = spawn(bin('tetherctl'), args, { env: { PATH: process.env.PATH ?? '/usr/bin:/bin' } });
    let stdout = '';
    let stderr = '';
    p.stdout.on('data', (b: Buffer) => (stdout += b));
    p.stderr.on('data', (b: Buffer) => (stderr += b));
    const timer = setTimeout(() => p.kill('SIGKILL'), 20_000);
    p.on('close', (status) => {
      clearTimeout(timer);
      resolve({ status, stdout, stderr });
    });
  });
}

test('tetherctl: a missing or malformed flag is a usage error naming it (exit 2); nothing reaches tetherd', async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tether-ctl-'));
  const sock = path.join(dir, 'fake.sock');
  // A fake tetherd that records every request and answers it: whatever reaches it is counted.
  const requests: Array<{ method: string; params: Record<string, unknown> }> = [];
  const close = await fakeTetherd(sock, (s, line) => {
    const req = JSON.parse(line);
    requests.push({ method: req.method, params: req.params });
    reply(s, line, { result: { ok: true } });
  });
  const allocate = ['address', 'allocate', '--pool', 'floating', '--owner', 'egress/shop/web-out#0'];
  const cases: Array<[string[], RegExp]> = [
    [['address', 'allocate'], /address allocate needs --pool/],
    [['address', 'allocate', '--owner', 'egress/shop/web-out#0'], /address allocate needs --pool/],
    [['address', 'allocate', '--pool', 'floating'], /address allocate needs --owner/],
    [['address', 'release', '--owner', 'o'], /address release needs --pool/],
    [['address', 'release', '--pool', 'floating'], /address release needs --owner/],
    [['address', 'allocate', '--pool', 'Floating_1', '--owner', 'o'], /--pool "Floating_1": not a pool name/],
    [['address', 'allocate', '--pool', 'floating', '--owner', ' x'], /--owner " x": must be 1-253 characters/],
    [[...allocate, '--count', 'two'], /--count "two": must be a whole number/],
    [[...allocate, '--count', '0'], /--count "0": must be a whole number/],
    [[...allocate, '--family', '5'], /--family "5": must be 4 or 6/],
    [[...allocate, '--address', 'nope'], /--address "nope": not an IP address/],
    [[...allocate, '--address', '10.250.0.9', '--count', '2'], /--count and --address are alternatives/],
    [[...allocate, '--address', '10.250.0.9', '--family', '4'], /--family goes with --count/],
    [['address', 'release', '--pool', 'floating', '--owner', 'o', '--count', '2'], /address release takes no --count/],
    [['address'], /address needs a subcommand: allocate or release/],
    [['address', 'free'], /address "free": not a subcommand/],
    [['stats'], /"stats" is not a command/],
    [['status', '--pool', 'floating'], /status takes no --pool/],
    [['ping', 'now'], /ping: unexpected argument "now"/],
    [['ready', '--runtime', 'docker'], /--runtime "docker": must be one of containerd, crio/],
    [['--timeout', 'soon', 'ping'], /--timeout "soon": must be a number of milliseconds/],
    [['--timeout', '99999999999', 'status'], /--timeout "99999999999": must be a number of milliseconds/],
  ];
  try {
    for (const socket of [sock, path.join(dir, 'no-such-dir', 'tetherd.sock')]) {
      for (const [args, message] of cases) {
        const r = await ctl(['--socket', socket, ...args]);
        const what = args.join(' ');
        assert.is(r.status, 2, `${what}: ${r.stderr}`);
        assert.match(r.stderr, message, what);
        assert.match(r.stderr, /^tetherctl: [^\n]*\nusage: tetherctl/, `${what}: one line, then the usage`);
        const first = r.stderr.split('\n')[0];
        assert.not.match(first, /tetherd|sock|reachable|ENOENT/, `${what}: about the flag, not the socket: ${first}`);
        assert.is(r.stdout, '');
      }
    }
    assert.equal(requests, [], 'nothing was sent to tetherd');
    // Well-formed command lines still go through, with the params typed as tetherd expects them.
    for (const args of [[...allocate, '--count', '2', '--family', '6'], [...allocate, '--address', '10.250.0.9', '--address', 'fd00:10:250::9'], ['address', 'release', '--pool', 'floating', '--owner', 'egress/shop/web-out#0']]) {
      const r = await ctl(['--socket', sock, ...args]);
      assert.is(r.status, 0, r.stderr);
    }
    assert.equal(requests, [
      { method: 'address.allocate', params: { pool: 'floating', owner: 'egress/shop/web-out#0', count: 2, family: 6 } },
      { method: 'address.allocate', params: { pool: 'floating', owner: 'egress/shop/web-out#0', addresses: ['10.250.0.9', 'fd00:10:250::9'] } },
      { method: 'address.release', params: { pool: 'floating', owner: 'egress/shop/web-out#0' } },
    ]);
  } finally {
    await close();
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test('tetherd starts and stops without a runtime warning on stderr', async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tether-cli-'));
  try {
    const p = spawn(bin('tetherd'), ['--node-name', 'cli', '--socket', path.join(dir, 'd.sock'), '--state-dir', path.join(dir, 'state'), '--bpf-pin-dir', path.join('/sys/fs/bpf', path.basename(dir))], {
      env: { PATH: process.env.PATH ?? '/usr/bin:/bin', TETHER_RUNTIME_DIR: path.join(dir, 'run') },
    });
    let err = '';
    p.stderr.on('data', (b: Buffer) => (err += b.toString()));
    const exited = new Promise<number | null>((r) => p.once('exit', (c) => r(c)));
    const end = Date.now() + 15_000;
    while (!err.includes('"tetherd started"') && p.exitCode === null && Date.now() < end) await new Promise((r) => setTimeout(r, 50));
    assert.match(err, /"tetherd started"/);
    p.kill('SIGTERM');
    assert.is(await exited, 0);
    const nonJson = err.split('\n').filter((l) => l.trim() && !l.startsWith('{'));
    assert.equal(nonJson, [], `lines on stderr that are not log lines: ${nonJson.join(' | ')}`);
    assert.not.match(err, /Warning|require\(\)/);
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
    fs.rmSync(path.join('/sys/fs/bpf', path.basename(dir)), { recursive: true, force: true });
  }
});

test.run();
