// The UDP side of single-hop BFD (RFC 5881): one receive socket on a local address (port 3784), one source
// socket per session (port 49152–65535, TTL 255), and demultiplexing of received packets to sessions.
//
// GTSM (RFC 5881 §5, drop packets whose TTL is not 255) is NOT enforced: node:dgram can set the outgoing
// TTL but exposes no ancillary data (IP_RECVTTL / IPV6_RECVHOPLIMIT), so the received TTL is unknown.
// Authentication is what rejects off-link forgeries instead; run sessions with a key.
import * as dgram from 'node:dgram';
import { randomInt } from 'node:crypto';
import { isIP } from 'node:net';
import { EventEmitter } from 'node:events';
import { ErrorCode, TetherError } from '../../lib/errors';
import { log } from '../../lib/log';
import { realClock, type Clock } from './clock';
import { decodeControl, type BfdControl } from './packet';
import { BfdSession, emptyRejects, type BfdRejectReason, type BfdSessionOptions, type BfdSessionStats, type BfdVerdict } from './session';

export const BFD_CONTROL_PORT = 3784;
const SRC_PORT_MIN = 49152;
const SRC_PORT_MAX = 65535;
const BIND_ATTEMPTS = 32;

export interface BfdEndpointOptions {
  /** Local address to receive on and send from (IPv4 or IPv6, not link-local: no scope handling). */
  address: string;
  /** Receive port; 3784 unless a test needs another. */
  port?: number;
  /** Destination port on peers; defaults to `port`. */
  peerPort?: number;
  clock?: Clock;
}

export interface BfdEndpointStats {
  /** Datagrams received on the control port. */
  rx: number;
  /** Every rejected datagram by reason, whether or not it could be tied to a session. */
  rejected: Record<BfdRejectReason, number>;
  sessions: BfdSessionStats[];
}

/** Emitted as 'datagram' for every received datagram when someone listens (tracing, tests). */
export interface BfdDatagramEvent {
  data: Buffer;
  from: { address: string; port: number };
  verdict: BfdVerdict;
  packet?: BfdControl;
  peer?: string;
}

interface Entry {
  session: BfdSession;
  sock: dgram.Socket;
  pending: number;
  closing: boolean;
}

/** Canonical text form, so a configured peer compares equal to the kernel's rinfo.address. */
function canonical(addr: string): string {
  return isIP(addr) === 6 ? new URL(`http://[${addr}]`).hostname.slice(1, -1) : addr;
}

function closeQuietly(sock: dgram.Socket): void {
  try {
    sock.close();
  } catch {
    // already closed
  }
}

export class BfdEndpoint extends EventEmitter {
  readonly address: string;
  readonly port: number;
  private readonly peerPort: number;
  private readonly clock: Clock;
  private readonly family: 'udp4' | 'udp6';
  private readonly sock: dgram.Socket;
  private readonly byPeer = new Map<string, Entry>();
  private counters = { rx: 0, rejected: emptyRejects() };
  private closed = false;

  private constructor(opts: BfdEndpointOptions, family: 'udp4' | 'udp6', sock: dgram.Socket, port: number) {
    super();
    this.address = canonical(opts.address);
    this.port = port;
    this.peerPort = opts.peerPort ?? port;
    this.clock = opts.clock ?? realClock;
    this.family = family;
    this.sock = sock;
    sock.on('message', (msg, rinfo) => this.onMessage(msg, rinfo));
    sock.on('error', (err) => log().warn('bfd endpoint socket error', { address: this.address, port: this.port, error: err.message }));
  }

  /** Binds the receive socket; fails with IoFailure when the address or port cannot be bound. */
  static async open(opts: BfdEndpointOptions): Promise<BfdEndpoint> {
    const v = isIP(opts.address);
    if (!v) throw new TetherError(ErrorCode.InvalidConfig, `bfd address: ${JSON.stringify(opts.address)} is not an IP address`);
    const family = v === 6 ? 'udp6' : 'udp4';
    const sock = dgram.createSocket({ type: family });
    const port = opts.port ?? BFD_CONTROL_PORT;
    await new Promise<void>((resolve, reject) => {
      sock.once('error', (err) => reject(new TetherError(ErrorCode.IoFailure, `bfd: cannot bind ${opts.address} port ${port}: ${err.message}`, { cause: err })));
      sock.bind({ address: opts.address, port, exclusive: true }, () => resolve());
    });
    sock.removeAllListeners('error');
    return new BfdEndpoint(opts, family, sock, sock.address().port);
  }

  /** Starts a session with `peer` (one per peer). It transmits as soon as its source port is bound. */
  session(peer: string, opts: BfdSessionOptions = {}): BfdSession {
    if (this.closed) throw new TetherError(ErrorCode.InvalidEnvironment, 'bfd endpoint is closed');
    if (isIP(peer) !== (this.family === 'udp6' ? 6 : 4)) throw new TetherError(ErrorCode.InvalidConfig, `bfd peer: ${JSON.stringify(peer)} is not an IPv${this.family === 'udp6' ? 6 : 4} address`);
    const key = canonical(peer);
    if (this.byPeer.has(key)) throw new TetherError(ErrorCode.InvalidConfig, `bfd peer: a session with ${key} already exists`);
    const sock = dgram.createSocket({ type: this.family });
    const entry = { sock, pending: 0, closing: false } as Entry;
    entry.session = new BfdSession(
      {
        peer: key,
        clock: this.clock,
        allocDiscr: () => this.allocDiscr(),
        send: (pkt) => this.send(entry, pkt),
      },
      opts,
    );
    this.byPeer.set(key, entry);
    entry.session.once('close', () => this.retire(entry));
    this.bindSource(entry, BIND_ATTEMPTS);
    return entry.session;
  }

