// What a tether load balancer is, read from the objects kubectl users already write: a Service of type
// LoadBalancer whose spec.loadBalancerClass is tether's, its EndpointSlices (the targets), and a few
// annotations for what the Service has no field for. The same objects come from a file or from the API.
//
//   lb.tether.dev/lb-pods            label selector of the LB pods ("k=v,k2=v2"; default tether.dev/role=lb)
//   lb.tether.dev/lb-pods-namespace  their namespace (default: the Service's)
//   lb.tether.dev/affinity           client (default: one target per client address) or flow (per 5-tuple)
//   lb.tether.dev/pool               the loadBalancer AddressPool to take the VIPs from (default: per family,
//                                    the first pool that has it)
//   lb.tether.dev/vip                requested VIPs, one per family, comma-separated (spec.loadBalancerIP,
//                                    deprecated upstream, also works for one)
//   lb.tether.dev/idle-timeout       seconds a mapping lives unused, when sessionAffinity is not ClientIP
//
// IP families, as Kubernetes defines them (spec.ipFamilyPolicy, spec.ipFamilies; familiesOf() below says
// which API-server rule each step follows): a Service is resolved into one ResolvedLoadBalancer per family it
// is given, each with its own VIP, its own key and its own targets (the EndpointSlices of that addressType).
// Keys and VIP owners: the IPv4 VIP keeps the key every release before had ("<ns>/<name>", owner
// "lb/<ns>/<name>", and every store key and record derived from it), wherever IPv4 stands in ipFamilies:
// releases before took the VIP from the pool's first family, which is IPv4 in every pool that has one, so
// what they allocated and recorded is the IPv4 VIP's. The IPv6 VIP is "<ns>/<name>#IPv6" (owner
// "lb/<ns>/<name>#IPv6"), a key no earlier release reads or writes.
//
// The VIP the Service was given, as its status records it (status.loadBalancer.ingress[].ip, written by
// tether-operator from the store's allocation), is read too: a node that newly needs the VIP while the
// store is unreachable serves it from there, and confirms it with the store once it is back.
//
// sessionAffinity ClientIP's timeoutSeconds is the mapping's idle timeout. Every problem names the Service
// and the field; a Service with problems programs nothing, in any family (its status says why).
import { isObject, isLabelKey, isLabelValue } from '../../lib/fields';
import { canonicalIp, inSubnet, ipFamily, parseIp, type IpFamily } from '../../lib/ip';
import type { ResolvedPool } from '../../ipam/types';
import { PROTO, type Protocol } from '../bpf/lb-structs';
import { isTetherService, SERVICE_NAME_LABEL } from '../objects/names';

export const ANNOTATION = {
  lbPods: 'lb.tether.dev/lb-pods',
  lbPodsNamespace: 'lb.tether.dev/lb-pods-namespace',
  affinity: 'lb.tether.dev/affinity',
  pool: 'lb.tether.dev/pool',
  vip: 'lb.tether.dev/vip',
  idleTimeout: 'lb.tether.dev/idle-timeout',
} as const;
export const DEFAULT_LB_POD_LABELS = { 'tether.dev/role': 'lb' };
/** Kubernetes' default for sessionAffinityConfig.clientIP.timeoutSeconds. */
export const DEFAULT_IDLE_TIMEOUT_S = 10800;

export type TargetState = 'active' | 'terminating';

export interface LbTarget {
  address: string;
  state: TargetState;
  node?: string;
  /** targetRef namespace/name when given (a Pod). */
  pod?: string;
}

/** Kubernetes' names of the IP families (Service spec.ipFamilies, EndpointSlice addressType). */
export type FamilyName = 'IPv4' | 'IPv6';
export const FAMILY_NAME: Record<IpFamily, FamilyName> = { 4: 'IPv4', 6: 'IPv6' };
const FAMILY_NUMBER: Record<FamilyName, IpFamily> = { IPv4: 4, IPv6: 6 };

/**
 * The VIP families this release's datapath programs: THE gate of a VIP family. resolveLoadBalancers applies
 * it to every resolution, the nodes' (LbController) and tether-operator's (LbView) alike, so a VIP of a
 * family not listed is never allocated, routed, slotted, announced, set up on a target nor listed in the
 * Service's status (nothing half-programmed); the Service's status names it instead ("IPv6 VIPs are not
 * programmed by this release's datapath yet"), and its other family is served. Both families since IPv6
 * VIPs were wired to the eBPF datapath (FoU in outer IPv6 from the node's IPv6 address, --node-address-6);
 * a release before listed IPv4 only, and its nodes pass an IPv6 VIP's entries over.
 */
