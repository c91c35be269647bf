// Who owns each floating address, with a fencing epoch, in the cluster store (Redis): a compare-and-set
// Lua script makes every ownership change atomic and gives it a larger epoch; a pub/sub channel tells
// every tetherd (clients' and candidates') at once. A gateway registry lets tetherds find candidates on
// other nodes. The Kubernetes store (Lease objects) can slot in behind the same interface later.
import Redis from 'ioredis';
import { EventEmitter } from 'node:events';
import { ErrorCode, TetherError } from '../errors';
import { log } from '../log';
import { parseRedisUrl } from '../../ipam/store/redis-store';

/** A gateway pod that can hold an Egress's floating addresses. */
export interface GatewayInfo {
  /** "namespace/name" of the pod. */
  pod: string;
  node: string;
  /** The node's address: BFD and conntrack sync between tetherds use it. */
  nodeAddress: string;
  podIp: string;
  zone?: string;
}

export interface Ownership {
  egress: string;
  address: string;
  /** Gateway pod ("namespace/name") holding the address; "" when nobody does. */
  owner: string;
  /** Grows by one on every change; 0 = never owned. */
  epoch: number;
  /** Why the last change happened (failover, handover, initial…). */
  cause?: string;
}

const CLAIM = `
local cur = redis.call('HGET', KEYS[1], 'epoch')
local epoch = tonumber(cur or '0')
if epoch ~= tonumber(ARGV[2]) then
  return {'stale', redis.call('HGET', KEYS[1], 'owner') or '', epoch}
end
epoch = epoch + 1
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'epoch', epoch, 'cause', ARGV[3], 'at', ARGV[4])
redis.call('PUBLISH', KEYS[2], cjson.encode({egress=ARGV[5], address=ARGV[6], owner=ARGV[1], epoch=epoch, cause=ARGV[3]}))
return {'ok', ARGV[1], epoch}
`;

interface Scripted extends Redis {
  tetherClaimOwner(key: string, channel: string, owner: string, expect: number, cause: string, at: string, egress: string, address: string): Promise<[string, string, number]>;
}

export class OwnershipStore extends EventEmitter {
  private constructor(
    private readonly client: Scripted,
    private readonly sub: Redis,
    private readonly prefix: string,
  ) {
    super();
  }

  static async connect(url: string, opts: { keyPrefix?: string; timeoutMs?: number } = {}): Promise<OwnershipStore> {
    const target = parseRedisUrl(url);
    const prefix = opts.keyPrefix ?? 'tether:';
    const common = { ...target.options, lazyConnect: true, connectTimeout: opts.timeoutMs ?? 1000, commandTimeout: opts.timeoutMs ?? 1000, maxRetriesPerRequest: 0, retryStrategy: (n: number) => Math.min(50 * n, 500) };
    const client = new Redis({ ...common, connectionName: 'tether-ownership' }) as Scripted;
    const sub = new Redis({ ...common, connectionName: 'tether-ownership-sub' });
    for (const c of [client, sub]) c.on('error', (e: Error) => log().debug('ownership store connection error', { error: e.message }));
    client.defineCommand('tetherClaimOwner', { numberOfKeys: 2, lua: CLAIM });
    try {
      await Promise.all([client.connect(), sub.connect()]);
    } catch (e) {
      client.disconnect();
      sub.disconnect();
      throw new TetherError(ErrorCode.TryAgainLater, `ownership store (${target.where}) unreachable: ${(e as Error).message}`, { cause: e });
    }
    const store = new OwnershipStore(client, sub, prefix);
    await sub.subscribe(store.channel());
    sub.on('message', (_ch: string, msg: string) => {
      try {
        store.emit('change', JSON.parse(msg) as Ownership);
      } catch {
        log().warn('ownership store: unreadable change notice ignored', { msg: msg.slice(0, 200) });
      }
    });
    // After a reconnect the subscription is restored by ioredis; tell listeners to re-read what they missed.
    sub.on('ready', () => store.emit('resync'));
    return store;
  }

  private channel(): string {
    return `${this.prefix}egress-ownership`;
  }

  private key(egress: string, address: string): string {
    return `${this.prefix}egress:${egress}:owner:${address}`;
  }

  /**
   * Makes `owner` the holder of `address` if the current epoch is still `expectEpoch` (compare-and-set);
   * returns the ownership after the call. A stale caller learns who won instead.
   */
  async claim(egress: string, address: string, owner: string, expectEpoch: number, cause: string): Promise<Ownership & { won: boolean }> {
    const [state, holder, epoch] = await this.client.tetherClaimOwner(
      this.key(egress, address),
      this.channel(),
      owner,
      expectEpoch,
      cause,
      new Date().toISOString(),
      egress,
      address,
    );
    return { egress, address, owner: holder, epoch: Number(epoch), cause, won: state === 'ok' };
  }

  async get(egress: string, address: string): Promise<Ownership> {
    const h = await this.client.hgetall(this.key(egress, address));
    return { egress, address, owner: h.owner ?? '', epoch: Number(h.epoch ?? 0), cause: h.cause };
  }

  /**
   * Publishes this node's gateway pods for an Egress. Each node writes one field of one hash, with its
   * own expiry time, so a node that died drops out of the list without anyone deleting it.
   */
  async registerGateways(egress: string, node: string, gateways: GatewayInfo[], ttlMs: number): Promise<void> {
    await this.client.hset(`${this.prefix}egress:${egress}:gateways`, node, JSON.stringify({ gateways, expiresAt: Date.now() + ttlMs }));
  }

  /** Live registrations only (clocks of the nodes are assumed roughly in sync, as NTP keeps them). */
  async listGateways(egress: string): Promise<GatewayInfo[]> {
    const all = await this.client.hgetall(`${this.prefix}egress:${egress}:gateways`);
    const now = Date.now();
    return Object.values(all).flatMap((v) => {
      try {
        const r = JSON.parse(v) as { gateways: GatewayInfo[]; expiresAt: number };
        return r.expiresAt > now ? r.gateways : [];
      } catch {
        return [];
      }
    });
  }

  /** Publishes this node's address (gateways accept FoU only from registered nodes). */
  async registerNode(node: string, address: string, ttlMs: number): Promise<void> {
    await this.client.hset(`${this.prefix}nodes`, node, JSON.stringify({ address, expiresAt: Date.now() + ttlMs }));
  }

  async listNodes(): Promise<string[]> {
    const now = Date.now();
    return Object.values(await this.client.hgetall(`${this.prefix}nodes`)).flatMap((v) => {
      try {
        const r = JSON.parse(v) as { address: string; expiresAt: number };
        return r.expiresAt > now ? [r.address] : [];
      } catch {
        return [];
      }
    });
  }

  async close(): Promise<void> {
    this.client.disconnect();
    this.sub.disconnect();
  }
}
