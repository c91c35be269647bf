// Ownership of floating addresses for the Egress controller: the reconcile tick that decides claims,
// handovers and stand-downs (candidates.ts), following decisions from notices and the store, telling every node.
import { decide, handoverTarget, orderCandidates, placeAddresses, scoreOf, supersedes } from './candidates';
import { type ResolvedEgress } from './egress-spec';
import { type OwnershipNotice } from './ownership-notice';
import { UnreadableRecordError, type GatewayInfo, type Ownership } from './ownership-store';
import {
  type EgressShared, streamOf, isDraining, causeWithNote, countTakeover, takeoverCause, type AddressState, type LocalGateway, CONFIRM_WAIT_MS, HANDOVER_POLL_MS, INITIAL_SETTLE_MS, NOTICE_REPEAT_MS, TICK_MS,
} from './egress-state';
import type { PeerLiveness } from './peer-liveness';
import type { ConntrackStreams } from './conntrack-streams';
import type { StoreRecords } from './store-records';
import type { ClientSteering } from './client-steering';
import { ReconcileLoop } from '../util/reconcile-loop';

/** How long a pod's guard lets it use an address its failed owner also held (anticipateSiblings). */
const ANTICIPATE_MS = 1000;

export class Election {
  /** The ticks: every TICK_MS (once the controller starts it) and on request; they never overlap. */
  readonly loop: ReconcileLoop;

  /**
   * `dropVanishedGateways`: each pass first drops the local gateway pods whose namespace is gone (the pod
   * roles do; they are built after the election, which they hand over through).
   */
  constructor(
    private readonly s: EgressShared,
    private readonly peers: PeerLiveness,
    private readonly streams: ConntrackStreams,
    private readonly store: StoreRecords,
    private readonly steering: ClientSteering,
    private readonly dropVanishedGateways: () => Promise<void>,
  ) {
    this.loop = new ReconcileLoop({
      run: () => this.pass(),
      everyMs: TICK_MS,
      onError: (e) => this.s.o.logger.error('egress: work failed', { error: e.message, stack: e.stack }),
    });
  }

  /** The candidates of each Egress as last seen, and since when (initial placement waits for them to settle). */
  private readonly registrySeen = new Map<string, { sig: string; since: number }>();

  /** Placement of ownerless addresses per Egress, for the tick under way. */
  private readonly placements = new Map<string, Map<string, GatewayInfo | undefined>>();

  /** Ticks never overlap: a tick asked for while one runs runs right after it. */
  requestTick(): void {
    if (!this.s.stopped) this.loop.request();
  }

  /**
   * A tick now, awaited; while one runs, one more is asked for and not awaited (the caller may hold a
   * stream's lock the tick under way needs).
   */
  async tick(): Promise<void> {
    if (this.s.stopped) return;
    if (this.loop.running) return this.loop.request();
    await this.loop.kick();
  }

  /** One reconcile pass over every address, from what this node knows now: it never waits for the store. */
  private async pass(): Promise<void> {
    if (this.s.stopped) return;
    await this.dropVanishedGateways();
    this.peers.dropLapsedAnnouncements();
    this.peers.ensureBfd();
    this.placements.clear();
    const involved = this.s.involvedSet();
    for (const st of this.s.addresses.values()) {
      if (this.s.stopped) return;
      // A node with no part in the Egress (no gateway or client pod of it, holding none of its addresses)
      // decides nothing about it: it is no candidate, steers no client, and learns owners from notices.
      // Only the node an owner record names still looks (a pod of it gone: this node must hand over).
      if (!involved.has(st.egress.key) && st.own.ownerNode !== this.s.o.node.name) {
        if (st.candidates.length) st.candidates = [];
        continue;
      }
      await this.s.mutex.run(streamOf(st), () => this.evaluate(st));
    }
  }

  /** This node's cap on one Egress's addresses for `node` (the node's own override, else the Egress's). */
  private capOf(e: ResolvedEgress, node: string): number {
    const g = this.peers.liveRegistry(e.key).find((x) => x.node === node);
    return g?.maxAddresses ?? e.maxAddressesPerNode ?? Infinity;
  }

