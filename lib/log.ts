// Structured logs: winston, JSON, one line per action, naming the pod / container / VIP it concerns.
import * as winston from 'winston';

export type Logger = winston.Logger;

let root: winston.Logger | undefined;

export function makeLogger(opts: { level?: string; node?: string; stream?: NodeJS.WritableStream } = {}): winston.Logger {
  return winston.createLogger({
    level: opts.level ?? process.env.TETHER_LOG_LEVEL ?? 'info',
    defaultMeta: opts.node ? { node: opts.node } : undefined,
    format: winston.format.combine(winston.format.timestamp(), winston.format.errors({ stack: false }), winston.format.json()),
    transports: [new winston.transports.Stream({ stream: opts.stream ?? process.stderr })],
  });
}

/** The process-wide logger; tetherd replaces it at start-up with one that names the node. */
export function log(): winston.Logger {
  if (!root) root = makeLogger();
  return held ? holding(root, held) : root;
}

const LEVELS = new Set(['error', 'warn', 'info', 'http', 'verbose', 'debug', 'silly', 'log']);
let held: Array<() => void> | undefined;

/** The root logger, its lines queued on `queue` instead of written. */
function holding(l: winston.Logger, queue: Array<() => void>): winston.Logger {
  return new Proxy(l, {
    get(target, prop, receiver) {
      if (typeof prop !== 'string' || !LEVELS.has(prop)) return Reflect.get(target, prop, receiver);
      return (...args: unknown[]) => {
        queue.push(() => (target[prop as 'info'] as (...a: unknown[]) => unknown).apply(target, args));
        return receiver;
      };
    },
  });
}

/**
 * Runs fn (synchronous) with the lines written through log() held, and writes them, in order, on the event
 * loop's next turn: for work that answers a caller (a CNI ADD), whose lines are no part of the answer and
 * can follow it. Inside a hold, a nested hold adds to it.
 */
export function holdLogs<T>(fn: () => T): T {
  if (held) return fn();
  const lines: Array<() => void> = (held = []);
  try {
    return fn();
  } finally {
    held = undefined;
    if (lines.length) setImmediate(() => lines.forEach((write) => write()));
  }
}

export function setLogger(l: winston.Logger): void {
  root = l;
}
