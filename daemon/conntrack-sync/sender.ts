// SyncSender: on the owner of a floating address, streams its gateway's conntrack events to one
// candidate's SyncReceiver. A full transfer of the table only when a connection starts, the receiver asks
// (RESYNC_REQUEST) or the peer fell too far behind; otherwise checkConsistency() (periodic, the caller's
// timer) sends per-bucket digests (digest.ts), and the receiver asks back for just the buckets that differ.
// The connection is kept up by a reconcile loop: a pass connects and lasts until the connection closes,
// then the next one comes after a jittered backoff, reset by each completed handshake.
import * as net from 'node:net';
import type { ConntrackEntry, ConntrackEventType } from '../conntrack/types';
import { log } from '../../lib/log';
import { hostPort } from '../../lib/ip';
import { Backoff } from '../../lib/backoff';
import { ReconcileLoop } from '../util/reconcile-loop';
import { SyncChannel, type ChannelTiming } from './channel';
import { CoalescingQueue } from './coalescing-queue';
import { CodecError, EncodedEntries, MAX_EVENT_BYTES, writeEntry, writeList, type SyncEvent } from './entry-codec';
import { DEFAULT_BUCKETS, Digests, bucketSetBytes, checkBuckets, inBuckets, inBucketsByHash, keyHashInto, lastKeyLo, readBucketSet, writeBucketSet, type BucketSet } from './digest';
import { Cursor } from './entry-codec';
import { DEFAULT_MAX_FRAME, FrameRejected, FrameType, SUPPORTED_VERSIONS, emptyRejects, readU64, senderBytes, type Frame, type RejectReason, type VersionRange } from './frame';
import {
  advertisedVersions, checkClusterKey, deriveSession, handshakeKey, negotiate, newNonce, proofsEqual, rangeText, readAccept, readChallenge, writeHello, writeProof, type SessionKeys,
} from './handshake';

export interface SyncSenderOptions {
  /** Shared cluster key, at least 32 bytes. */
  key: Buffer;
  /** This node's name: the sender id in every frame. */
  id: string;
  /** The candidate's SyncReceiver. */
  host: string;
  port: number;
  /** What is synced, e.g. the floating address; the receiver scopes replaceAll by (id, stream). */
  stream?: string;
  /** Ownership epoch of the stream; a receiver refuses an epoch lower than one it has seen. */
  epoch?: number;
  /** The full current table, taken when a resync starts (may be a kernel dump): decoded entries, or
   *  entries already in wire form (dumpScopeEncoded, no object per entry). It is sent in chunks
   *  afterwards, so it must be a fresh one that the caller no longer changes. */
  snapshot: () => Snapshot | Promise<Snapshot>;
  /** Buckets of the consistency check (digest.ts); both ends use the sender's. */
  buckets?: number;
  /** The current table's digests for checkConsistency(); computed from snapshot() when not given. A
   *  caller with several senders per table shares one (cached while no event changed the table). */
  digests?: (k: number) => Digests | Promise<Digests>;
  /** Refuse a receiver that authenticates under another id. */
  expectReceiverId?: string;
  maxFrameBytes?: number;
  /** Events per EVENTS frame / entries per RESYNC_CHUNK frame. */
  batchEntries?: number;
  chunkEntries?: number;
  /** Unacked frames / bytes in flight before the sender stops writing (checked before each frame, so
   *  memory in flight stays under maxInflightBytes plus one frame). */
  maxInflightFrames?: number;
  maxInflightBytes?: number;
  /** Queued (coalesced) events beyond this are dropped for a full resync. */
  maxQueuedEntries?: number;
  heartbeatMs?: number;
  deadAfterMs?: number;
  handshakeTimeoutMs?: number;
  backoffMinMs?: number;
  backoffMaxMs?: number;
  /** The protocol versions offered (SUPPORTED_VERSIONS); other ranges only stand in for other releases in tests. */
  versions?: VersionRange;
}

