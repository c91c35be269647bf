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
import { createHmac } from 'node:crypto';
import * as fs from 'node:fs';
import type { Logger } from '../log';
import { ErrorCode, TetherError } from '../errors';
import { podKeyOf as podKey, type PodRecord } from '../state/pod-store';
import type { AttachService } from '../pod/attach-service';
import { attachEgressSteer, openEgressMaps, type EgressMaps, type EgressSteer } from '../bpf/egress-steer';
import { BfdAuthType, BfdState, type BfdAuthConfig } from '../bfd';
import { BfdThread, type BfdPeer } from '../bfd/threaded';
import { ConntrackEvents, ConntrackHandle, type ApplyResult, type ConntrackEntry, type ConntrackEvent, type ConntrackEventType } from '../conntrack';
import { applySyncedEvents, encodeEventPayload, replaceSyncedEntries, SyncReceiver, SyncSender, type SyncPeerInfo } from '../conntrack-sync';
import { ipToBytes } from '../netlink/ip-bytes';
import { InFlight } from '../util/in-flight';
import { KeyedMutex } from '../util/keyed-mutex';
import type { ClusterAddresses } from '../../ipam/cluster-addresses';
import { decide, handoverTarget, orderCandidates, placeAddresses, scoreOf, supersedes } from './candidates';
import { addressSlots, slotOwner, type AddressSlot, type ResolvedEgress } from './egress-spec';
import { EGRESS_TIER_EXCLUDED, EGRESS_TIER_FALLBACK, EGRESS_TIER_PREFERRED } from '../bpf/egress-structs';
import type { PodMeta } from '../config/objects';
import { GatewayDatapath } from './gateway-datapath';
import { NoticeChannel, type GatewayAnnouncement, type OwnershipNotice } from './ownership-notice';
import { UnreadableRecordError, type GatewayInfo, type Ownership, type OwnershipStore } from './ownership-store';

export interface EgressControllerOptions {
  /** maxEgressAddresses: this node's cap on the addresses of one Egress (over the Egress's own). */
  node: { name: string; zone?: string; address: string; uplink: string; maxEgressAddresses?: number };
  pinDir: string;
  fouPort: number;
  /** TCP: conntrack sync; UDP on the same number: ownership notices. */
  syncPort: number;
  /** Shared cluster key (≥ 32 bytes): BFD keyed SHA1, conntrack sync and ownership notices derive from it. */
  clusterKey: Buffer;
  egresses: ResolvedEgress[];
  /** Pod metadata from the config source ("namespace/name"): labels override pod records' own. */
  podLabels?: Record<string, PodMeta>;
  ownership: OwnershipStore;
  addresses: ClusterAddresses;
  attach: AttachService;
  logger: Logger;
  /** For the negative control in tests: without sync, takeover loses the connections. */
  conntrackSync?: boolean;
  /** Size of the node's flow pin map (flows of client pods on this node). */
  maxFlows?: number;
}

interface LocalGateway {
  info: GatewayInfo;
  datapath: GatewayDatapath;
  egresses: Set<string>;
  /** The destinations its guard and rules were last prepared for (JSON), so an unchanged set is not rewritten. */
  guarded: string;
  netns: string;
}

interface ClientPod {
  ip: string;
  hostIfName: string;
  egressIds: number[];
  steer?: EgressSteer;
}

interface AddressState {
  egress: ResolvedEgress;
  address: string;
  /** The slot of spec.addresses it fills, and its allocation owner in the cluster store. */
  slot: AddressSlot;
  slotOwner: string;
  own: Ownership;
  candidates: GatewayInfo[];
  /** The local gateway holding it, when this node owns it. */
  holder?: LocalGateway;
  events?: ConntrackEvents;
  senders: Map<string, SyncSender>;
  /** Nodes the owner last reported in sync (from its heartbeat; computed here while this node owns). */
  inSync: Set<string>;
  /** When this node first saw the current owner dead (for the out-of-sync hold-down). */
  ownerDownSince?: number;
  /** This node is waiting out the hold-down (logged once per wait). */
  waiting?: boolean;
  /** The store holds `own` (this node decided or learned it there). */
  recorded: boolean;
  lastTakeover?: { at: string; cause: string; ms: number; epoch: number; from: string; to: string; decidedBy: string };
  /** Clients re-steer when the new owner confirms (or at this timer): see adopt(). */
  steerTimer?: NodeJS.Timeout;
}

const REGISTRY_TTL_MS = 5000;
/**
 * A peer whose BFD session has not come Up yet (just discovered, or this tetherd just started) counts as
 * alive for this long: otherwise every node would see every other as dead at start and claim.
 */
const BFD_STARTUP_GRACE_MS = 3000;
/**
 * A node whose authenticated notices (heartbeats, gateway announcements) arrived this recently is alive as
 * far as this node can tell, while no BFD session with it has come Up yet.
 */
const HEARD_MS = 3000;
/** A gateway announced by its node's notices (not the store) is a candidate this long after the last one. */
const ANNOUNCED_TTL_MS = 3000;
/**
 * A gateway pod deleted through CNI DEL keeps forwarding (its conntrack and SNAT intact) this long after
 * handing its addresses over, so packets clients sent before they learned the new owner still get
 * through instead of waiting for a TCP retransmission timeout.
 */
const DRAIN_MS = 300;
/** Clients told of a new owner by another node re-steer on the owner's confirmation, or after this. */
const CONFIRM_WAIT_MS = 150;
/**
 * The cause of a planned handover whose old gateway keeps forwarding through a drain: its clients can wait
 * for the new owner's confirmation. (When the old gateway is gone, they switch at once: every packet
 * still sent to it is lost.)
 */
const draining = (cause: string) => `${cause} (old gateway draining)`;
const isDraining = (cause: string | undefined) => !!cause?.endsWith(' (old gateway draining)');
const TICK_MS = 250;
/** The candidate set of an Egress must be unchanged this long before its addresses are first placed. */
const INITIAL_SETTLE_MS = 2000;
/** Store pass (registry, node list, records) and the owner's heartbeat notice. */
const STORE_EVERY_MS = 1000;
const HEARTBEAT_MS = 1000;
/** A decision is sent twice: UDP may lose one datagram, a retransmission timeout costs far more. */
const NOTICE_REPEAT_MS = 20;
const RESYNC_EVERY_MS = 30_000;
/** A sync peer with fewer entries than this waiting is "in sync" (its standby has the connections). */
const IN_SYNC_MAX_LAG = 1000;

export class EgressController {
  private readonly egresses = new Map<string, ResolvedEgress>();
  private readonly egressIds = new Map<string, number>();
  private readonly gateways = new Map<string, LocalGateway>();
  private readonly clients = new Map<string, ClientPod>();
  private readonly addresses = new Map<string, AddressState>();
  private readonly bfd = new Map<string, BfdPeer>();
  /** What the client steering map holds per Egress (for one log line per change). */
  private readonly steered = new Map<string, string>();
  private readonly bfdInfo = new Map<string, { createdAt: number; everUp: boolean }>();
  /** Last known registry and node list: kept while the store is unreachable. */
  private readonly registry = new Map<string, GatewayInfo[]>();
  /**
   * Gateways their own nodes announced in notices, by Egress then pod, with when the announcement lapses:
   * candidates are learned from each other, not only from the store (which may be down when one joins).
   */
  private readonly announced = new Map<string, Map<string, { info: GatewayInfo; until: number }>>();
  /** When an authentic notice last came from a node's address (a sign of life while BFD is not Up). */
  private readonly heard = new Map<string, number>();
  /** Senders refused for naming an address that is not theirs, or for being unknown (logged once each). */
  private readonly refusedSenders = new Set<string>();
  private nodes: string[] = [];
  /** Why an Egress has fewer addresses than it asks for (allocation failures), by Egress. */
  private readonly shortfall = new Map<string, string>();
  private readonly mutex = new KeyedMutex();
  /** Every piece of work started by a timer or an event; stop() waits for it. */
  private readonly work = new InFlight();
  /** Background writes of decisions to the store; awaited last, briefly, on stop. */
  private readonly records = new InFlight();
  private endpoint?: BfdThread;
  private receiver?: SyncReceiver;
  private notices?: NoticeChannel;
  private maps?: EgressMaps;
  private timers: NodeJS.Timeout[] = [];
  private watcher?: fs.FSWatcher;
  /** Pod metadata from the config source ("namespace/name"); labels override a pod record's own. */
  private podMeta = new Map<string, PodMeta>();
  /** BFD timers in force (the fastest of the Egresses this node serves). */
  private timers_: { intervalMs: number; detectMultiplier: number } | undefined;
  private stopped = false;
  private ticking = false;
  private tickAgain = false;
  private storeBusy = false;
  /** The cluster store's generation last seen (a new one: the store lost its data). */
  private generation?: string;
  private storeDown = false;
  /** Cluster-wide use of each Egress's addresses (every node's clients), from the store's last pass. */
  private readonly usage = new Map<string, Record<string, { flows: number; bytes: number }>>();
  /** The candidates of each Egress as last seen, and since when (initial placement waits for them to settle). */
  private readonly registrySeen = new Map<string, { sig: string; since: number }>();
  /** Placement of ownerless addresses per Egress, for the tick under way. */
  private readonly placements = new Map<string, Map<string, GatewayInfo | undefined>>();

  constructor(private readonly o: EgressControllerOptions) {
    o.egresses.forEach((e, i) => {
      this.egresses.set(e.key, e);
      this.egressIds.set(e.key, i + 1);
    });
    this.podMeta = new Map(Object.entries(o.podLabels ?? {}));
  }

