// Process helpers for the testbed: run a command (async or sync), enter a namespace with nsenter, and
// check whether a pid is still alive. Teardown must work from process 'exit' handlers, hence the sync forms.
import { spawn, spawnSync } from 'node:child_process';
import * as fs from 'node:fs';

export interface RunResult {
  code: number | null;
  signal: NodeJS.Signals | null;
  stdout: string;
  stderr: string;
  /** Wall time from spawn to exit, in milliseconds. */
  ms: number;
}

export interface RunOptions {
  input?: string;
  env?: NodeJS.ProcessEnv;
  timeoutMs?: number;
}

/** Runs argv to completion; never rejects on a non-zero exit (the caller decides what failure means). */
export function run(argv: readonly string[], opts: RunOptions = {}): Promise<RunResult> {
  return new Promise((resolve, reject) => {
    const t0 = process.hrtime.bigint();
    const child = spawn(argv[0], argv.slice(1), { env: opts.env ?? process.env, stdio: ['pipe', 'pipe', 'pipe'] });
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    child.stdout.on('data', (b: Buffer) => out.push(b));
    child.stderr.on('data', (b: Buffer) => err.push(b));
    // A plugin that exits before reading stdin makes the write fail with EPIPE; its exit status tells the story.
    child.stdin.on('error', () => undefined);
    child.stdin.end(opts.input ?? '');
    const timer = opts.timeoutMs ? setTimeout(() => child.kill('SIGKILL'), opts.timeoutMs) : undefined;
    child.on('error', (e) => {
      if (timer) clearTimeout(timer);
      reject(e);
    });
    child.on('close', (code, signal) => {
      if (timer) clearTimeout(timer);
      const ms = Number(process.hrtime.bigint() - t0) / 1e6;
      resolve({ code, signal, stdout: Buffer.concat(out).toString(), stderr: Buffer.concat(err).toString(), ms });
    });
  });
}

/** Like run(), but rejects with stderr in the message when the command does not exit 0. */
export async function mustRun(argv: readonly string[], opts: RunOptions = {}): Promise<RunResult> {
  const r = await run(argv, opts);
  if (r.code !== 0) {
    throw new Error(`${argv.join(' ')} exited ${r.code ?? r.signal}: ${r.stderr.trim() || r.stdout.trim()}`);
  }
  return r;
}

/** Synchronous run for teardown paths; returns the exit status and output. */
export function runSync(argv: readonly string[], input?: string): { code: number | null; stdout: string; stderr: string } {
  const r = spawnSync(argv[0], argv.slice(1), { input: input ?? '', encoding: 'utf8', timeout: 20_000 });
  return { code: r.status, stdout: r.stdout ?? '', stderr: r.stderr ?? (r.error ? String(r.error) : '') };
}

/** argv prefix that runs a command in the network namespace at nsPath without remounting /sys. */
export function nsenterArgv(nsPath: string, argv: readonly string[]): string[] {
  return ['nsenter', `--net=${nsPath}`, '--', ...argv];
}

/** Blocks the thread (usable inside 'exit' handlers, where timers never fire). */
export function sleepSync(ms: number): void {
  Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, ms);
}

export const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

/** Kernel start time of pid (clock ticks since boot), or undefined when the pid is gone. */
export function pidStartTime(pid: number): string | undefined {
  try {
    const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
    // Field 2 (comm) may contain spaces and parentheses: split after its closing parenthesis.
    const rest = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    if (rest[0] === 'Z' || rest[0] === 'X') return undefined; // a zombie no longer runs anything
    return rest[19]; // field 22 overall: starttime
  } catch {
    return undefined;
  }
}

/** True when pid runs and, if given, still has the same start time (guards against pid reuse). */
export function pidAlive(pid: number, startTime?: string): boolean {
  const st = pidStartTime(pid);
  return st !== undefined && (startTime === undefined || st === startTime);
}

/** Waits (synchronously) up to ms for pid to stop running. */
export function waitPidGoneSync(pid: number, ms: number): boolean {
  const deadline = Date.now() + ms;
  while (Date.now() < deadline) {
    if (!pidAlive(pid)) return true;
    sleepSync(20);
  }
  return !pidAlive(pid);
}

export function killQuiet(pid: number, signal: NodeJS.Signals): void {
  try {
    process.kill(pid, signal);
  } catch {
    // Already gone: nothing to do.
  }
}

/** Something that runs and ends: a child process or a container (its `exited` resolves with how it ended). */
export interface Stoppable<T> {
  running: boolean;
  exited: Promise<T | undefined>;
  kill(signal: NodeJS.Signals): void;
}

/**
 * Sends `signal`, and SIGKILL if it has not ended within `timeoutMs`; resolves with how it ended (at once when
 * it is not running).
 */
export async function signalThenKill<T>(p: Stoppable<T>, signal: NodeJS.Signals, timeoutMs: number, none: T): Promise<T> {
  if (!p.running) return (await p.exited) ?? none;
  p.kill(signal);
  const st = await Promise.race([p.exited, sleep(timeoutMs).then(() => undefined)]);
  if (st) return st;
  p.kill('SIGKILL');
  return (await p.exited) ?? none;
}

/** A testbed process that runs either in a container (`box`) or as a child process. */
export function stopBoxOrChild<T>(
  o: { box?: Stoppable<T>; child?: { kill(signal: NodeJS.Signals): unknown }; running: boolean; exited?: Promise<T | undefined> },
  signal: NodeJS.Signals,
  timeoutMs: number,
  none: T,
): Promise<T> {
  const box = o.box;
  if (box) return signalThenKill({ running: box.running, exited: box.exited, kill: (s) => box.kill(s) }, signal, timeoutMs, none);
  const child = o.child;
  return signalThenKill({ running: o.running && !!child, exited: o.exited ?? Promise.resolve(undefined), kill: (s) => child?.kill(s) }, signal, timeoutMs, none);
}
