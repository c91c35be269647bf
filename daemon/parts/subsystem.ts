// The one shape of tetherd's subsystems (IPAM, egress, load balancer, health checks):
// start / apply typed desired state / stop / status, and the one resolve step that turns each configuration
// from the config source into every subsystem's desired state. main.ts only wires them.
import type { Part } from '../lifecycle';
import type { ConfigObjects, NodeFacts, PodMeta } from '../config/objects';
import type { Reconciler } from '../config/source';
import type { EgressObjects } from '../egress/egress-config';
import type { ResolvedEgress } from '../egress/egress-spec';
import { resolveLoadBalancers, type LbResolution } from '../lb/lb-spec';
import type { ResolvedPool } from '../../ipam/types';

/** A part (lifecycle.ts) that also converges to desired state and reports its status. */
export interface Subsystem<Desired> extends Part {
  /** Starts what it serves and its loops, from the desired state applied so far. */
  start(): Promise<void>;
  /** Converges to `desired`: the whole state every time (level-triggered), never a diff. Idempotent. */
  apply(desired: Desired): Promise<void> | void;
  /** Stops its loops, waiting for the pass under way; what must outlive tetherd (datapath) stays. */
  stop(stoppingSince?: number): Promise<void>;
  /** Its fields of tetherd's status answer. */
  status(): Promise<Record<string, unknown>> | Record<string, unknown>;
}

export interface IpamDesired {
  pools: ResolvedPool[];
  /** This node's facts (zone, labels: which pools it takes blocks from). */
  node: NodeFacts;
}

export interface EgressDesired {
  egresses: ResolvedEgress[];
  /** Pods' metadata from the config source, over the pod records' own labels. */
  podMeta?: Record<string, PodMeta>;
}

export interface LbDesired {
  resolution: LbResolution;
  podMeta?: Record<string, PodMeta>;
}

export interface HealthDesired {
  /** The node may take load-balanced traffic (not being deleted or drained by the autoscaler). */
  eligible: boolean;
}

/** Every subsystem's desired state, from one configuration. */
export interface DesiredState {
  config: ConfigObjects;
  ipam: IpamDesired;
  egress: EgressDesired;
  lb: LbDesired;
  health: HealthDesired;
}

/**
 * The resolve step. Egress objects are resolved through `egressObjects`, which keeps an invalid Egress's
 * last good version and its reason (for status); everything else is a pure function of the configuration.
 */
export function resolveDesired(c: ConfigObjects, o: { nodeName: string; egressObjects: EgressObjects }): DesiredState {
  const node = c.nodes[o.nodeName] ?? { labels: {} };
  return {
    config: c,
    ipam: { pools: c.pools, node },
    egress: { egresses: o.egressObjects.resolve(c), podMeta: c.pods },
    lb: { resolution: resolveLoadBalancers(c.others, c.pools), podMeta: c.pods },
    health: { eligible: node.eligible !== false },
  };
}

/** A subsystem fed its own part of each resolved desired state. */
export function fed<D>(s: Subsystem<D>, pick: (d: DesiredState) => D): Reconciler<DesiredState> {
  return { name: s.name, apply: (d) => s.apply(pick(d)) };
}