  /** Starts every part, with or without Egresses: they may come later from the config source. */
  async start(): Promise<void> {
    this.endpoint = await BfdThread.open({ address: this.o.node.address });
    this.receiver = new SyncReceiver({
      key: this.o.clusterKey,
      id: this.o.node.name,
      host: this.o.node.address,
      port: this.o.syncPort,
      apply: (events, from) => this.work.run(() => this.applySynced(events, from)),
      replaceAll: (entries, from) => this.work.run(() => this.replaceSynced(entries, from)),
    });
    await this.receiver.listen();
    this.notices = await NoticeChannel.open({ clusterKey: this.o.clusterKey, node: this.o.node.name, address: this.o.node.address, port: this.o.syncPort });
    this.notices.on('heard', (_from: string, address: string) => this.heard.set(address, Date.now()));
    this.notices.on('gateways', (list: GatewayAnnouncement[], from: string, address: string) => this.onAnnounced(list, from, address));
    this.notices.on('notice', (n: OwnershipNotice, from: string, address: string) => this.spawn(() => this.onNotice(n, from, address)));
    this.maps = openEgressMaps(this.o.pinDir, { create: true, maxFlows: this.o.maxFlows });
    for (const e of this.egresses.values()) {
      const id = this.egressIds.get(e.key)!;
      this.maps.setDestinations(id, e.destinations, e.excluded);
      this.trackExplicit(e);
    }
    this.o.ownership.on('change', (c: Ownership) => this.spawn(() => this.onStoreNotice(c)));
    this.o.ownership.on('resync', () => this.spawn(() => this.storePass()));
    this.o.attach.on('attached', (r: PodRecord) => this.spawn(() => this.podUp(r)));
    this.o.attach.onBeforeDetach((r: PodRecord) => (this.stopped ? Promise.resolve() : this.podDown(r, 'gateway pod deleted', DRAIN_MS)));
    this.o.attach.on('detached', (r: PodRecord) => this.spawn(() => this.podDown(r, 'gateway pod deleted')));
    // The store is asked once before anything else, so a start with the store up begins with its record.
    await this.storePass();
    // Pods recorded before a restart whose namespace is gone (killed without a DEL) play no role.
    for (const r of this.o.attach.pods()) if (fs.existsSync(r.netns)) await this.podUp(r);
    this.watchNetns();
    this.timers = [
      setInterval(() => this.requestTick(), TICK_MS),
      setInterval(() => this.spawn(() => this.storePass()), STORE_EVERY_MS),
      setInterval(() => this.spawn(() => this.retryFailedRoles()), STORE_EVERY_MS),
      setInterval(() => this.heartbeat(), HEARTBEAT_MS),
      setInterval(() => this.periodicResync(), RESYNC_EVERY_MS),
    ];
    await this.tick();
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
    if (this.stopped) return;
    await this.work.run(() => this.mutex.run('config', () => this.reconcileConfig(egresses, podLabels)));
  }

  private async reconcileConfig(next: ResolvedEgress[], podLabels?: Record<string, PodMeta>): Promise<void> {
    const want = new Map(next.map((e) => [e.key, e]));
    for (const [key, cur] of [...this.egresses]) {
      const e = want.get(key);
      if (!e) await this.removeEgress(cur, 'Egress deleted');
      else if (JSON.stringify(cur.announce) !== JSON.stringify(e.announce)) {
        await this.removeEgress(cur, 'Egress announcement changed: replaced');
      }
    }
    for (const e of next) {
      const cur = this.egresses.get(e.key);
      if (!cur) {
        this.addEgress(e);
        continue;
      }
      if (JSON.stringify(cur) === JSON.stringify(e)) continue;
      const changed = (Object.keys(e) as Array<keyof ResolvedEgress>).filter((k) => JSON.stringify(cur[k]) !== JSON.stringify(e[k]));
      this.egresses.set(e.key, e);
      for (const st of this.addresses.values()) if (st.egress.key === e.key) st.egress = e;
      if (changed.includes('destinations') || changed.includes('excluded')) this.maps?.setDestinations(this.egressIds.get(e.key)!, e.destinations, e.excluded);
      if (changed.includes('addresses')) {
        // Addresses come and go one by one while traffic flows: a removed one takes only its own flows.
        const want = new Set(addressSlots(e).map((x) => slotOwner(e.key, x)));
        for (const st of [...this.addresses.values()]) if (st.egress.key === e.key && !want.has(st.slotOwner)) await this.removeAddress(st, 'address removed from the Egress');
        this.trackExplicit(e);
        this.shortfall.delete(e.key);
      }
      this.o.logger.info('egress: Egress updated', { egress: e.key, changed });
      if (changed.includes('zonePolicy') || changed.includes('addresses')) for (const st of this.addresses.values()) if (st.egress.key === e.key) this.updateClients(st);
    }
    if (podLabels) this.podMeta = new Map(Object.entries(podLabels));
    this.applyBfdTimers();
    // Selectors, labels or destinations may have changed: every pod's roles are evaluated again.
    for (const r of this.o.attach.pods()) if (fs.existsSync(r.netns)) await this.podUp(r);
    this.spawn(() => this.storePass());
  }

  private addEgress(e: ResolvedEgress): void {
    const used = new Set(this.egressIds.values());
    let id = 1;
    while (used.has(id)) id++;
    this.egresses.set(e.key, e);
    this.egressIds.set(e.key, id);
    this.maps?.setDestinations(id, e.destinations, e.excluded);
    this.trackExplicit(e);
    this.o.logger.info('egress: Egress added', { egress: e.key, id, destinations: e.destinations, addresses: e.addresses });
  }

  /** Tears down exactly what the Egress set up on this node, and returns its addresses to the pool. */
  private async removeEgress(e: ResolvedEgress, cause: string): Promise<void> {
    const released: string[] = [];
    for (const st of [...this.addresses.values()].filter((x) => x.egress.key === e.key)) {
      await this.mutex.run(streamOf(st), async () => {
        if (st.holder) {
          st.holder.datapath.release(st.address, e.announce);
          st.holder = undefined;
          released.push(st.address);
        }
        await this.stopStreaming(st);
      });
      this.addresses.delete(streamOf(st));
    }
    const id = this.egressIds.get(e.key);
    if (id !== undefined) this.maps?.removeEgress(id);
    for (const gw of this.gateways.values()) gw.egresses.delete(e.key);
    for (const [pod, c] of [...this.clients]) {
      if (id === undefined || !c.egressIds.includes(id)) continue;
      c.egressIds = c.egressIds.filter((x) => x !== id);
      if (c.egressIds.length) c.steer?.setClient(c.ip, c.egressIds);
      else this.clientDown(pod, c);
    }
    this.egresses.delete(e.key);
    this.egressIds.delete(e.key);
    this.shortfall.delete(e.key);
    this.registry.delete(e.key);
    this.steered.delete(e.key);
    // The store's part (registrations, the allocations) is undone in the background: it may be down.
    this.spawn(async () => {
      try {
        await this.o.ownership.registerGateways(e.key, this.o.node.name, [], REGISTRY_TTL_MS);
        for (const slot of addressSlots(e)) await this.o.addresses.release(slot.pool, slotOwner(e.key, slot));
      } catch (err) {
        this.storeFailed(err);
      }
    });
    this.o.logger.info('egress: Egress removed', { egress: e.key, cause, releasedHere: released });
  }

  /** Explicit addresses are known without the store: they can be owned even if it is down now. */
  private trackExplicit(e: ResolvedEgress): void {
    for (const slot of addressSlots(e)) if ('explicit' in slot) this.track(e, slot.explicit, slot);
  }

  /**
   * One address leaves its Egress (spec.addresses shrank): its holder here releases it, its stream stops,
   * clients stop choosing it (flows pinned to it are pinned again elsewhere and fail cleanly), and its
   * allocation is returned in the background. The other addresses and their flows are untouched.
   */
  private async removeAddress(st: AddressState, cause: string): Promise<void> {
    await this.mutex.run(streamOf(st), async () => {
      if (st.holder) {
        st.holder.datapath.release(st.address, st.egress.announce);
        st.holder = undefined;
      }
      await this.stopStreaming(st);
    });
    this.addresses.delete(streamOf(st));
    this.updateClients(st);
    this.maps?.forgetAddress(st.address);
    this.o.logger.info('egress: address removed', { egress: st.egress.key, address: st.address, cause });
    this.spawn(async () => {
      try {
        await this.o.addresses.release(st.slot.pool, st.slotOwner);
      } catch (err) {
        this.storeFailed(err);
      }
    });
  }

  /** BFD runs at the fastest failover timers of the Egresses this node serves; a change is a Poll Sequence, not a restart. */
  private applyBfdTimers(): void {
    const t = this.bfdTimers();
    if (!t || (this.timers_ && this.timers_.intervalMs === t.intervalMs && this.timers_.detectMultiplier === t.detectMultiplier)) return;
    const first = !this.timers_;
    this.timers_ = t;
    if (first) return;
    for (const s of this.bfd.values()) s.setTimers({ desiredMinTxUs: t.intervalMs * 1000, requiredMinRxUs: t.intervalMs * 1000, detectMult: t.detectMultiplier });
    this.o.logger.info('egress: BFD timers changed', { intervalMs: t.intervalMs, detectMultiplier: t.detectMultiplier, sessions: this.bfd.size });
  }

  private bfdTimers(): { intervalMs: number; detectMultiplier: number } | undefined {
    const all = [...this.egresses.values()].map((e) => e.failover);
    if (!all.length) return this.timers_;
    const intervalMs = Math.min(...all.map((f) => f.intervalMs));
    const detectMultiplier = Math.min(...all.filter((f) => f.intervalMs === intervalMs).map((f) => f.detectMultiplier));
    return { intervalMs, detectMultiplier };
  }

