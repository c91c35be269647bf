// tether-install: the DaemonSet's installer.
//   install    executables into --bin-dir, tether chained into the primary in --net-dir; waits for a primary
//   watch      the same, then keeps it so (the primary's agent rewrote its file, an executable was deleted)
//   uninstall  writes the uninstall tombstone, then takes tether out of the CNI configuration (run by
//              install/uninstall, never on an upgrade); the executables stay for pods created with tether
//   clean-node once tetherd is gone: takes what it left off the node (clean-node.ts), then the executables
//   hold       keeps the tombstone live until SIGTERM, then removes it (the uninstall DaemonSet's main container)
//   ready      exit 0 when the configuration the runtime uses chains tether and the executables exist
//   sleep      waits for SIGTERM
// While a live tombstone is there (tombstone.ts), install and watch leave everything alone.
import * as fs from 'node:fs';
import { parseArgs } from 'node:util';
import type { Logger } from 'winston';
import { makeLogger } from '../../lib/log';
import { Installer, readConfDir, readiness, type InstallerOptions, type Outcome } from './installer';
import { holdsTether } from './conflist';
import { RUNTIMES, type Runtime } from './libcni';
import { cleanNode, tetherdAnswers } from './clean-node';
import { holdTombstone, tombstoneState, uninstallInProgress, writeTombstone } from './tombstone';

const USAGE = `usage: tether-install install|watch|uninstall|clean-node|hold|ready|sleep [options]
  --net-dir DIR       the runtime's CNI configuration directory (default /host/etc/cni/net.d)
  --bin-dir DIR       the runtime's CNI executable directory (default /host/opt/cni/bin)
  --src-bin-dir DIR   where the executables to install are (default /usr/local/bin)
  --state-dir DIR     what the installer changed, for uninstall (default /host/var/lib/tether/cni-install)
  --entry-file FILE   the JSON of tether's entry in the conflist (default {"type":"tether","socketPath":"/run/tether/tetherd.sock"})
  --check-interval MS periodic check besides the file watches (default 5000)
  --runtime containerd|crio  whose rules pick the configuration and decide readiness (default containerd):
                      containerd (go-cni) loads the files in name order and fails the whole directory at the
                      first one libcni cannot load, so the node has no network until it is fixed; crio (ocicni)
                      skips such files and uses the first that loads
clean-node:
  --tetherd-state-dir DIR  tetherd's --state-dir as mounted here (default /host/var/lib/tether)
  --socket PATH       tetherd's socket (default /host/run/tether/tetherd.sock)
  --run-dir DIR       tetherd's runtime directory, emptied (default /host/run/tether)
  --pin-dir DIR       tetherd's --bpf-pin-dir, removed (default /sys/fs/bpf/tether)
  --wait              first wait until tetherd has not answered for --gone-for MS (default 15000),
                      keeping the tombstone live meanwhile
  --force             clean even though tetherd answers\n`;

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
  let tombstoneLogged = false;
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
      if (keepOut(opts, log, tombstoneLogged)) {
        tombstoneLogged = true;
        return schedule(intervalMs);
      }
      if (tombstoneLogged) log.info('uninstall tombstone gone: installing again', { stateDir: opts.stateDir });
      tombstoneLogged = false;
      // Copying the executables can take a while (100 MB compared): look at the tombstone again right
      // before the configuration is written, so an uninstall that started meanwhile is not undone.
      if (opts.srcBinDir) inst.installExecutables();
      if (keepOut(opts, log, false)) {
        tombstoneLogged = true;
        return schedule(intervalMs);
      }
      const out = inst.reconcileConfig();
      if (out.state === 'waiting') {
        // A refusal or a directory the runtime cannot load needs someone to act: say so loudly, once.
        const level = out.refused || /loads no network/.test(out.why) ? 'error' : 'info';
        if (!waitingLogged) log.log(level, 'waiting for a primary CNI configuration', { netDir: opts.netDir, why: out.why, skipped: out.skipped });
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

/**
 * True while a live uninstall tombstone says to keep out (logged the first time only, as `logged` says).
 * A stale one is removed and does not block: an upgrade never waits on an uninstall pod that is gone.
 */
function keepOut(opts: InstallerOptions, log: Logger, logged: boolean): boolean {
  const t = uninstallInProgress(opts.stateDir, log);
  if (t.block && !logged) log.info('uninstall in progress on this node (live tombstone): leaving the CNI configuration alone', { file: t.state === 'live' ? t.file : undefined });
  return t.block;
}

/** Waits until tetherd has not answered for goneForMs in a row, keeping the tombstone live; false when signalled. */
async function waitTetherdGone(socket: string, goneForMs: number, stop: Promise<void>, log: Logger): Promise<boolean> {
  let stopped = false;
  void stop.then(() => (stopped = true));
  let since: number | undefined;
  let logged = false;
  while (!stopped) {
    if (await tetherdAnswers(socket)) {
      since = undefined;
      if (!logged) log.info('clean-node: waiting until tetherd is gone (delete the tetherd DaemonSet)', { socket });
      logged = true;
    } else {
      since ??= Date.now();
      if (Date.now() - since >= goneForMs) return true;
    }
    await Promise.race([new Promise((r) => setTimeout(r, 500)), stop]);
  }
  return false;
}

/** How long a watch check that began before the tombstone may still write (it looks just before writing). */
const SETTLE_MS = 1000;

/**
 * Takes tether out of the configuration and makes sure it stays out: a watch check already past its look
 * at the tombstone can still write once, so look again after SETTLE_MS and take it out again if so.
 */
async function takeTetherOut(inst: Installer, opts: InstallerOptions, log: Logger): Promise<void> {
  await new Promise((r) => setTimeout(r, SETTLE_MS));
  for (let pass = 1; ; pass++) {
    inst.uninstallConfig();
    await new Promise((r) => setTimeout(r, SETTLE_MS));
    const back = readConfDir(opts.netDir).filter((f) => holdsTether(f.bytes)).map((f) => f.name);
    if (back.length === 0) return;
    if (pass === 5) throw new Error(`tether keeps coming back into ${back.join(', ')}: something other than tether-install watch writes it`);
    log.warn('uninstall: tether was put back by a check that started before the tombstone; taking it out again', { files: back });
  }
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
      runtime: { type: 'string', default: 'containerd' },
      'tetherd-state-dir': { type: 'string', default: '/host/var/lib/tether' },
      socket: { type: 'string', default: '/host/run/tether/tetherd.sock' },
      'run-dir': { type: 'string', default: '/host/run/tether' },
      'pin-dir': { type: 'string', default: '/sys/fs/bpf/tether' },
      'gone-for': { type: 'string', default: '15000' },
      wait: { type: 'boolean', default: false },
      force: { type: 'boolean', default: false },
      help: { type: 'boolean', short: 'h' },
    },
  });
}

