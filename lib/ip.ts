// IP addresses, IPv4 and IPv6 alike: text <-> network-order bytes (inet_pton / inet_ntop rules, so results
// compare equal to `ip -j` output), text <-> bigint, prefixes and block arithmetic, and MAC text for the
// same netlink and ARP messages. The text <-> bytes functions run per conntrack entry, per netlink dump
// entry and per load-balancer mapping, so they parse and print by character, without regular expressions,
// arrays or allocations.
import * as net from 'node:net';
import { IPv4, IPv4CidrRange, IPv4Prefix, IPv6, IPv6CidrRange, IPv6Prefix } from 'ip-num';

/** An address family by its version number. */
export type IpFamily = 4 | 6;

export function familyBits(f: IpFamily): number {
  return f === 4 ? 32 : 128;
}

/** host:port, the host in brackets when it is an IPv6 address ("[fd00:18::12]:3785"), as URLs write it. */
export function hostPort(host: string, port: number | string): string {
  return host.includes(':') ? `[${host}]:${port}` : `${host}:${port}`;
}

/** An address as a host prefix: /32 for IPv4, /128 for IPv6 (routes and addresses of one address). */
export function hostPrefix(address: string): string {
  return `${address}/${address.includes(':') ? 128 : 32}`;
}

/** Which family the text `s` is an address of, 0 for none (node:net's rules, zone suffix included). */
export function ipFamily(s: string): IpFamily | 0 {
  const v = net.isIP(s);
  return v === 4 || v === 6 ? v : 0;
}

// ---------------------------------------------------------------------------------------------------
// Text <-> bytes at an offset (the codecs' form: no Buffer of its own per address)

export class AddressError extends Error {
  constructor(text: string, family: IpFamily) {
    super(`'${text}' is not an IPv${family} address`);
    this.name = 'AddressError';
  }
}

/** Parses dotted-quad `s` from index `from` into 4 bytes at `o`; false when it isn't one. */
function parseV4(s: string, from: number, buf: Uint8Array, o: number): boolean {
  let part = 0, digits = 0, n = 0;
  for (let i = from; i <= s.length; i++) {
    const c = i < s.length ? s.charCodeAt(i) : 46; // the end closes the last part like a dot
    if (c === 46) {
      if (digits === 0 || part > 255 || n > 3) return false;
      buf[o + n++] = part;
      part = 0;
      digits = 0;
    } else if (c >= 48 && c <= 57 && digits < 3) {
      // A leading zero ("01") is refused, as inet_pton does.
      if (digits === 1 && part === 0) return false;
      part = part * 10 + (c - 48);
      digits++;
    } else return false;
  }
  return n === 4;
}

function hexVal(c: number): number {
  if (c >= 48 && c <= 57) return c - 48;
  if (c >= 97 && c <= 102) return c - 87;
  if (c >= 65 && c <= 70) return c - 55;
  return -1;
}

// Scratch space: everything here is synchronous, so one set is enough.
const G = new Uint16Array(8);
const V4 = Buffer.alloc(4);
const SCRATCH = Buffer.alloc(16);

/**
 * Writes dotted-quad `s` as 4 bytes at `o`; false (bytes at `o` undefined) unless `s` is four decimal parts
 * of 0 to 255 without leading zeros and nothing else, which is what inet_pton and net.isIPv4 accept.
 */
export function tryWriteV4(buf: Uint8Array, o: number, s: string): boolean {
  return parseV4(s, 0, buf, o);
}