export const DATAPATH_FAMILIES: readonly FamilyName[] = ['IPv4', 'IPv6'];

export type IpFamilyPolicy = 'SingleStack' | 'PreferDualStack' | 'RequireDualStack';
const POLICIES: readonly IpFamilyPolicy[] = ['SingleStack', 'PreferDualStack', 'RequireDualStack'];

/**
 * The key of a Service's VIP of one family: the IPv4 VIP's is the Service's own "<ns>/<name>" (the key and
 * allocation owner of every release before), the IPv6 VIP's "<ns>/<name>#IPv6".
 */
export function familyKey(service: string, family: FamilyName): string {
  return family === 'IPv4' ? service : `${service}#${family}`;
}

export interface ResolvedLoadBalancer {
  /** The VIP's key: "namespace/name" of the Service for its IPv4 VIP, "namespace/name#IPv6" for its IPv6 VIP (familyKey). */
  key: string;
  /** "namespace/name" of the Service. */
  service: string;
  namespace: string;
  name: string;
  /** The VIP's family; its targets are of the same family. */
  family: FamilyName;
  /** The Service's families, in its order (spec.ipFamilies as the API server defaults it): its status lists its VIPs so. */
  ipFamilies: FamilyName[];
  ports: Array<{ port: number; protocol: Protocol; proto: number; name?: string }>;
  lbPods: { namespace: string; matchLabels: Record<string, string> };
  affinity: 'client' | 'flow';
  idleTimeoutS: number;
  /**
   * Where the VIP comes from: a requested address (with the pool holding it) or a pool; `recorded`: the
   * address the Service's status names (in that pool, of this family, and the requested one if any), not authoritative.
   */
  vip: { pool: string; address?: string; recorded?: string };
  /** Targets by address: ready ones are active (terminating or not); not ready but serving while terminating ones keep their clients. */
  targets: LbTarget[];
  externalTrafficPolicy: 'Cluster' | 'Local';
  /** With Local: the node port answering health checks (kube-proxy's contract). */
  healthCheckNodePort?: number;
}

export interface LbResolution {
  /** The VIPs of tether Services that are valid, one per family served, each Service's in its ipFamilies order. */
  loadBalancers: ResolvedLoadBalancer[];
  /** Services of tether's class that are not valid (by Service key), with every reason: nothing of them is served. */
  refused: Array<{ key: string; problems: string[] }>;
  /**
   * Families of valid Services that are not served, by Service key, with why: PreferDualStack without a pool
   * of the family, or a family this release's datapath does not program (DATAPATH_FAMILIES). A
   * Service all of whose families are here is served in none (its status says why).
   */
  unserved?: Array<{ key: string; family: FamilyName; why: string }>;
}

function meta(o: Record<string, unknown>): { name: string; namespace: string; labels: Record<string, string>; annotations: Record<string, string> } {
  const m = isObject(o.metadata) ? o.metadata : {};
  return {
    name: typeof m.name === 'string' ? m.name : '',
    namespace: typeof m.namespace === 'string' ? m.namespace : 'default',
    labels: (isObject(m.labels) ? m.labels : {}) as Record<string, string>,
    annotations: (isObject(m.annotations) ? m.annotations : {}) as Record<string, string>,
  };
}

/** "k=v,k2=v2" as matchLabels; throws naming the bad part. */
export function parseSelector(text: string): Record<string, string> {
  const out: Record<string, string> = {};
  for (const part of text.split(',').map((p) => p.trim()).filter(Boolean)) {
    const eq = part.indexOf('=');
    if (eq <= 0) throw new Error(`"${part}" is not key=value`);
    const k = part.slice(0, eq).trim();
    const v = part.slice(eq + 1).replace(/^=/, '').trim();
    if (!isLabelKey(k)) throw new Error(`"${k}" is not a label key`);
    if (!isLabelValue(v)) throw new Error(`"${v}" is not a label value`);
    out[k] = v;
  }
  if (Object.keys(out).length === 0) throw new Error('is empty (it would select every pod)');
  return out;
}

