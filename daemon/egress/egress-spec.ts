// The Egress object (file config now, custom resource later) and its validation. Every problem names the
// Egress and the field; all problems are reported at once; an invalid Egress changes nothing.
// N floating addresses: a count from one pool, a count from each of several pools, or explicit addresses.
// IP families: an Egress steers the families of its addresses (spec.ipFamilies, or what its destinations,
// explicit addresses or pools imply); each family's traffic leaves from an address of its own family.
import { ErrorCode, TetherError } from '../../lib/errors';
import { formatCidr, inSubnet, parseCidr, parseIp, type IpFamily } from '../../lib/ip';
import { API_VERSION, describe, isLabelKey, isLabelValue, isObject } from '../../lib/fields';
import type { ResolvedPool } from '../../ipam/types';
import { OWN_NAMESPACE_ONLY } from '../objects/crds';

export type AnnounceMode = 'l2' | 'routeTable';
export type ZonePolicy = 'any' | 'preferLocalNode' | 'preferZone' | 'requireZone';
export const ZONE_POLICIES: ZonePolicy[] = ['any', 'preferLocalNode', 'preferZone', 'requireZone'];

/**
 * One floating address an Egress asks for: `count` addresses from a pool are slots pool#0..#count-1. `family`
 * is set only for a family other than the pool's first (the one a count drew from before Egresses had
 * families), so the slots, and their owners in the store, of every Egress written before stay as they were.
 */
export type AddressSlot = { pool: string; index: number; family?: IpFamily } | { pool: string; explicit: string };

/** Kubernetes' names of the families (Service.spec.ipFamilies). */
export const FAMILY_NAMES: Record<IpFamily, 'IPv4' | 'IPv6'> = { 4: 'IPv4', 6: 'IPv6' };

/** Pods of the Egress's own namespace (never another: crds.ts) whose labels match all of matchLabels. */
export interface PodSelection {
  /** matchLabels; empty selects every pod of the namespace. */
  matchLabels: Record<string, string>;
}

export interface ResolvedEgress {
  /** "namespace/name" */
  key: string;
  name: string;
  namespace: string;
  clients: PodSelection;
  gateways: PodSelection;
  /** The families the Egress steers, each with addresses of its own (IPv4 first when both). */
  families: IpFamily[];
  /** CIDRs steered through the egress, of its families. */
  destinations: string[];
  /** CIDRs never steered (cluster pod and service ranges, plus spec.excludeDestinations). */
  excluded: string[];
  /**
   * What spec.addresses asks for: counts from pools, or explicit addresses (each with its pool). A count's
   * `family` is set only when it is not the pool's first family (see AddressSlot).
   */
  addresses: Array<{ pool: string; count: number; family?: IpFamily } | { pool: string; explicit: string[] }>;
  /** How clients choose among the addresses (default any). */
  zonePolicy: ZonePolicy;
  /** At most this many of the Egress's addresses on one node (default: no cap). */
  maxAddressesPerNode?: number;
  failover: { intervalMs: number; detectMultiplier: number };
  announce: { mode: AnnounceMode; table?: number };
}

const NAME = /^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$/;
const SPEC_FIELDS = new Set(['clients', 'gateways', 'ipFamilies', 'destinations', 'excludeDestinations', 'addresses', 'zonePolicy', 'maxAddressesPerNode', 'failover', 'announce']);
/** The default destination of each family: everything (less the cluster's ranges, always excluded). */
const EVERYTHING: Record<IpFamily, string> = { 4: '0.0.0.0/0', 6: '::/0' };
const RESERVED_TABLES = new Set([0, 253, 254, 255]);

export interface EgressContext {
  pools: ResolvedPool[];
  /** Service CIDRs of the cluster, excluded from the default destinations. */
  serviceCidrs?: string[];
}

