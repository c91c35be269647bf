// Runs the DaemonSet's containers on the testbed's nodes as a node's runtime would: the image built by
// install/image.sh, unpacked once; a private containerd (test/lib/cri/containerd.ts) whose own client,
// `ctr run`, builds each container's OCI spec from the manifest's container (pod-spec.ts) and hands it to
// runc. Every container of one run shares the read-only rootfs; each joins its node's network namespace
// (hostNetwork) and gets a PID namespace of its own (no hostPID).
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import * as crypto from 'node:crypto';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { Containerd } from '../cri/containerd';
import { ctrRunFlags, runAsArgv, type CtrRunInput } from './pod-spec';

const root = path.join(__dirname, '../../..');
export const IMAGE_ARCHIVE = process.env.TETHER_IMAGE_ARCHIVE ?? path.join(root, 'dist/image/tether.oci.tar');
const ROOTFS_CACHE = process.env.TETHER_ROOTFS_CACHE ?? '/var/cache/tether-test/rootfs';
/** Unpacked images kept in ROOTFS_CACHE (this release's, the previous one's, one more). */
const KEEP_IMAGES = 3;
/** containerd namespace of the node containers (the CRI's own is k8s.io). */
const NS = 'tether-node';

export interface ExitStatus {
  code: number | null;
  signal: NodeJS.Signals | null;
}

/**
 * The image's root filesystem, unpacked from the OCI archive once per image (keyed by its manifest
 * digest, so a rebuilt image is unpacked anew) with umoci.
 */
export function imageRootfs(archive = IMAGE_ARCHIVE): { rootfs: string; env: string[] } {
  if (!fs.existsSync(archive)) throw new Error(`${archive} is missing: bash install/image.sh builds it (test/run.sh does)`);
  const listing = spawnSync('tar', ['-xOf', archive, 'index.json'], { encoding: 'utf8' });
  if (listing.status !== 0) throw new Error(`${archive}: no index.json (${listing.stderr})`);
  const m = (JSON.parse(listing.stdout) as { manifests: Array<{ digest: string; annotations?: Record<string, string> }> }).manifests[0];
  const tag = m.annotations?.['org.opencontainers.image.ref.name'];
  if (!tag) throw new Error(`${archive}: the image has no ref name`);
  // The image config's Env (PATH above all), which the CRI puts before the container's own env.
  const blob = (d: string) => JSON.parse(spawnSync('tar', ['-xOf', archive, `blobs/${d.replace(':', '/')}`], { encoding: 'utf8', maxBuffer: 1 << 24 }).stdout);
  const config = blob(blob(m.digest).config.digest) as { config?: { Env?: string[] } };
  const env = config.config?.Env ?? [];
  const dir = path.join(ROOTFS_CACHE, m.digest.replace(':', '-'));
  const rootfs = path.join(dir, 'rootfs');
  const done = path.join(dir, 'done');
  if (fs.existsSync(done)) {
    // Marks it as used now: the eviction below keeps the images used last.
    const now = new Date();
    fs.utimesSync(done, now, now);
    return { rootfs, env };
  }
  fs.rmSync(dir, { recursive: true, force: true });
  const layout = path.join(dir, 'layout');
  fs.mkdirSync(layout, { recursive: true });
  run('tar', ['-xf', archive, '-C', layout]);
  run('umoci', ['raw', 'unpack', '--image', `${layout}:${tag}`, rootfs]);
  fs.rmSync(layout, { recursive: true, force: true });
  fs.writeFileSync(done, `${tag} ${m.digest}\n`);
  // Older unpacked images go, but not the ones used last: the upgrade test runs this release's image and the
  // previous release's side by side.
  const used = (e: string) => {
    try {
      return fs.statSync(path.join(ROOTFS_CACHE, e, 'done')).mtimeMs;
    } catch {
      return 0;
    }
  };
  const others = fs.readdirSync(ROOTFS_CACHE).filter((e) => path.join(ROOTFS_CACHE, e) !== dir).sort((a, b) => used(b) - used(a));
  for (const e of others.slice(KEEP_IMAGES - 1)) fs.rmSync(path.join(ROOTFS_CACHE, e), { recursive: true, force: true });
  return { rootfs, env };
}

function run(cmd: string, args: string[]): string {
  const r = spawnSync(cmd, args, { encoding: 'utf8', timeout: 120_000 });
  if (r.status !== 0) throw new Error(`${cmd} ${args.join(' ')} failed: ${r.stderr || r.error?.message}`);
  return r.stdout;
}

/** One running container: its task's host PID, a kill that reaches the task, and how it ended. */
export class NodeContainer {
  readonly exited: Promise<ExitStatus>;
  private ended?: ExitStatus;

