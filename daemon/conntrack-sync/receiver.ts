// SyncReceiver: on each candidate gateway node, accepts authenticated SyncSenders and hands their
// events and transfers to the caller (which writes the kernel table), acking what was applied.
//
// A transfer (full, or the buckets a consistency check found different) is applied while it streams:
// each RESYNC_CHUNK is upserted as it arrives (memory bounded by maxPendingFrames, TCP pushes back), and
// only the key hashes it carried are kept (KeySet, 8 bytes an entry). At RESYNC_END the caller sweeps: in
// the transfer's buckets, what the table holds and the transfer did not carry is deleted. A transfer cut
// off before its END sweeps nothing, so it never deletes a live entry. A DIGEST frame is compared with the
// caller's digests of its own table, and the differing buckets are asked for (BUCKET_REQUEST).
import * as net from 'node:net';
import type { ConntrackEntry, ConntrackEvent } from '../conntrack/types';
import { log } from '../../lib/log';
import { hostPort } from '../../lib/ip';
import { SyncChannel, type ChannelTiming } from './channel';
import { Digests, KeySet, bucketSetBytes, keyHashInto, lastKeyLo, readBucketSet, writeBucketSet, type BucketSet } from './digest';
import { Cursor, WireList } from './entry-codec';
import { DEFAULT_MAX_FRAME, FrameRejected, FrameType, SUPPORTED_VERSIONS, emptyRejects, senderBytes, writeU64, type Frame, type RejectReason, type VersionRange } from './frame';
import {
  advertisedVersions, checkClusterKey, deriveSession, handshakeKey, negotiate, newNonce, proofsEqual, rangeText, readHello, readProof, writeAccept, writeChallenge, type SessionKeys,
} from './handshake';

/** Who a batch came from. A sweep deletes entries of this (id, stream) only. */
export interface SyncPeerInfo {
  id: string;
  stream: string;
  epoch: number;
  remote: string;
}

export interface SyncReceiverOptions {
  /** Shared cluster key, at least 32 bytes. */
  key: Buffer;
  /** This node's name, proven to senders in the handshake. */
  id: string;
  host?: string;
  /** 0 (default) picks an ephemeral port; see `port` after listen(). */
  port?: number;
  /**
   * Applies events in order (upsert for new/update, delete-if-present for destroy). Throwing drops the
   * connection, which makes the sender resync. This or applyWire.
   */
  apply?: (events: ConntrackEvent[], from: SyncPeerInfo) => void | Promise<void>;
  /** A chunk of a transfer: create or update each entry (applied as it arrives). This or upsertWire. */
  upsert?: (entries: ConntrackEntry[], from: SyncPeerInfo) => void | Promise<void>;
  /**
   * apply and upsert for callers that read entries in their wire form (table-wire.ts, EntryStore): given,
   * they are called instead, with the frame's list validated but not decoded (no object per entry).
   */
  applyWire?: (events: WireList, from: SyncPeerInfo) => void | Promise<void>;
  upsertWire?: (entries: WireList, from: SyncPeerInfo) => void | Promise<void>;
  /**
   * The end of a transfer: delete the stream's entries in `buckets` whose key hash (digest.ts keyHash) is
   * not in `keep`. Returns how many were deleted (for stats) or nothing.
   */
  sweep: (keep: KeySet, buckets: BucketSet, from: SyncPeerInfo) => void | number | Promise<void | number>;
  /** Digests of the stream's entries as held here, or undefined when there is nowhere to hold them. */
  digests: (k: number, from: SyncPeerInfo) => Digests | undefined | Promise<Digests | undefined>;
  maxFrameBytes?: number;
  /** ACK after this many applied frames, or ackDelayMs after the first unacked one. */
  ackEvery?: number;
  ackDelayMs?: number;
  heartbeatMs?: number;
  deadAfterMs?: number;
  handshakeTimeoutMs?: number;
  /** A transfer announcing more entries is refused (counted as oversize). */
  maxResyncEntries?: number;
  maxConnections?: number;
  /** Decoded frames waiting for apply before the socket is paused (TCP then slows the sender). */
  maxPendingFrames?: number;
  /** The protocol versions accepted (SUPPORTED_VERSIONS); other ranges only stand in for other releases in tests. */
  versions?: VersionRange;
}

