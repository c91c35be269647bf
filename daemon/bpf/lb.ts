// The load balancer datapath of one node: one lb.bpf.o whose maps are pinned under <pinDir>/lb and shared
// by its two programs: lb_ingress at tc ingress of every LB pod's interface, and (--lb-datapath=node)
// lb_node at tc ingress of the node's uplink, which handles VIP traffic where it arrives. tetherd writes
// the services, targets and Maglev rows, installs mappings learnt from the store, reads the mappings the
// program chose from the ring buffer, and reads counters. After a restart the pinned maps (and with them
// every mapping) are reused, and the filters are found again by their fixed tc id.
// IPv6 VIPs have maps of their own (lb_services6, lb_targets6, lb_maglev6, lb_mappings6, lb_events6; the
// IPv4 maps keep their pinned layouts): every method that takes an address string takes either family and
// picks the maps by the VIP's (a VIP's targets and clients are of its family). A VIP's slot is per VIP.
import * as path from 'node:path';
import { log } from '../../lib/log';
import { BpfObject } from './object';
import { BPF_ANY } from './map';
import { RingBufferReader } from './libbpf';
import { attachTc, detachTc, queryTc, type TcAttachment } from './tc';
import { BpfCallError } from './libbpf';
import { bpfObjectDir } from './fou';
import {
  LB_MAGLEV_DEFAULT, LB_MAX_VIPS_DEFAULT, LB_TARGET_ACTIVE, LB_TARGET_TERMINATING, decodeEvent, decodeEvent6, decodeMapKey, decodeMapping, decodeTargetKey,
  decodeServiceKey, encodeLbConfig, encodeLbConfig6, encodeMapKey, encodeMapping, encodeService, encodeServiceKey, encodeTargetKey, sumLbStats, sumLbNodeStats, LB_MAP_LAYOUTS, type LbStats, type LbNodeStats, type MapKey,
} from './lb-structs';
import { addressFamily, ipBytes } from './fou-structs';
import { canonicalIp, formatV4, formatV6 } from '../../lib/ip';

export const LB_TC = { handle: 1, priority: 0x110, object: 'lb', program: 'lb_ingress' } as const;
/** The uplink program's filter: its own priority, so it never replaces another program on the uplink. */
export const LB_NODE_TC = { handle: 1, priority: 0x130, program: 'lb_node' } as const;

/** Where VIP traffic is handled: on the node's uplink as it arrives, or in the LB pods (tetherd --lb-datapath). */
export type LbDatapathMode = 'node' | 'pod';

/** A fixed flow-hash seed: every node must hash a client alike (the Maglev row is the same everywhere). */
export const LB_HASH_SEED = 0x7e7e1b5d;

export interface LbDatapathOptions {
  pinDir: string;
  /**
   * VIP slots (default 16), the Maglev table size (a prime, default 65537) and the mapping table's entries
   * (default: the object's, 262,144): all three fix map sizes, at load.
   */
  maxVips?: number;
  maglevSize?: number;
  maxMappings?: number;
  objectPath?: string;
  /**
   * Load the uplink program too (default true). Off in pod mode: it needs newer kernel helpers
   * (bpf_redirect_neigh with a next hop, the FIB's MTU result: Linux 5.12) that the LB pods' program does not.
   */
  nodeProgram?: boolean;
}

export type TargetState = 'active' | 'terminating';

export interface LbMapping extends MapKey {
  target: string;
  /** bpf_ktime_get_ns of its last packet (0 when installed and unused since). */
  lastNs: bigint;
}

const KEY0 = Buffer.alloc(4);

type Family = 4 | 6;
/** The maps of each family, by role. */
const MAPS = {
  services: { 4: 'lb_services', 6: 'lb_services6' },
  targets: { 4: 'lb_targets', 6: 'lb_targets6' },
  maglev: { 4: 'lb_maglev', 6: 'lb_maglev6' },
  mappings: { 4: 'lb_mappings', 6: 'lb_mappings6' },
} as const;
const famOf = (vip: string): Family => addressFamily(vip, 'vip');

export class LbDatapath {
  readonly maxVips: number;
  readonly maglevSize: number;
  private obj: BpfObject | null;
  private events?: RingBufferReader;
  private events6?: RingBufferReader;
  private readonly attached = new Map<string, TcAttachment>();

