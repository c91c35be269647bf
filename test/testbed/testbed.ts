// The multi-node testbed: builds a Topology in network namespaces (router, nodes, externals), runs one
// tetherd per node (and one Redis per run for tether-ipam), attaches pods through the real CNI chain, and
// tears everything down even after a failure. See topology.ts for the addressing plan.
import { ChildProcess, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import * as fs from 'node:fs';
import * as path from 'node:path';
import Redis from 'ioredis';
import { call } from '../../lib/api/client';
import { FakeApiServer, kubeconfigFor } from '../lib/fake-apiserver';
import { startRedis, type TestRedis } from '../lib/redis';
import { startSentinelSet, type SentinelSet } from '../lib/sentinel';
import { startRedisCluster, type RedisCluster } from '../lib/redis-cluster';
import { StoreRelay } from './store-relay';
import { Attachment, ChainOutcome, CniChain, CniResult, Conflist, PluginConf } from './cni-chain';
import { bpfDir, claimPrefix, leftovers, recordRedis, registerLive, runDir, sweepStale, teardownRunSync, unregisterLive } from './cleanup';
import { CLIENT_SCRIPT, ProbeResult, SERVER_SCRIPT } from './probe';
import { ECHO_SERVER, TRAFFIC_CLIENT, type TrafficReport } from '../lib/traffic';
import { CriNode, type CriSandbox } from './cri-nodes';
import { mustRun, nsenterArgv, run, RunOptions, RunResult } from './proc';
import { binDir, ensureBpffs, ExitStatus, Tetherd, tetherBinariesPresent } from './tetherd';
import { OperatorProc } from './operator-proc';
import { NodeRuntime } from '../lib/container/node-runtime';
import { installObjects, operatorDeployment, tetherdPodSpec, type PodSpec as ManifestPodSpec } from '../lib/container/pod-spec';
import { admitWith, serviceAccountUser, type UserInfo } from '../lib/admission-request';
import type { Release } from '../lib/releases';
import { addrOf, FABRIC_CIDR6, familyOf, nodeAddressOf, IpamMode, IpFamily, NodePlan, Plan, planPod, PodPlan, PodSpec, resolveTopology, TetherStepConfig, Topology } from './topology';

/** Debian's reference plugins (ptp, bridge, host-local…); CNI_PLUGIN_DIR overrides. */
export const SYSTEM_CNI_DIR = process.env.CNI_PLUGIN_DIR ?? '/usr/lib/cni';
export const NETWORK_NAME = 'tether-testbed';
const IFNAME = 'eth0';

export interface Pod extends PodPlan {
  nsPath: string;
  containerId: string;
  ifName: string;
  /** The pod's IPv4 address (no prefix length); its IPv6 one when pods have no IPv4 (topology families [6]). */
  ip: string;
  /** Its prefix length (24 with host-local, the block size with tether-ipam). */
  prefixLength: number;
  /** The pod's IPv6 address and its prefix length, when pods have IPv6 (topology families). */
  ip6?: string;
  prefixLength6?: number;
  result: CniResult;
  /** Timings of the ADD that attached it. */
  add: ChainOutcome;
  chain: CniChain;
  /** runtime 'cri': the pod's sandbox (add has no invocations: containerd ran the plugins). */
  sandbox?: CriSandbox;
}

export interface UpOptions {
  /** Copy tetherd logs to <repo>/results/tmp/testbed/<prefix>/ at down() (TETHER_TESTBED_KEEP_LOGS=1 too). */
  keepLogs?: boolean;
  /** Skip removing stale runs of dead processes before building (default: sweep). */
  noSweep?: boolean;
  /**
   * Run every node's tetherd in the DaemonSet's container (install/'s pod spec, the image from
   * install/image.sh, containerd + runc) instead of as a plain process. Default: TETHER_TESTBED_CONTAINERS=1.
   */
  containers?: boolean;
  /** Env for the tetherd containers beyond the manifest's (a test that overrides it, e.g. TETHER_PROC_SYS_NET). */
  containerEnv?: Record<string, string>;
  /**
   * 'cri': pods are made as kubelet makes them: every node runs its own containerd in its namespace, over
   * the node's CNI directory that `tether-install install` chained (cri-nodes.ts); addPod is RunPodSandbox,
   * delPod StopPodSandbox + RemovePodSandbox. Pod labels reach tetherd as Pod objects (the config file or
   * the API server); other per-pod tether fields are refused (set them node-wide: NodeSpec.tether).
   * Default: the testbed runs the chain itself.
   */
  runtime?: 'cri';
  /**
   * Each node's tetherd reaches the run's single Redis through its own relay (a Unix socket the test
   * process forwards, store-relay.ts), so cutStore(node) cuts one node off the store while the others
   * still reach it. Not with a Sentinel set.
   */
  storeRelay?: boolean;
  /**
   * The release every node starts on (its tetherd, its CNI executables, its DaemonSet manifest); default this
   * tree's build. setRelease() moves one node to another (the upgrade test).
   */
  release?: Release;
}

export class Testbed {
  readonly runDir: string;
  private readonly pods = new Map<string, Pod>();
  private readonly daemons = new Map<string, Tetherd>();
  /** configSource 'kubernetes': tether-operator's replicas, by index (stopped ones stay, to start again). */
  private readonly operators: OperatorProc[] = [];
  private readonly children = new Set<ChildProcess>();
  private isDown = false;
  private testRedis?: TestRedis;
  private sentinelSet?: SentinelSet;
  /** Topology redis: 'cluster': the run's Redis Cluster, on the router. */
  private clusterStore?: RedisCluster;
  /** UpOptions.storeRelay: each node's own path to Redis. */
  private readonly relays = new Map<string, StoreRelay>();
  /** Block routes installed by syncBlockRoutes(): block CIDR → owning node. */
  private readonly blockRoutes = new Map<string, string>();
  private routeSync: Promise<void> = Promise.resolve();
  /** configSource 'kubernetes': the run's FAKE API server, and its socket. */
  private fakeApi?: FakeApiServer;
  private apiSocket?: string;
  /** containers: the runtime of the nodes' tetherd containers and the manifest's pod spec. */
  private nodeRuntime?: { runtime: NodeRuntime; pod: ManifestPodSpec; env?: Record<string, string> };
  /** configSource 'kubernetes': who each bearer token is (a node's tetherd, an operator replica). */
  private readonly users = new Map<string, UserInfo>();
  /** configSource 'kubernetes': writes the admission policies denied ("user VERB resource/name: message"). */
  private readonly denied: string[] = [];
  /** runtime 'cri': each node's containerd, and (file config) the Pod objects that carry pods' labels. */
  private readonly criNodes = new Map<string, CriNode>();
  private readonly criPodObjects = new Map<string, Record<string, unknown>>();
  /** Nodes moved to a release other than UpOptions.release (setRelease). */
  private readonly nodeRelease = new Map<string, Release>();

  private constructor(
    readonly plan: Plan,
    readonly topology: Topology,
    /** Whether tetherd runs and `tether` ends each pod's chain. */
    readonly tetherEnabled: boolean,
    /** Who gives pods their addresses: tether-ipam (blocks claimed through Redis) or host-local (static /24s). */
    readonly ipam: IpamMode,
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
    const ipam = decideIpam(topo, tether);
    if (!opts.noSweep) sweepStale();
    if (tether) await ensureBpffs();
    const prefix = claimPrefix();
    registerLive(prefix);
    let tb: Testbed | undefined;
    try {
      tb = new Testbed(resolveTopology(topo, prefix), topo, tether, ipam, opts);
      await tb.build();
      return tb;
    } catch (e) {
      if (tb) tb.isDown = true;
      await tb?.destroyCri();
      await tb?.nodeRuntime?.runtime.destroy();
      teardownRunSync(prefix, 1000);
      await tb?.testRedis?.stop();
      await tb?.clusterStore?.stop();
      await Promise.all([...(tb?.relays.values() ?? [])].map((r) => r.close()));
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

  /** A pod's IPv6 address; throws when pods have none (topology families without 6). */
  podIp6(key: string): string {
    const p = this.pod(key);
    if (!p.ip6) throw new Error(`pod ${key} has no IPv6 address (topology families: ${this.plan.families.join(', ')})`);
    return p.ip6;
  }

  /** An external host's IPv6 address; throws when the testbed carries no IPv6. */
  externalIp6(name: string): string {
    const x = this.plan.externals.find((e) => e.name === name);
    if (!x) throw new Error(`unknown external host "${name}"`);
    if (!x.ip6) throw new Error(`external host "${name}" has no IPv6 address (topology families: ${this.plan.families.join(', ')})`);
    return x.ip6;
  }

  /** Whether pods have this family. */
  hasFamily(family: IpFamily): boolean {
    return this.plan.families.includes(family);
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

  /** Serves a TCP probe on port in a namespace (both families), answering with the host's name; resolves once listening. */
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

  /**
   * Runs test/lib/traffic.ts's echo server in a namespace on port (TCP and UDP, both families); resolves once
   * listening. stop() ends it and resolves with the peers it saw ("addr:port", "[addr]:port" for IPv6; see
   * peerAddress()).
   */
  async echoServe(name: string, port: number): Promise<{ stop: () => Promise<string[]> }> {
    const child = this.spawn(name, [process.execPath, '-e', ECHO_SERVER, String(port)]);
    const out = output(child);
    await new Promise<void>((resolve, reject) => {
      child.stdout?.on('data', (b: Buffer) => b.toString().includes('ready') && resolve());
      child.once('exit', (code) => reject(new Error(`echo server in ${name} exited (${code})`)));
    });
    return {
      stop: async () => {
        child.kill('SIGTERM');
        const line = (await out).split('\n').find((l) => l.startsWith('{'));
        return line ? (JSON.parse(line) as { peers: string[] }).peers : [];
      },
    };
  }

  /**
   * Runs test/lib/traffic.ts's client from a namespace to ip:port (either family) for durationMs: `conns` TCP
   * connections in request/response every intervalMs (default 50), and a UDP stream with udp. Resolves with its report.
   */
  async traffic(from: string, ip: string, port: number, o: { conns: number; durationMs: number; intervalMs?: number; udp?: boolean }): Promise<TrafficReport> {
    const child = this.spawn(from, [process.execPath, '-e', TRAFFIC_CLIENT, ip, String(port), String(o.conns), String(o.durationMs), String(o.intervalMs ?? 50), o.udp ? '1' : '0']);
    const text = await output(child);
    const line = text.split('\n').find((l) => l.startsWith('{'));
    if (!line) throw new Error(`traffic client in ${from} printed no report: ${text.slice(0, 500)}`);
    return JSON.parse(line) as TrafficReport;
  }

  // ---- pods --------------------------------------------------------------------------------------------

  /** The conflist a node's runtime would use for a pod (ptp + tether-ipam or host-local, then tether when enabled). */
  conflist(node: string, podTether?: TetherStepConfig): Conflist {
    const n = this.node(node);
    // A default route per family the pods have (ptp installs each via that family's gateway).
    const routes = this.plan.families.map((f) => ({ dst: f === 4 ? '0.0.0.0/0' : '::/0' }));
    const ipam =
      this.ipam === 'tether-ipam'
        ? { type: 'tether-ipam', pool: this.plan.podPool.name, socketPath: this.socketPath(node), deleteQueueDir: this.deleteQueueDir(node), routes }
        : {
            type: 'host-local',
            // Per node and per run, so nothing lands in /var/lib/cni and teardown removes it with the run dir.
            dataDir: this.nodeDir(node, 'ipam'),
            ranges: this.plan.families.map((f) => [f === 4 ? { subnet: n.podCidr, gateway: n.podGateway } : { subnet: n.podCidr6!, gateway: n.podGateway6! }]),
            routes,
          };
    const ptp: PluginConf = {
      type: 'ptp',
      ipMasq: false,
      ...(this.topology.podMtu ? { mtu: this.topology.podMtu } : {}),
      ipam,
    };
    const plugins: PluginConf[] = [ptp];
    if (this.tetherEnabled) {
      const step: PluginConf = { type: 'tether', socketPath: this.socketPath(node), deleteQueueDir: this.deleteQueueDir(node), ...n.tether, ...podTether };
      // In a cluster, labels come from the Pod object; the conflist field is for standalone use.
      if (this.kube) delete step.labels;
      plugins.push(step);
    }
    return { cniVersion: '1.0.0', name: NETWORK_NAME, plugins };
  }

  /** The release a node runs (its tetherd once restarted, its CNI executables at once). */
  releaseOf(node: string): Release | undefined {
    return this.nodeRelease.get(node) ?? this.opts.release;
  }

  /**
   * Moves a node to another release, as a DaemonSet rollout does: its CNI executables at once (the chain of
   * every later ADD, DEL and CHECK on the node), its tetherd at its next start (stop it first).
   */
  setRelease(node: string, rel: Release): void {
    if (this.cri) throw new Error('setRelease: a cri testbed\'s nodes take their CNI executables from tether-install, which is not modelled per release');
    this.node(node);
    this.nodeRelease.set(node, rel);
    this.daemons.get(node)?.useRelease(this.releaseParts(rel));
  }

  private releaseParts(rel: Release | undefined): { binDir: string; image?: string; pod?: ManifestPodSpec } {
    if (!rel) return { binDir: binDir() };
    return { binDir: rel.binDir, image: rel.imageArchive, pod: this.nodeRuntime ? tetherdPodSpec(rel.tree) : undefined };
  }

  /** A chain runner for a node, running plugins in the node's namespace with the node's release's executables. */
  chain(node: string, podTether?: TetherStepConfig): CniChain {
    return new CniChain(this.conflist(node, podTether), {
      cniPath: this.tetherEnabled ? [this.releaseOf(node)?.binDir ?? binDir(), SYSTEM_CNI_DIR] : [SYSTEM_CNI_DIR],
      cacheDir: this.nodeDir(node, 'cni-cache'),
      runInNetns: `/run/netns/${this.nodeNs(node)}`,
    });
  }

  /**
   * Creates a pod's namespace and runs the chain ADD; on failure runs DEL and removes the namespace, like a
   * runtime. With tether-ipam, block routes follow (syncBlockRoutes) before it resolves.
   */
  async addPod(node: string, spec: PodSpec | string = { name: this.nextPodName(node) }): Promise<Pod> {
    const plan = planPod(this.prefix, node, typeof spec === 'string' ? { name: spec } : spec);
    this.node(node);
    if (this.pods.has(plan.key)) throw new Error(`pod ${plan.key} exists`);
    if (this.cri) return this.addCriPod(plan);
    const nsPath = `/run/netns/${plan.ns}`;
    await mustRun(['ip', 'netns', 'add', plan.ns]);
    await mustRun(['ip', '-n', plan.ns, 'link', 'set', 'lo', 'up']);
    if (this.hasFamily(6)) await this.noDad(plan.ns);
    const chain = this.chain(node, plan.tether);
    const containerId = randomBytes(32).toString('hex');
    const att = this.attachment(plan, containerId);
    // In a cluster the Pod object exists (scheduled, with its labels) before the runtime runs ADD.
    if (this.kube) this.api.apply(this.podObject(plan));
    try {
      const add = await chain.add(att);
      const result = add.result as CniResult;
      const pod: Pod = { ...plan, nsPath, containerId, ifName: IFNAME, ...this.podAddresses(plan.key, result), result, add, chain };
      this.pods.set(plan.key, pod);
      await this.syncBlockRoutes();
      return pod;
    } catch (e) {
      // Like a runtime: DEL after a failed ADD; when that DEL fails too (tetherd stopped), it is retried
      // later (retryTeardowns), as containerd retries the teardown of a sandbox.
      await chain.del(att).catch(() => this.failedTeardowns.push({ chain, att }));
      await run(['ip', 'netns', 'delete', plan.ns]);
      if (this.kube) this.api.remove('Pod', plan.name, plan.namespace);
      throw e;
    }
  }

  /** ip/prefixLength (IPv4, or IPv6 without IPv4) and ip6/prefixLength6 of an ADD's result; throws when a family is missing. */
  private podAddresses(key: string, result: CniResult): Pick<Pod, 'ip' | 'prefixLength' | 'ip6' | 'prefixLength6'> {
    const of = (f: IpFamily) => (result.ips ?? []).map((i) => i.address ?? '').find((a) => a && familyOf(a) === f);
    const missing = this.plan.families.filter((f) => !of(f));
    if (missing.length) throw new Error(`ADD of ${key} returned no IPv${missing.join('/IPv')} address: ${JSON.stringify(result)}`);
    const [cidr, cidr6] = [of(4) ?? of(6)!, of(6)];
    return {
      ip: addrOf(cidr), prefixLength: Number(cidr.split('/')[1]),
      ...(cidr6 ? { ip6: addrOf(cidr6), prefixLength6: Number(cidr6.split('/')[1]) } : {}),
    };
  }

  /**
   * No duplicate address detection in a namespace: an IPv6 address stays tentative (unusable) for a second
   * or more while DAD runs, and nothing in the testbed can hold a duplicate. `all` and `default` both, as the
   * kernel runs DAD when either says so; `default` reaches the interfaces made afterwards (a pod's veth).
   */
  private async noDad(ns: string): Promise<void> {
    await mustRun(nsenterArgv(`/run/netns/${ns}`, ['sh', '-c', 'echo 0 > /proc/sys/net/ipv6/conf/all/accept_dad && echo 0 > /proc/sys/net/ipv6/conf/default/accept_dad']));
  }

  /** Teardowns (DEL after a failed ADD) that failed, waiting for retryTeardowns. */
  private readonly failedTeardowns: Array<{ chain: CniChain; att: Attachment }> = [];

  /** Retries each failed teardown once (the runtime's retry); returns how many succeeded. */
  async retryTeardowns(): Promise<number> {
    let ok = 0;
    for (const t of this.failedTeardowns.splice(0)) {
      await t.chain.del(t.att).then(
        () => ok++,
        () => this.failedTeardowns.push(t),
      );
    }
    return ok;
  }

  /** Runs the chain DEL for a pod and removes its namespace (the runtime's order); block routes follow. */
  async delPod(key: string): Promise<ChainOutcome> {
    const pod = this.pod(key);
    if (pod.sandbox) return this.delCriPod(pod, pod.sandbox);
    // In a cluster the Pod object turns terminating (deletionTimestamp) before kubelet tears the pod down.
    if (this.kube) {
      const obj = this.podObject(pod) as { metadata: Record<string, unknown> };
      const cur = this.api.get('Pod', pod.name, pod.namespace) as { metadata?: { labels?: Record<string, string> } } | undefined;
      obj.metadata.labels = cur?.metadata?.labels ?? obj.metadata.labels;
      obj.metadata.deletionTimestamp = new Date().toISOString();
      this.api.apply(obj);
    }
    // The node's executables now, which may be another release's than the ADD's (the upgrade test).
    const out = await this.chain(pod.node, pod.tether).del(this.attachment(pod, pod.containerId));
    this.pods.delete(key);
    await mustRun(['ip', 'netns', 'delete', pod.ns]);
    if (this.kube) this.api.remove('Pod', pod.name, pod.namespace);
    await this.syncBlockRoutes();
    return out;
  }

  /** Runs the chain CHECK for a pod. */
  checkPod(key: string): Promise<ChainOutcome> {
    const pod = this.pod(key);
    if (pod.sandbox) throw new Error(`pod ${key} was made through CRI, which has no CHECK call`);
    return this.chain(pod.node, pod.tether).check(this.attachment(pod, pod.containerId));
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

  // ---- the Kubernetes API (configSource 'kubernetes') -----------------------------------------------------

  get kube(): boolean {
    return this.topology.configSource === 'kubernetes';
  }

  /** The run's FAKE API server: create, change and delete objects here as kubectl would. */
  get api(): FakeApiServer {
    if (!this.fakeApi) throw new Error("no API server in this testbed (topology configSource: 'kubernetes')");
    return this.fakeApi;
  }

  /** A node's tetherd's kubeconfig (in its run directory, which its container mounts): the node's own token. */
  kubeconfigOf(node: string): string {
    return this.nodeDir(node, 'kubeconfig');
  }

  /** Who a bearer token of the run's API server belongs to (undefined: none of the run's components). */
  userOf(token: string | undefined): UserInfo | undefined {
    return token === undefined ? undefined : this.users.get(token);
  }

  /** Writes the admission policies denied so far (none may be: down() fails the run if any was). */
  get admissionDenials(): readonly string[] {
    return this.denied;
  }

  /**
   * A kubeconfig at `file` with a token of its own for `user` (a pod-bound ServiceAccount token), readable
   * by `owner` (a container's non-root user) when given.
   */
  private writeKubeconfig(file: string, token: string, user: UserInfo, owner?: { uid: number; gid: number }): void {
    this.users.set(token, user);
    fs.mkdirSync(path.dirname(file), { recursive: true });
    fs.writeFileSync(file, kubeconfigFor(`http://127.0.0.1:${KUBE_API_PORT}`, token), { mode: 0o600 });
    if (owner) fs.chownSync(file, owner.uid, owner.gid);
  }

  /** A pod's Pod object as the API holds it once the pod is scheduled and running (Ready). */
  podObject(pod: PodPlan, labels?: Record<string, string>): Record<string, unknown> {
    const stepLabels = { ...(this.node(pod.node).tether?.labels as Record<string, string> | undefined), ...(pod.tether?.labels as Record<string, string> | undefined) };
    return {
      apiVersion: 'v1', kind: 'Pod',
      metadata: { name: pod.name, namespace: pod.namespace, labels: labels ?? stepLabels },
      spec: { nodeName: pod.node },
      status: { phase: 'Running', conditions: [{ type: 'Ready', status: 'True' }] },
    };
  }

  /**
   * Starts the FAKE API server on a unix socket of the run, with the pod pool, the Nodes and the
   * topology's objects, and a TCP forwarder in each node namespace (127.0.0.1:KUBE_API_PORT → the socket),
   * so tetherd's client-node reaches it as it would reach an apiserver.
   */
  private async startApi(): Promise<void> {
    const api = new FakeApiServer();
    this.fakeApi = api;
    // Both admission policies of install/, enforced on every write as a cluster's API server does, each
    // request made as its token's user. A denial is a bug of the component that wrote: loud now, and down()
    // fails the run.
    const policies = installObjects().filter((o) => o.kind === 'ValidatingAdmissionPolicy');
    if (policies.length < 2) throw new Error(`install/ holds ${policies.length} ValidatingAdmissionPolicies; the testbed expects the node's and the operator's`);
    const admit = admitWith(policies, (a) => this.userOf(a.token) ?? ADMIN);
    api.admit = (a) => {
      const v = admit(a);
      if (!v.allowed) {
        const line = `${this.userOf(a.token)?.username ?? `token ${a.token}`} ${a.operation} ${a.resource}${a.subResource ? `/${a.subResource}` : ''} ${a.namespace ? `${a.namespace}/` : ''}${a.name || a.object?.metadata?.name || ''}: ${v.message}`;
        this.denied.push(line);
        process.stderr.write(`  testbed ${this.prefix}: admission DENIED ${line}\n`);
      }
      return v;
    };
    this.apiSocket = path.join(this.runDir, 'apiserver.sock');
    await api.listen({ socketPath: this.apiSocket });
    api.apply(this.podPoolObject());
    for (const n of this.plan.nodes) {
      api.apply({ apiVersion: 'v1', kind: 'Node', metadata: { name: n.name, labels: n.zone ? { 'topology.kubernetes.io/zone': n.zone } : {} }, spec: {} });
    }
    for (const o of this.topology.extraObjects ?? []) api.apply(structuredClone(o));
    // Each node's tetherd its own token, as the DaemonSet's pod-bound token names its node.
    for (const n of this.plan.nodes) this.writeKubeconfig(this.kubeconfigOf(n.name), `node-${n.name}`, serviceAccountUser('tether-system', 'tether', { node: n.name, pod: `tetherd-${n.name}` }));
    await Promise.all(this.plan.nodes.map((n) => this.forwardApi(n.name)));
  }

  /** A TCP forwarder in a namespace: 127.0.0.1:KUBE_API_PORT → the API server's socket. */
  private async forwardApi(ns: string): Promise<void> {
    const child = this.spawn(ns, [process.execPath, '-e', FORWARDER, String(KUBE_API_PORT), this.apiSocket!]);
    await new Promise<void>((resolve, reject) => {
      child.stdout?.on('data', (b: Buffer) => b.toString().includes('ready') && resolve());
      child.once('exit', (code) => reject(new Error(`API forwarder in ${ns} exited (${code})`)));
    });
  }

  // ---- tetherd -------------------------------------------------------------------------------------------

  nodeDir(node: string, ...sub: string[]): string {
    return path.join(this.runDir, 'nodes', node, ...sub);
  }

  socketPath(node: string): string {
    return this.nodeDir(node, 'tetherd.sock');
  }

  /** Where the node's CNI executables queue a DEL while its tetherd is away: <its --state-dir>/delete-queue. */
  deleteQueueDir(node: string): string {
    return this.nodeDir(node, 'state', 'delete-queue');
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

  /** Stops a node's tetherd cleanly if it runs, starts it again and waits until it is ready; block routes follow. */
  async restartTetherd(node: string): Promise<void> {
    await this.tetherd(node).restart();
    await this.syncBlockRoutes();
  }

  // ---- tether-operator (configSource 'kubernetes') ---------------------------------------------------------

  /** A replica's log (kept across its restarts). */
  operatorLog(replica: number): string {
    return path.join(this.runDir, 'operator', `tether-operator-${replica}.log`);
  }

  /** The replicas running now. */
  get operatorReplicas(): number {
    return this.operators.filter((o) => o.running).length;
  }

  /** The identities (pod names, the Lease's holderIdentity) of the replicas running now. */
  get operatorIdentities(): string[] {
    return this.operators.filter((o) => o.running).map((o) => o.o.identity);
  }

  /** One replica by its identity. */
  operator(identity: string): OperatorProc {
    const o = this.operators.find((x) => x.o.identity === identity);
    if (!o) throw new Error(`no tether-operator replica ${identity} (replicas: ${this.operators.map((x) => x.o.identity).join(', ') || 'none'})`);
    return o;
  }

  /** Stops one replica by its identity (SIGTERM: a leader releases the Lease; SIGKILL: it does not), as a pod lost. */
  async stopOperator(identity: string, signal: NodeJS.Signals = 'SIGTERM'): Promise<void> {
    await this.operator(identity).kill(signal);
  }

  /**
   * Runs `replicas` replicas of tether-operator, as `kubectl scale deploy/tether-operator` would: the highest
   * ones stop first (SIGTERM: a leader releases its Lease), stopped ones start again (ready once every part
   * started: in container mode once its probes answer). Each replica has its own token of the ServiceAccount
   * tether-operator. As processes they run in the last node's namespace; in container mode each runs the
   * Deployment's container in a network namespace of its own.
   */
  async scaleOperator(replicas: number): Promise<void> {
    if (!this.kube) throw new Error('tether-operator runs only with configSource kubernetes');
    if (!Number.isInteger(replicas) || replicas < 0) throw new Error(`scaleOperator(${replicas}): give a whole number of replicas, 0 or more`);
    while (this.operators.length < replicas) this.operators.push(await this.newOperator(this.operators.length));
    await Promise.all(this.operators.map((o, i) => (i < replicas ? (o.running ? undefined : o.start()) : o.kill('SIGTERM'))));
  }

  private async newOperator(i: number): Promise<OperatorProc> {
    const identity = `tether-operator-${i}`;
    const dir = path.join(this.runDir, 'operator', identity);
    fs.mkdirSync(dir, { recursive: true });
    const user = serviceAccountUser('tether-system', 'tether-operator', { pod: identity });
    const common = { identity, log: this.operatorLog(i), binDir: binDir() }; // the build under test
    if (!this.nodeRuntime) {
      const last = this.plan.nodes[this.plan.nodes.length - 1];
      this.writeKubeconfig(path.join(dir, 'kubeconfig'), identity, user);
      return new OperatorProc({
        ...common, nsPath: this.nsPath(last.name), kubeconfig: path.join(dir, 'kubeconfig'),
        redis: { url: this.sentinelSet?.url ?? this.clusterStore?.url ?? this.redis.url, prefix: this.redisPrefix },
      });
    }
    const { pod } = operatorDeployment();
    const sc = pod.containers.find((c) => c.name === 'tether-operator')?.securityContext;
    const owner = { uid: sc?.runAsUser ?? 0, gid: sc?.runAsGroup ?? 0 };
    // Its network namespace: loopback only, where a forwarder reaches the API server. The store over a
    // relay socket of its own, which its user may open (the run's Redis socket is root's).
    if (this.sentinelSet || this.clusterStore) throw new Error('the operator\'s container reaches the store over a Unix socket: a Sentinel set or a Cluster (TCP on the fabric) is not reachable from its namespace');
    const ns = `${this.prefix}-op${i}`;
    await mustRun(['ip', 'netns', 'add', ns]);
    await mustRun(['ip', '-n', ns, 'link', 'set', 'lo', 'up']);
    await this.forwardApi(ns);
    const relay = await StoreRelay.start(path.join(dir, 'redis.sock'), this.redis.socketPath);
    this.relays.set(identity, relay);
    fs.chownSync(relay.path, owner.uid, owner.gid);
    this.writeKubeconfig(path.join(dir, 'kubeconfig'), identity, user, owner);
    return new OperatorProc({
      ...common, nsPath: `/run/netns/${ns}`, kubeconfig: path.join(dir, 'kubeconfig'),
      redis: { url: `unix://${relay.path}`, prefix: this.redisPrefix },
      container: { runtime: this.nodeRuntime.runtime, pod, tmpDir: path.join(this.runDir, 'operator') },
    });
  }

  /** tetherd's status answer for a node (what `tetherctl status` prints). */
  status(node: string): Promise<TetherdStatus> {
    return call<TetherdStatus>(this.socketPath(node), 'status', {}, { timeoutMs: 10_000 });
  }

  // ---- IPAM (tether-ipam mode) ------------------------------------------------------------------------------

  /** The run's Redis (tether-ipam mode only). */
  get redis(): TestRedis {
    if (!this.testRedis) throw new Error(`no Redis in this testbed (ipam is ${this.ipam})`);
    return this.testRedis;
  }

  /** The run's Sentinel set (topology redis: 'sentinel'). */
  get sentinel(): SentinelSet {
    if (!this.sentinelSet) throw new Error("no Sentinel set in this testbed (topology redis: 'sentinel')");
    return this.sentinelSet;
  }

  /** The run's Redis Cluster (topology redis: 'cluster'). */
  get redisCluster(): RedisCluster {
    if (!this.clusterStore) throw new Error("no Redis Cluster in this testbed (topology redis: 'cluster')");
    return this.clusterStore;
  }

  /** The key prefix this run's tetherds use in Redis (runs could share one Redis without meeting). */
  get redisPrefix(): string {
    return `${this.prefix}:`;
  }

  /**
   * SIGKILLs the run's Redis (a crash of the cluster store). With keepData, the crash of a Redis with
   * durable storage: writes are paused and the data set saved (dump.rdb, which restartRedis loads) just
   * before the kill, so nothing a client was told succeeded is lost. Without it the data is gone.
   */
  async killRedis(opts: { keepData?: boolean } = {}): Promise<void> {
    if (opts.keepData) {
      await this.withRedisClient(async (r) => {
        await r.call('CLIENT', 'PAUSE', '30000', 'WRITE'); // writes queue up; they die with the server
        await r.call('SAVE');
      });
    } else {
      fs.rmSync(path.join(this.redis.dir, 'dump.rdb'), { force: true });
    }
    await this.redis.kill();
  }

  /** Starts the run's Redis again on the same socket, with what killRedis({keepData}) saved or else empty. */
  async restartRedis(): Promise<void> {
    await this.redis.restart();
    this.recordRedis();
  }

  /** SIGSTOPs the run's Redis (it hangs: connections stay open, nothing is answered); resumeRedis() undoes it. */
  pauseRedis(): void {
    this.redis.pause();
  }

  resumeRedis(): void {
    this.redis.resume();
  }

  /**
   * UpOptions.storeRelay: cuts one node off the store as a partition would (its open connections stop
   * moving, new ones hang) while the other nodes still reach it; healStore(node) ends the cut.
   */
  cutStore(node: string): void {
    this.relay(node).partition();
  }

  healStore(node: string): void {
    this.relay(node).heal();
  }

  private relay(node: string): StoreRelay {
    const r = this.relays.get(node);
    if (!r) throw new Error(`no store relay for ${node} (UpOptions.storeRelay)`);
    return r;
  }

  /** What Redis says about a pod pool's blocks: block CIDR → node (read straight from the store). */
  async clusterBlocks(pool = this.plan.podPool.name): Promise<Map<string, string>> {
    return new Map(Object.entries(await this.withRedisClient((r) => r.hgetall(`${this.redisPrefix}pool:{${pool}}:blocks`))));
  }

  /** Runs fn with a short-lived client of the run's Redis (for inspection and fault injection). */
  async withRedisClient<T>(fn: (r: Redis) => Promise<T>): Promise<T> {
    const r = new Redis({ path: this.redis.socketPath, lazyConnect: true, maxRetriesPerRequest: 0, retryStrategy: () => null });
    try {
      await r.connect();
      return await fn(r);
    } finally {
      r.disconnect();
    }
  }

  /** The blocks of one family (IPv4 unless given) a node's tetherd holds of the pod pool, from its status. */
  async nodeBlocks(node: string, pool = this.plan.podPool.name, family: IpFamily = 4): Promise<{ blocks: string[]; allocated: number; free: number }> {
    const st = await this.status(node);
    const fam = st.ipam.pods.find((p) => p.pool === pool)?.families.find((f) => f.family === family);
    return { blocks: fam?.blocks ?? [], allocated: fam?.allocated ?? 0, free: fam?.free ?? 0 };
  }

  /**
   * Takes a node's uplink down (the node is lost to the others) or brings it back: the kernel drops the
   * routes through a link that goes down, so 'up' puts back the default route and the routes to the other
   * nodes' pod blocks or CIDRs, as the node's routing (DHCP, BGP) would.
   */
  async setUplink(node: string, state: 'up' | 'down'): Promise<void> {
    const n = this.node(node);
    if (state === 'down') {
      await mustRun(['ip', '-n', n.ns, 'link', 'set', 'eth0', 'down']);
      return;
    }
    const lines = ['link set eth0 up', `route replace default via ${this.plan.router.fabricIp}`];
    // The IPv6 prefix route of the fabric comes back only after the link is up and its address usable again
    // (asynchronously): put it back first, or the routes via IPv6 neighbours fail with "No route to host".
    if (this.plan.router.fabricIp6) lines.push(`route replace ${FABRIC_CIDR6} dev eth0`, `route replace ::/0 via ${this.plan.router.fabricIp6}`);
    if (this.ipam !== 'tether-ipam') for (const o of this.plan.nodes) if (o !== n) lines.push(...this.podCidrRoutes(o, 'replace'));
    for (const [b, owner] of this.blockRoutes) if (owner !== node) lines.push(`route replace ${b} via ${this.blockVia(b, owner)}`);
    await ipBatch(n.ns, lines);
  }

  /**
   * Makes cross-node routes follow the claimed blocks: `<block> via <owner's fabric IP>` on the router and
   * on every other node, and removes routes of blocks no longer claimed. This stands in for the BGP
   * announcement of a node's blocks that real clusters use (BIRD/Calico-style). A node whose tetherd does
   * not answer keeps its routes as they are. Runs after every addPod/delPod; serialised; no-op with host-local.
   */
  syncBlockRoutes(): Promise<void> {
    if (this.ipam !== 'tether-ipam') return Promise.resolve();
    const next = this.routeSync.then(() => this.applyBlockRoutes());
    this.routeSync = next.catch(() => undefined);
    return next;
  }

  private async applyBlockRoutes(): Promise<void> {
    const want = new Map(this.blockRoutes);
    await Promise.all(
      this.plan.nodes.map(async (n) => {
        let blocks: string[];
        try {
          // One status call: the blocks of every family the pods have.
          const st = await this.status(n.name);
          const fams = st.ipam.pods.find((p) => p.pool === this.plan.podPool.name)?.families ?? [];
          blocks = fams.filter((f) => this.hasFamily(f.family as IpFamily)).flatMap((f) => f.blocks);
        } catch {
          return; // down or restarting: its pods' routes stay until it answers again
        }
        for (const [b, owner] of this.blockRoutes) if (owner === n.name && !blocks.includes(b)) want.delete(b);
        for (const b of blocks) want.set(b, n.name);
      }),
    );
    const dels = new Map<string, string[]>(); // namespace → ip -batch lines
    const adds = new Map<string, string[]>();
    const push = (m: Map<string, string[]>, ns: string, line: string) => m.set(ns, [...(m.get(ns) ?? []), line]);
    const everyoneBut = (owner: string) => [this.plan.router.ns, ...this.plan.nodes.filter((n) => n.name !== owner).map((n) => n.ns)];
    for (const [b, owner] of this.blockRoutes) {
      if (want.get(b) === owner) continue;
      for (const ns of everyoneBut(owner)) push(dels, ns, `route del ${b}`);
    }
    for (const [b, owner] of want) {
      if (this.blockRoutes.get(b) === owner) continue;
      for (const ns of everyoneBut(owner)) push(adds, ns, `route replace ${b} via ${this.blockVia(b, owner)}`);
    }
    // Removals run first (a block may have moved to another node) and ignore routes that are already gone.
    await Promise.all([...dels].map(([ns, lines]) => run(['ip', '-n', ns, '-force', '-batch', '-'], { input: lines.join('\n') + '\n' })));
    await Promise.all([...adds].map(([ns, lines]) => ipBatch(ns, lines)));
    this.blockRoutes.clear();
    for (const [b, owner] of want) this.blockRoutes.set(b, owner);
  }

  /** The next hop of a block's route: its owner's fabric address of the block's family. */
  private blockVia(block: string, owner: string): string {
    const n = this.node(owner);
    return familyOf(block) === 6 ? n.fabricIp6! : n.fabricIp;
  }

  // ---- pods through containerd's CRI (UpOptions.runtime 'cri') ----------------------------------------------

  get cri(): boolean {
    return this.opts.runtime === 'cri';
  }

  /** A node's containerd and CNI directories (runtime 'cri'). */
  criNode(node: string): CriNode {
    const c = this.criNodes.get(node);
    if (!c) throw new Error(`no containerd on ${node} (UpOptions.runtime: 'cri')`);
    return c;
  }

  /** The labels of a pod's Pod object: its node's and its own tether.labels. */
  private podLabels(pod: PodPlan): Record<string, string> {
    return (this.podObject(pod) as { metadata: { labels: Record<string, string> } }).metadata.labels;
  }

  /** File config: the Pod objects of the topology's pods are in the config file before tetherd first reads it. */
  private planCriPodObjects(): void {
    if (!this.cri || this.kube) return;
    for (const n of this.plan.nodes) for (const p of n.pods) this.setCriPodObject(p, false);
  }

  /** File config: puts a pod's Pod object (its labels) into the config file every tetherd watches. */
  private setCriPodObject(pod: PodPlan, write = true): void {
    const labels = this.podLabels(pod);
    if (Object.keys(labels).length === 0) return;
    if (this.ipam !== 'tether-ipam' || this.node(pod.node).tetherdConfig) {
      throw new Error(`pod ${pod.key}: its labels need a Pod object in tetherd's config, which this testbed does not generate (host-local IPAM or the node's own config file); use configSource 'kubernetes'`);
    }
    this.criPodObjects.set(pod.key, { apiVersion: 'v1', kind: 'Pod', metadata: { name: pod.name, namespace: pod.namespace, labels } });
    if (write) this.writeCriPodObjects();
  }

  private dropCriPodObject(pod: PodPlan): void {
    if (this.criPodObjects.delete(pod.key)) this.writeCriPodObjects();
  }

  /**
   * Rewrites the config file's Pod objects of pods made through CRI (atomically, as rewriteConfig does),
   * keeping every other object as the file holds it now (a test may have rewritten it).
   */
  private writeCriPodObjects(): void {
    if (!fs.existsSync(this.ipamConfigPath)) return; // build() writes it with the planned pods' objects
    const cur = JSON.parse(fs.readFileSync(this.ipamConfigPath, 'utf8')) as { items: Record<string, unknown>[] };
    const ours = new Set(this.plan.nodes.flatMap((n) => [...n.pods, ...this.listPods(n.name)]).map((p) => `${p.namespace}/${p.name}`));
    for (const o of this.criPodObjects.values()) {
      const m = o.metadata as { name: string; namespace: string };
      ours.add(`${m.namespace}/${m.name}`);
    }
    const isOurs = (o: Record<string, unknown>) => {
      const m = o.metadata as { name?: string; namespace?: string } | undefined;
      return o.kind === 'Pod' && ours.has(`${m?.namespace}/${m?.name}`);
    };
    const text = JSON.stringify({ ...cur, items: [...cur.items.filter((o) => !isOurs(o)), ...this.criPodObjects.values()] }, null, 2) + '\n';
    if (text === fs.readFileSync(this.ipamConfigPath, 'utf8')) return;
    const tmp = `${this.ipamConfigPath}.tmp`;
    fs.writeFileSync(tmp, text);
    fs.renameSync(tmp, this.ipamConfigPath);
  }

  /** Every node's containerd in its namespace, over the node's CNI directory chained by tether-install. */
  private async startCri(): Promise<void> {
    await Promise.all(
      this.plan.nodes.map(async (n) => {
        // What conflist() builds for the node without a pod: ptp with its IPAM, tether with node-wide fields.
        const full = this.conflist(n.name);
        const [primary, step] = full.plugins;
        let tetherEntry: Record<string, unknown> | undefined;
        if (step) {
          tetherEntry = { ...step };
          delete tetherEntry.labels; // a Pod object's, never the node's conflist's
        }
        const c = new CriNode({
          node: n.name,
          dir: this.nodeDir(n.name, 'cri'),
          nsPath: `/run/netns/${n.ns}`,
          primary: { cniVersion: full.cniVersion, name: full.name, plugins: [primary] },
          tetherEntry,
          systemCniDir: SYSTEM_CNI_DIR,
          tetherBinDir: binDir(),
        });
        this.criNodes.set(n.name, c); // before start: destroyCri() must find a half-started one too
        await c.start();
      }),
    );
  }

  /** RunPodSandbox on the pod's node; the Pod record as addPod keeps it, its address read back from its netns. */
  private async addCriPod(plan: PodPlan): Promise<Pod> {
    const perPod = Object.keys(plan.tether ?? {}).filter((k) => k !== 'labels');
    if (perPod.length) {
      throw new Error(`pod ${plan.key}: ${perPod.join(', ')} cannot reach tether through the runtime (kubelet passes no per-pod CNI configuration); set them node-wide (NodeSpec.tether)`);
    }
    const cri = this.criNode(plan.node);
    // In a cluster the Pod object exists (scheduled, with its labels) before kubelet asks the runtime.
    if (this.kube) this.api.apply(this.podObject(plan));
    else this.setCriPodObject(plan);
    let sb: CriSandbox | undefined;
    let pod: Pod;
    try {
      sb = await cri.runPod({ name: plan.name, namespace: plan.namespace, labels: this.podLabels(plan) }, `/run/netns/${plan.ns}`);
      const addrs = JSON.parse((await mustRun(['ip', '-n', plan.ns, '-j', 'addr', 'show', 'dev', IFNAME])).stdout) as Array<{ address?: string; mtu?: number; addr_info: Array<{ family: string; local: string; prefixlen: number }> }>;
      const inet = addrs[0]?.addr_info.find((a) => a.family === 'inet');
      if (!inet || inet.local !== sb.ip) throw new Error(`sandbox of ${plan.key}: containerd reports ${sb.ip || 'no address'}, its ${IFNAME} holds ${inet?.local ?? 'none'}`);
      const routes = JSON.parse((await mustRun(['ip', '-n', plan.ns, '-j', 'route', 'show', 'default'])).stdout) as Array<{ gateway?: string }>;
      const result: CniResult = {
        cniVersion: '1.0.0',
        interfaces: [{ name: IFNAME, mac: addrs[0].address, mtu: addrs[0].mtu, sandbox: sb.criNetns }],
        ips: [{ address: `${inet.local}/${inet.prefixlen}`, gateway: routes[0]?.gateway, interface: 0 }],
      };
      pod = {
        ...plan, nsPath: sb.alias, containerId: sb.id, ifName: IFNAME, ip: inet.local, prefixLength: inet.prefixlen, result,
        add: { result, invocations: [], ms: sb.ms }, chain: this.chain(plan.node), sandbox: sb,
      };
    } catch (e) {
      // containerd itself ran DEL after a failed ADD; a sandbox that came up unusable goes as kubelet removes it.
      if (sb) await cri.removePod(sb).catch(() => undefined);
      if (this.kube) this.api.remove('Pod', plan.name, plan.namespace);
      else this.dropCriPodObject(plan);
      throw e;
    }
    this.pods.set(plan.key, pod);
    await this.syncBlockRoutes();
    return pod;
  }

  /** StopPodSandbox + RemovePodSandbox (CNI DEL inside), then the Pod object goes; block routes follow. */
  private async delCriPod(pod: Pod, sb: CriSandbox): Promise<ChainOutcome> {
    if (this.kube) {
      // The Pod object turns terminating (deletionTimestamp) before kubelet tears the pod down.
      const obj = this.podObject(pod) as { metadata: Record<string, unknown> };
      const cur = this.api.get('Pod', pod.name, pod.namespace) as { metadata?: { labels?: Record<string, string> } } | undefined;
      obj.metadata.labels = cur?.metadata?.labels ?? obj.metadata.labels;
      obj.metadata.deletionTimestamp = new Date().toISOString();
      this.api.apply(obj);
    }
    const t0 = Date.now();
    await this.criNode(pod.node).removePod(sb);
    const ms = Date.now() - t0;
    this.pods.delete(pod.key);
    if (this.kube) this.api.remove('Pod', pod.name, pod.namespace);
    else this.dropCriPodObject(pod);
    await this.syncBlockRoutes();
    return { invocations: [], ms };
  }

  /** Destroys every node's containerd (sandboxes through CRI first); what could not be removed. */
  private async destroyCri(): Promise<string[]> {
    const nodes = [...this.criNodes.values()];
    this.criNodes.clear();
    return (await Promise.all(nodes.map((c) => c.destroy()))).flat();
  }

  // ---- lifecycle -------------------------------------------------------------------------------------------

  private async build(): Promise<void> {
    const { plan } = this;
    if (this.cri && this.hasFamily(6)) {
      throw new Error("topology.families: IPv6 pods with runtime 'cri' are not modelled (containerd makes the pod's namespace, so the testbed cannot turn DAD off in it before ADD)");
    }
    const all = [plan.router.ns, ...plan.nodes.map((n) => n.ns), ...plan.externals.map((x) => x.ns)];
    await ipBatch(undefined, all.map((ns) => `netns add ${ns}`));
    const v6 = this.hasFamily(6);
    if (v6) await Promise.all(all.map((ns) => this.noDad(ns)));

    // Router: a bridge as the L2 fabric (gratuitous ARP for floating addresses needs one), a link per external.
    // With IPv6, no multicast snooping on it: no MLD querier runs here, and neighbour discovery (solicitations,
    // unsolicited advertisements) must reach every port whatever group reports the bridge has or has not seen.
    const r: string[] = ['link set lo up', `link add fabric type bridge${v6 ? ' mcast_snooping 0' : ''}`, `addr add ${plan.router.fabricIp}/24 dev fabric`, 'link set fabric up'];
    if (v6) r.push(`addr add ${plan.router.fabricIp6}/64 dev fabric nodad`);
    const hostLocal = this.ipam === 'host-local';
    for (const n of plan.nodes) {
      r.push(`link add ${n.fabricPort} type veth peer name eth0 netns ${n.ns}`, `link set ${n.fabricPort} master fabric`, `link set ${n.fabricPort} up`);
      if (hostLocal) r.push(...this.podCidrRoutes(n, 'add'));
    }
    for (const x of plan.externals) {
      r.push(`link add ${x.routerPort} type veth peer name eth0 netns ${x.ns}`, `addr add ${x.routerIp}/24 dev ${x.routerPort}`, `link set ${x.routerPort} up`);
      if (v6) r.push(`addr add ${x.routerIp6}/64 dev ${x.routerPort} nodad`);
    }
    await ipBatch(plan.router.ns, r);
    // locktime 0: the router follows a floating address's gratuitous ARP (or unsolicited neighbour
    // advertisement) at once (Linux holds an entry for 1 s by default; hardware routers update immediately).
    await this.sysctl('router', {
      'net.ipv4.ip_forward': '1', 'net.ipv4.conf.all.send_redirects': '0', 'net.ipv4.neigh.fabric.locktime': '0',
      ...(v6 ? { 'net.ipv6.conf.all.forwarding': '1', 'net.ipv6.neigh.fabric.locktime': '0' } : {}),
    });

    for (const n of plan.nodes) {
      const c = ['link set lo up', `addr add ${n.fabricIp}/24 dev eth0`, 'link set eth0 up', `route add default via ${plan.router.fabricIp}`];
      if (v6) c.push(`addr add ${n.fabricIp6}/64 dev eth0 nodad`, `route add ::/0 via ${plan.router.fabricIp6}`);
      if (hostLocal) for (const o of plan.nodes) if (o !== n) c.push(...this.podCidrRoutes(o, 'add'));
      await ipBatch(n.ns, c);
      // IPv6 forwarding also turns accepting router advertisements off (accept_ra 1 means "unless forwarding").
      await this.sysctl(n.name, { 'net.ipv4.ip_forward': '1', ...(v6 ? { 'net.ipv6.conf.all.forwarding': '1' } : {}) });
      for (const d of ['ipam', 'cni-cache']) fs.mkdirSync(this.nodeDir(n.name, d), { recursive: true });
    }
    for (const x of plan.externals) {
      const c = ['link set lo up', `addr add ${x.ip}/24 dev eth0`, 'link set eth0 up', `route add default via ${x.routerIp}`];
      if (v6) c.push(`addr add ${x.ip6}/64 dev eth0 nodad`, `route add ::/0 via ${x.routerIp6}`);
      await ipBatch(x.ns, c);
    }

    this.planCriPodObjects();
    if (this.ipam === 'tether-ipam') {
      this.testRedis = await startRedis();
      this.recordRedis();
      if (this.topology.redis === 'sentinel') this.sentinelSet = await startSentinelSet({ host: plan.router.fabricIp, netns: plan.router.ns });
      // 3 primaries + 3 replicas on the router's fabric address, as the Sentinel set: every node reaches it.
      if (this.topology.redis === 'cluster') this.clusterStore = await startRedisCluster({ host: plan.router.fabricIp, netns: plan.router.ns });
      if (this.opts.storeRelay) {
        if (this.sentinelSet || this.clusterStore) throw new Error('storeRelay: the relay forwards to the single Redis, not to a Sentinel set or a Cluster');
        // Outside the node dirs: those are the container's /run/tether, and the socket must keep its host path.
        fs.mkdirSync(path.join(this.runDir, 'store-relay'), { recursive: true });
        for (const n of plan.nodes) this.relays.set(n.name, await StoreRelay.start(path.join(this.runDir, 'store-relay', `${n.name}.sock`), this.testRedis.socketPath));
      }
      if (this.kube) await this.startApi();
      else fs.writeFileSync(this.ipamConfigPath, JSON.stringify(this.ipamConfig(), null, 2) + '\n');
    }
    if (this.tetherEnabled) {
      // Stand-in binaries (TETHER_BIN_DIR) are not in the image: only the real tetherd runs in its container.
      if (this.opts.containers ?? (process.env.TETHER_TESTBED_CONTAINERS === '1' && !process.env.TETHER_BIN_DIR)) {
        const runtime = new NodeRuntime();
        this.nodeRuntime = { runtime, pod: tetherdPodSpec(), env: this.opts.containerEnv };
        await runtime.start();
      }
      await Promise.all(plan.nodes.map((n) => this.startDaemon(n)));
      // As many replicas as the Deployment says when it runs from its manifest; one as a process.
      if (this.kube && this.ipam === 'tether-ipam') await this.scaleOperator(this.topology.operatorReplicas ?? (this.nodeRuntime ? operatorDeployment().replicas : 1));
    }
    if (this.cri) await this.startCri();
    // Nodes attach their pods in parallel, each node one pod at a time (as a kubelet would, roughly).
    await Promise.all(plan.nodes.map(async (n) => {
      for (const p of n.pods) await this.addPodRetried(n.name, p);
    }));
  }

  /**
   * addPod as a kubelet creates a sandbox: an ADD refused with CNI's code 11 ("try again later", e.g. a
   * cluster store whose replica has not acknowledged a block claim yet on a busy machine) is tried again,
   * up to twice, after the failed ADD's DEL. Any other error is the test's.
   */
  private async addPodRetried(node: string, spec: PodSpec | string): Promise<Pod> {
    for (let attempt = 1; ; attempt++) {
      try {
        return await this.addPod(node, spec);
      } catch (e) {
        if (attempt >= 3 || !/CNI ADD failed in plugin #\d+ \S+: \[11\]/.test((e as Error).message)) throw e;
        process.stdout.write(`  testbed: ADD on ${node} refused with "try again later" (attempt ${attempt}); again in 1 s\n`);
        await new Promise((r) => setTimeout(r, 1000));
      }
    }
  }

  /** host-local mode: routes to a node's static pod CIDR(s) over the fabric, one per family the pods have. */
  private podCidrRoutes(n: NodePlan, verb: 'add' | 'replace'): string[] {
    return this.plan.families.map((f) => (f === 4 ? `route ${verb} ${n.podCidr} via ${n.fabricIp}` : `route ${verb} ${n.podCidr6} via ${n.fabricIp6}`));
  }

  /** The pod AddressPool "default": the families the pods have. */
  private podPoolObject(): Record<string, unknown> {
    const { podPool, families } = this.plan;
    return {
      apiVersion: 'tether.dev/v1alpha1',
      kind: 'AddressPool',
      metadata: { name: podPool.name },
      spec: {
        usage: 'pod',
        ...(families.includes(4) ? { ipv4: { cidr: podPool.cidr, blockSize: podPool.blockSize } } : {}),
        ...(podPool.ipv6 ? { ipv6: { cidr: podPool.ipv6.cidr, blockSize: podPool.ipv6.blockSize } } : {}),
      },
    };
  }

  /** A random cluster key per run (tetherd-to-tetherd authentication), written once, root-only. */
  clusterKeyPath(): string {
    const p = path.join(this.runDir, 'cluster.key');
    if (!fs.existsSync(p)) fs.writeFileSync(p, randomBytes(32).toString('hex'), { mode: 0o600 });
    return p;
  }

  /**
   * Replaces the config file every tetherd watches, atomically (temp file, rename), as an operator or a
   * config-management tool would: the generated objects plus `extraObjects`, or `raw` text as given.
   */
  rewriteConfig(change: { extraObjects?: Record<string, unknown>[]; raw?: string }): void {
    if (this.kube) throw new Error('this testbed takes objects from its API server: change them through tb.api');
    const tmp = `${this.ipamConfigPath}.tmp`;
    const text = change.raw ?? JSON.stringify(this.ipamConfig(change.extraObjects), null, 2) + '\n';
    fs.writeFileSync(tmp, text);
    fs.renameSync(tmp, this.ipamConfigPath);
  }

  /** The per-run tetherd config of tether-ipam mode: the pod pool and the nodes' facts. */
  get ipamConfigPath(): string {
    return path.join(this.runDir, 'tether-config.json');
  }

  private ipamConfig(extraObjects = this.topology.extraObjects ?? []): Record<string, unknown> {
    const items: Record<string, unknown>[] = [
      this.podPoolObject(),
      ...this.plan.nodes.map((n) => ({ apiVersion: 'tether.dev/v1alpha1', kind: 'Node', metadata: { name: n.name }, spec: n.zone ? { zone: n.zone } : {} })),
      ...extraObjects,
      ...this.criPodObjects.values(),
    ];
    return { apiVersion: 'v1', kind: 'List', items };
  }

  private recordRedis(): void {
    const r = this.testRedis;
    if (r?.pid !== undefined) recordRedis(this.prefix, r.pid, r.dir);
  }

  private async startDaemon(n: NodePlan): Promise<void> {
    const tetherIpam = this.ipam === 'tether-ipam';
    const d = new Tetherd({
      node: n.name,
      nsPath: `/run/netns/${n.ns}`,
      // A node's own config file wins over the generated one (it must then hold the pod pool itself).
      config: n.tetherdConfig ?? (tetherIpam && !this.kube ? this.ipamConfigPath : undefined),
      redis: tetherIpam ? { url: this.sentinelSet?.url ?? this.clusterStore?.url ?? (this.relays.has(n.name) ? `unix://${this.relays.get(n.name)!.path}` : this.redis.url), prefix: this.redisPrefix } : undefined,
      // Every tetherd knows its node address and shares the run's cluster key: Egress needs both.
      extraArgs: [
        // The node address is of the underlay's family: over an IPv6 underlay the IPv6 one is the only one.
        '--node-address', nodeAddressOf(this.plan, n), '--uplink', 'eth0', '--cluster-key-file', this.clusterKeyPath(),
        // IPv6-only pods over the IPv4 underlay: egress reaches their gateways in outer IPv6 from this address.
        ...(this.plan.underlay === 4 && !this.plan.families.includes(4) && n.fabricIp6 ? ['--node-address-6', n.fabricIp6] : []),
        ...(this.kube && !n.tetherdConfig ? ['--kubeconfig', this.kubeconfigOf(n.name)] : []),
        ...(this.topology.tetherdArgs ?? []),
      ],
      logLevel: this.topology.tetherdLogLevel,
      readyTimeoutMs: this.topology.tetherdReadyTimeoutMs ?? 15_000,
      container: this.nodeRuntime && { ...this.nodeRuntime, ...this.releaseParts(this.releaseOf(n.name)) },
      binDir: this.releaseParts(this.releaseOf(n.name)).binDir,
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
    // Sandboxes go through CRI while tetherd still answers their DEL; containerds before the namespaces.
    const criLeft = await this.destroyCri();
    await Promise.all(this.operators.map((o) => o.kill('SIGKILL')));
    for (const c of this.children) c.kill('SIGKILL');
    // Containers first (SIGKILL through containerd, as the plain tetherds are killed by the teardown).
    const rtLeft = (await this.nodeRuntime?.runtime.destroy()) ?? [];
    await this.sentinelSet?.stop();
    await this.clusterStore?.stop();
    await Promise.all([...this.relays.values()].map((r) => r.close()));
    await this.fakeApi?.close();
    const left = teardownRunSync(this.prefix);
    await this.testRedis?.stop(); // teardown killed it already; this drops the helper's exit hook
    unregisterLive(this.prefix);
    if (left.length > 0) throw new Error(`testbed ${this.prefix} teardown left: ${left.join(', ')}`);
    if (this.denied.length > 0) throw new Error(`testbed ${this.prefix}: the admission policies denied ${this.denied.length} write(s) of the run's components:\n  ${this.denied.join('\n  ')}`);
    if (rtLeft.length > 0) throw new Error(`testbed ${this.prefix} node containers left: ${rtLeft.join(', ')}`);
    if (criLeft.length > 0) throw new Error(`testbed ${this.prefix} containerd teardown: ${criLeft.join('; ')}`);
  }

  /**
   * The last decisions of every node's tetherd (ownership changes, liveness, store), in time order: what a
   * failed scenario's output needs to say why (CI keeps no logs).
   */
  printDecisions(max = 40): void {
    const lines: Array<{ t: string; line: string }> = [];
    for (const n of this.plan.nodes) {
      let text = '';
      try {
        text = fs.readFileSync(this.tetherdLog(n.name), 'utf8');
      } catch {
        continue;
      }
      for (const line of text.split('\n')) {
        if (!DECISION.test(line)) continue;
        const t = /"timestamp":"([^"]+)"/.exec(line)?.[1] ?? '';
        lines.push({ t, line: `${n.name} ${line.length > 400 ? line.slice(0, 400) + '…' : line}` });
      }
    }
    lines.sort((a, b) => a.t.localeCompare(b.t));
    if (!lines.length) return;
    process.stdout.write(`  tetherd decisions (last ${Math.min(max, lines.length)} of ${lines.length}):\n${lines.slice(-max).map((l) => `    ${l.line}`).join('\n')}\n`);
  }

  /** Where keepLogs copies the logs to. */
  get keptLogsDir(): string {
    return path.resolve(__dirname, '../../results/tmp/testbed', this.prefix);
  }

  private copyLogs(): void {
    const redisLog = this.testRedis && path.join(this.testRedis.dir, 'redis.log');
    if (redisLog && fs.existsSync(redisLog)) {
      fs.mkdirSync(this.keptLogsDir, { recursive: true });
      fs.copyFileSync(redisLog, path.join(this.keptLogsDir, 'redis.log'));
    }
    for (const n of this.plan.nodes) {
      if (!fs.existsSync(this.tetherdLog(n.name))) continue;
      fs.mkdirSync(this.keptLogsDir, { recursive: true });
      fs.copyFileSync(this.tetherdLog(n.name), path.join(this.keptLogsDir, `tetherd-${n.name}.log`));
    }
    this.operators.forEach((_, i) => {
      if (!fs.existsSync(this.operatorLog(i))) return;
      fs.mkdirSync(this.keptLogsDir, { recursive: true });
      fs.copyFileSync(this.operatorLog(i), path.join(this.keptLogsDir, path.basename(this.operatorLog(i))));
    });
  }

  /** What of this run still exists (namespaces, run dir, pin dir); empty after down(). */
  leftovers(): string[] {
    return leftovers(this.prefix);
  }
}

/** The ServiceAccount users of the run's components, as the API server names them. */
export const NODE_SA = 'system:serviceaccount:tether-system:tether';
export const OPERATOR_SA = 'system:serviceaccount:tether-system:tether-operator';

/** A request whose token is none of the run's components': an administrator (no policy applies to it). */
const ADMIN: UserInfo = { username: 'kubernetes-admin', groups: ['kubeadm:cluster-admins', 'system:authenticated'] };

/** The port tetherds reach the FAKE API server on, inside each node namespace. */
const KUBE_API_PORT = 16443;

/** TCP on 127.0.0.1:<port> of a namespace → the API server's unix socket (argv: port, socket path). */
const FORWARDER = `
const net = require('net');
const [port, sock] = process.argv.slice(1);
net.createServer((c) => {
  const u = net.connect(sock);
  c.pipe(u); u.pipe(c);
  c.on('error', () => u.destroy()); u.on('error', () => c.destroy());
  c.on('close', () => u.destroy()); u.on('close', () => c.destroy());
}).listen(Number(port), '127.0.0.1', () => console.log('ready'));`;

/** Brings a testbed up, runs fn on it and always tears it down, also when fn throws. */
export async function withTestbed<T>(topo: Topology, fn: (tb: Testbed) => Promise<T>, opts?: UpOptions): Promise<T> {
  const tb = await Testbed.up(topo, opts);
  try {
    return await fn(tb);
  } catch (e) {
    tb.printDecisions();
    throw e;
  } finally {
    await tb.down();
  }
}

/** tetherd log lines that say what was decided (ownership, liveness, store): printed when a scenario fails. */
const DECISION = /ownership changed|stands? down|looks down|BFD session|handover|refused|store (un)?reachable|connection lost|reconnected|restarted empty|generation/;

/** Everything a child prints (stdout and stderr), once it exits. */
function output(child: ChildProcess): Promise<string> {
  return new Promise((resolve) => {
    let out = '';
    child.stdout?.on('data', (b: Buffer) => (out += b.toString()));
    child.stderr?.on('data', (b: Buffer) => (out += b.toString()));
    child.once('exit', () => resolve(out));
  });
}

/** Runs `ip [-n ns] -batch -` over lines; rejects with ip's error (it names the failing line). */
async function ipBatch(ns: string | undefined, lines: string[]): Promise<void> {
  await mustRun(['ip', ...(ns ? ['-n', ns] : []), '-batch', '-'], { input: lines.join('\n') + '\n' });
}

/** The part of tetherd's status the testbed reads. */
export interface TetherdStatus {
  node: string;
  zone?: string;
  ipam: {
    pods: Array<{ pool: string; usage: string; families: Array<{ family: number; cidr: string; blockSize: number; blocks: string[]; allocated: number; free: number }> }>;
  };
  [key: string]: unknown;
}

function decideIpam(topo: Topology, tether: boolean): IpamMode {
  // TETHER_TESTBED_IPAM=host-local runs a tether testbed on host-local unless the topology says otherwise.
  const env = process.env.TETHER_TESTBED_IPAM;
  const fallback: IpamMode = tether && env !== 'host-local' ? 'tether-ipam' : 'host-local';
  const mode = topo.ipam ?? fallback;
  if (mode === 'tether-ipam') {
    if (!tether) throw new Error('topology.ipam: tether-ipam needs tetherd, but tether is disabled in this testbed');
    if (!fs.existsSync(path.join(binDir(), 'tether-ipam'))) throw new Error(`topology.ipam: tether-ipam is not in ${binDir()} (build, or set ipam: 'host-local')`);
  }
  return mode;
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
