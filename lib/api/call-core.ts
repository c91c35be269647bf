// One request to tetherd's socket over any transport: connect, send one request line, read one response
// line, with the connect and answer timeouts and the error codes every caller relies on. The transport is
// a Connector: Node's net (lib/api/client.ts, for tetherctl and tetherd's tools) or Bun's own sockets
// (cni/bun-connector.ts, for the CNI executables, where loading node:net costs more than the request).
// This file imports no runtime module.
import { TetherError, ErrorCode } from '../errors';
import { MAX_LINE_BYTES, MIN_PROTOCOL_VERSION, PROTOCOL_VERSION, type Method, type Response } from './protocol';

export interface CallOptions {
  /**
   * The protocol version to ask in (default PROTOCOL_VERSION) and the oldest one to fall back to (default
   * MIN_PROTOCOL_VERSION): tests set them to play another release's client.
   */
  version?: number;
  minVersion?: number;
  /** Time to connect before tetherd counts as unreachable. */
  connectTimeoutMs?: number;
  /** Time for the whole request once connected. */
  timeoutMs?: number;
}

export interface Connection {
  write(text: string): void;
  destroy(): void;
}

export interface ConnectionEvents {
  open(): void;
  data(text: string): void;
  /** A failure, with the errno code when there is one (ENOENT, ECONNREFUSED…). */
  error(e: { code?: string; message: string }): void;
  close(): void;
}

/** Opens a unix socket connection and reports on `ev`; returns a handle for writing and closing. */
export type Connector = (socketPath: string, ev: ConnectionEvents) => Connection;

/**
 * tetherd is not there to answer: nothing listens at the socket (ENOENT: never started, stopped or
 * uninstalled; ECONNREFUSED: a socket file its killed process left), no connection within the connect
 * timeout, or the connection ended before a whole answer came (tetherd died while handling the request).
 * A tetherd that answers, even with an error or late, is not unreachable. The CNI clients queue a DEL
 * on this error instead of failing it (lib/api/delete-queue.ts); the code on the wire stays 11.
 */
export class TetherdUnreachable extends TetherError {
  constructor(
    message: string,
    /** What was seen: the errno code, 'connect-timeout' or 'lost' (the connection ended before an answer). */
    readonly reason: string,
    cause?: unknown,
  ) {
    super(ErrorCode.TryAgainLater, message, { cause });
    this.name = 'TetherdUnreachable';
  }
}

/** Connect errors that mean nobody serves the socket; any other (EACCES, ENOTSOCK…) is a setup fault. */
const NOBODY_LISTENS = new Set(['ENOENT', 'ECONNREFUSED']);
/** Connect errors that mean this process may not use the socket: no retry helps, so never code 11. */
const NOT_ALLOWED = new Set(['EACCES', 'EPERM']);

/** The error for a socket this process is not allowed to connect to, saying why and what to do. */
function socketPermissionError(socketPath: string, code: string, cause?: unknown): TetherError {
  return new TetherError(
    ErrorCode.PermissionDenied,
    `permission denied connecting to tetherd's socket ${socketPath} (${code}): the socket is root-only (mode 0600, in a directory of mode 0700); run this as root`,
    { cause },
  );
}

let seq = 0;

/**
 * A daemon's refusal of our version that names an older one we speak too: the version to ask again in.
 * A tetherd refuses a version it does not speak with code PROTOCOL_VERSION and `version` set to the highest
 * it speaks; one of release 0.1.0 answers such a request with id "" (it refused before reading the id).
 */
function fallbackVersion(resp: Response, id: string, asked: number, min: number): number | undefined {
  if (resp.error?.code !== ErrorCode.ProtocolVersion || (resp.id !== id && resp.id !== '')) return undefined;
  const v = resp.version;
  return typeof v === 'number' && Number.isInteger(v) && v < asked && v >= min ? v : undefined;
}

export function callWith<R = unknown>(connect: Connector, socketPath: string, method: Method, params: unknown, opts: CallOptions = {}): Promise<R> {
  const version = opts.version ?? PROTOCOL_VERSION;
  const minVersion = opts.minVersion ?? MIN_PROTOCOL_VERSION;
  // Unique enough to pair an answer with its request on one connection; avoids loading a crypto module.
  const id = `${process.pid}-${Date.now().toString(36)}-${(++seq).toString(36)}`;
  const line = JSON.stringify({ version, id, method, params }) + '\n';
  const connectTimeout = opts.connectTimeoutMs ?? 2000;
  const timeout = opts.timeoutMs ?? 60_000;

  return new Promise<R>((resolve, reject) => {
    let connected = false;
    let buf = '';
    let settled = false;
    let conn: Connection | undefined;
    const finish = (err: Error | null, value?: R) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      conn?.destroy();
      if (err) reject(err);
      else resolve(value as R);
    };
    const unreachable = (why: string, reason: string | undefined, cause?: unknown) => {
      const message = `tetherd is not reachable at ${socketPath}: ${why}`;
      finish(reason ? new TetherdUnreachable(message, reason, cause) : new TetherError(ErrorCode.TryAgainLater, message, { cause }));
    };
    let timer = setTimeout(() => unreachable(`no connection within ${connectTimeout} ms`, 'connect-timeout'), connectTimeout);

    conn = connect(socketPath, {
      open() {
        connected = true;
        clearTimeout(timer);
        timer = setTimeout(
          () => finish(new TetherError(ErrorCode.TryAgainLater, `tetherd at ${socketPath} did not answer ${method} within ${timeout} ms`)),
          timeout,
        );
        conn!.write(line);
      },
      data(text) {
        buf += text;
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
        const older = fallbackVersion(resp, id, version, minVersion);
        if (older !== undefined) {
          // An older tetherd (a rolling upgrade under way): the same request once more in its version, on a
          // new connection. Safe for any method: a refused request was never dispatched. The retry cannot
          // loop, each one asks in a lower version.
          settled = true;
          clearTimeout(timer);
          conn?.destroy();
          callWith<R>(connect, socketPath, method, params, { ...opts, version: older }).then(resolve, reject);
        } else if (resp.id !== id) {
          finish(new TetherError(ErrorCode.ProtocolVersion, `tetherd answered request ${resp.id}, expected ${id}`));
        } else if (resp.error) {
          finish(new TetherError(resp.error.code, resp.error.message, { details: resp.error.details }));
        } else {
          finish(null, resp.result as R);
        }
      },
      error(e) {
        if (!connected && e.code && NOT_ALLOWED.has(e.code)) finish(socketPermissionError(socketPath, e.code, e));
        else if (!connected) unreachable(e.code ?? e.message, e.code && NOBODY_LISTENS.has(e.code) ? e.code : undefined, e);
        else finish(new TetherdUnreachable(`connection to tetherd at ${socketPath} failed: ${e.message}`, 'lost', e));
      },
      close() {
        if (connected) finish(new TetherdUnreachable(`tetherd at ${socketPath} closed the connection before answering ${method}`, 'lost'));
      },
    });
    if (settled) conn.destroy();
  });
}