/** Writes IPv6 text `s` (an embedded dotted quad allowed, no zone) as 16 bytes at `o`; false when it isn't one. */
export function tryWriteV6(buf: Uint8Array, o: number, s: string): boolean {
  const n = s.length;
  let i = 0, count = 0, gap = -1;
  if (n >= 2 && s.charCodeAt(0) === 58) {
    if (s.charCodeAt(1) !== 58) return false;
    gap = 0;
    i = 2;
  }
  while (i < n) {
    if (count === 8) return false;
    let v = 0, d = 0, j = i;
    for (; j < n; j++) {
      const h = hexVal(s.charCodeAt(j));
      if (h < 0) break;
      v = v * 16 + h;
      d++;
    }
    if (j < n && s.charCodeAt(j) === 46) {
      // Embedded dotted quad: the last 32 bits.
      if (count > 6 || !parseV4(s, i, V4, 0)) return false;
      G[count++] = (V4[0] << 8) | V4[1];
      G[count++] = (V4[2] << 8) | V4[3];
      break;
    }
    if (d === 0 || d > 4) return false;
    G[count++] = v;
    i = j;
    if (i === n) break;
    if (s.charCodeAt(i) !== 58) return false;
    i++;
    if (i < n && s.charCodeAt(i) === 58) {
      if (gap >= 0) return false;
      gap = count;
      i++;
    } else if (i === n) return false;
  }
  if (gap < 0 ? count !== 8 : count > 7) return false;
  const head = gap < 0 ? 8 : gap;
  const tail = gap < 0 ? 0 : count - gap;
  buf.fill(0, o, o + 16);
  for (let k = 0; k < head; k++) {
    buf[o + 2 * k] = G[k] >>> 8;
    buf[o + 2 * k + 1] = G[k];
  }
  for (let k = 0; k < tail; k++) {
    const at = o + 2 * (8 - tail + k);
    buf[at] = G[gap + k] >>> 8;
    buf[at + 1] = G[gap + k];
  }
  return true;
}

export function writeV4(buf: Uint8Array, o: number, s: string): void {
  if (!tryWriteV4(buf, o, s)) throw new AddressError(s, 4);
}

export function writeV6(buf: Uint8Array, o: number, s: string): void {
  if (!tryWriteV6(buf, o, s)) throw new AddressError(s, 6);
}

export function formatV4(b: Uint8Array, o = 0): string {
  return `${b[o]}.${b[o + 1]}.${b[o + 2]}.${b[o + 3]}`;
}

/**
 * Where the text of 16 bytes at `o` writes "::": the first group and the length of the longest run (≥ 2) of
 * zero groups, the first on ties; best -1 when there is none. `dotted`: the address ends in a dotted quad
 * (IPv4-compatible or IPv4-mapped), as inet_ntop prints it.
 */
export function v6ZeroRun(b: Uint8Array, o = 0): { best: number; bestLen: number; dotted: boolean } {
  let best = -1, bestLen = 0;
  for (let i = 0; i < 8; ) {
    if (b[o + 2 * i] !== 0 || b[o + 2 * i + 1] !== 0) {
      i++;
      continue;
    }
    let j = i;
    while (j < 8 && b[o + 2 * j] === 0 && b[o + 2 * j + 1] === 0) j++;
    if (j - i > bestLen && j - i >= 2) {
      best = i;
      bestLen = j - i;
    }
    i = j;
  }
  const dotted = best === 0 && (bestLen === 6 || (bestLen === 5 && b[o + 10] === 0xff && b[o + 11] === 0xff));
  return { best, bestLen, dotted };
}

/** inet_ntop text of 16 bytes at `o`: longest run (≥ 2) of zero groups as "::", first on ties. */
export function formatV6(b: Uint8Array, o = 0): string {
  const { best, bestLen, dotted } = v6ZeroRun(b, o);
  // IPv4-compatible and IPv4-mapped addresses end in a dotted quad, as inet_ntop prints them.
  if (dotted) {
    return `::${bestLen === 5 ? 'ffff:' : ''}${formatV4(b, o + 12)}`;
  }
  let s = '';
  let sep = false;
  for (let i = 0; i < 8; i++) {
    if (i === best) {
      s += '::';
      sep = false;
      i += bestLen - 1;
      continue;
    }
    if (sep) s += ':';
    s += ((b[o + 2 * i] << 8) | b[o + 2 * i + 1]).toString(16);
    sep = true;
  }
  return s;
}

/**
 * Writes address text of either family at `o` (4 or 16 bytes); its family, or 0 when it is not an address.
 * Accepts what ipFamily() accepts: an IPv6 zone ("fe80::1%eth0") is allowed and dropped.
 */
function writeIp(buf: Uint8Array, o: number, s: string): IpFamily | 0 {
  if (typeof s !== 'string') return 0;
  if (!s.includes(':')) return tryWriteV4(buf, o, s) ? 4 : 0;
  const zone = s.indexOf('%');
  if (zone < 0) return tryWriteV6(buf, o, s) ? 6 : 0;
  return ipFamily(s) === 6 && tryWriteV6(buf, o, s.slice(0, zone)) ? 6 : 0;
}

