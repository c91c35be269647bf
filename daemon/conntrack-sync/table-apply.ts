// What a candidate does with a received sync stream: writes it into a gateway namespace's conntrack
// table, in ctnetlink batches, without holding the event loop for long (a stalled loop delays BFD and
// the sync channels' own heartbeats). Shared by the egress controller and the sync benchmark.
import { setImmediate as nextTurn } from 'node:timers/promises';
import { ConntrackHandle, type ApplyResult, type TableOp } from '../conntrack/handle';
import * as os from 'node:os';
import { nfgenmsg } from '../conntrack/codec';
import { ctMsgType, IPCTNL_MSG, NFNL_SUBSYS_CTNETLINK } from '../conntrack/constants';
import { NetlinkError } from '../netlink/netlink-error';
import { encodeEventAt } from './event-transcode';
import type { ConntrackEntry, ConntrackEvent } from '../conntrack/types';
import type { Writer } from '../conntrack/wire';
import { NLM_F_CREATE, NLM_F_EXCL } from '../netlink/constants';
import { EncodedEntries, type WireList } from './entry-codec';
import { writeCreateAt, writeLookupAt, writeUpdateAt } from './table-wire';
import { Digests, inBuckets, keyHash, type BucketSet, type KeySet } from './digest';

/**
 * A standby's copy of an entry lives at least this long (seconds). Its own timer is not what ends it: the
 * owner's destroy event, or a sweep when the owner no longer has it, does. An owner's UDP flow that
 * keeps going sends no events, so its copy would otherwise expire at the standby; the consistency check
 * (syncedDigests) re-arms copies below half of this. After a takeover, traffic resets the timers of live
 * flows to the kernel's own; dead ones go within this time.
 */
export const STANDBY_MIN_TIMEOUT = 600;

function standby(e: ConntrackEntry, minTimeout: number): ConntrackEntry {
  return e.timeout !== undefined && e.timeout < minTimeout ? { ...e, timeout: minTimeout } : e;
}

/** Ops per slice between two turns of the event loop (~10–20 ms of kernel work). */
export const SLICE_OPS = 2048;

function merge(into: ApplyResult, r: ApplyResult): void {
  into.created += r.created;
  into.updated += r.updated;
  into.deleted += r.deleted;
  for (const f of r.failed) into.failed.push(f);
}

/** Applies ops in order, a slice per event-loop turn. */
export async function applyInSlices(h: ConntrackHandle, ops: readonly TableOp[], sliceOps = SLICE_OPS): Promise<ApplyResult> {
  const res: ApplyResult = { created: 0, updated: 0, deleted: 0, failed: [] };
  for (let i = 0; i < ops.length; i += sliceOps) {
    if (i > 0) await nextTurn();
    merge(res, h.applyOps(ops.slice(i, i + sliceOps)));
  }
  return res;
}

/** Applies one frame's events (new/update upserted, destroy deleted) to the table at nsPath. */
export async function applySyncedEvents(nsPath: string, events: readonly ConntrackEvent[], minTimeout = 0): Promise<ApplyResult> {
  const h = ConntrackHandle.open(nsPath);
  try {
    return await applyInSlices(h, events.map((ev) => ({ kind: ev.type === 'destroy' ? 'delete' : ev.type === 'new' ? 'create' : 'update', entry: standby(ev.entry, minTimeout) })));
  } finally {
    h.close();
  }
}

const CT_NEW = ctMsgType(IPCTNL_MSG.CT_NEW);
const CT_DELETE = ctMsgType(IPCTNL_MSG.CT_DELETE);
const KINDS: Array<TableOp['kind']> = ['create', 'update', 'delete'];

/**
 * A received list (WireList) applied to the table at nsPath straight from its wire bytes: events (new
 * created, update updated, destroy deleted) or a transfer's entries (created), each entry's timeout
 * raised to at least minTimeout. Only an entry that needs a second message (it existed, or did not, or
 * was refused) is decoded. A slice per event-loop turn, as applyInSlices.
 */
