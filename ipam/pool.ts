// AddressPool validation: turns file objects or custom resources (same shape) into ResolvedPools. Every
// problem names the pool and the field, and all problems are reported at once so one edit fixes a file.
import { ErrorCode, TetherError } from '../lib/errors';
import { cidrInside, cidrsOverlap, familyBits, formatCidr, parseCidr, parseIp, rangeOf } from '../lib/ip';
import { API_VERSION, DNS1123_LABEL, describe, isLabelKey, isLabelValue, isObject } from '../lib/fields';
import type { AddressPool, IpFamily, PoolUsage, ResolvedFamily, ResolvedPool } from './types';
import { ZONE_LABEL } from '../daemon/objects/names';

const USAGES: readonly PoolUsage[] = ['pod', 'floating', 'loadBalancer'];

/**
 * Node block size of a pod pool without `blockSize`: /26 (IPv4) and /122 (IPv6), 64 addresses each, a
 * common pod density per claim; a subnet smaller than that becomes a single block.
 */
export const DEFAULT_BLOCK_SIZE: Record<IpFamily, number> = { 4: 26, 6: 122 };
/** Longest pod block: anything smaller would cost a cluster-wide claim every pod or two. */
export const MAX_BLOCK_SIZE: Record<IpFamily, number> = { 4: 30, 6: 126 };

// Status is written by controllers on custom resources; it is allowed and ignored.
const TOP_FIELDS = new Set(['apiVersion', 'kind', 'metadata', 'spec', 'status']);
const SPEC_FIELDS = new Set(['ipv4', 'ipv6', 'usage', 'nodeSelector', 'zone', 'reserved']);
const FAMILY_FIELDS = new Set(['cidr', 'blockSize']);

// Ranges no usage can hand out to pods or services.
const SPECIAL: Record<IpFamily, Array<[string, string]>> = {
  4: [
    ['0.0.0.0/8', '"this network"'],
    ['127.0.0.0/8', 'loopback'],
    ['169.254.0.0/16', 'link-local'],
    ['224.0.0.0/4', 'multicast'],
    ['255.255.255.255/32', 'broadcast'],
  ],
  6: [
    ['::/128', 'unspecified'],
    ['::1/128', 'loopback'],
    ['fe80::/10', 'link-local'],
    ['ff00::/8', 'multicast'],
    ['::ffff:0:0/96', 'IPv4-mapped'],
  ],
};
const V4_MAPPED = parseCidr('::ffff:0:0/96')!;


/** Outcome of checking one pool without throwing; `pool` is set only when there are no problems. */
export interface PoolCheck {
  name?: string;
  pool?: ResolvedPool;
  problems: string[];
  /** How the pool is named in messages, e.g. `pools.yaml document 2: AddressPool "blue"`. */
  label: string;
}

/** Validates and resolves one AddressPool; throws TetherError(InvalidConfig) listing every problem. */
export function validatePool(raw: unknown, where?: string): ResolvedPool {
  const c = checkPool(raw, where);
  if (!c.pool) throw configError(c.problems);
  return c.pool;
}

/** validatePool for each, plus duplicate names and overlapping subnets across pools; all problems in one error. */
export function validatePools(raws: unknown[], where?: (index: number) => string | undefined): ResolvedPool[] {
  const { pools, problems } = checkPools(raws, where);
  if (problems.length) throw configError(problems);
  return pools;
}