/** Network-order bytes of an address: 4 for IPv4, 16 for IPv6. */
export function ipToBytes(s: string): Buffer {
  const f = writeIp(SCRATCH, 0, s);
  if (!f) throw new Error(`'${s}' is not an IP address`);
  return Buffer.from(SCRATCH.subarray(0, f === 4 ? 4 : 16));
}

export function bytesToIp(b: Uint8Array): string {
  if (b.length === 4) return formatV4(b, 0);
  if (b.length !== 16) throw new Error(`address of ${b.length} bytes`);
  return formatV6(b, 0);
}

/** Canonical text of an address (e.g. "fd00:0::1" -> "fd00::1"). */
export function canonicalIp(s: string): string {
  return bytesToIp(ipToBytes(s));
}

/** An IPv4 address as an unsigned 32-bit number; undefined when `s` is not one. */
export function v4ToUint32(s: string): number | undefined {
  return tryWriteV4(SCRATCH, 0, s) ? SCRATCH.readUInt32BE(0) : undefined;
}

/** Zeroes the bits of `b` (an address in network order) past the first `len`. */
export function clearHostBits(b: Uint8Array, len: number): void {
  for (let bit = len; bit < b.length * 8; bit++) b[bit >> 3] &= ~(0x80 >> (bit & 7));
}

// ---------------------------------------------------------------------------------------------------
// Addresses as bigints: block arithmetic (IPAM, Egress and load-balancer pools)

/** Parses a bare address; undefined when it is not one. */
export function parseIp(s: string): { family: IpFamily; value: bigint } | undefined {
  const family = writeIp(SCRATCH, 0, s);
  if (family === 4) return { family, value: BigInt(SCRATCH.readUInt32BE(0)) };
  if (family === 6) return { family, value: (SCRATCH.readBigUInt64BE(0) << 64n) | SCRATCH.readBigUInt64BE(8) };
  return undefined;
}

const U64 = (1n << 64n) - 1n;

export function formatIp(family: IpFamily, v: bigint): string {
  if (v < 0n || v >> BigInt(familyBits(family)) !== 0n) {
    // Out of range: what the hex path this replaced made of it (a wrong length is refused by bytesToIp).
    return bytesToIp(Buffer.from(v.toString(16).padStart(family === 4 ? 8 : 32, '0'), 'hex'));
  }
  if (family === 4) {
    SCRATCH.writeUInt32BE(Number(v), 0);
    return formatV4(SCRATCH, 0);
  }
  SCRATCH.writeBigUInt64BE(v >> 64n, 0);
  SCRATCH.writeBigUInt64BE(v & U64, 8);
  return formatV6(SCRATCH, 0);
}

export interface Cidr {
  family: IpFamily;
  /** The address as written. */
  value: bigint;
  /** The network address (host bits cleared). */
  base: bigint;
  prefix: number;
  /** True when the address as written has no host bits set. */
  isNetwork: boolean;
}

/** Parses "addr/len"; undefined when malformed (bad address, missing or out-of-range length). */
export function parseCidr(s: string): Cidr | undefined {
  if (typeof s !== 'string') return undefined;
  const m = /^([^/]+)\/(\d{1,3})$/.exec(s.trim());
  if (!m) return undefined;
  const ip = parseIp(m[1]);
  if (!ip) return undefined;
  const prefix = Number(m[2]);
  if (prefix > familyBits(ip.family)) return undefined;
  const base = ip.value & prefixMask(ip.family, prefix);
  return { family: ip.family, value: ip.value, base, prefix, isNetwork: base === ip.value };
}

export function prefixMask(family: IpFamily, prefix: number): bigint {
  const bits = BigInt(familyBits(family));
  const all = (1n << bits) - 1n;
  return prefix === 0 ? 0n : (all >> (bits - BigInt(prefix))) << (bits - BigInt(prefix));
}

/** Number of addresses in a prefix of this length. */
export function sizeOf(family: IpFamily, prefix: number): bigint {
  return 1n << BigInt(familyBits(family) - prefix);
}

export function formatCidr(family: IpFamily, base: bigint, prefix: number): string {
  return `${formatIp(family, base)}/${prefix}`;
}

