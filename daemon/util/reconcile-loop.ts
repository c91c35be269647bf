// The one loop every subsystem's reconciler runs on (level-triggered): passes never overlap, a request
// while a pass runs causes exactly one more pass after it, a failed pass is reported and run again after a
// capped exponential backoff (lib/backoff.ts; requests meanwhile join that retry), and stop() waits for the
// pass under way and starts no new one. Nobody writes their own busy/again loop.
import { Backoff, jittered } from '../../lib/backoff';

/** A failing loop without a period of its own is retried at least this often. */
const RETRY_MAX_MS = 30_000;
/** The first retry of a failing loop comes after at most this long (or its period, when shorter). */
const RETRY_MIN_MS = 1000;

export interface ReconcileLoopOptions {
  /** One pass: converges to what is wanted now. May call request() to have another pass right after. */
  run: () => unknown;
  /** A pass's error (logged by the caller, at its level, naming its subsystem); the pass is retried. */
  onError: (e: Error) => void;
  /** A pass at least this often besides the requests (none when absent). */
  everyMs?: number;
  /** Spread of the period, a fraction of it: each wait is everyMs × (1 ± jitter), so nodes do not beat together. */
  jitter?: number;
  /**
   * A periodic pass that falls due while a pass runs is dropped instead of queued (requests still queue
   * one): for passes whose load on a shared store or API matters more than running right after a slow one.
   */
  skipBusyTicks?: boolean;
  /**
   * The period counts from the end of the last pass (the next one comes everyMs after it) instead of
   * running on a clock of its own (so no periodic pass falls due during one); after a failed pass the
   * retry's backoff stands in for it.
   */
  periodAfterPass?: boolean;
  /**
   * The waits before a failed pass runs again: a pass that succeeds resets it, and its owner may too (a
   * connection that came up). Default: from RETRY_MIN_MS (or the period, when shorter) doubling up to the
   * period (RETRY_MAX_MS without one), equal jitter, so a failing loop runs at least as often as its period.
   */
  backoff?: Backoff;
  /** Its timers (period, retry) hold the process up, as a lease or a connection kept up should; by default they do not. */
  holdsProcess?: boolean;
}

export class ReconcileLoop {
  private timer?: NodeJS.Timeout;
  private current?: Promise<void>;
  private again = false;
  private stopped = false;
  private armed = false;
  private readonly backoff: Backoff;
  /** A failed pass waiting out its backoff: requests meanwhile resolve with the retry's passes. */
  private retry?: { timer: NodeJS.Timeout; done: Promise<void>; settle: () => void };

  constructor(private readonly o: ReconcileLoopOptions) {
    if (o.jitter !== undefined && !(o.jitter >= 0 && o.jitter < 1)) throw new RangeError(`reconcile loop: jitter ${o.jitter} is not a fraction in [0, 1)`);
    if (o.everyMs !== undefined && !(o.everyMs > 0)) throw new RangeError(`reconcile loop: everyMs ${o.everyMs} is not a positive period`);
    const cap = o.everyMs ?? RETRY_MAX_MS;
    this.backoff = o.backoff ?? new Backoff(Math.min(RETRY_MIN_MS, cap), cap);
  }

  /** A pass is running now. */
  get running(): boolean {
    return this.current !== undefined;
  }

  /** A failed pass waits for its retry. */
  get backingOff(): boolean {
    return this.retry !== undefined;
  }

  get stopping(): boolean {
    return this.stopped;
  }

  /** Arms the period: the first periodic pass comes one period from now (kick() for one now). Idempotent. */
  start(): this {
    if (this.stopped || this.armed || !this.o.everyMs) return this;
    this.armed = true;
    this.arm();
    return this;
  }

  private arm(): void {
    clearTimeout(this.timer);
    this.timer = setTimeout(() => {
      if (this.stopped) return;
      if (!((this.o.skipBusyTicks || this.o.periodAfterPass) && this.current)) this.request();
      if (!this.o.periodAfterPass) this.arm();
    }, jittered(this.o.everyMs!, this.o.jitter ?? 0));
    if (!this.o.holdsProcess) this.timer.unref();
  }

  /**
   * Runs a pass now, or once more right after the one under way (however many requests came meanwhile),
   * or with the retry of a failed pass. Resolves when the passes that cover this request are done; never
   * rejects. After stop(), runs nothing.
   */
  kick(): Promise<void> {
    if (this.retry) return this.retry.done;
    if (this.current) {
      if (!this.stopped) this.again = true;
      return this.current;
    }
    if (this.stopped) return Promise.resolve();
    let settle!: () => void;
    const p = new Promise<void>((r) => (settle = r));
    // Set before the first pass starts, so a request made by the pass itself (synchronously) is coalesced.
    this.current = p;
    void this.passes().then((failed) => {
      this.current = undefined;
      if (failed && !this.stopped) {
        // The requests made during the failed pass are owed a pass: the retry.
        const owed = this.again;
        this.again = false;
        const retry = this.retryLater();
        if (owed) return void retry.then(settle);
      } else if (!failed && this.armed && this.o.periodAfterPass && !this.stopped) this.arm();
      settle();
    });
    return p;
  }

  /** kick() without waiting. */
  request(): void {
    void this.kick();
  }

  /** Resolves when the passes under way and those owed right after them are done (not a retry's wait). */
  async idle(): Promise<void> {
    while (this.current) await this.current;
  }

  /** Passes while requested; true when the last one failed (the rest wait for its retry). */
  private async passes(): Promise<boolean> {
    do {
      this.again = false;
      try {
        await this.o.run();
      } catch (e) {
        try {
          this.o.onError(e instanceof Error ? e : new Error(String(e)));
        } catch {
          // A broken error handler must not end the loop either.
        }
        return true;
      }
      this.backoff.reset();
    } while (this.again && !this.stopped);
    return false;
  }

  private retryLater(): Promise<void> {
    if (this.o.periodAfterPass) clearTimeout(this.timer);
    let settle!: () => void;
    const done = new Promise<void>((r) => (settle = r));
    const timer = setTimeout(() => {
      this.retry = undefined;
      void this.kick().then(settle);
    }, this.backoff.next());
    if (!this.o.holdsProcess) timer.unref();
    this.retry = { timer, done, settle };
    return done;
  }

  /**
   * No new pass (periodic, requested or retried) from now on; waits for the one under way, at most
   * `timeoutMs` when given. True when nothing runs any more.
   */
  async stop(timeoutMs?: number): Promise<boolean> {
    this.stopped = true;
    clearTimeout(this.timer);
    if (this.retry) {
      clearTimeout(this.retry.timer);
      this.retry.settle();
      this.retry = undefined;
    }
    const p = this.current;
    if (!p) return true;
    if (timeoutMs === undefined) {
      await p;
      return true;
    }
    let timer: NodeJS.Timeout | undefined;
    const done = await Promise.race([p.then(() => true), new Promise<boolean>((r) => (timer = setTimeout(() => r(false), timeoutMs)))]);
    clearTimeout(timer);
    return done;
  }
}