export async function applyWireList(nsPath: string, list: WireList, minTimeout = 0, sliceOps = SLICE_OPS): Promise<ApplyResult> {
  const h = ConntrackHandle.open(nsPath);
  try {
    const res: ApplyResult = { created: 0, updated: 0, deleted: 0, failed: [] };
    const buf = list.payload;
    const off = list.offsets;
    const types = list.types;
    const kind = (i: number): TableOp['kind'] => (types ? KINDS[types[i]] : 'create');
    const write = (w: Writer, i: number): { type: number; flags: number } => {
      const k = kind(i);
      if (k === 'delete') {
        writeLookupAt(w, buf, off[i]);
        return { type: CT_DELETE, flags: 0 };
      }
      if (k === 'create') {
        writeCreateAt(w, buf, off[i], minTimeout);
        return { type: CT_NEW, flags: NLM_F_CREATE | NLM_F_EXCL };
      }
      writeUpdateAt(w, buf, off[i], minTimeout);
      return { type: CT_NEW, flags: 0 };
    };
    const op = (i: number): TableOp => ({ kind: kind(i), entry: standby(list.entry(i), minTimeout) });
    for (let i = 0; i < list.count; i += sliceOps) {
      if (i > 0) await nextTurn();
      const n = Math.min(sliceOps, list.count - i);
      const items = new Array<number>(n);
      for (let j = 0; j < n; j++) items[j] = i + j;
      h.applyItems(items, kind, write, op, res);
    }
    return res;
  } finally {
    h.close();
  }
}

/** Makes the entries in scope at nsPath equal to `entries` (a full resync): one dump, then batches. */
export async function replaceSyncedEntries(nsPath: string, entries: readonly ConntrackEntry[], inScope: (e: ConntrackEntry) => boolean): Promise<ApplyResult> {
  const h = ConntrackHandle.open(nsPath);
  try {
    const ops = h.planReconcile(entries, inScope);
    await nextTurn();
    return await applyInSlices(h, ops);
  } finally {
    h.close();
  }
}

/** A transfer's chunk: each entry created, or updated where it exists. */
export async function upsertSyncedEntries(nsPath: string, entries: readonly ConntrackEntry[], minTimeout = 0): Promise<ApplyResult> {
  const h = ConntrackHandle.open(nsPath);
  try {
    return await applyInSlices(h, entries.map((e) => ({ kind: 'create', entry: standby(e, minTimeout) })));
  } finally {
    h.close();
  }
}

/** The end of a transfer: deletes the in-scope entries of its buckets that it did not carry. */
export async function sweepSyncedEntries(nsPath: string, inScope: (e: ConntrackEntry) => boolean, keep: KeySet, buckets: BucketSet): Promise<ApplyResult> {
  const h = ConntrackHandle.open(nsPath);
  try {
    let ops: TableOp[] = [];
    await h.dumpEach({}, (e) => {
      if (!inScope(e) || !inBuckets(buckets, e)) return;
      const [hi, lo] = keyHash(e);
      if (!keep.has(hi, lo)) ops.push({ kind: 'delete', entry: e });
    }, () => { ops = []; });
    await nextTurn();
    return await applyInSlices(h, ops);
  } finally {
    h.close();
  }
}

/**
 * Digests of the in-scope entries at nsPath (the standby's side of a consistency check), re-arming copies
 * whose timeout fell under half of `minTimeout` (0: none). One dump; the kernel work is the re-armed ones.
 */
export async function syncedDigests(nsPath: string, inScope: (e: ConntrackEntry) => boolean, k: number, minTimeout = 0): Promise<{ digests: Digests; refreshed: number }> {
  const h = ConntrackHandle.open(nsPath);
  try {
    let d = new Digests(k);
    let ops: TableOp[] = [];
    await h.dumpEach({}, (e) => {
      if (!inScope(e)) return;
      d.add(e);
      if (minTimeout && e.timeout !== undefined && e.timeout < minTimeout / 2) ops.push({ kind: 'update', entry: { ...e, timeout: minTimeout }, keepStatus: e.status });
    }, () => {
      d = new Digests(k);
      ops = [];
    });
    if (ops.length) await applyInSlices(h, ops);
    return { digests: d, refreshed: ops.length };
  } finally {
    h.close();
  }
}

/**
 * How long a standby's digests are reused while nothing was written to its table: its copies change by
 * themselves only by expiring, which the dump behind fresh digests prevents (syncedDigests re-arms copies
 * under half of STANDBY_MIN_TIMEOUT, so a dump at most this often keeps every copy alive).
 */