/** Whether ip lies in the subnet base/prefix (of the same family). */
export function inSubnet(ip: { family: IpFamily; value: bigint }, s: { family: IpFamily; base: bigint; prefix: number }): boolean {
  return s.family === ip.family && ip.value >= s.base && ip.value < s.base + sizeOf(s.family, s.prefix);
}

/** Inclusive [first, last] of a prefix (an allocator's reserved ranges are kept so). */
export function rangeOf(family: IpFamily, base: bigint, prefix: number): [bigint, bigint] {
  return [base, base + sizeOf(family, prefix) - 1n];
}

// Relations between prefixes (pools with each other, with special-purpose space, a reserved entry with its
// pool) are ip-num's: they are checked when a configuration changes, never per address or per packet, where
// its cost (tens of microseconds a check, against a fraction of one for the parsing above) does not matter.
type CidrLike = { family: IpFamily; base: bigint; prefix: number };

function cidrRange(c: CidrLike): IPv4CidrRange | IPv6CidrRange {
  // From the numbers, not the text: ip-num reads no dotted-quad tail in IPv6 text (::ffff:10.0.0.0).
  return c.family === 4 ? new IPv4CidrRange(IPv4.fromNumber(c.base), new IPv4Prefix(BigInt(c.prefix))) : new IPv6CidrRange(IPv6.fromBigInt(c.base), new IPv6Prefix(BigInt(c.prefix)));
}

/** Do two prefixes share an address? Never across families. */
export function cidrsOverlap(a: CidrLike, b: CidrLike): boolean {
  if (a.family !== b.family) return false;
  return a.family === 4 ? (cidrRange(a) as IPv4CidrRange).isOverlapping(cidrRange(b) as IPv4CidrRange) : (cidrRange(a) as IPv6CidrRange).isOverlapping(cidrRange(b) as IPv6CidrRange);
}

/** Is every address of `inner` in `outer`? */
export function cidrInside(inner: CidrLike, outer: CidrLike): boolean {
  if (inner.family !== outer.family) return false;
  return inner.family === 4 ? (cidrRange(inner) as IPv4CidrRange).inside(cidrRange(outer) as IPv4CidrRange) : (cidrRange(inner) as IPv6CidrRange).inside(cidrRange(outer) as IPv6CidrRange);
}

// ---------------------------------------------------------------------------------------------------
// Prefixes as text: netlink routes, rules and addresses ("10.0.0.0/24", "default")

export interface Prefix { family: IpFamily; address: string; len: number }

/** Parses "addr", "addr/len" or "default"/"default6"; a bare address is a host prefix. */
export function parsePrefix(s: string, defaultFamily: IpFamily = 4): Prefix {
  if (s === 'default') return { family: defaultFamily, address: defaultFamily === 4 ? '0.0.0.0' : '::', len: 0 };
  const slash = s.indexOf('/');
  const addr = slash < 0 ? s : s.slice(0, slash);
  const family = ipFamily(addr);
  if (!family) throw new Error(`'${addr}' is not an IP address`);
  const max = family === 4 ? 32 : 128;
  let len = max;
  if (slash >= 0) {
    const t = s.slice(slash + 1);
    if (!/^\d{1,3}$/.test(t) || Number(t) > max) throw new Error(`'${s}' has an invalid prefix length (0..${max})`);
    len = Number(t);
  }
  return { family, address: canonicalIp(addr), len };
}

/** Zeroes host bits, so "10.1.0.5/24" names the network 10.1.0.0/24 the kernel stores. */
export function networkOf(p: Prefix): Prefix {
  const b = ipToBytes(p.address);
  clearHostBits(b, p.len);
  return { family: p.family, address: bytesToIp(b), len: p.len };
}

export function formatPrefix(p: Prefix): string {
  return `${p.address}/${p.len}`;
}

// ---------------------------------------------------------------------------------------------------
// MAC addresses (the link-layer half of the same neighbour and ARP messages)

export function macToBytes(mac: string): Buffer {
  if (!/^([0-9a-f]{2}:){5}[0-9a-f]{2}$/i.test(mac)) throw new Error(`'${mac}' is not a MAC address`);
  return Buffer.from(mac.split(':').map((x) => parseInt(x, 16)));
}

export function bytesToMac(b: Buffer): string {
  return [...b].map((x) => x.toString(16).padStart(2, '0')).join(':');
}
