// The load balancer datapath of one node: one lb.bpf.o whose maps are pinned under <pinDir>/lb and shared
// by every LB pod of the node (each pod's interface gets the same program at tc ingress). tetherd writes
// the services, targets and Maglev rows, installs mappings learnt from the store, reads the mappings the
// program chose from the ring buffer, and reads counters. After a restart the pinned maps (and with them
// every mapping) are reused, and the filters are found again by their fixed tc id.
import * as path from 'node:path';
import { log } from '../log';
import { BpfObject } from './object';
import { BPF_ANY } from './map';
import { RingBufferReader } from './libbpf';
import { attachTc, detachTc, type TcAttachment } from './tc';
import { bpfObjectDir } from './fou';
import {
  LB_MAGLEV_DEFAULT, LB_MAX_VIPS_DEFAULT, LB_TARGET_ACTIVE, LB_TARGET_TERMINATING, decodeEvent, decodeMapKey, decodeMapping, decodeTargetKey,
  decodeServiceKey, encodeLbConfig, encodeMapKey, encodeMapping, encodeService, encodeServiceKey, encodeTargetKey, sumLbStats, LB_MAP_LAYOUTS, type LbStats, type MapKey,
} from './lb-structs';
import { ipv4Bytes } from './fou-structs';

export const LB_TC = { handle: 1, priority: 0x110, object: 'lb', program: 'lb_ingress' } as const;

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
}

export type TargetState = 'active' | 'terminating';

export interface LbMapping extends MapKey {
  target: string;
  /** bpf_ktime_get_ns of its last packet (0 when installed and unused since). */
  lastNs: bigint;
}

const KEY0 = Buffer.alloc(4);

