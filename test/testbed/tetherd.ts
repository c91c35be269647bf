// One node's tetherd as a child process: started inside the node's namespace with nsenter (so bpffs pins
// stay visible), logging to a file, ready when `tetherctl ping` answers on its socket.
import { ChildProcess, spawn } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { nsenterArgv, run, sleep, stopBoxOrChild } from './proc';
import type { NodeContainer, NodeRuntime } from '../lib/container/node-runtime';
import { containerOf, type PodSpec } from '../lib/container/pod-spec';

/** Where tether, tetherd and tetherctl live (TETHER_BIN_DIR overrides <repo>/dist/bin); read at each use. */
export function binDir(): string {
  return process.env.TETHER_BIN_DIR ?? path.resolve(__dirname, '../../dist/bin');
}

export interface TetherdPaths {
  socket: string;
  stateDir: string;
  pinDir: string;
  log: string;
  pidFile: string;
}

export interface TetherdOptions {
  node: string;
  nsPath: string;
  paths: TetherdPaths;
  config?: string;
  /** The cluster store: --redis URL --redis-prefix PREFIX. */
  redis?: { url: string; prefix: string };
  /** More flags (e.g. --node-address, --cluster-key-file for Egress). */
  extraArgs?: string[];
  logLevel?: string;
  readyTimeoutMs: number;
  /**
   * Run tetherd in the DaemonSet's container (the manifest's pod spec) on this runtime, not as a plain process;
   * `image`: the image archive to run (default: the runtime's).
   */
  container?: { runtime: NodeRuntime; pod: PodSpec; env?: Record<string, string>; image?: string };
  /** Where tetherd and tetherctl are (default binDir()): another release's build in the upgrade test. */
  binDir?: string;
}

/** Flags of the manifest's command that need a cluster (its service account, Secrets): the testbed gives its own. */
const CLUSTER_ONLY_FLAGS = ['--kubernetes', '--cluster-key-secret', '--redis-password-secret', '--node-name', '--node-address', '--cni-net-dir'];

export interface ExitStatus {
  code: number | null;
  signal: NodeJS.Signals | null;
}

export class Tetherd {
  private child?: ChildProcess;
  private box?: NodeContainer;
  private exited?: Promise<ExitStatus>;

  constructor(readonly opts: TetherdOptions) {}

  private get binDir(): string {
    return this.opts.binDir ?? binDir();
  }

  /**
   * Which release the next start() runs: its executables, and in a container its image and its DaemonSet's
   * pod spec. A running tetherd is not touched (stop it first, as a DaemonSet's rollout does).
   */
  useRelease(rel: { binDir: string; image?: string; pod?: PodSpec }): void {
    this.opts.binDir = rel.binDir;
    if (this.opts.container) this.opts.container = { ...this.opts.container, image: rel.image, pod: rel.pod ?? this.opts.container.pod };
  }

  get pid(): number | undefined {
    if (this.box) return this.box.pid;
    return this.running ? this.child?.pid : undefined;
  }

  get running(): boolean {
    if (this.box) return this.box.running;
    return this.child !== undefined && this.child.exitCode === null && this.child.signalCode === null;
  }

  /** The container tetherd runs in (undefined when it runs as a plain process). */
  get container(): NodeContainer | undefined {
    return this.box;
  }

  /** Starts tetherd and resolves once it answers ping; rejects with the log's tail if it dies or times out. */
  async start(): Promise<void> {
    if (this.running) throw new Error(`tetherd on ${this.opts.node} already runs (pid ${this.child?.pid})`);
    const { paths } = this.opts;
    fs.mkdirSync(paths.stateDir, { recursive: true });
    fs.mkdirSync(paths.pinDir, { recursive: true });
    const argv = [
      path.join(this.binDir, 'tetherd'),
      '--node-name', this.opts.node,
      '--socket', paths.socket,
      '--state-dir', paths.stateDir,
      '--bpf-pin-dir', paths.pinDir,
      '--log-level', this.opts.logLevel ?? 'info',
      ...(this.opts.config ? ['--config', this.opts.config] : []),
      ...(this.opts.redis ? ['--redis', this.opts.redis.url, '--redis-prefix', this.opts.redis.prefix] : []),
      ...(this.opts.extraArgs ?? []),
    ];
    if (this.opts.container) {
      this.startContainer(argv);
      await this.waitReady();
      return;
    }
    const fd = fs.openSync(paths.log, 'a');
    fs.writeSync(fd, `# ${new Date().toISOString()} testbed: starting ${argv.join(' ')}\n`);
    // nsenter execs tetherd in place (no --fork), so the child's pid is tetherd's pid.
    const full = nsenterArgv(this.opts.nsPath, argv);
    const child = spawn(full[0], full.slice(1), { stdio: ['ignore', fd, fd] });
    fs.closeSync(fd);
    this.child = child;
    this.exited = new Promise((resolve) => child.once('exit', (code, signal) => resolve({ code, signal })));
    child.once('error', () => undefined); // surfaced by the readiness wait below
    if (child.pid !== undefined) fs.writeFileSync(paths.pidFile, String(child.pid));
    await this.waitReady();
  }

