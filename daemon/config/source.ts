// Config sources: where tetherd's objects come from. Each source hands the subsystems the complete
// desired configuration (level-triggered: every update is the whole state, never a diff to replay), first
// from start() and then on every accepted change ('update'). An invalid change is rejected as a whole with
// every reason ('rejected', and the log); what was running keeps running.
// Two implementations: FileSource here (standalone, the demo and the testbed) and the Kubernetes source.
import { EventEmitter } from 'node:events';
import * as fs from 'node:fs';
import * as path from 'node:path';
import type { Logger } from '../log';
import { emptyConfig, parseConfig, type ConfigObjects } from './objects';

export interface ConfigSource extends EventEmitter {
  readonly name: string;
  /** The first complete configuration; throws TetherError(InvalidConfig) naming every problem. */
  start(): Promise<ConfigObjects>;
  /** Stops watching; no 'update' after it resolves. */
  stop(): Promise<void>;
  on(event: 'update', fn: (c: ConfigObjects) => void): this;
  on(event: 'rejected', fn: (problems: string[]) => void): this;
}

/** No configuration at all (tetherd without --config): pod attach still works, with no pools. */
export class EmptySource extends EventEmitter implements ConfigSource {
  readonly name = 'none';
  async start(): Promise<ConfigObjects> {
    return emptyConfig();
  }
  async stop(): Promise<void> {}
}

/** How long edits settle before the file is read (an editor writes, renames, touches). */
const SETTLE_MS = 100;
/** A missed inotify event (a bind-mounted file replaced, an overflow) is caught by this periodic check. */
const RECHECK_MS = 2000;

/**
 * One YAML/JSON file, watched. The directory is watched, not the file: editors and `kubectl create
 * configmap`-style updates replace the file by rename, which a watch on the old inode would miss. A
 * change whose text is the same as the configuration in force is ignored.
 */
export class FileSource extends EventEmitter implements ConfigSource {
  readonly name: string;
  private current?: ConfigObjects;
  private text?: string;
  private watcher?: fs.FSWatcher;
  private timer?: NodeJS.Timeout;
  private recheck?: NodeJS.Timeout;
  private stopped = false;

  constructor(
    private readonly file: string,
    private readonly logger: Logger,
  ) {
    super();
    this.name = `file ${file}`;
  }

  async start(): Promise<ConfigObjects> {
    // Armed before the first read, so an edit between the two is not lost.
    this.watch();
    this.text = this.read();
    this.current = parseConfig(this.text ?? '', this.file);
    this.recheck = setInterval(() => this.check(), RECHECK_MS);
    this.recheck.unref();
    return this.current;
  }

  async stop(): Promise<void> {
    this.stopped = true;
    this.watcher?.close();
    clearTimeout(this.timer);
    clearInterval(this.recheck);
  }

  private watch(): void {
    try {
      const base = path.basename(this.file);
      this.watcher = fs.watch(path.dirname(this.file), (_event, name) => {
        if (name === null || name === base || String(name).startsWith('..')) this.soon();
      });
      this.watcher.on('error', (e) => this.logger.warn('config: watch failed; changes are picked up by the periodic check', { source: this.name, error: e.message }));
    } catch (e) {
      this.logger.warn('config: cannot watch; changes are picked up by the periodic check', { source: this.name, error: (e as Error).message });
    }
  }

  private soon(): void {
    if (this.stopped) return;
    clearTimeout(this.timer);
    this.timer = setTimeout(() => this.check(), SETTLE_MS);
  }

  private read(): string | undefined {
    try {
      return fs.readFileSync(this.file, 'utf8');
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code === 'ENOENT' && this.current === undefined) throw new Error(`config ${this.file}: no such file`);
      this.logger.warn('config: cannot read; the running configuration stays', { source: this.name, error: (e as NodeJS.ErrnoException).code ?? (e as Error).message });
      return undefined;
    }
  }

  /** Reads the file; a changed, valid text becomes the configuration in force, an invalid one is refused whole. */
  private check(): void {
    // Nobody listens yet (tetherd still starting): the periodic check comes back to it.
    if (this.stopped || !this.current || this.listenerCount('update') === 0) return;
    const text = this.read();
    if (text === undefined || text === this.text) return;
    this.text = text;
    let next: ConfigObjects;
    try {
      next = parseConfig(text, this.file, this.current);
    } catch (e) {
      const problems = (e as Error).message.split('\n');
      this.logger.error('config: change rejected; the running configuration stays', { source: this.name, problems });
      this.emit('rejected', problems);
      return;
    }
    this.current = next;
    this.logger.info('config: change accepted', {
      source: this.name, pools: next.pools.length, nodes: Object.keys(next.nodes).length, objects: next.others.length, pods: Object.keys(next.pods ?? {}).length,
    });
    this.emit('update', next);
  }
}

/** Hands every configuration to `apply`, one at a time in order; a newer one replaces one still waiting. */
export function serialApply(apply: (c: ConfigObjects) => Promise<void>, onError: (e: Error) => void): (c: ConfigObjects) => void {
  let running = false;
  let pending: ConfigObjects | undefined;
  const next = async (): Promise<void> => {
    running = true;
    while (pending) {
      const c = pending;
      pending = undefined;
      await apply(c).catch(onError);
    }
    running = false;
  };
  return (c) => {
    pending = c;
    if (!running) void next();
  };
}

/** A subsystem that converges to each complete configuration it is given (level-triggered). */
export interface Reconciler {
  readonly name: string;
  apply(config: ConfigObjects): Promise<void> | void;
}

/**
 * Feeds every accepted configuration of `source` to the reconcilers, in order, one configuration at a time
 * (a newer one replaces one still waiting). stop() detaches and waits for the one being applied, so no
 * reconciler is handed a configuration while it stops.
 */
export function feedReconcilers(source: ConfigSource, reconcilers: Reconciler[], logger: Logger): { stop(): Promise<void> } {
  let stopped = false;
  let current: Promise<void> = Promise.resolve();
  const apply = serialApply(
    (c) => {
      current = (async () => {
        for (const r of reconcilers) {
          if (stopped) return;
          try {
            await r.apply(c);
          } catch (e) {
            logger.error('config: applying a change failed', { reconciler: r.name, error: (e as Error).message, stack: (e as Error).stack });
          }
        }
      })();
      return current;
    },
    (err) => logger.error('config: applying a change failed', { error: err.message, stack: err.stack }),
  );
  const onUpdate = (c: ConfigObjects) => {
    if (!stopped) apply(c);
  };
  source.on('update', onUpdate);
  return {
    async stop() {
      stopped = true;
      source.off('update', onUpdate);
      await current;
    },
  };
}