  private constructor(obj: BpfObject, maxVips: number, maglevSize: number) {
    this.obj = obj;
    this.maxVips = maxVips;
    this.maglevSize = maglevSize;
  }

  /** Loads lb.bpf.o, reusing its pinned maps when their sizes still match. */
  static load(o: LbDatapathOptions): LbDatapath {
    const maxVips = o.maxVips ?? LB_MAX_VIPS_DEFAULT;
    const maglevSize = o.maglevSize ?? LB_MAGLEV_DEFAULT;
    const obj = BpfObject.load(o.objectPath ?? path.join(bpfObjectDir(), `${LB_TC.object}.bpf.o`), {
      pinDir: o.pinDir,
      maxEntries: {
        lb_maglev: maxVips * maglevSize, lb_maglev6: maxVips * maglevSize, lb_stats: maxVips,
        ...(o.maxMappings ? { lb_mappings: o.maxMappings, lb_mappings6: o.maxMappings } : {}),
      },
      layouts: LB_MAP_LAYOUTS,
      skipPrograms: o.nodeProgram === false ? [LB_NODE_TC.program] : [],
    });
    return new LbDatapath(obj, maxVips, maglevSize);
  }

  private o(): BpfObject {
    if (!this.obj) throw new Error('lb datapath is closed');
    return this.obj;
  }

  /**
   * Outer source (this node's registered address) and the targets' FoU port. IPv6 VIPs are served once an
   * IPv6 outer source is given (outerSource6, this node's registered IPv6 address; or outerSource itself
   * when it is IPv6, for a node with IPv6 VIPs only): FoU to an IPv6 target is in outer IPv6 from it.
   */
  configure(outerSource: string, fouPort: number, outerSource6?: string): void {
    const v6 = addressFamily(outerSource, 'outerSource') === 6;
    const src6 = v6 ? outerSource : outerSource6;
    // The IPv6 source first: the IPv6 path is armed by lb_cfg's port, which an earlier call may have set.
    if (src6) this.o().map('lb_cfg6').update(KEY0, encodeLbConfig6(src6));
    this.o().map('lb_cfg').update(KEY0, encodeLbConfig({ outerSource: v6 ? '' : outerSource, port: fouPort, maglevSize: this.maglevSize, seed: LB_HASH_SEED }));
  }

  /** Attaches the program at ingress of an LB pod's interface (in its namespace). Idempotent. */
  attach(netns: string, ifName: string): TcAttachment {
    const a = attachTc({ netns, ifName, direction: 'ingress', progFd: this.o().programFd(LB_TC.program), handle: LB_TC.handle, priority: LB_TC.priority });
    this.attached.set(`${netns} ${ifName}`, a);
    this.o().settle();
    return a;
  }

  /**
   * Attaches the node program at ingress of the node's uplink (netns: the node's namespace, when not
   * tetherd's own). Idempotent: a program already there is replaced in place, no packet passes unhandled.
   */
  attachNode(ifName: string, netns?: string): TcAttachment {
    const a = attachTc({ netns, ifName, direction: 'ingress', progFd: this.o().programFd(LB_NODE_TC.program), handle: LB_NODE_TC.handle, priority: LB_NODE_TC.priority });
    this.o().settle();
    return a;
  }

  /** Removes the node program from the uplink; false when it was not there. */
  detachNode(ifName: string, netns?: string): boolean {
    return LbDatapath.detachNodeFrom(ifName, netns);
  }

  /** detachNode without a loaded datapath: what an earlier tetherd in node mode left on the uplink. */
  static detachNodeFrom(ifName: string, netns?: string): boolean {
    return detachTc({ netns, ifName, direction: 'ingress', handle: LB_NODE_TC.handle, priority: LB_NODE_TC.priority });
  }

  /** Whether a node program is attached at the uplink (by this or an earlier tetherd). */
  nodeAttached(ifName: string, netns?: string): boolean {
    return queryTc({ netns, ifName, direction: 'ingress', handle: LB_NODE_TC.handle, priority: LB_NODE_TC.priority }) !== undefined;
  }

