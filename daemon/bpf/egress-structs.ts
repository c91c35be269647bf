// TypeScript mirrors of the structs in bpf/egress-types.h — must match bpf/egress-types.h (checked against
// the compiled object's BTF by test/unit/bpf-structs.test.ts). Addresses and ports travel in network
// order, ids, counts and epochs in host (little-endian) order.
import { TetherError, ErrorCode } from '../../lib/errors';
import { clearHostBits, formatV4, formatV6 } from '../../lib/ip';
import { addressFamily, ipv4Bytes, ipv6Bytes, type StructLayout } from './fou-structs';
import type { MapLayout } from './map-layout';

// must match bpf/egress-types.h constants
export const EGRESS_MAX_SLOTS = 8;
export const EGRESS_MAX_PER_CLIENT = 4;
export const EGRESS_ID_GLOBAL = 0;
export const EGRESS_ACT_STEER = 1;
export const EGRESS_ACT_BYPASS = 2;
export const EGRESS_TIER_PREFERRED = 0;
export const EGRESS_TIER_FALLBACK = 1;
export const EGRESS_TIER_EXCLUDED = 255;

const SLOT_SIZE = 24;
const SLOT6_SIZE = 40;
const SLOT66_SIZE = 48;

/** Byte layouts by C struct name; the encoders below write exactly these offsets. */
export const EGRESS_LAYOUTS: Record<string, StructLayout> = {
  egress_dest_key: { size: 12, fields: { prefixlen: { offset: 0, size: 4 }, egress_id: { offset: 4, size: 4 }, daddr: { offset: 8, size: 4 } } },
  egress_dest: { size: 4, fields: { action: { offset: 0, size: 1 }, pad: { offset: 1, size: 3 } } },
  egress_client: { size: 4 + 4 * EGRESS_MAX_PER_CLIENT, fields: { count: { offset: 0, size: 4 }, ids: { offset: 4, size: 4 * EGRESS_MAX_PER_CLIENT } } },
  egress_slot: {
    size: SLOT_SIZE,
    fields: {
      gateway: { offset: 0, size: 4 },
      floating: { offset: 4, size: 4 },
      epoch: { offset: 8, size: 8 },
      zone: { offset: 16, size: 4 },
      tier: { offset: 20, size: 4 },
    },
  },
  egress_flow_key: {
    size: 20,
    fields: {
      saddr: { offset: 0, size: 4 },
      daddr: { offset: 4, size: 4 },
      sport: { offset: 8, size: 2 },
      dport: { offset: 10, size: 2 },
      proto: { offset: 12, size: 1 },
      pad: { offset: 13, size: 3 },
      egress_id: { offset: 16, size: 4 },
    },
  },
  egress_flow: { size: 8, fields: { floating: { offset: 0, size: 4 }, pad: { offset: 4, size: 4 } } },
  egress_addr_stats: { size: 24, fields: { flows: { offset: 0, size: 8 }, packets: { offset: 8, size: 8 }, bytes: { offset: 16, size: 8 } } },
  egress_gateways: {
    size: 8 + SLOT_SIZE * EGRESS_MAX_SLOTS,
    fields: { count: { offset: 0, size: 4 }, flags: { offset: 4, size: 4 }, slots: { offset: 8, size: SLOT_SIZE * EGRESS_MAX_SLOTS } },
  },
  egress_config: { size: 8, fields: { saddr: { offset: 0, size: 4 }, dport: { offset: 4, size: 2 }, flags: { offset: 6, size: 2 } } },
  // IPv6 (bpf/egress-types.h, bottom): keys and values of the maps added beside the IPv4 ones.
  in6_addr: { size: 16, fields: { in6_u: { offset: 0, size: 16 } } },
  egress_dest6_key: { size: 24, fields: { prefixlen: { offset: 0, size: 4 }, egress_id: { offset: 4, size: 4 }, daddr: { offset: 8, size: 16 } } },
  egress_slot6: {
    size: SLOT6_SIZE,
    fields: {
      gateway: { offset: 0, size: 4 },
      pad: { offset: 4, size: 4 },
      floating: { offset: 8, size: 16 },
      epoch: { offset: 24, size: 8 },
      zone: { offset: 32, size: 4 },
      tier: { offset: 36, size: 4 },
    },
  },
  egress_gateways6: {
    size: 8 + SLOT6_SIZE * EGRESS_MAX_SLOTS,
    fields: { count: { offset: 0, size: 4 }, flags: { offset: 4, size: 4 }, slots: { offset: 8, size: SLOT6_SIZE * EGRESS_MAX_SLOTS } },
  },
  egress_flow6_key: {
    size: 44,
    fields: {
      saddr: { offset: 0, size: 16 },
      daddr: { offset: 16, size: 16 },
      sport: { offset: 32, size: 2 },
      dport: { offset: 34, size: 2 },
      proto: { offset: 36, size: 1 },
      pad: { offset: 37, size: 3 },
      egress_id: { offset: 40, size: 4 },
    },
  },
  egress_flow6: { size: 16, fields: { floating: { offset: 0, size: 16 } } },
  // Gateways without IPv4 (outer IPv6): maps added beside the IPv6 ones.
  egress_config6: { size: 20, fields: { saddr: { offset: 0, size: 16 }, dport: { offset: 16, size: 2 }, flags: { offset: 18, size: 2 } } },
  egress_slot66: {
    size: SLOT66_SIZE,
    fields: {
      gateway: { offset: 0, size: 16 },
      floating: { offset: 16, size: 16 },
      epoch: { offset: 32, size: 8 },
      zone: { offset: 40, size: 4 },
      tier: { offset: 44, size: 4 },
    },
  },
  egress_gateways66: {
    size: 8 + SLOT66_SIZE * EGRESS_MAX_SLOTS,
    fields: { count: { offset: 0, size: 4 }, flags: { offset: 4, size: 4 }, slots: { offset: 8, size: SLOT66_SIZE * EGRESS_MAX_SLOTS } },
  },
  egress_stats: {
    size: 72,
    fields: {
      steered: { offset: 0, size: 8 },
      steered_bytes: { offset: 8, size: 8 },
      bypassed: { offset: 16, size: 8 },
      not_client: { offset: 24, size: 8 },
      no_gateway: { offset: 32, size: 8 },
      errors: { offset: 40, size: 8 },
      pinned: { offset: 48, size: 8 },
      repinned: { offset: 56, size: 8 },
      excluded: { offset: 64, size: 8 },
    },
  },
};