export type SyncSenderState = 'idle' | 'connecting' | 'handshake' | 'resync' | 'streaming' | 'closed';

export interface SyncSenderStats {
  state: SyncSenderState;
  connected: boolean;
  peer: string;
  receiverId: string | undefined;
  connects: number;
  disconnects: number;
  handshakeFailures: number;
  framesSent: number;
  entriesSent: number;
  bytesSent: number;
  /** Sequence number of the last frame sent / acked on the current connection. */
  lastSeq: number;
  ackedSeq: number;
  queuedEntries: number;
  coalesced: number;
  inflightFrames: number;
  inflightBytes: number;
  /** Bytes written to the socket that Node still buffers (bounded by maxInflightBytes). */
  unsentBytes: number;
  /** Entries queued or sent but not yet acked. */
  lagEntries: number;
  /** From the first queued event of the last acked frame to its ack; and the worst seen. */
  lagMs: number;
  maxLagMs: number;
  /** Full transfers sent. */
  resyncs: number;
  /** Partial transfers (buckets a consistency check found different) and the buckets they carried. */
  bucketResyncs: number;
  bucketsResent: number;
  /** Consistency checks (DIGEST frames) sent, and their bytes. */
  checks: number;
  checkBytes: number;
  /** Resyncs the receiver asked for (RESYNC_REQUEST). */
  resyncsRequested: number;
  lastResyncEntries: number;
  lastResyncMs: number;
  /** Queue overflows that were turned into a full resync. */
  overflows: number;
  /** Events not queued because a resync will cover them (disconnected or overflowed). */
  dropped: number;
  /** Entries the codec could not encode (skipped, logged). */
  invalidEntries: number;
  rejected: Record<RejectReason, number>;
  /** The protocol version the current connection speaks (negotiated in its HELLO exchange). */
  version: number | undefined;
  /** The last refusal, by either side as far as this side can tell: why the peer is not synced. */
  lastRejected: { reason: RejectReason; message: string; at: number } | undefined;
}

interface Inflight {
  seq: number;
  bytes: number;
  entries: number;
  since: number;
}

interface Resync {
  set: BucketSet;
  /** The snapshot: decoded entries, or entries already in wire form (dumpScopeEncoded). */
  entries: ConntrackEntry[] | EncodedEntries;
  /** How many. */
  total: number;
  next: number;
  started: number;
}

const ackPayload = 8;

export type Snapshot = ConntrackEntry[] | EncodedEntries;

/** The snapshot's entries in the set's buckets. */
function inSet(all: Snapshot, set: BucketSet): Snapshot {
  if (!(all instanceof EncodedEntries)) return all.filter((e) => inBuckets(set, e));
  const out = new EncodedEntries();
  for (let i = 0; i < all.count; i++) {
    keyHashInto(all.buf, all.offsets[i]);
    if (inBucketsByHash(set, lastKeyLo())) out.append(all.buf, all.offsets[i], all.offsets[i + 1] - all.offsets[i]);
  }
  return out;
}

/** A connection's pass ends when the connection does: the link connects again after its backoff. */
class ConnectionEnded extends Error {}

