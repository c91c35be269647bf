// tetherd's start and stop order: every part that started registers how to stop it, and a stop (a signal,
// or a part that failed to start) stops them in reverse order, each awaited with a bound, before the
// logger ends. Nothing runs or logs after that, and the exit code says how it went.
import type { Logger } from '../lib/log';

/** A start that cannot go on: `exitCode` 2 for bad configuration or arguments, 1 for the environment. */
export class StartError extends Error {
  constructor(
    readonly exitCode: number,
    message: string,
    opts: { cause?: unknown } = {},
  ) {
    super(message, opts.cause === undefined ? undefined : { cause: opts.cause });
    this.name = 'StartError';
  }
}

interface Part {
  name: string;
  stop: () => Promise<void> | void;
  timeoutMs: number;
}

export class Lifecycle {
  private readonly parts: Part[] = [];
  /** When stopAll() began (Date.now()): a part that waits within the pod's grace period counts from here. */
  stoppingSince?: number;

  constructor(private readonly logger: Logger) {}

  /** Registers a started part; parts stop in the reverse order of registration. */
  started(name: string, stop: () => Promise<void> | void, timeoutMs = 10_000): void {
    this.parts.push({ name, stop, timeoutMs });
  }

  /** Stops every registered part, last first; a part that fails or overruns is logged and the rest go on. */
  async stopAll(): Promise<void> {
    this.stoppingSince ??= Date.now();
    while (this.parts.length) {
      const p = this.parts.pop()!;
      const t0 = Date.now();
      let timer: NodeJS.Timeout | undefined;
      try {
        const done = await Promise.race([
          Promise.resolve(p.stop()).then(() => true),
          new Promise<boolean>((r) => {
            timer = setTimeout(() => r(false), p.timeoutMs);
          }),
        ]);
        if (!done) this.logger.warn('tetherd: part did not stop in time; going on', { part: p.name, timeoutMs: p.timeoutMs });
        else this.logger.debug('tetherd: part stopped', { part: p.name, ms: Date.now() - t0 });
      } catch (e) {
        this.logger.warn('tetherd: part failed to stop cleanly', { part: p.name, error: (e as Error).message });
      } finally {
        clearTimeout(timer);
      }
    }
  }
}

/**
 * Resolves with the first SIGTERM or SIGINT. Installed before anything starts, so a signal that arrives
 * during start-up stops tetherd cleanly as soon as the start step under way returns.
 */
export function stopSignal(): { signal: Promise<NodeJS.Signals>; dispose: () => void } {
  let resolve!: (s: NodeJS.Signals) => void;
  const signal = new Promise<NodeJS.Signals>((r) => {
    resolve = r;
  });
  const onTerm = () => resolve('SIGTERM');
  const onInt = () => resolve('SIGINT');
  process.once('SIGTERM', onTerm);
  process.once('SIGINT', onInt);
  return {
    signal,
    dispose: () => {
      process.off('SIGTERM', onTerm);
      process.off('SIGINT', onInt);
    },
  };
}

/** Ends the logger and waits until everything written has left; later writes are dropped, not thrown. */
export function endLogger(logger: Logger): Promise<void> {
  return new Promise((resolve) => {
    // A write after the end is a bug to fix, but it must not turn a clean stop into a crash.
    logger.on('error', () => undefined);
    logger.on('finish', () => resolve());
    logger.end();
  });
}
