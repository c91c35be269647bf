// Kubernetes Events (events.k8s.io/v1) from one tetherd, recorded the way client-go's recorders keep them
// cheap, with our own code: an Event repeated (same object, reason, note) within SERIES_WINDOW_MS becomes
// a series on the Event already written (series.count, series.lastObservedTime) instead of a new object;
// a token bucket per object (BURST writes, then one more every REFILL_MS, like client-go's spam filter)
// bounds what one object can cost the API server, and drops the excess with one debug line. emit() never
// waits and never throws: it only queues (a bounded queue; a full one drops), and one worker (a reconcile
// loop's passes) sends the queue in order. API errors are logged (the first of a run at warn, the rest at
// debug) and never thrown: Events are informative, and an Event flood during a takeover storm must not
// slow the egress path.
import { microTime } from './micro-time';
import { randomBytes } from 'node:crypto';
import * as k8s from '@kubernetes/client-node';
import type { Logger } from '../../lib/log';
import { describeError } from '../config/reflector';
import { ReconcileLoop } from '../util/reconcile-loop';

/** The controller named in every Event tetherd writes. */
export const REPORTING_CONTROLLER = 'tether.dev/tetherd';

/** An object an Event is about (metav1.ObjectReference; the uid is looked up at write time when absent). */
export interface EventObject {
  apiVersion: string;
  kind: string;
  name: string;
  /** Absent for cluster-scoped objects (their Events go to the "default" namespace, as client-go's do). */
  namespace?: string;
  uid?: string;
}

export interface TetherEvent {
  regarding: EventObject;
  type: 'Normal' | 'Warning';
  /** UpperCamelCase, what happened: Takeover, Refused… */
  reason: string;
  /** What tetherd did or failed to do: Failover, Validate… */
  action: string;
  /** Human-readable, at most 1 KiB (longer notes are cut). */
  note: string;
}

export interface EventRecorderOptions {
  kc: k8s.KubeConfig;
  /** reportingInstance: this node's name (an admission policy may require it to equal the token's node), or the operator replica's. */
  nodeName: string;
  /** reportingController (default REPORTING_CONTROLLER, tetherd's). */
  controller?: string;
  logger: Logger;
  /** The uid of an object (from the watch caches), so `kubectl describe` finds its Events. */
  uidOf?: (o: EventObject) => string | undefined;
  /** Writes one object's token bucket holds (default BURST). */
  burst?: number;
  /** One more write per object every this many ms (default REFILL_MS). */
  refillMs?: number;
  /** A repeat within this long of the last one joins its series (default SERIES_WINDOW_MS). */
  seriesWindowMs?: number;
  /** Writes waiting at most (default QUEUE_SIZE); more are dropped. */
  queueSize?: number;
  now?: () => number;
}

/**
 * Per object: 16 writes at once (an Egress has at most 16 addresses, so one node's takeovers of all of them
 * are each recorded), then one every 30 s (2 per minute per object, sustained, whatever the storm).
 * client-go's spam filter allows 25, then one per 5 minutes, per object and source; ours is per node.
 */
export const BURST = 16;
export const REFILL_MS = 30_000;
/** client-go's correlator aggregates similar Events over 10 minutes; a series here lives as long. */
export const SERIES_WINDOW_MS = 10 * 60_000;
export const QUEUE_SIZE = 256;
/** Series and buckets remembered at most (the oldest are forgotten first). */
const MAX_TRACKED = 4096;
const NOTE_MAX = 1024;

interface Series {
  key: string;
  objectKey: string;
  event: TetherEvent;
  firstAt: number;
  lastAt: number;
  count: number;
  /** The Event's name once created; its namespace. */
  name?: string;
  namespace: string;
  /** series.count as last written (1: the Event alone). */
  written: number;
  queued: boolean;
}

interface Bucket {
  tokens: number;
  at: number;
  /** Drops logged since tokens ran out (one debug line per run of drops). */
  dropping: boolean;
}

export interface EventRecorderStats {
  /** emit() calls. */
  emitted: number;
  created: number;
  /** Series writes (a repeat counted on an Event already written). */
  seriesUpdates: number;
  /** Repeats folded into a series (written as its count, not as Events). */
  aggregated: number;
  /** New Events refused by their object's token bucket. */
  rateLimited: number;
  /** Writes dropped because the queue was full. */
  queueFull: number;
  failed: number;
  queued: number;
}


const statusOf = (e: unknown) => (e as { code?: number }).code ?? (e as { statusCode?: number }).statusCode;