export class SyncSender {
  private readonly o: Required<Omit<SyncSenderOptions, 'expectReceiverId' | 'stream' | 'epoch' | 'digests'>> & Pick<SyncSenderOptions, 'expectReceiverId' | 'digests'> & { stream: string; epoch: number };
  private version: number | undefined;
  private pendingVersion: number | undefined;
  private lastRejected: SyncSenderStats['lastRejected'];
  private readonly idBytes: Buffer;
  private readonly hsKey: Buffer;
  private readonly timing: ChannelTiming;
  private state: SyncSenderState = 'idle';
  /** The current connection finished its handshake. */
  private up = false;
  private ch: SyncChannel | undefined;
  /** Bumped per connection so a snapshot that resolves late can tell it belongs to a dead one. */
  private generation = 0;
  private queue = new CoalescingQueue();
  private inflight: Inflight[] = [];
  private inflightBytes = 0;
  private inflightEntries = 0;
  private resync: Resync | undefined;
  private resyncPending = false;
  /** Buckets a receiver asked for while a transfer was under way: sent after it. */
  private bucketsPending: Set<number> | undefined;
  private checking = false;
  /** Sequence number of the last DIGEST sent: no other goes out before the receiver acked (compared) it. */
  private checkSeq = -1;
  private pumpScheduled = false;
  /** Connects, and again after a connection ends (a pass lasts as long as its connection). */
  private readonly link: ReconcileLoop;
  /** Waits before connecting again: bounded, exponential, jittered (candidates restarted together do not
   *  reconnect in lockstep); reset once a handshake completes. */
  private readonly backoff: Backoff;
  /** Ends the pass of the current connection. */
  private ended: ((reason: string) => void) | undefined;
  private nonceS: Buffer | undefined;
  private pendingKeys: SessionKeys | undefined;
  private receiverId: string | undefined;
  private s = {
    connects: 0, disconnects: 0, handshakeFailures: 0, framesSent: 0, entriesSent: 0, bytesSent: 0, ackedSeq: -1,
    lagMs: 0, maxLagMs: 0, resyncs: 0, resyncsRequested: 0, lastResyncEntries: 0, lastResyncMs: 0, bucketResyncs: 0, bucketsResent: 0, checks: 0, checkBytes: 0, overflows: 0, dropped: 0, invalidEntries: 0,
    rejected: emptyRejects(),
  };

  constructor(opts: SyncSenderOptions) {
    checkClusterKey(opts.key);
    this.idBytes = senderBytes(opts.id);
    this.hsKey = handshakeKey(opts.key);
    this.o = {
      maxFrameBytes: DEFAULT_MAX_FRAME, batchEntries: 1000, chunkEntries: 4000, maxInflightFrames: 128, maxInflightBytes: 8 << 20,
      maxQueuedEntries: 200_000, buckets: DEFAULT_BUCKETS, heartbeatMs: 250, deadAfterMs: 1000, handshakeTimeoutMs: 2000, backoffMinMs: 50, backoffMaxMs: 2000, versions: SUPPORTED_VERSIONS,
      ...opts,
      stream: opts.stream ?? '',
      epoch: opts.epoch ?? 0,
    };
    checkBuckets(this.o.buckets);
    this.timing = { heartbeatMs: this.o.heartbeatMs, deadAfterMs: this.o.deadAfterMs, handshakeTimeoutMs: this.o.handshakeTimeoutMs };
    this.backoff = new Backoff(this.o.backoffMinMs, this.o.backoffMaxMs, Math.random, 0.25);
    this.link = new ReconcileLoop({
      run: () => this.connection(),
      backoff: this.backoff,
      holdsProcess: true,
      // A connection's end is logged by onClosed; anything else kept it from being made.
      onError: (e) => {
        if (e instanceof ConnectionEnded) return;
        if (this.state !== 'closed') this.state = 'idle';
        log().error('conntrack sync: cannot connect', { peer: this.peer, stream: this.o.stream, error: e.message });
      },
    });
  }

  get peer(): string {
    return hostPort(this.o.host, this.o.port);
  }

  /** Starts connecting; reconnects on its own until close(). Idempotent. */
  start(): void {
    if (this.state === 'idle') this.link.request();
  }

  /**
   * Queues events from the owner's gateway, decoded or already encoded (encodeEventPayload, the fast
   * path). Never blocks and never grows beyond maxQueuedEntries.
   */
  push(events: SyncEvent | readonly SyncEvent[]): void {
    const list: readonly SyncEvent[] = Array.isArray(events) ? events : [events as SyncEvent];
    // Before a snapshot is taken, or when one is owed anyway, the snapshot will carry these.
    if (!this.accepting()) {
      this.s.dropped += list.length;
      return;
    }
    const now = Date.now();
    for (let i = 0; i < list.length; i++) {
      try {
        this.queue.push(list[i], now);
      } catch (e) {
        if (!(e instanceof CodecError)) throw e;
        this.s.invalidEntries++;
        log().error('conntrack sync: entry skipped, cannot encode', { peer: this.peer, error: e.message, entry: JSON.stringify(list[i]).slice(0, 300) });
        continue;
      }
      if (this.overflowed(list.length - i - 1)) break;
    }
    this.schedulePump();
  }

