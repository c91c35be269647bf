// The load balancer's shared mapping store (Redis: one server, through Sentinel, or a Cluster): which
// target each client of a VIP is mapped to, so that every LB pod — old, new or restarted, on any node —
// sends a client to the same target.
//
// Per VIP and bucket (a hash of the mapping's field picks one of LB_STORE_BUCKETS) one hash
// (mapping → target) and one sorted set (mapping → last use, ms), both tagged {<vip>#<bucket>}: every
// script touches one hash slot, and a hot VIP spreads over BUCKETS slots of a Cluster. The first writer
// of a mapping wins (HSETNX), so LB pods that pick at the same moment agree on the winner's choice. New
// mappings are published on the VIP's own channel ({<vip>} tagged; SPUBLISH on a Cluster, PUBLISH
// elsewhere), and only nodes serving the VIP subscribe to it. One node per VIP expires idle mappings: the
// holder of the VIP's expirer lease (SET NX PX). Loads are paged (HSCAN, ZRANGEBYSCORE … LIMIT), so no one
// command carries a whole VIP. Nothing here waits for Redis: callers queue and retry.
import Redis, { type Cluster } from 'ioredis';
import { EventEmitter } from 'node:events';
import { isIPv4 } from 'node:net';
import { log } from '../../lib/log';
import { createRedisClient, parseRedisUrl, reconnectAfterEnd } from '../common/redis';
import { NodeRegistry } from '../common/node-registry';
import { refuseRecord } from '../common/store-record';
import type { MapKey } from '../bpf/lb-structs';
import type { NodeHealthReport } from '../health/health-controller';

/**
 * Buckets per VIP. Every node must use the same count (a mapping's bucket is where every node looks for
 * it), so it is a constant, not an option.
 */
export const LB_STORE_BUCKETS = 16;
/** Entries per script call or page: small enough that no single command blocks Redis for long. */
const PART = 500;
/** Mappings per notice message (a pass's new mappings go in one; a backlog after an outage in several). */
const NOTICE_PART = 2000;
/** Script calls in flight at once on one server (each of up to PART mappings). */
const CONCURRENT_CALLS = 32;
const PAGE = 1000;

/** A mapping as stored: the hash field names the client (and, per flow, the tuple). */
export interface StoredMapping {
  key: MapKey;
  target: string;
}

/** "c:<client>" (client affinity) or "f:<client>:<proto>:<vport>:<cport>" (per flow). */
export function fieldOf(k: MapKey): string {
  return k.vport || k.cport || k.proto ? `f:${k.client}:${k.proto}:${k.vport}:${k.cport}` : `c:${k.client}`;
}

/** The bucket of a field: FNV-1a, the same on every node. */
export function bucketOf(field: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < field.length; i++) h = Math.imul(h ^ field.charCodeAt(i), 0x01000193);
  return (h >>> 0) % LB_STORE_BUCKETS;
}

/** The mapping key of a hash field of vip's mappings; undefined when the field is not one. */
export function keyOf(vip: string, field: string): MapKey | undefined {
  const p = field.split(':');
  const num = (s: string | undefined, max: number) => (s !== undefined && /^\d{1,5}$/.test(s) && Number(s) <= max ? Number(s) : undefined);
  if (p[0] === 'c' && p.length === 2 && isIPv4(p[1])) return { vip, client: p[1], vport: 0, cport: 0, proto: 0 };
  if (p[0] === 'f' && p.length === 5 && isIPv4(p[1])) {
    const proto = num(p[2], 255);
    const vport = num(p[3], 65535);
    const cport = num(p[4], 65535);
    if (proto !== undefined && vport !== undefined && cport !== undefined) return { vip, client: p[1], vport, cport, proto };
  }
  return undefined;
}

