// The declarative testbed topology and its addressing plan. Resolving is pure (no kernel calls), so the
// plan can be unit-tested and printed before anything is built.
//
// Addressing (benchmark/private ranges; they exist only inside the testbed's own namespaces):
//   fabric   198.18.0.0/24 on bridge "fabric" in the router namespace; router .1, node #i (1-based) .(10+i)
//   pods     tether-ipam (default with tether): one pod AddressPool "default", 10.244.0.0/16 in /26 blocks that
//            nodes claim on demand through Redis; a pod's gateway is its block's first address.
//            host-local (default without tether): node #i owns 10.244.i.0/24; gateway 10.244.i.1.
//            Either way ptp puts the gateway on the host veth.
//   external external #j (1-based) sits on its own link: router 198.19.j.1/24, host 198.19.j.2/24
// IPv6 (`families` includes 6; ULA space, every address added without DAD):
//   fabric   also fd00:18::/64; router fd00:18::1, node #i fd00:18::(10+i) (the decimal digits as a hex group:
//            n1 is fd00:18::11, as it is 198.18.0.11)
//   pods     tether-ipam: the pool "default" gets an ipv6 family, fd00:10:244::/56 in /122 blocks (64
//            addresses, as a /26), claimed per family, so a node holds IPv4 and IPv6 blocks of its own; the
//            CNI result carries one address of each family and ptp puts both on the pod, both gateways on
//            the host veth and a host route for each. host-local: node #i also owns fd00:10:244:<i in hex>::/64,
//            gateway ::1.
//   external also fd00:19:j::/64 (j in decimal digits, as above): router ::1, host ::2
// `families` is the pods' families only: [4] (default), [4, 6] (dual-stack) or [6] (IPv6-only pods). The
// fabric and the external links carry IPv4 in every mode and IPv6 too whenever pods have it. `underlay` is
// the family nodes talk to each other in (tetherd's --node-address: node registry, BFD, state sync,
// ownership notices, FoU): 4 (default), as dual-stack clusters on an IPv4 underlay do, or 6 (each node's
// fabric IPv6 address; needs pods with IPv6, which puts IPv6 on the fabric).
// Routing: nodes reach other nodes' pod CIDRs (host-local) or claimed blocks (tether-ipam) directly over the
// fabric (host-gw style, as flat clusters do) and everything else through the router; the router holds a
// route to every pod CIDR or block; externals default to the router. Each family is routed the same way over
// its own fabric addresses. No NAT anywhere, so every hop sees real pod addresses.

import { parseCidr, parseIp, inSubnet } from '../../lib/ip';

export interface TetherStepConfig {
  encapOverhead?: number;
  vips?: string[];
  routes?: { dst: string; gw?: string; mtu?: number }[];
  [key: string]: unknown;
}

export interface PodSpec {
  /** Short name, unique on its node; the pod's key is `<node>-<name>` (e.g. n1-p1). */
  name: string;
  /** Kubernetes namespace passed in CNI_ARGS (default "default"). */
  namespace?: string;
  /** Extra keys for this pod's tether step (merged over the node's). */
  tether?: TetherStepConfig;
}

export interface NodeSpec {
  /** Short name (lower-case letters/digits, ≤ 10 chars), e.g. n1. */
  name: string;
  zone?: string;
  /** A count (named p1..pN) or explicit pods. */
  pods?: number | (string | PodSpec)[];
  /** tetherd --config FILE for this node. */
  tetherdConfig?: string;
  /** Extra keys for the tether step of pods on this node. */
  tether?: TetherStepConfig;
}

