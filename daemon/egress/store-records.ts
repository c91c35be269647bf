// The cluster store's part for the Egress controller: registrations, the registry and node list, address
// allocation and re-assertion after a wipe, and records of decisions (written in the background, reconciled).
import { ErrorCode, TetherError } from '../../lib/errors';
import { scoreOf, supersedes } from './candidates';
import { addressSlots, slotOwner, type ResolvedEgress } from './egress-spec';
import { UnreadableRecordError, type Ownership } from './ownership-store';
import { type EgressShared, streamOf, type AddressState } from './egress-state';
import { REGISTRY_TTL_MS } from '../common/node-registry';
import { isOomReply, storeFullness } from '../common/store-full';

/** The safety net's period: records a node follows by change notice are read whole this often anyway. */
export const SAFETY_EVERY_MS = 15_000;

/** This node's safety-net period: SAFETY_EVERY_MS ± 25 %, fixed per node name, so nodes do not read in step. */
export function safetyPeriodMs(node: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < node.length; i++) h = Math.imul(h ^ node.charCodeAt(i), 0x01000193);
  return Math.round(SAFETY_EVERY_MS * (0.75 + ((h >>> 0) / 2 ** 32) * 0.5));
}

export class StoreRecords {
  /**
   * `adopt`: follows a record that supersedes this node's view (the election does; it is built after the
   * store's part, which it records its decisions through). Called under the address's lock.
   */
  constructor(private readonly s: EgressShared, private readonly adopt: (st: AddressState, rec: Ownership, via: string) => Promise<void>) {}

  private storeBusy = false;

  /** The cluster store's generation last seen (a new one: the store lost its data). */
  private generation?: string;

  /** A full pass was asked for while one ran: the next pass is full. */
  private fullAgain = true;

  /** When the next pass reads every involved record (the safety net behind the change notices). */
  private nextSafetyMs = 0;

  /** Egresses this node has registered gateway pods for (so the last one leaving removes the entry). */
  private readonly registered = new Set<string>();

  /**
   * One pass of what the store is used for, in the background: this node's registrations (one command
   * for its node, one per Egress it has gateway pods for, each bringing back only what changed), then for
   * the Egresses this node plays a part in (gateway, client, holder; every Egress on a full pass): the
   * registry (kept as last known when the store is unreachable), floating addresses not yet allocated, and
   * records: a record that supersedes this node's view is followed; a decision this node holds that the
   * store lacks is written (epochs reconciled after the store was away). A node with no part in an Egress
   * reads nothing of it periodically: it follows the store's change notices, and reads it whole on a full
   * pass (start, configuration change, store connection back).
   */
  async storePass(opts: { full?: boolean } = {}): Promise<void> {
    if (this.s.stopped) return;
    if (this.storeBusy) {
      if (opts.full) this.fullAgain = true;
      return;
    }
    this.storeBusy = true;
    try {
      const full = opts.full || this.fullAgain || this.s.storeDown;
      this.fullAgain = false;
      // A full store refuses writes but still answers reads: the pass goes on reading and following records.
      await this.unlessFull(this.register());
      const involved = this.s.involvedSet();
      const watched = [...this.s.egresses.values()].filter((e) => full || involved.has(e.key));
      // Read together (one round trip's wait, not one per Egress): a full pass reads every Egress, and as
      // many sequential round trips outlast a loaded store's timeouts, leaving the node in full passes.
      const unlisted = watched.filter((e) => !this.registered.has(e.key));
      const lists = await Promise.all(unlisted.map((e) => this.s.o.ownership.listGateways(e.key)));
      unlisted.forEach((e, i) => this.s.registry.set(e.key, lists[i]));
      // A node with no part in an Egress keeps no copy of its registry: it would read none again, so a
      // kept copy would only go stale (its status would name candidates that left long ago).
      for (const e of this.s.egresses.values()) if (!full && !involved.has(e.key)) this.s.registry.delete(e.key);
      if (full || watched.length) await this.reassertAddresses();
      await this.ensureAddresses(watched);
      // Records are followed by the store's change notices; a pass reads one only where that is not enough:
      // on a full pass, for the holder (it repairs a record that lost or garbled its decision), where this
      // node's view is not known to be the store's (learnt from a peer's notice, not yet confirmed), and on
      // the slow safety-net pass (a notice lost), spread over the nodes.
      const now = Date.now();
      const safety = full || now >= this.nextSafetyMs;
      if (safety) this.nextSafetyMs = now + safetyPeriodMs(this.s.o.node.name);
      const toRead = [...this.s.addresses.values()].filter((st) => (full || involved.has(st.egress.key)) && (safety || st.holder || !st.recorded));
      // Read together, then followed one by one (each under its address's lock).
      const read = await Promise.all(toRead.map((st) => this.s.o.ownership.get(st.egress.key, st.address).then(
        (rec): Ownership | 'unreadable' => rec,
        (e): 'unreadable' => {
          if (e instanceof UnreadableRecordError) return 'unreadable';
          throw e;
        },
      )));
      for (const [i, st] of toRead.entries()) {
        const rec = read[i];
        if (rec === 'unreadable') {
          // A garbled record (refused and logged by the store layer): nothing in it is followed; the
          // holder's decision replaces it, the others wait for that.
          if (st.holder) await this.unlessFull(this.record(st));
          continue;
        }
        const write = await this.s.mutex.run(streamOf(st), async () => {
          if (supersedes(rec, st.own) || (rec.epoch === st.own.epoch && rec.owner === st.own.owner)) {
            await this.adopt(st, rec, 'store');
            return false;
          }
          // This node's view supersedes the record: the holder writes it (the others wait for it to).
          return !!st.holder;
        });
        if (write) await this.unlessFull(this.record(st));
      }
      // The use of the addresses is read only while someone asks for it (the leader's status, the API).
      if (Date.now() < this.s.observedUntil) for (const e of this.s.egresses.values()) this.s.usage.set(e.key, await this.s.o.ownership.usage(e.key));
      if (this.s.storeDown) this.s.o.logger.info('egress: cluster store reachable again; records reconciled');
      this.s.storeDown = false;
    } catch (e) {
      this.s.storeFailed(e);
    } finally {
      this.storeBusy = false;
    }
  }

