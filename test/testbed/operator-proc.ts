// One replica of tether-operator, logging to its own file. As a plain process (the default) it runs in a
// node's namespace, where the node's forwarder reaches the run's API server at 127.0.0.1, ready once it logs
// that every part started. In container mode it runs from the Deployment's pod template (install/, kubectl
// kustomize) through the node runtime, as tetherd's DaemonSet container does: the manifest's image, command
// with kubelet's $(VAR) expansion, env (downward API and the tether-store ConfigMap), securityContext (uid
// 65532, no capability, read-only root, RuntimeDefault seccomp) and emptyDir; in a network namespace of its
// own (no hostNetwork; the testbed's stand-in for a pod network: loopback, where a forwarder reaches the API
// server), ready once its startupProbe and then its readinessProbe answer 200 (liveness is not acted on).
import { ChildProcess, spawn } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { nsenterArgv, run, sleep, stopBoxOrChild } from './proc';
import type { ExitStatus } from './tetherd';
import type { NodeContainer, NodeRuntime } from '../lib/container/node-runtime';
import { containerEnv, containerOf, expandCommand, type HttpProbe, type PodSpec } from '../lib/container/pod-spec';

export interface OperatorOptions {
  identity: string;
  /** The network namespace it runs in (a node's; in container mode the replica's own). */
  nsPath: string;
  kubeconfig: string;
  /** The cluster store; in container mode the URL reaches it as the tether-store ConfigMap's url. */
  redis: { url: string; prefix: string };
  log: string;
  binDir: string;
  readyTimeoutMs?: number;
  extraArgs?: string[];
  /** Run the Deployment's container (`pod`) on this runtime; `tmpDir`: its emptyDir volumes' parent. */
  container?: { runtime: NodeRuntime; pod: PodSpec; tmpDir: string; image?: string };
}

/**
 * Flags of the manifest's command the testbed replaces: the in-cluster service account (a kubeconfig with the
 * replica's own token instead) and the store password's Secret (the run's Redis has none).
 */
const CLUSTER_ONLY_FLAGS = ['--kubernetes', '--redis-password-secret'];

/** Polls http://127.0.0.1:<port><path> for each (port, path) pair in turn until it answers 200 (argv: ms, port, path, ...). */
const PROBE_SCRIPT = `
const http = require('http');
const [ms, ...rest] = process.argv.slice(1);
const deadline = Date.now() + Number(ms);
const get = (port, p) => new Promise((r) => {
  const q = http.get({ host: '127.0.0.1', port: Number(port), path: p, timeout: 3000 }, (res) => { res.resume(); r(res.statusCode); });
  q.on('timeout', () => q.destroy(new Error('timeout')));
  q.on('error', (e) => r(e.code || e.message));
});
(async () => {
  for (let i = 0; i < rest.length; i += 2) {
    let last;
    while ((last = await get(rest[i], rest[i + 1])) !== 200) {
      if (Date.now() > deadline) { console.error(rest[i + 1] + ': ' + last); process.exit(1); }
      await new Promise((r) => setTimeout(r, 200));
    }
  }
  console.log('ready');
})();`;

export class OperatorProc {
  private child?: ChildProcess;
  private box?: NodeContainer;
  private exited?: Promise<ExitStatus>;

  constructor(readonly o: OperatorOptions) {}

  get running(): boolean {
    if (this.box) return this.box.running;
    return this.child !== undefined && this.child.exitCode === null && this.child.signalCode === null;
  }

  /** Its process's PID on the host (in a container: the task's), while it runs. */
  get pid(): number | undefined {
    if (this.box) return this.box.pid;
    return this.running ? this.child?.pid : undefined;
  }

  /** Whether it runs from the Deployment's container (not as a plain process). */
  get inContainer(): boolean {
    return this.o.container !== undefined;
  }

