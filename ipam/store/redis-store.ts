// ClusterStore over Redis (standalone mode): block claims and cluster-wide addresses, each change one
// atomic Lua script. An unreachable Redis is a TRY_AGAIN_LATER answer within the command timeout, never a hang.
//
// Keys (prefix defaults to "tether:"):
//   <prefix>pool:<pool>:blocks         hash  block CIDR → node
//   <prefix>pool:<pool>:addrs          hash  address → owner
//   <prefix>pool:<pool>:owner:<owner>  list  the owner's addresses in allocation order
import { randomBytes } from 'node:crypto';
import Redis, { ReplyError } from 'ioredis';
import { ErrorCode, TetherError } from '../../daemon/errors';
import { log } from '../../daemon/log';
import { formatCidr, formatIp, parseCidr, parseIp } from '../ip-math';
import type { AddressOutcome, AddressRequest, ClusterStore } from '../types';
import { ALLOCATE, CLAIM_BLOCK, RELEASE_BLOCK, RELEASE_OWNER } from './redis-scripts';

export interface RedisStoreOptions {
  /** Prepended to every key, so several clusters or tests can share one Redis. Default "tether:". */
  keyPrefix?: string;
  /** How long the first connection may take. Default 2000 ms. */
  connectTimeoutMs?: number;
  /** How long any call may take, including waiting for a reconnect in progress. Default 1000 ms. */
  commandTimeoutMs?: number;
}

// The scripts as ioredis custom commands: EVALSHA, with EVAL when Redis lost its script cache (restart).
interface ScriptedRedis extends Redis {
  tetherClaimBlock(blocks: string, block: string, node: string): Promise<[string, string]>;
  tetherReleaseBlock(blocks: string, block: string, node: string): Promise<number>;
  tetherAllocate(addrs: string, ownerKey: string, owner: string, mode: string, count: number, ...addresses: string[]): Promise<unknown[]>;
  tetherReleaseOwner(addrs: string, ownerKey: string, owner: string): Promise<string[]>;
}

const MAX_NAME = 253;
const MAX_OWNER = 512;
const MAX_COUNT = 1024;
const MAX_CANDIDATES = 4096;
// Replies that mean "Redis is there but cannot serve right now" rather than a bug in the request.
const TRANSIENT_REPLY = /^(LOADING|BUSY|MASTERDOWN|TRYAGAIN|READONLY|CLUSTERDOWN)\b/;

export class RedisStore implements ClusterStore {
  private closed = false;

  private constructor(
    private readonly client: ScriptedRedis,
    private readonly prefix: string,
    private readonly where: string,
    private readonly timeoutMs: number,
  ) {}

  /** Connects to `redis://[user:password@]host:port[/db]`, `unix:///path.sock[?password=…&db=…]` or `redis+sentinel://…` (parseRedisUrl). */
  static async connect(url: string, opts: RedisStoreOptions = {}): Promise<RedisStore> {
    const target = parseRedisUrl(url);
    const prefix = opts.keyPrefix ?? 'tether:';
    checkName('keyPrefix', prefix, 128, true);
    const connectTimeoutMs = checkTimeout('connectTimeoutMs', opts.connectTimeoutMs ?? 2000);
    const commandTimeoutMs = checkTimeout('commandTimeoutMs', opts.commandTimeoutMs ?? 1000);

    const client = new Redis({
      ...target.options,
      lazyConnect: true,
      connectionName: 'tether',
      connectTimeout: connectTimeoutMs,
      commandTimeout: commandTimeoutMs,
      // Fail in-flight commands on the first disconnect and never resend them later behind the caller's
      // back: the caller already got TRY_AGAIN_LATER and decides itself whether to repeat.
      maxRetriesPerRequest: 0,
      autoResendUnfulfilledCommands: false,
      // Keep reconnecting in the background (quickly: a restarted Redis should be used again at once).
      retryStrategy: (attempt) => Math.min(50 * attempt, 500),
    }) as ScriptedRedis;
    client.defineCommand('tetherClaimBlock', { numberOfKeys: 1, lua: CLAIM_BLOCK });
    client.defineCommand('tetherReleaseBlock', { numberOfKeys: 1, lua: RELEASE_BLOCK });
    client.defineCommand('tetherAllocate', { numberOfKeys: 2, lua: ALLOCATE });
    client.defineCommand('tetherReleaseOwner', { numberOfKeys: 2, lua: RELEASE_OWNER });
    watchConnection(client, target.where);

    try {
      await withDeadline(client.connect(), connectTimeoutMs);
    } catch (e) {
      client.disconnect();
      throw unreachable(target.where, e);
    }
    // From now on a call made while Redis is away fails instead of waiting in an unbounded queue.
    client.options.enableOfflineQueue = false;
    log().info('cluster store connected', { store: target.where, keyPrefix: prefix });
    return new RedisStore(client, prefix, target.where, commandTimeoutMs);
  }

