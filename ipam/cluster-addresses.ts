// Floating and load-balancer addresses: allocated cluster-wide (not per node) by owner through the
// cluster store, idempotently — asking twice for one owner gives the same addresses; releasing an owner
// frees all of its addresses; explicitly requested addresses are honoured or refused with the holder named.
// A store that lost its data (restarted empty, FLUSHALL) no longer knows who holds what: for the first
// hold-off of every store generation nothing new is handed out, while the holders (the egress and LB
// controllers, which notice the new generation) re-assert the addresses they use.
import { ErrorCode, TetherError } from '../lib/errors';
import type { Logger } from '../lib/log';
import { formatIp, inSubnet, parseIp, sizeOf } from '../lib/ip';
import { HOLD_OFF_MS } from './pod-allocator';
import type { AddressOutcome, ClusterStore, IpFamily, ResolvedFamily, ResolvedPool, StoreGeneration } from './types';

export interface OwnerRequest {
  pool: string;
  /** e.g. "egress/ns/name#2", "lb/ns/name". */
  owner: string;
  /** How many addresses the owner should hold (default 1); ignored with `addresses`. */
  count?: number;
  /** Explicit addresses: honoured or refused. */
  addresses?: string[];
  /** For dual-stack pools: which family to draw from (default: the pool's first). */
  family?: IpFamily;
}

