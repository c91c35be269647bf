// Client side of egress: the steering program on client pods' host-side veths (tc ingress) and the node's
// one shared set of egress maps (destinations, clients, gateway slots, settings, counters), pinned under
// <pinDir>/egress/ so every attachment on the node and a restarted tetherd use the same maps. IPv4 and IPv6
// have maps of their own; every method here takes and returns both, dispatching by address family.
import * as fs from 'node:fs';
import * as path from 'node:path';
import { log } from '../../lib/log';
import { readNetSysctl, writeNetSysctl } from '../sys/netns';
import { BpfObject } from './object';
import { BpfMap } from './map';
import { bpfObjectDir } from './fou';
import { addressFamily, ipBytes } from './fou-structs';
import { BpfCallError } from './libbpf';
import { attachTc, detachTc, type TcAttachment } from './tc';
import {
  checkEgressId, decodeEgressClient, decodeEgressConfig, decodeEgressDest, decodeEgressDestKey, decodeEgressDest6Key, decodeEgressGateways,
  decodeEgressGateways6, encodeEgressClient, encodeEgressConfig, encodeEgressDest, encodeEgressDestKey, encodeEgressDest6Key,
  encodeEgressGateways, encodeEgressGateways6, encodeEgressGateways66, decodeEgressGateways66, hasIpv6Gateway, encodeEgressConfig6,
  decodeEgressConfig6, type EgressConfig6, parseIpPrefix, splitSlotsByFamily, sumEgressStats, sumEgressAddressStats, decodeEgressFlow,
  decodeEgressFlow6, EGRESS_ID_GLOBAL, type EgressAction, type EgressConfig, type EgressSlot, type EgressStats, type EgressFlow,
  type EgressAddressStats, type Ipv4Prefix, EGRESS_MAP_LAYOUTS,
} from './egress-structs';
import { TetherError, ErrorCode } from '../../lib/errors';
import { bytesToIp } from '../../lib/ip';

export type { EgressSlot, EgressStats, EgressFlow, EgressAddressStats } from './egress-structs';

/** tc filter id and object of the steering program; fixed so a restarted tetherd finds its filters. */
export const EGRESS_TC = { handle: 1, priority: 0x110, object: 'egress-steer', program: 'egress_steer', pinName: 'egress' } as const;

const MAP_NAMES = [
  'egress_cfg', 'egress_dest', 'egress_clients', 'egress_gateways', 'egress_stats', 'egress_flows', 'egress_addr_stats',
  'egress_dest6', 'egress_clients6', 'egress_gateways6', 'egress_flows6', 'egress_addr_stats6',
  'egress_cfg6', 'egress_gateways66',
] as const;
/** Default size of the node's flow pin map (flows per node; least recently used ones go first). */
export const DEFAULT_EGRESS_FLOWS = 65536;
type MapName = (typeof MAP_NAMES)[number];
type Map6Name = 'egress_dest6' | 'egress_clients6' | 'egress_gateways6' | 'egress_flows6' | 'egress_addr_stats6' | 'egress_cfg6' | 'egress_gateways66';
const KEY0 = Buffer.alloc(4);
const ENOENT = 2;

/** The destination maps of each family: which map, and how its keys are written and read. */
const DEST = {
  4: { map: 'egress_dest', encode: encodeEgressDestKey, decode: decodeEgressDestKey },
  6: { map: 'egress_dest6', encode: encodeEgressDest6Key, decode: decodeEgressDest6Key },
} as const satisfies Record<4 | 6, { map: MapName; encode: (id: number, p: Ipv4Prefix) => Buffer; decode: (b: Buffer) => { egressId: number; prefix: Ipv4Prefix } }>;

function objectPath(o?: string): string {
  return o ?? path.join(bpfObjectDir(), `${EGRESS_TC.object}.bpf.o`);
}

function egressKey(id: number): Buffer {
  const k = Buffer.alloc(4);
  k.writeUInt32LE(checkEgressId(id));
  return k;
}

/**
 * The node's egress maps. Every method is idempotent and writes the kernel maps directly, so the
 * datapath follows each call at once; they work the same on an attachment and on maps opened from pins.
 */