/** A connection this receiver refused: from whom (as far as it can tell) and why. */
export interface SyncRefusal {
  reason: RejectReason;
  message: string;
  /** The sender id the refused frames named (authenticated or not), when readable. */
  claimedId: string | undefined;
  /** The remote address (no port). */
  address: string;
  at: number;
}

/** Refusals remembered, the most recent kept: enough for every peer of a node, bounded against strangers. */
const MAX_REFUSALS = 64;

export interface SyncPeerStats extends SyncPeerInfo {
  connectedAt: number;
  appliedSeq: number;
  ackedSeq: number;
  framesApplied: number;
  entriesApplied: number;
  resyncs: number;
  bucketResyncs: number;
  /** Frames received but not yet applied. */
  pendingFrames: number;
  /** The protocol version the connection speaks. */
  version: number;
}

export interface SyncReceiverStats {
  port: number;
  connectedPeers: number;
  peers: SyncPeerStats[];
  connectionsAccepted: number;
  connectionsRefused: number;
  framesApplied: number;
  entriesApplied: number;
  /** Full transfers completed (swept), with the entries and time of the last one. */
  resyncs: number;
  lastResyncEntries: number;
  lastResyncMs: number;
  /** Partial transfers completed. */
  bucketResyncs: number;
  /** Entries deleted by sweeps (held here, not in the sender's transfer). */
  swept: number;
  /** Consistency checks received, and the buckets found different and asked for again. */
  checks: number;
  bucketsRequested: number;
  /** Largest key set a transfer held (bytes): the receiver's per-transfer memory besides pending frames. */
  maxKeySetBytes: number;
  /** From receipt of the oldest frame in an ACK to sending that ACK; last and worst. */
  ackLagMs: number;
  maxAckLagMs: number;
  rejected: Record<RejectReason, number>;
}

type Work =
  | { kind: 'apply'; seq: number; rxAt: number; list: WireList }
  | { kind: 'upsert'; seq: number; rxAt: number; list: WireList }
  | { kind: 'sweep'; seq: number; rxAt: number; t: Transfer }
  | { kind: 'check'; seq: number; rxAt: number; digests: Digests }
  | { kind: 'none'; seq: number; rxAt: number };

interface Transfer {
  total: number;
  got: number;
  keys: KeySet;
  set: BucketSet;
  began: number;
}

interface Conn {
  ch: SyncChannel;
  remote: string;
  nonceR: Buffer;
  /** Between the sender's HELLO and its proof. */
  pending: { keys: SessionKeys; id: string; stream: string; epoch: number; version: number | undefined; theirs: VersionRange } | undefined;
  info: SyncPeerInfo | undefined;
  stats: SyncPeerStats | undefined;
  resync: Transfer | undefined;
  work: Work[];
  running: boolean;
  sinceAck: number;
  oldestUnacked: number;
  ackTimer: NodeJS.Timeout | undefined;
}

export class SyncReceiver {
  private readonly o: Required<Omit<SyncReceiverOptions, 'apply' | 'upsert' | 'sweep' | 'digests' | 'applyWire' | 'upsertWire'>>;
  /** Recent refusals by (claimed id, address), oldest first. */
  private readonly refusals = new Map<string, SyncRefusal>();
  private readonly hsKey: Buffer;
  private readonly idBytes: Buffer;
  private readonly timing: ChannelTiming;
  private readonly server: net.Server;
  private readonly conns = new Set<Conn>();
  /** Highest ownership epoch seen per stream: a sender below it is a fenced former owner. */
  private readonly epochs = new Map<string, number>();
  private s = {
    connectionsAccepted: 0, connectionsRefused: 0, framesApplied: 0, entriesApplied: 0, resyncs: 0, lastResyncEntries: 0,
    lastResyncMs: 0, bucketResyncs: 0, swept: 0, checks: 0, bucketsRequested: 0, maxKeySetBytes: 0, ackLagMs: 0, maxAckLagMs: 0, rejected: emptyRejects(),
  };