// KEYS: hash, zset of one bucket. ARGV: now ms, then field/target pairs. HSETNX each: a new mapping is
// stamped and returned as "+<target>" (the caller publishes it); an existing one wins over ours.
const CLAIM = `
local out = {}
for i = 2, #ARGV, 2 do
  local f, t = ARGV[i], ARGV[i + 1]
  if redis.call('HSETNX', KEYS[1], f, t) == 1 then
    redis.call('ZADD', KEYS[2], ARGV[1], f)
    out[#out + 1] = '+' .. t
  else
    out[#out + 1] = redis.call('HGET', KEYS[1], f)
  end
end
return out
`;

// KEYS: hash, zset of one bucket. ARGV: cutoff ms, limit. Removes up to limit mappings unused since cutoff;
// returns their fields. Lua unpacks at most ~8,000 values at once (LUAI_MAXCSTACK): parts of 500.
const EXPIRE = `
local old = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
for i = 1, #old, 500 do
  local part = {unpack(old, i, math.min(i + 499, #old))}
  redis.call('HDEL', KEYS[1], unpack(part))
  redis.call('ZREM', KEYS[2], unpack(part))
end
return old
`;

// KEYS: hash, zset of one bucket. ARGV: target, then fields (one page the caller scanned). Removes each
// field still mapped to target; returns how many.
const DROP_TARGET = `
local n = 0
for i = 2, #ARGV do
  if redis.call('HGET', KEYS[1], ARGV[i]) == ARGV[1] then
    redis.call('HDEL', KEYS[1], ARGV[i])
    redis.call('ZREM', KEYS[2], ARGV[i])
    n = n + 1
  end
end
return n
`;

// KEYS: the VIP's expirer lease. ARGV: holder, lease ms. Taken when free, renewed by its holder; 1 when
// the caller holds it now.
const LEASE = `
local cur = redis.call('GET', KEYS[1])
if cur == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if cur then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])
return 1
`;

interface Scripted extends Redis {
  tetherLbClaim(hash: string, zset: string, now: string, ...pairs: string[]): Promise<Array<string | null>>;
  tetherLbExpire(hash: string, zset: string, cutoff: string, limit: string): Promise<string[]>;
  tetherLbDropTarget(hash: string, zset: string, target: string, ...fields: string[]): Promise<number>;
  tetherLbLease(key: string, holder: string, ms: string): Promise<number>;
}

export class MappingStore extends EventEmitter {
  private closed = false;
  /** Notice channels wanted (the VIPs this node serves) and the ones subscribed now. */
  private wanted = new Set<string>();
  private readonly subscribed = new Set<string>();
  private syncing?: Promise<void>;
  private nodeRegistry?: NodeRegistry;
  /**
   * New mappings recorded whose notice could not be published (on a Cluster the channel's primary may be
   * down while the buckets' are up): VIP → field → target, sent before the VIP's next claim.
   */
  private readonly unsent = new Map<string, Map<string, string>>();

  private constructor(
    private readonly client: Scripted,
    private readonly sub: Redis,
    private readonly prefix: string,
  ) {
    super();
    // The commands are (re)defined here, whoever made the connections: one key slot per script.
    client.defineCommand('tetherLbClaim', { numberOfKeys: 2, lua: CLAIM });
    client.defineCommand('tetherLbExpire', { numberOfKeys: 2, lua: EXPIRE });
    client.defineCommand('tetherLbDropTarget', { numberOfKeys: 2, lua: DROP_TARGET });
    client.defineCommand('tetherLbLease', { numberOfKeys: 1, lua: LEASE });
    sub.on('smessage', (_ch: string, msg: string) => this.onNotice(msg));
    sub.on('ready', () => void this.syncSubscriptions());
    // A Cluster's sharded subscribers were set up again (a shard's primary failed over, slots moved):
    // notices published meanwhile never arrived here, so callers read back what changed.
    sub.on('subscribersReady', () => this.emit('resubscribed'));
    // ioredis resubscribes what it had after a reconnect; a connection that ended for good starts empty.
    sub.on('end', () => this.subscribed.clear());
  }

