// The coordinator's side of the simulation: bundles the worker (bundle.ts), forks worker processes, places
// simulated nodes on them, writes the shared config file (the scenario), and asks the workers questions.
// Used by run.ts (npm run bench:scale) and by test/unit/scale-sim.test.ts.
import { fork, type ChildProcess } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { stringify } from 'yaml';
import { bundleSim } from './bundle';
import type { Common, NodeSpec, Request } from './worker';
import type { SimPod } from './sim-node';
import type { ApiLoad, ApiRequest } from './api-proc';
import { TETHER_SERVICE_LABEL } from '../../../daemon/objects/names';

export interface Scenario {
  egresses: number;
  gatewaysPerEgress: number;
  services: number;
  lbPodsPerService: number;
  targetsPerService: number;
}

export const NS = 'sim';

/**
 * Node i's name and address (127.<base>.0.0/16 and up: one address per node, all local). Runs pick their
 * own base (addressBase()), so two runs at once do not bind the same addresses.
 */
export function nodeSpec(i: number, base = 20): NodeSpec {
  const a = i + 1;
  return { name: `sim-${String(i).padStart(4, '0')}`, address: `127.${base + (a >> 16)}.${(a >> 8) & 255}.${a & 255}` };
}

/**
 * A second octet for a run's node addresses (32..231): the first drawn at random, so overlapping processes do
 * not collide, the next ones in this process the following octets, so two runs of one process (whose first
 * run's nodes may still be up) never draw the same (seen: both tests of scale-sim.test.ts drew 160).
 */
let nextBase = 32 + Math.floor(Math.random() * 200);
export function addressBase(): number {
  const b = nextBase;
  nextBase = 32 + ((nextBase - 32 + 1) % 200);
  return b;
}

/** The k-th pod IP of node i (10.128.0.0/9, 256 per node). */
export function podIp(i: number, k: number): string {
  const n = 0x0a800000 + i * 256 + k;
  return [n >>> 24, (n >>> 16) & 255, (n >>> 8) & 255, n & 255].join('.');
}

/** Where every pod of the scenario lives, for N nodes. */
export function placePods(s: Scenario, n: number): Array<{ node: number; pod: SimPod }> {
  const out: Array<{ node: number; pod: SimPod }> = [];
  const used = new Map<number, number>();
  const add = (node: number, name: string, labels: Record<string, string>) => {
    const k = (used.get(node) ?? 0) + 1;
    used.set(node, k);
    out.push({ node, pod: { namespace: NS, name, ip: podIp(node, k), labels } });
  };
  for (let e = 0; e < s.egresses; e++) for (let k = 0; k < s.gatewaysPerEgress; k++) add((e * s.gatewaysPerEgress + k) % n, `gw-e${e}-${k}`, { 'egress-gw': `e${e}` });
  for (let i = 0; i < n; i++) if (s.egresses) add(i, `client-${i}`, { 'egress-client': `e${i % s.egresses}` });
  for (let v = 0; v < s.services; v++) {
    for (let k = 0; k < s.lbPodsPerService; k++) add((v * s.lbPodsPerService + k) % n, `lb-s${v}-${k}`, { 'lb-for': `s${v}` });
    for (let k = 0; k < s.targetsPerService; k++) add((v * s.targetsPerService + k + Math.floor(n / 2)) % n, `app-s${v}-${k}`, { app: `s${v}` });
  }
  return out;
}

