// One BFD session in asynchronous mode (RFC 5880 §6.2, §6.8): state machine, transmit pacing with jitter,
// detection timer, Poll/Final for timer changes, authentication, counters. No sockets: the endpoint feeds
// decoded packets in and gives a send function, so unit tests can drive it with a fake clock.
import { EventEmitter } from 'node:events';
import { randomBytes } from 'node:crypto';
import { ErrorCode, TetherError } from '../../lib/errors';
import { log } from '../../lib/log';
import { authLen, resolveAuth, SeqWindow, signPacket, verifyDigest, type BfdAuthConfig, type ResolvedAuth } from './auth';
import type { Clock } from './clock';
import { BfdDiag, BfdState, encodeControl, type BfdControl } from './packet';

export type BfdRejectReason = 'malformed' | 'noSession' | 'wrongSource' | 'authMismatch' | 'badKeyId' | 'badDigest' | 'replay';
export const REJECT_REASONS: readonly BfdRejectReason[] = ['malformed', 'noSession', 'wrongSource', 'authMismatch', 'badKeyId', 'badDigest', 'replay'];

/** What happened to one received packet: accepted, or the reason it was dropped and counted. */
export type BfdVerdict = 'accepted' | BfdRejectReason;

export interface BfdSessionOptions {
  desiredMinTxUs?: number;
  requiredMinRxUs?: number;
  detectMult?: number;
  /** Without it packets are unauthenticated: only for tests; tetherd always configures a key. */
  auth?: BfdAuthConfig;
}

/** What the endpoint provides to a session. */
export interface BfdSessionIo {
  peer: string;
  clock: Clock;
  send(packet: Buffer): void;
  /** A random nonzero discriminator not used by any other session of the endpoint. */
  allocDiscr(): number;
}

export interface BfdStateChange {
  from: BfdState;
  to: BfdState;
  diag: BfdDiag;
  /** Clock time of the change (ms). */
  at: number;
  /** Time since the last valid packet from the peer; for diag 1 this is how long detection took. */
  sinceLastRxMs: number;
}

export interface BfdSessionStats {
  peer: string;
  state: keyof typeof BfdState;
  diag: keyof typeof BfdDiag;
  localDiscr: number;
  remoteDiscr: number;
  rx: number;
  tx: number;
  rejected: Record<BfdRejectReason, number>;
  ups: number;
  downs: number;
}

/** §6.8.3: while not Up, transmit no faster than once a second. */
const SLOW_TX_US = 1_000_000;

export function emptyRejects(): Record<BfdRejectReason, number> {
  return Object.fromEntries(REJECT_REASONS.map((r) => [r, 0])) as Record<BfdRejectReason, number>;
}

function checkTimers(o: Required<Omit<BfdSessionOptions, 'auth'>>): void {
  // Below a millisecond Node timers cannot keep up; 0 (RequiredMinRx "do not send") is not useful here.
  for (const k of ['desiredMinTxUs', 'requiredMinRxUs'] as const) {
    if (!Number.isInteger(o[k]) || o[k] < 1000 || o[k] > 0xffffffff) throw new TetherError(ErrorCode.InvalidConfig, `bfd ${k}: ${o[k]} is not an integer of 1000..4294967295 µs`);
  }
  if (!Number.isInteger(o.detectMult) || o.detectMult < 1 || o.detectMult > 255) throw new TetherError(ErrorCode.InvalidConfig, `bfd detectMult: ${o.detectMult} is not 1..255`);
}

export class BfdSession extends EventEmitter {
  readonly peer: string;
  private readonly io: BfdSessionIo;
  private readonly auth?: ResolvedAuth;
  private cfg: Required<Omit<BfdSessionOptions, 'auth'>>;

  private st = BfdState.Down;
  private localDiag = BfdDiag.None;
  private _localDiscr: number;
  private _remoteDiscr = 0;
  private remoteDiag = BfdDiag.None;
  /** §6.8.1 initial value 1 µs: until the peer speaks, our own rate decides. */
  private remoteMinRxUs = 1;
  private remoteDesiredTxUs = 0;
  private remoteDetectMult = 0;

