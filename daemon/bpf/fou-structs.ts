// TypeScript mirrors of the structs in bpf/fou-types.h — must match bpf/fou-types.h (checked against the
// compiled objects' BTF by test/unit/bpf-structs.test.ts). Addresses and ports travel in network order.
import { TetherError, ErrorCode } from '../../lib/errors';
import { formatV4, ipFamily, tryWriteV4, tryWriteV6 } from '../../lib/ip';
import type { MapLayout } from './map-layout';

export interface FieldLayout {
  offset: number;
  size: number;
}
export interface StructLayout {
  size: number;
  fields: Record<string, FieldLayout>;
}

/** Byte layouts by C struct name; the encoders below write exactly these offsets. */
export const FOU_LAYOUTS: Record<string, StructLayout> = {
  fou_encap_config: { size: 8, fields: { saddr: { offset: 0, size: 4 }, dport: { offset: 4, size: 2 }, flags: { offset: 6, size: 2 } } },
  fou_dest: { size: 8, fields: { daddr: { offset: 0, size: 4 }, dport: { offset: 4, size: 2 }, pad: { offset: 6, size: 2 } } },
  fou_decap_config: { size: 8, fields: { daddr: { offset: 0, size: 4 }, dport: { offset: 4, size: 2 }, flags: { offset: 6, size: 2 } } },
  fou_decap_config6: { size: 20, fields: { daddr: { offset: 0, size: 16 }, dport: { offset: 16, size: 2 }, flags: { offset: 18, size: 2 } } },
  fou_stats: {
    size: 40,
    fields: {
      packets: { offset: 0, size: 8 },
      bytes: { offset: 8, size: 8 },
      rejected_source: { offset: 16, size: 8 },
      rejected_dest: { offset: 24, size: 8 },
      errors: { offset: 32, size: 8 },
    },
  },
};

// must match bpf/fou-types.h flag macros
export const FOU_ENCAP_F_REDIRECT_BACK = 0x1;
export const FOU_DECAP_F_CHECK_SOURCES = 0x1;
/** fou_decap_config6 only: mark unwrapped packets by the outer flow label's low 16 bits (egress gateways). */
export const FOU_DECAP_F_LABEL_MARK = 0x2;

const L = FOU_LAYOUTS;

/** Layout versions of the maps in bpf/fou-encap-maps.h and bpf/fou-decap-maps.h (map-layout.ts). */
export const FOU_MAP_LAYOUTS: Record<string, MapLayout> = {
  fou_encap_cfg: { version: 1, convert: 'prefix' },
  fou_dests: { version: 1, convert: 'copy' },
  fou_encap_stats: { version: 1, convert: 'prefix' },
  fou_decap_cfg: { version: 1, convert: 'prefix' },
  fou_sources: { version: 1, convert: 'copy' },
  fou_decap_stats: { version: 1, convert: 'prefix' },
  // Outer IPv6 decap (an IPv6 VIP's FoU): new maps beside fou_decap_cfg and fou_sources, whose layouts stay.
  fou_decap_cfg6: { version: 1, convert: 'prefix' },
  fou_sources6: { version: 1, convert: 'copy' },
};

/** An IPv4 address as 4 bytes in network order (map keys and address fields). */
export function ipv4Bytes(addr: string, field = 'address'): Buffer {
  const b = Buffer.allocUnsafe(4);
  putIpv4(addr, b, 0, field);
  return b;
}

/** An IPv6 address as 16 bytes in network order (map keys and address fields of the IPv6 maps). */
export function ipv6Bytes(addr: string, field = 'address'): Buffer {
  const b = Buffer.allocUnsafe(16);
  // tryWriteV6 takes no zone and no brackets: exactly the addresses a map can hold.
  if (!tryWriteV6(b, 0, addr)) throw new TetherError(ErrorCode.InvalidConfig, `${field}: "${addr}" is not an IPv6 address`);
  return b;
}

/** The family of an address given to a map API, or an error naming the field. */
export function addressFamily(addr: string, field = 'address'): 4 | 6 {
  const f = ipFamily(addr);
  if (!f || addr.includes('%')) throw new TetherError(ErrorCode.InvalidConfig, `${field}: "${addr}" is not an IP address`);
  return f;
}

