// Whether tether's programming is stale, by kube-proxy's rule (pkg/proxy/healthcheck, proxy_health.go): a
// node is unhealthy only while a change has waited longer than the timeout to be programmed. A quiet node
// whose last pass is old is healthy (nothing waits), and so is one that has not finished its first pass.
// The load balancer records its changes and passes per IP family in FamilyTrackers (one ProgrammingTracker
// per family programmed, as kube-proxy has one proxier per family); the health checks read them.

/** kube-proxy's healthTimeout: 2 × its default sync period (30 s). */
export const HEALTH_TIMEOUT_MS = 60_000;

/** An IP family as kube-proxy names it in the status (v1.IPFamily). */
export type ProgrammedFamily = 'IPv4' | 'IPv6';

/** When the programming last caught up (ms), and since when the oldest change not programmed waits. */
export interface ProgrammingState {
  lastUpdated?: number;
  pendingSince?: number;
}

/** Each family's programming state, for the families programmed so far (kube-proxy's per-proxier maps). */
export type FamilyProgramming = Partial<Record<ProgrammedFamily, ProgrammingState>>;

/** The proxy's health as kube-proxy reports it: overall, its last update, and per IP family. */
export interface ProxyHealth {
  healthy: boolean;
  /** The last time the programming caught up (none before the first). */
  lastUpdated?: Date;
  status: Record<string, { lastUpdated: Date; healthy: boolean }>;
}

/** Records the changes the load balancer must program and the passes that programmed them (one family). */
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

/**
 * One tracker per family programmed, as kube-proxy keeps one per proxier (lastUpdatedMap and
 * oldestPendingQueuedMap by v1.IPFamily): a family is reported from when something of it was first
 * programmed (track()), and then every change and completed pass counts for it, as kube-proxy's changes
 * and syncs reach both of its proxiers.
 */
export class FamilyTrackers {
  private readonly trackers = new Map<ProgrammedFamily, ProgrammingTracker>();

  constructor(private readonly now: () => number = Date.now) {}

  /** The family is programmed from now on: reported, healthy until a change waits too long. Idempotent. */
  track(family: ProgrammedFamily): void {
    if (this.trackers.has(family)) return;
    const t = new ProgrammingTracker(this.now);
    t.started();
    this.trackers.set(family, t);
  }

  tracks(family: ProgrammedFamily): boolean {
    return this.trackers.has(family);
  }

  queued(): void {
    for (const t of this.trackers.values()) t.queued();
  }

  updated(): void {
    for (const t of this.trackers.values()) t.updated();
  }

  state(): FamilyProgramming {
    const out: FamilyProgramming = {};
    for (const f of [...this.trackers.keys()].sort()) out[f] = this.trackers.get(f)!.state();
    return out;
  }
}

/**
 * kube-proxy's verdict at `now` (pkg/proxy/healthcheck proxy_health.go Health()): each family programmed is
 * reported with its last update, unhealthy when a change has waited `timeoutMs` or more; the proxy is healthy
 * when every family is, and its lastUpdated is the latest of theirs. A family never updated is not reported.
 */
export function proxyHealth(families: FamilyProgramming, now: number, timeoutMs = HEALTH_TIMEOUT_MS): ProxyHealth {
  const out: ProxyHealth = { healthy: true, status: {} };
  for (const f of Object.keys(families).sort() as ProgrammedFamily[]) {
    const s = families[f]!;
    // Before its first update a proxier is healthy and not reported (kube-proxy's map has no entry for it).
    if (s.lastUpdated === undefined) continue;
    const healthy = s.pendingSince === undefined || now - s.pendingSince < timeoutMs;
    const lastUpdated = new Date(s.lastUpdated);
    if (!out.lastUpdated || lastUpdated > out.lastUpdated) out.lastUpdated = lastUpdated;
    out.healthy &&= healthy;
    out.status[f] = { lastUpdated, healthy };
  }
  return out;
}

/** The oldest change waiting in any family (the health log's "waiting since"). */
export function oldestPending(families: FamilyProgramming): number | undefined {
  const waits = Object.values(families).map((s) => s?.pendingSince).filter((x): x is number => x !== undefined);
  return waits.length ? Math.min(...waits) : undefined;
}