  private xmitSeq = randomBytes(4).readUInt32BE(0);
  private readonly rcvSeq = new SeqWindow();

  // Values in force, which lag the advertised ones during a Poll Sequence (§6.8.3): a slower TX rate or a
  // smaller RequiredMinRx only takes effect once the peer has acknowledged it with Final.
  private txUsInUse = SLOW_TX_US;
  private rxUsForDetect: number;
  private pollActive = false;
  private repoll = false;

  private lastTxAt = -Infinity;
  private lastRxAt = -Infinity;
  private scheduledTxUs = 0;
  private txTimer: unknown;
  private detectTimer: unknown;
  private forgetTimer: unknown;
  private started = false;
  private closed = false;

  private counters = { rx: 0, tx: 0, ups: 0, downs: 0, rejected: emptyRejects() };

  constructor(io: BfdSessionIo, opts: BfdSessionOptions = {}) {
    super();
    this.io = io;
    this.peer = io.peer;
    this.cfg = { desiredMinTxUs: opts.desiredMinTxUs ?? 100_000, requiredMinRxUs: opts.requiredMinRxUs ?? 100_000, detectMult: opts.detectMult ?? 3 };
    checkTimers(this.cfg);
    this.auth = opts.auth ? resolveAuth(opts.auth) : undefined;
    this.rxUsForDetect = this.cfg.requiredMinRxUs;
    this.txUsInUse = this.advertisedTxUs();
    this._localDiscr = io.allocDiscr();
  }

  get state(): BfdState {
    return this.st;
  }
  get localDiscr(): number {
    return this._localDiscr;
  }
  get remoteDiscr(): number {
    return this._remoteDiscr;
  }
  get diag(): BfdDiag {
    return this.localDiag;
  }

  /** Detection time (ms) as currently computed (§6.8.4), Infinity before the peer has been heard. */
  detectionTimeMs(): number {
    if (!this.remoteDetectMult) return Infinity;
    return (this.remoteDetectMult * Math.max(this.rxUsForDetect, this.remoteDesiredTxUs)) / 1000;
  }

  /** Current transmit interval before jitter (ms). */
  txIntervalMs(): number {
    return Math.max(this.txUsInUse, this.remoteMinRxUs) / 1000;
  }

  stats(): BfdSessionStats {
    return {
      peer: this.peer,
      state: BfdState[this.st] as keyof typeof BfdState,
      diag: BfdDiag[this.localDiag] as keyof typeof BfdDiag,
      localDiscr: this._localDiscr,
      remoteDiscr: this._remoteDiscr,
      rx: this.counters.rx,
      tx: this.counters.tx,
      rejected: { ...this.counters.rejected },
      ups: this.counters.ups,
      downs: this.counters.downs,
    };
  }

  /** Begins periodic transmission; the endpoint calls it once the session's source port is bound. */
  start(): void {
    if (this.started || this.closed) return;
    this.started = true;
    this.scheduleTx();
  }

  /** Counts a packet dropped before it could be handed to receive() (e.g. malformed, from our peer). */
  countRejected(reason: BfdRejectReason): void {
    this.counters.rejected[reason]++;
  }

