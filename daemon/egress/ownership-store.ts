// The cluster store's record of who owns each floating address (Redis). Decisions are made by the
// candidates themselves (BFD liveness, a common order, epochs; see candidates.ts) and travel between
// tetherds as ownership notices; the store records them, publishes them to whoever listens, and settles
// decisions made on both sides of a partition when it is reachable again: a Lua script keeps the record
// that supersedes (larger epoch, or the same epoch with the better-scored owner). A gateway and node
// registry lets tetherds find candidates and peers on other nodes: member sets (common/member-registry.ts)
// written only by nodes with gateway pods, read as changes, pruned of nodes that stopped. The Kubernetes
// store can slot in behind the same interface later.
import Redis from 'ioredis';
import { EventEmitter } from 'node:events';
import { log } from '../../lib/log';
import { createRedisClient, parseRedisUrl, reconnectAfterEnd } from '../common/redis';
import { listNodes, NodeRegistry, registerNode } from '../common/node-registry';
import { MemberView } from '../common/member-registry';
import { RUNS_WHEN_FULL } from '../common/store-full';
import { isCanonicalIp, isObjectRef, isPlainName, nodeAddressText, nonNegativeInt, parseObject, readNodeAddress, refuseRecord, UnreadableRecordError } from '../common/store-record';
export { UnreadableRecordError } from '../common/store-record';

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

// Records a decision unless the store holds one that supersedes it; publishes what it records. One key (the
// record); the channel is ARGV[12], not a key (Redis Cluster: a script's keys are one slot, channels none).
// ARGV: owner, epoch, cause, at, egress, address, score, ownerNode, ownerNodeAddress, ownerPodIp, firstOnly
// (firstOnly '1': only if nobody owns it yet, the first owner's compare-and-set).
// A record whose epoch is not a non-negative integer says nothing anyone can follow: the first owner's
// compare-and-set is refused ('unreadable': someone may own the address), and a decision — which only a
// holder writes — replaces it ('repaired').
const RECORD = `
local h = redis.call('HMGET', KEYS[1], 'owner', 'epoch', 'score')
local ep = tonumber(ARGV[2])
local state = 'recorded'
if h[2] and not string.match(h[2], '^%d+$') then
  if ARGV[11] == '1' then return {'unreadable', 0} end
  state = 'repaired'
else
  local cur = tonumber(h[2] or '0')
  local owner = h[1] or ''
  if cur > ep or (cur == ep and (owner == ARGV[1] or (owner ~= '' and (h[3] or '') >= ARGV[7]))) or (ARGV[11] == '1' and owner ~= '') then
    return {owner == ARGV[1] and cur == ep and 'same' or 'superseded', cur}
  end
end
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'epoch', ep, 'cause', ARGV[3], 'at', ARGV[4], 'score', ARGV[7],
  'ownerNode', ARGV[8], 'ownerNodeAddress', ARGV[9], 'ownerPodIp', ARGV[10])
redis.call('PUBLISH', ARGV[12], cjson.encode({egress=ARGV[5], address=ARGV[6], owner=ARGV[1], epoch=ep, cause=ARGV[3],
  ownerNode=ARGV[8], ownerNodeAddress=ARGV[9], ownerPodIp=ARGV[10]}))
return {state, ep}
`;

// A node's use of an Egress's addresses: its entry and its expiry (the store's clock), expired ones pruned.
// KEYS: hash, expiry. ARGV: node, value, ttlMs, pruneMax.
const USAGE_REPORT = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
for _, m in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, tonumber(ARGV[4]))) do
  redis.call('ZREM', KEYS[2], m)
  redis.call('HDEL', KEYS[1], m)