const L = EGRESS_LAYOUTS;

/**
 * Layout versions of the maps in bpf/egress-maps.h and how an older pin is carried over (map-layout.ts).
 * Bump a version when a map keeps its sizes but changes meaning, and give a converter from the old one.
 * Pins from before versioning (egress_stats of 48 bytes, no egress_flows) differ in shape: 'prefix' widens
 * the counters; missing maps are simply created.
 */
export const EGRESS_MAP_LAYOUTS: Record<string, MapLayout> = {
  egress_cfg: { version: 1, convert: 'prefix' },
  egress_dest: { version: 1, convert: 'copy' },
  egress_clients: { version: 1, convert: 'copy' },
  egress_gateways: { version: 1, convert: 'copy' },
  egress_stats: { version: 1, convert: 'prefix' },
  // Live flows keep their floating address only if their pin survives: copied, and caught up after each attach.
  egress_flows: { version: 1, convert: 'copy', catchUp: true },
  egress_addr_stats: { version: 1, convert: 'prefix' },
  // IPv6, added beside the maps above (which keep their layouts): a pin directory without them gets them
  // created empty; the release before neither creates nor reads them.
  egress_dest6: { version: 1, convert: 'copy' },
  egress_clients6: { version: 1, convert: 'copy' },
  egress_gateways6: { version: 1, convert: 'copy' },
  egress_flows6: { version: 1, convert: 'copy', catchUp: true },
  egress_addr_stats6: { version: 1, convert: 'prefix' },
  // Outer IPv6 (gateways without IPv4), added beside the maps above likewise.
  egress_cfg6: { version: 1, convert: 'prefix' },
  egress_gateways66: { version: 1, convert: 'copy' },
};