export interface Topology {
  nodes: NodeSpec[];
  /** External hosts behind the router (default ["client", "server"]). */
  externals?: string[];
  /**
   * Include tetherd and the tether plugin: 'auto' (default) when dist/bin/tether and tetherd exist,
   * true to require them, false for a ptp + host-local chain only. TETHER_TESTBED_TETHER=0/1 overrides 'auto'.
   */
  tether?: 'auto' | boolean;
  /** MTU ptp gives pod interfaces (default: ptp's choice, the node uplink's 1500). */
  podMtu?: number;
  /** How long to wait for a tetherd to answer ping (default 15 s). */
  tetherdReadyTimeoutMs?: number;
  tetherdLogLevel?: string;
  /**
   * Pod IPAM: 'tether-ipam' (default when tether is enabled; needs tetherd, starts Redis) or 'host-local'
   * (default otherwise: a static /24 per node).
   */
  ipam?: IpamMode;
  /**
   * The pods' address families: [4] (default), [4, 6] (dual-stack: every pod has one address of each) or [6]
   * (IPv6-only pods). With 6, the fabric and the external links carry IPv6 too (see the addressing plan above).
   */
  families?: IpFamily[];
  /**
   * The family of the node underlay: 4 (default: every tetherd's --node-address is its fabric IPv4 address)
   * or 6 (its fabric IPv6 address, so nodes register, run BFD, sync conntrack, send ownership notices and
   * steer FoU over IPv6). 6 needs families to include 6.
   */
  underlay?: IpFamily;
  /**
   * The pod AddressPool "default" of tether-ipam mode: its IPv4 family (default 10.244.0.0/16 in /26 blocks)
   * and, when families includes 6, its IPv6 family (default fd00:10:244::/56 in /122 blocks).
   */
  podPool?: { cidr?: string; blockSize?: number; ipv6?: { cidr?: string; blockSize?: number } };
  /** More objects for every tetherd's config (floating pools, Egress…), tether-ipam mode only. */
  extraObjects?: Record<string, unknown>[];
  /** More tetherd flags on every node. */
  tetherdArgs?: string[];
  /**
   * configSource 'kubernetes': replicas of tether-operator (0: none until tb.scaleOperator). Default: the
   * Deployment's replicas in container mode (each from its manifest, in a namespace of its own), else 1 as a
   * process in the last node's namespace, where that node's forwarder reaches the API server.
   */
  operatorReplicas?: number;
  /**
   * The cluster store tetherds use in tether-ipam mode: one Redis on a Unix socket (default), or a Sentinel
   * set (primary, replica, three sentinels) on the router's fabric address, reached by redis+sentinel://,
   * or a Redis Cluster (3 primaries, 3 replicas; test/lib/redis-cluster.ts) there, reached by redis+cluster://.
   */
  redis?: 'single' | 'sentinel' | 'cluster';
  /**
   * Where tetherds get their objects (tether-ipam mode): 'file' (default; one shared config file) or
   * 'kubernetes': the run's FAKE API server (test/lib/fake-apiserver.ts; no kube-apiserver runs here), as
   * in a cluster — AddressPools, Egresses, Nodes and each pod's Pod object (its labels, from the pod's
   * tether.labels, which then stay out of the conflist), block claims as AddressBlock resources.
   */
  configSource?: 'file' | 'kubernetes';
}

export type IpamMode = 'host-local' | 'tether-ipam';
export type IpFamily = 4 | 6;

export const POD_POOL = 'default';
export const DEFAULT_POD_POOL_CIDR = '10.244.0.0/16';
export const DEFAULT_POD_BLOCK_SIZE = 26;
export const DEFAULT_POD_POOL_CIDR6 = 'fd00:10:244::/56';
export const DEFAULT_POD_BLOCK_SIZE6 = 122;

export interface NodePlan {
  name: string;
  index: number;
  zone?: string;
  ns: string;
  fabricIp: string;
  /** Its IPv6 fabric address, when pods have IPv6. */
  fabricIp6?: string;
  /** Router-side veth name of this node's fabric link. */
  fabricPort: string;
  /** host-local mode: the node's static pod CIDR and gateway (tether-ipam mode uses claimed blocks instead). */
  podCidr: string;
  podGateway: string;
  /** host-local mode, pods with IPv6: the node's static IPv6 pod CIDR and gateway. */
  podCidr6?: string;
  podGateway6?: string;
  pods: PodPlan[];
  tetherdConfig?: string;
  tether?: TetherStepConfig;
}

export interface PodPlan {
  key: string;
  name: string;
  node: string;
  namespace: string;
  ns: string;
  tether?: TetherStepConfig;
}

export interface ExternalPlan {
  name: string;
  index: number;
  ns: string;
  ip: string;
  routerIp: string;
  subnet: string;
  /** The link's IPv6 addresses and prefix, when pods have IPv6. */
  ip6?: string;
  routerIp6?: string;
  subnet6?: string;
  /** Router-side veth name. */
  routerPort: string;
}

/** One family of the tether-ipam pod pool. */
export interface PoolFamilyPlan {
  cidr: string;
  blockSize: number;
}

