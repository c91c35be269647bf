// The Egress controller of one node. It follows the pods this tetherd attached and the Egress objects,
// and plays every role the node has:
// - gateway candidate: prepares local gateway pods, registers them cluster-wide, watches peer nodes with
//   BFD, and takes a floating address over when its owner is gone (candidates.ts decides; every tetherd
//   computes the same answer from BFD liveness and the common candidate order, fenced by epochs);
// - owner: holds the address on its gateway pod (SNAT, route, announcement), streams the gateway's
//   conntrack events to the other candidates and repeats its ownership to every node each second,
//   naming the standbys that are in sync;
// - standby: inserts the streamed entries into its gateway pods' tables, so takeover finds them there;
// - client node: steers its client pods' traffic in eBPF to the current owner's gateway pod.
// No decision waits for the cluster store. The deciding tetherd sends its decision to every node at once
// (ownership notices, authenticated UDP), so clients learn a new owner in one hop with or without the
// store; the store (Redis) records decisions in the background, publishes them, and settles decisions
// made on both sides of a partition once it is reachable again (the superseding one wins everywhere).
import * as fs from 'node:fs';
import { ErrorCode, TetherError } from '../../lib/errors';
import { type PodRecord } from '../state/pod-store';
import { openEgressMaps } from '../bpf/egress-steer';
import { BfdThread } from '../bfd/threaded';
import { SyncReceiver } from '../conntrack-sync';
import { addressSlots, slotOwner, type ResolvedEgress } from './egress-spec';
import type { PodMeta } from '../config/objects';
import { NoticeChannel, type GatewayAnnouncement, type OwnershipNotice } from './ownership-notice';
import { type Ownership } from './ownership-store';
import { EgressShared, streamOf, draining, type AddressState, type EgressControllerOptions, DRAIN_MS, HANDOVER_WAIT_MS, STORE_EVERY_MS, HEARTBEAT_MS, CONSISTENCY_EVERY_MS } from './egress-state';
import { PeerLiveness } from './peer-liveness';
import { ClientSteering } from './client-steering';
import { PodRoles } from './pod-roles';
import { Election } from './election';
import { ConntrackStreams } from './conntrack-streams';
import { StoreRecords } from './store-records';
import { StandbySync } from './standby-sync';
import { ReconcileLoop } from '../util/reconcile-loop';
import { REGISTRY_TTL_MS } from '../common/node-registry';

/** After status() or egressSummary() is called, the store pass reads the addresses' cluster-wide use this long. */
const OBSERVED_MS = 30_000;

/** The controller's shared state and its parts: what the controller runs on, and what tests drive. */
export interface EgressParts {
  s: EgressShared;
  streams: ConntrackStreams;
  peers: PeerLiveness;
  steering: ClientSteering;
  standby: StandbySync;
  store: StoreRecords;
  election: Election;
  roles: PodRoles;
}

/**
 * The parts built in dependency order, each given what it uses. Three calls run against that order, each
 * a narrow callback that runs only once the controller does (never while building): peer liveness asks
 * the election for a tick, the store records have it follow a record, and each election pass first has
 * the pod roles drop gateways whose namespace vanished.
 */
export function egressParts(o: EgressControllerOptions): EgressParts {
  const s = new EgressShared(o);
  const peers = new PeerLiveness(s, () => election.requestTick());
  const streams = new ConntrackStreams(s, peers);
  const steering = new ClientSteering(s, peers);
  const standby = new StandbySync(s, peers);
  const store: StoreRecords = new StoreRecords(s, (st, rec, via) => election.adopt(st, rec, via));
  const election: Election = new Election(s, peers, streams, store, steering, () => roles.dropVanishedGateways());
  const roles = new PodRoles(s, election, streams, store, steering);
  return { s, streams, peers, steering, standby, store, election, roles };
}

