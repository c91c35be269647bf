// One replica of tether-operator as a child process in a node's namespace (where the node's forwarder
// reaches the run's API server at 127.0.0.1, as a pod of the Deployment reaches its API server), logging to
// a file, ready once it logs that every part started. The Deployment's container is not run here: the
// testbed's container mode runs the DaemonSet's tetherd only.
import { ChildProcess, spawn } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { nsenterArgv, sleep } from './proc';
import type { ExitStatus } from './tetherd';

export interface OperatorOptions {
  identity: string;
  nsPath: string;
  kubeconfig: string;
  redis: { url: string; prefix: string };
  log: string;
  binDir: string;
  readyTimeoutMs?: number;
  extraArgs?: string[];
}

export class OperatorProc {
  private child?: ChildProcess;
  private exited?: Promise<ExitStatus>;

  constructor(readonly o: OperatorOptions) {}

  get running(): boolean {
    return this.child !== undefined && this.child.exitCode === null && this.child.signalCode === null;
  }

  async start(): Promise<void> {
    if (this.running) throw new Error(`tether-operator ${this.o.identity} already runs`);
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

  /** Sends the signal (SIGTERM: a clean stop, releasing the Lease) and resolves when it has exited. */
  async kill(signal: NodeJS.Signals = 'SIGTERM', timeoutMs = 10_000): Promise<ExitStatus> {
    if (!this.running || !this.child) return (await this.exited) ?? { code: null, signal: null };
    this.child.kill(signal);
    const st = await Promise.race([this.exited!, sleep(timeoutMs).then(() => undefined)]);
    if (st) return st;
    this.child.kill('SIGKILL');
    return this.exited!;
  }

  logTail(lines = 30): string {
    try {
      return fs.readFileSync(this.o.log, 'utf8').trimEnd().split('\n').slice(-lines).join('\n');
    } catch {
      return '(no log)';
    }
  }
}
