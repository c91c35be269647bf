// Peer liveness for the Egress controller: which gateway candidates exist (local pods, the store's registry,
// announcements from their nodes), and whether each is alive (BFD sessions, authenticated notices heard).
// Every peer address this node connects to (BFD, sync streams, notices) is asked of reachable() here first.
import { createHmac } from 'node:crypto';
import { ipFamily } from '../../lib/ip';
import { BfdAuthType, BfdState, type BfdAuthConfig } from '../bfd';
import { type BfdPeer } from '../bfd/threaded';
import { type GatewayAnnouncement } from './ownership-notice';
import { type GatewayInfo } from './ownership-store';
import { type EgressShared, type AddressState, BFD_STARTUP_GRACE_MS, HEARD_MS, ANNOUNCED_TTL_MS } from './egress-state';

/** How long after a BFD session ended on its own a new one to that peer is started. */
export const BFD_RETRY_MS = 1000;

export class PeerLiveness {
  /** `requestTick`: a candidate was learned, or a peer's BFD session went Up or Down (the election looks again). */
  constructor(private readonly s: EgressShared, private readonly requestTick: () => void) {}

  private readonly bfd = new Map<string, BfdPeer>();

  private readonly bfdInfo = new Map<string, { createdAt: number; everUp: boolean }>();

  /** Peers whose session ended without being asked to (it could not start in the BFD thread): not before then. */
  private readonly bfdRetryAt = new Map<string, number>();

  /**
   * Gateways their own nodes announced in notices, by Egress then pod, with when the announcement lapses:
   * candidates are learned from each other, not only from the store (which may be down when one joins).
   */
  private readonly announced = new Map<string, Map<string, { info: GatewayInfo; until: number }>>();

  /**
   * Nodes with client pods of an Egress, by Egress then node address, with when their word lapses: an
   * owner repeats its ownership to them (and to the candidates), not to every node.
   */
  private readonly clientNodes = new Map<string, Map<string, number>>();

  /** When an authentic notice last came from a node's address (a sign of life while BFD is not Up). */
  readonly heard = new Map<string, number>();

  /** Senders refused for naming an address that is not theirs, or for being unknown (logged once each). */
  private readonly refusedSenders = new Set<string>();

  /** Peers skipped for a node address of the other family (logged once each): by address, their node. */
  private readonly otherFamily = new Map<string, string>();

  /** BFD timers in force (the fastest of the Egresses this node serves). */
  private timers_: { intervalMs: number; detectMultiplier: number } | undefined;

  /** BFD runs at the fastest failover timers of the Egresses this node serves; a change is a Poll Sequence, not a restart. */
  applyBfdTimers(): void {
    const t = this.bfdTimers();
    if (!t || (this.timers_ && this.timers_.intervalMs === t.intervalMs && this.timers_.detectMultiplier === t.detectMultiplier)) return;
    const first = !this.timers_;
    this.timers_ = t;
    if (first) return;
    for (const s of this.bfd.values()) s.setTimers({ desiredMinTxUs: t.intervalMs * 1000, requiredMinRxUs: t.intervalMs * 1000, detectMult: t.detectMultiplier });
    this.s.o.logger.info('egress: BFD timers changed', { intervalMs: t.intervalMs, detectMultiplier: t.detectMultiplier, sessions: this.bfd.size });
  }

  private bfdTimers(): { intervalMs: number; detectMultiplier: number } | undefined {
    const all = [...this.s.egresses.values()].map((e) => e.failover);
    if (!all.length) return this.timers_;
    const intervalMs = Math.min(...all.map((f) => f.intervalMs));
    const detectMultiplier = Math.min(...all.filter((f) => f.intervalMs === intervalMs).map((f) => f.detectMultiplier));
    return { intervalMs, detectMultiplier };
  }

