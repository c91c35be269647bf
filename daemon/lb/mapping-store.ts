// The load balancer's flow mappings in the cluster store: which target each client of a VIP is mapped to,
// so that every LB pod — old, new or restarted, on any node — sends a client to the same target.
//
// Per VIP and bucket (a hash of the mapping's field picks one of LB_STORE_BUCKETS) one hash
// (mapping → target) and one sorted set (mapping → last use, ms), both tagged {<vip>#<bucket>}: every
// script touches one hash slot, and a hot VIP spreads over BUCKETS slots of a Cluster. The first writer
// of a mapping wins (HSETNX), so LB pods that pick at the same moment agree on the winner's choice; the
// new ones are announced on the VIP's notice channel (mapping-notices.ts). One node per VIP expires idle
// mappings: the holder of the VIP's expirer lease (expirer-lease.ts). Loads are paged (HSCAN,
// ZRANGEBYSCORE … LIMIT), so no one command carries a whole VIP. Nothing here waits for Redis: callers
// queue and retry.
import type Redis from 'ioredis';
import type { StoreConnection } from '../common/store-connection';
import { RUNS_WHEN_FULL } from '../common/store-full';
import { refuseRecord } from '../common/store-record';
import type { MapKey } from '../bpf/lb-structs';
import { LB_STORE_BUCKETS, bucketOf, familyOf, fieldOf, keyOf, sameFamily, type StoredMapping } from './mapping-fields';
import type { MappingNotices } from './mapping-notices';

/** Entries per script call: small enough that no single command blocks Redis for long. */
const PART = 500;
/** Script calls in flight at once on one server (each of up to PART mappings). */
const CONCURRENT_CALLS = 32;
const PAGE = 1000;

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

// KEYS: zset of one bucket. ARGV: score/field pairs. Marks mappings as used (only ever later: GT; never
// re-creates an expired one: XX). A script only to run on a full store (RUNS_WHEN_FULL): it grows nothing,
// and a refused touch would leave the expirer taking mappings in use for idle ones.
const TOUCH = `
return redis.call('ZADD', KEYS[1], 'XX', 'GT', unpack(ARGV))
`;

interface Scripted extends Redis {
  tetherLbTouch(zset: string, ...pairs: Array<string | number>): Promise<number>;
  tetherLbClaim(hash: string, zset: string, now: string, ...pairs: string[]): Promise<Array<string | null>>;
  tetherLbExpire(hash: string, zset: string, cutoff: string, limit: string): Promise<string[]>;
  tetherLbDropTarget(hash: string, zset: string, target: string, ...fields: string[]): Promise<number>;
}

export class MappingStore {
  private readonly client: Scripted;
  private readonly prefix: string;

  /** Over the load balancer's connection set; new mappings are announced through notices. */
  constructor(
    private readonly conn: StoreConnection,
    private readonly notices: MappingNotices,
  ) {
    this.client = conn.client as Scripted;
    this.prefix = conn.prefix;
    // The commands are (re)defined here, whoever made the connection: one key slot per script.
    this.client.defineCommand('tetherLbClaim', { numberOfKeys: 2, lua: CLAIM });
    this.client.defineCommand('tetherLbExpire', { numberOfKeys: 2, lua: EXPIRE });
    this.client.defineCommand('tetherLbDropTarget', { numberOfKeys: 2, lua: DROP_TARGET });
    this.client.defineCommand('tetherLbTouch', { numberOfKeys: 1, lua: RUNS_WHEN_FULL + TOUCH });
  }

  private keys(vip: string, bucket: number): [string, string] {
    return [`${this.prefix}lb:{${vip}#${bucket}}:map`, `${this.prefix}lb:{${vip}#${bucket}}:used`];
  }

  /**
   * Records mappings of one VIP unless the store has them already (first writer wins), and publishes the
   * new ones on the VIP's channel. Returns the mappings in force, in the order given, which differ from
   * the ones given where another LB pod was first. On one server every bucket's call is sent at once, and
   * what they recorded is announced together (MappingNotices.announce), not one notice per bucket.
   */
  async claim(vip: string, list: StoredMapping[], nowMs = Date.now()): Promise<StoredMapping[]> {
    // Notices left unsent go first; while they still cannot go, the new mappings are recorded all the same
    // and the call fails at the end (the caller retries it, which sends them once the channel is back).
    const unsentFailed = await this.notices.sendUnsent(vip).then(() => undefined, (e: unknown) => e ?? new Error('publish failed'));
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
        if (t !== null && t !== undefined && !sameFamily(t, vip)) refuseRecord('lb mapping store', job.hash, fields[j], `target is not an ${familyOf(vip)} address`, t);
        out[j] = { key: list[j].key, target: sameFamily(t, vip) ? t : list[j].target };
      });
    };
    // A failed call does not stop the others: what they recorded is still published below.
    let writeFailed: unknown;
    if (this.conn.sharded) {
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
    const publishFailed = await this.notices.announce(vip, fresh);
    if (writeFailed) throw writeFailed;
    if (publishFailed) throw publishFailed;
    if (unsentFailed) throw unsentFailed;
    return out;
  }

  /** Marks stored mappings as used at nowMs (only ever later: GT; never re-creates an expired one: XX). */
  async touch(vip: string, keys: MapKey[], nowMs = Date.now()): Promise<void> {
    const fields = keys.map(fieldOf);
    for (const [bucket, idx] of byBucket(fields)) {
      const [, zset] = this.keys(vip, bucket);
      for (let i = 0; i < idx.length; i += PAGE) {
        const args: Array<string | number> = [];
        for (const j of idx.slice(i, i + PAGE)) args.push(nowMs, fields[j]);
        await this.client.tetherLbTouch(zset, ...args);
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
    if (key && sameFamily(t, vip)) return { key, target: t };
    refuseRecord('lb mapping store', hash, f, key ? `target is not an ${familyOf(vip)} address` : 'not a mapping field (c:<client> or f:<client>:<proto>:<vport>:<cport>, an IPv6 client in brackets)', t);
    return undefined;
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

  /** Removes all of vip's mappings (the Service is gone). */
  async drop(vip: string): Promise<void> {
    for (let b = 0; b < LB_STORE_BUCKETS; b++) await this.client.del(...this.keys(vip, b));
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
