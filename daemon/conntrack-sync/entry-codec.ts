// Compact binary encoding of conntrack entries and events for sync payloads (~55 bytes for a TCP/IPv4
// entry against ~330 as JSON); decoding validates every bound so a bad payload is an error, not a crash.
import type { ConntrackEntry, ConntrackEvent, ConntrackEventType, CtTuple } from '../conntrack/types';
import { formatV4, formatV6, writeV4, writeV6 } from '../../lib/ip';

/** The most bytes one event can take: type, flags, status, two IPv6 tuples with every field, options. */
export const MAX_EVENT_BYTES = 1 + 1 + 4 + 2 * (2 + 32 + 8) + 4 + 4 + 2 + 8 + 4;

export class CodecError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'CodecError';
  }
}

const EV_TYPES: ConntrackEventType[] = ['new', 'update', 'destroy'];
const EV_CODE: Record<ConntrackEventType, number> = { new: 0, update: 1, destroy: 2 };

// Entry option bits (exported for event-transcode.ts, which writes the same format).
export const E_TIMEOUT = 1, E_MARK = 2, E_ZONE = 4, E_TCP = 8, E_ID = 16;
// Tuple bits.
export const T_V6 = 1, T_SPORT = 2, T_DPORT = 4, T_ICMP_ID = 8, T_ICMP_TYPE = 16, T_ICMP_CODE = 32;
// TCP info bits.
export const P_WS_ORIG = 1, P_WS_REPLY = 2, P_FL_ORIG = 4, P_FL_REPLY = 8;

function u16(buf: Buffer, o: number, v: number): number {
  buf[o] = v >>> 8;
  buf[o + 1] = v;
  return o + 2;
}
function u32(buf: Buffer, o: number, v: number): number {
  buf[o] = v >>> 24;
  buf[o + 1] = v >>> 16;
  buf[o + 2] = v >>> 8;
  buf[o + 3] = v;
  return o + 4;
}

function writeAddr(buf: Buffer, o: number, s: string, v6: boolean): number {
  try {
    if (v6) writeV6(buf, o, s);
    else writeV4(buf, o, s);
  } catch (e) {
    throw new CodecError((e as Error).message);
  }
  return o + (v6 ? 16 : 4);
}

function writeTuple(buf: Buffer, o: number, t: CtTuple): number {
  const v6 = t.family === 6;
  if (!v6 && t.family !== 4) throw new CodecError(`tuple family ${t.family}`);
  const flags = (v6 ? T_V6 : 0) | (t.sport !== undefined ? T_SPORT : 0) | (t.dport !== undefined ? T_DPORT : 0) |
    (t.icmpId !== undefined ? T_ICMP_ID : 0) | (t.icmpType !== undefined ? T_ICMP_TYPE : 0) | (t.icmpCode !== undefined ? T_ICMP_CODE : 0);
  buf[o++] = flags;
  buf[o++] = t.proto;
  o = writeAddr(buf, o, t.src, v6);
  o = writeAddr(buf, o, t.dst, v6);
  if (flags & T_SPORT) o = u16(buf, o, t.sport!);
  if (flags & T_DPORT) o = u16(buf, o, t.dport!);
  if (flags & T_ICMP_ID) o = u16(buf, o, t.icmpId!);
  if (flags & T_ICMP_TYPE) buf[o++] = t.icmpType!;
  if (flags & T_ICMP_CODE) buf[o++] = t.icmpCode!;
  return o;
}

/** Writes `e` at `o` (room for MAX_EVENT_BYTES assumed) and returns the end offset. */
export function writeEntry(buf: Buffer, o: number, e: ConntrackEntry): number {
  const tcp = e.tcp;
  const flags = (e.timeout !== undefined ? E_TIMEOUT : 0) | (e.mark !== undefined ? E_MARK : 0) |
    (e.zone !== undefined ? E_ZONE : 0) | (tcp ? E_TCP : 0) | (e.id !== undefined ? E_ID : 0);
  buf[o++] = flags;
  o = u32(buf, o, e.status);
  o = writeTuple(buf, o, e.orig);
  o = writeTuple(buf, o, e.reply);
  if (flags & E_TIMEOUT) o = u32(buf, o, e.timeout!);
  if (flags & E_MARK) o = u32(buf, o, e.mark!);
  if (flags & E_ZONE) o = u16(buf, o, e.zone!);
  if (tcp) {
    buf[o++] = tcp.state;
    const p = (tcp.wscaleOrig !== undefined ? P_WS_ORIG : 0) | (tcp.wscaleReply !== undefined ? P_WS_REPLY : 0) |
      (tcp.flagsOrig !== undefined ? P_FL_ORIG : 0) | (tcp.flagsReply !== undefined ? P_FL_REPLY : 0);
    buf[o++] = p;
    if (p & P_WS_ORIG) buf[o++] = tcp.wscaleOrig!;
    if (p & P_WS_REPLY) buf[o++] = tcp.wscaleReply!;
    // TCP flags are the kernel's {flags, mask} pair, hence 16 bits.
    if (p & P_FL_ORIG) o = u16(buf, o, tcp.flagsOrig!);
    if (p & P_FL_REPLY) o = u16(buf, o, tcp.flagsReply!);
  }
  if (flags & E_ID) o = u32(buf, o, e.id!);
  return o;
}

