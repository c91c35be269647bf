// Floating and load-balancer addresses: allocated cluster-wide (not per node) by owner through the
// cluster store, idempotently — asking twice for one owner gives the same addresses; releasing an owner
// frees all of its addresses; explicitly requested addresses are honoured or refused with the holder named.
import { ErrorCode, TetherError } from '../daemon/errors';
import type { Logger } from '../daemon/log';
import { formatIp, inSubnet, parseIp, sizeOf } from '../daemon/common/ip-math';
import type { ClusterStore, IpFamily, ResolvedFamily, ResolvedPool } from './types';

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

export class ClusterAddresses {
  private readonly pools = new Map<string, ResolvedPool>();

  constructor(
    pools: ResolvedPool[],
    private readonly store: ClusterStore | undefined,
    private readonly logger: Logger,
  ) {
    for (const p of pools) if (p.usage !== 'pod') this.pools.set(p.name, p);
  }

  /** The configuration changed: cluster-wide pools are looked up in the new set from now on. */
  setPools(pools: ResolvedPool[]): void {
    this.pools.clear();
    for (const p of pools) if (p.usage !== 'pod') this.pools.set(p.name, p);
  }

  async allocate(req: OwnerRequest): Promise<{ pool: string; owner: string; addresses: string[] }> {
    const { pool, store } = this.resolve(req.pool);
    const owner = checkOwner(req.owner);
    if (req.addresses !== undefined) {
      if (!Array.isArray(req.addresses) || req.addresses.length === 0) throw bad('addresses: must be a non-empty array');
      const explicit = req.addresses.map((a, i) => this.inPool(pool, a, `addresses[${i}]`));
      const out = await store.allocateAddresses(pool.name, owner, { explicit });
      if (!out.ok && 'conflict' in out) {
        throw new TetherError(ErrorCode.AddressConflict, `address ${out.conflict.address} of pool "${pool.name}" is held by ${out.conflict.holder}; ${owner} cannot have it`);
      }
      return this.done(pool.name, owner, out);
    }
    const count = req.count ?? 1;
    if (!Number.isInteger(count) || count < 1 || count > 1024) throw bad(`count: must be an integer 1..1024, got ${String(req.count)}`);
    const fam = req.family ? pool.families.find((f) => f.family === req.family) : pool.families[0];
    if (!fam) throw bad(`family: pool "${pool.name}" has no IPv${req.family} subnet`);
    for (let attempt = 0; attempt < MAX_ATTEMPTS; attempt++) {
      const taken = await store.listAddresses(pool.name);
      const mine = [...taken].filter(([, o]) => o === owner).length;
      const candidates = freeCandidates(fam, taken, Math.max(0, count - mine) + 8);
      const out = await store.allocateAddresses(pool.name, owner, { count, candidates });
      if (out.ok) return this.done(pool.name, owner, out);
      if ('needCandidates' in out && candidates.length < count - out.have.length) break;
    }
    throw new TetherError(ErrorCode.PoolExhausted, `pool "${pool.name}" has no ${count} free IPv${fam.family} address(es) for ${owner} (${fam.cidr})`);
  }

  /** Frees every address of the owner in the pool. Idempotent. */
  async release(poolName: string, ownerRaw: string): Promise<string[]> {
    const { pool, store } = this.resolve(poolName);
    const owner = checkOwner(ownerRaw);
    const freed = await store.releaseOwner(pool.name, owner);
    this.logger.info('ipam: owner released', { pool: pool.name, owner, addresses: freed });
    return freed;
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
      out.push({ pool: p.name, usage: p.usage, families: p.families.map((f) => ({ family: f.family, cidr: f.cidr })), allocated });
    }
    return out;
  }

  private done(pool: string, owner: string, out: { ok: boolean } & { addresses?: string[] }): { pool: string; owner: string; addresses: string[] } {
    const addresses = out.addresses ?? [];
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

  private inPool(pool: ResolvedPool, a: unknown, field: string): string {
    const ip = typeof a === 'string' ? parseIp(a) : undefined;
    if (!ip) throw bad(`${field}: ${JSON.stringify(a)} is not an IP address`);
    const fam = pool.families.find((f) => inSubnet(ip, f));
    if (!fam) throw bad(`${field}: ${a} is outside pool "${pool.name}" (${pool.families.map((f) => f.cidr).join(', ')})`);
    if (fam.reserved.some(([lo, hi]) => ip.value >= lo && ip.value <= hi)) throw bad(`${field}: ${a} is reserved in pool "${pool.name}"`);
    return formatIp(ip.family, ip.value);
  }
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
