// One resource followed from the API server the way client-go's reflector does it, because client-node's
// ListWatch does not: list once, then watch from the list's resourceVersion with bookmarks, and after a
// watch ends (server timeout, dropped connection, a stall caught by the watchdog) watch again from the last
// event's or bookmark's resourceVersion — no relist. Only 410 Gone (that version compacted away) relists.
// client-node 1.4's ListWatch relists at once on every 410 (a 410 loop becomes a list loop with no delay),
// stops for good on any other error, sends no allowWatchBookmarks, and the resync that was wrapped around
// it relisted every resource every 5 minutes on every node: at 1,000 nodes that was the apiserver's load.
// Every retry here waits a jittered exponential backoff; a 410 loop is reported once (log and status) and
// the last listed objects keep being served meanwhile.
import * as k8s from '@kubernetes/client-node';
import type { Logger } from '../../lib/log';
import { Backoff } from '../../lib/backoff';

type Obj = Record<string, any>;

export interface ReflectorOptions {
  /** For logs and status: "services", "pods"… */
  name: string;
  kc: k8s.KubeConfig;
  /** The collection's path, e.g. /api/v1/services. */
  path: string;
  /** Lists the collection with the same selectors; `resourceVersion` "0" lets the API server answer from its cache. */
  list: (resourceVersion: string | undefined) => Promise<Obj>;
  labelSelector?: string;
  fieldSelector?: string;
  /** Called after every change to the objects (coalescing is the caller's). */
  changed: () => void;
  logger: Logger;
  /** A watch that ended with an error or 410 Gone (counted as a failed API request; nothing else changes). */
  watchFailed?: (err: unknown) => void;
  /** No event or bookmark for this long: the watch is taken for stalled and resumed (default 150 s). */
  idleMs?: number;
  /** Backoff between failed attempts (default 500 ms doubling to 30 s, jittered). */
  backoffMinMs?: number;
  backoffMaxMs?: number;
  random?: () => number;
}

export interface ReflectorStats {
  resource: string;
  objects: number;
  lists: number;
  watches: number;
  events: number;
  /** Watches answered 410 Gone. */
  gone: number;
  /** Failed lists or watches (restarts after an error). */
  restarts: number;
  resourceVersion: string;
  /** Set while the resource cannot be followed (a 410 loop, the API away): what is wrong and since when. */
  problem?: string;
}

interface WatchEnd {
  error?: unknown;
  gone: boolean;
  stalled: boolean;
  /** Events and bookmarks received. */
  received: number;
  /** How long it lasted. */
  ms: number;
}

export class Reflector {
  private readonly store = new Map<string, Obj>();
  private rv = '';
  private stopped = true;
  private loop?: Promise<void>;
  private abort?: () => void;
  private sleeping?: { timer: NodeJS.Timeout; wake: () => void };
  private readonly backoff: Backoff;
  /** 410s in a row with nothing delivered in between. */
  private goneStreak = 0;
  private problem?: { text: string; since: string };
  private readonly counts = { lists: 0, watches: 0, events: 0, gone: 0, restarts: 0 };
  /** Becomes true after the first complete list. */
  listed = false;

  constructor(private readonly o: ReflectorOptions) {
    this.backoff = new Backoff(o.backoffMinMs ?? 500, o.backoffMaxMs ?? 30_000, o.random);
  }

  get name(): string {
    return this.o.name;
  }

  start(): void {
    if (!this.stopped) return;
    this.stopped = false;
    this.loop = this.run();
  }

  async stop(): Promise<void> {
    this.stopped = true;
    this.abort?.();
    if (this.sleeping) {
      clearTimeout(this.sleeping.timer);
      this.sleeping.wake();
    }
    // A list in flight against an API server that is away may not answer for long: its result is
    // ignored once stopped, so stopping does not wait for it past a second.
    let timer: NodeJS.Timeout | undefined;
    await Promise.race([this.loop, new Promise((r) => (timer = setTimeout(r, 1000)))]);
    clearTimeout(timer);
  }

