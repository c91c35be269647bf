// Ownership notices between tetherds: how every node (candidates and clients) learns who owns a floating
// address without the cluster store. The node that decides (a takeover, a handover) sends the decision to
// every node it knows at once; each owner repeats its current ownership every second (a heartbeat that
// also names the standbys in sync with it). UDP on the sync port number, one datagram per notice,
// authenticated with an HMAC from the cluster key; a notice from a stale sender is harmless because
// epochs only grow, and per-sender sequence numbers reject replays.
import { createHmac, randomBytes, timingSafeEqual } from 'node:crypto';
import * as dgram from 'node:dgram';
import { EventEmitter } from 'node:events';
import { isIP } from 'node:net';
import { ErrorCode, TetherError } from '../errors';
import { log } from '../log';

const MAGIC = Buffer.from('TOWN');
const VERSION = 1;
const HEADER = 8;
const MAC_BYTES = 32;
export const MAX_NOTICE_BYTES = 1400;
/** Notices older or newer than this (sender's clock) are refused: nodes keep their clocks in sync (NTP). */
const MAX_SKEW_MS = 30_000;

/** One decision (or its repetition): who owns `address` of `egress`, with which epoch. */
export interface OwnershipNotice {
  egress: string;
  address: string;
  /** Gateway pod "namespace/name"; "" when nobody does. */
  owner: string;
  epoch: number;
  ownerNode: string;
  ownerNodeAddress: string;
  /** The owner pod's address: clients steer to it. */
  ownerPodIp: string;
  cause: string;
  /** Nodes whose conntrack state the owner streams and has current (only an owner's heartbeat knows). */
  inSync: string[];
}

export type NoticeRejectReason = 'malformed' | 'badMac' | 'replay' | 'stale' | 'oversize';
const REJECT_REASONS: NoticeRejectReason[] = ['malformed', 'badMac', 'replay', 'stale', 'oversize'];

interface Envelope {
  from: string;
  boot: string;
  seq: number;
  at: number;
  notices: OwnershipNotice[];
}

export function noticeKey(clusterKey: Buffer): Buffer {
  return createHmac('sha256', clusterKey).update('tether ownership notice').digest();
}

export function encodeNotices(key: Buffer, env: Envelope): Buffer {
  const body = Buffer.from(JSON.stringify(env), 'utf8');
  const header = Buffer.alloc(HEADER);
  MAGIC.copy(header, 0);
  header[4] = VERSION;
  const mac = createHmac('sha256', key).update(header).update(body).digest();
  const out = Buffer.concat([header, mac, body]);
  if (out.length > MAX_NOTICE_BYTES) throw new TetherError(ErrorCode.InvalidConfig, `ownership notice of ${out.length} bytes exceeds ${MAX_NOTICE_BYTES}`);
  return out;
}

/** Checks and decodes one datagram; throws a NoticeRejected naming the reason. */
export function decodeNotices(key: Buffer, data: Buffer): Envelope {
  if (data.length > MAX_NOTICE_BYTES) throw new NoticeRejected('oversize', `${data.length} bytes`);
  if (data.length < HEADER + MAC_BYTES + 2 || !data.subarray(0, 4).equals(MAGIC) || data[4] !== VERSION) throw new NoticeRejected('malformed', 'not a version 1 ownership notice');
  const mac = data.subarray(HEADER, HEADER + MAC_BYTES);
  const body = data.subarray(HEADER + MAC_BYTES);
  const want = createHmac('sha256', key).update(data.subarray(0, HEADER)).update(body).digest();
  if (!timingSafeEqual(mac, want)) throw new NoticeRejected('badMac', 'authentication failed');
  let raw: unknown;
  try {
    raw = JSON.parse(body.toString('utf8'));
  } catch {
    throw new NoticeRejected('malformed', 'body is not JSON');
  }
  return checkEnvelope(raw);
}

export class NoticeRejected extends Error {
  constructor(
    readonly reason: NoticeRejectReason,
    message: string,
  ) {
    super(`ownership notice rejected (${reason}): ${message}`);
  }
}

function checkEnvelope(raw: unknown): Envelope {
  const bad = (what: string): never => {
    throw new NoticeRejected('malformed', what);
  };
  const r = raw as Record<string, unknown>;
  if (!r || typeof r !== 'object' || Array.isArray(r)) bad('body is not an object');
  if (typeof r.from !== 'string' || !r.from || r.from.length > 253) bad('from');
  if (typeof r.boot !== 'string' || !/^[0-9a-f]{16}$/.test(r.boot)) bad('boot');
  if (!Number.isSafeInteger(r.seq) || (r.seq as number) < 0) bad('seq');
  if (!Number.isSafeInteger(r.at)) bad('at');
  if (!Array.isArray(r.notices) || r.notices.length > 16) bad('notices');
  const notices = (r.notices as unknown[]).map((n, i) => {
    const x = n as Record<string, unknown>;
    const str = (k: string, max = 253) => (typeof x?.[k] === 'string' && (x[k] as string).length <= max ? (x[k] as string) : bad(`notices[${i}].${k}`));
    const ip = (k: string, empty: boolean) => {
      const v = str(k, 45);
      return (empty && v === '') || isIP(v) ? v : bad(`notices[${i}].${k}`);
    };
    if (!Number.isSafeInteger(x?.epoch) || (x.epoch as number) < 0) bad(`notices[${i}].epoch`);
    if (!Array.isArray(x.inSync) || x.inSync.length > 64 || x.inSync.some((s) => typeof s !== 'string')) bad(`notices[${i}].inSync`);
    return {
      egress: str('egress'),
      address: ip('address', false),
      owner: str('owner'),
      epoch: x.epoch as number,
      ownerNode: str('ownerNode'),
      ownerNodeAddress: ip('ownerNodeAddress', true),
      ownerPodIp: ip('ownerPodIp', true),
      cause: str('cause', 400),
      inSync: x.inSync as string[],
    };
  });
  return { from: r.from as string, boot: r.boot as string, seq: r.seq as number, at: r.at as number, notices };
}

