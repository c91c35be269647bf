// One authenticated sync connection, either side: frames in (MAC, session, sender and exact sequence
// checked before anything else sees them), frames out, heartbeats and the dead-peer / handshake timers.
import type * as net from 'node:net';
import { CodecError } from './entry-codec';
import { FrameReader, FrameRejected, FrameType, FrameWriter, HELLO_VERSION, claimedSender, openFrame, type Frame, type RejectReason } from './frame';

export interface ChannelTiming {
  /** Send a HEARTBEAT when nothing else went out for this long. */
  heartbeatMs: number;
  /** Drop the connection when nothing authentic came in for this long. */
  deadAfterMs: number;
  /** Drop a connection that has not finished the HELLO exchange by then. */
  handshakeTimeoutMs: number;
}

export interface ChannelHandlers {
  /** An authentic, in-sequence frame. Throwing FrameRejected or CodecError drops the connection as rejected. */
  frame(f: Frame): void;
  /** `claimed`: the sender id the refused frame names, unauthenticated (undefined when unreadable). */
  rejected(reason: RejectReason, message: string, claimed: string | undefined): void;
  /** Called once, whatever ended the connection. */
  closed(reason: string): void;
}

export class SyncChannel {
  readonly writer: FrameWriter;
  readonly openedAt = Date.now();
  /** Resolves when the socket is fully closed. */
  readonly done: Promise<void>;
  established = false;
  closed = false;
  bytesIn = 0;
  bytesOut = 0;
  private readonly reader: FrameReader;
  private recvKey: Buffer;
  /** The version the peer's frames must carry: HELLO_VERSION, then the negotiated one. */
  private recvVersion = HELLO_VERSION;
  private session: Buffer | undefined;
  private peer: Buffer | undefined;
  private expectSeq = 0;
  private lastRx = Date.now();
  private lastTx = Date.now();
  private rxPaused = false;
  private readonly timer: NodeJS.Timeout;
  private readonly tickMs: number;
  private lastTick = Date.now();

  constructor(
    readonly socket: net.Socket,
    localId: Buffer,
    handshakeKey: Buffer,
    maxFrame: number,
    private readonly timing: ChannelTiming,
    private readonly handlers: ChannelHandlers,
  ) {
    this.writer = new FrameWriter(localId, handshakeKey);
    this.recvKey = handshakeKey;
    this.reader = new FrameReader(maxFrame, (b) => this.onRaw(b), (e) => this.reject(e));
    this.done = new Promise((resolve) => socket.once('close', () => resolve()));
    socket.setNoDelay(true);
    socket.on('data', (chunk: Buffer) => {
      this.bytesIn += chunk.length;
      this.reader.push(chunk);
    });
    socket.on('error', (e) => this.close(`socket error: ${e.message}`));
    socket.on('close', () => this.close('connection closed by peer'));
    socket.on('end', () => this.close('connection ended by peer'));
    // Fine enough that a dead peer is noticed within a tenth of deadAfterMs of the deadline.
    this.tickMs = Math.max(10, Math.min(timing.heartbeatMs / 2, timing.deadAfterMs / 10));
    this.timer = setInterval(() => this.tick(), this.tickMs);
  }

  /**
   * Switches to the session keys and the negotiated protocol `version` once both proofs checked out; from
   * now on frames must name `peer` and carry `version`.
   */
  establish(sendKey: Buffer, recvKey: Buffer, session: Buffer, peer: Buffer, version: number): void {
    this.writer.key = sendKey;
    this.writer.version = version;
    this.recvVersion = version;
    this.writer.session = Buffer.from(session);
    this.recvKey = recvKey;
    this.session = Buffer.from(session);
    this.peer = Buffer.from(peer);
    this.established = true;
  }

  /** The peer's frames must carry this sender id (set during the handshake, before establish). */
  expectPeer(peer: Buffer): void {
    this.peer = Buffer.from(peer);
  }

