// Pod addresses, per node: the node claims blocks of a pod pool from the cluster store and allocates
// inside them; it claims another block when its blocks are full and returns a block as soon as it is
// empty. Allocations are durable before they are answered, so an address is never handed out twice, and
// every allocation is keyed by its attachment so a repeated ADD gets the same address back.
import { createHash } from 'node:crypto';
import { ErrorCode, TetherError } from '../lib/errors';
import type { Logger } from '../lib/log';
import { KeyedMutex } from '../lib/keyed-mutex';
import type { AllocationRecord, AllocationStore } from './allocation-store';
import { poolMatchesNode } from './pool';
import { formatCidr, formatIp, parseCidr, parseIp, sizeOf } from '../lib/ip';
import type { ClusterStore, IpFamily, PodOwner, ResolvedFamily, ResolvedPool } from './types';

export interface NodeIdentity {
  name: string;
  zone?: string;
  labels: Record<string, string>;
}

export interface AllocatedIp {
  family: IpFamily;
  address: string;
  /** The block's prefix length: what the pod's address is configured with. */
  prefix: number;
  /** The block's first address, reserved as the pods' gateway (ptp puts it on the host side). */
  gateway: string;
  block: string;
}

export interface PodAllocation {
  pool: string;
  ips: AllocatedIp[];
}

interface BlockState {
  family: IpFamily;
  cidr: string;
  base: bigint;
  size: bigint;
  /** Offsets in the block that are allocated. */
  used: Set<bigint>;
  /** Where the next search starts, so a just-released address is not reused at once. */
  cursor: bigint;
}

interface PoolState {
  pool: ResolvedPool;
  blocks: Map<string, BlockState>;
  /** Empty blocks whose return to the cluster store failed; retried by maintain(). */
  pendingReturn: Set<string>;
  /** Blocks another node claimed while this node still held them (store restarted empty): never allocated from. */
  lost: Set<string>;
  /**
   * Blocks this node holds whose claim the store has not confirmed (re-claiming them failed: the store was
   * unreachable, or the replicas did not acknowledge): no new address from them until maintain() confirms.
   */
  unconfirmed: Set<string>;
  /**
   * Blocks not held here whose claim got no clear answer (unacknowledged by the replicas, or no reply): the
   * store may record them as this node's. The next claim tries them first (idempotent); maintain() releases
   * the ones still unused, so none leaks.
   */
  unsure: Set<string>;
}

function poolState(pool: ResolvedPool): PoolState {
  return { pool, blocks: new Map(), pendingReturn: new Set(), lost: new Set(), unconfirmed: new Set(), unsure: new Set() };
}

export function ownerKey(o: Pick<PodOwner, 'network' | 'containerId' | 'ifName'>): string {
  return `${o.network}/${o.containerId}/${o.ifName}`;
}

/**
 * After the cluster store comes back empty, no node claims a new block for this long after the new
 * generation was born, so every running node (checking every MAINTAIN_EVERY_MS) has re-asserted the blocks
 * it holds before anyone could take one. Cluster-wide addresses hold off as long (ClusterAddresses).
 */
export const MAINTAIN_EVERY_MS = 5000;
export const HOLD_OFF_MS = 2 * MAINTAIN_EVERY_MS + 2000;

/** How many candidate blocks one claim attempt walks before giving up (bounds work on huge IPv6 pools). */
const MAX_BLOCK_SCAN = 1 << 16;

export class PodAllocator {
  private readonly pools = new Map<string, PoolState>();
  private readonly byOwner = new Map<string, AllocationRecord[]>();
  private readonly mutex = new KeyedMutex();
  /** Pools removed from the configuration that still hold allocations: released normally, never allocated from. */
  private readonly retired = new Set<string>();
  private generationSeen?: string;
  private holdOffUntil = 0;

  constructor(
    private readonly node: NodeIdentity,
    pools: ResolvedPool[],
    private readonly store: ClusterStore | undefined,
    private readonly files: AllocationStore,
    private readonly logger: Logger,
    private readonly holdOffMs = HOLD_OFF_MS,
    /** Where the block search starts (firstBlock; tests that lay blocks out by hand start at 0). */
    private readonly searchStart: typeof firstBlock = firstBlock,
  ) {
    for (const pool of pools) if (pool.usage === 'pod') this.pools.set(pool.name, poolState(pool));
  }