/** The non-throwing form of validatePools, for loaders that merge these problems with their own. */
export function checkPools(
  raws: unknown[],
  where?: (index: number) => string | undefined,
): { pools: ResolvedPool[]; problems: string[] } {
  const checks = raws.map((r, i) => checkPool(r, where?.(i)));
  const problems = checks.flatMap((c) => c.problems);

  const byName = new Map<string, number>();
  const duplicates = new Set<PoolCheck>();
  checks.forEach((c, i) => {
    if (c.name === undefined) return;
    const first = byName.get(c.name);
    if (first === undefined) return void byName.set(c.name, i);
    // Both carry the same name, so the earlier one is pointed at by position.
    problems.push(`${c.label}: metadata.name is already used by ${where?.(first) ?? `pools[${first}]`}`);
    duplicates.add(c);
  });

  // Overlap is checked between pools that resolved and are not second copies (often two versions of one
  // pool, which would overlap for no news); a broken pool already has its own message.
  const ok = checks.filter((c): c is PoolCheck & { pool: ResolvedPool } => c.pool !== undefined && !duplicates.has(c));
  for (let i = 0; i < ok.length; i++) {
    for (let j = i + 1; j < ok.length; j++) {
      for (const a of ok[i].pool.families) {
        const b = ok[j].pool.families.find((f) => f.family === a.family);
        if (b && cidrsOverlap(a, b)) {
          const field = `spec.ipv${a.family}.cidr`;
          problems.push(`${ok[j].label}: ${field} ${b.cidr} overlaps ${ok[i].label} ${field} ${a.cidr}`);
        }
      }
    }
  }
  return { pools: problems.length ? [] : ok.map((c) => c.pool), problems };
}

/** Whether `node` may use `pool`: every nodeSelector label matches (the node's zone counts as its zone label). */
export function poolMatchesNode(
  pool: ResolvedPool,
  node: { name: string; zone?: string; labels: Record<string, string> },
): boolean {
  const labels = node.zone === undefined ? node.labels : { ...node.labels, [ZONE_LABEL]: node.zone };
  return Object.entries(pool.nodeSelector).every(([k, v]) => labels[k] === v);
}

export function checkPool(raw: unknown, where?: string): PoolCheck {
  const rawName = isObject(raw) && isObject(raw.metadata) ? raw.metadata.name : undefined;
  const named = typeof rawName === 'string' && rawName !== '' ? `AddressPool ${JSON.stringify(rawName)}` : 'AddressPool (no name)';
  const label = where ? `${where}: ${named}` : named;
  const problems: string[] = [];
  const report: Report = { bad: (msg) => void problems.push(`${label}: ${msg}`), count: () => problems.length };
  const bad = report.bad;
  const result = (): PoolCheck => ({ name: typeof rawName === 'string' ? rawName : undefined, problems, label });

  if (!isObject(raw)) {
    bad(`must be an object, not ${describe(raw)}`);
    return result();
  }
  const must = (field: string, v: unknown, want: string) =>
    bad(v === undefined ? `${field} is missing (must be ${want})` : `${field} ${describe(v)} must be ${want}`);
  if (raw.apiVersion !== API_VERSION) must('apiVersion', raw.apiVersion, API_VERSION);
  if (raw.kind !== 'AddressPool') must('kind', raw.kind, 'AddressPool');
  for (const k of Object.keys(raw)) if (!TOP_FIELDS.has(k)) bad(`unknown field ${k}`);

  if (!isObject(raw.metadata)) bad('metadata must be an object with a name');
  else if (rawName === undefined) bad('metadata.name is missing');
  else if (typeof rawName !== 'string' || rawName.length > 63 || !DNS1123_LABEL.test(rawName)) {
    bad(`metadata.name ${describe(rawName)} must be a DNS-1123 label (lower-case letters, digits and '-', at most 63 characters)`);
  }

  const spec = raw.spec;
  if (!isObject(spec)) {
    bad(spec === undefined ? 'spec is missing' : `spec must be an object, not ${describe(spec)}`);
    return result();
  }
  for (const k of Object.keys(spec)) if (!SPEC_FIELDS.has(k)) bad(`unknown field spec.${k}`);

  let usage: PoolUsage | undefined;
  if (spec.usage === undefined) bad(`spec.usage is missing (one of ${USAGES.join(', ')})`);
  else if (!USAGES.includes(spec.usage as PoolUsage)) bad(`spec.usage ${describe(spec.usage)} must be one of ${USAGES.join(', ')}`);
  else usage = spec.usage as PoolUsage;

  if (spec.ipv4 === undefined && spec.ipv6 === undefined) bad('spec needs ipv4, ipv6 or both');
  const families: ResolvedFamily[] = [];
  for (const family of [4, 6] as const) {
    const f = spec[`ipv${family}`];
    if (f === undefined) continue;
    const r = checkFamily(family, f, usage, report);
    if (r) families.push(r);
  }
  const declared = ([4, 6] as const).filter((f) => spec[`ipv${f}`] !== undefined);
  if (spec.reserved !== undefined) checkReserved(spec.reserved, families, declared, bad);
  const nodeSelector = checkSelector(spec.nodeSelector, spec.zone, bad);

  if (problems.length === 0 && usage) {
    const pool: ResolvedPool = { name: rawName as string, usage, families, nodeSelector, source: raw as unknown as AddressPool };
    return { ...result(), pool };
  }
  return result();
}