/** An event already in wire form (see event-transcode.ts): the owner's fast path. */
export interface EncodedEvent {
  type: ConntrackEventType;
  /** The original tuple's bytes as a string: coalesces events of one flow. */
  key: string;
  /** The entry as writeEntry writes it (without the event type byte). */
  bytes: Buffer;
}

/** What a SyncSender queues: decoded events, or events already encoded. */
export type SyncEvent = ConntrackEvent | EncodedEvent;

export function isEncoded(ev: SyncEvent): ev is EncodedEvent {
  return (ev as EncodedEvent).bytes !== undefined;
}

/** The same event with another type (the entry is shared, not copied). */
export function withType(ev: SyncEvent, type: ConntrackEventType): SyncEvent {
  if (ev.type === type) return ev;
  return isEncoded(ev) ? { type, key: ev.key, bytes: ev.bytes } : { type, entry: ev.entry };
}

/** writeEvent for either form. */
export function writeSyncEvent(buf: Buffer, o: number, ev: SyncEvent): number {
  if (!isEncoded(ev)) return writeEvent(buf, o, ev);
  const code = EV_CODE[ev.type];
  if (code === undefined) throw new CodecError(`event type '${ev.type}'`);
  if (ev.bytes.length + 1 > MAX_EVENT_BYTES) throw new CodecError(`encoded entry of ${ev.bytes.length} bytes`);
  buf[o] = code;
  ev.bytes.copy(buf, o + 1);
  return o + 1 + ev.bytes.length;
}

export function writeEvent(buf: Buffer, o: number, ev: ConntrackEvent): number {
  const code = EV_CODE[ev.type];
  if (code === undefined) throw new CodecError(`event type '${ev.type}'`);
  buf[o] = code;
  return writeEntry(buf, o + 1, ev.entry);
}

/** A bounds-checked read position in a payload. */
export class Cursor {
  constructor(readonly buf: Buffer, public off = 0, readonly end = buf.length) {}

  need(n: number): void {
    if (this.off + n > this.end) throw new CodecError(`payload truncated at byte ${this.off}`);
  }
  u8(): number {
    this.need(1);
    return this.buf[this.off++];
  }
  u16(): number {
    this.need(2);
    const v = (this.buf[this.off] << 8) | this.buf[this.off + 1];
    this.off += 2;
    return v;
  }
  u32(): number {
    this.need(4);
    const v = this.buf.readUInt32BE(this.off);
    this.off += 4;
    return v;
  }
  done(): void {
    if (this.off !== this.end) throw new CodecError(`${this.end - this.off} bytes after the payload`);
  }
}

function readAddr(c: Cursor, v6: boolean): string {
  const o = c.off;
  c.need(v6 ? 16 : 4);
  c.off += v6 ? 16 : 4;
  return v6 ? formatV6(c.buf, o) : formatV4(c.buf, o);
}

function readTuple(c: Cursor): CtTuple {
  const flags = c.u8();
  if (flags & ~63) throw new CodecError(`tuple flags ${flags}`);
  const v6 = (flags & T_V6) !== 0;
  const t: CtTuple = { family: v6 ? 6 : 4, proto: c.u8(), src: readAddr(c, v6), dst: readAddr(c, v6) };
  if (flags & T_SPORT) t.sport = c.u16();
  if (flags & T_DPORT) t.dport = c.u16();
  if (flags & T_ICMP_ID) t.icmpId = c.u16();
  if (flags & T_ICMP_TYPE) t.icmpType = c.u8();
  if (flags & T_ICMP_CODE) t.icmpCode = c.u8();
  return t;
}

export function readEntry(c: Cursor): ConntrackEntry {
  const flags = c.u8();
  if (flags & ~31) throw new CodecError(`entry flags ${flags}`);
  const e: ConntrackEntry = { status: c.u32(), orig: readTuple(c), reply: readTuple(c) };
  if (flags & E_TIMEOUT) e.timeout = c.u32();
  if (flags & E_MARK) e.mark = c.u32();
  if (flags & E_ZONE) e.zone = c.u16();
  if (flags & E_TCP) {
    const tcp: ConntrackEntry['tcp'] = { state: c.u8() };
    const p = c.u8();
    if (p & ~15) throw new CodecError(`tcp flags ${p}`);
    if (p & P_WS_ORIG) tcp.wscaleOrig = c.u8();
    if (p & P_WS_REPLY) tcp.wscaleReply = c.u8();
    if (p & P_FL_ORIG) tcp.flagsOrig = c.u16();
    if (p & P_FL_REPLY) tcp.flagsReply = c.u16();
    e.tcp = tcp;
  }
  if (flags & E_ID) e.id = c.u32();
  return e;
}