  /**
   * Gateways a node announced: candidates until ANNOUNCED_TTL_MS after its last announcement. Accepted only
   * from the node's own address; a node not known otherwise becomes known this way (the notice is
   * authenticated with the cluster key), which is how candidates find each other while the store is down.
   */
  onAnnounced(list: GatewayAnnouncement[], from: string, address: string): void {
    const until = Date.now() + ANNOUNCED_TTL_MS;
    let added = false;
    for (const a of list) {
      if (a.nodeAddress !== address || a.node === this.s.o.node.name) {
        this.refuseSender(`${from}|${address}|gateways`, 'egress: gateway announcement refused; nothing in it applied', {
          from, address, pod: a.pod, egress: a.egress, why: a.node === this.s.o.node.name ? `names this node (${a.node})` : `names node address ${a.nodeAddress}, but came from ${address}`,
        });
        return;
      }
    }
    for (const a of list) {
      if (!this.s.egresses.has(a.egress)) continue;
      let m = this.announced.get(a.egress);
      if (!m) this.announced.set(a.egress, (m = new Map()));
      const { egress: _egress, ...info } = a;
      if (!m.has(a.pod) && !(this.s.registry.get(a.egress) ?? []).some((g) => g.pod === a.pod)) {
        added = true;
        this.s.o.logger.info('egress: gateway candidate learned from its node', { egress: a.egress, pod: a.pod, node: a.node, nodeAddress: address });
      }
      m.set(a.pod, { info, until });
    }
    if (added) this.requestTick();
  }

  /** A node said it has client pods of these Egresses (an authenticated notice from its own address). */
  onClients(egresses: string[], address: string): void {
    const until = Date.now() + ANNOUNCED_TTL_MS;
    for (const e of egresses) {
      if (!this.s.egresses.has(e) || address === this.s.o.node.address) continue;
      let m = this.clientNodes.get(e);
      if (!m) this.clientNodes.set(e, (m = new Map()));
      m.set(address, until);
    }
  }

  /** The node addresses that said, within ANNOUNCED_TTL_MS, that they have client pods of `egress`. */
  clientNodesOf(egress: string): string[] {
    const now = Date.now();
    return [...(this.clientNodes.get(egress) ?? [])].filter(([, until]) => until > now).map(([a]) => a);
  }

  /**
   * Where an owner's heartbeat for `egress` goes: the Egress's other candidates (standbys, failover) and the
   * nodes of its clients (they steer to the owner). Nodes with no part in it learn of a change of owner from
   * the notice sent to every node when it happens, and from the store.
   */
  heartbeatPeers(egress: string): Set<string> {
    const out = this.gatewayPeers(egress);
    for (const a of this.clientNodesOf(egress)) out.add(a);
    out.delete(this.s.o.node.address);
    return out;
  }

  /**
   * The nodes this node's gateways and clients of `egress` tell of themselves each second: the Egress's
   * other candidates and its addresses' owners, those this node can reach.
   */
  gatewayPeers(egress: string): Set<string> {
    const peers = new Map(this.liveRegistry(egress).filter((g) => g.node !== this.s.o.node.name).map((g) => [g.nodeAddress, g.node]));
    for (const st of this.s.addresses.values()) {
      if (st.egress.key === egress && st.own.ownerNodeAddress && !peers.has(st.own.ownerNodeAddress)) peers.set(st.own.ownerNodeAddress, st.own.ownerNode ?? '');
    }
    peers.delete(this.s.o.node.address);
    return new Set([...peers].filter(([a, node]) => this.reachable(a, node)).map(([a]) => a));
  }

  /**
   * Whether this node can reach a peer's node address: one of its own underlay's family. A node of the
   * other family (a cluster moving between underlays, or a misconfigured --node-address) cannot be reached
   * by any socket of this node (each is bound to its node address): no BFD session, sync stream or notice is
   * started to it, it is logged once, and status lists it (skippedPeers()). It is never seen alive from here
   * (peerView), so this node neither hands an address to it nor counts on it.
   */
  reachable(address: string, node?: string): boolean {
    if (ipFamily(address) === ipFamily(this.s.o.node.address)) return true;
    if (!this.otherFamily.has(address)) {
      const name = node || this.nodeOf(address);
      this.otherFamily.set(address, name);
      this.s.o.logger.warn('egress: peer node skipped: node underlays of different families: not reachable from here', {
        node: name, nodeAddress: address, thisNode: this.s.o.node.name, thisNodeAddress: this.s.o.node.address,
      });
    }
    return false;
  }