/** The shared config file every simulated node's file source reads: pools, Egresses, Services, slices. */
export function scenarioObjects(s: Scenario, n: number): unknown[] {
  const pods = placePods(s, n);
  const objs: unknown[] = [
    { apiVersion: 'tether.dev/v1alpha1', kind: 'AddressPool', metadata: { name: 'pods' }, spec: { usage: 'pod', ipv4: { cidr: '10.128.0.0/9', blockSize: 26 } } },
    { apiVersion: 'tether.dev/v1alpha1', kind: 'AddressPool', metadata: { name: 'floating' }, spec: { usage: 'floating', ipv4: { cidr: '172.30.0.0/16' } } },
    { apiVersion: 'tether.dev/v1alpha1', kind: 'AddressPool', metadata: { name: 'lb' }, spec: { usage: 'loadBalancer', ipv4: { cidr: '172.31.0.0/16' } } },
  ];
  for (let e = 0; e < s.egresses; e++) {
    objs.push({
      apiVersion: 'tether.dev/v1alpha1', kind: 'Egress', metadata: { name: `e${e}`, namespace: NS },
      spec: {
        clients: { podSelector: { matchLabels: { 'egress-client': `e${e}` } } },
        gateways: { podSelector: { matchLabels: { 'egress-gw': `e${e}` } } },
        destinations: ['203.0.113.0/24'], addresses: { pool: 'floating', count: 1 },
        failover: { intervalMs: 50, detectMultiplier: 3 }, announce: { mode: 'l2' },
      },
    });
  }
  for (let v = 0; v < s.services; v++) {
    objs.push({
      apiVersion: 'v1', kind: 'Service', metadata: { name: `s${v}`, namespace: NS, annotations: { 'lb.tether.dev/lb-pods': `lb-for=s${v}` } },
      spec: { type: 'LoadBalancer', loadBalancerClass: 'tether.dev/lb', allocateLoadBalancerNodePorts: false, ports: [{ name: 'tcp', port: 80, protocol: 'TCP' }] },
    });
    const targets = pods.filter((p) => p.pod.labels.app === `s${v}`);
    objs.push({
      apiVersion: 'discovery.k8s.io/v1', kind: 'EndpointSlice', metadata: { name: `s${v}-1`, namespace: NS, labels: { 'kubernetes.io/service-name': `s${v}` } },
      addressType: 'IPv4', ports: [{ name: 'tcp', port: 80, protocol: 'TCP' }],
      endpoints: targets.map((t) => ({ addresses: [t.pod.ip], conditions: { ready: true }, nodeName: nodeSpec(t.node).name, targetRef: { kind: 'Pod', namespace: NS, name: t.pod.name } })),
    });
  }
  return objs;
}

/**
 * The same scenario as the API server holds it (kube mode): the objects above, with the Services carrying
 * the label the leader's service labeler puts on tether's Services (already there, as after a leader ran),
 * a Node per simulated node, and a Pod (ready, on its node) per pod of placePods.
 */
export function apiObjects(s: Scenario, n: number, base: number): Array<Record<string, any>> {
  const objs = scenarioObjects(s, n) as Array<Record<string, any>>;
  for (const o of objs) if (o.kind === 'Service') o.metadata.labels = { [TETHER_SERVICE_LABEL]: 'true' };
  for (let i = 0; i < n; i++) objs.push(nodeObject(nodeSpec(i, base)));
  for (const p of placePods(s, n)) objs.push(podObject(nodeSpec(p.node, base).name, p.pod));
  return objs;
}

export function nodeObject(spec: NodeSpec): Record<string, any> {
  return { apiVersion: 'v1', kind: 'Node', metadata: { name: spec.name, labels: { 'kubernetes.io/hostname': spec.name } }, spec: {}, status: { addresses: [{ type: 'InternalIP', address: spec.address }] } };
}

export function podObject(node: string, p: SimPod): Record<string, any> {
  return {
    apiVersion: 'v1', kind: 'Pod', metadata: { name: p.name, namespace: p.namespace, labels: p.labels }, spec: { nodeName: node, containers: [{ name: 'c', image: 'sim' }] },
    status: { phase: 'Running', podIP: p.ip, conditions: [{ type: 'Ready', status: 'True' }] },
  };
}

/** Requests to a forked process over IPC, each answered by the message with its id. */
class ChildRpc<Req> {
  private next = 1;
  private readonly waiting = new Map<number, { resolve: (v: unknown) => void; reject: (e: Error) => void }>();
  exited = false;

  constructor(
    readonly proc: ChildProcess,
    private readonly what: string,
  ) {
    proc.on('message', (m: { id?: number; result?: unknown; error?: string }) => {
      if (m.id === undefined) return;
      const w = this.waiting.get(m.id);
      this.waiting.delete(m.id);
      if (m.error !== undefined) w?.reject(new Error(m.error));
      else w?.resolve(m.result);
    });
    proc.on('exit', () => {
      this.exited = true;
      for (const w of this.waiting.values()) w.reject(new Error(`${this.what} exited`));
      this.waiting.clear();
    });
  }

  ask<T>(req: Req): Promise<T> {
    if (this.exited) return Promise.reject(new Error(`${this.what} exited`));
    const id = this.next++;
    return new Promise<T>((resolve, reject) => {
      this.waiting.set(id, { resolve: resolve as (v: unknown) => void, reject });
      this.proc.send({ id, req });
    });
  }
}

/** The fake API server's process (api-proc.ts). */
export class SimApi extends ChildRpc<ApiRequest> {
  private constructor(
    proc: ChildProcess,
    readonly url: string,
  ) {
    super(proc, 'fake apiserver process');
  }

