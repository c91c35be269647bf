// The Egress controller of one node. It follows the pods this tetherd attached and the Egress objects,
// and plays every role the node has:
// - gateway candidate: prepares local gateway pods, registers them cluster-wide, watches peer nodes with
//   BFD, claims a floating address (compare-and-set on its epoch) when the owner is gone, and stands down
//   when a larger epoch names someone else;
// - owner: holds the address on its gateway pod (SNAT, route, announcement) and streams the gateway's
//   conntrack events to the other candidates;
// - standby: inserts the streamed entries into its gateway pods' tables, so takeover finds them there;
// - client node: steers its client pods' traffic in eBPF to the current owner's gateway pod.
// How clients learn a new owner within the failover budget: the owner change is a compare-and-set in the
// shared store that publishes a notice in the same atomic step, and every tetherd subscribes to it (one
// hop, no polling); a periodic re-read catches up after a lost subscription.
import { createHmac } from 'node:crypto';
import * as fs from 'node:fs';
import type { Logger } from '../log';
import { ErrorCode, TetherError } from '../errors';
import type { PodRecord } from '../state/pod-store';
import type { AttachService } from '../pod/attach-service';
import { attachEgressSteer, openEgressMaps, type EgressMaps, type EgressSteer } from '../bpf/egress-steer';
import { BfdAuthType, BfdEndpoint, BfdState, type BfdAuthConfig, type BfdSession } from '../bfd';
import { ConntrackEvents, ConntrackHandle, type ApplyResult, type ConntrackEntry, type ConntrackEvent, type ConntrackEventType } from '../conntrack';
import { applySyncedEvents, encodeEventPayload, replaceSyncedEntries, SyncReceiver, SyncSender, type SyncPeerInfo } from '../conntrack-sync';
import { ipToBytes } from '../netlink/ip-bytes';
import { KeyedMutex } from '../util/keyed-mutex';
import type { ClusterAddresses } from '../../ipam/cluster-addresses';
import { decide, orderCandidates } from './candidates';
import type { ResolvedEgress } from './egress-spec';
import { GatewayDatapath } from './gateway-datapath';
import type { GatewayInfo, Ownership, OwnershipStore } from './ownership-store';

export interface EgressControllerOptions {
  node: { name: string; zone?: string; address: string; uplink: string };
  pinDir: string;
  fouPort: number;
  syncPort: number;
  /** Shared cluster key (≥ 32 bytes): BFD keyed SHA1 and conntrack sync HMAC derive from it. */
  clusterKey: Buffer;
  egresses: ResolvedEgress[];
  ownership: OwnershipStore;
  addresses: ClusterAddresses;
  attach: AttachService;
  logger: Logger;
  /** For the negative control in tests: without sync, takeover loses the connections. */
  conntrackSync?: boolean;
}

interface LocalGateway {
  info: GatewayInfo;
  datapath: GatewayDatapath;
  egresses: Set<string>;
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
  own: Ownership;
  candidates: GatewayInfo[];
  /** The local gateway holding it, when this node owns it. */
  holder?: LocalGateway;
  events?: ConntrackEvents;
  senders: Map<string, SyncSender>;
  lastTakeover?: { at: string; cause: string; ms: number; epoch: number; from: string; to: string };
}

const REGISTRY_TTL_MS = 5000;
/**
 * A peer whose BFD session has not come Up yet (just discovered, or this tetherd just started) counts as
 * alive for this long: otherwise every node would see every other as dead at start and claim.
 */
const BFD_STARTUP_GRACE_MS = 3000;
/**
 * A gateway pod deleted through CNI DEL keeps forwarding (its conntrack and SNAT intact) this long after
 * handing its addresses over, so packets clients sent before they learned the new owner still get
 * through instead of waiting for a TCP retransmission timeout.
 */
const DRAIN_MS = 300;
const TICK_MS = 250;
const RESYNC_EVERY_MS = 30_000;

