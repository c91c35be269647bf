// Messages between tetherd's main thread and its BFD thread (threaded.ts ⇄ worker-main.ts).
import type { BfdRejectReason, BfdSessionOptions, BfdSessionStats, BfdStateChange } from './session';

/** workerData of the BFD thread. */
export interface BfdWorkerData {
  address: string;
  port?: number;
  peerPort?: number;
  /** The main logger's level: the thread forwards only lines that level would write. */
  logLevel: string;
}

export type ToWorker =
  | { op: 'session'; peer: string; opts: BfdSessionOptions }
  | { op: 'setTimers'; peer: string; opts: Omit<BfdSessionOptions, 'auth'> }
  | { op: 'closeSession'; peer: string }
  | { op: 'close' };

export interface BfdThreadStats {
  rx: number;
  rejected: Record<BfdRejectReason, number>;
  sessions: BfdSessionStats[];
  /** Worst delay of the BFD thread's own event loop since it started, ms (timers firing late). */
  loopLagMaxMs: number;
  /** Worst delay of each of the last seconds (oldest first), ms. */
  loopLagPerSecondMs: number[];
}

export type FromWorker =
  | { kind: 'ready'; port: number }
  | { kind: 'openFailed'; code: string; message: string }
  | { kind: 'state'; peer: string; change: BfdStateChange }
  | { kind: 'sessionClosed'; peer: string }
  | { kind: 'sessionFailed'; peer: string; message: string }
  | { kind: 'stats'; stats: BfdThreadStats }
  | { kind: 'log'; level: string; message: string; meta: Record<string, unknown> }
  | { kind: 'closed' };