function invalid(msg: string): TetherError {
  return new TetherError(ErrorCode.InvalidConfig, msg);
}

/** Egress ids are u32 and never 0 (0 holds the global BYPASS prefixes), unless allowGlobal. */
export function checkEgressId(id: number, field = 'egressId', allowGlobal = false): number {
  if (!Number.isInteger(id) || id < 0 || id > 0xffffffff || (id === EGRESS_ID_GLOBAL && !allowGlobal)) {
    throw invalid(`${field}: ${id} is not an egress id (an integer 1..4294967295${allowGlobal ? ', or 0 for global bypass' : ''})`);
  }
  return id;
}

export interface Ipv4Prefix {
  /** Network address, host bits cleared. */
  address: string;
  length: number;
}

/** Parses "a.b.c.d/len" (or a bare address, /32); host bits are cleared so one prefix has one key. */
export function parseIpv4Prefix(cidr: string, field = 'cidr'): Ipv4Prefix {
  const [addr, len, extra] = cidr.split('/');
  const length = len === undefined ? 32 : Number(len);
  if (extra !== undefined || !/^\d{1,2}$/.test(len ?? '32') || length > 32) throw invalid(`${field}: "${cidr}" is not an IPv4 CIDR`);
  const b = ipv4Bytes(addr, field);
  clearHostBits(b, length);
  return { address: formatV4(b), length };
}

/** A destination prefix of either family. */
export interface IpPrefix extends Ipv4Prefix {
  family: 4 | 6;
}

/** Parses "addr/len" of either family (a bare address is a host prefix); host bits are cleared. */
export function parseIpPrefix(cidr: string, field = 'cidr'): IpPrefix {
  const [addr, len, extra] = cidr.split('/');
  let family: 4 | 6;
  try {
    family = addressFamily(addr, field);
  } catch {
    throw invalid(`${field}: "${cidr}" is not an IP CIDR`);
  }
  if (family === 4) return { family, ...parseIpv4Prefix(cidr, field) };
  const length = len === undefined ? 128 : Number(len);
  if (extra !== undefined || !/^\d{1,3}$/.test(len ?? '128') || length > 128) throw invalid(`${field}: "${cidr}" is not an IPv6 CIDR`);
  const b = ipv6Bytes(addr, field);
  clearHostBits(b, length);
  return { family, address: formatV6(b), length };
}

export function encodeEgressDestKey(egressId: number, p: Ipv4Prefix): Buffer {
  const f = L.egress_dest_key.fields;
  const b = Buffer.alloc(L.egress_dest_key.size);
  b.writeUInt32LE(32 + p.length, f.prefixlen.offset);
  b.writeUInt32LE(checkEgressId(egressId, 'egressId', true), f.egress_id.offset);
  ipv4Bytes(p.address).copy(b, f.daddr.offset);
  return b;
}

export function decodeEgressDestKey(b: Buffer): { egressId: number; prefix: Ipv4Prefix } {
  const f = L.egress_dest_key.fields;
  return {
    egressId: b.readUInt32LE(f.egress_id.offset),
    prefix: { address: formatV4(b, f.daddr.offset), length: b.readUInt32LE(f.prefixlen.offset) - 32 },
  };
}

export function encodeEgressDest6Key(egressId: number, p: Ipv4Prefix): Buffer {
  const f = L.egress_dest6_key.fields;
  const b = Buffer.alloc(L.egress_dest6_key.size);
  b.writeUInt32LE(32 + p.length, f.prefixlen.offset);
  b.writeUInt32LE(checkEgressId(egressId, 'egressId', true), f.egress_id.offset);
  ipv6Bytes(p.address).copy(b, f.daddr.offset);
  return b;
}

