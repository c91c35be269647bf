// npm run bench:scale — the control plane of N simulated nodes (sim.ts) against a real Redis: store load
// per node and in total at steady state, memory per simulated node, time for every node to agree after a
// gateway node is lost, mapping fan-out per new connection, and the load of churn. Writes
// results/bench-scale.json and the README's bench:scale block.
//
//   tsx test/bench/scale/run.ts [--sizes 50,200,500,1000] [--window 10] [--workers 2] [--baseline] [--merge] [--report-only]
//
// --baseline also writes results/bench-scale-baseline.json (the run on the code before issue 21's changes).
// Store: a standalone redis-server started like the tests do, or with TETHER_SIM_STORE=cluster the 3-primary
// Redis Cluster of test/lib/redis-cluster.ts (commands and bytes summed over its primaries).
import * as fs from 'node:fs';
import * as path from 'node:path';
import { parseArgs } from 'node:util';
import Redis from 'ioredis';
import { startRedis } from '../../lib/redis';
import { startRedisCluster } from '../../lib/redis-cluster';
import { machine, updateReadme } from '../stats';
import { addressBase, apiObjects, commonFor, nodeObject, nodeSpec as nodeSpecAt, NS, placePods, podObject, Sim, SimApi, type Scenario, type SimWorker } from './sim';
import type { ApiLoad } from './api-proc';
import { runMillion, type MillionResult } from './mappings-1m';
import type { NodeSpec } from './worker';

const ROOT = path.resolve(__dirname, '../../..');
const args = parseArgs({
  options: {
    sizes: { type: 'string', default: '50,200,500,1000' },
    window: { type: 'string', default: '10' },
    workers: { type: 'string', default: '2' },
    egresses: { type: 'string', default: '100' },
    services: { type: 'string', default: '1000' },
    baseline: { type: 'boolean', default: false },
    out: { type: 'string', default: path.join(ROOT, 'results/bench-scale.json') },
    'no-readme': { type: 'boolean', default: false },
    merge: { type: 'boolean', default: false },
    'report-only': { type: 'boolean', default: false },
    api: { type: 'string', default: 'kube' },
    'mappings-1m': { type: 'boolean', default: false },
    mappings: { type: 'string', default: '1000000' },
    'start-budget': { type: 'string', default: '600' },
  },
}).values;
// --sizes none: no simulation (e.g. only --mappings-1m, with --merge to keep the rows measured before).
const SIZES = args.sizes === 'none' ? [] : args.sizes!.split(',').map(Number);
/** --mappings-1m: the 1M-mappings phase's result (mappings-1m.ts), kept in the report. */
let million: MillionResult | undefined;
const WINDOW_S = Number(args.window);
const MAIN_WORKERS = Number(args.workers);
const SCENARIO: Scenario = { egresses: Number(args.egresses), gatewaysPerEgress: 3, services: Number(args.services), lbPodsPerService: 2, targetsPerService: 2 };
/** Nodes 0..2 (egress e0's gateways) each run alone in a process, so losing one is a SIGKILL. */
const VICTIMS = 3;
const CHURN_STEP_MS = 30_000;
/** This run's node addresses: 127.<BASE>.x.y, drawn per run so overlapping runs do not collide (EADDRINUSE). */
const BASE = addressBase();
const nodeSpec = (i: number) => nodeSpecAt(i, BASE);
const API_MODE = args.api === 'file' ? 'file' : 'kube';
if (args.api !== 'file' && args.api !== 'kube') throw new Error(`--api ${args.api}: give kube (the fake API server) or file`);
/** Kube mode: the fake API server's name for tether-operator's token (sim-operator.ts, in a worker of its own). */
const OPERATOR = 'tether-operator';
const MEMORY_LIMIT_GIB = Math.max(2, Math.floor(require('node:os').totalmem() / 2 ** 30) - 4);

let storeKind: 'standalone' | 'cluster' = process.env.TETHER_SIM_STORE === 'cluster' ? 'cluster' : 'standalone';
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const log = (m: string, x: Record<string, unknown> = {}) => process.stdout.write(`${new Date().toISOString()} ${m} ${Object.keys(x).length ? JSON.stringify(x) : ''}\n`);
const round = (x: number, d = 1) => Math.round(x * 10 ** d) / 10 ** d;

interface Store {
  url: string;
  kind: 'standalone' | 'cluster';
  /** INFO commands each counters() call adds per primary (taken out of the rates). */
  probeCommands: number;
  /** INFO stats counters summed over the store's primaries. */
  counters(): Promise<{ commands: number; outBytes: number; inBytes: number; clients: number; byCommand: Record<string, number> }>;
  stop(): Promise<void>;
}

/** INFO commandstats → calls per command (summed over the strings given). */
const byCommand = (infos: string[]) => {
  const out: Record<string, number> = {};
  for (const i of infos) for (const m of i.matchAll(/^cmdstat_([^:]+):calls=(\d+)/gm)) out[m[1]] = (out[m[1]] ?? 0) + Number(m[2]);
  return out;
};
const infoField = (info: string, name: string) => Number(new RegExp(`^${name}:(\\d+)`, 'm').exec(info)?.[1] ?? 0);

async function startStore(): Promise<Store> {
  if (process.env.TETHER_SIM_STORE === 'cluster') return startClusterStore();
  const r = await startRedis();
  const admin = new Redis({ path: r.socketPath });
  await admin.config('SET', 'maxclients', '15000');
  return {
    url: r.url,
    kind: 'standalone',
    probeCommands: 1,
    async counters() {
      const info = await admin.info('all');
      return { commands: infoField(info, 'total_commands_processed'), outBytes: infoField(info, 'total_net_output_bytes'), inBytes: infoField(info, 'total_net_input_bytes'), clients: infoField(info, 'connected_clients'), byCommand: byCommand([info]) };
    },
    async stop() {
      admin.disconnect();
      await r.stop();
    },
  };
}

