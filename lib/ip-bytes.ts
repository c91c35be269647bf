// IP address text <-> network-order bytes for netlink attributes, and prefix parsing ("10.0.0.0/24",
// "default"). Formatting follows inet_ntop so results compare equal to `ip -j` output.
import * as net from 'node:net';

export type Family = 4 | 6;

export interface Prefix { family: Family; address: string; len: number }

export function ipFamily(s: string): Family | 0 {
  const v = net.isIP(s);
  return v === 4 || v === 6 ? v : 0;
}

export function ipToBytes(s: string): Buffer {
  const fam = ipFamily(s);
  if (fam === 4) return Buffer.from(s.split('.').map((p) => Number(p)));
  if (fam !== 6) throw new Error(`'${s}' is not an IP address`);
  let text = s;
  let tail: number[] = [];
  // An embedded dotted quad (::ffff:1.2.3.4) becomes the last two groups.
  const lastColon = text.lastIndexOf(':');
  if (text.includes('.', lastColon)) {
    const v4 = text.slice(lastColon + 1).split('.').map(Number);
    tail = [(v4[0] << 8) | v4[1], (v4[2] << 8) | v4[3]];
    text = text.slice(0, lastColon + 1) + '0';
  }
  const [head, rest] = text.includes('::') ? text.split('::') : [text, undefined];
  const parse = (x: string) => (x === '' ? [] : x.split(':').map((g) => parseInt(g, 16)));
  let groups: number[];
  if (rest === undefined) groups = parse(head);
  else {
    const h = parse(head);
    const r = parse(rest);
    groups = [...h, ...new Array(8 - h.length - r.length - (tail.length ? 1 : 0)).fill(0), ...r];
  }
  if (tail.length) groups = [...groups.slice(0, groups.length - 1), ...tail];
  const b = Buffer.alloc(16);
  groups.forEach((g, i) => b.writeUInt16BE(g, i * 2));
  return b;
}

export function bytesToIp(b: Buffer): string {
  if (b.length === 4) return `${b[0]}.${b[1]}.${b[2]}.${b[3]}`;
  if (b.length !== 16) throw new Error(`address of ${b.length} bytes`);
  const g: number[] = [];
  for (let i = 0; i < 8; i++) g.push(b.readUInt16BE(i * 2));
  // Longest run of at least two zero groups becomes "::" (first one on ties), as inet_ntop does.
  let best = -1;
  let bestLen = 0;
  for (let i = 0; i < 8; ) {
    if (g[i] !== 0) { i++; continue; }
    let j = i;
    while (j < 8 && g[j] === 0) j++;
    if (j - i > bestLen && j - i >= 2) { best = i; bestLen = j - i; }
    i = j;
  }
  // IPv4-mapped addresses print the last 32 bits dotted, like inet_ntop.
  if (best === 0 && (bestLen === 6 || (bestLen === 5 && g[5] === 0xffff))) {
    return `::${bestLen === 5 ? 'ffff:' : ''}${b[12]}.${b[13]}.${b[14]}.${b[15]}`;
  }
  const hex = (xs: number[]) => xs.map((x) => x.toString(16)).join(':');
  if (best < 0) return hex(g);
  return `${hex(g.slice(0, best))}::${hex(g.slice(best + bestLen))}`;
}

/** Canonical text of an address (e.g. "fd00:0::1" -> "fd00::1"). */
export function canonicalIp(s: string): string {
  return bytesToIp(ipToBytes(s));
}

/** Parses "addr", "addr/len" or "default"/"default6"; a bare address is a host prefix. */
export function parsePrefix(s: string, defaultFamily: Family = 4): Prefix {
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
  for (let bit = p.len; bit < b.length * 8; bit++) b[bit >> 3] &= ~(0x80 >> (bit & 7));
  return { family: p.family, address: bytesToIp(b), len: p.len };
}

export function formatPrefix(p: Prefix): string {
  return `${p.address}/${p.len}`;
}

export function macToBytes(mac: string): Buffer {
  if (!/^([0-9a-f]{2}:){5}[0-9a-f]{2}$/i.test(mac)) throw new Error(`'${mac}' is not a MAC address`);
  return Buffer.from(mac.split(':').map((x) => parseInt(x, 16)));
}

export function bytesToMac(b: Buffer): string {
  return [...b].map((x) => x.toString(16).padStart(2, '0')).join(':');
}