  /**
   * The DaemonSet's tetherd container on this node: the manifest's security context, volumes and flags,
   * with the node's own directories behind the hostPath volumes and the testbed's flags (node name and
   * address, config file, store, key) in place of those that need a cluster.
   */
  private startContainer(argv: string[]): void {
    const { runtime, pod } = this.opts.container!;
    const { paths } = this.opts;
    const spec = containerOf(pod, 'tetherd');
    const cniDir = path.join(paths.stateDir, '..', 'cni-net.d');
    fs.mkdirSync(cniDir, { recursive: true });
    const nodeDirs: Record<string, string> = { 'run-tether': path.dirname(paths.socket), state: paths.stateDir, 'cni-net': cniDir };
    const inContainer = new Map<string, string>(); // host dir → its path in the container
    for (const m of spec.volumeMounts ?? []) if (nodeDirs[m.name]) inContainer.set(nodeDirs[m.name], m.mountPath);
    const translate = (p: string): string | undefined => {
      for (const [host, ctr] of inContainer) if (p === host || p.startsWith(`${host}/`)) return ctr + p.slice(host.length);
      return undefined;
    };
    const extraDirs = new Set<string>();
    const testbedArgs = argv.slice(1).map((a) => {
      const unix = /^unix:\/\/(\/[^?]*)/.exec(a)?.[1];
      if (unix) extraDirs.add(path.dirname(unix));
      if (!a.startsWith('/')) return a;
      const t = translate(a);
      if (t !== undefined) return t;
      if (!a.startsWith('/sys/fs/bpf/')) extraDirs.add(path.dirname(a));
      return a;
    });
    const given = new Set(testbedArgs.filter((a) => a.startsWith('--')).map((a) => a.split('=')[0]));
    const manifestFlags = spec.command.slice(1).filter((a) => {
      const name = a.split('=')[0];
      return !CLUSTER_ONLY_FLAGS.includes(name) && !given.has(name);
    });
    const log = paths.log;
    fs.appendFileSync(log, `# ${new Date().toISOString()} testbed: starting in the DaemonSet's container: ${[spec.command[0], ...manifestFlags, ...testbedArgs].join(' ')}\n`);
    this.box = runtime.run(`tetherd-${this.opts.node}`, {
      pod,
      container: spec,
      nodeNetns: this.opts.nsPath,
      hostPath: (volume, p) => {
        const d = nodeDirs[volume] ?? p;
        fs.mkdirSync(d, { recursive: true });
        return d;
      },
      argv: [spec.command[0], ...manifestFlags, ...testbedArgs],
      env: { NODE_NAME: this.opts.node, POD_NAMESPACE: 'tether-system', ...(this.opts.container!.env ?? {}) },
      extraReadOnlyDirs: [...extraDirs].filter((d) => translate(d) === undefined),
    }, log, this.opts.container!.image);
    this.exited = this.box.exited;
  }

  private async waitReady(): Promise<void> {
    const deadline = Date.now() + this.opts.readyTimeoutMs;
    const ctl = path.join(this.binDir, 'tetherctl');
    for (;;) {
      if (!this.running) {
        throw new Error(`tetherd on ${this.opts.node} exited before ready (${JSON.stringify(await this.exited)}):\n${this.logTail()}`);
      }
      // A Unix socket path is reachable from any network namespace: no nsenter needed for the client.
      const r = await run([ctl, '--socket', this.opts.paths.socket, 'ping'], { timeoutMs: 2000 });
      if (r.code === 0) return;
      if (Date.now() > deadline) {
        throw new Error(`tetherd on ${this.opts.node} not ready after ${this.opts.readyTimeoutMs} ms (last ping: ${r.stderr.trim()}):\n${this.logTail()}`);
      }
      await sleep(100);
    }
  }

  /** Sends signal and resolves with how the process ended; resolves at once if it is not running. */
  async kill(signal: NodeJS.Signals = 'SIGKILL', timeoutMs = 5000): Promise<ExitStatus> {
    return stopBoxOrChild({ box: this.box, child: this.child, running: this.running, exited: this.exited }, signal, timeoutMs, { code: null, signal: null });
  }

  /** Clean stop (SIGTERM, SIGKILL after a grace period) then start again. */
  async restart(): Promise<void> {
    await this.kill('SIGTERM');
    await this.start();
  }

  logTail(lines = 30): string {
    try {
      return fs.readFileSync(this.opts.paths.log, 'utf8').trimEnd().split('\n').slice(-lines).join('\n');
    } catch {
      return '(no log)';
    }
  }
}

/** True when all three tether executables are present. */
export function tetherBinariesPresent(): boolean {
  return ['tether', 'tetherd', 'tetherctl'].every((b) => fs.existsSync(path.join(binDir(), b)));
}

/** Mounts bpffs at /sys/fs/bpf unless it already is one (it is not mounted at boot here). */
export async function ensureBpffs(): Promise<void> {
  const mounted = fs
    .readFileSync('/proc/mounts', 'utf8')
    .split('\n')
    .some((l) => {
      const f = l.split(' ');
      return f[1] === '/sys/fs/bpf' && f[2] === 'bpf';
    });
  if (mounted) return;
  const r = await run(['mount', '-t', 'bpf', 'bpf', '/sys/fs/bpf']);
  if (r.code !== 0) throw new Error(`mount bpffs at /sys/fs/bpf: ${r.stderr.trim()}`);
}