end
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[3]), ARGV[1])
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return 1
`;

// The use of an Egress's addresses summed over the live entries in the store, so the reply is one small
// object however many nodes report. KEYS: hash, expiry. Returns {totals JSON, names of entries refused}.
const USAGE_SUM = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local live = redis.call('ZRANGEBYSCORE', KEYS[2], now, '+inf')
local totals, bad = {}, {}
for _, m in ipairs(live) do
  local raw = redis.call('HGET', KEYS[1], m)
  local ok, r = pcall(cjson.decode, raw or '')
  local good = ok and type(r) == 'table' and type(r.usage) == 'table'
  if good then
    for a, u in pairs(r.usage) do
      if type(u) ~= 'table' or type(u.flows) ~= 'number' or type(u.bytes) ~= 'number' or u.flows < 0 or u.bytes < 0 then good = false end
    end
  end
  if good then
    for a, u in pairs(r.usage) do
      local x = totals[a] or {flows = 0, bytes = 0}
      x.flows = x.flows + u.flows
      x.bytes = x.bytes + u.bytes
      totals[a] = x
    end
  elseif #bad < 10 then
    bad[#bad + 1] = m
  end
end
if next(totals) == nil then return {'{}', bad} end
return {cjson.encode(totals), bad}
`;

/** Expired usage entries removed per report. */
const USAGE_PRUNE_MAX = 16;

const STORE = 'ownership store';

/** A gateway pod as tetherd names it: "namespace/name", or the container ID of a pod without Kubernetes metadata. */
function isPodName(v: unknown): v is string {
  return isObjectRef(v) || isPlainName(v, 128);
}

/**
 * An ownership record as read from its hash, validated: no record (an empty hash) is owner "" epoch 0; a
 * record from an older tetherd (owner, epoch, cause, at: no score, no owner location) is read as it is,
 * without location (the gateway registry has it, and the owner's next record adds it). Anything else that
 * is wrong throws UnreadableRecordError after one warn line.
 */
export function readOwnership(egress: string, address: string, key: string, h: Record<string, string>): Ownership {
  if (Object.keys(h).length === 0) return { egress, address, owner: '', epoch: 0 };
  const refuse = (field: string, problem: string): never => {
    refuseRecord(STORE, key, field, problem, h[field]);
    throw new UnreadableRecordError(key, field, problem);
  };
  const epoch = nonNegativeInt(h.epoch);
  if (epoch === undefined) refuse('epoch', h.epoch === undefined ? 'missing' : 'not a non-negative integer');
  if (h.owner === undefined) refuse('owner', 'missing');
  if (h.owner !== '' && !isPodName(h.owner)) refuse('owner', 'not a pod name');
  if (h.ownerNode !== undefined && h.ownerNode !== '' && !isPlainName(h.ownerNode)) refuse('ownerNode', 'not a node name');
  if (h.ownerNodeAddress !== undefined && h.ownerNodeAddress !== '' && !readNodeAddress(h.ownerNodeAddress)) refuse('ownerNodeAddress', 'not an IPv4 address or an IPv6 one in brackets');
  if (h.ownerPodIp !== undefined && h.ownerPodIp !== '' && !isCanonicalIp(h.ownerPodIp)) refuse('ownerPodIp', 'not an IP address');
  if (h.score === undefined && h.ownerNode === undefined && olderSchemaSeen.size < 10_000 && !olderSchemaSeen.has(key)) {
    olderSchemaSeen.add(key);
    log().info('ownership store: record written by an older tetherd (no score, no owner location) read without location; its owner\'s next record upgrades it', { key, owner: h.owner, epoch });
  }
  return {
    egress,
    address,
    owner: h.owner,
    epoch: epoch!,
    cause: h.cause,
    ownerNode: h.ownerNode || undefined,
    ownerNodeAddress: readNodeAddress(h.ownerNodeAddress),
    ownerPodIp: h.ownerPodIp || undefined,
  };
}
const olderSchemaSeen = new Set<string>();