  /**
   * Connects (without waiting for Redis: a store that is down is reconnected in the background). Events:
   * 'mapping' (a StoredMapping another LB pod recorded), 'ready' (connected again: callers write back what
   * they hold and reload), 'resubscribed' (a Cluster's notice subscriptions were made again: notices may
   * have been missed, callers read back what changed), 'garbled' (a notice that is not a mapping; logged
   * and ignored).
   */
  static async connect(url: string, opts: { keyPrefix?: string; timeoutMs?: number } = {}): Promise<MappingStore> {
    const target = parseRedisUrl(url);
    const prefix = opts.keyPrefix ?? 'tether:';
    // One server, Sentinel or a Cluster alike (createRedisClient); a Cluster client answers every command used here.
    const common = { connectTimeoutMs: opts.timeoutMs ?? 1000, commandTimeoutMs: opts.timeoutMs ?? 2000 };
    const client = createRedisClient(target, { ...common, enableOfflineQueue: false, connectionName: 'tether-lb' });
    const sub = createRedisClient(target, { ...common, enableOfflineQueue: true, connectionName: 'tether-lb-sub', shardedSubscribers: true });
    for (const c of [client, sub]) c.on('error', (e: Error) => log().debug('lb mapping store connection error', { error: e.message }));
    // Each VIP's notices come on its own channel, subscribed by serve() for the VIPs this node holds.
    const store = MappingStore.over(client, sub, prefix);
    reconnectAfterEnd(client, () => store.closed, 'lb mappings');
    reconnectAfterEnd(sub, () => store.closed, 'lb mapping notices');
    try {
      await client.connect();
    } catch (e) {
      log().warn('lb mapping store unreachable at start; forwarding goes on from local maps', { store: target.where, error: (e as Error).message });
    }
    sub.connect().catch(() => undefined);
    return store;
  }

  /**
   * A store over connections made elsewhere (a connection factory; ioredis's Cluster client with
   * shardedSubscribers for a Redis Cluster): the same wiring connect() does, without connecting.
   */
  static over(client: Redis | Cluster, sub: Redis | Cluster, prefix = 'tether:'): MappingStore {
    const store = new MappingStore(client as unknown as Scripted, sub as unknown as Redis, prefix);
    sub.on('message', (_ch: string, msg: string) => store.onNotice(msg));
    client.on('ready', () => store.emit('ready'));
    return store;
  }

  get connected(): boolean {
    return this.client.status === 'ready';
  }

  /** On a Redis Cluster notices go by sharded pub/sub (to the channel's shard only); elsewhere plain. */
  get sharded(): boolean {
    return (this.client as { isCluster?: boolean }).isCluster === true;
  }

  /** The VIP's own notice channel, in the VIP's slot. */
  noticeChannel(vip: string): string {
    return `${this.prefix}lb:{${vip}}:notices`;
  }

  private keys(vip: string, bucket: number): [string, string] {
    return [`${this.prefix}lb:{${vip}#${bucket}}:map`, `${this.prefix}lb:{${vip}#${bucket}}:used`];
  }

  private leaseKey(vip: string): string {
    return `${this.prefix}lb:{${vip}}:expirer`;
  }

  /**
   * The VIPs whose new mappings this node wants (those it serves): their channels are subscribed, the
   * others' left. Idempotent; with the store away it takes effect on the next connection.
   */
  async serve(vips: Iterable<string>): Promise<void> {
    this.wanted = new Set([...vips].map((v) => this.noticeChannel(v)));
    await this.syncSubscriptions();
  }

  /** Channels this node is subscribed to now (status and tests). */
  subscriptions(): string[] {
    return [...this.subscribed].sort();
  }

  /** Whether this node receives vip's new mappings now. */
  hears(vip: string): boolean {
    return this.subscribed.has(this.noticeChannel(vip));
  }