export function decodeEgressDest6Key(b: Buffer): { egressId: number; prefix: Ipv4Prefix } {
  const f = L.egress_dest6_key.fields;
  return {
    egressId: b.readUInt32LE(f.egress_id.offset),
    prefix: { address: formatV6(b, f.daddr.offset), length: b.readUInt32LE(f.prefixlen.offset) - 32 },
  };
}

export type EgressAction = 'steer' | 'bypass';

export function encodeEgressDest(action: EgressAction): Buffer {
  const b = Buffer.alloc(L.egress_dest.size);
  b.writeUInt8(action === 'steer' ? EGRESS_ACT_STEER : EGRESS_ACT_BYPASS, L.egress_dest.fields.action.offset);
  return b;
}

export function decodeEgressDest(b: Buffer): EgressAction {
  return b.readUInt8(L.egress_dest.fields.action.offset) === EGRESS_ACT_STEER ? 'steer' : 'bypass';
}

/** A client's Egress ids in priority order: 1..EGRESS_MAX_PER_CLIENT distinct non-zero ids. */
export function encodeEgressClient(ids: number[]): Buffer {
  if (ids.length === 0 || ids.length > EGRESS_MAX_PER_CLIENT) throw invalid(`egressIds: ${ids.length} ids, a client belongs to 1..${EGRESS_MAX_PER_CLIENT} Egresses`);
  if (new Set(ids).size !== ids.length) throw invalid(`egressIds: [${ids.join(', ')}] repeats an id`);
  const f = L.egress_client.fields;
  const b = Buffer.alloc(L.egress_client.size);
  b.writeUInt32LE(ids.length, f.count.offset);
  ids.forEach((id, i) => b.writeUInt32LE(checkEgressId(id, `egressIds[${i}]`), f.ids.offset + 4 * i));
  return b;
}

export function decodeEgressClient(b: Buffer): number[] {
  const f = L.egress_client.fields;
  const n = Math.min(b.readUInt32LE(f.count.offset), EGRESS_MAX_PER_CLIENT);
  return Array.from({ length: n }, (_, i) => b.readUInt32LE(f.ids.offset + 4 * i));
}

export interface EgressSlot {
  /**
   * Gateway pod address that owns the floating address now: the FoU outer destination. IPv4 (outer IPv4); an
   * IPv6 gateway (a pod without IPv4, or an IPv6 underlay) only for an IPv6 floating address (outer IPv6).
   */
  gatewayIp: string;
  /** IPv4 or IPv6: an IPv6 address goes to the IPv6 slots (egress_gateways6). */
  floatingIp: string;
  /** Ownership epoch (only grows). */
  epoch: number | bigint;
  /** Zone id of the gateway's node; 0 or absent = unknown (diagnostics). */
  zone?: number;
  /** New flows from this node take the lowest tier present (EGRESS_TIER_*; default preferred). */
  tier?: number;
}

/** The two slot layouts: the IPv4 one and the IPv6 one (a 16-byte floating address). */
type SlotFamily = { gateways: string; slot: string; floating: (addr: string, field: string) => Buffer; format: (b: Buffer, o: number) => string };
const SLOT4: SlotFamily = { gateways: 'egress_gateways', slot: 'egress_slot', floating: ipv4Bytes, format: formatV4 };
const SLOT6: SlotFamily = { gateways: 'egress_gateways6', slot: 'egress_slot6', floating: ipv6Bytes, format: formatV6 };