  constructor(private readonly opts: SyncReceiverOptions) {
    checkClusterKey(opts.key);
    if (!opts.apply && !opts.applyWire) throw new TypeError('SyncReceiver: apply or applyWire is required');
    if (!opts.upsert && !opts.upsertWire) throw new TypeError('SyncReceiver: upsert or upsertWire is required');
    this.idBytes = senderBytes(opts.id);
    this.hsKey = handshakeKey(opts.key);
    this.o = {
      key: opts.key, id: opts.id, host: opts.host ?? '0.0.0.0', port: opts.port ?? 0,
      maxFrameBytes: opts.maxFrameBytes ?? DEFAULT_MAX_FRAME, ackEvery: opts.ackEvery ?? 16, ackDelayMs: opts.ackDelayMs ?? 20,
      heartbeatMs: opts.heartbeatMs ?? 250, deadAfterMs: opts.deadAfterMs ?? 1000, handshakeTimeoutMs: opts.handshakeTimeoutMs ?? 2000,
      maxResyncEntries: opts.maxResyncEntries ?? 4_000_000, maxConnections: opts.maxConnections ?? 256,
      maxPendingFrames: opts.maxPendingFrames ?? 64, versions: opts.versions ?? SUPPORTED_VERSIONS,
    };
    this.timing = { heartbeatMs: this.o.heartbeatMs, deadAfterMs: this.o.deadAfterMs, handshakeTimeoutMs: this.o.handshakeTimeoutMs };
    this.server = net.createServer((s) => this.accept(s));
  }

  listen(): Promise<number> {
    return new Promise((resolve, reject) => {
      this.server.once('error', reject);
      this.server.listen(this.o.port, this.o.host, () => {
        this.server.off('error', reject);
        resolve(this.port);
      });
    });
  }

  get port(): number {
    const a = this.server.address();
    return a && typeof a === 'object' ? a.port : 0;
  }

  stats(): SyncReceiverStats {
    const peers = [...this.conns].filter((c) => c.stats).map((c) => ({ ...c.stats!, pendingFrames: c.work.length }));
    return { ...this.s, rejected: { ...this.s.rejected }, port: this.port, connectedPeers: peers.length, peers };
  }

  /**
   * Asks the senders of the matching streams for their whole table again (a new standby on this node has
   * none of it: events alone bring only what changes from now on). Returns how many were asked; a stream
   * with no connection up gets its resync when its sender connects.
   */
  requestResync(match: (stream: string) => boolean): number {
    let n = 0;
    for (const c of this.conns) {
      if (!c.info || c.ch.closed || !c.ch.established || !match(c.info.stream)) continue;
      c.ch.send(FrameType.RESYNC_REQUEST, 0);
      n++;
    }
    return n;
  }

  /**
   * The latest refusal of a connection claiming to come from node `id` or from `address`, if any since
   * `since` and none of its connections was accepted after it: why that node's stream does not arrive.
   */
  refusalFrom(id: string, address: string | undefined, since = 0): SyncRefusal | undefined {
    let out: SyncRefusal | undefined;
    for (const r of this.refusals.values()) {
      if (r.at < since || (r.claimedId !== id && (!address || r.address !== address))) continue;
      if (!out || r.at >= out.at) out = r;
    }
    return out && { ...out };
  }

  private remember(reason: RejectReason, message: string, claimedId: string | undefined, address: string): void {
    const key = `${claimedId ?? ''}|${address}`;
    this.refusals.delete(key);
    this.refusals.set(key, { reason, message, claimedId, address, at: Date.now() });
    if (this.refusals.size > MAX_REFUSALS) this.refusals.delete(this.refusals.keys().next().value!);
  }

  /** A connection from `id` at `address` was accepted: what was refused from it before is over. */
  private forgive(id: string, address: string): void {
    for (const [k, r] of this.refusals) if (r.claimedId === id || r.address === address) this.refusals.delete(k);
  }

  /** Stops listening and drops every connection. A half-received transfer is not swept. */
  async close(): Promise<void> {
    const closed = new Promise<void>((resolve) => this.server.close(() => resolve()));
    const done = [...this.conns].map((c) => {
      c.ch.close('receiver closed');
      return c.ch.done;
    });
    await Promise.all([closed, ...done]);
  }

