// A private containerd for tests that create pods as kubelet does: its own config, root, state and socket
// under one directory, the CRI plugin reading the test's CNI dirs, the locally built pause image as the
// sandbox image. stop() keeps the sandboxes' shims (a containerd restart, as on a node); destroy() removes
// everything this instance started or mounted, even after a failed test.
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import * as crypto from 'node:crypto';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { CriClient, sandboxNetns, type PodSandboxConfig } from './client';
import { PAUSE_REPO, pauseImage, type PauseImage } from './pause-image';

export interface ContainerdOptions {
  /** Directory for everything of this instance (created; default a new temp dir). Removed by destroy(). */
  dir?: string;
  /** The CRI plugin's cni.bin_dir and cni.conf_dir. */
  cniBinDir: string;
  cniConfDir: string;
  /** overlayfs (default) or native. */
  snapshotter?: 'overlayfs' | 'native';
  logLevel?: string;
  readyTimeoutMs?: number;
  /**
   * Run containerd (and so the CNI plugins and shims it starts) inside this network namespace, as a node's
   * containerd runs in the node's host network (the testbed's nodes are namespaces). Default: ours.
   */
  netns?: string;
}

const SHIM = 'containerd-shim-runc-v2';
const CGROUP_ROOT = '/sys/fs/cgroup';

/** The CRI plugin's configuration (containerd 1.6, config version 2); other plugins keep their defaults. */
function configToml(dir: string, o: Required<Pick<ContainerdOptions, 'cniBinDir' | 'cniConfDir' | 'snapshotter'>>, sandboxImage: string): string {
  const q = JSON.stringify; // a TOML basic string is a JSON string for the paths we write
  return `version = 2
root = ${q(path.join(dir, 'root'))}
state = ${q(path.join(dir, 'state'))}
# Snapshotters this machine lacks would only log errors at each start; the tracing exporter is unused.
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = ${q(path.join(dir, 'containerd.sock'))}

[ttrpc]
  address = ${q(path.join(dir, 'containerd.sock.ttrpc'))}

[debug]
  address = ${q(path.join(dir, 'debug.sock'))}

[plugins."io.containerd.internal.v1.opt"]
  path = ${q(path.join(dir, 'opt'))}

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = ${q(sandboxImage)}
  # This machine withholds CAP_SYS_RESOURCE from runc: without this every sandbox fails to start
  # (runc cannot lower the pause process's oom_score_adj below containerd's own).
  restrict_oom_score_adj = true
  # The exec/attach stream server is unused; a kernel-chosen port on loopback never clashes.
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  disable_apparmor = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = ${q(o.snapshotter)}
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        # runc's state of this instance's containers, instead of the host's /run/containerd/runc.
        Root = ${q(path.join(dir, 'runc'))}
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = ${q(o.cniBinDir)}
    conf_dir = ${q(o.cniConfDir)}
    # As kubelet's nodes run it: only the first file of the directory (the chained one) is the network.
    max_conf_num = 1
`;
}

export interface RunPodOptions {
  /** Pod (and sandbox) name; the Kubernetes namespace defaults to the harness's. */
  name: string;
  namespace?: string;
  labels?: Record<string, string>;
  annotations?: Record<string, string>;
  hostNetwork?: boolean;
}

export class Containerd {
  readonly dir: string;
  readonly socket: string;
  readonly logFile: string;
  /** Every pod's cgroup lives below this (one per instance), so destroy() can remove them all. */
  readonly cgroupParent: string;
  /** Random per instance: in pod uids and the cgroup parent, so parallel instances never share either. */
  readonly instance = crypto.randomBytes(4).toString('hex');
  readonly client: CriClient;
  private child?: ChildProcess;
  private exited?: Promise<number | null>;
  private image?: PauseImage;
  /** Netns paths seen for this instance's sandboxes: destroy() removes any containerd left behind. */
  private readonly netnsSeen = new Set<string>();
  private readonly opts: Required<Omit<ContainerdOptions, 'dir' | 'netns'>> & Pick<ContainerdOptions, 'netns'>;

  constructor(opts: ContainerdOptions) {
    this.dir = opts.dir ?? fs.mkdtempSync(path.join(os.tmpdir(), 'tether-cri-'));
    fs.mkdirSync(this.dir, { recursive: true, mode: 0o700 });
    this.opts = { snapshotter: 'overlayfs', logLevel: 'info', readyTimeoutMs: 30_000, ...opts };
    this.socket = path.join(this.dir, 'containerd.sock');
    this.logFile = path.join(this.dir, 'containerd.log');
    this.cgroupParent = `/tether-cri-${this.instance}`;
    this.client = new CriClient(this.socket);
  }

  get running(): boolean {
    return this.child !== undefined && this.child.exitCode === null && this.child.signalCode === null;
  }

  get pid(): number | undefined {
    return this.running ? this.child?.pid : undefined;
  }

