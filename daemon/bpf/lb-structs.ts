// TypeScript mirrors of the structs in bpf/lb-types.h (checked against the compiled object's BTF by
// test/unit/bpf-structs.test.ts). Addresses and ports travel in network order, as in the packet.
import { formatV4, formatV6 } from '../../lib/ip';
import type { StructLayout } from './fou-structs';
import { addressFamily, ipv4Bytes, ipv6Bytes, putIpv4 } from './fou-structs';
import type { MapLayout } from './map-layout';

export const LB_LAYOUTS: Record<string, StructLayout> = {
  lb_config: {
    size: 16,
    fields: { saddr: { offset: 0, size: 4 }, dport: { offset: 4, size: 2 }, pad: { offset: 6, size: 2 }, maglev_size: { offset: 8, size: 4 }, seed: { offset: 12, size: 4 } },
  },
  lb_service_key: { size: 8, fields: { vip: { offset: 0, size: 4 }, port: { offset: 4, size: 2 }, proto: { offset: 6, size: 1 }, pad: { offset: 7, size: 1 } } },
  lb_service: { size: 8, fields: { slot: { offset: 0, size: 4 }, flags: { offset: 4, size: 4 } } },
  lb_map_key: {
    size: 16,
    fields: {
      vip: { offset: 0, size: 4 }, client: { offset: 4, size: 4 }, vport: { offset: 8, size: 2 }, cport: { offset: 10, size: 2 },
      proto: { offset: 12, size: 1 }, pad: { offset: 13, size: 3 },
    },
  },
  lb_mapping: { size: 16, fields: { target: { offset: 0, size: 4 }, pad: { offset: 4, size: 4 }, last_ns: { offset: 8, size: 8 } } },
  lb_target_key: { size: 8, fields: { vip: { offset: 0, size: 4 }, target: { offset: 4, size: 4 } } },
  lb_event: { size: 24, fields: { key: { offset: 0, size: 16 }, target: { offset: 16, size: 4 }, kind: { offset: 20, size: 4 } } },
  lb_frag_key: { size: 12, fields: { saddr: { offset: 0, size: 4 }, daddr: { offset: 4, size: 4 }, id: { offset: 8, size: 2 }, proto: { offset: 10, size: 1 }, pad: { offset: 11, size: 1 } } },
  lb_frag: { size: 8, fields: { target: { offset: 0, size: 4 }, hash: { offset: 4, size: 4 } } },
  lb_stats: {
    size: 128,
    fields: Object.fromEntries(
      [
        'packets', 'bytes', 'misses', 'icmp_forwarded', 'drop_no_target', 'drop_no_port', 'drop_icmp_no_flow', 'drop_fragment', 'drop_error', 'report_lost',
        'drop_bad_header', 'drop_ip_options', 'fragments', 'too_big', 'mapping_full', 'drop_no_route',
      ].map((n, i) => [n, { offset: i * 8, size: 8 }]),
    ),
  },
  lb_node_stats: { size: 8, fields: { not_for_host: { offset: 0, size: 8 } } },
  // IPv6 VIPs: structs of their own beside the IPv4 ones (whose pinned layouts stay as they were).
  lb_config6: { size: 16, fields: { saddr: { offset: 0, size: 16 } } },
  lb_service_key6: { size: 20, fields: { vip: { offset: 0, size: 16 }, port: { offset: 16, size: 2 }, proto: { offset: 18, size: 1 }, pad: { offset: 19, size: 1 } } },
  lb_map_key6: {
    size: 40,
    fields: {
      vip: { offset: 0, size: 16 }, client: { offset: 16, size: 16 }, vport: { offset: 32, size: 2 }, cport: { offset: 34, size: 2 },
      proto: { offset: 36, size: 1 }, pad: { offset: 37, size: 3 },
    },
  },
  lb_mapping6: { size: 24, fields: { target: { offset: 0, size: 16 }, last_ns: { offset: 16, size: 8 } } },
  lb_target_key6: { size: 32, fields: { vip: { offset: 0, size: 16 }, target: { offset: 16, size: 16 } } },
  lb_frag_key6: { size: 36, fields: { saddr: { offset: 0, size: 16 }, daddr: { offset: 16, size: 16 }, id: { offset: 32, size: 4 } } },
  lb_frag6: { size: 24, fields: { target: { offset: 0, size: 16 }, hash: { offset: 16, size: 4 }, pad: { offset: 20, size: 4 } } },
  lb_event6: { size: 64, fields: { key: { offset: 0, size: 40 }, target: { offset: 40, size: 16 }, kind: { offset: 56, size: 4 }, pad: { offset: 60, size: 4 } } },
};