  private async syncSubscriptions(): Promise<void> {
    while (this.syncing) await this.syncing;
    if (this.closed || this.sub.status !== 'ready') return;
    const add = [...this.wanted].filter((c) => !this.subscribed.has(c));
    const del = [...this.subscribed].filter((c) => !this.wanted.has(c));
    if (!add.length && !del.length) return;
    this.syncing = (async () => {
      try {
        // A Cluster takes one sharded channel per command (channels of one command share a slot).
        const parts = (l: string[]) => (this.sharded ? l.map((c) => [c]) : Array.from({ length: Math.ceil(l.length / PART) }, (_, i) => l.slice(i * PART, (i + 1) * PART)));
        for (const p of parts(add)) {
          await (this.sharded ? this.sub.ssubscribe(...p) : this.sub.subscribe(...p));
          for (const c of p) this.subscribed.add(c);
        }
        for (const p of parts(del)) {
          await (this.sharded ? this.sub.sunsubscribe(...p) : this.sub.unsubscribe(...p));
          for (const c of p) this.subscribed.delete(c);
        }
      } catch (e) {
        log().warn('lb mapping store: (un)subscribing notice channels failed; retried on the next change or connection', { error: (e as Error).message });
      } finally {
        this.syncing = undefined;
      }
    })();
    await this.syncing;
  }

  /** A notice: {"vip": …, "mappings": [[field, target], …]}. Bad ones are named and ignored. */
  private onNotice(msg: string): void {
    let n: { vip?: unknown; mappings?: unknown };
    try {
      n = JSON.parse(msg) as typeof n;
    } catch {
      n = {};
    }
    const vip = typeof n.vip === 'string' && isIPv4(n.vip) ? n.vip : undefined;
    const list = Array.isArray(n.mappings) ? n.mappings : undefined;
    if (!vip || !list) {
      this.garbled(msg);
      return;
    }
    for (const e of list) {
      const key = Array.isArray(e) && typeof e[0] === 'string' ? keyOf(vip, e[0]) : undefined;
      const target = Array.isArray(e) ? e[1] : undefined;
      if (!key || typeof target !== 'string' || !isIPv4(target)) this.garbled(JSON.stringify(e));
      else this.emit('mapping', { key, target } satisfies StoredMapping);
    }
  }

  private garbled(msg: string): void {
    log().warn('lb mapping store: garbled mapping notice ignored', { notice: msg.slice(0, 200) });
    this.emit('garbled', msg);
  }

  private async publish(vip: string, mappings: Array<[string, string]>): Promise<void> {
    const msg = JSON.stringify({ vip, mappings });
    const ch = this.noticeChannel(vip);
    await (this.sharded ? this.client.spublish(ch, msg) : this.client.publish(ch, msg));
  }

