// A simulation worker process: hosts many simulated nodes (sim-node.ts), driven by the coordinator over
// IPC (process.send). Only ever run as the bundle bundle.ts builds (fakes in place of the kernel).
import * as fs from 'node:fs';
import * as path from 'node:path';
import { kubeconfigFor } from '../../lib/fake-apiserver';
import { monitorEventLoopDelay } from 'node:perf_hooks';
import { Session } from 'node:inspector/promises';
import Redis from 'ioredis';
import { makeLogger, setLogger } from '../../../lib/log';
import { SimNode, type SimPod } from './sim-node';
import { SimOperator } from './sim-operator';
import { MemberView } from '../../../daemon/common/member-registry';
import { setAlive } from './fakes/bfd-threaded';
import { lbDatapaths } from './fakes/bpf-lb';
import { recorded } from './fakes/record';
import type { MapKey } from '../../../daemon/bpf/lb-structs';

export interface NodeSpec {
  name: string;
  address: string;
}
export interface Common {
  redisUrl: string;
  redisPrefix: string;
  /** File mode: the scenario's config file. */
  configFile?: string;
  /** Kube mode: the fake API server's URL (each node gets a kubeconfig with its own token). */
  apiUrl?: string;
  clusterKeyFile: string;
  dir: string;
  maxVips: number;
  syncPort: number;
}
export type Request =
  | { op: 'start'; common: Common; nodes: NodeSpec[]; alive: string[] }
  /** Kube mode: tether-operator in this worker (its token "tether-operator"); answers whether it leads once started. */
  | { op: 'startOperator'; common: Common }
  | { op: 'operatorLeads' }
  | { op: 'alive'; address: string; alive: boolean }
  | { op: 'addPods'; pods: Array<{ node: string; pod: SimPod }> }
  | { op: 'removePod'; node: string; namespace: string; name: string }
  | { op: 'stopNode'; name: string }
  | { op: 'egressView' }
  | { op: 'egressOwners'; egress: string }
  | { op: 'stats' }
  | { op: 'lbConnect'; node: string; key: MapKey; target: string }
  | { op: 'lbHolders'; key: MapKey }
  | { op: 'lbStatus'; node: string }
  | { op: 'lbPending' }
  | { op: 'profStart' }
  | { op: 'profStop'; file: string }
  | { op: 'exit' };

// Quiet by default: N nodes' log lines (every refused Service, every store timeout) cost the simulation
// CPU the nodes need; TETHER_SIM_LOG_LEVEL=warn (or info) writes them to the worker's log file.
const logger = makeLogger({ level: process.env.TETHER_SIM_LOG_LEVEL ?? 'error' });
logger.silent = !process.env.TETHER_SIM_LOG_LEVEL;
setLogger(logger);
const nodes = new Map<string, SimNode>();
let operator: SimOperator | undefined;
// Event loop delay of this process since the last stats question: a worker whose loop lags by most of a
// second runs its nodes' 1 s passes less often than a real node would, and the rates measured undercount.
const loopDelay = monitorEventLoopDelay({ resolution: 20 });
loopDelay.enable();
const addresses = new Set<string>();
// TETHER_SIM_STEADY_PROF (run.ts): a CPU profile of the steady-state window only, start-up left out.
const profiler = new Session();
profiler.connect();

// The node addresses are the simulated nodes' interfaces (they are loopback addresses: 127/8 is local).
// eslint-disable-next-line @typescript-eslint/no-var-requires
const os = require('node:os') as typeof import('node:os');
const realInterfaces = os.networkInterfaces;
os.networkInterfaces = () => ({
  ...realInterfaces(),
  sim: [...addresses].map((address) => ({ address, netmask: '255.0.0.0', family: 'IPv4' as const, mac: '00:00:00:00:00:00', internal: true, cidr: `${address}/8` })),
});

// Client-side count of store commands sent by this process's nodes (every connection is an ioredis Redis).
let commandsSent = 0;
const send = Redis.prototype.sendCommand;
Redis.prototype.sendCommand = function (this: Redis, ...a: Parameters<typeof send>) {
  commandsSent++;
  return send.apply(this, a);
};

// Member-set reads by reply mode (0 nothing new, 1 changes, 2 the whole set), per set, and what a whole
// read was asked with (the reader's version against the set's): where whole reads come from.
const memberReads: Record<string, [number, number, number]> = {};
const wholeReads: Array<{ base: string; since: number; version: string }> = [];
const applyReply = (MemberView.prototype as unknown as { apply: (r: [string, number, string[]?]) => boolean }).apply;
(MemberView.prototype as unknown as { apply: (r: [string, number, string[]?]) => boolean }).apply = function (this: MemberView<unknown>, r: [string, number, string[]?]) {
  const base = this.base.replace(/egress:[^}]*/, 'egress:*');
  (memberReads[base] ??= [0, 0, 0])[r[1]]++;
  if (r[1] === 2 && wholeReads.length < 20) wholeReads.push({ base, since: this.version, version: r[0] });
  return applyReply.call(this, r);
};

// Load balancer mapping notices received by this process's nodes: deliveries on the per-VIP notice
// channels (tether:lb:{<vip>}:notices; 'message' on one server, 'smessage' by sharded pub/sub on a
// Cluster, whose subscriber connections are ioredis Redis instances too).
let lbNotices = 0;
const emit = Redis.prototype.emit;
Redis.prototype.emit = function (this: Redis, event: string | symbol, ...a: unknown[]) {
  if ((event === 'message' || event === 'smessage') && typeof a[0] === 'string' && a[0].includes('lb:') && a[0].endsWith(':notices')) lbNotices++;
  return emit.call(this, event, ...a);
};

