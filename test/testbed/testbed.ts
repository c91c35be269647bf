// The multi-node testbed: builds a Topology in network namespaces (router, nodes, externals), runs one
// tetherd per node, attaches pods through the real CNI chain, and tears everything down even after a
// failure. See topology.ts for the addressing plan.
import { ChildProcess, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { Attachment, ChainOutcome, CniChain, CniResult, Conflist, PluginConf } from './cni-chain';
import { bpfDir, claimPrefix, leftovers, registerLive, runDir, sweepStale, teardownRunSync, unregisterLive } from './cleanup';
import { CLIENT_SCRIPT, ProbeResult, SERVER_SCRIPT } from './probe';
import { mustRun, nsenterArgv, run, RunOptions, RunResult } from './proc';
import { binDir, ensureBpffs, ExitStatus, Tetherd, tetherBinariesPresent } from './tetherd';
import { addrOf, NodePlan, Plan, planPod, PodPlan, PodSpec, resolveTopology, TetherStepConfig, Topology } from './topology';

/** Debian's reference plugins (ptp, bridge, host-local…); CNI_PLUGIN_DIR overrides. */
export const SYSTEM_CNI_DIR = process.env.CNI_PLUGIN_DIR ?? '/usr/lib/cni';
export const NETWORK_NAME = 'tether-testbed';
const IFNAME = 'eth0';

export interface Pod extends PodPlan {
  nsPath: string;
  containerId: string;
  ifName: string;
  /** The pod's IPv4 address (no prefix length). */
  ip: string;
  result: CniResult;
  /** Timings of the ADD that attached it. */
  add: ChainOutcome;
  chain: CniChain;
}

export interface UpOptions {
  /** Copy tetherd logs to <repo>/results/tmp/testbed/<prefix>/ at down() (TETHER_TESTBED_KEEP_LOGS=1 too). */
  keepLogs?: boolean;
  /** Skip removing stale runs of dead processes before building (default: sweep). */
  noSweep?: boolean;
}

export class Testbed {
  readonly runDir: string;
  private readonly pods = new Map<string, Pod>();
  private readonly daemons = new Map<string, Tetherd>();
  private readonly children = new Set<ChildProcess>();
  private isDown = false;

  private constructor(
    readonly plan: Plan,
    readonly topology: Topology,
    /** Whether tetherd runs and `tether` ends each pod's chain. */
    readonly tetherEnabled: boolean,
    private readonly opts: UpOptions,
  ) {
    this.runDir = runDir(plan.prefix);
  }

  get prefix(): string {
    return this.plan.prefix;
  }

  /** Builds the topology; on any failure removes what it built and rethrows. */
  static async up(topo: Topology, opts: UpOptions = {}): Promise<Testbed> {
    const tether = decideTether(topo);
    if (!opts.noSweep) sweepStale();
    if (tether) await ensureBpffs();
    const prefix = claimPrefix();
    registerLive(prefix);
    let tb: Testbed | undefined;
    try {
      tb = new Testbed(resolveTopology(topo, prefix), topo, tether, opts);
      await tb.build();
      return tb;
    } catch (e) {
      if (tb) tb.isDown = true;
      teardownRunSync(prefix, 1000);
      unregisterLive(prefix);
      throw e;
    }
  }

  // ---- names and addresses -------------------------------------------------------------------------

  /** Full namespace name of a logical name (router, a node, an external, a pod key) or of a full name. */
  ns(name: string): string {
    if (name.startsWith(`${this.prefix}-`)) return name;
    const known =
      name === 'router' ||
      this.plan.nodes.some((n) => n.name === name) ||
      this.plan.externals.some((x) => x.name === name) ||
      this.pods.has(name);
    if (!known) throw new Error(`unknown testbed host "${name}"`);
    return `${this.prefix}-${name}`;
  }

  nsPath(name: string): string {
    return `/run/netns/${this.ns(name)}`;
  }

  nodeNs(node: string): string {
    return this.node(node).ns;
  }

  node(name: string): NodePlan {
    const n = this.plan.nodes.find((x) => x.name === name);
    if (!n) throw new Error(`unknown node "${name}"`);
    return n;
  }

  externalIp(name: string): string {
    const x = this.plan.externals.find((e) => e.name === name);
    if (!x) throw new Error(`unknown external host "${name}"`);
    return x.ip;
  }

  pod(key: string): Pod {
    const p = this.pods.get(key);
    if (!p) throw new Error(`unknown pod "${key}"`);
    return p;
  }

  podIp(key: string): string {
    return this.pod(key).ip;
  }

  listPods(node?: string): Pod[] {
    return [...this.pods.values()].filter((p) => node === undefined || p.node === node);
  }

  // ---- running things in namespaces ------------------------------------------------------------------

  /** Runs argv inside a namespace (nsenter --net, so /sys and bpffs stay as they are). */
  exec(name: string, argv: readonly string[], opts?: RunOptions): Promise<RunResult> {
    return run(nsenterArgv(this.nsPath(name), argv), opts);
  }

  /** exec() that rejects on a non-zero exit. */
  mustExec(name: string, argv: readonly string[], opts?: RunOptions): Promise<RunResult> {
    return mustRun(nsenterArgv(this.nsPath(name), argv), opts);
  }

  /** Starts a long-running process in a namespace; down() kills it. */
  spawn(name: string, argv: readonly string[]): ChildProcess {
    const full = nsenterArgv(this.nsPath(name), argv);
    const child = spawn(full[0], full.slice(1), { stdio: ['ignore', 'pipe', 'pipe'] });
    this.children.add(child);
    child.once('exit', () => this.children.delete(child));
    return child;
  }

  /** Serves a TCP probe on 0.0.0.0:port in a namespace, answering with the host's name; resolves once listening. */
  async tcpServe(name: string, port: number): Promise<{ stop: () => void }> {
    const child = this.spawn(name, [process.execPath, '-e', SERVER_SCRIPT, String(port), name]);
    await new Promise<void>((resolve, reject) => {
      let err = '';
      child.stderr?.on('data', (b: Buffer) => (err += b));
      child.stdout?.on('data', (b: Buffer) => b.toString().includes('ready') && resolve());
      child.once('exit', (code) => reject(new Error(`probe server in ${name} exited ${code}: ${err}`)));
    });
    return { stop: () => child.kill('SIGKILL') };
  }

  /** One TCP connect from a namespace to ip:port; ok with the server's name when the full exchange worked. */
  async tcpProbe(from: string, ip: string, port: number, timeoutMs = 2000): Promise<ProbeResult> {
    const r = await this.exec(from, [process.execPath, '-e', CLIENT_SCRIPT, ip, String(port), String(timeoutMs)], {
      timeoutMs: timeoutMs + 5000,
    });
    return r.code === 0 ? { ok: true, reply: r.stdout.trim(), ms: r.ms } : { ok: false, error: r.stderr.trim() || `exit ${r.code}`, ms: r.ms };
  }

  // ---- pods --------------------------------------------------------------------------------------------

  /** The conflist a node's runtime would use for a pod (ptp + host-local, then tether when enabled). */
  conflist(node: string, podTether?: TetherStepConfig): Conflist {
    const n = this.node(node);
    const ptp: PluginConf = {
      type: 'ptp',
      ipMasq: false,
      ...(this.topology.podMtu ? { mtu: this.topology.podMtu } : {}),
      ipam: {
        type: 'host-local',
        // Per node and per run, so nothing lands in /var/lib/cni and teardown removes it with the run dir.
        dataDir: this.nodeDir(node, 'ipam'),
        ranges: [[{ subnet: n.podCidr, gateway: n.podGateway }]],
        routes: [{ dst: '0.0.0.0/0' }],
      },
    };
    const plugins: PluginConf[] = [ptp];
    if (this.tetherEnabled) {
      plugins.push({ type: 'tether', socketPath: this.socketPath(node), ...n.tether, ...podTether });
    }
    return { cniVersion: '1.0.0', name: NETWORK_NAME, plugins };
  }

  /** A chain runner for a node, running plugins in the node's namespace. */
  chain(node: string, podTether?: TetherStepConfig): CniChain {
    return new CniChain(this.conflist(node, podTether), {
      cniPath: this.tetherEnabled ? [binDir(), SYSTEM_CNI_DIR] : [SYSTEM_CNI_DIR],
      cacheDir: this.nodeDir(node, 'cni-cache'),
      runInNetns: `/run/netns/${this.nodeNs(node)}`,
    });
  }

  /** Creates a pod's namespace and runs the chain ADD; on failure runs DEL and removes the namespace, like a runtime. */
  async addPod(node: string, spec: PodSpec | string = { name: this.nextPodName(node) }): Promise<Pod> {
    const plan = planPod(this.prefix, node, typeof spec === 'string' ? { name: spec } : spec);
    this.node(node);
    if (this.pods.has(plan.key)) throw new Error(`pod ${plan.key} exists`);
    const nsPath = `/run/netns/${plan.ns}`;
    await mustRun(['ip', 'netns', 'add', plan.ns]);
    await mustRun(['ip', '-n', plan.ns, 'link', 'set', 'lo', 'up']);
    const chain = this.chain(node, plan.tether);
    const containerId = randomBytes(32).toString('hex');
    const att = this.attachment(plan, containerId);
    try {
      const add = await chain.add(att);
      const result = add.result as CniResult;
      const ip = addrOf(result.ips?.[0]?.address ?? '');
      if (!ip) throw new Error(`ADD of ${plan.key} returned no IP: ${JSON.stringify(result)}`);
      const pod: Pod = { ...plan, nsPath, containerId, ifName: IFNAME, ip, result, add, chain };
      this.pods.set(plan.key, pod);
      return pod;
    } catch (e) {
      await chain.del(att).catch(() => undefined); // failures are informative: the ADD error is what matters
      await run(['ip', 'netns', 'delete', plan.ns]);
      throw e;
    }
  }

  /** Runs the chain DEL for a pod and removes its namespace (the runtime's order). */
  async delPod(key: string): Promise<ChainOutcome> {
    const pod = this.pod(key);
    const out = await pod.chain.del(this.attachment(pod, pod.containerId));
    this.pods.delete(key);
    await mustRun(['ip', 'netns', 'delete', pod.ns]);
    return out;
  }

  /** Runs the chain CHECK for a pod. */
  checkPod(key: string): Promise<ChainOutcome> {
    const pod = this.pod(key);
    return pod.chain.check(this.attachment(pod, pod.containerId));
  }

  private attachment(pod: PodPlan, containerId: string): Attachment {
    return {
      containerId,
      netns: `/run/netns/${pod.ns}`,
      ifName: IFNAME,
      // What containerd passes; IgnoreUnknown keeps host-local from rejecting the K8S_ keys.
      args: { IgnoreUnknown: '1', K8S_POD_NAMESPACE: pod.namespace, K8S_POD_NAME: pod.name, K8S_POD_INFRA_CONTAINER_ID: containerId },
    };
  }

  private nextPodName(node: string): string {
    for (let i = 1; ; i++) if (!this.pods.has(`${node}-p${i}`)) return `p${i}`;
  }

  // ---- tetherd -------------------------------------------------------------------------------------------

  nodeDir(node: string, ...sub: string[]): string {
    return path.join(this.runDir, 'nodes', node, ...sub);
  }

  socketPath(node: string): string {
    return this.nodeDir(node, 'tetherd.sock');
  }

  /** File holding tetherd's stderr/stdout for a node (kept across restarts, appended). */
  tetherdLog(node: string): string {
    return this.nodeDir(node, 'tetherd.log');
  }

  tetherd(node: string): Tetherd {
    const d = this.daemons.get(node);
    if (!d) throw new Error(`no tetherd on ${node}${this.tetherEnabled ? '' : ' (tether is disabled in this testbed)'}`);
    return d;
  }

  /** Sends a signal to a node's tetherd (SIGKILL by default: a crash) and resolves when it has exited. */
  killTetherd(node: string, signal: NodeJS.Signals = 'SIGKILL'): Promise<ExitStatus> {
    return this.tetherd(node).kill(signal);
  }

  /** Stops a node's tetherd cleanly if it runs, starts it again and waits until it is ready. */
  restartTetherd(node: string): Promise<void> {
    return this.tetherd(node).restart();
  }

  // ---- lifecycle -------------------------------------------------------------------------------------------

  private async build(): Promise<void> {
    const { plan } = this;
    const all = [plan.router.ns, ...plan.nodes.map((n) => n.ns), ...plan.externals.map((x) => x.ns)];
    await ipBatch(undefined, all.map((ns) => `netns add ${ns}`));

    // Router: a bridge as the L2 fabric (gratuitous ARP for floating addresses needs one), a link per external.
    const r: string[] = ['link set lo up', 'link add fabric type bridge', `addr add ${plan.router.fabricIp}/24 dev fabric`, 'link set fabric up'];
    for (const n of plan.nodes) {
      r.push(`link add ${n.fabricPort} type veth peer name eth0 netns ${n.ns}`, `link set ${n.fabricPort} master fabric`, `link set ${n.fabricPort} up`);
      r.push(`route add ${n.podCidr} via ${n.fabricIp}`);
    }
    for (const x of plan.externals) {
      r.push(`link add ${x.routerPort} type veth peer name eth0 netns ${x.ns}`, `addr add ${x.routerIp}/24 dev ${x.routerPort}`, `link set ${x.routerPort} up`);
    }
    await ipBatch(plan.router.ns, r);
    await this.sysctl('router', { 'net.ipv4.ip_forward': '1', 'net.ipv4.conf.all.send_redirects': '0' });

    for (const n of plan.nodes) {
      const c = ['link set lo up', `addr add ${n.fabricIp}/24 dev eth0`, 'link set eth0 up', `route add default via ${plan.router.fabricIp}`];
      for (const o of plan.nodes) if (o !== n) c.push(`route add ${o.podCidr} via ${o.fabricIp}`);
      await ipBatch(n.ns, c);
      await this.sysctl(n.name, { 'net.ipv4.ip_forward': '1' });
      for (const d of ['ipam', 'cni-cache']) fs.mkdirSync(this.nodeDir(n.name, d), { recursive: true });
    }
    for (const x of plan.externals) {
      await ipBatch(x.ns, ['link set lo up', `addr add ${x.ip}/24 dev eth0`, 'link set eth0 up', `route add default via ${x.routerIp}`]);
    }

    if (this.tetherEnabled) {
      await Promise.all(plan.nodes.map((n) => this.startDaemon(n)));
    }
    // Nodes attach their pods in parallel, each node one pod at a time (as a kubelet would, roughly).
    await Promise.all(plan.nodes.map(async (n) => {
      for (const p of n.pods) await this.addPod(n.name, p);
    }));
  }

  private async startDaemon(n: NodePlan): Promise<void> {
    const d = new Tetherd({
      node: n.name,
      nsPath: `/run/netns/${n.ns}`,
      config: n.tetherdConfig,
      logLevel: this.topology.tetherdLogLevel,
      readyTimeoutMs: this.topology.tetherdReadyTimeoutMs ?? 15_000,
      paths: {
        socket: this.socketPath(n.name),
        stateDir: this.nodeDir(n.name, 'state'),
        pinDir: path.join(bpfDir(this.prefix), n.name),
        log: this.tetherdLog(n.name),
        pidFile: this.nodeDir(n.name, 'tetherd.pid'),
      },
    });
    this.daemons.set(n.name, d);
    await d.start();
  }

  private async sysctl(name: string, values: Record<string, string>): Promise<void> {
    // /proc/sys/net shows the namespace of the process that opens it, so write from inside.
    const script = Object.entries(values)
      .map(([k, v]) => `echo ${v} > /proc/sys/${k.replace(/\./g, '/')}`)
      .join(' && ');
    await this.mustExec(name, ['sh', '-c', script]);
  }

  /**
   * Removes everything this run created (daemons, processes in its namespaces, namespaces, pins, run dir).
   * Idempotent. Rejects listing what is left if anything could not be removed.
   */
  async down(): Promise<void> {
    if (this.isDown) return;
    this.isDown = true;
    if (this.opts.keepLogs || process.env.TETHER_TESTBED_KEEP_LOGS === '1') this.copyLogs();
    for (const c of this.children) c.kill('SIGKILL');
    const left = teardownRunSync(this.prefix);
    unregisterLive(this.prefix);
    if (left.length > 0) throw new Error(`testbed ${this.prefix} teardown left: ${left.join(', ')}`);
  }

  /** Where keepLogs copies the logs to. */
  get keptLogsDir(): string {
    return path.resolve(__dirname, '../../results/tmp/testbed', this.prefix);
  }

  private copyLogs(): void {
    for (const n of this.plan.nodes) {
      if (!fs.existsSync(this.tetherdLog(n.name))) continue;
      fs.mkdirSync(this.keptLogsDir, { recursive: true });
      fs.copyFileSync(this.tetherdLog(n.name), path.join(this.keptLogsDir, `tetherd-${n.name}.log`));
    }
  }

  /** What of this run still exists (namespaces, run dir, pin dir); empty after down(). */
  leftovers(): string[] {
    return leftovers(this.prefix);
  }
}

/** Brings a testbed up, runs fn on it and always tears it down, also when fn throws. */
export async function withTestbed<T>(topo: Topology, fn: (tb: Testbed) => Promise<T>, opts?: UpOptions): Promise<T> {
  const tb = await Testbed.up(topo, opts);
  try {
    return await fn(tb);
  } finally {
    await tb.down();
  }
}

/** Runs `ip [-n ns] -batch -` over lines; rejects with ip's error (it names the failing line). */
async function ipBatch(ns: string | undefined, lines: string[]): Promise<void> {
  await mustRun(['ip', ...(ns ? ['-n', ns] : []), '-batch', '-'], { input: lines.join('\n') + '\n' });
}

function decideTether(topo: Topology): boolean {
  const env = process.env.TETHER_TESTBED_TETHER;
  const mode = topo.tether === undefined || topo.tether === 'auto' ? (env === '1' ? true : env === '0' ? false : 'auto') : topo.tether;
  if (mode === 'auto') return tetherBinariesPresent();
  if (mode && !tetherBinariesPresent()) {
    throw new Error(`tether requested but tether/tetherd/tetherctl are not all in ${binDir()} (set TETHER_BIN_DIR or build)`);
  }
  return mode;
}