  /** Starts containerd (building the pause image on first use and importing it) and waits for CRI Version. */
  async start(): Promise<void> {
    if (this.running) throw new Error('containerd already runs');
    this.image ??= pauseImage();
    const conf = path.join(this.dir, 'config.toml');
    fs.writeFileSync(conf, configToml(this.dir, this.opts, this.image.ref));
    const fd = fs.openSync(this.logFile, 'a');
    const argv = ['containerd', '--config', conf, '--log-level', this.opts.logLevel];
    // nsenter --net alone does not fork: the child is containerd itself, so stop() signals it directly.
    if (this.opts.netns) argv.unshift('nsenter', `--net=${this.opts.netns}`, '--');
    const child = spawn(argv[0], argv.slice(1), { stdio: ['ignore', fd, fd] });
    fs.closeSync(fd);
    this.child = child;
    this.exited = new Promise((resolve) => child.once('exit', (code) => resolve(code)));
    child.once('error', () => undefined); // reported by the wait below
    const deadline = Date.now() + this.opts.readyTimeoutMs;
    for (;;) {
      if (!this.running) throw new Error(`containerd exited before answering (${await this.exited}):\n${this.logTail()}`);
      if (fs.existsSync(this.socket)) {
        try {
          // The CRI plugin registers with the gRPC server after containerd's own services: Version
          // answering means the runtime service is there, not only the socket.
          await this.client.version(2000);
          break;
        } catch {
          /* not yet */
        }
      }
      if (Date.now() > deadline) throw new Error(`containerd did not answer CRI Version within ${this.opts.readyTimeoutMs} ms:\n${this.logTail()}`);
      await new Promise((r) => setTimeout(r, 100));
    }
    await this.importImage(this.image);
  }

  /** Imports the pause archive into the CRI's namespace; a no-op when the image is already there. */
  private async importImage(img: PauseImage): Promise<void> {
    const ctr = ['ctr', '-a', this.socket, '-n', 'k8s.io'];
    const have = spawnSync(ctr[0], [...ctr.slice(1), 'images', 'ls', '-q'], { encoding: 'utf8' });
    if (have.stdout?.split('\n').includes(img.ref)) return;
    // The archive names the image by its tag alone; --base-name makes it the full reference sandbox_image holds.
    const r = spawnSync(ctr[0], [...ctr.slice(1), 'images', 'import', '--base-name', PAUSE_REPO, '--snapshotter', this.opts.snapshotter, img.archive], {
      encoding: 'utf8',
      timeout: 60_000,
    });
    if (r.status !== 0) throw new Error(`ctr images import failed: ${r.stderr || r.error?.message}`);
    const after = spawnSync(ctr[0], [...ctr.slice(1), 'images', 'ls', '-q'], { encoding: 'utf8' });
    if (!after.stdout?.split('\n').includes(img.ref)) throw new Error(`imported ${img.archive} but containerd lists no ${img.ref}: ${after.stdout}`);
  }

  /** Stops containerd alone (SIGTERM, SIGKILL after graceMs): the sandboxes' shims and pause processes stay. */
  async stop(graceMs = 10_000): Promise<void> {
    if (!this.running || !this.child) return;
    this.child.kill('SIGTERM');
    const timer = new Promise<'timeout'>((r) => setTimeout(() => r('timeout'), graceMs));
    if ((await Promise.race([this.exited, timer])) === 'timeout') {
      this.child.kill('SIGKILL');
      await this.exited;
    }
    // The socket file stays after SIGKILL; a stale one would make the next start's wait see it at once.
    fs.rmSync(this.socket, { force: true });
  }

  async restart(): Promise<void> {
    await this.stop();
    await this.start();
  }

  /** A PodSandboxConfig as kubelet builds it: unique uid, the harness's cgroup parent and log directory. */
  podConfig(o: RunPodOptions): PodSandboxConfig {
    const namespace = o.namespace ?? 'default';
    const uid = `${this.instance}-${namespace}-${o.name}`;
    const logDirectory = path.join(this.dir, 'pod-logs', `${namespace}_${o.name}_${uid}`);
    fs.mkdirSync(logDirectory, { recursive: true });
    return {
      metadata: { name: o.name, uid, namespace, attempt: 0 },
      hostname: o.name,
      logDirectory,
      labels: { 'io.kubernetes.pod.name': o.name, 'io.kubernetes.pod.namespace': namespace, ...(o.labels ?? {}) },
      annotations: o.annotations ?? {},
      linux: {
        cgroupParent: `${this.cgroupParent}/pod${uid}`,
        securityContext: { namespaceOptions: { network: o.hostNetwork ? 'NODE' : 'POD', pid: 'CONTAINER', ipc: 'POD' } },
      },
    };
  }

  /** RunPodSandbox, then the sandbox's IP and netns from its (verbose) status. */
  async runPod(o: RunPodOptions, timeoutMs?: number): Promise<{ id: string; ip: string; netns: string | undefined }> {
    const id = await this.client.runPodSandbox(this.podConfig(o), timeoutMs);
    const st = await this.client.podSandboxStatus(id, true);
    const netns = sandboxNetns(st);
    if (netns) this.netnsSeen.add(netns);
    return { id, ip: st.status.network?.ip ?? '', netns };
  }

