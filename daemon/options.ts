// tetherd's command line: the options, their defaults and the checks that need no subsystem.
import * as os from 'node:os';
import { isIP } from 'node:net';
import { parseArgs } from 'node:util';
import { DEFAULT_SOCKET_PATH } from '../lib/api/protocol';
import { StartError } from './lifecycle';
import { parseRedisUrl } from './common/redis';
import { isPrime } from './lb/maglev';

export const USAGE = `usage: tetherd [--node-name NAME] [--socket PATH] [--state-dir DIR] [--bpf-pin-dir DIR] [--config FILE | --kubernetes | --kubeconfig FILE]
               [--redis URL] [--redis-prefix PREFIX] [--log-level LEVEL]
               [--node-address IP] [--node-address-6 IP] [--uplink IF] [--cluster-key-file FILE] [--fou-port N] [--sync-port N]
  --config FILE   YAML/JSON objects: AddressPool, Egress, Node (zone, labels), Pod (labels); watched,
                  every valid edit applied live (an invalid one is refused whole, nothing changes)
  --kubernetes    objects from the Kubernetes API with the pod's service account (in a cluster):
                  AddressPool and Egress resources, this node's Node and Pods; --kubeconfig FILE: same, from FILE
  --redis URL     the cluster store for block claims (standalone) and floating addresses:
                  redis://[:password@]host:port[/db], unix:///path.sock[?password=…],
                  redis+sentinel://[:password@]host[:port][,…]/master[/db] or
                  redis+cluster://[:password@]host[:port][,host[:port]…] (a Redis Cluster)
  --redis-password-secret NAME  in a cluster: the store's password from Secret NAME (entry "password") in
                          $POD_NAMESPACE, created by the first tetherd; a password in the URL wins
  Egress (objects of kind Egress in --config) also needs:
  --node-address IP       this node's address: BFD, conntrack sync and FoU between nodes use it
  --node-address-6 IP     this node's IPv6 address: the outer source of FoU to IPv6 load-balancer targets and
                          to egress gateway pods that have no IPv4 address, accepted from registered nodes only
                          (default: the one global IPv6 address of the interface holding --node-address, if
                          it has exactly one; without any, IPv6 VIPs are not forwarded by this node)
  --uplink IF             the node's interface on the L2 segment (announcements, the LB's node datapath);
                          default: the interface holding --node-address, else eth0
  --cluster-key-file FILE shared secret (≥ 32 bytes, hex or base64) authenticating tetherd-to-tetherd traffic
  --cluster-key-secret NAME  in a cluster: the key from Secret NAME in $POD_NAMESPACE (created by the first tetherd)
  --controller-candidates C  ignored (with a warning): the cluster's controllers run in tether-operator
  --fou-port N            UDP port of FoU encapsulation (default 5555); --sync-port N conntrack sync (default 3785)
  --egress-flows N        flows of this node's client pods pinned to their egress address (LRU; default 65536)
  Load balancer (Services of type LoadBalancer, loadBalancerClass tether.dev/lb) needs --node-address and --redis:
  --lb-export-table N     route-export table the node's BGP speaker advertises VIPs from (default 0: none)
  --lb-max-vips N         VIPs this node's LB pods can serve (default 16, at most 256): the node's own budget; a
                          node programs only the VIPs of its LB pods, so the cluster's Services are not capped
  --lb-maglev-size P      Maglev table size, a prime (65537); --lb-max-mappings N  clients held per node (262144)
  --lb-change-wait S      how long a target-set change waits for an LB node of the VIP that stopped answering
                          (default 8): set it above the time your routers take to withdraw a dead LB node
                          (BGP hold time, BFD), so its flows reach the others before the new table holds
  --lb-datapath MODE      where VIP traffic is handled: node (default: at tc ingress of --uplink, where it arrives;
                          the LB pods still decide where the VIP is announced) or pod (in the LB pods)
  --health-port N         the node's /healthz and /livez, kube-proxy's contract (default 10266; 0: off); Services
                          with externalTrafficPolicy Local answer on their healthCheckNodePort
  --probe-port N          kubelet's probes on 127.0.0.1: /livez, /readyz (default 0: off; the DaemonSet uses 10267)
  --metrics-bind-address IP:PORT  Prometheus metrics on http://IP:PORT/metrics (default 127.0.0.1:10268, this
                          node only; 0.0.0.0:10268 or [::]:10268 for the node's addresses; empty or port 0: off)
  --cni-net-dir DIR       the runtime's CNI configuration directory: /readyz is 503 while it does not chain tether
  --cni-runtime NAME      containerd (default) or crio: whose rules decide which file of --cni-net-dir is loaded
  --bpffs MODE            mount: mount a bpffs at /sys/fs/bpf when there is none (default); host: the host's
                          bpffs must be there already (in a container: mounted by the DaemonSet's init container)
  --help, --version`;

