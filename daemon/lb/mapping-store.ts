// The load balancer's shared mapping store (Redis, one server or through Sentinel): which target each
// client of a VIP is mapped to, so that every LB pod — old, new or restarted, on any node — sends a client
// to the same target. Per VIP one hash (mapping → target) and one sorted set (mapping → last use, ms).
// The first writer of a mapping wins (HSETNX), so LB pods that pick at the same moment agree on the
// winner's choice; every recorded mapping is published, and LB pods install what others recorded. Idle
// mappings are expired by last use. Nothing here waits for Redis: callers queue and retry.
import Redis from 'ioredis';
import { EventEmitter } from 'node:events';
import { isIPv4 } from 'node:net';
import { log } from '../log';
import { createRedisClient, parseRedisUrl, reconnectAfterEnd } from '../common/redis';
import { listNodes, registerNode } from '../common/node-registry';
import { refuseRecord } from '../common/store-record';
import type { MapKey } from '../bpf/lb-structs';
import type { NodeHealthReport } from '../health/health-controller';

/** A mapping as stored: the hash field names the client (and, per flow, the tuple). */
export interface StoredMapping {
  key: MapKey;
  target: string;
}

/** "c:<client>" (client affinity) or "f:<client>:<proto>:<vport>:<cport>" (per flow). */
export function fieldOf(k: MapKey): string {
  return k.vport || k.cport || k.proto ? `f:${k.client}:${k.proto}:${k.vport}:${k.cport}` : `c:${k.client}`;
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

// KEYS: hash, zset, channel. ARGV: now ms, vip, then field/target pairs. HSETNX each: a new mapping is
// stamped and published; an existing one wins over ours. Returns the target in force for each pair.
const CLAIM = `
local out = {}
for i = 3, #ARGV, 2 do
  local f, t = ARGV[i], ARGV[i + 1]
  if redis.call('HSETNX', KEYS[1], f, t) == 1 then
    redis.call('ZADD', KEYS[2], ARGV[1], f)
    redis.call('PUBLISH', KEYS[3], cjson.encode({vip = ARGV[2], field = f, target = t}))
    out[#out + 1] = t
  else
    out[#out + 1] = redis.call('HGET', KEYS[1], f)
  end
end
return out
`;

// KEYS: hash, zset. ARGV: cutoff ms, limit. Removes up to limit mappings unused since cutoff; returns their
// fields. Lua unpacks at most ~8,000 values at once (LUAI_MAXCSTACK), so the fields go in parts of 500.
const EXPIRE = `
local old = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
for i = 1, #old, 500 do
  local part = {unpack(old, i, math.min(i + 499, #old))}
  redis.call('HDEL', KEYS[1], unpack(part))
  redis.call('ZREM', KEYS[2], unpack(part))
end
return old
`;

// KEYS: hash, zset. ARGV: target. Removes every mapping to target; returns how many.
const DROP_TARGET = `
local all = redis.call('HGETALL', KEYS[1])
local gone = {}
for i = 1, #all, 2 do
  if all[i + 1] == ARGV[1] then gone[#gone + 1] = all[i] end
end
for i = 1, #gone, 500 do
  local part = {unpack(gone, i, math.min(i + 499, #gone))}
  redis.call('HDEL', KEYS[1], unpack(part))
  redis.call('ZREM', KEYS[2], unpack(part))
end
return #gone
`;

interface Scripted extends Redis {
  tetherLbClaim(hash: string, zset: string, channel: string, now: string, vip: string, ...pairs: string[]): Promise<Array<string | null>>;
  tetherLbExpire(hash: string, zset: string, cutoff: string, limit: string): Promise<string[]>;
  tetherLbDropTarget(hash: string, zset: string, target: string): Promise<number>;
}

export class MappingStore extends EventEmitter {
  private closed = false;

  private constructor(
    private readonly client: Scripted,
    private readonly sub: Redis,
    private readonly prefix: string,
  ) {
    super();
  }

  /**
   * Connects (without waiting for Redis: a store that is down is reconnected in the background). Events:
   * 'mapping' (a StoredMapping another LB pod recorded), 'ready' (connected again: callers write back what
   * they hold and reload), 'garbled' (a notice that is not a mapping; logged and ignored).
   */
  static async connect(url: string, opts: { keyPrefix?: string; timeoutMs?: number } = {}): Promise<MappingStore> {
    const target = parseRedisUrl(url);
    const prefix = opts.keyPrefix ?? 'tether:';
    // One server, Sentinel or a Cluster alike (createRedisClient); a Cluster client answers every command used here.
    const common = { connectTimeoutMs: opts.timeoutMs ?? 1000, commandTimeoutMs: opts.timeoutMs ?? 2000 };
    const client = createRedisClient(target, { ...common, enableOfflineQueue: false, connectionName: 'tether-lb' }) as unknown as Scripted;
    const sub = createRedisClient(target, { ...common, enableOfflineQueue: true, connectionName: 'tether-lb-sub' }) as unknown as Redis;
    for (const c of [client, sub]) c.on('error', (e: Error) => log().debug('lb mapping store connection error', { error: e.message }));
    client.defineCommand('tetherLbClaim', { numberOfKeys: 3, lua: CLAIM });
    client.defineCommand('tetherLbExpire', { numberOfKeys: 2, lua: EXPIRE });
    client.defineCommand('tetherLbDropTarget', { numberOfKeys: 2, lua: DROP_TARGET });
    const store = new MappingStore(client, sub, prefix);
    reconnectAfterEnd(client, () => store.closed, 'lb mappings');
    reconnectAfterEnd(sub, () => store.closed, 'lb mapping notices');
    sub.on('message', (_ch: string, msg: string) => store.onNotice(msg));
    let subscribed = false;
    sub.on('ready', () => {
      if (subscribed) return;
      subscribed = true;
      sub.subscribe(store.channel()).catch((e: Error) => {
        subscribed = false;
        log().warn('lb mapping store: subscribe failed; retried on the next connection', { error: e.message });
      });
    });
    client.on('ready', () => store.emit('ready'));
    try {
      await client.connect();
    } catch (e) {
      log().warn('lb mapping store unreachable at start; forwarding goes on from local maps', { store: target.where, error: (e as Error).message });
    }
    sub.connect().catch(() => undefined);
    return store;
  }

  get connected(): boolean {
    return this.client.status === 'ready';
  }

  private channel(): string {
    return `${this.prefix}lb:mappings`;
  }

  private keys(vip: string): [string, string] {
    return [`${this.prefix}lb:{${vip}}:map`, `${this.prefix}lb:{${vip}}:used`];
  }

  private onNotice(msg: string): void {
    let n: { vip?: unknown; field?: unknown; target?: unknown };
    try {
      n = JSON.parse(msg) as typeof n;
    } catch {
      n = {};
    }
    const key = typeof n.vip === 'string' && typeof n.field === 'string' && isIPv4(n.vip) ? keyOf(n.vip, n.field) : undefined;
    if (!key || typeof n.target !== 'string' || !isIPv4(n.target)) {
      log().warn('lb mapping store: garbled mapping notice ignored', { notice: msg.slice(0, 200) });
      this.emit('garbled', msg);
      return;
    }
    this.emit('mapping', { key, target: n.target } satisfies StoredMapping);
  }

  /**
   * Records mappings of one VIP unless the store has them already (first writer wins). Returns the
   * mappings in force, which differ from the ones given where another LB pod was first.
   */
  async claim(vip: string, list: StoredMapping[], nowMs = Date.now()): Promise<StoredMapping[]> {
    const out: StoredMapping[] = [];
    const [hash, zset] = this.keys(vip);
    for (let i = 0; i < list.length; i += 500) {
      const part = list.slice(i, i + 500);
      const pairs = part.flatMap((m) => [fieldOf(m.key), m.target]);
      const got = await this.client.tetherLbClaim(hash, zset, this.channel(), String(nowMs), vip, ...pairs);
      part.forEach((m, j) => {
        const t = got[j];
        // A stored target that is not an address is not followed: this pod keeps its own pick.
        if (t !== null && t !== undefined && !isIPv4(t)) refuseRecord('lb mapping store', hash, fieldOf(m.key), 'target is not an IPv4 address', t);
        out.push({ key: m.key, target: t && isIPv4(t) ? t : m.target });
      });
    }
    return out;
  }

  /** Marks mappings as used at nowMs (only ever later: GT). */
  async touch(vip: string, keys: MapKey[], nowMs = Date.now()): Promise<void> {
    const [, zset] = this.keys(vip);
    for (let i = 0; i < keys.length; i += 1000) {
      const args: Array<string | number> = [];
      for (const k of keys.slice(i, i + 1000)) args.push(nowMs, fieldOf(k));
      await this.client.zadd(zset, 'GT', ...(args as [number, string]));
    }
  }

  /**
   * Every mapping of vip. Fields that are not mappings, or whose target is not an address, are skipped
   * (one warn line each, counted in `garbled`); the rest is returned.
   */
  async load(vip: string): Promise<{ mappings: StoredMapping[]; garbled: number }> {
    const [hash] = this.keys(vip);
    const all = await this.client.hgetall(hash);
    const mappings: StoredMapping[] = [];
    let garbled = 0;
    for (const [f, t] of Object.entries(all)) {
      const key = keyOf(vip, f);
      if (key && isIPv4(t)) {
        mappings.push({ key, target: t });
        continue;
      }
      garbled++;
      refuseRecord('lb mapping store', hash, f, key ? 'target is not an IPv4 address' : 'not a mapping field (c:<client> or f:<client>:<proto>:<vport>:<cport>)', t);
    }
    return { mappings, garbled };
  }

  /**
   * Removes all of vip's mappings unused for idleS, however many; returns the keys removed. Each script
   * call removes at most `batch`, so Redis is never blocked for long by one VIP with a huge idle crowd.
   */
  async expire(vip: string, idleS: number, nowMs = Date.now(), batch = 5000): Promise<MapKey[]> {
    const [hash, zset] = this.keys(vip);
    const cutoff = String(nowMs - idleS * 1000);
    const out: MapKey[] = [];
    for (;;) {
      const gone = await this.client.tetherLbExpire(hash, zset, cutoff, String(batch));
      for (const f of gone) {
        const k = keyOf(vip, f);
        if (k) out.push(k);
      }
      // The cutoff is fixed, so the idle set only shrinks: a short batch was the last one.
      if (gone.length < batch) return out;
    }
  }

  /** Removes every mapping of vip to target (the target is gone); returns how many. */
  async dropTarget(vip: string, target: string): Promise<number> {
    const [hash, zset] = this.keys(vip);
    return this.client.tetherLbDropTarget(hash, zset, target);
  }

  /** Removes all of vip's mappings (the Service is gone). */
  async dropVip(vip: string): Promise<void> {
    await this.client.del(...this.keys(vip));
  }

  /** Publishes this node's address: targets accept FoU only from registered nodes. */
  async registerNode(node: string, address: string, ttlMs: number): Promise<void> {
    await registerNode(this.client, this.prefix, node, address, ttlMs);
  }

  async listNodes(): Promise<string[]> {
    return listNodes(this.client, this.prefix);
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
