// Runs a piece of a test with the process logger captured (winston JSON lines at info and above).
import { PassThrough } from 'node:stream';
import { log, makeLogger, setLogger } from '../../lib/log';

/** Runs `fn` with the log captured; returns its lines, parsed. The previous logger is put back after. */
export async function captureLog(fn: () => Promise<void>): Promise<Array<Record<string, string>>> {
  const out = new PassThrough();
  let text = '';
  out.on('data', (d) => (text += d));
  const prev = log();
  setLogger(makeLogger({ level: 'info', stream: out }));
  try {
    await fn();
  } finally {
    setLogger(prev);
  }
  return text.trim().split('\n').filter(Boolean).map((l) => JSON.parse(l) as Record<string, string>);
}

/** A logger (debug and above) whose JSON lines land in `lines`; settle() waits for the stream to deliver. */
export function captureLogger(): { logger: ReturnType<typeof makeLogger>; lines: Array<Record<string, any>>; settle: () => Promise<void> } {
  const lines: Array<Record<string, any>> = [];
  const stream = new PassThrough();
  let buf = '';
  stream.on('data', (c: Buffer) => {
    buf += c.toString();
    let nl;
    while ((nl = buf.indexOf('\n')) >= 0) {
      lines.push(JSON.parse(buf.slice(0, nl)));
      buf = buf.slice(nl + 1);
    }
  });
  return { logger: makeLogger({ stream, level: 'debug' }), lines, settle: () => new Promise((r) => setTimeout(r, 20)) };
}