// must match bpf/lb-types.h
export const LB_F_PER_FLOW = 0x1;
/** New picks are not reported on the ring buffer (record on change; lb-types.h). */
export const LB_F_QUIET = 0x2;
export const LB_TARGET_ACTIVE = 1;
export const LB_TARGET_TERMINATING = 2;
export const LB_MAX_VIPS_DEFAULT = 16;
export const LB_MAGLEV_DEFAULT = 65537;

export const PROTO = { TCP: 6, UDP: 17 } as const;
export type Protocol = keyof typeof PROTO;

const L = LB_LAYOUTS;

/** Layout versions of the maps in bpf/lb-maps.h and how an older pin is carried over (map-layout.ts). */
export const LB_MAP_LAYOUTS: Record<string, MapLayout> = {
  lb_cfg: { version: 1, convert: 'prefix' },
  lb_services: { version: 1, convert: 'copy' },
  // Client → target: a live client keeps its target only if its mapping survives (the store may hold it too).
  // A pin of the LRU type (before the node datapath) is copied into the plain hash as it is.
  lb_mappings: { version: 1, convert: 'copy', catchUp: true },
  lb_frags: { version: 1, convert: 'replace' }, // where fragmented datagrams in flight went: seconds of state
  lb_targets: { version: 1, convert: 'copy' },
  // Rows of maglev_size entries per slot: a resize may change the row length, and the controller writes
  // every served VIP's row before it attaches an LB pod, so the rows are rebuilt rather than copied.
  lb_maglev: { version: 1, convert: 'replace' },
  lb_events: { version: 1, convert: 'replace' }, // a ring buffer: nothing to carry
  lb_stats: { version: 1, convert: 'prefix' }, // per-slot counters; slots keep their index; new counters start at 0
  lb_node_stats: { version: 1, convert: 'prefix' }, // node counters (new beside ccd851b's maps, which do not name it)
  // IPv6 VIPs: new maps, so no earlier pin changes layout; a release before them does not declare them and
  // leaves their pins alone. Converters as their IPv4 counterparts'.
  lb_cfg6: { version: 1, convert: 'prefix' },
  lb_services6: { version: 1, convert: 'copy' },
  lb_mappings6: { version: 1, convert: 'copy', catchUp: true },
  lb_targets6: { version: 1, convert: 'copy' },
  lb_maglev6: { version: 1, convert: 'replace' },
  lb_frags6: { version: 1, convert: 'replace' },
  lb_events6: { version: 1, convert: 'replace' },
  lb_scratch6: { version: 1, convert: 'replace' }, // per-CPU working memory of the IPv6 path: nothing to carry
  // The node program's per-CPU next-hop caches (bpf/lb-nexthop.h): entries live 100 ms, nothing to carry.
  lb_nexthops: { version: 1, convert: 'replace' },
  lb_nexthops6: { version: 1, convert: 'replace' },
};

/** lb_config; an outerSource of '' leaves the IPv4 source 0 (a node with IPv6 VIPs only: IPv4 passes untouched). */
export function encodeLbConfig(c: { outerSource: string; port: number; maglevSize: number; seed: number }): Buffer {
  const b = Buffer.alloc(L.lb_config.size);
  if (c.outerSource) ipv4Bytes(c.outerSource, 'outerSource').copy(b, 0);
  b.writeUInt16BE(c.port, 4);
  b.writeUInt32LE(c.maglevSize, 8);
  b.writeUInt32LE(c.seed >>> 0, 12);
  return b;
}

/** lb_config6: the outer IPv6 source of FoU to IPv6 targets. */
export function encodeLbConfig6(outerSource6: string): Buffer {
  return ipv6Bytes(outerSource6, 'outerSource6');
}

/** A service port of a VIP; port 0 / proto 0 is the VIP's own entry (refuses its other ports). */
export function encodeServiceKey(vip: string, port: number, proto: number): Buffer {
  if (addressFamily(vip, 'vip') === 6) return encodeServiceKey6(vip, port, proto);
  const b = Buffer.alloc(L.lb_service_key.size);
  ipv4Bytes(vip, 'vip').copy(b, 0);
  b.writeUInt16BE(port, 4);
  b.writeUInt8(proto, 6);
  return b;
}

/** Decodes an lb_service_key, or an lb_service_key6 (told apart by size). */
export function decodeServiceKey(b: Buffer): { vip: string; port: number; proto: number } {
  if (b.length === L.lb_service_key6.size) return { vip: formatV6(b, 0), port: b.readUInt16BE(16), proto: b.readUInt8(18) };
  return { vip: formatV4(b, 0), port: b.readUInt16BE(4), proto: b.readUInt8(6) };
}

export function encodeServiceKey6(vip: string, port: number, proto: number): Buffer {
  const b = Buffer.alloc(L.lb_service_key6.size);
  ipv6Bytes(vip, 'vip').copy(b, 0);
  b.writeUInt16BE(port, 16);
  b.writeUInt8(proto, 18);
  return b;
}