  /** Removes the program from an LB pod's interface; false when it was not there (or the pod is gone). */
  detach(netns: string, ifName: string): boolean {
    this.attached.delete(`${netns} ${ifName}`);
    try {
      return detachTc({ netns, ifName, direction: 'ingress', handle: LB_TC.handle, priority: LB_TC.priority });
    } catch (e) {
      log().debug('lb detach: pod gone', { netns, ifName, error: (e as Error).message });
      return false;
    }
  }

  /**
   * Serves vip's ports from slot (0 ≤ slot < maxVips); flags: LB_F_*. Also writes the VIP's port-0 entry,
   * which makes the program refuse the VIP's other ports. Ports no longer listed are removed.
   */
  setService(vip: string, slot: number, ports: Array<{ port: number; proto: number }>, flags: number): void {
    if (slot < 0 || slot >= this.maxVips) throw new Error(`VIP slot ${slot} out of range 0..${this.maxVips - 1}`);
    const m = this.o().map(MAPS.services[famOf(vip)]);
    const want = new Map<string, Buffer>();
    for (const p of [...ports, { port: 0, proto: 0 }]) {
      const k = encodeServiceKey(vip, p.port, p.proto);
      want.set(k.toString('hex'), k);
    }
    m.updateBatch([...want.values()].map((k) => [k, encodeService(slot, flags)]));
    const vipHex = ipBytes(vip, 'vip').toString('hex');
    for (const k of m.keys()) {
      const h = k.toString('hex');
      if (h.startsWith(vipHex) && !want.has(h)) m.delete(k);
    }
  }

  /** Rewrites the flags of every port of vip (its slot kept); ports and slot are set by setService. */
  setServiceFlags(vip: string, flags: number): void {
    const m = this.o().map(MAPS.services[famOf(vip)]);
    const vipHex = ipBytes(vip, 'vip').toString('hex');
    const update: Array<[Buffer, Buffer]> = [];
    for (const [k, v] of m.entries()) {
      if (k.toString('hex').startsWith(vipHex) && v.readUInt32LE(4) !== flags) update.push([k, encodeService(v.readUInt32LE(0), flags)]);
    }
    if (update.length) m.updateBatch(update);
  }

  /** The VIPs programmed now, both families, and their slots (from each VIP's port-0 entry): what a restart finds. */
  services(): Map<string, number> {
    const out = new Map<string, number>();
    for (const f of [4, 6] as const) {
      for (const [k, v] of this.o().map(MAPS.services[f]).entries()) {
        const key = decodeServiceKey(k);
        if (key.port === 0 && key.proto === 0) out.set(key.vip, v.readUInt32LE(0));
      }
    }
    return out;
  }

  /** Stops serving vip: its ports, targets and mappings go; the Maglev row is cleared. */
  removeService(vip: string, slot: number): void {
    const vipHex = ipBytes(vip, 'vip').toString('hex');
    const services = this.o().map(MAPS.services[famOf(vip)]);
    for (const k of services.keys()) if (k.toString('hex').startsWith(vipHex)) services.delete(k);
    this.setTargets(vip, new Map());
    this.setMaglevRow(slot, new Int32Array(this.maglevSize).fill(-1), []);
    const canon = canonicalIp(vip);
    this.deleteMappings((m) => m.vip === canon);
  }

  /** The VIP's targets and their states; a mapping to a target not listed is void in the datapath. */
  setTargets(vip: string, targets: Map<string, TargetState>): void {
    const m = this.o().map(MAPS.targets[famOf(vip)]);
    const state = (s: TargetState) => {
      const b = Buffer.alloc(4);
      b.writeUInt32LE(s === 'active' ? LB_TARGET_ACTIVE : LB_TARGET_TERMINATING);
      return b;
    };
    if (targets.size) m.updateBatch([...targets].map(([t, s]) => [encodeTargetKey(vip, t), state(s)]));
    // Decoded addresses are canonical text: compare with the canonical text of what was given.
    const canon = canonicalIp(vip);
    const keep = new Set([...targets.keys()].map((t) => canonicalIp(t)));
    for (const k of m.keys()) {
      const tk = decodeTargetKey(k);
      if (tk.vip === canon && !keep.has(tk.target)) m.delete(k);
    }
  }

