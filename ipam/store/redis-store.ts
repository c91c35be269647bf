// ClusterStore over Redis (one server, through Sentinel, or a Redis Cluster): block claims and cluster-wide
// addresses, each change one atomic Lua script. An unreachable Redis is a TRY_AGAIN_LATER answer within
// the command timeout, never a hang. A block claim is acknowledged only once every replica connected to
// the primary (of the claim's slot, in a Cluster) has it (WAIT): Redis replicates asynchronously, and
// Sentinel or the Cluster promotes a replica when the primary dies, so a claim only the primary held would
// vanish while the node goes on allocating from the block.
//
// Keys (prefix defaults to "tether:"); every script, MULTI or pipeline touches keys of one hash slot: a
// pool's keys share the tag {<pool>}, the generation's keys the tag {generation} (storeKeys below):
//   <prefix>pool:{<pool>}:blocks         hash  block CIDR → node
//   <prefix>pool:{<pool>}:addrs          hash  address → owner
//   <prefix>pool:{<pool>}:owner:<owner>  list  the owner's addresses in allocation order
//   <prefix>pool:{<pool>}:generation     string  the generation under which a guarded call last wrote the
//                                        pool's addresses (the pool's own copy: see MARK_POOL)
//   <prefix>{generation}                 string  the store's generation token (see ClusterStore.generation)
//   <prefix>{generation}:born            string  when the token was created, ms by the store's clock
//   <prefix>{generation}:restarted       string  the token, once a node that saw an older one said so
//   <prefix>{generation}:pools           set   pools whose mark was set in this generation
// Before issue 21 the keys had no tags (<prefix>pool:<pool>:blocks, <prefix>generation, …). A store that
// is not a Cluster and still has them is used in compat mode (detectUntagged): scripts read the untagged
// keys where the tagged ones say nothing and write both, so tetherds of both versions see each other's
// claims during a rolling upgrade, and the untagged generation is carried over. Nothing is deleted.
import { randomBytes } from 'node:crypto';
import type { Cluster, Redis } from 'ioredis';
import { ErrorCode, TetherError } from '../../lib/errors';
import { log } from '../../lib/log';
import { formatCidr, formatIp, parseCidr, parseIp } from '../../lib/ip';
import { createRedisClient, parseRedisUrl, reconnectAfterEnd, storeFailure, unreachable, waitReady, watchConnection, withDeadline } from '../../daemon/common/redis';
import { refuseRecord } from '../../daemon/common/store-record';
import { storeFullness } from '../../daemon/common/store-full';
export { parseRedisUrl } from '../../daemon/common/redis';
import type { AddressOutcome, AddressRequest, AllocationGuard, ClusterStore, StoreGeneration } from '../types';
import { ALLOCATE, CLAIM_BLOCK, CONFIRM_POOL, GENERATION, MARK_POOL, RELEASE_BLOCK, RELEASE_OWNER } from './redis-scripts';

export interface RedisStoreOptions {
  /** Prepended to every key, so several clusters or tests can share one Redis. Default "tether:". */
  keyPrefix?: string;
  /** How long the first connection may take. Default 2000 ms. */
  connectTimeoutMs?: number;
  /** How long any call may take, including waiting for a reconnect in progress. Default 1000 ms. */
  commandTimeoutMs?: number;
}

// The scripts as ioredis custom commands: EVALSHA, with EVAL when Redis lost its script cache (restart).
interface Scripts {
  // These four take the number of keys first: the untagged keys of compat mode are passed after the others.
  tetherClaimBlock(numKeys: number, ...keysAndArgs: string[]): Promise<[string, string]>;
  tetherReleaseBlock(numKeys: number, ...keysAndArgs: string[]): Promise<number>;
  tetherAllocate(numKeys: number, ...keysAndArgs: Array<string | number>): Promise<unknown[]>;
  tetherGeneration(token: string, born: string, restarted: string, pools: string, fresh: string, mark: string): Promise<[string, number, string, number]>;
  tetherMarkPool(token: string, born: string, restarted: string, pools: string, generation: string, pool: string, mark: string, fresh: string, markReadAfterMember: string): Promise<'stale' | 'new' | 'adopt' | 'lost' | 'recheck'>;
  tetherConfirmPool(token: string, pools: string, generation: string, pool: string): Promise<number>;
  tetherReleaseOwner(numKeys: number, ...keysAndArgs: string[]): Promise<string[]>;
}
type ScriptedRedis = (Redis & Scripts) | (Cluster & Scripts);

