// Runs a piece of a test with the process logger captured (winston JSON lines at info and above).
import { PassThrough } from 'node:stream';
import { log, makeLogger, setLogger } from '../../daemon/log';

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
