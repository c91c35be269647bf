// The FoU datapath: attach the encapsulation program (LB side) and the decapsulation program (target side),
// manage their maps, read their counters, and detach — also after a restart, from pins and tc ids alone.
import * as fs from 'node:fs';
import * as path from 'node:path';
import { log } from '../../lib/log';
import { formatV4 } from '../../lib/ip';
import { BpfObject } from './object';
import { BpfMap } from './map';
import { attachTc, detachTc, type TcAttachment, type TcDirection } from './tc';
import {
  FOU_DECAP_F_CHECK_SOURCES, FOU_DECAP_F_LABEL_MARK, FOU_ENCAP_F_REDIRECT_BACK, addressFamily, decodeFouDest, encodeFouDecapConfig, encodeFouDecapConfig6, encodeFouDest,
  encodeFouEncapConfig, ipv4Bytes, ipv6Bytes, sumFouStats, FOU_MAP_LAYOUTS, type FouDest, type FouStats,
} from './fou-structs';

export type { FouStats } from './fou-structs';

/** tc filter ids of the FoU programs, fixed so that a restarted tetherd finds (and replaces) its filters. */
export const FOU_TC = {
  encap: { handle: 1, priority: 0x100, object: 'fou-encap', program: 'fou_encap' },
  decap: { handle: 1, priority: 0x101, object: 'fou-decap', program: 'fou_decap' },
} as const;

const KEY0 = Buffer.alloc(4);

/**
 * Directory of the compiled objects: $TETHER_BPF_DIR; in the single executable, ../bpf beside its bin/
 * directory (dist/bin → dist/bpf, /opt/tether/bin → /opt/tether/bpf); from source, dist/bpf of the tree.
 */
export function bpfObjectDir(): string {
  if (process.env.TETHER_BPF_DIR) return process.env.TETHER_BPF_DIR;
  let sea = false;
  try {
    // eslint-disable-next-line @typescript-eslint/no-var-requires
    sea = require('node:sea').isSea() as boolean;
  } catch {
    sea = false;
  }
  return sea ? path.resolve(path.dirname(process.execPath), '../bpf') : path.resolve(__dirname, '../../dist/bpf');
}

function statsOf(map: BpfMap): FouStats {
  return sumFouStats(map.lookupPerCpu(KEY0) ?? []);
}

export interface FouEncapOptions {
  netns?: string | null;
  ifName: string;
  /** ingress: packets arriving for a VIP (LB pod); egress: packets the namespace sends. */
  direction: TcDirection;
  /** Outer UDP destination port. */
  port: number;
  /** Outer source address (an address of this namespace, so ICMP errors come back here). */
  outerSource: string;
  /** bpffs directory; maps go to <pinDir>/fou-encap/<map>. */
  pinDir: string;
  /** Send encapsulated packets back out the interface they came in by (MACs swapped); default: direction is ingress. */
  redirectBack?: boolean;
  objectPath?: string;
}

export class FouEncap {
  constructor(private readonly obj: BpfObject, readonly attachment: TcAttachment) {}

  /** Sends packets for vip to backend (idempotent upsert). port 0: the attach-time port. */
  setDestination(vip: string, backend: string, port = 0): void {
    this.obj.map('fou_dests').update(ipv4Bytes(vip, 'vip'), encodeFouDest({ backend, port }));
  }

  /** Many destinations in one batch. */
  setDestinations(dests: Array<{ vip: string; backend: string; port?: number }>): void {
    this.obj.map('fou_dests').updateBatch(dests.map((d) => [ipv4Bytes(d.vip, 'vip'), encodeFouDest({ backend: d.backend, port: d.port ?? 0 })]));
  }

  /** Stops encapsulating for vip; false when it was not set. */
  removeDestination(vip: string): boolean {
    return this.obj.map('fou_dests').delete(ipv4Bytes(vip, 'vip'));
  }

  destinations(): Map<string, FouDest> {
    return new Map(this.obj.map('fou_dests').entries().map(([k, v]) => [formatV4(k), decodeFouDest(v)]));
  }

  stats(): FouStats {
    return statsOf(this.obj.map('fou_encap_stats'));
  }

  /** Removes the tc filter, releases the object and, unless keepPins, its pinned maps. Idempotent. */
  detach(opts: { keepPins?: boolean } = {}): void {
    const a = this.attachment;
    detachTc({ netns: a.netns, ifindex: a.ifindex, direction: a.direction, handle: a.handle, priority: a.priority });
    if (!opts.keepPins) this.obj.unpinMaps();
    this.obj.close();
  }
}