  async claimBlock(pool: string, block: string, node: string): Promise<boolean> {
    checkPool(pool);
    const b = checkBlock(block);
    checkName('node', node, MAX_NAME);
    const [state, holder] = await this.run('claimBlock', () => this.client.tetherClaimBlock(this.key(pool, 'blocks'), b, node));
    if (state === 'claimed') log().info('block claimed', { pool, block: b, node });
    else if (state === 'taken') log().info('block claim refused', { pool, block: b, node, holder });
    return state !== 'taken';
  }

  async releaseBlock(pool: string, block: string, node: string): Promise<boolean> {
    checkPool(pool);
    const b = checkBlock(block);
    checkName('node', node, MAX_NAME);
    const released = (await this.run('releaseBlock', () => this.client.tetherReleaseBlock(this.key(pool, 'blocks'), b, node))) === 1;
    if (released) log().info('block released', { pool, block: b, node });
    return released;
  }

  async generation(): Promise<string> {
    const key = `${this.prefix}generation`;
    const fresh = randomBytes(8).toString('hex');
    return this.run('generation', async () => {
      await this.client.set(key, fresh, 'NX');
      return (await this.client.get(key)) ?? fresh;
    });
  }

  async listBlocks(pool: string): Promise<Map<string, string>> {
    checkPool(pool);
    return new Map(Object.entries(await this.run('listBlocks', () => this.client.hgetall(this.key(pool, 'blocks')))));
  }

  async allocateAddresses(pool: string, owner: string, req: AddressRequest): Promise<AddressOutcome> {
    checkPool(pool);
    checkName('owner', owner, MAX_OWNER);
    const { mode, count, addresses } = checkRequest(req);
    const reply = await this.run('allocateAddresses', () =>
      this.client.tetherAllocate(this.key(pool, 'addrs'), this.ownerKey(pool, owner), owner, mode, count, ...addresses),
    );
    switch (reply[0]) {
      case 'ok': {
        for (const address of reply[2] as string[]) log().info('address claimed', { pool, address, owner });
        return { ok: true, addresses: reply[1] as string[] };
      }
      case 'conflict': {
        const conflict = { address: reply[1] as string, holder: reply[2] as string };
        log().info('address claim refused', { pool, owner, ...conflict });
        return { ok: false, conflict };
      }
      case 'need':
        return { ok: false, needCandidates: true, have: reply[1] as string[] };
      default:
        throw new TetherError(ErrorCode.Internal, `cluster store (${this.where}): unexpected allocate reply ${JSON.stringify(reply)}`);
    }
  }

  async releaseOwner(pool: string, owner: string): Promise<string[]> {
    checkPool(pool);
    checkName('owner', owner, MAX_OWNER);
    const freed = await this.run('releaseOwner', () => this.client.tetherReleaseOwner(this.key(pool, 'addrs'), this.ownerKey(pool, owner), owner));
    for (const address of freed) log().info('address released', { pool, address, owner });
    return freed;
  }

  async listAddresses(pool: string): Promise<Map<string, string>> {
    checkPool(pool);
    return new Map(Object.entries(await this.run('listAddresses', () => this.client.hgetall(this.key(pool, 'addrs')))));
  }