function checkFamily(
  family: IpFamily,
  raw: unknown,
  usage: PoolUsage | undefined,
  report: Report,
): ResolvedFamily | undefined {
  const bad = report.bad;
  const field = `spec.ipv${family}`;
  if (!isObject(raw)) {
    bad(`${field} must be an object with a cidr, not ${describe(raw)}`);
    return undefined;
  }
  const before = report.count();
  for (const k of Object.keys(raw)) if (!FAMILY_FIELDS.has(k)) bad(`unknown field ${field}.${k}`);

  const text = raw.cidr;
  if (text === undefined) {
    bad(`${field}.cidr is missing`);
    return undefined;
  }
  const shown = `${field}.cidr ${describe(text)}`;
  const cidr = typeof text === 'string' ? parseCidr(text) : undefined;
  if (!cidr) {
    bad(`${shown} ${whyNotCidr(text, family)}`);
    return undefined;
  }
  if (cidr.family !== family) {
    bad(`${field}.cidr is an IPv${cidr.family} prefix (${text}); put it under spec.ipv${cidr.family}`);
    return undefined;
  }
  if (!cidr.isNetwork) {
    bad(`${shown} is not a network address (did you mean ${formatCidr(family, cidr.base, cidr.prefix)}?)`);
    return undefined;
  }
  // A subnet inside v4-mapped space is an IPv4 subnet written the IPv6 way; say where it belongs.
  if (family === 6 && cidrInside(cidr, V4_MAPPED)) {
    bad(`${shown} is IPv4-mapped (::ffff:0:0/96) space; put IPv4 subnets under spec.ipv4`);
    return undefined;
  }
  for (const [special, what] of SPECIAL[family]) {
    if (cidrsOverlap(cidr, parseCidr(special)!)) {
      bad(`${shown} overlaps ${what} space ${special}, which cannot be handed out`);
      return undefined;
    }
  }

  let blockSize = cidr.prefix;
  const bs = raw.blockSize;
  if (usage === 'pod') {
    const max = MAX_BLOCK_SIZE[family];
    if (cidr.prefix > max) {
      bad(`${shown} is too small for a pod pool (node blocks are at most /${max})`);
    } else if (bs === undefined) {
      blockSize = Math.max(DEFAULT_BLOCK_SIZE[family], cidr.prefix);
    } else if (typeof bs !== 'number' || !Number.isInteger(bs)) {
      bad(`${field}.blockSize ${describe(bs)} must be an integer prefix length`);
    } else if (bs < cidr.prefix || bs > max) {
      bad(`${field}.blockSize ${bs} does not fit the subnet /${cidr.prefix} (must be ${cidr.prefix}..${max})`);
    } else {
      blockSize = bs;
    }
  } else if (usage && bs !== undefined) {
    bad(`${field}.blockSize is not allowed for a ${usage} pool (its addresses are allocated cluster-wide, not in node blocks)`);
  }
  if (report.count() !== before) return undefined;
  return { family, cidr: formatCidr(family, cidr.base, cidr.prefix), base: cidr.base, prefix: cidr.prefix, blockSize, reserved: [] };
}

