// One connection set to the cluster store (one server, through Sentinel, or a Cluster), shared by the stores
// of one subsystem, each owning its own keys: a commands connection without an offline queue (nothing waits
// for Redis: callers queue and retry) and a subscriber. Both are reconnected in the background, also after
// ioredis ended one for good; 'ready' says the commands connection is up (again).
import type Redis from 'ioredis';
import { EventEmitter } from 'node:events';
import { log } from '../../lib/log';
import { createRedisClient, parseRedisUrl, reconnectAfterEnd } from './redis';

/** How a connection set is named on the server and in log lines. */
export interface ConnectionNames {
  /** CLIENT SETNAME of the commands connection and of the subscriber. */
  client: string;
  sub: string;
  /** The store in log lines: "<store> connection error", "<store> unreachable at start; <atStart>". */
  store: string;
  /** What goes on while the store is unreachable at start. */
  atStart: string;
  /** Each connection in the line logged when ioredis ended it and it is connected again. */
  clientRole: string;
  subRole: string;
}

export class StoreConnection extends EventEmitter {
  private isClosed = false;

  /**
   * Over connections made elsewhere (connect(), or a factory: ioredis's Cluster client with
   * shardedSubscribers for a Redis Cluster). A Cluster client answers every command the stores use, so
   * both are typed as one server's.
   */
  constructor(
    readonly client: Redis,
    readonly sub: Redis,
    /** Every key and channel name starts with it. */
    readonly prefix = 'tether:',
  ) {
    super();
    client.on('ready', () => this.emit('ready'));
  }

  /** Connects (without waiting for Redis: a store that is down is reconnected in the background). */
  static async connect(url: string, names: ConnectionNames, opts: { keyPrefix?: string; timeoutMs?: number } = {}): Promise<StoreConnection> {
    const target = parseRedisUrl(url);
    const common = { connectTimeoutMs: opts.timeoutMs ?? 1000, commandTimeoutMs: opts.timeoutMs ?? 2000 };
    const client = createRedisClient(target, { ...common, enableOfflineQueue: false, connectionName: names.client });
    const sub = createRedisClient(target, { ...common, enableOfflineQueue: true, connectionName: names.sub, shardedSubscribers: true });
    for (const c of [client, sub]) c.on('error', (e: Error) => log().debug(`${names.store} connection error`, { error: e.message }));
    const conn = new StoreConnection(client as unknown as Redis, sub as unknown as Redis, opts.keyPrefix ?? 'tether:');
    reconnectAfterEnd(client, () => conn.closed, names.clientRole);
    reconnectAfterEnd(sub, () => conn.closed, names.subRole);
    try {
      await client.connect();
    } catch (e) {
      log().warn(`${names.store} unreachable at start; ${names.atStart}`, { store: target.where, error: (e as Error).message });
    }
    sub.connect().catch(() => undefined);
    return conn;
  }

  get closed(): boolean {
    return this.isClosed;
  }

  get connected(): boolean {
    return this.client.status === 'ready';
  }

  /** A Redis Cluster: pub/sub goes sharded (to the channel's shard only); elsewhere plain. */
  get sharded(): boolean {
    return (this.client as { isCluster?: boolean }).isCluster === true;
  }

  async close(): Promise<void> {
    this.isClosed = true;
    this.client.disconnect();
    this.sub.disconnect();
  }
}