export class EgressController {
  private readonly s: EgressShared;
  private readonly streams: ConntrackStreams;
  private readonly peers: PeerLiveness;
  private readonly steering: ClientSteering;
  private readonly standby: StandbySync;
  private readonly store: StoreRecords;
  private readonly election: Election;
  private readonly roles: PodRoles;

  /** The store passes (never overlapping; a full one asked for while one runs follows it). */
  private readonly storeLoop: ReconcileLoop;
  private fullStorePass = false;
  /** Every periodic loop but the election's ticks (this.election.loop). */
  private readonly loops: ReconcileLoop[];

  constructor(o: EgressControllerOptions) {
    ({ s: this.s, streams: this.streams, peers: this.peers, steering: this.steering, standby: this.standby, store: this.store, election: this.election, roles: this.roles } = egressParts(o));
    const failed = (e: Error) => this.s.o.logger.error('egress: work failed', { error: e.message, stack: e.stack });
    const every = (everyMs: number, run: () => unknown) => new ReconcileLoop({ run, everyMs, skipBusyTicks: true, onError: failed });
    this.storeLoop = every(STORE_EVERY_MS, () => {
      const full = this.fullStorePass;
      this.fullStorePass = false;
      return this.store.storePass({ full });
    });
    this.loops = [
      this.storeLoop,
      every(STORE_EVERY_MS, () => this.roles.retryFailedRoles()),
      every(HEARTBEAT_MS, () => this.election.heartbeat()),
      every(HEARTBEAT_MS, () => this.standby.update()),
      every(CONSISTENCY_EVERY_MS, () => this.streams.checkConsistency()),
    ];
  }

  /** A store pass now or right after the one under way; a full one reads every Egress. */
  private storePass(full: boolean): Promise<void> {
    if (full) this.fullStorePass = true;
    return this.storeLoop.kick();
  }

  /** Starts every part, with or without Egresses: they may come later from the config source. */
  async start(): Promise<void> {
    this.s.endpoint = await BfdThread.open({ address: this.s.o.node.address });
    this.s.receiver = new SyncReceiver({
      key: this.s.o.clusterKey,
      id: this.s.o.node.name,
      host: this.s.o.node.address,
      port: this.s.o.syncPort,
      // Received entries are written from their wire bytes, not decoded (table-wire.ts).
      applyWire: (events, from) => this.s.work.run(() => this.streams.applySynced(events, from)),
      upsertWire: (entries, from) => this.s.work.run(() => this.streams.upsertSynced(entries, from)),
      sweep: (keep, buckets, from) => this.s.work.run(() => this.streams.sweepSynced(keep, buckets, from)),
      digests: (k, from) => this.s.work.run(() => this.streams.syncedDigests(k, from)),
    });
    await this.s.receiver.listen();
    this.s.notices = await NoticeChannel.open({ clusterKey: this.s.o.clusterKey, node: this.s.o.node.name, address: this.s.o.node.address, port: this.s.o.syncPort });
    this.s.notices.on('heard', (_from: string, address: string) => this.peers.heard.set(address, Date.now()));
    this.s.notices.on('gateways', (list: GatewayAnnouncement[], from: string, address: string) => this.peers.onAnnounced(list, from, address));
    this.s.notices.on('clients', (egresses: string[], _from: string, address: string) => this.peers.onClients(egresses, address));
    this.s.notices.on('notice', (n: OwnershipNotice, from: string, address: string) => this.s.spawn(() => this.election.onNotice(n, from, address)));
    this.s.maps = openEgressMaps(this.s.o.pinDir, { create: true, maxFlows: this.s.o.maxFlows });
    for (const e of this.s.egresses.values()) {
      const id = this.s.egressIds.get(e.key)!;
      this.s.maps.setDestinations(id, e.destinations, e.excluded);
      this.trackExplicit(e);
    }
    this.s.o.ownership.on('change', (c: Ownership) => this.s.spawn(() => this.election.onStoreNotice(c)));
    this.s.o.ownership.on('resync', () => void this.storePass(true));
    this.s.o.attach.on('attached', (r: PodRecord) => this.s.spawn(() => this.roles.podUp(r)));
    this.s.o.attach.onBeforeDetach((r: PodRecord) => (this.s.stopped ? Promise.resolve() : this.roles.podDown(r, 'gateway pod deleted', DRAIN_MS)));
    this.s.o.attach.on('detached', (r: PodRecord) => this.s.spawn(() => this.roles.podDown(r, 'gateway pod deleted')));
    // The store is asked once before anything else, so a start with the store up begins with its record.
    await this.storePass(true);
    // Pods recorded before a restart whose namespace is gone (killed without a DEL) play no role.
    for (const r of this.s.o.attach.pods()) if (fs.existsSync(r.netns)) await this.roles.podUp(r);
    this.roles.watchNetns();
    this.election.loop.start();
    for (const l of this.loops) l.start();
    await this.election.tick();
  }

