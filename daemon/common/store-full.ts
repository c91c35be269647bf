// A full cluster store: Redis at its maxmemory with the noeviction policy (tether's manifests) refuses every
// command that may grow memory ("OOM command not allowed when used memory > 'maxmemory'") and still answers
// reads and deletes. That is neither an outage (the store answers; what it says is still true) nor a bug
// in the request: a caller gets TRY_AGAIN_LATER naming the store as full, and this node's refusals are
// counted per subsystem (ipam, egress, lb) for the metrics and told once per episode to whoever listens
// (the Warning Event on this node's TetherNode).
import { ErrorCode, TetherError } from '../../lib/errors';
import { log } from '../../lib/log';

/** A subsystem counts as refused-full this long after its last refusal (a write that went through ends it sooner). */
export const FULL_FOR_MS = 60_000;

const OOM_REPLY = /(^|\s)OOM command not allowed\b|^OOM\b/;

/** Whether `e` (or its cause) is Redis's refusal of a write because it is at its maxmemory. */
export function isOomReply(e: unknown): boolean {
  for (let x = e, depth = 0; x && depth < 4; x = (x as { cause?: unknown }).cause, depth++) {
    if (x instanceof StoreFullError) return true;
    if (x instanceof Error && OOM_REPLY.test(x.message)) return true;
  }
  return false;
}

/** The store refused a write because it is full: TRY_AGAIN_LATER (CNI code 11), with what to do in the message. */
export class StoreFullError extends TetherError {
  constructor(where: string, what: string, cause: unknown) {
    super(
      ErrorCode.TryAgainLater,
      `cluster store (${where}) is full: it refused ${what} (Redis is at its maxmemory and evicts nothing); try again later. ` +
        'Space comes back as idle load-balancer mappings expire and addresses are released; raise maxmemory and the pod\'s memory limit together if it stays full (docs/operations.md)',
      { cause },
    );
    this.name = 'StoreFullError';
  }
}

export type StoreSubsystem = 'ipam' | 'egress' | 'lb';

/** A subsystem's store writes refused as full: how many since start, and when the last one was. */
export interface StoreFullState {
  full: boolean;
  refusals: number;
}

export interface StoreFullNotice {
  subsystem: StoreSubsystem;
  where: string;
  what: string;
  message: string;
}

/**
 * This node's record of writes the store refused as full. One per process (every store client of the
 * node reports to it), as the store's authentication problems are (common/redis.ts).
 */
export class StoreFullness {
  private readonly refusals = new Map<StoreSubsystem, number>();
  private readonly lastAt = new Map<StoreSubsystem, number>();
  private readonly listeners = new Set<(n: StoreFullNotice) => void>();

  constructor(private readonly now: () => number = Date.now) {}

  /**
   * A write of `subsystem` refused as full: counted, and, when the subsystem was not full already, logged
   * at warn and told to the listeners (once per episode, not per refusal: a CNI storm against a full store
   * is one Event).
   */
  refused(subsystem: StoreSubsystem, where: string, what: string, message: string): void {
    const was = this.isFull(subsystem);
    this.refusals.set(subsystem, (this.refusals.get(subsystem) ?? 0) + 1);
    this.lastAt.set(subsystem, this.now());
    if (was) return;
    log().warn('cluster store is full: writes are refused until space is freed', { subsystem, store: where, refused: what });
    for (const l of this.listeners) {
      try {
        l({ subsystem, where, what, message });
      } catch (e) {
        log().debug('store full listener failed', { error: (e as Error).message });
      }
    }
  }

  /** A write of `subsystem` went through: the store has room again (for now). */
  written(subsystem: StoreSubsystem): void {
    if (!this.lastAt.has(subsystem)) return;
    this.lastAt.delete(subsystem);
    log().info('cluster store takes writes again', { subsystem });
  }

  isFull(subsystem: StoreSubsystem): boolean {
    const at = this.lastAt.get(subsystem);
    return at !== undefined && this.now() - at < FULL_FOR_MS;
  }

  /** Every subsystem that wrote to the store or was refused, for the metrics. */
  state(): Record<string, StoreFullState> {
    const out: Record<string, StoreFullState> = {};
    for (const s of new Set([...this.refusals.keys(), ...this.lastAt.keys()])) out[s] = { full: this.isFull(s), refusals: this.refusals.get(s) ?? 0 };
    return out;
  }

  /** Told when a subsystem becomes full (see refused); returns the way to stop listening. */
  onFull(l: (n: StoreFullNotice) => void): () => void {
    this.listeners.add(l);
    return () => this.listeners.delete(l);
  }
}

export const storeFullness = new StoreFullness();

/**
 * `e` as a StoreFullError when it is Redis's OOM refusal (recorded for `subsystem`), else undefined: the
 * one check every store's error path makes.
 */
export function storeFullFailure(subsystem: StoreSubsystem, where: string, what: string, e: unknown): StoreFullError | undefined {
  if (!isOomReply(e)) return undefined;
  const err = e instanceof StoreFullError ? e : new StoreFullError(where, what, e);
  if (!(e instanceof StoreFullError)) storeFullness.refused(subsystem, where, what, err.message);
  return err;
}

/**
 * The first line of the few scripts that must run on a full store (Redis 7.0 or later: script flags):
 * each writes a small, bounded amount whatever the traffic, and refusing it would make the cluster lie
 * about something live rather than stop growing it. They are: a node's or gateway's registration (the
 * member sets: refused, live nodes would expire out of the FoU allow-lists and candidate lists), an
 * Egress address's ownership record (refused, a decision would go unrecorded and unannounced), and a
 * VIP's expirer lease (refused, nobody would expire the idle mappings whose removal frees the store).
 * Everything that grows with traffic (addresses, LB mappings, usage reports) is refused as full.
 */
export const RUNS_WHEN_FULL = '#!lua flags=allow-oom\n';
