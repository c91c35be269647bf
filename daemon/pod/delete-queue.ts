// Replays the DELs the CNI clients queued while tetherd could not be reached (the format is
// lib/api/delete-queue.ts): once when tetherd starts, before its socket serves, so what the runtime tore
// down while tetherd was away is released before anything new is attached; then every RETRY_EVERY_MS for
// requests that failed or that a client queued while tetherd was restarting. The DEL handlers are
// idempotent, so a request replayed twice, or one tetherd had already half done when it died, is harmless.
import * as fs from 'node:fs';
import * as path from 'node:path';
import type { CniParams } from '../../lib/api/protocol';
import { isQueueTempName, parseQueuedDelete, type QueuedDelete, type QueuedMethod } from '../../lib/api/delete-queue';
import { validateCniRequest, type CniRequestFields } from '../../lib/cni-validate';
import { fsyncDir, removeFileDurable } from '../../lib/atomic-file';
import type { Part } from '../lifecycle';
import type { Logger } from '../../lib/log';
import { ReconcileLoop } from '../util/reconcile-loop';
import { Backoff } from '../../lib/backoff';
import type { AttachService } from './attach-service';
import type { IpamService } from '../../ipam/ipam-service';

export type DeleteHandler = (p: CniParams) => Promise<void> | void;

export interface DrainSummary {
  /** Replayed and removed. */
  done: number;
  /** Replayed, failed, kept for a later drain. */
  failed: number;
  /** Unreadable, moved to garbled/. */
  garbled: number;
  /** Not tried this time: waiting for their retry time after a failure. */
  waiting: number;
}

/** How often queued requests are looked for while tetherd runs. */
export const RETRY_EVERY_MS = 30_000;
/** A request that keeps failing is retried at most this far apart, so it cannot flood the log. */
const MAX_BACKOFF_MS = 10 * 60_000;
/** A temp file older than this belongs to a killed writer (a live one renames it within milliseconds). */
const STALE_TEMP_MS = 60_000;
/** Where unreadable requests are moved: kept for a person to read, never replayed. */
export const GARBLED_DIR = 'garbled';

export class DeleteQueue implements Part {
  readonly name = 'delete queue';
  /** The periodic drains. */
  private readonly loop: ReconcileLoop;
  private draining?: Promise<DrainSummary>;
  /** Failed requests by file name: their backoff (doubling from retryEveryMs, no jitter), and when to try
   *  again. Lost on restart, which retries all. */
  private readonly failures = new Map<string, { backoff: Backoff; nextAt: number }>();

  constructor(
    readonly dir: string,
    private readonly handlers: Record<QueuedMethod, DeleteHandler>,
    private readonly logger: Logger,
    private readonly retryEveryMs = RETRY_EVERY_MS,
  ) {
    // The clients create only the last component (lib/api/delete-queue.ts): make it here, root only.
    fs.mkdirSync(dir, { recursive: true, mode: 0o700 });
    this.loop = new ReconcileLoop({
      run: () => this.drain(),
      everyMs: retryEveryMs,
      skipBusyTicks: true,
      onError: (e) => this.logger.error('delete queue: drain failed', { dir: this.dir, error: e.message }),
    });
  }

  /** Replays every queued request due now; one drain at a time (a call during a drain gets its result). */
  drain(): Promise<DrainSummary> {
    if (!this.draining) {
      this.draining = this.drainOnce().finally(() => {
        this.draining = undefined;
      });
    }
    return this.draining;
  }

  /**
   * Drains once now (tetherd: before its socket serves; a failure to read the directory is logged, never a
   * failed start, since pods must stay deletable), then every retryEveryMs until stop().
   */
  async start(): Promise<void> {
    try {
      await this.drain();
    } catch (e) {
      this.logger.error('delete queue: drain at start failed; retrying periodically', { dir: this.dir, error: (e as Error).message });
    }
    this.loop.start();
  }

  /** Stops the timer and waits for a drain under way (a DEL half replayed is finished, not cut off). */
  async stop(): Promise<void> {
    if (!(await this.loop.stop(10_000))) this.logger.warn('delete queue: a drain was still running at stop', { dir: this.dir });
  }