  /**
   * Handles one decoded packet already demultiplexed to this session. `packet` is the datagram cut to its
   * Length field (the digest covers exactly that). Returns the verdict, counted in stats().
   */
  receive(p: BfdControl, packet: Buffer): BfdVerdict {
    if (this.closed) return 'noSession';
    const verdict = this.authenticate(p, packet);
    if (verdict !== 'accepted') {
      this.counters.rejected[verdict]++;
      return verdict;
    }
    const now = this.io.clock.now();
    this.counters.rx++;
    this.lastRxAt = now;
    this._remoteDiscr = p.myDiscr;
    this.remoteDiag = p.diag;
    this.remoteMinRxUs = p.requiredMinRxUs;
    this.remoteDesiredTxUs = p.desiredMinTxUs;
    this.remoteDetectMult = p.detectMult;
    this.armForget();
    if (p.final && this.pollActive) this.endPoll();
    this.refreshTx();

    if (this.st !== BfdState.AdminDown) {
      if (p.state === BfdState.AdminDown) {
        if (this.st !== BfdState.Down) this.setState(BfdState.Down, BfdDiag.NeighborSignaledDown);
      } else if (this.st === BfdState.Down) {
        if (p.state === BfdState.Down) this.setState(BfdState.Init, BfdDiag.None);
        else if (p.state === BfdState.Init) this.setState(BfdState.Up, BfdDiag.None);
      } else if (this.st === BfdState.Init) {
        if (p.state === BfdState.Init || p.state === BfdState.Up) this.setState(BfdState.Up, BfdDiag.None);
      } else if (p.state === BfdState.Down) {
        this.setState(BfdState.Down, BfdDiag.NeighborSignaledDown);
      }
      if (this.st === BfdState.Init || this.st === BfdState.Up) this.armDetect();
    }
    // §6.8.6: answer a Poll at once, outside the periodic schedule.
    if (p.poll && !this.closed) this.transmit(true);
    return 'accepted';
  }

  /** Changes timers; when Up this runs a Poll Sequence (§6.8.3) before slower values take effect. */
  setTimers(opts: Omit<BfdSessionOptions, 'auth'>): void {
    const next = { ...this.cfg, ...opts };
    checkTimers(next);
    const prevAdv = this.advertisedTxUs();
    const prev = this.cfg;
    this.cfg = next;
    this.timersChanged(prevAdv, prev.requiredMinRxUs, prev.detectMult);
  }

  /** Holds the session AdminDown (diag 7); the peer sees AdminDown and goes Down with diag 3. */
  adminDown(): void {
    if (this.closed) return;
    this.setState(BfdState.AdminDown, BfdDiag.AdministrativelyDown);
  }

  /** Leaves AdminDown; the session then comes Up through the usual three-way handshake. */
  adminUp(): void {
    if (this.closed || this.st !== BfdState.AdminDown) return;
    this.setState(BfdState.Down, BfdDiag.None);
  }

  /** Stops the session; tells the peer with one AdminDown packet so it does not wait for detection time. */
  close(): void {
    if (this.closed) return;
    this.setState(BfdState.AdminDown, BfdDiag.AdministrativelyDown);
    if (this.started) this.transmit(false);
    this.closed = true;
    for (const t of [this.txTimer, this.detectTimer, this.forgetTimer]) if (t !== undefined) this.io.clock.clearTimeout(t);
    this.emit('close');
  }

  private authenticate(p: BfdControl, packet: Buffer): BfdVerdict {
    const a = this.auth;
    // §6.8.6: the A bit must agree with our configuration either way.
    if (!a) return p.auth ? 'authMismatch' : 'accepted';
    if (!p.auth || p.auth.type !== a.type || packet.length !== 24 + authLen(a)) return 'authMismatch';
    if (p.auth.keyId !== a.keyId) return 'badKeyId';
    // Digest before sequence: a forgery is counted as such, and only genuine packets are called replays.
    if (!verifyDigest(a, packet)) return 'badDigest';
    if (!this.rcvSeq.check(p.auth.seq, p.detectMult, a.meticulous)) {
      // A restarted peer starts from a new random sequence and says Down with Your Discriminator 0. While
      // we are not Up, such a packet starts a new incarnation at once instead of after 2 × detection time
      // (see armForget): the old sequence and our discriminator are dropped together, so a replayed
      // capture of this kind can move Down → Init at most, and captured Init/Up packets, which name the old
      // discriminator, can no longer complete a handshake.
      if (this.st === BfdState.Up || p.yourDiscr !== 0) return 'replay';
      this.forgetPeer('re-anchored by a Down packet with a new sequence');
    }
    this.rcvSeq.commit(p.auth.seq);
    return 'accepted';
  }

