// What the status pass writes of Egresses and tether Services, as the cluster store holds it: the operator
// runs on no node, so it has no egress or LB controller of its own to ask (as the node that led did).
//   Egresses   each address slot's allocation (the pools' holders), its recorded owner and epoch (the
//              ownership records), the owner's zone (the gateway registry), every node's use of it (the
//              usage reports); read only: the nodes allocate, elect and record
//   Services   each tether Service's VIP, held here for every Service (as the leading node's LB did:
//              allocated idempotently per Service, so the nodes that serve it get the same one), released
//              when the Service asks for another, and the VIPs of Services deleted while nobody held them
//              collected (vip-addresses.ts, the nodes' own code)
import type { Logger } from '../lib/log';
import type { ClusterAddresses } from '../ipam/cluster-addresses';
import type { ResolvedPool } from '../ipam/types';
import type { EgressAddressStatus, EgressSummary } from '../daemon/kube/status-controller';
import { addressSlots, slotOwner, type ResolvedEgress } from '../daemon/egress/egress-spec';
import type { GatewayInfo, OwnershipStore } from '../daemon/egress/ownership-store';
import type { LbResolution, ResolvedLoadBalancer } from '../daemon/lb/lb-spec';
import { LbShared, type LbControllerOptions } from '../daemon/lb/lb-state';
import type { LbStore } from '../daemon/lb/lb-store';
import { VipAddresses } from '../daemon/lb/vip-addresses';

/** The Egresses' addresses, owners and counts, from the store; read again before each status pass. */
export class EgressView {
  private addresses: EgressAddressStatus[] = [];
  private summaries: Record<string, EgressSummary> = {};

  constructor(private readonly o: { ownership: OwnershipStore; addresses: ClusterAddresses; logger: Logger }) {}

  async refresh(egresses: ResolvedEgress[], pools: ResolvedPool[]): Promise<void> {
    this.o.addresses.setPools(pools);
    const holders = new Map<string, Map<string, string>>();
    const ownerToAddress = async (pool: string): Promise<Map<string, string>> => {
      let m = holders.get(pool);
      if (!m) {
        m = new Map([...(await this.o.addresses.holders(pool))].map(([address, owner]) => [owner, address]));
        holders.set(pool, m);
      }
      return m;
    };
    const addresses: EgressAddressStatus[] = [];
    const summaries: Record<string, EgressSummary> = {};
    const failed: string[] = [];
    for (const e of egresses) {
      try {
        const { mine, summary } = await this.read(e, ownerToAddress);
        addresses.push(...mine);
        summaries[e.key] = summary;
      } catch (err) {
        // This Egress as last read (its status is not rewritten from nothing); the others go on.
        failed.push(`${e.key}: ${(err as Error).message}`);
        addresses.push(...this.addresses.filter((a) => a.egress === e.key));
        if (this.summaries[e.key]) summaries[e.key] = this.summaries[e.key];
      }
    }
    if (failed.length) this.o.logger.warn('operator: Egress owners not read from the store; their status keeps what was last read', { failed });
    this.addresses = addresses;
    this.summaries = summaries;
  }

  /** One Egress: its slots' addresses and owners, and its counts. */
  private async read(e: ResolvedEgress, ownerToAddress: (pool: string) => Promise<Map<string, string>>): Promise<{ mine: EgressAddressStatus[]; summary: EgressSummary }> {
    const slots = addressSlots(e);
    const gateways: GatewayInfo[] = await this.o.ownership.listGateways(e.key);
    const usage = await this.o.ownership.usage(e.key);
    const mine: EgressAddressStatus[] = [];
    const unallocated = new Set<string>();
    for (const s of slots) {
      const address = (await ownerToAddress(s.pool)).get(slotOwner(e.key, s));
      if (!address) {
        unallocated.add(s.pool);
        continue;
      }
      const own = await this.o.ownership.get(e.key, address);
      const u = usage[address];
      mine.push({
        egress: e.key, address, owner: own.owner, ownerNode: own.ownerNode || undefined, epoch: own.epoch,
        ownerZone: gateways.find((g) => g.pod === own.owner)?.zone,
        ...(u ? { flows: u.flows, bytes: u.bytes } : {}),
      });
    }
    const owned = mine.filter((a) => a.owner);
    const ownerNodes = new Set(owned.map((a) => a.ownerNode)).size;
    // A cap (the Egress's, or a node's label) keeps addresses without an owner while live gateways are there.
    const liveNodes = new Set(gateways.map((g) => g.node)).size;
    const capped = e.maxAddressesPerNode !== undefined || gateways.some((g) => g.maxAddresses !== undefined);
    // Why fewer are allocated, as far as the store tells: a pool with no free address (the nodes log the rest).
    const capacity = new Map(this.o.addresses.capacities().map((c) => [c.pool, c.capacity]));
    const full: string[] = [];
    for (const pool of unallocated) {
      const used = (await ownerToAddress(pool)).size;
      const cap = capacity.get(pool);
      if (cap !== undefined && used >= cap) full.push(`pool ${pool} has no free address (${used} of ${cap} allocated)`);
    }
    const summary = {
      asked: slots.length, allocated: mine.length, owned: owned.length, ownerNodes, ...(full.length ? { shortfall: full.join('; ') } : {}),
      capLimited: capped && liveNodes > 0 && owned.length < mine.length && ownerNodes >= liveNodes,
    };
    return { mine, summary };
  }

