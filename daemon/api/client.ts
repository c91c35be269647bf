// A one-shot client for tetherd's socket: connect, send one request line, read one response line.
// Used by the CNI executables and tetherctl; it only imports node:net so they stay small and fast.
import * as net from 'node:net';
import { TetherError, ErrorCode } from '../errors';
import { MAX_LINE_BYTES, PROTOCOL_VERSION, type Method, type Response } from './protocol';

export interface CallOptions {
  /** Time to connect before tetherd counts as unreachable. */
  connectTimeoutMs?: number;
  /** Time for the whole request once connected. */
  timeoutMs?: number;
}

let seq = 0;

export function call<R = unknown>(socketPath: string, method: Method, params: unknown, opts: CallOptions = {}): Promise<R> {
  // Unique enough to pair an answer with its request on one connection; avoids loading node:crypto.
  const id = `${process.pid}-${Date.now().toString(36)}-${(++seq).toString(36)}`;
  const line = JSON.stringify({ version: PROTOCOL_VERSION, id, method, params }) + '\n';
  const connectTimeout = opts.connectTimeoutMs ?? 2000;
  const timeout = opts.timeoutMs ?? 60_000;

  return new Promise<R>((resolve, reject) => {
    let connected = false;
    let buf = '';
    let settled = false;
    const sock = net.createConnection({ path: socketPath });
    const finish = (err: Error | null, value?: R) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      sock.destroy();
      if (err) reject(err);
      else resolve(value as R);
    };
    const unreachable = (why: string, cause?: unknown) =>
      finish(new TetherError(ErrorCode.TryAgainLater, `tetherd is not reachable at ${socketPath}: ${why}`, { cause }));
    let timer = setTimeout(() => unreachable(`no connection within ${connectTimeout} ms`), connectTimeout);

    sock.on('connect', () => {
      connected = true;
      clearTimeout(timer);
      timer = setTimeout(
        () => finish(new TetherError(ErrorCode.TryAgainLater, `tetherd at ${socketPath} did not answer ${method} within ${timeout} ms`)),
        timeout,
      );
      sock.write(line);
    });
    sock.on('data', (chunk) => {
      buf += chunk.toString('utf8');
      if (buf.length > MAX_LINE_BYTES) {
        finish(new TetherError(ErrorCode.ProtocolVersion, `tetherd answered a line over ${MAX_LINE_BYTES} bytes`));
        return;
      }
      const nl = buf.indexOf('\n');
      if (nl < 0) return;
      let resp: Response<R>;
      try {
        resp = JSON.parse(buf.slice(0, nl)) as Response<R>;
      } catch (e) {
        finish(new TetherError(ErrorCode.ProtocolVersion, `tetherd answered something that is not JSON`, { cause: e }));
        return;
      }
      if (resp.id !== id) {
        finish(new TetherError(ErrorCode.ProtocolVersion, `tetherd answered request ${resp.id}, expected ${id}`));
      } else if (resp.error) {
        finish(new TetherError(resp.error.code, resp.error.message, { details: resp.error.details }));
      } else {
        finish(null, resp.result as R);
      }
    });
    sock.on('error', (e: NodeJS.ErrnoException) => {
      if (!connected) unreachable(e.code ?? e.message, e);
      else finish(new TetherError(ErrorCode.TryAgainLater, `connection to tetherd at ${socketPath} failed: ${e.message}`, { cause: e }));
    });
    sock.on('close', () => {
      if (connected) finish(new TetherError(ErrorCode.TryAgainLater, `tetherd at ${socketPath} closed the connection before answering ${method}`));
    });
  });
}
