// Starts a real tetherd for a test (own socket, state dir and pin dir under a unique temp dir),
// optionally inside a network namespace via nsenter, and stops it even when the test failed.
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { bin } from './binaries';

export interface TestDaemon {
  dir: string;
  socket: string;
  stateDir: string;
  logFile: string;
  proc: ChildProcess;
  /** Stops with SIGTERM (or the given signal) and waits for the exit. */
  stop(signal?: NodeJS.Signals): Promise<number | null>;
  /** Starts again with the same socket, state dir and pin dir. */
  restart(): Promise<TestDaemon>;
  log(): string;
}

export async function startDaemon(opts: { netns?: string; dir?: string; node?: string; extraArgs?: string[] } = {}): Promise<TestDaemon> {
  const dir = opts.dir ?? fs.mkdtempSync(path.join(os.tmpdir(), 'tetherd-test-'));
  fs.mkdirSync(dir, { recursive: true, mode: 0o700 });
  const socket = path.join(dir, 'tetherd.sock');
  const stateDir = path.join(dir, 'state');
  const logFile = path.join(dir, 'tetherd.log');
  const pinDir = `/sys/fs/bpf/${path.basename(dir)}`;
  const args = ['--node-name', opts.node ?? 'test-node', '--socket', socket, '--state-dir', stateDir, '--bpf-pin-dir', pinDir, '--log-level', 'debug', ...(opts.extraArgs ?? [])];
  const out = fs.openSync(logFile, 'a');
  const proc = opts.netns
    ? spawn('nsenter', [`--net=${opts.netns}`, bin('tetherd'), ...args], { stdio: ['ignore', out, out], env: { ...process.env, TETHER_RUNTIME_DIR: path.join(dir, 'rt') } })
    : spawn(bin('tetherd'), args, { stdio: ['ignore', out, out], env: { ...process.env, TETHER_RUNTIME_DIR: path.join(dir, 'rt') } });
  fs.closeSync(out);
  const exited = new Promise<number | null>((resolve) => proc.once('exit', (code) => resolve(code)));
  const deadline = Date.now() + 10_000;
  while (!fs.existsSync(socket) || spawnSync(bin('tetherctl'), ['--socket', socket, 'ping'], { stdio: 'ignore' }).status !== 0) {
    if (proc.exitCode !== null || Date.now() > deadline) {
      proc.kill('SIGKILL');
      throw new Error(`tetherd did not become ready; log:\n${fs.readFileSync(logFile, 'utf8')}`);
    }
    await new Promise((r) => setTimeout(r, 30));
  }
  const d: TestDaemon = {
    dir,
    socket,
    stateDir,
    logFile,
    proc,
    async stop(signal: NodeJS.Signals = 'SIGTERM') {
      if (proc.exitCode === null && proc.signalCode === null) proc.kill(signal);
      return exited;
    },
    restart: () => startDaemon({ ...opts, dir }),
    log: () => fs.readFileSync(logFile, 'utf8'),
  };
  return d;
}

export function removeDaemonDir(d: TestDaemon | undefined): void {
  if (!d) return;
  fs.rmSync(d.dir, { recursive: true, force: true });
}
