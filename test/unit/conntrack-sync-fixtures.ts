// Shared by the conntrack-sync tests (no tests here): synthetic entries, a model of the receiver's
// kernel table, a frame-aware TCP proxy to tamper with/replay/stall traffic, and polling helpers.
import { randomBytes } from 'node:crypto';
import * as net from 'node:net';
import { Writable } from 'node:stream';
import { entryKey, IPS, type ConntrackEntry, type ConntrackEvent } from '../../daemon/conntrack/types';
import { log, makeLogger, setLogger, type Logger } from '../../lib/log';
import { Digests, inBuckets, keyHash, SyncReceiver, type BucketSet, type KeySet, type SyncReceiverOptions } from '../../daemon/conntrack-sync';
import { sleep, waitFor as pollFor } from '../lib/wait';

export const KEY = randomBytes(32);

/** Log lines of the code under test, kept instead of printed (between captureLogs and restoreLogs). */
export const logLines: Array<Record<string, unknown>> = [];
const capture = makeLogger({
  level: 'debug',
  stream: new Writable({
    write(chunk, _enc, cb) {
      for (const l of String(chunk).split('\n')) if (l.trim()) logLines.push(JSON.parse(l));
      cb();
    },
  }),
});
let saved: Logger | undefined;
// Hooks rather than an import-time swap: uvu loads every file of the group before running any.
export function captureLogs(): void {
  saved = log();
  setLogger(capture);
}
export function restoreLogs(): void {
  if (saved) setLogger(saved);
}

/** A TCP/IPv4 flow SNATed to a floating address; `i` makes it unique, `rev` changes its content. */
export function entry(i: number, rev = 0): ConntrackEntry {
  const src = `10.${(i >> 16) & 255}.${(i >> 8) & 255}.${i & 255}`;
  const sport = 1024 + (i % 60000);
  return {
    orig: { family: 4, proto: 6, src, dst: '198.51.100.7', sport, dport: 443 },
    reply: { family: 4, proto: 6, src: '198.51.100.7', dst: '203.0.113.10', sport: 443, dport: sport },
    status: IPS.CONFIRMED | IPS.SEEN_REPLY | IPS.ASSURED | IPS.SRC_NAT | IPS.SRC_NAT_DONE,
    timeout: 432000 - rev,
    mark: 0x100,
    zone: 0,
    tcp: { state: 3, wscaleOrig: 7, wscaleReply: 7, flagsOrig: 0x2323, flagsReply: 0x2323 },
    id: 1_000_000 + i,
  };
}

export function entry6(i: number): ConntrackEntry {
  return {
    orig: { family: 6, proto: 17, src: `fd00::${(i & 0xffff).toString(16)}`, dst: '2001:db8::53', sport: 5000 + (i % 1000), dport: 53 },
    reply: { family: 6, proto: 17, src: '2001:db8::53', dst: '2001:db8:ffff::10', sport: 53, dport: 5000 + (i % 1000) },
    status: IPS.CONFIRMED | IPS.SRC_NAT | IPS.SRC_NAT_DONE,
    timeout: 30,
  };
}

export const ev = (type: ConntrackEvent['type'], e: ConntrackEntry): ConntrackEvent => ({ type, entry: e });

/** What a kernel table would hold: upserts for new/update and transfer chunks, delete for destroy and sweeps. */
export class Table {
  readonly map = new Map<string, ConntrackEntry>();
  readonly applied: ConntrackEvent[] = [];
  /** Entries carried by each completed full transfer (recorded at its sweep). */
  replaceCalls: number[] = [];
  /** Buckets of each completed partial transfer. */
  bucketCalls: number[][] = [];
  upserted = 0;
  swept = 0;

  upsert(entries: ConntrackEntry[]): void {
    this.upserted += entries.length;
    for (const e of entries) this.map.set(entryKey(e), e);
  }

  sweep(keep: KeySet, set: BucketSet): number {
    let n = 0;
    for (const [k, e] of this.map) {
      if (!inBuckets(set, e)) continue;
      const [hi, lo] = keyHash(e);
      if (!keep.has(hi, lo)) {
        this.map.delete(k);
        n++;
      }
    }
    this.swept += n;
    if (set.list) this.bucketCalls.push(set.list);
    else this.replaceCalls.push(keep.size);
    return n;
  }

  digests(k: number): Digests {
    return Digests.of(this.map.values(), k);
  }

  apply(events: ConntrackEvent[]): void {
    for (const e of events) {
      this.applied.push(e);
      if (e.type === 'destroy') this.map.delete(entryKey(e.entry));
      else this.map.set(entryKey(e.entry), e.entry);
    }
  }

  replaceAll(entries: ConntrackEntry[]): void {
    this.replaceCalls.push(entries.length);
    this.map.clear();
    for (const e of entries) this.map.set(entryKey(e), e);
  }
}

