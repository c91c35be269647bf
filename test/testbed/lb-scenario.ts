// The load balancer on the testbed: LB pods on n1..n3 (n3's added during a test), target pods on n4 and n5,
// one Service of type LoadBalancer of tether's class with its EndpointSlice, real BIRD 2 on the LB nodes
// (each advertising its route-export table) and on the router (ECMP over the nodes that advertise the VIP,
// hashing on L4 so each connection takes one path and a change of paths rehashes them), Redis as the
// mapping store, and long-lived traffic from the external client through the VIP.
import type { ChildProcess } from 'node:child_process';
import type { Testbed } from './testbed';
import type { Topology } from './topology';
import type { IpFamily } from '../../lib/ip';
import { exportTableSpeakerConfig, startBird, waitBgpEstablished, type TestBird } from '../lib/bird';
import { TRAFFIC_CLIENT, type TrafficReport } from '../lib/traffic';
import { until } from '../lib/wait';

export const LB_POOL = '198.51.100.0/28';
export const EXPORT_TABLE = 100;
export const PORT = 9000;
const ROUTER_AS = 65000;
const NODE_AS = 65001;
const LB = { tether: { labels: { 'tether.dev/role': 'lb' } }, namespace: 'shop' };
const APP = { tether: { labels: { app: 'db' } }, namespace: 'shop' };
export const LB_NODES = ['n1', 'n2', 'n3'];

/**
 * tetherd's --lb-datapath for the load balancer's testbed runs: TETHER_LB_DATAPATH=node|pod (default: the
 * tetherd default), so every LB scenario can be run against either datapath.
 */
export function lbDatapathArgs(mode = process.env.TETHER_LB_DATAPATH): string[] {
  if (mode === undefined || mode === '') return [];
  if (mode !== 'node' && mode !== 'pod') throw new Error(`TETHER_LB_DATAPATH=${mode}: node or pod`);
  return ['--lb-datapath', mode];
}

export function topology(datapath?: string): Topology {
  return {
    nodes: [
      { name: 'n1', pods: [{ name: 'lb', ...LB }] },
      { name: 'n2', pods: [{ name: 'lb', ...LB }] },
      { name: 'n3', pods: [] },
      { name: 'n4', pods: [{ name: 't1', ...APP }, { name: 't2', ...APP }] },
      { name: 'n5', pods: [{ name: 't3', ...APP }] },
    ],
    tether: true,
    ipam: 'tether-ipam',
    tetherdArgs: ['--lb-export-table', String(EXPORT_TABLE), ...lbDatapathArgs(datapath)],
    extraObjects: [pool],
  };
}

export const lbPodSpec = { name: 'lb', ...LB };
export const targetSpec = (name: string) => ({ name, ...APP });

export const pool = { apiVersion: 'tether.dev/v1alpha1', kind: 'AddressPool', metadata: { name: 'lb' }, spec: { usage: 'loadBalancer', ipv4: { cidr: LB_POOL } } };

export function service(annotations: Record<string, string> = { 'lb.tether.dev/affinity': 'flow' }, spec: Record<string, unknown> = {}): Record<string, unknown> {
  return {
    apiVersion: 'v1', kind: 'Service', metadata: { name: 'db', namespace: 'shop', annotations },
    spec: { type: 'LoadBalancer', loadBalancerClass: 'tether.dev/lb', allocateLoadBalancerNodePorts: false, ports: [{ name: 'tcp', port: PORT, protocol: 'TCP' }, { name: 'udp', port: PORT, protocol: 'UDP' }], ...spec },
  };
}

/**
 * The EndpointSlice of the Service: the given target pods, ready unless listed as terminating; their
 * addresses of `family` (a dual-stack Service has one slice of each).
 */
export function slice(tb: Testbed, targets: string[], terminating: string[] = [], family: IpFamily = 4): Record<string, unknown> {
  const addr = (k: string) => (family === 4 ? tb.podIp(k) : tb.podIp6(k));
  return {
    apiVersion: 'discovery.k8s.io/v1', kind: 'EndpointSlice',
    metadata: { name: family === 4 ? 'db-1' : 'db-6', namespace: 'shop', labels: { 'kubernetes.io/service-name': 'db' } },
    addressType: family === 4 ? 'IPv4' : 'IPv6',
    ports: [{ name: 'tcp', port: PORT, protocol: 'TCP' }],
    endpoints: [
      ...targets.map((k) => ({ addresses: [addr(k)], conditions: { ready: true }, nodeName: tb.pod(k).node, targetRef: { kind: 'Pod', namespace: 'shop', name: tb.pod(k).name } })),
      ...terminating.map((k) => ({ addresses: [addr(k)], conditions: { ready: false, serving: true, terminating: true }, nodeName: tb.pod(k).node })),
    ],
  };
}

