// The Kubernetes Events tetherd writes, in one place (their reasons are part of what users see and filter on):
//   Egress      Normal  Assigned         a floating address got its first owner          (the deciding node)
//   Egress      Warning Takeover         an owner was down: another gateway took over     (the deciding node)
//   Egress      Normal  Handover         a planned move (gateway pod deleted, tetherd stopping)
//   Egress      Warning StandbyOutOfSync this node's standby cannot sync with the owner (each standby node, its own)
//   Egress      Normal  StandbyInSync    … and it can again
//   Service     Warning HealthCheckFailing  this node's health check answer flipped to 503 (each node, its own)
//   Service     Normal  HealthCheckPassing  … and back to 200
//   Service     Warning VIPNotForwarded  this node's LB pods select a VIP it cannot forward: an IPv6 VIP, no IPv6
//                                        address on the node (each node, its own; nothing of the VIP programmed)
//   TetherNode  Warning StoreFull        the cluster store refused this node's write as full (each node, its own)
//   AddressPool, Egress, Service
//               Warning Refused          refused as invalid (the leader only, on the status change)
//               Warning AddressConflict  an overlapping pool, or an address held by another owner (the leader)
//               Normal  Accepted         valid again after a refusal or conflict (the leader)
import type { OwnershipChange, StandbySyncChange } from '../egress/egress-state';
import type { Condition } from './conditions';
import type { EventObject, TetherEvent } from './event-recorder';
import { GROUP, VERSION } from '../objects/crds';

const CR_API = `${GROUP}/${VERSION}`;

/** The Event of an ownership change of an Egress's floating address. */
export function ownershipEvent(c: OwnershipChange): TetherEvent {
  const [namespace, name] = c.egress.split('/');
  const regarding: EventObject = { apiVersion: CR_API, kind: 'Egress', namespace, name };
  const to = `${c.to.pod}${c.to.node ? ` on node ${c.to.node}` : ''}`;
  if (!c.from) return { regarding, type: 'Normal', reason: 'Assigned', action: 'Assign', note: `address ${c.address} assigned to ${to} (${c.cause})` };
  const from = `${c.from.pod}${c.from.node ? ` on node ${c.from.node}` : ''}`;
  // The epoch is left out of the note: the same move repeated (a gateway flapping) is one Event's series.
  if (c.cause.startsWith('failover')) return { regarding, type: 'Warning', reason: 'Takeover', action: 'Failover', note: `address ${c.address} taken over from ${from} by ${to}: ${c.cause}` };
  return { regarding, type: 'Normal', reason: 'Handover', action: 'Handover', note: `address ${c.address} handed over from ${from} to ${to}: ${c.cause}` };
}

/** This node's standby of an Egress's address cannot sync with the owner (reported), or can again. */
export function standbySyncEvent(c: StandbySyncChange): TetherEvent {
  const [namespace, name] = c.egress.split('/');
  const regarding: EventObject = { apiVersion: CR_API, kind: 'Egress', namespace, name };
  const standby = `${c.pods.join(', ') || 'the standby'} on node ${c.node}`;
  const owner = `${c.owner.pod} on node ${c.owner.node}`;
  if (c.inSync) return { regarding, type: 'Normal', reason: 'StandbyInSync', action: 'Sync', note: `address ${c.address}: ${standby} syncs with the owner ${owner} again` };
  // The duration is left out of the note: the same problem seen again is one Event's series.
  return {
    regarding, type: 'Warning', reason: 'StandbyOutOfSync', action: 'Sync',
    note: `address ${c.address}: ${standby} cannot sync with the owner ${owner} (${c.reason}): ${c.message}; a handover to it would break connections`,
  };
}