/** A change notice as published by RECORD, validated; undefined (after one warn line) when it is not one. */
export function readNotice(channel: string, msg: string): Ownership | undefined {
  const { value: n, problem } = parseObject(msg);
  const bad = (field: string | undefined, why: string): undefined => {
    refuseRecord(STORE, channel, field, why, msg);
    return undefined;
  };
  if (!n) return bad(undefined, problem!);
  if (!isObjectRef(n.egress)) return bad('egress', 'not an Egress "namespace/name"');
  if (!isCanonicalIp(n.address)) return bad('address', 'not an IP address');
  const epoch = typeof n.epoch === 'number' ? nonNegativeInt(n.epoch) : undefined;
  if (epoch === undefined) return bad('epoch', 'not a non-negative integer');
  if (typeof n.owner !== 'string' || (n.owner !== '' && !isPodName(n.owner))) return bad('owner', 'not a pod name');
  const opt = (f: string, ok: (v: unknown) => boolean): boolean => n[f] === undefined || n[f] === '' || ok(n[f]);
  if (!opt('ownerNode', (v) => isPlainName(v))) return bad('ownerNode', 'not a node name');
  if (!opt('ownerNodeAddress', (v) => !!readNodeAddress(v))) return bad('ownerNodeAddress', 'not an IPv4 address or an IPv6 one in brackets');
  if (!opt('ownerPodIp', isCanonicalIp)) return bad('ownerPodIp', 'not an IP address');
  if (n.cause !== undefined && typeof n.cause !== 'string') return bad('cause', 'not a string');
  return {
    egress: n.egress,
    address: n.address,
    owner: n.owner,
    epoch,
    cause: n.cause as string | undefined,
    ownerNode: (n.ownerNode as string) || undefined,
    ownerNodeAddress: readNodeAddress(n.ownerNodeAddress),
    ownerPodIp: (n.ownerPodIp as string) || undefined,
  };
}

/** One node's gateway registration, validated; undefined (after one warn line) when any part is wrong. */
function readGateways(key: string, node: string, raw: string): GatewayInfo[] | undefined {
  const { value: r, problem } = parseObject(raw);
  const bad = (why: string): undefined => {
    refuseRecord(STORE, key, node, why, raw);
    return undefined;
  };
  if (!r) return bad(problem!);
  if (!Array.isArray(r.gateways)) return bad('gateways is not a list');
  const out: GatewayInfo[] = [];
  for (const [i, g] of (r.gateways as unknown[]).entries()) {
    const gw = g as Record<string, unknown>;
    if (typeof g !== 'object' || g === null) return bad(`gateways[${i}] is not an object`);
    if (!isPodName(gw.pod)) return bad(`gateways[${i}].pod is not a pod name`);
    if (!isPlainName(gw.node)) return bad(`gateways[${i}].node is not a node name`);
    const nodeAddress = readNodeAddress(gw.nodeAddress);
    if (!nodeAddress) return bad(`gateways[${i}].nodeAddress is not an IPv4 address or an IPv6 one in brackets`);
    if (!isCanonicalIp(gw.podIp)) return bad(`gateways[${i}].podIp is not an IP address`);
    if (gw.zone !== undefined && !isPlainName(gw.zone, 63)) return bad(`gateways[${i}].zone is not a zone name`);
    if (gw.maxAddresses !== undefined && nonNegativeInt(gw.maxAddresses) === undefined) return bad(`gateways[${i}].maxAddresses is not a non-negative integer`);
    out.push({
      pod: gw.pod,
      node: gw.node,
      nodeAddress,
      podIp: gw.podIp,
      ...(gw.zone !== undefined ? { zone: gw.zone as string } : {}),
      ...(gw.maxAddresses !== undefined ? { maxAddresses: gw.maxAddresses as number } : {}),
    });
  }
  return out;
}

interface Scripted extends Redis {
  tetherRecordOwner1(key: string, owner: string, epoch: number, cause: string, at: string, egress: string, address: string, score: string, ownerNode: string, ownerNodeAddress: string, ownerPodIp: string, firstOnly: string, channel: string): Promise<[string, number]>;
  tetherUsageReport(hash: string, expiry: string, node: string, value: string, ttlMs: number, pruneMax: number): Promise<number>;
  tetherUsageSum(hash: string, expiry: string): Promise<[string, string[]]>;
}

export class OwnershipStore extends EventEmitter {
  private closed = false;
  /** Each Egress's gateway registry as this node last saw it (kept current by changes only). */
  private readonly gatewayViews = new Map<string, MemberView<GatewayInfo[]>>();
  private nodeRegistry?: NodeRegistry;

  private constructor(
    private readonly client: Scripted,
    private readonly sub: Redis,
    private readonly prefix: string,
  ) {
    super();
    client.defineCommand('tetherRecordOwner1', { numberOfKeys: 1, lua: RUNS_WHEN_FULL + RECORD });
    client.defineCommand('tetherUsageReport', { numberOfKeys: 2, lua: USAGE_REPORT });
    client.defineCommand('tetherUsageSum', { numberOfKeys: 2, lua: USAGE_SUM });
  }