  /**
   * Stops without leaving anything half done: no new work starts, work under way is awaited, addresses this
   * node holds are handed to an in-sync live candidate (make-before-break, as for a deleted gateway pod) or,
   * with no candidate, kept in the kernel for the next start to resume; then the sockets close.
   */
  async stop(): Promise<void> {
    if (this.stopped) return;
    this.stopped = true;
    for (const t of this.timers) clearInterval(t);
    this.watcher?.close();
    if (!(await this.work.close(10_000))) this.o.logger.warn('egress: work still running at stop', { pending: this.work.size });
    const held = [...this.addresses.values()].filter((st) => st.holder);
    for (const st of held) {
      await this.mutex.run(streamOf(st), async () => {
        const gw = st.holder!;
        const next = this.handOver(st, gw.info.pod, draining('tetherd stopping'));
        if (!next) {
          this.o.logger.info('egress: stopping; the address stays on its gateway (no other live candidate)', { egress: st.egress.key, address: st.address, pod: gw.info.pod, epoch: st.own.epoch });
          return;
        }
        gw.datapath.withdrawAnnouncement(st.address);
      });
    }
    if (held.some((st) => !st.holder)) await new Promise((r) => setTimeout(r, DRAIN_MS));
    for (const st of held) {
      // Handed over: the address leaves the pod once the drain is over; the pod stays a prepared standby.
      if (!st.holder && st.own.owner && !this.gateways.has(st.own.owner)) {
        const gw = [...this.gateways.values()].find((g) => g.datapath.ownedAddresses().includes(st.address));
        gw?.datapath.release(st.address, st.egress.announce);
      }
    }
    for (const st of this.addresses.values()) await this.stopStreaming(st);
    await this.records.close(1500);
    await this.receiver?.close();
    await this.notices?.close();
    await this.endpoint?.close();
    this.maps?.close();
  }

  /** Authentication counters (forged, replayed or garbage BFD packets, sync frames and notices) and the source guard's counters. */
  security(): Record<string, unknown> {
    const n = this.notices?.stats();
    // Per gateway pod: what the node's guard on its veth let out or dropped, by reason.
    const guard = Object.fromEntries([...this.gateways.values()].map((g) => [g.info.pod, g.datapath.guardStats()]));
    return { bfdRejected: this.endpoint?.stats().rejected, syncRejected: this.receiver?.stats().rejected, noticesRejected: n?.rejected, notices: n && { rx: n.rx, tx: n.tx, accepted: n.accepted }, guard };
  }

  /** BFD as its thread last reported it: each session's state and Up/Down counts, the thread's worst loop delay. */
  bfdStatus(): Record<string, unknown> | undefined {
    const st = this.endpoint?.stats();
    return st && { threadLagMaxMs: st.loopLagMaxMs, threadLagMaxPerSecondMs: st.loopLagPerSecondMs, sessions: st.sessions.map((x) => ({ peer: x.peer, state: x.state, ups: x.ups, downs: x.downs, rx: x.rx, tx: x.tx })) };
  }

  /** Status per floating address: owner, epoch, candidates with their liveness, sync counters, last takeover. */
  status(): Array<Record<string, unknown>> {
    let counters = new Map<string, { flows: bigint; packets: bigint; bytes: bigint }>();
    try {
      counters = this.maps?.addressStats() ?? counters;
    } catch {
      // counters are diagnostics: status answers without them
    }
    return [...this.addresses.values()].map((st) => ({
      egress: st.egress.key,
      address: st.address,
      pool: st.slot.pool,
      owner: st.own.owner,
      ownerNode: st.own.ownerNode,
      ownerZone: this.liveRegistry(st.egress.key).find((x) => x.pod === st.own.owner)?.zone,
      epoch: st.own.epoch,
      // This node's clients' use of the address (flows pinned, packets and bytes steered to it), and every
      // node's as reported to the store.
      flows: Number(counters.get(st.address)?.flows ?? 0n),
      packets: Number(counters.get(st.address)?.packets ?? 0n),
      bytes: Number(counters.get(st.address)?.bytes ?? 0n),
      clusterFlows: this.usage.get(st.egress.key)?.[st.address]?.flows,
      clusterBytes: this.usage.get(st.egress.key)?.[st.address]?.bytes,
      ownedHere: !!st.holder,
      recorded: st.recorded,
      storeReachable: !this.storeDown,
      inSync: [...st.inSync],
      candidates: st.candidates.map((c) => ({ pod: c.pod, node: c.node, live: this.alive(c), bfd: this.bfdState(c), inSync: st.inSync.has(c.node) })),
      sync: st.holder
        ? [...st.senders.entries()].map(([peer, s]) => {
            const x = s.stats();
            return { peer, state: x.state, entriesSent: x.entriesSent, lagEntries: x.lagEntries, lagMs: x.lagMs, resyncs: x.resyncs };
          })
        : this.receiver?.stats().peers.filter((p) => p.stream === streamOf(st)).map((p) => ({ from: p.id, entriesApplied: p.entriesApplied, resyncs: p.resyncs })),
      lastTakeover: st.lastTakeover,
    }));
  }

  /**
   * Per Egress, what its status conditions need: how many addresses it asks for, has and has owned; why
   * it has fewer (allocation failures); whether a per-node cap keeps an address without an owner although
   * live candidates exist; and a zone policy this node cannot apply (no zone of its own).
   */
  egressSummary(): Record<string, { asked: number; allocated: number; owned: number; ownerNodes: number; shortfall?: string; capLimited: boolean; zoneProblem?: string }> {
    const out: ReturnType<EgressController['egressSummary']> = {};
    for (const e of this.egresses.values()) {
      const mine = [...this.addresses.values()].filter((x) => x.egress.key === e.key);
      const owned = mine.filter((x) => x.own.owner);
      const live = this.liveRegistry(e.key).filter((g) => this.alive(g));
      const placement = this.placementOf(e);
      const capLimited = live.length > 0 && mine.some((x) => !x.own.owner && placement.has(x.address) && placement.get(x.address) === undefined)
        || (e.maxAddressesPerNode !== undefined && new Set(owned.map((x) => x.own.ownerNode)).size < Math.min(owned.length, new Set(live.map((g) => g.node)).size));
      const zoneProblem = (e.zonePolicy === 'preferZone' || e.zonePolicy === 'requireZone') && !this.o.node.zone
        ? `node ${this.o.node.name} has no topology.kubernetes.io/zone label: ${e.zonePolicy === 'requireZone' ? 'its clients\' traffic is dropped' : 'no zone is preferred'}`
        : e.zonePolicy === 'requireZone' && owned.length > 0 && !owned.some((x) => this.liveRegistry(e.key).find((g) => g.pod === x.own.owner)?.zone === this.o.node.zone)
          ? `no address is held in zone ${this.o.node.zone}: clients on ${this.o.node.name} are dropped (requireZone)`
          : undefined;
      out[e.key] = {
        asked: addressSlots(e).length, allocated: mine.length, owned: owned.length, ownerNodes: new Set(owned.map((x) => x.own.ownerNode)).size,
        ...(this.shortfall.has(e.key) ? { shortfall: this.shortfall.get(e.key) } : {}), capLimited, ...(zoneProblem ? { zoneProblem } : {}),
      };
    }
    return out;
  }

  /** Runs event- or timer-driven work unless stopping; its failure is logged, never thrown. */
  private spawn(fn: () => Promise<void>): void {
    if (this.stopped) return;
    void this.work.run(fn).catch((e) => this.o.logger.error('egress: work failed', { error: (e as Error).message, stack: (e as Error).stack }));
  }

  private track(e: ResolvedEgress, address: string, slot: AddressSlot, own?: Ownership): AddressState {
    const key = `${e.key}|${address}`;
    let st = this.addresses.get(key);
    if (!st) {
      st = {
        egress: e, address, slot, slotOwner: slotOwner(e.key, slot), own: own ?? { egress: e.key, address, owner: '', epoch: 0 },
        candidates: [], senders: new Map(), inSync: new Set(), recorded: !!own,
      };
      this.addresses.set(key, st);
    }
    return st;
  }

  // ---- pods ------------------------------------------------------------------------------------------

  private async podUp(r: PodRecord): Promise<void> {
    const pod = podKey(r) ?? r.containerId;
    try {
      await this.podRoles(r);
      this.o.attach.roleProblems.ok(pod, 'egress');
    } catch (e) {
      // One pod that cannot take its role (gone meanwhile, broken namespace) must not stop the others; it is
      // reported (status, /readyz) until a later pass sets it up.
      if (this.o.attach.roleProblems.failed(pod, 'egress', (e as Error).message)) {
        this.o.logger.error('egress: pod role setup failed', { pod, error: (e as Error).message });
      }
    }
  }

  /** Pods whose egress role failed are tried again (a transient netlink or sysctl error heals itself). */
  private async retryFailedRoles(): Promise<void> {
    const failed = new Set(this.o.attach.roleProblems.list().filter((p) => p.role === 'egress').map((p) => p.pod));
    if (failed.size === 0) return;
    for (const r of this.o.attach.pods()) if (failed.has(podKey(r) ?? r.containerId) && fs.existsSync(r.netns)) await this.podUp(r);
  }

