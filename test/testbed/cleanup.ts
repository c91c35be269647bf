// Everything a testbed run leaves on the machine, and how to remove it: run directories that record their
// owner (and the run's redis-server), namespaces and bpffs pins named by the run prefix. Teardown is synchronous so it also works
// from process 'exit' and signal handlers, and sweepStale() clears what crashed runs left behind.
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { killQuiet, pidAlive, pidStartTime, runSync, waitPidGoneSync } from './proc';

export const RUN_ROOT = process.env.TETHER_TESTBED_RUN_DIR ?? '/run/tether-testbed';
export const BPF_ROOT = '/sys/fs/bpf';
const NETNS_DIR = '/run/netns';
/** A run prefix: "tb" and four hex digits. Anything matching is testbed property. */
export const PREFIX_RE = /^tb[0-9a-f]{4}$/;
const NS_RE = /^(tb[0-9a-f]{4})-/;

interface Owner {
  pid: number;
  startTime?: string;
  created: string;
}

export function runDir(prefix: string): string {
  return path.join(RUN_ROOT, prefix);
}

export function bpfDir(prefix: string): string {
  return path.join(BPF_ROOT, prefix);
}

/** Picks an unused prefix and creates its run directory with this process as owner (before anything else exists). */
export function claimPrefix(): string {
  fs.mkdirSync(RUN_ROOT, { recursive: true });
  const taken = new Set(listNetns().map((n) => NS_RE.exec(n)?.[1]));
  for (let attempt = 0; attempt < 100; attempt++) {
    const prefix = `tb${Math.floor(Math.random() * 0x10000).toString(16).padStart(4, '0')}`;
    if (taken.has(prefix) || fs.existsSync(bpfDir(prefix))) continue;
    try {
      fs.mkdirSync(runDir(prefix)); // not recursive: fails if another run holds the prefix
    } catch {
      continue;
    }
    const owner: Owner = { pid: process.pid, startTime: pidStartTime(process.pid), created: new Date().toISOString() };
    fs.writeFileSync(path.join(runDir(prefix), 'owner.json'), JSON.stringify(owner));
    return prefix;
  }
  throw new Error('no free testbed prefix after 100 attempts');
}

/** Names of all network namespaces in /run/netns. */
export function listNetns(): string[] {
  try {
    return fs.readdirSync(NETNS_DIR);
  } catch {
    return [];
  }
}

/** Namespaces, run dir and bpffs dir that belong to prefix (what must be gone after teardown). */
export function leftovers(prefix: string): string[] {
  const out = listNetns()
    .filter((n) => n.startsWith(`${prefix}-`))
    .map((n) => `netns ${n}`);
  if (fs.existsSync(runDir(prefix))) out.push(runDir(prefix));
  if (fs.existsSync(bpfDir(prefix))) out.push(bpfDir(prefix));
  return out;
}

/** Pids of tetherds a run recorded (nodes/<node>/tetherd.pid), still running and still ours. */
function recordedDaemons(prefix: string): number[] {
  const nodesDir = path.join(runDir(prefix), 'nodes');
  const pids: number[] = [];
  let nodes: string[] = [];
  try {
    nodes = fs.readdirSync(nodesDir);
  } catch {
    return pids;
  }
  for (const n of nodes) {
    try {
      const pid = Number(fs.readFileSync(path.join(nodesDir, n, 'tetherd.pid'), 'utf8'));
      // The cmdline carries the run prefix (socket path): a recycled pid belongs to someone else.
      const cmdline = fs.readFileSync(`/proc/${pid}/cmdline`, 'utf8');
      if (pid > 0 && cmdline.includes(prefix) && pidAlive(pid)) pids.push(pid);
    } catch {
      // No pid file or the process is gone.
    }
  }
  return pids;
}

interface RedisRecord {
  pid: number;
  startTime?: string;
  /** The throwaway server's temp dir (socket, log); removed with it. */
  dir: string;
}

/** Records the run's redis-server (call again after each restart: the pid changes). */
export function recordRedis(prefix: string, pid: number, dir: string): void {
  const rec: RedisRecord = { pid, startTime: pidStartTime(pid), dir };
  fs.writeFileSync(path.join(runDir(prefix), 'redis.json'), JSON.stringify(rec));
}

/** Kills the recorded redis-server if it still runs (it lives outside the namespaces) and removes its dir. */
function stopRecordedRedis(prefix: string): void {
  let rec: RedisRecord;
  try {
    rec = JSON.parse(fs.readFileSync(path.join(runDir(prefix), 'redis.json'), 'utf8')) as RedisRecord;
  } catch {
    return; // this run had no Redis, or never got to record it
  }
  if (pidAlive(rec.pid, rec.startTime)) {
    // Throwaway and unpersisted: nothing to flush, so no grace period.
    killQuiet(rec.pid, 'SIGCONT');
    killQuiet(rec.pid, 'SIGKILL');
    waitPidGoneSync(rec.pid, 2000);
  }
  // Only ever a temp dir made by test/lib/redis.ts.
  if (path.dirname(rec.dir) === os.tmpdir() && path.basename(rec.dir).startsWith('tether-redis-')) {
    fs.rmSync(rec.dir, { recursive: true, force: true });
  }
}