function encodeGateways(fam: SlotFamily, slots: EgressSlot[]): Buffer {
  if (slots.length > EGRESS_MAX_SLOTS) throw invalid(`slots: ${slots.length} slots, an Egress has at most ${EGRESS_MAX_SLOTS}`);
  const g = L[fam.gateways].fields;
  const s = L[fam.slot].fields;
  const b = Buffer.alloc(L[fam.gateways].size);
  b.writeUInt32LE(slots.length, g.count.offset);
  slots.forEach((slot, i) => {
    const at = g.slots.offset + i * L[fam.slot].size;
    const epoch = BigInt(slot.epoch);
    if (epoch < 0n || epoch > 0xffffffffffffffffn) throw invalid(`slots[${i}].epoch: ${slot.epoch} is not a u64`);
    const zone = slot.zone ?? 0;
    if (!Number.isInteger(zone) || zone < 0 || zone > 0xffffffff) throw invalid(`slots[${i}].zone: ${zone} is not a u32`);
    const tier = slot.tier ?? EGRESS_TIER_PREFERRED;
    if (!Number.isInteger(tier) || tier < 0 || tier > EGRESS_TIER_EXCLUDED) throw invalid(`slots[${i}].tier: ${tier} is not a tier (0-255)`);
    ipv4Bytes(slot.gatewayIp, `slots[${i}].gatewayIp`).copy(b, at + s.gateway.offset);
    fam.floating(slot.floatingIp, `slots[${i}].floatingIp`).copy(b, at + s.floating.offset);
    b.writeBigUInt64LE(epoch, at + s.epoch.offset);
    b.writeUInt32LE(zone, at + s.zone.offset);
    b.writeUInt32LE(tier, at + s.tier.offset);
  });
  return b;
}

function decodeGateways(fam: SlotFamily, b: Buffer): EgressSlot[] {
  const g = L[fam.gateways].fields;
  const s = L[fam.slot].fields;
  const n = Math.min(b.readUInt32LE(g.count.offset), EGRESS_MAX_SLOTS);
  return Array.from({ length: n }, (_, i) => {
    const at = g.slots.offset + i * L[fam.slot].size;
    return {
      gatewayIp: formatV4(b, at + s.gateway.offset),
      floatingIp: fam.format(b, at + s.floating.offset),
      epoch: b.readBigUInt64LE(at + s.epoch.offset),
      zone: b.readUInt32LE(at + s.zone.offset),
      tier: b.readUInt32LE(at + s.tier.offset),
    };
  });
}

/** struct egress_gateways: IPv4 floating addresses only. */
export function encodeEgressGateways(slots: EgressSlot[]): Buffer {
  return encodeGateways(SLOT4, slots);
}

export function decodeEgressGateways(b: Buffer): EgressSlot[] {
  return decodeGateways(SLOT4, b);
}

/** struct egress_gateways6: IPv6 floating addresses (gateways stay IPv4). */
export function encodeEgressGateways6(slots: EgressSlot[]): Buffer {
  return encodeGateways(SLOT6, slots);
}

export function decodeEgressGateways6(b: Buffer): EgressSlot[] {
  return decodeGateways(SLOT6, b);
}

/**
 * struct egress_gateways66: IPv6 floating addresses whose gateways may be IPv6; an IPv4 gateway is written
 * IPv4-mapped (::ffff:a.b.c.d), which the program reaches in outer IPv4.
 */
export function encodeEgressGateways66(slots: EgressSlot[]): Buffer {
  const g = L.egress_gateways66.fields;
  const s = L.egress_slot66.fields;
  const b = encodeGateways(SLOT6, slots.map((x) => ({ ...x, gatewayIp: '0.0.0.0' })));
  const out = Buffer.alloc(L.egress_gateways66.size);
  out.writeUInt32LE(slots.length, g.count.offset);
  const g6 = L.egress_gateways6.fields;
  const s6 = L.egress_slot6.fields;
  slots.forEach((slot, i) => {
    const at = g.slots.offset + i * L.egress_slot66.size;
    const from = g6.slots.offset + i * L.egress_slot6.size;
    gateway66Bytes(slot.gatewayIp, `slots[${i}].gatewayIp`).copy(out, at + s.gateway.offset);
    b.copy(out, at + s.floating.offset, from + s6.floating.offset, from + s6.floating.offset + 16);
    b.copy(out, at + s.epoch.offset, from + s6.epoch.offset, from + s6.tier.offset + 4);
  });
  return out;
}

