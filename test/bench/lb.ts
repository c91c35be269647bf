// Benchmark (not a test): the stateful load balancer on the testbed, in one run.
//  1. Throughput (iperf3, 1 and 8 streams, client → target, the direction that passes the LB) and packets
//     per second (iperf3 UDP, 64-byte datagrams) through tether's VIP, through a kube-proxy-style iptables
//     DNAT path (nft DNAT + masquerade on an LB node, same target), and by plain routing to the target (the
//     floor). All three reach the same target pod from the same external client. tetherd runs with
//     --lb-datapath BENCH_LB_DATAPATH (default node: VIP traffic handled on the LB nodes' uplinks); with
//     node, the LB pods' path is measured too in the same run (the uplink program taken off n1 and n2, so
//     VIP traffic falls back to the LB pods, then tetherd restarted there to put it back).
//  2. Time to load 100k mappings into a new LB pod: from the store (Redis HGETALL) into the node's maps.
//  3. New connections per second through the VIP at a steady target set (per-flow affinity; record on change:
//     the picks stay in the LB nodes' maps, nothing is written to the store per connection), against the same
//     connections straight to a target; the store writes per new connection (mappings in Redis, and Redis's
//     write counter, before and after the rounds) and the LB nodes' CPU per new connection (above direct).
//     What recording every pick costs (externalTrafficPolicy Local, or while a change is under way) is
//     measured apart by lb-record.ts; a change of the target set by lb-switch.ts.
//  4. The survival table: 200 long-lived connections through each change, tether and the stateless
//     ECMP + kube-proxy baseline.
// Writes results/bench-lb.json (keeping lb-switch.ts's `tableChange`) and its docs/performance.md section.
// The IPv6 rows beside these (the same measures, both families in one run) are lb-families.ts's, which
// takes its paths' measures from here.
import * as fs from 'node:fs';
import * as path from 'node:path';
import type { ChildProcess } from 'node:child_process';
import Redis from 'ioredis';
import { withTestbed, type Testbed } from '../testbed/testbed';
import { LB_NODE_TC } from '../../daemon/bpf/lb';
import {
  EXPORT_TABLE, PORT, baselineAnnounce, baselineWithdraw, configure, lbPodSpec, lbStatus, pool, routerPaths, service, slice, startBgp, startTargets, targetSpec, topology, traffic, until,
} from '../testbed/lb-scenario';
import { LbDatapath } from '../../daemon/bpf/lb';
import { ensureBpffs } from '../../daemon/bpf/bpffs';
import { LB_STORE_BUCKETS } from '../../daemon/lb/mapping-fields';
import { connectLbStore } from '../../daemon/lb/lb-store';
import { startRedis } from '../lib/redis';
import type { IpFamily } from '../../lib/ip';
import { machine, updateReadme } from './stats';

const repo = path.resolve(__dirname, '../..');
const CONNS = Number(process.env.BENCH_LB_CONNS ?? 200);
const SECS = Number(process.env.BENCH_LB_SECS ?? 5);
const MAPPINGS = Number(process.env.BENCH_LB_MAPPINGS ?? 100_000);
const STORM = Number(process.env.BENCH_LB_STORM ?? 3000);
const STORM_ROUNDS = Number(process.env.BENCH_LB_STORM_ROUNDS ?? 3);
export const PERF_PORT = 5201;
/** The tether path's iperf3 server is bound to the VIP, so its UDP handshake answers from the VIP (DSR). */
export const VIP_PERF_PORT = 5202;
const DNAT_VIP = '198.51.100.200';
const DATAPATH = process.env.BENCH_LB_DATAPATH ?? 'node';
/** The LB nodes serving the perf VIP (their LB pods: lb-scenario's topology). */
export const PERF_LB_NODES = ['n1', 'n2'];
/**
 * Plain routing over the same hops as the VIP (one node more than plain routing to the pod): the router sends a
 * target pod's address through the LB node n1 (a /32 via n1), which routes it on to the pod's node as usual.
 * The floor of any L4 load balancer that runs on its own node.
 */
async function routeThroughNode(tb: Testbed, pod: string, on: boolean): Promise<void> {
  const dst = `${tb.podIp(pod)}/32`;
  if (on) await tb.mustExec('router', ['ip', 'route', 'replace', dst, 'via', tb.node('n1').fabricIp]);
  else await tb.mustExec('router', ['ip', 'route', 'del', dst, 'via', tb.node('n1').fabricIp]);
}