  /**
   * Where each address of the Egress without a live owner goes (placeAddresses), computed once per tick
   * from this node's views, which every candidate shares: anti-affinity, the per-node caps, least load.
   */
  placementOf(e: ResolvedEgress): Map<string, GatewayInfo | undefined> {
    let p = this.placements.get(e.key);
    if (!p) {
      const mine = [...this.s.addresses.values()].filter((x) => x.egress.key === e.key);
      p = placeAddresses(
        mine.map((x) => ({ address: x.address, own: x.own, ownerAlive: this.peers.ownerAlive(x), inSync: x.inSync })),
        this.peers.liveRegistry(e.key), (g) => this.peers.alive(g), (node) => this.capOf(e, node),
      );
      this.placements.set(e.key, p);
    }
    return p;
  }

  /** The addresses of an Egress each node holds now (live owners), for load-aware handovers. */
  private loadOf(e: ResolvedEgress, except: AddressState): { of: (node: string) => number; cap: (node: string) => number } {
    const load = new Map<string, number>();
    for (const x of this.s.addresses.values()) {
      if (x === except || x.egress.key !== e.key || !x.own.owner || !x.own.ownerNode || !this.peers.ownerAlive(x)) continue;
      load.set(x.own.ownerNode, (load.get(x.own.ownerNode) ?? 0) + 1);
    }
    return { of: (n) => load.get(n) ?? 0, cap: (n) => this.capOf(e, n) };
  }

  /**
   * Whether the Egress's candidate set has been stable for INITIAL_SETTLE_MS: the first placement of its
   * addresses waits for that, so gateways starting together are all known and the addresses spread over
   * them (a live owner is never moved later, so a rushed first placement would stay lopsided).
   */
  private candidatesSettled(e: ResolvedEgress): boolean {
    const sig = this.peers.liveRegistry(e.key).map((g) => g.pod).sort().join(',');
    const seen = this.registrySeen.get(e.key);
    const now = Date.now();
    if (!seen || seen.sig !== sig) {
      this.registrySeen.set(e.key, { sig, since: now });
      return false;
    }
    return now - seen.since >= INITIAL_SETTLE_MS;
  }

  private async evaluate(st: AddressState): Promise<void> {
    st.candidates = orderCandidates(st.address, this.peers.liveRegistry(st.egress.key));
    // Its holder is letting it go (handOverWhenInSync decides): only its sync streams follow the candidates.
    if (st.handingOver && st.holder) return this.streams.ensureSenders(st);
    if (st.own.epoch === 0 && !st.own.owner && !this.candidatesSettled(st.egress)) return;
    const local = new Set([...this.s.gateways.values()].filter((g) => g.egresses.has(st.egress.key)).map((g) => g.info.pod));
    if (st.own.owner && st.own.ownerNode === this.s.o.node.name && !local.has(st.own.owner) && !st.holder) {
      // The owner is a pod of this node that is gone (killed before a live candidate was known here, or
      // named by a handover that did not know it was gone). Only this node knows: the others see its node
      // alive. Hand over as soon as a live candidate is known: every tick, not only when the pod left.
      if (this.handOver(st, st.own.owner, `handover: owner ${st.own.owner} is no longer on ${this.s.o.node.name}`)) {
        this.streams.ensureSenders(st);
        return;
      }
    }
    const ownerAlive = this.peers.ownerAlive(st);
    const now = Date.now();
    if (ownerAlive || !st.own.owner) st.ownerDownSince = undefined;
    else st.ownerDownSince ??= now;
    const placed = ownerAlive && st.own.owner ? undefined : { pod: this.placementOf(st.egress).get(st.address) };
    const d = decide({
      own: st.own, candidates: st.candidates, localPods: local, alive: (g) => this.peers.alive(g), ownerAlive, holdingLocally: !!st.holder,
      inSync: st.inSync, ownerDownSince: st.ownerDownSince, now, choice: placed,
    });
    if (d.action !== 'wait') st.waiting = false;
    if (d.action === 'claim' && st.own.epoch === 0 && !this.s.storeDown) {
      // A first owner has no connections to lose, so it goes through the store's compare-and-set: two
      // candidates starting at once (neither knowing the other yet) would otherwise both claim, and the
      // better-scored one would then take the address from the other. Without the store, they settle it.
      const gw = this.s.gateways.get(d.pod)!;
      const first: Ownership = { egress: st.egress.key, address: st.address, owner: d.pod, epoch: 1, cause: d.cause, ownerNode: this.s.o.node.name, ownerNodeAddress: this.s.o.node.address, ownerPodIp: gw.info.podIp };
      // The pod side first (SNAT, no announcement): the store publishes a won claim at once, and clients
      // steer to the pod on it; a lost claim is undone.
      await gw.datapath.takeUnannounced(st.address, st.egress.announce);
      const r = await this.s.o.ownership.record({ ...first, score: scoreOf(st.address, d.pod) }, { firstOnly: true }).catch((e) => {
        // A garbled record where the first owner's would go: nobody knows who owns it; no claim over it.
        if (e instanceof UnreadableRecordError) return 'unreadable' as const;
        this.s.storeFailed(e);
        return undefined;
      });
      // Recorded (or the store failed meanwhile: then claimed without it, as below, and recorded later).
      if (r !== 'superseded' && r !== 'unreadable') return this.takeOver(st, d.pod, d.cause, r !== undefined);
      await gw.datapath.release(st.address, st.egress.announce);
      if (r === 'unreadable') return;
      return this.adopt(st, await this.s.o.ownership.get(st.egress.key, st.address), 'store');
    }
    if (d.action === 'claim') await this.takeOver(st, d.pod, d.cause);
    else if (d.action === 'standDown') await this.standDown(st, `epoch ${st.own.epoch} names ${st.own.owner}`);
    else if (d.action === 'wait' && !st.waiting) {
      st.waiting = true;
      this.s.o.logger.warn('egress: owner looks down from here, but this node is not in sync with it: holding off for in-sync candidates', {
        egress: st.egress.key, address: st.address, owner: st.own.owner, epoch: st.own.epoch, pod: d.pod, inSync: [...st.inSync], untilMs: d.untilMs - now,
      });
    } else if (d.action === 'keep' && st.own.owner && local.has(st.own.owner) && !st.holder) {
      await this.become(st, this.s.gateways.get(st.own.owner)!, 'restart: resuming ownership');
    }
    this.streams.ensureSenders(st);
    this.steering.updateClients(st);
  }