/** The names tetherds before issue 21 used (no hash tags); read and written only in compat mode. */
export function untaggedKeys(prefix: string) {
  return {
    blocks: (pool: string) => `${prefix}pool:${pool}:blocks`,
    addrs: (pool: string) => `${prefix}pool:${pool}:addrs`,
    owner: (pool: string, owner: string) => `${prefix}pool:${pool}:owner:${owner}`,
    generation: `${prefix}generation`,
    born: `${prefix}generation:born`,
    restarted: `${prefix}generation:restarted`,
  };
}

/** The store's key names for `prefix` (see the table at the top); exported for tests and tools. */
export function storeKeys(prefix: string) {
  const gen = `${prefix}{generation}`;
  return {
    blocks: (pool: string) => `${prefix}pool:{${pool}}:blocks`,
    addrs: (pool: string) => `${prefix}pool:{${pool}}:addrs`,
    owner: (pool: string, owner: string) => `${prefix}pool:{${pool}}:owner:${owner}`,
    mark: (pool: string) => `${prefix}pool:{${pool}}:generation`,
    generation: gen,
    born: `${gen}:born`,
    restarted: `${gen}:restarted`,
    pools: `${gen}:pools`,
  };
}

const MAX_NAME = 253;
const MAX_OWNER = 512;
const MAX_COUNT = 1024;
const MAX_CANDIDATES = 4096;

export class RedisStore implements ClusterStore {
  private closed = false;
  private readonly keys: ReturnType<typeof storeKeys>;
  /** Compat mode: the untagged key names of tetherds from before issue 21 (see detectUntagged). */
  private old?: ReturnType<typeof untaggedKeys>;

  private constructor(
    private readonly client: ScriptedRedis,
    private readonly prefix: string,
    private readonly where: string,
    private readonly timeoutMs: number,
  ) {
    this.keys = storeKeys(prefix);
  }

  /**
   * Connects to `redis://[user:password@]host:port[/db]`, `unix:///path.sock[?password=…&db=…]`,
   * `redis+sentinel://…` or `redis+cluster://host:port,…` (parseRedisUrl).
   */
  static async connect(url: string, opts: RedisStoreOptions = {}): Promise<RedisStore> {
    const target = parseRedisUrl(url);
    const prefix = opts.keyPrefix ?? 'tether:';
    checkName('keyPrefix', prefix, 128, true);
    // A brace in the prefix would change which part of every key is its hash tag.
    if (/[{}]/.test(prefix)) throw invalid('keyPrefix', `must not contain '{' or '}' (they pick a key's Redis Cluster hash slot), got ${JSON.stringify(prefix)}`);
    const connectTimeoutMs = checkTimeout('connectTimeoutMs', opts.connectTimeoutMs ?? 2000);
    const commandTimeoutMs = checkTimeout('commandTimeoutMs', opts.commandTimeoutMs ?? 1000);

    // In-flight commands fail on the first disconnect and are never resent later behind the caller's back:
    // the caller already got TRY_AGAIN_LATER and decides itself whether to repeat.
    const client = createRedisClient(target, {
      connectionName: 'tether',
      connectTimeoutMs,
      commandTimeoutMs,
      autoResendUnfulfilledCommands: false,
    }) as ScriptedRedis;
    client.defineCommand('tetherClaimBlock', { lua: CLAIM_BLOCK });
    client.defineCommand('tetherReleaseBlock', { lua: RELEASE_BLOCK });
    client.defineCommand('tetherAllocate', { lua: ALLOCATE });
    client.defineCommand('tetherGeneration', { numberOfKeys: 4, lua: GENERATION });
    client.defineCommand('tetherMarkPool', { numberOfKeys: 4, lua: MARK_POOL });
    client.defineCommand('tetherConfirmPool', { numberOfKeys: 2, lua: CONFIRM_POOL });
    client.defineCommand('tetherReleaseOwner', { lua: RELEASE_OWNER });
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
    const store = new RedisStore(client, prefix, target.where, commandTimeoutMs);
    reconnectAfterEnd(client, () => store.closed, 'ipam');
    await store.checkVersion().catch(async (e: unknown) => {
      await store.close();
      throw e;
    });
    if (!target.cluster) await store.detectUntagged();
    return store;
  }