export function readEvent(c: Cursor): ConntrackEvent {
  const code = c.u8();
  const type = EV_TYPES[code];
  if (!type) throw new CodecError(`event type ${code}`);
  return { type, entry: readEntry(c) };
}

/**
 * Writes a count-prefixed list at `o`: items from `items[from]` on while they fit under `limit` bytes
 * and `max` items. An item that cannot be encoded is skipped and reported, so one bad entry from the
 * kernel side cannot wedge the stream. Returns the end offset and how many items were consumed.
 */
export function writeList<T>(
  buf: Buffer, o: number, limit: number, items: readonly T[], from: number, max: number,
  write: (buf: Buffer, o: number, item: T) => number, onBad: (item: T, e: Error) => void,
): { end: number; next: number; count: number } {
  const countAt = o;
  o += 4;
  let i = from;
  let count = 0;
  while (i < items.length && count < max && o + MAX_EVENT_BYTES <= limit) {
    try {
      o = write(buf, o, items[i]);
      count++;
    } catch (e) {
      onBad(items[i], e as Error);
    }
    i++;
  }
  u32(buf, countAt, count);
  return { end: o, next: i, count };
}

/** Reads a count-prefixed list that must fill the payload exactly; at most `max` items. */
export function readList<T>(payload: Buffer, max: number, read: (c: Cursor) => T): T[] {
  const c = new Cursor(payload);
  const n = c.u32();
  if (n > max) throw new CodecError(`${n} items, over the limit of ${max}`);
  // Each item takes at least 12 bytes, so a lying count is caught before the loop allocates much.
  if (n * 12 > payload.length) throw new CodecError(`${n} items cannot fit in ${payload.length} bytes`);
  const out: T[] = new Array(n);
  for (let i = 0; i < n; i++) out[i] = read(c);
  c.done();
  return out;
}

/** Length of the wire tuple at buf[o], checked against `end`, with its flags validated as readTuple does. */
function skipTuple(buf: Buffer, o: number, end: number): number {
  if (o + 2 > end) throw new CodecError(`payload truncated at byte ${o}`);
  const f = buf[o];
  if (f & ~63) throw new CodecError(`tuple flags ${f}`);
  const addr = f & T_V6 ? 16 : 4;
  const n = 2 + 2 * addr + (f & T_SPORT ? 2 : 0) + (f & T_DPORT ? 2 : 0) + (f & T_ICMP_ID ? 2 : 0) + (f & T_ICMP_TYPE ? 1 : 0) + (f & T_ICMP_CODE ? 1 : 0);
  if (o + n > end) throw new CodecError(`payload truncated at byte ${o}`);
  return o + n;
}

/**
 * Where the wire entry at buf[o] ends, checking everything readEntry checks (bounds, flag bits) without
 * building anything. Throws CodecError.
 */
export function skipEntry(buf: Buffer, o: number, end: number): number {
  if (o + 5 > end) throw new CodecError(`payload truncated at byte ${o}`);
  const flags = buf[o];
  if (flags & ~31) throw new CodecError(`entry flags ${flags}`);
  const origFlags = buf[o + 5];
  o = skipTuple(buf, o + 5, end);
  // Both tuples of one family (a kernel entry always is): table-wire.ts relies on it.
  if (o < end && (buf[o] & T_V6) !== (origFlags & T_V6)) throw new CodecError('tuples of two address families');
  o = skipTuple(buf, o, end);
  o += (flags & E_TIMEOUT ? 4 : 0) + (flags & E_MARK ? 4 : 0) + (flags & E_ZONE ? 2 : 0);
  if (flags & E_TCP) {
    if (o + 2 > end) throw new CodecError(`payload truncated at byte ${o}`);
    const p = buf[o + 1];
    if (p & ~15) throw new CodecError(`tcp flags ${p}`);
    o += 2 + (p & P_WS_ORIG ? 1 : 0) + (p & P_WS_REPLY ? 1 : 0) + (p & P_FL_ORIG ? 2 : 0) + (p & P_FL_REPLY ? 2 : 0);
  }
  if (flags & E_ID) o += 4;
  if (o > end) throw new CodecError(`payload truncated at byte ${end}`);
  return o;
}

/**
 * A received list payload (EVENTS or RESYNC_CHUNK), validated in full but not decoded: the offset of each
 * item's entry in the payload, and for events its type. Consumers read the entries' bytes in place
 * (table-wire.ts writes them into ctnetlink messages, EntryStore keeps them) or decode them on demand.
 * The same checks as readList with readEvent/readEntry, so a garbled payload is refused before any of it
 * is applied.
 */
