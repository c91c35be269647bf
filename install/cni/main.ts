// tether-install: the DaemonSet's installer.
//   install    executables into --bin-dir, tether chained into the primary in --net-dir; waits for a primary
//   watch      the same, then keeps it so (the primary's agent rewrote its file, an executable was deleted)
//   uninstall  takes out only what install added (run by install/uninstall, never on an upgrade)
//   ready      exit 0 when the configuration the runtime uses chains tether and the executables exist
//   sleep      waits for SIGTERM (the uninstall DaemonSet's main container)
import * as fs from 'node:fs';
import { parseArgs } from 'node:util';
import type { Logger } from 'winston';
import { makeLogger } from '../../daemon/log';
import { Installer, readiness, type InstallerOptions, type Outcome } from './installer';

const USAGE = `usage: tether-install install|watch|uninstall|ready|sleep [options]
  --net-dir DIR       the runtime's CNI configuration directory (default /host/etc/cni/net.d)
  --bin-dir DIR       the runtime's CNI executable directory (default /host/opt/cni/bin)
  --src-bin-dir DIR   where the executables to install are (default /usr/local/bin)
  --state-dir DIR     what the installer changed, for uninstall (default /host/var/lib/tether/cni-install)
  --entry-file FILE   the JSON of tether's entry in the conflist (default {"type":"tether","socketPath":"/run/tether/tetherd.sock"})
  --check-interval MS periodic check besides the file watches (default 5000)\n`;

/** More than this many writes within WINDOW_MS means something fights us over the file: back off. */
const MAX_WRITES = 5;
const WINDOW_MS = 10_000;
const BACKOFF_MS = 30_000;
const DEBOUNCE_MS = 100;

export interface Watching {
  stop(): Promise<void>;
  /** Resolves when tether is first installed (the primary appeared). */
  installed: Promise<Outcome>;
}

/**
 * Watches both directories (armed before the first check, so nothing between check and watch is missed),
 * reconciles after every change, and every `intervalMs` as a safety net (a watch on a directory that was
 * replaced sees nothing: it is re-armed then). When writes come faster than MAX_WRITES per WINDOW_MS (an
 * agent that removes our entry as fast as we insert it), it logs that and slows down.
 */
export function watch(opts: InstallerOptions, intervalMs = 5000): Watching {
  const inst = new Installer(opts);
  const log = opts.log;
  const watchers = new Map<string, fs.FSWatcher>();
  let timer: NodeJS.Timeout | undefined;
  let stopped = false;
  let writes: number[] = [];
  let backoffUntil = 0;
  let waitingLogged = false;
  let resolveInstalled!: (o: Outcome) => void;
  const installed = new Promise<Outcome>((r) => (resolveInstalled = r));

  const arm = () => {
    for (const dir of [opts.netDir, opts.binDir]) {
      if (watchers.has(dir)) continue;
      try {
        fs.mkdirSync(dir, { recursive: true });
        const w = fs.watch(dir, { persistent: true }, () => schedule(DEBOUNCE_MS));
        w.on('error', () => {
          w.close();
          watchers.delete(dir);
          schedule(DEBOUNCE_MS);
        });
        watchers.set(dir, w);
      } catch (e) {
        log.warn('cannot watch directory; relying on the periodic check', { dir, error: (e as Error).message });
      }
    }
  };

  const check = () => {
    timer = undefined;
    if (stopped) return;
    const now = Date.now();
    if (now < backoffUntil) return schedule(backoffUntil - now);
    arm();
    try {
      const out = inst.reconcile();
      if (out.state === 'waiting') {
        if (!waitingLogged) log.info('waiting for a primary CNI configuration', { netDir: opts.netDir, skipped: out.skipped });
        waitingLogged = true;
      } else {
        waitingLogged = false;
        resolveInstalled(out);
        if (out.wrote) {
          writes = [...writes.filter((t) => now - t < WINDOW_MS), now];
          if (writes.length > MAX_WRITES) {
            backoffUntil = now + BACKOFF_MS;
            writes = [];
            log.warn('the CNI configuration keeps losing tether; checking less often', { file: out.target, writes: MAX_WRITES + 1, windowMs: WINDOW_MS, backoffMs: BACKOFF_MS });
          }
        }
      }
    } catch (e) {
      log.error('install check failed', { error: (e as Error).message });
    }
    schedule(intervalMs);
  };

  function schedule(ms: number) {
    if (stopped) return;
    if (timer) {
      if (ms >= intervalMs) return; // an earlier check is due anyway
      clearTimeout(timer);
    }
    timer = setTimeout(check, ms);
  }

  arm();
  check();
  return {
    installed,
    async stop() {
      stopped = true;
      if (timer) clearTimeout(timer);
      for (const w of watchers.values()) w.close();
      watchers.clear();
    },
  };
}