  /**
   * Rebuilds state from the durable allocations and the cluster store: adopts blocks the store says this
   * node owns (a claim made just before a crash), re-claims blocks that hold allocations, returns empty ones.
   */
  async start(): Promise<{ allocations: number; blocks: number; conflicts: string[] }> {
    const { records, broken } = this.files.loadAll();
    for (const b of broken) this.logger.error('ipam: unreadable allocation record set aside', { file: b });
    const conflicts: string[] = [];
    for (const ps of this.pools.values()) {
      const name = ps.pool.name;
      const mine = records.filter((r) => r.pool === name);
      const known = new Set([...this.files.loadBlocks(name), ...mine.map((r) => r.block)]);
      let fromStore: string[] | undefined;
      try {
        fromStore = this.store ? [...(await this.store.listBlocks(name))].filter(([, n]) => n === this.node.name).map(([b]) => b) : undefined;
      } catch (e) {
        this.logger.warn('ipam: cluster store unreachable at start; using the local copy of owned blocks', { pool: name, error: (e as Error).message });
      }
      for (const b of fromStore ?? []) known.add(b);
      for (const cidr of known) {
        const c = parseCidr(cidr);
        if (!c) continue;
        if (fromStore && !fromStore.includes(cidr) && this.store) {
          // Owned here but not in the store (store restarted, or a return raced a crash): claim it back.
          // No clear answer: keep the block, allocate nothing new from it until maintain() confirms it.
          const won = await this.store.claimBlock(name, cidr, this.node.name).catch((e) => {
            ps.unconfirmed.add(cidr);
            this.logger.warn('ipam: could not claim back a block at start; no new address from it until the store confirms it', { pool: name, block: cidr, error: (e as Error).message });
            return true;
          });
          if (!won && mine.some((r) => r.block === cidr)) {
            conflicts.push(`${name} ${cidr}`);
            this.logger.error('ipam: block holding local allocations is owned by another node', { pool: name, block: cidr });
          }
        }
        ps.blocks.set(cidr, { family: c.family, cidr, base: c.base, size: sizeOf(c.family, c.prefix), used: new Set(), cursor: 1n });
      }
      for (const r of mine) {
        const blk = ps.blocks.get(r.block);
        const ip = parseIp(r.address);
        if (blk && ip) blk.used.add(ip.value - blk.base);
        this.index(r);
      }
      for (const blk of [...ps.blocks.values()]) if (blk.used.size === 0) await this.returnBlock(ps, blk);
      this.files.saveBlocks(name, [...ps.blocks.keys()]);
    }
    try {
      await this.checkGeneration();
    } catch (e) {
      this.logger.warn('ipam: cluster store generation unknown at start', { error: (e as Error).message });
    }
    const blocks = [...this.pools.values()].reduce((n, p) => n + p.blocks.size, 0);
    this.logger.info('ipam: started', { allocations: records.length, blocks, conflicts });
    return { allocations: records.length, blocks, conflicts };
  }

  /**
   * The configuration changed (level-triggered): new pod pools serve at once; a changed pool's reserved
   * ranges and node selector apply to new allocations (its subnet and usage are immutable, schema rule);
   * a removed pool allocates no more, and is forgotten once its last allocation is released.
   */
  setPools(pools: ResolvedPool[], facts?: { zone?: string; labels: Record<string, string> }): void {
    if (facts) {
      this.node.zone = facts.zone;
      this.node.labels = facts.labels;
    }
    const want = new Map(pools.filter((p) => p.usage === 'pod').map((p) => [p.name, p]));
    for (const [name, pool] of want) {
      const ps = this.pools.get(name);
      if (!ps) {
        this.pools.set(name, poolState(pool));
        this.logger.info('ipam: pool added', { pool: name });
      } else if (JSON.stringify(ps.pool.source) !== JSON.stringify(pool.source)) {
        ps.pool = pool;
        this.logger.info('ipam: pool updated', { pool: name });
      }
      if (this.retired.delete(name)) this.logger.info('ipam: removed pool configured again', { pool: name });
    }
    for (const [name, ps] of this.pools) {
      if (want.has(name) || this.retired.has(name)) continue;
      const inUse = [...ps.blocks.values()].some((b) => b.used.size > 0);
      if (inUse) {
        this.retired.add(name);
        this.logger.warn('ipam: pool removed while addresses are allocated from it; no new allocations, existing ones stay until released', { pool: name });
      } else {
        this.pools.delete(name);
        this.logger.info('ipam: pool removed', { pool: name, blocksReturned: 'by maintenance' });
      }
    }
  }