/** Validates one Egress; throws TetherError(InvalidConfig) listing every problem, each naming the field. */
export function validateEgress(raw: unknown, ctx: EgressContext): ResolvedEgress {
  const problems: string[] = [];
  const r = isObject(raw) ? raw : {};
  const meta = isObject(r.metadata) ? r.metadata : {};
  const label = `Egress "${typeof meta.namespace === 'string' ? `${meta.namespace}/` : ''}${typeof meta.name === 'string' ? meta.name : '?'}"`;
  const bad = (msg: string) => problems.push(`${label}: ${msg}`);
  if (!isObject(raw)) bad(`must be an object, not ${describe(raw)}`);
  if (r.apiVersion !== API_VERSION) bad(`apiVersion ${describe(r.apiVersion)} must be "${API_VERSION}"`);
  if (r.kind !== 'Egress') bad(`kind ${describe(r.kind)} must be "Egress"`);
  const name = typeof meta.name === 'string' && NAME.test(meta.name) ? meta.name : (bad(`metadata.name ${describe(meta.name)} must be a DNS-1123 label`), '');
  const namespace =
    typeof meta.namespace === 'string' && NAME.test(meta.namespace) ? meta.namespace : (bad(`metadata.namespace ${describe(meta.namespace)} must be a DNS-1123 label`), '');
  const spec = isObject(r.spec) ? r.spec : (bad('spec: missing or not an object'), {});
  for (const k of Object.keys(spec)) if (!SPEC_FIELDS.has(k)) bad(`spec.${k} is not a field of Egress (fields: ${[...SPEC_FIELDS].join(', ')})`);

  const clients = selection(spec.clients, 'spec.clients', bad);
  const gateways = selection(spec.gateways, 'spec.gateways', bad);
  const floating = ctx.pools.filter((p) => p.usage === 'floating');
  const asked = checkAddresses(spec.addresses, floating, bad);

  const destinations = spec.destinations === undefined ? undefined : cidrList(spec.destinations, 'spec.destinations', bad);
  const extraExcluded = spec.excludeDestinations === undefined ? [] : cidrList(spec.excludeDestinations, 'spec.excludeDestinations', bad);
  if (Array.isArray(spec.destinations) && spec.destinations.length === 0) bad('spec.destinations must not be empty (omit it to mean everything outside the cluster)');
  const families = egressFamilies(spec.ipFamilies, destinations, asked, floating, bad);
  // What made a family the Egress's, for the message when it has no address of it.
  const why = (f: IpFamily) => (spec.ipFamilies !== undefined ? 'spec.ipFamilies' : `spec.destinations ${destinations?.filter((d) => familyOf(d) === f).join(', ')}`);
  const addresses = asked && families.length ? addressesOf(asked, families, floating, why, bad) : undefined;
  destinations?.forEach((d, i) => {
    const f = familyOf(d);
    if (families.length && !families.includes(f)) bad(`spec.destinations[${i}] ${d} is ${FAMILY_NAMES[f]}, but the Egress has no ${FAMILY_NAMES[f]} address (its families: ${families.map((x) => FAMILY_NAMES[x]).join(', ')}): its traffic could leave from no address of its own family`);
  });
  extraExcluded.forEach((d, i) => {
    if (families.length && !families.includes(familyOf(d))) bad(`spec.excludeDestinations[${i}] ${d} is ${FAMILY_NAMES[familyOf(d)]}, which the Egress does not steer`);
  });
  const inFamilies = (c: string) => families.includes(familyOf(c));
  const podRanges = ctx.pools.filter((p) => p.usage === 'pod').flatMap((p) => p.families.map((f) => f.cidr)).filter(inFamilies);

  const zonePolicy = spec.zonePolicy === undefined ? 'any' : ZONE_POLICIES.includes(spec.zonePolicy as ZonePolicy) ? (spec.zonePolicy as ZonePolicy) : (bad(`spec.zonePolicy ${describe(spec.zonePolicy)} must be one of ${ZONE_POLICIES.join(', ')}`), 'any');
  const maxAddressesPerNode = spec.maxAddressesPerNode === undefined ? undefined : intIn(spec.maxAddressesPerNode, 1, 16, 'spec.maxAddressesPerNode', bad);

  const fo = spec.failover === undefined ? {} : isObject(spec.failover) ? spec.failover : (bad('spec.failover must be an object'), {});
  for (const k of Object.keys(fo)) if (k !== 'intervalMs' && k !== 'detectMultiplier') bad(`spec.failover.${k} is not a field (intervalMs, detectMultiplier)`);
  const intervalMs = intIn(fo.intervalMs ?? 50, 10, 10_000, 'spec.failover.intervalMs', bad);
  const detectMultiplier = intIn(fo.detectMultiplier ?? 3, 2, 255, 'spec.failover.detectMultiplier', bad);

  const an = spec.announce === undefined ? { mode: 'l2' } : isObject(spec.announce) ? spec.announce : (bad('spec.announce must be an object'), { mode: 'l2' });
  let announce: ResolvedEgress['announce'] = { mode: 'l2' };
  if (an.mode === 'l2') {
    if (an.table !== undefined) bad('spec.announce.table only applies to mode routeTable');
  } else if (an.mode === 'routeTable') {
    const t = an.table ?? 200;
    if (!Number.isInteger(t) || (t as number) < 1 || (t as number) > 0xfffffffe || RESERVED_TABLES.has(t as number)) {
      bad(`spec.announce.table ${describe(an.table)} must be a routing table id 1..4294967294 other than 253, 254, 255`);
    }
    announce = { mode: 'routeTable', table: t as number };
  } else bad(`spec.announce.mode ${describe(an.mode)} must be "l2" or "routeTable"`);

  if (problems.length) throw new TetherError(ErrorCode.InvalidConfig, problems.join('\n'), { details: `${problems.length} problem(s)` });
  return {
    key: `${namespace}/${name}`,
    name,
    namespace,
    clients,
    gateways,
    families,
    destinations: destinations ?? families.map((f) => EVERYTHING[f]),
    excluded: [...podRanges, ...(ctx.serviceCidrs ?? []).filter(inFamilies), ...extraExcluded],
    addresses: addresses!,
    zonePolicy,
    ...(maxAddressesPerNode !== undefined ? { maxAddressesPerNode } : {}),
    failover: { intervalMs, detectMultiplier },
    announce,
  };
}