/**
 * TETHER_SIM_STORE=cluster: a 3-primary (+3 replicas) Redis Cluster from test/lib/redis-cluster.ts; the
 * nodes get its redis+cluster:// URL. Counters are INFO stats summed over every primary serving slots
 * (replicas' replication traffic is not client load: Redis 7 counts it apart, total_net_repl_*).
 */
async function startClusterStore(): Promise<Store> {
  const c = await startRedisCluster();
  try {
    const primaries = (await c.nodes()).filter((n) => n.role === 'master' && !n.failed && n.slots.length).map((n) => n.port);
    if (primaries.length !== 3) throw new Error(`expected 3 primaries, the cluster has ${primaries.length}`);
    await Promise.all(c.ports.map((p) => c.cli(p, 'config', 'set', 'maxclients', '15000')));
    const admins = primaries.map((port) => new Redis({ host: '127.0.0.1', port, lazyConnect: false }));
    return {
      url: c.url,
      kind: 'cluster',
      probeCommands: primaries.length,
      async counters() {
        const infos = await Promise.all(admins.map((a) => a.info('all')));
        const sum = (name: string) => infos.reduce((acc, i) => acc + infoField(i, name), 0);
        return { commands: sum('total_commands_processed'), outBytes: sum('total_net_output_bytes'), inBytes: sum('total_net_input_bytes'), clients: sum('connected_clients'), byCommand: byCommand(infos) };
      },
      async stop() {
        for (const a of admins) a.disconnect();
        await c.stop();
      },
    };
  } catch (e) {
    await c.stop();
    throw e;
  }
}

interface WorkerStats {
  nodes: number;
  rss: number;
  heapUsed: number;
  commandsSent: number;
  lbNotices: number;
  calls: Record<string, number>;
  loopLag: { p50Ms: number; p99Ms: number; maxMs: number };
}

async function until<T>(fn: () => Promise<T | undefined>, timeoutMs: number, everyMs = 100): Promise<{ value?: T; ms: number }> {
  const t0 = Date.now();
  for (;;) {
    const v = await fn().catch(() => undefined);
    if (v !== undefined) return { value: v, ms: Date.now() - t0 };
    if (Date.now() - t0 > timeoutMs) return { ms: Date.now() - t0 };
    await sleep(everyMs);
  }
}

/** API load between two tallies of the fake: per simulated node (mean and max) and tether-operator's, per second. */
function apiRates(a0: ApiLoad, a1: ApiLoad, names: Set<string>, secs: number) {
  const zero = { requests: 0, lists: 0, watches: 0, writes: 0, events: 0, bytes: 0 };
  const per = [...names].map((name) => {
    const x = a1.clients[name] ?? zero;
    const y = a0.clients[name] ?? zero;
    return { name, requests: (x.requests - y.requests) / secs, writes: (x.writes - y.writes) / secs, events: (x.events - y.events) / secs, bytes: (x.bytes - y.bytes) / secs };
  });
  // tether-operator (status, labels: per-cluster work) is reported apart; the per-node figures are the nodes'.
  const op = a1.clients[OPERATOR];
  const op0 = a0.clients[OPERATOR] ?? zero;
  const leader = op && { name: OPERATOR, requests: (op.requests - op0.requests) / secs, writes: (op.writes - op0.writes) / secs, events: (op.events - op0.events) / secs, bytes: (op.bytes - op0.bytes) / secs };
  const others = per;
  const mean = (k: 'requests' | 'events' | 'bytes' | 'writes') => others.reduce((a, p) => a + p[k], 0) / Math.max(1, others.length);
  const max = (k: 'requests' | 'events' | 'bytes') => others.reduce((a, p) => (p[k] > a[k] ? p : a), others[0] ?? { name: '-', requests: 0, events: 0, bytes: 0, writes: 0 });
  return {
    requestsPerSecPerNode: round(mean('requests'), 3), watchEventsPerSecPerNode: round(mean('events'), 3), bytesPerSecPerNode: round(mean('bytes')),
    maxNode: { requests: { node: max('requests').name, perSec: round(max('requests').requests, 3) }, events: { node: max('events').name, perSec: round(max('events').events, 3) }, bytes: { node: max('bytes').name, perSec: round(max('bytes').bytes) } },
    operator: leader ? { client: leader.name, requestsPerSec: round(leader.requests, 2), writesPerSec: round(leader.writes, 2), eventsPerSec: round(leader.events, 2), bytesPerSec: round(leader.bytes) } : undefined,
    nodesCounted: per.length,
  };
}

