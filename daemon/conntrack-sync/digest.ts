// Anti-entropy for conntrack sync: per-entry 64-bit hashes, the table split into K buckets by its original
// tuple, order-independent bucket digests, and a compact set of key hashes for a transfer's mark-and-sweep.
//
// What counts: an entry is identified by its original tuple (the bucket and the sweep key come from that
// alone, so a changed entry stays in its bucket), and its digest hash covers what a standby must have the
// same to carry the flow: original and reply tuples (the NAT mapping), zone and TCP state. Timeouts,
// counters, status bits and the kernel id are left out: they move on the owner without events (or are
// local), and would make every bucket differ at every check.
//
// A bucket digest is (count, XOR of the entries' 64-bit hashes): independent of order, cheap to build from
// one pass over a dump, 12 bytes per bucket on the wire. Keys in a table are unique, so XOR never cancels
// an entry against itself.
import type { ConntrackEntry, CtTuple } from '../conntrack/types';
import { formatV6, v6ZeroRun } from '../../lib/ip';
import { CodecError, Cursor } from './entry-codec';

/** Buckets per stream unless configured: 12 KiB of digests per check, ~1,000 entries a bucket at 1M. */
export const DEFAULT_BUCKETS = 1024;
export const MAX_BUCKETS = 65536;
export const DIGEST_BYTES = 12;

function tupleText(t: CtTuple): string {
  return `${t.family}/${t.proto}/${t.src}/${t.sport ?? t.icmpId ?? ''}/${t.dst}/${t.dport ?? ''}/${t.icmpType ?? ''}/${t.icmpCode ?? ''}`;
}

// Two independent 32-bit string hashes (FNV-1a and a multiply-rotate mix with another seed) make 64 bits.
function fnv(s: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < s.length; i++) h = Math.imul(h ^ s.charCodeAt(i), 0x01000193);
  return h >>> 0;
}
function mix(s: string): number {
  let h = 0x9747b28c;
  for (let i = 0; i < s.length; i++) {
    h = Math.imul(h ^ s.charCodeAt(i), 0x5bd1e995);
    h ^= h >>> 15;
  }
  h = Math.imul(h ^ (h >>> 13), 0xc2b2ae35);
  return (h ^ (h >>> 16)) >>> 0;
}

/** The 64-bit key hash (hi, lo) of an entry's identity: its original tuple and zone. */
export function keyHash(e: Pick<ConntrackEntry, 'orig' | 'zone'>): [number, number] {
  const s = `${tupleText(e.orig)}#${e.zone ?? 0}`;
  return [fnv(s), mix(s)];
}

/** The bucket of an entry among k. */
export function bucketOf(e: Pick<ConntrackEntry, 'orig' | 'zone'>, k: number): number {
  return mix(`${tupleText(e.orig)}#${e.zone ?? 0}`) % k;
}

/** The 64-bit digest hash (hi, lo) of the fields that matter (see the header). */
export function entryHash(e: ConntrackEntry): [number, number] {
  const s = `${tupleText(e.orig)}>${tupleText(e.reply)}#${e.zone ?? 0}#${e.tcp?.state ?? ''}`;
  return [fnv(s), mix(s)];
}

// keyHash straight from an entry's wire bytes (entry-codec.ts): the same characters of the same text fed
// to both hashes as they are produced, with no string and no objects (a transfer hashes every entry).
let fh = 0, mh = 0;
function feed(c: number): void {
  fh = Math.imul(fh ^ c, 0x01000193);
  mh = Math.imul(mh ^ c, 0x5bd1e995);
  mh ^= mh >>> 15;
}
function feedNum(v: number): void {
  if (v >= 10) feedNum(Math.floor(v / 10));
  feed(48 + (v % 10));
}
function feedText(s: string): void {
  for (let i = 0; i < s.length; i++) feed(s.charCodeAt(i));
}
/** A group's hex digits, lower case, no leading zeros (as formatV6 writes it). */
function feedHex(v: number): void {
  if (v >= 16) feedHex(v >>> 4);
  const d = v & 15;
  feed(d < 10 ? 48 + d : 87 + d);
}
/**
 * The characters formatV6 writes for buf[o..o+16], fed without building the string: a transfer hashes two
 * addresses per entry, and the string was most of what an IPv6 entry cost more than an IPv4 one here.
 */