/** Loads fou-encap (reusing pinned maps), writes its config and attaches it. Replaces an earlier attachment. */
export function attachFouEncap(o: FouEncapOptions): FouEncap {
  const obj = BpfObject.load(o.objectPath ?? path.join(bpfObjectDir(), `${FOU_TC.encap.object}.bpf.o`), { pinDir: o.pinDir, layouts: FOU_MAP_LAYOUTS });
  try {
    const redirect = o.redirectBack ?? o.direction === 'ingress';
    obj.map('fou_encap_cfg').update(KEY0, encodeFouEncapConfig({ outerSource: o.outerSource, port: o.port, flags: redirect ? FOU_ENCAP_F_REDIRECT_BACK : 0 }));
    const attachment = attachTc({
      netns: o.netns, ifName: o.ifName, direction: o.direction, progFd: obj.programFd(FOU_TC.encap.program),
      handle: FOU_TC.encap.handle, priority: FOU_TC.encap.priority,
    });
    log().info('fou encap attached', { netns: o.netns, ifName: o.ifName, direction: o.direction, port: o.port, outerSource: o.outerSource });
    return new FouEncap(obj, attachment);
  } catch (e) {
    obj.close();
    throw e;
  }
}

export interface FouDecapOptions {
  netns?: string | null;
  ifName: string;
  /** FoU UDP port; other UDP traffic passes untouched. */
  port: number;
  /** Only decapsulate packets whose outer destination is this address; absent: any arriving on ifName. */
  localAddress?: string;
  /**
   * Also decapsulate FoU in outer IPv6 (what an IPv6 VIP's load balancer sends) addressed to this IPv6
   * address, on the same port; absent: outer IPv6 passes untouched.
   */
  localAddress6?: string;
  /**
   * Outer IPv6: mark unwrapped packets FOU_FLOAT_MARK | the outer flow label's low 16 bits (an egress
   * gateway: steering puts the floating address's low bits there). Off for the load balancer's targets,
   * whose labels are flow hashes.
   */
  markFromLabel?: boolean;
  /**
   * When non-empty, only decapsulate packets from these outer sources (either family; a family with none
   * listed is then refused altogether); others are dropped and counted.
   */
  allowedSources?: string[];
  /** bpffs directory for <pinDir>/fou-decap/<map>; absent: nothing pinned (state dies with the filter). */
  pinDir?: string;
  objectPath?: string;
  /**
   * ingress (default): packets arriving on ifName (a pod's own interface). egress: packets leaving
   * ifName, e.g. a pod's host-side veth — decapsulated before the pod, so full-size encapsulated frames
   * never meet the pod interface's lowered MTU (a veth drops frames longer than its peer's MTU).
   */
  direction?: TcDirection;
}

export class FouDecap {
  constructor(private readonly obj: BpfObject, readonly attachment: TcAttachment, private config: { port: number; localAddress?: string; localAddress6?: string; markFromLabel?: boolean }) {}

  /**
   * Replaces the source allow-list (IPv4 and IPv6 sources, each into its family's map); an empty list lets
   * every source through. A non-empty list is in force for both families: a family with no source listed
   * accepts none.
   */
  setAllowedSources(sources: string[]): void {
    const byFamily = { 4: [] as string[], 6: [] as string[] };
    for (const s of sources) byFamily[addressFamily(s, 'allowedSources')].push(s);
    const flags = sources.length > 0 ? FOU_DECAP_F_CHECK_SOURCES : 0;
    const map = this.obj.map('fou_sources');
    const want = new Set(byFamily[4].map((s) => ipv4Bytes(s, 'allowedSources').toString('hex')));
    // Add before switching the check on, and switch it off before emptying: never a window that drops
    // packets from a source that is allowed both before and after.
    if (want.size) map.updateBatch([...want].map((h) => [Buffer.from(h, 'hex'), Buffer.from([1])]));
    this.obj.map('fou_decap_cfg').update(KEY0, encodeFouDecapConfig({ port: this.config.port, localAddress: this.config.localAddress, flags }));
    for (const k of map.keys()) if (!want.has(k.toString('hex'))) map.delete(k);

    const map6 = this.obj.map('fou_sources6');
    const want6 = new Set(byFamily[6].map((s) => ipv6Bytes(s, 'allowedSources').toString('hex')));
    if (want6.size) map6.updateBatch([...want6].map((h) => [Buffer.from(h, 'hex'), Buffer.from([1])]));
    // Outer IPv6 is unwrapped only where an IPv6 address is configured (port 0 keeps it off).
    const port6 = this.config.localAddress6 ? this.config.port : 0;
    const flags6 = flags | (this.config.markFromLabel ? FOU_DECAP_F_LABEL_MARK : 0);
    this.obj.map('fou_decap_cfg6').update(KEY0, encodeFouDecapConfig6({ port: port6, localAddress: this.config.localAddress6, flags: flags6 }));
    for (const k of map6.keys()) if (!want6.has(k.toString('hex'))) map6.delete(k);
  }

