// The worst delay of this thread's event loop, per second for the last two minutes and since start: how
// late a timer or a received packet is handled while the thread is busy (status, benchmarks).
import { monitorEventLoopDelay, type IntervalHistogram } from 'node:perf_hooks';

const KEEP_SECONDS = 120;

/** Measures from start() to stop() (a part of tetherd: daemon/lifecycle.ts). */
export class LoopLag {
  readonly name = 'event loop monitor';
  private readonly h: IntervalHistogram = monitorEventLoopDelay({ resolution: 10 });
  private readonly perSecond: number[] = [];
  private ever = 0;
  private timer?: NodeJS.Timeout;

  start(): void {
    this.h.enable();
    this.timer = setInterval(() => this.roll(), 1000);
    this.timer.unref();
  }

  /** Worst delay since start, ms. */
  maxMs(): number {
    return Math.max(this.ever, this.current());
  }

  /** Worst delay of each of the last seconds (oldest first; the last entry is the second under way), ms. */
  series(): number[] {
    return [...this.perSecond, this.current()];
  }

  stop(): void {
    clearInterval(this.timer);
    this.h.disable();
  }

  private current(): number {
    // The histogram starts at its maximum trackable value before its first sample.
    return this.h.count ? Math.round(this.h.max / 1e4) / 100 : 0;
  }

  private roll(): void {
    const m = this.current();
    this.ever = Math.max(this.ever, m);
    this.perSecond.push(m);
    if (this.perSecond.length > KEEP_SECONDS) this.perSecond.shift();
    this.h.reset();
  }
}
