// Fake of daemon/egress/gateway-datapath.ts: a gateway pod's datapath (decap, SNAT, announcement) as the
// set of addresses it owns; every call recorded.
import type { AnnounceMode } from '../../../../daemon/egress/egress-spec';
import { parseIp } from '../../../../lib/ip';
import { record } from './record';

export interface GatewayPod {
  pod: string;
  netns: string;
  podIp: string;
  podIp6?: string;
  ifName: string;
  hostIfName: string;
}
export interface GuardedDestinations {
  destinations: string[];
  excluded: string[];
}
export interface NodeSide {
  uplink: string;
  fouPort: number;
  pinDir: string;
}

export const FLOAT_MARK = 0x7e7e0000;
export function floatMark(address: string): number | undefined {
  const low = Number((parseIp(address)?.value ?? 0n) & 0xffffn);
  return low ? (FLOAT_MARK | low) >>> 0 : undefined;
}
export function exportTable(announce: { mode: AnnounceMode; table?: number }): number | undefined {
  return announce.mode === 'routeTable' ? announce.table : undefined;
}

export class GatewayDatapath {
  private readonly owned = new Set<string>();

  constructor(
    readonly gw: GatewayPod,
    readonly node: NodeSide,
  ) {}

  prepare(allowedSources: string[]): void {
    record('gateway.prepare');
    record('gateway.allowedSourceEntries', allowedSources.length);
  }
  setAllowedSources(sources: string[]): void {
    record('gateway.setAllowedSources');
    record('gateway.allowedSourceEntries', sources.length);
  }
  guardStats(): undefined {
    return undefined;
  }
  async takeUnannounced(address: string): Promise<void> {
    record('gateway.takeUnannounced');
    this.owned.add(address);
  }
  anticipate(address: string): boolean {
    record('gateway.anticipate');
    return !this.owned.has(address);
  }
  async own(address: string): Promise<void> {
    record('gateway.own');
    this.owned.add(address);
  }
  withdrawAnnouncement(): void {
    record('gateway.withdrawAnnouncement');
  }
  async release(address: string): Promise<void> {
    record('gateway.release');
    this.owned.delete(address);
  }
  ownedAddresses(): string[] {
    return [...this.owned];
  }
  decapStats(): undefined {
    return undefined;
  }
  teardown(): void {
    record('gateway.teardown');
    this.owned.clear();
  }
}