export class EgressMaps {
  constructor(private readonly mapOf: (name: MapName) => BpfMap, private readonly release: () => void) {}

  /**
   * An IPv6 map. Pins written by the release before have none (openEgressMaps without create): reading
   * finds nothing there, and only writing IPv6 entries needs the map (need), which then fails saying so.
   */
  private map6(name: Map6Name, need: boolean): BpfMap | undefined {
    try {
      return this.mapOf(name);
    } catch (e) {
      if (!(e instanceof BpfCallError && e.errno === ENOENT)) throw e;
      if (!need) return undefined;
      throw new TetherError(ErrorCode.Bpf, `${name}: the node's egress maps have no IPv6 maps yet (pins of an older release); open them with create first`, { cause: e });
    }
  }

  private mapOfFamily(family: 4 | 6, name4: MapName, name6: Map6Name, need = true): BpfMap | undefined {
    return family === 4 ? this.mapOf(name4) : this.map6(name6, need);
  }

  /**
   * Replaces the destination prefixes of one Egress: packets of its clients to `steer` prefixes are
   * encapsulated unless a longer `bypass` prefix covers them. egressId 0 holds global bypass prefixes
   * (cluster pod and service ranges) that beat every Egress; it takes no steer prefixes. New entries go
   * in before stale ones leave, so a prefix present before and after never stops matching. IPv4 and IPv6
   * prefixes may be mixed; each family's map gets its own.
   */
  setDestinations(egressId: number, steer: string[], bypass: string[]): void {
    checkEgressId(egressId, 'egressId', true);
    if (egressId === EGRESS_ID_GLOBAL && steer.length > 0) {
      throw new TetherError(ErrorCode.InvalidConfig, 'steer: egress id 0 holds global bypass prefixes only');
    }
    const want = { 4: new Map<string, [Buffer, Buffer]>(), 6: new Map<string, [Buffer, Buffer]>() };
    const add = (cidrs: string[], action: EgressAction, field: string) => cidrs.forEach((c, i) => {
      const p = parseIpPrefix(c, `${field}[${i}]`);
      const key = DEST[p.family].encode(egressId, p);
      const prev = want[p.family].get(key.toString('hex'));
      if (prev && decodeEgressDest(prev[1]) !== action) {
        throw new TetherError(ErrorCode.InvalidConfig, `${field}[${i}]: ${c} is both steered and bypassed`);
      }
      want[p.family].set(key.toString('hex'), [key, encodeEgressDest(action)]);
    });
    add(steer, 'steer', 'steer');
    add(bypass, 'bypass', 'bypass');
    for (const family of [4, 6] as const) {
      // Pins without the IPv6 map hold no IPv6 prefix to remove: only adding one needs the map.
      const map = this.mapOfFamily(family, 'egress_dest', 'egress_dest6', want[family].size > 0);
      if (!map) continue;
      for (const [k, v] of want[family].values()) map.update(k, v); // LPM tries have no batch update
      for (const k of map.keys()) {
        if (DEST[family].decode(k).egressId === egressId && !want[family].has(k.toString('hex'))) map.delete(k);
      }
    }
  }

  /** Destination prefixes (CIDR → action) of one Egress, IPv4 then IPv6. */
  destinations(egressId: number): Map<string, EgressAction> {
    checkEgressId(egressId, 'egressId', true);
    const out = new Map<string, EgressAction>();
    for (const family of [4, 6] as const) {
      const map = this.mapOfFamily(family, 'egress_dest', 'egress_dest6', false);
      for (const k of map?.keys() ?? []) {
        const { egressId: id, prefix } = DEST[family].decode(k);
        const v = id === egressId ? map!.lookup(k) : undefined;
        if (v) out.set(`${prefix.address}/${prefix.length}`, decodeEgressDest(v));
      }
    }
    return out;
  }

  /** Makes podIp (IPv4 or IPv6) a client of these Egresses (priority order; first whose destinations steer wins). Empty: removes it. */
  setClient(podIp: string, egressIds: number[]): void {
    if (egressIds.length === 0) {
      this.removeClient(podIp);
      return;
    }
    const map = this.mapOfFamily(addressFamily(podIp, 'podIp'), 'egress_clients', 'egress_clients6')!;
    map.update(ipBytes(podIp, 'podIp'), encodeEgressClient(egressIds));
  }

