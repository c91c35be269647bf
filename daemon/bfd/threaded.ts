// BfdThread: the BFD endpoint tetherd uses. Sockets, sessions and timers live on a worker thread with its
// own event loop (worker-main.ts), so a busy main thread neither delays our packets (the peer would
// declare us down) nor makes our detection timers fire late or miss packets (we would declare the peer
// down). The main thread keeps a mirror of each session's state, updated by the thread's messages.
//
// The worker runs bundled JavaScript: in the single executable it is the SEA asset `bfd-worker.js`
// (install/build.sh); from source it is bundled on first use with esbuild (a development dependency).
import { EventEmitter } from 'node:events';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { Worker } from 'node:worker_threads';
import { ErrorCode, TetherError } from '../../lib/errors';
import { log } from '../../lib/log';
import { BfdDiag, BfdState } from './packet';
import { emptyRejects, type BfdSessionOptions, type BfdStateChange } from './session';
import type { BfdThreadStats, BfdWorkerData, FromWorker, ToWorker } from './worker-protocol';

export interface BfdThreadOptions {
  address: string;
  port?: number;
  peerPort?: number;
}

let workerSource: string | undefined;

function seaAsset(name: string): string | undefined {
  try {
    // eslint-disable-next-line @typescript-eslint/no-var-requires
    const sea = require('node:sea');
    return sea.isSea() ? (sea.getAsset(name, 'utf8') as string) : undefined;
  } catch {
    return undefined;
  }
}

/** The worker's JavaScript: the SEA asset, the bundle beside dist/tether.js, or bundled from source now. */
function source(): string {
  if (workerSource) return workerSource;
  const fromSea = seaAsset('bfd-worker.js');
  if (fromSea) return (workerSource = fromSea);
  const entry = path.join(__dirname, 'worker-main.ts');
  if (!fs.existsSync(entry)) return (workerSource = fs.readFileSync(path.join(__dirname, 'bfd-worker.js'), 'utf8'));
  // Hidden from the bundler: only reached when running from source.
  const esbuild = module.require('esbuild') as typeof import('esbuild');
  const out = esbuild.buildSync({ entryPoints: [entry], bundle: true, platform: 'node', target: 'node20', format: 'cjs', write: false, logLevel: 'error' });
  return (workerSource = out.outputFiles[0].text);
}

/** The main thread's view of one session. Emits 'state', 'up', 'down' (BfdStateChange) and 'close'. */
export class BfdPeer extends EventEmitter {
  private st = BfdState.Down;
  private lastDiag = BfdDiag.None;
  /** True from the first 'ready' of the session until close. */
  closed = false;

  constructor(
    readonly peer: string,
    private readonly thread: BfdThread,
  ) {
    super();
  }

  get state(): BfdState {
    return this.st;
  }

  get diag(): BfdDiag {
    return this.lastDiag;
  }

  setTimers(opts: Omit<BfdSessionOptions, 'auth'>): void {
    this.thread.send({ op: 'setTimers', peer: this.peer, opts });
  }

  /** Tells the peer AdminDown and ends the session. */
  close(): void {
    if (this.closed) return;
    this.thread.send({ op: 'closeSession', peer: this.peer });
  }

  /** @internal */
  apply(change: BfdStateChange): void {
    this.st = change.to;
    this.lastDiag = change.diag;
    this.emit('state', change);
    if (change.to === BfdState.Up) this.emit('up', change);
    if (change.from === BfdState.Up) this.emit('down', change);
  }

  /** @internal */
  ended(): void {
    if (this.closed) return;
    this.closed = true;
    this.emit('close');
  }
}

export class BfdThread {
  private readonly peers = new Map<string, BfdPeer>();
  private last: BfdThreadStats = { rx: 0, rejected: emptyRejects(), sessions: [], loopLagMaxMs: 0, loopLagPerSecondMs: [] };
  private closing?: Promise<void>;
  private exited = false;
  private started?: { resolve: (port: number) => void; reject: (e: Error) => void };
  /** The receive port the thread bound. */
  port = 0;