  async start(): Promise<void> {
    if (this.running) throw new Error(`tether-operator ${this.o.identity} already runs`);
    if (this.o.container) return this.startContainer();
    const argv = [
      path.join(this.o.binDir, 'tether-operator'), '--kubeconfig', this.o.kubeconfig, '--identity', this.o.identity,
      '--redis', this.o.redis.url, '--redis-prefix', this.o.redis.prefix, ...(this.o.extraArgs ?? []),
    ];
    const fd = fs.openSync(this.o.log, 'a');
    const from = fs.fstatSync(fd).size;
    fs.writeSync(fd, `# ${new Date().toISOString()} testbed: starting ${argv.join(' ')}\n`);
    const full = nsenterArgv(this.o.nsPath, argv);
    const child = spawn(full[0], full.slice(1), { stdio: ['ignore', fd, fd], env: { ...process.env, POD_NAMESPACE: 'tether-system' } });
    fs.closeSync(fd);
    this.child = child;
    this.exited = new Promise((resolve) => child.once('exit', (code, signal) => resolve({ code, signal })));
    child.once('error', () => undefined);
    const deadline = Date.now() + (this.o.readyTimeoutMs ?? 20_000);
    for (;;) {
      const text = fs.readFileSync(this.o.log, 'utf8').slice(from);
      if (text.includes('"message":"tether-operator started"')) return;
      if (!this.running) throw new Error(`tether-operator ${this.o.identity} exited before it started (${JSON.stringify(await this.exited)}):\n${this.logTail()}`);
      if (Date.now() > deadline) throw new Error(`tether-operator ${this.o.identity} not started after ${this.o.readyTimeoutMs ?? 20_000} ms:\n${this.logTail()}`);
      await sleep(100);
    }
  }

  /** The Deployment's container for this replica, as kubelet would start it, then its probes. */
  private async startContainer(): Promise<void> {
    const { runtime, pod, tmpDir, image } = this.o.container!;
    const spec = containerOf(pod, 'tether-operator');
    const env = containerEnv(spec, { 'metadata.name': this.o.identity, 'metadata.namespace': 'tether-system', 'configmap/tether-store/url': this.o.redis.url });
    const cmd = expandCommand(spec.command, env);
    const argv = [
      cmd[0], ...cmd.slice(1).filter((a) => !CLUSTER_ONLY_FLAGS.includes(a.split('=')[0])),
      '--kubeconfig', this.o.kubeconfig, '--redis-prefix', this.o.redis.prefix, ...(this.o.extraArgs ?? []),
    ];
    // The kubeconfig and the store's socket: test-only binds at their own paths (the replica's directory).
    const binds = [path.dirname(this.o.kubeconfig), ...[/^unix:\/\/(\/[^?]*)/.exec(this.o.redis.url)?.[1]].filter((p): p is string => !!p).map((p) => path.dirname(p))];
    fs.appendFileSync(this.o.log, `# ${new Date().toISOString()} testbed: starting ${this.o.identity} in the Deployment's container: ${argv.join(' ')}\n`);
    this.box = runtime.run(this.o.identity, {
      pod,
      container: spec,
      nodeNetns: this.o.nsPath,
      podNetns: this.o.nsPath,
      hostPath: (volume) => {
        throw new Error(`the operator's pod has no hostPath volume (${volume})`);
      },
      emptyDir: (volume) => {
        // An emptyDir is world-writable (kubelet makes it 0777): the container's user writes there.
        const d = path.join(tmpDir, `${this.o.identity}-${volume}`);
        fs.rmSync(d, { recursive: true, force: true });
        fs.mkdirSync(d, { recursive: true });
        fs.chmodSync(d, 0o777);
        return d;
      },
      argv,
      env,
      extraReadOnlyDirs: [...new Set(binds)],
    }, this.o.log, image);
    this.exited = this.box.exited;
    const probes = [spec.startupProbe, spec.readinessProbe].filter((p): p is HttpProbe => !!p?.httpGet);
    if (!probes.length) throw new Error('the operator\'s container has no startup or readiness probe: nothing says when it is ready');
    const ms = this.o.readyTimeoutMs ?? 30_000;
    const probeArgv = nsenterArgv(this.o.nsPath, [process.execPath, '-e', PROBE_SCRIPT, String(ms), ...probes.flatMap((p) => [String(p.httpGet.port), p.httpGet.path])]);
    const r = await Promise.race([run(probeArgv, { timeoutMs: ms + 5000 }), this.box.exited.then((st) => ({ exited: st }))]);
    if ('exited' in r) throw new Error(`tether-operator ${this.o.identity} exited before it was ready (${JSON.stringify(r.exited)}):\n${this.logTail()}`);
    if (r.code !== 0) throw new Error(`tether-operator ${this.o.identity}: its probes did not answer 200 in ${ms} ms (${r.stderr.trim()}):\n${this.logTail()}`);
  }

  /** Sends the signal (SIGTERM: a clean stop, releasing the Lease) and resolves when it has exited. */
  async kill(signal: NodeJS.Signals = 'SIGTERM', timeoutMs = 10_000): Promise<ExitStatus> {
    return stopBoxOrChild({ box: this.box, child: this.child, running: this.running, exited: this.exited }, signal, timeoutMs, { code: null, signal: null });
  }

  logTail(lines = 30): string {
    try {
      return fs.readFileSync(this.o.log, 'utf8').trimEnd().split('\n').slice(-lines).join('\n');
    } catch {
      return '(no log)';
    }
  }
}