/** A receiver on 127.0.0.1 feeding a Table. */
export async function startReceiver(opts: Partial<SyncReceiverOptions> = {}, table = new Table()): Promise<{ rx: SyncReceiver; table: Table; port: number }> {
  const rx = new SyncReceiver({
    key: KEY, id: 'node-b', host: '127.0.0.1', port: 0,
    apply: (evs) => table.apply(evs),
    upsert: (entries) => table.upsert(entries),
    sweep: (keep, set) => table.sweep(keep, set),
    digests: (k) => table.digests(k),
    ...opts,
  });
  const port = await rx.listen();
  return { rx, table, port };
}

export function sameTable(a: Map<string, ConntrackEntry>, b: Map<string, ConntrackEntry>): string | undefined {
  if (a.size !== b.size) return `sizes ${a.size} vs ${b.size}`;
  for (const [k, v] of a) {
    const w = b.get(k);
    if (!w) return `missing ${k}`;
    if (canonical(v) !== canonical(w)) return `differs at ${k}: ${canonical(v)} vs ${canonical(w)}`;
  }
  return undefined;
}

/** JSON with sorted keys, so field order does not matter. */
export function canonical(v: unknown): string {
  return JSON.stringify(v, (_k, x) => (x && typeof x === 'object' && !Array.isArray(x) ? Object.fromEntries(Object.entries(x).sort(([a], [b]) => (a < b ? -1 : 1))) : x));
}

/** test/lib/wait's waitFor, polling every 2 ms: these tests time sub-second protocol behaviour. */
export function waitFor(cond: () => boolean, what: string, timeoutMs = 5000): Promise<number> {
  return pollFor(cond, what, { timeoutMs, intervalMs: 2 });
}

export { sleep };

/** A whole frame as seen on the wire by the proxy. */
export interface WireFrame {
  conn: number;
  type: number;
  seq: number;
  bytes: Buffer;
}

/**
 * A TCP proxy in front of a receiver that splits the sender → receiver stream into frames (by length
 * prefix only, it knows no keys) so a test can rewrite, duplicate, capture or hold them back.
 */
export class Proxy {
  readonly frames: WireFrame[] = [];
  /** Returns the frames to forward in place of `f` (default: itself). */
  rewrite: (f: WireFrame) => Buffer[] = (f) => [f.bytes];
  /** Stop forwarding in either direction while still holding the connections open. */
  blackhole = false;
  private server: net.Server;
  private conns: Array<{ a: net.Socket; b: net.Socket }> = [];
  private count = 0;

  constructor(private readonly target: number) {
    this.server = net.createServer((a) => this.accept(a));
  }

  async listen(): Promise<number> {
    await new Promise<void>((r) => this.server.listen(0, '127.0.0.1', () => r()));
    return (this.server.address() as net.AddressInfo).port;
  }

  /** Stop / resume reading from senders: their data piles up in TCP buffers, as with a stuck receiver. */
  pauseUpstream(): void {
    for (const c of this.conns) c.a.pause();
    this.paused = true;
  }
  resumeUpstream(): void {
    this.paused = false;
    for (const c of this.conns) c.a.resume();
  }
  private paused = false;

  async close(): Promise<void> {
    for (const c of this.conns) {
      c.a.destroy();
      c.b.destroy();
    }
    await new Promise<void>((r) => this.server.close(() => r()));
  }

  private accept(a: net.Socket): void {
    const conn = this.count++;
    const b = net.connect(this.target, '127.0.0.1');
    this.conns.push({ a, b });
    if (this.paused) a.pause();
    let pending = Buffer.alloc(0);
    a.on('data', (chunk: Buffer) => {
      if (this.blackhole) return;
      pending = Buffer.concat([pending, chunk]);
      while (pending.length >= 4 && pending.length >= 4 + pending.readUInt32BE(0)) {
        const n = 4 + pending.readUInt32BE(0);
        const bytes = Buffer.from(pending.subarray(0, n));
        pending = pending.subarray(n);
        const f: WireFrame = { conn, type: bytes[5], seq: bytes.readUInt32BE(20), bytes };
        this.frames.push(f);
        for (const out of this.rewrite(f)) b.write(out);
      }
    });
    b.on('data', (chunk: Buffer) => {
      if (!this.blackhole) a.write(chunk);
    });
    const end = () => {
      a.destroy();
      b.destroy();
    };
    a.on('close', end);
    b.on('close', end);
    a.on('error', end);
    b.on('error', end);
  }
}

/** Connects a raw client to `port`; resolves with the socket, everything it received, and its closing. */
export async function rawClient(port: number): Promise<{ s: net.Socket; got: () => Buffer; closed: Promise<void> }> {
  const s = net.connect(port, '127.0.0.1');
  const chunks: Buffer[] = [];
  s.on('data', (c) => chunks.push(c));
  s.on('error', () => undefined);
  const closed = new Promise<void>((r) => s.once('close', () => r()));
  await new Promise<void>((r, j) => {
    s.once('connect', () => r());
    s.once('error', j);
  });
  return { s, got: () => Buffer.concat(chunks), closed };
}