  /**
   * Every address slot of every Egress allocated and tracked: a new slot (count raised, a pool added) gets
   * its address now; a failure (pool exhausted, address held by another owner) is kept as the Egress's
   * shortfall for status and retried on the next pass. Each slot has its own owner in the store, so an
   * address is allocated and returned alone.
   */
  private async ensureAddresses(egresses: ResolvedEgress[]): Promise<void> {
    const held = new Set([...this.s.addresses.values()].map((st) => st.slotOwner));
    for (const e of egresses) {
      const problems: string[] = [];
      for (const slot of addressSlots(e)) {
        const owner = slotOwner(e.key, slot);
        if (held.has(owner)) continue;
        try {
          const req = 'explicit' in slot ? { pool: slot.pool, owner, addresses: [slot.explicit] } : { pool: slot.pool, owner, count: 1, ...(slot.family ? { family: slot.family } : {}) };
          const { addresses } = await this.s.o.addresses.allocate(req);
          const a = addresses[0];
          if (!a) continue;
          // An unreadable record: tracked as nobody's here, but a first claim over it is refused by the
          // store's compare-and-set, and a holder's heartbeat still supersedes it.
          const rec = await this.s.o.ownership.get(e.key, a).catch((err) => {
            if (err instanceof UnreadableRecordError) return { egress: e.key, address: a, owner: '', epoch: 0 } as Ownership;
            throw err;
          });
          const st = this.s.track(e, a, slot, rec);
          if (supersedes(rec, st.own)) await this.s.mutex.run(streamOf(st), () => this.adopt(st, rec, 'store'));
          this.s.o.logger.info('egress: floating address', { egress: e.key, address: a, pool: slot.pool, owner });
        } catch (err) {
          // TryAgainLater: the store restarted empty and new addresses wait while holders re-assert theirs.
          if (err instanceof TetherError && (err.code === ErrorCode.PoolExhausted || err.code === ErrorCode.AddressConflict || err.code === ErrorCode.UnknownPool || err.code === ErrorCode.TryAgainLater)) problems.push(err.message);
          else throw err;
        }
      }
      const why = problems.join('; ');
      if (why && this.s.shortfall.get(e.key) !== why) this.s.o.logger.warn('egress: fewer addresses than asked', { egress: e.key, asked: addressSlots(e).length, problems });
      if (why) this.s.shortfall.set(e.key, why);
      else this.s.shortfall.delete(e.key);
    }
  }