export const STANDBY_REDIGEST_MS = 180_000;

/**
 * Digests kept per key until invalidated (something was written, an event arrived) or maxAgeMs old, for
 * either side of the consistency check. The computation's promise is what is kept, so callers asking at
 * once share one dump, and an invalidation during a dump drops it (its result may predate the change); a
 * failed one is not kept.
 */
export class DigestCache<K, D> {
  private readonly cache = new Map<K, { k: number; at: number; digests: Promise<D> }>();
  computed = 0;

  constructor(private readonly maxAgeMs: number) {}

  invalidate(key: K): void {
    this.cache.delete(key);
  }

  get(key: K, k: number, compute: () => Promise<D>): Promise<D> {
    const c = this.cache.get(key);
    if (c && c.k === k && Date.now() - c.at < this.maxAgeMs) return c.digests;
    this.computed++;
    const entry = { k, at: Date.now(), digests: compute() };
    this.cache.set(key, entry);
    entry.digests.catch(() => {
      if (this.cache.get(key) === entry) this.cache.delete(key);
    });
    return entry.digests;
  }

  protected keys(): IterableIterator<K> {
    return this.cache.keys();
  }
}

/**
 * The standby's side of the consistency check without a dump per check: digests per stream, kept until
 * something is written for that stream (invalidate) or they are maxAgeMs old. With nothing changed, a
 * check costs a comparison of K buckets on both sides.
 */
export class StandbyDigests extends DigestCache<string, Digests | undefined> {
  constructor(maxAgeMs = STANDBY_REDIGEST_MS) {
    super(maxAgeMs);
  }

  invalidatePrefix(prefix: string): void {
    for (const key of [...this.keys()]) if (key.startsWith(prefix)) this.invalidate(key);
  }
}

/**
 * The owner's side: its in-scope entries (a transfer's snapshot), read without holding the event loop.
 */
export async function dumpScope(nsPath: string, family: 4 | 6, inScope: (e: ConntrackEntry) => boolean): Promise<ConntrackEntry[]> {
  const h = ConntrackHandle.open(nsPath);
  try {
    let out: ConntrackEntry[] = [];
    await h.dumpEach({ family }, (e) => { if (inScope(e)) out.push(e); }, () => { out = []; });
    return out;
  } finally {
    h.close();
  }
}

/**
 * dumpScope for a transfer: the entries whose reply goes to `replyDst` (the floating address's 4 or 16
 * bytes), each dump message written straight into its sync wire form (event-transcode.ts): no object per
 * entry, and the bytes go into the transfer's frames as they are.
 */
export async function dumpScopeEncoded(nsPath: string, family: 4 | 6, replyDst: Buffer): Promise<EncodedEntries> {
  const h = ConntrackHandle.open(nsPath);
  try {
    let out = new EncodedEntries();
    const body = [nfgenmsg(family)];
    for (let attempt = 0; attempt < 4; attempt++) {
      if (attempt > 0) out = new EncodedEntries(out.count);
      const complete = await h.socket.dumpEachAt(ctMsgType(IPCTNL_MSG.CT_GET), body, 'IPCTNL_MSG_CT_GET dump', (buf, start, end, type) => {
        if (type >> 8 !== NFNL_SUBSYS_CTNETLINK) return;
        out.reserve();
        const e = encodeEventAt(buf, start, end, replyDst, out.buf, out.used);
        if (e >= 0) out.commit(e);
      });
      if (complete) return out;
    }
    throw new NetlinkError('IPCTNL_MSG_CT_GET dump', os.constants.errno.EINTR, undefined, { message: 'IPCTNL_MSG_CT_GET dump: interrupted 4 times in a row by concurrent changes; giving up' });
  } finally {
    h.close();
  }
}

/** The owner's digests of its in-scope entries: one dump, nothing kept but the K buckets. */
export async function scopeDigests(nsPath: string, family: 4 | 6, inScope: (e: ConntrackEntry) => boolean, k: number): Promise<Digests> {
  const h = ConntrackHandle.open(nsPath);
  try {
    let d = new Digests(k);
    await h.dumpEach({ family }, (e) => { if (inScope(e)) d.add(e); }, () => { d = new Digests(k); });
    return d;
  } finally {
    h.close();
  }
}