  /**
   * Makes a pod's roles what its labels and the Egresses say now, in both directions: a pod that became a
   * client is steered, one that stopped being one is not; a gateway that left an Egress hands its
   * addresses over first (make-before-break). Nothing is re-attached.
   */
  private async podRoles(r: PodRecord): Promise<void> {
    const pod = podKey(r);
    const ip = r.ips?.find((i) => !i.includes(':'));
    if (!pod || !ip || !r.hostIfName) return;
    const meta = this.podMeta.get(pod);
    const labels = meta?.labels ?? r.labels ?? {};
    // A gateway serves only while ready and not terminating: a terminating one hands over before its DEL.
    const serving = meta?.ready !== false && !meta?.deleting;
    const gwOf = serving ? [...this.egresses.values()].filter((e) => selects(e.gateways, r.podNamespace!, labels)) : [];
    const clientOf = [...this.egresses.values()].filter((e) => selects(e.clients, r.podNamespace!, labels));
    await this.gatewayRole(r, pod, ip, gwOf);
    this.clientRole(r, pod, ip, clientOf);
    await this.tick();
  }

  private async gatewayRole(r: PodRecord, pod: string, ip: string, gwOf: ResolvedEgress[]): Promise<void> {
    const cur = this.gateways.get(pod);
    const keys = new Set(gwOf.map((e) => e.key));
    const guarded = { destinations: [...new Set(gwOf.flatMap((e) => e.destinations))], excluded: [...new Set(gwOf.flatMap((e) => e.excluded))] };
    if (!gwOf.length) {
      if (cur) await this.gatewayDown(pod, cur, 'pod no longer selected as a gateway', DRAIN_MS);
      return;
    }
    if (cur) {
      const before = [...cur.egresses].sort().join();
      const left = [...cur.egresses].filter((k) => !keys.has(k));
      for (const st of this.addresses.values()) {
        if (st.holder !== cur || !left.includes(st.egress.key)) continue;
        await this.mutex.run(streamOf(st), async () => {
          this.handOver(st, pod, draining(`handover: ${pod} no longer a gateway of ${st.egress.key}`));
          cur.datapath.withdrawAnnouncement(st.address);
          void this.stopStreaming(st);
        });
        // Packets clients sent before they learned the new owner still leave NATed: release after a drain.
        const release = () => {
          if (st.holder !== cur) cur.datapath.release(st.address, st.egress.announce);
        };
        setTimeout(() => this.spawn(async () => release()), DRAIN_MS).unref();
      }
      cur.egresses = keys;
      // Rules are replaced in place (owned addresses keep their SNAT): the guard follows new destinations.
      if (JSON.stringify(guarded) !== cur.guarded) {
        cur.datapath.prepare(this.nodes, guarded);
        cur.guarded = JSON.stringify(guarded);
      }
      if ([...keys].sort().join() !== before) {
        this.o.logger.info('egress: gateway pod roles changed', { pod, egresses: [...keys] });
        this.spawn(() => this.register().catch((e) => this.storeFailed(e)));
      }
      return;
    }
    const info: GatewayInfo = {
      pod, node: this.o.node.name, nodeAddress: this.o.node.address, podIp: ip, zone: this.o.node.zone,
      ...(this.o.node.maxEgressAddresses !== undefined ? { maxAddresses: this.o.node.maxEgressAddresses } : {}),
    };
    const datapath = new GatewayDatapath({ pod, netns: r.netns, podIp: ip, ifName: r.ifName, hostIfName: r.hostIfName! }, { uplink: this.o.node.uplink, fouPort: this.o.fouPort, pinDir: this.o.pinDir });
    datapath.prepare(this.nodes, guarded);
    this.gateways.set(pod, { info, datapath, egresses: keys, netns: r.netns, guarded: JSON.stringify(guarded) });
    // Owners already streaming to this node sent their tables before this pod existed, and events bring
    // only what changes: without a fresh resync the pod would lack every established flow and still
    // count as in sync (sync is per node). A resync in progress takes the node out of the owner's
    // in-sync set until it is applied to this pod too.
    const resyncs = this.receiver?.requestResync((stream) => keys.has(stream.split('|')[0])) ?? 0;
    this.o.logger.info('egress: gateway pod ready', { pod, egresses: [...keys], resyncsRequested: resyncs });
    // The registry is told in the background: a store that hangs must not hold a pod's set-up.
    this.spawn(() => this.register().catch((e) => this.storeFailed(e)));
  }

  private clientRole(r: PodRecord, pod: string, ip: string, clientOf: ResolvedEgress[]): void {
    const cur = this.clients.get(pod);
    const egressIds = clientOf.map((e) => this.egressIds.get(e.key)!).sort((a, b) => a - b);
    if (!egressIds.length) {
      if (cur) {
        this.clientDown(pod, cur);
        this.o.logger.info('egress: client pod no longer steered', { pod });
      }
      return;
    }
    if (cur) {
      if (cur.egressIds.join() === egressIds.join()) return;
      cur.steer?.setClient(ip, egressIds);
      cur.egressIds = egressIds;
    } else {
      const steer = attachEgressSteer({ ifName: r.hostIfName!, pinDir: this.o.pinDir, nodeAddress: this.o.node.address, port: this.o.fouPort });
      steer.setClient(ip, egressIds);
      this.clients.set(pod, { ip, hostIfName: r.hostIfName!, egressIds, steer });
    }
    for (const e of clientOf) this.steered.delete(e.key);
    this.o.logger.info('egress: client pod steered', { pod, egresses: clientOf.map((e) => e.key) });
  }

  private clientDown(pod: string, client: ClientPod): void {
    this.maps?.removeClient(client.ip);
    try {
      client.steer?.detach();
    } catch {
      // the veth went with the pod
    }
    this.clients.delete(pod);
  }

  private async podDown(r: PodRecord, cause: string, drainMs = 0): Promise<void> {
    const pod = podKey(r);
    if (!pod) return;
    const client = this.clients.get(pod);
    if (client) this.clientDown(pod, client);
    const gw = this.gateways.get(pod);
    if (gw) await this.gatewayDown(pod, gw, cause, drainMs);
  }

  private async gatewayDown(pod: string, gw: LocalGateway, cause: string, drainMs = 0): Promise<void> {
    if (this.gateways.get(pod) !== gw) return;
    this.gateways.delete(pod);
    // Hand every address it held to the next live candidate at once, instead of waiting for detection.
    for (const st of this.addresses.values()) {
      if (st.holder !== gw) continue;
      await this.mutex.run(streamOf(st), async () => {
        this.handOver(st, pod, drainMs ? draining(`handover: ${cause} (${pod})`) : `handover: ${cause} (${pod})`);
        gw.datapath.withdrawAnnouncement(st.address);
        // Closing the event reader waits out its receive timeout: not on the handover's critical path.
        void this.stopStreaming(st);
      });
    }
    this.spawn(() => this.register().catch((e) => this.storeFailed(e)));
    if (drainMs) await new Promise((res) => setTimeout(res, drainMs));
    try {
      gw.datapath.teardown();
    } catch (e) {
      this.o.logger.debug('egress: gateway teardown after the pod left', { pod, error: (e as Error).message });
    }
  }

  /** A gateway pod whose namespace vanishes without a DEL (killed) is noticed at once, not at GC time. */
  private watchNetns(): void {
    try {
      this.watcher = fs.watch('/run/netns', () => this.spawn(() => this.dropVanishedGateways()));
    } catch {
      // no inotify on this path: the tick checks too
    }
  }

  private async dropVanishedGateways(): Promise<void> {
    for (const [pod, gw] of [...this.gateways]) {
      if (fs.existsSync(gw.netns)) continue;
      this.o.logger.warn('egress: gateway pod namespace disappeared', { pod, netns: gw.netns });
      const [podNamespace, podName] = pod.split('/');
      await this.podDown({ podNamespace, podName } as PodRecord, 'gateway pod namespace gone');
    }
  }

  // ---- ownership -------------------------------------------------------------------------------------

  /** Ticks never overlap: a tick asked for while one runs runs right after it. */
  private requestTick(): void {
    if (this.ticking) {
      this.tickAgain = true;
      return;
    }
    this.spawn(() => this.tick());
  }

  /** One reconcile pass over every address, from what this node knows now: it never waits for the store. */
  private async tick(): Promise<void> {
    if (this.stopped) return;
    if (this.ticking) {
      this.tickAgain = true;
      return;
    }
    this.ticking = true;
    try {
      do {
        this.tickAgain = false;
        await this.dropVanishedGateways();
        this.dropLapsedAnnouncements();
        this.ensureBfd();
        this.placements.clear();
        for (const st of this.addresses.values()) {
          if (this.stopped) return;
          await this.mutex.run(streamOf(st), () => this.evaluate(st));
        }
      } while (this.tickAgain && !this.stopped);
    } finally {
      this.ticking = false;
    }
  }

  /** This node's cap on one Egress's addresses for `node` (the node's own override, else the Egress's). */
  private capOf(e: ResolvedEgress, node: string): number {
    const g = this.liveRegistry(e.key).find((x) => x.node === node);
    return g?.maxAddresses ?? e.maxAddressesPerNode ?? Infinity;
  }

  /**
   * Where each address of the Egress without a live owner goes (placeAddresses), computed once per tick
   * from this node's views, which every candidate shares: anti-affinity, the per-node caps, least load.
   */
  private placementOf(e: ResolvedEgress): Map<string, GatewayInfo | undefined> {
    let p = this.placements.get(e.key);
    if (!p) {
      const mine = [...this.addresses.values()].filter((x) => x.egress.key === e.key);
      p = placeAddresses(
        mine.map((x) => ({ address: x.address, own: x.own, ownerAlive: this.ownerAlive(x), inSync: x.inSync })),
        this.liveRegistry(e.key), (g) => this.alive(g), (node) => this.capOf(e, node),
      );
      this.placements.set(e.key, p);
    }
    return p;
  }

