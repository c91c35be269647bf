// The Redis connection every subsystem shares: the store URL (redis://, rediss:// (TLS), unix://,
// redis+sentinel://, redis+cluster://) parsed into a target, ONE factory (createRedisClient) that turns a target into an
// ioredis client (a Redis for one server or through Sentinel, a Cluster for Redis Cluster) with the same
// reconnect and timeout settings, and the helpers every store uses the same way whatever the client is:
// waitReady, watchConnection, reconnectAfterEnd, and storeFailure (a call's error as TRY_AGAIN_LATER when
// the store is away, moving or full, INTERNAL when Redis refused the request itself).
import Redis, { Cluster, ReplyError } from 'ioredis';
import * as fs from 'node:fs';
import { ErrorCode, TetherError } from '../../lib/errors';
import { log } from '../../lib/log';
import { storeFullFailure, type StoreSubsystem } from './store-full';
import { hostPort } from '../../lib/ip';

/** One server, a Sentinel-watched primary, or a Redis Cluster: every store takes either. */
export type RedisClient = Redis | Cluster;

export function unreachable(where: string, e: unknown): TetherError {
  const msg = e instanceof Error ? e.message : String(e);
  const auth = authProblems.get(where);
  // A refused password shows as a closed connection to the caller: say what the store answered instead.
  if (auth) return new TetherError(ErrorCode.TryAgainLater, `cluster store (${where}) refused authentication: ${auth} (tether's password comes from the store URL or --redis-password-secret)`, { cause: e });
  const tls = tlsProblems.get(where);
  // A certificate refused shows as a closed connection too: say why.
  if (tls) return new TetherError(ErrorCode.TryAgainLater, `cluster store (${where}) unreachable: its TLS certificate was refused: ${tls} (checked against the CA file of the store URL's ca=, and the URL's host)`, { cause: e });
  return new TetherError(ErrorCode.TryAgainLater, `cluster store (${where}) unreachable: ${msg}`, { cause: e });
}

/** The store's last answer refusing authentication, per store (cleared once a connection is ready). */
const authProblems = new Map<string, string>();
const AUTH_REFUSED = /WRONGPASS|NOAUTH|invalid password|invalid username-password/i;
/** The last TLS refusal of the server's certificate, per store (cleared once a connection is ready). */
const tlsProblems = new Map<string, string>();
const TLS_REFUSED = /CERT|SELF_SIGNED|UNABLE_TO_(GET|VERIFY)|ALTNAME|ERR_TLS|ERR_SSL/;

/** Logs losing and regaining Redis once per transition; ioredis's per-attempt errors only at debug. */
export function watchConnection(client: RedisClient, where: string): void {
  let lost = false;
  client.on('error', (e: Error) => {
    if (AUTH_REFUSED.test(e.message)) {
      // Not an outage that heals by itself: one error line per change of answer, and every call says it.
      if (authProblems.get(where) !== e.message) log().error('cluster store refused the password; retrying', { store: where, error: e.message });
      authProblems.set(where, e.message);
      return;
    }
    const code = (e as NodeJS.ErrnoException).code;
    if (code && TLS_REFUSED.test(code)) {
      if (tlsProblems.get(where) !== e.message) log().error('cluster store\'s TLS certificate refused; retrying', { store: where, error: e.message, code });
      tlsProblems.set(where, `${e.message} (${code})`);
      return;
    }
    log().debug('cluster store connection error', { store: where, error: e.message });
  });
  client.on('close', () => {
    if (!lost && client.options.enableOfflineQueue === false) log().warn('cluster store connection lost', { store: where });
    lost = true;
  });
  client.on('ready', () => {
    if (authProblems.delete(where)) log().info('cluster store accepted the password', { store: where });
    tlsProblems.delete(where);
    if (lost) log().info('cluster store reconnected', { store: where });
    lost = false;
  });
}

/**
 * Reconnects a client that ioredis gave up on. ioredis ends a client for good (status "end", no more
 * reconnects, every call "Connection is closed.") when a connect attempt fails inside its connector rather
 * than on the socket; through Sentinel that happens when a +switch-master reaches the previous
 * connection's failover detector while the next attempt is still asking a sentinel for the master (the
 * detector cancels the attempt): seen as a tetherd whose store calls all failed after a failover, for
 * good. tetherd's clients must outlive any store outage, so an end that `closed()` did not ask for is
 * followed, after `delayMs`, by a new connect (and by another one if that ends too).
 */
export function reconnectAfterEnd(client: RedisClient, closed: () => boolean, what: string, delayMs = 200): void {
  client.on('end', () => {
    if (closed()) return;
    log().warn('cluster store client ended by its driver; connecting again', { client: what });
    const timer = setTimeout(() => {
      if (!closed() && client.status === 'end') client.connect().catch(() => undefined);
    }, delayMs);
    timer.unref();
  });
}