export class EgressController {
  private readonly egresses = new Map<string, ResolvedEgress>();
  private readonly egressIds = new Map<string, number>();
  private readonly gateways = new Map<string, LocalGateway>();
  private readonly clients = new Map<string, ClientPod>();
  private readonly addresses = new Map<string, AddressState>();
  private readonly bfd = new Map<string, BfdSession>();
  /** What the client steering map holds per Egress (for one log line per change). */
  private readonly steered = new Map<string, string>();
  private readonly bfdInfo = new Map<string, { createdAt: number; everUp: boolean }>();
  private readonly registry = new Map<string, GatewayInfo[]>();
  private readonly mutex = new KeyedMutex();
  private endpoint?: BfdEndpoint;
  private receiver?: SyncReceiver;
  private maps?: EgressMaps;
  private timer?: NodeJS.Timeout;
  private resyncTimer?: NodeJS.Timeout;
  private watcher?: fs.FSWatcher;
  private stopped = false;

  constructor(private readonly o: EgressControllerOptions) {
    o.egresses.forEach((e, i) => {
      this.egresses.set(e.key, e);
      this.egressIds.set(e.key, i + 1);
    });
  }

  async start(): Promise<void> {
    if (!this.egresses.size) return;
    const log = this.o.logger;
    this.endpoint = await BfdEndpoint.open({ address: this.o.node.address });
    this.receiver = new SyncReceiver({
      key: this.o.clusterKey,
      id: this.o.node.name,
      host: this.o.node.address,
      port: this.o.syncPort,
      apply: (events, from) => this.applySynced(events, from),
      replaceAll: (entries, from) => this.replaceSynced(entries, from),
    });
    await this.receiver.listen();
    this.maps = openEgressMaps(this.o.pinDir, { create: true });
    for (const e of this.egresses.values()) {
      const id = this.egressIds.get(e.key)!;
      this.maps.setDestinations(id, e.destinations, e.excluded);
    }
    // Floating addresses are allocated cluster-wide and idempotently: every node asks, all get the same.
    for (const e of this.egresses.values()) {
      const req = 'explicit' in e.addresses ? { pool: e.addresses.pool, owner: `egress/${e.key}`, addresses: e.addresses.explicit } : { pool: e.addresses.pool, owner: `egress/${e.key}`, count: e.addresses.count };
      const { addresses } = await this.o.addresses.allocate(req);
      for (const a of addresses) {
        const own = await this.o.ownership.get(e.key, a);
        this.addresses.set(`${e.key}|${a}`, { egress: e, address: a, own, candidates: [], senders: new Map() });
      }
      log.info('egress: floating addresses', { egress: e.key, addresses });
    }
    this.o.ownership.on('change', (c: Ownership) => void this.onOwnership(c));
    this.o.ownership.on('resync', () => void this.tick());
    this.o.attach.on('attached', (r: PodRecord) => void this.podUp(r));
    this.o.attach.onBeforeDetach((r: PodRecord) => this.podDown(r, 'gateway pod deleted', DRAIN_MS));
    this.o.attach.on('detached', (r: PodRecord) => void this.podDown(r, 'gateway pod deleted'));
    // Pods recorded before a restart whose namespace is gone (killed without a DEL) play no role.
    for (const r of this.o.attach.pods()) if (fs.existsSync(r.netns)) await this.podUp(r);
    this.watchNetns();
    this.timer = setInterval(() => void this.tick(), TICK_MS);
    this.resyncTimer = setInterval(() => this.periodicResync(), RESYNC_EVERY_MS);
    await this.tick();
  }

  async stop(): Promise<void> {
    this.stopped = true;
    clearInterval(this.timer);
    clearInterval(this.resyncTimer);
    this.watcher?.close();
    for (const st of this.addresses.values()) await this.stopStreaming(st);
    await this.receiver?.close();
    await this.endpoint?.close();
    this.maps?.close();
  }

  /** Authentication counters: forged, replayed or garbage BFD packets and sync frames, rejected and counted. */
  security(): Record<string, unknown> {
    return { bfdRejected: this.endpoint?.stats().rejected, syncRejected: this.receiver?.stats().rejected };
  }