function poolHolding(pools: ResolvedPool[], address: string): ResolvedPool | undefined {
  const ip = parseIp(address);
  if (!ip) return undefined;
  return pools.find((p) => p.families.some((f) => inSubnet(ip, f)));
}

/** Resolves every tether Service of `objects` with its EndpointSlices, one VIP per family it is given. */
export function resolveLoadBalancers(objects: Array<Record<string, unknown>>, pools: ResolvedPool[], opts: { datapathFamilies?: readonly FamilyName[] } = {}): LbResolution {
  const lbPools = pools.filter((p) => p.usage === 'loadBalancer');
  const programmed = opts.datapathFamilies ?? DATAPATH_FAMILIES;
  const slices = new Map<string, Array<Record<string, unknown>>>();
  for (const o of objects) {
    if (o.kind !== 'EndpointSlice') continue;
    const m = meta(o);
    const svc = m.labels[SERVICE_NAME_LABEL];
    if (!svc) continue;
    const k = `${m.namespace}/${svc}`;
    slices.set(k, [...(slices.get(k) ?? []), o]);
  }
  const out: LbResolution = { loadBalancers: [], refused: [], unserved: [] };
  for (const o of objects) {
    if (!isTetherService(o)) continue;
    const m = meta(o);
    const key = `${m.namespace}/${m.name}`;
    const problems: string[] = [];
    const r = resolveOne(o, key, slices.get(key) ?? [], lbPools, problems);
    const hc = r?.vips[0]?.healthCheckNodePort;
    const holder = hc !== undefined ? out.loadBalancers.find((l) => l.healthCheckNodePort === hc) : undefined;
    if (holder) problems.push(`spec.healthCheckNodePort: ${hc} is already the health-check port of Service ${holder.service}`);
    if (problems.length || !r) {
      out.refused.push({ key, problems });
      continue;
    }
    out.unserved!.push(...r.unserved);
    for (const lb of r.vips) {
      // The one gate of the families the datapath programs: a VIP of another family is neither allocated,
      // nor routed, nor set up on any pod — not half-programmed — and its Service's status says so.
      if (programmed.includes(lb.family)) out.loadBalancers.push(lb);
      else out.unserved!.push({ key, family: lb.family, why: notProgrammed(lb.family, r.vips.filter((v) => programmed.includes(v.family)).map((v) => v.family)) });
    }
  }
  return out;
}

function notProgrammed(family: FamilyName, served: FamilyName[]): string {
  return `${family} VIPs are not programmed by this release's datapath yet${served.length ? `; served in ${served.join(' and ')} only` : ''}`;
}

/**
 * The Service's families and each family's VIP source, by the API server's rules for a Service it creates
 * (kubernetes pkg/registry/core/service/storage alloc.go initIPFamilyFields, and pkg/apis/core/validation
 * ValidateServiceClusterIPsRelatedFields), with "the cluster's service CIDRs" read as the loadBalancer
 * pools the Service may take its VIPs from (the named pool, else every loadBalancer pool) and the requested
 * VIPs standing for clusterIPs:
 *  - no ipFamilyPolicy: SingleStack (a created Service without a policy; LoadBalancer Services are never
 *    headless-and-selectorless, alloc.go's one exception);
 *  - ipFamilyPolicy must be one of the three, ipFamilies must name IPv4 or IPv6, each once, at most two
 *    (validation: NotSupported, Duplicate, "may specify no more than 2");
 *  - SingleStack with two families or two requested VIPs is refused ("must be 'RequireDualStack' or
 *    'PreferDualStack' when multiple IP families are specified");
 *  - ipFamilies left out are inferred from the requested VIPs in their order (as from clusterIPs), else the
 *    cluster's default family, the first family of the pool (the named one, else the first loadBalancer
 *    pool: the family releases before allocated from);
 *  - a requested VIP of a family ipFamilies does not list is refused (ipFamilies[i] must match clusterIPs[i]);
 *  - a family no pool has is refused ("not configured on this cluster"), RequireDualStack without both is
 *    refused ("this cluster is not configured for dual-stack services");
 *  - PreferDualStack and RequireDualStack with one family get the other appended when the pools have both.
 * One exception, PreferDualStack: the API server fills its ipFamilies from the cluster's service CIDRs,
 * which tether's pools need not match, so a family of it that no pool has is not served (reported), not
 * refused, as long as one family is served.
 */
