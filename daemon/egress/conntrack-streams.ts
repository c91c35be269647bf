// Conntrack state sync for the Egress controller: the owner streams its gateway's conntrack events to the
// other candidates' nodes; a standby applies what it receives to its own gateway pods.
//
// One event socket per gateway namespace, however many floating addresses it holds: events are encoded
// once and handed to the address their reply goes to. Per address, the bucket digests of the owner's
// table are computed once for all its peers and kept until an event of that address arrives (an owner
// whose table did not change dumps nothing for a check). Nothing is re-sent periodically in full:
// checkConsistency(), every CONSISTENCY_EVERY_MS, compares bucket digests instead.
import { ConntrackEvents, type ApplyResult, type ConntrackEventType } from '../conntrack';
import {
  applyWireList, DigestCache, Digests, dumpScopeEncoded, scopeDigests, encodeEventAt, MAX_EVENT_BYTES, replyDstIs, STANDBY_MIN_TIMEOUT, StandbyDigests, SyncSender, syncedDigests, sweepSyncedEntries,
  type BucketSet, type KeySet, type SyncPeerInfo, type WireList,
} from '../conntrack-sync';
import { ipToBytes } from '../../lib/ip';
import { type EgressShared, streamOf, type AddressState, type LocalGateway, IN_SYNC_MAX_LAG } from './egress-state';
import type { PeerLiveness } from './peer-liveness';

/** The shared event socket of one gateway namespace and the addresses streaming from it. */
interface NsEvents {
  events: ConntrackEvents;
  /** Address bytes (latin1) → the address streaming from this namespace. */
  byAddress: Map<string, AddressState>;
  /** The same as a list of (address bytes, address), matched against each event's bytes in place. */
  scopes: Array<{ bytes: Buffer; st: AddressState }>;
}

/** Owner digests are computed again at least this often even without events (insurance, not needed). */
const OWNER_DIGEST_MAX_AGE_MS = 300_000;

function scopesOf(byAddress: Map<string, AddressState>): NsEvents['scopes'] {
  return [...byAddress].map(([k, st]) => ({ bytes: Buffer.from(k, 'latin1'), st }));
}

export class ConntrackStreams {
  private readonly namespaces = new Map<string, NsEvents>();
  /** The owner's digests per address, valid until the next event of that address. */
  private readonly digestCache = new DigestCache<AddressState, Digests>(OWNER_DIGEST_MAX_AGE_MS);
  /** This node's digests per received stream and set of target pods, until written to (or re-armed). */
  private readonly standbyDigests = new StandbyDigests();

  constructor(private readonly s: EgressShared, private readonly peers: Pick<PeerLiveness, 'reachable'>) {}

  /** Event sockets open (one per gateway namespace that holds a streaming address). */
  get eventSockets(): number {
    return this.namespaces.size;
  }

  /** Nodes whose sync stream from here is streaming with little lag: their standbys have the connections. */
  computeInSync(st: AddressState): string[] {
    const byAddress = new Map(st.candidates.map((c) => [c.nodeAddress, c.node]));
    const out: string[] = [];
    for (const [peer, s] of st.senders) {
      const x = s.stats();
      const node = byAddress.get(peer);
      if (node && x.state === 'streaming' && x.lagEntries < IN_SYNC_MAX_LAG) out.push(node);
    }
    return out.sort();
  }

  /** The holder's view of each standby's stream (logged when a handover must wait for one). */
  syncStates(st: AddressState): Array<Record<string, unknown>> {
    const byAddress = new Map(st.candidates.map((c) => [c.nodeAddress, c.node]));
    return [...st.senders].map(([peer, s]) => {
      const x = s.stats();
      return { node: byAddress.get(peer), peer, state: x.state, lagEntries: x.lagEntries, version: x.version, rejected: x.lastRejected?.reason, why: x.lastRejected?.message };
    });
  }

  async startStreaming(st: AddressState): Promise<void> {
    if (!st.holder || this.s.o.conntrackSync === false) return;
    const ns = this.eventsOf(st.holder.netns);
    ns.byAddress.set(ipToBytes(st.address).toString('latin1'), st);
    ns.scopes = scopesOf(ns.byAddress);
    st.events = ns.events;
    this.ensureSenders(st);
  }