async function runSize(sim: Sim, n: number): Promise<Record<string, unknown>> {
  const store = await startStore();
  const runDir = path.join(sim.dir, `n${n}`);
  fs.mkdirSync(runDir, { recursive: true });
  let api: SimApi | undefined;
  let common;
  if (API_MODE === 'kube') {
    api = await SimApi.start(path.join(runDir, 'apiserver.log'));
    await api.apply(apiObjects(SCENARIO, n, BASE));
    common = commonFor(sim, store.url, undefined, { dir: path.join(runDir, 'nodes'), apiUrl: api.url });
  } else {
    const configFile = path.join(runDir, 'config.yaml');
    const { writeScenario } = await import('./sim');
    writeScenario(configFile, SCENARIO, n);
    common = commonFor(sim, store.url, configFile, { dir: path.join(runDir, 'nodes') });
  }
  const specs = Array.from({ length: n }, (_, i) => nodeSpec(i));
  const owner = new Map<string, SimWorker>();
  const victims: SimWorker[] = [];
  const mains: SimWorker[] = [];
  const t0 = Date.now();
  try {
    for (let i = 0; i < Math.min(VICTIMS, n); i++) victims.push(await sim.fork(path.join(runDir, `victim-${i}.log`)));
    for (let i = 0; i < MAIN_WORKERS; i++) mains.push(await sim.fork(path.join(runDir, `worker-${i}.log`)));
    // Kube mode: tether-operator (its status passes are per-cluster work) runs in a process of its own, as
    // it runs in a Deployment of its own, not on the main workers' nodes' CPU time.
    const ctl = API_MODE === 'kube' ? await sim.fork(path.join(runDir, 'operator.log')) : undefined;
    if (ctl) await ctl.ask({ op: 'startOperator', common });
    const placement = new Map<SimWorker, NodeSpec[]>();
    let m = 0;
    specs.forEach((s, i) => {
      const w = i < victims.length ? victims[i] : mains[m++ % mains.length];
      owner.set(s.name, w);
      placement.set(w, [...(placement.get(w) ?? []), s]);
    });
    const alive = specs.map((s) => s.address);
    // Start-up is bounded (--start-budget s): a size that cannot start in time is a row naming that, and
    // the run goes on to write what it measured.
    const budgetMs = Number(args['start-budget']) * 1000;
    let budget: NodeJS.Timeout | undefined;
    const started = await Promise.race([
      Promise.all([...placement].map(([w, nodes]) => w.ask<{ started: string[]; failed: Array<{ name: string; error: string }> }>({ op: 'start', common, nodes, alive }))),
      new Promise<never>((_, reject) => {
        budget = setTimeout(() => reject(new Error(`${n} simulated nodes did not all start within ${budgetMs / 1000} s (see the workers' "started k/m" lines)`)), budgetMs);
      }),
    ]).finally(() => clearTimeout(budget));
    const failed = started.flatMap((s) => s.failed);
    if (failed.length) throw new Error(`${failed.length} simulated nodes failed to start, e.g. ${failed[0].name}: ${failed[0].error}`);
    const startMs = Date.now() - t0;
    log('nodes started', { n, startMs });
    const pods = placePods(SCENARIO, n);
    const byWorker = new Map<SimWorker, Array<{ node: string; pod: (typeof pods)[number]['pod'] }>>();
    for (const p of pods) {
      const w = owner.get(specs[p.node].name)!;
      byWorker.set(w, [...(byWorker.get(w) ?? []), { node: specs[p.node].name, pod: p.pod }]);
    }
    await Promise.all([...byWorker].map(([w, list]) => w.ask({ op: 'addPods', pods: list })));

    // Convergence: for every Egress, every node tracking it sees the same owner node.
    const live = () => sim.workers.filter((w) => !w.exited);
    const view = async () => Object.assign({}, ...(await Promise.all(live().map((w) => w.ask<Record<string, Record<string, string>>>({ op: 'egressView' }))))) as Record<string, Record<string, string>>;
    const agreedAll = async () => {
      const v = await view();
      const owners = new Map<string, Set<string>>();
      for (const per of Object.values(v)) for (const [k, o] of Object.entries(per)) owners.set(k.split('/').slice(0, 2).join('/'), (owners.get(k.split('/').slice(0, 2).join('/')) ?? new Set()).add(o));
      const ok = [...owners.values()].filter((s) => s.size === 1 && !s.has('')).length;
      return owners.size >= SCENARIO.egresses && ok === owners.size ? ok : undefined;
    };
    const conv = await until(agreedAll, 240_000, 1000);
    log('converged', { n, ok: conv.value !== undefined, ms: conv.ms });
    // The load balancer settled too: every node holds the VIPs it needs (the operator every
    // one), and the operator's status writes for them are done (3 s without one): the window measures the
    // steady state, not the tail of the start.
    const lbSettled = await until(async () => {
      const pending = (await Promise.all(live().map((w) => w.ask<number>({ op: 'lbPending' })))).reduce((a, b) => a + b, 0);
      if (pending) return undefined;
      if (!api) return true;
      const writes = async () => Object.values((await api!.load()).clients).reduce((a, c) => a + c.writes, 0);
      const w0 = await writes();
      await sleep(3000);
      return (await writes()) === w0 ? true : undefined;
    }, 240_000, 1000);
    log('lb settled', { n, ok: lbSettled.value !== undefined, ms: lbSettled.ms });
    await sleep(2000);

    // Steady state window.
    const statsAllDef = () => Promise.all(mains.concat(victims, ctl ? [ctl] : []).filter((w) => !w.exited).map((w) => w.ask<WorkerStats>({ op: 'stats' })));
    const statsAll = statsAllDef;
    const names = new Set(specs.map((x) => x.name));
    const aStart = await api?.load();
    const c0 = await store.counters();
    const s0 = await statsAll();
    const a0 = await api?.load();
    const w0 = Date.now();
    // TETHER_SIM_STEADY_PROF=<dir>: each worker's CPU profile of this window (steady state only).
    const profDir = process.env.TETHER_SIM_STEADY_PROF && path.resolve(process.env.TETHER_SIM_STEADY_PROF);
    const profiled = live();
    if (profDir) await Promise.all(profiled.map((w) => w.ask({ op: 'profStart' })));
    await sleep(WINDOW_S * 1000);
    if (profDir) {
      fs.mkdirSync(profDir, { recursive: true });
      await Promise.all(profiled.map((w, i) => w.ask({ op: 'profStop', file: path.join(profDir, `n${n}-w${i}-${w === ctl ? 'operator' : victims.includes(w) ? 'victim' : 'main'}.cpuprofile`) })));
    }
    const c1 = await store.counters();
    const s1 = await statsAll();
    const a1 = await api?.load();
    storeKind = store.kind;
    const secs = (Date.now() - w0) / 1000;
    const apiSteady = a0 && a1 ? apiRates(a0, a1, names, secs) : undefined;
    // Start-up (lists and first watches, up to convergence), per node: requests and bytes.
    const apiStart = aStart ? apiRates({ clients: {}, openWatches: 0, rss: 0, cpuUserMs: 0, cpuSystemMs: 0 }, aStart, names, 1) : undefined;
    if (apiSteady) log('api steady', { n, ...apiSteady, openWatches: a1!.openWatches });
    const cmds = (c1.commands - c0.commands - store.probeCommands) / secs;
    const outB = (c1.outBytes - c0.outBytes) / secs;
    const sent = (s1.reduce((a, s) => a + s.commandsSent, 0) - s0.reduce((a, s) => a + s.commandsSent, 0)) / secs;
    const mainStats = s1.slice(0, mains.length);
    const mainNodes = mainStats.reduce((a, s) => a + s.nodes, 0);
    const rssPerNode = mainStats.reduce((a, s) => a + s.rss, 0) / Math.max(1, mainNodes);
    const heapPerNode = mainStats.reduce((a, s) => a + s.heapUsed, 0) / Math.max(1, mainNodes);
    const calls = s1.reduce((acc, s) => {
      for (const [k, v] of Object.entries(s.calls)) acc[k] = (acc[k] ?? 0) + v;
      return acc;
    }, {} as Record<string, number>);
    // Which commands the steady state is made of (INFO commandstats deltas), per node per second.
    const perCommand = Object.fromEntries(Object.entries(c1.byCommand).map(([k, v]) => [k, round((v - (c0.byCommand[k] ?? 0)) / secs / n, 2)]).filter(([, v]) => (v as number) > 0).sort((a, b) => (b[1] as number) - (a[1] as number)));
    // The main workers' event loop delay over the window (s1 answers for the window since s0 reset it).
    const loopLag = { p50Ms: Math.max(...mainStats.map((x) => x.loopLag.p50Ms)), p99Ms: Math.max(...mainStats.map((x) => x.loopLag.p99Ms)), maxMs: Math.max(...mainStats.map((x) => x.loopLag.maxMs)) };
    // Member-set reads in the window by reply mode, summed over the workers (diagnostics: whole reads are the costly ones).
    const modes: Record<string, number[]> = {};
    for (const [i, x] of s1.entries()) {
      const m1 = (x as unknown as { memberReads?: Record<string, number[]> }).memberReads ?? {};
      const m0 = (s0[i] as unknown as { memberReads?: Record<string, number[]> })?.memberReads ?? {};
      for (const [b, v] of Object.entries(m1)) modes[b] = v.map((c, k) => (modes[b]?.[k] ?? 0) + c - (m0[b]?.[k] ?? 0));
    }
    const whole = s1.flatMap((x) => (x as unknown as { wholeReads?: unknown[] }).wholeReads ?? []).slice(0, 6);
    log('member reads', { n, modes, whole });
    log('steady', { n, loopLag, perCommand, cmds: round(cmds), outB: round(outB), perNodeCmds: round(cmds / n, 2), perNodeOutB: round(outB / n), rssPerNodeMiB: round(rssPerNode / 2 ** 20, 2) });

    // Load balancer: refused Services and mapping fan-out per new connection.
    const lbNode = specs[(10 * SCENARIO.lbPodsPerService) % n].name;
    const lbs = await owner.get(lbNode)!.ask<Array<{ service: string; vip?: string; problem?: string; refused?: string[] }>>({ op: 'lbStatus', node: lbNode });
    const refused = lbs.filter((l) => l.problem).length;
    const sampleProblem = lbs.find((l) => l.problem)?.problem;
    const served = lbs.find((l) => l.vip && !l.problem && l.service === `${NS}/s10`) ?? lbs.find((l) => l.vip && !l.problem);
    let fanOut: number | undefined;
    let receivedBy: number | undefined;
    if (served?.vip) {
      const holders: number[] = [];
      const svc = served.service.split('/')[1];
      const target = pods.find((p) => p.pod.labels.app === svc)?.pod.ip ?? '10.128.0.1';
      const notices0 = (await statsAll()).reduce((a, s) => a + s.lbNotices, 0);
      for (let i = 0; i < 10; i++) {
        const key = { vip: served.vip, client: `198.51.100.${10 + i}`, vport: 80, cport: 40000 + i, proto: 6 };
        await owner.get(lbNode)!.ask({ op: 'lbConnect', node: lbNode, key, target });
        await sleep(1500);
        const counts = await Promise.all(live().map((w) => w.ask<number>({ op: 'lbHolders', key })));
        holders.push(counts.reduce((a, b) => a + b, 0) - 1); // other nodes that received it
      }
      fanOut = holders.reduce((a, b) => a + b, 0) / holders.length;
      receivedBy = ((await statsAll()).reduce((a, s) => a + s.lbNotices, 0) - notices0) / holders.length;
    }
    log('lb', { n, lbServicesSeen: lbs.length, refused, fanOut, receivedBy, service: served?.service });

    // Loss: the owner of e0 (on a victim process) is killed; every node must agree on a live new owner.
    const e0 = `${NS}/e0`;
    const owners0 = Object.assign({}, ...(await Promise.all(live().map((w) => w.ask<Record<string, string>>({ op: 'egressOwners', egress: e0 }))))) as Record<string, string>;
    const lostName = Object.values(owners0)[0];
    const lostIdx = specs.findIndex((s) => s.name === lostName);
    let agreeMs: number | undefined;
    let agreeNodes = 0;
    if (lostIdx >= 0 && lostIdx < victims.length) {
      const lost = specs[lostIdx];
      const tKill = Date.now();
      victims[lostIdx].proc.kill('SIGKILL');
      await Promise.all(live().filter((w) => w !== victims[lostIdx]).map((w) => w.ask({ op: 'alive', address: lost.address, alive: false })));
      const r = await until(async () => {
        const o = Object.assign({}, ...(await Promise.all(live().filter((w) => w !== victims[lostIdx]).map((w) => w.ask<Record<string, string>>({ op: 'egressOwners', egress: e0 }))))) as Record<string, string>;
        const set = new Set(Object.values(o));
        return set.size === 1 && !set.has(lost.name) && !set.has('') ? Object.keys(o).length : undefined;
      }, 60_000, 50);
      agreeMs = r.value !== undefined ? Date.now() - tKill : undefined;
      agreeNodes = r.value ?? 0;
    }
    log('loss', { n, lost: lostName, agreeMs, agreeNodes });

    // Churn: a node added, gateway pods added and removed, client pods added; its store load over a window.
    // Each step is bounded (CHURN_STEP_MS): a step that does not answer is named in the row, not waited for.
    const timedOut: string[] = [];
    const bounded = <T>(label: string, p: Promise<T>): Promise<T | undefined> => {
      let done = false;
      return Promise.race([
        p.catch(() => undefined).finally(() => (done = true)),
        sleep(CHURN_STEP_MS).then(() => {
          if (!done) timedOut.push(label);
          return undefined;
        }),
      ]);
    };
    const cc0 = await store.counters();
    const ac0 = await api?.load();
    const tc = Date.now();
    const extra = nodeSpec(n);
    // In kube mode the API server holds the churn too: the new Node and the pods added and removed.
    const gwExtra = { namespace: NS, name: 'gw-e1-extra', ip: '10.127.255.1', labels: { 'egress-gw': 'e1' } };
    await api?.apply([nodeObject(extra), podObject(extra.name, gwExtra)]);
    await bounded('alive', Promise.all(live().map((w) => w.ask({ op: 'alive', address: extra.address, alive: true }))));
    const joined = (await bounded('node start', mains[0].ask<{ failed: unknown[] }>({ op: 'start', common, nodes: [extra], alive: [] }))) ?? { failed: ['timed out'] };
    await bounded('gateway pod added', mains[0].ask({ op: 'addPods', pods: [{ node: extra.name, pod: gwExtra }] }));
    const gwVictim = placePods(SCENARIO, n).find((p) => p.pod.name === 'gw-e1-0')!;
    await api?.ask({ op: 'remove', kind: 'Pod', name: 'gw-e1-0', namespace: NS });
    await bounded('gateway pod removed', owner.get(specs[gwVictim.node].name)!.ask({ op: 'removePod', node: specs[gwVictim.node].name, namespace: NS, name: 'gw-e1-0' }));
    const clients = Array.from({ length: 20 }, (_, i) => ({ node: specs[(7 * i + 5) % n], pod: { namespace: NS, name: `client-churn-${i}`, ip: podIp2(i), labels: { 'egress-client': `e${i % Math.max(1, SCENARIO.egresses)}` } } }));
    await api?.apply(clients.map((c) => podObject(c.node.name, c.pod)));
    await bounded('client pods added', Promise.all(clients.map((c) => owner.get(c.node.name)!.ask({ op: 'addPods', pods: [{ node: c.node.name, pod: c.pod }] }))));
    await sleep(Math.max(0, WINDOW_S * 1000 - (Date.now() - tc)));
    const cc1 = await store.counters();
    const ac1 = await api?.load();
    const churnSecs = (Date.now() - tc) / 1000;
    const apiChurn = ac0 && ac1 ? apiRates(ac0, ac1, new Set([...names, extra.name]), churnSecs) : undefined;
    log('churn', { n, timedOut, joined: joined.failed.length === 0, cmds: round((cc1.commands - cc0.commands) / churnSecs), api: apiChurn && { requestsPerSecPerNode: apiChurn.requestsPerSecPerNode, watchEventsPerSecPerNode: apiChurn.watchEventsPerSecPerNode } });

    return {
      nodes: n,
      workers: mains.length + victims.length + (ctl ? 1 : 0),
      startMs,
      convergedMs: conv.value !== undefined ? conv.ms : undefined,
      store: {
        kind: store.kind,
        commandsPerSec: round(cmds),
        replyBytesPerSec: round(outB),
        commandsPerSecPerNode: round(cmds / n, 2),
        replyBytesPerSecPerNode: round(outB / n),
        clientCountedCommandsPerSec: round(sent),
        commandsPerSecPerNodeByCommand: perCommand,
        connections: c1.clients,
      },
      workerLoopLagMs: loopLag,
      memory: { rssPerNodeMiB: round(rssPerNode / 2 ** 20, 2), heapPerNodeMiB: round(heapPerNode / 2 ** 20, 2), rssTotalMiB: round(s1.reduce((a, s) => a + s.rss, 0) / 2 ** 20) },
      loss: { lostNode: lostName, agreeMs, nodesAgreeing: agreeNodes },
      lb: { servicesSeenByOneNode: lbs.length, refusedAtOneNode: refused, sampleProblem, fanOutPerNewConnection: receivedBy, installedOnOtherNodesPerNewConnection: fanOut, mappingsInstalledTotal: calls['lb.mappingsInstalled'] ?? 0 },
      churn: { timedOut, windowS: round(churnSecs), commandsPerSec: round((cc1.commands - cc0.commands) / churnSecs), nodeJoined: joined.failed.length === 0 },
      api: api
        ? {
          mode: 'kube', server: 'test/lib/fake-apiserver.ts (a fake) in one process, serving every node',
          operator: 'tether-operator, 1 replica, in a worker of its own', openWatches: a1?.openWatches, steady: apiSteady, churn: apiChurn,
          startup: apiStart && { requestsPerNode: apiStart.requestsPerSecPerNode, bytesPerNode: apiStart.bytesPerSecPerNode, eventsPerNode: apiStart.watchEventsPerSecPerNode },
          fakeRssMiB: a1 && round(a1.rss / 2 ** 20), fakeCpuS: a1 && round((a1.cpuUserMs + a1.cpuSystemMs) / 1000),
        }
        : { mode: 'file', note: 'file config source (--api file): no API server' },
      datapathCalls: calls,
    };
  } finally {
    await Promise.all(sim.workers.splice(0).map(async (w) => {
      if (w.exited) return;
      const exited = new Promise((r) => w.proc.once('exit', r));
      await Promise.race([w.ask({ op: 'exit' }).catch(() => undefined), sleep(30_000)]);
      const t = setTimeout(() => w.proc.kill('SIGKILL'), 5000);
      await exited;
      clearTimeout(t);
    }));
    await api?.stop();
    await store.stop();
    fs.rmSync(runDir, { recursive: true, force: true });
  }
}

