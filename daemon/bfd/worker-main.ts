// The BFD thread: owns the BFD sockets, sessions and timers on an event loop of its own, so tetherd's main
// thread being busy (a CNI ADD storm, a 100k-entry conntrack resync, a GC pause) delays neither its packets
// nor its detection timers. Bundled on its own (install/build.sh) and started by threaded.ts.
import { parentPort, workerData } from 'node:worker_threads';
import { setLogger, type Logger } from '../../lib/log';
import { LoopLag } from '../util/loop-lag';
import { BfdEndpoint } from './endpoint';
import type { BfdSession, BfdSessionOptions } from './session';
import type { BfdWorkerData, FromWorker, ToWorker } from './worker-protocol';

const STATS_EVERY_MS = 500;
const LEVELS: Record<string, number> = { error: 0, warn: 1, info: 2, http: 3, verbose: 4, debug: 5, silly: 6 };

function post(m: FromWorker): void {
  parentPort!.postMessage(m);
}

/** Lines go to the main thread's logger, which stamps them with the node like every other line. */
function forwardingLogger(level: string): Logger {
  const max = LEVELS[level] ?? LEVELS.info;
  const at = (lvl: string) => (message: string, meta: Record<string, unknown> = {}) => {
    if ((LEVELS[lvl] ?? 0) <= max) post({ kind: 'log', level: lvl, message, meta });
  };
  return { error: at('error'), warn: at('warn'), info: at('info'), debug: at('debug'), verbose: at('verbose') } as unknown as Logger;
}

/** Structured clone turns Buffers into Uint8Arrays: make the key a Buffer again. */
function revive(opts: BfdSessionOptions): BfdSessionOptions {
  return opts.auth ? { ...opts, auth: { ...opts.auth, key: Buffer.from(opts.auth.key) } } : opts;
}

async function run(): Promise<void> {
  const data = workerData as BfdWorkerData;
  setLogger(forwardingLogger(data.logLevel));
  const lag = new LoopLag();
  lag.start();
  let endpoint: BfdEndpoint;
  try {
    endpoint = await BfdEndpoint.open({ address: data.address, port: data.port, peerPort: data.peerPort });
  } catch (e) {
    post({ kind: 'openFailed', code: String((e as { code?: unknown }).code ?? ''), message: (e as Error).message });
    return;
  }
  const sessions = new Map<string, BfdSession>();
  const stats = () => ({ ...endpoint.stats(), loopLagMaxMs: lag.maxMs(), loopLagPerSecondMs: lag.series() });
  const timer = setInterval(() => post({ kind: 'stats', stats: stats() }), STATS_EVERY_MS);
  post({ kind: 'ready', port: endpoint.port });

  parentPort!.on('message', (m: ToWorker) => {
    switch (m.op) {
      case 'session': {
        let s: BfdSession;
        try {
          s = endpoint.session(m.peer, revive(m.opts));
        } catch (e) {
          post({ kind: 'sessionFailed', peer: m.peer, message: (e as Error).message });
          return;
        }
        sessions.set(m.peer, s);
        s.on('state', (change) => post({ kind: 'state', peer: m.peer, change }));
        s.once('close', () => {
          if (sessions.get(m.peer) === s) sessions.delete(m.peer);
          post({ kind: 'sessionClosed', peer: m.peer });
        });
        return;
      }
      case 'setTimers':
        sessions.get(m.peer)?.setTimers(m.opts);
        return;
      case 'closeSession':
        sessions.get(m.peer)?.close();
        return;
      case 'close':
        clearInterval(timer);
        lag.stop();
        void endpoint.close().then(() => {
          post({ kind: 'stats', stats: stats() });
          post({ kind: 'closed' });
          parentPort!.close();
        });
        return;
    }
  });
}

void run();
