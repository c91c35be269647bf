// tetherd's socket API: a root-only Unix socket speaking newline-delimited JSON (see api/protocol.ts).
// Each line is one request; answers go back on the same connection in order. A malformed line gets a
// typed error answer and never disturbs other connections.
import * as fs from 'node:fs';
import * as net from 'node:net';
import * as path from 'node:path';
import { asTetherError, ErrorCode, TetherError } from './errors';
import type { Logger } from './log';
import { InFlight } from './util/in-flight';
import { MAX_LINE_BYTES, PROTOCOL_VERSION, type Method, type Request, type Response } from './api/protocol';

export type Handler = (params: unknown) => unknown | Promise<unknown>;

export class ApiServer {
  private server?: net.Server;
  private readonly sockets = new Set<net.Socket>();
  /** Requests being answered: close() lets them finish, so an ADD under way is completed and answered. */
  private readonly answering = new InFlight();

  constructor(
    private readonly socketPath: string,
    private readonly handlers: Partial<Record<Method, Handler>>,
    private readonly logger: Logger,
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
      id = parseRequest(line).id;
    } catch {
      // answered without an id
    }
    if (!sock.destroyed) sock.write(JSON.stringify(errorResponse(id, new TetherError(ErrorCode.TryAgainLater, 'tetherd is stopping; try again'))) + '\n');
  }

  private async answer(sock: net.Socket, line: string): Promise<void> {
    let id = '';
    let resp: Response;
    try {
      const req = parseRequest(line);
      id = req.id;
      const handler = this.handlers[req.method];
      if (!handler) throw new TetherError(ErrorCode.BadRequest, `unknown method '${req.method}'`);
      resp = { version: PROTOCOL_VERSION, id, result: (await handler(req.params)) ?? null };
    } catch (e) {
      const te = asTetherError(e);
      if (te.code === ErrorCode.Internal) this.logger.error('api: internal error', { error: te.message, stack: (e as Error).stack });
      resp = errorResponse(id, te);
    }
    if (!sock.destroyed) sock.write(JSON.stringify(resp) + '\n');
  }
}

function errorResponse(id: string, e: TetherError): Response {
  return { version: PROTOCOL_VERSION, id, error: { code: e.code, message: e.message, details: e.details } };
}

function parseRequest(line: string): Request {
  let raw: unknown;
  try {
    raw = JSON.parse(line);
  } catch {
    throw new TetherError(ErrorCode.BadRequest, 'request is not valid JSON');
  }
  const r = raw as Partial<Request>;
  if (!r || typeof r !== 'object') throw new TetherError(ErrorCode.BadRequest, 'request must be a JSON object');
  if (r.version !== PROTOCOL_VERSION) {
    throw new TetherError(ErrorCode.ProtocolVersion, `protocol version ${String(r.version)} is not spoken here (tetherd speaks ${PROTOCOL_VERSION})`);
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