  /**
   * True once the block is this node's on the primary and on every replica the primary has connected
   * (none connected: nothing to wait for — Sentinel cannot fail over without a replica). TRY_AGAIN_LATER
   * when the replicas did not all acknowledge it in time: the claim is then not acknowledged — it may be
   * on the primary, so the caller must not use the block, and claims it again (idempotent) or releases it.
   */
  async claimBlock(pool: string, block: string, node: string): Promise<boolean> {
    checkPool(pool);
    const b = checkBlock(block);
    checkName('node', node, MAX_NAME);
    const { reply, replicas, acked, waitMs } = await this.runAcked('claimBlock', this.keys.blocks(pool), (p, key) => p.tetherClaimBlock(...this.withOld([key], [this.old?.blocks(pool)]), b, node));
    const [state, holder] = reply as [string, string];
    if (state === 'taken') {
      log().info('block claim refused', { pool, block: b, node, holder });
      return false;
    }
    if (acked < replicas) {
      log().warn('block claim not acknowledged: the replicas did not all confirm it', { pool, block: b, node, replicas, acked, waitMs });
      throw new TetherError(
        ErrorCode.TryAgainLater,
        `cluster store (${this.where}): claim of block ${b} of pool "${pool}" not acknowledged: ${acked} of ${replicas} replica(s) confirmed it within ${waitMs} ms (a failover now could lose it); the block is not used, try again`,
      );
    }
    if (state === 'claimed') {
      log().info('block claimed', { pool, block: b, node, replicas });
      storeFullness.written('ipam');
    }
    return true;
  }

  async releaseBlock(pool: string, block: string, node: string): Promise<boolean> {
    checkPool(pool);
    const b = checkBlock(block);
    checkName('node', node, MAX_NAME);
    const released = (await this.run('releaseBlock', () => this.client.tetherReleaseBlock(...this.withOld([this.keys.blocks(pool)], [this.old?.blocks(pool)]), b, node))) === 1;
    if (released) log().info('block released', { pool, block: b, node });
    return released;
  }

  async generation(opts: { markRestarted?: string } = {}): Promise<StoreGeneration> {
    const k = this.keys;
    const fresh = randomBytes(8).toString('hex');
    if (opts.markRestarted !== undefined) checkName('generation', opts.markRestarted, 64);
    const [token, ageMs, how, restarted] = await this.run('generation', async () => {
      const reply: unknown = await this.client.tetherGeneration(k.generation, k.born, k.restarted, k.pools, fresh, opts.markRestarted ?? '');
      // A Cluster primary killed under the call can leave it with no reply at all: that is the store not
      // answering (try again later), not a malformed generation.
      if (!Array.isArray(reply) || reply.length < 4) throw new Error(`no answer to the generation script (got ${JSON.stringify(reply) ?? 'nothing'})`);
      return reply as Awaited<ReturnType<typeof this.client.tetherGeneration>>;
    });
    if (opts.markRestarted === token && !restarted) log().warn('cluster store: generation marked as a restart, but the mark did not stick', { generation: token });
    if (how === 'new') log().warn('cluster store: new generation (the store is new, or restarted empty)', { store: this.where, generation: token });
    else if (how === 'upgraded') log().warn('cluster store: generation without a birth time (written by an older tetherd, or garbled): its birth is recorded as now', { store: this.where, generation: token });
    return { token, ageMs: Number(ageMs), restarted: restarted === 1 };
  }

