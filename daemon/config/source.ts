// Config sources: where tetherd's objects come from. Each source hands the subsystems the complete
// desired configuration (level-triggered: every update is the whole state, never a diff to replay), first
// from start() and then on every accepted change ('update'). An invalid change is rejected as a whole with
// every reason ('rejected', and the log); what was running keeps running.
// Two implementations: FileSource here (standalone, the demo and the testbed) and the Kubernetes source.
import { EventEmitter } from 'node:events';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { parseAllDocuments } from 'yaml';
import { isObject } from '../../lib/fields';
import { ErrorCode, TetherError } from '../../lib/errors';
import type { Logger } from '../../lib/log';
import { emptyConfig, parseConfig, type ConfigObjects } from './objects';
import { ReconcileLoop } from '../util/reconcile-loop';

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

/** How a config says "no objects" on purpose (Kubernetes' own empty list); quoted in messages. */
export const EMPTY_ON_PURPOSE = '`apiVersion: v1` / `kind: List` / `items: []`';

/**
 * One YAML/JSON file, watched. The directory is watched, not the file: editors and `kubectl create
 * configmap`-style updates replace the file by rename, which a watch on the old inode would miss. A
 * change whose text is the same as the configuration in force is ignored.
 *
 * What a save leaves on the way is never taken for the operator's intent: a file with no objects (zero
 * bytes, whitespace, comments, empty documents: what a truncated write or an editor's half-done save
 * leaves) is refused, at start and live, unless it says "no objects" on purpose with an empty List; so is
 * a file whose last line has no newline (cut mid-line); a file that is gone (renamed away mid-save,
 * deleted) changes nothing until it is back.
 */
export class FileSource extends EventEmitter implements ConfigSource {
  readonly name: string;
  private current?: ConfigObjects;
  /** The text of the configuration in force. */
  private text?: string;
  /** The last text refused, so a refusal is logged once, not on every periodic check. */
  private refused?: string;
  /** Why the file could not be read last time (ENOENT: gone), so that is logged once too. */
  private unreadable?: string;
  private watcher?: fs.FSWatcher;
  private timer?: NodeJS.Timeout;
  /** Every read of the file: after the watch's settle time, and every RECHECK_MS. */
  private readonly recheck = new ReconcileLoop({
    run: () => this.check(),
    everyMs: RECHECK_MS,
    onError: (e) => this.logger.error('config: check failed', { source: this.name, error: e.message }),
  });
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
    let text: string;
    try {
      text = fs.readFileSync(this.file, 'utf8');
    } catch (e) {
      const code = (e as NodeJS.ErrnoException).code;
      throw new TetherError(ErrorCode.InvalidConfig, `config ${this.file}: ${code === 'ENOENT' ? 'no such file' : (code ?? (e as Error).message)}`, { cause: e });
    }
    const config = parseConfig(text, this.file);
    const why = notAnIntent(text, config, this.file);
    if (why) throw new TetherError(ErrorCode.InvalidConfig, `${why.problem}; refused. ${why.remedy}`);
    this.text = text;
    this.current = config;
    this.recheck.start();
    return this.current;
  }

  async stop(): Promise<void> {
    this.stopped = true;
    this.watcher?.close();
    clearTimeout(this.timer);
    await this.recheck.stop();
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
    this.timer = setTimeout(() => this.recheck.request(), SETTLE_MS);
  }

  /**
   * The file's text, or undefined when it cannot be read. A file that is gone (an editor renamed it away
   * and has not written the new one yet, or it was deleted) means "unchanged", never "no objects": the
   * configuration in force stays until the file is back. Logged once per cause, not on every check.
   */
  private read(): string | undefined {
    let text: string;
    try {
      text = fs.readFileSync(this.file, 'utf8');
    } catch (e) {
      const code = (e as NodeJS.ErrnoException).code ?? (e as Error).message;
      if (this.unreadable !== code) {
        this.unreadable = code;
        if (code === 'ENOENT') {
          this.logger.warn(
            `config: ${this.file} is gone; the running configuration stays until the file is back (deleting it removes nothing: to remove every object, write ${EMPTY_ON_PURPOSE})`,
            { source: this.name, file: this.file },
          );
        } else {
          this.logger.warn('config: cannot read; the running configuration stays', { source: this.name, error: code });
        }
      }
      return undefined;
    }
    if (this.unreadable !== undefined) {
      this.logger.info('config: the file can be read again', { source: this.name, file: this.file, was: this.unreadable });
      this.unreadable = undefined;
    }
    return text;
  }

  private writtenWithin(ms: number): boolean {
    try {
      const age = Date.now() - fs.statSync(this.file).mtimeMs;
      return age >= 0 && age < ms; // a clock set back (a future mtime) must not hold changes off for good
    } catch {
      return false; // read() says why
    }
  }

  /** Reads the file; a changed, valid text becomes the configuration in force, an invalid one is refused whole. */
  private check(): void {
    // Nobody listens yet (tetherd still starting): the periodic check comes back to it.
    if (this.stopped || !this.current || this.listenerCount('update') === 0) return;
    // Written less than the settle time ago (the periodic check does not wait for the watch's settle): a
    // write may still be going on, so come back once the file has been still that long.
    if (this.writtenWithin(SETTLE_MS)) return this.soon();
    const text = this.read();
    if (text === undefined || text === this.text) {
      // Back to the text in force (an edit undone, a save finished as it began): nothing to apply.
      if (text !== undefined) this.refused = undefined;
      return;
    }
    if (text === this.refused) return;
    let next: ConfigObjects;
    try {
      next = parseConfig(text, this.file, this.current);
    } catch (e) {
      this.refused = text;
      const problems = (e as Error).message.split('\n');
      this.logger.error('config: change rejected; the running configuration stays', { source: this.name, problems });
      this.emit('rejected', problems);
      return;
    }
    const why = notAnIntent(text, next, this.file);
    if (why) {
      this.refused = text;
      const problem = `${why.problem}; refused, the running configuration stays. ${why.remedy}`;
      this.logger.warn(`config: ${problem}`, { source: this.name, file: this.file });
      this.emit('rejected', [problem]);
      return;
    }
    this.text = text;
    this.refused = undefined;
    this.current = next;
    this.logger.info('config: change accepted', {
      source: this.name, pools: next.pools.length, nodes: Object.keys(next.nodes).length, objects: next.others.length, pods: Object.keys(next.pods ?? {}).length,
    });
    this.emit('update', next);
  }
}