  /**
   * push() for one event whose entry is already in wire form at buf[off, off + len) (encodeEventAt): the
   * owner's hot path, with no object per event. The bytes are copied; buf may be reused after the call.
   */
  pushEncoded(type: ConntrackEventType, buf: Buffer, off: number, len: number): void {
    if (!this.accepting()) {
      this.s.dropped++;
      return;
    }
    this.queue.pushBytes(type, buf, off, len, Date.now());
    this.overflowed(0);
    this.schedulePump();
  }

  private accepting(): boolean {
    return (this.state === 'resync' || this.state === 'streaming') && !this.resyncPending;
  }

  /** Past maxQueuedEntries: the queue is dropped for a full resync (`rest` more events are dropped with it). */
  private overflowed(rest: number): boolean {
    if (this.queue.size <= this.o.maxQueuedEntries) return false;
    this.s.dropped += this.queue.size + rest;
    this.s.overflows++;
    this.queue.clear();
    this.resyncPending = true;
    log().warn('conntrack sync: peer too far behind, queue dropped for a full resync', { peer: this.peer, stream: this.o.stream, inflightFrames: this.inflight.length });
    return true;
  }

  /** Sends the whole table again (e.g. after the owner's own table was rebuilt). */
  requestResync(): void {
    this.resyncPending = true;
    this.queue.clear();
    this.schedulePump();
  }

  /**
   * The periodic consistency check: sends the table's bucket digests (O(buckets) bytes, whatever the
   * table's size); the receiver answers with the buckets it holds differently, which are then sent again.
   * Skipped while a transfer is under way or owed (that one brings the peer up to date anyway).
   */
  checkConsistency(): void {
    if (this.state !== 'streaming' || this.resync || this.resyncPending || this.checking || !this.ch) return;
    // A standby still comparing the last one (a large table) is not sent another.
    if (this.checkSeq > this.s.ackedSeq) return;
    const gen = this.generation;
    const k = this.o.buckets;
    let d: Digests | Promise<Digests>;
    this.checking = true;
    try {
      d = this.o.digests ? this.o.digests(k) : Promise.resolve(this.o.snapshot()).then((all) => Digests.of(all instanceof EncodedEntries ? all.entries() : all, k));
    } catch (e) {
      this.checking = false;
      log().error('conntrack sync: digests failed', { peer: this.peer, stream: this.o.stream, error: (e as Error).message ?? String(e) });
      return;
    }
    const go = (dg: Digests) => {
      this.checking = false;
      if (gen !== this.generation || this.state !== 'streaming' || !this.ch) return;
      if (dg.k !== k) throw new RangeError(`digests of ${dg.k} buckets, ${k} wanted`);
      this.checkSeq = this.ch.writer.seq;
      const bytes = this.sendFrame(FrameType.DIGEST, dg.wireBytes, (b, o) => dg.write(b, o), 0, Date.now());
      this.s.checks++;
      this.s.checkBytes += bytes;
    };
    if (d instanceof Digests) go(d);
    else d.then(go, (e) => {
      this.checking = false;
      log().error('conntrack sync: digests failed', { peer: this.peer, stream: this.o.stream, error: (e as Error).message ?? String(e) });
    });
  }