function podIp2(i: number): string {
  return `10.127.254.${i + 1}`;
}

/**
 * Total commands/s at `target` nodes from the measured curve, fitted as total = a + b·N (least squares):
 * a part that does not grow with N (per VIP and per Egress work, spread over however many nodes) plus a
 * per-node constant. (A per-node model a + b·N goes negative when per-node load falls with N, as it does
 * once the per-VIP work is spread over more nodes.) Never below the largest total measured.
 */
function extrapolate(rows: Array<{ n: number; total: number }>, target: number): number {
  if (rows.length === 1) return (rows[0].total / rows[0].n) * target;
  const mx = rows.reduce((a, r) => a + r.n, 0) / rows.length;
  const my = rows.reduce((a, r) => a + r.total, 0) / rows.length;
  const b = rows.reduce((a, r) => a + (r.n - mx) * (r.total - my), 0) / rows.reduce((a, r) => a + (r.n - mx) ** 2, 0);
  return Math.max(my + b * (target - mx), ...rows.map((r) => r.total));
}

async function main(): Promise<void> {
  // --merge: rows measured earlier (same scenario) are kept and this run's sizes replace theirs (per store
  // kind), so sizes can be run one at a time within a time budget. --report-only: no run, only the report.
  const earlier = args.merge || args['report-only'] ? readEarlier() : [];
  const rows: Array<Record<string, unknown>> = [];
  const all = () => [...earlier.filter((r) => !rows.some((x) => x.nodes === r.nodes && kindOf(x) === kindOf(r))), ...rows].sort((a, b) => kindOf(a).localeCompare(kindOf(b)) || Number(a.nodes) - Number(b.nodes));
  if (args['report-only']) return report(all());
  log('bundling the simulation');
  const sim = await Sim.create();
  log('substituted', { modules: sim.substituted });
  try {
    for (const n of SIZES) {
      const free = require('node:os').freemem() / 2 ** 30;
      const last = rows.at(-1) as { memory: { rssPerNodeMiB: number } } | undefined;
      if (last && (last.memory.rssPerNodeMiB * n) / 1024 > Math.min(free - 2, MEMORY_LIMIT_GIB)) {
        log('skipping: not enough memory', { n, needGiB: round((last.memory.rssPerNodeMiB * n) / 1024), freeGiB: round(free) });
        break;
      }
      log('running', { n });
      try {
        rows.push(await runSize(sim, n));
        report(all()); // written after every size: a run cut short keeps what it measured
      } catch (e) {
        log('size failed', { n, error: (e as Error).message });
        rows.push({ nodes: n, store: { kind: storeKind }, error: (e as Error).message });
        break;
      }
    }
  } finally {
    await sim.stop();
  }
  if (args['mappings-1m']) {
    log('1M mappings of one VIP in the Redis Cluster', { mappings: Number(args.mappings) });
    million = await runMillion(Number(args.mappings), log);
    log('1M mappings done', { ok: million.ok, errors: million.errors, writeMs: million.write.ms, loadMs: million.load.ms, expireMs: million.expire.ms });
  }
  report(all());
}