  private accept(socket: net.Socket): void {
    const remote = hostPort(socket.remoteAddress ?? '', socket.remotePort ?? 0);
    if (this.conns.size >= this.o.maxConnections) {
      this.s.connectionsRefused++;
      socket.destroy();
      return;
    }
    this.s.connectionsAccepted++;
    const address = socket.remoteAddress ?? '';
    const c: Conn = {
      ch: undefined as unknown as SyncChannel, remote, nonceR: newNonce(this.o.versions), pending: undefined, info: undefined, stats: undefined, resync: undefined,
      work: [], running: false, sinceAck: 0, oldestUnacked: 0, ackTimer: undefined,
    };
    c.ch = new SyncChannel(socket, this.idBytes, this.hsKey, this.o.maxFrameBytes, this.timing, {
      frame: (f) => this.onFrame(c, f),
      rejected: (reason, message, claimed) => {
        this.s.rejected[reason]++;
        this.remember(reason, message, c.info?.id ?? c.pending?.id ?? claimed, address);
        log().warn('conntrack sync: frame rejected', { role: 'receiver', remote, peerId: c.info?.id ?? c.pending?.id, claimedId: claimed, stream: c.info?.stream ?? c.pending?.stream, reason, message });
      },
      closed: (reason) => this.onClosed(c, reason),
    });
    this.conns.add(c);
  }

  private onFrame(c: Conn, f: Frame): void {
    if (!c.ch.established) return this.onHello(c, f);
    const now = Date.now();
    switch (f.type) {
      case FrameType.EVENTS:
        if (c.resync) throw new FrameRejected('malformed', 'EVENTS inside a resync');
        return this.enqueue(c, { kind: 'apply', seq: f.seq, rxAt: now, list: WireList.parse(f.payload, 0xffffffff, true) });
      case FrameType.RESYNC_BEGIN: {
        if (c.resync) throw new FrameRejected('malformed', 'RESYNC_BEGIN inside a resync');
        const cur = new Cursor(f.payload);
        const total = cur.u32();
        const set = readBucketSet(cur);
        cur.done();
        if (total > this.o.maxResyncEntries) throw new FrameRejected('oversize', `resync of ${total} entries over the limit of ${this.o.maxResyncEntries}`);
        c.resync = { total, got: 0, keys: new KeySet(Math.min(total, 1 << 16)), set, began: now };
        return this.enqueue(c, { kind: 'none', seq: f.seq, rxAt: now });
      }
      case FrameType.RESYNC_CHUNK: {
        const r = c.resync;
        if (!r) throw new FrameRejected('malformed', 'RESYNC_CHUNK outside a resync');
        const list = WireList.parse(f.payload, r.total - r.got, false);
        r.got += list.count;
        for (let i = 0; i < list.count; i++) {
          const hi = keyHashInto(list.payload, list.offsets[i]);
          r.keys.add(hi, lastKeyLo());
        }
        return this.enqueue(c, { kind: 'upsert', seq: f.seq, rxAt: now, list });
      }
      case FrameType.RESYNC_END: {
        const r = c.resync;
        if (!r) throw new FrameRejected('malformed', 'RESYNC_END outside a resync');
        const total = u32Payload(f);
        if (total !== r.total || r.got !== r.total) throw new FrameRejected('malformed', `resync ended with ${r.got} of ${r.total} entries (END says ${total})`);
        c.resync = undefined;
        if (r.keys.bytes > this.s.maxKeySetBytes) this.s.maxKeySetBytes = r.keys.bytes;
        return this.enqueue(c, { kind: 'sweep', seq: f.seq, rxAt: now, t: r });
      }
      case FrameType.DIGEST:
        if (c.resync) throw new FrameRejected('malformed', 'DIGEST inside a resync');
        return this.enqueue(c, { kind: 'check', seq: f.seq, rxAt: now, digests: Digests.read(f.payload) });
      case FrameType.HEARTBEAT:
        return this.enqueue(c, { kind: 'none', seq: f.seq, rxAt: now });
      default:
        throw new FrameRejected('malformed', `unexpected frame type ${f.type} from a sender`);
    }
  }