function selection(raw: unknown, field: string, bad: (m: string) => void): PodSelection {
  if (!isObject(raw)) {
    bad(`${field} must be an object with podSelector${field === 'spec.gateways' ? ': an Egress without gateways cannot work' : ''}`);
    return { matchLabels: {} };
  }
  for (const k of Object.keys(raw)) if (k !== 'podSelector' && k !== 'namespace') bad(`${field}.${k} is not a field (podSelector)`);
  if (raw.namespace !== undefined) bad(`${field}.namespace: ${OWN_NAMESPACE_ONLY}`);
  const sel = raw.podSelector;
  if (!isObject(sel)) {
    bad(`${field}.podSelector must map label names to values`);
    return { matchLabels: {} };
  }
  const labels = isObject(sel.matchLabels) ? sel.matchLabels : sel;
  const matchLabels: Record<string, string> = {};
  for (const [k, v] of Object.entries(labels)) {
    if (!isLabelKey(k)) bad(`${field}.podSelector key ${JSON.stringify(k)} is not a valid label name`);
    else if (typeof v !== 'string' || !isLabelValue(v)) bad(`${field}.podSelector.${k} ${describe(v)} is not a valid label value`);
    else matchLabels[k] = v;
  }
  if (field === 'spec.gateways' && Object.keys(matchLabels).length === 0) bad(`${field}.podSelector must name at least one label: every pod of the namespace as a gateway is never meant`);
  return { matchLabels };
}

