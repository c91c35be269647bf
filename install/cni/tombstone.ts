// The uninstall tombstone: a file in the installer's state directory (a hostPath, so every container of the
// node sees it) that says "tether is being taken off this node". While it is live, `install` and `watch`
// leave the CNI configuration alone and `ready` answers not ready.
//
// Live means refreshed: the uninstall pod's containers touch it every REFRESH_MS while they run and remove
// it when they are stopped. A tombstone nobody refreshed for STALE_MS belongs to an uninstall pod that is
// gone without cleaning up (node rebooted, container killed), and is ignored and removed. So:
//   - deleting the uninstall DaemonSet (finished or aborted) lifts it at once (SIGTERM removes it);
//   - an upgrade or a re-install is never blocked by a tombstone left behind: at most STALE_MS, and not at
//     all when it is older than that;
//   - no API access is needed to tell an uninstall in progress from a leftover.
import * as fs from 'node:fs';
import * as path from 'node:path';
import type { Logger } from 'winston';
import { writeFileAtomic } from '../../lib/atomic-file';
import { tempName } from './installer';

export const TOMBSTONE_FILE = 'uninstall-tombstone';
export const REFRESH_MS = 10_000;
export const STALE_MS = 60_000;

export type TombstoneState =
  | { state: 'absent' }
  | { state: 'live'; file: string; ageMs: number; writtenAt?: string }
  | { state: 'stale'; file: string; ageMs: number };

export function tombstonePath(stateDir: string): string {
  return path.join(stateDir, TOMBSTONE_FILE);
}

/** Writes (or renews) the tombstone, durably: the caller takes tether out only after this returns. */
export function writeTombstone(stateDir: string, log: Logger): void {
  fs.mkdirSync(stateDir, { recursive: true, mode: 0o700 });
  const body = { writtenAt: new Date().toISOString(), by: process.env.HOSTNAME ?? 'tether-install', why: 'tether is being uninstalled from this node' };
  writeFileAtomic(tombstonePath(stateDir), Buffer.from(JSON.stringify(body) + '\n'), { mode: 0o600, tempName: tempName() });
  log.info('uninstall tombstone written: install and watch leave the CNI configuration alone while it is refreshed', { file: tombstonePath(stateDir), staleAfterMs: STALE_MS });
}

/** Renews the tombstone's time (its mtime is what counts); recreates it when it vanished. */
export function refreshTombstone(stateDir: string, log: Logger): void {
  const file = tombstonePath(stateDir);
  const now = new Date();
  try {
    fs.utimesSync(file, now, now);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code !== 'ENOENT') throw e;
    writeTombstone(stateDir, log);
  }
}

export function removeTombstone(stateDir: string, log: Logger, why: string): boolean {
  const file = tombstonePath(stateDir);
  try {
    fs.unlinkSync(file);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') return false;
    throw e;
  }
  log.info('uninstall tombstone removed', { file, why });
  return true;
}

export function tombstoneState(stateDir: string, now = Date.now()): TombstoneState {
  const file = tombstonePath(stateDir);
  let st: fs.Stats;
  try {
    st = fs.statSync(file);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') return { state: 'absent' };
    throw e;
  }
  const ageMs = Math.max(0, now - st.mtimeMs);
  if (ageMs > STALE_MS) return { state: 'stale', file, ageMs };
  let writtenAt: string | undefined;
  try {
    writtenAt = (JSON.parse(fs.readFileSync(file, 'utf8')) as { writtenAt?: string }).writtenAt;
  } catch {
    writtenAt = undefined; // half-written by hand or garbled: its mtime still says it is live
  }
  return { state: 'live', file, ageMs, writtenAt };
}

/**
 * What install and watch do before touching anything: true when a live tombstone says to keep out. A stale
 * one is removed (logged) and does not block.
 */
export function uninstallInProgress(stateDir: string, log: Logger): TombstoneState & { block: boolean } {
  const t = tombstoneState(stateDir);
  if (t.state === 'stale') {
    removeTombstone(stateDir, log, `not refreshed for ${Math.round(t.ageMs / 1000)} s: the uninstall pod that wrote it is gone`);
    return { ...t, block: false };
  }
  return { ...t, block: t.state === 'live' };
}

/** Keeps the tombstone live every REFRESH_MS until stop(); stop removes it (the uninstall pod is going away). */
export function holdTombstone(stateDir: string, log: Logger, everyMs = REFRESH_MS): { stop(remove: boolean): void } {
  refreshTombstone(stateDir, log);
  const timer = setInterval(() => {
    try {
      refreshTombstone(stateDir, log);
    } catch (e) {
      log.error('cannot refresh the uninstall tombstone', { file: tombstonePath(stateDir), error: (e as Error).message });
    }
  }, everyMs);
  return {
    stop(remove: boolean) {
      clearInterval(timer);
      if (remove) removeTombstone(stateDir, log, 'the uninstall pod is stopping');
    },
  };
}