/** Resolves spec.reserved into each family's sorted ranges; entries must lie inside the pool. */
function checkReserved(
  raw: unknown,
  families: ResolvedFamily[],
  declared: IpFamily[],
  bad: (msg: string) => void,
): void {
  if (!Array.isArray(raw)) {
    bad(`spec.reserved must be a list of addresses or CIDRs, not ${describe(raw)}`);
    return;
  }
  raw.forEach((entry, i) => {
    const shown = `spec.reserved[${i}] ${describe(entry)}`;
    const text = typeof entry === 'string' ? entry.trim() : '';
    let given: { family: IpFamily; base: bigint; prefix: number };
    if (text.includes('/')) {
      const c = parseCidr(text);
      if (!c) return bad(`${shown} is not an address or CIDR`);
      if (!c.isNetwork) return bad(`${shown} is not a network address (did you mean ${formatCidr(c.family, c.base, c.prefix)}?)`);
      given = c;
    } else {
      const ip = parseIp(text);
      if (!ip) return bad(`${shown} is not an address or CIDR`);
      given = { family: ip.family, base: ip.value, prefix: familyBits(ip.family) };
    }
    const family = given.family;
    const f = families.find((x) => x.family === family);
    if (!f) {
      // A declared family is missing only because its cidr was rejected, which has its own message.
      if (!declared.includes(family)) bad(`${shown} lies outside the pool (it has no IPv${family} subnet)`);
      return;
    }
    if (!cidrInside(given, f)) return bad(`${shown} lies outside the pool's ${f.cidr}`);
    f.reserved.push(rangeOf(family, given.base, given.prefix));
  });
  for (const f of families) f.reserved.sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0));
}

/** nodeSelector merged with zone (the shorthand for the zone label); they must not disagree. */
function checkSelector(rawSel: unknown, zone: unknown, bad: (msg: string) => void): Record<string, string> {
  const sel: Record<string, string> = {};
  if (rawSel !== undefined) {
    if (!isObject(rawSel)) bad(`spec.nodeSelector must map label names to values, not ${describe(rawSel)}`);
    else {
      for (const [k, v] of Object.entries(rawSel)) {
        if (!isLabelKey(k)) bad(`spec.nodeSelector key ${JSON.stringify(k)} is not a valid label name`);
        else if (typeof v !== 'string' || !isLabelValue(v)) bad(`spec.nodeSelector.${k} ${describe(v)} is not a valid label value`);
        else sel[k] = v;
      }
    }
  }
  if (zone !== undefined) {
    if (typeof zone !== 'string' || zone === '' || !isLabelValue(zone)) bad(`spec.zone ${describe(zone)} must be a non-empty label value`);
    else if (sel[ZONE_LABEL] !== undefined && sel[ZONE_LABEL] !== zone) {
      bad(`spec.zone "${zone}" contradicts spec.nodeSelector.${ZONE_LABEL} "${sel[ZONE_LABEL]}"`);
    } else sel[ZONE_LABEL] = zone;
  }
  return sel;
}

function whyNotCidr(text: unknown, family: IpFamily): string {
  if (typeof text !== 'string') return `must be a string like ${family === 4 ? '"10.244.0.0/16"' : '"fd00:10:244::/56"'}`;
  const [addr, len, extra] = text.trim().split('/');
  const ip = parseIp(addr);
  if (ip && len === undefined) return `has no prefix length (e.g. "${addr}/${ip.family === 4 ? 16 : 56}")`;
  if (ip && extra === undefined) return `has an invalid prefix length (0..${familyBits(ip.family)})`;
  return `is not an IPv${family} network`;
}

function configError(problems: string[]): TetherError {
  return new TetherError(ErrorCode.InvalidConfig, problems.join('\n'), {
    details: `${problems.length} problem${problems.length === 1 ? '' : 's'}`,
  });
}

/** Collects one pool's problems; count() lets a check tell whether it added any. */
interface Report {
  bad(msg: string): void;
  count(): number;
}