  private onHello(c: Conn, f: Frame): void {
    if (f.type !== FrameType.HELLO) throw new FrameRejected('malformed', `frame type ${f.type} before the HELLO exchange`);
    if (!c.pending) {
      const h = readHello(f.payload);
      const id = f.sender.toString('utf8');
      const keys = deriveSession(this.o.key, { nonceR: c.nonceR, nonceS: h.nonceS, senderId: id, receiverId: this.o.id, stream: h.stream, epoch: h.epoch });
      const theirs = advertisedVersions(h.nonceS);
      // Without a shared version the challenge still goes out: the sender learns this side's range from it.
      c.pending = { keys, id, stream: h.stream, epoch: h.epoch, version: negotiate(this.o.versions, theirs), theirs };
      c.ch.expectPeer(f.sender);
      c.ch.send(FrameType.HELLO, 512, (b, o) => writeChallenge(b, o, c.nonceR, this.o.id, keys.proofR));
      return;
    }
    const { keys, id, stream, epoch, version, theirs } = c.pending;
    if (!proofsEqual(readProof(f.payload), keys.proofS)) throw new FrameRejected('auth', `sender '${id}' failed to prove the cluster key`);
    if (version === undefined) {
      throw new FrameRejected('version', `sender '${id}' speaks sync protocol versions ${rangeText(theirs)}, this node ${rangeText(this.o.versions)}: none in common`);
    }
    const highest = this.epochs.get(stream) ?? -1;
    if (epoch < highest) throw new FrameRejected('stale', `sender '${id}' has epoch ${epoch} of stream '${stream}', ${highest} was seen`);
    this.epochs.set(stream, epoch);
    // A reconnecting sender replaces its old connection; a newer owner fences an older one.
    for (const o of this.conns) {
      if (o !== c && o.info && o.info.stream === stream && (o.info.id === id || o.info.epoch < epoch)) o.ch.close(`superseded by a connection from '${id}' (epoch ${epoch})`);
    }
    c.ch.send(FrameType.HELLO, 8, (b, o) => writeAccept(b, o));
    c.ch.establish(keys.toSender, keys.toReceiver, keys.session, f.sender, version);
    c.pending = undefined;
    c.info = { id, stream, epoch, remote: c.remote };
    c.stats = { ...c.info, connectedAt: Date.now(), appliedSeq: f.seq, ackedSeq: -1, framesApplied: 0, entriesApplied: 0, resyncs: 0, bucketResyncs: 0, pendingFrames: 0, version };
    this.forgive(id, c.ch.socket.remoteAddress ?? '');
    log().info('conntrack sync connected', { role: 'receiver', peerId: id, remote: c.remote, stream, epoch, version, peers: this.stats().connectedPeers });
  }

  private enqueue(c: Conn, w: Work): void {
    c.work.push(w);
    if (c.work.length > this.o.maxPendingFrames) c.ch.pauseRx();
    this.run(c);
  }

  /** Applies queued work strictly in order; an async callback holds the queue until it settles. */
  private run(c: Conn): void {
    if (c.running) return;
    c.running = true;
    while (c.work.length && !c.ch.closed) {
      const w = c.work.shift()!;
      let r: void | Promise<void>;
      try {
        r = this.exec(c, w);
      } catch (e) {
        c.running = false;
        return this.applyFailed(c, e);
      }
      if (r && typeof (r as Promise<void>).then === 'function') {
        (r as Promise<void>).then(
          () => {
            c.running = false;
            this.applied(c, w);
            this.run(c);
          },
          (e) => {
            c.running = false;
            this.applyFailed(c, e);
          },
        );
        return;
      }
      this.applied(c, w);
    }
    c.running = false;
    if (c.work.length <= this.o.maxPendingFrames / 2) c.ch.resumeRx();
  }

  private exec(c: Conn, w: Work): void | Promise<void> {
    if (w.kind === 'apply') return this.opts.applyWire ? this.opts.applyWire(w.list, c.info!) : this.opts.apply!(w.list.events(), c.info!);
    if (w.kind === 'upsert') return this.opts.upsertWire ? this.opts.upsertWire(w.list, c.info!) : this.opts.upsert!(w.list.entries(), c.info!);
    if (w.kind === 'sweep') {
      const r = this.opts.sweep(w.t.keys, w.t.set, c.info!);
      const count = (n: void | number) => {
        if (typeof n === 'number') this.s.swept += n;
      };
      if (r && typeof (r as Promise<void | number>).then === 'function') return (r as Promise<void | number>).then(count);
      count(r as void | number);
      return;
    }
    if (w.kind === 'check') {
      const mine = this.opts.digests(w.digests.k, c.info!);
      if (mine && typeof (mine as Promise<Digests | undefined>).then === 'function') return (mine as Promise<Digests | undefined>).then((d) => this.compare(c, w.digests, d));
      this.compare(c, w.digests, mine as Digests | undefined);
    }
  }