  /** Addresses for one attachment, one per family of the pool. Idempotent per attachment. */
  allocate(poolName: string, owner: PodOwner): Promise<PodAllocation> {
    const ps = this.podPool(poolName);
    const key = ownerKey(owner);
    return this.mutex.run(poolName, async () => {
      const held = this.byOwner.get(key) ?? [];
      const other = held.find((r) => r.pool !== poolName);
      if (other) {
        throw new TetherError(ErrorCode.AddressConflict, `attachment ${key} already holds ${other.address} from pool "${other.pool}"; release it before asking pool "${poolName}"`);
      }
      const records = [...held];
      const added: AllocationRecord[] = [];
      try {
        for (const fam of ps.pool.families) {
          if (records.some((r) => r.family === fam.family)) continue;
          const rec = await this.allocateIn(ps, fam, owner);
          added.push(rec);
          records.push(rec);
        }
      } catch (e) {
        // Dual-stack is all or nothing: an IPv4 address taken before IPv6 failed goes back.
        for (const r of added) await this.releaseRecord(r);
        throw e;
      }
      return this.describe(poolName, records);
    });
  }

  /** Releases every address of an attachment; returns them. Idempotent. */
  async release(key: string): Promise<string[]> {
    const held = this.byOwner.get(key) ?? [];
    const pools = [...new Set(held.map((r) => r.pool))];
    const released: string[] = [];
    for (const poolName of pools) {
      await this.mutex.run(poolName, async () => {
        for (const r of (this.byOwner.get(key) ?? []).filter((x) => x.pool === poolName)) {
          released.push(r.address);
          await this.releaseRecord(r);
        }
      });
    }
    return released;
  }

  lookup(key: string): PodAllocation | undefined {
    const held = this.byOwner.get(key);
    return held?.length ? this.describe(held[0].pool, held) : undefined;
  }

  /** CNI GC: releases the attachments of `network` that are not in `valid` (attachment keys). */
  async gc(network: string, valid: Set<string>): Promise<string[]> {
    const stale = [...this.byOwner.entries()].filter(([k, rs]) => rs[0]?.owner.network === network && !valid.has(k)).map(([k]) => k);
    for (const k of stale) {
      const addrs = await this.release(k);
      this.logger.info('ipam: gc released addresses of a container the runtime no longer has', { owner: k, addresses: addrs });
    }
    return stale;
  }

  /** Every attachment key holding addresses, with the netns it was allocated for. */
  attachments(): Array<{ key: string; netns?: string; network: string }> {
    return [...this.byOwner.entries()].map(([key, rs]) => ({ key, netns: rs[0]?.owner.netns, network: rs[0]?.owner.network }));
  }

  /**
   * Runs every MAINTAIN_EVERY_MS: notices a cluster store that lost its data and re-asserts this node's
   * blocks, and retries block returns that failed while the store was unreachable.
   */
  async maintain(): Promise<void> {
    await this.checkGeneration();
    for (const ps of this.pools.values()) {
      if (!ps.pendingReturn.size && !ps.unconfirmed.size && !ps.unsure.size) continue;
      await this.mutex.run(ps.pool.name, async () => {
        for (const cidr of [...ps.pendingReturn]) {
          const blk = ps.blocks.get(cidr);
          if (blk && blk.used.size === 0) await this.returnBlock(ps, blk);
          else ps.pendingReturn.delete(cidr);
        }
        for (const cidr of [...ps.unconfirmed]) await this.reassertBlock(ps, cidr);
        for (const cidr of [...ps.unsure]) {
          if (ps.blocks.has(cidr)) {
            ps.unsure.delete(cidr);
            continue;
          }
          // Compare-and-delete: a no-op when the claim never landed or another node holds the block.
          try {
            await this.store?.releaseBlock(ps.pool.name, cidr, this.node.name);
            ps.unsure.delete(cidr);
            this.logger.info('ipam: unacknowledged block claim withdrawn', { pool: ps.pool.name, block: cidr, node: this.node.name });
          } catch (e) {
            this.logger.warn('ipam: could not withdraw an unacknowledged block claim yet', { pool: ps.pool.name, block: cidr, error: (e as Error).message });
          }
        }
      });
    }
  }