export interface Plan {
  prefix: string;
  /** The pods' families, in order ([4] unless the topology says otherwise). */
  families: IpFamily[];
  /** The node underlay's family (topology.underlay; 4 unless it says otherwise). */
  underlay: IpFamily;
  router: { ns: string; fabricIp: string; fabricIp6?: string };
  fabricCidr: string;
  /** The fabric's IPv6 prefix, when pods have IPv6. */
  fabricCidr6?: string;
  nodes: NodePlan[];
  externals: ExternalPlan[];
  /**
   * The tether-ipam pod pool (unused in host-local mode): cidr and blockSize are its IPv4 family, which the
   * AddressPool leaves out when families does not include 4; ipv6 is its IPv6 family when families includes 6.
   */
  podPool: { name: string; cidr: string; blockSize: number; ipv6?: PoolFamilyPlan };
}

export const FABRIC_CIDR = '198.18.0.0/24';
export const ROUTER_FABRIC_IP = '198.18.0.1';
export const FABRIC_CIDR6 = 'fd00:18::/64';
export const ROUTER_FABRIC_IP6 = 'fd00:18::1';
const NAME_RE = /^[a-z][a-z0-9]{0,9}$/;

/** Validates a topology and assigns names and addresses. Throws naming the bad field. */
export function resolveTopology(topo: Topology, prefix: string): Plan {
  if (!Array.isArray(topo.nodes) || topo.nodes.length === 0) throw new Error('topology.nodes: at least one node');
  if (topo.nodes.length > 200) throw new Error('topology.nodes: at most 200 nodes (one fabric /24)');
  const families = resolveFamilies(topo.families);
  const v6 = families.includes(6);
  const underlay = topo.underlay ?? 4;
  if (underlay !== 4 && underlay !== 6) throw new Error(`topology.underlay: ${JSON.stringify(topo.underlay)} must be 4 or 6`);
  if (underlay === 6 && !v6) throw new Error('topology.underlay: 6 needs IPv6 on the fabric (add 6 to topology.families)');
  const seen = new Set<string>();
  const unique = (field: string, name: string): void => {
    if (!NAME_RE.test(name)) throw new Error(`${field}: "${name}" must match ${NAME_RE} (it becomes part of interface names)`);
    if (seen.has(name)) throw new Error(`${field}: duplicate name "${name}"`);
    seen.add(name);
  };
  unique('router', 'router');
  const nodes = topo.nodes.map((n, i): NodePlan => {
    unique(`topology.nodes[${i}].name`, n.name);
    const index = i + 1;
    return {
      name: n.name,
      index,
      zone: n.zone,
      ns: `${prefix}-${n.name}`,
      fabricIp: `198.18.0.${10 + index}`,
      ...(v6 ? { fabricIp6: `fd00:18::${10 + index}` } : {}),
      fabricPort: `f-${n.name}`,
      podCidr: `10.244.${index}.0/24`,
      podGateway: `10.244.${index}.1`,
      ...(v6 ? { podCidr6: `fd00:10:244:${index.toString(16)}::/64`, podGateway6: `fd00:10:244:${index.toString(16)}::1` } : {}),
      pods: podsOf(n, i, prefix),
      tetherdConfig: n.tetherdConfig,
      tether: n.tether,
    };
  });
  const externals = (topo.externals ?? ['client', 'server']).map((name, j): ExternalPlan => {
    unique(`topology.externals[${j}]`, name);
    const index = j + 1;
    if (index > 254) throw new Error('topology.externals: too many');
    return {
      name,
      index,
      ns: `${prefix}-${name}`,
      ip: `198.19.${index}.2`,
      routerIp: `198.19.${index}.1`,
      subnet: `198.19.${index}.0/24`,
      ...(v6 ? { ip6: `fd00:19:${index}::2`, routerIp6: `fd00:19:${index}::1`, subnet6: `fd00:19:${index}::/64` } : {}),
      routerPort: `x-${name}`,
    };
  });
  const podPool: Plan['podPool'] = {
    name: POD_POOL,
    ...poolFamily(4, 'topology.podPool', topo.podPool?.cidr ?? DEFAULT_POD_POOL_CIDR, topo.podPool?.blockSize ?? DEFAULT_POD_BLOCK_SIZE),
  };
  if (v6) {
    podPool.ipv6 = poolFamily(6, 'topology.podPool.ipv6', topo.podPool?.ipv6?.cidr ?? DEFAULT_POD_POOL_CIDR6, topo.podPool?.ipv6?.blockSize ?? DEFAULT_POD_BLOCK_SIZE6);
  } else if (topo.podPool?.ipv6 !== undefined) {
    throw new Error('topology.podPool.ipv6: pods have no IPv6 (add 6 to topology.families)');
  }
  if (topo.ipam !== undefined && topo.ipam !== 'host-local' && topo.ipam !== 'tether-ipam') {
    throw new Error(`topology.ipam: "${String(topo.ipam)}" must be "host-local" or "tether-ipam"`);
  }
  return {
    prefix,
    families,
    underlay,
    router: { ns: `${prefix}-router`, fabricIp: ROUTER_FABRIC_IP, ...(v6 ? { fabricIp6: ROUTER_FABRIC_IP6 } : {}) },
    fabricCidr: FABRIC_CIDR,
    ...(v6 ? { fabricCidr6: FABRIC_CIDR6 } : {}),
    nodes,
    externals,
    podPool,
  };
}