const OWNER_RE = /^[A-Za-z0-9][A-Za-z0-9._\-/#:]{0,252}$/;
const MAX_ATTEMPTS = 8;

export interface ClusterAddressesOptions {
  /**
   * How long after a store generation is born no new address is handed out, so holders can re-assert
   * theirs first. Default HOLD_OFF_MS, the pod allocator's (holders check every few seconds).
   */
  holdOffMs?: number;
}

export class ClusterAddresses {
  private readonly pools = new Map<string, ResolvedPool>();
  private readonly holdOffMs: number;
  /** The store generation this node last saw (a different one later: the store lost its data). */
  private seen?: string;

  constructor(
    pools: ResolvedPool[],
    private readonly store: ClusterStore | undefined,
    private readonly logger: Logger,
    opts: ClusterAddressesOptions = {},
  ) {
    for (const p of pools) if (p.usage !== 'pod') this.pools.set(p.name, p);
    const h = opts.holdOffMs ?? HOLD_OFF_MS;
    if (!Number.isInteger(h) || h < 0 || h > 600_000) throw bad(`holdOffMs: must be 0..600000, got ${String(opts.holdOffMs)}`);
    this.holdOffMs = h;
  }

  /** The configuration changed: cluster-wide pools are looked up in the new set from now on. */
  setPools(pools: ResolvedPool[]): void {
    this.pools.clear();
    for (const p of pools) if (p.usage !== 'pod') this.pools.set(p.name, p);
  }

  /**
   * The owner's addresses: the ones it holds, plus new ones up to `count` (or the explicit ones). Idempotent.
   * During the hold-off of a new store generation an owner that would get a new address is refused with
   * TRY_AGAIN_LATER (an owner asking for what it holds is answered as usual): the address could be one a
   * holder is about to re-assert.
   */
  async allocate(req: OwnerRequest): Promise<{ pool: string; owner: string; addresses: string[] }> {
    const { pool, store } = this.resolve(req.pool);
    const owner = checkOwner(req.owner);
    let explicit: string[] | undefined;
    let count = 0;
    let fam: ResolvedFamily | undefined;
    if (req.addresses !== undefined) {
      if (!Array.isArray(req.addresses) || req.addresses.length === 0) throw bad('addresses: must be a non-empty array');
      explicit = req.addresses.map((a, i) => this.inPool(pool, a, `addresses[${i}]`));
    } else {
      count = req.count ?? 1;
      if (!Number.isInteger(count) || count < 1 || count > 1024) throw bad(`count: must be an integer 1..1024, got ${String(req.count)}`);
      fam = req.family ? pool.families.find((f) => f.family === req.family) : pool.families[0];
      if (!fam) throw bad(`family: pool "${pool.name}" has no IPv${req.family} subnet`);
    }
    for (let attempt = 0; attempt < MAX_ATTEMPTS; attempt++) {
      // The generation is checked again by the store's script, atomically with the claim: a store wiped
      // between this read and the claim refuses it (staleGeneration) and the next attempt sees the new one.
      const gen = await this.seeGeneration(store);
      // Only a generation a node marked as a restart holds off: a new store (a fresh install) has no holders.
      const guard = { generation: gen.token, holdOff: gen.restarted && gen.ageMs < this.holdOffMs };
      let out: AddressOutcome;
      let candidates: string[] = [];
      if (explicit) {
        out = await store.allocateAddresses(pool.name, owner, { explicit }, guard);
      } else {
        // An owner that may hold its addresses already (every node but the first asking for a Service's
        // VIP, an Egress slot after a restart) is answered without listing the pool (a reply that grows
        // with the pool); only an owner short of addresses lists it for candidates.
        let first: AddressOutcome | undefined;
        if (attempt === 0) {
          first = await store.allocateAddresses(pool.name, owner, { count, candidates: [] }, guard);
          if (!first.ok && 'needCandidates' in first) first = undefined;
        }
        if (first) out = first;
        else {
          const taken = await store.listAddresses(pool.name);
          const mine = [...taken].filter(([, o]) => o === owner).length;
          candidates = freeCandidates(fam!, taken, Math.max(0, count - mine) + 8);
          out = await store.allocateAddresses(pool.name, owner, { count, candidates }, guard);
        }
      }
      if (out.ok) return this.done(pool.name, owner, out);
      if ('conflict' in out) {
        throw new TetherError(ErrorCode.AddressConflict, `address ${out.conflict.address} of pool "${pool.name}" is held by ${out.conflict.holder}; ${owner} cannot have it`);
      }
      if ('holdOff' in out) {
        const ago = Math.floor(gen.ageMs / 1000);
        const wait = Math.max(1, Math.ceil((this.holdOffMs - gen.ageMs) / 1000));
        throw new TetherError(
          ErrorCode.TryAgainLater,
          `pool "${pool.name}": the cluster store restarted empty ${ago} s ago; new addresses wait ${wait} s more while holders re-assert theirs (${owner} holds ${out.have.length ? out.have.join(', ') : 'none'})`,
        );
      }
      if ('staleGeneration' in out) continue;
      if (explicit) break;
      if ('needCandidates' in out && candidates.length < count - out.have.length) break;
    }
    if (explicit) throw new TetherError(ErrorCode.TryAgainLater, `pool "${pool.name}": the cluster store's generation kept changing while ${owner} was being allocated; try again`);
    throw new TetherError(ErrorCode.PoolExhausted, `pool "${pool.name}" has no ${count} free IPv${fam!.family} address(es) for ${owner} (${fam!.cidr})`);
  }

  /**
   * Puts `address` back under `owner` after the store lost its data: the holder says what it uses. Allowed
   * during the hold-off (that is what the hold-off is for); idempotent. Returns every address the owner
   * holds afterwards. An address someone else holds now is refused with ADDRESS_CONFLICT naming the holder
   * (someone got it while no holder re-asserted it). An address that became reserved in the pool is put
   * back all the same: the holder still uses it, and reserved addresses are never handed out anyway.
   */
  async reassert(poolName: string, ownerRaw: string, address: string): Promise<{ pool: string; owner: string; addresses: string[] }> {
    const { pool, store } = this.resolve(poolName);
    const owner = checkOwner(ownerRaw);
    const a = this.inPool(pool, address, 'address', true);
    const out = await store.allocateAddresses(pool.name, owner, { explicit: [a] });
    if (!out.ok && 'conflict' in out) {
      throw new TetherError(ErrorCode.AddressConflict, `address ${a} of pool "${pool.name}" is held by ${out.conflict.holder}; ${owner} cannot re-assert it`);
    }
    if (!out.ok) throw new TetherError(ErrorCode.Internal, `pool "${pool.name}": unexpected answer re-asserting ${a} for ${owner}: ${JSON.stringify(out)}`);
    this.logger.info('ipam: address re-asserted by its holder', { pool: pool.name, owner, address: a });
    return { pool: pool.name, owner, addresses: out.addresses };
  }

  /**
   * The cluster store's generation token: holders compare it with the one they last saw and re-assert
   * their addresses when it changed. TRY_AGAIN_LATER when there is no store or it is unreachable.
   */
  async generation(): Promise<string> {
    if (!this.store) throw new TetherError(ErrorCode.TryAgainLater, 'cluster-wide addresses need the cluster store (start tetherd with --redis)');
    // Polled every second by every holder: one plain read while the token is the one this node saw; the
    // script (which creates a missing token and marks a changed one as a restart) only when it is not.
    if (this.seen !== undefined && this.store.generationToken) {
      const token = await this.store.generationToken();
      if (token === this.seen) return token;
    }
    return (await this.seeGeneration(this.store)).token;
  }

  /**
   * The store's generation, marked as a restart right away when this node saw another token before: the
   * first allocation after a wipe, on a node that had looked at the store, is held off even before the
   * holders' next pass has marked it.
   */
  private async seeGeneration(store: ClusterStore): Promise<StoreGeneration> {
    let gen = await store.generation();
    if (this.seen !== undefined && gen.token !== this.seen && !gen.restarted) {
      gen = await store.generation({ markRestarted: gen.token });
      this.logger.warn('ipam: cluster store generation changed since this node last looked; marked as a restart', { generation: gen.token, previous: this.seen });
    }
    this.seen = gen.token;
    return gen;
  }

  /**
   * A holder that saw an older generation says `token` replaced it: the store lost data, and new addresses
   * wait for the hold-off from the generation's birth while holders re-assert theirs. Without this mark a
   * new generation is a new store and allocations go ahead at once.
   */
  async markRestarted(token: string): Promise<void> {
    if (!this.store) return;
    const g = await this.store.generation({ markRestarted: token });
    if (g.token === token && g.restarted) this.logger.warn('ipam: cluster store marked as restarted empty; new cluster-wide addresses wait while holders re-assert', { generation: token, ageMs: g.ageMs, holdOffMs: this.holdOffMs });
  }

  /** Frees every address of the owner in the pool. Idempotent. */
  async release(poolName: string, ownerRaw: string): Promise<string[]> {
    const { pool, store } = this.resolve(poolName);
    const owner = checkOwner(ownerRaw);
    const freed = await store.releaseOwner(pool.name, owner);
    this.logger.info('ipam: owner released', { pool: pool.name, owner, addresses: freed });
    return freed;
  }

  /** The loadBalancer pools configured (the controllers' node collects VIPs of deleted Services there). */
  loadBalancerPools(): string[] {
    return [...this.pools.values()].filter((p) => p.usage === 'loadBalancer').map((p) => p.name);
  }

  /** Every address of the pool allocated now, with its owner. */
  async holders(poolName: string): Promise<Map<string, string>> {
    return this.resolve(poolName).store.listAddresses(poolName);
  }

  /** Each pool's capacity (poolCapacity), from the configuration alone. */
  capacities(): Array<{ pool: string; capacity: number }> {
    return [...this.pools.values()].map((p) => ({ pool: p.name, capacity: poolCapacity(p) }));
  }

  async usage(): Promise<Array<Record<string, unknown>>> {
    const out: Array<Record<string, unknown>> = [];
    for (const p of this.pools.values()) {
      let allocated: number | string = 'unknown (cluster store unreachable)';
      try {
        if (this.store) allocated = (await this.store.listAddresses(p.name)).size;
      } catch {
        // reported as unknown: status must answer even when Redis is down
      }
      out.push({ pool: p.name, usage: p.usage, families: p.families.map((f) => ({ family: f.family, cidr: f.cidr })), allocated, capacity: poolCapacity(p) });
    }
    return out;
  }

  private done(pool: string, owner: string, out: { ok: true; addresses: string[] }): { pool: string; owner: string; addresses: string[] } {
    const addresses = out.addresses;
    this.logger.info('ipam: addresses allocated to owner', { pool, owner, addresses });
    return { pool, owner, addresses };
  }

  private resolve(name: string): { pool: ResolvedPool; store: ClusterStore } {
    if (typeof name !== 'string' || !name) throw bad('pool: missing or not a string');
    const pool = this.pools.get(name);
    if (!pool) throw new TetherError(ErrorCode.UnknownPool, `unknown floating/loadBalancer pool "${name}" (known: ${[...this.pools.keys()].join(', ') || 'none'})`);
    if (!this.store) throw new TetherError(ErrorCode.TryAgainLater, `pool "${name}" is cluster-wide and tetherd has no cluster store (start it with --redis)`);
    return { pool, store: this.store };
  }

  private inPool(pool: ResolvedPool, a: unknown, field: string, allowReserved = false): string {
    const ip = typeof a === 'string' ? parseIp(a) : undefined;
    if (!ip) throw bad(`${field}: ${JSON.stringify(a)} is not an IP address`);
    const fam = pool.families.find((f) => inSubnet(ip, f));
    if (!fam) throw bad(`${field}: ${a} is outside pool "${pool.name}" (${pool.families.map((f) => f.cidr).join(', ')})`);
    if (!allowReserved && fam.reserved.some(([lo, hi]) => ip.value >= lo && ip.value <= hi)) throw bad(`${field}: ${a} is reserved in pool "${pool.name}"`);
    return formatIp(ip.family, ip.value);
  }
}

/** How many addresses a cluster-wide pool can hand out, over its families. */
export function poolCapacity(p: ResolvedPool): number {
  return Number(p.families.reduce((n, f) => n + familyCapacity(f), 0n));
}

/**
 * How many addresses of one family a cluster-wide pool can hand out: its subnet less the reserved ranges and
 * an IPv4 subnet's network and broadcast addresses (what freeCandidates skips).
 */
export function familyCapacity(fam: ResolvedFamily): bigint {
  const size = sizeOf(fam.family, fam.prefix);
  const first = fam.base;
  const last = fam.base + size - 1n;
  const excluded: Array<[bigint, bigint]> = fam.reserved
    .map(([lo, hi]): [bigint, bigint] => [lo < first ? first : lo, hi > last ? last : hi])
    .filter(([lo, hi]) => lo <= hi);
  if (fam.family === 4 && fam.prefix <= 30) excluded.push([first, first], [last, last]);
  excluded.sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0));
  let out = size;
  let covered = first - 1n; // excluded ranges may overlap: each address is taken off once
  for (const [lo, hi] of excluded) {
    const from = lo > covered ? lo : covered + 1n;
    if (hi < from) continue;
    out -= hi - from + 1n;
    covered = hi;
  }
  return out;
}

/** Free addresses in pool order, skipping reserved ones and an IPv4 subnet's network and broadcast addresses. */
function freeCandidates(fam: ResolvedFamily, taken: Map<string, string>, want: number): string[] {
  const size = sizeOf(fam.family, fam.prefix);
  const skipEdges = fam.family === 4 && fam.prefix <= 30;
  const out: string[] = [];
  for (let i = 0n; i < size && out.length < want; i++) {
    if (skipEdges && (i === 0n || i === size - 1n)) continue;
    const v = fam.base + i;
    if (fam.reserved.some(([lo, hi]) => v >= lo && v <= hi)) continue;
    const a = formatIp(fam.family, v);
    if (!taken.has(a)) out.push(a);
  }
  return out;
}

function checkOwner(o: unknown): string {
  if (typeof o !== 'string' || !OWNER_RE.test(o)) throw bad(`owner: ${JSON.stringify(o)} must be 1-253 characters of letters, digits and . _ - / # :`);
  return o;
}

function bad(msg: string): TetherError {
  return new TetherError(ErrorCode.InvalidConfig, msg);
}
