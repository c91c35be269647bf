// The node registry (daemon/common/node-registry.ts) on a real redis-server: FoU receivers accept only
// registered node addresses, so the list a node holds must not shrink for a moment when the store restarts
// empty and the nodes register again one by one; a node that really left is dropped after LEFT_GRACE_MS.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import Redis from 'ioredis';
import { LEFT_GRACE_MS, NodeRegistry, nodeValue, readNode } from '../../daemon/common/node-registry';
import { isCanonicalIp } from '../../daemon/common/store-record';
import { startRedis } from '../lib/redis';

// A registration is sent again only once a tenth of its TTL has passed (member-registry.ts): a short TTL and a
// wait of more than that before each beat whose answer matters. Grace times are given as nowMs.
const TTL = 3000;
const sleep = () => new Promise((r) => setTimeout(r, TTL / 10 + 50));

async function withRegistries(fn: (raw: Redis, nodes: Record<'a' | 'b' | 'c', NodeRegistry>) => Promise<void>): Promise<void> {
  const redis = await startRedis();
  const clients = [0, 1, 2, 3].map(() => new Redis({ path: redis.socketPath }));
  try {
    const [raw, ca, cb, cc] = clients;
    await fn(raw, {
      a: new NodeRegistry(ca, 'reg:', 'a', '10.0.0.1'),
      b: new NodeRegistry(cb, 'reg:', 'b', '10.0.0.2'),
      c: new NodeRegistry(cc, 'reg:', 'c', '10.0.0.3'),
    });
  } finally {
    for (const c of clients) c.disconnect();
    await redis.stop();
  }
}

test('the store restarted empty: a node that registers first still lists the others until they are back', async () => {
  await withRegistries(async (raw, { a, b, c }) => {
    const t0 = Date.now();
    await b.beat(TTL, t0);
    await c.beat(TTL, t0);
    assert.equal(await a.beat(TTL, t0), ['10.0.0.1', '10.0.0.2', '10.0.0.3']);
    await raw.flushall();
    await sleep();
    // a beats first after the wipe: only a is registered, and b and c are still listed.
    assert.equal(await a.beat(TTL, t0 + 1000), ['10.0.0.1', '10.0.0.2', '10.0.0.3'], 'no registered node dropped at the wipe');
    assert.is(await raw.hlen('{reg:nodes}'), 1, 'only a is registered now');
    // b registers again; c does not (it went while the store was away).
    await b.beat(TTL, t0 + 1500);
    await sleep();
    assert.equal(await a.beat(TTL, t0 + 2000), ['10.0.0.1', '10.0.0.2', '10.0.0.3']);
    assert.equal(await a.beat(TTL, t0 + 1000 + LEFT_GRACE_MS - 1), ['10.0.0.1', '10.0.0.2', '10.0.0.3'], 'c kept within the grace');
    assert.equal(await a.beat(TTL, t0 + 1000 + LEFT_GRACE_MS), ['10.0.0.1', '10.0.0.2'], 'c dropped once the grace is over');
  });
});

test('a node that leaves is dropped after the grace; one that comes back within it never was', async () => {
  await withRegistries(async (_raw, { a, b, c }) => {
    const t0 = Date.now();
    await b.beat(TTL, t0);
    await c.beat(TTL, t0);
    const first = await a.beat(TTL, t0);
    assert.equal(first, ['10.0.0.1', '10.0.0.2', '10.0.0.3']);
    assert.is(await a.beat(TTL, t0 + 100), first, 'the same array while nothing changed (callers compare by identity)');
    await b.leave();
    await c.leave();
    await sleep();
    assert.equal(await a.beat(TTL, t0 + 200), ['10.0.0.1', '10.0.0.2', '10.0.0.3']);
    await c.beat(TTL, t0 + 300);
    await sleep();
    assert.equal(await a.beat(TTL, t0 + 200 + LEFT_GRACE_MS), ['10.0.0.1', '10.0.0.3'], 'b dropped, c (back) kept');
    assert.equal(await a.beat(TTL, t0 + 400 + 2 * LEFT_GRACE_MS), ['10.0.0.1', '10.0.0.3']);
  });
});

