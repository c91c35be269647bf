// Which gateway may own a floating address, in order: rendezvous hashing of (address, gateway pod) so
// every tetherd computes the same list without talking, reordered so consecutive candidates sit on
// different nodes (one node failing never takes out the first two). A live owner keeps its address; when
// it is gone, the first live candidate takes over, those the owner last reported in sync first.
import { createHash } from 'node:crypto';
import type { GatewayInfo, Ownership } from './ownership-store';

/**
 * The rendezvous score of a gateway pod for an address, as 16 hex digits (so strings compare like the
 * numbers, in TypeScript and in the store's Lua alike). Two decisions with the same epoch are settled by it.
 */
export function scoreOf(address: string, pod: string): string {
  return createHash('sha256').update(`${address}\0${pod}`).digest().subarray(0, 8).toString('hex');
}

/** True when ownership `a` supersedes `b`: a larger epoch, or the same epoch naming a better-scored owner. */
export function supersedes(a: Pick<Ownership, 'address' | 'owner' | 'epoch'>, b: Pick<Ownership, 'address' | 'owner' | 'epoch'>): boolean {
  if (a.epoch !== b.epoch) return a.epoch > b.epoch;
  if (a.owner === b.owner || !a.owner) return false;
  return !b.owner || scoreOf(a.address, a.owner) > scoreOf(b.address, b.owner);
}

export function orderCandidates(address: string, gateways: GatewayInfo[]): GatewayInfo[] {
  const scored = [...new Map(gateways.map((g) => [g.pod, g])).values()]
    .map((g) => ({ g, score: BigInt(`0x${scoreOf(address, g.pod)}`) }))
    .sort((a, b) => (a.score === b.score ? a.g.pod.localeCompare(b.g.pod) : a.score > b.score ? -1 : 1));
  const out: GatewayInfo[] = [];
  const rest = [...scored];
  // Round-robin over nodes in score order: the best pod of each node first, then the second best…
  while (rest.length) {
    const usedNodes = new Set<string>();
    for (let i = 0; i < rest.length; ) {
      if (usedNodes.has(rest[i].g.node)) {
        i++;
        continue;
      }
      usedNodes.add(rest[i].g.node);
      out.push(rest[i].g);
      rest.splice(i, 1);
    }
  }
  return out;
}

export type Decision =
  | { action: 'keep' }
  /** This node's gateway `pod` takes the address over (with the next epoch). */
  | { action: 'claim'; pod: string; cause: string }
  /** This node should claim but waits: it is not in sync with the owner and gives in-sync candidates time. */
  | { action: 'wait'; pod: string; untilMs: number }
  /** This node holds the address but must stop (the current ownership names someone else). */
  | { action: 'standDown' };

export interface DecisionInput {
  own: Ownership;
  /** In candidate order (orderCandidates). */
  candidates: GatewayInfo[];
  /** This node's gateway pods for the Egress. */
  localPods: Set<string>;
  /** This node's view of a candidate (BFD to its node, or the pod's presence when it is local). */
  alive: (g: GatewayInfo) => boolean;
  /** Whether the current owner is alive (its node by BFD, or the local pod); false when nobody owns. */
  ownerAlive: boolean;
  holdingLocally: boolean;
  /** Nodes the owner last reported as in sync (their conntrack state streamed and current). */
  inSync: ReadonlySet<string>;
  /** Since when this node has seen the owner dead (ms clock), for the out-of-sync hold-down. */
  ownerDownSince?: number;
  now: number;
  /** How long a candidate that is not in sync waits after the owner went down (default 1000 ms). */
  holdDownMs?: number;
  /**
   * The placement's choice for this address (placeAddresses: anti-affinity, per-node cap, load), which
   * replaces the first live candidate; `pod` undefined: no candidate may take it (every node at its cap).
   */
  choice?: { pod?: GatewayInfo };
}

const DEFAULT_HOLD_DOWN_MS = 1000;

/**
 * What this node should do for one address. Never takes an address from a live owner (a joining or
 * better-ranked candidate does not preempt: no flapping). With the owner gone, the live candidates the owner
 * reported in sync come first, in candidate order, then the others; a candidate that is not in sync claims
 * only after a hold-down, so a false "down" seen by one out-of-sync node alone does not move the address to
 * a gateway without the connections' state. Every tetherd computes the same answer from the same views.
 */