  /** The generation token with one GET (a single key: any Redis, a Cluster alike); undefined when there is none. */
  async generationToken(): Promise<string | undefined> {
    const k = this.keys;
    return (await this.run('generationToken', () => this.client.get(k.generation))) ?? undefined;
  }

  /**
   * Every claimed block of the pool. An entry that is not a block (not a canonical network CIDR) or not a
   * node name is left out with one warn line; that is safe: a claim is decided by the script, which still
   * sees the entry, so nobody is given a block by a list that skipped it.
   */
  async listBlocks(pool: string): Promise<Map<string, string>> {
    checkPool(pool);
    const key = this.keys.blocks(pool);
    const all = await this.run('listBlocks', () => this.hgetallWithOld(key, this.old?.blocks(pool)));
    return readEntries(key, all, (block) => (isCanonicalBlock(block) ? undefined : 'not a block (a canonical network CIDR)'), MAX_NAME, 'node');
  }

  async allocateAddresses(pool: string, owner: string, req: AddressRequest, guard: AllocationGuard = {}): Promise<AddressOutcome> {
    checkPool(pool);
    checkName('owner', owner, MAX_OWNER);
    const { mode, count, addresses } = checkRequest(req);
    if (guard.generation !== undefined) checkName('generation', guard.generation, 64);
    const reply = await this.allocateGuarded(pool, owner, mode, count, addresses, guard);
    switch (reply[0]) {
      case 'ok': {
        for (const address of reply[2] as string[]) log().info('address claimed', { pool, address, owner });
        if ((reply[2] as string[]).length) storeFullness.written('ipam');
        return { ok: true, addresses: reply[1] as string[] };
      }
      case 'conflict': {
        const conflict = { address: reply[1] as string, holder: reply[2] as string };
        log().info('address claim refused', { pool, owner, ...conflict });
        return { ok: false, conflict };
      }
      case 'need':
        return { ok: false, needCandidates: true, have: reply[1] as string[] };
      case 'holdoff':
        return { ok: false, holdOff: true, have: reply[1] as string[] };
      case 'stale':
        return { ok: false, staleGeneration: true };
      default:
        throw new TetherError(ErrorCode.Internal, `cluster store (${this.where}): unexpected allocate reply ${JSON.stringify(reply)}`);
    }
  }

  async releaseOwner(pool: string, owner: string): Promise<string[]> {
    checkPool(pool);
    checkName('owner', owner, MAX_OWNER);
    const freed = await this.run('releaseOwner', () => this.client.tetherReleaseOwner(...this.withOld([this.keys.addrs(pool), this.keys.owner(pool, owner)], [this.old?.addrs(pool), this.old?.owner(pool, owner)]), owner));
    for (const address of freed) log().info('address released', { pool, address, owner });
    return freed;
  }

  /** Every allocated address of the pool; garbled entries are left out like listBlocks's (the script decides). */
  async listAddresses(pool: string): Promise<Map<string, string>> {
    checkPool(pool);
    const key = this.keys.addrs(pool);
    const all = await this.run('listAddresses', () => this.hgetallWithOld(key, this.old?.addrs(pool)));
    return readEntries(key, all, (a) => (isCanonicalAddress(a) ? undefined : 'not an IP address in canonical form'), MAX_OWNER, 'owner');
  }

  /** Whether the connection is up now (a metric; read without a round trip). */
  get connected(): boolean {
    return !this.closed && this.client.status === 'ready';
  }