/** An address of either family as network-order bytes: 4 for IPv4, 16 for IPv6. */
export function ipBytes(addr: string, field = 'address'): Buffer {
  return addressFamily(addr, field) === 4 ? ipv4Bytes(addr, field) : ipv6Bytes(addr, field);
}

/** Writes addr's 4 bytes into out at off; an address net.isIPv4 refuses is refused, naming the field. */
export function putIpv4(addr: string, out: Uint8Array, off: number, field = 'address'): void {
  if (!tryWriteV4(out, off, addr)) throw new TetherError(ErrorCode.InvalidConfig, `${field}: "${addr}" is not an IPv4 address`);
}

function port(p: number, field: string): number {
  if (!Number.isInteger(p) || p < 0 || p > 65535) throw new TetherError(ErrorCode.InvalidConfig, `${field}: ${p} is not a UDP port`);
  return p;
}

export interface FouEncapConfig {
  outerSource: string;
  port: number;
  flags: number;
}

export function encodeFouEncapConfig(c: FouEncapConfig): Buffer {
  const b = Buffer.alloc(L.fou_encap_config.size);
  ipv4Bytes(c.outerSource, 'outerSource').copy(b, L.fou_encap_config.fields.saddr.offset);
  b.writeUInt16BE(port(c.port, 'port'), L.fou_encap_config.fields.dport.offset);
  b.writeUInt16LE(c.flags, L.fou_encap_config.fields.flags.offset);
  return b;
}

export interface FouDest {
  backend: string;
  /** 0: the encap config's port. */
  port: number;
}

export function encodeFouDest(d: FouDest): Buffer {
  const b = Buffer.alloc(L.fou_dest.size);
  ipv4Bytes(d.backend, 'backend').copy(b, L.fou_dest.fields.daddr.offset);
  b.writeUInt16BE(port(d.port, 'port'), L.fou_dest.fields.dport.offset);
  return b;
}

export function decodeFouDest(b: Buffer): FouDest {
  return { backend: formatV4(b, L.fou_dest.fields.daddr.offset), port: b.readUInt16BE(L.fou_dest.fields.dport.offset) };
}

export interface FouDecapConfig {
  /** Accepted outer destination; undefined: any address arriving on the interface. */
  localAddress?: string;
  port: number;
  flags: number;
}

export function encodeFouDecapConfig(c: FouDecapConfig): Buffer {
  const b = Buffer.alloc(L.fou_decap_config.size);
  if (c.localAddress) ipv4Bytes(c.localAddress, 'localAddress').copy(b, L.fou_decap_config.fields.daddr.offset);
  b.writeUInt16BE(port(c.port, 'port'), L.fou_decap_config.fields.dport.offset);
  b.writeUInt16LE(c.flags, L.fou_decap_config.fields.flags.offset);
  return b;
}

export interface FouDecapConfig6 {
  /** Accepted outer IPv6 destination; undefined: any address arriving on the interface. */
  localAddress?: string;
  /** 0: outer IPv6 decap off. */
  port: number;
  flags: number;
}

export function encodeFouDecapConfig6(c: FouDecapConfig6): Buffer {
  const f = L.fou_decap_config6.fields;
  const b = Buffer.alloc(L.fou_decap_config6.size);
  if (c.localAddress) ipv6Bytes(c.localAddress, 'localAddress6').copy(b, f.daddr.offset);
  b.writeUInt16BE(port(c.port, 'port'), f.dport.offset);
  b.writeUInt16LE(c.flags, f.flags.offset);
  return b;
}

export interface FouStats {
  packets: bigint;
  bytes: bigint;
  rejectedSource: bigint;
  rejectedDest: bigint;
  errors: bigint;
}

/** Sums per-CPU fou_stats slots into one total. */
export function sumFouStats(perCpu: Buffer[]): FouStats {
  const f = L.fou_stats.fields;
  const s: FouStats = { packets: 0n, bytes: 0n, rejectedSource: 0n, rejectedDest: 0n, errors: 0n };
  for (const b of perCpu) {
    s.packets += b.readBigUInt64LE(f.packets.offset);
    s.bytes += b.readBigUInt64LE(f.bytes.offset);
    s.rejectedSource += b.readBigUInt64LE(f.rejected_source.offset);
    s.rejectedDest += b.readBigUInt64LE(f.rejected_dest.offset);
    s.errors += b.readBigUInt64LE(f.errors.offset);
  }
  return s;
}
