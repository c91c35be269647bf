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
  return root;
}

export function setLogger(l: winston.Logger): void {
  root = l;
}