  stats(): FouStats {
    return statsOf(this.obj.map('fou_decap_stats'));
  }

  detach(opts: { keepPins?: boolean } = {}): void {
    const a = this.attachment;
    detachTc({ netns: a.netns, ifindex: a.ifindex, direction: a.direction, handle: a.handle, priority: a.priority });
    if (!opts.keepPins) this.obj.unpinMaps();
    this.obj.close();
  }
}

/** Loads fou-decap, configures port / address / allow-list, and attaches it at ifName (ingress by default). */
export function attachFouDecap(o: FouDecapOptions): FouDecap {
  const obj = BpfObject.load(o.objectPath ?? path.join(bpfObjectDir(), `${FOU_TC.decap.object}.bpf.o`), { pinDir: o.pinDir, layouts: FOU_MAP_LAYOUTS });
  try {
    const config = { port: o.port, localAddress: o.localAddress, localAddress6: o.localAddress6, ...(o.markFromLabel ? { markFromLabel: true } : {}) };
    const attachment = attachTc({
      netns: o.netns, ifName: o.ifName, direction: o.direction ?? 'ingress', progFd: obj.programFd(FOU_TC.decap.program),
      handle: FOU_TC.decap.handle, priority: FOU_TC.decap.priority,
    });
    const decap = new FouDecap(obj, attachment, config);
    decap.setAllowedSources(o.allowedSources ?? []); // also writes the config, which arms the program
    log().info('fou decap attached', { netns: o.netns, ifName: o.ifName, direction: o.direction ?? 'ingress', port: o.port, allowedSources: o.allowedSources?.length ?? 0, ...(o.localAddress6 ? { localAddress6: o.localAddress6 } : {}) });
    return decap;
  } catch (e) {
    obj.close();
    throw e;
  }
}

/**
 * Detaches a FoU program by interface and its fixed tc id, without the object that attached it (after a
 * restart), and removes its pins under pinDir when given. Idempotent: false when nothing was attached.
 */
export function detachFou(o: { which: 'encap' | 'decap'; netns?: string | null; ifName: string; direction?: TcDirection; pinDir?: string }): boolean {
  const id = FOU_TC[o.which];
  const gone = detachTc({ netns: o.netns, ifName: o.ifName, direction: o.direction ?? 'ingress', handle: id.handle, priority: id.priority });
  if (o.pinDir) fs.rmSync(path.join(o.pinDir, id.object), { recursive: true, force: true });
  return gone;
}

/** Sets a destination through the pinned map (e.g. from another process, or after a restart). */
export function setFouDestination(pinDir: string, vip: string, backend: string, port = 0): void {
  const m = BpfMap.fromPin(path.join(pinDir, FOU_TC.encap.object, 'fou_dests'));
  try {
    m.update(ipv4Bytes(vip, 'vip'), encodeFouDest({ backend, port }));
  } finally {
    m.close();
  }
}

export function removeFouDestination(pinDir: string, vip: string): boolean {
  const m = BpfMap.fromPin(path.join(pinDir, FOU_TC.encap.object, 'fou_dests'));
  try {
    return m.delete(ipv4Bytes(vip, 'vip'));
  } finally {
    m.close();
  }
}

/** Counters of a pinned FoU program. */
export function readFouStats(pinDir: string, which: 'encap' | 'decap'): FouStats {
  const m = BpfMap.fromPin(path.join(pinDir, FOU_TC[which].object, `fou_${which}_stats`));
  try {
    return statsOf(m);
  } finally {
    m.close();
  }
}