  /** This node's gateway `pod` takes the address: next epoch, datapath first, then every node is told. */
  private async takeOver(st: AddressState, pod: string, cause: string, recorded = false): Promise<void> {
    const gw = this.s.gateways.get(pod);
    if (!gw) return;
    const t0 = Date.now();
    const from = st.own.owner;
    const fromNode = st.own.ownerNode;
    st.own = { egress: st.egress.key, address: st.address, owner: pod, epoch: st.own.epoch + 1, cause, ownerNode: this.s.o.node.name, ownerNodeAddress: this.s.o.node.address, ownerPodIp: gw.info.podIp };
    st.recorded = recorded;
    st.inSync = new Set();
    await this.become(st, gw, cause);
    st.lastTakeover = { at: new Date().toISOString(), cause, ms: Date.now() - t0, epoch: st.own.epoch, from, to: pod, decidedBy: this.s.o.node.name };
    countTakeover(st, takeoverCause(cause, false));
    this.s.o.logger.info('egress: ownership changed', { egress: st.egress.key, address: st.address, from, to: pod, epoch: st.own.epoch, cause, decidedBy: this.s.o.node.name, ms: Date.now() - t0 });
    this.s.ownershipChanged({ egress: st.egress.key, address: st.address, ...(from ? { from: { pod: from, node: fromNode } } : {}), to: { pod, node: this.s.o.node.name }, cause, epoch: st.own.epoch, decidedBy: this.s.o.node.name });
    this.steering.updateClients(st);
    if (!recorded) this.store.recordLater(st);
  }