  usage(): Array<Record<string, unknown>> {
    return [...this.pools.values()].map((ps) => ({
      pool: ps.pool.name,
      usage: ps.pool.usage,
      families: ps.pool.families.map((f) => {
        const blocks = [...ps.blocks.values()].filter((b) => b.family === f.family);
        const allocated = blocks.reduce((n, b) => n + b.used.size, 0);
        const capacity = blocks.reduce((n, b) => n + Number(b.size) - 1, 0);
        const lost = blocks.filter((b) => ps.lost.has(b.cidr)).map((b) => b.cidr);
        const unconfirmed = blocks.filter((b) => ps.unconfirmed.has(b.cidr)).map((b) => b.cidr);
        return {
          family: f.family, cidr: f.cidr, blockSize: f.blockSize, blocks: blocks.map((b) => b.cidr), allocated, free: capacity - allocated,
          ...(lost.length ? { lost } : {}), ...(unconfirmed.length ? { unconfirmed } : {}),
        };
      }),
    }));
  }

  private podPool(name: string): PoolState {
    if (typeof name !== 'string' || !name) throw new TetherError(ErrorCode.InvalidConfig, 'ipam.pool: missing or not a string');
    const ps = this.pools.get(name);
    if (!ps || this.retired.has(name)) {
      const known = [...this.pools.keys()].filter((n) => !this.retired.has(n));
      throw new TetherError(ErrorCode.UnknownPool, `${ps ? 'removed' : 'unknown'} pod pool "${name}" (this node knows: ${known.join(', ') || 'none'})`);
    }
    if (!poolMatchesNode(ps.pool, this.node)) {
      throw new TetherError(ErrorCode.InvalidConfig, `pool "${name}" does not serve node ${this.node.name} (its nodeSelector does not match)`);
    }
    return ps;
  }

  private async allocateIn(ps: PoolState, fam: ResolvedFamily, owner: PodOwner): Promise<AllocationRecord> {
    for (;;) {
      for (const blk of ps.blocks.values()) {
        if (blk.family !== fam.family || ps.pendingReturn.has(blk.cidr) || ps.lost.has(blk.cidr) || ps.unconfirmed.has(blk.cidr)) continue;
        const off = freeOffset(blk, fam);
        if (off !== undefined) return this.take(ps, blk, off, owner);
      }
      const blk = await this.claimBlock(ps, fam);
      const off = freeOffset(blk, fam);
      if (off !== undefined) return this.take(ps, blk, off, owner);
    }
  }

  private take(ps: PoolState, blk: BlockState, off: bigint, owner: PodOwner): AllocationRecord {
    const rec: AllocationRecord = {
      pool: ps.pool.name,
      family: blk.family,
      address: formatIp(blk.family, blk.base + off),
      block: blk.cidr,
      owner,
      createdAt: new Date().toISOString(),
    };
    this.files.create(rec);
    blk.used.add(off);
    blk.cursor = off + 1n >= blk.size ? 1n : off + 1n;
    this.index(rec);
    this.logger.info('ipam: address allocated', { pool: rec.pool, address: rec.address, block: rec.block, owner: ownerKey(owner), pod: podName(owner) });
    return rec;
  }

  private async releaseRecord(r: AllocationRecord): Promise<void> {
    const ps = this.pools.get(r.pool);
    this.files.remove(r.pool, r.address);
    const key = ownerKey(r.owner);
    const rest = (this.byOwner.get(key) ?? []).filter((x) => !(x.pool === r.pool && x.address === r.address));
    if (rest.length) this.byOwner.set(key, rest);
    else this.byOwner.delete(key);
    this.logger.info('ipam: address released', { pool: r.pool, address: r.address, block: r.block, owner: key, pod: podName(r.owner) });
    const blk = ps?.blocks.get(r.block);
    const ip = parseIp(r.address);
    if (!ps || !blk || !ip) return;
    blk.used.delete(ip.value - blk.base);
    if (blk.used.size === 0) await this.returnBlock(ps, blk);
  }

