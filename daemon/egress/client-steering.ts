// Client steering for the Egress controller: what this node's client pods' traffic of each Egress is steered
// to in eBPF (each address's current owner's gateway pod, tiered by the Egress's zone policy).
import { type ResolvedEgress } from './egress-spec';
import { ipFamily } from '../../lib/ip';
import { EGRESS_TIER_EXCLUDED, EGRESS_TIER_FALLBACK, EGRESS_TIER_PREFERRED } from '../bpf/egress-structs';
import type { PeerLiveness } from './peer-liveness';
import { type EgressShared, type AddressState } from './egress-state';

export class ClientSteering {
  constructor(private readonly s: EgressShared, private readonly peers: PeerLiveness) {}

  /** What the client steering map holds per Egress (for one log line per change). */
  readonly steered = new Map<string, string>();

  updateClients(st: AddressState): void {
    if (!this.s.maps || ![...this.s.clients.values()].some((c) => c.egressIds.includes(this.s.egressIds.get(st.egress.key)!))) return;
    const id = this.s.egressIds.get(st.egress.key)!;
    const slots: Array<{ gatewayIp: string; floatingIp: string; epoch: number; tier: number }> = [];
    const unreachable: string[] = [];
    const noOuterIpv4: string[] = [];
    const underlay6 = ipFamily(this.s.o.node.address) === 6;
    for (const a of [...this.s.addresses.values()].sort((x, y) => (x.address < y.address ? -1 : 1))) {
      if (a.egress.key !== st.egress.key || !a.own.owner) continue;
      const reg = this.peers.liveRegistry(a.egress.key).find((x) => x.pod === a.own.owner);
      const gatewayIp = a.own.ownerPodIp || reg?.podIp;
      // Not known yet (a record without the pod's address): keep the previous slots; dropped at worst,
      // never sent unNATed. The owner's heartbeat brings it within a second.
      if (!gatewayIp) return;
      // An IPv4 floating address is steered in outer IPv4 only: an owner that published an IPv6 pod address
      // (an IPv6 underlay) cannot be reached for it. Left out (its flows go to the other slots), and said.
      if (ipFamily(a.address) === 4 && ipFamily(gatewayIp) === 6) {
        unreachable.push(a.address);
        continue;
      }
      // Over an IPv6 underlay this node has no outer IPv4 source: a gateway pod published by its IPv4 address
      // (an owner on an IPv4 underlay: node underlays of different families) cannot be reached from here.
      if (underlay6 && ipFamily(gatewayIp) === 4) {
        noOuterIpv4.push(a.address);
        continue;
      }
      slots.push({ gatewayIp, floatingIp: a.address, epoch: a.own.epoch, tier: this.tierOf(a.egress, a.own.ownerNode, reg?.zone) });
    }
    this.s.maps.setGateways(id, slots);
    const now = slots.map((x) => `${x.floatingIp}→${x.gatewayIp}@${x.epoch}/${x.tier}`).join(',');
    if (this.steered.get(st.egress.key) !== now) {
      this.steered.set(st.egress.key, now);
      this.s.o.logger.info('egress: client steering updated', {
        egress: st.egress.key, slots, ...(unreachable.length ? { unreachableIpv4: unreachable } : {}), ...(noOuterIpv4.length ? { unreachableIpv4Gateway: noOuterIpv4 } : {}),
      });
    }
  }

  /**
   * The tier of an address for new flows of this node's clients, from the Egress's zone policy: its owner
   * on this node (preferLocalNode) or in this node's zone (preferZone, requireZone) is preferred; the
   * others are the fallback, or excluded under requireZone. Without a zone on this node, preferZone
   * prefers nothing and requireZone excludes everything (status says why).
   */
  private tierOf(e: ResolvedEgress, ownerNode: string | undefined, ownerZone: string | undefined): number {
    const zone = this.s.o.node.zone;
    switch (e.zonePolicy) {
      case 'preferLocalNode':
        return ownerNode === this.s.o.node.name ? EGRESS_TIER_PREFERRED : EGRESS_TIER_FALLBACK;
      case 'preferZone':
        return !zone || ownerZone === zone ? EGRESS_TIER_PREFERRED : EGRESS_TIER_FALLBACK;
      case 'requireZone':
        return zone && ownerZone === zone ? EGRESS_TIER_PREFERRED : EGRESS_TIER_EXCLUDED;
      default:
        return EGRESS_TIER_PREFERRED;
    }
  }
}