export function decide(i: DecisionInput): Decision {
  const { own, candidates, localPods } = i;
  if (i.holdingLocally && !localPods.has(own.owner)) return { action: 'standDown' };
  if (own.owner && i.ownerAlive) return { action: 'keep' };
  const live = candidates.filter((c) => c.pod !== own.owner && i.alive(c));
  const ranked = [...live.filter((c) => i.inSync.has(c.node)), ...live.filter((c) => !i.inSync.has(c.node))];
  const first = i.choice ? i.choice.pod : ranked[0];
  if (!first || !localPods.has(first.pod)) return { action: 'keep' };
  const owner = candidates.find((c) => c.pod === own.owner);
  const cause = own.owner === '' ? 'initial' : owner ? `failover: owner ${own.owner} on ${owner.node} is down` : `failover: owner ${own.owner} is no longer a live gateway`;
  // Out of sync while the owner had in-sync standbys: the owner may only look dead from here.
  if (own.owner && i.inSync.size && !i.inSync.has(first.node)) {
    const untilMs = (i.ownerDownSince ?? i.now) + (i.holdDownMs ?? DEFAULT_HOLD_DOWN_MS);
    if (i.now < untilMs) return { action: 'wait', pod: first.pod, untilMs };
    return { action: 'claim', pod: first.pod, cause: `${cause} (no in-sync candidate is live)` };
  }
  return { action: 'claim', pod: first.pod, cause };
}

/**
 * The candidate a holder hands an address to (planned handover): among live candidates below their node's
 * cap (when `load` is given), in-sync first, then the least loaded node, then candidate order. With
 * `inSyncOnly`, only an in-sync one: a candidate without the connections' state would break them, so the
 * holder keeps the address meanwhile (Election.handOverWhenInSync).
 */
export function handoverTarget(
  candidates: GatewayInfo[], exceptPod: string, alive: (g: GatewayInfo) => boolean, inSync: ReadonlySet<string>,
  load?: { of: (node: string) => number; cap: (node: string) => number }, inSyncOnly = false,
): GatewayInfo | undefined {
  let live = candidates.filter((c) => c.pod !== exceptPod && alive(c));
  if (load) live = rank(live.filter((c) => load.of(c.node) < load.cap(c.node)), inSync, load.of);
  return live.find((c) => inSync.has(c.node)) ?? (inSyncOnly ? undefined : live[0]);
}

/** Stable order: in-sync nodes first, then the least loaded, then the given (rendezvous) order. */
function rank(live: GatewayInfo[], inSync: ReadonlySet<string>, load: (node: string) => number): GatewayInfo[] {
  return live
    .map((g, i) => ({ g, i }))
    .sort((a, b) => Number(inSync.has(b.g.node)) - Number(inSync.has(a.g.node)) || load(a.g.node) - load(b.g.node) || a.i - b.i)
    .map((x) => x.g);
}

export interface PlacedAddress {
  address: string;
  own: Ownership;
  /** Whether this node sees the current owner alive. */
  ownerAlive: boolean;
  /** Nodes the owner last reported in sync. */
  inSync: ReadonlySet<string>;
}

/**
 * Where the addresses of one Egress without a live owner should go, computed the same way on every
 * tetherd from the same views: addresses with a live owner stay where they are (no preemption, so nothing
 * flaps back when a node returns) and count as their node's load; each address without one, in address
 * order, goes to a live candidate whose node is below its cap — in-sync nodes first, then the least loaded
 * node, then the address's rendezvous order — so the addresses of an Egress spread over as many nodes as
 * there are. An address no node may take (every node at its cap) maps to undefined.
 */
export function placeAddresses(
  addresses: PlacedAddress[], gateways: GatewayInfo[], alive: (g: GatewayInfo) => boolean, cap: (node: string) => number,
): Map<string, GatewayInfo | undefined> {
  const load = new Map<string, number>();
  const of = (node: string) => load.get(node) ?? 0;
  for (const a of addresses) if (a.own.owner && a.ownerAlive && a.own.ownerNode) load.set(a.own.ownerNode, of(a.own.ownerNode) + 1);
  const out = new Map<string, GatewayInfo | undefined>();
  for (const a of [...addresses].sort((x, y) => (x.address < y.address ? -1 : x.address > y.address ? 1 : 0))) {
    if (a.own.owner && a.ownerAlive) continue;
    const live = orderCandidates(a.address, gateways).filter((c) => c.pod !== a.own.owner && alive(c) && of(c.node) < cap(c.node));
    const chosen = rank(live, a.inSync, of)[0];
    out.set(a.address, chosen);
    if (chosen) load.set(chosen.node, of(chosen.node) + 1);
  }
  return out;
}
