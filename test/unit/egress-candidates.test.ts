// Candidate order for floating addresses (deterministic, node-diverse) and the ownership decision table.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { decide, handoverTarget, orderCandidates, placeAddresses, scoreOf, supersedes } from '../../daemon/egress/candidates';
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
  const base = { candidates: cands, alive: all, ownerAlive: true, holdingLocally: false, inSync: new Set<string>(), now: 10_000 };
  // Nobody owns it: only the node hosting the first live candidate claims.
  assert.equal(decide({ ...base, own: own('', 0), ownerAlive: false, localPods: new Set([first.pod]) }), { action: 'claim', pod: first.pod, cause: 'initial' });
  assert.equal(decide({ ...base, own: own('', 0), ownerAlive: false, localPods: new Set([second.pod]) }), { action: 'keep' });
  // A live owner keeps it, even when it is not the first candidate (no flapping back, no preemption).
  assert.equal(decide({ ...base, own: own(second.pod), localPods: new Set([first.pod]) }), { action: 'keep' });
  // The owner's node is down: the next live candidate claims.
  const down = (g: GatewayInfo) => g.pod !== first.pod;
  const d = decide({ ...base, own: own(first.pod), ownerAlive: false, alive: down, localPods: new Set([second.pod]) });
  assert.equal(d, { action: 'claim', pod: second.pod, cause: `failover: owner ${first.pod} on ${first.node} is down` });
  // A node that still holds the address locally but is not the owner any more stands down.
  assert.equal(decide({ ...base, own: own(second.pod, 4), localPods: new Set([first.pod]), holdingLocally: true }), { action: 'standDown' });
  // No live candidate at all: nothing to do.
  assert.equal(decide({ ...base, own: own(first.pod), ownerAlive: false, alive: () => false, localPods: new Set([second.pod]) }), { action: 'keep' });
});

test('in-sync candidates win over better-ranked ones that are not in sync', () => {
  const cands = orderCandidates('198.51.100.1', G);
  const [first, second, third] = cands;
  const own = { egress: 'e', address: '198.51.100.1', owner: first.pod, epoch: 7 };
  const base = { own, candidates: cands, ownerAlive: false, holdingLocally: false, now: 10_000, ownerDownSince: 10_000, alive: (g: GatewayInfo) => g.pod !== first.pod };
  const inSync = new Set([third.node]);
  // The second candidate is not in sync, the third is: the third claims, the second keeps out.
  assert.equal(decide({ ...base, inSync, localPods: new Set([third.pod]) }).action, 'claim');
  assert.equal(decide({ ...base, inSync, localPods: new Set([second.pod]) }), { action: 'keep' });
});

test('an out-of-sync candidate that alone sees the owner down holds off, then claims if nobody in sync is live', () => {
  const cands = orderCandidates('198.51.100.1', G);
  const [first, second] = cands;
  const own = { egress: 'e', address: '198.51.100.1', owner: first.pod, epoch: 7 };
  // The owner reported only its own other node in sync… which is down too from here (or was never a candidate).
  const inSync = new Set(['n-elsewhere']);
  const base = { own, candidates: cands, ownerAlive: false, holdingLocally: false, inSync, localPods: new Set([second.pod]), alive: (g: GatewayInfo) => g.pod !== first.pod };
  assert.equal(decide({ ...base, ownerDownSince: 10_000, now: 10_400 }), { action: 'wait', pod: second.pod, untilMs: 11_000 });
  const later = decide({ ...base, ownerDownSince: 10_000, now: 11_000 });
  assert.is(later.action, 'claim');
  assert.match((later as { cause: string }).cause, /no in-sync candidate is live/);
  // Without any in-sync report (sync off, or a new owner whose standbys are still resyncing) nobody waits.
  assert.is(decide({ ...base, inSync: new Set(), ownerDownSince: 10_000, now: 10_001 }).action, 'claim');
});

test('a joining candidate never takes the address from a live owner', () => {
  const cands = orderCandidates('198.51.100.1', G);
  const [first, second] = cands;
  // The joiner ranks first; the owner (second) is alive: keep, whatever the joiner's sync state.
  const own = { egress: 'e', address: '198.51.100.1', owner: second.pod, epoch: 2 };
  for (const inSync of [new Set<string>(), new Set([first.node])]) {
    assert.equal(decide({ own, candidates: cands, localPods: new Set([first.pod]), alive: () => true, ownerAlive: true, holdingLocally: false, inSync, now: 0 }), { action: 'keep' });
  }
});

test('supersedes: larger epoch, then the better-scored owner on a tie', () => {
  const a = { address: '198.51.100.1', owner: 'ns/a1', epoch: 5 };
  const b = { address: '198.51.100.1', owner: 'ns/b1', epoch: 5 };
  assert.ok(supersedes({ ...a, epoch: 6 }, b));
  assert.not.ok(supersedes({ ...a, epoch: 4 }, b));
  assert.not.ok(supersedes(a, a), 'the same decision does not supersede itself');
  // Exactly one of two same-epoch decisions wins, and every node agrees which.
  assert.is(supersedes(a, b), !supersedes(b, a));
  assert.is(supersedes(a, b), scoreOf(a.address, a.owner) > scoreOf(b.address, b.owner));
  assert.ok(supersedes(a, { ...a, owner: '' }), 'any owner supersedes "nobody" at the same epoch');
});

test('handover target: in-sync first, then candidate order, never the pod handing over', () => {
  const cands = orderCandidates('198.51.100.1', G);
  const [first, second, third] = cands;
  assert.is(handoverTarget(cands, first.pod, () => true, new Set())?.pod, second.pod);
  assert.is(handoverTarget(cands, first.pod, () => true, new Set([third.node]))?.pod, third.pod);
  assert.is(handoverTarget(cands, first.pod, (g) => g.pod === first.pod, new Set()), undefined);
});

