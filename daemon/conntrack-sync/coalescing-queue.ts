// Events waiting to be sent, coalesced per entry key (latest wins) so a burst on a few flows costs one
// slot each rather than one per event, and a flow that came and went before it was sent costs nothing.
//
// Events are kept in their wire form (entry-codec.ts) in one byte log, not as objects: push copies (or
// encodes) an event's bytes in, writeInto copies them straight into a frame's payload. The key (the
// original tuple's bytes) is found through an open-addressing index in typed arrays that points at the
// key's record in the log and is checked byte for byte there: no string, object or Map entry per event.
//
// Record layout in the log (8-byte aligned): u8 type (0 new, 1 update, 2 destroy, DEAD), u8 destroyFirst,
// u16 room, u16 length, 2 bytes pad, f64 since (when the first event folded into the record was queued),
// then the entry's bytes (room ≥ length, so a later event of the same flow is written in place when it fits).
import type { ConntrackEvent, ConntrackEventType } from '../conntrack/types';
import { Cursor, MAX_EVENT_BYTES, isEncoded, readEvent, writeEntry, type SyncEvent } from './entry-codec';

const DEAD = 0xff;
const EMPTY_SLOT = -1;
const TOMB = -2;
const HEAD = 16;
const NEW = 0, UPDATE = 1, DESTROY = 2;
const CODE: Record<ConntrackEventType, number> = { new: NEW, update: UPDATE, destroy: DESTROY };

/** Length of the wire tuple at buf[o] (entry-codec's tuple flags first). */
function tupleBytes(buf: Buffer, o: number): number {
  const f = buf[o];
  const addr = f & 1 ? 16 : 4;
  return 2 + 2 * addr + (f & 2 ? 2 : 0) + (f & 4 ? 2 : 0) + (f & 8 ? 2 : 0) + (f & 16 ? 1 : 0) + (f & 32 ? 1 : 0);
}

/** Copies n bytes; a byte loop for short runs (Buffer.copy makes a view object per call). */
export function copyBytes(src: Buffer, from: number, dst: Buffer, to: number, n: number): void {
  if (n > 96) {
    src.copy(dst, to, from, from + n);
    return;
  }
  for (let i = 0; i < n; i++) dst[to + i] = src[from + i];
}

export class CoalescingQueue {
  private log = CoalescingQueue.alloc(64 << 10);
  private since64 = new Float64Array(this.log.buffer, 0, this.log.length >>> 3);
  /** Logical positions (growing forever; the log holds [head, tail) at physical offset position - base). */
  private base = 0;
  private head = 0;
  private tail = 0;
  /**
   * Key index: per slot the logical position of a record (EMPTY, or TOMB for a cancelled one; a position
   * below head is stale: that record went out) and its key's hash. `used` counts non-empty slots.
   */
  private slots = new Float64Array(1024).fill(EMPTY_SLOT);
  private hashes = new Uint32Array(1024);
  private used = 0;
  private events = 0;
  /** Events folded into an existing slot or cancelled since creation. */
  coalesced = 0;
  private readonly scratch = Buffer.allocUnsafe(MAX_EVENT_BYTES);

  private static alloc(n: number): Buffer {
    // Its own 8-aligned ArrayBuffer: the since field is read through a Float64Array view.
    return Buffer.from(new ArrayBuffer(n));
  }

  /** Events that would be sent now (a destroy-then-new slot counts two). */
  get size(): number {
    return this.events;
  }

  /** Queues a decoded or encoded event (encoding it here; throws CodecError when it cannot be). */
  push(ev: SyncEvent, now: number): void {
    if (isEncoded(ev)) return this.pushBytes(ev.type, ev.bytes, 0, ev.bytes.length, now);
    const end = writeEntry(this.scratch, 0, ev.entry);
    this.pushBytes(ev.type, this.scratch, 0, end, now);
  }