  /**
   * A planned handover from local pod `fromPod` (deleted, or tetherd stopping): the best live candidate,
   * in-sync first, gets the next epoch; it learns from the notice, as every other node does. Returns it.
   */
  handOver(st: AddressState, fromPod: string, cause: string, o: HandoverOptions = {}): GatewayInfo | undefined {
    st.candidates = orderCandidates(st.address, this.peers.liveRegistry(st.egress.key));
    // The holder's own senders say who is in sync now; the set its heartbeat keeps can be a second old.
    const inSync = st.holder ? new Set(this.streams.computeInSync(st)) : st.inSync;
    const next = handoverTarget(st.candidates, fromPod, this.targetFilter(fromPod, o), inSync, this.loadOf(st.egress, st), o.inSyncOnly);
    // Only in sync, and none is: the holder keeps it.
    if (!next && o.inSyncOnly) return undefined;
    st.holder = undefined;
    st.handingOver = undefined;
    if (!next) return undefined;
    const from = st.own.owner;
    const fromNode = st.own.ownerNode;
    st.own = { egress: st.egress.key, address: st.address, owner: next.pod, epoch: st.own.epoch + 1, cause, ownerNode: next.node, ownerNodeAddress: next.nodeAddress, ownerPodIp: next.podIp };
    st.recorded = false;
    st.inSync = new Set();
    this.broadcast(st);
    st.lastTakeover = { at: new Date().toISOString(), cause, ms: 0, epoch: st.own.epoch, from, to: next.pod, decidedBy: this.s.o.node.name };
    countTakeover(st, takeoverCause(cause, true));
    this.s.o.logger.info('egress: ownership changed', { egress: st.egress.key, address: st.address, from, to: next.pod, epoch: st.own.epoch, cause, decidedBy: this.s.o.node.name });
    this.s.ownershipChanged({ egress: st.egress.key, address: st.address, ...(from ? { from: { pod: from, node: fromNode } } : {}), to: { pod: next.pod, node: next.node }, cause, epoch: st.own.epoch, decidedBy: this.s.o.node.name });
    const local = this.s.gateways.get(next.pod);
    if (local) this.s.spawn(() => this.s.mutex.run(streamOf(st), () => this.become(st, local, cause)));
    else if (isDraining(cause)) this.steerOnConfirmation(st);
    else this.steering.updateClients(st);
    this.store.recordLater(st);
    return next;
  }

  /** Which candidates a handover from `fromPod` may go to: live ones, not `fromPod`, on another node with `elsewhere`. */
  private targetFilter(fromPod: string, o: HandoverOptions): (g: GatewayInfo) => boolean {
    return (g) => g.pod !== fromPod && (!o.elsewhere || g.node !== this.s.o.node.name) && this.peers.alive(g);
  }

  /**
   * A planned handover from local pod `fromPod` (its pod leaving, or tetherd stopping) that keeps the
   * connections: at once to a live candidate in sync with this holder; with live candidates but none in
   * sync, the holder keeps serving the address (address, NAT, announcement, its sync streams, which follow
   * the candidates meanwhile) and looks again every HANDOVER_POLL_MS, so a standby that comes in sync
   * (one that just restarted resyncs) gets it; at `until`, to the best live candidate anyway. Without
   * conntrack sync there is nothing to wait for. Returns the new owner; undefined when no other candidate
   * is live (the address stays, as handOver) or another decision took the address meanwhile.
   */
  handOverWhenInSync(st: AddressState, fromPod: string, cause: string, o: HandoverOptions & { until: number; tick?: () => void }): Promise<GatewayInfo | undefined> {
    // One handover of an address at a time: a stop finds the one its pod's leaving began, and joins it.
    const under = this.handoffs.get(st);
    if (under) return under;
    const p = this.waitAndHandOver(st, fromPod, cause, o).finally(() => this.handoffs.delete(st));
    this.handoffs.set(st, p);
    return p;
  }

  private readonly handoffs = new Map<AddressState, Promise<GatewayInfo | undefined>>();