  /** The namespace's shared event socket, opened on first use. */
  private eventsOf(netns: string): NsEvents {
    const have = this.namespaces.get(netns);
    if (have) return have;
    const events = ConntrackEvents.open(netns);
    const ns: NsEvents = { events, byAddress: new Map(), scopes: [] };
    const all = () => [...ns.byAddress.values()];
    const resyncAll = () => {
      for (const st of all()) {
        this.digestCache.invalidate(st);
        for (const s of st.senders.values()) s.requestResync();
      }
    };
    // Events are encoded for the wire straight from their netlink bytes, in place in the event ring, into
    // one scratch buffer (no object per event); only flows SNATed to a floating address of this namespace
    // (their reply goes to it) are synced, to that address's peers, which copy the bytes into their queues.
    const scratch = Buffer.allocUnsafe(MAX_EVENT_BYTES);
    events.sink((type: ConntrackEventType, buf: Buffer, start: number, end: number) => {
      let n;
      try {
        n = encodeEventAt(buf, start, end, undefined, scratch, 0);
      } catch (e) {
        // The kernel's own message: should not happen; a resync covers whatever it was.
        this.s.o.logger.error('egress: conntrack event not encodable; resyncing', { netns, addresses: all().map((st) => st.address), error: (e as Error).message });
        return resyncAll();
      }
      for (const { bytes, st } of ns.scopes) {
        if (!replyDstIs(scratch, 0, bytes)) continue;
        this.digestCache.invalidate(st);
        for (const s of st.senders.values()) s.pushEncoded(type, scratch, 0, n);
        return;
      }
    });
    events.on('overrun', resyncAll);
    events.on('error', (e: Error) => this.s.o.logger.error('egress: conntrack events stopped', { netns, addresses: all().map((st) => st.address), error: e.message }));
    this.namespaces.set(netns, ns);
    return ns;
  }

  /** The owner's digests of one address's flows, shared by its senders (one dump per change, not per peer). */
  private ownerDigests(st: AddressState, netns: string, k: number): Promise<Digests> {
    return this.digestCache.get(st, k, () => scopeDigests(netns, st.address.includes(':') ? 6 : 4, (e) => e.reply.dst === st.address, k));
  }

