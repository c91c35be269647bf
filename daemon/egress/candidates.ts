// Which gateway may own a floating address, in order: rendezvous hashing of (address, gateway pod) so
// every tetherd computes the same list without talking, reordered so consecutive candidates sit on
// different nodes (one node failing never takes out the first two). The first live candidate owns.
import { createHash } from 'node:crypto';
import type { GatewayInfo, Ownership } from './ownership-store';

export function orderCandidates(address: string, gateways: GatewayInfo[]): GatewayInfo[] {
  const scored = [...new Map(gateways.map((g) => [g.pod, g])).values()]
    .map((g) => ({ g, score: createHash('sha256').update(`${address}\0${g.pod}`).digest().readBigUInt64BE(0) }))
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
  /** This node's gateway `pod` should claim the address (CAS against `expectEpoch`). */
  | { action: 'claim'; pod: string; expectEpoch: number; cause: string }
  /** This node holds the address but must stop (a larger epoch names someone else). */
  | { action: 'standDown' };

/**
 * What this node should do for one address. `alive(g)` is this node's view (BFD to the gateway's node,
 * or the pod's presence when it is local). A live owner keeps the address even if a better-ranked
 * candidate returns: no flapping back.
 */
export function decide(
  own: Ownership,
  candidates: GatewayInfo[],
  localPods: Set<string>,
  alive: (g: GatewayInfo) => boolean,
  holdingLocally: boolean,
): Decision {
  const owner = candidates.find((c) => c.pod === own.owner);
  if (holdingLocally && !localPods.has(own.owner)) return { action: 'standDown' };
  if (owner && alive(owner)) return { action: 'keep' };
  const first = candidates.find((c) => alive(c));
  if (!first || !localPods.has(first.pod)) return { action: 'keep' };
  const cause = own.owner === '' ? 'initial' : owner ? `failover: owner ${own.owner} on ${owner.node} is down` : `failover: owner ${own.owner} is no longer a gateway`;
  return { action: 'claim', pod: first.pod, expectEpoch: own.epoch, cause };
}