export function encodeService(slot: number, flags: number): Buffer {
  const b = Buffer.alloc(L.lb_service.size);
  b.writeUInt32LE(slot, 0);
  b.writeUInt32LE(flags, 4);
  return b;
}

/** A mapping key; client affinity leaves vport, cport and proto 0. */
export interface MapKey {
  vip: string;
  client: string;
  vport: number;
  cport: number;
  proto: number;
}

/** Encodes a mapping key: an lb_map_key, or an lb_map_key6 when the VIP is IPv6 (client of the same family). */
export function encodeMapKey(k: MapKey): Buffer {
  if (addressFamily(k.vip, 'vip') === 6) return encodeMapKey6(k);
  const b = Buffer.alloc(L.lb_map_key.size);
  putIpv4(k.vip, b, 0, 'vip');
  putIpv4(k.client, b, 4, 'client');
  b.writeUInt16BE(k.vport, 8);
  b.writeUInt16BE(k.cport, 10);
  b.writeUInt8(k.proto, 12);
  return b;
}

/** Decodes an lb_map_key at off, or an lb_map_key6 when the buffer holds exactly one at off (40 bytes). */
export function decodeMapKey(b: Buffer, off = 0): MapKey {
  if (b.length - off === L.lb_map_key6.size) return decodeMapKey6(b, off);
  return { vip: formatV4(b, off), client: formatV4(b, off + 4), vport: b.readUInt16BE(off + 8), cport: b.readUInt16BE(off + 10), proto: b.readUInt8(off + 12) };
}

export function encodeMapKey6(k: MapKey): Buffer {
  const b = Buffer.alloc(L.lb_map_key6.size);
  ipv6Bytes(k.vip, 'vip').copy(b, 0);
  ipv6Bytes(k.client, 'client').copy(b, 16);
  b.writeUInt16BE(k.vport, 32);
  b.writeUInt16BE(k.cport, 34);
  b.writeUInt8(k.proto, 36);
  return b;
}

export function decodeMapKey6(b: Buffer, off = 0): MapKey {
  return { vip: formatV6(b, off), client: formatV6(b, off + 16), vport: b.readUInt16BE(off + 32), cport: b.readUInt16BE(off + 34), proto: b.readUInt8(off + 36) };
}

/** An lb_mapping, or an lb_mapping6 for an IPv6 target. */
export function encodeMapping(target: string, lastNs = 0n): Buffer {
  if (addressFamily(target, 'target') === 6) {
    const b6 = Buffer.alloc(L.lb_mapping6.size);
    ipv6Bytes(target, 'target').copy(b6, 0);
    b6.writeBigUInt64LE(lastNs, 16);
    return b6;
  }
  const b = Buffer.alloc(L.lb_mapping.size);
  putIpv4(target, b, 0, 'target');
  b.writeBigUInt64LE(lastNs, 8);
  return b;
}

/** Decodes an lb_mapping, or an lb_mapping6 (told apart by size). */
export function decodeMapping(b: Buffer): { target: string; lastNs: bigint } {
  if (b.length === L.lb_mapping6.size) return { target: formatV6(b, 0), lastNs: b.readBigUInt64LE(16) };
  return { target: formatV4(b, 0), lastNs: b.readBigUInt64LE(8) };
}

/** An lb_target_key, or an lb_target_key6 when the VIP is IPv6. */
export function encodeTargetKey(vip: string, target: string): Buffer {
  if (addressFamily(vip, 'vip') === 6) {
    const b6 = Buffer.alloc(L.lb_target_key6.size);
    ipv6Bytes(vip, 'vip').copy(b6, 0);
    ipv6Bytes(target, 'target').copy(b6, 16);
    return b6;
  }
  const b = Buffer.alloc(L.lb_target_key.size);
  ipv4Bytes(vip, 'vip').copy(b, 0);
  ipv4Bytes(target, 'target').copy(b, 4);
  return b;
}

export function decodeTargetKey(b: Buffer): { vip: string; target: string } {
  if (b.length === L.lb_target_key6.size) return { vip: formatV6(b, 0), target: formatV6(b, 16) };
  return { vip: formatV4(b, 0), target: formatV4(b, 4) };
}

/** A record of lb_events (struct lb_event, 24 bytes). */
export function decodeEvent(b: Buffer): { key: MapKey; target: string; kind: number } {
  return { key: decodeMapKey(b.subarray(0, 16), 0), target: formatV4(b, 16), kind: b.readUInt32LE(20) };
}