  /** StopPodSandbox then RemovePodSandbox, as kubelet does when a pod is deleted. */
  async removePod(id: string, timeoutMs?: number): Promise<void> {
    await this.client.stopPodSandbox(id, timeoutMs);
    await this.client.removePodSandbox(id, timeoutMs);
  }

  /** Netns paths of sandboxes started through runPod() that still exist on the host. */
  leftoverNetns(): string[] {
    return [...this.netnsSeen].filter((p) => fs.existsSync(p));
  }

  logTail(lines = 40): string {
    try {
      return fs.readFileSync(this.logFile, 'utf8').trimEnd().split('\n').slice(-lines).join('\n');
    } catch {
      return '(no log)';
    }
  }

  /** Shim processes of this instance (found by the containerd address on their command line). */
  shimPids(): number[] {
    const pids: number[] = [];
    for (const e of fs.readdirSync('/proc')) {
      if (!/^\d+$/.test(e)) continue;
      let argv: string[];
      try {
        argv = fs.readFileSync(`/proc/${e}/cmdline`, 'utf8').split('\0');
      } catch {
        continue; // exited while we looked
      }
      if (!argv[0]?.endsWith(SHIM)) continue;
      const a = argv.indexOf('-address');
      if (a >= 0 && argv[a + 1] === this.socket) pids.push(Number(e));
    }
    return pids;
  }

  /**
   * Removes everything of this instance, best effort and in an order that cannot strand anything: the
   * sandboxes through CRI (so CNI DEL runs) while containerd answers, then containerd, its shims and their
   * children (pause), mounts under dir, netns it left, the pods' cgroups, and dir.
   */
  async destroy(): Promise<string[]> {
    const problems: string[] = [];
    if (this.running) {
      try {
        for (const sb of await this.client.listPodSandbox({}, 10_000)) {
          try {
            const st = await this.client.podSandboxStatus(sb.id, true, 10_000);
            const ns = sandboxNetns(st);
            if (ns) this.netnsSeen.add(ns);
            await this.removePod(sb.id, 30_000);
          } catch (e) {
            problems.push(`sandbox ${sb.id}: ${(e as Error).message}`);
          }
        }
      } catch (e) {
        problems.push(`ListPodSandbox: ${(e as Error).message}`);
      }
    }
    this.client.close();
    await this.stop(5000);
    const shims = this.shimPids();
    const children = allPids().filter((p) => shims.includes(ppidOf(p)));
    for (const p of [...children, ...shims]) {
      try {
        process.kill(p, 'SIGKILL');
      } catch {
        /* already gone */
      }
    }
    if (shims.length) problems.push(`killed ${shims.length} leftover shim(s)`);
    // Deepest first: a sandbox's rootfs and shm mounts sit below the state and root dirs.
    for (const m of mountsUnder(this.dir).reverse()) {
      if (spawnSync('umount', ['-l', m]).status !== 0) problems.push(`umount ${m} failed`);
    }
    for (const ns of this.leftoverNetns()) {
      spawnSync('umount', ['-l', ns]);
      fs.rmSync(ns, { force: true });
      problems.push(`removed leftover netns ${ns}`);
    }
    removeCgroups(this.cgroupParent);
    fs.rmSync(this.dir, { recursive: true, force: true });
    return problems;
  }
}

function allPids(): number[] {
  return fs
    .readdirSync('/proc')
    .filter((e) => /^\d+$/.test(e))
    .map(Number);
}

function ppidOf(pid: number): number {
  try {
    // The command name (field 2) may hold spaces and parentheses: parse after its last ')'.
    const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
    return Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
  } catch {
    return -1;
  }
}

/** Mount points at or below dir, in mount order (mountinfo's fifth field, octal escapes decoded). */
export function mountsUnder(dir: string): string[] {
  const unescape = (s: string) => s.replace(/\\([0-7]{3})/g, (_, o: string) => String.fromCharCode(parseInt(o, 8)));
  return fs
    .readFileSync('/proc/self/mountinfo', 'utf8')
    .split('\n')
    .filter(Boolean)
    .map((l) => unescape(l.split(' ')[4]))
    .filter((m) => m === dir || m.startsWith(`${dir}/`));
}

/** rmdir the pods' cgroups (cgroup v1 hierarchies and v2), leaves first; only empty cgroups can go. */
function removeCgroups(parent: string): void {
  let hierarchies: string[];
  try {
    hierarchies = fs.readdirSync(CGROUP_ROOT).map((h) => path.join(CGROUP_ROOT, h));
  } catch {
    return;
  }
  const rmTree = (p: string) => {
    let entries: fs.Dirent[];
    try {
      entries = fs.readdirSync(p, { withFileTypes: true });
    } catch {
      return;
    }
    for (const e of entries) if (e.isDirectory()) rmTree(path.join(p, e.name));
    try {
      fs.rmdirSync(p);
    } catch {
      /* still has tasks or not a cgroup dir: left for the caller's leak check to name */
    }
  };
  for (const h of [...hierarchies, CGROUP_ROOT]) rmTree(path.join(h, parent));
}