  /** Sends one frame; returns its size, or 0 when the connection is already closed. */
  send(type: FrameType, maxPayload: number, fill?: (buf: Buffer, off: number) => number): number {
    if (this.closed) return 0;
    const frame = this.writer.build(type, maxPayload, fill);
    this.socket.write(frame);
    this.bytesOut += frame.length;
    this.lastTx = Date.now();
    return frame.length;
  }

  /** Bytes written but still in Node's socket buffer (the kernel's is full). */
  get unsentBytes(): number {
    return this.socket.writableLength;
  }

  /** Stops reading (our consumer is behind); TCP then pushes back on the peer. */
  pauseRx(): void {
    if (this.rxPaused) return;
    this.rxPaused = true;
    this.socket.pause();
  }

  resumeRx(): void {
    if (!this.rxPaused) return;
    this.rxPaused = false;
    // Silence while we were not reading says nothing about the peer.
    this.lastRx = Date.now();
    this.socket.resume();
  }

  /** Ends the connection; `graceful` lets already written frames go out first. */
  close(reason: string, graceful = false): void {
    if (this.closed) return;
    this.closed = true;
    clearInterval(this.timer);
    this.reader.stop();
    if (graceful) {
      this.socket.end();
      setTimeout(() => this.socket.destroy(), 1000).unref();
    } else {
      this.socket.destroy();
    }
    this.handlers.closed(reason);
  }

  /** Refuses the peer for `e`, letting what was already written (a last HELLO) go out first. */
  refuse(e: FrameRejected, claimed?: string): void {
    if (this.closed) return;
    this.handlers.rejected(e.reason, e.message, claimed);
    this.close(`rejected (${e.reason}): ${e.message}`, true);
  }

  private onRaw(buf: Buffer): void {
    if (this.closed) return;
    try {
      const f = openFrame(buf, this.recvKey, this.recvVersion);
      if (this.session && !f.session.equals(this.session)) throw new FrameRejected('replay', 'frame from another session');
      if (f.seq !== this.expectSeq) throw new FrameRejected('replay', `sequence ${f.seq}, expected ${this.expectSeq}`);
      if (this.peer && !f.sender.equals(this.peer)) throw new FrameRejected('auth', `sender id '${f.sender.toString()}' is not the authenticated peer`);
      this.expectSeq++;
      this.lastRx = Date.now();
      this.handlers.frame(f);
    } catch (e) {
      this.reject(e, this.peer?.toString('utf8') ?? claimedSender(buf));
    }
  }

  private reject(e: unknown, claimed?: string): void {
    if (this.closed) return;
    if (e instanceof FrameRejected || e instanceof CodecError) {
      const reason = e instanceof FrameRejected ? e.reason : 'malformed';
      this.handlers.rejected(reason, e.message, claimed ?? this.peer?.toString('utf8'));
      this.close(`rejected (${reason}): ${e.message}`);
    } else {
      this.close(`error: ${(e as Error).message ?? String(e)}`);
    }
  }

  private tick(): void {
    const now = Date.now();
    // Timers run before the socket is read in a turn of the event loop: after this process was busy
    // (a large dump or resync), the peer's frames may be waiting unread. Time the loop was stalled is
    // not time the peer was silent, so a busy node never drops a healthy stream and resyncs in a loop.
    const stalled = now - this.lastTick - this.tickMs;
    this.lastTick = now;
    if (stalled > this.tickMs) this.lastRx += stalled;
    if (!this.established) {
      if (now - this.openedAt > this.timing.handshakeTimeoutMs) {
        this.reject(new FrameRejected('timeout', `no HELLO exchange within ${this.timing.handshakeTimeoutMs} ms`));
      }
      return;
    }
    if (!this.rxPaused && now - this.lastRx > this.timing.deadAfterMs) {
      this.close(`peer silent for ${now - this.lastRx} ms`);
      return;
    }
    if (now - this.lastTx >= this.timing.heartbeatMs) this.send(FrameType.HEARTBEAT, 0);
  }
}
