// Jittered exponential backoff for everything that retries against the API server (watches, lists, the
// Lease). Without jitter, a thousand tetherds that lost the API server together come back together, in
// lock-step, every retry: the thundering herd that keeps a recovering API server down.

/**
 * Exponential delays, capped, with "equal jitter": half of each delay is fixed (so a failing server is
 * really backed off from) and half is random (so nodes that failed together spread out).
 */
export class Backoff {
  private attempt = 0;

  constructor(
    readonly minMs: number,
    readonly maxMs: number,
    private readonly random: () => number = Math.random,
  ) {}

  /** The delay before the next retry; each call doubles the ceiling up to maxMs. */
  next(): number {
    const ceil = Math.min(this.maxMs, this.minMs * 2 ** this.attempt);
    this.attempt++;
    return Math.round(ceil / 2 + (this.random() * ceil) / 2);
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