function feedV6(buf: Buffer, o: number): void {
  const { best, bestLen, dotted } = v6ZeroRun(buf, o);
  // IPv4-compatible and IPv4-mapped addresses end in a dotted quad: rare, and formatV6 says how.
  if (dotted) return feedText(formatV6(buf, o));
  let sep = false;
  for (let i = 0; i < 8; i++) {
    if (i === best) {
      feed(58);
      feed(58);
      sep = false;
      i += bestLen - 1;
      continue;
    }
    if (sep) feed(58);
    feedHex((buf[o + 2 * i] << 8) | buf[o + 2 * i + 1]);
    sep = true;
  }
}
function feedAddr(buf: Buffer, o: number, v6: boolean): void {
  if (v6) return feedV6(buf, o);
  feedNum(buf[o]);
  feed(46);
  feedNum(buf[o + 1]);
  feed(46);
  feedNum(buf[o + 2]);
  feed(46);
  feedNum(buf[o + 3]);
}

/** The 64-bit key hash of the wire entry at buf[o] (validated: see WireList), as keyHash of it decoded. */
export function keyHashAt(buf: Buffer, o: number): [number, number] {
  keyHashInto(buf, o);
  return [fh >>> 0, keyLo];
}

let keyLo = 0;
/** keyHashAt without the array: returns hi; the low half is then in `lastKeyLo()`. */
export function keyHashInto(buf: Buffer, o: number): number {
  fh = 0x811c9dc5;
  mh = 0x9747b28c;
  const flags = buf[o];
  let t = o + 5;
  // The original tuple as tupleText writes it.
  const f = buf[t];
  const v6 = (f & 1) !== 0;
  const al = v6 ? 16 : 4;
  feed(v6 ? 54 : 52);
  feed(47);
  feedNum(buf[t + 1]);
  feed(47);
  feedAddr(buf, t + 2, v6);
  feed(47);
  let q = t + 2 + 2 * al;
  let sport = -1, dport = -1, icmpId = -1, icmpType = -1, icmpCode = -1;
  if (f & 2) { sport = (buf[q] << 8) | buf[q + 1]; q += 2; }
  if (f & 4) { dport = (buf[q] << 8) | buf[q + 1]; q += 2; }
  if (f & 8) { icmpId = (buf[q] << 8) | buf[q + 1]; q += 2; }
  if (f & 16) icmpType = buf[q++];
  if (f & 32) icmpCode = buf[q++];
  if (sport >= 0) feedNum(sport);
  else if (icmpId >= 0) feedNum(icmpId);
  feed(47);
  feedAddr(buf, t + 2 + al, v6);
  feed(47);
  if (dport >= 0) feedNum(dport);
  feed(47);
  if (icmpType >= 0) feedNum(icmpType);
  feed(47);
  if (icmpCode >= 0) feedNum(icmpCode);
  // Then '#' and the zone (0 when absent).
  feed(35);
  let zone = 0;
  if (flags & 4) {
    // Past the reply tuple, the timeout and the mark.
    const r = q;
    const rf = buf[r];
    const ral = rf & 1 ? 16 : 4;
    let z = r + 2 + 2 * ral + (rf & 2 ? 2 : 0) + (rf & 4 ? 2 : 0) + (rf & 8 ? 2 : 0) + (rf & 16 ? 1 : 0) + (rf & 32 ? 1 : 0);
    z += (flags & 1 ? 4 : 0) + (flags & 2 ? 4 : 0);
    zone = (buf[z] << 8) | buf[z + 1];
  }
  feedNum(zone);
  let h = Math.imul(mh ^ (mh >>> 13), 0xc2b2ae35);
  keyLo = (h ^ (h >>> 16)) >>> 0;
  h = fh >>> 0;
  return h;
}

