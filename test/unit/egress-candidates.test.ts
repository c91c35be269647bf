// Candidate order for floating addresses (deterministic, node-diverse) and the ownership decision table.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { decide, orderCandidates } from '../../daemon/egress/candidates';
import type { GatewayInfo } from '../../daemon/egress/ownership-store';

const gw = (pod: string, node: string): GatewayInfo => ({ pod, node, nodeAddress: `198.18.0.${node.slice(1)}`, podIp: '10.0.0.1' });
const G = [gw('ns/a1', 'n1'), gw('ns/a2', 'n1'), gw('ns/b1', 'n2'), gw('ns/c1', 'n3'), gw('ns/b2', 'n2')];

test('order is deterministic, independent of input order, and node-diverse first', () => {
  const o1 = orderCandidates('198.51.100.1', G);
  const o2 = orderCandidates('198.51.100.1', [...G].reverse());
  assert.equal(o1.map((g) => g.pod), o2.map((g) => g.pod));
  assert.is(new Set(o1.slice(0, 3).map((g) => g.node)).size, 3, `first three on three nodes: ${o1.map((g) => g.node)}`);
  assert.is(o1.length, 5);
});

test('different addresses spread their first candidate over gateways', () => {
  const firsts = new Set(Array.from({ length: 32 }, (_, i) => orderCandidates(`198.51.100.${i}`, G)[0].pod));
  assert.ok(firsts.size >= 3, `only ${[...firsts]}`);
});

test('decision table', () => {
  const cands = orderCandidates('198.51.100.1', G);
  const [first, second] = cands;
  const own = (owner: string, epoch = 3) => ({ egress: 'e', address: '198.51.100.1', owner, epoch });
  const all = () => true;
  // Nobody owns it: only the node hosting the first live candidate claims.
  assert.equal(decide(own('', 0), cands, new Set([first.pod]), all, false), { action: 'claim', pod: first.pod, expectEpoch: 0, cause: 'initial' });
  assert.equal(decide(own('', 0), cands, new Set([second.pod]), all, false), { action: 'keep' });
  // A live owner keeps it, even when it is not the first candidate (no flapping back).
  assert.equal(decide(own(second.pod), cands, new Set([first.pod]), all, false), { action: 'keep' });
  // The owner's node is down: the next live candidate claims with the epoch it saw.
  const d = decide(own(first.pod), cands, new Set([second.pod]), (g) => g.pod !== first.pod, false);
  assert.equal(d, { action: 'claim', pod: second.pod, expectEpoch: 3, cause: `failover: owner ${first.pod} on ${first.node} is down` });
  // A node that still holds the address locally but is not the owner any more stands down.
  assert.equal(decide(own(second.pod, 4), cands, new Set([first.pod]), all, true), { action: 'standDown' });
  // No live candidate at all: nothing to do.
  assert.equal(decide(own(first.pod), cands, new Set([second.pod]), () => false, false), { action: 'keep' });
});

test.run();
