// The cluster store's record of who owns each floating address (Redis). Decisions are made by the
// candidates themselves (BFD liveness, a common order, epochs; see candidates.ts) and travel between
// tetherds as ownership notices; the store records them, publishes them to whoever listens, and settles
// decisions made on both sides of a partition when it is reachable again: a Lua script keeps the record
// that supersedes (larger epoch, or the same epoch with the better-scored owner). A gateway and node
// registry lets tetherds find candidates and peers on other nodes. The Kubernetes store can slot in
// behind the same interface later.
import Redis from 'ioredis';
import { EventEmitter } from 'node:events';
import { log } from '../log';
import { parseRedisUrl } from '../common/redis';
import { listNodes, registerNode } from '../common/node-registry';

/** A gateway pod that can hold an Egress's floating addresses. */
export interface GatewayInfo {
  /** "namespace/name" of the pod. */
  pod: string;
  node: string;
  /** The node's address: BFD and conntrack sync between tetherds use it. */
  nodeAddress: string;
  podIp: string;
  zone?: string;
  /** The node's cap on the addresses of one Egress (its tether.dev/max-egress-addresses label). */
  maxAddresses?: number;
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
  /** Where the owner is, so clients can steer to it without the gateway registry. */
  ownerNode?: string;
  ownerNodeAddress?: string;
  ownerPodIp?: string;
}

// Records a decision unless the store holds one that supersedes it; publishes what it records.
// ARGV: owner, epoch, cause, at, egress, address, score, ownerNode, ownerNodeAddress, ownerPodIp, firstOnly
// (firstOnly '1': only if nobody owns it yet, the first owner's compare-and-set).
const RECORD = `
local h = redis.call('HMGET', KEYS[1], 'owner', 'epoch', 'score')
local cur = tonumber(h[2] or '0')
local ep = tonumber(ARGV[2])
local owner = h[1] or ''
if cur > ep or (cur == ep and (owner == ARGV[1] or (owner ~= '' and (h[3] or '') >= ARGV[7]))) or (ARGV[11] == '1' and owner ~= '') then
  return {owner == ARGV[1] and cur == ep and 'same' or 'superseded', cur}
end
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'epoch', ep, 'cause', ARGV[3], 'at', ARGV[4], 'score', ARGV[7],
  'ownerNode', ARGV[8], 'ownerNodeAddress', ARGV[9], 'ownerPodIp', ARGV[10])
redis.call('PUBLISH', KEYS[2], cjson.encode({egress=ARGV[5], address=ARGV[6], owner=ARGV[1], epoch=ep, cause=ARGV[3],
  ownerNode=ARGV[8], ownerNodeAddress=ARGV[9], ownerPodIp=ARGV[10]}))
return {'recorded', ep}
`;

interface Scripted extends Redis {
  tetherRecordOwner(key: string, channel: string, owner: string, epoch: number, cause: string, at: string, egress: string, address: string, score: string, ownerNode: string, ownerNodeAddress: string, ownerPodIp: string, firstOnly: string): Promise<[string, number]>;
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
    client.defineCommand('tetherRecordOwner', { numberOfKeys: 2, lua: RECORD });
    const store = new OwnershipStore(client, sub, prefix);
    sub.on('message', (_ch: string, msg: string) => {
      try {
        store.emit('change', JSON.parse(msg) as Ownership);
      } catch {
        log().warn('ownership store: unreadable change notice ignored', { msg: msg.slice(0, 200) });
      }
    });
    // Subscribed on the first ready connection (ioredis restores it after a reconnect); every ready tells
    // listeners to re-read what they missed meanwhile.
    let subscribed = false;
    sub.on('ready', () => {
      if (!subscribed) {
        subscribed = true;
        sub.subscribe(store.channel()).catch((e: Error) => {
          subscribed = false;
          log().warn('ownership store: subscribe failed; retried on the next connection', { error: e.message });
        });
      }
      store.emit('resync');
    });
    // Nothing waits for the store: a tetherd that starts while it is down decides ownership with its peers
    // and catches up once a connection is ready (ioredis keeps reconnecting).
    try {
      await Promise.all([client.connect(), sub.connect()]);
    } catch (e) {
      log().warn('ownership store unreachable at start; going on and reconnecting', { store: target.where, error: (e as Error).message });
    }
    return store;
  }

  private channel(): string {
    return `${this.prefix}egress-ownership`;
  }

  private key(egress: string, address: string): string {
    return `${this.prefix}egress:${egress}:owner:${address}`;
  }

  /**
   * Records a decision. 'recorded' (and published), 'same' (already there), or 'superseded' when the store
   * holds a later decision: read it with get() and follow it. With `firstOnly`, nothing is written when
   * somebody owns the address already (the first owner's compare-and-set).
   */
  async record(o: Ownership & { score: string }, opts: { firstOnly?: boolean } = {}): Promise<'recorded' | 'same' | 'superseded'> {
    const [state] = await this.client.tetherRecordOwner(
      this.key(o.egress, o.address),
      this.channel(),
      o.owner,
      o.epoch,
      o.cause ?? '',
      new Date().toISOString(),
      o.egress,
      o.address,
      o.score,
      o.ownerNode ?? '',
      o.ownerNodeAddress ?? '',
      o.ownerPodIp ?? '',
      opts.firstOnly ? '1' : '0',
    );
    return state as 'recorded' | 'same' | 'superseded';
  }

  async get(egress: string, address: string): Promise<Ownership> {
    const h = await this.client.hgetall(this.key(egress, address));
    return {
      egress,
      address,
      owner: h.owner ?? '',
      epoch: Number(h.epoch ?? 0),
      cause: h.cause,
      ownerNode: h.ownerNode || undefined,
      ownerNodeAddress: h.ownerNodeAddress || undefined,
      ownerPodIp: h.ownerPodIp || undefined,
    };
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
    await registerNode(this.client, this.prefix, node, address, ttlMs);
  }

  async listNodes(): Promise<string[]> {
    return listNodes(this.client, this.prefix);
  }

  /**
   * This node's clients' use of an Egress's addresses (flows pinned, bytes steered), for the leader's
   * status; each node's entry expires like its registration.
   */
  async reportUsage(egress: string, node: string, usage: Record<string, { flows: number; bytes: number }>, ttlMs: number): Promise<void> {
    await this.client.hset(`${this.prefix}egress:${egress}:usage`, node, JSON.stringify({ usage, expiresAt: Date.now() + ttlMs }));
  }

  /** The addresses' use summed over the nodes that reported it lately. */
  async usage(egress: string): Promise<Record<string, { flows: number; bytes: number }>> {
    const now = Date.now();
    const out: Record<string, { flows: number; bytes: number }> = {};
    for (const v of Object.values(await this.client.hgetall(`${this.prefix}egress:${egress}:usage`))) {
      try {
        const r = JSON.parse(v) as { usage: Record<string, { flows: number; bytes: number }>; expiresAt: number };
        if (r.expiresAt <= now) continue;
        for (const [a, u] of Object.entries(r.usage)) {
          const t = (out[a] ??= { flows: 0, bytes: 0 });
          t.flows += Number(u.flows) || 0;
          t.bytes += Number(u.bytes) || 0;
        }
      } catch {
        // a garbled entry counts as none
      }
    }
    return out;
  }

  async close(): Promise<void> {
    this.client.disconnect();
    this.sub.disconnect();
  }
}
