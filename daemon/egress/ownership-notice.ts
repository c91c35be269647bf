// Ownership notices between tetherds: how every node (candidates and clients) learns who owns a floating
// address without the cluster store. The node that decides (a takeover, a handover) sends the decision to
// every node it knows at once; each owner repeats its current ownership every second (a heartbeat that
// also names the standbys in sync with it), and each node with gateway pods announces them to the other
// candidates of their Egresses every second, so candidates learn each other without the store. UDP on the
// sync port number; as many notices as fit in one datagram of at most 1,400 bytes, the rest in more
// datagrams; each authenticated with an HMAC from the cluster key. A notice from a stale sender is
// harmless because epochs only grow, and per-sender sequence numbers (with a window for datagrams that
// arrive out of order) reject replays.
import { createHmac, randomBytes, timingSafeEqual } from 'node:crypto';
import * as dgram from 'node:dgram';
import { EventEmitter } from 'node:events';
import { isIP } from 'node:net';
import { ErrorCode, TetherError } from '../../lib/errors';
import { log } from '../../lib/log';
import type { GatewayInfo } from './ownership-store';

const MAGIC = Buffer.from('TOWN');
const VERSION = 1;
const HEADER = 8;
const MAC_BYTES = 32;
export const MAX_NOTICE_BYTES = 1400;
/** Notices older or newer than this (sender's clock) are refused: nodes keep their clocks in sync (NTP). */
const MAX_SKEW_MS = 30_000;
/** At most this many notices, and this many announced gateways, in one datagram. */
export const MAX_PER_DATAGRAM = 16;
/** Datagrams of one sender may arrive out of order within this many sequence numbers. */
const REPLAY_WINDOW = 64;
/** A refusal is logged once per sender address and reason in this period (with the count since). */
const REJECT_LOG_EVERY_MS = 10_000;

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

/** A gateway pod announced by its node: a candidate for the Egress's addresses. */
export interface GatewayAnnouncement extends GatewayInfo {
  egress: string;
}

interface Envelope {
  from: string;
  boot: string;
  seq: number;
  at: number;
  notices: OwnershipNotice[];
  /** Optional (older senders do not send it): the sender's gateway pods, by Egress. */
  gateways?: GatewayAnnouncement[];
  /**
   * Optional: the Egresses ("ns/name") the sender has client pods of. Sent to their candidates and owners,
   * who then repeat their ownership to the sender's node too: owners heartbeat to the nodes that use them,
   * not to every node (a change of owner still goes to every node at once).
   */
  clients?: string[];
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
  if (!Array.isArray(r.notices) || r.notices.length > MAX_PER_DATAGRAM) bad(`notices: ${Array.isArray(r.notices) ? `${r.notices.length} in one datagram (at most ${MAX_PER_DATAGRAM})` : 'not an array'}`);
  if (r.clients !== undefined && (!Array.isArray(r.clients) || r.clients.length > MAX_PER_DATAGRAM || r.clients.some((c) => typeof c !== 'string' || !c || c.length > 253))) {
    bad(`clients: ${Array.isArray(r.clients) ? (r.clients.length > MAX_PER_DATAGRAM ? `${r.clients.length} in one datagram (at most ${MAX_PER_DATAGRAM})` : 'an entry is not an Egress name') : 'not an array'}`);
  }
  if (r.gateways !== undefined && (!Array.isArray(r.gateways) || r.gateways.length > MAX_PER_DATAGRAM)) {
    bad(`gateways: ${Array.isArray(r.gateways) ? `${r.gateways.length} in one datagram (at most ${MAX_PER_DATAGRAM})` : 'not an array'}`);
  }
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
  const gateways = r.gateways === undefined ? undefined : (r.gateways as unknown[]).map((g, i) => {
    const x = g as Record<string, unknown>;
    const str = (k: string) => (typeof x?.[k] === 'string' && (x[k] as string).length > 0 && (x[k] as string).length <= 253 ? (x[k] as string) : bad(`gateways[${i}].${k}`));
    const ip = (k: string) => (isIP(str(k)) ? (x[k] as string) : bad(`gateways[${i}].${k}`));
    const out: GatewayAnnouncement = { egress: str('egress'), pod: str('pod'), node: str('node'), nodeAddress: ip('nodeAddress'), podIp: ip('podIp') };
    if (x.zone !== undefined) out.zone = str('zone');
    if (x.maxAddresses !== undefined) {
      if (!Number.isSafeInteger(x.maxAddresses) || (x.maxAddresses as number) < 0) bad(`gateways[${i}].maxAddresses`);
      out.maxAddresses = x.maxAddresses as number;
    }
    // A node announces only its own gateway pods.
    if (out.node !== r.from) bad(`gateways[${i}].node: ${out.node} announced by ${String(r.from)}`);
    return out;
  });
  const clients = r.clients as string[] | undefined;
  return { from: r.from as string, boot: r.boot as string, seq: r.seq as number, at: r.at as number, notices, ...(gateways ? { gateways } : {}), ...(clients?.length ? { clients } : {}) };
}