export function configure(tb: Testbed, targets: string[], opts: { terminating?: string[]; service?: Record<string, unknown> } = {}): void {
  tb.rewriteConfig({ extraObjects: [pool, opts.service ?? service(), slice(tb, targets, opts.terminating)] });
}

export interface LbStatus {
  service: string;
  vip?: string;
  announced: boolean;
  mappings: number;
  localLbPods: string[];
  localTargets: string[];
  problem?: string;
  refused?: string[];
  counters?: Record<string, number>;
  /** The VIP's Maglev table on this node (table-switch.ts): the version it forwards by, a change waiting. */
  table?: { mode: string; version?: number; pending?: { version: number; waitingFor: string[] }; recording: boolean };
}

/** The Service's VIP of `family` on `node`: its IPv4 VIP is keyed "shop/db", its IPv6 VIP "shop/db#IPv6". */
export async function lbStatus(tb: Testbed, node: string, family: IpFamily = 4): Promise<LbStatus | undefined> {
  const key = family === 4 ? 'shop/db' : 'shop/db#IPv6';
  return ((await tb.status(node)) as unknown as { loadBalancers: LbStatus[] }).loadBalancers.find((l) => l.service === key);
}

export { until } from '../lib/wait';

/**
 * BIRD on the router (ECMP into its kernel table) and on each LB node (advertising the export table). With
 * ipv6 (a dual-stack testbed) each node also advertises the export table's IPv6 /128s over an IPv6 session
 * to the router's fabric IPv6 address, and the router installs them via the nodes' global addresses.
 */
export async function startBgp(tb: Testbed, speakers: string[] = LB_NODES, o: { ipv6?: boolean } = {}): Promise<{ birds: TestBird[]; stop: () => Promise<void> }> {
  if (o.ipv6) return startBgpDual(tb, speakers);
  const routerIp = '198.18.0.1';
  await tb.mustExec('router', ['sysctl', '-qw', 'net.ipv4.fib_multipath_hash_policy=1']);
  const nodes = speakers.map((n) => tb.node(n));
  const routerConf = `router id ${routerIp};
log stderr all;
protocol device { scan time 10; }
protocol kernel fib {
  merge paths on;
  ipv4 { import none; export where source = RTS_BGP; };
}
${nodes.map((n) => `protocol bgp ${n.name} {
  local as ${ROUTER_AS};
  neighbor ${n.fabricIp} as ${NODE_AS};
  connect delay time 1;
  connect retry time 1;
  error wait time 1, 5;
  hold time 3;
  ipv4 { import all; export none; };
}
`).join('')}`;
  const birds: TestBird[] = [];
  try {
    birds.push(await startBird(tb.ns('router'), routerConf));
    for (const n of nodes) {
      birds.push(await startBird(tb.ns(n.name), exportTableSpeakerConfig({ routerId: n.fabricIp, as: NODE_AS, table: EXPORT_TABLE, peers: [{ name: 'upstream', address: routerIp, as: ROUTER_AS }] })));
    }
    await waitBgpEstablished(birds);
  } catch (e) {
    await Promise.all(birds.map((b) => b.stop()));
    throw e;
  }
  return { birds, stop: async () => void (await Promise.all(birds.map((b) => b.stop()))) };
}