  /** Status per floating address: owner, epoch, candidates with their liveness, sync counters, last takeover. */
  status(): Array<Record<string, unknown>> {
    return [...this.addresses.values()].map((st) => ({
      egress: st.egress.key,
      address: st.address,
      owner: st.own.owner,
      epoch: st.own.epoch,
      ownedHere: !!st.holder,
      candidates: st.candidates.map((c) => ({ pod: c.pod, node: c.node, live: this.alive(c), bfd: this.bfdState(c) })),
      sync: st.holder
        ? [...st.senders.entries()].map(([peer, s]) => {
            const x = s.stats();
            return { peer, state: x.state, entriesSent: x.entriesSent, lagEntries: x.lagEntries, lagMs: x.lagMs, resyncs: x.resyncs };
          })
        : this.receiver?.stats().peers.filter((p) => p.stream === streamOf(st)).map((p) => ({ from: p.id, entriesApplied: p.entriesApplied, resyncs: p.resyncs })),
      lastTakeover: st.lastTakeover,
    }));
  }

  // ---- pods ------------------------------------------------------------------------------------------

  private async podUp(r: PodRecord): Promise<void> {
    try {
      await this.podRoles(r);
    } catch (e) {
      // One pod that cannot take its role (gone meanwhile, broken namespace) must not stop the others.
      this.o.logger.error('egress: pod role setup failed', { pod: podKey(r), error: (e as Error).message });
    }
  }

  private async podRoles(r: PodRecord): Promise<void> {
    const pod = podKey(r);
    const ip = r.ips?.find((i) => !i.includes(':'));
    if (!pod || !ip || !r.hostIfName) return;
    const labels = r.labels ?? {};
    const gwOf = [...this.egresses.values()].filter((e) => selects(e.gateways, r.podNamespace!, labels));
    const clientOf = [...this.egresses.values()].filter((e) => selects(e.clients, r.podNamespace!, labels));
    if (gwOf.length) {
      const info: GatewayInfo = { pod, node: this.o.node.name, nodeAddress: this.o.node.address, podIp: ip, zone: this.o.node.zone };
      const datapath = new GatewayDatapath({ pod, netns: r.netns, podIp: ip, ifName: r.ifName, hostIfName: r.hostIfName }, { uplink: this.o.node.uplink, fouPort: this.o.fouPort, pinDir: this.o.pinDir });
      datapath.prepare(await this.nodeAddresses());
      this.gateways.set(pod, { info, datapath, egresses: new Set(gwOf.map((e) => e.key)), netns: r.netns });
      this.o.logger.info('egress: gateway pod ready', { pod, egresses: gwOf.map((e) => e.key) });
      await this.register();
    }
    if (clientOf.length) {
      const egressIds = clientOf.map((e) => this.egressIds.get(e.key)!);
      const steer = attachEgressSteer({ ifName: r.hostIfName, pinDir: this.o.pinDir, nodeAddress: this.o.node.address, port: this.o.fouPort });
      steer.setClient(ip, egressIds);
      this.clients.set(pod, { ip, hostIfName: r.hostIfName, egressIds, steer });
      this.o.logger.info('egress: client pod steered', { pod, egresses: clientOf.map((e) => e.key) });
    }
    await this.tick();
  }