  objects(): Obj[] {
    return [...this.store.values()];
  }

  stats(): ReflectorStats {
    return { resource: this.o.name, objects: this.store.size, ...this.counts, resourceVersion: this.rv, ...(this.problem ? { problem: `${this.problem.text} (since ${this.problem.since})` } : {}) };
  }

  private async run(): Promise<void> {
    while (!this.stopped) {
      if (!this.rv) {
        if (!(await this.relist())) {
          await this.sleep(this.backoff.next());
          continue;
        }
      }
      const end = await this.watchOnce();
      if (this.stopped) return;
      if (end.gone) {
        this.counts.gone++;
        this.o.watchFailed?.({ statusCode: 410 });
        this.rv = '';
        this.goneStreak++;
        // One 410 is ordinary (the version was compacted while we were away): relist at once. Several in a
        // row, with nothing delivered in between, is a loop: back off and say so, once.
        if (this.goneStreak > 1) {
          const inMs = this.backoff.next();
          this.report(`watch answers 410 Gone in a loop (${this.goneStreak} in a row); relisting with backoff, serving the last listed ${this.store.size} objects`, { inMs });
          await this.sleep(inMs);
        }
        continue;
      }
      if (end.received > 0) {
        this.goneStreak = 0;
        this.recovered();
      }
      if (end.error !== undefined) {
        this.counts.restarts++;
        this.o.watchFailed?.(end.error);
        const inMs = this.backoff.next();
        this.report(`watch failed: ${describeError(end.error)}; resuming from resourceVersion ${this.rv}, serving the last ${this.store.size} objects`, { inMs });
        await this.sleep(inMs);
      } else if (end.stalled) {
        this.o.logger.warn('kube: watch silent past its deadline; resuming from its resourceVersion', { resource: this.o.name, resourceVersion: this.rv });
      } else if (end.received === 0 && end.ms < 1000) {
        // Ended by the server at once with nothing in it: a loop unless it is backed off.
        await this.sleep(this.backoff.next());
      } else this.backoff.reset();
    }
  }

  /** A full list replaces the objects; false when it failed (the objects held are kept). */
  private async relist(): Promise<boolean> {
    this.counts.lists++;
    let l: Obj;
    try {
      // The first list may come from the API server's cache; after a 410 it must be current.
      l = await this.o.list(this.listed ? undefined : '0');
    } catch (e) {
      if (this.stopped) return false;
      this.counts.restarts++;
      this.report(`list failed: ${describeError(e)}; serving the last ${this.store.size} objects`, {});
      return false;
    }
    if (this.stopped) return false;
    const before = this.store.size;
    this.store.clear();
    for (const item of (l.items ?? []) as Obj[]) this.store.set(keyOf(item), item);
    this.rv = String(l.metadata?.resourceVersion ?? '');
    const first = !this.listed;
    this.listed = true;
    if (this.rv === '') this.o.logger.warn('kube: list without a resourceVersion; the watch starts from now', { resource: this.o.name });
    if (!first) this.o.logger.info('kube: relisted', { resource: this.o.name, objects: this.store.size, before, resourceVersion: this.rv });
    this.o.changed();
    return true;
  }