export function decodeEgressGateways66(b: Buffer): EgressSlot[] {
  const g = L.egress_gateways66.fields;
  const s = L.egress_slot66.fields;
  const n = Math.min(b.readUInt32LE(g.count.offset), EGRESS_MAX_SLOTS);
  return Array.from({ length: n }, (_, i) => {
    const at = g.slots.offset + i * L.egress_slot66.size;
    const gw = b.subarray(at + s.gateway.offset, at + s.gateway.offset + 16);
    const mapped = gw.subarray(0, 10).every((x) => x === 0) && gw[10] === 0xff && gw[11] === 0xff;
    return {
      gatewayIp: mapped ? formatV4(gw, 12) : formatV6(gw, 0),
      floatingIp: formatV6(b, at + s.floating.offset),
      epoch: b.readBigUInt64LE(at + s.epoch.offset),
      zone: b.readUInt32LE(at + s.zone.offset),
      tier: b.readUInt32LE(at + s.tier.offset),
    };
  });
}

/** A slot66 gateway: IPv6 as is, IPv4 as ::ffff:a.b.c.d. */
function gateway66Bytes(addr: string, field: string): Buffer {
  if (addressFamily(addr, field) === 6) return ipv6Bytes(addr, field);
  const b = Buffer.alloc(16);
  b[10] = 0xff;
  b[11] = 0xff;
  ipv4Bytes(addr, field).copy(b, 12);
  return b;
}

/** True when a slot's gateway is IPv6: it needs egress_gateways66 (outer IPv6). */
export function hasIpv6Gateway(slots: EgressSlot[]): boolean {
  return slots.some((s, i) => addressFamily(s.gatewayIp, `slots[${i}].gatewayIp`) === 6);
}

/** Splits mixed slots by the family of their floating address, keeping their order; the field names the bad one. */
export function splitSlotsByFamily(slots: EgressSlot[]): { v4: EgressSlot[]; v6: EgressSlot[] } {
  const v4: EgressSlot[] = [];
  const v6: EgressSlot[] = [];
  slots.forEach((s, i) => (addressFamily(s.floatingIp, `slots[${i}].floatingIp`) === 4 ? v4 : v6).push(s));
  if (v4.length > EGRESS_MAX_SLOTS || v6.length > EGRESS_MAX_SLOTS) {
    throw invalid(`slots: ${v4.length} IPv4 and ${v6.length} IPv6 slots, an Egress has at most ${EGRESS_MAX_SLOTS} of each family`);
  }
  return { v4, v6 };
}

export interface EgressConfig {
  /** Outer source: an address of this node. */
  nodeAddress: string;
  /** Outer UDP destination port (the gateways' FoU port). */
  port: number;
}

export function encodeEgressConfig(c: EgressConfig): Buffer {
  if (!Number.isInteger(c.port) || c.port < 1 || c.port > 65535) throw invalid(`port: ${c.port} is not a UDP port`);
  const f = L.egress_config.fields;
  const b = Buffer.alloc(L.egress_config.size);
  ipv4Bytes(c.nodeAddress, 'nodeAddress').copy(b, f.saddr.offset);
  b.writeUInt16BE(c.port, f.dport.offset);
  return b;
}

/** Node settings for outer IPv6 (struct egress_config6). */
export interface EgressConfig6 {
  /** Outer IPv6 source: an IPv6 address of this node; undefined = none (IPv6 gateways unreachable). */
  nodeAddress6?: string;
  port: number;
}

export function encodeEgressConfig6(c: EgressConfig6): Buffer {
  if (!Number.isInteger(c.port) || c.port < 1 || c.port > 65535) throw invalid(`port: ${c.port} is not a UDP port`);
  const f = L.egress_config6.fields;
  const b = Buffer.alloc(L.egress_config6.size);
  if (c.nodeAddress6) ipv6Bytes(c.nodeAddress6, 'nodeAddress6').copy(b, f.saddr.offset);
  b.writeUInt16BE(c.port, f.dport.offset);
  return b;
}

