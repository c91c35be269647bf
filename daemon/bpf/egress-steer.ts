// Client side of egress: the steering program on client pods' host-side veths (tc ingress) and the node's
// one shared set of egress maps (destinations, clients, gateway slots, settings, counters), pinned under
// <pinDir>/egress/ so every attachment on the node and a restarted tetherd use the same maps.
import * as fs from 'node:fs';
import * as path from 'node:path';
import { log } from '../../lib/log';
import { readNetSysctl, writeNetSysctl } from '../sys/netns';
import { BpfObject } from './object';
import { BpfMap } from './map';
import { bpfObjectDir } from './fou';
import { ipv4Bytes } from './fou-structs';
import { attachTc, detachTc, type TcAttachment } from './tc';
import {
  checkEgressId, decodeEgressClient, decodeEgressConfig, decodeEgressDest, decodeEgressDestKey, decodeEgressGateways,
  encodeEgressClient, encodeEgressConfig, encodeEgressDest, encodeEgressDestKey, encodeEgressGateways, parseIpv4Prefix,
  sumEgressStats, sumEgressAddressStats, decodeEgressFlow, EGRESS_ID_GLOBAL, type EgressAction, type EgressConfig, type EgressSlot,
  type EgressStats, type EgressFlow, type EgressAddressStats, EGRESS_MAP_LAYOUTS,
} from './egress-structs';
import { TetherError, ErrorCode } from '../../lib/errors';
import { formatV4 } from '../../lib/ip';

export type { EgressSlot, EgressStats, EgressFlow, EgressAddressStats } from './egress-structs';

/** tc filter id and object of the steering program; fixed so a restarted tetherd finds its filters. */
export const EGRESS_TC = { handle: 1, priority: 0x110, object: 'egress-steer', program: 'egress_steer', pinName: 'egress' } as const;