  /** Stops steering podIp's traffic; false when it was not a client. */
  removeClient(podIp: string): boolean {
    const map = this.mapOfFamily(addressFamily(podIp, 'podIp'), 'egress_clients', 'egress_clients6', false);
    return map ? map.delete(ipBytes(podIp, 'podIp')) : false;
  }

  /** Client pods of both families → their Egress ids. */
  clients(): Map<string, number[]> {
    const out = new Map<string, number[]>();
    for (const family of [4, 6] as const) {
      for (const [k, v] of this.mapOfFamily(family, 'egress_clients', 'egress_clients6', false)?.entries() ?? []) out.set(bytesToIp(k), decodeEgressClient(v));
    }
    return out;
  }

  /**
   * Replaces the gateway slots of one Egress in a single map update per family, which the datapath sees
   * atomically (old set or new set, never a mix): the call to make on every ownership change. Slots of
   * both families may be mixed: they are split by the floating address's family (IPv4 flows take IPv4
   * slots, IPv6 flows IPv6 ones). A gateway is an IPv4 address (outer IPv4), or for an IPv6 slot an IPv6
   * one (outer IPv6: a gateway pod without IPv4, or an IPv6 underlay), which puts the Egress's IPv6 slots in
   * egress_gateways66 (the program asks it first) and, for the release before, the slots with an IPv4
   * gateway in egress_gateways6. An Egress with no IPv6 gateway is written exactly as before. A new flow
   * takes the lowest tier present and, within it, the slot with the highest rendezvous score for its hash;
   * it stays pinned to that floating address while the address is a slot. A family with no slots keeps
   * the Egress but steers nothing of that family: its clients' packets to its destinations are dropped
   * (counted as noGateway) until slots come back.
   */
  setGateways(egressId: number, slots: EgressSlot[]): void {
    const key = egressKey(egressId);
    const { v4, v6 } = splitSlotsByFamily(slots);
    this.mapOf('egress_gateways').update(key, encodeEgressGateways(v4));
    if (hasIpv6Gateway(v6)) {
      // The new set first, which the program asks first; then what a program of the release before (which
      // knows only egress_gateways6) can reach.
      this.map6('egress_gateways66', true)!.update(key, encodeEgressGateways66(v6));
      this.map6('egress_gateways6', true)!.update(key, encodeEgressGateways6(v6.filter((x) => addressFamily(x.gatewayIp) === 4)));
      return;
    }
    // Pins of the release before have no IPv6 slots map; with no IPv6 slot there is nothing to write.
    this.map6('egress_gateways6', v6.length > 0)?.update(key, encodeEgressGateways6(v6));
    // Only once egress_gateways6 holds the whole set does the program stop reading the IPv6-gateway one.
    this.map6('egress_gateways66', false)?.delete(key);
  }

  /** Gateway slots of one Egress, IPv4 then IPv6; undefined when none were ever set. */
  gateways(egressId: number): EgressSlot[] | undefined {
    const key = egressKey(egressId);
    const v4 = this.mapOf('egress_gateways').lookup(key);
    const v66 = this.map6('egress_gateways66', false)?.lookup(key);
    const v6 = this.map6('egress_gateways6', false)?.lookup(key);
    if (!v4 && !v6 && !v66) return undefined;
    return [...(v4 ? decodeEgressGateways(v4) : []), ...(v66 ? decodeEgressGateways66(v66) : v6 ? decodeEgressGateways6(v6) : [])];
  }

  /** Removes an Egress's gateways and destinations of both families (its clients keep their other Egresses). Idempotent. */
  removeEgress(egressId: number): void {
    this.setDestinations(egressId, [], []);
    this.mapOf('egress_gateways').delete(egressKey(egressId));
    this.map6('egress_gateways66', false)?.delete(egressKey(egressId));
    this.map6('egress_gateways6', false)?.delete(egressKey(egressId));
  }

  /** Node settings: outer source address and FoU port. */
  config(): EgressConfig {
    return decodeEgressConfig(this.mapOf('egress_cfg').lookup(KEY0)!);
  }