type Row = { nodes: number; error?: string; store: { kind: string; commandsPerSecPerNode: number; replyBytesPerSecPerNode: number; commandsPerSec: number; replyBytesPerSec: number } };
const kindOf = (r: Record<string, unknown>) => String((r.store as { kind?: string } | undefined)?.kind ?? 'standalone');

function readEarlier(): Array<Record<string, unknown>> {
  if (!fs.existsSync(args.out!)) return [];
  const old = JSON.parse(fs.readFileSync(args.out!, 'utf8')) as { scenario: Scenario; windowS?: number; rows: Array<Record<string, unknown>>; mappings1M?: MillionResult };
  million ??= old.mappings1M;
  if (JSON.stringify(old.scenario) !== JSON.stringify(SCENARIO)) throw new Error(`--merge: ${args.out} holds another scenario (${JSON.stringify(old.scenario)}; this run: ${JSON.stringify(SCENARIO)}); not mixing them`);
  return old.rows;
}

function apiOf(r: Row): Record<string, number> | undefined {
  const a = (r as unknown as { api?: { steady?: { requestsPerSecPerNode: number; watchEventsPerSecPerNode: number; bytesPerSecPerNode: number }; churn?: { requestsPerSecPerNode: number; watchEventsPerSecPerNode: number } } }).api;
  if (!a?.steady) return undefined;
  return { requestsPerSec: a.steady.requestsPerSecPerNode, watchEventsPerSec: a.steady.watchEventsPerSecPerNode, bytesPerSec: a.steady.bytesPerSecPerNode, churnRequestsPerSec: a.churn?.requestsPerSecPerNode ?? NaN, churnWatchEventsPerSec: a.churn?.watchEventsPerSecPerNode ?? NaN };
}