  /** Drops the connection at once (no QUIT round trip that could wait on a dead Redis). Idempotent. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    // Our own disconnect is not an outage: no "connection lost" line for it.
    this.client.removeAllListeners('close');
    this.client.disconnect();
  }

  /**
   * Compat mode, decided once at connect on a store that is not a Cluster: a tetherd from before issue 21
   * created the untagged generation key (it does on its first look at the store), so tetherds of that
   * version may still be running. The scripts then also read the untagged keys and write both names,
   * lists read both, so old and new tetherds see each other's block claims and addresses during a rolling
   * upgrade; and the untagged generation is carried over (if the tagged one does not exist yet), so the
   * upgrade does not look like a wipe (no hold-off, nothing to re-assert). On a Cluster there are no
   * untagged keys (no earlier version could use one).
   */
  private async detectUntagged(): Promise<void> {
    const u = untaggedKeys(this.prefix);
    const k = this.keys;
    try {
      const client = this.client as Redis;
      if (!(await client.exists(u.generation))) return;
      this.old = u;
      const [token, born, restarted] = await client.mget(u.generation, u.born, u.restarted);
      if (token && (await client.set(k.generation, token, 'NX')) === 'OK') {
        if (born) await client.set(k.born, born, 'NX');
        if (restarted) await client.set(k.restarted, restarted, 'NX');
        log().info('cluster store: generation of the untagged keys carried over', { store: this.where, generation: token });
      }
      log().warn('cluster store: untagged keys of an older tetherd found; reading and writing both names while tetherds of both versions may run', { store: this.where });
    } catch (e) {
      // Not knowing is unsafe both ways; fail the connect, the caller retries (LazyStore).
      throw storeFailure(this.where, 'looking for untagged keys', e);
    }
  }

  /**
   * Redis 7.0 or later: the scripts that must run on a full store say so with a script flag
   * (common/store-full.ts), which older servers cannot compile. Refused at connect, naming the version,
   * rather than as script errors later.
   */
  private async checkVersion(): Promise<void> {
    const info = await this.run('checking the server version', () => this.client.info('server'));
    const v = /^redis_version:(\d+)\.(\S+)/m.exec(String(info));
    if (v && Number(v[1]) < 7) {
      throw new TetherError(ErrorCode.InvalidConfig, `cluster store (${this.where}) is Redis ${v[1]}.${v[2]}: tether needs Redis 7.0 or later (script flags)`);
    }
  }

  /** numKeys and the keys for a script that takes untagged twins in compat mode. */
  private withOld(keys: string[], old: Array<string | undefined>): [number, ...string[]] {
    const all = this.old ? [...keys, ...old.map((x) => x!)] : keys;
    return [all.length, ...all];
  }

  /** HGETALL, merged with the untagged twin in compat mode (the tagged entry wins). */
  private async hgetallWithOld(key: string, old: string | undefined): Promise<Record<string, string>> {
    if (!old) return this.client.hgetall(key);
    const [a, b] = await Promise.all([this.client.hgetall(old), this.client.hgetall(key)]);
    return { ...a, ...b };
  }