/** Resolves once the connection is ready; fails after `ms` (a reconnect that does not come in time). */
export function waitReady(client: RedisClient, ms: number): Promise<void> {
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

export function withDeadline<T>(p: Promise<T>, ms: number): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`no answer within ${ms} ms`)), ms);
  });
  return Promise.race([p, timeout]).finally(() => clearTimeout(timer));
}

export interface RedisTarget {
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
    /**
     * TLS (rediss://): the server's certificate is checked against these CA certificates (the system's when
     * none is given) and against the host name or address of the URL.
     */
    tls?: { ca?: Buffer };
  };
  /** A Redis Cluster: the nodes to learn the slot map from (any reachable one is enough). */
  cluster?: Array<{ host: string; port: number }>;
  /** For messages: "redis at host:port/db" or "redis at unix:/path"; never the password. */
  where: string;
}

const SENTINEL_SCHEME = 'redis+sentinel://';
const SENTINEL_PORT = 26379;
const CLUSTER_SCHEME = 'redis+cluster://';
const REDIS_PORT = 6379;

/** A URL of the form scheme://[userinfo@]host[:port][,host[:port]…][/path][?query], split up. */
function splitMultiHostUrl(url: string, scheme: string, what: string, defaultPort: number, bad: (why: string) => TetherError) {
  const rest = url.slice(scheme.length);
  const q = rest.indexOf('?');
  const query = new URLSearchParams(q >= 0 ? rest.slice(q + 1) : '');
  const beforeQuery = q >= 0 ? rest.slice(0, q) : rest;
  const slash = beforeQuery.indexOf('/');
  const authority = slash >= 0 ? beforeQuery.slice(0, slash) : beforeQuery;
  const pathParts = slash >= 0 ? beforeQuery.slice(slash + 1).split('/') : [];
  const at = authority.lastIndexOf('@');
  const userinfo = at >= 0 ? authority.slice(0, at) : '';
  const hostList = at >= 0 ? authority.slice(at + 1) : authority;
  if (!hostList) throw bad(`no ${what} address`);
  const hosts = hostList.split(',').map((h) => {
    const m = /^(?:\[([0-9a-fA-F:.]+)\]|([^:\[\]]+))(?::(\d{1,5}))?$/.exec(h);
    if (!m) throw bad(`${what} address ${JSON.stringify(h)} is not host[:port]`);
    const port = m[3] ? Number(m[3]) : defaultPort;
    if (port < 1 || port > 65535) throw bad(`${what} port ${port} is not 1..65535`);
    return { host: m[1] ?? m[2], port };
  });
  const colon = userinfo.indexOf(':');
  const username = colon >= 0 ? userinfo.slice(0, colon) : userinfo;
  const password = colon >= 0 ? userinfo.slice(colon + 1) : '';
  return {
    hosts,
    pathParts,
    query,
    /** The parts as written, to put a URL back together: the host list and the path (with its slash). */
    raw: { userinfo, hostList, path: slash >= 0 ? beforeQuery.slice(slash) : '' },
    username: username ? decodeURIComponent(username) : undefined,
    password: password ? decodeURIComponent(password) : undefined,
  };
}

/**
 * `redis+sentinel://[[user]:password@]host[:port][,host[:port]…]/master[/db][?sentinelPassword=…]`: the
 * sentinels to ask (port 26379 by default; IPv6 in brackets), the name of the master they watch, and the
 * password of the Redis servers (the sentinels' own, when they have one, in the query).
 */
function parseSentinelUrl(url: string): RedisTarget {
  const bad = (why: string) => new TetherError(ErrorCode.InvalidConfig, `store url: ${why} (redis+sentinel://[:password@]host[:port][,host[:port]…]/master[/db])`);
  const { hosts: sentinels, pathParts, query, username, password } = splitMultiHostUrl(url, SENTINEL_SCHEME, 'sentinel', SENTINEL_PORT, bad);
  const name = decodeURIComponent(pathParts[0] ?? '');
  if (!name) throw bad('no master name');
  if (pathParts.length > 2) throw bad('too many path parts');
  const dbText = pathParts[1] ?? query.get('db') ?? '';
  if (dbText !== '' && !/^\d{1,5}$/.test(dbText)) throw bad(`db must be a number, got ${JSON.stringify(dbText)}`);
  const sentinelPassword = query.get('sentinelPassword') ?? undefined;
  const db = dbText === '' ? undefined : Number(dbText);
  return {
    options: { sentinels, name, username, password, sentinelPassword, db, failoverDetector: true },
    where: `redis master ${name}${db === undefined ? '' : `/${db}`} via sentinels ${sentinels.map((x) => hostPort(x.host, x.port)).join(',')}`,
  };
}