  stats(): SyncSenderStats {
    const lastSeq = this.ch ? this.ch.writer.seq - 1 : -1;
    return {
      ...this.s,
      rejected: { ...this.s.rejected },
      state: this.state,
      connected: this.state === 'resync' || this.state === 'streaming',
      peer: this.peer,
      receiverId: this.receiverId,
      lastSeq,
      queuedEntries: this.queue.size,
      coalesced: this.queue.coalesced,
      inflightFrames: this.inflight.length,
      inflightBytes: this.inflightBytes,
      unsentBytes: this.ch?.unsentBytes ?? 0,
      lagEntries: this.queue.size + this.inflightEntries,
      version: this.version,
      lastRejected: this.lastRejected && { ...this.lastRejected },
    };
  }

  /** Stops for good: lets written frames go out, then closes. */
  async close(): Promise<void> {
    if (this.state === 'closed') return;
    this.state = 'closed';
    const passDone = this.link.stop();
    const ch = this.ch;
    if (ch) {
      ch.close('sender closed', true);
      await ch.done;
    }
    await passDone;
  }

  /** One pass of the link: a connection, ended (rejected) when it closes. */
  private connection(): Promise<void> {
    if (this.state === 'closed') return Promise.resolve();
    return new Promise((_, reject) => {
      this.ended = (reason) => reject(new ConnectionEnded(reason));
      this.connect();
    });
  }

  private connect(): void {
    this.state = 'connecting';
    const gen = ++this.generation;
    const socket = net.connect({ host: this.o.host, port: this.o.port });
    const ch = new SyncChannel(socket, this.idBytes, this.hsKey, this.o.maxFrameBytes, this.timing, {
      frame: (f) => this.onFrame(ch, f),
      rejected: (reason, message) => {
        this.s.rejected[reason]++;
        this.lastRejected = { reason, message, at: Date.now() };
        log().warn('conntrack sync: frame rejected', { role: 'sender', peer: this.peer, receiverId: this.receiverId, stream: this.o.stream, reason, message });
      },
      closed: (reason) => this.onClosed(gen, reason),
    });
    this.ch = ch;
    socket.once('connect', () => {
      if (this.ch !== ch || this.state !== 'connecting') return;
      this.state = 'handshake';
      const nonceS = (this.nonceS = newNonce(this.o.versions));
      ch.send(FrameType.HELLO, 512, (b, o) => writeHello(b, o, nonceS, this.o.stream, this.o.epoch));
    });
  }

  private onFrame(ch: SyncChannel, f: Frame): void {
    if (!ch.established) return this.onHandshake(ch, f);
    switch (f.type) {
      case FrameType.ACK: return this.onAck(f);
      case FrameType.HEARTBEAT: return;
      case FrameType.RESYNC_REQUEST:
        if (f.payload.length !== 0) throw new FrameRejected('malformed', `RESYNC_REQUEST with a ${f.payload.length}-byte payload`);
        this.s.resyncsRequested++;
        log().info('conntrack sync: resync requested by the receiver', { role: 'sender', peer: this.peer, receiverId: this.receiverId, stream: this.o.stream });
        return this.requestResync();
      case FrameType.BUCKET_REQUEST: return this.onBucketRequest(f);
      default: throw new FrameRejected('malformed', `unexpected frame type ${f.type} from a receiver`);
    }
  }