  private advertisedTxUs(): number {
    return this.st === BfdState.Up ? this.cfg.desiredMinTxUs : Math.max(this.cfg.desiredMinTxUs, SLOW_TX_US);
  }

  private timersChanged(prevAdvTxUs: number, prevReqRxUs: number, prevDetectMult: number): void {
    const adv = this.advertisedTxUs();
    const up = this.st === BfdState.Up;
    if (!up) {
      // Nothing to protect outside Up: the peer is not timing us against a fast rate.
      this.pollActive = false;
      this.repoll = false;
    } else if (adv !== prevAdvTxUs || this.cfg.requiredMinRxUs !== prevReqRxUs || this.cfg.detectMult !== prevDetectMult) {
      if (this.pollActive) this.repoll = true;
      this.pollActive = true;
    }
    // Faster TX and a larger RequiredMinRx are safe at once; the opposite waits for Final (endPoll).
    if (!up || !this.pollActive || adv <= this.txUsInUse) this.txUsInUse = adv;
    if (!up || !this.pollActive || this.cfg.requiredMinRxUs >= this.rxUsForDetect) this.rxUsForDetect = this.cfg.requiredMinRxUs;
    this.refreshTx();
    if (this.st === BfdState.Init || this.st === BfdState.Up) this.armDetect();
  }

  private endPoll(): void {
    // A change made while this Poll was in flight may not be what the Final acknowledges: poll again.
    if (this.repoll) {
      this.repoll = false;
      return;
    }
    this.pollActive = false;
    this.txUsInUse = this.advertisedTxUs();
    this.rxUsForDetect = this.cfg.requiredMinRxUs;
    if (this.st === BfdState.Init || this.st === BfdState.Up) this.armDetect();
  }

  private setState(to: BfdState, diag: BfdDiag): void {
    const from = this.st;
    if (from === to) return;
    const prevAdv = this.advertisedTxUs();
    const now = this.io.clock.now();
    this.st = to;
    this.localDiag = diag;
    if (to === BfdState.Up) this.counters.ups++;
    if (from === BfdState.Up) this.counters.downs++;
    if (to !== BfdState.Init && to !== BfdState.Up && this.detectTimer !== undefined) {
      this.io.clock.clearTimeout(this.detectTimer);
      this.detectTimer = undefined;
    }
    this.timersChanged(prevAdv, this.cfg.requiredMinRxUs, this.cfg.detectMult);
    const change: BfdStateChange = { from, to, diag, at: now, sinceLastRxMs: now - this.lastRxAt };
    log().info('bfd session state changed', {
      peer: this.peer,
      from: BfdState[from],
      to: BfdState[to],
      diag: BfdDiag[diag],
      remoteDiag: BfdDiag[this.remoteDiag],
      localDiscr: this._localDiscr,
      remoteDiscr: this._remoteDiscr,
      sinceLastRxMs: Number.isFinite(change.sinceLastRxMs) ? Math.round(change.sinceLastRxMs * 10) / 10 : null,
      detectionTimeMs: Number.isFinite(this.detectionTimeMs()) ? this.detectionTimeMs() : null,
      txIntervalMs: this.txIntervalMs(),
    });
    this.emit('state', change);
    if (to === BfdState.Up) this.emit('up', change);
    if (from === BfdState.Up) this.emit('down', change);
  }

  // --- timers ---

  private jitteredMs(): number {
    // §6.8.7: 0–25 % shorter, and at most 90 % of the interval when Detect Mult is 1.
    const r = Math.random();
    const factor = this.cfg.detectMult === 1 ? 0.75 + 0.15 * r : 0.75 + 0.25 * r;
    return this.txIntervalMs() * factor;
  }

  private refreshTx(): void {
    // Only a faster rate reschedules. A slower one starts after the packet already due: that packet tells
    // the peer about the change (e.g. leaving Up) while its detection time still assumes the fast rate.
    const us = Math.max(this.txUsInUse, this.remoteMinRxUs);
    if (this.started && !this.closed && us < this.scheduledTxUs) this.scheduleTx();
  }