/** The low half of the last keyHashInto. */
export function lastKeyLo(): number {
  return keyLo;
}

export function checkBuckets(k: number): void {
  if (!Number.isInteger(k) || k < 1 || k > MAX_BUCKETS) throw new RangeError(`bucket count ${k}: must be 1..${MAX_BUCKETS}`);
}

/** Per-bucket (count, XOR hi, XOR lo) of a set of entries. */
export class Digests {
  readonly count: Uint32Array;
  readonly hi: Uint32Array;
  readonly lo: Uint32Array;

  constructor(readonly k: number) {
    checkBuckets(k);
    this.count = new Uint32Array(k);
    this.hi = new Uint32Array(k);
    this.lo = new Uint32Array(k);
  }

  static of(entries: Iterable<ConntrackEntry>, k: number): Digests {
    const d = new Digests(k);
    for (const e of entries) d.add(e);
    return d;
  }

  add(e: ConntrackEntry): void {
    const b = bucketOf(e, this.k);
    const [h, l] = entryHash(e);
    this.count[b]++;
    this.hi[b] ^= h;
    this.lo[b] ^= l;
  }

  get entries(): number {
    let n = 0;
    for (let i = 0; i < this.k; i++) n += this.count[i];
    return n;
  }

  /** Buckets whose digest differs from `other`'s (same k). */
  diff(other: Digests): number[] {
    if (other.k !== this.k) throw new RangeError(`digests of ${this.k} and ${other.k} buckets`);
    const out: number[] = [];
    for (let i = 0; i < this.k; i++) {
      if (this.count[i] !== other.count[i] || this.hi[i] !== other.hi[i] || this.lo[i] !== other.lo[i]) out.push(i);
    }
    return out;
  }

  /** Wire form: u32 k, then k × (u32 count, u32 hi, u32 lo). */
  write(buf: Buffer, o: number): number {
    o = buf.writeUInt32BE(this.k, o);
    for (let i = 0; i < this.k; i++) {
      o = buf.writeUInt32BE(this.count[i], o);
      o = buf.writeUInt32BE(this.hi[i], o);
      o = buf.writeUInt32BE(this.lo[i], o);
    }
    return o;
  }

  get wireBytes(): number {
    return 4 + this.k * DIGEST_BYTES;
  }

  static read(payload: Buffer): Digests {
    const c = new Cursor(payload);
    const k = c.u32();
    if (k < 1 || k > MAX_BUCKETS) throw new CodecError(`digest of ${k} buckets (1..${MAX_BUCKETS})`);
    if (payload.length !== 4 + k * DIGEST_BYTES) throw new CodecError(`digest of ${k} buckets in ${payload.length} bytes`);
    const d = new Digests(k);
    for (let i = 0; i < k; i++) {
      d.count[i] = c.u32();
      d.hi[i] = c.u32();
      d.lo[i] = c.u32();
    }
    c.done();
    return d;
  }
}

/** A set of buckets out of k (a partial transfer), or every bucket (a full one). */
export interface BucketSet {
  k: number;
  /** Sorted, unique; undefined = all of them. */
  list?: number[];
}

export function inBuckets(set: BucketSet, e: Pick<ConntrackEntry, 'orig' | 'zone'>): boolean {
  if (!set.list) return true;
  return bucketSetHas(set, bucketOf(e, set.k));
}

/** inBuckets for an entry whose key hash's low half (keyHash, keyHashInto) is `lo`. */
export function inBucketsByHash(set: BucketSet, lo: number): boolean {
  if (!set.list) return true;
  return bucketSetHas(set, lo % set.k);
}