  /**
   * Level-triggered configuration: makes this node serve exactly `egresses`, with `podLabels` (from the
   * config source) overriding pod records' labels. New Egresses start, removed ones are torn down (their
   * addresses leave their gateways, clients stop being steered, the allocation is returned), changed ones
   * are updated in place: destinations in the maps and the gateways' rules, failover timers through a BFD
   * Poll Sequence, selectors by re-evaluating every pod's roles. A change of addresses or announcement
   * mode replaces the Egress. Serialised with itself; never waits for the store.
   */
  async apply(egresses: ResolvedEgress[], podLabels?: Record<string, PodMeta>): Promise<void> {
    if (this.s.stopped) return;
    await this.s.work.run(() => this.s.mutex.run('config', () => this.reconcileConfig(egresses, podLabels)));
  }

  private async reconcileConfig(next: ResolvedEgress[], podLabels?: Record<string, PodMeta>): Promise<void> {
    const want = new Map(next.map((e) => [e.key, e]));
    for (const [key, cur] of [...this.s.egresses]) {
      const e = want.get(key);
      if (!e) await this.removeEgress(cur, 'Egress deleted');
      else if (JSON.stringify(cur.announce) !== JSON.stringify(e.announce)) {
        await this.removeEgress(cur, 'Egress announcement changed: replaced');
      }
    }
    for (const e of next) {
      const cur = this.s.egresses.get(e.key);
      if (!cur) {
        this.addEgress(e);
        continue;
      }
      if (JSON.stringify(cur) === JSON.stringify(e)) continue;
      const changed = (Object.keys(e) as Array<keyof ResolvedEgress>).filter((k) => JSON.stringify(cur[k]) !== JSON.stringify(e[k]));
      this.s.egresses.set(e.key, e);
      for (const st of this.s.addresses.values()) if (st.egress.key === e.key) st.egress = e;
      if (changed.includes('destinations') || changed.includes('excluded')) this.s.maps?.setDestinations(this.s.egressIds.get(e.key)!, e.destinations, e.excluded);
      if (changed.includes('addresses')) {
        // Addresses come and go one by one while traffic flows: a removed one takes only its own flows.
        const want = new Set(addressSlots(e).map((x) => slotOwner(e.key, x)));
        for (const st of [...this.s.addresses.values()]) if (st.egress.key === e.key && !want.has(st.slotOwner)) await this.removeAddress(st, 'address removed from the Egress');
        this.trackExplicit(e);
        this.s.shortfall.delete(e.key);
      }
      this.s.o.logger.info('egress: Egress updated', { egress: e.key, changed });
      if (changed.includes('zonePolicy') || changed.includes('addresses')) for (const st of this.s.addresses.values()) if (st.egress.key === e.key) this.steering.updateClients(st);
    }
    if (podLabels) this.s.podMeta = new Map(Object.entries(podLabels));
    this.peers.applyBfdTimers();
    // Selectors, labels or destinations may have changed: every pod's roles are evaluated again.
    for (const r of this.s.o.attach.pods()) if (fs.existsSync(r.netns)) await this.roles.podUp(r);
    if (!this.s.stopped) void this.storePass(true);
  }

