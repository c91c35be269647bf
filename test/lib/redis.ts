// Starts a real, throwaway redis-server for a test: Unix socket only, no persistence, in a fresh temp dir
// that stop() removes. restart() and kill() let tests exercise an outage of the cluster store.
import { spawn, type ChildProcess } from 'node:child_process';
import * as fs from 'node:fs';
import * as net from 'node:net';
import * as os from 'node:os';
import * as path from 'node:path';

export interface TestRedis {
  /** unix:///…/redis.sock — what RedisStore.connect takes. */
  url: string;
  socketPath: string;
  dir: string;
  /** Pid of the current redis-server (changes on restart); for SIGSTOP-style fault injection. */
  readonly pid: number | undefined;
  /** Stops Redis and removes the temp dir. Idempotent; never throws. */
  stop(): Promise<void>;
  /** Stops Redis if it runs, then starts it again on the same socket (empty: nothing is persisted). */
  restart(): Promise<void>;
  /** SIGKILL, the way a crash looks to clients; the temp dir stays so restart() works. */
  kill(): Promise<void>;
  /** SIGSTOP: the server hangs (connections open, nothing answered) until resume(). No-op when not running. */
  pause(): void;
  /** SIGCONT after pause(). */
  resume(): void;
}

const REDIS_SERVER = process.env.REDIS_SERVER ?? 'redis-server';
const READY_TIMEOUT_MS = 5000;

/** `args`: more redis-server options (e.g. ['--maxmemory-policy', 'noeviction']), kept across restart(). */
export async function startRedis(opts: { args?: string[] } = {}): Promise<TestRedis> {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tether-redis-'));
  const socketPath = path.join(dir, 'redis.sock');
  let proc: ChildProcess | undefined;

  const exitOf = (p: ChildProcess) =>
    p.exitCode !== null || p.signalCode !== null ? Promise.resolve() : new Promise<void>((r) => p.once('exit', () => r()));

  const launch = async () => {
    fs.rmSync(socketPath, { force: true });
    const args = ['--port', '0', '--unixsocket', socketPath, '--unixsocketperm', '700', '--save', '', '--appendonly', 'no', '--dir', dir, ...(opts.args ?? [])];
    const out = fs.openSync(path.join(dir, 'redis.log'), 'a');
    const p = spawn(REDIS_SERVER, args, { stdio: ['ignore', out, out] });
    fs.closeSync(out);
    proc = p;
    const spawnError = new Promise<never>((_, reject) => p.once('error', reject));
    spawnError.catch(() => undefined);
    const deadline = Date.now() + READY_TIMEOUT_MS;
    while (!(await Promise.race([ping(socketPath), spawnError]))) {
      if (p.exitCode !== null) throw new Error(`redis-server exited with ${p.exitCode}: ${readLog(dir)}`);
      if (Date.now() > deadline) throw new Error(`redis-server did not answer PING within ${READY_TIMEOUT_MS} ms: ${readLog(dir)}`);
      await sleep(20);
    }
  };

  const halt = async (signal: NodeJS.Signals) => {
    const p = proc;
    proc = undefined;
    if (!p || p.exitCode !== null || p.signalCode !== null) return;
    const exited = exitOf(p);
    p.kill('SIGCONT'); // a test may have SIGSTOPped it; a stopped process ignores SIGTERM
    p.kill(signal);
    const timer = setTimeout(() => p.kill('SIGKILL'), 3000);
    await exited;
    clearTimeout(timer);
  };

  // If the test process exits without stop() (a crash in a test), do not leave Redis or the dir behind.
  const onExit = () => {
    proc?.kill('SIGKILL');
    fs.rmSync(dir, { recursive: true, force: true });
  };
  process.once('exit', onExit);

  try {
    await launch();
  } catch (e) {
    await halt('SIGKILL');
    process.removeListener('exit', onExit);
    fs.rmSync(dir, { recursive: true, force: true });
    throw e;
  }

  return {
    url: `unix://${socketPath}`,
    socketPath,
    dir,
    get pid() {
      return proc?.pid;
    },
    async stop() {
      await halt('SIGTERM').catch(() => undefined);
      process.removeListener('exit', onExit);
      fs.rmSync(dir, { recursive: true, force: true });
    },
    async restart() {
      await halt('SIGTERM');
      await launch();
    },
    async kill() {
      await halt('SIGKILL');
    },
    pause() {
      proc?.kill('SIGSTOP');
    },
    resume() {
      proc?.kill('SIGCONT');
    },
  };
}

/** Runs `fn` with a fresh Redis that is stopped afterwards, also when `fn` throws. */
export async function withRedis<T>(fn: (r: TestRedis) => Promise<T>): Promise<T> {
  const r = await startRedis();
  try {
    return await fn(r);
  } finally {
    await r.stop();
  }
}

/** True when the socket answers PING with PONG. */
function ping(socketPath: string): Promise<boolean> {
  return new Promise((resolve) => {
    const s = net.createConnection(socketPath);
    let buf = '';
    const done = (ok: boolean) => {
      s.destroy();
      resolve(ok);
    };
    s.setTimeout(500, () => done(false));
    s.on('error', () => done(false));
    s.on('connect', () => s.write('PING\r\n'));
    s.on('data', (d) => {
      buf += d.toString();
      if (buf.includes('\r\n')) done(buf.startsWith('+PONG'));
    });
  });
}

function readLog(dir: string): string {
  try {
    return fs.readFileSync(path.join(dir, 'redis.log'), 'utf8').trim().split('\n').slice(-5).join(' | ');
  } catch {
    return '(no log)';
  }
}

function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}