const lookups = new WeakMap<BucketSet, Uint8Array>();
function bucketSetHas(set: BucketSet, b: number): boolean {
  let m = lookups.get(set);
  if (!m) {
    m = new Uint8Array(set.k);
    for (const x of set.list!) m[x] = 1;
    lookups.set(set, m);
  }
  return m[b] === 1;
}

/** Wire form: u32 k, u32 n, n × u32 (n = 0: all buckets). */
export function writeBucketSet(buf: Buffer, o: number, set: BucketSet): number {
  o = buf.writeUInt32BE(set.k, o);
  const list = set.list ?? [];
  o = buf.writeUInt32BE(list.length, o);
  for (const b of list) o = buf.writeUInt32BE(b, o);
  return o;
}

export function bucketSetBytes(set: BucketSet): number {
  return 8 + 4 * (set.list?.length ?? 0);
}

export function readBucketSet(c: Cursor): BucketSet {
  const k = c.u32();
  if (k < 1 || k > MAX_BUCKETS) throw new CodecError(`bucket count ${k} (1..${MAX_BUCKETS})`);
  const n = c.u32();
  if (n === 0) return { k };
  if (n > k) throw new CodecError(`${n} buckets listed out of ${k}`);
  const list: number[] = [];
  for (let i = 0; i < n; i++) {
    const b = c.u32();
    if (b >= k) throw new CodecError(`bucket ${b} out of ${k}`);
    if (i > 0 && b <= list[i - 1]) throw new CodecError('bucket list not sorted and unique');
    list.push(b);
  }
  return { k, list };
}

/**
 * A set of 64-bit key hashes in an open-addressing table of u32 pairs: what a transfer carried, for the
 * sweep at its end. 8 bytes a key at most 50 % full: 1M entries hold under 32 MiB, no objects per key.
 * (hi, lo) = (0, 0) is the empty slot marker, so that one key is remembered apart.
 */
export class KeySet {
  private slots: Uint32Array;
  private mask: number;
  private zero = false;
  size = 0;

  constructor(expected = 1024) {
    let cap = 16;
    while (cap < expected * 2) cap *= 2;
    this.slots = new Uint32Array(cap * 2);
    this.mask = cap - 1;
  }

  add(hi: number, lo: number): void {
    if (hi === 0 && lo === 0) {
      if (!this.zero) this.size++;
      this.zero = true;
      return;
    }
    if ((this.size + 1) * 2 > this.mask + 1) this.grow();
    if (this.put(this.slots, this.mask, hi, lo)) this.size++;
  }

  has(hi: number, lo: number): boolean {
    if (hi === 0 && lo === 0) return this.zero;
    const s = this.slots;
    for (let i = (lo ^ Math.imul(hi, 0x9e3779b1)) & this.mask; ; i = (i + 1) & this.mask) {
      const a = s[i * 2], b = s[i * 2 + 1];
      if (a === 0 && b === 0) return false;
      if (a === hi && b === lo) return true;
    }
  }

  get bytes(): number {
    return this.slots.byteLength;
  }

  private put(s: Uint32Array, mask: number, hi: number, lo: number): boolean {
    for (let i = (lo ^ Math.imul(hi, 0x9e3779b1)) & mask; ; i = (i + 1) & mask) {
      const a = s[i * 2], b = s[i * 2 + 1];
      if (a === hi && b === lo) return false;
      if (a === 0 && b === 0) {
        s[i * 2] = hi;
        s[i * 2 + 1] = lo;
        return true;
      }
    }
  }

  private grow(): void {
    const old = this.slots;
    const cap = (this.mask + 1) * 2;
    this.slots = new Uint32Array(cap * 2);
    this.mask = cap - 1;
    for (let i = 0; i < old.length; i += 2) if (old[i] !== 0 || old[i + 1] !== 0) this.put(this.slots, this.mask, old[i], old[i + 1]);
  }
}
