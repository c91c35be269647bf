// Fake of daemon/bfd/threaded.ts: BFD sessions whose state follows the simulation's membership instead
// of packets. A peer that is a live simulated node comes Up shortly after the session starts; a node the
// simulation kills goes Down at its peers after the session's detection time (detectMult x interval),
// as real BFD would see it. Membership is per process: the coordinator tells every worker who is alive.
import { EventEmitter } from 'node:events';
import { BfdDiag, BfdState } from '../../../../daemon/bfd/packet';
import { emptyRejects, type BfdSessionOptions, type BfdStateChange } from '../../../../daemon/bfd/session';
import type { BfdThreadStats } from '../../../../daemon/bfd/worker-protocol';
import { record } from './record';

export interface BfdThreadOptions {
  address: string;
  port?: number;
  peerPort?: number;
}

interface Membership {
  alive: Set<string>;
  threads: Set<BfdThread>;
}
const membership: Membership = ((globalThis as Record<string, unknown>).__tetherSimBfd ??= { alive: new Set<string>(), threads: new Set<BfdThread>() }) as Membership;

/** Simulation: node addresses alive (all others are down). Sessions to nodes that changed follow. */
export function setAlive(address: string, alive: boolean): void {
  if (alive === membership.alive.has(address)) return;
  if (alive) membership.alive.add(address);
  else membership.alive.delete(address);
  for (const t of membership.threads) t.peerChanged(address);
}

const UP_AFTER_MS = 20;

export class BfdPeer extends EventEmitter {
  private st = BfdState.Down;
  private lastDiag = BfdDiag.None;
  private timer?: NodeJS.Timeout;
  closed = false;

  constructor(
    readonly peer: string,
    private opts: BfdSessionOptions,
  ) {
    super();
  }

  get state(): BfdState {
    return this.st;
  }
  get diag(): BfdDiag {
    return this.lastDiag;
  }
  setTimers(opts: Omit<BfdSessionOptions, 'auth'>): void {
    this.opts = { ...this.opts, ...opts };
  }
  close(): void {
    if (this.closed) return;
    clearTimeout(this.timer);
    this.closed = true;
    this.emit('close');
  }
  /** Schedules the state the membership says, after the delay real BFD would take. */
  follow(): void {
    if (this.closed) return;
    clearTimeout(this.timer);
    const want = membership.alive.has(this.peer) ? BfdState.Up : BfdState.Down;
    if (want === this.st) return;
    const detectMs = ((this.opts.requiredMinRxUs ?? 50_000) / 1000) * (this.opts.detectMult ?? 3);
    this.timer = setTimeout(() => this.apply(want, want === BfdState.Up ? BfdDiag.None : BfdDiag.ControlDetectionTimeExpired), want === BfdState.Up ? UP_AFTER_MS : detectMs);
    this.timer.unref();
  }
  private apply(to: BfdState, diag: BfdDiag): void {
    if (this.closed) return;
    const change: BfdStateChange = { from: this.st, to, diag, at: Date.now(), sinceLastRxMs: 0 };
    record(to === BfdState.Up ? 'bfd.up' : 'bfd.down');
    this.st = to;
    this.lastDiag = diag;
    this.emit('state', change);
    if (to === BfdState.Up) this.emit('up', change);
    if (change.from === BfdState.Up) this.emit('down', change);
  }
}

export class BfdThread {
  private readonly peers = new Map<string, BfdPeer>();
  port = 3784;

  private constructor(readonly address: string) {}

  static async open(opts: BfdThreadOptions): Promise<BfdThread> {
    record('bfd.open');
    const t = new BfdThread(opts.address);
    membership.threads.add(t);
    return t;
  }
  session(peer: string, opts: BfdSessionOptions = {}): BfdPeer {
    record('bfd.session');
    const p = new BfdPeer(peer, opts);
    p.once('close', () => this.peers.delete(peer));
    this.peers.set(peer, p);
    p.follow();
    return p;
  }
  peerChanged(address: string): void {
    this.peers.get(address)?.follow();
  }
  stats(): BfdThreadStats {
    return { rx: 0, rejected: emptyRejects(), sessions: [], loopLagMaxMs: 0, loopLagPerSecondMs: [] };
  }
  async close(): Promise<void> {
    membership.threads.delete(this);
    for (const p of [...this.peers.values()]) p.close();
  }
}