  private addEgress(e: ResolvedEgress): void {
    const used = new Set(this.s.egressIds.values());
    let id = 1;
    while (used.has(id)) id++;
    this.s.egresses.set(e.key, e);
    this.s.egressIds.set(e.key, id);
    this.s.maps?.setDestinations(id, e.destinations, e.excluded);
    this.trackExplicit(e);
    this.s.o.logger.info('egress: Egress added', { egress: e.key, id, destinations: e.destinations, addresses: e.addresses });
  }

  /** Tears down exactly what the Egress set up on this node, and returns its addresses to the pool. */
  private async removeEgress(e: ResolvedEgress, cause: string): Promise<void> {
    const released: string[] = [];
    for (const st of [...this.s.addresses.values()].filter((x) => x.egress.key === e.key)) {
      await this.s.mutex.run(streamOf(st), async () => {
        if (st.holder) {
          await st.holder.datapath.release(st.address, e.announce);
          st.holder = undefined;
          released.push(st.address);
        }
        await this.streams.stopStreaming(st);
      });
      this.s.addresses.delete(streamOf(st));
    }
    const id = this.s.egressIds.get(e.key);
    if (id !== undefined) this.s.maps?.removeEgress(id);
    for (const gw of this.s.gateways.values()) gw.egresses.delete(e.key);
    for (const [pod, c] of [...this.s.clients]) {
      if (id === undefined || !c.egressIds.includes(id)) continue;
      c.egressIds = c.egressIds.filter((x) => x !== id);
      if (c.egressIds.length) {
        // Both addresses of a dual-stack client (an IPv6-only one has only ip6).
        if (c.ip) c.steer?.setClient(c.ip, c.egressIds);
        if (c.ip6) c.steer?.setClient(c.ip6, c.egressIds);
      } else this.roles.clientDown(pod, c);
    }
    this.s.egresses.delete(e.key);
    this.s.egressIds.delete(e.key);
    this.s.shortfall.delete(e.key);
    this.s.registry.delete(e.key);
    this.steering.steered.delete(e.key);
    // The store's part (registrations, the allocations) is undone in the background: it may be down.
    this.s.spawn(async () => {
      try {
        await this.s.o.ownership.registerGateways(e.key, this.s.o.node.name, [], REGISTRY_TTL_MS);
        this.s.o.ownership.forgetGateways(e.key);
        for (const slot of addressSlots(e)) await this.s.o.addresses.release(slot.pool, slotOwner(e.key, slot));
      } catch (err) {
        this.s.storeFailed(err);
      }
    });
    this.s.o.logger.info('egress: Egress removed', { egress: e.key, cause, releasedHere: released });
  }

  /** Explicit addresses are known without the store: they can be owned even if it is down now. */
  private trackExplicit(e: ResolvedEgress): void {
    for (const slot of addressSlots(e)) if ('explicit' in slot) this.s.track(e, slot.explicit, slot);
  }

  /**
   * One address leaves its Egress (spec.addresses shrank): its holder here releases it, its stream stops,
   * clients stop choosing it (flows pinned to it are pinned again elsewhere and fail cleanly), and its
   * allocation is returned in the background. The other addresses and their flows are untouched.
   */
  private async removeAddress(st: AddressState, cause: string): Promise<void> {
    await this.s.mutex.run(streamOf(st), async () => {
      if (st.holder) {
        await st.holder.datapath.release(st.address, st.egress.announce);
        st.holder = undefined;
      }
      await this.streams.stopStreaming(st);
    });
    this.s.addresses.delete(streamOf(st));
    this.steering.updateClients(st);
    this.s.maps?.forgetAddress(st.address);
    this.s.o.logger.info('egress: address removed', { egress: st.egress.key, address: st.address, cause });
    this.s.spawn(async () => {
      try {
        await this.s.o.addresses.release(st.slot.pool, st.slotOwner);
      } catch (err) {
        this.s.storeFailed(err);
      }
    });
  }