  private onHandshake(ch: SyncChannel, f: Frame): void {
    if (f.type !== FrameType.HELLO) throw new FrameRejected('malformed', `frame type ${f.type} before the HELLO exchange`);
    if (!this.pendingKeys) {
      const { nonceR, receiverId, proofR } = readChallenge(f.payload);
      if (this.o.expectReceiverId !== undefined && receiverId !== this.o.expectReceiverId) {
        throw new FrameRejected('auth', `receiver is '${receiverId}', expected '${this.o.expectReceiverId}'`);
      }
      const keys = deriveSession(this.o.key, { nonceR, nonceS: this.nonceS!, senderId: this.o.id, receiverId, stream: this.o.stream, epoch: this.o.epoch });
      if (!proofsEqual(proofR, keys.proofR)) throw new FrameRejected('auth', `receiver '${receiverId}' failed to prove the cluster key`);
      this.receiverId = receiverId;
      this.pendingKeys = keys;
      ch.expectPeer(Buffer.from(receiverId, 'utf8'));
      const theirs = advertisedVersions(nonceR);
      this.pendingVersion = negotiate(this.o.versions, theirs);
      ch.send(FrameType.HELLO, 64, (b, o) => writeProof(b, o, keys.proofS));
      // The proof goes out even so: the receiver then knows who it refuses, and says why on its side too.
      if (this.pendingVersion === undefined) {
        ch.refuse(new FrameRejected('version', `receiver '${receiverId}' speaks sync protocol versions ${rangeText(theirs)}, this node ${rangeText(this.o.versions)}: none in common`), receiverId);
      }
      return;
    }
    readAccept(f.payload);
    const keys = this.pendingKeys;
    this.version = this.pendingVersion!;
    ch.establish(keys.toReceiver, keys.toSender, keys.session, Buffer.from(this.receiverId!, 'utf8'), this.version);
    this.nonceS = undefined;
    this.pendingKeys = undefined;
    this.backoff.reset();
    this.s.connects++;
    this.up = true;
    this.lastRejected = undefined;
    log().info('conntrack sync connected', { role: 'sender', peer: this.peer, receiverId: this.receiverId, stream: this.o.stream, epoch: this.o.epoch, version: this.version, connects: this.s.connects });
    this.startResync();
  }

  private onAck(f: Frame): void {
    if (f.payload.length !== ackPayload) throw new CodecError(`ACK payload of ${f.payload.length} bytes`);
    const seq = readU64(f.payload, 0);
    const last = this.ch!.writer.seq - 1;
    if (seq > last) throw new FrameRejected('malformed', `ACK of ${seq} beyond the last frame sent (${last})`);
    if (seq < this.s.ackedSeq) throw new FrameRejected('malformed', `ACK went back from ${this.s.ackedSeq} to ${seq}`);
    this.s.ackedSeq = seq;
    const now = Date.now();
    let k = 0;
    let since = Infinity;
    while (k < this.inflight.length && this.inflight[k].seq <= seq) {
      const r = this.inflight[k++];
      this.inflightBytes -= r.bytes;
      this.inflightEntries -= r.entries;
      if (r.since < since) since = r.since;
    }
    if (k) this.inflight.splice(0, k);
    if (since !== Infinity) {
      this.s.lagMs = now - since;
      if (this.s.lagMs > this.s.maxLagMs) this.s.maxLagMs = this.s.lagMs;
    }
    this.pump();
  }

  private onBucketRequest(f: Frame): void {
    const c = new Cursor(f.payload);
    const set = readBucketSet(c);
    c.done();
    if (set.k !== this.o.buckets) throw new FrameRejected('malformed', `BUCKET_REQUEST over ${set.k} buckets, ${this.o.buckets} in use`);
    if (!set.list) throw new FrameRejected('malformed', 'BUCKET_REQUEST without buckets');
    log().info('conntrack sync: buckets differ at the receiver, sending them again', { role: 'sender', peer: this.peer, stream: this.o.stream, buckets: set.list.length, of: set.k });
    if (this.resyncPending) return;
    this.bucketsPending ??= new Set();
    for (const b of set.list) this.bucketsPending.add(b);
    this.schedulePump();
  }