function resolveFamilies(raw: unknown): IpFamily[] {
  if (raw === undefined) return [4];
  const ok = Array.isArray(raw) && raw.length > 0 && raw.every((f) => f === 4 || f === 6) && new Set(raw).size === raw.length;
  if (!ok) throw new Error(`topology.families: ${JSON.stringify(raw)} must be [4], [4, 6], [6, 4] or [6]`);
  return [...(raw as IpFamily[])];
}

/** One family of the pod pool, checked: a network of that family, and a block size it can be cut into. */
function poolFamily(family: IpFamily, field: string, cidr: string, blockSize: number): PoolFamilyPlan {
  const c = parseCidr(cidr);
  if (!c || c.family !== family || !c.isNetwork) throw new Error(`${field}.cidr: "${cidr}" is not an IPv${family} network`);
  const max = family === 4 ? 30 : 126; // tether-ipam's largest pod block (ipam/pool.ts MAX_BLOCK_SIZE)
  if (!Number.isInteger(blockSize) || blockSize < c.prefix || blockSize > max) {
    throw new Error(`${field}.blockSize: ${blockSize} must be an integer from ${c.prefix} to ${max}`);
  }
  return { cidr, blockSize };
}

/** Plans one pod (also used for pods added after bring-up). */
export function planPod(prefix: string, node: string, spec: PodSpec): PodPlan {
  if (!NAME_RE.test(spec.name)) throw new Error(`pod name "${spec.name}" must match ${NAME_RE}`);
  const key = `${node}-${spec.name}`;
  return { key, name: spec.name, node, namespace: spec.namespace ?? 'default', ns: `${prefix}-${key}`, tether: spec.tether };
}

function podsOf(n: NodeSpec, i: number, prefix: string): PodPlan[] {
  const specs: PodSpec[] =
    typeof n.pods === 'number'
      ? Array.from({ length: n.pods }, (_, k) => ({ name: `p${k + 1}` }))
      : (n.pods ?? []).map((p) => (typeof p === 'string' ? { name: p } : p));
  const names = new Set<string>();
  return specs.map((s) => {
    if (names.has(s.name)) throw new Error(`topology.nodes[${i}].pods: duplicate pod "${s.name}"`);
    names.add(s.name);
    return planPod(prefix, n.name, s);
  });
}

/** The address a node's tetherd is given as --node-address: its fabric address of the underlay's family. */
export function nodeAddressOf(plan: Pick<Plan, 'underlay'>, n: Pick<NodePlan, 'fabricIp' | 'fabricIp6'>): string {
  return plan.underlay === 6 ? n.fabricIp6! : n.fabricIp;
}

/** The address part of a CIDR string ("10.244.1.2/24" → "10.244.1.2"). */
export function addrOf(cidr: string): string {
  return cidr.split('/')[0];
}

/** True when ip lies in cidr (either family; never across families). */
export function inCidr(ip: string, cidr: string): boolean {
  const a = parseIp(ip);
  const c = parseCidr(cidr);
  return a !== undefined && c !== undefined && inSubnet(a, c);
}

/** The family of an address or CIDR by its text. */
export function familyOf(addr: string): IpFamily {
  return addr.includes(':') ? 6 : 4;
}
