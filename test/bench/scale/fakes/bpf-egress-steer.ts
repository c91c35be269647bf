// Fake of daemon/bpf/egress-steer.ts: the node's egress maps as plain Maps, every call recorded. The
// gateways each Egress's clients are steered to (setGateways) are what the simulation reads to check that
// every node agrees on a new owner.
import type { EgressAddressStats, EgressConfig, EgressFlow, EgressSlot, EgressStats } from '../../../../daemon/bpf/egress-structs';
import { record } from './record';

export type { EgressSlot, EgressStats, EgressFlow, EgressAddressStats } from '../../../../daemon/bpf/egress-structs';
export const EGRESS_TC = { handle: 1, priority: 0x110, object: 'egress-steer', program: 'egress_steer', pinName: 'egress' } as const;
export const DEFAULT_EGRESS_FLOWS = 65536;

/** Every node's maps in this process by pin dir. */
export const egressMaps: Map<string, EgressMaps> = ((globalThis as Record<string, unknown>).__tetherSimEgress ??= new Map()) as Map<string, EgressMaps>;

export class EgressMaps {
  readonly dests = new Map<number, { steer: string[]; bypass: string[] }>();
  readonly clientMap = new Map<string, number[]>();
  readonly gatewayMap = new Map<number, EgressSlot[]>();
  private cfg: EgressConfig = { nodeAddress: '0.0.0.0', port: 0 };

  setDestinations(egressId: number, steer: string[], bypass: string[]): void {
    record('egress.setDestinations');
    this.dests.set(egressId, { steer, bypass });
  }
  destinations(): Map<string, unknown> {
    return new Map();
  }
  setClient(podIp: string, egressIds: number[]): void {
    record('egress.setClient');
    this.clientMap.set(podIp, egressIds);
  }
  removeClient(podIp: string): boolean {
    record('egress.removeClient');
    return this.clientMap.delete(podIp);
  }
  clients(): Map<string, number[]> {
    return new Map(this.clientMap);
  }
  setGateways(egressId: number, slots: EgressSlot[]): void {
    record('egress.setGateways');
    this.gatewayMap.set(egressId, slots);
  }
  gateways(egressId: number): EgressSlot[] | undefined {
    return this.gatewayMap.get(egressId);
  }
  removeEgress(egressId: number): void {
    record('egress.removeEgress');
    this.dests.delete(egressId);
    this.gatewayMap.delete(egressId);
  }
  config(): EgressConfig {
    return this.cfg;
  }
  setConfig(c: EgressConfig): void {
    this.cfg = c;
  }
  flows(): EgressFlow[] {
    return [];
  }
  addressStats(): Map<string, EgressAddressStats> {
    return new Map();
  }
  forgetAddress(): void {
    record('egress.forgetAddress');
  }
  stats(): EgressStats {
    return { steered: 0n, steeredBytes: 0n, bypassed: 0n, notClient: 0n, noGateway: 0n, errors: 0n, pinned: 0n, repinned: 0n, excluded: 0n } as EgressStats;
  }
  close(): void {}
}

export interface EgressSteerOptions {
  netns?: string | null;
  ifName: string;
  pinDir: string;
  nodeAddress: string;
  port: number;
  objectPath?: string;
  maxFlows?: number;
}

function mapsOf(pinDir: string): EgressMaps {
  let m = egressMaps.get(pinDir);
  if (!m) egressMaps.set(pinDir, (m = new EgressMaps()));
  return m;
}

/** A client veth's attachment: writes go to the node's shared maps, as the pinned maps do. */
export class EgressSteer extends EgressMaps {
  constructor(readonly pinDir: string) {
    super();
  }
  override setClient(podIp: string, egressIds: number[]): void {
    mapsOf(this.pinDir).setClient(podIp, egressIds);
  }
  override removeClient(podIp: string): boolean {
    return mapsOf(this.pinDir).removeClient(podIp);
  }
  detach(): void {
    record('egress.detach');
  }
}

export function attachEgressSteer(o: EgressSteerOptions): EgressSteer {
  record('egress.attach');
  return new EgressSteer(o.pinDir);
}

export function openEgressMaps(pinDir: string): EgressMaps {
  record('egress.openMaps');
  return mapsOf(pinDir);
}

export function detachEgressSteer(): boolean {
  record('egress.detach');
  return true;
}

export function removeEgressPins(pinDir: string): void {
  egressMaps.delete(pinDir);
}

export function readEgressStats(pinDir: string): EgressStats {
  return mapsOf(pinDir).stats();
}