/** A process and its descendants (a node container's entrypoint may run tetherd below it). */
function processTree(pid: number): number[] {
  const children = (p: number): number[] => {
    try {
      return fs.readdirSync(`/proc/${p}/task`).flatMap((t) => fs.readFileSync(`/proc/${p}/task/${t}/children`, 'utf8').trim().split(/\s+/).filter(Boolean).map(Number));
    } catch {
      return [];
    }
  };
  const all: number[] = [];
  const walk = (p: number) => {
    all.push(p);
    for (const c of children(p)) walk(c);
  };
  walk(pid);
  return all;
}

/** CPU time (user + system, every thread) of these processes and their descendants so far, in ms. */
function cpuMs(pids: number[]): number {
  const tick = 1000 / 100; // USER_HZ
  let ms = 0;
  for (const p of pids.flatMap(processTree)) {
    try {
      const f = fs.readFileSync(`/proc/${p}/stat`, 'utf8');
      const rest = f.slice(f.lastIndexOf(')') + 2).split(' ');
      ms += (Number(rest[11]) + Number(rest[12])) * tick; // utime, stime (fields 14 and 15)
    } catch {
      // gone meanwhile
    }
  }
  return ms;
}

/** Signals a process and every descendant. */
function signalTree(pid: number, signal: NodeJS.Signals): void {
  for (const p of processTree(pid)) process.kill(p, signal);
}

/** The Service of the throughput paths (spec: what to add, e.g. both families). */
export function perfService(spec: Record<string, unknown> = {}): Record<string, unknown> {
  const s = service({ 'lb.tether.dev/affinity': 'flow' }, spec) as { metadata: Record<string, unknown>; spec: Record<string, unknown> };
  return { ...s, metadata: { ...s.metadata, name: 'perf' }, spec: { ...s.spec, ports: [{ name: 'tcp', port: VIP_PERF_PORT, protocol: 'TCP' }, { name: 'udp', port: VIP_PERF_PORT, protocol: 'UDP' }] } };
}

/** The throughput paths' one target, n4-t1 (its address of `family`). */
export function perfSlice(tb: Testbed, family: IpFamily = 4): Record<string, unknown> {
  const s = slice(tb, ['n4-t1'], [], family) as { metadata: Record<string, unknown> };
  return { ...s, metadata: { ...s.metadata, name: `perf-${family === 4 ? 1 : 6}`, labels: { 'kubernetes.io/service-name': 'perf' } } };
}

export async function iperf(tb: Testbed, host: string, port: number, args: string[]): Promise<{ mbps: number; pps?: number }> {
  const r = await tb.exec('client', ['iperf3', '-J', '-c', host, '-p', String(port), '-t', String(SECS), ...args], { timeoutMs: (SECS + 20) * 1000 });
  const j = JSON.parse(r.stdout) as { end: { sum_received?: { bits_per_second: number }; sum?: { bits_per_second: number; packets: number; lost_packets: number; seconds: number } }; error?: string };
  if (j.error) throw new Error(`iperf3 to ${host}: ${j.error}`);
  if (j.end.sum?.packets !== undefined) {
    const s = j.end.sum;
    return { mbps: s.bits_per_second / 1e6, pps: (s.packets - s.lost_packets) / s.seconds };
  }
  return { mbps: (j.end.sum_received?.bits_per_second ?? 0) / 1e6 };
}

// Short connections, 40 at a time, each answered once by the target; prints the rate.
const STORM_CLIENT = `
const net = require('net');
const [host, port, n] = process.argv.slice(1);
let done = 0, started = 0, errors = 0; const t0 = Date.now();
function one() {
  if (started >= Number(n)) return; started++;
  const s = net.connect({ host, port: Number(port) });
  s.setTimeout(5000, () => s.destroy(new Error('timeout')));
  s.on('connect', () => s.end('0 0\\n'));
  s.on('data', () => {});
  s.on('error', () => errors++);
  s.on('close', () => { if (++done === Number(n)) { console.log(JSON.stringify({ perSecond: n / ((Date.now() - t0) / 1000), errors })); process.exit(0); } else one(); });
}
for (let i = 0; i < 40; i++) one();`;

/**
 * A burst of n connections from the client to host:PORT; the rate at which they ended. A refused connection
 * ends too, and sooner than a served one (a port nobody listens on answers RST at about twice the rate), so a
 * burst with errors is no connection rate: it throws unless allowErrors (the caller reports them itself).
 */