  /** How long stop() may take at most: the handover wait and the rest (for the caller's own bound). */
  get stopBudgetMs(): number {
    return (this.s.o.handoverWaitMs ?? HANDOVER_WAIT_MS) + 8000;
  }

  /**
   * Stops without leaving anything half done: no new work starts, work under way is awaited, addresses this
   * node holds are handed to an in-sync live candidate on another node (make-before-break, as for a
   * deleted gateway pod). With live candidates but none in sync, the address is kept and served (its sync
   * streams and ownership notices go on) until one is, or until handoverWaitMs after tetherd began to stop
   * (`stoppingSince`: the parts stopped before this one used part of the pod's grace period already); then
   * it goes to the best live candidate anyway: left in place, it would be taken over by failover once this
   * tetherd is gone, later (detection, hold-down) and by a candidate no better in sync, while this
   * node's announcement lingered. With no other live candidate it stays in the kernel for the next start
   * to resume. Then the sockets close.
   */
  async stop(stoppingSince = Date.now()): Promise<void> {
    if (this.s.stopped) return;
    this.s.stopped = true;
    const until = Math.min(stoppingSince, Date.now()) + (this.s.o.handoverWaitMs ?? HANDOVER_WAIT_MS);
    this.roles.watcher?.close();
    const [loopsDone, workDone] = await Promise.all([
      Promise.all([this.election.loop, ...this.loops].map((l) => l.stop(10_000))).then((d) => d.every(Boolean)),
      this.s.work.close(10_000),
    ]);
    if (!loopsDone || !workDone) this.s.o.logger.warn('egress: work still running at stop', { pending: this.s.work.size, passes: !loopsDone });
    const held = [...this.s.addresses.values()].filter((st) => st.holder);
    // While some wait for a standby, the owner's notices go on (the loops that sent them are stopped).
    let beat = Date.now();
    const tick = () => {
      if (Date.now() - beat < HEARTBEAT_MS) return;
      beat = Date.now();
      try {
        this.election.repeatOwnership();
      } catch (e) {
        this.s.o.logger.error('egress: heartbeat notice not sent', { error: (e as Error).message });
      }
    };
    await Promise.all(held.map(async (st) => {
      const gw = st.holder!;
      const next = await this.election.handOverWhenInSync(st, gw.info.pod, draining('tetherd stopping'), { until, elsewhere: true, tick });
      if (!next) {
        if (st.own.owner === gw.info.pod) this.s.o.logger.info('egress: stopping; the address stays on its gateway (no other live candidate)', { egress: st.egress.key, address: st.address, pod: gw.info.pod, epoch: st.own.epoch });
        return;
      }
      gw.datapath.withdrawAnnouncement(st.address);
    }));
    if (held.some((st) => !st.holder)) await new Promise((r) => setTimeout(r, DRAIN_MS));
    for (const st of held) {
      // Handed over: the address leaves the pod once the drain is over; the pod stays a prepared standby.
      if (!st.holder && st.own.owner && !this.s.gateways.has(st.own.owner)) {
        const gw = [...this.s.gateways.values()].find((g) => g.datapath.ownedAddresses().includes(st.address));
        await gw?.datapath.release(st.address, st.egress.announce);
      }
    }
    for (const st of this.s.addresses.values()) await this.streams.stopStreaming(st);
    await this.s.records.close(1500);
    await this.s.receiver?.close();
    await this.s.notices?.close();
    await this.s.endpoint?.close();
    this.s.maps?.close();
  }

