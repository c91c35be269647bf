// ConntrackHandle: ctnetlink (conntrack table) work in one network namespace: dump, get, insert (one or
// many per sendto), delete, flush. Like NetlinkHandle, open(nsPath) creates the socket inside the
// namespace and every later call runs synchronously from the daemon's own thread.
import * as os from 'node:os';
import { NLM_F_CREATE, NLM_F_EXCL } from '../netlink/constants';
import { NetlinkError } from '../netlink/netlink-error';
import { inNetns } from '../sys/netns';
import { be32, decodeEntry, encodeCreate, encodeLookup, encodeUpdate, formatTuple, nfgenmsg, writeCreate, writeLookup, writeUpdate } from './codec';
import { Writer } from './wire';
import { CTA, ctMsgType, IPCTNL_MSG, NFNL_SUBSYS_CTNETLINK } from './constants';
import { CtnlSocket, type CtnlSocketOptions } from './ctnl-socket';
import { entryKey, type ConntrackEntry, type CtTuple } from './types';

const { EEXIST, ENOENT } = os.constants.errno;

export interface DumpFilter {
  family?: 4 | 6;
  /** Entries whose mark & mask equals value & mask (filtered by the kernel). */
  mark?: { value: number; mask: number };
  zone?: number;
}

export interface InsertOptions {
  /**
   * When an entry with the same original tuple exists, make it equal to this one instead of failing with
   * EEXIST: updated in place (timeout, mark, status, TCP state) when its NAT mapping is the same, else
   * deleted and created again (the kernel cannot change an entry's NAT mapping).
   */
  update?: boolean;
}

/** One change of a batched apply: create (EEXIST → update), update (ENOENT → create), or delete (ENOENT is fine). */
export interface TableOp {
  kind: 'create' | 'update' | 'delete';
  entry: ConntrackEntry;
  /** update: status bits the existing entry has, which an update may not clear (SEEN_REPLY, ASSURED). */
  keepStatus?: number;
}

export interface ApplyResult {
  created: number;
  updated: number;
  deleted: number;
  failed: Array<{ op: TableOp; error: NetlinkError }>;
}

export interface InsertManyResult {
  created: number;
  updated: number;
  failed: Array<{ entry: ConntrackEntry; error: NetlinkError }>;
}

function sameTuple(a: CtTuple, b: CtTuple): boolean {
  return a.family === b.family && a.proto === b.proto && a.src === b.src && a.dst === b.dst && a.sport === b.sport &&
    a.dport === b.dport && a.icmpId === b.icmpId;
}

const CT_NEW = ctMsgType(IPCTNL_MSG.CT_NEW);
const CT_DELETE = ctMsgType(IPCTNL_MSG.CT_DELETE);

function writeCreateMsg(w: Writer, e: ConntrackEntry): { type: number; flags: number } {
  writeCreate(w, e);
  return { type: CT_NEW, flags: NLM_F_CREATE | NLM_F_EXCL };
}

function writeOp(w: Writer, op: TableOp): { type: number; flags: number } {
  if (op.kind === 'delete') {
    writeLookup(w, op.entry.orig, op.entry.zone);
    return { type: CT_DELETE, flags: 0 };
  }
  if (op.kind === 'create') return writeCreateMsg(w, op.entry);
  writeUpdate(w, op.entry, op.keepStatus ?? 0);
  return { type: CT_NEW, flags: 0 };
}

function opName(msg: number, t?: CtTuple): string {
  const name = msg === IPCTNL_MSG.CT_NEW ? 'IPCTNL_MSG_CT_NEW' : msg === IPCTNL_MSG.CT_GET ? 'IPCTNL_MSG_CT_GET' : 'IPCTNL_MSG_CT_DELETE';
  return t ? `${name} ${formatTuple(t)}` : name;
}

export class ConntrackHandle {
  readonly socket: CtnlSocket;
  /** The namespace path the handle was opened in; undefined means the daemon's own namespace. */
  readonly nsPath?: string;
  /** Messages per sendto in insertMany; their error replies must fit the receive buffer. */
  batchSize = 256;

  constructor(socket: CtnlSocket, nsPath?: string) {
    this.socket = socket;
    this.nsPath = nsPath;
  }

