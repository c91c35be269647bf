// tetherd's socket API: a root-only Unix socket speaking newline-delimited JSON (see api/protocol.ts).
// Each line is one request; answers go back on the same connection in order. A malformed line gets a
// typed error answer and never disturbs other connections. Every version from MIN_PROTOCOL_VERSION to
// PROTOCOL_VERSION is answered (the previous release's CNI executables and this one's, during an upgrade),
// each request in its own version.
import * as fs from 'node:fs';
import * as net from 'node:net';
import * as path from 'node:path';
import { asTetherError, ErrorCode, TetherError } from '../lib/errors';
import type { Logger } from '../lib/log';
import { InFlight } from './util/in-flight';
import { MAX_LINE_BYTES, MIN_PROTOCOL_VERSION, PROTOCOL_VERSION, type Method, type Request, type Response } from '../lib/api/protocol';

export type Handler = (params: unknown) => unknown | Promise<unknown>;

/** The protocol versions a server answers (tests narrow it to play an older tetherd). */
export interface VersionRange {
  min: number;
  max: number;
}

export class ApiServer {
  private server?: net.Server;
  private readonly sockets = new Set<net.Socket>();
  /** Requests being answered: close() lets them finish, so an ADD under way is completed and answered. */
  private readonly answering = new InFlight();

  constructor(
    private readonly socketPath: string,
    private readonly handlers: Partial<Record<Method, Handler>>,
    private readonly logger: Logger,
    private readonly versions: VersionRange = { min: MIN_PROTOCOL_VERSION, max: PROTOCOL_VERSION },
  ) {}

  async listen(): Promise<void> {
    fs.mkdirSync(path.dirname(this.socketPath), { recursive: true, mode: 0o700 });
    await removeStaleSocket(this.socketPath);
    const server = net.createServer((s) => this.serve(s));
    this.server = server;
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(this.socketPath, () => {
        server.off('error', reject);
        resolve();
      });
    });
    // Root only: the umask already made it 0600-ish; make it exact in case it was not.
    fs.chmodSync(this.socketPath, 0o600);
  }

  async close(): Promise<void> {
    const server = this.server;
    if (!server) return;
    this.server = undefined;
    const closed = new Promise<void>((resolve) => server.close(() => resolve()));
    if (!(await this.answering.close(10_000))) this.logger.warn('api: requests still running at stop', { pending: this.answering.size });
    for (const s of this.sockets) s.end();
    await closed;
    for (const s of this.sockets) s.destroy();
    try {
      fs.unlinkSync(this.socketPath);
    } catch {
      // already gone: nothing to clean up
    }
  }

  private serve(sock: net.Socket): void {
    this.sockets.add(sock);
    sock.on('close', () => this.sockets.delete(sock));
    sock.on('error', () => sock.destroy());
    let buf = '';
    let chain = Promise.resolve();
    sock.on('data', (chunk) => {
      buf += chunk.toString('utf8');
      let nl: number;
      while ((nl = buf.indexOf('\n')) >= 0) {
        const line = buf.slice(0, nl);
        buf = buf.slice(nl + 1);
        if (!line.trim()) continue;
        chain = chain.then(() => (this.answering.stopping ? this.refuse(sock, line) : this.answering.run(() => this.answer(sock, line)))).then(() => undefined);
      }
      if (buf.length > MAX_LINE_BYTES) {
        this.logger.warn('api: request line too long; closing connection', { bytes: buf.length });
        sock.end(JSON.stringify(errorResponse('', new TetherError(ErrorCode.BadRequest, `request line exceeds ${MAX_LINE_BYTES} bytes`))) + '\n');
        buf = '';
      }
    });
  }

  /** A request that arrives while tetherd stops: the runtime retries it (CNI code 11) once tetherd is back. */
  private refuse(sock: net.Socket, line: string): void {
    let id = '';
    try {
      id = parseRequest(line, this.versions).id;
    } catch {
      // answered without an id
    }
    if (!sock.destroyed) sock.write(JSON.stringify(errorResponse(id, new TetherError(ErrorCode.TryAgainLater, 'tetherd is stopping; try again'), this.versions.max)) + '\n');
  }

  private async answer(sock: net.Socket, line: string): Promise<void> {
    let id = '';
    // An answer is in the request's version; a refused version is answered with the highest spoken here,
    // which tells a newer client what to ask again with.
    let version = this.versions.max;
    let resp: Response;
    try {
      const req = parseRequest(line, this.versions);
      id = req.id;
      version = req.version;
      const handler = this.handlers[req.method];
      if (!handler) throw new TetherError(ErrorCode.BadRequest, `unknown method '${req.method}'`);
      resp = { version, id, result: (await handler(req.params)) ?? null };
    } catch (e) {
      const te = asTetherError(e);
      if (te.code === ErrorCode.Internal) this.logger.error('api: internal error', { error: te.message, stack: (e as Error).stack });
      if (te.code === ErrorCode.ProtocolVersion) this.logger.warn('api: request in a protocol version not spoken here refused', { error: te.message });
      resp = errorResponse(id || idOf(line), te, version);
    }
    if (!sock.destroyed) sock.write(JSON.stringify(resp) + '\n');
  }
}

function errorResponse(id: string, e: TetherError, version = PROTOCOL_VERSION): Response {
  return { version, id, error: { code: e.code, message: e.message, details: e.details } };
}

/** The id of a request that was refused before it was read whole ('' when it has none). */
function idOf(line: string): string {
  try {
    const id = (JSON.parse(line) as { id?: unknown } | null)?.id;
    return typeof id === 'string' ? id : '';
  } catch {
    return '';
  }
}

function parseRequest(line: string, versions: VersionRange): Request {
  let raw: unknown;
  try {
    raw = JSON.parse(line);
  } catch {
    throw new TetherError(ErrorCode.BadRequest, 'request is not valid JSON');
  }
  const r = raw as Partial<Request>;
  if (!r || typeof r !== 'object') throw new TetherError(ErrorCode.BadRequest, 'request must be a JSON object');
  if (typeof r.version !== 'number' || !Number.isInteger(r.version) || r.version < versions.min || r.version > versions.max) {
    const spoken = versions.min === versions.max ? `${versions.max}` : `${versions.min} to ${versions.max}`;
    throw new TetherError(ErrorCode.ProtocolVersion, `protocol version ${JSON.stringify(r.version) ?? 'undefined'} is not spoken here (tetherd speaks ${spoken})`);
  }
  if (typeof r.id !== 'string' || typeof r.method !== 'string') throw new TetherError(ErrorCode.BadRequest, 'request needs string id and method');
  return r as Request;
}

/** A socket file left by a killed tetherd is removed; one that answers means another tetherd owns it. */
async function removeStaleSocket(p: string): Promise<void> {
  if (!fs.existsSync(p)) return;
  const alive = await new Promise<boolean>((resolve) => {
    const c = net.createConnection({ path: p });
    c.once('connect', () => {
      c.destroy();
      resolve(true);
    });
    c.once('error', () => resolve(false));
  });
  if (alive) throw new TetherError(ErrorCode.InvalidEnvironment, `another tetherd is already serving ${p}`);
  fs.unlinkSync(p);
}