export async function storm(tb: Testbed, host: string, n: number, opts: { allowErrors?: boolean } = {}): Promise<{ perSecond: number; errors: number }> {
  const r = await tb.exec('client', [process.execPath, '-e', STORM_CLIENT, host, String(PORT), String(n)], { timeoutMs: 300_000 });
  const res = JSON.parse(r.stdout.trim().split('\n').pop()!) as { perSecond: number; errors: number };
  if (res.errors > 0 && !opts.allowErrors) throw new Error(`connection burst to ${host} port ${PORT}: ${res.errors} of ${n} connections failed (is a server listening in that family?)`);
  return res;
}

/** Redis's write counter (changes to the data set; nothing is saved, so it never resets) and its script and publish calls. */
async function storeCounters(raw: Redis): Promise<{ writes: number; scripts: number; publishes: number }> {
  const info = await raw.info('all');
  const num = (re: RegExp) => Number(re.exec(info)?.[1] ?? 0);
  const calls = (cmd: string) => num(new RegExp(`cmdstat_${cmd}:calls=(\\d+)`));
  return {
    writes: num(/rdb_changes_since_last_save:(\d+)/),
    scripts: calls('evalsha') + calls('eval'),
    publishes: calls('publish') + calls('spublish'),
  };
}

async function storedMappings(raw: Redis, prefix: string, vip: string): Promise<number> {
  let stored = 0;
  for (let i = 0; i < LB_STORE_BUCKETS; i++) stored += await raw.hlen(`${prefix}lb:{${vip}#${i}}:map`);
  return stored;
}

/** The router spreads the VIP over exactly `nodes` (their fabric address of the VIP's family). */
export async function announced(tb: Testbed, vip: string, nodes: string[]): Promise<void> {
  const want = nodes.map((n) => (vip.includes(':') ? tb.node(n).fabricIp6! : tb.node(n).fabricIp)).sort().join();
  await until(`${vip} over ${nodes.join(',')}`, async () => (await routerPaths(tb, vip)).join() === want, 30_000);
}

async function loadMappings(): Promise<{ written: number; loadMs: number; installMs: number; totalMs: number }> {
  const redis = await startRedis();
  const pinDir = `/sys/fs/bpf/tether-bench/lb-${process.pid}`;
  ensureBpffs(pinDir);
  const store = await connectLbStore(redis.url);
  const dp = LbDatapath.load({ pinDir, maxVips: 2 });
  try {
    const vip = '198.51.100.1';
    const list = Array.from({ length: MAPPINGS }, (_, i) => ({
      key: { vip, client: `10.${(i >> 16) & 255}.${(i >> 8) & 255}.${i & 255}`, vport: 0, cport: 0, proto: 0 },
      target: `10.244.0.${(i % 50) + 2}`,
    }));
    await store.mappings.claim(vip, list);
    const t0 = process.hrtime.bigint();
    const { mappings } = await store.mappings.load(vip);
    const t1 = process.hrtime.bigint();
    dp.installMappings(mappings);
    const t2 = process.hrtime.bigint();
    if (dp.mappings().length !== MAPPINGS) throw new Error(`installed ${dp.mappings().length} of ${MAPPINGS}`);
    return { written: mappings.length, loadMs: Number(t1 - t0) / 1e6, installMs: Number(t2 - t1) / 1e6, totalMs: Number(t2 - t0) / 1e6 };
  } finally {
    dp.close({ unpin: true });
    fs.rmSync(pinDir, { recursive: true, force: true });
    await store.connection.close();
    await redis.stop();
  }
}

/** One path's figures: 1 and 8 TCP streams (Mbit/s), 64-byte UDP datagrams received per second. */
export interface PathThroughput {
  mbps1: number;
  mbps8: number;
  pps64: number;
}

export async function pathThroughput(tb: Testbed, host: string, port: number): Promise<PathThroughput> {
  const one = await iperf(tb, host, port, []);
  const eight = await iperf(tb, host, port, ['-P', '8']);
  const pps = await iperf(tb, host, port, ['-u', '-l', '64', '-b', '0']);
  return { mbps1: Math.round(one.mbps), mbps8: Math.round(eight.mbps), pps64: Math.round(pps.pps ?? 0) };
}