function summarize(rows: Row[]) {
  const ok = rows.filter((r) => !r.error);
  const first = ok.find((r) => r.nodes === 50) ?? ok[0];
  const largest = ok.at(-1)!;
  const at1000 = ok.find((r) => r.nodes === 1000);
  return {
    maxNodes: largest.nodes,
    perNodeGrowth: round(Math.max(largest.store.commandsPerSecPerNode / first.store.commandsPerSecPerNode, largest.store.replyBytesPerSecPerNode / first.store.replyBytesPerSecPerNode), 2),
    perNodeGrowthCommands: round(largest.store.commandsPerSecPerNode / first.store.commandsPerSecPerNode, 2),
    perNodeGrowthReplyBytes: round(largest.store.replyBytesPerSecPerNode / first.store.replyBytesPerSecPerNode, 2),
    perNodeGrowthBase: first.nodes,
    totalStoreOpsAt1000: Math.round(at1000 ? at1000.store.commandsPerSec : extrapolate(ok.map((r) => ({ n: r.nodes, total: r.store.commandsPerSec })), 1000)),
    totalStoreOpsAt1000Is: at1000 ? 'measured' : ok.length === 1 ? `extrapolated (per node x 1,000 from N = ${ok[0].nodes} alone)` : `extrapolated (total commands/s fitted as a + b·N over N = ${ok.map((r) => r.nodes).join(', ')})`,
    lbServices: SCENARIO.services,
    // API load per node (kube mode; tether-operator apart) at N = 50 and the largest N.
    ...(apiOf(first) && apiOf(largest) ? { apiPerNode: { [`n${first.nodes}`]: apiOf(first), [`n${largest.nodes}`]: apiOf(largest) } } : {}),
    egresses: SCENARIO.egresses,
    gatewaysPerEgress: SCENARIO.gatewaysPerEgress,
  };
}