  /** Queues an event whose entry is already in wire form at buf[off, off + len) (copied in). */
  pushBytes(type: ConntrackEventType, buf: Buffer, off: number, len: number, now: number): void {
    const code = CODE[type];
    const keyAt = off + 5;
    const keyLen = tupleBytes(buf, keyAt);
    let h = 0x811c9dc5;
    for (let i = 0; i < keyLen; i++) h = Math.imul(h ^ buf[keyAt + i], 0x01000193);
    h >>>= 0;
    const slot = this.find(h, buf, keyAt, keyLen);
    if (slot < 0) {
      this.claim(-slot - 1, h, this.append(code, 0, buf, off, len, now));
      this.events++;
      return;
    }
    this.coalesced++;
    const log = this.log;
    const p = this.slots[slot] - this.base;
    const prev = log[p];
    const df = log[p + 1] === 1;
    const since = this.since64[(p + 8) >>> 3];
    if (code === DESTROY) {
      if (prev === NEW && !df) {
        // Created and gone before the peer heard of it.
        log[p] = DEAD;
        this.slots[slot] = TOMB;
        this.events--;
        return;
      }
      // destroy, new, destroy: the peer only needs the first destroy; update+destroy is a destroy.
      if (prev === NEW) this.events--;
      this.rewrite(slot, p, DESTROY, false, buf, off, len, since);
      return;
    }
    if (prev === DESTROY) {
      // The peer's entry under this key is an older flow (reused tuple): remove it, then insert anew.
      this.events++;
      this.rewrite(slot, p, NEW, true, buf, off, len, since);
      return;
    }
    // new+update stays new (the peer never had it); update+update or update+new is the latest entry.
    this.rewrite(slot, p, prev === NEW ? NEW : code, df, buf, off, len, since);
  }

  /**
   * Moves events into a frame: writes up to `max` of them (a destroy-then-new slot counts two), oldest
   * first, as the wire list's items (type byte, entry) at buf[o, limit). Returns where it stopped, how many
   * it wrote and the oldest `since` among them.
   */
  writeInto(buf: Buffer, o: number, limit: number, max: number): { end: number; count: number; since: number } {
    const log = this.log;
    let count = 0;
    let since = Infinity;
    while (this.head < this.tail) {
      const p = this.head - this.base;
      const room = log[p + 2] | (log[p + 3] << 8);
      const t = log[p];
      if (t === DEAD) {
        this.head += HEAD + room;
        continue;
      }
      const len = log[p + 4] | (log[p + 5] << 8);
      const df = log[p + 1] === 1;
      const n = df ? 2 : 1;
      if (count + n > max && count > 0) break;
      if (o + n * (1 + len) > limit) break;
      if (df) {
        buf[o] = DESTROY;
        copyBytes(log, p + HEAD, buf, o + 1, len);
        o += 1 + len;
      }
      buf[o] = t;
      copyBytes(log, p + HEAD, buf, o + 1, len);
      o += 1 + len;
      const s = this.since64[(p + 8) >>> 3];
      if (s < since) since = s;
      count += n;
      this.head += HEAD + room;
    }
    this.events -= count;
    if (this.head === this.tail) this.reset();
    return { end: o, count, since };
  }

  /** Removes and returns up to about `max` events, decoded (tests and diagnostics; the sender uses writeInto). */
  take(max: number): { events: ConntrackEvent[]; since: number } {
    const buf = Buffer.allocUnsafe(Math.max(1, max) * 2 * MAX_EVENT_BYTES);
    const r = this.writeInto(buf, 0, buf.length, max);
    const c = new Cursor(buf, 0, r.end);
    const events: ConntrackEvent[] = [];
    for (let i = 0; i < r.count; i++) events.push(readEvent(c));
    return { events, since: r.since };
  }

  clear(): void {
    this.head = this.tail;
    this.reset();
    this.events = 0;
  }

  /** Nothing queued: every index slot is now stale; the log starts over at its beginning. */
  private reset(): void {
    this.base = this.head = this.tail;
    if (this.used > 4096) this.rebuild(1024);
  }