  private async claimBlock(ps: PoolState, fam: ResolvedFamily): Promise<BlockState> {
    const pool = ps.pool.name;
    if (!this.store) {
      throw new TetherError(ErrorCode.TryAgainLater, `pool "${pool}" needs a new block but tetherd has no cluster store (start it with --redis)`);
    }
    await this.checkGeneration();
    if (Date.now() < this.holdOffUntil) {
      throw new TetherError(
        ErrorCode.TryAgainLater,
        `pool "${pool}" needs a new block, but the cluster store restarted empty; new claims wait ${Math.ceil((this.holdOffUntil - Date.now()) / 1000)} s more while nodes re-assert the blocks they hold`,
      );
    }
    const blockOf = (cidr: string): BlockState | undefined => {
      const c = parseCidr(cidr);
      if (!c || c.family !== fam.family || c.prefix !== fam.blockSize || ps.blocks.has(cidr)) return undefined;
      const blk: BlockState = { family: c.family, cidr, base: c.base, size: sizeOf(c.family, c.prefix), used: new Set(), cursor: 1n };
      return freeOffset(blk, fam) === undefined ? undefined : blk; // undefined: wholly reserved
    };
    // The claim is used only once the store acknowledged it; with no clear answer the block is "unsure":
    // the store may hold it for this node, so it is tried first next time and withdrawn by maintain().
    const tryClaim = async (blk: BlockState): Promise<boolean> => {
      let won: boolean;
      try {
        won = await this.store!.claimBlock(pool, blk.cidr, this.node.name);
      } catch (e) {
        ps.unsure.add(blk.cidr);
        throw e;
      }
      ps.unsure.delete(blk.cidr);
      if (!won) return false; // another node was faster
      ps.blocks.set(blk.cidr, blk);
      this.files.saveBlocks(pool, [...ps.blocks.keys()]);
      this.logger.info('ipam: block claimed', { pool, block: blk.cidr, node: this.node.name });
      return true;
    };
    for (const cidr of [...ps.unsure]) {
      const blk = blockOf(cidr);
      if (blk && (await tryClaim(blk))) return blk;
    }
    const claimed = await this.store.listBlocks(pool);
    const total = sizeOf(fam.family, fam.prefix) / sizeOf(fam.family, fam.blockSize);
    // Each node starts where its name puts it and walks on (wrapping), so nodes starting together do not
    // all race for block 0, then block 1, …; a full walk still visits every block.
    const start = this.searchStart(this.node.name, pool, fam.family, total);
    let scanned = 0;
    for (let i = 0n; i < total && scanned < MAX_BLOCK_SCAN; i++, scanned++) {
      const cidr = formatCidr(fam.family, fam.base + ((start + i) % total) * sizeOf(fam.family, fam.blockSize), fam.blockSize);
      // A block the store says is this node's but that it does not hold (a claim whose answer was lost, a
      // return a failover undid) is claimed again like a free one: adopted, not leaked.
      const holder = claimed.get(cidr);
      if (holder !== undefined && holder !== this.node.name) continue;
      const blk = blockOf(cidr);
      if (blk && (await tryClaim(blk))) return blk;
    }
    const held = [...claimed.values()].length;
    throw new TetherError(
      ErrorCode.PoolExhausted,
      `pool "${pool}" is exhausted for IPv${fam.family}: all ${total} /${fam.blockSize} blocks of ${fam.cidr} are claimed (${held} by nodes) and this node's blocks are full`,
    );
  }

  /** Detects a new store generation (the store lost its data): re-asserts every owned block, holds off claims. */
  private async checkGeneration(): Promise<void> {
    if (!this.store) return;
    const { token: g, ageMs } = await this.store.generation();
    // The generation seen before a restart is kept in the state dir, so a tetherd that was down while the
    // store was wiped notices too.
    this.generationSeen ??= this.files.loadGeneration();
    if (g === this.generationSeen) return;
    const first = this.generationSeen === undefined;
    this.generationSeen = g;
    this.files.saveGeneration(g);
    // A node that never saw a generation (a new node, a wiped state dir) has no blocks to re-assert, and
    // holding its claims off would make every fresh install wait; see docs/ipam.md ("Store restarted empty") for the window this leaves.
    if (first) return;
    // Tell every node (and ClusterAddresses on every node) that this generation replaced one this node saw.
    await this.store.generation({ markRestarted: g }).catch((e) => this.logger.warn('ipam: could not mark the store generation as a restart', { error: (e as Error).message }));
    // The hold-off counts from the generation's birth (the store's clock), which is when holders started
    // noticing, not from when this node happened to look.
    const left = Math.max(0, this.holdOffMs - ageMs);
    this.holdOffUntil = Math.max(this.holdOffUntil, Date.now() + left);
    this.logger.warn('ipam: cluster store restarted empty; re-asserting this node\'s blocks and holding off new claims', { holdOffMs: left, generationAgeMs: ageMs });
    for (const ps of this.pools.values()) {
      for (const cidr of [...ps.blocks.keys()]) {
        ps.unconfirmed.add(cidr);
        await this.reassertBlock(ps, cidr);
      }
    }
  }