  private async waitAndHandOver(st: AddressState, fromPod: string, cause: string, o: HandoverOptions & { until: number; tick?: () => void }): Promise<GatewayInfo | undefined> {
    const gw = st.holder;
    if (!gw) return undefined;
    const since = Date.now();
    const waitFor = this.s.o.conntrackSync !== false;
    // Set at once: from now on the election pass must not stand this holder down (its pod may be gone from
    // the gateways already) nor resume it.
    st.handingOver = { pod: fromPod, since, until: o.until };
    let told = false;
    try {
      for (;;) {
        const r = await this.s.mutex.run(streamOf(st), (): { next?: GatewayInfo; done: boolean } => {
          if (st.holder !== gw) return { done: true };
          const now = Date.now();
          const last = !waitFor || now >= o.until;
          st.candidates = orderCandidates(st.address, this.peers.liveRegistry(st.egress.key));
          const anyLive = st.candidates.some(this.targetFilter(fromPod, o));
          let next = this.handOver(st, fromPod, cause, { ...o, inSyncOnly: anyLive });
          const fields = { egress: st.egress.key, address: st.address, pod: fromPod, waitedMs: now - since };
          if (!next && last && anyLive && st.holder === gw) {
            const standbys = this.streams.syncStates(st);
            next = this.handOver(st, fromPod, waitFor ? causeWithNote(cause, `no standby in sync within ${now - since} ms`) : cause, o);
            if (next && waitFor) this.s.o.logger.warn('egress: no standby came in sync: handed over anyway; the connections it lacks break', { ...fields, to: next.pod, node: next.node, standbys });
          } else if (next && told) {
            this.s.o.logger.info('egress: a standby came in sync: handed over', { ...fields, to: next.pod, node: next.node });
          }
          if (next || !anyLive || st.holder !== gw) return { next, done: true };
          if (!told) {
            told = true;
            this.s.o.logger.warn('egress: must hand over, but no standby is in sync: keeping the address until one is', {
              ...fields, cause, waitMs: o.until - now, standbys: this.streams.syncStates(st),
            });
          }
          this.streams.ensureSenders(st);
          return { done: false };
        });
        if (r.done) return r.next;
        o.tick?.();
        await new Promise((res) => setTimeout(res, Math.max(1, Math.min(HANDOVER_POLL_MS, o.until - Date.now()))));
      }
    } finally {
      if (st.handingOver?.pod === fromPod) st.handingOver = undefined;
    }
  }


  onNotice(n: OwnershipNotice, from: string, address?: string): Promise<void> {
    const st = this.s.addresses.get(`${n.egress}|${n.address}`);
    if (!st) return Promise.resolve();
    if (address !== undefined) {
      // A decision is followed only from a node this one knows (the store's node list, a registered or
      // announced gateway, an owner), and an owner's own notice only from the owner's own address.
      const why = !this.peers.knownNode(address) ? `sender ${from} at ${address} is not a known node`
        : n.ownerNode === from && n.ownerNodeAddress && n.ownerNodeAddress !== address ? `sender ${from} at ${address} names its own address as ${n.ownerNodeAddress}` : undefined;
      if (why) {
        this.peers.refuseSender(`${from}|${address}|notice`, 'egress: ownership notice refused; nothing in it applied', { from, address, egress: n.egress, floating: n.address, owner: n.owner, epoch: n.epoch, why });
        return Promise.resolve();
      }
    }
    return this.s.mutex.run(streamOf(st), () => this.adopt(st, n, `notice from ${from}`, from === n.ownerNode ? n.inSync : undefined));
  }

  onStoreNotice(c: Ownership): Promise<void> {
    const st = this.s.addresses.get(`${c.egress}|${c.address}`);
    if (!st) return Promise.resolve();
    return this.s.mutex.run(streamOf(st), () => this.adopt(st, c, 'store'));
  }