  /**
   * The slot holding the key's live record, or -(a free slot + 1) when there is none: the first EMPTY,
   * TOMB or stale slot on the key's probe path.
   */
  private find(h: number, buf: Buffer, keyAt: number, keyLen: number): number {
    const slots = this.slots, hashes = this.hashes, mask = slots.length - 1, log = this.log;
    let free = -1;
    for (let i = h & mask; ; i = (i + 1) & mask) {
      const pos = slots[i];
      if (pos === EMPTY_SLOT) return -((free < 0 ? i : free) + 1);
      if (pos < this.head) {
        if (free < 0) free = i;
        continue;
      }
      if (hashes[i] !== h) continue;
      const q = pos - this.base + HEAD + 5;
      let same = true;
      for (let k = 0; k < keyLen; k++) {
        if (log[q + k] !== buf[keyAt + k]) {
          same = false;
          break;
        }
      }
      if (same) return i;
    }
  }

  private claim(i: number, h: number, pos: number): void {
    if (this.slots[i] === EMPTY_SLOT) this.used++;
    this.slots[i] = pos;
    this.hashes[i] = h;
    // At most half the slots in use (stale and cancelled ones count until the next rebuild).
    if (this.used * 2 > this.slots.length) this.rebuild(Math.max(1024, this.events * 4));
  }

  /** A fresh index holding only the live records (at least `size` slots, a power of two). */
  private rebuild(size: number): void {
    let cap = 1024;
    while (cap < size) cap *= 2;
    const slots = this.slots, hashes = this.hashes;
    this.slots = new Float64Array(cap).fill(EMPTY_SLOT);
    this.hashes = new Uint32Array(cap);
    this.used = 0;
    const mask = cap - 1;
    for (let i = 0; i < slots.length; i++) {
      const pos = slots[i];
      if (pos < this.head) continue; // EMPTY, TOMB (both negative) and stale
      let j = hashes[i] & mask;
      while (this.slots[j] !== EMPTY_SLOT) j = (j + 1) & mask;
      this.slots[j] = pos;
      this.hashes[j] = hashes[i];
      this.used++;
    }
  }

  /** The slot's record with new content: in place when it fits, else a new record at the tail. */
  private rewrite(slot: number, p: number, type: number, df: boolean, buf: Buffer, off: number, len: number, since: number): void {
    const log = this.log;
    if (len <= (log[p + 2] | (log[p + 3] << 8))) {
      log[p] = type;
      log[p + 1] = df ? 1 : 0;
      log[p + 4] = len;
      log[p + 5] = len >>> 8;
      copyBytes(buf, off, log, p + HEAD, len);
      return;
    }
    log[p] = DEAD;
    this.slots[slot] = this.append(type, df ? 1 : 0, buf, off, len, since);
  }

  /** Appends a record; returns its logical position. */
  private append(type: number, df: number, buf: Buffer, off: number, len: number, since: number): number {
    const room = (len + 7) & ~7;
    const need = HEAD + room;
    if (this.tail - this.base + need > this.log.length) this.makeRoom(need);
    const p = this.tail - this.base;
    const log = this.log;
    log[p] = type;
    log[p + 1] = df;
    log[p + 2] = room;
    log[p + 3] = room >>> 8;
    log[p + 4] = len;
    log[p + 5] = len >>> 8;
    this.since64[(p + 8) >>> 3] = since;
    copyBytes(buf, off, log, p + HEAD, len);
    const at = this.tail;
    this.tail += need;
    return at;
  }

  /** Drops what was sent from the front of the log, growing it when what remains needs more room. */
  private makeRoom(need: number): void {
    const live = this.tail - this.head;
    const from = this.head - this.base;
    const size = live + need > this.log.length / 2 ? Math.max(this.log.length * 2, live + need) : this.log.length;
    const log = size === this.log.length ? this.log : CoalescingQueue.alloc(size);
    this.log.copy(log, 0, from, from + live);
    if (log !== this.log) {
      this.log = log;
      this.since64 = new Float64Array(log.buffer, 0, log.length >>> 3);
    }
    this.base = this.head;
  }
}