  private onClosed(gen: number, reason: string): void {
    if (gen !== this.generation) return;
    const wasUp = this.up;
    this.up = false;
    if (!wasUp && this.state !== 'closed') this.s.handshakeFailures++;
    this.ch = undefined;
    this.nonceS = undefined;
    this.pendingKeys = undefined;
    this.version = undefined;
    this.pendingVersion = undefined;
    this.queue.clear();
    this.inflight = [];
    this.inflightBytes = 0;
    this.inflightEntries = 0;
    this.resync = undefined;
    this.resyncPending = false;
    this.bucketsPending = undefined;
    this.checking = false;
    this.checkSeq = -1;
    this.s.ackedSeq = -1;
    if (wasUp) {
      this.s.disconnects++;
      log().info('conntrack sync disconnected', {
        role: 'sender', peer: this.peer, receiverId: this.receiverId, stream: this.o.stream, reason,
        framesSent: this.s.framesSent, entriesSent: this.s.entriesSent, resyncs: this.s.resyncs, disconnects: this.s.disconnects,
      });
    }
    if (this.state !== 'closed') this.state = 'idle';
    const ended = this.ended;
    this.ended = undefined;
    // The link connects again after its backoff (unless closed).
    ended?.(reason);
  }

  /**
   * A transfer: the whole table (set without a list), or the listed buckets. A full one supersedes whatever
   * is queued; a partial one leaves the queue alone (its events are the newer state, sent after it).
   */
  private startResync(set: BucketSet = { k: this.o.buckets }): void {
    const gen = this.generation;
    this.state = 'resync';
    if (!set.list) {
      this.resyncPending = false;
      this.bucketsPending = undefined;
      // The snapshot supersedes everything queued so far; events from now on are queued behind it.
      this.queue.clear();
    }
    const started = Date.now();
    let snap: Snapshot | Promise<Snapshot>;
    try {
      snap = this.o.snapshot();
    } catch (e) {
      return this.snapshotFailed(gen, e);
    }
    const go = (all: Snapshot) => {
      if (gen !== this.generation || this.state !== 'resync' || !this.ch) return;
      const entries = set.list ? inSet(all, set) : all;
      const total = entries instanceof EncodedEntries ? entries.count : entries.length;
      this.resync = { set, entries, total, next: 0, started };
      this.sendFrame(FrameType.RESYNC_BEGIN, 4 + bucketSetBytes(set), (b, o) => {
        b.writeUInt32BE(total, o);
        return writeBucketSet(b, o + 4, set);
      }, 0, started);
      this.pump();
    };
    if (Array.isArray(snap) || snap instanceof EncodedEntries) go(snap);
    else snap.then(go, (e) => this.snapshotFailed(gen, e));
  }

  private snapshotFailed(gen: number, e: unknown): void {
    if (gen !== this.generation || !this.ch) return;
    // Without a snapshot the peer would keep stale state: drop and retry the whole connection.
    log().error('conntrack sync: snapshot failed', { peer: this.peer, stream: this.o.stream, error: (e as Error).message ?? String(e) });
    this.ch.close('snapshot failed');
  }

  private schedulePump(): void {
    if (this.pumpScheduled) return;
    this.pumpScheduled = true;
    // One tick of batching: a burst of push() calls goes out in full frames.
    setImmediate(() => {
      this.pumpScheduled = false;
      this.pump();
    });
  }

  private canSend(): boolean {
    return !!this.ch && !this.ch.closed && this.inflight.length < this.o.maxInflightFrames && this.inflightBytes < this.o.maxInflightBytes;
  }

  /** Writes whatever the in-flight bound allows: resync chunks first, then queued events. */
  private pump(): void {
    while (this.canSend()) {
      const r = this.resync;
      if (r) {
        if (r.next < r.total) {
          if (r.entries instanceof EncodedEntries) this.sendEncodedChunk(r, r.entries);
          else this.sendList(FrameType.RESYNC_CHUNK, { entries: r.entries, next: r.next }, this.o.chunkEntries, writeEntry, r.started, (next) => { r.next = next; });
          continue;
        }
        this.sendFrame(FrameType.RESYNC_END, 4, (b, o) => {
          b.writeUInt32BE(r.total, o);
          return o + 4;
        }, 0, r.started);
        this.resync = undefined;
        this.state = 'streaming';
        if (r.set.list) {
          this.s.bucketResyncs++;
          this.s.bucketsResent += r.set.list.length;
          log().info('conntrack sync buckets sent', { role: 'sender', peer: this.peer, stream: this.o.stream, buckets: r.set.list.length, entries: r.total, ms: Date.now() - r.started });
        } else {
          this.s.resyncs++;
          this.s.lastResyncEntries = r.total;
          this.s.lastResyncMs = Date.now() - r.started;
          log().info('conntrack sync resync sent', { role: 'sender', peer: this.peer, stream: this.o.stream, entries: r.total, ms: this.s.lastResyncMs, resyncs: this.s.resyncs });
        }
        continue;
      }
      if (this.state !== 'streaming') return;
      if (this.resyncPending) return this.startResync();
      if (this.bucketsPending) {
        const list = [...this.bucketsPending].sort((a, b) => a - b);
        this.bucketsPending = undefined;
        return this.startResync({ k: this.o.buckets, list });
      }
      if (this.queue.size === 0) return;
      this.sendEvents();
    }
  }