  /** Asks for the buckets whose digest differs here (none asked when equal, or nothing is held here). */
  private compare(c: Conn, theirs: Digests, mine: Digests | undefined): void {
    this.s.checks++;
    if (!mine || c.ch.closed) return;
    const list = theirs.diff(mine);
    if (!list.length) return;
    this.s.bucketsRequested += list.length;
    const set: BucketSet = { k: theirs.k, list };
    log().info('conntrack sync: buckets differ from the owner\'s, asking for them', { role: 'receiver', peerId: c.info!.id, stream: c.info!.stream, buckets: list.length, of: theirs.k });
    c.ch.send(FrameType.BUCKET_REQUEST, bucketSetBytes(set), (b, o) => writeBucketSet(b, o, set));
  }

  private applied(c: Conn, w: Work): void {
    if (c.ch.closed) return;
    const st = c.stats!;
    st.appliedSeq = w.seq;
    st.framesApplied++;
    this.s.framesApplied++;
    const n = w.kind === 'apply' || w.kind === 'upsert' ? w.list.count : 0;
    st.entriesApplied += n;
    this.s.entriesApplied += n;
    if (w.kind === 'sweep' && w.t.set.list) {
      st.bucketResyncs++;
      this.s.bucketResyncs++;
      log().info('conntrack sync buckets applied', { role: 'receiver', peerId: c.info!.id, stream: c.info!.stream, buckets: w.t.set.list.length, entries: w.t.total, ms: Date.now() - w.t.began });
    } else if (w.kind === 'sweep') {
      st.resyncs++;
      this.s.resyncs++;
      this.s.lastResyncEntries = w.t.total;
      this.s.lastResyncMs = Date.now() - w.t.began;
      log().info('conntrack sync resync applied', { role: 'receiver', peerId: c.info!.id, stream: c.info!.stream, entries: w.t.total, ms: this.s.lastResyncMs, resyncs: st.resyncs });
    }
    if (c.sinceAck++ === 0) c.oldestUnacked = w.rxAt;
    if (c.sinceAck >= this.o.ackEvery) this.ack(c);
    else if (!c.ackTimer) c.ackTimer = setTimeout(() => this.ack(c), this.o.ackDelayMs);
  }

  private ack(c: Conn): void {
    clearTimeout(c.ackTimer);
    c.ackTimer = undefined;
    const st = c.stats;
    if (!st || c.ch.closed || c.sinceAck === 0) return;
    c.ch.send(FrameType.ACK, 8, (b, o) => {
      writeU64(b, o, st.appliedSeq);
      return o + 8;
    });
    st.ackedSeq = st.appliedSeq;
    c.sinceAck = 0;
    this.s.ackLagMs = Date.now() - c.oldestUnacked;
    if (this.s.ackLagMs > this.s.maxAckLagMs) this.s.maxAckLagMs = this.s.ackLagMs;
  }

  private applyFailed(c: Conn, e: unknown): void {
    // Not acked, so the sender cannot believe it applied: dropping the connection makes it resync.
    log().error('conntrack sync: applying received state failed', { peerId: c.info?.id, stream: c.info?.stream, error: (e as Error)?.message ?? String(e) });
    c.ch.close('apply failed');
  }

  private onClosed(c: Conn, reason: string): void {
    clearTimeout(c.ackTimer);
    this.conns.delete(c);
    c.work = [];
    c.resync = undefined;
    if (c.info) {
      log().info('conntrack sync disconnected', {
        role: 'receiver', peerId: c.info.id, remote: c.remote, stream: c.info.stream, reason,
        framesApplied: c.stats!.framesApplied, entriesApplied: c.stats!.entriesApplied, resyncs: c.stats!.resyncs,
      });
    }
  }
}

function u32Payload(f: Frame): number {
  const c = new Cursor(f.payload);
  const v = c.u32();
  c.done();
  return v;
}