export type Options = {
  'node-name'?: string;
  socket: string;
  'state-dir': string;
  'bpf-pin-dir': string;
  config?: string;
  kubernetes: boolean;
  kubeconfig?: string;
  redis?: string;
  'redis-prefix': string;
  'redis-password-secret'?: string;
  'node-address'?: string;
  'node-address-6'?: string;
  uplink: string;
  'cluster-key-file'?: string;
  'cluster-key-secret'?: string;
  'controller-candidates'?: string;
  'fou-port': string;
  'sync-port': string;
  'egress-flows': string;
  'lb-export-table': string;
  'lb-max-vips': string;
  'lb-maglev-size': string;
  'lb-max-mappings': string;
  'lb-change-wait': string;
  'lb-datapath': string;
  'health-port': string;
  'probe-port': string;
  'metrics-bind-address': string;
  'cni-net-dir'?: string;
  'cni-runtime': string;
  bpffs: string;
  'no-conntrack-sync': boolean;
  'log-level': string;
  help?: boolean;
};

/** Parses the command line; throws what parseArgs says about an unknown or malformed option. */
export function parseOptions(argv: string[]): Options {
  return parseArgs({
    args: argv,
    options: {
      'node-name': { type: 'string' },
      socket: { type: 'string', default: DEFAULT_SOCKET_PATH },
      'state-dir': { type: 'string', default: '/var/lib/tether' },
      'bpf-pin-dir': { type: 'string', default: '/sys/fs/bpf/tether' },
      config: { type: 'string' },
      kubernetes: { type: 'boolean', default: false },
      kubeconfig: { type: 'string' },
      redis: { type: 'string', default: process.env.TETHER_REDIS_URL },
      'redis-prefix': { type: 'string', default: 'tether:' },
      'redis-password-secret': { type: 'string' },
      'node-address': { type: 'string' },
      'node-address-6': { type: 'string' },
      uplink: { type: 'string', default: '' },
      'cluster-key-file': { type: 'string' },
      'cluster-key-secret': { type: 'string' },
      'controller-candidates': { type: 'string' },
      'fou-port': { type: 'string', default: '5555' },
      'sync-port': { type: 'string', default: '3785' },
      'egress-flows': { type: 'string', default: '65536' },
      'lb-export-table': { type: 'string', default: '0' },
      'lb-max-vips': { type: 'string', default: '16' },
      'lb-maglev-size': { type: 'string', default: '65537' },
      'lb-max-mappings': { type: 'string', default: '262144' },
      'lb-change-wait': { type: 'string', default: '8' },
      'lb-datapath': { type: 'string', default: 'node' },
      'health-port': { type: 'string', default: '10266' },
      'probe-port': { type: 'string', default: '0' },
      'metrics-bind-address': { type: 'string', default: DEFAULT_METRICS_ADDRESS },
      'cni-net-dir': { type: 'string' },
      'cni-runtime': { type: 'string', default: 'containerd' },
      bpffs: { type: 'string', default: 'mount' },
      // Testing only: the negative control of the failover tests (takeover without conntrack state).
      'no-conntrack-sync': { type: 'boolean', default: false },
      'log-level': { type: 'string', default: 'info' },
      help: { type: 'boolean', short: 'h' },
    },
  }).values as Options;
}

export function nodeNameOf(opts: Options): string {
  return opts['node-name'] ?? process.env.NODE_NAME ?? os.hostname();
}

/** Whether objects come from the Kubernetes API. */
export function kubeMode(opts: Pick<Options, 'kubernetes' | 'kubeconfig'>): boolean {
  return opts.kubernetes || opts.kubeconfig !== undefined;
}

export function portOption(name: string, raw: string): number {
  const n = Number(raw);
  if (!/^[0-9]+$/.test(raw) || n < 1 || n > 65535) throw new StartError(2, `--${name}: ${JSON.stringify(raw)} is not a port number (1-65535)`);
  return n;
}

/** An address tetherd binds BFD and sync to must be one of this node's (namespace's) own. */
export function requireLocalAddress(addr: string): void {
  if (!isIP(addr)) throw new StartError(2, `--node-address: ${JSON.stringify(addr)} is not an IP address`);
  const local = Object.values(os.networkInterfaces()).flatMap((l) => (l ?? []).map((a) => a.address));
  if (!local.includes(addr)) throw new StartError(2, `--node-address: ${addr} is not an address of any local interface (have: ${local.join(', ') || 'none'})`);
}

/**
 * --uplink, or when it is not given the interface that holds --node-address (where the node's traffic
 * arrives and leaves), else eth0. `interfaces` is os.networkInterfaces() (a parameter for tests).
 */
export function uplinkOption(opts: Options, interfaces: NodeJS.Dict<os.NetworkInterfaceInfo[]> = os.networkInterfaces()): string {
  if (opts.uplink) return opts.uplink;
  const addr = opts['node-address'];
  if (addr) for (const [name, list] of Object.entries(interfaces)) if ((list ?? []).some((a) => a.address === addr)) return name;
  return 'eth0';
}

