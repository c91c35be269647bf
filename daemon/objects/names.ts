// Names tether gives to, or reads from, core Kubernetes objects: the loadBalancerClass it serves, the label
// that marks its Services (and their EndpointSlices) so a node lists only those, and the taint that says a
// Node is leaving. Every part that speaks of these objects (the config source, the load balancer, the
// health server, the Service labeler) takes the names from here.
import { isObject } from '../../lib/fields';

/** The Service loadBalancerClass tether serves. */
export const LB_CLASS = 'tether.dev/lb';

/** On every Service of class LB_CLASS, set by the leader; copied onto its EndpointSlices. */
export const TETHER_SERVICE_LABEL = 'tether.dev/load-balancer';
export const TETHER_SERVICE_SELECTOR = `${TETHER_SERVICE_LABEL}=true`;

/** The well-known label of a Node's zone (and the pools' `zone` shorthand). */
export const ZONE_LABEL = 'topology.kubernetes.io/zone';

/** The label on an EndpointSlice naming its Service. */
export const SERVICE_NAME_LABEL = 'kubernetes.io/service-name';

/** The cluster autoscaler's taint on a Node it is about to remove. */
export const TO_BE_DELETED_TAINT = 'ToBeDeletedByClusterAutoscaler';

/** Is this a Service tether serves (type LoadBalancer, tether's class)? Others' Services are ignored. */
export function isTetherService(o: Record<string, unknown>): boolean {
  const spec = isObject(o.spec) ? o.spec : {};
  return o.kind === 'Service' && spec.type === 'LoadBalancer' && spec.loadBalancerClass === LB_CLASS;
}
