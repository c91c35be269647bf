// Test frames for the datapath programs: an Ethernet frame with an IPv4 or IPv6 header (the options,
// fragment and bad-header variants included) and a UDP header, built byte by byte so a test controls every
// field the program reads.
import { ipToBytes } from '../../lib/ip';

export function ipChecksum(h: Buffer): number {
  let sum = 0;
  for (let i = 0; i < h.length; i += 2) sum += h.readUInt16BE(i);
  while (sum > 0xffff) sum = (sum & 0xffff) + (sum >>> 16);
  return ~sum & 0xffff;
}

export interface FrameSpec {
  src: string; dst: string; proto: number; payload: Buffer;
  /** IPv4: options (NOP NOP NOP EOL); IPv6: a Hop-by-Hop header (PadN). */
  options?: boolean;
  /** In 8-byte units; either set: a fragment (IPv6: a Fragment header). */
  fragOffset?: number; moreFragments?: boolean; id?: number;
  /** A header the stack would refuse: IPv4 a bad checksum, IPv6 a payload length past the frame's end. */
  badHeader?: boolean;
  dstMac: Buffer;
  srcMac: Buffer;
}

function ethernet(f: FrameSpec, type: number, ip: Buffer): Buffer {
  const eth = Buffer.alloc(14);
  f.dstMac.copy(eth, 0);
  f.srcMac.copy(eth, 6);
  eth.writeUInt16BE(type, 12);
  return Buffer.concat([eth, ip, f.payload]);
}

/** The frame: IPv4 or IPv6 by the source address's family. */
export function frame(f: FrameSpec): Buffer {
  if (f.src.includes(':')) return frame6(f);
  const opts = f.options ? Buffer.from([1, 1, 1, 0]) : Buffer.alloc(0);
  const ip = Buffer.alloc(20 + opts.length);
  ip.writeUInt8(0x40 | ((20 + opts.length) / 4), 0);
  ip.writeUInt16BE(ip.length + f.payload.length, 2);
  ip.writeUInt16BE(f.id ?? 0x1234, 4);
  ip.writeUInt16BE((f.moreFragments ? 0x2000 : 0) | (f.fragOffset ?? 0), 6);
  ip.writeUInt8(64, 8);
  ip.writeUInt8(f.proto, 9);
  ipToBytes(f.src).copy(ip, 12);
  ipToBytes(f.dst).copy(ip, 16);
  opts.copy(ip, 20);
  ip.writeUInt16BE(ipChecksum(ip) ^ (f.badHeader ? 0x5a5a : 0), 10);
  return ethernet(f, 0x0800, ip);
}

/** frame for IPv6: the IPv6 header, then a Hop-by-Hop header if options, a Fragment header if a fragment. */
function frame6(f: FrameSpec): Buffer {
  let next = f.proto;
  let ext = Buffer.alloc(0);
  if (f.fragOffset !== undefined || f.moreFragments) {
    const fh = Buffer.alloc(8);
    fh[0] = next;
    fh.writeUInt16BE(((f.fragOffset ?? 0) << 3) | (f.moreFragments ? 1 : 0), 2);
    fh.writeUInt32BE(f.id ?? 0x1234, 4);
    ext = fh;
    next = 44;
  }
  if (f.options) {
    ext = Buffer.concat([Buffer.from([next, 0, 1, 4, 0, 0, 0, 0]), ext]);
    next = 0;
  }
  const ip = Buffer.alloc(40);
  ip.writeUInt32BE(0x60000000, 0);
  ip.writeUInt16BE(ext.length + f.payload.length + (f.badHeader ? 1000 : 0), 4);
  ip[6] = next;
  ip[7] = 64;
  ipToBytes(f.src).copy(ip, 8);
  ipToBytes(f.dst).copy(ip, 24);
  return ethernet(f, 0x86dd, Buffer.concat([ip, ext]));
}

/** A UDP header (checksum 0: none, allowed over IPv4; over IPv6 a receiving stack drops it) and payload. */
export function udp(sport: number, dport: number, data = Buffer.alloc(8)): Buffer {
  const u = Buffer.alloc(8);
  u.writeUInt16BE(sport, 0);
  u.writeUInt16BE(dport, 2);
  u.writeUInt16BE(8 + data.length, 4);
  return Buffer.concat([u, data]);
}