  /** Drops the connection at once (no QUIT round trip that could wait on a dead Redis). Idempotent. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    // Our own disconnect is not an outage: no "connection lost" line for it.
    this.client.removeAllListeners('close');
    this.client.disconnect();
  }

  private key(pool: string, what: 'blocks' | 'addrs'): string {
    return `${this.prefix}pool:${pool}:${what}`;
  }

  private ownerKey(pool: string, owner: string): string {
    return `${this.prefix}pool:${pool}:owner:${owner}`;
  }

  /** One call under one deadline: waiting for a reconnect in progress counts against the same timeout. */
  private async run<T>(what: string, fn: () => Promise<T>): Promise<T> {
    if (this.closed) throw new TetherError(ErrorCode.Internal, `cluster store (${this.where}) used after close (${what})`);
    const deadline = Date.now() + this.timeoutMs;
    try {
      await waitReady(this.client, this.timeoutMs);
      return await withDeadline(fn(), Math.max(1, deadline - Date.now()));
    } catch (e) {
      // A reply error is Redis answering (a script or auth problem), not Redis being away.
      const reply = e instanceof ReplyError ? (e as Error).message : undefined;
      if (reply !== undefined && !TRANSIENT_REPLY.test(reply)) {
        throw new TetherError(ErrorCode.Internal, `cluster store (${this.where}) refused ${what}: ${reply}`, { cause: e });
      }
      throw unreachable(this.where, e);
    }
  }
}

function unreachable(where: string, e: unknown): TetherError {
  const msg = e instanceof Error ? e.message : String(e);
  return new TetherError(ErrorCode.TryAgainLater, `cluster store (${where}) unreachable: ${msg}`, { cause: e });
}

/** Logs losing and regaining Redis once per transition; ioredis's per-attempt errors only at debug. */
function watchConnection(client: Redis, where: string): void {
  let lost = false;
  client.on('error', (e: Error) => log().debug('cluster store connection error', { store: where, error: e.message }));
  client.on('close', () => {
    if (!lost && client.options.enableOfflineQueue === false) log().warn('cluster store connection lost', { store: where });
    lost = true;
  });
  client.on('ready', () => {
    if (lost) log().info('cluster store reconnected', { store: where });
    lost = false;
  });
}

/** Resolves once the connection is ready; fails after `ms` (a reconnect that does not come in time). */
function waitReady(client: Redis, ms: number): Promise<void> {
  if (client.status === 'ready') return Promise.resolve();
  if (client.status === 'end') return Promise.reject(new Error('connection closed'));
  return new Promise((resolve, reject) => {
    const onReady = () => {
      clearTimeout(timer);
      resolve();
    };
    const timer = setTimeout(() => {
      client.removeListener('ready', onReady);
      reject(new Error(`not connected (${client.status}) within ${ms} ms`));
    }, ms);
    client.once('ready', onReady);
  });
}

function withDeadline<T>(p: Promise<T>, ms: number): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`no answer within ${ms} ms`)), ms);
  });
  return Promise.race([p, timeout]).finally(() => clearTimeout(timer));
}

interface RedisTarget {
  options: {
    path?: string;
    host?: string;
    port?: number;
    username?: string;
    password?: string;
    db?: number;
    /** Through Sentinel: where the sentinels are, the master's name, and the sentinels' own password. */
    sentinels?: Array<{ host: string; port: number }>;
    name?: string;
    sentinelPassword?: string;
    /** Subscribe to the sentinels' +switch-master, so a failover is followed at once, not on the next error. */
    failoverDetector?: boolean;
  };
  /** For messages: "redis at host:port/db" or "redis at unix:/path"; never the password. */
  where: string;
}

const SENTINEL_SCHEME = 'redis+sentinel://';
const SENTINEL_PORT = 26379;

/**
 * `redis+sentinel://[[user]:password@]host[:port][,host[:port]…]/master[/db][?sentinelPassword=…]`: the
 * sentinels to ask (port 26379 by default; IPv6 in brackets), the name of the master they watch, and the
 * password of the Redis servers (the sentinels' own, when they have one, in the query).
 */