  setConfig(c: EgressConfig): void {
    this.mapOf('egress_cfg').update(KEY0, encodeEgressConfig(c));
  }

  /** Node settings for outer IPv6 (IPv6 gateways); undefined on pins of the release before. */
  config6(): EgressConfig6 | undefined {
    const v = this.map6('egress_cfg6', false)?.lookup(KEY0);
    return v ? decodeEgressConfig6(v) : undefined;
  }

  setConfig6(c: EgressConfig6): void {
    this.map6('egress_cfg6', true)!.update(KEY0, encodeEgressConfig6(c));
  }

  /** The pinned flows of both families (a dump: for tests and diagnostics, not for a hot path). */
  flows(): EgressFlow[] {
    return [
      ...this.mapOf('egress_flows').entries().map(([k, v]) => decodeEgressFlow(k, v)),
      ...(this.map6('egress_flows6', false)?.entries() ?? []).map(([k, v]) => decodeEgressFlow6(k, v)),
    ];
  }

  /** Flow, packet and byte counts of each floating address (IPv4 and IPv6) this node's clients used. */
  addressStats(): Map<string, EgressAddressStats> {
    const out = new Map<string, EgressAddressStats>();
    for (const family of [4, 6] as const) {
      const m = this.mapOfFamily(family, 'egress_addr_stats', 'egress_addr_stats6', false);
      for (const k of m?.keys() ?? []) {
        const v = m!.lookupPerCpu(k);
        if (v) out.set(bytesToIp(k), sumEgressAddressStats(v));
      }
    }
    return out;
  }

  /** Forgets the counters of an address no Egress uses any more. */
  forgetAddress(floatingIp: string): void {
    this.mapOfFamily(addressFamily(floatingIp, 'floatingIp'), 'egress_addr_stats', 'egress_addr_stats6', false)?.delete(ipBytes(floatingIp, 'floatingIp'));
  }

  /** Counters summed over CPUs and over every attachment on the node (they share the map). */
  stats(): EgressStats {
    return sumEgressStats(this.mapOf('egress_stats').lookupPerCpu(KEY0) ?? []);
  }

  /** Releases this handle's file descriptors; maps and attachments stay. */
  close(): void {
    this.release();
  }
}

export interface EgressSteerOptions {
  netns?: string | null;
  /** The client pod's host-side veth (packets the pod sends arrive at its ingress). */
  ifName: string;
  /** bpffs directory; the shared maps live at <pinDir>/egress/<map>. */
  pinDir: string;
  /**
   * Outer source of FoU packets: an address of this node. IPv4 (the IPv4 underlay) or IPv6 (an IPv6
   * underlay: then it is the outer IPv6 source too, and IPv4 gateways are unreachable).
   */
  nodeAddress: string;
  /** Outer source to IPv6 gateways over an IPv4 underlay: an IPv6 address of this node (ignored when nodeAddress is IPv6). */
  nodeAddress6?: string;
  /** Outer UDP destination port: the gateways' FoU decap port. */
  port: number;
  objectPath?: string;
  /** Size of the node's flow pin maps (each family's) when created (default DEFAULT_EGRESS_FLOWS). */
  maxFlows?: number;
}

export class EgressSteer extends EgressMaps {
  constructor(private readonly obj: BpfObject, readonly attachment: TcAttachment, readonly pinDir: string) {
    super((name) => obj.map(name), () => obj.close());
  }

  /**
   * Removes this veth's filter and releases the object. The maps stay pinned for the node's other
   * attachments unless unpin (the node's last client is gone). Idempotent.
   */
  detach(opts: { unpin?: boolean } = {}): void {
    const a = this.attachment;
    detachTc({ netns: a.netns, ifindex: a.ifindex, direction: a.direction, handle: a.handle, priority: a.priority });
    if (opts.unpin) removeEgressPins(this.pinDir);
    this.obj.close();
  }
}

function load(pinDir: string, file?: string, maxFlows = DEFAULT_EGRESS_FLOWS): BpfObject {
  return BpfObject.load(objectPath(file), { pinDir, name: EGRESS_TC.pinName, maxEntries: { egress_flows: maxFlows, egress_flows6: maxFlows }, layouts: EGRESS_MAP_LAYOUTS });
}