  constructor(
    readonly id: string,
    private readonly rt: NodeRuntime,
    child: ChildProcess,
    private readonly pidFile: string,
  ) {
    this.exited = new Promise((resolve) =>
      child.once('exit', (code) => {
        // ctr run exits with the task's status: 128 + N when signal N ended it.
        const sig = code !== null && code > 128 ? (Object.entries(os.constants.signals).find(([, n]) => n === code - 128)?.[0] as NodeJS.Signals) : null;
        this.ended = sig ? { code: null, signal: sig } : { code, signal: null };
        resolve(this.ended);
      }),
    );
  }

  get running(): boolean {
    return this.ended === undefined;
  }

  /** The task's PID on the host (the entrypoint's process), once ctr has written it. */
  get pid(): number | undefined {
    try {
      return this.running ? Number(fs.readFileSync(this.pidFile, 'utf8').trim()) || undefined : undefined;
    } catch {
      return undefined;
    }
  }

  /** Signals the task as kubelet's runtime would (SIGKILL too, which ctr itself could not forward). */
  kill(signal: NodeJS.Signals): void {
    if (!this.running) return;
    this.rt.ctr(['tasks', 'kill', '--signal', signal, this.id], true);
  }
}

/** A private containerd for the run's node containers; destroy() removes every container, shim and mount. */
export class NodeRuntime {
  private readonly containerd: Containerd;
  private readonly dir: string;
  /** Unpacked images by archive path; the first one started is the default. */
  private readonly images = new Map<string, { rootfs: string; env: string[] }>();
  private defaultArchive?: string;
  private readonly live = new Map<string, NodeContainer>();
  readonly instance = crypto.randomBytes(3).toString('hex');

  constructor() {
    this.dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tether-node-rt-'));
    const empty = path.join(this.dir, 'cni');
    fs.mkdirSync(empty);
    // The CRI plugin is not used for node containers; it only needs directories to watch.
    this.containerd = new Containerd({ dir: path.join(this.dir, 'containerd'), cniBinDir: empty, cniConfDir: empty });
  }

  /** Starts containerd; `archive` is the image containers run unless run() names another. */
  async start(archive = IMAGE_ARCHIVE): Promise<void> {
    this.image(archive);
    this.defaultArchive = archive;
    await this.containerd.start();
  }

  private image(archive: string): { rootfs: string; env: string[] } {
    let img = this.images.get(archive);
    if (!img) this.images.set(archive, (img = imageRootfs(archive)));
    return img;
  }

  ctr(args: string[], quiet = false): string {
    const r = spawnSync('ctr', ['-a', this.containerd.socket, '-n', NS, ...args], { encoding: 'utf8', timeout: 30_000 });
    if (r.status !== 0 && !quiet) throw new Error(`ctr ${args.join(' ')}: ${r.stderr || r.error?.message}`);
    return r.stdout ?? '';
  }

  /**
   * Starts a container (ctr run --rm, attached: its output goes to logFile, its exit is the task's) from the
   * image in `archive` (default: the one given to start()).
   */
  run(name: string, input: CtrRunInput, logFile: string, archive?: string): NodeContainer {
    if (!this.defaultArchive) throw new Error('NodeRuntime.start() first');
    const image = this.image(archive ?? this.defaultArchive);
    const id = `${name}-${this.instance}-${crypto.randomBytes(2).toString('hex')}`;
    const pidFile = path.join(this.dir, `${id}.pid`);
    const argv = ['-a', this.containerd.socket, '-n', NS, 'run', '--rm', '--rootfs', '--pid-file', pidFile, ...image.env.flatMap((e) => ['--env', e]), ...ctrRunFlags(input), image.rootfs, id, ...runAsArgv(input.container, input.argv)];
    const fd = fs.openSync(logFile, 'a');
    fs.writeSync(fd, `# ${new Date().toISOString()} container ${id}: ctr ${argv.join(' ')}\n`);
    const child = spawn('ctr', argv, { stdio: ['ignore', fd, fd] });
    fs.closeSync(fd);
    child.once('error', () => undefined); // seen as an exit by the caller's readiness wait
    const c = new NodeContainer(id, this, child, pidFile);
    this.live.set(id, c);
    void c.exited.then(() => this.live.delete(id));
    return c;
  }

  /** Runs a container to its end (an init container) and returns its status and output. */
  async runToEnd(name: string, input: CtrRunInput, logFile: string, timeoutMs = 60_000): Promise<ExitStatus> {
    const c = this.run(name, input, logFile);
    const timer = new Promise<'timeout'>((r) => setTimeout(() => r('timeout'), timeoutMs));
    const st = await Promise.race([c.exited, timer]);
    if (st === 'timeout') {
      c.kill('SIGKILL');
      throw new Error(`${name} did not finish in ${timeoutMs} ms`);
    }
    return st;
  }

  async destroy(): Promise<string[]> {
    for (const c of this.live.values()) c.kill('SIGKILL');
    await Promise.race([Promise.all([...this.live.values()].map((c) => c.exited)), new Promise((r) => setTimeout(r, 10_000))]);
    const problems = await this.containerd.destroy();
    fs.rmSync(this.dir, { recursive: true, force: true });
    return problems;
  }
}
