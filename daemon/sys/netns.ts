// Work inside another network namespace from the daemon's own thread.
// setns() moves only the calling thread, and a socket stays in the namespace it was created in, so the
// pattern is: enter, do synchronous work (create sockets, write /proc/sys), return — no await in between.
import * as fs from 'node:fs';
import { CLONE_NEWNET, setns } from './libc';
import { TetherError, ErrorCode } from '../../lib/errors';
import { journalHostSysctl } from './sysctl-journal';

/**
 * The thread's own namespace, opened once (each entry returns to it; opening it through /proc on every entry
 * cost as much as the entry). Only outside any inNetns: a nested entry returns to the one around it.
 */
let ownNs: number | undefined;
let depth = 0;

/** Runs fn synchronously inside the network namespace at nsPath (e.g. /run/netns/x or /proc/PID/ns/net). */
export function inNetns<T>(nsPath: string, fn: () => T): T {
  let target: number;
  try {
    target = fs.openSync(nsPath, 'r');
  } catch (e) {
    throw new TetherError(ErrorCode.NetnsGone, `network namespace ${nsPath} cannot be opened: ${(e as Error).message}`, { cause: e });
  }
  const nested = depth > 0;
  let home: number;
  try {
    home = nested ? fs.openSync('/proc/thread-self/ns/net', 'r') : (ownNs ??= fs.openSync('/proc/thread-self/ns/net', 'r'));
  } catch (e) {
    fs.closeSync(target);
    throw e;
  }
  depth++;
  try {
    setns(target, CLONE_NEWNET, nsPath);
    try {
      const out = fn();
      if (out && typeof (out as { then?: unknown }).then === 'function') {
        throw new Error('inNetns: fn must be synchronous (a promise would run in the wrong namespace)');
      }
      return out;
    } finally {
      try {
        setns(home, CLONE_NEWNET, 'back to own namespace');
      } catch (e) {
        // Staying in a pod's namespace would make every later action wrong: stop hard.
        process.stderr.write(`FATAL: cannot return to own network namespace: ${(e as Error).message}\n`);
        process.abort();
      }
    }
  } finally {
    depth--;
    fs.closeSync(target);
    if (nested) fs.closeSync(home);
  }
}

/** True when nsPath is the network namespace this thread is in (the node's, for tetherd). */
export function isOwnNetns(nsPath: string): boolean {
  try {
    const a = fs.statSync(nsPath);
    const b = fs.statSync('/proc/thread-self/ns/net');
    return a.dev === b.dev && a.ino === b.ino;
  } catch {
    return false;
  }
}

/** True when nsPath exists and is a network namespace handle. */
export function netnsExists(nsPath: string): boolean {
  try {
    fs.closeSync(fs.openSync(nsPath, 'r'));
    return true;
  } catch {
    return false;
  }
}

/**
 * Where net sysctls are written. In the DaemonSet's container /proc/sys is read-only (the OCI default
 * readonlyPaths), so the host's /proc/sys/net is mounted elsewhere (TETHER_PROC_SYS_NET, e.g.
 * /host/proc/sys/net). A net sysctl file resolves against the network namespace of the thread that opens
 * it, not the namespace of the mount, so the same path serves the node and, after setns, a pod.
 */
export function procSysNet(): string {
  return process.env.TETHER_PROC_SYS_NET || '/proc/sys/net';
}

/** The file of a net sysctl key (slash path, starting with net/). */
function sysctlFile(key: string): string {
  if (!key.startsWith('net/')) throw new TetherError(ErrorCode.Internal, `sysctl ${key}: only net/ sysctls are written`);
  return `${procSysNet()}/${key.slice('net/'.length)}`;
}

/** Writes a sysctl (slash path under /proc/sys, e.g. net/ipv4/conf/eth0/arp_ignore, since interface names may hold dots) inside a namespace; returns the previous value. */
export function writeNetSysctl(nsPath: string | null, key: string, value: string): string {
  return writeNetSysctls(nsPath, [[key, value]])[0];
}

/**
 * Writes several sysctls in one namespace, in order, entering it once; returns each previous value. Each
 * write is told to `written` as soon as it is done (synchronously, still inside the namespace: record it,
 * nothing more), so a failure part way, thrown as writeNetSysctl throws it, leaves the caller knowing every
 * value it replaced.
 */
export function writeNetSysctls(
  nsPath: string | null,
  entries: ReadonlyArray<readonly [key: string, value: string]>,
  written: (key: string, value: string, previous: string) => void = () => undefined,
): string[] {
  const work = () =>
    entries.map(([key, value]) => {
      const previous = writeOne(nsPath, key, value);
      written(key, value, previous);
      return previous;
    });
  return nsPath ? inNetns(nsPath, work) : work();
}

function writeOne(nsPath: string | null, key: string, value: string): string {
  const file = sysctlFile(key);
  const prev = fs.readFileSync(file, 'utf8').trim();
  if (prev !== value) {
    // The node's own sysctls outlive tetherd: remember the original first, so an uninstall can restore it.
    if (!nsPath) journalHostSysctl(key, prev, value);
    try {
      fs.writeFileSync(file, value);
    } catch (e) {
      const code = (e as NodeJS.ErrnoException).code;
      const hint = code === 'EROFS' ? ` (read-only: mount the host's /proc/sys/net elsewhere and set TETHER_PROC_SYS_NET to it)` : '';
      throw new TetherError(ErrorCode.Internal, `sysctl ${key}=${value} in ${nsPath ?? 'the node namespace'}: ${(e as Error).message}${hint}`, { cause: e });
    }
  }
  return prev;
}

export function readNetSysctl(nsPath: string | null, key: string): string {
  const file = sysctlFile(key);
  const work = () => fs.readFileSync(file, 'utf8').trim();
  return nsPath ? inNetns(nsPath, work) : work();
}