  /**
   * Records mappings of one VIP unless the store has them already (first writer wins), and publishes the
   * new ones on the VIP's channel. Returns the mappings in force, in the order given, which differ from
   * the ones given where another LB pod was first. On one server every bucket's call is sent at once, and
   * what they recorded goes out as one notice per NOTICE_PART: a node hears a pass's new mappings in one
   * message, not one per bucket.
   */
  async claim(vip: string, list: StoredMapping[], nowMs = Date.now()): Promise<StoredMapping[]> {
    // Notices left unsent go first; while they still cannot go, the new mappings are recorded all the same
    // and the call fails at the end (the caller retries it, which sends them once the channel is back).
    const unsentFailed = await this.sendUnsent(vip).then(() => undefined, (e: unknown) => e ?? new Error('publish failed'));
    const out: StoredMapping[] = new Array(list.length);
    const fields = list.map((m) => fieldOf(m.key));
    const fresh: Array<[string, string]> = [];
    const now = String(nowMs);
    // One script call per bucket and part of up to PART mappings.
    const jobs: Array<{ hash: string; zset: string; part: number[] }> = [];
    for (const [bucket, idx] of byBucket(fields)) {
      const [hash, zset] = this.keys(vip, bucket);
      for (let i = 0; i < idx.length; i += PART) jobs.push({ hash, zset, part: idx.slice(i, i + PART) });
    }
    const pairs = (job: (typeof jobs)[number]): string[] => {
      const a: string[] = [];
      for (const j of job.part) a.push(fields[j], list[j].target);
      return a;
    };
    const apply = (job: (typeof jobs)[number], got: Array<string | null>): void => {
      job.part.forEach((j, n) => {
        let t = got[n];
        if (typeof t === 'string' && t.startsWith('+')) {
          t = t.slice(1);
          fresh.push([fields[j], t]);
        }
        // A stored target that is not an address is not followed: this pod keeps its own pick.
        if (t !== null && t !== undefined && !isIPv4(t)) refuseRecord('lb mapping store', job.hash, fields[j], 'target is not an IPv4 address', t);
        out[j] = { key: list[j].key, target: t && isIPv4(t) ? t : list[j].target };
      });
    };
    // A failed call does not stop the others: what they recorded is still published below.
    let writeFailed: unknown;
    if (this.sharded) {
      // A Cluster's buckets sit on different shards, and a Cluster client without an offline queue refuses
      // a command to a shard whose connection is still being made: one call after the other.
      for (const job of jobs) {
        await this.client.tetherLbClaim(job.hash, job.zset, now, ...pairs(job)).then((got) => apply(job, got), (e: unknown) => void (writeFailed ??= e));
      }
    } else {
      // One server: the calls are sent CONCURRENT_CALLS at once (back to back on the connection), their
      // replies read together; a backlog after an outage goes in waves, so no call waits past its timeout.
      for (let i = 0; i < jobs.length; i += CONCURRENT_CALLS) {
        await Promise.all(jobs.slice(i, i + CONCURRENT_CALLS).map((job) => this.client.tetherLbClaim(job.hash, job.zset, now, ...pairs(job)).then((got) => apply(job, got), (e: unknown) => void (writeFailed ??= e))));
      }
    }
    // Published after the writes (a channel is never a script key), including what the buckets that did
    // not fail recorded. When that fails the mappings are stored but no longer fresh (a retried claim finds
    // them recorded), so their notice is kept and sent before the VIP's next claim (the caller retries this
    // one): on a Cluster, a failed-over channel primary would otherwise lose it for the serving nodes for good.
    let publishFailed: unknown;
    for (let i = 0; i < fresh.length; i += NOTICE_PART) {
      try {
        await this.publish(vip, fresh.slice(i, i + NOTICE_PART));
      } catch (e) {
        const q = this.unsent.get(vip) ?? new Map<string, string>();
        for (const [f, t] of fresh.slice(i)) q.set(f, t);
        this.unsent.set(vip, q);
        publishFailed = e ?? new Error('publish failed');
        break;
      }
    }
    if (writeFailed) throw writeFailed;
    if (publishFailed) throw publishFailed;
    if (unsentFailed) throw unsentFailed;
    return out;
  }

  /** Publishes the notices of vip that a failed publish left behind, in parts; kept when it fails again. */
  private async sendUnsent(vip: string): Promise<void> {
    const q = this.unsent.get(vip);
    if (!q) return;
    const all = [...q];
    for (let i = 0; i < all.length; i += NOTICE_PART) {
      const part = all.slice(i, i + NOTICE_PART);
      await this.publish(vip, part);
      for (const [f, t] of part) if (q.get(f) === t) q.delete(f);
    }
    if (!q.size) this.unsent.delete(vip);
    log().info('lb mapping store: notices that failed to publish sent again', { vip, mappings: all.length });
  }

  /** Marks stored mappings as used at nowMs (only ever later: GT; never re-creates an expired one: XX). */
  async touch(vip: string, keys: MapKey[], nowMs = Date.now()): Promise<void> {
    const fields = keys.map(fieldOf);
    for (const [bucket, idx] of byBucket(fields)) {
      const [, zset] = this.keys(vip, bucket);
      for (let i = 0; i < idx.length; i += PAGE) {
        const args: Array<string | number> = [];
        for (const j of idx.slice(i, i + PAGE)) args.push(nowMs, fields[j]);
        await this.client.zadd(zset, 'XX', 'GT', ...(args as [number, string]));
      }
    }
  }

