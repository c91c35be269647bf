// The node's own sysctls as they were before tetherd first changed them, kept durably in its state
// directory, so an uninstall can put them back with tetherd gone (a pod namespace's sysctls die with the
// pod and are not journalled). writeNetSysctl(null, …) records here before it writes.
import * as fs from 'node:fs';
import { koffi } from './ffi';
import { writeFileAtomic } from '../../lib/atomic-file';
import { TetherError, ErrorCode } from '../../lib/errors';

export interface SysctlJournalEntry {
  /** The value before tetherd's first write. */
  before: string;
  /** What tetherd wrote last: a restore only happens while the value is still this (nobody changed it since). */
  wrote: string;
  /** For a per-interface key: the interface's index then, so a later interface with the same name is not mistaken for it. */
  ifindex?: number;
}

export type SysctlJournal = Record<string, SysctlJournalEntry>;

let journalFile: string | undefined;

/** Where the journal lives (tetherd: <state-dir>/sysctl-journal.json); undefined: nothing is journalled. */
export function useSysctlJournal(file: string | undefined): void {
  journalFile = file;
}

let nameToIndex: ((name: string) => number) | undefined;

/** if_nametoindex in the calling thread's namespace; 0 when there is no such interface. */
export function ifIndexOf(name: string): number {
  if (!nameToIndex) nameToIndex = koffi().load('libc.so.6').func('unsigned int if_nametoindex(const char *name)');
  return nameToIndex!(name);
}

/** The interface a key is about (net/ipv4/conf/<dev>/…, net/ipv4/neigh/<dev>/…), not all/default. */
export function interfaceOf(key: string): string | undefined {
  const m = /^net\/ipv[46]\/(?:conf|neigh)\/([^/]+)\//.exec(key);
  return m && m[1] !== 'all' && m[1] !== 'default' ? m[1] : undefined;
}

export function readSysctlJournal(file: string): SysctlJournal {
  let raw: string;
  try {
    raw = fs.readFileSync(file, 'utf8');
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') return {};
    throw e;
  }
  try {
    return JSON.parse(raw) as SysctlJournal;
  } catch (e) {
    throw new TetherError(ErrorCode.Internal, `${file}: unreadable sysctl journal (${(e as Error).message})`, { cause: e });
  }
}

/** True when the entry still describes an interface that exists under the same index (or is node-wide). */
function stillSame(key: string, e: SysctlJournalEntry): boolean {
  const dev = interfaceOf(key);
  return !dev || (e.ifindex !== undefined && ifIndexOf(dev) === e.ifindex);
}

/**
 * Records a node sysctl's value before tetherd writes `value` over it, durably (fsync, rename) and before
 * the write: a tetherd killed right after the write still leaves the original on disk. The first value
 * recorded stays the original; entries of interfaces that are gone (or whose name now belongs to another
 * interface) are dropped, so the journal stays as small as the set of interfaces tetherd touches.
 * Runs in the node's namespace (the caller's thread).
 */
export function journalHostSysctl(key: string, before: string, value: string): void {
  if (!journalFile) return;
  const j = readSysctlJournal(journalFile);
  for (const k of Object.keys(j)) if (k !== key && !stillSame(k, j[k])) delete j[k];
  const dev = interfaceOf(key);
  const prev = j[key];
  if (prev && stillSame(key, prev)) {
    if (prev.wrote === value) return;
    j[key] = { ...prev, wrote: value };
  } else {
    j[key] = { before, wrote: value, ...(dev ? { ifindex: ifIndexOf(dev) } : {}) };
  }
  try {
    writeFileAtomic(journalFile, JSON.stringify(j, null, 1));
  } catch (e) {
    throw new TetherError(ErrorCode.Internal, `sysctl ${key}: cannot journal its value before changing it (${journalFile}: ${(e as Error).message})`, { cause: e });
  }
}
