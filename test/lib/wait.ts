// Polling for kernel tests: wait until a condition holds or a deadline passes, never a fixed sleep.

export const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

/**
 * Resolves with the milliseconds it took once cond() is true; rejects after timeoutMs with an error that
 * names what was awaited and, when given, what was last seen (describe() is called only on timeout).
 */
export async function waitFor(cond: () => boolean, what: string, opts: { timeoutMs?: number; intervalMs?: number; describe?: () => string } = {}): Promise<number> {
  const timeoutMs = opts.timeoutMs ?? 5000;
  const t0 = Date.now();
  while (!cond()) {
    if (Date.now() - t0 > timeoutMs) {
      throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}${opts.describe ? `; last seen: ${opts.describe()}` : ''}`);
    }
    await sleep(opts.intervalMs ?? 25);
  }
  return Date.now() - t0;
}

/**
 * Resolves with fn's first truthy value, polling every 150 ms (a throw counts as not yet); rejects after
 * timeoutMs naming what was awaited and the last error seen. For async conditions (status over a socket).
 */
export async function until<T>(what: string, fn: () => Promise<T | undefined | false>, timeoutMs = 20_000): Promise<T> {
  const end = Date.now() + timeoutMs;
  let last: unknown;
  for (;;) {
    try {
      const v = await fn();
      if (v) return v;
    } catch (e) {
      last = e;
    }
    if (Date.now() > end) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}${last ? ` (last error: ${(last as Error).message})` : ''}`);
    await sleep(150);
  }
}