  /**
   * Every mapping of vip, page by page (HSCAN … COUNT): onPage gets each page's valid mappings as it is
   * read, so a VIP of a million mappings never travels in one reply. Fields that are not mappings, or
   * whose target is not an address, are skipped (one warn line each, counted in `garbled`).
   */
  async loadPages(vip: string, onPage: (page: StoredMapping[]) => void, count = PAGE): Promise<{ loaded: number; garbled: number }> {
    let loaded = 0;
    let garbled = 0;
    for (let b = 0; b < LB_STORE_BUCKETS; b++) {
      const [hash] = this.keys(vip, b);
      let cursor = '0';
      do {
        const [next, flat] = await this.client.hscan(hash, cursor, 'COUNT', count);
        cursor = next;
        const page: StoredMapping[] = [];
        for (let i = 0; i < flat.length; i += 2) {
          const m = this.parse(vip, hash, flat[i], flat[i + 1]);
          if (m) page.push(m);
          else garbled++;
        }
        loaded += page.length;
        if (page.length) onPage(page);
      } while (cursor !== '0');
    }
    return { loaded, garbled };
  }

  /** Every mapping of vip (paged underneath); see loadPages. */
  async load(vip: string): Promise<{ mappings: StoredMapping[]; garbled: number }> {
    const mappings: StoredMapping[] = [];
    const { garbled } = await this.loadPages(vip, (p) => {
      for (const m of p) mappings.push(m);
    });
    return { mappings, garbled };
  }

  /**
   * The mappings of vip recorded or used since sinceMs, page by page: what a node that was away from the
   * store missed, without reading the rest.
   */
  async loadChangedSince(vip: string, sinceMs: number, onPage: (page: StoredMapping[]) => void, count = PAGE): Promise<number> {
    let n = 0;
    for (let b = 0; b < LB_STORE_BUCKETS; b++) {
      const [hash, zset] = this.keys(vip, b);
      for (let offset = 0; ; offset += count) {
        const fields = await this.client.zrangebyscore(zset, sinceMs, '+inf', 'LIMIT', offset, count);
        if (!fields.length) break;
        const targets = await this.client.hmget(hash, ...fields);
        const page: StoredMapping[] = [];
        fields.forEach((f, i) => {
          const t = targets[i];
          const m = t === null ? undefined : this.parse(vip, hash, f, t);
          if (m) page.push(m);
        });
        n += page.length;
        if (page.length) onPage(page);
        if (fields.length < count) break;
      }
    }
    return n;
  }

  private parse(vip: string, hash: string, f: string, t: string): StoredMapping | undefined {
    const key = keyOf(vip, f);
    if (key && isIPv4(t)) return { key, target: t };
    refuseRecord('lb mapping store', hash, f, key ? 'target is not an IPv4 address' : 'not a mapping field (c:<client> or f:<client>:<proto>:<vport>:<cport>)', t);
    return undefined;
  }

  /**
   * Takes or renews the VIP's expirer lease for holder (a node name); true when holder is the expirer. One
   * node per VIP expires its mappings, however many serve it; when it goes, the lease lapses after leaseMs
   * and the next node to ask takes over.
   */
  async expirer(vip: string, holder: string, leaseMs: number): Promise<boolean> {
    return (await this.client.tetherLbLease(this.leaseKey(vip), holder, String(Math.max(1, Math.round(leaseMs))))) === 1;
  }