  /** Throws TetherError(NETNS_GONE) when nsPath cannot be opened. */
  static open(nsPath?: string, opts: CtnlSocketOptions = {}): ConntrackHandle {
    const sock = nsPath ? inNetns(nsPath, () => CtnlSocket.open(opts)) : CtnlSocket.open(opts);
    return new ConntrackHandle(sock, nsPath);
  }

  /** Runs fn with a handle for nsPath and always closes it. */
  static with<T>(nsPath: string | undefined, fn: (h: ConntrackHandle) => T): T {
    const h = ConntrackHandle.open(nsPath);
    try {
      return fn(h);
    } finally {
      h.close();
    }
  }

  /** Idempotent. */
  close(): void {
    this.socket.close();
  }

  /** All entries (restarted a bounded number of times if a concurrent change interrupts the dump). */
  dump(filter: DumpFilter = {}): ConntrackEntry[] {
    const body = [nfgenmsg(filter.family ?? 0)];
    if (filter.mark) body.push(be32(CTA.MARK, filter.mark.value), be32(CTA.MARK_MASK, filter.mark.mask));
    const out: ConntrackEntry[] = [];
    for (const m of this.socket.nl.dump(ctMsgType(IPCTNL_MSG.CT_GET), body, 'IPCTNL_MSG_CT_GET dump')) {
      if (m.type >> 8 !== NFNL_SUBSYS_CTNETLINK) continue;
      const e = decodeEntry(m.payload);
      // The kernel filters family and mark already; zone has no dump filter, and re-checking is cheap.
      if (filter.family && e.orig.family !== filter.family) continue;
      if (filter.mark && ((e.mark ?? 0) & filter.mark.mask) !== (filter.mark.value & filter.mark.mask)) continue;
      if (filter.zone !== undefined && (e.zone ?? 0) !== filter.zone) continue;
      out.push(e);
    }
    return out;
  }

  /**
   * All entries, each handed to `each` and not kept, yielding to the event loop as it goes (see
   * CtnlSocket.dumpEach); restarted (onRestart first) a bounded number of times if a concurrent change
   * interrupts it, so `each` may see an entry again only after onRestart.
   */
  async dumpEach(filter: DumpFilter, each: (e: ConntrackEntry) => void, onRestart: () => void = () => undefined): Promise<void> {
    const body = [nfgenmsg(filter.family ?? 0)];
    if (filter.mark) body.push(be32(CTA.MARK, filter.mark.value), be32(CTA.MARK_MASK, filter.mark.mask));
    for (let attempt = 0; attempt < 4; attempt++) {
      if (attempt > 0) onRestart();
      const complete = await this.socket.dumpEach(ctMsgType(IPCTNL_MSG.CT_GET), body, 'IPCTNL_MSG_CT_GET dump', (m) => {
        if (m.type >> 8 !== NFNL_SUBSYS_CTNETLINK) return;
        const e = decodeEntry(m.payload);
        if (filter.family && e.orig.family !== filter.family) return;
        if (filter.mark && ((e.mark ?? 0) & filter.mark.mask) !== (filter.mark.value & filter.mark.mask)) return;
        if (filter.zone !== undefined && (e.zone ?? 0) !== filter.zone) return;
        each(e);
      });
      if (complete) return;
    }
    throw new NetlinkError('IPCTNL_MSG_CT_GET dump', os.constants.errno.EINTR, undefined, { message: 'IPCTNL_MSG_CT_GET dump: interrupted 4 times in a row by concurrent changes; giving up' });
  }

  /** The entry whose original tuple is `orig`, or undefined. */
  get(orig: CtTuple, zone?: number): ConntrackEntry | undefined {
    try {
      const r = this.socket.nl.request(ctMsgType(IPCTNL_MSG.CT_GET), 0, encodeLookup(orig, zone), opName(IPCTNL_MSG.CT_GET, orig));
      const m = r.find((x) => x.type >> 8 === NFNL_SUBSYS_CTNETLINK);
      return m ? decodeEntry(m.payload) : undefined;
    } catch (e) {
      if (e instanceof NetlinkError && e.errno === ENOENT) return undefined;
      throw e;
    }
  }