  static async start(logFile: string): Promise<SimApi> {
    const out = fs.openSync(logFile, 'a');
    const proc = fork(path.join(__dirname, 'api-proc.ts'), [], { stdio: ['ignore', out, out, 'ipc'], execArgv: ['--import', 'tsx', '--max-old-space-size=4096'] });
    fs.closeSync(out);
    const url = await new Promise<string>((resolve, reject) => {
      proc.once('message', (m: { url: string }) => resolve(m.url));
      proc.once('exit', (code) => reject(new Error(`fake apiserver process exited at start (${code}); see ${logFile}`)));
    });
    return new SimApi(proc, url);
  }

  /** Applies objects in chunks (one IPC message of every Pod of 1,000 nodes is large). */
  async apply(objects: Array<Record<string, any>>): Promise<void> {
    for (let i = 0; i < objects.length; i += 500) await this.ask({ op: 'apply', objects: objects.slice(i, i + 500) });
  }

  load(): Promise<ApiLoad> {
    return this.ask<ApiLoad>({ op: 'load' });
  }

  async stop(): Promise<void> {
    if (this.exited) return;
    const exited = new Promise((r) => this.proc.once('exit', r));
    await Promise.race([this.ask({ op: 'exit' }).catch(() => undefined), new Promise((r) => setTimeout(r, 5000))]);
    const t = setTimeout(() => this.proc.kill('SIGKILL'), 2000);
    await exited;
    clearTimeout(t);
  }
}

export function writeScenario(file: string, s: Scenario, n: number): void {
  fs.writeFileSync(file, scenarioObjects(s, n).map((o) => stringify(o)).join('---\n'));
}

/** One worker process. */
export class SimWorker extends ChildRpc<Request> {
  readonly nodes: NodeSpec[] = [];

  constructor(proc: ChildProcess) {
    super(proc, 'simulation worker');
  }
}

export class Sim {
  readonly workers: SimWorker[] = [];
  private constructor(
    readonly dir: string,
    readonly bundle: string,
    readonly substituted: string[],
  ) {}

  /** Bundles the worker into a fresh temp dir. */
  static async create(): Promise<Sim> {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tether-sim-'));
    const bundle = path.join(dir, 'worker.js');
    const substituted = await bundleSim(path.join(__dirname, 'worker.ts'), bundle);
    return new Sim(dir, bundle, substituted);
  }

  async fork(logFile: string): Promise<SimWorker> {
    const out = fs.openSync(logFile, 'a');
    // TETHER_SIM_CPU_PROF=<dir>: every worker writes a V8 CPU profile there when it exits (not the SIGKILLed victim).
    const prof = process.env.TETHER_SIM_CPU_PROF ? ['--cpu-prof', `--cpu-prof-dir=${path.resolve(process.env.TETHER_SIM_CPU_PROF)}`] : [];
    const proc = fork(this.bundle, [], { stdio: ['ignore', out, out, 'ipc'], execArgv: ['--max-old-space-size=8192', ...prof] });
    fs.closeSync(out);
    await new Promise<void>((resolve, reject) => {
      proc.once('message', () => resolve());
      proc.once('exit', (code) => reject(new Error(`simulation worker exited at start (${code}); see ${logFile}`)));
    });
    const w = new SimWorker(proc);
    this.workers.push(w);
    return w;
  }

  /** Asks every live worker, in parallel. */
  all<T>(req: Request): Promise<T[]> {
    return Promise.all(this.workers.filter((w) => !w.exited).map((w) => w.ask<T>(req)));
  }

  async stop(): Promise<void> {
    await Promise.all(
      this.workers.filter((w) => !w.exited).map(async (w) => {
        const exited = new Promise((r) => w.proc.once('exit', r));
        await Promise.race([w.ask({ op: 'exit' }).catch(() => undefined), new Promise((r) => setTimeout(r, 20_000))]);
        const t = setTimeout(() => w.proc.kill('SIGKILL'), 5000);
        await exited;
        clearTimeout(t);
      }),
    );
    if (!process.env.TETHER_SIM_KEEP) fs.rmSync(this.dir, { recursive: true, force: true });
  }
}

export function commonFor(sim: Sim, redisUrl: string, configFile: string | undefined, extra: Partial<Common> = {}): Common {
  const keyFile = path.join(sim.dir, 'cluster.key');
  if (!fs.existsSync(keyFile)) fs.writeFileSync(keyFile, `${'5e'.repeat(32)}\n`);
  return { redisUrl, redisPrefix: 'tether:', configFile, clusterKeyFile: keyFile, dir: path.join(sim.dir, 'nodes'), maxVips: 256, syncPort: 3785, ...extra };
}