/**
 * Packs notices, gateway announcements and client Egresses into as few datagrams as fit MAX_NOTICE_BYTES
 * (and MAX_PER_DATAGRAM of each). An item too large for a datagram on its own is returned in `tooLarge`.
 */
export function packNotices(
  key: Buffer, head: Omit<Envelope, 'notices' | 'gateways' | 'clients' | 'seq'>, nextSeq: () => number,
  notices: OwnershipNotice[], gateways: GatewayAnnouncement[] = [], clients: string[] = [],
): { datagrams: Buffer[]; tooLarge: Array<OwnershipNotice | GatewayAnnouncement | string> } {
  // The envelope's fixed part with the widest numbers it can carry, so an estimate never falls short.
  const fixed = HEADER + MAC_BYTES + Buffer.byteLength(JSON.stringify({ ...head, seq: Number.MAX_SAFE_INTEGER, at: -Number.MAX_SAFE_INTEGER, notices: [], gateways: [], clients: [] }));
  const items = [
    ...notices.map((n) => ({ kind: 'notices' as const, item: n as unknown })),
    ...gateways.map((g) => ({ kind: 'gateways' as const, item: g as unknown })),
    ...clients.map((c) => ({ kind: 'clients' as const, item: c as unknown })),
  ];
  const datagrams: Buffer[] = [];
  const tooLarge: Array<OwnershipNotice | GatewayAnnouncement | string> = [];
  const empty = () => ({ notices: [] as unknown[], gateways: [] as unknown[], clients: [] as unknown[], bytes: fixed });
  let cur = empty();
  const flush = () => {
    if (!cur.notices.length && !cur.gateways.length && !cur.clients.length) return;
    datagrams.push(encodeNotices(key, {
      ...head, seq: nextSeq(), notices: cur.notices as OwnershipNotice[],
      ...(cur.gateways.length ? { gateways: cur.gateways as GatewayAnnouncement[] } : {}),
      ...(cur.clients.length ? { clients: cur.clients as string[] } : {}),
    }));
    cur = empty();
  };
  for (const { kind, item } of items) {
    const size = Buffer.byteLength(JSON.stringify(item)) + 1;
    if (fixed + size > MAX_NOTICE_BYTES) {
      tooLarge.push(item as OwnershipNotice | GatewayAnnouncement | string);
      continue;
    }
    if (cur.bytes + size > MAX_NOTICE_BYTES || cur[kind].length >= MAX_PER_DATAGRAM) flush();
    cur[kind].push(item);
    cur.bytes += size;
  }
  flush();
  return { datagrams, tooLarge };
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
 * authentic, fresh notice, 'gateways' (GatewayAnnouncement[], from: string) for a node's announced gateway
 * pods, 'clients' (string[], from: string, address: string) for the Egresses a node has client pods of, and 'heard' (from: string, address: string) for every authentic datagram (a sign of life of the
 * sender's node); rejected datagrams are counted per reason and logged (rate-limited) with what was refused.
 */
export class NoticeChannel extends EventEmitter {
  private readonly key: Buffer;
  private readonly boot = randomBytes(8).toString('hex');
  private seq = 0;
  /** Per sender: its boot, the highest sequence number seen and which of the REPLAY_WINDOW below it were. */
  private readonly seen = new Map<string, { boot: string; seq: number; window: bigint }>();
  private readonly now: () => number;
  private readonly counters = { rx: 0, tx: 0, accepted: 0, rejected: Object.fromEntries(REJECT_REASONS.map((r) => [r, 0])) as Record<NoticeRejectReason, number> };
  private readonly rejectLog = new Map<string, { at: number; suppressed: number }>();

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

  /**
   * Sends `notices` and `gateways` to every peer address (not to itself), in as many datagrams as they
   * need. Send errors are what liveness detects: logged at debug. An item too large for any datagram is
   * not sent, and named in an error log line.
   */
  send(peers: Iterable<string>, notices: OwnershipNotice[], gateways: GatewayAnnouncement[] = [], opts: { clients?: string[]; port?: number } = {}): void {
    const clients = opts.clients ?? [];
    const port = opts.port ?? this.o.port;
    if (!notices.length && !gateways.length && !clients.length) return;
    const { datagrams, tooLarge } = packNotices(this.key, { from: this.o.node, boot: this.boot, at: this.now() }, () => ++this.seq, notices, gateways, clients);
    for (const t of tooLarge) {
      const item = typeof t === 'string' ? { egress: t, item: 'client' } : { egress: t.egress, item: 'address' in t ? t.address : t.pod };
      log().error('egress: ownership notice too large for a datagram; not sent', { ...item, bytes: Buffer.byteLength(JSON.stringify(t)) });
    }
    for (const p of new Set(peers)) {
      if (p === this.o.address) continue;
      for (const data of datagrams) {
        this.counters.tx++;
        this.sock.send(data, port, p, (err) => {
          if (err) log().debug('egress: ownership notice not sent', { peer: p, error: err.message });
        });
      }
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

  /** True when (boot, seq) from `from` is new; records it. Tolerates reordering within REPLAY_WINDOW. */
  private fresh(from: string, boot: string, seq: number): boolean {
    const last = this.seen.get(from);
    if (!last || last.boot !== boot) {
      this.seen.set(from, { boot, seq, window: 1n });
      return true;
    }
    if (seq > last.seq) {
      const shift = BigInt(Math.min(seq - last.seq, REPLAY_WINDOW));
      last.window = ((last.window << shift) | 1n) & ((1n << BigInt(REPLAY_WINDOW)) - 1n);
      last.seq = seq;
      return true;
    }
    const back = last.seq - seq;
    if (back >= REPLAY_WINDOW) return false;
    const bit = 1n << BigInt(back);
    if (last.window & bit) return false;
    last.window |= bit;
    return true;
  }

  private onMessage(msg: Buffer, from: string): void {
    this.counters.rx++;
    let env: Envelope;
    try {
      env = decodeNotices(this.key, msg);
      const skew = Math.abs(this.now() - env.at);
      if (skew > MAX_SKEW_MS) throw new NoticeRejected('stale', `sent ${skew} ms from now`);
      if (!this.fresh(env.from, env.boot, env.seq)) throw new NoticeRejected('replay', `seq ${env.seq} from ${env.from} already seen`);
    } catch (e) {
      const reason = e instanceof NoticeRejected ? e.reason : 'malformed';
      this.counters.rejected[reason]++;
      this.logRejected(from, reason, (e as Error).message);
      return;
    }
    this.counters.accepted++;
    this.emit('heard', env.from, from);
    if (env.gateways?.length) this.emit('gateways', env.gateways, env.from, from);
    if (env.clients?.length) this.emit('clients', env.clients, env.from, from);
    for (const n of env.notices) this.emit('notice', n, env.from, from);
  }

  /** One warn line per sender address and reason per REJECT_LOG_EVERY_MS, with how many were refused since. */
  private logRejected(from: string, reason: NoticeRejectReason, error: string): void {
    const k = `${from}|${reason}`;
    const now = Date.now();
    const l = this.rejectLog.get(k);
    if (l && now - l.at < REJECT_LOG_EVERY_MS) {
      l.suppressed++;
      return;
    }
    this.rejectLog.set(k, { at: now, suppressed: 0 });
    log().warn('egress: ownership notice refused; nothing in it applied', { from, reason, error, refusedSinceLastLine: l?.suppressed ?? 0 });
  }
}