export class EventRecorder {
  private readonly api: k8s.EventsV1Api;
  private readonly series = new Map<string, Series>();
  private readonly buckets = new Map<string, Bucket>();
  /** Series with repeats not written yet because their object had no token left. */
  private readonly pending = new Set<Series>();
  private pendingTimer?: NodeJS.Timeout;
  private readonly queue: Series[] = [];
  /** Sends the queue: one pass at a time; writes queued during a pass get one more after it. */
  private readonly sender = new ReconcileLoop({
    run: () => this.drain(),
    // drain() catches every write's error; anything else is a bug, and Events are informative.
    onError: (e) => this.o.logger.warn('kube: events not sent', { error: e.message }),
  });
  private stopped = false;
  private queueFullLogged = false;
  /** Set while writes fail (logged at warn once, then at debug until one succeeds). */
  private failing = false;
  private readonly burst: number;
  private readonly refillMs: number;
  private readonly windowMs: number;
  private readonly queueSize: number;
  private readonly now: () => number;
  readonly stats: EventRecorderStats = { emitted: 0, created: 0, seriesUpdates: 0, aggregated: 0, rateLimited: 0, queueFull: 0, failed: 0, queued: 0 };

  constructor(private readonly o: EventRecorderOptions) {
    this.api = o.kc.makeApiClient(k8s.EventsV1Api);
    this.burst = o.burst ?? BURST;
    this.refillMs = o.refillMs ?? REFILL_MS;
    this.windowMs = o.seriesWindowMs ?? SERIES_WINDOW_MS;
    this.queueSize = o.queueSize ?? QUEUE_SIZE;
    this.now = o.now ?? Date.now;
  }

  /** Records an Event: queued, aggregated or dropped at once; never waits, never throws. */
  emit(e: TetherEvent): void {
    if (this.stopped) return;
    try {
      this.record(e);
    } catch (err) {
      this.o.logger.warn('kube: event not recorded', { object: objectKey(e.regarding), reason: e.reason, error: (err as Error).message });
    }
  }

  private record(e: TetherEvent): void {
    this.stats.emitted++;
    const now = this.now();
    const objKey = objectKey(e.regarding);
    const note = cut(e.note);
    const key = `${objKey}\u0000${e.type}\u0000${e.reason}\u0000${e.action}\u0000${note}`;
    const s = this.series.get(key);
    if (s && now - s.lastAt < this.windowMs) {
      s.count++;
      s.lastAt = now;
      this.stats.aggregated++;
      // The queued write (if any) takes the latest count; else one now if the object has a token left.
      if (s.queued) return;
      if (this.take(objKey, now)) this.enqueue(s);
      else this.later(s);
      return;
    }
    if (!this.take(objKey, now)) {
      this.stats.rateLimited++;
      return;
    }
    if (s) this.series.delete(key);
    const next: Series = {
      key, objectKey: objKey, event: { ...e, note }, firstAt: now, lastAt: now, count: 1, written: 0, queued: false,
      namespace: e.regarding.namespace || 'default',
    };
    this.series.set(key, next);
    this.forgetOld(now);
    this.enqueue(next);
  }

  /** Takes a token of the object's bucket; false (and one debug line per run of drops) when none is left. */
  private take(objKey: string, now: number): boolean {
    let b = this.buckets.get(objKey);
    if (!b) {
      b = { tokens: this.burst, at: now, dropping: false };
      this.buckets.set(objKey, b);
    } else {
      b.tokens = Math.min(this.burst, b.tokens + (now - b.at) / this.refillMs);
      b.at = now;
    }
    if (b.tokens >= 1) {
      b.tokens--;
      b.dropping = false;
      return true;
    }
    if (!b.dropping) {
      b.dropping = true;
      this.o.logger.debug('kube: events about this object rate-limited; new ones dropped, repeats counted, until its budget refills', {
        object: objKey, burst: this.burst, refillMs: this.refillMs,
      });
    }
    return false;
  }

  /** A repeat with no token left: its count is written once the object's bucket has one again. */
  private later(s: Series): void {
    this.pending.add(s);
    if (this.pendingTimer) return;
    this.pendingTimer = setTimeout(() => {
      this.pendingTimer = undefined;
      const now = this.now();
      for (const p of [...this.pending]) {
        if (p.queued || p.count === p.written) this.pending.delete(p);
        else if (this.take(p.objectKey, now)) {
          this.pending.delete(p);
          this.enqueue(p);
        }
      }
      if (this.pending.size && !this.stopped) this.later([...this.pending][0]);
    }, this.refillMs);
    this.pendingTimer.unref();
  }

  private enqueue(s: Series): void {
    if (this.queue.length >= this.queueSize) {
      this.stats.queueFull++;
      if (!this.queueFullLogged) {
        this.queueFullLogged = true;
        this.o.logger.debug('kube: event queue full; events dropped until it drains', { object: s.objectKey, reason: s.event.reason, queueSize: this.queueSize });
      }
      // A series already written keeps its count for the next write; a new Event is gone.
      if (!s.name && s.count === 1) this.series.delete(s.key);
      return;
    }
    s.queued = true;
    this.queue.push(s);
    this.stats.queued = this.queue.length;
    if (!this.stopped) this.sender.request();
  }