function parse(argv: string[]) {
  return parseArgs({
    args: argv,
    allowPositionals: true,
    options: {
      'net-dir': { type: 'string', default: '/host/etc/cni/net.d' },
      'bin-dir': { type: 'string', default: '/host/opt/cni/bin' },
      'src-bin-dir': { type: 'string', default: '/usr/local/bin' },
      'state-dir': { type: 'string', default: '/host/var/lib/tether/cni-install' },
      'entry-file': { type: 'string' },
      'check-interval': { type: 'string', default: '5000' },
      help: { type: 'boolean', short: 'h' },
    },
  });
}

function entryFrom(file: string | undefined): Record<string, unknown> | undefined {
  if (!file) return undefined;
  const json = JSON.parse(fs.readFileSync(file, 'utf8')) as unknown;
  if (typeof json !== 'object' || json === null || Array.isArray(json)) throw new Error(`${file}: the entry must be a JSON object`);
  if ((json as Record<string, unknown>).type !== 'tether') throw new Error(`${file}: the entry's type must be "tether"`);
  return json as Record<string, unknown>;
}

function untilSignal(): Promise<void> {
  return new Promise((resolve) => {
    const done = () => resolve();
    process.once('SIGTERM', done);
    process.once('SIGINT', done);
  });
}

export async function main(argv: string[], logger?: Logger): Promise<number> {
  let parsed;
  try {
    parsed = parse(argv);
  } catch (e) {
    process.stderr.write(`tether-install: ${(e as Error).message}\n${USAGE}`);
    return 2;
  }
  const { values: v, positionals } = parsed;
  const cmd = positionals[0];
  if (v.help) {
    process.stdout.write(USAGE);
    return 0;
  }
  const log = logger ?? makeLogger();
  let opts: InstallerOptions;
  try {
    opts = {
      netDir: v['net-dir'] as string,
      binDir: v['bin-dir'] as string,
      srcBinDir: v['src-bin-dir'] as string,
      stateDir: v['state-dir'] as string,
      entry: entryFrom(v['entry-file'] as string | undefined),
      log,
    };
  } catch (e) {
    process.stderr.write(`tether-install: ${(e as Error).message}\n`);
    return 2;
  }
  const interval = Number(v['check-interval']);
  try {
    switch (cmd) {
      case 'install': {
        const w = watch(opts, interval);
        const stop = untilSignal().then(() => undefined);
        const out = await Promise.race([w.installed, stop]);
        await w.stop();
        return out ? 0 : 1;
      }
      case 'watch': {
        const w = watch(opts, interval);
        await untilSignal();
        await w.stop();
        return 0; // a stop (upgrade, node drain) never uninstalls
      }
      case 'uninstall':
        new Installer({ ...opts, srcBinDir: undefined }).uninstall();
        return 0;
      case 'ready': {
        const r = readiness(opts.netDir, opts.binDir);
        (r.ready ? process.stdout : process.stderr).write(`${r.ready ? 'ready' : 'not ready'}: ${r.why}\n`);
        return r.ready ? 0 : 1;
      }
      case 'sleep':
        await untilSignal();
        return 0;
      default:
        process.stderr.write(USAGE);
        return 2;
    }
  } catch (e) {
    log.error('tether-install failed', { command: cmd, error: (e as Error).message });
    return 1;
  }
}