export function decodeEgressConfig6(b: Buffer): EgressConfig6 {
  const f = L.egress_config6.fields;
  const a = b.subarray(f.saddr.offset, f.saddr.offset + 16);
  return { ...(a.some((x) => x !== 0) ? { nodeAddress6: formatV6(a, 0) } : {}), port: b.readUInt16BE(f.dport.offset) };
}

export function decodeEgressConfig(b: Buffer): EgressConfig {
  const f = L.egress_config.fields;
  return { nodeAddress: formatV4(b, f.saddr.offset), port: b.readUInt16BE(f.dport.offset) };
}

export interface EgressStats {
  steered: bigint;
  steeredBytes: bigint;
  bypassed: bigint;
  notClient: bigint;
  noGateway: bigint;
  errors: bigint;
  pinned: bigint;
  repinned: bigint;
  excluded: bigint;
}

/** Sums per-CPU egress_stats slots into one total. */
export function sumEgressStats(perCpu: Buffer[]): EgressStats {
  const f = L.egress_stats.fields;
  const s: EgressStats = { steered: 0n, steeredBytes: 0n, bypassed: 0n, notClient: 0n, noGateway: 0n, errors: 0n, pinned: 0n, repinned: 0n, excluded: 0n };
  for (const b of perCpu) {
    s.steered += b.readBigUInt64LE(f.steered.offset);
    s.steeredBytes += b.readBigUInt64LE(f.steered_bytes.offset);
    s.bypassed += b.readBigUInt64LE(f.bypassed.offset);
    s.notClient += b.readBigUInt64LE(f.not_client.offset);
    s.noGateway += b.readBigUInt64LE(f.no_gateway.offset);
    s.errors += b.readBigUInt64LE(f.errors.offset);
    s.pinned += b.readBigUInt64LE(f.pinned.offset);
    s.repinned += b.readBigUInt64LE(f.repinned.offset);
    s.excluded += b.readBigUInt64LE(f.excluded.offset);
  }
  return s;
}

export interface EgressFlow {
  src: string;
  dst: string;
  sport: number;
  dport: number;
  proto: number;
  egressId: number;
  floatingIp: string;
}

export function decodeEgressFlow(k: Buffer, v: Buffer): EgressFlow {
  const f = L.egress_flow_key.fields;
  return {
    src: formatV4(k, f.saddr.offset),
    dst: formatV4(k, f.daddr.offset),
    sport: k.readUInt16BE(f.sport.offset),
    dport: k.readUInt16BE(f.dport.offset),
    proto: k.readUInt8(f.proto.offset),
    egressId: k.readUInt32LE(f.egress_id.offset),
    floatingIp: formatV4(v, L.egress_flow.fields.floating.offset),
  };
}

export function decodeEgressFlow6(k: Buffer, v: Buffer): EgressFlow {
  const f = L.egress_flow6_key.fields;
  return {
    src: formatV6(k, f.saddr.offset),
    dst: formatV6(k, f.daddr.offset),
    sport: k.readUInt16BE(f.sport.offset),
    dport: k.readUInt16BE(f.dport.offset),
    proto: k.readUInt8(f.proto.offset),
    egressId: k.readUInt32LE(f.egress_id.offset),
    floatingIp: formatV6(v, L.egress_flow6.fields.floating.offset),
  };
}

export interface EgressAddressStats {
  flows: bigint;
  packets: bigint;
  bytes: bigint;
}

export function sumEgressAddressStats(perCpu: Buffer[]): EgressAddressStats {
  const f = L.egress_addr_stats.fields;
  const s: EgressAddressStats = { flows: 0n, packets: 0n, bytes: 0n };
  for (const b of perCpu) {
    s.flows += b.readBigUInt64LE(f.flows.offset);
    s.packets += b.readBigUInt64LE(f.packets.offset);
    s.bytes += b.readBigUInt64LE(f.bytes.offset);
  }
  return s;
}