async function startAll(common: Common, specs: NodeSpec[]): Promise<{ started: string[]; failed: Array<{ name: string; error: string }> }> {
  const started: string[] = [];
  const failed: Array<{ name: string; error: string }> = [];
  for (const s of specs) addresses.add(s.address);
  // A few at a time: what a rolling start of a DaemonSet does to the store, without one burst of all.
  const queue = [...specs];
  await Promise.all(
    Array.from({ length: 8 }, async () => {
      for (let s = queue.shift(); s; s = queue.shift()) {
        try {
          const dir = path.join(common.dir, s.name);
          let kubeconfig: string | undefined;
          if (common.apiUrl) {
            fs.mkdirSync(dir, { recursive: true });
            kubeconfig = path.join(dir, 'kubeconfig');
            fs.writeFileSync(kubeconfig, kubeconfigFor(common.apiUrl, s.name));
          }
          const n = await SimNode.start({ ...common, kubeconfig, name: s.name, address: s.address, dir, logger: logger.child({ node: s.name }) });
          nodes.set(s.name, n);
          started.push(s.name);
          if (started.length % 10 === 0) process.stderr.write(`${new Date().toISOString()} started ${started.length}/${specs.length}\n`);
        } catch (e) {
          failed.push({ name: s.name, error: (e as Error).message });
        }
      }
    }),
  );
  return { started, failed };
}

async function handle(m: Request): Promise<unknown> {
  switch (m.op) {
    case 'start':
      for (const a of m.alive) setAlive(a, true);
      return startAll(m.common, m.nodes);
    case 'startOperator': {
      if (!m.common.apiUrl) throw new Error('startOperator: kube mode only (no apiUrl)');
      const dir = path.join(m.common.dir, 'tether-operator');
      fs.mkdirSync(dir, { recursive: true });
      const kubeconfig = path.join(dir, 'kubeconfig');
      fs.writeFileSync(kubeconfig, kubeconfigFor(m.common.apiUrl, 'tether-operator'));
      operator = await SimOperator.start({ identity: 'tether-operator-0', kubeconfig, redisUrl: m.common.redisUrl, redisPrefix: m.common.redisPrefix, logger: logger.child({ node: 'tether-operator' }) });
      return true;
    }
    case 'operatorLeads':
      return operator?.isLeader() ?? false;
    case 'alive':
      setAlive(m.address, m.alive);
      return true;
    case 'addPods':
      for (const { node, pod } of m.pods) nodes.get(node)?.addPod(pod);
      return true;
    case 'removePod':
      await nodes.get(m.node)?.removePod(m.namespace, m.name);
      return true;
    case 'stopNode': {
      const n = nodes.get(m.name);
      nodes.delete(m.name);
      await n?.stop();
      return true;
    }
    case 'egressView': {
      // Per node: egress key → owner node of each of its addresses.
      const view: Record<string, Record<string, string>> = {};
      for (const [name, n] of nodes) {
        const v: Record<string, string> = {};
        for (const s of n.egress?.owners() ?? []) v[`${s.egress}/${s.address}`] = s.ownerNode;
        view[name] = v;
      }
      return view;
    }
    case 'egressOwners': {
      // Per node that tracks the Egress: the owner node of its (first) address.
      const out: Record<string, string> = {};
      for (const [name, n] of nodes) {
        // The cheap view: the agreement is polled every 50 ms, and a full status() of every node (each
        // Service's LB status, each address's counters) would be load the simulation measures itself.
        const s = n.egress?.owners().find((x) => x.egress === m.egress);
        if (s) out[name] = s.ownerNode;
      }
      return out;
    }
    case 'stats': {
      const mu = process.memoryUsage();
      const lag = { p50Ms: Math.round(loopDelay.percentile(50) / 1e6), p99Ms: Math.round(loopDelay.percentile(99) / 1e6), maxMs: Math.round(loopDelay.max / 1e6) };
      loopDelay.reset();
      return { nodes: nodes.size, rss: mu.rss, heapUsed: mu.heapUsed, commandsSent, lbNotices, calls: recorded(), loopLag: lag, memberReads, wholeReads: wholeReads.splice(0) };
    }
    case 'lbConnect': {
      const n = nodes.get(m.node);
      const dp = n && lbDatapaths.get(n.pinDir);
      if (!dp) return false;
      dp.simNewConnection(m.key, m.target);
      return true;
    }
    case 'lbHolders': {
      let held = 0;
      for (const n of nodes.values()) if (lbDatapaths.get(n.pinDir)?.simHas(m.key)) held++;
      return held;
    }
    case 'lbPending': {
      // Per process: Services its nodes need whose VIP they do not hold yet.
      let n = 0;
      for (const node of nodes.values()) n += node.lb?.pendingVips() ?? 0;
      return n;
    }
    case 'lbStatus':
      return nodes.get(m.node)?.status().loadBalancers ?? [];
    case 'profStart':
      await profiler.post('Profiler.enable');
      await profiler.post('Profiler.start');
      return true;
    case 'profStop': {
      const { profile } = (await profiler.post('Profiler.stop')) as { profile: unknown };
      fs.writeFileSync(m.file, JSON.stringify(profile));
      return true;
    }
    case 'exit':
      await Promise.all([...nodes.values(), ...(operator ? [operator] : [])].map((n) => n.stop().catch(() => undefined)));
      setTimeout(() => process.exit(0), 100);
      return true;
  }
}

process.on('message', (msg: { id: number; req: Request }) => {
  handle(msg.req).then(
    (result) => process.send!({ id: msg.id, result }),
    (e) => process.send!({ id: msg.id, error: (e as Error).message }),
  );
});
process.on('disconnect', () => process.exit(0));
process.send!({ ready: true });