  /**
   * Removes all of vip's mappings unused for idleS, however many; returns the keys removed. Each script
   * call removes at most `batch` of one bucket, so Redis is never blocked for long by a huge idle crowd.
   */
  async expire(vip: string, idleS: number, nowMs = Date.now(), batch = 5000): Promise<MapKey[]> {
    const cutoff = String(nowMs - idleS * 1000);
    const out: MapKey[] = [];
    for (let b = 0; b < LB_STORE_BUCKETS; b++) {
      const [hash, zset] = this.keys(vip, b);
      for (;;) {
        const gone = await this.client.tetherLbExpire(hash, zset, cutoff, String(batch));
        for (const f of gone) {
          const k = keyOf(vip, f);
          if (k) out.push(k);
        }
        // The cutoff is fixed, so the idle set only shrinks: a short batch was the last one.
        if (gone.length < batch) break;
      }
    }
    return out;
  }

  /** Removes every mapping of vip to target (the target is gone), a scanned page at a time; returns how many. */
  async dropTarget(vip: string, target: string): Promise<number> {
    let n = 0;
    for (let b = 0; b < LB_STORE_BUCKETS; b++) {
      const [hash, zset] = this.keys(vip, b);
      let cursor = '0';
      do {
        const [next, flat] = await this.client.hscan(hash, cursor, 'COUNT', PAGE);
        cursor = next;
        const fields: string[] = [];
        for (let i = 0; i < flat.length; i += 2) if (flat[i + 1] === target) fields.push(flat[i]);
        if (fields.length) n += await this.client.tetherLbDropTarget(hash, zset, target, ...fields);
      } while (cursor !== '0');
    }
    return n;
  }

  /** Removes all of vip's mappings and its expirer lease (the Service is gone). */
  async dropVip(vip: string): Promise<void> {
    for (let b = 0; b < LB_STORE_BUCKETS; b++) await this.client.del(...this.keys(vip, b));
    await this.client.del(this.leaseKey(vip));
    this.unsent.delete(vip);
  }

  /**
   * Registers this node's address for `ttlMs` and returns every registered node's address (sorted): one
   * command whose reply carries only what changed since this node's last call (targets accept FoU only
   * from registered nodes).
   */
  async beatNode(node: string, address: string, ttlMs: number): Promise<string[]> {
    if (!this.nodeRegistry) this.nodeRegistry = new NodeRegistry(this.client as unknown as Redis, this.prefix, node, address);
    return this.nodeRegistry.beat(ttlMs);
  }

  /** This node's health-check answers, for the Services' status (the leader reads every node's). */
  async reportHealth(node: string, report: NodeHealthReport, ttlMs: number): Promise<void> {
    await this.client.hset(`${this.prefix}lb:health`, node, JSON.stringify({ report, expiresAt: Date.now() + ttlMs }));
  }

  /** Every node's latest health report that has not expired; expired and garbled entries are removed. */
  async healthReports(nowMs = Date.now()): Promise<Record<string, NodeHealthReport>> {
    const key = `${this.prefix}lb:health`;
    const out: Record<string, NodeHealthReport> = {};
    const stale: string[] = [];
    for (const [node, v] of Object.entries(await this.client.hgetall(key))) {
      let r: { report?: NodeHealthReport; expiresAt?: number } | undefined;
      try {
        r = JSON.parse(v) as typeof r;
      } catch {
        r = undefined;
      }
      if (!r || typeof r.expiresAt !== 'number' || typeof r.report?.services !== 'object' || r.report.services === null) {
        log().warn('lb mapping store: garbled health report removed', { node, report: v.slice(0, 200) });
        stale.push(node);
      } else if (r.expiresAt <= nowMs) stale.push(node);
      else out[node] = r.report;
    }
    if (stale.length) await this.client.hdel(key, ...stale);
    return out;
  }

  async close(): Promise<void> {
    this.closed = true;
    this.client.disconnect();
    this.sub.disconnect();
  }
}

/** Indexes of fields grouped by bucket. */
function byBucket(fields: string[]): Map<number, number[]> {
  const m = new Map<number, number[]>();
  fields.forEach((f, i) => {
    const b = bucketOf(f);
    const l = m.get(b);
    if (l) l.push(i);
    else m.set(b, [i]);
  });
  return m;
}