function checkAddresses(raw: unknown, floating: ResolvedPool[], bad: (m: string) => void): AskedAddresses | undefined {
  if (!isObject(raw)) {
    bad('spec.addresses must be an object: {pool, count}, {pools: [{pool, count}]} or {explicit: [...]}');
    return undefined;
  }
  for (const k of Object.keys(raw)) if (!['pool', 'count', 'pools', 'explicit'].includes(k)) bad(`spec.addresses.${k} is not a field (pool, count, pools, explicit)`);
  const forms = ['explicit', 'pools', 'count'].filter((k) => raw[k] !== undefined);
  if (forms.length > 1) bad(`spec.addresses: give one of count, pools, explicit (got ${forms.join(' and ')})`);
  const poolNamed = (name: unknown, field: string): ResolvedPool | undefined => {
    if (typeof name !== 'string' || !name) {
      bad(`${field} must name a floating AddressPool`);
      return undefined;
    }
    const p = floating.find((fp) => fp.name === name);
    if (!p) bad(`${field} "${name}" is not a floating pool (floating pools: ${floating.map((f) => f.name).join(', ') || 'none defined'})`);
    return p;
  };
  if (raw.explicit !== undefined) {
    if (!Array.isArray(raw.explicit) || raw.explicit.length === 0 || raw.explicit.length > 16) {
      bad('spec.addresses.explicit must list 1..16 addresses');
      return undefined;
    }
    const byPool = new Map<string, string[]>();
    raw.explicit.forEach((a, i) => {
      const ip = typeof a === 'string' ? parseIp(a) : undefined;
      if (!ip) return bad(`spec.addresses.explicit[${i}] ${describe(a)} is not an IP address`);
      const p = floating.find((fp) => fp.families.some((f) => inSubnet(ip, f)));
      if (!p) return bad(`spec.addresses.explicit[${i}] ${a} is outside every floating pool (${floating.map((f) => f.name).join(', ') || 'none defined'})`);
      if (raw.pool !== undefined && raw.pool !== p.name) return bad(`spec.addresses.explicit[${i}] ${a} is in pool "${p.name}", not "${String(raw.pool)}"`);
      byPool.set(p.name, [...(byPool.get(p.name) ?? []), a as string]);
    });
    const all = [...byPool.values()].flat();
    if (new Set(all).size !== all.length) bad('spec.addresses.explicit lists an address twice');
    return [...byPool].map(([pool, explicit]) => ({ pool, explicit }));
  }
  if (raw.pools !== undefined) {
    if (!Array.isArray(raw.pools) || raw.pools.length === 0 || raw.pools.length > 16) {
      bad('spec.addresses.pools must list 1..16 {pool, count}');
      return undefined;
    }
    const out: Array<{ pool: string; count: number }> = [];
    raw.pools.forEach((x, i) => {
      if (!isObject(x)) return bad(`spec.addresses.pools[${i}] must be {pool, count}`);
      for (const k of Object.keys(x)) if (k !== 'pool' && k !== 'count') bad(`spec.addresses.pools[${i}].${k} is not a field (pool, count)`);
      const p = poolNamed(x.pool, `spec.addresses.pools[${i}].pool`);
      const count = intIn(x.count ?? 1, 1, 16, `spec.addresses.pools[${i}].count`, bad);
      if (p && out.some((o) => o.pool === p.name)) return bad(`spec.addresses.pools[${i}].pool "${p.name}" is listed twice`);
      if (p) out.push({ pool: p.name, count });
    });
    const total = out.reduce((n, o) => n + o.count, 0);
    if (total > 16) bad(`spec.addresses.pools ask for ${total} addresses; an Egress has at most 16`);
    return out;
  }
  const p = poolNamed(raw.pool, 'spec.addresses.pool');
  const count = intIn(raw.count ?? 1, 1, 16, 'spec.addresses.count', bad);
  return p ? [{ pool: p.name, count }] : undefined;
}

/** The address slots an Egress asks for, each allocated under its own owner so one can come and go alone. */
export function addressSlots(e: Pick<ResolvedEgress, 'addresses'>): AddressSlot[] {
  return e.addresses.flatMap((a): AddressSlot[] =>
    'explicit' in a
      ? a.explicit.map((x) => ({ pool: a.pool, explicit: x }))
      : Array.from({ length: a.count }, (_, index) => (a.family ? { pool: a.pool, index, family: a.family } : { pool: a.pool, index })),
  );
}

/**
 * The allocation owner of a slot in the cluster store: egress/<ns>/<name>#<pool>/<index or address>, and for a
 * count in a pool's second family egress/<ns>/<name>#<pool>/IPv6/<index> (the first family's owners are the
 * ones every release wrote).
 */
export function slotOwner(egressKey: string, s: AddressSlot): string {
  if ('explicit' in s) return `egress/${egressKey}#${s.pool}/${s.explicit}`;
  return `egress/${egressKey}#${s.pool}/${s.family ? `${FAMILY_NAMES[s.family]}/` : ''}${s.index}`;
}

/** The family a slot's address is of, given its pool (undefined: the pool is gone). */
export function slotFamily(s: AddressSlot, pools: ResolvedPool[]): IpFamily | undefined {
  if ('explicit' in s) return parseIp(s.explicit)?.family;
  return s.family ?? pools.find((p) => p.name === s.pool)?.families[0]?.family;
}

type AskedAddresses = Array<{ pool: string; count: number } | { pool: string; explicit: string[] }>;

const familyOf = (cidrOrIp: string): IpFamily => (cidrOrIp.includes(':') ? 6 : 4);

/**
 * The families an Egress steers: spec.ipFamilies when given; else those of its destinations; else those of
 * its explicit addresses; else the first family of each pool it counts from (what a count drew from before
 * Egresses had families, so an Egress written before keeps its one family).
 */