async function main(): Promise<void> {
  const result: Record<string, unknown> = { machine: machine() };
  process.stdout.write('lb bench: loading mappings\n');
  result.load = await loadMappings();
  process.stdout.write(`  ${JSON.stringify(result.load)}\n`);

  result.datapath = DATAPATH;
  result.iperfSeconds = SECS;
  await withTestbed(topology(DATAPATH), async (tb) => {
    const bgp = await startBgp(tb);
    const servers: ChildProcess[] = [];
    try {
      tb.rewriteConfig({ extraObjects: [pool, service(), slice(tb, ['n4-t1', 'n4-t2', 'n5-t3']), perfService(), perfSlice(tb)] });
      const st = await until('both VIPs announced', async () => {
        const l = ((await tb.status('n1')) as unknown as { loadBalancers: Array<{ service: string; vip?: string; announced: boolean }> }).loadBalancers;
        const db = l.find((x) => x.service === 'shop/db');
        const perf = l.find((x) => x.service === 'shop/perf');
        return db?.announced && perf?.announced ? { db: db.vip!, perf: perf.vip! } : undefined;
      }, 30_000);
      await announced(tb, st.perf, ['n1', 'n2']);
      // The DNAT path: one LB node (n1) DNATs a second VIP to the same target and masquerades.
      await tb.mustExec('n1', ['nft', '-f', '-'], { input: `table ip kubeproxy {
  chain pre { type nat hook prerouting priority dstnat; ip daddr ${DNAT_VIP} tcp dport ${PERF_PORT} dnat to ${tb.podIp('n4-t1')}; ip daddr ${DNAT_VIP} udp dport ${PERF_PORT} dnat to ${tb.podIp('n4-t1')}; }
  chain post { type nat hook postrouting priority srcnat; ct status dnat masquerade; }
}
` });
      await tb.mustExec('n1', ['ip', 'route', 'replace', `${DNAT_VIP}/32`, 'dev', 'lo', 'table', String(EXPORT_TABLE)]);
      await announced(tb, DNAT_VIP, ['n1']);
      servers.push(tb.spawn('n4-t1', ['iperf3', '-s', '-p', String(PERF_PORT)]));
      servers.push(tb.spawn('n4-t1', ['iperf3', '-s', '-p', String(VIP_PERF_PORT), '-B', st.perf]));
      await new Promise((r) => setTimeout(r, 500));

      const paths: Record<string, [string, number]> = { tether: [st.perf, VIP_PERF_PORT], dnat: [DNAT_VIP, PERF_PORT], plain: [tb.podIp('n4-t1'), PERF_PORT] };
      const tput: Record<string, Record<string, number>> = {};
      const measure = async (name: string, host: string, port: number) => {
        tput[name] = { ...(await pathThroughput(tb, host, port)) };
        process.stdout.write(`  ${name}: ${JSON.stringify(tput[name])}\n`);
      };
      for (const [name, [host, port]] of Object.entries(paths)) await measure(name, host, port);
      await routeThroughNode(tb, 'n4-t1', true);
      await measure('viaNode', tb.podIp('n4-t1'), PERF_PORT);
      await routeThroughNode(tb, 'n4-t1', false);
      result.throughput = tput;
      result.ratios = {
        tetherVsPlain1: +(tput.tether.mbps1 / tput.plain.mbps1).toFixed(2),
        tetherVsPlain8: +(tput.tether.mbps8 / tput.plain.mbps8).toFixed(2),
        tetherVsDnat1: +(tput.tether.mbps1 / tput.dnat.mbps1).toFixed(2),
        tetherVsDnat8: +(tput.tether.mbps8 / tput.dnat.mbps8).toFixed(2),
        ppsVsPlain: +(tput.tether.pps64 / tput.plain.pps64).toFixed(2),
        ppsVsDnat: +(tput.tether.pps64 / tput.dnat.pps64).toFixed(2),
        tetherVsViaNode1: +(tput.tether.mbps1 / tput.viaNode.mbps1).toFixed(2),
        tetherVsViaNode8: +(tput.tether.mbps8 / tput.viaNode.mbps8).toFixed(2),
        ppsVsViaNode: +(tput.tether.pps64 / tput.viaNode.pps64).toFixed(2),
        viaNodeVsPlainPps: +(tput.viaNode.pps64 / tput.plain.pps64).toFixed(2),
      };

      // New connections per second at a steady target set (per-flow affinity, record on change).
      const targets = await startTargets(tb, ['n4-t1', 'n4-t2', 'n5-t3'], st.db);
      const raw = new Redis({ path: tb.redis.socketPath });
      try {
        // The target set holds still: each LB node's table is active, no change waits, and nothing is recorded.
        type Table = { mode: string; version?: number; pending?: unknown; recording: boolean };
        const tables = await until('the db VIP\'s table quiet on the LB nodes', async () => {
          const t = await Promise.all(PERF_LB_NODES.map(async (n) => ((await lbStatus(tb, n)) as unknown as { table?: Table } | undefined)?.table));
          return t.every((x) => x && x.mode === 'change' && !x.pending && !x.recording) ? t : undefined;
        }, 30_000);
        // Interleaved rounds (each burst lasts about a second), the median of each path. "Paused": through
        // the VIP with tetherd stopped (SIGSTOP) on the LB nodes, so the datapath alone picks and forwards: the
        // rate the datapath allows, and so what tetherd's work per connection (none is recorded at a steady
        // target set) costs on these 2 shared cores.
        // Each connection leaves the client a TIME_WAIT port for 60 s, and every round reuses the same two
        // destinations: the client gets the whole port range, so 2 × rounds × STORM stays well inside it per
        // destination (with the default 28k a third round waited on connect's port search: ~600/s on every path).
        await tb.mustExec('client', ['sysctl', '-q', '-w', 'net.ipv4.ip_local_port_range=1024 65535']);
        const runs: Record<'direct' | 'viaNode' | 'through' | 'paused', Array<{ perSecond: number; errors: number }>> = { direct: [], viaNode: [], through: [], paused: [] };
        // CPU of the LB nodes' tetherds and of Redis, and Redis's writes, while connections go straight to the
        // target (what they use anyway: beats, registry, health reports) and while they go through the VIP
        // (that plus whatever each new connection costs them).
        const recorders = () => [...PERF_LB_NODES.map((n) => tb.tetherd(n).pid!), tb.redis.pid!];
        const cpu = { direct: { ms: 0, s: 0 }, through: { ms: 0, s: 0 } };
        const writes = { direct: { writes: 0, scripts: 0, publishes: 0 }, through: { writes: 0, scripts: 0, publishes: 0 } };
        const mappingsBefore = await storedMappings(raw, tb.redisPrefix, st.db);
        const measured = async (which: 'direct' | 'through', host: string) => {
          const w0 = await storeCounters(raw);
          const c0 = cpuMs(recorders());
          const r = await storm(tb, host, STORM, { allowErrors: which === 'through' });
          cpu[which].ms += cpuMs(recorders()) - c0;
          cpu[which].s += STORM / r.perSecond;
          const w1 = await storeCounters(raw);
          for (const k of ['writes', 'scripts', 'publishes'] as const) writes[which][k] += w1[k] - w0[k];
          return r;
        };
        for (let round = 0; round < STORM_ROUNDS; round++) {
          runs.direct.push(await measured('direct', tb.podIp('n4-t2')));
          await routeThroughNode(tb, 'n4-t2', true);
          runs.viaNode.push(await storm(tb, tb.podIp('n4-t2'), STORM));
          await routeThroughNode(tb, 'n4-t2', false);
          runs.through.push(await measured('through', st.db));
          const paused = PERF_LB_NODES.map((n) => tb.tetherd(n).pid!);
          for (const pid of paused) signalTree(pid, 'SIGSTOP');
          try {
            runs.paused.push(await storm(tb, st.db, STORM, { allowErrors: true }));
          } finally {
            for (const pid of paused) signalTree(pid, 'SIGCONT');
          }
          // The resumed tetherds write what they missed (a few hundred ms of CPU): not in the next round's baseline.
          await new Promise((r) => setTimeout(r, 3000));
        }
        const median = (l: Array<{ perSecond: number; errors: number }>) => {
          const sorted = [...l].sort((x, y) => x.perSecond - y.perSecond);
          return { perSecond: sorted[Math.floor(sorted.length / 2)].perSecond, errors: l.reduce((n, x) => n + x.errors, 0), all: l.map((x) => Math.round(x.perSecond)) };
        };
        const direct = median(runs.direct);
        const viaNode = median(runs.viaNode);
        const through = median(runs.through);
        const pausedRate = median(runs.paused);
        await new Promise((r) => setTimeout(r, 1500));
        const stored = await storedMappings(raw, tb.redisPrefix, st.db);
        const viaVip = STORM * STORM_ROUNDS * 2;
        result.connections = {
          throughVipPerSecond: Math.round(through.perSecond), directPerSecond: Math.round(direct.perSecond), ratio: +(through.perSecond / direct.perSecond).toFixed(2),
          viaNodePerSecond: Math.round(viaNode.perSecond), viaNodeRatio: +(through.perSecond / viaNode.perSecond).toFixed(2), errors: through.errors,
          mappingsBefore, mappingsInRedis: stored, connections: viaVip,
          tetherdPausedPerSecond: Math.round(pausedRate.perSecond), pausedRatio: +(pausedRate.perSecond / direct.perSecond).toFixed(2), pausedErrors: pausedRate.errors, rounds: STORM_ROUNDS,
          table: tables[0],
        };
        // Store writes per new connection through the VIP at a steady target set (record on change: 0): the
        // mappings recorded over every round through the VIP (with tetherd running or paused), and Redis's
        // writes, script calls and publishes during the rounds through the VIP above the same time's worth of
        // the rounds straight to the target (the LB nodes' beats, the node registry and health reports).
        const excess = (k: 'writes' | 'scripts' | 'publishes') => writes.through[k] - (writes.direct[k] / cpu.direct.s) * cpu.through.s;
        const per = (x: number) => +(x / (STORM * STORM_ROUNDS)).toFixed(3);
        result.storeWrites = {
          mappingsPerConnection: +((stored - mappingsBefore) / viaVip).toFixed(3),
          writesPerConnection: per(excess('writes')), scriptCallsPerConnection: per(excess('scripts')), publishesPerConnection: per(excess('publishes')),
          through: writes.through, direct: writes.direct, throughS: +cpu.through.s.toFixed(2), directS: +cpu.direct.s.toFixed(2),
        };
        process.stdout.write(`  store writes: ${JSON.stringify(result.storeWrites)}\n`);
        // µs of CPU per connection through the VIP (the LB nodes' tetherds and Redis), above what they used in
        // the same time with the connections going straight to the target.
        const idleMsPerS = cpu.direct.ms / cpu.direct.s;
        result.recordingCpu = {
          throughMs: Math.round(cpu.through.ms), throughS: +cpu.through.s.toFixed(2), directMs: Math.round(cpu.direct.ms), directS: +cpu.direct.s.toFixed(2),
          usPerConnection: Math.round(((cpu.through.ms - idleMsPerS * cpu.through.s) * 1000) / (STORM * STORM_ROUNDS)),
          coresWhileThrough: +(cpu.through.ms / 1000 / cpu.through.s).toFixed(2),
        };
        process.stdout.write(`  LB nodes' CPU per connection: ${JSON.stringify(result.recordingCpu)}\n`);
        result.connectionRuns = { direct: direct.all, viaNode: viaNode.all, through: through.all, tetherdPaused: pausedRate.all };
        process.stdout.write(`  connections: ${JSON.stringify(result.connections)}\n`);

        if (DATAPATH === 'node') {
          // The LB pods' path in the same run: the uplink program off n1 and n2 (the VIPs' routes to the LB
          // pods stay), measured, then tetherd restarted there, which puts it back.
          for (const n of PERF_LB_NODES) await tb.mustExec(n, ['tc', 'filter', 'del', 'dev', 'eth0', 'ingress', 'pref', String(LB_NODE_TC.priority)]);
          await measure('tetherPod', st.perf, VIP_PERF_PORT);
          Object.assign(result.ratios as Record<string, number>, {
            podVsPlain1: +(tput.tetherPod.mbps1 / tput.plain.mbps1).toFixed(2),
            podVsPlain8: +(tput.tetherPod.mbps8 / tput.plain.mbps8).toFixed(2),
            podPpsVsPlain: +(tput.tetherPod.pps64 / tput.plain.pps64).toFixed(2),
          });
          const viaPods = await storm(tb, st.db, STORM);
          (result.connections as Record<string, number>).throughPodsPerSecond = Math.round(viaPods.perSecond);
          (result.connections as Record<string, number>).podsRatio = +(viaPods.perSecond / direct.perSecond).toFixed(2);
          for (const n of PERF_LB_NODES) await tb.restartTetherd(n);
          await until('the uplink program back on n1 and n2', async () => {
            for (const n of PERF_LB_NODES) if (!((await tb.status(n)) as unknown as { lbDatapath?: { attached?: boolean } }).lbDatapath?.attached) return false;
            return true;
          }, 30_000);
          await announced(tb, st.db, PERF_LB_NODES);
        }

        // Survival, one change at a time, 200 connections each.
        const survival: Array<{ path: string; change: string; intact: number; of: number; longestGapMs?: number }> = [];
        const run = async (change: string, fn: () => Promise<void>) => {
          const r = await traffic(tb, st.db, CONNS, 9000, fn, false);
          survival.push({ path: 'tether', change, intact: r.intact, of: CONNS, longestGapMs: r.maxGapAfterMarkMs });
          process.stdout.write(`  tether, ${change}: ${r.intact}/${CONNS}\n`);
        };
        await run('LB pod added on a new node (ECMP rehash)', async () => {
          await tb.addPod('n3', lbPodSpec);
          await announced(tb, st.db, ['n1', 'n2', 'n3']);
        });
        await run('LB pod removed gracefully', async () => {
          await tb.delPod('n1-lb');
          await announced(tb, st.db, ['n2', 'n3']);
        });
        await run('targets scaled out', async () => {
          await tb.addPod('n5', targetSpec('t4'));
          configure(tb, ['n4-t1', 'n4-t2', 'n5-t3', 'n5-t4']);
          await until('t4 a target', async () => (await lbStatus(tb, 'n5'))?.localTargets.includes('shop/t4'));
          await targets.add('n5-t4');
        });
        await run('tetherd restarted on an LB node', () => tb.restartTetherd('n3'));
        await run('Redis restarted empty', () => tb.restartRedis());
        await run('LB node killed', async () => {
          await tb.killTetherd('n2', 'SIGKILL');
          await tb.mustExec('n2', ['ip', 'link', 'set', 'eth0', 'down']);
          await announced(tb, st.db, ['n3']);
        });
        // The stateless baseline on the nodes still up (n1 has no LB pod now; n3 and n4 can announce).
        await tb.mustExec('n2', ['ip', 'link', 'set', 'eth0', 'up']).catch(() => undefined);
        const base = '198.51.100.201';
        const tgs = ['n4-t1', 'n4-t2', 'n5-t3'];
        await baselineAnnounce(tb, 'n1', base, tgs);
        await announced(tb, base, ['n1']);
        const baseRun = async (change: string, fn: () => Promise<void>) => {
          const r = await traffic(tb, base, CONNS, 9000, fn, false);
          survival.push({ path: 'stateless ECMP + DNAT', change, intact: r.intact, of: CONNS });
          process.stdout.write(`  baseline, ${change}: ${r.intact}/${CONNS}\n`);
        };
        await baseRun('LB node added (ECMP rehash)', async () => {
          await baselineAnnounce(tb, 'n3', base, tgs);
          await announced(tb, base, ['n1', 'n3']);
        });
        await baseRun('LB node withdrawn', async () => {
          await baselineWithdraw(tb, 'n1', base);
          await announced(tb, base, ['n3']);
        });
        result.survival = survival;
      } finally {
        raw.disconnect();
        await targets.stop().catch(() => undefined);
      }
    } finally {
      for (const s of servers) s.kill('SIGKILL');
      await bgp.stop();
    }
  });

  fs.mkdirSync(path.join(repo, 'results'), { recursive: true });
  const file = path.join(repo, 'results/bench-lb.json');
  // lb-switch.ts's rows (a run of their own) stay.
  const before = fs.existsSync(file) ? (JSON.parse(fs.readFileSync(file, 'utf8')) as Record<string, unknown>) : {};
  if (before.tableChange) result.tableChange = before.tableChange;
  fs.writeFileSync(file, JSON.stringify(result, null, 2) + '\n');
  const t = result.throughput as Record<string, Record<string, number>>;
  const r = result.ratios as Record<string, number>;
  const l = result.load as { totalMs: number; loadMs: number; installMs: number; written: number };
  const c = result.connections as Record<string, number>;
  const w = result.storeWrites as Record<string, number>;
  const cpuUs = (result.recordingCpu as Record<string, number>).usPerConnection;
  const s = result.survival as Array<{ path: string; change: string; intact: number; of: number }>;
  const row = (label: string, x: Record<string, number>) => `| ${label} | ${x.mbps1} Mbit/s | ${x.mbps8} Mbit/s | ${x.pps64} pkt/s |`;
  const rows = [
    row(`tether VIP, ${DATAPATH} datapath (ECMP → ${DATAPATH === 'node' ? 'LB node\'s uplink' : 'LB pod'}, eBPF, FoU, DSR)`, t.tether),
    ...(t.tetherPod ? [row('tether VIP, pod datapath (ECMP → LB pod, eBPF, FoU, DSR)', t.tetherPod)] : []),
    row('iptables DNAT (kube-proxy style, one node)', t.dnat),
    row('plain routing through an LB node (router → n1 → target\'s node: the hops of any L4 LB on its own node)', t.viaNode),
  ];
  const md = `Measured by \`test/bench/lb.ts\` (part of \`npm run bench\`) on ${String((result.machine as Record<string, unknown>).cpu ?? 'this machine')}; raw numbers in \`results/bench-lb.json\`.

| path (client → same target pod) | 1 stream | 8 streams | 64-byte UDP |
|---|---|---|---|
${rows.join('\n')}
| plain routing (the floor) | ${t.plain.mbps1} Mbit/s | ${t.plain.mbps8} Mbit/s | ${t.plain.pps64} pkt/s |

Ratios (tether: the ${DATAPATH} datapath): tether / plain ${r.tetherVsPlain1} (1 stream), ${r.tetherVsPlain8} (8 streams), ${r.ppsVsPlain} (packets); tether / DNAT ${r.tetherVsDnat1}, ${r.tetherVsDnat8}, ${r.ppsVsDnat}; tether / plain routing through an LB node ${r.tetherVsViaNode1}, ${r.tetherVsViaNode8}, ${r.ppsVsViaNode} (that path's packets / plain: ${r.viaNodeVsPlainPps}).${t.tetherPod ? ` The pod datapath in the same run: / plain ${r.podVsPlain1}, ${r.podVsPlain8}, ${r.podPpsVsPlain}.` : ''}

- ${l.written} mappings loaded into a new LB pod's maps in ${l.totalMs.toFixed(0)} ms (Redis ${l.loadMs.toFixed(0)} ms, maps ${l.installMs.toFixed(0)} ms).
- New connections at a steady target set (record on change: each pick stays in the LB node's map, nothing is written to the store): ${c.throughVipPerSecond}/s through the VIP (${DATAPATH} datapath), against ${c.directPerSecond}/s straight to a target (${c.ratio}×) and ${c.viaNodePerSecond}/s routed to it through an LB node (${c.viaNodeRatio}×)${c.throughPodsPerSecond ? `; ${c.throughPodsPerSecond}/s through the LB pods (${c.podsRatio}×)` : ''}; with tetherd stopped on the LB nodes (the datapath alone) ${c.tetherdPausedPerSecond}/s (${c.pausedRatio}×); medians of ${c.rounds} interleaved rounds, ${c.errors} errors.
- Store writes per new connection through the VIP: ${w.mappingsPerConnection} mappings recorded (${c.mappingsBefore} in Redis before the rounds, ${c.mappingsInRedis} after ${c.connections} connections through the VIP); Redis's writes during the bursts through the VIP above its rate during those straight to the target (the LB nodes' beats, registry, health reports): ${w.writesPerConnection} per connection${Math.abs(w.writesPerConnection) < 0.05 ? ' (none: what is left is that background\'s own variation)' : ''} (script calls ${w.scriptCallsPerConnection}, publishes ${w.publishesPerConnection}).
- CPU: the LB nodes' tetherds and Redis used ${cpuUs} µs per connection through the VIP above what they used in the same time while connections went straight to the target${cpuUs <= 0 ? ' (nothing measurable: they used no more than in the bursts straight to the target)' : ''}; ${(result.recordingCpu as Record<string, number>).coresWhileThrough} cores' worth during the bursts through the VIP, on a machine of 2 cores that also runs the client, the targets and the kernel's forwarding. What recording every pick costs (externalTrafficPolicy Local, and while a change is under way) is measured apart by \`test/bench/lb-record.ts\`.

| path | change | connections intact |
|---|---|---|
${s.map((x) => `| ${x.path} | ${x.change} | ${x.intact}/${x.of} |`).join('\n')}
`;
  updateReadme(path.join(repo, 'README.md'), 'lb', md);
  process.stdout.write(md);
}

if (require.main === module) {
  main().then(() => process.exit(0), (e) => {
    process.stderr.write(`lb bench failed: ${(e as Error).stack}\n`);
    process.exit(1);
  });
}