/**
 * Removes everything of one run, synchronously and best effort: tetherds get SIGTERM (then SIGKILL),
 * any other process left in the run's namespaces is killed, the run's redis-server is killed, then
 * namespaces, pins and the run dir go.
 * Returns what could not be removed (empty on success).
 */
export function teardownRunSync(prefix: string, graceMs = 3000): string[] {
  if (!PREFIX_RE.test(prefix)) throw new Error(`refusing to tear down "${prefix}": not a testbed prefix`);
  const daemons = recordedDaemons(prefix);
  daemons.forEach((pid) => killQuiet(pid, 'SIGTERM'));
  for (const pid of daemons) {
    if (!waitPidGoneSync(pid, graceMs)) killQuiet(pid, 'SIGKILL');
  }
  stopRecordedRedis(prefix);
  const namespaces = listNetns().filter((n) => n.startsWith(`${prefix}-`));
  // Processes keep a deleted namespace (and its veths and routes) alive: kill whatever is still inside.
  for (const ns of namespaces) {
    const pids = runSync(['ip', 'netns', 'pids', ns]).stdout.split(/\s+/).filter(Boolean).map(Number);
    for (const pid of pids) {
      if (pid !== process.pid) killQuiet(pid, 'SIGKILL');
    }
    for (const pid of pids) waitPidGoneSync(pid, 1000);
  }
  if (namespaces.length > 0) {
    runSync(['ip', '-force', '-batch', '-'], namespaces.map((n) => `netns delete ${n}`).join('\n') + '\n');
  }
  for (const dir of [bpfDir(prefix), runDir(prefix)]) {
    try {
      fs.rmSync(dir, { recursive: true, force: true });
    } catch {
      // Reported through leftovers() below.
    }
  }
  return leftovers(prefix);
}

/**
 * Removes leftovers of earlier runs whose owner process is gone: run dirs with a dead owner, and
 * namespaces or bpffs dirs with a testbed prefix but no run dir at all. Returns the prefixes swept.
 */
export function sweepStale(): string[] {
  const prefixes = new Set<string>();
  let dirs: string[] = [];
  try {
    dirs = fs.readdirSync(RUN_ROOT).filter((d) => PREFIX_RE.test(d));
  } catch {
    // No run root yet: nothing ran here.
  }
  for (const d of dirs) {
    let owner: Owner | undefined;
    try {
      owner = JSON.parse(fs.readFileSync(path.join(runDir(d), 'owner.json'), 'utf8')) as Owner;
    } catch {
      // A run dir without a readable owner is a crash between mkdir and write, or garbage.
    }
    if (!owner || !pidAlive(owner.pid, owner.startTime)) prefixes.add(d);
  }
  // A run dir is created before any namespace or pin, so those without one are orphans.
  const orphan = (p: string): boolean => !fs.existsSync(runDir(p));
  for (const ns of listNetns()) {
    const p = NS_RE.exec(ns)?.[1];
    if (p && orphan(p)) prefixes.add(p);
  }
  try {
    for (const d of fs.readdirSync(BPF_ROOT)) if (PREFIX_RE.test(d) && orphan(d)) prefixes.add(d);
  } catch {
    // bpffs not mounted: no pins to sweep.
  }
  for (const p of prefixes) teardownRunSync(p, 1000);
  return [...prefixes];
}

// Live runs of this process, torn down if the process exits or is interrupted before down().
const live = new Set<string>();
let handlersInstalled = false;

function teardownLive(): void {
  for (const p of live) {
    teardownRunSync(p, 1000);
    live.delete(p);
  }
}

function onSignal(sig: NodeJS.Signals): void {
  teardownLive();
  // Re-raise with the default action so the exit status says which signal ended us.
  process.removeListener('SIGINT', onSignal);
  process.removeListener('SIGTERM', onSignal);
  process.kill(process.pid, sig);
}

export function registerLive(prefix: string): void {
  live.add(prefix);
  if (!handlersInstalled) {
    handlersInstalled = true;
    process.on('exit', teardownLive);
    process.on('SIGINT', onSignal);
    process.on('SIGTERM', onSignal);
  }
}

export function unregisterLive(prefix: string): void {
  live.delete(prefix);
  if (live.size === 0 && handlersInstalled) {
    handlersInstalled = false;
    process.removeListener('exit', teardownLive);
    process.removeListener('SIGINT', onSignal);
    process.removeListener('SIGTERM', onSignal);
  }
}
