// What a tether load balancer is, read from the objects kubectl users already write: a Service of type
// LoadBalancer whose spec.loadBalancerClass is tether's, its EndpointSlices (the targets), and a few
// annotations for what the Service has no field for. The same objects come from a file or from the API.
//
//   lb.tether.dev/lb-pods            label selector of the LB pods ("k=v,k2=v2"; default tether.dev/role=lb)
//   lb.tether.dev/lb-pods-namespace  their namespace (default: the Service's)
//   lb.tether.dev/affinity           client (default: one target per client address) or flow (per 5-tuple)
//   lb.tether.dev/pool               the loadBalancer AddressPool to take the VIP from (default: the first)
//   lb.tether.dev/vip                a requested VIP (spec.loadBalancerIP, deprecated upstream, also works)
//   lb.tether.dev/idle-timeout       seconds a mapping lives unused, when sessionAffinity is not ClientIP
//
// The VIP the Service was given, as its status records it (status.loadBalancer.ingress[].ip, written by
// tether-operator from the store's allocation), is read too: a node that newly needs the VIP while the
// store is unreachable serves it from there, and confirms it with the store once it is back.
//
// sessionAffinity ClientIP's timeoutSeconds is the mapping's idle timeout. Every problem names the Service
// and the field; a Service with problems programs nothing (its status says why).
import { isIPv4 } from 'node:net';
import { isObject, isLabelKey, isLabelValue } from '../../lib/fields';
import { inSubnet, parseIp } from '../../lib/ip';
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

export interface ResolvedLoadBalancer {
  /** "namespace/name" of the Service. */
  key: string;
  namespace: string;
  name: string;
  ports: Array<{ port: number; protocol: Protocol; proto: number; name?: string }>;
  lbPods: { namespace: string; matchLabels: Record<string, string> };
  affinity: 'client' | 'flow';
  idleTimeoutS: number;
  /**
   * Where the VIP comes from: a requested address (with the pool holding it) or a pool; `recorded`: the
   * address the Service's status names (in that pool, and the requested one if any), not authoritative.
   */
  vip: { pool: string; address?: string; recorded?: string };
  /** Targets by address: ready ones are active (terminating or not); not ready but serving while terminating ones keep their clients. */
  targets: LbTarget[];
  externalTrafficPolicy: 'Cluster' | 'Local';
  /** With Local: the node port answering health checks (kube-proxy's contract). */
  healthCheckNodePort?: number;
}

