// Jittered exponential backoff: the one computation of retry delays (watches, lists, the Lease, failed
// reconcile passes, the conntrack sync connection, queued DELs). Without jitter, a thousand tetherds that
// lost the API server together come back together, in lock-step, every retry: the thundering herd that
// keeps a recovering API server down.

/**
 * How a delay is spread around its ceiling: 'equal' jitter, half of it fixed (so a failing server is
 * really backed off from) and half random (so nodes that failed together spread out), in [ceiling/2,
 * ceiling]; or a fraction f, the ceiling moved by up to ±f (jittered()); 0 for none.
 */
export type Jitter = 'equal' | number;

/** Exponential delays, doubling from minMs up to maxMs, jittered. */
export class Backoff {
  private attempt = 0;

  constructor(
    readonly minMs: number,
    readonly maxMs: number,
    private readonly random: () => number = Math.random,
    readonly jitter: Jitter = 'equal',
  ) {
    if (jitter !== 'equal' && !(jitter >= 0 && jitter < 1)) throw new RangeError(`backoff: jitter ${jitter} is not a fraction in [0, 1)`);
  }

  /** The delay before the next retry; each call doubles the ceiling up to maxMs. */
  next(): number {
    const ceil = Math.min(this.maxMs, this.minMs * 2 ** this.attempt);
    this.attempt++;
    if (this.jitter === 'equal') return Math.round(ceil / 2 + (this.random() * ceil) / 2);
    return jittered(ceil, this.jitter, this.random);
  }

  /** Failures in a row since the last reset. */
  get failures(): number {
    return this.attempt;
  }

  reset(): void {
    this.attempt = 0;
  }
}

/** `ms` moved by up to ±fraction at random: periodic work of many nodes does not line up. */
export function jittered(ms: number, fraction = 0.2, random: () => number = Math.random): number {
  return Math.round(ms * (1 - fraction + 2 * fraction * random()));
}