export class LbDatapath {
  readonly maxVips: number;
  readonly maglevSize: number;
  private obj: BpfObject | null;
  private events?: RingBufferReader;
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
      maxEntries: { lb_maglev: maxVips * maglevSize, lb_stats: maxVips, ...(o.maxMappings ? { lb_mappings: o.maxMappings } : {}) },
      layouts: LB_MAP_LAYOUTS,
    });
    return new LbDatapath(obj, maxVips, maglevSize);
  }

  private o(): BpfObject {
    if (!this.obj) throw new Error('lb datapath is closed');
    return this.obj;
  }

  /** Outer source (this node's registered address) and the targets' FoU port. */
  configure(outerSource: string, fouPort: number): void {
    this.o().map('lb_cfg').update(KEY0, encodeLbConfig({ outerSource, port: fouPort, maglevSize: this.maglevSize, seed: LB_HASH_SEED }));
  }

  /** Attaches the program at ingress of an LB pod's interface (in its namespace). Idempotent. */
  attach(netns: string, ifName: string): TcAttachment {
    const a = attachTc({ netns, ifName, direction: 'ingress', progFd: this.o().programFd(LB_TC.program), handle: LB_TC.handle, priority: LB_TC.priority });
    this.attached.set(`${netns} ${ifName}`, a);
    this.o().settle();
    return a;
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
    const m = this.o().map('lb_services');
    const want = new Map<string, Buffer>();
    for (const p of [...ports, { port: 0, proto: 0 }]) {
      const k = encodeServiceKey(vip, p.port, p.proto);
      want.set(k.toString('hex'), k);
    }
    m.updateBatch([...want.values()].map((k) => [k, encodeService(slot, flags)]));
    const vipHex = ipv4Bytes(vip, 'vip').toString('hex');
    for (const k of m.keys()) {
      const h = k.toString('hex');
      if (h.startsWith(vipHex) && !want.has(h)) m.delete(k);
    }
  }

  /** The VIPs programmed now and their slots (from each VIP's port-0 entry): what a restart finds. */
  services(): Map<string, number> {
    const out = new Map<string, number>();
    for (const [k, v] of this.o().map('lb_services').entries()) {
      const key = decodeServiceKey(k);
      if (key.port === 0 && key.proto === 0) out.set(key.vip, v.readUInt32LE(0));
    }
    return out;
  }

  /** Stops serving vip: its ports, targets and mappings go; the Maglev row is cleared. */
  removeService(vip: string, slot: number): void {
    const vipHex = ipv4Bytes(vip, 'vip').toString('hex');
    const services = this.o().map('lb_services');
    for (const k of services.keys()) if (k.toString('hex').startsWith(vipHex)) services.delete(k);
    this.setTargets(vip, new Map());
    this.setMaglevRow(slot, new Int32Array(this.maglevSize).fill(-1), []);
    this.deleteMappings((m) => m.vip === vip);
  }

  /** The VIP's targets and their states; a mapping to a target not listed is void in the datapath. */
  setTargets(vip: string, targets: Map<string, TargetState>): void {
    const m = this.o().map('lb_targets');
    const state = (s: TargetState) => {
      const b = Buffer.alloc(4);
      b.writeUInt32LE(s === 'active' ? LB_TARGET_ACTIVE : LB_TARGET_TERMINATING);
      return b;
    };
    if (targets.size) m.updateBatch([...targets].map(([t, s]) => [encodeTargetKey(vip, t), state(s)]));
    for (const k of m.keys()) {
      const tk = decodeTargetKey(k);
      if (tk.vip === vip && !targets.has(tk.target)) m.delete(k);
    }
  }

  /** Writes a Maglev row: table[i] indexes targets (-1 = none). */
  setMaglevRow(slot: number, table: Int32Array, targets: string[]): void {
    if (table.length !== this.maglevSize) throw new Error(`maglev row has ${table.length} entries, not ${this.maglevSize}`);
    const addrs = targets.map((t) => ipv4Bytes(t, 'target'));
    const none = Buffer.alloc(4);
    const base = slot * this.maglevSize;
    const entries: Array<[Buffer, Buffer]> = new Array(table.length);
    for (let i = 0; i < table.length; i++) {
      const k = Buffer.alloc(4);
      k.writeUInt32LE(base + i);
      entries[i] = [k, table[i] >= 0 ? addrs[table[i]] : none];
    }
    this.o().map('lb_maglev').updateBatch(entries);
  }

  /**
   * Installs mappings (from the store; lastNs 0: unused since); an existing mapping for the same key is
   * replaced. A lastNs is given only where a mapping's use is carried over (tests, a map upgrade).
   */
  installMappings(list: Array<{ key: MapKey; target: string; lastNs?: bigint }>): void {
    if (!list.length) return;
    this.o().map('lb_mappings').updateBatch(list.map((m) => [encodeMapKey(m.key), encodeMapping(m.target, m.lastNs ?? 0n)]), BPF_ANY);
  }

  /** Every mapping the node holds. */
  mappings(): LbMapping[] {
    return this.o().map('lb_mappings').entries().map(([k, v]) => ({ ...decodeMapKey(k), ...decodeMapping(v) }));
  }

  /** Deletes the mappings matching pred; returns how many went. */
  deleteMappings(pred: (m: LbMapping) => boolean): number {
    return this.deleteMappingKeys(this.mappings().filter(pred));
  }

  /** Deletes these mappings (e.g. picked from a mappings() read already made); returns how many went. */
  deleteMappingKeys(keys: MapKey[]): number {
    const map = this.o().map('lb_mappings');
    let n = 0;
    for (const k of keys) if (map.delete(encodeMapKey(k))) n++;
    return n;
  }

  /** Starts reading new-mapping reports; call pollEvents() to have them delivered. */
  onEvents(fn: (e: { key: MapKey; target: string }) => void): void {
    this.events?.close();
    this.events = new RingBufferReader(this.o().map('lb_events').fd, (b) => {
      const e = decodeEvent(b);
      fn({ key: e.key, target: e.target });
    }, 'lb_events');
  }

  /** Delivers the reports waiting now; returns how many. */
  pollEvents(): number {
    return this.events?.consume() ?? 0;
  }

  stats(slot: number): LbStats {
    const k = Buffer.alloc(4);
    k.writeUInt32LE(slot);
    return sumLbStats(this.o().map('lb_stats').lookupPerCpu(k) ?? []);
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
    if (!this.obj) return;
    if (opts.unpin) this.obj.unpinMaps();
    this.obj.close();
    this.obj = null;
  }
}
