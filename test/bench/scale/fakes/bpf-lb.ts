// Fake of daemon/bpf/lb.ts: the load balancer's maps as plain Maps, every call recorded. The simulation
// finds each node's datapath by its pin dir (one per simulated node) to feed it "new connection" events
// (what the ring buffer would carry) and to count where a mapping was installed (fan-out).
import { LB_MAGLEV_DEFAULT, LB_MAX_VIPS_DEFAULT, STAT_NAMES, type LbStats, type MapKey } from '../../../../daemon/bpf/lb-structs';
import { record } from './record';

export const LB_TC = { handle: 1, priority: 0x110, object: 'lb', program: 'lb_ingress' } as const;
export const LB_NODE_TC = { handle: 1, priority: 0x130, program: 'lb_node' } as const;
export const LB_HASH_SEED = 0x7e7e1b5d;
export type LbDatapathMode = 'node' | 'pod';
export type TargetState = 'active' | 'terminating';
export interface LbDatapathOptions {
  pinDir: string;
  maxVips?: number;
  maglevSize?: number;
  maxMappings?: number;
  objectPath?: string;
  nodeProgram?: boolean;
}
export interface LbMapping extends MapKey {
  target: string;
  lastNs: bigint;
}

const keyOf = (k: MapKey) => `${k.vip}|${k.vport}|${k.proto}|${k.client}|${k.cport}`;
/** Every fake datapath of this process by pin dir. */
export const lbDatapaths: Map<string, LbDatapath> = ((globalThis as Record<string, unknown>).__tetherSimLb ??= new Map()) as Map<string, LbDatapath>;

export class LbDatapath {
  readonly slots = new Map<string, number>();
  readonly map = new Map<string, LbMapping>();
  private listener?: (e: { key: MapKey; target: string }) => void;
  private queued: Array<{ key: MapKey; target: string }> = [];

  private constructor(
    readonly pinDir: string,
    readonly maxVips: number,
    readonly maglevSize: number,
    private readonly maxMappingsN = 262_144,
  ) {}

  static load(o: LbDatapathOptions): LbDatapath {
    record('lb.load');
    const dp = new LbDatapath(o.pinDir, o.maxVips ?? LB_MAX_VIPS_DEFAULT, o.maglevSize ?? LB_MAGLEV_DEFAULT, o.maxMappings);
    lbDatapaths.set(o.pinDir, dp);
    return dp;
  }
  configure(): void {
    record('lb.configure');
  }
  attach(netns: string, ifName: string): { netns: string; ifName: string } {
    record('lb.attach');
    return { netns, ifName };
  }
  detach(): boolean {
    record('lb.detach');
    return true;
  }
  attachNode(ifName: string): { ifName: string } {
    record('lb.attachNode');
    return { ifName };
  }
  detachNode(): boolean {
    record('lb.detachNode');
    return true;
  }
  static detachNodeFrom(): boolean {
    record('lb.detachNode');
    return false;
  }
  nodeAttached(): boolean {
    return false;
  }
  get maxMappings(): number {
    return this.maxMappingsN;
  }
  /** The VIPs programmed now and their slots (what a restart finds in the pinned maps). */
  services(): Map<string, number> {
    return new Map(this.slots);
  }
  setService(vip: string, slot: number): void {
    record('lb.setService');
    this.slots.set(vip, slot);
  }
  removeService(vip: string): void {
    record('lb.removeService');
    this.slots.delete(vip);
  }
  setTargets(): void {
    record('lb.setTargets');
  }
  setMaglevRow(): void {
    record('lb.setMaglevRow');
  }
  installMappings(list: Array<{ key: MapKey; target: string }>): { installed: number; full: number } {
    record('lb.installMappings');
    record('lb.mappingsInstalled', list.length);
    for (const m of list) this.map.set(keyOf(m.key), { ...m.key, target: m.target, lastNs: 0n });
    return { installed: list.length, full: 0 };
  }
  mappings(): LbMapping[] {
    return [...this.map.values()];
  }
  deleteMappings(pred: (m: LbMapping) => boolean): number {
    let n = 0;
    for (const [k, m] of this.map) if (pred(m) && this.map.delete(k)) n++;
    return n;
  }
  deleteMappingKeys(keys: MapKey[]): number {
    let n = 0;
    for (const k of keys) if (this.map.delete(keyOf(k))) n++;
    return n;
  }
  onEvents(fn: (e: { key: MapKey; target: string }) => void): void {
    this.listener = fn;
  }
  pollEvents(): number {
    const q = this.queued;
    this.queued = [];
    for (const e of q) this.listener?.(e);
    return q.length;
  }
  stats(): LbStats {
    const z = 0n;
    return Object.fromEntries(STAT_NAMES.map((n) => [n, z])) as unknown as LbStats;
  }
  resetStats(): void {}
  nodeStats(): { notForHost: bigint } {
    return { notForHost: 0n };
  }
  close(): void {
    record('lb.close');
    lbDatapaths.delete(this.pinDir);
  }

  /** Simulation: a packet of a new flow picked `target` (the ring buffer's event), and the datapath holds it. */
  simNewConnection(key: MapKey, target: string): void {
    this.map.set(keyOf(key), { ...key, target, lastNs: 0n });
    this.queued.push({ key, target });
  }
  simHas(key: MapKey): boolean {
    return this.map.has(keyOf(key));
  }
}