export interface NoticeChannelOptions {
  clusterKey: Buffer;
  /** This node's name (senders are told apart by it) and address (bound). */
  node: string;
  address: string;
  port: number;
  now?: () => number;
}

/**
 * Sends and receives ownership notices. Emits 'notice' (OwnershipNotice, from: string) for every
 * authentic, fresh notice; rejected datagrams are counted per reason.
 */
export class NoticeChannel extends EventEmitter {
  private readonly key: Buffer;
  private readonly boot = randomBytes(8).toString('hex');
  private seq = 0;
  private readonly seen = new Map<string, { boot: string; seq: number }>();
  private readonly now: () => number;
  private readonly counters = { rx: 0, tx: 0, accepted: 0, rejected: Object.fromEntries(REJECT_REASONS.map((r) => [r, 0])) as Record<NoticeRejectReason, number> };

  private constructor(
    private readonly o: NoticeChannelOptions,
    private readonly sock: dgram.Socket,
  ) {
    super();
    this.key = noticeKey(o.clusterKey);
    this.now = o.now ?? Date.now;
    sock.on('message', (msg, rinfo) => this.onMessage(msg, rinfo.address));
    sock.on('error', (e) => log().warn('egress: ownership notice socket error', { error: e.message }));
  }

  static async open(o: NoticeChannelOptions): Promise<NoticeChannel> {
    const v = isIP(o.address);
    if (!v) throw new TetherError(ErrorCode.InvalidConfig, `ownership notices: ${JSON.stringify(o.address)} is not an IP address`);
    const sock = dgram.createSocket({ type: v === 6 ? 'udp6' : 'udp4' });
    await new Promise<void>((resolve, reject) => {
      sock.once('error', (e) => reject(new TetherError(ErrorCode.IoFailure, `ownership notices: cannot bind ${o.address} udp port ${o.port}: ${e.message}`, { cause: e })));
      sock.bind({ address: o.address, port: o.port, exclusive: true }, () => resolve());
    });
    sock.removeAllListeners('error');
    return new NoticeChannel(o, sock);
  }

  get port(): number {
    return this.sock.address().port;
  }

  stats(): { rx: number; tx: number; accepted: number; rejected: Record<NoticeRejectReason, number> } {
    return { ...this.counters, rejected: { ...this.counters.rejected } };
  }

  /** Sends `notices` to every peer address (not to itself). Send errors are what liveness detects: logged at debug. */
  send(peers: Iterable<string>, notices: OwnershipNotice[], port = this.o.port): void {
    if (!notices.length) return;
    const data = encodeNotices(this.key, { from: this.o.node, boot: this.boot, seq: ++this.seq, at: this.now(), notices });
    for (const p of new Set(peers)) {
      if (p === this.o.address) continue;
      this.counters.tx++;
      this.sock.send(data, port, p, (err) => {
        if (err) log().debug('egress: ownership notice not sent', { peer: p, error: err.message });
      });
    }
  }

  close(): Promise<void> {
    return new Promise((resolve) => {
      try {
        this.sock.close(() => resolve());
      } catch {
        resolve();
      }
    });
  }

  private onMessage(msg: Buffer, from: string): void {
    this.counters.rx++;
    let env: Envelope;
    try {
      env = decodeNotices(this.key, msg);
      const skew = Math.abs(this.now() - env.at);
      if (skew > MAX_SKEW_MS) throw new NoticeRejected('stale', `sent ${skew} ms from now`);
      const last = this.seen.get(env.from);
      if (last && last.boot === env.boot && env.seq <= last.seq) throw new NoticeRejected('replay', `seq ${env.seq} from ${env.from} already seen`);
      this.seen.set(env.from, { boot: env.boot, seq: env.seq });
    } catch (e) {
      const reason = e instanceof NoticeRejected ? e.reason : 'malformed';
      this.counters.rejected[reason]++;
      log().debug('egress: ownership notice rejected', { from, reason, error: (e as Error).message });
      return;
    }
    this.counters.accepted++;
    for (const n of env.notices) this.emit('notice', n, env.from);
  }
}