  private async drainOnce(): Promise<DrainSummary> {
    const sum: DrainSummary = { done: 0, failed: 0, garbled: 0, waiting: 0 };
    const entries: Array<{ name: string; text: string; req: QueuedDelete }> = [];
    for (const ent of fs.readdirSync(this.dir, { withFileTypes: true })) {
      const name = ent.name;
      if (ent.isDirectory() && name === GARBLED_DIR) continue;
      if (isQueueTempName(name)) {
        this.removeStaleTemp(name);
        continue;
      }
      let text: string;
      try {
        if (!ent.isFile() || !name.endsWith('.json')) throw new Error('not a queued request file (*.json)');
        text = fs.readFileSync(path.join(this.dir, name), 'utf8');
      } catch (e) {
        if ((e as NodeJS.ErrnoException).code === 'ENOENT') continue; // replayed by a DEL that raced us
        this.setAside(name, (e as Error).message);
        sum.garbled++;
        continue;
      }
      try {
        const req = parseQueuedDelete(text);
        req.params.args ??= {};
        validateCniRequest(req.params as unknown as CniRequestFields, { requireNetns: false });
        entries.push({ name, text, req });
      } catch (e) {
        this.setAside(name, (e as Error).message);
        sum.garbled++;
      }
    }
    for (const name of this.failures.keys()) if (!entries.some((e) => e.name === name)) this.failures.delete(name);
    // In the order they were queued: a chain's DEL reaches tether before the primary's IPAM.
    entries.sort((a, b) => a.req.queuedAt.localeCompare(b.req.queuedAt) || a.name.localeCompare(b.name));
    const now = Date.now();
    for (const { name, text, req } of entries) {
      const failed = this.failures.get(name);
      if (failed && failed.nextAt > now) {
        sum.waiting++;
        continue;
      }
      if (await this.replay(name, text, req)) sum.done++;
      else sum.failed++;
    }
    if (sum.done || sum.failed || sum.garbled) this.logger.info('delete queue: drained', { dir: this.dir, ...sum });
    return sum;
  }

  /** Runs one request; true when it succeeded and its file is gone. */
  private async replay(name: string, text: string, req: QueuedDelete): Promise<boolean> {
    const p = req.params;
    const who = {
      method: req.method,
      container: p.containerId,
      ifName: p.ifName,
      network: p.config.name,
      pod: p.args.K8S_POD_NAMESPACE && p.args.K8S_POD_NAME ? `${p.args.K8S_POD_NAMESPACE}/${p.args.K8S_POD_NAME}` : undefined,
      queuedAt: req.queuedAt,
    };
    try {
      await this.handlers[req.method](p);
    } catch (e) {
      const failure = this.failures.get(name) ?? { backoff: new Backoff(this.retryEveryMs, MAX_BACKOFF_MS, Math.random, 0), nextAt: 0 };
      const backoff = failure.backoff.next();
      failure.nextAt = Date.now() + backoff;
      this.failures.set(name, failure);
      this.logger.warn('delete queue: queued DEL failed; kept for retry', { ...who, error: (e as Error).message, attempt: failure.backoff.failures, retryInSeconds: Math.round(backoff / 1000) });
      return false;
    }
    this.failures.delete(name);
    const file = path.join(this.dir, name);
    try {
      // A client may have queued the same DEL again while it ran (same pod, same file): that copy is
      // left for the next drain rather than removed unseen.
      if (fs.readFileSync(file, 'utf8') === text) removeFileDurable(file);
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== 'ENOENT') {
        this.logger.error('delete queue: queued DEL done but its file could not be removed; it will be replayed again', { ...who, file, error: (e as Error).message });
      }
    }
    this.logger.info('delete queue: queued DEL done', { ...who, waitedSeconds: Math.round((Date.now() - Date.parse(req.queuedAt)) / 1000) });
    return true;
  }

  /** Moves an unreadable request to garbled/ (kept, never replayed) and says why; never throws. */
  private setAside(name: string, why: string): void {
    const to = path.join(this.dir, GARBLED_DIR, `${name}.${Date.now()}`);
    try {
      fs.mkdirSync(path.dirname(to), { recursive: true, mode: 0o700 });
      fs.renameSync(path.join(this.dir, name), to);
      fsyncDir(this.dir);
      this.logger.error('delete queue: unreadable request moved aside, not replayed', { file: name, movedTo: to, error: why });
    } catch (e) {
      this.logger.error('delete queue: unreadable request could not be moved aside', { file: name, error: why, moveError: (e as Error).message });
    }
  }

  private removeStaleTemp(name: string): void {
    const file = path.join(this.dir, name);
    try {
      if (Date.now() - fs.statSync(file).mtimeMs < STALE_TEMP_MS) return; // a client writing right now
      fs.unlinkSync(file);
      this.logger.info('delete queue: temp file of an interrupted client removed', { file: name });
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== 'ENOENT') this.logger.warn('delete queue: cannot remove temp file', { file: name, error: (e as Error).message });
    }
  }
}

/** tetherd's deletion queue, <stateDir>/delete-queue, replaying through the attach service and IPAM. */
export function nodeDeleteQueue(o: { stateDir: string; attach: AttachService; ipam: IpamService; logger: Logger }): DeleteQueue {
  return new DeleteQueue(path.join(o.stateDir, 'delete-queue'), { 'cni.del': (p) => o.attach.del(p), 'ipam.del': (p) => o.ipam.del(p) }, o.logger);
}