  static async connect(url: string, opts: { keyPrefix?: string; timeoutMs?: number } = {}): Promise<OwnershipStore> {
    const target = parseRedisUrl(url);
    const prefix = opts.keyPrefix ?? 'tether:';
    // One server, Sentinel or a Cluster alike (createRedisClient); a Cluster client answers every command used here.
    const common = { connectTimeoutMs: opts.timeoutMs ?? 1000, commandTimeoutMs: opts.timeoutMs ?? 1000 };
    const client = createRedisClient(target, { ...common, connectionName: 'tether-ownership' }) as unknown as Scripted;
    const sub = createRedisClient(target, { ...common, connectionName: 'tether-ownership-sub' }) as unknown as Redis;
    for (const c of [client, sub]) c.on('error', (e: Error) => log().debug('ownership store connection error', { error: e.message }));
    client.defineCommand('tetherRecordOwner', { numberOfKeys: 2, lua: RUNS_WHEN_FULL + RECORD });
    const store = new OwnershipStore(client, sub, prefix);
    reconnectAfterEnd(client, () => store.closed, 'ownership');
    reconnectAfterEnd(sub, () => store.closed, 'ownership notices');
    sub.on('message', (ch: string, msg: string) => {
      const o = readNotice(ch, msg);
      if (o) store.emit('change', o);
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
   * somebody owns the address already (the first owner's compare-and-set). A stored record with a garbled
   * epoch is replaced by the decision (logged); with `firstOnly` it throws UnreadableRecordError instead.
   */
  async record(o: Ownership & { score: string }, opts: { firstOnly?: boolean } = {}): Promise<'recorded' | 'same' | 'superseded'> {
    const key = this.key(o.egress, o.address);
    const [state] = await this.client.tetherRecordOwner1(
      key,
      o.owner,
      o.epoch,
      o.cause ?? '',
      new Date().toISOString(),
      o.egress,
      o.address,
      o.score,
      o.ownerNode ?? '',
      o.ownerNodeAddress ? nodeAddressText(o.ownerNodeAddress) : '',
      o.ownerPodIp ?? '',
      opts.firstOnly ? '1' : '0',
      this.channel(),
    );
    if (state === 'unreadable') {
      refuseRecord(STORE, key, 'epoch', 'not a non-negative integer', '(first-owner claim refused)');
      throw new UnreadableRecordError(key, 'epoch', 'not a non-negative integer');
    }
    if (state === 'repaired') {
      log().warn('ownership store: record with a garbled epoch replaced by this decision', { key, owner: o.owner, epoch: o.epoch });
      return 'recorded';
    }
    return state as 'recorded' | 'same' | 'superseded';
  }

  /**
   * The recorded decision for an address: owner "" epoch 0 when there is none. A record that is not
   * readable (garbled epoch, owner, location) is never read as "none" — that could hand a live owner's
   * address to someone else — but throws UnreadableRecordError (TRY_AGAIN_LATER): treat it like the store
   * being unreachable for that address. A record from an older tetherd is read without owner location.
   */
  async get(egress: string, address: string): Promise<Ownership> {
    const key = this.key(egress, address);
    return readOwnership(egress, address, key, await this.client.hgetall(key));
  }

  /** An Egress's keys share its hash tag: every script on them touches one slot. */
  private egressBase(egress: string): string {
    return `{${this.prefix}egress:${egress}}`;
  }

  private gatewayView(egress: string): MemberView<GatewayInfo[]> {
    let v = this.gatewayViews.get(egress);
    if (!v) {
      const base = `${this.egressBase(egress)}:gateways`;
      v = new MemberView(this.client, base, (node, raw) => readGateways(base, node, raw));
      this.gatewayViews.set(egress, v);
    }
    return v;
  }

  /**
   * Publishes this node's gateway pods for an Egress for `ttlMs` (none: removes this node's entry) and
   * returns every node's, live ones only. One command; its reply carries only what changed since this
   * node's last call, and a node that stopped is removed by whichever call first sees it expired.
   */
  async registerGateways(egress: string, node: string, gateways: GatewayInfo[], ttlMs: number): Promise<GatewayInfo[]> {
    const v = this.gatewayView(egress);
    await v.beat(node, gateways.length ? JSON.stringify({ gateways: gateways.map((g) => ({ ...g, nodeAddress: nodeAddressText(g.nodeAddress) })) }) : undefined, ttlMs);
    return [...v.entries().values()].flat();
  }

  /**
   * Every node's live registrations for an Egress: one command, whose reply carries only what changed
   * since this node's last call. A node's registration that is not readable is left out whole (one warn
   * line); the others are returned.
   */
  async listGateways(egress: string): Promise<GatewayInfo[]> {
    const v = this.gatewayView(egress);
    await v.poll();
    return [...v.entries().values()].flat();
  }

  /** Forgets this node's copy of an Egress's registry (the Egress is no longer served here). */
  forgetGateways(egress: string): void {
    this.gatewayViews.delete(egress);
  }

  /**
   * Registers this node's address for `ttlMs` and returns every registered node's address (sorted). One
   * command; its reply carries only what changed since this node's last call.
   */
  async beatNode(node: string, address: string, ttlMs: number, address6?: string): Promise<string[]> {
    // The node's IPv6 address (--node-address-6) rides in its own registration as address6, the value the load
    // balancer's registry writes too (one process-wide address: two values under one member would rewrite
    // each other every beat). The allow-lists take the nodes' IPv6 addresses beside their IPv4 ones: outer
    // IPv6 FoU to an IPv6-only gateway pod comes from them.
    if (!this.nodeRegistry) this.nodeRegistry = new NodeRegistry(this.client, this.prefix, node, address, address6);
    await this.nodeRegistry.beat(ttlMs);
    return this.nodeRegistry.addresses({ ipv6: true });
  }

  /** Each registered node's node address with its name, as of the last beatNode() (empty before). */
  nodeNames(): Map<string, string> {
    return this.nodeRegistry?.nodeNames() ?? new Map();
  }

  /** Publishes this node's address (gateways accept FoU only from registered nodes). */
  async registerNode(node: string, address: string, ttlMs: number): Promise<void> {
    await registerNode(this.client, this.prefix, node, address, ttlMs);
  }

  /** Every registered node's address, read whole: beatNode() is what a periodic pass uses. */
  async listNodes(): Promise<string[]> {
    return listNodes(this.client, this.prefix);
  }

  /**
   * This node's clients' use of an Egress's addresses (flows pinned, bytes steered), for the leader's
   * status; each node's entry expires like its registration. Written only by nodes whose clients use it.
   */
  async reportUsage(egress: string, node: string, usage: Record<string, { flows: number; bytes: number }>, ttlMs: number): Promise<void> {
    const base = `${this.egressBase(egress)}:usage`;
    await this.client.tetherUsageReport(base, `${base}:expiry`, node, JSON.stringify({ usage }), ttlMs, USAGE_PRUNE_MAX);
  }

  /**
   * The addresses' use summed over the nodes that reported it lately, summed in the store: the reply is
   * one small object however many nodes report. A garbled entry counts as none (one warn line each).
   */
  async usage(egress: string): Promise<Record<string, { flows: number; bytes: number }>> {
    const base = `${this.egressBase(egress)}:usage`;
    const [json, bad] = await this.client.tetherUsageSum(base, `${base}:expiry`);
    for (const node of bad) refuseRecord(STORE, base, node, 'not a usage entry ({usage: {address: {flows, bytes}}})', '');
    const { value: r } = parseObject(json);
    const out: Record<string, { flows: number; bytes: number }> = {};
    for (const [a, u] of Object.entries(r ?? {})) {
      const x = u as { flows?: unknown; bytes?: unknown };
      if (isCanonicalIp(a) && nonNegativeInt(x?.flows) !== undefined && nonNegativeInt(x?.bytes) !== undefined) out[a] = { flows: x.flows as number, bytes: x.bytes as number };
    }
    return out;
  }

  async close(): Promise<void> {
    this.closed = true;
    this.client.disconnect();
    this.sub.disconnect();
  }
}
