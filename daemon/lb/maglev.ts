// Maglev consistent hashing (Eisenbud et al., NSDI 2016, section 3.4): a lookup table of prime size M in
// which every target gets ~M/N entries, and a change of the target set moves few entries. Every tetherd
// computes the same table for the same target set: targets are ordered by address and hashed with fixed
// seeds, so LB pods on different nodes send a new client to the same target.
import { ipToBytes } from '../../lib/ip';
import { lbHash, type MapKey } from '../bpf/lb-structs';

/** Is n prime (trial division; table sizes are at most a few million). */
export function isPrime(n: number): boolean {
  if (!Number.isInteger(n) || n < 2) return false;
  if (n % 2 === 0) return n === 2;
  for (let d = 3; d * d <= n; d += 2) if (n % d === 0) return false;
  return true;
}

/**
 * The order targets are indexed in: by address bytes in network order (IPv4, 4 bytes, before IPv6, 16),
 * so every node indexes the same set alike in either family. For IPv4 this is the numeric order rows were
 * always built in (a row is the same before and after an upgrade); text that is no address sorts first.
 */
export function compareTargets(a: string, b: string): number {
  const x = bytesOf(a);
  const y = bytesOf(b);
  return x.length - y.length || Buffer.compare(x, y);
}

function bytesOf(s: string): Buffer {
  try {
    return ipToBytes(s);
  } catch {
    return Buffer.alloc(0);
  }
}

/** FNV-1a, 32 bits, over the UTF-8 bytes of s, from a given basis. */
function fnv1a(s: string, basis: number): number {
  let h = basis >>> 0;
  for (const b of Buffer.from(s)) {
    h ^= b;
    h = Math.imul(h, 0x01000193) >>> 0;
  }
  // Final avalanche (murmur3 fmix32): FNV alone leaves similar names (10.0.0.1, 10.0.0.2) correlated.
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b) >>> 0;
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35) >>> 0;
  h ^= h >>> 16;
  return h >>> 0;
}

/**
 * The Maglev table of size m (a prime) over targets (addresses of one family): entry i is the index into the
 * returned `targets` (sorted, deduplicated) of the target owning slot i, or -1 for all when there are none.
 */
export function maglevTable(targetsIn: readonly string[], m: number): { targets: string[]; table: Int32Array } {
  if (!isPrime(m)) throw new Error(`maglev table size ${m} is not a prime`);
  const targets = [...new Set(targetsIn)].sort(compareTargets);
  const table = new Int32Array(m).fill(-1);
  const n = targets.length;
  if (n === 0) return { targets, table };
  const offset = new Uint32Array(n);
  const skip = new Uint32Array(n);
  const next = new Uint32Array(n);
  targets.forEach((t, i) => {
    offset[i] = fnv1a(t, 0x811c9dc5) % m;
    skip[i] = (fnv1a(t, 0x9747b28c) % (m - 1)) + 1;
  });
  let filled = 0;
  for (;;) {
    for (let i = 0; i < n; i++) {
      // (offset + next * skip) mod m without overflow: next < m and skip < m, both < 2^26 for real sizes,
      // but the product can pass 2^53 for huge m; use the running form instead.
      let c = (offset[i] + ((next[i] * skip[i]) % m)) % m;
      while (table[c] >= 0) {
        next[i]++;
        c = (offset[i] + ((next[i] * skip[i]) % m)) % m;
      }
      table[c] = i;
      next[i]++;
      if (++filled === m) return { targets, table };
    }
  }
}

/** A Maglev table as written to a VIP's row: entry i indexes targets (-1: none). */
export interface MaglevTable {
  targets: string[];
  table: Int32Array;
}

/** The target the datapath picks for key from table (lb_pick of lb-core.h); undefined when the row is empty. */
export function pickOf(t: MaglevTable, key: MapKey, seed: number): string | undefined {
  const i = t.table[lbHash(key, seed) % t.table.length];
  return i >= 0 ? t.targets[i] : undefined;
}

/**
 * The table of `base` with every entry whose target is not in `known` taken from `fill` instead (targets of
 * both, sorted as maglevTable sorts them). Every node with the same three inputs computes the same table:
 * the entries of known targets stay where base has them.
 */
export function patchTable(base: MaglevTable, fill: MaglevTable, known: ReadonlySet<string>): MaglevTable {
  const targets = [...new Set([...base.targets.filter((t) => known.has(t)), ...fill.targets])].sort(compareTargets);
  const index = new Map(targets.map((t, i) => [t, i]));
  const table = new Int32Array(base.table.length);
  for (let i = 0; i < table.length; i++) {
    const b = base.table[i] >= 0 ? base.targets[base.table[i]] : undefined;
    const f = fill.table[i] >= 0 ? fill.targets[fill.table[i]] : undefined;
    const t = b !== undefined && known.has(b) ? b : f;
    table[i] = t === undefined ? -1 : index.get(t)!;
  }
  return { targets, table };
}