  /** The known peers this node skips for a node address of the other family (status): node, address and why. */
  skippedPeers(): Array<{ node: string; nodeAddress: string; why: string }> {
    return [...this.knownPeers()].filter(([a]) => ipFamily(a) !== ipFamily(this.s.o.node.address)).sort(([a], [b]) => (a < b ? -1 : 1))
      .map(([nodeAddress, node]) => ({ node: node || this.otherFamily.get(nodeAddress) || '', nodeAddress, why: 'node underlays of different families: not reachable from here' }));
  }

  /** Logs a refused sender once per kind (the channel counts every refusal). */
  refuseSender(key: string, msg: string, fields: Record<string, unknown>): void {
    if (this.refusedSenders.has(key)) return;
    this.refusedSenders.add(key);
    this.s.o.logger.warn(msg, fields);
  }

  /** A node address this node knows: the store's node list, a registered or announced gateway's, an owner's. */
  knownNode(address: string): boolean {
    if (this.nodeSet(this.s.nodes).has(address)) return true;
    for (const list of this.s.registry.values()) if (list.some((g) => g.nodeAddress === address)) return true;
    for (const m of this.announced.values()) for (const a of m.values()) if (a.info.nodeAddress === address) return true;
    for (const st of this.s.addresses.values()) if (st.own.ownerNodeAddress === address) return true;
    return false;
  }

  /** Every peer node this node can reach: where a change of owner is sent. */
  peerAddresses(): string[] {
    return [...this.knownPeers()].filter(([a, node]) => this.reachable(a, node)).map(([a]) => a);
  }

  /**
   * Every other node this node knows by its node address, with its name where known: the registered nodes
   * (their node addresses, not the IPv6 ones registered beside IPv4 ones for FoU), registered and
   * announced gateways' nodes, and owners' nodes.
   */
  private knownPeers(): Map<string, string> {
    const out = new Map(this.s.nodeNames);
    const add = (a: string, node: string | undefined) => {
      if (!out.get(a)) out.set(a, node ?? '');
    };
    for (const list of this.s.registry.values()) for (const g of list) add(g.nodeAddress, g.node);
    for (const m of this.announced.values()) for (const a of m.values()) add(a.info.nodeAddress, a.info.node);
    for (const st of this.s.addresses.values()) if (st.own.ownerNodeAddress) add(st.own.ownerNodeAddress, st.own.ownerNode);
    out.delete(this.s.o.node.address);
    return out;
  }

  /** A peer's node name from what this node knows ('' when only its address is known). */
  private nodeOf(address: string): string {
    return this.knownPeers().get(address) ?? '';
  }

  /** The Egress's candidates: local gateways, the store's registry (last known), and announced ones. */
  liveRegistry(egress: string): GatewayInfo[] {
    const remote = new Map((this.s.registry.get(egress) ?? []).filter((g) => g.node !== this.s.o.node.name).map((g) => [g.pod, g]));
    const now = Date.now();
    for (const [pod, a] of this.announced.get(egress) ?? []) if (a.until > now && !remote.has(pod)) remote.set(pod, a.info);
    const local = [...this.s.gateways.values()].filter((g) => g.egresses.has(egress)).map((g) => g.info);
    return [...local, ...remote.values()];
  }

  /** The store's node list as a set (kept while the list is the same array). */
  private nodeSet(nodes: string[]): Set<string> {
    if (this.nodeSetOf !== nodes) {
      this.nodeSetOf = nodes;
      this.nodeSet_ = new Set(nodes);
    }
    return this.nodeSet_;
  }
  private nodeSetOf?: string[];
  private nodeSet_ = new Set<string>();

  dropLapsedAnnouncements(): void {
    const now = Date.now();
    for (const [egress, m] of this.clientNodes) {
      for (const [a, until] of m) if (until <= now) m.delete(a);
      if (!m.size || !this.s.egresses.has(egress)) this.clientNodes.delete(egress);
    }
    for (const [egress, m] of this.announced) {
      for (const [pod, a] of m) if (a.until <= now) m.delete(pod);
      if (!m.size || !this.s.egresses.has(egress)) this.announced.delete(egress);
    }
  }