function parseSentinelUrl(url: string): RedisTarget {
  const bad = (why: string) => new TetherError(ErrorCode.InvalidConfig, `store url: ${why} (redis+sentinel://[:password@]host[:port][,host[:port]…]/master[/db])`);
  const rest = url.slice(SENTINEL_SCHEME.length);
  const q = rest.indexOf('?');
  const query = new URLSearchParams(q >= 0 ? rest.slice(q + 1) : '');
  const beforeQuery = q >= 0 ? rest.slice(0, q) : rest;
  const slash = beforeQuery.indexOf('/');
  const authority = slash >= 0 ? beforeQuery.slice(0, slash) : beforeQuery;
  const pathParts = slash >= 0 ? beforeQuery.slice(slash + 1).split('/') : [];
  const at = authority.lastIndexOf('@');
  const userinfo = at >= 0 ? authority.slice(0, at) : '';
  const hostList = at >= 0 ? authority.slice(at + 1) : authority;
  if (!hostList) throw bad('no sentinel address');
  const sentinels = hostList.split(',').map((h) => {
    const m = /^(?:\[([0-9a-fA-F:.]+)\]|([^:\[\]]+))(?::(\d{1,5}))?$/.exec(h);
    if (!m) throw bad(`sentinel address ${JSON.stringify(h)} is not host[:port]`);
    const port = m[3] ? Number(m[3]) : SENTINEL_PORT;
    if (port < 1 || port > 65535) throw bad(`sentinel port ${port} is not 1..65535`);
    return { host: m[1] ?? m[2], port };
  });
  const name = decodeURIComponent(pathParts[0] ?? '');
  if (!name) throw bad('no master name');
  if (pathParts.length > 2) throw bad('too many path parts');
  const dbText = pathParts[1] ?? query.get('db') ?? '';
  if (dbText !== '' && !/^\d{1,5}$/.test(dbText)) throw bad(`db must be a number, got ${JSON.stringify(dbText)}`);
  const colon = userinfo.indexOf(':');
  const username = colon >= 0 ? userinfo.slice(0, colon) : userinfo;
  const password = colon >= 0 ? userinfo.slice(colon + 1) : '';
  const sentinelPassword = query.get('sentinelPassword') ?? undefined;
  const db = dbText === '' ? undefined : Number(dbText);
  return {
    options: {
      sentinels,
      name,
      username: username ? decodeURIComponent(username) : undefined,
      password: password ? decodeURIComponent(password) : undefined,
      sentinelPassword,
      db,
      failoverDetector: true,
    },
    where: `redis master ${name}${db === undefined ? '' : `/${db}`} via sentinels ${sentinels.map((x) => (x.host.includes(':') ? `[${x.host}]:${x.port}` : `${x.host}:${x.port}`)).join(',')}`,
  };
}

