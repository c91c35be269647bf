// Work a subsystem started and has not finished (a reconcile pass, a handover, a resync being applied),
// so that stopping it can wait for that work instead of letting it log or touch the kernel afterwards.

export class InFlight {
  private readonly pending = new Set<Promise<unknown>>();
  private closing = false;

  /** True once close() was called: callers start no new work. */
  get stopping(): boolean {
    return this.closing;
  }

  get size(): number {
    return this.pending.size;
  }

  /**
   * Runs `fn` unless stopping, and keeps its promise until it settles. Errors go to the returned promise,
   * which resolves to undefined when the work was not started because a stop is under way.
   */
  run<T>(fn: () => Promise<T>): Promise<T | undefined> {
    if (this.closing) return Promise.resolve(undefined);
    const p = fn();
    this.pending.add(p);
    const forget = () => this.pending.delete(p);
    p.then(forget, forget);
    return p;
  }

  /** Starts no new work and waits for what runs to settle, at most `timeoutMs`; true when all did. */
  async close(timeoutMs: number): Promise<boolean> {
    this.closing = true;
    const deadline = Date.now() + timeoutMs;
    while (this.pending.size) {
      const left = deadline - Date.now();
      if (left <= 0) return false;
      let timer: NodeJS.Timeout | undefined;
      await Promise.race([
        Promise.allSettled([...this.pending]),
        new Promise((r) => {
          timer = setTimeout(r, left);
        }),
      ]);
      clearTimeout(timer);
    }
    return true;
  }
}