function report(rows: Array<Record<string, unknown>>): void {
  fs.mkdirSync(path.dirname(args.out!), { recursive: true });
  const ok = (rows as Row[]).filter((r) => !r.error);
  if (!ok.length) {
    fs.writeFileSync(args.out!, JSON.stringify({ benchmark: 'scale', machine: machine(), scenario: SCENARIO, rows, ...(million ? { mappings1M: million } : {}) }, null, 2) + '\n');
    return;
  }
  // The summary is over the standalone rows when there are any (the Cluster rows get their own).
  const standalone = ok.filter((r) => r.store.kind === 'standalone');
  const cluster = ok.filter((r) => r.store.kind === 'cluster');
  const main = standalone.length ? standalone : cluster;
  const summary = { ...summarize(main), store: main === standalone ? 'redis standalone' : 'redis cluster (3 primaries)', ...(cluster.length && main !== cluster ? { cluster: summarize(cluster) } : {}) };
  const m1 = million && { mappings: million.mappings, errors: million.errors, ok: million.ok, writeMs: million.write.ms, loadMs: million.load.ms, expireMs: million.expire.ms };
  const report = { benchmark: 'scale', machine: machine(), loadAverage1m: require('node:os').loadavg()[0], scenario: SCENARIO, windowS: WINDOW_S, summary: { ...summary, ...(m1 ? { mappings1M: m1 } : {}) }, rows, ...(million ? { mappings1M: million } : {}) };
  fs.writeFileSync(args.out!, JSON.stringify(report, null, 2) + '\n');
  if (args.baseline) fs.writeFileSync(path.join(ROOT, 'results/bench-scale-baseline.json'), JSON.stringify(report, null, 2) + '\n');
  log('summary', summary);
  if (!args['no-readme']) updateReadme(path.join(ROOT, 'README.md'), 'scale', table(report));
}

const fmt = (x: number) => (x >= 100 ? Math.round(x).toLocaleString('en-US') : String(round(x, 2)));