/** A record of lb_events6 (struct lb_event6, 64 bytes). */
export function decodeEvent6(b: Buffer): { key: MapKey; target: string; kind: number } {
  return { key: decodeMapKey6(b, 0), target: formatV6(b, 40), kind: b.readUInt32LE(56) };
}

export interface LbStats {
  packets: bigint;
  bytes: bigint;
  misses: bigint;
  icmpForwarded: bigint;
  dropNoTarget: bigint;
  dropNoPort: bigint;
  dropIcmpNoFlow: bigint;
  dropFragment: bigint;
  dropError: bigint;
  reportLost: bigint;
  /** IPv4 header checksum wrong or lengths inconsistent. */
  dropBadHeader: bigint;
  dropIpOptions: bigint;
  /** Later fragments forwarded to their first fragment's target. */
  fragments: bigint;
  /** Over the path MTU once encapsulated: ICMP frag-needed sent to the client (node datapath). */
  tooBig: bigint;
  /** New flows forwarded by their Maglev pick without a mapping here: the table was full. */
  mappingFull: bigint;
  dropNoRoute: bigint;
}

export const STAT_NAMES: Array<keyof LbStats> = [
  'packets', 'bytes', 'misses', 'icmpForwarded', 'dropNoTarget', 'dropNoPort', 'dropIcmpNoFlow', 'dropFragment', 'dropError', 'reportLost',
  'dropBadHeader', 'dropIpOptions', 'fragments', 'tooBig', 'mappingFull', 'dropNoRoute',
];

/** Per-CPU node counters (bpf/lb-types.h struct lb_node_stats). */
export interface LbNodeStats {
  /** VIP frames not addressed to this host (a bridge's flood, a promiscuous uplink): passed to the stack, not balanced. */
  notForHost: bigint;
}

export function sumLbNodeStats(perCpu: Buffer[]): LbNodeStats {
  let notForHost = 0n;
  for (const b of perCpu) notForHost += b.readBigUInt64LE(0);
  return { notForHost };
}

export function sumLbStats(perCpu: Buffer[]): LbStats {
  const s = Object.fromEntries(STAT_NAMES.map((n) => [n, 0n])) as unknown as LbStats;
  for (const b of perCpu) STAT_NAMES.forEach((n, i) => { s[n] += b.readBigUInt64LE(i * 8); });
  return s;
}

/** One round of lb_mix (lb-core.h): murmur3's block mix. */
function lbMix(h: number, k: number): number {
  k = Math.imul(k, 0xcc9e2d51);
  k = (k << 15) | (k >>> 17);
  k = Math.imul(k, 0x1b873593);
  h ^= k;
  h = (h << 13) | (h >>> 19);
  return (Math.imul(h, 5) + 0xe6546b64) | 0;
}

/**
 * lb_hash of lb-core.h, bit for bit: the words are the key's fields as the program loads them (network
 * byte order read little-endian), so tetherd computes the pick every LB node's datapath makes for a key.
 */
export function lbHash(k: MapKey, seed: number): number {
  return lbHashKeyBytes(encodeMapKey(k), seed);
}

/**
 * lbHash of a key as the mapping table holds it (lb_map_key's bytes at off, or an lb_map_key6's when the
 * buffer holds exactly one at off): no decoding, no re-encoding.
 */
export function lbHashKeyBytes(b: Uint8Array, seed: number, off = 0): number {
  if (b.length - off === L.lb_map_key6.size) return lbHash6KeyBytes(b, seed, off);
  const le32 = (o: number) => (b[off + o] | (b[off + o + 1] << 8) | (b[off + o + 2] << 16) | (b[off + o + 3] << 24)) >>> 0;
  const le16 = (o: number) => b[off + o] | (b[off + o + 1] << 8);
  let h = seed | 0;
  h = lbMix(h, le32(0));
  h = lbMix(h, le32(4));
  h = lbMix(h, ((le16(8) << 16) | le16(10)) >>> 0);
  h = lbMix(h, b[off + 12]);
  h ^= 16;
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  h ^= h >>> 16;
  return h >>> 0;
}

/** lb_hash6 of lb-core.h over an lb_map_key6's bytes at off, bit for bit (the words of both addresses first). */
export function lbHash6KeyBytes(b: Uint8Array, seed: number, off = 0): number {
  const le32 = (o: number) => (b[off + o] | (b[off + o + 1] << 8) | (b[off + o + 2] << 16) | (b[off + o + 3] << 24)) >>> 0;
  const le16 = (o: number) => b[off + o] | (b[off + o + 1] << 8);
  let h = seed | 0;
  for (let i = 0; i < 32; i += 4) h = lbMix(h, le32(i));
  h = lbMix(h, ((le16(32) << 16) | le16(34)) >>> 0);
  h = lbMix(h, b[off + 36]);
  h ^= 40;
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  h ^= h >>> 16;
  return h >>> 0;
}