  /**
   * After the store lost its data (a new generation: restarted empty, FLUSHALL), every floating address
   * this node tracks is put back under its slot's owner, and the decision this node holds is written again
   * right away: the store holds new allocations back meanwhile (ClusterAddresses), so an address in use is
   * never handed to anyone else, and a tetherd starting now gets the same address for the same slot.
   */
  private async reassertAddresses(): Promise<void> {
    const g = await this.s.o.addresses.generation();
    if (g === this.generation) return;
    if (this.generation === undefined || !this.s.addresses.size) {
      this.generation = g;
      return;
    }
    this.s.o.logger.warn('egress: cluster store lost its data; re-asserting the floating addresses this node tracks', { addresses: this.s.addresses.size, generation: g });
    await this.s.o.addresses.markRestarted(g);
    for (const st of this.s.addresses.values()) {
      try {
        await this.s.o.addresses.reassert(st.slot.pool, st.slotOwner, st.address);
        this.s.o.logger.info('egress: floating address re-asserted', { egress: st.egress.key, address: st.address, owner: st.slotOwner });
      } catch (e) {
        if (!(e instanceof TetherError) || e.code !== ErrorCode.AddressConflict) throw e;
        // Someone got it while nobody re-asserted it (no node tracking it reached the store in the hold-off).
        this.s.o.logger.error('egress: floating address this Egress uses was given to another owner while the store was empty', { egress: st.egress.key, address: st.address, error: e.message });
        this.s.shortfall.set(st.egress.key, e.message);
      }
      if (st.holder) await this.record(st);
    }
    // Only once all are back: a pass that failed half-way re-asserts again.
    this.generation = g;
  }

  /** Writes the decision this node made (or holds) to the store; follows the store if it has a later one. */
  private async record(st: AddressState): Promise<void> {
    const own = st.own;
    const r = await this.s.o.ownership.record({ ...own, score: scoreOf(own.address, own.owner) });
    if (r === 'superseded') {
      const rec = await this.s.o.ownership.get(st.egress.key, st.address);
      await this.s.mutex.run(streamOf(st), () => this.adopt(st, rec, 'store'));
      return;
    }
    if (st.own === own) st.recorded = true;
    if (r === 'recorded') this.s.o.logger.info('egress: decision recorded in the cluster store', { egress: st.egress.key, address: st.address, owner: own.owner, epoch: own.epoch });
  }

  /** `p`, whose refusal by a full store is reported (storeFailed) instead of failing the pass. */
  private async unlessFull(p: Promise<void>): Promise<void> {
    try {
      await p;
    } catch (e) {
      if (!isOomReply(e)) throw e;
      this.s.storeFailed(e);
    }
  }

  recordLater(st: AddressState): void {
    void this.s.records.run(() => this.record(st)).catch((e) => this.s.storeFailed(e));
  }

  /**
   * This node's registrations: its node (one command; the node list comes back as changes), its gateway
   * pods per Egress it has some for (one command each; the registry comes back as changes; the last pod
   * leaving removes the entry), and its clients' use of the addresses of each Egress they use.
   */
  async register(): Promise<void> {
    let counters = new Map<string, { flows: bigint; bytes: bigint }>();
    try {
      counters = this.s.maps?.addressStats() ?? counters;
    } catch {
      // usage is diagnostics
    }
    for (const e of this.s.egresses.values()) {
      const mine = [...this.s.gateways.values()].filter((g) => g.egresses.has(e.key)).map((g) => g.info);
      if (mine.length || this.registered.has(e.key)) {
        this.s.registry.set(e.key, await this.s.o.ownership.registerGateways(e.key, this.s.o.node.name, mine, REGISTRY_TTL_MS));
        if (mine.length) this.registered.add(e.key);
        else this.registered.delete(e.key);
      }
      const id = this.s.egressIds.get(e.key);
      if (![...this.s.clients.values()].some((c) => id !== undefined && c.egressIds.includes(id))) continue;
      const usage: Record<string, { flows: number; bytes: number }> = {};
      for (const st of this.s.addresses.values()) {
        const c = st.egress.key === e.key ? counters.get(st.address) : undefined;
        if (c) usage[st.address] = { flows: Number(c.flows), bytes: Number(c.bytes) };
      }
      // Usage is diagnostics, and grows with the nodes reporting it: a full store refuses it (reported).
      if (Object.keys(usage).length) {
        await this.unlessFull(this.s.o.ownership.reportUsage(e.key, this.s.o.node.name, usage, REGISTRY_TTL_MS * 6).then(() => storeFullness.written('egress')));
      }
    }
    const nodes = await this.s.o.ownership.beatNode(this.s.o.node.name, this.s.o.node.address, REGISTRY_TTL_MS, this.s.o.node.address6);
    this.s.nodeNames = this.s.o.ownership.nodeNames();
    if (nodes.join() !== this.s.nodes.join()) {
      this.s.nodes = nodes;
      for (const gw of this.s.gateways.values()) gw.datapath.setAllowedSources(nodes);
    }
  }
}