  /** Authentication counters (forged, replayed or garbage BFD packets, sync frames and notices) and the source guard's counters. */
  security(): Record<string, unknown> {
    const n = this.s.notices?.stats();
    // Per gateway pod: what the node's guard on its veth let out or dropped, by reason.
    const guard = Object.fromEntries([...this.s.gateways.values()].map((g) => [g.info.pod, g.datapath.guardStats()]));
    // Per gateway pod: FoU its decap program took, and refused for an outer source that is not a registered node.
    const decap = Object.fromEntries([...this.s.gateways.values()].map((g) => {
      const d = g.datapath.decapStats();
      return [g.info.pod, d && { packets: Number(d.packets), rejectedSource: Number(d.rejectedSource), errors: Number(d.errors) }];
    }));
    return { bfdRejected: this.s.endpoint?.stats().rejected, syncRejected: this.s.receiver?.stats().rejected, noticesRejected: n?.rejected, notices: n && { rx: n.rx, tx: n.tx, accepted: n.accepted }, guard, decap };
  }

  /**
   * BFD as its thread last reported it: each session's state and Up/Down counts, the thread's worst loop
   * delay; and the peers given no session for a node address of the other underlay family (skippedPeers).
   */
  bfdStatus(): Record<string, unknown> | undefined {
    const st = this.s.endpoint?.stats();
    const skipped = this.peers.skippedPeers();
    return st && {
      threadLagMaxMs: st.loopLagMaxMs, threadLagMaxPerSecondMs: st.loopLagPerSecondMs, sessions: st.sessions.map((x) => ({ peer: x.peer, state: x.state, ups: x.ups, downs: x.downs, rx: x.rx, tx: x.tx })),
      // Peers with no session (nor sync stream, nor notice) for a node address of the other underlay family.
      ...(skipped.length ? { skippedPeers: skipped } : {}),
    };
  }

  /** Standby sync problems reported (see StandbySync), one line each: /readyz is not ready while there are any. */
  standbyProblems(): string[] {
    return this.s.stopped ? [] : this.standby.readinessProblems();
  }

  /** Whether the cluster store answered this controller's last calls (a failed call marks it down until a store pass succeeds). */
  storeReachable(): boolean {
    return !this.s.storeDown;
  }

  /** Status per floating address: owner, epoch, candidates with their liveness, sync counters, last takeover. */
  /** Each tracked address's owner node as this node knows it (a cheap view: no counters, no candidates). */
  owners(): Array<{ egress: string; address: string; ownerNode: string }> {
    return [...this.s.addresses.values()].map((st) => ({ egress: st.egress.key, address: st.address, ownerNode: st.own.ownerNode ?? '' }));
  }

  /**
   * `observe: false` (metrics scrapes): this node's view only; the store passes are not asked to read the
   * cluster-wide use (clusterFlows, clusterBytes) on its account.
   */
  status(o: { observe?: boolean } = {}): Array<Record<string, unknown>> {
    if (o.observe !== false) this.s.observedUntil = Date.now() + OBSERVED_MS;
    if (!this.s.stopped) this.standby.update();
    let counters = new Map<string, { flows: bigint; packets: bigint; bytes: bigint }>();
    try {
      counters = this.s.maps?.addressStats() ?? counters;
    } catch {
      // counters are diagnostics: status answers without them
    }
    return [...this.s.addresses.values()].map((st) => ({
      egress: st.egress.key,
      address: st.address,
      pool: st.slot.pool,
      owner: st.own.owner,
      ownerNode: st.own.ownerNode,
      ownerZone: this.peers.liveRegistry(st.egress.key).find((x) => x.pod === st.own.owner)?.zone,
      epoch: st.own.epoch,
      // This node's clients' use of the address (flows pinned, packets and bytes steered to it), and every
      // node's as reported to the store.
      flows: Number(counters.get(st.address)?.flows ?? 0n),
      packets: Number(counters.get(st.address)?.packets ?? 0n),
      bytes: Number(counters.get(st.address)?.bytes ?? 0n),
      clusterFlows: this.s.usage.get(st.egress.key)?.[st.address]?.flows,
      clusterBytes: this.s.usage.get(st.egress.key)?.[st.address]?.bytes,
      ownedHere: !!st.holder,
      recorded: st.recorded,
      storeReachable: !this.s.storeDown,
      inSync: [...st.inSync],
      candidates: st.candidates.map((c) => ({ pod: c.pod, node: c.node, live: this.peers.alive(c), bfd: this.peers.bfdState(c), inSync: st.inSync.has(c.node) })),
      sync: st.holder
        ? [...st.senders.entries()].map(([peer, s]) => {
            const x = s.stats();
            return {
              peer, state: x.state, entriesSent: x.entriesSent, lagEntries: x.lagEntries, lagMs: x.lagMs, resyncs: x.resyncs, version: x.version,
              ...(x.lastRejected && x.state !== 'streaming' ? { rejected: x.lastRejected.reason, rejectedWhy: x.lastRejected.message } : {}),
            };
          })
        : this.s.receiver?.stats().peers.filter((p) => p.stream === streamOf(st)).map((p) => ({ from: p.id, entriesApplied: p.entriesApplied, resyncs: p.resyncs, version: p.version })),
      // This node as a standby of the address: in sync with its owner, or why not.
      standbySync: this.standby.statusOf(st),
      lastTakeover: st.lastTakeover,
      takeovers: { ...st.takeovers },
    }));
  }