async function startBgpDual(tb: Testbed, speakers: string[]): Promise<{ birds: TestBird[]; stop: () => Promise<void> }> {
  const routerIp = '198.18.0.1';
  const routerIp6 = tb.plan.router.fabricIp6!;
  await tb.mustExec('router', ['sysctl', '-qw', 'net.ipv4.fib_multipath_hash_policy=1', 'net.ipv6.fib_multipath_hash_policy=1']);
  const nodes = speakers.map((n) => tb.node(n));
  const session = (name: string, local: number, addr: string, as: number, channel: string) => `protocol bgp ${name} {
  local as ${local};
  neighbor ${addr} as ${as};
  connect delay time 1;
  connect retry time 1;
  error wait time 1, 5;
  hold time 3;
  ${channel}
}
`;
  const routerConf = `router id ${routerIp};
log stderr all;
protocol device { scan time 10; }
protocol kernel fib { merge paths on; ipv4 { import none; export where source = RTS_BGP; }; }
protocol kernel fib6 { merge paths on; ipv6 { import none; export where source = RTS_BGP; }; }
${nodes.map((n) => session(n.name, ROUTER_AS, n.fabricIp, NODE_AS, 'ipv4 { import all; export none; };') + session(`${n.name}_6`, ROUTER_AS, n.fabricIp6!, NODE_AS, 'ipv6 { import all; export none; next hop prefer global; };')).join('')}`;
  const nodeConf = (n: { fabricIp: string }) => `router id ${n.fabricIp};
log stderr all;
protocol device { scan time 10; }
protocol kernel export_table { kernel table ${EXPORT_TABLE}; learn; scan time 5; ipv4 { import where net.len = 32; export none; }; }
protocol kernel export_table6 { kernel table ${EXPORT_TABLE}; learn; scan time 5; ipv6 { import where net.len = 128; export none; }; }
${session('upstream', NODE_AS, routerIp, ROUTER_AS, 'ipv4 { import none; export where proto = "export_table"; };')}${session('upstream6', NODE_AS, routerIp6, ROUTER_AS, 'ipv6 { import none; export where proto = "export_table6"; };')}`;
  const birds: TestBird[] = [];
  try {
    birds.push(await startBird(tb.ns('router'), routerConf));
    for (const n of nodes) birds.push(await startBird(tb.ns(n.name), nodeConf(n)));
    await waitBgpEstablished(birds);
  } catch (e) {
    await Promise.all(birds.map((b) => b.stop()));
    throw e;
  }
  return { birds, stop: async () => void (await Promise.all(birds.map((b) => b.stop()))) };
}

/** The VIP (read on nodes[0]) once the router spreads it over exactly `nodes`. */
export async function announcedOn(tb: Testbed, nodes: string[]): Promise<string> {
  return until(`VIP announced by exactly ${nodes.join(', ')}`, async () => {
    const st = await lbStatus(tb, nodes[0]);
    if (!st?.vip) return undefined;
    const paths = await routerPaths(tb, st.vip);
    const want = nodes.map((n) => tb.node(n).fabricIp).sort();
    return paths.join() === want.join() ? st.vip : undefined;
  }, 30_000);
}

/** The router's next hops for the VIP (the nodes it spreads connections over). */
export async function routerPaths(tb: Testbed, vip: string): Promise<string[]> {
  const r = await tb.exec('router', vip.includes(':') ? ['ip', '-6', '-j', 'route', 'show', `${vip}/128`] : ['ip', '-j', 'route', 'show', `${vip}/32`]);
  const routes = JSON.parse(r.stdout || '[]') as Array<{ gateway?: string; nexthops?: Array<{ gateway: string }> }>;
  return routes.flatMap((x) => (x.nexthops ? x.nexthops.map((h) => h.gateway) : x.gateway ? [x.gateway] : [])).sort();
}

// Target server: echoes numbered lines (TCP) and datagrams (UDP, answered from the VIP the client used);
// on SIGTERM prints the TCP peers it saw and how many it saw close early.
const TARGET_SERVER = `
const net = require('net'), dgram = require('dgram');
const [port, vip, name] = process.argv.slice(1);
// An IPv6 VIP's server listens on IPv6 only (an IPv4 VIP's server may listen on the same port in the same
// pod) and records a peer as "[addr]:port" (test/lib/traffic.ts peerAddress).
const v6 = vip.includes(':');
const peers = new Set();
net.createServer((s) => {
  peers.add(v6 ? '[' + s.remoteAddress + ']:' + s.remotePort : s.remoteAddress + ':' + s.remotePort);
  s.setNoDelay(true);
  s.on('data', (b) => s.write(b));
  s.on('error', () => {});
}).listen({ port: Number(port), host: v6 ? '::' : '0.0.0.0', ipv6Only: v6 }, () => up());
// The VIP is on the pod once tetherd has set its target role up, which may come a moment after the pod:
// bind again until it is there (an unbound socket's error would end the server), ready only then.
let pending = 2;
const up = () => { if (--pending === 0) process.stdout.write('ready\\n'); };
const bindUdp = () => {
  const u = dgram.createSocket(v6 ? { type: 'udp6', ipv6Only: true } : 'udp4');
  u.on('message', (m, r) => u.send(m, r.port, r.address));
  u.once('error', () => { u.close(); setTimeout(bindUdp, 50); });
  u.bind(Number(port), vip, up);
};
bindUdp();
// Exit once the list is written: exiting at once cut a long one (thousands of peers) short in the pipe.
process.on('SIGTERM', () => process.stdout.write(JSON.stringify({ name, peers: [...peers] }) + '\\n', () => process.exit(0)));
`;