export interface LbResolution {
  /** Services of tether's class that are valid. */
  loadBalancers: ResolvedLoadBalancer[];
  /** Services of tether's class that are not, with every reason. */
  refused: Array<{ key: string; problems: string[] }>;
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

/** Resolves every tether Service of `objects` with its EndpointSlices. */
export function resolveLoadBalancers(objects: Array<Record<string, unknown>>, pools: ResolvedPool[]): LbResolution {
  const lbPools = pools.filter((p) => p.usage === 'loadBalancer');
  const slices = new Map<string, Array<Record<string, unknown>>>();
  for (const o of objects) {
    if (o.kind !== 'EndpointSlice') continue;
    const m = meta(o);
    const svc = m.labels[SERVICE_NAME_LABEL];
    if (!svc) continue;
    const k = `${m.namespace}/${svc}`;
    slices.set(k, [...(slices.get(k) ?? []), o]);
  }
  const out: LbResolution = { loadBalancers: [], refused: [] };
  for (const o of objects) {
    if (!isTetherService(o)) continue;
    const m = meta(o);
    const key = `${m.namespace}/${m.name}`;
    const problems: string[] = [];
    const r = resolveOne(o, key, slices.get(key) ?? [], lbPools, problems);
    const holder = r?.healthCheckNodePort !== undefined ? out.loadBalancers.find((l) => l.healthCheckNodePort === r.healthCheckNodePort) : undefined;
    if (holder) problems.push(`spec.healthCheckNodePort: ${r!.healthCheckNodePort} is already the health-check port of Service ${holder.key}`);
    if (problems.length || !r) out.refused.push({ key, problems });
    else out.loadBalancers.push(r);
  }
  return out;
}

function resolveOne(o: Record<string, unknown>, key: string, slices: Array<Record<string, unknown>>, lbPools: ResolvedPool[], problems: string[]): ResolvedLoadBalancer | undefined {
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

  // The VIP: requested (annotation or spec.loadBalancerIP) inside a loadBalancer pool, or from a pool.
  let vip: ResolvedLoadBalancer['vip'] | undefined;
  const requested = a[ANNOTATION.vip] ?? (typeof spec.loadBalancerIP === 'string' && spec.loadBalancerIP ? spec.loadBalancerIP : undefined);
  const poolName = a[ANNOTATION.pool];
  if (lbPools.length === 0) bad('VIP', 'no AddressPool with usage loadBalancer exists');
  else if (requested !== undefined) {
    const field = a[ANNOTATION.vip] !== undefined ? `metadata.annotations["${ANNOTATION.vip}"]` : 'spec.loadBalancerIP';
    if (!isIPv4(requested)) bad(field, `"${requested}" is not an IPv4 address`);
    else {
      const holder = poolHolding(lbPools, requested);
      if (!holder) bad(field, `${requested} is outside every loadBalancer pool (${lbPools.map((p) => `${p.name} ${p.families.map((f) => f.cidr).join(',')}`).join('; ')})`);
      else if (poolName !== undefined && poolName !== holder.name) bad(field, `${requested} is in pool "${holder.name}", not in the requested pool "${poolName}"`);
      else vip = { pool: holder.name, address: requested };
    }
  } else if (poolName !== undefined) {
    if (!lbPools.some((p) => p.name === poolName)) bad(`metadata.annotations["${ANNOTATION.pool}"]`, `"${poolName}" is not a loadBalancer AddressPool (${lbPools.map((p) => p.name).join(', ')})`);
    else vip = { pool: poolName };
  } else vip = { pool: lbPools[0].name };

  // Targets from the EndpointSlices, read as kube-proxy reads them (pkg/proxy endpointslicecache.go): an
  // endpoint is its first address (the API makes its addresses fungible: "clients may choose to only use
  // the first element"), IPv4 slices only; ready (the condition, absent = true) → active, terminating or
  // not (publishNotReadyAddresses keeps a terminating pod ready, and kube-proxy sends it new connections);
  // not ready but serving while terminating → keeps its clients; anything else is not a target. An
  // address listed twice counts once (the better state).
  const targets = new Map<string, LbTarget>();
  for (const s of slices) {
    if (s.addressType !== 'IPv4') continue;
    for (const ep of Array.isArray(s.endpoints) ? s.endpoints : []) {
      if (!isObject(ep)) continue;
      const c = isObject(ep.conditions) ? ep.conditions : {};
      const terminating = c.terminating === true;
      const ready = c.ready !== false;
      const serving = c.serving ?? ready;
      const state: TargetState | undefined = ready ? 'active' : terminating && serving ? 'terminating' : undefined;
      if (!state) continue;
      const addr = Array.isArray(ep.addresses) ? ep.addresses[0] : undefined;
      if (typeof addr !== 'string' || !isIPv4(addr)) continue;
      const ref = isObject(ep.targetRef) && ep.targetRef.kind === 'Pod' ? `${String(ep.targetRef.namespace ?? m.namespace)}/${String(ep.targetRef.name)}` : undefined;
      const prev = targets.get(addr);
      if (prev?.state === 'active') continue;
      targets.set(addr, { address: addr, state, ...(typeof ep.nodeName === 'string' ? { node: ep.nodeName } : {}), ...(ref ? { pod: ref } : {}) });
    }
  }

  // Local traffic policy: external load balancers probe each node's health-check port. In a cluster the API
  // server allocates it; in a file it is given.
  let healthCheckNodePort: number | undefined;
  if (spec.externalTrafficPolicy === 'Local') {
    const hc = spec.healthCheckNodePort;
    if (typeof hc !== 'number' || !Number.isInteger(hc) || hc < 1 || hc > 65535) bad('spec.healthCheckNodePort', `${JSON.stringify(hc)}: externalTrafficPolicy Local needs a health-check port 1..65535`);
    else healthCheckNodePort = hc;
  }

  // The status is the store's allocation as last recorded: ignored (not a problem) when it does not fit.
  if (vip) {
    const status = isObject(o.status) && isObject(o.status.loadBalancer) ? o.status.loadBalancer : {};
    const ingress = Array.isArray(status.ingress) ? status.ingress : [];
    const recorded = ingress.map((i) => (isObject(i) && typeof i.ip === 'string' ? i.ip : undefined))
      .find((ip) => ip !== undefined && isIPv4(ip) && poolHolding(lbPools, ip)?.name === vip!.pool && (vip!.address === undefined || vip!.address === ip));
    if (recorded) vip.recorded = recorded;
  }

  if (problems.length || !vip) return undefined;
  return {
    key, namespace: m.namespace, name: m.name, ports,
    lbPods: { namespace: lbNs, matchLabels },
    affinity: aff as 'client' | 'flow',
    idleTimeoutS, vip,
    targets: [...targets.values()].sort((x, y) => (x.address < y.address ? -1 : 1)),
    externalTrafficPolicy: spec.externalTrafficPolicy === 'Local' ? 'Local' : 'Cluster',
    ...(healthCheckNodePort !== undefined ? { healthCheckNodePort } : {}),
  };
}