function table(r: { machine: Record<string, unknown>; summary: Record<string, any>; rows: Array<Record<string, unknown>> }): string {
  const m = r.machine;
  const lines = [
    `Measured ${String(m.date).slice(0, 10)} on ${m.cpu} (${m.cores} cores, shared with other work; ${m.memoryGiB} GiB), Node ${m.node}, Redis 7.0; ${SCENARIO.egresses} Egresses x ${SCENARIO.gatewaysPerEgress} gateways, ${SCENARIO.services} LB Services (${SCENARIO.lbPodsPerService} LB pods, ${SCENARIO.targetsPerService} targets each), steady window ${WINDOW_S} s.`,
    '',
    '| store | nodes | start s | store cmds/s | per node | sent by clients per node | reply B/s | per node | API req/s per node (steady / churn) | API watch events/s per node (steady / churn) | RSS/node MiB | worker loop lag p50/p99 ms | agree after loss ms | fan-out per new connection | Services refused (one node) | churn cmds/s |',
    '|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|',
  ];
  for (const row of r.rows as Array<Record<string, any>>) {
    if (row.error) {
      lines.push(`| ${kindOf(row)} | ${row.nodes} | failed: ${row.error} ||||||||||||||`);
      continue;
    }
    const lag = row.workerLoopLagMs ? `${row.workerLoopLagMs.p50Ms}/${row.workerLoopLagMs.p99Ms}` : '-';
    const a = row.api?.steady ? row.api : undefined;
    const apiReq = a ? `${a.steady.requestsPerSecPerNode} / ${a.churn?.requestsPerSecPerNode ?? '-'}` : 'file source';
    const apiEv = a ? `${a.steady.watchEventsPerSecPerNode} / ${a.churn?.watchEventsPerSecPerNode ?? '-'}` : '-';
    lines.push(`| ${row.store.kind} | ${row.nodes} | ${round(row.startMs / 1000)} | ${fmt(row.store.commandsPerSec)} | ${fmt(row.store.commandsPerSecPerNode)} | ${fmt(row.store.clientCountedCommandsPerSec / row.nodes)} | ${fmt(row.store.replyBytesPerSec)} | ${fmt(row.store.replyBytesPerSecPerNode)} | ${apiReq} | ${apiEv} | ${row.memory.rssPerNodeMiB} | ${lag} | ${row.loss.agreeMs ?? 'no agreement'} | ${row.lb.fanOutPerNewConnection ?? '-'} | ${row.lb.refusedAtOneNode} | ${fmt(row.churn.commandsPerSec)} |`);
  }
  const s = r.summary;
  lines.push('', `Summary (${s.store}): maxNodes ${s.maxNodes}, perNodeGrowth ${s.perNodeGrowth} (N = ${s.maxNodes} over N = ${s.perNodeGrowthBase}: commands/s x${s.perNodeGrowthCommands}, reply bytes/s x${s.perNodeGrowthReplyBytes}), totalStoreOpsAt1000 ${s.totalStoreOpsAt1000} (${s.totalStoreOpsAt1000Is}), lbServices ${s.lbServices}.`);
  if (s.apiPerNode) lines.push('', `API load per node (fake API server, tether-operator apart), steady / churn: ${Object.entries(s.apiPerNode as Record<string, Record<string, number>>).map(([k, v]) => `N = ${k.slice(1)}: ${v.requestsPerSec} / ${v.churnRequestsPerSec} requests/s, ${v.watchEventsPerSec} / ${v.churnWatchEventsPerSec} watch events/s, ${fmt(v.bytesPerSec)} B/s steady`).join('; ')}.`);
  if (million) lines.push('', `1M mappings of one VIP in the 3-primary Redis Cluster (daemon/lb/mapping-store.ts): ${million.mappings.toLocaleString('en-US')} claimed in ${round(million.write.ms / 1000)} s (${million.write.concurrentClaims} claims at once), loaded back in pages in ${round(million.load.ms / 1000)} s, expired by the VIP's expirer in ${round(million.expire.ms / 1000)} s; errors ${million.errors}${million.errors ? ` (${million.errorSamples.join('; ')})` : ''}; per primary (keys, mappings, used memory): ${million.perPrimary.map((p) => `${p.keys}, ${p.mappings.toLocaleString('en-US')}, ${p.usedMemoryMiB} MiB`).join(' | ')}; bench process RSS peak ${million.process.rssPeakMiB} MiB.`);
  if (s.cluster) lines.push(`Cluster rows: maxNodes ${s.cluster.maxNodes}, perNodeGrowth ${s.cluster.perNodeGrowth}, totalStoreOpsAt1000 ${s.cluster.totalStoreOpsAt1000} (${s.cluster.totalStoreOpsAt1000Is}).`);

  // Growth curve: per-node load by N (a flat curve is the target).
  const ok = (r.rows as Row[]).filter((x) => !x.error && x.store.kind === (s.store.startsWith('redis standalone') ? 'standalone' : 'cluster'));
  const maxC = Math.max(...ok.map((x) => x.store.commandsPerSecPerNode));
  const maxB = Math.max(...ok.map((x) => x.store.replyBytesPerSecPerNode));
  const bar = (v: number, max: number) => '#'.repeat(Math.max(1, Math.round((v / max) * 40)));
  lines.push('', 'Growth curve (per node, steady state; bars scaled to the largest value):', '', '```text');
  for (const x of ok) lines.push(`N=${String(x.nodes).padEnd(5)} cmds/s ${fmt(x.store.commandsPerSecPerNode).padStart(7)} ${bar(x.store.commandsPerSecPerNode, maxC)}`);
  for (const x of ok) lines.push(`N=${String(x.nodes).padEnd(5)} B/s    ${fmt(x.store.replyBytesPerSecPerNode).padStart(7)} ${bar(x.store.replyBytesPerSecPerNode, maxB)}`);
  lines.push('```');

  // Against the code before issue 21 (results/bench-scale-baseline.json), on the same scenario where one
  // was measured with the new code too (results/bench-scale-like-baseline.json).
  const basePath = path.join(ROOT, 'results/bench-scale-baseline.json');
  const likePath = path.join(ROOT, 'results/bench-scale-like-baseline.json');
  if (fs.existsSync(basePath)) {
    const base = JSON.parse(fs.readFileSync(basePath, 'utf8')) as { scenario: Scenario; rows: Row[] };
    const like = fs.existsSync(likePath) ? (JSON.parse(fs.readFileSync(likePath, 'utf8')) as { scenario: Scenario; rows: Row[] }) : undefined;
    lines.push('', '| code | scenario | nodes | store cmds/s | per node | reply B/s per node | new / old per node (cmds, bytes) |', '|---|---|---:|---:|---:|---:|---|');
    const sc = (x: Scenario) => `${x.egresses} Egresses, ${x.services} Services`;
    for (const b of base.rows.filter((x) => !x.error)) {
      lines.push(`| before issue 21 | ${sc(base.scenario)} | ${b.nodes} | ${fmt(b.store.commandsPerSec)} | ${fmt(b.store.commandsPerSecPerNode)} | ${fmt(b.store.replyBytesPerSecPerNode)} | |`);
      const pairs: Array<[string, Scenario, Row | undefined]> = [
        ['issue 21', base.scenario, like && JSON.stringify(like.scenario) === JSON.stringify(base.scenario) ? like.rows.find((x) => !x.error && x.nodes === b.nodes) : undefined],
        ['issue 21', SCENARIO, ok.find((x) => x.nodes === b.nodes)],
      ];
      for (const [code, scen, x] of pairs) {
        if (!x) continue;
        lines.push(`| ${code} | ${sc(scen)} | ${x.nodes} | ${fmt(x.store.commandsPerSec)} | ${fmt(x.store.commandsPerSecPerNode)} | ${fmt(x.store.replyBytesPerSecPerNode)} | ${round(x.store.commandsPerSecPerNode / b.store.commandsPerSecPerNode, 3)}x, ${round(x.store.replyBytesPerSecPerNode / b.store.replyBytesPerSecPerNode, 3)}x |`);
      }
    }
  }
  return lines.join('\n');
}

main().then(
  () => process.exit(0),
  (e) => {
    process.stderr.write(`bench:scale failed: ${(e as Error).stack}\n`);
    process.exit(1);
  },
);