  /**
   * Creates the entry, NAT mapping included (CTA_NAT_SRC/DST from the reply tuple), CONFIRMED so the
   * kernel accepts it. Throws NetlinkError naming op and tuple, e.g. EEXIST without `update`.
   */
  insert(entry: ConntrackEntry, opts: InsertOptions = {}): 'created' | 'updated' {
    try {
      this.socket.nl.request(ctMsgType(IPCTNL_MSG.CT_NEW), NLM_F_CREATE | NLM_F_EXCL, encodeCreate(entry), opName(IPCTNL_MSG.CT_NEW, entry.orig));
      return 'created';
    } catch (e) {
      if (!(opts.update && e instanceof NetlinkError && e.errno === EEXIST)) throw e;
    }
    return this.replace(entry);
  }

  /**
   * Inserts many entries, batchSize messages per sendto. Never stops at one failure: failures are
   * returned with their NetlinkError. With `update`, existing entries are handled as in insert().
   */
  insertMany(entries: ConntrackEntry[], opts: InsertOptions = {}): InsertManyResult {
    const res: InsertManyResult = { created: 0, updated: 0, failed: [] };
    for (let i = 0; i < entries.length; i += this.batchSize) {
      const chunk = entries.slice(i, i + this.batchSize);
      const results = this.socket.batchWrite(chunk, writeCreateMsg, `IPCTNL_MSG_CT_NEW batch of ${chunk.length}`);
      results.forEach((r, j) => {
        const entry = chunk[j];
        if (r === 0) { res.created++; return; }
        const error = new NetlinkError(opName(IPCTNL_MSG.CT_NEW, entry.orig), r.errno, r.extAck);
        if (!(opts.update && r.errno === EEXIST)) { res.failed.push({ entry, error }); return; }
        try {
          this.replace(entry);
          res.updated++;
        } catch (e) {
          res.failed.push({ entry, error: e instanceof NetlinkError ? e : error });
        }
      });
    }
    return res;
  }

  /**
   * Applies changes in order, batchSize messages per sendto: the fast path for synced events. A create
   * that meets an existing entry becomes an update, an update of a missing entry becomes a create (both
   * retried in a second batch before the next chunk), and an update the kernel refuses (a status bit it
   * may not clear, an expired entry) falls back to replace(). The NAT mapping of an existing entry is not
   * compared here (that takes a lookup per entry); reconcile() does, from one dump.
   */
  applyOps(ops: readonly TableOp[]): ApplyResult {
    return this.applyItems(ops, (op) => op.kind, writeOp, (op) => op);
  }

  /**
   * applyOps for items in any form (e.g. entries still in their sync wire bytes): `write` writes an item's
   * message straight into the batch, `kind` says what it is, and `op` turns an item into a TableOp only
   * when it needs more than its first message (the kernel refused it, or it met an entry or none).
   * Results are accumulated into `res` when given.
   */
  applyItems<T>(
    items: readonly T[], kind: (item: T) => TableOp['kind'], write: (w: Writer, item: T) => { type: number; flags: number }, op: (item: T) => TableOp,
    res: ApplyResult = { created: 0, updated: 0, deleted: 0, failed: [] },
  ): ApplyResult {
    for (let i = 0; i < items.length; i += this.batchSize) {
      const chunk = i === 0 && items.length <= this.batchSize ? items : items.slice(i, i + this.batchSize);
      const first = this.runBatch(chunk, kind, write, op, res, false);
      const second = first.retry.length ? this.runBatch(first.retry, (o) => o.kind, writeOp, (o) => o, res, true).replace : [];
      for (const o of [...first.replace, ...second]) {
        try {
          this.replace(o.entry);
          res.updated++;
        } catch (e) {
          res.failed.push({ op: o, error: e as NetlinkError });
        }
      }
    }
    return res;
  }