test('handover target, in sync only: none when no live candidate is in sync (the holder keeps the address), else the in-sync one', () => {
  const cands = orderCandidates('198.51.100.1', G);
  const [first, second, third] = cands;
  assert.is(handoverTarget(cands, first.pod, () => true, new Set(), undefined, true), undefined);
  assert.is(handoverTarget(cands, first.pod, () => true, new Set([third.node]), undefined, true)?.pod, third.pod);
  assert.is(handoverTarget(cands, first.pod, (g) => g.node !== third.node, new Set([third.node]), undefined, true), undefined, 'an in-sync node that is down is no target');
  assert.is(handoverTarget(cands, first.pod, () => true, new Set(), { of: () => 0, cap: () => 9 }, true), undefined);
  assert.is(handoverTarget(cands, first.pod, () => true, new Set([second.node]), { of: () => 0, cap: () => 9 }, true)?.pod, second.pod);
});

const ADDRS = ['198.51.100.1', '198.51.100.2', '198.51.100.3'];
const none = new Set<string>();
const unowned = (a: string) => ({ address: a, own: { egress: 'e', address: a, owner: '', epoch: 0 }, ownerAlive: false, inSync: none });
const ownedBy = (a: string, g: GatewayInfo, alive = true) => ({ address: a, own: { egress: 'e', address: a, owner: g.pod, epoch: 2, ownerNode: g.node }, ownerAlive: alive, inSync: none });

test('placement: 3 addresses over 3 gateway nodes land on 3 distinct nodes, whatever the input order', () => {
  const gws = [gw('ns/a1', 'n1'), gw('ns/b1', 'n2'), gw('ns/c1', 'n3')];
  const p = placeAddresses(ADDRS.map(unowned), gws, () => true, () => Infinity);
  assert.is(new Set([...p.values()].map((g) => g!.node)).size, 3);
  const q = placeAddresses([...ADDRS].reverse().map(unowned), [...gws].reverse(), () => true, () => Infinity);
  assert.equal([...q].sort(), [...p].sort(), 'every tetherd computes the same placement');
});

test('placement: over 2 nodes with cap 2 → 2 + 1; with cap 1 the third address has no owner', () => {
  const gws = [gw('ns/a1', 'n1'), gw('ns/a2', 'n1'), gw('ns/b1', 'n2'), gw('ns/b2', 'n2')];
  const p = placeAddresses(ADDRS.map(unowned), gws, () => true, () => 2);
  const perNode = [...p.values()].reduce((m, g) => m.set(g!.node, (m.get(g!.node) ?? 0) + 1), new Map<string, number>());
  assert.equal([...perNode.values()].sort(), [1, 2]);
  const q = placeAddresses(ADDRS.map(unowned), gws, () => true, () => 1);
  assert.is([...q.values()].filter((g) => g === undefined).length, 1, 'cap 1 on 2 nodes: one address stays without owner');
  // A node-level cap: n1 takes at most 1.
  const r = placeAddresses(ADDRS.map(unowned), gws, () => true, (node) => (node === 'n1' ? 1 : 16));
  assert.is([...r.values()].filter((g) => g?.node === 'n1').length, 1);
});

test('placement: a lost node moves only its address, to the least-loaded live node; nothing flaps back when it returns', () => {
  const [a, b, c, d] = [gw('ns/a1', 'n1'), gw('ns/b1', 'n2'), gw('ns/c1', 'n3'), gw('ns/d1', 'n4')];
  // n1 holds .1, n2 holds .2 and .3 (cap allows 2), n3 and n4 hold nothing of this Egress.
  const state = [ownedBy(ADDRS[0], a, false), ownedBy(ADDRS[1], b), ownedBy(ADDRS[2], b)];
  const alive = (g: GatewayInfo) => g.node !== 'n1';
  const p = placeAddresses(state, [a, b, c, d], alive, () => 2);
  assert.equal([...p.keys()], [ADDRS[0]], 'only the lost node\'s address is placed');
  assert.ok(['n3', 'n4'].includes(p.get(ADDRS[0])!.node), `to an empty node, not loaded n2: ${p.get(ADDRS[0])!.node}`);
  // n1 returns: every address has a live owner, so nothing moves.
  const back = placeAddresses([ownedBy(ADDRS[0], p.get(ADDRS[0])!), ownedBy(ADDRS[1], b), ownedBy(ADDRS[2], b)], [a, b, c, d], () => true, () => 2);
  assert.is(back.size, 0);
});

test('placement: in-sync candidates before load', () => {
  const [a, b, c] = [gw('ns/a1', 'n1'), gw('ns/b1', 'n2'), gw('ns/c1', 'n3')];
  const lost = { ...ownedBy(ADDRS[0], a, false), inSync: new Set(['n2']) };
  const p = placeAddresses([lost, ownedBy(ADDRS[1], b)], [a, b, c], (g) => g.node !== 'n1', () => 16);
  assert.is(p.get(ADDRS[0])!.node, 'n2', 'the in-sync node, although it holds more');
});

test('handover respects load and caps', () => {
  const [a, b, c] = [gw('ns/a1', 'n1'), gw('ns/b1', 'n2'), gw('ns/c1', 'n3')];
  const t = handoverTarget([b, c], a.pod, () => true, new Set(), { of: (n) => (n === 'n2' ? 1 : 0), cap: () => 1 });
  assert.is(t?.node, 'n3', 'n2 is at its cap');
  assert.is(handoverTarget([b], a.pod, () => true, new Set(), { of: () => 1, cap: () => 1 }), undefined);
});

test.run();