  /**
   * Follows a decision made elsewhere (a notice, the store) if it supersedes what this node knows: stands
   * down when it names another pod, takes the address when it names a local one, re-steers clients.
   */
  async adopt(st: AddressState, c: Ownership, via: string, inSync?: string[]): Promise<void> {
    const same = c.epoch === st.own.epoch && c.owner === st.own.owner;
    if (same) {
      if (inSync && st.steerTimer) this.steerNow(st); // the owner confirmed: clients go to it now
      if (inSync && !st.holder) {
        st.inSync = new Set(inSync);
        // The owner itself just spoke: whatever BFD says from here, an out-of-sync candidate's hold-down
        // starts over (its claim is for owners that are really gone).
        st.ownerDownSince = undefined;
      }
      if (via === 'store') st.recorded = true;
      st.own = { ...st.own, ownerNode: st.own.ownerNode ?? c.ownerNode, ownerNodeAddress: st.own.ownerNodeAddress ?? c.ownerNodeAddress, ownerPodIp: st.own.ownerPodIp ?? c.ownerPodIp };
      return;
    }
    if (!supersedes(c, st.own)) return;
    const prev = st.own;
    st.own = { egress: st.egress.key, address: st.address, owner: c.owner, epoch: c.epoch, cause: c.cause, ownerNode: c.ownerNode, ownerNodeAddress: c.ownerNodeAddress, ownerPodIp: c.ownerPodIp };
    st.recorded = via === 'store';
    st.inSync = new Set(inSync ?? []);
    st.ownerDownSince = undefined;
    this.s.o.logger.info('egress: ownership learned', { egress: st.egress.key, address: st.address, from: prev.owner, to: c.owner, epoch: c.epoch, previousEpoch: prev.epoch, cause: c.cause, via });
    if (st.holder && st.holder.info.pod !== c.owner) await this.standDown(st, `epoch ${c.epoch} names ${c.owner} (${via})`);
    const gw = this.s.gateways.get(c.owner);
    if (gw && !st.holder) {
      this.anticipateSiblings(st, prev.owner, gw, c);
      await this.become(st, gw, c.cause ?? via);
      // become() confirms to every node (and to the decider) that the named gateway holds it now.
      st.lastTakeover = { at: new Date().toISOString(), cause: c.cause ?? '', ms: 0, epoch: c.epoch, from: prev.owner, to: c.owner, decidedBy: via };
    }
    // Told by another node (the old owner's node, or the store) of a planned handover to a pod elsewhere:
    // the new owner needs a few ms to take the address (until then its node's guard drops what its pod
    // sends from it), while the old one still forwards through its drain. So clients move on the owner's
    // own confirmation (become() broadcasts it), or after CONFIRM_WAIT_MS if that notice is lost. Seen on the testbed: clients switched 1 ms before the owner could send, and a
    // handful of segments waited out TCP's 200 ms retransmission timeout.
    if (!inSync && !gw && c.owner && c.ownerNode !== this.s.o.node.name && isDraining(c.cause)) this.steerOnConfirmation(st);
    else this.steerNow(st);
  }

  /**
   * A failover (not a planned handover) from a pod that held other addresses too: the local pod taking this
   * one may be handed those next, and their notices reach the clients' nodes as soon as this node. So its
   * guard lets it use each of them as a source now, for ANTICIPATE_MS, if it is one of that address's
   * gateways: until this node has read and taken that address, what the pod forwards from it is not dropped.
   */
  private anticipateSiblings(st: AddressState, fromPod: string, gw: LocalGateway, c: Ownership): void {
    if (!fromPod || isDraining(c.cause)) return;
    for (const other of this.s.addresses.values()) {
      if (other === st || other.own.owner !== fromPod || other.holder) continue;
      if (!other.candidates.some((g) => g.pod === gw.info.pod)) continue;
      try {
        if (gw.datapath.anticipate(other.address, ANTICIPATE_MS)) {
          this.s.o.logger.info('egress: guard lets the pod use an address its failed owner also held, until it is handed over', { egress: other.egress.key, address: other.address, pod: gw.info.pod, from: fromPod, ms: ANTICIPATE_MS });
        }
      } catch (e) {
        this.s.o.logger.debug('egress: address not anticipated', { address: other.address, pod: gw.info.pod, error: (e as Error).message });
      }
    }
  }

  /** Clients move to the new owner on its confirmation (adopt), or after CONFIRM_WAIT_MS. */
  private steerOnConfirmation(st: AddressState): void {
    clearTimeout(st.steerTimer);
    st.steerTimer = setTimeout(() => this.s.spawn(() => this.s.mutex.run(streamOf(st), async () => this.steerNow(st))), CONFIRM_WAIT_MS);
    st.steerTimer.unref();
  }

  private steerNow(st: AddressState): void {
    clearTimeout(st.steerTimer);
    st.steerTimer = undefined;
    this.steering.updateClients(st);
  }

  /**
   * Holds the address on a local gateway: datapath first, then every node is told (clients re-steer on
   * that notice), then the conntrack stream to the standbys starts (its event reader takes a few ms).
   */
  private async become(st: AddressState, gw: LocalGateway, cause: string): Promise<void> {
    // The holder is set first: a pod going down while SNAT is written (own() waits for nft) hands this
    // address over too, after this (its handover runs on this address's stream).
    st.holder = gw;
    try {
      await gw.datapath.own(st.address, st.egress.announce);
    } catch (e) {
      if (st.holder === gw) st.holder = undefined;
      throw e;
    }
    this.broadcast(st);
    this.steering.updateClients(st);
    this.s.o.logger.info('egress: this node owns the floating address', { egress: st.egress.key, address: st.address, pod: gw.info.pod, epoch: st.own.epoch, cause });
    await this.streams.startStreaming(st);
  }