  /**
   * The changes that make the entries for which inScope() holds equal to `entries`, from one dump:
   * missing ones created, present ones updated (keeping the status bits the kernel won't clear), ones
   * with another NAT mapping deleted and created again, and in-scope ones not in `entries` deleted.
   */
  planReconcile(entries: readonly ConntrackEntry[], inScope: (e: ConntrackEntry) => boolean): TableOp[] {
    const current = new Map<string, ConntrackEntry>();
    for (const e of this.dump()) if (inScope(e)) current.set(entryKey(e), e);
    const ops: TableOp[] = [];
    for (const e of entries) {
      const k = entryKey(e);
      const cur = current.get(k);
      if (!cur) {
        ops.push({ kind: 'create', entry: e });
        continue;
      }
      current.delete(k);
      if (sameTuple(cur.reply, e.reply)) {
        ops.push({ kind: 'update', entry: e, keepStatus: cur.status });
      } else {
        ops.push({ kind: 'delete', entry: cur }, { kind: 'create', entry: e });
      }
    }
    for (const stale of current.values()) ops.push({ kind: 'delete', entry: stale });
    return ops;
  }

  /**
   * One batch. `retry`: creates that met an entry (as updates), updates that met none (as creates), only
   * on the first try; `replace`: the rest that failed. An item becomes a TableOp only when it failed.
   */
  private runBatch<T>(
    items: readonly T[], kind: (item: T) => TableOp['kind'], write: (w: Writer, item: T) => { type: number; flags: number }, op: (item: T) => TableOp,
    res: ApplyResult, secondTry: boolean,
  ): { retry: TableOp[]; replace: TableOp[] } {
    const out = { retry: [] as TableOp[], replace: [] as TableOp[] };
    this.socket.batchWrite(items, write, `ctnetlink batch of ${items.length}`).forEach((r, j) => {
      const k = kind(items[j]);
      if (r === 0) {
        res[k === 'delete' ? 'deleted' : k === 'create' ? 'created' : 'updated']++;
        return;
      }
      const o = op(items[j]);
      if (k === 'delete') {
        if (r.errno !== ENOENT) res.failed.push({ op: o, error: new NetlinkError(opName(IPCTNL_MSG.CT_DELETE, o.entry.orig), r.errno, r.extAck) });
      } else if (k === 'create' && r.errno === EEXIST && !secondTry) {
        out.retry.push({ kind: 'update', entry: o.entry, keepStatus: o.keepStatus });
      } else if (k === 'update' && r.errno === ENOENT && !secondTry) {
        out.retry.push({ kind: 'create', entry: o.entry });
      } else {
        out.replace.push(o);
      }
    });
    return out;
  }

  /** Makes an existing entry equal to `entry` (see InsertOptions.update). */
  private replace(entry: ConntrackEntry): 'created' | 'updated' {
    const cur = this.get(entry.orig, entry.zone);
    const op = opName(IPCTNL_MSG.CT_NEW, entry.orig);
    if (cur && sameTuple(cur.reply, entry.reply)) {
      try {
        this.socket.nl.request(ctMsgType(IPCTNL_MSG.CT_NEW), 0, encodeUpdate(entry, cur.status), op);
        return 'updated';
      } catch (e) {
        if (!(e instanceof NetlinkError && e.errno === ENOENT)) throw e; // expired meanwhile: create below
      }
    } else if (cur) {
      this.delete(entry.orig, entry.zone);
    }
    this.socket.nl.request(ctMsgType(IPCTNL_MSG.CT_NEW), NLM_F_CREATE | NLM_F_EXCL, encodeCreate(entry), op);
    return cur ? 'updated' : 'created';
  }

  /** Deletes the entry whose original tuple is `orig`. Idempotent: false when it was already gone. */
  delete(orig: CtTuple, zone?: number): boolean {
    try {
      this.socket.nl.request(ctMsgType(IPCTNL_MSG.CT_DELETE), 0, encodeLookup(orig, zone), opName(IPCTNL_MSG.CT_DELETE, orig));
      return true;
    } catch (e) {
      if (e instanceof NetlinkError && e.errno === ENOENT) return false;
      throw e;
    }
  }

  /** Deletes every entry (of one family when given) in the namespace. */
  flush(family?: 4 | 6): void {
    this.socket.nl.request(ctMsgType(IPCTNL_MSG.CT_DELETE), 0, [nfgenmsg(family ?? 0)], 'IPCTNL_MSG_CT_DELETE flush');
  }
}