export interface Servers {
  stop(): Promise<Map<string, string[]>>;
  add(pod: string): Promise<void>;
}

/** Echo servers in the target pods; stop() tells, per pod, the TCP peers it served. */
export async function startTargets(tb: Testbed, pods: string[], vip: string): Promise<Servers> {
  const running = new Map<string, { child: ChildProcess; out: Promise<string> }>();
  const add = async (pod: string) => {
    const child = tb.spawn(pod, [process.execPath, '-e', TARGET_SERVER, String(PORT), vip, pod]);
    let text = '';
    const out = new Promise<string>((resolve) => {
      child.stdout?.on('data', (b: Buffer) => (text += b.toString()));
      // 'close', not 'exit': a long peer list may still be in the pipe when the process has exited.
      child.on('close', () => resolve(text));
    });
    await until(`server in ${pod}`, async () => text.includes('ready'), 10_000);
    running.set(pod, { child, out });
  };
  for (const p of pods) await add(p);
  return {
    add,
    async stop() {
      const res = new Map<string, string[]>();
      for (const [pod, r] of running) {
        r.child.kill('SIGTERM');
        const line = (await r.out).split('\n').find((l) => l.startsWith('{'));
        res.set(pod, line ? (JSON.parse(line).peers as string[]) : []);
      }
      return res;
    },
  };
}

/**
 * Long-lived connections (and a UDP stream) from the external client to the VIP while `during` runs; with
 * endWhenDone, durationMs is an upper bound and the run ends when `during` does.
 */
export async function traffic(tb: Testbed, vip: string, conns: number, durationMs: number, during: () => Promise<void>, udp = true, opts: { endWhenDone?: boolean } = {}): Promise<TrafficReport> {
  const client = tb.spawn('client', [process.execPath, '-e', TRAFFIC_CLIENT, vip, String(PORT), String(conns), String(durationMs), '50', udp ? '1' : '0']);
  let out = '';
  client.stdout?.on('data', (b: Buffer) => (out += b.toString()));
  const exited = new Promise<void>((r) => client.on('exit', () => r()));
  await until('traffic client ready', async () => out.includes('ready'), 10_000);
  await new Promise((r) => setTimeout(r, 3000));
  client.kill('SIGUSR2');
  await during();
  if (opts.endWhenDone) client.kill('SIGINT');
  await exited;
  const line = out.split('\n').find((l) => l.startsWith('{'));
  if (!line) throw new Error(`traffic client printed no report: ${out.slice(0, 400)}`);
  return JSON.parse(line) as TrafficReport;
}

/**
 * The stateless baseline (what MetalLB with kube-proxy gives): a node that announces the VIP DNATs each new
 * connection to a random target and masquerades it (kube-proxy's Cluster policy); no state is shared, so a
 * connection that ECMP moves to another node is picked up there as new and broken.
 */
export async function baselineAnnounce(tb: Testbed, node: string, vip: string, targets: string[]): Promise<void> {
  // An IPv6 VIP DNATs to the targets' IPv6 addresses in an ip6 table, as kube-proxy's nftables mode does per family.
  const v6 = vip.includes(':');
  const [family, ip] = v6 ? ['ip6', 'ip6'] : ['ip', 'ip'];
  const map = targets.map((t, i) => `${i} : ${v6 ? tb.podIp6(t) : tb.podIp(t)}`).join(', ');
  const rules = `table ${family} kubeproxy {
  chain pre { type nat hook prerouting priority dstnat; ${ip} daddr ${vip} tcp dport ${PORT} dnat to numgen random mod ${targets.length} map { ${map} }; }
  chain post { type nat hook postrouting priority srcnat; ct status dnat masquerade; }
}
`;
  await tb.mustExec(node, ['nft', '-f', '-'], { input: rules });
  await tb.mustExec(node, ['ip', ...(v6 ? ['-6'] : []), 'route', 'replace', `${vip}/${v6 ? 128 : 32}`, 'dev', 'lo', 'table', String(EXPORT_TABLE)]);
}

export async function baselineWithdraw(tb: Testbed, node: string, vip: string): Promise<void> {
  const v6 = vip.includes(':');
  await tb.mustExec(node, ['ip', ...(v6 ? ['-6'] : []), 'route', 'del', `${vip}/${v6 ? 128 : 32}`, 'table', String(EXPORT_TABLE)]);
}