function egressFamilies(raw: unknown, destinations: string[] | undefined, asked: AskedAddresses | undefined, floating: ResolvedPool[], bad: (m: string) => void): IpFamily[] {
  let fams: IpFamily[];
  if (raw !== undefined) {
    const names = Object.entries(FAMILY_NAMES);
    if (!Array.isArray(raw) || raw.length < 1 || raw.length > 2 || raw.some((x) => !names.some(([, n]) => n === x)) || new Set(raw).size !== raw.length) {
      bad(`spec.ipFamilies ${JSON.stringify(raw) ?? describe(raw)} must list IPv4, IPv6 or both, once each`);
      return [];
    }
    fams = raw.map((x) => Number(names.find(([, n]) => n === x)![0]) as IpFamily);
  } else if (destinations?.length) fams = destinations.map(familyOf);
  else if (asked?.some((a) => 'explicit' in a)) fams = asked.flatMap((a) => ('explicit' in a ? a.explicit.map(familyOf) : []));
  else fams = (asked ?? []).flatMap((a) => floating.find((p) => p.name === a.pool)?.families.slice(0, 1).map((f) => f.family) ?? []);
  return ([4, 6] as IpFamily[]).filter((f) => fams.includes(f));
}

/**
 * The counts per family and explicit addresses, checked against the Egress's families: each family has an
 * address, no address is of a family the Egress does not steer.
 */
function addressesOf(asked: AskedAddresses, families: IpFamily[], floating: ResolvedPool[], why: (f: IpFamily) => string, bad: (m: string) => void): ResolvedEgress['addresses'] {
  const out: ResolvedEgress['addresses'] = [];
  const have = new Set<IpFamily>();
  const fams = families.map((f) => FAMILY_NAMES[f]).join(', ');
  for (const a of asked) {
    if ('explicit' in a) {
      const mine = a.explicit.filter((x) => families.includes(familyOf(x)));
      for (const x of a.explicit) if (!mine.includes(x)) bad(`spec.addresses.explicit: ${x} is ${FAMILY_NAMES[familyOf(x)]}, not a family of the Egress (${fams})`);
      mine.forEach((x) => have.add(familyOf(x)));
      if (mine.length) out.push({ pool: a.pool, explicit: mine });
      continue;
    }
    const pool = floating.find((p) => p.name === a.pool)!;
    const poolFams = pool.families.map((f) => f.family);
    const drawn = poolFams.filter((f) => families.includes(f));
    if (!drawn.length) bad(`spec.addresses pool "${a.pool}" has no ${fams} subnet (it has ${poolFams.map((f) => FAMILY_NAMES[f]).join(', ')})`);
    for (const f of drawn) {
      have.add(f);
      out.push(f === poolFams[0] ? { pool: a.pool, count: a.count } : { pool: a.pool, count: a.count, family: f });
    }
  }
  for (const f of families) if (!have.has(f)) bad(`${why(f)}: the Egress steers ${FAMILY_NAMES[f]} but none of its addresses is ${FAMILY_NAMES[f]}`);
  const total = out.reduce((n, o) => n + ('explicit' in o ? o.explicit.length : o.count), 0);
  if (total > 16) bad(`spec.addresses ask for ${total} addresses over ${fams}; an Egress has at most 16`);
  return out;
}

function cidrList(raw: unknown, field: string, bad: (m: string) => void): string[] {
  if (!Array.isArray(raw)) {
    bad(`${field} must be a list of CIDRs`);
    return [];
  }
  const out: string[] = [];
  raw.forEach((c, i) => {
    const p = typeof c === 'string' ? parseCidr(c) : undefined;
    if (!p) return bad(`${field}[${i}] ${describe(c)} is not a CIDR like "203.0.113.0/24" or "2001:db8::/32"`);
    if (!p.isNetwork) return bad(`${field}[${i}] ${c} is not a network address (did you mean ${formatCidr(p.family, p.base, p.prefix)}?)`);
    out.push(formatCidr(p.family, p.base, p.prefix));
  });
  return out;
}

function intIn(v: unknown, lo: number, hi: number, field: string, bad: (m: string) => void): number {
  if (!Number.isInteger(v) || (v as number) < lo || (v as number) > hi) {
    bad(`${field} ${describe(v)} must be an integer ${lo}..${hi}`);
    return lo;
  }
  return v as number;
}