  /**
   * Claims a block this node holds again and clears it for allocation; another node holding it by now is
   * reported loudly and the block is never allocated from again. No clear answer: it stays unconfirmed.
   */
  private async reassertBlock(ps: PoolState, cidr: string): Promise<void> {
    if (!this.store || !ps.blocks.has(cidr)) {
      ps.unconfirmed.delete(cidr);
      return;
    }
    let won: boolean;
    try {
      won = await this.store.claimBlock(ps.pool.name, cidr, this.node.name);
    } catch (e) {
      this.logger.warn('ipam: could not re-assert a block yet; no new address from it until the store confirms it', { pool: ps.pool.name, block: cidr, error: (e as Error).message });
      return;
    }
    ps.unconfirmed.delete(cidr);
    if (won) return;
    // Another node got it first (it was not holding off): stop allocating from it and say so loudly.
    ps.lost.add(cidr);
    this.logger.error('ipam: block this node holds was claimed by another node after the store restart', { pool: ps.pool.name, block: cidr });
  }

  private async returnBlock(ps: PoolState, blk: BlockState): Promise<void> {
    const pool = ps.pool.name;
    try {
      if (this.store) await this.store.releaseBlock(pool, blk.cidr, this.node.name);
    } catch (e) {
      // The block stays ours until the store can be told; maintain() retries, allocate() skips it meanwhile.
      ps.pendingReturn.add(blk.cidr);
      this.logger.warn('ipam: could not return empty block yet', { pool, block: blk.cidr, error: (e as Error).message });
      return;
    }
    ps.pendingReturn.delete(blk.cidr);
    ps.unconfirmed.delete(blk.cidr);
    ps.blocks.delete(blk.cidr);
    this.files.saveBlocks(pool, [...ps.blocks.keys()]);
    this.logger.info('ipam: empty block returned', { pool, block: blk.cidr, node: this.node.name });
  }

  private index(r: AllocationRecord): void {
    const key = ownerKey(r.owner);
    this.byOwner.set(key, [...(this.byOwner.get(key) ?? []), r]);
  }

  private describe(pool: string, records: AllocationRecord[]): PodAllocation {
    return {
      pool,
      ips: [...records]
        .sort((a, b) => a.family - b.family)
        .map((r) => {
          const b = parseCidr(r.block)!;
          return { family: r.family, address: r.address, prefix: b.prefix, gateway: formatIp(b.family, b.base), block: r.block };
        }),
    };
  }
}

/**
 * Where `node`'s block search in a pool family of `total` blocks starts: a number in 0..total-1 drawn from
 * a hash of the node's name (with the pool and family), so it is spread evenly over the pool, differs
 * between nodes, and stays the same for one node across restarts (as Calico seeds its block search with
 * the host name).
 */
export function firstBlock(node: string, pool: string, family: IpFamily, total: bigint): bigint {
  if (total <= 1n) return 0n;
  const h = createHash('sha256').update(`${node}\0${pool}\0${family}`).digest();
  return h.readBigUInt64BE(0) % total;
}

/** The first free offset at or after the block's cursor (wrapping), skipping the gateway and reserved ranges. */
function freeOffset(blk: BlockState, fam: ResolvedFamily): bigint | undefined {
  const n = blk.size;
  for (let i = 0n; i < n; i++) {
    const off = (blk.cursor + i) % n;
    if (off === 0n || blk.used.has(off)) continue;
    const addr = blk.base + off;
    if (fam.reserved.some(([a, b]) => addr >= a && addr <= b)) continue;
    return off;
  }
  return undefined;
}

function podName(o: PodOwner): string | undefined {
  return o.podNamespace && o.podName ? `${o.podNamespace}/${o.podName}` : undefined;
}