/**
 * `redis+cluster://[[user]:password@]host[:port][,host[:port]…][/][?password=…]`: nodes of a Redis Cluster
 * (port 6379 by default; IPv6 in brackets), any of which tells the slot map. A Cluster has no databases:
 * a db in the path is refused.
 */
function parseClusterUrl(url: string): RedisTarget {
  const bad = (why: string) => new TetherError(ErrorCode.InvalidConfig, `store url: ${why} (redis+cluster://[[user]:password@]host[:port][,host[:port]…])`);
  const { hosts, pathParts, query, username, password } = splitMultiHostUrl(url, CLUSTER_SCHEME, 'node', REDIS_PORT, bad);
  if (pathParts.some((p) => p !== '')) throw bad(`a Redis Cluster has no databases; got path /${pathParts.join('/')}`);
  for (const k of query.keys()) if (k !== 'password') throw bad(`unknown parameter ${JSON.stringify(k)}`);
  return {
    options: { username, password: password ?? query.get('password') ?? undefined },
    cluster: hosts,
    where: `redis cluster via ${hosts.map((x) => hostPort(x.host, x.port)).join(',')}`,
  };
}

export function parseRedisUrl(url: string): RedisTarget {
  if (typeof url === 'string' && url.startsWith(SENTINEL_SCHEME)) return parseSentinelUrl(url);
  if (typeof url === 'string' && url.startsWith(CLUSTER_SCHEME)) return parseClusterUrl(url);
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
  if (u.protocol === 'redis:' || u.protocol === 'rediss:') {
    const tls = u.protocol === 'rediss:';
    if (!u.hostname) throw new TetherError(ErrorCode.InvalidConfig, `store url: ${u.protocol}// needs a host`);
    if (tls) for (const k of u.searchParams.keys()) if (k !== 'ca') throw new TetherError(ErrorCode.InvalidConfig, `store url: unknown parameter ${JSON.stringify(k)} (rediss:// takes ca=<CA certificate file>)`);
    const host = u.hostname.replace(/^\[(.*)\]$/, '$1');
    const port = u.port ? Number(u.port) : 6379;
    const d = db(u.pathname.replace(/^\//, ''));
    const options = {
      host,
      port,
      username: u.username ? decodeURIComponent(u.username) : undefined,
      password: u.password ? decodeURIComponent(u.password) : undefined,
      db: d,
      ...(tls ? { tls: { ca: readCa(u.searchParams.get('ca')) } } : {}),
    };
    return { options, where: `redis at ${u.hostname}:${port}${d === undefined ? '' : `/${d}`}${tls ? ' (TLS)' : ''}` };
  }
  if (/^rediss\+(sentinel|cluster):$/.test(u.protocol)) {
    throw new TetherError(ErrorCode.InvalidConfig, `store url: ${u.protocol}// is not supported: TLS to the store is supported to one server (rediss://host[:port][/db][?ca=file]), not through Sentinel or to a Redis Cluster`);
  }
  throw new TetherError(ErrorCode.InvalidConfig, `store url: unsupported scheme ${u.protocol} (use redis://, rediss://, unix://, redis+sentinel:// or redis+cluster://)`);
}

/** The CA certificates of rediss://…?ca=<file> (PEM), read now, so a wrong path fails at start naming it. */
function readCa(file: string | null): Buffer | undefined {
  if (file === null) return undefined;
  if (!file.startsWith('/')) throw new TetherError(ErrorCode.InvalidConfig, `store url: ca must be an absolute file path, got ${JSON.stringify(file)}`);
  let pem: Buffer;
  try {
    pem = fs.readFileSync(file);
  } catch (e) {
    throw new TetherError(ErrorCode.InvalidConfig, `store url: CA certificate file ${file} cannot be read: ${(e as NodeJS.ErrnoException).code ?? (e as Error).message}`, { cause: e });
  }
  if (!pem.includes('-----BEGIN CERTIFICATE-----')) throw new TetherError(ErrorCode.InvalidConfig, `store url: CA certificate file ${file} holds no PEM certificate`);
  return pem;
}

/**
 * The store URL with `password` as the servers' password where the URL gives none (a password in the URL
 * wins); through Sentinel also as the sentinels' own (they run with the same one in tether's manifests)
 * unless the URL says sentinelPassword. The URL is checked first (parseRedisUrl's errors).
 */
export function withRedisPassword(url: string, password: string): string {
  const target = parseRedisUrl(url);
  if (target.options.password) return url;
  const enc = encodeURIComponent(password);
  for (const scheme of [SENTINEL_SCHEME, CLUSTER_SCHEME]) {
    if (!url.startsWith(scheme)) continue;
    const { query, raw } = splitMultiHostUrl(url, scheme, 'host', REDIS_PORT, (why) => new TetherError(ErrorCode.InvalidConfig, why));
    // A user name without a password keeps its name: user@ becomes user:password@.
    const user = raw.userinfo.split(':')[0];
    if (scheme === CLUSTER_SCHEME) query.delete('password');
    if (scheme === SENTINEL_SCHEME && !query.has('sentinelPassword')) query.set('sentinelPassword', password);
    const qs = query.toString();
    return `${scheme}${user}:${enc}@${raw.hostList}${raw.path}${qs ? `?${qs}` : ''}`;
  }
  const u = new URL(url);
  if (u.protocol === 'unix:') u.searchParams.set('password', password);
  else u.password = enc;
  return u.toString();
}

/** How a store's client is set up; the same for one server, Sentinel and Cluster. */
export interface ClientSettings {
  /** CLIENT SETNAME on every connection (every node's, in a Cluster). */
  connectionName: string;
  /** How long a connect (or a Cluster's slot-map refresh) may take. */
  connectTimeoutMs: number;
  /** How long a command may wait for its answer. */
  commandTimeoutMs: number;
  /** Queue calls made while disconnected (ioredis's default) or fail them at once (false). */
  enableOfflineQueue?: boolean;
  /** Resend, after a reconnect, commands whose answer a disconnect lost (ioredis's default) or not (false). */
  autoResendUnfulfilledCommands?: boolean;
  /** A Cluster client that subscribes to sharded channels (SSUBSCRIBE on each channel's shard). */
  shardedSubscribers?: boolean;
}

/** Reconnect quickly: a restarted Redis (or a promoted replica) should be used again at once. */
const reconnectDelay = (attempt: number) => Math.min(50 * attempt, 500);

/**
 * The one way a store gets a client: not connected yet (lazyConnect; the caller connects and decides what
 * a failed first connect means). A call that finds the store away fails (maxRetriesPerRequest 0) rather
 * than being retried behind the caller's back; reconnecting goes on in the background. In a Cluster the
 * same holds per node: a node lost, a CLUSTERDOWN while a replica takes over or a TRYAGAIN while a slot
 * moves fails the call (retryDelayOn… 0), a MOVED or ASK (the command did not run) is followed by the
 * client; the Cluster client reconnects to the whole cluster when every node was lost.
 */
export function createRedisClient(target: RedisTarget, s: ClientSettings): RedisClient {
  const perConnection = {
    connectionName: s.connectionName,
    connectTimeout: s.connectTimeoutMs,
    commandTimeout: s.commandTimeoutMs,
    maxRetriesPerRequest: 0,
    ...(s.autoResendUnfulfilledCommands === undefined ? {} : { autoResendUnfulfilledCommands: s.autoResendUnfulfilledCommands }),
  };
  const offline = s.enableOfflineQueue === undefined ? {} : { enableOfflineQueue: s.enableOfflineQueue };
  if (target.cluster) {
    return new Cluster(target.cluster, {
      lazyConnect: true,
      ...offline,
      clusterRetryStrategy: reconnectDelay,
      retryDelayOnFailover: 0,
      retryDelayOnClusterDown: 0,
      retryDelayOnTryAgain: 0,
      slotsRefreshTimeout: s.connectTimeoutMs,
      ...(s.shardedSubscribers ? { shardedSubscribers: true } : {}),
      redisOptions: { ...perConnection, username: target.options.username, password: target.options.password },
    });
  }
  return new Redis({ ...target.options, lazyConnect: true, ...offline, ...perConnection, retryStrategy: reconnectDelay });
}

// Replies that mean "Redis is there but cannot serve this right now" rather than a bug in the request:
// loading, a script running, no primary or replicas, a slot moving or without a primary (Cluster failover).
const TRANSIENT_REPLY = /^(LOADING|BUSY|MASTERDOWN|TRYAGAIN|READONLY|CLUSTERDOWN|NOREPLICAS|MOVED|ASK)\b/;

/**
 * A failed store call as the callers' error: TRY_AGAIN_LATER when the store is away, busy or moving
 * (reconnect, failover, slot migration) or full (its maxmemory reached: StoreFullError, recorded for
 * `subsystem`), INTERNAL when Redis refused the request itself (a script error, auth, a request spanning
 * hash slots: a bug, not an outage).
 */
export function storeFailure(where: string, what: string, e: unknown, subsystem: StoreSubsystem = 'ipam'): TetherError {
  const full = storeFullFailure(subsystem, where, what, e);
  if (full) return full;
  if (e instanceof TetherError) return e;
  const msg = e instanceof Error ? e.message : String(e);
  const crossSlot = /CROSSSLOT|should belong to the same slot/.test(msg);
  if (crossSlot || (e instanceof ReplyError && !TRANSIENT_REPLY.test(msg))) {
    return new TetherError(ErrorCode.Internal, `cluster store (${where}) refused ${what}: ${msg}`, { cause: e });
  }
  return unreachable(where, e);
}