  /** Sends the queue in order, one request at a time. */
  private async drain(): Promise<void> {
    for (let s = this.queue.shift(); s; s = this.queue.shift()) {
      this.stats.queued = this.queue.length;
      s.queued = false;
      if (this.stopped) continue;
      try {
        if (!s.name) await this.create(s);
        else if (s.count > s.written) await this.writeSeries(s);
        if (this.failing) this.o.logger.info('kube: events written again', { object: s.objectKey });
        this.failing = false;
      } catch (e) {
        this.stats.failed++;
        // An Event that could not be created is forgotten (a repeat creates it anew); a series write that
        // failed is made again with the next repeat. A series whose Event is gone (404) starts over.
        if (!s.name || statusOf(e) === 404) this.series.delete(s.key);
        const fields = { object: s.objectKey, reason: s.event.reason, error: describeError(e) };
        if (!this.failing) this.o.logger.warn('kube: event not written; events are informative, tetherd goes on', fields);
        else this.o.logger.debug('kube: event not written', fields);
        this.failing = true;
      }
    }
    this.queueFullLogged = false;
  }

  private async create(s: Series): Promise<void> {
    const e = s.event;
    const uid = e.regarding.uid ?? this.o.uidOf?.(e.regarding);
    const count = s.count;
    const body = {
      apiVersion: 'events.k8s.io/v1',
      kind: 'Event',
      metadata: { name: eventName(e.regarding.name, s.firstAt), namespace: s.namespace },
      eventTime: microTime(s.firstAt),
      reportingController: this.o.controller ?? REPORTING_CONTROLLER,
      reportingInstance: this.o.nodeName,
      action: e.action,
      reason: e.reason,
      type: e.type,
      note: e.note,
      regarding: { apiVersion: e.regarding.apiVersion, kind: e.regarding.kind, name: e.regarding.name, ...(e.regarding.namespace ? { namespace: e.regarding.namespace } : {}), ...(uid ? { uid } : {}) },
      // Repeats that came before the create was sent are its series already.
      ...(count > 1 ? { series: { count, lastObservedTime: microTime(s.lastAt) } } : {}),
    };
    // eventTime is a string here: client-node passes MicroTime through as given (a Date would lose digits).
    const made = await this.api.createNamespacedEvent({ namespace: s.namespace, body: body as unknown as k8s.EventsV1Event });
    s.name = made.metadata?.name ?? body.metadata.name;
    s.written = count;
    this.stats.created++;
    // More repeats while it was being created: their count is written next.
    if (s.count > s.written) this.enqueueAgain(s);
  }

  private async writeSeries(s: Series): Promise<void> {
    const count = s.count;
    await this.api.patchNamespacedEvent(
      { name: s.name!, namespace: s.namespace, body: { series: { count, lastObservedTime: microTime(s.lastAt) } } },
      k8s.setHeaderOptions('Content-Type', k8s.PatchStrategy.MergePatch),
    );
    s.written = count;
    this.stats.seriesUpdates++;
  }

  /** A series write after the create, taking its own token (else written when one comes). */
  private enqueueAgain(s: Series): void {
    if (s.queued) return;
    if (this.take(s.objectKey, this.now())) this.enqueue(s);
    else this.later(s);
  }

  /** Series past their window and full buckets are forgotten once too many are held. */
  private forgetOld(now: number): void {
    if (this.series.size > MAX_TRACKED) {
      for (const [k, s] of this.series) {
        if (this.series.size <= MAX_TRACKED / 2) break;
        if (!s.queued && (now - s.lastAt >= this.windowMs || this.series.size > MAX_TRACKED)) this.series.delete(k);
      }
    }
    if (this.buckets.size > MAX_TRACKED) {
      for (const [k, b] of this.buckets) {
        if (this.buckets.size <= MAX_TRACKED / 2) break;
        if (b.tokens + (now - b.at) / this.refillMs >= this.burst || this.buckets.size > MAX_TRACKED) this.buckets.delete(k);
      }
    }
  }

  /** Waits until the queue is sent (tests, stop). */
  flush(): Promise<void> {
    return this.sender.idle();
  }

  /** No more Events; what is queued is sent for at most `timeoutMs`, the rest dropped. */
  async stop(timeoutMs = 2000): Promise<void> {
    clearTimeout(this.pendingTimer);
    this.pendingTimer = undefined;
    let timer: NodeJS.Timeout | undefined;
    await Promise.race([this.flush(), new Promise((r) => (timer = setTimeout(r, timeoutMs)))]);
    clearTimeout(timer);
    this.stopped = true;
    this.queue.length = 0;
    void this.sender.stop();
  }
}

function objectKey(o: EventObject): string {
  return `${o.kind} ${o.namespace ? `${o.namespace}/` : ''}${o.name}`;
}

function cut(note: string): string {
  if (Buffer.byteLength(note) <= NOTE_MAX) return note;
  let s = note.slice(0, NOTE_MAX);
  while (Buffer.byteLength(s) > NOTE_MAX - 3) s = s.slice(0, -1);
  return `${s}...`;
}

/** "<object>.<hex time><random>", as client-go names them (with a random tail: several nodes write). */
function eventName(objectName: string, ms: number): string {
  return `${objectName.slice(0, 200)}.${ms.toString(16)}${randomBytes(4).toString('hex')}`;
}

export { microTime };