  private scheduleTx(): void {
    const clock = this.io.clock;
    if (this.txTimer !== undefined) clock.clearTimeout(this.txTimer);
    this.txTimer = undefined;
    if (this.closed) return;
    this.scheduledTxUs = Math.max(this.txUsInUse, this.remoteMinRxUs);
    const due = this.lastTxAt + this.jitteredMs();
    this.txTimer = clock.setTimeout(() => {
      this.txTimer = undefined;
      this.transmit(false);
      this.scheduleTx();
    }, Math.max(0, due - clock.now()));
  }

  private armDetect(): void {
    const clock = this.io.clock;
    if (this.detectTimer !== undefined) clock.clearTimeout(this.detectTimer);
    this.detectTimer = undefined;
    const det = this.detectionTimeMs();
    if (!Number.isFinite(det) || this.closed) return;
    this.detectTimer = clock.setTimeout(() => {
      this.detectTimer = undefined;
      if (this.st !== BfdState.Init && this.st !== BfdState.Up) return;
      this.setState(BfdState.Down, BfdDiag.ControlDetectionTimeExpired);
      // §6.8.1: the peer's discriminator is forgotten once a detection time passes in silence.
      this._remoteDiscr = 0;
      // The forget deadline may have passed while Up under a shorter detection time: set it again.
      this.armForget();
    }, Math.max(0, this.lastRxAt + det - clock.now()));
  }

  /**
   * §6.8.1: after twice the detection time without a valid packet, bfd.AuthSeqKnown goes back to 0 so a
   * restarted peer (new random sequence) is accepted. Packets captured earlier would then pass the sequence
   * check, so the local discriminator changes at the same moment: old captures name a discriminator that no
   * longer exists and are dropped as noSession. At worst a captured Down packet (Your Discriminator 0) moves
   * the session to Init; reaching Up needs a fresh packet naming the new discriminator, which needs the key.
   */
  private armForget(): void {
    const clock = this.io.clock;
    if (this.forgetTimer !== undefined) clock.clearTimeout(this.forgetTimer);
    this.forgetTimer = undefined;
    const det = this.detectionTimeMs();
    if (!Number.isFinite(det) || this.closed) return;
    this.forgetTimer = clock.setTimeout(() => {
      this.forgetTimer = undefined;
      if (this.st === BfdState.Init || this.st === BfdState.Up) return;
      this.forgetPeer('no valid packet for 2 × detection time');
    }, Math.max(0, this.lastRxAt + 2 * det - clock.now()));
  }

  /** Ends the incarnation: bfd.AuthSeqKnown = 0, peer discriminator 0, and a new local discriminator. */
  private forgetPeer(why: string): void {
    const old = this._localDiscr;
    this.rcvSeq.reset();
    this._remoteDiscr = 0;
    this._localDiscr = this.io.allocDiscr();
    log().debug('bfd session forgot the peer incarnation', { peer: this.peer, why, oldLocalDiscr: old, localDiscr: this._localDiscr });
  }

  private transmit(final: boolean): void {
    const a = this.auth;
    const pkt = encodeControl({
      diag: this.localDiag,
      state: this.st,
      poll: this.pollActive && !final,
      final,
      cpi: false,
      demand: false,
      multipoint: false,
      detectMult: this.cfg.detectMult,
      myDiscr: this._localDiscr,
      yourDiscr: this._remoteDiscr,
      desiredMinTxUs: this.advertisedTxUs(),
      requiredMinRxUs: this.cfg.requiredMinRxUs,
      requiredMinEchoRxUs: 0,
      auth: a ? { type: a.type, keyId: a.keyId, seq: this.xmitSeq, digest: Buffer.alloc(a.digestLen) } : undefined,
    });
    if (a) {
      // Every packet gets a new number: required for meticulous, allowed (and stricter) for plain keyed.
      this.xmitSeq = (this.xmitSeq + 1) >>> 0;
      signPacket(a, pkt);
    }
    if (!final) this.lastTxAt = this.io.clock.now();
    this.counters.tx++;
    this.io.send(pkt);
  }
}