  /**
   * The Maglev row of slot as the datapath holds it: each entry's target, '' for none. A slot's row is its
   * VIP's family's (family; without it, the IPv4 row, or the IPv6 row when the IPv4 one names no target).
   */
  maglevRow(slot: number, family?: Family): string[] {
    const read = (f: Family): string[] => {
      const m = this.o().map(MAPS.maglev[f]);
      const out: string[] = new Array(this.maglevSize);
      const k = Buffer.alloc(4);
      for (let i = 0; i < this.maglevSize; i++) {
        k.writeUInt32LE(slot * this.maglevSize + i);
        const v = m.lookup(k);
        out[i] = v && v.some((x) => x !== 0) ? decodeAddress(v) : '';
      }
      return out;
    };
    if (family) return read(family);
    const v4 = read(4);
    return v4.some((t) => t !== '') ? v4 : read(6);
  }

  /** The VIP's targets as the datapath holds them (a mapping to another one is void). */
  targetsOf(vip: string): Set<string> {
    const out = new Set<string>();
    const canon = canonicalIp(vip);
    for (const k of this.o().map(MAPS.targets[famOf(vip)]).keys()) {
      const tk = decodeTargetKey(k);
      if (tk.vip === canon) out.add(tk.target);
    }
    return out;
  }

  /**
   * Writes a Maglev row: table[i] indexes targets (-1 = none), into the row of the targets' family. A row
   * with no target is written to both families' rows of the slot: a slot is one VIP's, and the other
   * family's row of it must not keep targets of a VIP that held the slot before.
   */
  setMaglevRow(slot: number, table: Int32Array, targets: string[]): void {
    if (table.length !== this.maglevSize) throw new Error(`maglev row has ${table.length} entries, not ${this.maglevSize}`);
    const families = targets.length ? [addressFamily(targets[0], 'target')] : ([4, 6] as const);
    for (const f of families) {
      const addrs = targets.map((t) => (addressFamily(t, 'target') === f ? ipBytes(t, 'target') : mixed(t)));
      const none = Buffer.alloc(f === 4 ? 4 : 16);
      const base = slot * this.maglevSize;
      const entries: Array<[Buffer, Buffer]> = new Array(table.length);
      for (let i = 0; i < table.length; i++) {
        const k = Buffer.alloc(4);
        k.writeUInt32LE(base + i);
        entries[i] = [k, table[i] >= 0 ? addrs[table[i]] : none];
      }
      this.o().map(MAPS.maglev[f]).updateBatch(entries);
    }
  }

  /** Entries the mapping table holds at most (--lb-max-mappings). */
  get maxMappings(): number {
    return this.o().map('lb_mappings').info.maxEntries;
  }

  /**
   * Installs mappings (from the store; lastNs 0: unused since); an existing mapping for the same key is
   * replaced. A lastNs is given only where a mapping's use is carried over (tests, a map upgrade). When
   * the table is full, what does not fit is left out and counted in `full` (those clients are forwarded by
   * their Maglev pick meanwhile); nothing else fails.
   */
  installMappings(list: Array<{ key: MapKey; target: string; lastNs?: bigint }>): { installed: number; full: number } {
    if (!list.length) return { installed: 0, full: 0 };
    const v6 = list.filter((m) => famOf(m.key.vip) === 6);
    if (v6.length) {
      // Each family's map on its own (a batch holds one key size).
      const a = this.installMappingsOf(4, list.filter((m) => famOf(m.key.vip) === 4));
      const b = this.installMappingsOf(6, v6);
      return { installed: a.installed + b.installed, full: a.full + b.full };
    }
    return this.installMappingsOf(4, list);
  }

  private installMappingsOf(f: Family, list: Array<{ key: MapKey; target: string; lastNs?: bigint }>): { installed: number; full: number } {
    if (!list.length) return { installed: 0, full: 0 };
    const map = this.o().map(MAPS.mappings[f]);
    const entries = list.map((m): [Buffer, Buffer] => [encodeMapKey(m.key), encodeMapping(m.target, m.lastNs ?? 0n)]);
    try {
      map.updateBatch(entries, BPF_ANY);
      return { installed: entries.length, full: 0 };
    } catch (e) {
      if (!(e instanceof BpfCallError) || e.errno !== 7 /* E2BIG: the table is full */) throw e;
    }
    // A batch stops at the first entry that does not fit: one by one, replacing what is there still works.
    let installed = 0;
    let full = 0;
    for (const [k, v] of entries) {
      try {
        map.update(k, v, BPF_ANY);
        installed++;
      } catch (e) {
        if (!(e instanceof BpfCallError) || e.errno !== 7) throw e;
        full++;
      }
    }
    return { installed, full };
  }