  stats(): BfdEndpointStats {
    return { rx: this.counters.rx, rejected: { ...this.counters.rejected }, sessions: [...this.byPeer.values()].map((e) => e.session.stats()) };
  }

  /** Closes every session (each tells its peer AdminDown) and the sockets. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    const entries = [...this.byPeer.values()];
    const gone = entries.map((e) => new Promise<void>((r) => e.sock.once('close', () => r())));
    for (const e of entries) e.session.close();
    await Promise.all(gone);
    await new Promise<void>((r) => this.sock.close(() => r()));
  }

  private bindSource(entry: Entry, attemptsLeft: number): void {
    // RFC 5881 §4: a source port from the dynamic range, the same for the whole session, unique per session.
    const port = randomInt(SRC_PORT_MIN, SRC_PORT_MAX + 1);
    const onError = (err: NodeJS.ErrnoException) => {
      if (entry.closing) return;
      if (err.code === 'EADDRINUSE' && attemptsLeft > 1) {
        entry.sock = dgram.createSocket({ type: this.family });
        this.bindSource(entry, attemptsLeft - 1);
        return;
      }
      log().error('bfd: cannot bind a source port', { peer: entry.session.peer, address: this.address, error: err.message });
      entry.session.close();
    };
    entry.sock.once('error', onError);
    entry.sock.bind({ address: this.address, port, exclusive: true }, () => {
      entry.sock.removeListener('error', onError);
      entry.sock.on('error', (err) => log().warn('bfd source socket error', { peer: entry.session.peer, error: err.message }));
      // Peers send to the control port only; anything arriving here is not BFD for us.
      entry.sock.on('message', () => undefined);
      entry.sock.setTTL(255);
      if (entry.closing) closeQuietly(entry.sock);
      else entry.session.start();
    });
  }

  private send(entry: Entry, pkt: Buffer): void {
    entry.pending++;
    entry.sock.send(pkt, this.peerPort, entry.session.peer, (err) => {
      entry.pending--;
      // Send failures (no route while a link is down) are what BFD exists to detect: the peer's silence
      // will bring the session down, so they are only logged at debug level.
      if (err) log().debug('bfd send failed', { peer: entry.session.peer, error: err.message });
      if (entry.closing && entry.pending === 0) closeQuietly(entry.sock);
    });
  }

  private retire(entry: Entry): void {
    entry.closing = true;
    if (this.byPeer.get(entry.session.peer) === entry) this.byPeer.delete(entry.session.peer);
    // Let the final AdminDown packet leave before closing; an unbound socket has nothing in flight.
    if (entry.pending === 0) closeQuietly(entry.sock);
  }

  private allocDiscr(): number {
    for (;;) {
      const d = randomInt(1, 0xffffffff);
      if (![...this.byPeer.values()].some((e) => e.session && e.session.localDiscr === d)) return d;
    }
  }

  private reject(reason: BfdRejectReason, entry: Entry | undefined, ev: Omit<BfdDatagramEvent, 'verdict'>): void {
    this.counters.rejected[reason]++;
    if (entry && reason !== 'noSession') entry.session.countRejected(reason);
    this.tap({ ...ev, verdict: reason, peer: entry?.session.peer });
  }

  private tap(ev: BfdDatagramEvent): void {
    if (this.listenerCount('datagram') > 0) this.emit('datagram', ev);
  }

  private onMessage(msg: Buffer, rinfo: dgram.RemoteInfo): void {
    this.counters.rx++;
    const from = { address: rinfo.address, port: rinfo.port };
    const byAddr = this.byPeer.get(rinfo.address);
    let p: BfdControl;
    try {
      p = decodeControl(msg);
    } catch {
      // Counted on the session too when it came from a configured peer: that is where operators look.
      this.reject('malformed', byAddr, { data: msg, from });
      return;
    }
    const ev = { data: msg, from, packet: p };
    let entry: Entry | undefined;
    if (p.yourDiscr !== 0) {
      entry = [...this.byPeer.values()].find((e) => e.session.localDiscr === p.yourDiscr);
      if (!entry) return this.reject('noSession', undefined, ev);
      // Single hop: a session's packets come from its configured peer, never from elsewhere.
      if (entry.session.peer !== rinfo.address) return this.reject('wrongSource', entry, ev);
    } else {
      entry = byAddr;
      if (!entry) return this.reject('noSession', undefined, ev);
    }
    const verdict = entry.session.receive(p, msg.subarray(0, msg[3]));
    if (verdict !== 'accepted') this.counters.rejected[verdict]++;
    this.tap({ ...ev, verdict, peer: entry.session.peer });
  }
}