  private watchOnce(): Promise<WatchEnd> {
    this.counts.watches++;
    const end: WatchEnd = { gone: false, stalled: false, received: 0, ms: 0 };
    const t0 = Date.now();
    return new Promise<WatchEnd>((resolve) => {
      let controller: AbortController | undefined;
      let finished = false;
      let idle: NodeJS.Timeout | undefined;
      let healthy: NodeJS.Timeout | undefined;
      const finish = (error?: unknown) => {
        if (finished) return;
        finished = true;
        clearTimeout(idle);
        clearTimeout(healthy);
        this.abort = undefined;
        controller?.abort();
        end.ms = Date.now() - t0;
        if (error !== undefined && error !== null && !end.gone && !end.stalled && !this.stopped && !isAbort(error)) end.error = error;
        resolve(end);
      };
      const arm = () => {
        clearTimeout(idle);
        idle = setTimeout(() => {
          end.stalled = true;
          finish();
        }, this.o.idleMs ?? 150_000);
        idle.unref();
      };
      this.abort = () => finish();
      arm();
      const params: Record<string, string> = {
        resourceVersion: this.rv,
        allowWatchBookmarks: 'true',
        // The server ends each watch after 5–10 min (spread, as client-go does); it is resumed, not relisted.
        timeoutSeconds: String(300 + Math.floor(Math.random() * 300)),
      };
      if (this.o.labelSelector) params.labelSelector = this.o.labelSelector;
      if (this.o.fieldSelector) params.fieldSelector = this.o.fieldSelector;
      const onEvent = (type: string, obj: Obj) => {
        if (finished) return;
        arm();
        if (type === 'ERROR') {
          if (Number(obj?.code) === 410) end.gone = true;
          else end.error = Object.assign(new Error(String(obj?.message ?? 'watch error')), { statusCode: obj?.code });
          finish();
          return;
        }
        end.received++;
        const rv = obj?.metadata?.resourceVersion;
        if (type === 'BOOKMARK') {
          if (rv) this.rv = String(rv);
          return;
        }
        this.counts.events++;
        if (type === 'ADDED' || type === 'MODIFIED') this.store.set(keyOf(obj), obj);
        else if (type === 'DELETED') this.store.delete(keyOf(obj));
        else return;
        if (rv) this.rv = String(rv);
        this.o.changed();
      };
      new k8s.Watch(this.o.kc)
        .watch(this.o.path, params, onEvent, (err: unknown) => {
          if (Number((err as { statusCode?: unknown })?.statusCode) === 410) end.gone = true;
          finish(err);
        })
        .then((c) => {
          controller = c;
          if (finished) c.abort();
          // Connected (a 200 and a stream): the API is back. After 410s, only once the stream has lasted a
          // moment without another one (a 410 comes at once), or delivered something.
          else if (this.goneStreak === 0) this.recovered();
          else {
            healthy = setTimeout(() => {
              if (finished) return;
              this.goneStreak = 0;
              this.recovered();
            }, 1000);
            healthy.unref();
          }
        })
        .catch((e: unknown) => finish(e));
    });
  }

  /** A problem is logged when it starts (warn) and kept for status; repeats only go to debug. */
  private report(problem: string, extra: Record<string, unknown>): void {
    if (this.problem === undefined) {
      this.problem = { text: problem, since: new Date().toISOString() };
      this.o.logger.warn(`kube: ${problem}`, { resource: this.o.name, ...extra });
      return;
    }
    this.problem.text = problem;
    this.o.logger.debug(`kube: ${problem}`, { resource: this.o.name, ...extra });
  }

  private recovered(): void {
    if (this.problem === undefined) return;
    this.o.logger.info('kube: following again', { resource: this.o.name, resourceVersion: this.rv, was: this.problem.text, since: this.problem.since });
    this.problem = undefined;
    this.backoff.reset();
  }

  private sleep(ms: number): Promise<void> {
    if (this.stopped) return Promise.resolve();
    return new Promise((resolve) => {
      const wake = () => {
        this.sleeping = undefined;
        resolve();
      };
      this.sleeping = { timer: setTimeout(wake, ms), wake };
    });
  }
}

function keyOf(o: Obj): string {
  return `${o.metadata?.namespace ?? ''}/${o.metadata?.name ?? ''}`;
}

function isAbort(e: unknown): boolean {
  return (e as { name?: string })?.name === 'AbortError' || (e as { type?: string })?.type === 'aborted';
}

export function describeError(e: unknown): string {
  const x = e as { code?: unknown; statusCode?: unknown; message?: string };
  return [x.statusCode ?? x.code, x.message ?? String(e)].filter((v) => v !== undefined && v !== '').join(' ');
}
