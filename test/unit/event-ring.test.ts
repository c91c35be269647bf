// The shared-memory ring between the conntrack event reader worker and the main thread: the producer is
// the very source text the worker runs. Order, content, wrap-around, full, and wake-up accounting.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { createRing, ringDrain, WAKE, type Ring } from '../../daemon/conntrack/event-ring';
import { ringPut } from './ctnetlink-fixtures';

function datagram(i: number, len: number): Buffer {
  const b = Buffer.alloc(len);
  for (let k = 0; k < len; k++) b[k] = (i * 31 + k) & 0xff;
  return b;
}

function drainAll(ring: Ring, into: Buffer[]): number {
  return ringDrain(ring, (d) => into.push(Buffer.from(d))).count;
}

test('datagrams come out in order and intact across many wrap-arounds; a full ring refuses, then takes again', () => {
  const ring = createRing(1024);
  const sent: Buffer[] = [];
  const got: Buffer[] = [];
  let seed = 7;
  const rnd = (n: number) => (seed = (seed * 1103515245 + 12345) & 0x7fffffff) % n;
  let fulls = 0;
  for (let i = 0; i < 5000; i++) {
    const d = datagram(i, 1 + rnd(200));
    let put = ringPut(ring.ctrl, ring.data, d, d.length);
    if (put === 'full') {
      fulls++;
      drainAll(ring, got);
      put = ringPut(ring.ctrl, ring.data, d, d.length);
    }
    assert.is.not(put, 'full', `datagram ${i} fits an empty ring`);
    sent.push(d);
    if (rnd(5) === 0) drainAll(ring, got);
  }
  drainAll(ring, got);
  assert.ok(fulls > 0, 'the ring filled up at times');
  assert.is(got.length, sent.length);
  for (let i = 0; i < sent.length; i++) assert.ok(got[i].equals(sent[i]), `datagram ${i} intact`);
});

test('one wake-up per drain: the producer wakes only when the consumer has cleared WAKE', () => {
  const ring = createRing(4096);
  const d = datagram(1, 40);
  assert.is(ringPut(ring.ctrl, ring.data, d, d.length), 'woke');
  assert.is(ringPut(ring.ctrl, ring.data, d, d.length), 'ok');
  assert.is(Atomics.load(ring.ctrl, WAKE), 1);
  const got: Buffer[] = [];
  assert.is(drainAll(ring, got), 2);
  assert.is(Atomics.load(ring.ctrl, WAKE), 0);
  assert.is(ringPut(ring.ctrl, ring.data, d, d.length), 'woke', 'after a drain the next datagram wakes again');
  assert.is(drainAll(ring, got), 1);
  assert.is(drainAll(ring, got), 0, 'empty');
});

test('a bounded drain takes at most max and says more are waiting', () => {
  const ring = createRing(4096);
  for (let i = 0; i < 5; i++) ringPut(ring.ctrl, ring.data, datagram(i, 10), 10);
  const got: Buffer[] = [];
  assert.equal(ringDrain(ring, (d) => got.push(Buffer.from(d)), 3), { count: 3, more: true });
  assert.equal(ringDrain(ring, (d) => got.push(Buffer.from(d)), 3), { count: 2, more: false });
  assert.ok(got.every((g, i) => g.equals(datagram(i, 10))));
});

test('a datagram larger than the ring is refused, never written over unread data', () => {
  const ring = createRing(256);
  const small = datagram(2, 100);
  assert.is.not(ringPut(ring.ctrl, ring.data, small, small.length), 'full');
  const big = datagram(3, 300);
  assert.is(ringPut(ring.ctrl, ring.data, big, big.length), 'full');
  const got: Buffer[] = [];
  drainAll(ring, got);
  assert.ok(got[0].equals(small));
});

test.run();