  /** Listens to the worker from its first message on: nothing it says between 'ready' and open()'s return is lost. */
  private constructor(private readonly worker: Worker) {
    worker.on('message', (m: FromWorker) => this.onMessage(m));
    worker.on('error', (e) => {
      if (this.started) this.started.reject(e);
      else log().error('bfd thread failed', { error: e.message });
    });
    worker.on('exit', (code) => this.onExit(code));
  }

  /** Starts the thread and binds the receive socket; fails like BfdEndpoint.open when it cannot bind. */
  static async open(opts: BfdThreadOptions): Promise<BfdThread> {
    const data: BfdWorkerData = { address: opts.address, port: opts.port, peerPort: opts.peerPort, logLevel: log().level };
    // execArgv []: the worker must not inherit loaders (tsx) or flags meant for the main thread.
    const t = new BfdThread(new Worker(source(), { eval: true, execArgv: [], workerData: data, name: 'tether-bfd' }));
    t.port = await new Promise<number>((resolve, reject) => (t.started = { resolve, reject }));
    t.started = undefined;
    return t;
  }

  /** Starts a session with `peer` (one per peer); its state is Down until the thread reports otherwise. */
  session(peer: string, opts: BfdSessionOptions = {}): BfdPeer {
    if (this.closing || this.exited) throw new TetherError(ErrorCode.InvalidEnvironment, 'bfd thread is closed');
    if (this.peers.has(peer)) throw new TetherError(ErrorCode.InvalidConfig, `bfd peer: a session with ${peer} already exists`);
    const p = new BfdPeer(peer, this);
    this.peers.set(peer, p);
    this.send({ op: 'session', peer, opts });
    return p;
  }

  /** Counters as of the thread's last report (every 500 ms, and at close). */
  stats(): BfdThreadStats {
    return this.last;
  }

  /** Closes every session (each tells its peer AdminDown), the sockets, then the thread. */
  close(): Promise<void> {
    if (this.closing) return this.closing;
    this.closing = this.exited
      ? Promise.resolve()
      : new Promise<void>((resolve) => {
          const done = setTimeout(() => void this.worker.terminate(), 2000);
          this.worker.once('exit', () => {
            clearTimeout(done);
            resolve();
          });
          this.send({ op: 'close' });
        });
    return this.closing;
  }

  /** @internal */
  send(m: ToWorker): void {
    if (!this.exited) this.worker.postMessage(m);
  }

  private onMessage(m: FromWorker): void {
    switch (m.kind) {
      case 'log':
        return forward(m);
      case 'ready':
        return this.started?.resolve(m.port);
      case 'openFailed':
        this.closing = this.worker.terminate().then(() => undefined);
        return this.started?.reject(new TetherError(m.code === ErrorCode.InvalidConfig ? ErrorCode.InvalidConfig : ErrorCode.IoFailure, m.message));
      case 'state':
        return this.peers.get(m.peer)?.apply(m.change);
      case 'sessionFailed':
        log().error('bfd: session could not start', { peer: m.peer, error: m.message });
        this.peers.get(m.peer)?.ended();
        this.peers.delete(m.peer);
        return;
      case 'sessionClosed': {
        const p = this.peers.get(m.peer);
        this.peers.delete(m.peer);
        p?.ended();
        return;
      }
      case 'stats':
        this.last = m.stats;
        return;
      default:
        return;
    }
  }

  private onExit(code: number): void {
    this.exited = true;
    this.started?.reject(new TetherError(ErrorCode.IoFailure, `bfd thread exited during start (code ${code})`));
    if (!this.closing) log().error('bfd thread exited', { code });
    for (const p of this.peers.values()) p.ended();
    this.peers.clear();
  }
}

function forward(m: Extract<FromWorker, { kind: 'log' }>): void {
  log().log(m.level, m.message, { ...m.meta, thread: 'bfd' });
}
