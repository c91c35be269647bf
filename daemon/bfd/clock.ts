// Time source for BFD sessions: monotonic milliseconds and timers, injectable so the state machine can be
// driven by a fake clock in unit tests instead of sleeping.
import { performance } from 'node:perf_hooks';

export interface Clock {
  /** Monotonic milliseconds (fractional). */
  now(): number;
  setTimeout(fn: () => void, ms: number): unknown;
  clearTimeout(handle: unknown): void;
}

export const realClock: Clock = {
  now: () => performance.now(),
  setTimeout: (fn, ms) => setTimeout(fn, Math.max(0, ms)),
  clearTimeout: (h) => clearTimeout(h as NodeJS.Timeout),
};