  private async standDown(st: AddressState, why: string): Promise<void> {
    const gw = st.holder;
    st.holder = undefined;
    await gw?.datapath.release(st.address, st.egress.announce);
    void this.streams.stopStreaming(st);
    this.s.o.logger.info('egress: stood down', { egress: st.egress.key, address: st.address, pod: gw?.info.pod, why });
  }

  /** The current ownership as a notice; the holder adds the nodes in sync with it. */
  private noticeOf(st: AddressState): OwnershipNotice {
    return {
      egress: st.egress.key, address: st.address, owner: st.own.owner, epoch: st.own.epoch, ownerNode: st.own.ownerNode ?? '',
      ownerNodeAddress: st.own.ownerNodeAddress ?? '', ownerPodIp: st.own.ownerPodIp ?? '', cause: (st.own.cause ?? '').slice(0, 400),
      inSync: st.holder ? this.streams.computeInSync(st) : [],
    };
  }

  /** Sends the current ownership to every known node now and once more shortly after. */
  private broadcast(st: AddressState): void {
    const n = this.noticeOf(st);
    const send = () => {
      try {
        this.s.notices?.send(this.peers.peerAddresses(), [n]);
      } catch (e) {
        this.s.o.logger.error('egress: ownership notice not sent', { egress: st.egress.key, address: st.address, error: (e as Error).message });
      }
    };
    send();
    setTimeout(() => !this.s.stopped && send(), NOTICE_REPEAT_MS).unref();
  }

  /**
   * Every second: the owner repeats its ownership to the Egress's candidates and its clients' nodes (those
   * that missed a notice or just started catch up); a node with gateway pods announces them to the other
   * candidates of their Egresses and to the owners, so candidates know each other (BFD sessions, conntrack
   * streams) even when the store is down; a node with client pods tells the same nodes it has clients, so
   * owners (a candidate that takes over included) repeat their ownership to it. A node with no part in an
   * Egress is sent nothing periodically: it hears a change of owner when it happens (sent to every node).
   */
  heartbeat(): void {
    if (this.s.stopped || !this.s.notices) return;
    try {
      this.repeatOwnership();
      // This node's gateway pods (to the other candidates and the owners) and the Egresses it has clients
      // of (to their candidates and owners, so owners repeat their ownership to this node).
      const involved = this.s.involvedSet();
      const clientOf = this.s.clientEgresses();
      for (const e of this.s.egresses.values()) {
        if (!involved.has(e.key)) continue;
        const mine = [...this.s.gateways.values()].filter((g) => g.egresses.has(e.key)).map((g) => ({ ...g.info, egress: e.key }));
        const client = clientOf.has(e.key);
        if (!mine.length && !client) continue;
        this.s.notices.send(this.peers.gatewayPeers(e.key), [], mine, { clients: client ? [e.key] : [] });
      }
    } catch (e) {
      this.s.o.logger.error('egress: heartbeat notice not sent', { error: (e as Error).message });
    }
  }

  /**
   * The owner's part of the heartbeat, per Egress: its ownership, with the nodes in sync, to the Egress's
   * candidates and its clients' nodes. Also while tetherd stops and still holds addresses (handOverWhenInSync).
   */
  repeatOwnership(): void {
    if (!this.s.notices) return;
    const held = [...this.s.addresses.values()].filter((st) => st.holder);
    for (const st of held) st.inSync = new Set(this.streams.computeInSync(st));
    const byEgress = new Map<string, AddressState[]>();
    for (const st of held) byEgress.set(st.egress.key, [...(byEgress.get(st.egress.key) ?? []), st]);
    for (const [egress, list] of byEgress) this.s.notices.send(this.peers.heartbeatPeers(egress), list.map((st) => this.noticeOf(st)));
  }
}

export interface HandoverOptions {
  /** Only to a candidate in sync with the holder (none: the holder keeps the address). */
  inSyncOnly?: boolean;
  /** Only to a candidate on another node (tetherd stopping: no local pod can be held). */
  elsewhere?: boolean;
}