  /**
   * ALLOCATE, with the generation guard split by slot: the pool's slot holds a copy of the generation its
   * addresses were written under (its mark), and only the generation's own slot can say whether a mark
   * that is not the caller's generation may be set (MARK_POOL). Replies as ALLOCATE, or ['stale'].
   */
  private async allocateGuarded(pool: string, owner: string, mode: string, count: number, addresses: string[], guard: AllocationGuard): Promise<unknown[]> {
    const k = this.keys;
    const token = guard.generation ?? '';
    let replaceMark = '-';
    // Set once MARK_POOL said the pool is recorded as marked: the next mark read comes after that.
    let memberSeen = false;
    for (let round = 0; round < 4; round++) {
      const { reply: r, replicas, acked, waitMs } = await this.runAcked('allocateAddresses', k.addrs(pool), (p, key) =>
        p.tetherAllocate(...this.withOld([key, k.owner(pool, owner), k.mark(pool)], [this.old?.addrs(pool), this.old?.owner(pool, owner)]), owner, mode, count, token, guard.holdOff ? '1' : '0', replaceMark, ...addresses),
      );
      const reply = r as unknown[];
      if (reply[0] === 'ok' && acked < replicas) {
        log().warn('address allocation not acknowledged: the replicas did not all confirm it', { pool, owner, addresses: reply[1], replicas, acked, waitMs });
        throw new TetherError(
          ErrorCode.TryAgainLater,
          `cluster store (${this.where}): addresses of ${owner} in pool "${pool}" not acknowledged: ${acked} of ${replicas} replica(s) confirmed them within ${waitMs} ms (a failover now could lose them); try again`,
        );
      }
      if (reply[0] !== 'mark') {
        // This call set the pool's first mark of the generation: record the pool as marked (see CONFIRM_POOL).
        if (replaceMark === '') {
          await this.run('allocateAddresses (confirm mark)', () => this.client.tetherConfirmPool(k.generation, k.pools, token, pool)).catch((e: Error) =>
            log().warn('cluster store: pool mark not recorded in the generation (a later loss of its keys would go unnoticed until it is)', { pool, error: e.message }),
          );
        }
        return reply;
      }
      const mark = String(reply[1]);
      const fresh = randomBytes(8).toString('hex');
      const verdict = await this.run('allocateAddresses (generation)', () => this.client.tetherMarkPool(k.generation, k.born, k.restarted, k.pools, token, pool, mark, fresh, memberSeen ? '1' : '0'));
      if (verdict === 'stale') return ['stale'];
      if (verdict === 'recheck') {
        memberSeen = true;
        continue;
      }
      if (verdict === 'lost') {
        log().warn('cluster store: the keys of a pool lost their data while the generation kept its own (a Redis Cluster node restarted empty?); generation replaced as a restart, holders re-assert', { store: this.where, pool, previous: token, generation: fresh });
        return ['stale'];
      }
      if (verdict === 'adopt') log().info('cluster store: pool written under an older generation carried over to the current one', { pool, from: mark, generation: token });
      replaceMark = mark;
    }
    // The mark kept changing under us (other nodes racing through generations): the caller looks again.
    return ['stale'];
  }

  /**
   * One write script on `key`'s slot followed by WAIT for every replica the slot's primary has online:
   * the script and its WAIT go out together on one connection (in a Cluster: to the node serving the
   * key's slot), since a WAIT sent on a new connection (after a reconnect, perhaps to a new primary) would
   * count nothing of this connection's write. The caller treats acked < replicas as not acknowledged.
   */
  private async runAcked(what: string, key: string, add: (p: Scripts, key: string) => unknown): Promise<{ reply: unknown; replicas: number; acked: number; waitMs: number }> {
    const waitMs = Math.max(10, Math.floor(this.timeoutMs / 2));
    return this.run(what, async () => {
      const replicas = await this.connectedReplicas(key);
      const res = await this.onKeySlot(key, what, () => {
        const p = this.client.pipeline() as unknown as Scripts & { wait(n: number, ms: number): unknown; exec(): Promise<Array<[Error | null, unknown]> | null> };
        add(p, key);
        p.wait(replicas, waitMs);
        return p.exec();
      });
      if (res.length !== 2) throw new Error(`no answer to ${what}`);
      for (const [err] of res) if (err) throw err;
      return { reply: res[0][1], replicas, acked: Number(res[1][1]), waitMs };
    });
  }