function hasNoObjects(c: ConfigObjects): boolean {
  return c.pools.length === 0 && Object.keys(c.nodes).length === 0 && Object.keys(c.pods ?? {}).length === 0 && c.others.length === 0;
}

/**
 * Why a text that parsed and validated is still not taken for what the operator meant, or undefined. A
 * write cut short or caught half-way leaves either no objects or, far more often, a last line cut in the
 * middle, which still parses in about one cut in eight (a Node's name cut to "no", an Egress without its
 * trailing fields): YAML must end with a newline, as editors, kubectl and yq write it. A file of one JSON
 * value may omit it (JSON cut short never parses).
 */
function notAnIntent(text: string, config: ConfigObjects, file: string): { problem: string; remedy: string } | undefined {
  if (hasNoObjects(config) && !emptyOnPurpose(text)) {
    return {
      problem: `${file} holds no objects (it is empty, or only whitespace, comments or empty documents: what a truncated write or a half-done save leaves)`,
      remedy: `To have no objects on purpose, write ${EMPTY_ON_PURPOSE}`,
    };
  }
  if (!text.endsWith('\n') && !isOneJsonValue(text)) {
    return {
      problem: `${file} looks cut short: its last line does not end with a newline (a truncated write, or a write still going on)`,
      remedy: 'End the file with a newline, and replace it whole (write a temp file, then rename it over the old one)',
    };
  }
  return undefined;
}

function isOneJsonValue(text: string): boolean {
  const t = text.trim();
  if (!t.startsWith('{') && !t.startsWith('[')) return false;
  try {
    JSON.parse(t);
    return true;
  } catch {
    return false;
  }
}

/**
 * Whether `text` says "no objects" on purpose: one of its documents is a List with `items: []`. Truncation
 * cannot make one: a cut inside a flow list loses its `]` (a parse error), and a block list cut after
 * `items:` leaves null, which is refused.
 */
function emptyOnPurpose(text: string): boolean {
  return parseAllDocuments(text).some((doc) => {
    if (doc.errors.length) return false;
    const v: unknown = doc.toJS();
    return isObject(v) && v.kind === 'List' && Array.isArray(v.items) && v.items.length === 0;
  });
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

/** A subsystem that converges to each complete configuration, or desired state, it is given (level-triggered). */
export interface Reconciler<D = ConfigObjects> {
  readonly name: string;
  apply(desired: D): Promise<void> | void;
}

/**
 * Feeds every accepted configuration of `source` to the reconcilers, in order, one configuration at a time
 * (a newer one replaces one still waiting), through a resolve step: each configuration is resolved once
 * into the desired state every reconciler is handed; one that does not resolve is logged and changes
 * nothing. stop() detaches and waits for the one being applied, so no reconciler is handed a
 * configuration while it stops.
 */
export function feedResolved<D>(source: ConfigSource, resolve: (c: ConfigObjects) => D, reconcilers: Reconciler<D>[], logger: Logger, takeMissed?: () => ConfigObjects | undefined): { stop(): Promise<void> } {
  let stopped = false;
  let current: Promise<void> = Promise.resolve();
  const apply = serialApply(
    (config) => {
      current = (async () => {
        let c: D;
        try {
          c = resolve(config);
        } catch (e) {
          logger.error('config: resolving a change failed; nothing applied', { error: (e as Error).message, stack: (e as Error).stack });
          return;
        }
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
  // An update that came before this subscription (held by the caller since the source started) is applied
  // now; subscribing and taking it happen in one tick, so none falls between.
  const missed = takeMissed?.();
  if (missed) apply(missed);
  return {
    async stop() {
      stopped = true;
      source.off('update', onUpdate);
      await current;
    },
  };
}