const MAP_NAMES = ['egress_cfg', 'egress_dest', 'egress_clients', 'egress_gateways', 'egress_stats', 'egress_flows', 'egress_addr_stats'] as const;
/** Default size of the node's flow pin map (flows per node; least recently used ones go first). */
export const DEFAULT_EGRESS_FLOWS = 65536;
type MapName = (typeof MAP_NAMES)[number];
const KEY0 = Buffer.alloc(4);

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
   * Replaces the destination prefixes of one Egress: packets of its clients to `steer` prefixes are
   * encapsulated unless a longer `bypass` prefix covers them. egressId 0 holds global bypass prefixes
   * (cluster pod and service ranges) that beat every Egress; it takes no steer prefixes. New entries go
   * in before stale ones leave, so a prefix present before and after never stops matching.
   */
  setDestinations(egressId: number, steer: string[], bypass: string[]): void {
    checkEgressId(egressId, 'egressId', true);
    if (egressId === EGRESS_ID_GLOBAL && steer.length > 0) {
      throw new TetherError(ErrorCode.InvalidConfig, 'steer: egress id 0 holds global bypass prefixes only');
    }
    const want = new Map<string, [Buffer, Buffer]>();
    const add = (cidrs: string[], action: EgressAction, field: string) => cidrs.forEach((c, i) => {
      const key = encodeEgressDestKey(egressId, parseIpv4Prefix(c, `${field}[${i}]`));
      const prev = want.get(key.toString('hex'));
      if (prev && decodeEgressDest(prev[1]) !== action) {
        throw new TetherError(ErrorCode.InvalidConfig, `${field}[${i}]: ${c} is both steered and bypassed`);
      }
      want.set(key.toString('hex'), [key, encodeEgressDest(action)]);
    });
    add(steer, 'steer', 'steer');
    add(bypass, 'bypass', 'bypass');
    const map = this.mapOf('egress_dest');
    for (const [k, v] of want.values()) map.update(k, v); // LPM tries have no batch update
    for (const k of map.keys()) {
      if (decodeEgressDestKey(k).egressId === egressId && !want.has(k.toString('hex'))) map.delete(k);
    }
  }

  /** Destination prefixes (CIDR → action) of one Egress. */
  destinations(egressId: number): Map<string, EgressAction> {
    checkEgressId(egressId, 'egressId', true);
    const map = this.mapOf('egress_dest');
    const out = new Map<string, EgressAction>();
    for (const k of map.keys()) {
      const { egressId: id, prefix } = decodeEgressDestKey(k);
      const v = id === egressId ? map.lookup(k) : undefined;
      if (v) out.set(`${prefix.address}/${prefix.length}`, decodeEgressDest(v));
    }
    return out;
  }

  /** Makes podIp a client of these Egresses (priority order; first whose destinations steer wins). Empty: removes it. */
  setClient(podIp: string, egressIds: number[]): void {
    if (egressIds.length === 0) {
      this.removeClient(podIp);
      return;
    }
    this.mapOf('egress_clients').update(ipv4Bytes(podIp, 'podIp'), encodeEgressClient(egressIds));
  }

  /** Stops steering podIp's traffic; false when it was not a client. */
  removeClient(podIp: string): boolean {
    return this.mapOf('egress_clients').delete(ipv4Bytes(podIp, 'podIp'));
  }

  clients(): Map<string, number[]> {
    return new Map(this.mapOf('egress_clients').entries().map(([k, v]) => [formatV4(k), decodeEgressClient(v)]));
  }

  /**
   * Replaces the gateway slots of one Egress in a single map update, which the datapath sees atomically
   * (old set or new set, never a mix): the call to make on every ownership change. A new flow takes the
   * lowest tier present and, within it, the slot with the highest rendezvous score for its hash; it stays
   * pinned to that floating address while the address is a slot. An empty list keeps the Egress but
   * steers nothing: its clients' packets are dropped (counted as noGateway) until slots come back.
   */
  setGateways(egressId: number, slots: EgressSlot[]): void {
    this.mapOf('egress_gateways').update(egressKey(egressId), encodeEgressGateways(slots));
  }

  /** Gateway slots of one Egress; undefined when none were ever set. */
  gateways(egressId: number): EgressSlot[] | undefined {
    const v = this.mapOf('egress_gateways').lookup(egressKey(egressId));
    return v && decodeEgressGateways(v);
  }

  /** Removes an Egress's gateways and destinations (its clients keep their other Egresses). Idempotent. */
  removeEgress(egressId: number): void {
    this.setDestinations(egressId, [], []);
    this.mapOf('egress_gateways').delete(egressKey(egressId));
  }

  /** Node settings: outer source address and FoU port. */
  config(): EgressConfig {
    return decodeEgressConfig(this.mapOf('egress_cfg').lookup(KEY0)!);
  }

  setConfig(c: EgressConfig): void {
    this.mapOf('egress_cfg').update(KEY0, encodeEgressConfig(c));
  }

  /** The pinned flows (a dump: for tests and diagnostics, not for a hot path). */
  flows(): EgressFlow[] {
    return this.mapOf('egress_flows').entries().map(([k, v]) => decodeEgressFlow(k, v));
  }

  /** Flow, packet and byte counts of each floating address this node's clients used. */
  addressStats(): Map<string, EgressAddressStats> {
    const m = this.mapOf('egress_addr_stats');
    const out = new Map<string, EgressAddressStats>();
    for (const k of m.keys()) {
      const v = m.lookupPerCpu(k);
      if (v) out.set(formatV4(k), sumEgressAddressStats(v));
    }
    return out;
  }

  /** Forgets the counters of an address no Egress uses any more. */
  forgetAddress(floatingIp: string): void {
    this.mapOf('egress_addr_stats').delete(ipv4Bytes(floatingIp, 'floatingIp'));
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
  /** Outer source of FoU packets: an address of this node. */
  nodeAddress: string;
  /** Outer UDP destination port: the gateways' FoU decap port. */
  port: number;
  objectPath?: string;
  /** Size of the node's flow pin map when it is created (default DEFAULT_EGRESS_FLOWS). */
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
  return BpfObject.load(objectPath(file), { pinDir, name: EGRESS_TC.pinName, maxEntries: { egress_flows: maxFlows }, layouts: EGRESS_MAP_LAYOUTS });
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
    obj.map('egress_cfg').update(KEY0, encodeEgressConfig({ nodeAddress: o.nodeAddress, port: o.port }));
    allowLocalSource(o.netns ?? null, o.ifName);
    const attachment = attachTc({
      netns: o.netns, ifName: o.ifName, direction: 'ingress', progFd: obj.programFd(EGRESS_TC.program),
      handle: EGRESS_TC.handle, priority: EGRESS_TC.priority,
    });
    obj.settle();
    log().info('egress steer attached', { netns: o.netns, ifName: o.ifName, nodeAddress: o.nodeAddress, port: o.port });
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
