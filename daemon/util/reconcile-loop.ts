// The one loop every subsystem's reconciler runs on (level-triggered): passes never overlap, a request
// while a pass runs causes exactly one more pass after it, a failed pass is reported and the loop goes on,
// and stop() waits for the pass under way and starts no new one. Nobody writes their own busy/again loop.

export interface ReconcileLoopOptions {
  /** One pass: converges to what is wanted now. May call request() to have another pass right after. */
  run: () => unknown;
  /** A pass's error (logged by the caller, at its level, naming its subsystem); the loop goes on. */
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
}

export class ReconcileLoop {
  private timer?: NodeJS.Timeout;
  private current?: Promise<void>;
  private again = false;
  private stopped = false;
  private armed = false;

  constructor(private readonly o: ReconcileLoopOptions) {
    if (o.jitter !== undefined && !(o.jitter >= 0 && o.jitter < 1)) throw new RangeError(`reconcile loop: jitter ${o.jitter} is not a fraction in [0, 1)`);
    if (o.everyMs !== undefined && !(o.everyMs > 0)) throw new RangeError(`reconcile loop: everyMs ${o.everyMs} is not a positive period`);
  }

  /** A pass is running now. */
  get running(): boolean {
    return this.current !== undefined;
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
    const j = this.o.jitter ?? 0;
    const ms = this.o.everyMs! * (1 + j * (2 * Math.random() - 1));
    this.timer = setTimeout(() => {
      if (this.stopped) return;
      if (!(this.o.skipBusyTicks && this.current)) this.request();
      this.arm();
    }, ms);
    this.timer.unref();
  }

  /**
   * Runs a pass now, or once more right after the one under way (however many requests came meanwhile).
   * Resolves when the passes that cover this request are done; never rejects. After stop(), runs nothing.
   */
  kick(): Promise<void> {
    if (this.current) {
      if (!this.stopped) this.again = true;
      return this.current;
    }
    if (this.stopped) return Promise.resolve();
    let settle!: () => void;
    const p = new Promise<void>((r) => (settle = r));
    // Set before the first pass starts, so a request made by the pass itself (synchronously) is coalesced.
    this.current = p;
    void this.passes().finally(() => {
      this.current = undefined;
      settle();
    });
    return p;
  }

  /** kick() without waiting. */
  request(): void {
    void this.kick();
  }

  private async passes(): Promise<void> {
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
      }
    } while (this.again && !this.stopped);
  }

  /**
   * No new pass (periodic or requested) from now on; waits for the one under way, at most `timeoutMs`
   * when given. True when nothing runs any more.
   */
  async stop(timeoutMs?: number): Promise<boolean> {
    this.stopped = true;
    clearTimeout(this.timer);
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
