// A peer's synced entries kept in memory in their sync wire form (entry-codec.ts), as conntrackd keeps a
// peer's entries in its external cache: one byte slab and an open-addressing index in typed arrays, keyed
// by the entry's identity (original tuple and zone), with no object per entry. Events and transfers are
// applied straight from a received WireList; entries are decoded only when read back.
import type { ConntrackEntry } from '../conntrack/types';
import { inBucketsByHash, keyHashInto, lastKeyLo, type BucketSet, type KeySet } from './digest';
import { Cursor, E_MARK, E_TIMEOUT, E_ZONE, readEntry, T_DPORT, T_ICMP_CODE, T_ICMP_ID, T_ICMP_TYPE, T_SPORT, T_V6, type WireList } from './entry-codec';

const EMPTY = -1;
const GONE = -2;
const DESTROY = 2;

function tupleBytes(buf: Buffer, o: number): number {
  const f = buf[o];
  const addr = f & T_V6 ? 16 : 4;
  return 2 + 2 * addr + (f & T_SPORT ? 2 : 0) + (f & T_DPORT ? 2 : 0) + (f & T_ICMP_ID ? 2 : 0) + (f & T_ICMP_TYPE ? 1 : 0) + (f & T_ICMP_CODE ? 1 : 0);
}

/** The zone of the wire entry at buf[o] (0 when absent). */
function zoneOf(buf: Buffer, o: number): number {
  const flags = buf[o];
  if (!(flags & E_ZONE)) return 0;
  let q = o + 5;
  q += tupleBytes(buf, q);
  q += tupleBytes(buf, q);
  q += (flags & E_TIMEOUT ? 4 : 0) + (flags & E_MARK ? 4 : 0);
  return (buf[q] << 8) | buf[q + 1];
}

export class EntryStore {
  /** Records: u16 length, then the entry's bytes. */
  private slab = Buffer.allocUnsafe(1 << 20);
  private used = 0;
  /** Slab bytes of replaced or deleted records. */
  private garbage = 0;
  /** Per index slot: record offset in the slab, EMPTY or GONE; and the key's hash. */
  private pos: Int32Array;
  private hash: Uint32Array;
  private mask: number;
  /** Slots holding an entry or a GONE marker. */
  private filled = 0;
  /** Entries held. */
  size = 0;

  constructor(expected = 1024) {
    let cap = 16;
    while (cap < expected * 2) cap *= 2;
    this.pos = new Int32Array(cap).fill(EMPTY);
    this.hash = new Uint32Array(cap);
    this.mask = cap - 1;
  }

  /** Bytes held: slab and index. */
  get bytes(): number {
    return this.slab.length + this.pos.byteLength + this.hash.byteLength;
  }

  /** Creates or replaces the entry at buf[off, off + len). */
  upsert(buf: Buffer, off: number, len: number): void {
    const h = this.keyHash(buf, off);
    const i = this.find(buf, off, h);
    if (i >= 0) {
      const at = this.pos[i];
      const old = this.slab.readUInt16LE(at);
      if (len === old) {
        for (let k = 0; k < len; k++) this.slab[at + 2 + k] = buf[off + k];
        return;
      }
      this.garbage += 2 + old;
      this.pos[i] = this.append(buf, off, len);
      return;
    }
    if ((this.filled + 1) * 2 > this.mask + 1) this.rehash();
    const at = this.append(buf, off, len);
    for (let j = h & this.mask; ; j = (j + 1) & this.mask) {
      const p = this.pos[j];
      if (p === EMPTY || p === GONE) {
        if (p === EMPTY) this.filled++;
        this.pos[j] = at;
        this.hash[j] = h;
        break;
      }
    }
    this.size++;
  }

  /** Deletes the entry with the identity of the one at buf[off]; false when none was held. */
  delete(buf: Buffer, off: number): boolean {
    const i = this.find(buf, off, this.keyHash(buf, off));
    if (i < 0) return false;
    this.garbage += 2 + this.slab.readUInt16LE(this.pos[i]);
    this.pos[i] = GONE;
    this.size--;
    if (this.garbage > (1 << 20) && this.garbage > this.used - this.garbage) this.compact();
    return true;
  }

  /** A received EVENTS list: destroy deletes, new and update create or replace. */
  applyEvents(list: WireList): void {
    const { payload, offsets, types } = list;
    for (let i = 0; i < list.count; i++) {
      if (types && types[i] === DESTROY) this.delete(payload, offsets[i]);
      else this.upsert(payload, offsets[i], list.len(i));
    }
  }

  /** A received transfer chunk: every entry created or replaced. */
  upsertAll(list: WireList): void {
    const { payload, offsets } = list;
    for (let i = 0; i < list.count; i++) this.upsert(payload, offsets[i], list.len(i));
  }