/**
 * The outer source is this node's own address, arriving on the veth: without accept_local the stack
 * drops it as a martian; strict rp_filter would drop it too (the reverse path of a local address is not
 * the veth), so strict becomes loose on this interface. Both only concern packets entering from the pod.
 */
function allowLocalSource(netns: string | null, ifName: string): void {
  writeNetSysctl(netns, `net/ipv4/conf/${ifName}/accept_local`, '1');
  const strict = ['all', ifName].some((dev) => readNetSysctl(netns, `net/ipv4/conf/${dev}/rp_filter`) === '1');
  if (strict) writeNetSysctl(netns, `net/ipv4/conf/${ifName}/rp_filter`, '2');
}

/**
 * Attaches egress steering at ifName's ingress, loading the program over the node's pinned maps (created
 * on first use, shared afterwards) and writing the node settings. Replaces an earlier attachment on ifName.
 */
export function attachEgressSteer(o: EgressSteerOptions): EgressSteer {
  const obj = load(o.pinDir, o.objectPath, o.maxFlows);
  try {
    const v6 = addressFamily(o.nodeAddress, 'nodeAddress') === 6;
    // An IPv6 underlay has no IPv4 source: egress_cfg stays zero (IPv4 steering counts errors and drops).
    if (!v6) obj.map('egress_cfg').update(KEY0, encodeEgressConfig({ nodeAddress: o.nodeAddress, port: o.port }));
    const nodeAddress6 = v6 ? o.nodeAddress : o.nodeAddress6;
    obj.map('egress_cfg6').update(KEY0, encodeEgressConfig6({ ...(nodeAddress6 ? { nodeAddress6 } : {}), port: o.port }));
    allowLocalSource(o.netns ?? null, o.ifName);
    const attachment = attachTc({
      netns: o.netns, ifName: o.ifName, direction: 'ingress', progFd: obj.programFd(EGRESS_TC.program),
      handle: EGRESS_TC.handle, priority: EGRESS_TC.priority,
    });
    obj.settle();
    log().info('egress steer attached', { netns: o.netns, ifName: o.ifName, nodeAddress: o.nodeAddress, ...(nodeAddress6 && !v6 ? { nodeAddress6 } : {}), port: o.port });
    return new EgressSteer(obj, attachment, o.pinDir);
  } catch (e) {
    obj.close();
    throw e;
  }
}

/**
 * The node's egress maps from their pins (after a restart, or for the controller, which needs no
 * attachment). create: load the object once first, which creates missing pins and migrates pins of an
 * older layout (an upgraded tetherd), so the maps opened here are the ones its programs will use.
 */
export function openEgressMaps(pinDir: string, opts: { create?: boolean; objectPath?: string; maxFlows?: number } = {}): EgressMaps {
  const dir = path.join(pinDir, EGRESS_TC.pinName);
  if (opts.create) load(pinDir, opts.objectPath, opts.maxFlows).close();
  const open = new Map<MapName, BpfMap>();
  const mapOf = (name: MapName) => {
    let m = open.get(name);
    if (!m) {
      m = BpfMap.fromPin(path.join(dir, name));
      open.set(name, m);
    }
    return m;
  };
  return new EgressMaps(mapOf, () => {
    for (const m of open.values()) m.close();
    open.clear();
  });
}

/** Detaches steering from a veth by its fixed tc id (after a restart). Idempotent: false when not attached. */
export function detachEgressSteer(o: { netns?: string | null; ifName: string }): boolean {
  return detachTc({ netns: o.netns, ifName: o.ifName, direction: 'ingress', handle: EGRESS_TC.handle, priority: EGRESS_TC.priority });
}

/** Removes the node's egress pins; the maps die with their last attached program. Idempotent. */
export function removeEgressPins(pinDir: string): void {
  fs.rmSync(path.join(pinDir, EGRESS_TC.pinName), { recursive: true, force: true });
}

/** Counters from the pins. */
export function readEgressStats(pinDir: string): EgressStats {
  const m = openEgressMaps(pinDir);
  try {
    return m.stats();
  } finally {
    m.close();
  }
}
