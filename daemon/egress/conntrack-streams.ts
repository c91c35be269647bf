// Conntrack state sync for the Egress controller: the owner streams its gateway's conntrack events to the
// other candidates' nodes; a standby applies what it receives to its own gateway pods.
import { ConntrackEvents, ConntrackHandle, type ApplyResult, type ConntrackEntry, type ConntrackEvent, type ConntrackEventType } from '../conntrack';
import { applySyncedEvents, encodeEventPayload, replaceSyncedEntries, SyncSender, type SyncPeerInfo } from '../conntrack-sync';
import { ipToBytes } from '../netlink/ip-bytes';
import { EgressContext, streamOf, type AddressState, type LocalGateway, IN_SYNC_MAX_LAG } from './egress-context';

export class ConntrackStreams {
  constructor(private readonly s: EgressContext) {}

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

  async startStreaming(st: AddressState): Promise<void> {
    if (!st.holder || this.s.o.conntrackSync === false) return;
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
        this.s.o.logger.error('egress: conntrack event not encodable; resyncing', { address: st.address, error: (e as Error).message });
        for (const s of st.senders.values()) s.requestResync();
        return;
      }
      if (!ev) return;
      for (const s of st.senders.values()) s.push(ev);
    });
    events.on('overrun', () => {
      for (const s of st.senders.values()) s.requestResync();
    });
    events.on('error', (e: Error) => this.s.o.logger.error('egress: conntrack events stopped', { address: st.address, error: e.message }));
    st.events = events;
    this.ensureSenders(st);
  }

  /** The owner keeps one sync stream to every other candidate's node; candidates come and go. */
  ensureSenders(st: AddressState): void {
    if (!st.holder || !st.events) return;
    const gw = st.holder;
    const snapshot = () => ConntrackHandle.with(gw.netns, (h) => h.dump({ family: 4 })).filter((e) => e.reply.dst === st.address);
    const want = new Set(st.candidates.filter((c) => c.node !== this.s.o.node.name).map((c) => c.nodeAddress));
    for (const peer of want) {
      if (st.senders.has(peer)) continue;
      const s = new SyncSender({ key: this.s.o.clusterKey, id: this.s.o.node.name, host: peer, port: this.s.o.syncPort, stream: streamOf(st), epoch: st.own.epoch, snapshot });
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
    await events?.close();
    for (const s of senders) await s.close();
  }

  periodicResync(): void {
    // Update events only come on state changes; a periodic resync refreshes standby timeouts (UDP).
    for (const st of this.s.addresses.values()) for (const s of st.senders.values()) s.requestResync();
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

  async applySynced(events: ConntrackEvent[], from: SyncPeerInfo): Promise<void> {
    for (const gw of this.targetsFor(from)) this.reportApply(await applySyncedEvents(gw.netns, events), gw, from, 'events');
  }

  async replaceSynced(entries: ConntrackEntry[], from: SyncPeerInfo): Promise<void> {
    const address = from.stream.split('|')[1];
    for (const gw of this.targetsFor(from)) {
      const t0 = Date.now();
      const r = await replaceSyncedEntries(gw.netns, entries, (e) => e.reply.dst === address);
      this.reportApply(r, gw, from, 'resync');
      this.s.o.logger.info('egress: conntrack resync applied', {
        pod: gw.info.pod, from: from.id, stream: from.stream, entries: entries.length, created: r.created, updated: r.updated, deleted: r.deleted, failed: r.failed.length, ms: Date.now() - t0,
      });
    }
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
