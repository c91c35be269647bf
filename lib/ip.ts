// Addresses as bigints: parsing, formatting and block arithmetic for IPv4 and IPv6 alike.
import { bytesToIp, ipFamily, ipToBytes } from './ip-bytes';

/** An address family by its version number. */
export type IpFamily = 4 | 6;

export function familyBits(f: IpFamily): number {
  return f === 4 ? 32 : 128;
}

/** Parses a bare address; undefined when it is not one. */
export function parseIp(s: string): { family: IpFamily; value: bigint } | undefined {
  if (typeof s !== 'string') return undefined;
  const family = ipFamily(s);
  if (!family) return undefined;
  try {
    return { family, value: BigInt('0x' + ipToBytes(s).toString('hex')) };
  } catch {
    return undefined;
  }
}

export function formatIp(family: IpFamily, v: bigint): string {
  const hex = v.toString(16).padStart(family === 4 ? 8 : 32, '0');
  return bytesToIp(Buffer.from(hex, 'hex'));
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

/** Inclusive [first, last] of a prefix. */
export function rangeOf(family: IpFamily, base: bigint, prefix: number): [bigint, bigint] {
  return [base, base + sizeOf(family, prefix) - 1n];
}

export function rangesOverlap(a: [bigint, bigint], b: [bigint, bigint]): boolean {
  return a[0] <= b[1] && b[0] <= a[1];
}