  /** Every mapping the node holds, both families. */
  mappings(): LbMapping[] {
    return [...this.mappingEntries(4), ...this.mappingEntries(6)].map(([k, v]) => ({ ...decodeMapKey(k), ...decodeMapping(v) }));
  }

  /**
   * Every mapping of one family (default IPv4) as the map holds it: lb_map_key's and lb_mapping's bytes, or
   * for 6 lb_map_key6's and lb_mapping6's (decodeMapKey, decodeMapping and lbHashKeyBytes take either by
   * size), for a scan of many that decodes only the few it keeps.
   */
  mappingEntries(family: Family = 4): Array<[Buffer, Buffer]> {
    return this.o().map(MAPS.mappings[family]).entries();
  }

  /** How many mappings of each family the node holds (each family's map holds maxMappings at most). */
  mappingCounts(): { 4: number; 6: number } {
    return { 4: this.o().map(MAPS.mappings[4]).keys().length, 6: this.o().map(MAPS.mappings[6]).keys().length };
  }

  /** Deletes the mappings matching pred; returns how many went. */
  deleteMappings(pred: (m: LbMapping) => boolean): number {
    return this.deleteMappingKeys(this.mappings().filter(pred));
  }

  /** Deletes these mappings (e.g. picked from a mappings() read already made); returns how many went. */
  deleteMappingKeys(keys: MapKey[]): number {
    let n = 0;
    for (const k of keys) if (this.o().map(MAPS.mappings[famOf(k.vip)]).delete(encodeMapKey(k))) n++;
    return n;
  }

  /** Starts reading new-mapping reports of both families (lb_events, lb_events6); call pollEvents() to have them delivered. */
  onEvents(fn: (e: { key: MapKey; target: string }) => void): void {
    this.events?.close();
    this.events6?.close();
    this.events = new RingBufferReader(this.o().map('lb_events').fd, (b) => {
      const e = decodeEvent(b);
      fn({ key: e.key, target: e.target });
    }, 'lb_events');
    this.events6 = new RingBufferReader(this.o().map('lb_events6').fd, (b) => {
      const e = decodeEvent6(b);
      fn({ key: e.key, target: e.target });
    }, 'lb_events6');
  }

  /** Delivers the reports waiting now; returns how many. */
  pollEvents(): number {
    return (this.events?.consume() ?? 0) + (this.events6?.consume() ?? 0);
  }

  stats(slot: number): LbStats {
    const k = Buffer.alloc(4);
    k.writeUInt32LE(slot);
    return sumLbStats(this.o().map('lb_stats').lookupPerCpu(k) ?? []);
  }

  /** The node's counters (not per VIP slot). */
  nodeStats(): LbNodeStats {
    return sumLbNodeStats(this.o().map('lb_node_stats').lookupPerCpu(KEY0) ?? []);
  }

  /** Zeroes a slot's counters (a slot handed to another VIP starts from 0). */
  resetStats(slot: number): void {
    const k = Buffer.alloc(4);
    k.writeUInt32LE(slot);
    const m = this.o().map('lb_stats');
    m.update(k, Buffer.alloc(m.valueBytes));
  }

  /** Releases the object (pins and attached filters stay unless unpin). */
  close(opts: { unpin?: boolean } = {}): void {
    this.events?.close();
    this.events = undefined;
    this.events6?.close();
    this.events6 = undefined;
    if (!this.obj) return;
    if (opts.unpin) this.obj.unpinMaps();
    this.obj.close();
    this.obj = null;
  }
}

/** Text of a map's address value: 4 bytes IPv4, 16 bytes IPv6. */
function decodeAddress(v: Buffer): string {
  return v.length === 4 ? formatV4(v, 0) : formatV6(v, 0);
}

function mixed(t: string): never {
  throw new Error(`maglev row: target ${t} is not of the family of the row's first target`);
}