function familiesOf(
  spec: Record<string, unknown>, key: string, requested: Map<IpFamily, { address: string; field: string; index: number }>, requestedCount: number,
  poolName: string | undefined, lbPools: ResolvedPool[], bad: (field: string, msg: string) => void,
): { ipFamilies: FamilyName[]; families: FamilyName[]; unserved: Array<{ family: FamilyName; why: string }> } | undefined {
  // Problems found here, counted: the API server stops at the first group of them, and so does this.
  let failed = 0;
  const fail = (field: string, msg: string) => {
    failed++;
    bad(field, msg);
  };
  let policy: IpFamilyPolicy = 'SingleStack';
  if (spec.ipFamilyPolicy !== undefined && spec.ipFamilyPolicy !== null) {
    if (!POLICIES.includes(spec.ipFamilyPolicy as IpFamilyPolicy)) fail('spec.ipFamilyPolicy', `${JSON.stringify(spec.ipFamilyPolicy)} is not supported (SingleStack, PreferDualStack or RequireDualStack)`);
    else policy = spec.ipFamilyPolicy as IpFamilyPolicy;
  }
  let given: FamilyName[] = [];
  if (spec.ipFamilies !== undefined && spec.ipFamilies !== null) {
    if (!Array.isArray(spec.ipFamilies)) fail('spec.ipFamilies', `${JSON.stringify(spec.ipFamilies)} must be a list of IPv4, IPv6 or both`);
    else {
      spec.ipFamilies.forEach((f, i) => {
        if (f !== 'IPv4' && f !== 'IPv6') return void fail(`spec.ipFamilies[${i}]`, `${JSON.stringify(f)} is not supported (IPv4 or IPv6)`);
        if (given.includes(f)) return void fail(`spec.ipFamilies[${i}]`, `${f} is listed twice (Duplicate value)`);
        given.push(f);
      });
      if (spec.ipFamilies.length > 2) fail('spec.ipFamilies', `may specify no more than 2 ipFamilies, got ${spec.ipFamilies.length}`);
    }
  }
  if (policy === 'SingleStack' && given.length === 2) fail('spec.ipFamilyPolicy', `must be 'RequireDualStack' or 'PreferDualStack' when multiple IP families are specified (spec.ipFamilies ${given.join(', ')})`);
  const vipField = [...requested.values()][0]?.field ?? `metadata.annotations["${ANNOTATION.vip}"]`;
  if (policy === 'SingleStack' && requestedCount === 2) fail('spec.ipFamilyPolicy', `must be 'RequireDualStack' or 'PreferDualStack' when ${vipField} requests a VIP in each family`);
  for (const r of requested.values()) {
    const f = FAMILY_NAME[ipFamily(r.address) as IpFamily];
    if (given.length && !given.includes(f)) fail(r.field, `${r.address} is an ${f} address, and spec.ipFamilies (${given.join(', ')}) does not list ${f}`);
  }
  if (failed) return undefined;

  // The families the Service may have VIPs of: its named pool's, else every loadBalancer pool's.
  const candidates = poolName !== undefined ? lbPools.filter((p) => p.name === poolName) : lbPools;
  const has = (f: FamilyName) => candidates.some((p) => p.families.some((x) => x.family === FAMILY_NUMBER[f]));
  const where = (f: FamilyName) => (poolName !== undefined ? `pool "${poolName}" has no ${f} subnet` : `no loadBalancer AddressPool has an ${f} subnet`);
  const defaultFamily = candidates[0]?.families[0] ? FAMILY_NAME[candidates[0].families[0].family] : undefined;
  if (!given.length) given = [...requested.values()].sort((x, y) => x.index - y.index).map((r) => FAMILY_NAME[ipFamily(r.address) as IpFamily]);
  if (!given.length && defaultFamily) given = [defaultFamily];
  const other = (f: FamilyName): FamilyName => (f === 'IPv4' ? 'IPv6' : 'IPv4');
  if (policy !== 'SingleStack' && given.length === 1 && has(other(given[0]))) given.push(other(given[0]));

  if (policy === 'RequireDualStack') {
    const missing = (['IPv4', 'IPv6'] as const).filter((f) => !has(f));
    for (const f of missing) fail('spec.ipFamilyPolicy', `RequireDualStack: Service ${key} needs an ${f} VIP, and ${where(f)}`);
    if (missing.length) return undefined;
  }
  const unserved: Array<{ family: FamilyName; why: string }> = [];
  const families: FamilyName[] = [];
  given.forEach((f, i) => {
    // A requested VIP of a family no pool has is refused where it is read (naming the address and the pools).
    if (has(f) || requested.has(FAMILY_NUMBER[f])) return void families.push(f);
    if (policy === 'PreferDualStack') unserved.push({ family: f, why: `spec.ipFamilyPolicy PreferDualStack: no ${f} VIP, ${where(f)}` });
    else fail(spec.ipFamilies ? `spec.ipFamilies[${i}]` : 'spec.ipFamilies', `${f}: Service ${key} needs an ${f} VIP, and ${where(f)}`);
  });
  if (failed) return undefined;
  if (!families.length) {
    fail('spec.ipFamilies', `Service ${key} has no family a loadBalancer pool serves (${given.map((f) => `${f}: ${where(f)}`).join('; ') || 'no loadBalancer AddressPool exists'})`);
    return undefined;
  }
  for (const u of unserved) u.why += `; served in ${families.join(' and ')} only`;
  return { ipFamilies: given, families, unserved };
}

