// The node registry (daemon/common/node-registry.ts) on a real redis-server: FoU receivers accept only
// registered node addresses, so the list a node holds must not shrink for a moment when the store restarts
// empty and the nodes register again one by one; a node that really left is dropped after LEFT_GRACE_MS.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import Redis from 'ioredis';
import { LEFT_GRACE_MS, NODE_ADDRESS6_SUFFIX, NodeRegistry, listNodes } from '../../daemon/common/node-registry';
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

test('a node\'s IPv6 address for outer IPv6 is a member of its own ("<node>/ipv6"), listed with the node addresses', async () => {
  const redis = await startRedis();
  const clients = [0, 1, 2].map(() => new Redis({ path: redis.socketPath }));
  try {
    const a = new NodeRegistry(clients[0], 'reg:', 'a', '10.0.0.1');
    const a6 = new NodeRegistry(clients[1], 'reg:', `a${NODE_ADDRESS6_SUFFIX}`, 'fd00:18::11');
    const b = new NodeRegistry(clients[2], 'reg:', 'b', '10.0.0.2');
    await a6.beat(TTL);
    await b.beat(TTL);
    assert.equal(await a.beat(TTL), ['10.0.0.1', '10.0.0.2', 'fd00:18::11']);
    assert.equal((await listNodes(clients[2], 'reg:')).sort(), ['10.0.0.1', '10.0.0.2', 'fd00:18::11']);
  } finally {
    for (const c of clients) c.disconnect();
    await redis.stop();
  }
});

test.run();