  /**
   * How many replicas the primary has online now (INFO replication: connected and past their initial
   * sync), each of which a claim waits for. A replica still in its first full sync acknowledges nothing
   * until it is done, and has no data a failover could keep: it is not waited for.
   */
  private async connectedReplicas(key: string): Promise<number> {
    // Sent with a command on `key`, so a Cluster client asks the primary serving the key's slot.
    const res = await this.onKeySlot(key, 'INFO replication', () => this.client.pipeline().exists(key).info('replication').exec());
    const [err, reply] = res[1] ?? [new Error('no answer to INFO replication'), undefined];
    if (err) throw err;
    const info = String(reply);
    const m = /^connected_slaves:(\d+)/m.exec(info);
    // A node that cannot describe its replication now (seen while a Cluster primary was SIGKILLed and its
    // replica took over) is a store in transition, not a bug: the caller tries again later.
    if (!m) throw new TetherError(ErrorCode.TryAgainLater, `cluster store (${this.where}): the node serving ${key} did not describe its replicas (INFO replication answered ${JSON.stringify(info.slice(0, 80))}); try again`);
    const lines = [...info.matchAll(/^slave\d+:(.*)$/gm)];
    // Older servers without per-replica lines: every connected replica counts.
    if (!lines.length) return Number(m[1]);
    return lines.filter((l) => /(^|,)state=online(,|$)/.test(l[1].trim())).length;
  }

  /**
   * A pipeline whose first command names `key`, sent to the node serving the key's slot. A Cluster
   * client follows a MOVED redirect inside a pipeline only when every command of it was redirected, and
   * a pipeline with a keyless command (WAIT, INFO) never is: the keyless command runs on the old node
   * (INFO then describes the wrong primary) and the keyed one fails with MOVED, every time, since nothing
   * updates the client's slot table. So a MOVED answer is followed by one plain command on the key (the
   * client follows that redirect and learns the slot's node) and the pipeline is sent again, once. An ASK
   * (the slot is being migrated) is not followed: the caller's call fails and is retried later.
   */
  private async onKeySlot(key: string, what: string, send: () => Promise<Array<[Error | null, unknown]> | null>): Promise<Array<[Error | null, unknown]>> {
    for (let attempt = 0; ; attempt++) {
      const res = await send();
      if (!res) throw new Error(`no answer to ${what}`);
      const moved = res.find(([e]) => e && /^MOVED /.test(e.message));
      if (!moved || attempt > 0) return res;
      log().info('cluster store: a slot moved to another node; following it', { store: this.where, key, redirect: moved[0]!.message });
      await this.client.exists(key);
    }
  }

  /** One call under one deadline: waiting for a reconnect in progress counts against the same timeout. */
  private async run<T>(what: string, fn: () => Promise<T>): Promise<T> {
    if (this.closed) throw new TetherError(ErrorCode.Internal, `cluster store (${this.where}) used after close (${what})`);
    const deadline = Date.now() + this.timeoutMs;
    try {
      await waitReady(this.client, this.timeoutMs);
      return await withDeadline(fn(), Math.max(1, deadline - Date.now()));
    } catch (e) {
      throw storeFailure(this.where, what, e);
    }
  }
}

/** A hash's entries whose field passes `fieldProblem` and whose value is a name as checkName allows. */
function readEntries(key: string, all: Record<string, string>, fieldProblem: (f: string) => string | undefined, max: number, what: string): Map<string, string> {
  const out = new Map<string, string>();
  for (const [f, v] of Object.entries(all)) {
    const problem = fieldProblem(f) ?? (v === '' || v.length > max || /[\x00-\x1f\x7f]/.test(v) ? `the ${what} is not a name (empty, too long, or control characters)` : undefined);
    if (problem) refuseRecord('cluster store', key, f, problem, v);
    else out.set(f, v);
  }
  return out;
}

function isCanonicalBlock(s: string): boolean {
  const c = parseCidr(s);
  return !!c && c.isNetwork && formatCidr(c.family, c.base, c.prefix) === s;
}

function isCanonicalAddress(s: string): boolean {
  const ip = parseIp(s);
  return !!ip && formatIp(ip.family, ip.value) === s;
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

// A pool name with ':' could make one pool's keys collide with another's owner keys; a brace would change
// the keys' hash tag.
function checkPool(pool: unknown): asserts pool is string {
  checkName('pool', pool, MAX_NAME);
  if (/[:\s{}]/.test(pool)) throw invalid('pool', `must not contain ':', '{', '}' or whitespace, got ${JSON.stringify(pool)}`);
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
