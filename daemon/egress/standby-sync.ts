// Whether this node, a standby candidate of a floating address, holds its live owner's connections (its
// sync stream arrives and its first transfer is applied), and if not, why: for the address's status, a
// metric, /readyz and a Kubernetes Event, so a standby that cannot sync says so before a handover to it
// would break connections (issue 29: a rolling upgrade whose sync versions differed said nothing).
import type { RejectReason, SyncPeerStats } from '../conntrack-sync';
import { type EgressShared, streamOf, type AddressState, type StandbySyncReason, type StandbySyncChange } from './egress-state';
import type { PeerLiveness } from './peer-liveness';

/** Reasons that do not pass by themselves: reported at once, not after STANDBY_SYNC_BOUND_MS. */
const REFUSALS: ReadonlySet<StandbySyncReason> = new Set(['version', 'auth', 'stale', 'protocol']);

/**
 * How long a standby may be out of sync (unreachable, resyncing) before it is reported (not ready, an
 * Event): a restarted standby or owner connects and resyncs well within it (sender backoff ≤ 2 s, a
 * transfer of 100,000 flows ≈ 1 s), so only a stream that does not come back is.
 */
export const STANDBY_SYNC_BOUND_MS = 10_000;
/** A refusal older than this no longer explains a missing stream (the owner stopped trying). */
const REFUSAL_WINDOW_MS = 30_000;

const REASON_OF: Record<RejectReason, StandbySyncReason> = {
  version: 'version', auth: 'auth', stale: 'stale', timeout: 'unreachable', malformed: 'protocol', replay: 'protocol', oversize: 'protocol',
};

/** The standby's side of one address, in its status. */
export interface StandbySyncStatus {
  inSync: boolean;
  /** The owner's node it syncs from. */
  ownerNode: string;
  reason?: StandbySyncReason;
  message?: string;
  /** Since when it is not in sync (ISO time), and whether that is reported (not ready, Event). */
  since?: string;
  reported?: boolean;
}

interface Track {
  ownerNode: string;
  reason: StandbySyncReason;
  message: string;
  since: number;
  reported: boolean;
}

export class StandbySync {
  /** Per address (stream name) this node is a standby of and not in sync with. */
  private readonly tracks = new Map<string, Track>();

  constructor(private readonly s: EgressShared, private readonly peers: PeerLiveness) {}

  /** This node's gateway pods that are standbys of `st` (none: this node is no standby of it). */
  private standbyPods(st: AddressState): string[] {
    if (st.holder || this.s.o.conntrackSync === false) return [];
    const o = st.own;
    if (!o.owner || !o.ownerNode || o.ownerNode === this.s.o.node.name) return [];
    if (!this.peers.ownerAlive(st)) return [];
    return [...this.s.gateways.values()].filter((g) => g.egresses.has(st.egress.key) && g.info.pod !== o.owner).map((g) => g.info.pod);
  }

  /** The receiver's connections by stream, read once per pass (not once per address). */
  private connections(): Map<string, SyncPeerStats[]> {
    const out = new Map<string, SyncPeerStats[]>();
    for (const p of this.s.receiver?.stats().peers ?? []) out.set(p.stream, [...(out.get(p.stream) ?? []), p]);
    return out;
  }

  /** Whether the owner's stream for `st` arrives and its first transfer is applied; if not, why. */
  private check(st: AddressState, now: number, conns = this.connections()): { reason: StandbySyncReason; message: string } | undefined {
    const owner = st.own.ownerNode!;
    const peers = (conns.get(streamOf(st)) ?? []).filter((p) => p.id === owner);
    if (peers.some((p) => p.resyncs > 0)) return undefined;
    if (peers.length) return { reason: 'resyncing', message: `the first transfer from ${owner} is under way` };
    const r = this.s.receiver?.refusalFrom(owner, st.own.ownerNodeAddress, now - REFUSAL_WINDOW_MS);
    if (r) return { reason: REASON_OF[r.reason], message: `its sync connection was refused (${r.reason}): ${r.message}` };
    const a = st.own.ownerNodeAddress;
    // An owner of the other underlay family never streams to this node (nor this node to it): said so.
    const why = a && !this.peers.reachable(a, owner) ? ': node underlays of different families: not reachable from here' : '';
    return { reason: 'unreachable', message: `no sync connection from ${owner}${a ? ` (${a})` : ''} arrives${why}` };
  }