test('IPv6 node addresses: registered beside the address, listed only when asked for, dropped after the grace like the address', async () => {
  const redis = await startRedis();
  const clients = [0, 1, 2].map(() => new Redis({ path: redis.socketPath }));
  try {
    const [raw, ca, cb] = clients;
    const a = new NodeRegistry(ca, 'reg:', 'a', '10.0.0.1', 'fd00:18::11');
    const b = new NodeRegistry(cb, 'reg:', 'b', '10.0.0.2', 'fd00:18::12');
    const t0 = Date.now();
    await b.beat(TTL, t0);
    assert.equal(await a.beat(TTL, t0), ['10.0.0.1', '10.0.0.2'], 'the IPv4 list as before (egress FoU allow-lists read it)');
    assert.equal(a.addresses({ ipv6: true }), ['10.0.0.1', '10.0.0.2', 'fd00:18::11', 'fd00:18::12']);
    assert.is(a.addresses({ ipv6: true }), a.addresses({ ipv6: true }), 'the same array while nothing changed');
    // The registration as a release before reads it: address and release, address6 ignored.
    const value = JSON.parse((await raw.hget('{reg:nodes}', 'a'))!);
    assert.is(value.address6, 'fd00:18::11');
    assert.is(value.address, '10.0.0.1');
    await b.leave();
    await sleep();
    assert.equal(await a.beat(TTL, t0 + 1000), ['10.0.0.1', '10.0.0.2'], 'b kept within the grace');
    assert.equal(a.addresses({ ipv6: true }), ['10.0.0.1', '10.0.0.2', 'fd00:18::11', 'fd00:18::12']);
    assert.equal(await a.beat(TTL, t0 + 1000 + LEFT_GRACE_MS), ['10.0.0.1']);
    assert.equal(a.addresses({ ipv6: true }), ['10.0.0.1', 'fd00:18::11'], 'b\'s IPv6 address dropped with it');
  } finally {
    for (const c of clients) c.disconnect();
    await redis.stop();
  }
});

test('readNode: a garbled address6 is left out, the node\'s address kept', () => {
  assert.equal(readNode('k', 'n', JSON.stringify({ address: '10.0.0.1', release: '0.3.0', address6: '10.0.0.9' })), { address: '10.0.0.1', release: '0.3.0' });
  assert.equal(readNode('k', 'n', JSON.stringify({ address: '10.0.0.1', address6: 'nope' })), { address: '10.0.0.1' });
  assert.equal(readNode('k', 'n', JSON.stringify({ address: '10.0.0.1', address6: 'fd00:18::11' })), { address: '10.0.0.1', address6: 'fd00:18::11' });
});

test('a node on an IPv6 underlay registers its address in brackets, which 0.1.0\'s check refuses; it reads back plain', () => {
  const v = nodeValue('fd00:18::11', '0.2.0', 'fd00:18::11');
  assert.is(v, '{"address":"[fd00:18::11]","release":"0.2.0","address6":"fd00:18::11"}');
  assert.equal(readNode('k', 'n', v), { address: 'fd00:18::11', release: '0.2.0', address6: 'fd00:18::11' });
  // 0.1.0 reads "address" with isCanonicalIp and refuses the registration when it is not one.
  assert.not.ok(isCanonicalIp(JSON.parse(v).address));
  assert.is(JSON.parse(nodeValue('10.0.0.1', '0.2.0', undefined)).address, '10.0.0.1', 'an IPv4 node writes as before');
  assert.is(readNode('k', 'n', JSON.stringify({ address: 'fd00:18::11' })), undefined, 'an unbracketed IPv6 address is refused');
});

test.run();