export class WireList {
  private constructor(
    readonly payload: Buffer,
    readonly count: number,
    /** Start of each item's entry (after the type byte for events); offsets[count] is the payload's end. */
    readonly offsets: Uint32Array,
    /** Event type codes (0 new, 1 update, 2 destroy), or undefined for a transfer's entries. */
    readonly types: Uint8Array | undefined,
  ) {}

  static parse(payload: Buffer, max: number, events: boolean): WireList {
    if (payload.length < 4) throw new CodecError(`payload truncated at byte 0`);
    const n = payload.readUInt32BE(0);
    if (n > max) throw new CodecError(`${n} items, over the limit of ${max}`);
    // Each item takes at least 12 bytes, so a lying count is caught before anything is sized from it.
    if (n * 12 > payload.length) throw new CodecError(`${n} items cannot fit in ${payload.length} bytes`);
    const offsets = new Uint32Array(n + 1);
    const types = events ? new Uint8Array(n) : undefined;
    const end = payload.length;
    let o = 4;
    for (let i = 0; i < n; i++) {
      if (types) {
        if (o >= end) throw new CodecError(`payload truncated at byte ${o}`);
        const code = payload[o++];
        if (code > 2) throw new CodecError(`event type ${code}`);
        types[i] = code;
      }
      offsets[i] = o;
      o = skipEntry(payload, o, end);
    }
    if (o !== end) throw new CodecError(`${end - o} bytes after the payload`);
    offsets[n] = o;
    return new WireList(payload, n, offsets, types);
  }

  /** Length in bytes of entry i (the next event's type byte is not part of it). */
  len(i: number): number {
    return (this.types && i + 1 < this.count ? this.offsets[i + 1] - 1 : this.offsets[i + 1]) - this.offsets[i];
  }

  /** The type of event i. */
  type(i: number): ConntrackEventType {
    return EV_TYPES[this.types ? this.types[i] : 0];
  }

  /** Entry i, decoded. */
  entry(i: number): ConntrackEntry {
    return readEntry(new Cursor(this.payload, this.offsets[i], this.offsets[i] + this.len(i)));
  }

  /** All items as decoded events (a transfer's entries count as 'new'). */
  events(): ConntrackEvent[] {
    const out: ConntrackEvent[] = new Array(this.count);
    for (let i = 0; i < this.count; i++) out[i] = { type: this.type(i), entry: this.entry(i) };
    return out;
  }

  /** All entries, decoded. */
  entries(): ConntrackEntry[] {
    const out: ConntrackEntry[] = new Array(this.count);
    for (let i = 0; i < this.count; i++) out[i] = this.entry(i);
    return out;
  }
}

/**
 * Entries already in wire form, back to back in one buffer (a transfer's snapshot read straight from a
 * dump: dumpScopeEncoded), with the offset of each: no object per entry. `add` reserves room for one
 * entry, the caller writes it there, `commit` records where it ended.
 */
export class EncodedEntries {
  buf: Buffer;
  used = 0;
  count = 0;
  offsets: Uint32Array;

  constructor(expected = 1024) {
    this.buf = Buffer.allocUnsafe(Math.max(4096, expected * 48));
    this.offsets = new Uint32Array(expected + 1);
  }

  /** Room for one more entry: write it at buf[used]. */
  reserve(): void {
    if (this.used + MAX_EVENT_BYTES > this.buf.length) {
      const bigger = Buffer.allocUnsafe(this.buf.length * 2);
      this.buf.copy(bigger, 0, 0, this.used);
      this.buf = bigger;
    }
    if (this.count + 2 > this.offsets.length) {
      const bigger = new Uint32Array(this.offsets.length * 2);
      bigger.set(this.offsets);
      this.offsets = bigger;
    }
  }

  /** The entry written at buf[used] ends at `end`. */
  commit(end: number): void {
    this.offsets[this.count] = this.used;
    this.used = end;
    this.count++;
    this.offsets[this.count] = end;
  }

  /** Appends a copy of the entry at src[off, off + len). */
  append(src: Buffer, off: number, len: number): void {
    this.reserve();
    for (let i = 0; i < len; i++) this.buf[this.used + i] = src[off + i];
    this.commit(this.used + len);
  }

  /** Entry i, decoded. */
  entry(i: number): ConntrackEntry {
    return readEntry(new Cursor(this.buf, this.offsets[i], this.offsets[i + 1]));
  }

  /** Every entry, decoded. */
  entries(): ConntrackEntry[] {
    const out: ConntrackEntry[] = new Array(this.count);
    for (let i = 0; i < this.count; i++) out[i] = this.entry(i);
    return out;
  }
}