/** One Service resolved: a VIP per family served, and the families not served with why. */
interface ResolvedService {
  vips: ResolvedLoadBalancer[];
  unserved: Array<{ key: string; family: FamilyName; why: string }>;
}

function resolveOne(o: Record<string, unknown>, key: string, slices: Array<Record<string, unknown>>, lbPools: ResolvedPool[], problems: string[]): ResolvedService | undefined {
  const m = meta(o);
  const spec = (isObject(o.spec) ? o.spec : {}) as Record<string, unknown>;
  const a = m.annotations;
  const bad = (field: string, msg: string) => problems.push(`${field}: ${msg}`);

  // Ports: TCP and UDP; the target answers from the VIP and the same port (DSR), so no port translation.
  const ports: ResolvedLoadBalancer['ports'] = [];
  const seen = new Map<string, number>();
  const rawPorts = Array.isArray(spec.ports) ? spec.ports : [];
  if (rawPorts.length === 0) bad('spec.ports', 'a load balancer needs at least one port');
  rawPorts.forEach((p, i) => {
    if (!isObject(p)) return;
    const protocol = (typeof p.protocol === 'string' ? p.protocol : 'TCP') as string;
    const port = p.port as number;
    if (protocol !== 'TCP' && protocol !== 'UDP') return void bad(`spec.ports[${i}].protocol`, `${protocol} is not supported (TCP or UDP)`);
    if (p.targetPort !== undefined && p.targetPort !== port) {
      bad(`spec.ports[${i}].targetPort`, `${JSON.stringify(p.targetPort)} must equal port ${port} (or be left out): targets answer clients directly from the VIP and port`);
    }
    const k = `${protocol}/${port}`;
    const first = seen.get(k);
    if (first !== undefined) return void bad(`spec.ports[${i}]`, `${protocol} port ${port} clashes with spec.ports[${first}] on the same VIP`);
    seen.set(k, i);
    ports.push({ port, protocol: protocol as Protocol, proto: PROTO[protocol as Protocol], ...(typeof p.name === 'string' ? { name: p.name } : {}) });
  });

  let matchLabels: Record<string, string> = DEFAULT_LB_POD_LABELS;
  if (a[ANNOTATION.lbPods] !== undefined) {
    try {
      matchLabels = parseSelector(String(a[ANNOTATION.lbPods]));
    } catch (e) {
      bad(`metadata.annotations["${ANNOTATION.lbPods}"]`, (e as Error).message);
    }
  }
  const lbNs = a[ANNOTATION.lbPodsNamespace] ?? m.namespace;

  const aff = a[ANNOTATION.affinity] ?? 'client';
  if (aff !== 'client' && aff !== 'flow') bad(`metadata.annotations["${ANNOTATION.affinity}"]`, `"${aff}" must be client or flow`);

  let idleTimeoutS = DEFAULT_IDLE_TIMEOUT_S;
  const sac = isObject(spec.sessionAffinityConfig) && isObject(spec.sessionAffinityConfig.clientIP) ? spec.sessionAffinityConfig.clientIP : {};
  if (spec.sessionAffinity === 'ClientIP' && typeof sac.timeoutSeconds === 'number') idleTimeoutS = sac.timeoutSeconds;
  else if (a[ANNOTATION.idleTimeout] !== undefined) {
    const n = Number(a[ANNOTATION.idleTimeout]);
    if (!Number.isInteger(n) || n < 1 || n > 86400) bad(`metadata.annotations["${ANNOTATION.idleTimeout}"]`, `"${a[ANNOTATION.idleTimeout]}" must be whole seconds 1..86400`);
    else idleTimeoutS = n;
  }

  // The VIPs: requested (annotation, one address per family, or spec.loadBalancerIP) inside a loadBalancer
  // pool, or from a pool; one per family the Service is given (familiesOf).
  const poolName = a[ANNOTATION.pool];
  const fromAnnotation = a[ANNOTATION.vip] !== undefined;
  const vipField = fromAnnotation ? `metadata.annotations["${ANNOTATION.vip}"]` : 'spec.loadBalancerIP';
  const requestedText = fromAnnotation ? String(a[ANNOTATION.vip]) : typeof spec.loadBalancerIP === 'string' && spec.loadBalancerIP ? spec.loadBalancerIP : undefined;
  const requested = new Map<IpFamily, { address: string; field: string; index: number }>();
  let requestedCount = 0;
  let requestOk = true;
  if (requestedText !== undefined) {
    const parts = fromAnnotation ? requestedText.split(',').map((x) => x.trim()) : [requestedText];
    if (parts.length > 2 || (!fromAnnotation && parts.length > 1)) {
      bad(vipField, `"${requestedText}" lists ${parts.length} addresses: at most one per family (IPv4, IPv6)`);
      requestOk = false;
    }
    parts.forEach((text, index) => {
      const f = ipFamily(text);
      if (!f || text.includes('%')) {
        requestOk = false;
        return void bad(vipField, `"${text}" is not an IPv4 or IPv6 address`);
      }
      if (requested.has(f)) {
        requestOk = false;
        return void bad(vipField, `"${requestedText}" lists two ${FAMILY_NAME[f]} addresses: at most one per family`);
      }
      requested.set(f, { address: canonicalIp(text), field: vipField, index });
      requestedCount++;
    });
  }
  if (poolName !== undefined && lbPools.length && !lbPools.some((p) => p.name === poolName)) {
    bad(`metadata.annotations["${ANNOTATION.pool}"]`, `"${poolName}" is not a loadBalancer AddressPool (${lbPools.map((p) => p.name).join(', ')})`);
    requestOk = false;
  }
  const vips = new Map<FamilyName, ResolvedLoadBalancer['vip']>();
  let families: ReturnType<typeof familiesOf> = undefined;
  if (lbPools.length === 0) bad('VIP', 'no AddressPool with usage loadBalancer exists');
  else if (requestOk) families = familiesOf(spec, key, requested, requestedCount, poolName, lbPools, bad);
  if (families) {
    for (const fam of families.families) {
      const n = FAMILY_NUMBER[fam];
      const r = requested.get(n);
      if (r) {
        const named = poolName !== undefined ? lbPools.find((p) => p.name === poolName) : undefined;
        const holder = poolHolding(lbPools, r.address);
        if (named && !named.families.some((f) => f.family === n)) bad(r.field, `${r.address} is an ${fam} address, and pool "${named.name}" has no ${fam} subnet (${named.families.map((f) => f.cidr).join(', ')})`);
        else if (!holder) bad(r.field, `${r.address} is outside every loadBalancer pool (${lbPools.map((p) => `${p.name} ${p.families.map((f) => f.cidr).join(',')}`).join('; ')})`);
        else if (named && named.name !== holder.name) bad(r.field, `${r.address} is in pool "${holder.name}", not in the requested pool "${named.name}"`);
        else vips.set(fam, { pool: holder.name, address: r.address });
      } else {
        // The named pool, else the first loadBalancer pool with the family (for IPv4 the first pool, as
        // releases before chose, whenever that pool has IPv4).
        const pool = poolName ?? lbPools.find((p) => p.families.some((f) => f.family === n))!.name;
        vips.set(fam, { pool });
      }
    }
  }

  // Targets from the EndpointSlices, read as kube-proxy reads them (pkg/proxy endpointslicecache.go): an
  // endpoint is its first address (the API makes its addresses fungible: "clients may choose to only use
  // the first element"); a VIP's targets are the endpoints of the slices of its family (addressType IPv4 or
  // IPv6; FQDN slices are not targets), as each of kube-proxy's per-family proxiers reads only its own;
  // ready (the condition, absent = true) → active, terminating or not (publishNotReadyAddresses keeps a
  // terminating pod ready, and kube-proxy sends it new connections); not ready but serving while
  // terminating → keeps its clients; anything else is not a target. An address listed twice (in any
  // spelling: IPv6 text is taken in its canonical form) counts once (the better state).
  const targetsOf = (fam: FamilyName): LbTarget[] => {
    const targets = new Map<string, LbTarget>();
    for (const s of slices) {
      if (s.addressType !== fam) continue;
      for (const ep of Array.isArray(s.endpoints) ? s.endpoints : []) {
        if (!isObject(ep)) continue;
        const c = isObject(ep.conditions) ? ep.conditions : {};
        const terminating = c.terminating === true;
        const ready = c.ready !== false;
        const serving = c.serving ?? ready;
        const state: TargetState | undefined = ready ? 'active' : terminating && serving ? 'terminating' : undefined;
        if (!state) continue;
        const text = Array.isArray(ep.addresses) ? ep.addresses[0] : undefined;
        if (typeof text !== 'string' || text.includes('%') || ipFamily(text) !== FAMILY_NUMBER[fam]) continue;
        const addr = canonicalIp(text);
        const ref = isObject(ep.targetRef) && ep.targetRef.kind === 'Pod' ? `${String(ep.targetRef.namespace ?? m.namespace)}/${String(ep.targetRef.name)}` : undefined;
        const prev = targets.get(addr);
        if (prev?.state === 'active') continue;
        targets.set(addr, { address: addr, state, ...(typeof ep.nodeName === 'string' ? { node: ep.nodeName } : {}), ...(ref ? { pod: ref } : {}) });
      }
    }
    return [...targets.values()].sort((x, y) => (x.address < y.address ? -1 : 1));
  };

  // Local traffic policy: external load balancers probe each node's health-check port. In a cluster the API
  // server allocates it; in a file it is given.
  let healthCheckNodePort: number | undefined;
  if (spec.externalTrafficPolicy === 'Local') {
    const hc = spec.healthCheckNodePort;
    if (typeof hc !== 'number' || !Number.isInteger(hc) || hc < 1 || hc > 65535) bad('spec.healthCheckNodePort', `${JSON.stringify(hc)}: externalTrafficPolicy Local needs a health-check port 1..65535`);
    else healthCheckNodePort = hc;
  }

  // The status is the store's allocation as last recorded: ignored (not a problem) when it does not fit.
  const status = isObject(o.status) && isObject(o.status.loadBalancer) ? o.status.loadBalancer : {};
  const ingress = (Array.isArray(status.ingress) ? status.ingress : []).map((i) => (isObject(i) && typeof i.ip === 'string' ? i.ip : undefined));
  for (const [fam, vip] of vips) {
    const recorded = ingress.find((ip) => ip !== undefined && ipFamily(ip) === FAMILY_NUMBER[fam] && poolHolding(lbPools, ip)?.name === vip.pool && (vip.address === undefined || vip.address === canonicalIp(ip)));
    if (recorded) vip.recorded = canonicalIp(recorded);
  }

  if (problems.length || !vips.size || !families) return undefined;
  const ipFamilies = families.ipFamilies;
  return {
    vips: [...vips].map(([family, vip]) => ({
      key: familyKey(key, family), service: key, namespace: m.namespace, name: m.name, family, ipFamilies, ports,
      lbPods: { namespace: lbNs, matchLabels },
      affinity: aff as 'client' | 'flow',
      idleTimeoutS, vip,
      targets: targetsOf(family),
      externalTrafficPolicy: spec.externalTrafficPolicy === 'Local' ? 'Local' : 'Cluster',
      ...(healthCheckNodePort !== undefined ? { healthCheckNodePort } : {}),
    })),
    unserved: families.unserved.map((u) => ({ key, ...u })),
  };
}