  /**
   * Looks at every address again (each second, and before status answers): a problem becomes reported
   * when it is a refusal or lasted STANDBY_SYNC_BOUND_MS; each reported problem, each change of its
   * reason and its end are logged and told (onStandbySyncChanged) once.
   */
  update(now = Date.now()): void {
    const seen = new Set<string>();
    const conns = this.connections();
    for (const st of this.s.addresses.values()) {
      const pods = this.standbyPods(st);
      if (!pods.length) continue;
      const key = streamOf(st);
      const problem = this.check(st, now, conns);
      const t = this.tracks.get(key);
      if (!problem) continue;
      seen.add(key);
      const owner = { pod: st.own.owner, node: st.own.ownerNode! };
      if (!t || t.ownerNode !== owner.node) {
        if (t?.reported) this.over(st, t, pods, now, `the owner moved to ${owner.node}`);
        this.tracks.set(key, { ownerNode: owner.node, ...problem, since: now, reported: false });
      } else {
        const changed = t.reason !== problem.reason;
        t.reason = problem.reason;
        t.message = problem.message;
        if (t.reported && changed) this.report(st, t, pods, now);
      }
      const cur = this.tracks.get(key)!;
      if (!cur.reported && (REFUSALS.has(cur.reason) || now - cur.since >= STANDBY_SYNC_BOUND_MS)) {
        cur.reported = true;
        this.report(st, cur, pods, now);
      }
    }
    for (const [key, t] of this.tracks) {
      if (seen.has(key)) continue;
      this.tracks.delete(key);
      const st = this.s.addresses.get(key);
      const pods = st ? this.standbyPods(st) : [];
      if (t.reported && st) this.over(st, t, pods, now, pods.length ? 'in sync' : 'no longer a standby of a live owner');
      else if (t.reported) this.s.o.logger.info('egress: standby sync problem over: address gone', { stream: key });
    }
  }

  private report(st: AddressState, t: Track, pods: string[], now: number): void {
    this.s.o.logger.warn('egress: this standby cannot sync with the address\'s owner: a handover to it would break connections', {
      egress: st.egress.key, address: st.address, pods, owner: st.own.owner, ownerNode: t.ownerNode, reason: t.reason, message: t.message, forMs: now - t.since,
    });
    this.tell({ egress: st.egress.key, address: st.address, node: this.s.o.node.name, pods, owner: { pod: st.own.owner, node: t.ownerNode }, inSync: false, reason: t.reason, message: t.message, forMs: now - t.since });
  }

  private over(st: AddressState, t: Track, pods: string[], now: number, why: string): void {
    this.s.o.logger.info('egress: standby sync problem over', { egress: st.egress.key, address: st.address, pods, ownerNode: t.ownerNode, was: t.reason, why, forMs: now - t.since });
    this.tell({ egress: st.egress.key, address: st.address, node: this.s.o.node.name, pods, owner: { pod: st.own.owner, node: t.ownerNode }, inSync: true, forMs: now - t.since });
  }

  private tell(c: StandbySyncChange): void {
    try {
      this.s.o.onStandbySyncChanged?.(c);
    } catch (e) {
      this.s.o.logger.debug('egress: standby sync listener failed', { egress: c.egress, address: c.address, error: (e as Error).message });
    }
  }

  /** The standby's side of `st` for its status, as of the last update(); undefined when this node is no standby of it. */
  statusOf(st: AddressState): StandbySyncStatus | undefined {
    if (!this.standbyPods(st).length) return undefined;
    const t = this.tracks.get(streamOf(st));
    const ownerNode = st.own.ownerNode!;
    if (!t || t.ownerNode !== ownerNode) return { inSync: true, ownerNode };
    return { inSync: false, ownerNode, reason: t.reason, message: t.message, since: new Date(t.since).toISOString(), reported: t.reported };
  }

  /** Reported problems, one line each, for /readyz. */
  readinessProblems(): string[] {
    const now = Date.now();
    const out: string[] = [];
    for (const [key, t] of this.tracks) {
      if (!t.reported) continue;
      const st = this.s.addresses.get(key);
      if (!st) continue;
      out.push(`egress ${st.egress.key} address ${st.address}: this standby cannot sync with its owner ${st.own.owner} on ${t.ownerNode} for ${Math.round((now - t.since) / 1000)} s: ${t.reason}: ${t.message}`);
    }
    return out;
  }
}