  /** One EVENTS frame, its list written straight from the queue's bytes. */
  private sendEvents(): void {
    const max = this.o.batchEntries;
    const room = Math.min(max * MAX_EVENT_BYTES + 4, this.o.maxFrameBytes - 128);
    let count = 0;
    let since = Date.now();
    this.sendFrame(FrameType.EVENTS, room, (b, o) => {
      const r = this.queue.writeInto(b, o + 4, o + room, max);
      b.writeUInt32BE(r.count, o);
      count = r.count;
      if (r.since < since) since = r.since;
      return r.end;
    }, () => count, () => since);
  }

  /** One RESYNC_CHUNK of entries already in wire form: as many whole entries as fit, in one copy. */
  private sendEncodedChunk(r: Resync, enc: EncodedEntries): void {
    const room = Math.min(this.o.chunkEntries * MAX_EVENT_BYTES + 4, this.o.maxFrameBytes - 128);
    const from = r.next;
    let n = Math.min(this.o.chunkEntries, r.total - from);
    while (n > 1 && 4 + enc.offsets[from + n] - enc.offsets[from] > room) n = Math.ceil(n / 2);
    const start = enc.offsets[from], end = enc.offsets[from + n];
    r.next = from + n;
    this.sendFrame(FrameType.RESYNC_CHUNK, 4 + end - start, (b, o) => {
      b.writeUInt32BE(n, o);
      enc.buf.copy(b, o + 4, start, end);
      return o + 4 + end - start;
    }, n, r.started);
  }

  private sendList<T extends ConntrackEntry | SyncEvent>(
    type: FrameType, src: { entries: T[]; next: number }, max: number, write: (b: Buffer, o: number, x: T) => number, since: number,
    advanced: (next: number) => void = () => undefined,
  ): void {
    const room = Math.min(max * MAX_EVENT_BYTES + 4, this.o.maxFrameBytes - 128);
    let sent = 0;
    this.sendFrame(type, room, (b, o) => {
      const r = writeList(b, o, o + room, src.entries, src.next, max, write, (item, e) => {
        this.s.invalidEntries++;
        log().error('conntrack sync: entry skipped, cannot encode', { peer: this.peer, error: e.message, entry: JSON.stringify(item).slice(0, 300) });
      });
      src.next = r.next;
      advanced(r.next);
      sent = r.count;
      return r.end;
    }, () => sent, since);
  }

  private sendFrame(type: FrameType, maxPayload: number, fill: (b: Buffer, o: number) => number, entries: number | (() => number), since: number | (() => number)): number {
    const ch = this.ch!;
    const seq = ch.writer.seq;
    const bytes = ch.send(type, maxPayload, fill);
    if (!bytes) return 0;
    const n = typeof entries === 'function' ? entries() : entries;
    this.inflight.push({ seq, bytes, entries: n, since: typeof since === 'function' ? since() : since });
    this.inflightBytes += bytes;
    this.inflightEntries += n;
    this.s.framesSent++;
    this.s.entriesSent += n;
    this.s.bytesSent += bytes;
    return bytes;
  }
}
