// Whether tether's programming is stale, by kube-proxy's rule (pkg/proxy/healthcheck, proxy_health.go): a
// node is unhealthy only while a change has waited longer than the timeout to be programmed. A quiet node
// whose last pass is old is healthy (nothing waits), and so is one that has not finished its first pass.
// The load balancer records its changes and passes in a ProgrammingTracker; the health checks read it.

/** kube-proxy's healthTimeout: 2 × its default sync period (30 s). */
export const HEALTH_TIMEOUT_MS = 60_000;

/**
 * The IP family tether's load balancer programs (lb-spec.ts takes IPv4 targets only): kube-proxy reports
 * each proxier's family, tether has this one.
 */
export const PROGRAMMED_FAMILY = 'IPv4';

/** When the programming last caught up (ms), and since when the oldest change not programmed waits. */
export interface ProgrammingState {
  lastUpdated?: number;
  pendingSince?: number;
}

/** The proxy's health as kube-proxy reports it: overall, its last update, and per IP family. */
export interface ProxyHealth {
  healthy: boolean;
  /** The last time the programming caught up (none before the first). */
  lastUpdated?: Date;
  status: Record<string, { lastUpdated: Date; healthy: boolean }>;
}

/** Records the changes the load balancer must program and the passes that programmed them. */
export class ProgrammingTracker {
  private lastUpdated?: number;
  private pendingSince?: number;

  constructor(private readonly now: () => number = Date.now) {}

  /** Programming starts: counts as an update, so a node whose passes never complete still goes stale. */
  started(): void {
    this.lastUpdated ??= this.now();
  }

  /** A change that needs programming arrived; the oldest one waiting sets the age. */
  queued(): void {
    this.pendingSince ??= this.now();
  }

  /** A pass completed: what was queued is programmed (kube-proxy clears on every completed sync too). */
  updated(): void {
    this.pendingSince = undefined;
    this.lastUpdated = this.now();
  }

  state(): ProgrammingState {
    return { lastUpdated: this.lastUpdated, pendingSince: this.pendingSince };
  }
}

/** kube-proxy's verdict on a programming state at `now`. */
export function proxyHealth(s: ProgrammingState, now: number, timeoutMs = HEALTH_TIMEOUT_MS): ProxyHealth {
  // Before its first update a proxier is healthy and not reported (kube-proxy's map has no entry for it).
  if (s.lastUpdated === undefined) return { healthy: true, status: {} };
  const healthy = s.pendingSince === undefined || now - s.pendingSince < timeoutMs;
  const lastUpdated = new Date(s.lastUpdated);
  return { healthy, lastUpdated, status: { [PROGRAMMED_FAMILY]: { lastUpdated, healthy } } };
}