  /** The owner keeps one sync stream to every other candidate's node; candidates come and go. */
  ensureSenders(st: AddressState): void {
    if (!st.holder || !st.events) return;
    const gw = st.holder;
    // Read in slices: a large table does not hold the loop (and the sync heartbeats) for seconds.
    // Each dump message goes straight to its wire form: no object per entry, even at a million.
    const snapshot = () => dumpScopeEncoded(gw.netns, st.address.includes(':') ? 6 : 4, ipToBytes(st.address));
    const digests = (k: number) => this.ownerDigests(st, gw.netns, k);
    // A candidate whose node this node cannot reach (the other underlay family) gets no stream.
    const want = new Set(st.candidates.filter((c) => c.node !== this.s.o.node.name && this.peers.reachable(c.nodeAddress, c.node)).map((c) => c.nodeAddress));
    for (const peer of want) {
      if (st.senders.has(peer)) continue;
      const s = new SyncSender({ key: this.s.o.clusterKey, id: this.s.o.node.name, host: peer, port: this.s.o.syncPort, stream: streamOf(st), epoch: st.own.epoch, snapshot, digests });
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
  async stopStreaming(st: AddressState): Promise<void> {
    const events = st.events;
    const senders = [...st.senders.values()];
    st.events = undefined;
    st.senders.clear();
    this.digestCache.invalidate(st);
    let close: Promise<void> | undefined;
    for (const [netns, ns] of this.namespaces) {
      if (ns.events !== events) continue;
      for (const [k, x] of ns.byAddress) if (x === st) ns.byAddress.delete(k);
      ns.scopes = scopesOf(ns.byAddress);
      // The namespace's socket closes with its last address.
      if (ns.byAddress.size === 0) {
        this.namespaces.delete(netns);
        close = ns.events.close();
      }
    }
    await close;
    for (const s of senders) await s.close();
  }

  /**
   * The periodic consistency check (no full re-send): every sender sends its address's bucket digests,
   * and only buckets a standby holds differently travel again. Standby copies need no periodic refresh
   * from here: they live STANDBY_MIN_TIMEOUT and the standby re-arms them during its side of the check.
   */
  checkConsistency(): void {
    for (const st of this.s.addresses.values()) for (const s of st.senders.values()) s.checkConsistency();
  }

  /**
   * The local gateways a stream's entries go to: every gateway of its Egress except the one holding that
   * stream's own address (it is the source of truth for it). A gateway holding another address of the
   * Egress is a standby for this one and must have its flows.
   */
  private targetsFor(from: SyncPeerInfo): LocalGateway[] {
    const egress = from.stream.split('|')[0];
    const holder = this.s.addresses.get(from.stream)?.holder;
    return [...this.s.gateways.values()].filter((g) => g.egresses.has(egress) && g !== holder);
  }

  /** A frame of events (new, update, destroy), written from its wire bytes. */
  async applySynced(events: WireList, from: SyncPeerInfo): Promise<void> {
    this.forget(from);
    for (const gw of this.targetsFor(from)) this.reportApply(await applyWireList(gw.netns, events, STANDBY_MIN_TIMEOUT), gw, from, 'events');
  }

  /** A chunk of a transfer, written as it arrives (every entry created, or updated where it exists). */
  async upsertSynced(entries: WireList, from: SyncPeerInfo): Promise<void> {
    this.forget(from);
    for (const gw of this.targetsFor(from)) this.reportApply(await applyWireList(gw.netns, entries, STANDBY_MIN_TIMEOUT), gw, from, 'transfer');
  }

  /** The end of a transfer: the address's entries in its buckets that it did not carry go. */
  async sweepSynced(keep: KeySet, buckets: BucketSet, from: SyncPeerInfo): Promise<number> {
    const address = from.stream.split('|')[1];
    let deleted = 0;
    this.forget(from);
    for (const gw of this.targetsFor(from)) {
      const t0 = Date.now();
      const r = await sweepSyncedEntries(gw.netns, (e) => e.reply.dst === address, keep, buckets);
      this.reportApply(r, gw, from, 'sweep');
      deleted += r.deleted;
      this.s.o.logger.info('egress: conntrack transfer applied', {
        pod: gw.info.pod, from: from.id, stream: from.stream, transferred: keep.size, buckets: buckets.list ? buckets.list.length : 'all', deleted: r.deleted, failed: r.failed.length, ms: Date.now() - t0,
      });
    }
    return deleted;
  }

  /**
   * This node's side of a consistency check: digests of what its standbys hold of the address (buckets
   * differing in any of them count), re-arming copies that would otherwise expire.
   */
  async syncedDigests(k: number, from: SyncPeerInfo): Promise<Digests | undefined> {
    const address = from.stream.split('|')[1];
    const targets = this.targetsFor(from);
    // Kept while nothing was written for the stream and its target pods are the same ones.
    const key = `${from.stream}#${targets.map((g) => g.netns).sort().join(',')}`;
    return this.standbyDigests.get(key, k, async () => {
      let out: Digests | undefined;
      for (const gw of targets) {
        const { digests } = await syncedDigests(gw.netns, (e) => e.reply.dst === address, k, STANDBY_MIN_TIMEOUT);
        if (!out) out = digests;
        else {
          // Another standby of the same address: where it differs from the first, make the bucket differ.
          for (const b of out.diff(digests)) out.count[b] = 0xffffffff;
        }
      }
      return out;
    });
  }

  /** Something is written for the stream: its cached standby digests no longer hold. */
  private forget(from: SyncPeerInfo): void {
    this.standbyDigests.invalidatePrefix(`${from.stream}#`);
  }

  /** Entries the kernel refused are logged, not retried: a resync would meet the same refusal. */
  private reportApply(r: ApplyResult, gw: LocalGateway, from: SyncPeerInfo, what: string): void {
    if (!r.failed.length) return;
    const first = r.failed[0];
    this.s.o.logger.error('egress: synced conntrack entries refused by the kernel', {
      pod: gw.info.pod, from: from.id, stream: from.stream, what, failed: r.failed.length, firstOp: first.op.kind, firstError: first.error.message,
    });
  }
}
