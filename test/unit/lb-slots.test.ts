// The node's VIP slot budget (daemon/lb/vip-slots.ts): a thousand Services in the cluster cost a node
// nothing until its LB pods serve them; past the budget a VIP is refused on this node by name and takes
// no slot from a VIP that holds one; slots come back after the release delay, at once for a gone Service,
// and a restart adopts the slots left in the pinned maps.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { VipSlots, overflowProblem } from '../../daemon/lb/vip-slots';

const vips = Array.from({ length: 1000 }, (_, i) => `198.51.${100 + (i >> 8)}.${i & 255}`);
const all = new Set(vips);

test('1,000 Services, LB pods here for 16 of them: all 16 get a slot, nothing overflows, the others cost nothing', () => {
  const s = new VipSlots(16);
  const ch = s.apply(vips.slice(0, 16), all, 0);
  assert.is(ch.assigned.length, 16);
  assert.equal(ch.overflow, []);
  assert.equal(new Set(ch.assigned.map((a) => a.slot)).size, 16, 'distinct slots');
  assert.is(s.used, 16);
  for (const v of vips.slice(16)) assert.is(s.slotOf(v), undefined);
});

test('past the budget: the newcomers overflow by name, and no VIP that holds a slot loses it', () => {
  const s = new VipSlots(4);
  s.apply(vips.slice(0, 4), all, 0);
  const before = vips.slice(0, 4).map((v) => s.slotOf(v));
  // The newcomers sort first: they still take nothing from the holders.
  const ch = s.apply([vips[10], vips[11], ...vips.slice(0, 4)], all, 1000);
  assert.equal(ch.overflow, [vips[10], vips[11]]);
  assert.equal(ch.released, []);
  assert.equal(vips.slice(0, 4).map((v) => s.slotOf(v)), before);
  const p = overflowProblem('n7', vips[10], 4);
  assert.match(p, /node n7/);
  assert.match(p, new RegExp(`VIP ${vips[10].replace(/\./g, '\\.')}`));
  assert.match(p, /--lb-max-vips/);
});

test('a VIP no local LB pod serves keeps its slot for the release delay, then frees it for a waiting one', () => {
  const s = new VipSlots(2, 60_000);
  s.apply([vips[0], vips[1]], all, 0);
  let ch = s.apply([vips[1], vips[2]], all, 30_000);
  assert.equal(ch.overflow, [vips[2]], 'vips[0] still within its delay');
  assert.is(s.slotOf(vips[0]), 0);
  ch = s.apply([vips[1], vips[2]], all, 60_001);
  assert.equal(ch.released, [{ vip: vips[0], slot: 0 }]);
  assert.equal(ch.assigned, [{ vip: vips[2], slot: 0 }]);
  assert.equal(ch.overflow, []);
});

test('an LB pod back within the delay finds its VIP in the same slot', () => {
  const s = new VipSlots(4, 60_000);
  s.apply([vips[0], vips[1]], all, 0);
  s.apply([vips[1]], all, 10_000);
  const ch = s.apply([vips[0], vips[1]], all, 20_000);
  assert.equal(ch.assigned, []);
  assert.is(s.slotOf(vips[0]), 0);
});

test('a VIP whose Service is gone gives its slot back at once', () => {
  const s = new VipSlots(4);
  s.apply([vips[0], vips[1]], all, 0);
  const ch = s.apply([vips[1]], new Set([vips[1]]), 1);
  assert.equal(ch.released, [{ vip: vips[0], slot: 0 }]);
});

test('a restart adopts the pinned slots (out-of-range and clashing ones ignored); newcomers fill the gaps', () => {
  const s = new VipSlots(4);
  s.adopt(new Map([[vips[5], 2], [vips[6], 9], [vips[7], 2]]), 0);
  assert.is(s.slotOf(vips[5]), 2);
  assert.is(s.slotOf(vips[6]), undefined);
  assert.is(s.slotOf(vips[7]), undefined);
  const ch = s.apply([vips[1], vips[5], vips[2]], all, 1);
  assert.equal(ch.assigned, [{ vip: vips[1], slot: 0 }, { vip: vips[2], slot: 1 }]);
  assert.throws(() => new VipSlots(0), /not a positive whole number/);
});

test.run();