/**
 * The node's IPv6 address (FoU to IPv6 targets leaves from it): --node-address-6, checked as --node-address
 * is; else the one global IPv6 address of the interface holding --node-address, when it has exactly one
 * (two would be a guess); else --node-address itself when it is IPv6; else none. `interfaces` is
 * os.networkInterfaces() (a parameter for tests).
 */
export function nodeAddress6Option(opts: Options, interfaces: NodeJS.Dict<os.NetworkInterfaceInfo[]> = os.networkInterfaces()): string | undefined {
  const given = opts['node-address-6'];
  if (given !== undefined) {
    if (isIP(given) !== 6) throw new StartError(2, `--node-address-6: ${JSON.stringify(given)} is not an IPv6 address`);
    const local = Object.values(interfaces).flatMap((l) => (l ?? []).map((a) => a.address));
    if (!local.includes(given)) throw new StartError(2, `--node-address-6: ${given} is not an address of any local interface`);
    return given;
  }
  const addr = opts['node-address'];
  if (!addr) return undefined;
  if (isIP(addr) === 6) return addr;
  for (const list of Object.values(interfaces)) {
    if (!(list ?? []).some((a) => a.address === addr)) continue;
    // Global unicast only: link-local (fe80::/10) needs a zone and is not routed between nodes.
    const global = (list ?? []).filter((a) => a.family === 'IPv6' && !a.internal && !/^fe[89ab]/i.test(a.address)).map((a) => a.address);
    return global.length === 1 ? global[0] : undefined;
  }
  return undefined;
}

/** tetherd's metrics: on this node only, next to the probes' 10267 (kube-proxy's are on 127.0.0.1:10249). */
export const DEFAULT_METRICS_ADDRESS = '127.0.0.1:10268';

/**
 * --metrics-bind-address, as kube-proxy's: IP:PORT, an IPv6 address in brackets ([::]:10268). Empty or
 * port 0 turns the metrics off (undefined).
 */
export function metricsAddressOption(raw: string): { host: string; port: number } | undefined {
  if (raw === '') return undefined;
  const m = /^(?:\[([^\]]+)\]|([^:[\]]+)):([0-9]{1,5})$/.exec(raw);
  const host = m?.[1] ?? m?.[2];
  const port = Number(m?.[3]);
  if (!m || !host || isIP(host) !== (m[1] !== undefined ? 6 : 4) || port > 65535) {
    throw new StartError(2, `--metrics-bind-address: ${JSON.stringify(raw)} is not IP:PORT (e.g. 127.0.0.1:10268, 0.0.0.0:10268 or [::]:10268; empty or port 0 turns metrics off)`);
  }
  return port === 0 ? undefined : { host, port };
}

/** --redis must be a store URL we understand (checked before anything starts). */
export function checkRedisOption(opts: Pick<Options, 'redis'>): void {
  if (!opts.redis) return;
  try {
    parseRedisUrl(opts.redis);
  } catch (e) {
    throw new StartError(2, `--redis rejected: ${(e as Error).message}`);
  }
}

/** --egress-flows: the size of the flow pin map, 1024..16777216. */
export function flowsOption(raw: string): number {
  const n = Number(raw);
  if (!/^[0-9]+$/.test(raw) || n < 1024 || n > 16_777_216) throw new StartError(2, `--egress-flows: ${JSON.stringify(raw)} is not a flow count (1024-16777216)`);
  return n;
}

/** --lb-export-table, --lb-max-vips, --lb-maglev-size, --lb-max-mappings (they size the maps at start), --lb-change-wait and --lb-datapath, checked. */
export function lbOptions(opts: Options): { exportTable: number; maxVips: number; maglevSize: number; maxMappings: number; changeWaitMs: number; datapath: 'node' | 'pod' } {
  const int = (name: keyof Options, min: number, max: number): number => {
    const raw = String(opts[name]);
    const n = Number(raw);
    if (!/^[0-9]+$/.test(raw) || n < min || n > max) throw new StartError(2, `--${name}: ${JSON.stringify(raw)} must be an integer ${min}..${max}`);
    return n;
  };
  const exportTable = int('lb-export-table', 0, 0xffffffff);
  if ([253, 254, 255].includes(exportTable)) throw new StartError(2, `--lb-export-table: ${exportTable} is a kernel table (local/main/default); pick another`);
  const maglevSize = int('lb-maglev-size', 7, 1_000_003);
  if (!isPrime(maglevSize)) throw new StartError(2, `--lb-maglev-size: ${maglevSize} is not a prime`);
  const datapath = opts['lb-datapath'] ?? 'node';
  if (datapath !== 'node' && datapath !== 'pod') throw new StartError(2, `--lb-datapath: ${JSON.stringify(datapath)} is not node or pod`);
  const changeWaitMs = int('lb-change-wait', 2, 600) * 1000;
  return { exportTable, maxVips: int('lb-max-vips', 1, 256), maglevSize, maxMappings: int('lb-max-mappings', 1024, 16_777_216), changeWaitMs, datapath };
}