/** A Service's health-check answer on `node` flipping between 200 and 503. */
export function healthFlipEvent(f: { service: string; port: number; status: number; was: number; localEndpoints: number }, node: string): TetherEvent {
  const [namespace, name] = f.service.split('/');
  const regarding: EventObject = { apiVersion: 'v1', kind: 'Service', namespace, name };
  if (f.status === 200) return { regarding, type: 'Normal', reason: 'HealthCheckPassing', action: 'HealthCheck', note: `node ${node} answers 200 on health-check port ${f.port} (was ${f.was})` };
  const why = f.localEndpoints > 0 ? 'tether\'s programming on this node is stale' : 'no ready local endpoint';
  return { regarding, type: 'Warning', reason: 'HealthCheckFailing', action: 'HealthCheck', note: `node ${node} answers ${f.status} on health-check port ${f.port} (was ${f.was}): ${why}` };
}

/**
 * This node does not forward a VIP its LB pods select (LbController.forwardable): nothing of it is programmed
 * there. The note is the node's problem, which names the node, the VIP and the LB pods.
 */
export function notForwardedEvent(n: { service: string; problem: string }): TetherEvent {
  const [namespace, name] = n.service.split('/');
  const regarding: EventObject = { apiVersion: 'v1', kind: 'Service', namespace, name };
  return { regarding, type: 'Warning', reason: 'VIPNotForwarded', action: 'Announce', note: n.problem };
}

/** The cluster store refused a write of this node's `subsystem` as full (once per episode: common/store-full.ts). */
export function storeFullEvent(node: string, n: { subsystem: string; where: string; what: string }): TetherEvent {
  const regarding: EventObject = { apiVersion: CR_API, kind: 'TetherNode', name: node };
  return {
    regarding, type: 'Warning', reason: 'StoreFull', action: 'WriteStore',
    note: `the cluster store (${n.where}) is full: it refused ${n.what} of the ${n.subsystem} on node ${node} (Redis at its maxmemory, noeviction); ` +
      'such writes are retried and fail with "try again later" until space is freed (idle load-balancer mappings expire, addresses are released) or maxmemory is raised',
  };
}

/**
 * The message of an address conflict: another owner holds the address (ipam/cluster-addresses.ts's
 * AddressConflict error, as the load balancer and the egress controller report it).
 */
export function isAddressConflict(message: string): boolean {
  return /\bis held by \S+; .* cannot (have|re-assert) it\b/.test(message);
}

/** Conditions whose turn to False is a refusal or an address conflict. */
const WATCHED = new Set(['Ready', 'tether.dev/Ready', 'AddressesComplete']);

function refusal(c: Pick<Condition, 'status' | 'reason' | 'message'>): 'Refused' | 'AddressConflict' | undefined {
  if (c.status !== 'False') return undefined;
  if (c.reason === 'Invalid') return 'Refused';
  if (c.reason === 'Overlaps' || isAddressConflict(c.message)) return 'AddressConflict';
  return undefined;
}

/**
 * The Events of a status change the leader wrote on `regarding`: a condition that turned into a refusal
 * or an address conflict (or changed its message while one), and one that is fine again after one.
 * Computed against the status as it was persisted, so a new leader does not repeat what the last wrote.
 */
export function refusalEvents(regarding: EventObject, prev: Condition[] | undefined, next: Condition[]): TetherEvent[] {
  const out: TetherEvent[] = [];
  for (const c of next) {
    if (!WATCHED.has(c.type)) continue;
    const old = prev?.find((p) => p.type === c.type);
    if (old && old.status === c.status && old.reason === c.reason && old.message === c.message) continue;
    const now = refusal(c);
    if (now) {
      out.push({ regarding, type: 'Warning', reason: now, action: now === 'Refused' ? 'Validate' : 'AllocateAddress', note: `${regarding.kind} ${now === 'Refused' ? 'refused' : 'address conflict'}: ${c.message}` });
    } else if (old && refusal(old) && c.status === 'True') {
      out.push({ regarding, type: 'Normal', reason: 'Accepted', action: 'Validate', note: `${regarding.kind} accepted: ${c.message}` });
    }
  }
  return out;
}