  /** The addresses of an Egress each node holds now (live owners), for load-aware handovers. */
  private loadOf(e: ResolvedEgress, except: AddressState): { of: (node: string) => number; cap: (node: string) => number } {
    const load = new Map<string, number>();
    for (const x of this.addresses.values()) {
      if (x === except || x.egress.key !== e.key || !x.own.owner || !x.own.ownerNode || !this.ownerAlive(x)) continue;
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
    const sig = this.liveRegistry(e.key).map((g) => g.pod).sort().join(',');
    const seen = this.registrySeen.get(e.key);
    const now = Date.now();
    if (!seen || seen.sig !== sig) {
      this.registrySeen.set(e.key, { sig, since: now });
      return false;
    }
    return now - seen.since >= INITIAL_SETTLE_MS;
  }

  private async evaluate(st: AddressState): Promise<void> {
    st.candidates = orderCandidates(st.address, this.liveRegistry(st.egress.key));
    if (st.own.epoch === 0 && !st.own.owner && !this.candidatesSettled(st.egress)) return;
    const local = new Set([...this.gateways.values()].filter((g) => g.egresses.has(st.egress.key)).map((g) => g.info.pod));
    if (st.own.owner && st.own.ownerNode === this.o.node.name && !local.has(st.own.owner) && !st.holder) {
      // The owner is a pod of this node that is gone (killed before a live candidate was known here, or
      // named by a handover that did not know it was gone). Only this node knows: the others see its node
      // alive. Hand over as soon as a live candidate is known: every tick, not only when the pod left.
      if (this.handOver(st, st.own.owner, `handover: owner ${st.own.owner} is no longer on ${this.o.node.name}`)) {
        this.ensureSenders(st);
        return;
      }
    }
    const ownerAlive = this.ownerAlive(st);
    const now = Date.now();
    if (ownerAlive || !st.own.owner) st.ownerDownSince = undefined;
    else st.ownerDownSince ??= now;
    const placed = ownerAlive && st.own.owner ? undefined : { pod: this.placementOf(st.egress).get(st.address) };
    const d = decide({
      own: st.own, candidates: st.candidates, localPods: local, alive: (g) => this.alive(g), ownerAlive, holdingLocally: !!st.holder,
      inSync: st.inSync, ownerDownSince: st.ownerDownSince, now, choice: placed,
    });
    if (d.action !== 'wait') st.waiting = false;
    if (d.action === 'claim' && st.own.epoch === 0 && !this.storeDown) {
      // A first owner has no connections to lose, so it goes through the store's compare-and-set: two
      // candidates starting at once (neither knowing the other yet) would otherwise both claim, and the
      // better-scored one would then take the address from the other. Without the store, they settle it.
      const gw = this.gateways.get(d.pod)!;
      const first: Ownership = { egress: st.egress.key, address: st.address, owner: d.pod, epoch: 1, cause: d.cause, ownerNode: this.o.node.name, ownerNodeAddress: this.o.node.address, ownerPodIp: gw.info.podIp };
      // The pod side first (SNAT, no announcement): the store publishes a won claim at once, and clients
      // steer to the pod on it; a lost claim is undone.
      gw.datapath.takeUnannounced(st.address, st.egress.announce);
      const r = await this.o.ownership.record({ ...first, score: scoreOf(st.address, d.pod) }, { firstOnly: true }).catch((e) => {
        // A garbled record where the first owner's would go: nobody knows who owns it; no claim over it.
        if (e instanceof UnreadableRecordError) return 'unreadable' as const;
        this.storeFailed(e);
        return undefined;
      });
      // Recorded (or the store failed meanwhile: then claimed without it, as below, and recorded later).
      if (r !== 'superseded' && r !== 'unreadable') return this.takeOver(st, d.pod, d.cause, r !== undefined);
      gw.datapath.release(st.address, st.egress.announce);
      if (r === 'unreadable') return;
      return this.adopt(st, await this.o.ownership.get(st.egress.key, st.address), 'store');
    }
    if (d.action === 'claim') await this.takeOver(st, d.pod, d.cause);
    else if (d.action === 'standDown') await this.standDown(st, `epoch ${st.own.epoch} names ${st.own.owner}`);
    else if (d.action === 'wait' && !st.waiting) {
      st.waiting = true;
      this.o.logger.warn('egress: owner looks down from here, but this node is not in sync with it: holding off for in-sync candidates', {
        egress: st.egress.key, address: st.address, owner: st.own.owner, epoch: st.own.epoch, pod: d.pod, inSync: [...st.inSync], untilMs: d.untilMs - now,
      });
    } else if (d.action === 'keep' && st.own.owner && local.has(st.own.owner) && !st.holder) {
      await this.become(st, this.gateways.get(st.own.owner)!, 'restart: resuming ownership');
    }
    this.ensureSenders(st);
    this.updateClients(st);
  }

  /** This node's gateway `pod` takes the address: next epoch, datapath first, then every node is told. */
  private async takeOver(st: AddressState, pod: string, cause: string, recorded = false): Promise<void> {
    const gw = this.gateways.get(pod);
    if (!gw) return;
    const t0 = Date.now();
    const from = st.own.owner;
    st.own = { egress: st.egress.key, address: st.address, owner: pod, epoch: st.own.epoch + 1, cause, ownerNode: this.o.node.name, ownerNodeAddress: this.o.node.address, ownerPodIp: gw.info.podIp };
    st.recorded = recorded;
    st.inSync = new Set();
    await this.become(st, gw, cause);
    st.lastTakeover = { at: new Date().toISOString(), cause, ms: Date.now() - t0, epoch: st.own.epoch, from, to: pod, decidedBy: this.o.node.name };
    this.o.logger.info('egress: ownership changed', { egress: st.egress.key, address: st.address, from, to: pod, epoch: st.own.epoch, cause, decidedBy: this.o.node.name, ms: Date.now() - t0 });
    this.updateClients(st);
    if (!recorded) this.recordLater(st);
  }

  /**
   * A planned handover from local pod `fromPod` (deleted, or tetherd stopping): the best live candidate,
   * in-sync first, gets the next epoch; it learns from the notice, as every other node does. Returns it.
   */
  private handOver(st: AddressState, fromPod: string, cause: string): GatewayInfo | undefined {
    st.candidates = orderCandidates(st.address, this.liveRegistry(st.egress.key));
    const next = handoverTarget(st.candidates, fromPod, (g) => this.alive(g) && g.pod !== fromPod, st.inSync, this.loadOf(st.egress, st));
    st.holder = undefined;
    if (!next) return undefined;
    const from = st.own.owner;
    st.own = { egress: st.egress.key, address: st.address, owner: next.pod, epoch: st.own.epoch + 1, cause, ownerNode: next.node, ownerNodeAddress: next.nodeAddress, ownerPodIp: next.podIp };
    st.recorded = false;
    st.inSync = new Set();
    this.broadcast(st);
    st.lastTakeover = { at: new Date().toISOString(), cause, ms: 0, epoch: st.own.epoch, from, to: next.pod, decidedBy: this.o.node.name };
    this.o.logger.info('egress: ownership changed', { egress: st.egress.key, address: st.address, from, to: next.pod, epoch: st.own.epoch, cause, decidedBy: this.o.node.name });
    const local = this.gateways.get(next.pod);
    if (local) this.spawn(() => this.mutex.run(streamOf(st), () => this.become(st, local, cause)));
    else if (isDraining(cause)) this.steerOnConfirmation(st);
    else this.updateClients(st);
    this.recordLater(st);
    return next;
  }

  private onNotice(n: OwnershipNotice, from: string, address?: string): Promise<void> {
    const st = this.addresses.get(`${n.egress}|${n.address}`);
    if (!st) return Promise.resolve();
    if (address !== undefined) {
      // A decision is followed only from a node this one knows (the store's node list, a registered or
      // announced gateway, an owner), and an owner's own notice only from the owner's own address.
      const why = !this.knownNode(address) ? `sender ${from} at ${address} is not a known node`
        : n.ownerNode === from && n.ownerNodeAddress && n.ownerNodeAddress !== address ? `sender ${from} at ${address} names its own address as ${n.ownerNodeAddress}` : undefined;
      if (why) {
        this.refuseSender(`${from}|${address}|notice`, 'egress: ownership notice refused; nothing in it applied', { from, address, egress: n.egress, floating: n.address, owner: n.owner, epoch: n.epoch, why });
        return Promise.resolve();
      }
    }
    return this.mutex.run(streamOf(st), () => this.adopt(st, n, `notice from ${from}`, from === n.ownerNode ? n.inSync : undefined));
  }

  private onStoreNotice(c: Ownership): Promise<void> {
    const st = this.addresses.get(`${c.egress}|${c.address}`);
    if (!st) return Promise.resolve();
    return this.mutex.run(streamOf(st), () => this.adopt(st, c, 'store'));
  }

  /**
   * Follows a decision made elsewhere (a notice, the store) if it supersedes what this node knows: stands
   * down when it names another pod, takes the address when it names a local one, re-steers clients.
   */
  private async adopt(st: AddressState, c: Ownership, via: string, inSync?: string[]): Promise<void> {
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
    this.o.logger.info('egress: ownership learned', { egress: st.egress.key, address: st.address, from: prev.owner, to: c.owner, epoch: c.epoch, previousEpoch: prev.epoch, cause: c.cause, via });
    if (st.holder && st.holder.info.pod !== c.owner) await this.standDown(st, `epoch ${c.epoch} names ${c.owner} (${via})`);
    const gw = this.gateways.get(c.owner);
    if (gw && !st.holder) {
      await this.become(st, gw, c.cause ?? via);
      // become() confirms to every node (and to the decider) that the named gateway holds it now.
      st.lastTakeover = { at: new Date().toISOString(), cause: c.cause ?? '', ms: 0, epoch: c.epoch, from: prev.owner, to: c.owner, decidedBy: via };
    }
    // Told by another node (the old owner's node, or the store) of a planned handover to a pod elsewhere:
    // the new owner needs a few ms to take the address (until then its node's guard drops what its pod
    // sends from it), while the old one still forwards through its drain. So clients move on the owner's
    // own confirmation (become() broadcasts it), or after CONFIRM_WAIT_MS if that notice is lost. Seen on the testbed: clients switched 1 ms before the owner could send, and a
    // handful of segments waited out TCP's 200 ms retransmission timeout.
    if (!inSync && !gw && c.owner && c.ownerNode !== this.o.node.name && isDraining(c.cause)) this.steerOnConfirmation(st);
    else this.steerNow(st);
  }

  /** Clients move to the new owner on its confirmation (adopt), or after CONFIRM_WAIT_MS. */
  private steerOnConfirmation(st: AddressState): void {
    clearTimeout(st.steerTimer);
    st.steerTimer = setTimeout(() => this.spawn(() => this.mutex.run(streamOf(st), async () => this.steerNow(st))), CONFIRM_WAIT_MS);
    st.steerTimer.unref();
  }

  private steerNow(st: AddressState): void {
    clearTimeout(st.steerTimer);
    st.steerTimer = undefined;
    this.updateClients(st);
  }

  /**
   * Holds the address on a local gateway: datapath first, then every node is told (clients re-steer on
   * that notice), then the conntrack stream to the standbys starts (its event reader takes a few ms).
   */
  private async become(st: AddressState, gw: LocalGateway, cause: string): Promise<void> {
    gw.datapath.own(st.address, st.egress.announce);
    st.holder = gw;
    this.broadcast(st);
    this.updateClients(st);
    this.o.logger.info('egress: this node owns the floating address', { egress: st.egress.key, address: st.address, pod: gw.info.pod, epoch: st.own.epoch, cause });
    await this.startStreaming(st);
  }

  private async standDown(st: AddressState, why: string): Promise<void> {
    const gw = st.holder;
    st.holder = undefined;
    gw?.datapath.release(st.address, st.egress.announce);
    void this.stopStreaming(st);
    this.o.logger.info('egress: stood down', { egress: st.egress.key, address: st.address, pod: gw?.info.pod, why });
  }

  /** The current ownership as a notice; the holder adds the nodes in sync with it. */
  private noticeOf(st: AddressState): OwnershipNotice {
    return {
      egress: st.egress.key, address: st.address, owner: st.own.owner, epoch: st.own.epoch, ownerNode: st.own.ownerNode ?? '',
      ownerNodeAddress: st.own.ownerNodeAddress ?? '', ownerPodIp: st.own.ownerPodIp ?? '', cause: (st.own.cause ?? '').slice(0, 400),
      inSync: st.holder ? this.computeInSync(st) : [],
    };
  }

  /** Sends the current ownership to every known node now and once more shortly after. */
  private broadcast(st: AddressState): void {
    const n = this.noticeOf(st);
    const send = () => {
      try {
        this.notices?.send(this.peerAddresses(), [n]);
      } catch (e) {
        this.o.logger.error('egress: ownership notice not sent', { egress: st.egress.key, address: st.address, error: (e as Error).message });
      }
    };
    send();
    setTimeout(() => !this.stopped && send(), NOTICE_REPEAT_MS).unref();
  }

  /**
   * Every second: the owner repeats its ownership (nodes that missed a notice or just started catch up), and
   * a node with gateway pods announces them to the other candidates of their Egresses and to the owners,
   * so candidates know each other (BFD sessions, conntrack streams) even when the store is down.
   */
  private heartbeat(): void {
    if (this.stopped || !this.notices) return;
    const held = [...this.addresses.values()].filter((st) => st.holder);
    for (const st of held) st.inSync = new Set(this.computeInSync(st));
    try {
      if (held.length) this.notices.send(this.peerAddresses(), held.map((st) => this.noticeOf(st)));
      for (const e of this.egresses.values()) {
        const mine = [...this.gateways.values()].filter((g) => g.egresses.has(e.key)).map((g) => ({ ...g.info, egress: e.key }));
        if (!mine.length) continue;
        const peers = new Set(this.liveRegistry(e.key).filter((g) => g.node !== this.o.node.name).map((g) => g.nodeAddress));
        for (const st of this.addresses.values()) if (st.egress.key === e.key && st.own.ownerNodeAddress) peers.add(st.own.ownerNodeAddress);
        peers.delete(this.o.node.address);
        this.notices.send(peers, [], mine);
      }
    } catch (e) {
      this.o.logger.error('egress: heartbeat notice not sent', { error: (e as Error).message });
    }
  }

  /**
   * Gateways a node announced: candidates until ANNOUNCED_TTL_MS after its last announcement. Accepted only
   * from the node's own address; a node not known otherwise becomes known this way (the notice is
   * authenticated with the cluster key), which is how candidates find each other while the store is down.
   */
  private onAnnounced(list: GatewayAnnouncement[], from: string, address: string): void {
    const until = Date.now() + ANNOUNCED_TTL_MS;
    let added = false;
    for (const a of list) {
      if (a.nodeAddress !== address || a.node === this.o.node.name) {
        this.refuseSender(`${from}|${address}|gateways`, 'egress: gateway announcement refused; nothing in it applied', {
          from, address, pod: a.pod, egress: a.egress, why: a.node === this.o.node.name ? `names this node (${a.node})` : `names node address ${a.nodeAddress}, but came from ${address}`,
        });
        return;
      }
    }
    for (const a of list) {
      if (!this.egresses.has(a.egress)) continue;
      let m = this.announced.get(a.egress);
      if (!m) this.announced.set(a.egress, (m = new Map()));
      const { egress: _egress, ...info } = a;
      if (!m.has(a.pod) && !(this.registry.get(a.egress) ?? []).some((g) => g.pod === a.pod)) {
        added = true;
        this.o.logger.info('egress: gateway candidate learned from its node', { egress: a.egress, pod: a.pod, node: a.node, nodeAddress: address });
      }
      m.set(a.pod, { info, until });
    }
    if (added) this.requestTick();
  }

  /** Logs a refused sender once per kind (the channel counts every refusal). */
  private refuseSender(key: string, msg: string, fields: Record<string, unknown>): void {
    if (this.refusedSenders.has(key)) return;
    this.refusedSenders.add(key);
    this.o.logger.warn(msg, fields);
  }

  /** A node address this node knows: the store's node list, a registered or announced gateway's, an owner's. */
  private knownNode(address: string): boolean {
    if (this.nodes.includes(address)) return true;
    for (const list of this.registry.values()) if (list.some((g) => g.nodeAddress === address)) return true;
    for (const m of this.announced.values()) for (const a of m.values()) if (a.info.nodeAddress === address) return true;
    for (const st of this.addresses.values()) if (st.own.ownerNodeAddress === address) return true;
    return false;
  }

  /** Nodes whose sync stream from here is streaming with little lag: their standbys have the connections. */
  private computeInSync(st: AddressState): string[] {
    const byAddress = new Map(st.candidates.map((c) => [c.nodeAddress, c.node]));
    const out: string[] = [];
    for (const [peer, s] of st.senders) {
      const x = s.stats();
      const node = byAddress.get(peer);
      if (node && x.state === 'streaming' && x.lagEntries < IN_SYNC_MAX_LAG) out.push(node);
    }
    return out.sort();
  }

  private peerAddresses(): string[] {
    const out = new Set(this.nodes);
    for (const list of this.registry.values()) for (const g of list) out.add(g.nodeAddress);
    for (const m of this.announced.values()) for (const a of m.values()) out.add(a.info.nodeAddress);
    for (const st of this.addresses.values()) if (st.own.ownerNodeAddress) out.add(st.own.ownerNodeAddress);
    out.delete(this.o.node.address);
    return [...out];
  }

  private updateClients(st: AddressState): void {
    if (!this.maps || ![...this.clients.values()].some((c) => c.egressIds.includes(this.egressIds.get(st.egress.key)!))) return;
    const id = this.egressIds.get(st.egress.key)!;
    const slots: Array<{ gatewayIp: string; floatingIp: string; epoch: number; tier: number }> = [];
    for (const a of [...this.addresses.values()].sort((x, y) => (x.address < y.address ? -1 : 1))) {
      if (a.egress.key !== st.egress.key || !a.own.owner) continue;
      const reg = this.liveRegistry(a.egress.key).find((x) => x.pod === a.own.owner);
      const gatewayIp = a.own.ownerPodIp || reg?.podIp;
      // Not known yet (a record without the pod's address): keep the previous slots; dropped at worst,
      // never sent unNATed. The owner's heartbeat brings it within a second.
      if (!gatewayIp) return;
      slots.push({ gatewayIp, floatingIp: a.address, epoch: a.own.epoch, tier: this.tierOf(a.egress, a.own.ownerNode, reg?.zone) });
    }
    this.maps.setGateways(id, slots);
    const now = slots.map((x) => `${x.floatingIp}→${x.gatewayIp}@${x.epoch}/${x.tier}`).join(',');
    if (this.steered.get(st.egress.key) !== now) {
      this.steered.set(st.egress.key, now);
      this.o.logger.info('egress: client steering updated', { egress: st.egress.key, slots });
    }
  }

  /**
   * The tier of an address for new flows of this node's clients, from the Egress's zone policy: its owner
   * on this node (preferLocalNode) or in this node's zone (preferZone, requireZone) is preferred; the
   * others are the fallback, or excluded under requireZone. Without a zone on this node, preferZone
   * prefers nothing and requireZone excludes everything (status says why).
   */
  private tierOf(e: ResolvedEgress, ownerNode: string | undefined, ownerZone: string | undefined): number {
    const zone = this.o.node.zone;
    switch (e.zonePolicy) {
      case 'preferLocalNode':
        return ownerNode === this.o.node.name ? EGRESS_TIER_PREFERRED : EGRESS_TIER_FALLBACK;
      case 'preferZone':
        return !zone || ownerZone === zone ? EGRESS_TIER_PREFERRED : EGRESS_TIER_FALLBACK;
      case 'requireZone':
        return zone && ownerZone === zone ? EGRESS_TIER_PREFERRED : EGRESS_TIER_EXCLUDED;
      default:
        return EGRESS_TIER_PREFERRED;
    }
  }

  // ---- the cluster store: registry, node list, records -----------------------------------------------

  /**
   * One pass of everything the store is used for, in the background: this node's registrations, the
   * registry and node list (kept as last known when the store is unreachable), floating addresses not yet
   * allocated, and records: a record that supersedes this node's view is followed; a decision this node
   * holds that the store lacks is written (epochs reconciled after the store was away).
   */
  private async storePass(): Promise<void> {
    if (this.storeBusy || this.stopped) return;
    this.storeBusy = true;
    try {
      await this.register();
      const nodes = await this.o.ownership.listNodes();
      if (nodes.join() !== this.nodes.join()) {
        this.nodes = nodes;
        for (const gw of this.gateways.values()) gw.datapath.setAllowedSources(nodes);
      }
      for (const e of this.egresses.values()) this.registry.set(e.key, await this.o.ownership.listGateways(e.key));
      await this.reassertAddresses();
      await this.ensureAddresses();
      for (const st of this.addresses.values()) {
        let rec: Ownership;
        try {
          rec = await this.o.ownership.get(st.egress.key, st.address);
        } catch (e) {
          if (!(e instanceof UnreadableRecordError)) throw e;
          // A garbled record (refused and logged by the store layer): nothing in it is followed; the
          // holder's decision replaces it, the others wait for that.
          if (st.holder) await this.record(st);
          continue;
        }
        const write = await this.mutex.run(streamOf(st), async () => {
          if (supersedes(rec, st.own) || (rec.epoch === st.own.epoch && rec.owner === st.own.owner)) {
            await this.adopt(st, rec, 'store');
            return false;
          }
          // This node's view supersedes the record: the holder writes it (the others wait for it to).
          return !!st.holder;
        });
        if (write) await this.record(st);
      }
      if (this.storeDown) this.o.logger.info('egress: cluster store reachable again; records reconciled');
      this.storeDown = false;
    } catch (e) {
      this.storeFailed(e);
    } finally {
      this.storeBusy = false;
    }
  }

  private storeFailed(e: unknown): void {
    if (this.storeDown) return;
    this.storeDown = true;
    this.o.logger.warn('egress: cluster store unreachable; ownership is decided between tetherds meanwhile', { error: (e as Error).message });
  }

  /**
   * Every address slot of every Egress allocated and tracked: a new slot (count raised, a pool added) gets
   * its address now; a failure (pool exhausted, address held by another owner) is kept as the Egress's
   * shortfall for status and retried on the next pass. Each slot has its own owner in the store, so an
   * address is allocated and returned alone.
   */
  private async ensureAddresses(): Promise<void> {
    const held = new Set([...this.addresses.values()].map((st) => st.slotOwner));
    for (const e of this.egresses.values()) {
      const problems: string[] = [];
      for (const slot of addressSlots(e)) {
        const owner = slotOwner(e.key, slot);
        if (held.has(owner)) continue;
        try {
          const req = 'explicit' in slot ? { pool: slot.pool, owner, addresses: [slot.explicit] } : { pool: slot.pool, owner, count: 1 };
          const { addresses } = await this.o.addresses.allocate(req);
          const a = addresses[0];
          if (!a) continue;
          // An unreadable record: tracked as nobody's here, but a first claim over it is refused by the
          // store's compare-and-set, and a holder's heartbeat still supersedes it.
          const rec = await this.o.ownership.get(e.key, a).catch((err) => {
            if (err instanceof UnreadableRecordError) return { egress: e.key, address: a, owner: '', epoch: 0 } as Ownership;
            throw err;
          });
          const st = this.track(e, a, slot, rec);
          if (supersedes(rec, st.own)) await this.mutex.run(streamOf(st), () => this.adopt(st, rec, 'store'));
          this.o.logger.info('egress: floating address', { egress: e.key, address: a, pool: slot.pool, owner });
        } catch (err) {
          // TryAgainLater: the store restarted empty and new addresses wait while holders re-assert theirs.
          if (err instanceof TetherError && (err.code === ErrorCode.PoolExhausted || err.code === ErrorCode.AddressConflict || err.code === ErrorCode.UnknownPool || err.code === ErrorCode.TryAgainLater)) problems.push(err.message);
          else throw err;
        }
      }
      const why = problems.join('; ');
      if (why && this.shortfall.get(e.key) !== why) this.o.logger.warn('egress: fewer addresses than asked', { egress: e.key, asked: addressSlots(e).length, problems });
      if (why) this.shortfall.set(e.key, why);
      else this.shortfall.delete(e.key);
    }
  }

  /**
   * After the store lost its data (a new generation: restarted empty, FLUSHALL), every floating address
   * this node tracks is put back under its slot's owner, and the decision this node holds is written again
   * right away: the store holds new allocations back meanwhile (ClusterAddresses), so an address in use is
   * never handed to anyone else, and a tetherd starting now gets the same address for the same slot.
   */
  private async reassertAddresses(): Promise<void> {
    const g = await this.o.addresses.generation();
    if (g === this.generation) return;
    if (this.generation === undefined || !this.addresses.size) {
      this.generation = g;
      return;
    }
    this.o.logger.warn('egress: cluster store lost its data; re-asserting the floating addresses this node tracks', { addresses: this.addresses.size, generation: g });
    await this.o.addresses.markRestarted(g);
    for (const st of this.addresses.values()) {
      try {
        await this.o.addresses.reassert(st.slot.pool, st.slotOwner, st.address);
        this.o.logger.info('egress: floating address re-asserted', { egress: st.egress.key, address: st.address, owner: st.slotOwner });
      } catch (e) {
        if (!(e instanceof TetherError) || e.code !== ErrorCode.AddressConflict) throw e;
        // Someone got it while nobody re-asserted it (no node tracking it reached the store in the hold-off).
        this.o.logger.error('egress: floating address this Egress uses was given to another owner while the store was empty', { egress: st.egress.key, address: st.address, error: e.message });
        this.shortfall.set(st.egress.key, e.message);
      }
      if (st.holder) await this.record(st);
    }
    // Only once all are back: a pass that failed half-way re-asserts again.
    this.generation = g;
  }

  /** Writes the decision this node made (or holds) to the store; follows the store if it has a later one. */
  private async record(st: AddressState): Promise<void> {
    const own = st.own;
    const r = await this.o.ownership.record({ ...own, score: scoreOf(own.address, own.owner) });
    if (r === 'superseded') {
      const rec = await this.o.ownership.get(st.egress.key, st.address);
      await this.mutex.run(streamOf(st), () => this.adopt(st, rec, 'store'));
      return;
    }
    if (st.own === own) st.recorded = true;
    if (r === 'recorded') this.o.logger.info('egress: decision recorded in the cluster store', { egress: st.egress.key, address: st.address, owner: own.owner, epoch: own.epoch });
  }

  private recordLater(st: AddressState): void {
    void this.records.run(() => this.record(st)).catch((e) => this.storeFailed(e));
  }

  private async register(): Promise<void> {
    let counters = new Map<string, { flows: bigint; bytes: bigint }>();
    try {
      counters = this.maps?.addressStats() ?? counters;
    } catch {
      // usage is diagnostics
    }
    for (const e of this.egresses.values()) {
      const mine = [...this.gateways.values()].filter((g) => g.egresses.has(e.key)).map((g) => g.info);
      await this.o.ownership.registerGateways(e.key, this.o.node.name, mine, REGISTRY_TTL_MS);
      const usage: Record<string, { flows: number; bytes: number }> = {};
      for (const st of this.addresses.values()) {
        const c = st.egress.key === e.key ? counters.get(st.address) : undefined;
        if (c) usage[st.address] = { flows: Number(c.flows), bytes: Number(c.bytes) };
      }
      if (Object.keys(usage).length) await this.o.ownership.reportUsage(e.key, this.o.node.name, usage, REGISTRY_TTL_MS * 6);
      this.usage.set(e.key, await this.o.ownership.usage(e.key));
    }
    await this.o.ownership.registerNode(this.o.node.name, this.o.node.address, REGISTRY_TTL_MS);
  }

  // ---- liveness --------------------------------------------------------------------------------------

  /** The Egress's candidates: local gateways, the store's registry (last known), and announced ones. */
  private liveRegistry(egress: string): GatewayInfo[] {
    const remote = new Map((this.registry.get(egress) ?? []).filter((g) => g.node !== this.o.node.name).map((g) => [g.pod, g]));
    const now = Date.now();
    for (const [pod, a] of this.announced.get(egress) ?? []) if (a.until > now && !remote.has(pod)) remote.set(pod, a.info);
    const local = [...this.gateways.values()].filter((g) => g.egresses.has(egress)).map((g) => g.info);
    return [...local, ...remote.values()];
  }

  private dropLapsedAnnouncements(): void {
    const now = Date.now();
    for (const [egress, m] of this.announced) {
      for (const [pod, a] of m) if (a.until <= now) m.delete(pod);
      if (!m.size || !this.egresses.has(egress)) this.announced.delete(egress);
    }
  }

  private alive(g: GatewayInfo): boolean {
    if (g.node === this.o.node.name) return this.gateways.has(g.pod);
    return this.peerView(g.nodeAddress) === 'up';
  }

  /**
   * What this node knows of a peer node: 'up' (its BFD session is Up; or, before any session came Up, its
   * authenticated notices arrive, or the session is in its start-up grace), 'down' (its session was Up and
   * went Down), or 'unknown' (no session ever came Up and nothing was heard from it lately).
   */
  private peerView(address: string): 'up' | 'down' | 'unknown' {
    const s = this.bfd.get(address);
    if (s?.state === BfdState.Up) return 'up';
    const info = this.bfdInfo.get(address);
    if (info?.everUp) return 'down';
    const heard = this.heard.get(address);
    if (heard !== undefined && Date.now() - heard < HEARD_MS) return 'up';
    if (!info || Date.now() - info.createdAt < BFD_STARTUP_GRACE_MS) return 'up';
    return 'unknown';
  }

  /**
   * The owner's liveness: its pod when it is local, else its node as this node sees it. An owner this node
   * has never seen alive nor dead ('unknown': a BFD session that never came Up, nothing heard) is not
   * down: a candidate that has not seen the owner never moves it. It counts as gone only when the store,
   * reachable, no longer has it registered (its node stopped registering: dead or cut off); with the store
   * unreachable too, nothing here can tell, and the address stays.
   */
  private ownerAlive(st: AddressState): boolean {
    const o = st.own;
    if (!o.owner) return false;
    const c = st.candidates.find((x) => x.pod === o.owner);
    if (c?.node === this.o.node.name || (!c && o.ownerNode === this.o.node.name)) return this.gateways.has(o.owner);
    const address = c?.nodeAddress ?? o.ownerNodeAddress;
    if (!address) return false;
    const v = this.peerView(address);
    if (v !== 'unknown') return v === 'up';
    if (this.storeDown) return true;
    return (this.registry.get(st.egress.key) ?? []).some((g) => g.pod === o.owner);
  }

  private bfdState(g: GatewayInfo): string {
    if (g.node === this.o.node.name) return 'local';
    const s = this.bfd.get(g.nodeAddress);
    return s ? BfdState[s.state] : 'none';
  }

  /** One BFD session per peer node that hosts a candidate (or the owner) of an Egress this node has gateways for. */
  private ensureBfd(): void {
    if (!this.endpoint) return;
    // Only candidates decide, so only they watch each other; client nodes learn decisions from notices.
    const involved = [...this.egresses.values()].filter((e) => [...this.gateways.values()].some((g) => g.egresses.has(e.key)));
    const peers = new Set(involved.flatMap((e) => this.liveRegistry(e.key).filter((g) => g.node !== this.o.node.name).map((g) => g.nodeAddress)));
    for (const st of this.addresses.values()) {
      if (involved.includes(st.egress) && st.own.ownerNodeAddress && st.own.ownerNode !== this.o.node.name) peers.add(st.own.ownerNodeAddress);
    }
    this.applyBfdTimers();
    const t = this.timers_ ?? { intervalMs: 50, detectMultiplier: 3 };
    for (const peer of peers) {
      if (this.bfd.has(peer)) continue;
      const s = this.endpoint.session(peer, {
        desiredMinTxUs: t.intervalMs * 1000,
        requiredMinRxUs: t.intervalMs * 1000,
        detectMult: t.detectMultiplier,
        auth: this.bfdAuth(),
      });
      const info = { createdAt: Date.now(), everUp: false };
      s.on('down', () => this.requestTick());
      s.on('up', () => {
        info.everUp = true;
        this.requestTick();
      });
      this.bfd.set(peer, s);
      this.bfdInfo.set(peer, info);
    }
  }

  private bfdAuth(): BfdAuthConfig {
    // Meticulous keyed SHA1 with a 20-byte key derived from the cluster key.
    const key = createHmac('sha256', this.o.clusterKey).update('tether bfd').digest().subarray(0, 20);
    return { type: BfdAuthType.MeticulousKeyedSha1, keyId: 1, key };
  }

  // ---- conntrack sync --------------------------------------------------------------------------------

  private async startStreaming(st: AddressState): Promise<void> {
    if (!st.holder || this.o.conntrackSync === false) return;
    const gw = st.holder;
    const events = ConntrackEvents.open(gw.netns);
    // Events are encoded for the wire straight from their netlink bytes; only flows SNATed to this
    // floating address (their reply goes to it) are synced.
    const scope = ipToBytes(st.address);
    events.on('raw', (type: ConntrackEventType, payload: Buffer) => {
      let ev;
      try {
        ev = encodeEventPayload(type, payload, scope);
      } catch (e) {
        // The kernel's own message: should not happen; a resync covers whatever it was.
        this.o.logger.error('egress: conntrack event not encodable; resyncing', { address: st.address, error: (e as Error).message });
        for (const s of st.senders.values()) s.requestResync();
        return;
      }
      if (!ev) return;
      for (const s of st.senders.values()) s.push(ev);
    });
    events.on('overrun', () => {
      for (const s of st.senders.values()) s.requestResync();
    });
    events.on('error', (e: Error) => this.o.logger.error('egress: conntrack events stopped', { address: st.address, error: e.message }));
    st.events = events;
    this.ensureSenders(st);
  }

  /** The owner keeps one sync stream to every other candidate's node; candidates come and go. */
  private ensureSenders(st: AddressState): void {
    if (!st.holder || !st.events) return;
    const gw = st.holder;
    const snapshot = () => ConntrackHandle.with(gw.netns, (h) => h.dump({ family: 4 })).filter((e) => e.reply.dst === st.address);
    const want = new Set(st.candidates.filter((c) => c.node !== this.o.node.name).map((c) => c.nodeAddress));
    for (const peer of want) {
      if (st.senders.has(peer)) continue;
      const s = new SyncSender({ key: this.o.clusterKey, id: this.o.node.name, host: peer, port: this.o.syncPort, stream: streamOf(st), epoch: st.own.epoch, snapshot });
      s.start();
      st.senders.set(peer, s);
    }
    for (const [peer, s] of st.senders) {
      if (want.has(peer)) continue;
      void s.close();
      st.senders.delete(peer);
    }
  }

  /** Detaches the stream at once (a new one may start right away) and closes the old parts after. */
  private async stopStreaming(st: AddressState): Promise<void> {
    const events = st.events;
    const senders = [...st.senders.values()];
    st.events = undefined;
    st.senders.clear();
    await events?.close();
    for (const s of senders) await s.close();
  }

  private periodicResync(): void {
    // Update events only come on state changes; a periodic resync refreshes standby timeouts (UDP).
    for (const st of this.addresses.values()) for (const s of st.senders.values()) s.requestResync();
  }

  /**
   * The local gateways a stream's entries go to: every gateway of its Egress except the one holding that
   * stream's own address (it is the source of truth for it). A gateway holding another address of the
   * Egress is a standby for this one and must have its flows.
   */
  private targetsFor(from: SyncPeerInfo): LocalGateway[] {
    const egress = from.stream.split('|')[0];
    const holder = this.addresses.get(from.stream)?.holder;
    return [...this.gateways.values()].filter((g) => g.egresses.has(egress) && g !== holder);
  }

  private async applySynced(events: ConntrackEvent[], from: SyncPeerInfo): Promise<void> {
    for (const gw of this.targetsFor(from)) this.reportApply(await applySyncedEvents(gw.netns, events), gw, from, 'events');
  }

  private async replaceSynced(entries: ConntrackEntry[], from: SyncPeerInfo): Promise<void> {
    const address = from.stream.split('|')[1];
    for (const gw of this.targetsFor(from)) {
      const t0 = Date.now();
      const r = await replaceSyncedEntries(gw.netns, entries, (e) => e.reply.dst === address);
      this.reportApply(r, gw, from, 'resync');
      this.o.logger.info('egress: conntrack resync applied', {
        pod: gw.info.pod, from: from.id, stream: from.stream, entries: entries.length, created: r.created, updated: r.updated, deleted: r.deleted, failed: r.failed.length, ms: Date.now() - t0,
      });
    }
  }

  /** Entries the kernel refused are logged, not retried: a resync would meet the same refusal. */
  private reportApply(r: ApplyResult, gw: LocalGateway, from: SyncPeerInfo, what: string): void {
    if (!r.failed.length) return;
    const first = r.failed[0];
    this.o.logger.error('egress: synced conntrack entries refused by the kernel', {
      pod: gw.info.pod, from: from.id, stream: from.stream, what, failed: r.failed.length, firstOp: first.op.kind, firstError: first.error.message,
    });
  }
}

/** One floating address of one Egress: its sync stream name and its lock key. */
function streamOf(st: AddressState): string {
  return `${st.egress.key}|${st.address}`;
}

function selects(sel: { namespace: string; matchLabels: Record<string, string> }, ns: string, labels: Record<string, string>): boolean {
  return sel.namespace === ns && Object.entries(sel.matchLabels).every(([k, v]) => labels[k] === v);
}

export function requireClusterKey(raw: string | undefined): Buffer {
  if (!raw) throw new TetherError(ErrorCode.InvalidConfig, '--cluster-key-file is required when Egress objects are configured');
  const key = Buffer.from(raw.trim(), /^[0-9a-f]+$/i.test(raw.trim()) ? 'hex' : 'base64');
  if (key.length < 32) throw new TetherError(ErrorCode.InvalidConfig, `cluster key: ${key.length} bytes; at least 32 are needed`);
  return key;
}