export function parseRedisUrl(url: string): RedisTarget {
  if (typeof url === 'string' && url.startsWith(SENTINEL_SCHEME)) return parseSentinelUrl(url);
  let u: URL;
  try {
    u = new URL(url);
  } catch {
    throw new TetherError(ErrorCode.InvalidConfig, `store url: not a URL: ${JSON.stringify(String(url).replace(/:[^@/]*@/, ':***@'))}`);
  }
  const db = (s: string | null) => {
    if (s === null || s === '') return undefined;
    if (!/^\d{1,5}$/.test(s)) throw new TetherError(ErrorCode.InvalidConfig, `store url: db must be a number, got ${JSON.stringify(s)}`);
    return Number(s);
  };
  if (u.protocol === 'unix:') {
    const path = decodeURIComponent(u.pathname);
    if (u.host !== '' || !path.startsWith('/') || path === '/') {
      throw new TetherError(ErrorCode.InvalidConfig, 'store url: unix:// needs an absolute socket path, e.g. unix:///run/redis/redis.sock');
    }
    const options = { path, password: u.searchParams.get('password') ?? undefined, db: db(u.searchParams.get('db')) };
    return { options, where: `redis at unix:${path}` };
  }
  if (u.protocol === 'redis:') {
    if (!u.hostname) throw new TetherError(ErrorCode.InvalidConfig, 'store url: redis:// needs a host');
    const host = u.hostname.replace(/^\[(.*)\]$/, '$1');
    const port = u.port ? Number(u.port) : 6379;
    const d = db(u.pathname.replace(/^\//, ''));
    const options = {
      host,
      port,
      username: u.username ? decodeURIComponent(u.username) : undefined,
      password: u.password ? decodeURIComponent(u.password) : undefined,
      db: d,
    };
    return { options, where: `redis at ${u.hostname}:${port}${d === undefined ? '' : `/${d}`}` };
  }
  throw new TetherError(ErrorCode.InvalidConfig, `store url: unsupported scheme ${u.protocol} (use redis://, unix:// or redis+sentinel://)`);
}

function invalid(field: string, why: string): TetherError {
  return new TetherError(ErrorCode.InvalidConfig, `${field}: ${why}`);
}

// Names end up in keys and JSON log lines: no control characters (a newline would forge log lines).
function checkName(field: string, v: unknown, max: number, allowEmpty = false): asserts v is string {
  if (typeof v !== 'string') throw invalid(field, `must be a string, got ${typeof v}`);
  if (!allowEmpty && v === '') throw invalid(field, 'must not be empty');
  if (v.length > max) throw invalid(field, `longer than ${max} characters`);
  if (/[\x00-\x1f\x7f]/.test(v)) throw invalid(field, 'must not contain a newline or other control character');
}

// A pool name with ':' could make one pool's keys collide with another's owner keys.
function checkPool(pool: unknown): asserts pool is string {
  checkName('pool', pool, MAX_NAME);
  if (/[:\s]/.test(pool)) throw invalid('pool', `must not contain ':' or whitespace, got ${JSON.stringify(pool)}`);
}

/** The block in canonical form, so "10.0.0.0/26" written two ways is one key. */
function checkBlock(block: unknown): string {
  checkName('block', block, 64);
  const c = parseCidr(block);
  if (!c) throw invalid('block', `not a CIDR: ${JSON.stringify(block)}`);
  if (!c.isNetwork) throw invalid('block', `has host bits set: ${block}`);
  return formatCidr(c.family, c.base, c.prefix);
}

function checkAddress(field: string, a: unknown): string {
  const ip = typeof a === 'string' ? parseIp(a) : undefined;
  if (!ip) throw invalid(field, `not an IP address: ${JSON.stringify(a)}`);
  return formatIp(ip.family, ip.value);
}

function checkTimeout(field: string, ms: unknown): number {
  if (typeof ms !== 'number' || !Number.isInteger(ms) || ms < 1 || ms > 600_000) throw invalid(field, `must be 1..600000 ms, got ${ms}`);
  return ms;
}

function checkRequest(req: AddressRequest): { mode: 'count' | 'explicit'; count: number; addresses: string[] } {
  if (req && typeof req === 'object' && 'explicit' in req) {
    const list = req.explicit;
    if (!Array.isArray(list) || list.length < 1 || list.length > MAX_COUNT) throw invalid('explicit', `must list 1..${MAX_COUNT} addresses`);
    const addresses = list.map((a, i) => checkAddress(`explicit[${i}]`, a));
    return { mode: 'explicit', count: new Set(addresses).size, addresses };
  }
  if (!req || typeof req !== 'object' || !('count' in req)) throw invalid('request', 'needs either count+candidates or explicit');
  const { count, candidates } = req;
  if (typeof count !== 'number' || !Number.isInteger(count) || count < 1 || count > MAX_COUNT) {
    throw invalid('count', `must be an integer 1..${MAX_COUNT}, got ${count}`);
  }
  if (!Array.isArray(candidates) || candidates.length > MAX_CANDIDATES) throw invalid('candidates', `must be a list of at most ${MAX_CANDIDATES} addresses`);
  return { mode: 'count', count, addresses: candidates.map((a, i) => checkAddress(`candidates[${i}]`, a)) };
}