  /**
   * Per Egress, what its status conditions need: how many addresses it asks for, has and has owned; why
   * it has fewer (allocation failures); whether a per-node cap keeps an address without an owner although
   * live candidates exist; and a zone policy this node cannot apply (no zone of its own).
   */
  egressSummary(): Record<string, { asked: number; allocated: number; owned: number; ownerNodes: number; shortfall?: string; capLimited: boolean; zoneProblem?: string }> {
    this.s.observedUntil = Date.now() + OBSERVED_MS;
    const out: ReturnType<EgressController['egressSummary']> = {};
    for (const e of this.s.egresses.values()) {
      const mine = [...this.s.addresses.values()].filter((x) => x.egress.key === e.key);
      const owned = mine.filter((x) => x.own.owner);
      const live = this.peers.liveRegistry(e.key).filter((g) => this.peers.alive(g));
      const placement = this.election.placementOf(e);
      const capLimited = live.length > 0 && mine.some((x) => !x.own.owner && placement.has(x.address) && placement.get(x.address) === undefined)
        || (e.maxAddressesPerNode !== undefined && new Set(owned.map((x) => x.own.ownerNode)).size < Math.min(owned.length, new Set(live.map((g) => g.node)).size));
      const zoneProblem = (e.zonePolicy === 'preferZone' || e.zonePolicy === 'requireZone') && !this.s.o.node.zone
        ? `node ${this.s.o.node.name} has no topology.kubernetes.io/zone label: ${e.zonePolicy === 'requireZone' ? 'its clients\' traffic is dropped' : 'no zone is preferred'}`
        : e.zonePolicy === 'requireZone' && owned.length > 0 && !owned.some((x) => this.peers.liveRegistry(e.key).find((g) => g.pod === x.own.owner)?.zone === this.s.o.node.zone)
          ? `no address is held in zone ${this.s.o.node.zone}: clients on ${this.s.o.node.name} are dropped (requireZone)`
          : undefined;
      out[e.key] = {
        asked: addressSlots(e).length, allocated: mine.length, owned: owned.length, ownerNodes: new Set(owned.map((x) => x.own.ownerNode)).size,
        ...(this.s.shortfall.has(e.key) ? { shortfall: this.s.shortfall.get(e.key) } : {}), capLimited, ...(zoneProblem ? { zoneProblem } : {}),
      };
    }
    return out;
  }
}

export function requireClusterKey(raw: string | undefined): Buffer {
  if (!raw) throw new TetherError(ErrorCode.InvalidConfig, '--cluster-key-file is required when Egress objects are configured');
  const key = Buffer.from(raw.trim(), /^[0-9a-f]+$/i.test(raw.trim()) ? 'hex' : 'base64');
  if (key.length < 32) throw new TetherError(ErrorCode.InvalidConfig, `cluster key: ${key.length} bytes; at least 32 are needed`);
  return key;
}
