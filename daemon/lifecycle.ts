// tetherd's (and tether-operator's) start and stop order: parts of one shape are started in order, each registered as it starts,
// and a stop (a signal, or a part that failed to start) stops them in reverse order, each awaited with a
// bound, before the logger ends. Nothing runs or logs after that, and the exit code says how it went.
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

/**
 * One part of tetherd, of one shape: started in the order of the list it comes in, stopped in the reverse
 * order. Every subsystem (parts/subsystem.ts) is one; so are the stores' connections, the socket, the feed.
 */
export interface Part {
  readonly name: string;
  /** Starts it; once this returns, its stop is registered. A start that throws registers nothing. */
  start(): Promise<void> | void;
  /** `stoppingSince`: when the stop began (Date.now()): a part that waits within the pod's grace period counts from there. */
  stop(stoppingSince: number): Promise<void> | void;
  /** How long its stop may take before the rest go on (default 10 s). */
  readonly stopBudgetMs?: number;
}

const STOP_BUDGET_MS = 10_000;

export class Lifecycle {
  private readonly parts: Part[] = [];
  /** When stopAll() began (Date.now()). */
  stoppingSince?: number;

  constructor(private readonly logger: Logger) {}

  /**
   * Starts the parts in the order `parts` yields them: each is started before the next is asked for (so
   * what one started is there for the next to be built from) and its stop registered once its start
   * returns. Resolves with what `parts` returns. A failed start throws: stopAll() then stops what started.
   */
  async start<R>(parts: AsyncGenerator<Part, R, void>): Promise<R> {
    for (;;) {
      const next = await parts.next();
      if (next.done) return next.value;
      await next.value.start();
      this.parts.push(next.value);
    }
  }

  /** Stops every started part, last first; a part that fails or overruns is logged and the rest go on. */
  async stopAll(): Promise<void> {
    const since = (this.stoppingSince ??= Date.now());
    while (this.parts.length) {
      const p = this.parts.pop()!;
      const timeoutMs = p.stopBudgetMs ?? STOP_BUDGET_MS;
      const t0 = Date.now();
      let timer: NodeJS.Timeout | undefined;
      try {
        const done = await Promise.race([
          Promise.resolve(p.stop(since)).then(() => true),
          new Promise<boolean>((r) => {
            timer = setTimeout(() => r(false), timeoutMs);
          }),
        ]);
        if (!done) this.logger.warn('tetherd: part did not stop in time; going on', { part: p.name, timeoutMs });
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
 * `p`'s stop alone, registered where this comes in the list: for a part that must stop after the parts
 * that follow it but starts only after them (its start is called by hand, later).
 */
export function stopOnly(p: Part): Part {
  return { name: p.name, start: () => undefined, stop: (since) => p.stop(since), stopBudgetMs: p.stopBudgetMs };
}

/** A connection as a part: opened at start (`value` from then on), closed at stop. */
export class Connection<T extends { close(): Promise<void> }> implements Part {
  private opened?: T;

  constructor(
    readonly name: string,
    private readonly open: () => Promise<T>,
  ) {}

  async start(): Promise<void> {
    this.opened = await this.open();
  }

  get value(): T {
    if (!this.opened) throw new Error(`${this.name}: not started`);
    return this.opened;
  }

  async stop(): Promise<void> {
    await this.opened?.close();
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

/**
 * A process's whole life (tetherd's, tether-operator's): its parts started in order, then stopped in reverse
 * on the first SIGTERM or SIGINT, or at once when a start fails; the logger ended last. Resolves with the
 * exit code: 0, or the failed start's (StartError's, else 1).
 */
export async function runParts(name: string, logger: Logger, parts: AsyncGenerator<Part, unknown, void>): Promise<number> {
  const stop = stopSignal();
  const life = new Lifecycle(logger);
  let code = 0;
  try {
    await life.start(parts);
    const signal = await stop.signal;
    logger.info(`${name} stopping`, { signal });
    await life.stopAll();
    logger.info(`${name} stopped`, { signal });
  } catch (e) {
    code = e instanceof StartError ? e.exitCode : 1;
    logger.error(`${name}: start failed`, { error: (e as Error).message, ...(e instanceof StartError ? {} : { stack: (e as Error).stack }) });
    await life.stopAll();
  } finally {
    stop.dispose();
  }
  await endLogger(logger);
  return code;
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