  alive(g: GatewayInfo): boolean {
    if (g.node === this.s.o.node.name) return this.s.gateways.has(g.pod);
    return this.peerView(g.nodeAddress) === 'up';
  }

  /**
   * What this node knows of a peer node: 'up' (its BFD session is Up; or, before any session came Up, its
   * authenticated notices arrive, or the session is in its start-up grace), 'down' (its session was Up and
   * went Down), or 'unknown' (no session ever came Up and nothing was heard from it lately).
   */
  private peerView(address: string): 'up' | 'down' | 'unknown' {
    // No session is started with a node of the other underlay family and nothing comes from it.
    if (ipFamily(address) !== ipFamily(this.s.o.node.address)) return 'unknown';
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
  ownerAlive(st: AddressState): boolean {
    const o = st.own;
    if (!o.owner) return false;
    const c = st.candidates.find((x) => x.pod === o.owner);
    if (c?.node === this.s.o.node.name || (!c && o.ownerNode === this.s.o.node.name)) return this.s.gateways.has(o.owner);
    const address = c?.nodeAddress ?? o.ownerNodeAddress;
    if (!address) return false;
    const v = this.peerView(address);
    if (v !== 'unknown') return v === 'up';
    if (this.s.storeDown) return true;
    return (this.s.registry.get(st.egress.key) ?? []).some((g) => g.pod === o.owner);
  }

  bfdState(g: GatewayInfo): string {
    if (g.node === this.s.o.node.name) return 'local';
    if (ipFamily(g.nodeAddress) !== ipFamily(this.s.o.node.address)) return 'otherFamily';
    const s = this.bfd.get(g.nodeAddress);
    return s ? BfdState[s.state] : 'none';
  }

  /** One BFD session per peer node that hosts a candidate (or the owner) of an Egress this node has gateways for. */
  ensureBfd(): void {
    if (!this.s.endpoint) return;
    // Only candidates decide, so only they watch each other; client nodes learn decisions from notices.
    const involved = [...this.s.egresses.values()].filter((e) => [...this.s.gateways.values()].some((g) => g.egresses.has(e.key)));
    const peers = new Map(involved.flatMap((e) => this.liveRegistry(e.key).filter((g) => g.node !== this.s.o.node.name).map((g) => [g.nodeAddress, g.node] as const)));
    for (const st of this.s.addresses.values()) {
      if (involved.includes(st.egress) && st.own.ownerNodeAddress && st.own.ownerNode !== this.s.o.node.name && !peers.has(st.own.ownerNodeAddress)) {
        peers.set(st.own.ownerNodeAddress, st.own.ownerNode ?? '');
      }
    }
    this.applyBfdTimers();
    const t = this.timers_ ?? { intervalMs: 50, detectMultiplier: 3 };
    const now = Date.now();
    for (const [peer, node] of peers) {
      if (this.bfd.has(peer) || !this.reachable(peer, node) || (this.bfdRetryAt.get(peer) ?? 0) > now) continue;
      this.bfdRetryAt.delete(peer);
      const s = this.s.endpoint.session(peer, {
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
      // A session that ends on its own (the BFD thread could not start it) is started again after
      // BFD_RETRY_MS: left in the map, the peer would never have a session and so never count as alive.
      s.once('close', () => {
        if (this.bfd.get(peer) !== s) return;
        this.bfd.delete(peer);
        this.bfdInfo.delete(peer);
        this.bfdRetryAt.set(peer, Date.now() + BFD_RETRY_MS);
        this.s.o.logger.warn('egress: BFD session to peer ended; starting it again', { peer, node, inMs: BFD_RETRY_MS });
        setTimeout(() => this.requestTick(), BFD_RETRY_MS).unref();
      });
      this.bfd.set(peer, s);
      this.bfdInfo.set(peer, info);
    }
  }

  private bfdAuth(): BfdAuthConfig {
    // Meticulous keyed SHA1 with a 20-byte key derived from the cluster key.
    const key = createHmac('sha256', this.s.o.clusterKey).update('tether bfd').digest().subarray(0, 20);
    return { type: BfdAuthType.MeticulousKeyedSha1, keyId: 1, key };
  }
}