  private async podDown(r: PodRecord, cause: string, drainMs = 0): Promise<void> {
    const pod = podKey(r);
    if (!pod) return;
    const client = this.clients.get(pod);
    if (client) {
      this.maps?.removeClient(client.ip);
      try {
        client.steer?.detach();
      } catch {
        // the veth went with the pod
      }
      this.clients.delete(pod);
    }
    const gw = this.gateways.get(pod);
    if (!gw) return;
    this.gateways.delete(pod);
    // Hand every address it held to the next live candidate at once, instead of waiting for detection;
    // the registry is updated after, so the candidates learn of the handover before they could infer it.
    for (const st of this.addresses.values()) {
      if (st.holder !== gw) continue;
      await this.mutex.run(streamOf(st), async () => {
        st.holder = undefined;
        const next = orderCandidates(st.address, this.liveRegistry(st.egress.key)).find((c) => c.pod !== pod && this.alive(c));
        if (next) await this.claim(st, next.pod, `handover: ${cause} (${pod})`);
        gw.datapath.withdrawAnnouncement(st.address);
        // Closing the event reader waits out its receive timeout: not on the handover's critical path.
        void this.stopStreaming(st);
      });
    }
    await this.register();
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
      this.watcher = fs.watch('/run/netns', () => void this.dropVanishedGateways());
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

  private async tick(): Promise<void> {
    if (this.stopped) return;
    try {
      await this.dropVanishedGateways();
      await this.register();
      for (const e of this.egresses.values()) this.registry.set(e.key, await this.o.ownership.listGateways(e.key));
      this.ensureBfd();
      for (const st of this.addresses.values()) await this.mutex.run(streamOf(st), () => this.evaluate(st));
    } catch (e) {
      this.o.logger.warn('egress: reconcile failed; retrying', { error: (e as Error).message });
    }
  }

  private async evaluate(st: AddressState): Promise<void> {
    st.candidates = orderCandidates(st.address, this.liveRegistry(st.egress.key));
    const local = new Set([...this.gateways.values()].filter((g) => g.egresses.has(st.egress.key)).map((g) => g.info.pod));
    const d = decide(st.own, st.candidates, local, (g) => this.alive(g), !!st.holder);
    if (d.action === 'claim') await this.claim(st, d.pod, d.cause);
    else if (d.action === 'standDown') await this.standDown(st, `epoch ${st.own.epoch} names ${st.own.owner}`);
    else if (st.own.owner && local.has(st.own.owner) && !st.holder) await this.become(st, this.gateways.get(st.own.owner)!, 'restart: resuming ownership');
    this.ensureSenders(st);
    this.updateClients(st);
  }

  private async claim(st: AddressState, pod: string, cause: string): Promise<void> {
    const t0 = Date.now();
    const res = await this.o.ownership.claim(st.egress.key, st.address, pod, st.own.epoch, cause);
    if (!res.won) {
      this.o.logger.info('egress: claim lost, someone else took it', { egress: st.egress.key, address: st.address, tried: pod, owner: res.owner, epoch: res.epoch });
      st.own = { ...st.own, owner: res.owner, epoch: res.epoch };
      return;
    }
    const from = st.own.owner;
    st.own = { egress: st.egress.key, address: st.address, owner: res.owner, epoch: res.epoch, cause };
    const gw = this.gateways.get(pod);
    if (gw) await this.become(st, gw, cause);
    st.lastTakeover = { at: new Date().toISOString(), cause, ms: Date.now() - t0, epoch: res.epoch, from, to: pod };
    this.o.logger.info('egress: ownership changed', { egress: st.egress.key, address: st.address, from, to: pod, epoch: res.epoch, cause, ms: Date.now() - t0 });
    this.updateClients(st);
  }

  private async onOwnership(c: Ownership): Promise<void> {
    const st = this.addresses.get(`${c.egress}|${c.address}`);
    if (!st || c.epoch < st.own.epoch) return;
    await this.mutex.run(streamOf(st), async () => {
      const prev = st.own;
      st.own = c;
      if (st.holder && st.holder.info.pod !== c.owner) await this.standDown(st, `epoch ${c.epoch} names ${c.owner}`);
      const gw = this.gateways.get(c.owner);
      if (gw && !st.holder) {
        await this.become(st, gw, c.cause ?? 'notice');
        st.lastTakeover = { at: new Date().toISOString(), cause: c.cause ?? '', ms: 0, epoch: c.epoch, from: prev.owner, to: c.owner };
      }
      this.updateClients(st);
    });
  }

  private async become(st: AddressState, gw: LocalGateway, cause: string): Promise<void> {
    gw.datapath.own(st.address, st.egress.announce);
    st.holder = gw;
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

  private updateClients(st: AddressState): void {
    if (!this.maps || ![...this.clients.values()].some((c) => c.egressIds.includes(this.egressIds.get(st.egress.key)!))) return;
    const id = this.egressIds.get(st.egress.key)!;
    const slots: Array<{ gatewayIp: string; floatingIp: string; epoch: number }> = [];
    for (const a of this.addresses.values()) {
      if (a.egress.key !== st.egress.key || !a.own.owner) continue;
      const g = this.liveRegistry(a.egress.key).find((x) => x.pod === a.own.owner);
      if (!g) {
        // The new owner is not in this node's copy of the registry yet: keep steering to the previous
        // slots (the old owner's traffic is dropped at worst, never sent unNATed) and fetch it now.
        void this.refreshRegistry(a.egress.key).then(() => this.updateClients(a));
        return;
      }
      slots.push({ gatewayIp: g.podIp, floatingIp: a.address, epoch: a.own.epoch });
    }
    this.maps.setGateways(id, slots);
    const now = slots.map((x) => `${x.floatingIp}→${x.gatewayIp}@${x.epoch}`).join(',');
    if (this.steered.get(st.egress.key) !== now) {
      this.steered.set(st.egress.key, now);
      this.o.logger.info('egress: client steering updated', { egress: st.egress.key, slots });
    }
  }

  private async refreshRegistry(egress: string): Promise<void> {
    try {
      this.registry.set(egress, await this.o.ownership.listGateways(egress));
    } catch (e) {
      this.o.logger.warn('egress: gateway registry unreachable', { egress, error: (e as Error).message });
    }
  }

  // ---- liveness --------------------------------------------------------------------------------------

  private liveRegistry(egress: string): GatewayInfo[] {
    const remote = (this.registry.get(egress) ?? []).filter((g) => g.node !== this.o.node.name);
    const local = [...this.gateways.values()].filter((g) => g.egresses.has(egress)).map((g) => g.info);
    return [...local, ...remote];
  }

  private alive(g: GatewayInfo): boolean {
    if (g.node === this.o.node.name) return this.gateways.has(g.pod);
    const s = this.bfd.get(g.nodeAddress);
    if (s?.state === BfdState.Up) return true;
    const info = this.bfdInfo.get(g.nodeAddress);
    // Not yet known either way: alive during the start-up grace, dead once it was Up and went Down.
    return !info || (!info.everUp && Date.now() - info.createdAt < BFD_STARTUP_GRACE_MS);
  }

  private bfdState(g: GatewayInfo): string {
    if (g.node === this.o.node.name) return 'local';
    const s = this.bfd.get(g.nodeAddress);
    return s ? BfdState[s.state] : 'none';
  }

  /** One BFD session per peer node that hosts a candidate of an Egress this node takes part in. */
  private ensureBfd(): void {
    if (!this.endpoint) return;
    const involved = [...this.egresses.values()].filter((e) => [...this.gateways.values()].some((g) => g.egresses.has(e.key)) || [...this.clients.values()].some((c) => c.egressIds.includes(this.egressIds.get(e.key)!)));
    const peers = new Set(involved.flatMap((e) => (this.registry.get(e.key) ?? []).filter((g) => g.node !== this.o.node.name).map((g) => g.nodeAddress)));
    const e0 = involved[0] ?? [...this.egresses.values()][0];
    for (const peer of peers) {
      if (this.bfd.has(peer)) continue;
      const s = this.endpoint.session(peer, {
        desiredMinTxUs: e0.failover.intervalMs * 1000,
        requiredMinRxUs: e0.failover.intervalMs * 1000,
        detectMult: e0.failover.detectMultiplier,
        auth: this.bfdAuth(),
      });
      const info = { createdAt: Date.now(), everUp: false };
      s.on('down', () => void this.tick());
      s.on('up', () => {
        info.everUp = true;
        void this.tick();
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

  private async register(): Promise<void> {
    for (const e of this.egresses.values()) {
      const mine = [...this.gateways.values()].filter((g) => g.egresses.has(e.key)).map((g) => g.info);
      await this.o.ownership.registerGateways(e.key, this.o.node.name, mine, REGISTRY_TTL_MS);
    }
    await this.o.ownership.registerNode(this.o.node.name, this.o.node.address, REGISTRY_TTL_MS);
  }

  private async nodeAddresses(): Promise<string[]> {
    return this.o.ownership.listNodes();
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

  private targetsFor(from: SyncPeerInfo): LocalGateway[] {
    const egress = from.stream.split('|')[0];
    return [...this.gateways.values()].filter((g) => g.egresses.has(egress) && !this.isHolder(g));
  }

  private isHolder(g: LocalGateway): boolean {
    return [...this.addresses.values()].some((st) => st.holder === g);
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

function podKey(r: Pick<PodRecord, 'podNamespace' | 'podName'>): string | undefined {
  return r.podNamespace && r.podName ? `${r.podNamespace}/${r.podName}` : undefined;
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