  status(): EgressAddressStatus[] {
    return this.addresses;
  }

  summary(): Record<string, EgressSummary> {
    return this.summaries;
  }
}

/** How often VIPs of Services deleted while nobody held them are looked for (as the leading node did). */
const COLLECT_EVERY_MS = 60_000;

/** Every tether Service's VIP, held by the operator's leader for their status (and released when it changes). */
export class LbView {
  private readonly s: LbShared;
  private readonly vips: VipAddresses;
  private lbs = new Map<string, ResolvedLoadBalancer>();
  private refused: LbResolution['refused'] = [];
  private unserved: NonNullable<LbResolution['unserved']> = [];
  private lastCollect = 0;

  constructor(o: { identity: string; addresses: ClusterAddresses; store?: LbStore; logger: Logger }) {
    // No datapath, no pods, no state dir: only what VipAddresses uses of a node's LB.
    const opts: LbControllerOptions = {
      node: { name: o.identity, address: '' }, pinDir: '', fouPort: 0, exportTable: 0,
      store: o.store, addresses: o.addresses, logger: o.logger, attach: undefined as never,
    };
    this.s = new LbShared(opts);
    this.vips = new VipAddresses(this.s, () => {});
  }

  async refresh(resolution: LbResolution, pools: ResolvedPool[]): Promise<void> {
    this.s.o.addresses.setPools(pools);
    this.lbs = new Map(resolution.loadBalancers.map((l) => [l.key, l]));
    this.refused = resolution.refused;
    this.unserved = resolution.unserved ?? [];
    this.s.storeAway = !!this.s.o.store && !this.s.o.store.connection.connected;
    let more = true;
    for (let i = 0; more && i < 50; i++) more = (await this.vips.apply(this.lbs, new Set(this.lbs.keys()))).more;
    if (!more && Date.now() - this.lastCollect >= COLLECT_EVERY_MS) {
      this.lastCollect = Date.now();
      await this.vips.collect(this.lbs).catch((e: Error) => this.s.logger.warn('operator: looking for VIPs of deleted Services failed; retried', { error: e.message }));
    }
  }

  /**
   * What the status pass reads of each Service, one entry per Service whatever its families: `vip` its
   * first VIP and `vips` every VIP it is served at, in its ipFamilies order (status.loadBalancer.ingress
   * lists them so); `problem` why it is not served (no VIP, no targets), `vipProblem` a family of it without
   * its VIP while another has one, `notes` the families it is not served in and why (PreferDualStack
   * without a pool of the family, a family the datapath does not program yet).
   */
  status(): Array<Record<string, unknown>> {
    const out: Array<Record<string, unknown>> = [];
    const byService = new Map<string, ResolvedLoadBalancer[]>();
    for (const lb of this.lbs.values()) byService.set(lb.service, [...(byService.get(lb.service) ?? []), lb]);
    const notes = new Map<string, string[]>();
    for (const u of this.unserved) notes.set(u.key, [...(notes.get(u.key) ?? []), u.why]);
    for (const [service, lbs] of byService) {
      lbs.sort((x, y) => x.ipFamilies.indexOf(x.family) - y.ipFamilies.indexOf(y.family));
      const states = lbs.map((lb) => ({ lb, st: this.s.vips.get(lb.key) }));
      const served = states.filter((x) => x.st?.vip);
      const dual = lbs.length > 1;
      const tag = (family: string, msg: string) => (dual ? `${family}: ${msg}` : msg);
      const noTargets = served.filter((x) => x.lb.targets.length === 0);
      const missing = states.filter((x) => !x.st?.vip);
      out.push({
        service, vip: served[0]?.st!.vip, vips: served.map((x) => x.st!.vip), pool: lbs[0].vip.pool, externalTrafficPolicy: lbs[0].externalTrafficPolicy,
        ...(states.some((x) => !x.st) ? { vipHere: 'pending: not asked for yet' } : {}),
        problem: !served.length
          ? missing.map((x) => tag(x.lb.family, x.st?.problem ?? 'no VIP allocated yet')).join('; ')
          : noTargets.length === served.length ? (dual ? `${noTargets.map((x) => x.lb.family).join(', ')}: ` : '') + 'no targets: accepted, nothing announced' : undefined,
        ...(served.length && missing.length ? { vipProblem: missing.map((x) => tag(x.lb.family, x.st?.problem ?? 'no VIP allocated yet')).join('; ') } : {}),
        ...(notes.has(service) ? { notes: notes.get(service) } : {}),
      });
    }
    // Services served in none of their families (an IPv6-only Service while the datapath takes IPv4 only).
    for (const [service, why] of notes) if (!byService.has(service)) out.push({ service, unserved: why });
    for (const r of this.refused) out.push({ service: r.key, refused: r.problems });
    return out;
  }
}