  /**
   * The end of a transfer held here: deletes the entries in `buckets` whose key hash the transfer did not
   * carry (receiver.ts). Returns how many went.
   */
  sweep(keep: KeySet, buckets: BucketSet): number {
    const gone: number[] = [];
    for (let i = 0; i <= this.mask; i++) {
      const at = this.pos[i];
      if (at < 0) continue;
      const hi = keyHashInto(this.slab, at + 2);
      const lo = lastKeyLo();
      if (inBucketsByHash(buckets, lo) && !keep.has(hi, lo)) gone.push(i);
    }
    for (const i of gone) {
      this.garbage += 2 + this.slab.readUInt16LE(this.pos[i]);
      this.pos[i] = GONE;
      this.size--;
    }
    if (this.garbage > (1 << 20) && this.garbage > this.used - this.garbage) this.compact();
    return gone.length;
  }

  /** Calls fn with each entry's bytes (valid during the call only). */
  forEachBytes(fn: (buf: Buffer, off: number, len: number) => void): void {
    for (let i = 0; i <= this.mask; i++) {
      const at = this.pos[i];
      if (at >= 0) fn(this.slab, at + 2, this.slab.readUInt16LE(at));
    }
  }

  /** Every entry, decoded. */
  entries(): ConntrackEntry[] {
    const out: ConntrackEntry[] = [];
    this.forEachBytes((b, o, n) => out.push(readEntry(new Cursor(b, o, o + n))));
    return out;
  }

  clear(): void {
    this.pos.fill(EMPTY);
    this.used = this.garbage = this.filled = this.size = 0;
  }

  /** FNV-1a of the original tuple's bytes and the zone. */
  private keyHash(buf: Buffer, off: number): number {
    const t = off + 5;
    const n = tupleBytes(buf, t);
    let h = 0x811c9dc5;
    for (let i = 0; i < n; i++) h = Math.imul(h ^ buf[t + i], 0x01000193);
    const z = zoneOf(buf, off);
    h = Math.imul(h ^ (z & 0xff), 0x01000193);
    h = Math.imul(h ^ (z >>> 8), 0x01000193);
    return h >>> 0;
  }

  /** The index slot holding the entry with the identity of the one at buf[off], or -1. */
  private find(buf: Buffer, off: number, h: number): number {
    const slab = this.slab;
    const t = off + 5;
    const n = tupleBytes(buf, t);
    for (let j = h & this.mask; ; j = (j + 1) & this.mask) {
      const at = this.pos[j];
      if (at === EMPTY) return -1;
      if (at === GONE || this.hash[j] !== h) continue;
      // Same hash: compare the original tuples byte for byte, then the zones.
      const s = at + 2 + 5;
      let same = true;
      for (let i = 0; i < n; i++) {
        if (slab[s + i] !== buf[t + i]) {
          same = false;
          break;
        }
      }
      if (same && zoneOf(slab, at + 2) === zoneOf(buf, off)) return j;
    }
  }

  private append(buf: Buffer, off: number, len: number): number {
    if (this.used + 2 + len > this.slab.length) {
      if (this.garbage > this.used / 2) this.compact();
      if (this.used + 2 + len > this.slab.length) {
        const bigger = Buffer.allocUnsafe(Math.max(this.slab.length * 2, this.used + 2 + len));
        this.slab.copy(bigger, 0, 0, this.used);
        this.slab = bigger;
      }
    }
    const at = this.used;
    this.slab.writeUInt16LE(len, at);
    for (let i = 0; i < len; i++) this.slab[at + 2 + i] = buf[off + i];
    this.used += 2 + len;
    return at;
  }

  /** Rewrites the slab with live records only. */
  private compact(): void {
    const old = this.slab;
    const slab = Buffer.allocUnsafe(Math.max(1 << 20, this.used - this.garbage) * 2);
    let used = 0;
    for (let i = 0; i <= this.mask; i++) {
      const at = this.pos[i];
      if (at < 0) continue;
      const n = 2 + old.readUInt16LE(at);
      old.copy(slab, used, at, at + n);
      this.pos[i] = used;
      used += n;
    }
    this.slab = slab;
    this.used = used;
    this.garbage = 0;
  }

  /** A bigger index (or the same size, rid of GONE markers). */
  private rehash(): void {
    const pos = this.pos, hash = this.hash;
    const cap = this.size * 4 > this.mask + 1 ? (this.mask + 1) * 2 : this.mask + 1;
    this.pos = new Int32Array(cap).fill(EMPTY);
    this.hash = new Uint32Array(cap);
    this.mask = cap - 1;
    this.filled = 0;
    for (let i = 0; i < pos.length; i++) {
      if (pos[i] < 0) continue;
      for (let j = hash[i] & this.mask; ; j = (j + 1) & this.mask) {
        if (this.pos[j] === EMPTY) {
          this.pos[j] = pos[i];
          this.hash[j] = hash[i];
          this.filled++;
          break;
        }
      }
    }
  }
}