const COMMANDS = ['install', 'watch', 'uninstall', 'clean-node', 'hold', 'ready', 'sleep'];

/**
 * The command line checked as main() checks it before doing anything (options, command, runtime), without
 * running it: throws naming what is wrong. The docs test checks every tether-install example with it.
 */
export function checkCommandLine(argv: string[]): void {
  const { values: v, positionals } = parse(argv);
  if (v.help) return;
  if (!COMMANDS.includes(positionals[0])) throw new Error(`${JSON.stringify(positionals[0] ?? '')} is not a command (${COMMANDS.join(', ')})`);
  runtimeFrom(v.runtime as string);
}

function entryFrom(file: string | undefined): Record<string, unknown> | undefined {
  if (!file) return undefined;
  const json = JSON.parse(fs.readFileSync(file, 'utf8')) as unknown;
  if (typeof json !== 'object' || json === null || Array.isArray(json)) throw new Error(`${file}: the entry must be a JSON object`);
  if ((json as Record<string, unknown>).type !== 'tether') throw new Error(`${file}: the entry's type must be "tether"`);
  return json as Record<string, unknown>;
}

function runtimeFrom(s: string): Runtime {
  if (!(RUNTIMES as readonly string[]).includes(s)) throw new Error(`--runtime ${s}: must be one of ${RUNTIMES.join(', ')}`);
  return s as Runtime;
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
      runtime: runtimeFrom(v.runtime as string),
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
        // The handlers first: the first check runs (and logs, synchronously on a pipe) inside watch(),
        // and a SIGTERM that follows its log line must stop the installer, not kill it.
        const stop = untilSignal().then(() => undefined);
        const w = watch(opts, interval);
        const out = await Promise.race([w.installed, stop]);
        await w.stop();
        return out ? 0 : 1;
      }
      case 'watch': {
        const signalled = untilSignal();
        const w = watch(opts, interval);
        await signalled;
        await w.stop();
        return 0; // a stop (upgrade, node drain) never uninstalls
      }
      case 'uninstall':
        // The tombstone first: from here on no watch on this node puts tether back.
        writeTombstone(opts.stateDir, log);
        await takeTetherOut(new Installer({ ...opts, srcBinDir: undefined }), opts, log);
        return 0;
      case 'clean-node': {
        const stop = untilSignal();
        let hold: ReturnType<typeof holdTombstone> | undefined;
        if (v.wait) {
          hold = holdTombstone(opts.stateDir, log);
          const gone = await waitTetherdGone(v.socket as string, Number(v['gone-for']), stop, log);
          if (!gone) {
            // The uninstall pod is being deleted before it cleaned: an aborted uninstall, tether may come back.
            hold.stop(true);
            return 1;
          }
        }
        try {
          const r = await cleanNode({
            tetherdStateDir: v['tetherd-state-dir'] as string, socket: v.socket as string, runDir: v['run-dir'] as string,
            pinDir: v['pin-dir'] as string, binDir: opts.binDir, netDir: opts.netDir, installerStateDir: opts.stateDir, log, force: v.force as boolean,
          });
          process.stdout.write(JSON.stringify(r) + '\n');
        } finally {
          hold?.stop(false);
        }
        return 0;
      }
      case 'hold': {
        const hold = holdTombstone(opts.stateDir, log);
        await untilSignal();
        hold.stop(true);
        return 0;
      }
      case 'ready': {
        const t = tombstoneState(opts.stateDir);
        if (t.state === 'live') {
          process.stderr.write(`not ready: tether is being uninstalled from this node (${t.file})\n`);
          return 1;
        }
        const r = readiness(opts.netDir, opts.binDir, opts.runtime);
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
