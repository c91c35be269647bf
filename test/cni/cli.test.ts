// The command line of each name of the built executable: --help and --version answer on stdout with exit 0;
// tether and tether-ipam run by hand (no CNI_COMMAND) print what they are and the CNI versions they support
// on stderr, exit 0, as the reference plugins do; tetherd starts and stops without any runtime warning.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { spawn, spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { bin } from '../lib/binaries';
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

test('tetherctl with an unknown option still fails with exit 2 and the usage', () => {
  const r = run('tetherctl', ['--frobnicate']);
  assert.is(r.status, 2);
  assert.match(r.stderr, /Unknown option '--frobnicate'/);
  assert.match(r.stderr, /usage: tetherctl/);
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
