// What the periodic store reads cost on the server (commands inside scripts included, as the scale bench
// counts them) and that the cheaper forms still see what they are for: the generation polled with one GET
// while unchanged (a wipe still noticed and marked), a registration refreshed without reading its value
// back (re-created after a wipe, a garbled own entry repaired), and not before 0.3 of its TTL.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { Writable } from 'node:stream';
import Redis from 'ioredis';
import { makeLogger, setLogger } from '../../lib/log';
import { ClusterAddresses } from '../../ipam/cluster-addresses';
import { RedisStore } from '../../ipam/store/redis-store';
import { validatePools } from '../../ipam/pool';
import { connectLbStore } from '../../daemon/lb/lb-store';
import { LbShared } from '../../daemon/lb/lb-state';
import { VipAddresses } from '../../daemon/lb/vip-addresses';
import type { ResolvedLoadBalancer } from '../../daemon/lb/lb-spec';
import type { AttachService } from '../../daemon/pod/attach-service';
import { MemberView } from '../../daemon/common/member-registry';
import { startRedis, type TestRedis } from '../lib/redis';
import { serverCommands, serverDelta, totalOf } from '../lib/redis-meter';

const quiet = makeLogger({ level: 'error', stream: new Writable({ write: (_c, _e, cb) => cb() }) });
setLogger(quiet);

const realNow = Date.now;
let skew = 0;
Date.now = () => realNow() + skew;

let redis: TestRedis;
let raw: Redis;
test.before(async () => {
  redis = await startRedis();
  raw = new Redis({ path: redis.socketPath });
});
test.after(async () => {
  raw?.disconnect();
  await redis?.stop();
});

async function cost(fn: () => Promise<unknown>): Promise<Record<string, number>> {
  const before = await serverCommands(raw);
  await fn();
  return serverDelta(before, await serverCommands(raw));
}

test('the store generation polled by a holder: one GET per look while unchanged; a wipe is still seen and marked as a restart', async () => {
  const store = await RedisStore.connect(redis.url, { keyPrefix: 'gen:' });
  try {
    const a = new ClusterAddresses([], store, quiet, { holdOffMs: 0 });
    const first = await a.generation();
    const d = await cost(async () => {
      for (let i = 0; i < 10; i++) assert.is(await a.generation(), first);
    });
    // Before: the generation script each time (EVALSHA, TIME and 3 GETs: 50 commands).
    assert.equal(d, { get: 10 }, `10 looks: ${JSON.stringify(d)}`);
    await raw.flushall();
    const second = await a.generation();
    assert.is.not(second, first, 'a wiped store has a new generation');
    const g = await store.generation();
    assert.is(g.token, second);
    assert.ok(g.restarted, 'marked as a restart (this node had seen the one before)');
  } finally {
    await store.close();
  }
});

test('a registration refreshed without reading its value back, at most every 0.3 of its TTL; re-created after a wipe; a garbled own entry repaired', async () => {
  const client = new Redis({ path: redis.socketPath });
  try {
    const base = '{reg:nodes}';
    const v = new MemberView<string>(client, base, (_m, r) => r);
    await v.beat('a', 'A', 5000);
    // Within 0.3 of the TTL nothing is sent.
    let d = await cost(() => v.beat('a', 'A', 5000));
    assert.equal(d, {}, `nothing sent within the refresh interval: ${JSON.stringify(d)}`);
    skew += 1600;
    d = await cost(() => v.beat('a', 'A', 5000));
    // Before: EVALSHA, TIME, GET, ZRANGEBYSCORE, ZADD and an HGET of the value (6) on every call.
    assert.equal(d, { evalsha: 1, get: 1, time: 1, zadd: 1, zrangebyscore: 1 }, `a refresh: ${JSON.stringify(d)}`);
    assert.ok(totalOf(d) <= 5);
    // A changed value goes at once, compared and written.
    d = await cost(() => v.beat('a', 'A2', 5000));
    assert.is(d.hset, 1, `changed value written at once: ${JSON.stringify(d)}`);
    assert.is(await raw.hget(base, 'a'), 'A2');
    // The store lost its data: the next refresh puts the entry back (the member was not in the set).
    await raw.flushall();
    skew += 1600;
    await v.beat('a', 'A2', 5000);
    assert.is(await raw.hget(base, 'a'), 'A2', 're-created after the wipe');
    // Someone garbles this node's own entry: repaired by a refresh within 30 s.
    await raw.hset(base, 'a', 'garbage');
    skew += 31_000;
    await v.beat('a', 'A2', 5000);
    assert.is(await raw.hget(base, 'a'), 'A2', 'garbled own entry repaired');
  } finally {
    client.disconnect();
  }
});

test('a Service\'s VIP asked for by a second node: answered without listing the pool (no reply that grows with it)', async () => {
  const pools = validatePools([{ apiVersion: 'tether.dev/v1alpha1', kind: 'AddressPool', metadata: { name: 'lb' }, spec: { usage: 'loadBalancer', ipv4: { cidr: '10.99.0.0/16' } } }]);
  const s1 = await RedisStore.connect(redis.url, { keyPrefix: 'vip:' });
  const s2 = await RedisStore.connect(redis.url, { keyPrefix: 'vip:' });
  try {
    const n1 = new ClusterAddresses(pools, s1, quiet, { holdOffMs: 0 });
    const n2 = new ClusterAddresses(pools, s2, quiet, { holdOffMs: 0 });
    for (let i = 0; i < 100; i++) await n1.allocate({ pool: 'lb', owner: `lb/ns/s${i}`, count: 1 });
    const want = (await n1.allocate({ pool: 'lb', owner: 'lb/ns/web', count: 1 })).addresses;
    let got: string[] = [];
    const d = await cost(async () => {
      got = (await n2.allocate({ pool: 'lb', owner: 'lb/ns/web', count: 1 })).addresses;
    });
    assert.equal(got, want, 'the same VIP on every node');
    // Before: the pool's whole address hash (HGETALL, 101 entries) read on every node for every Service.
    assert.not.ok(d.hgetall, `no listing of the pool: ${JSON.stringify(d)}`);
    // A new owner still gets a free address (listing the pool then).
    const fresh = (await n2.allocate({ pool: 'lb', owner: 'lb/ns/new', count: 1 })).addresses;
    assert.is(fresh.length, 1);
    assert.not.ok([...(await s1.listAddresses('lb'))].some(([a, o]) => a === fresh[0] && o !== 'lb/ns/new'), 'not anyone else\'s');
  } finally {
    await s1.close();
    await s2.close();
  }
});

test('a deleted Service\'s mappings and expirer lease are removed from the store, by the one node whose release freed its VIP', async () => {
  const pools = validatePools([{ apiVersion: 'tether.dev/v1alpha1', kind: 'AddressPool', metadata: { name: 'lb' }, spec: { usage: 'loadBalancer', ipv4: { cidr: '10.98.0.0/24' } } }]);
  const prefix = 'gone:';
  const nodes = await Promise.all([0, 1].map(async (i) => {
    const ipam = await RedisStore.connect(redis.url, { keyPrefix: prefix });
    const store = await connectLbStore(redis.url, { keyPrefix: prefix });
    const s = new LbShared({ node: { name: `n${i}`, address: `10.1.0.${i + 1}` }, pinDir: '/nonexistent', fouPort: 0, exportTable: 0, store, addresses: new ClusterAddresses(pools, ipam, quiet, { holdOffMs: 0 }), attach: {} as AttachService, logger: quiet });
    return { s, v: new VipAddresses(s, () => undefined), close: async () => { await store.connection.close(); await ipam.close(); } };
  }));
  try {
    const lb = { key: 'shop/web', vip: { pool: 'lb' } } as unknown as ResolvedLoadBalancer;
    for (const n of nodes) await n.v.apply(new Map([[lb.key, lb]]), new Set([lb.key]));
    const vip = nodes[0].s.vips.get(lb.key)!.vip!;
    assert.is(nodes[1].s.vips.get(lb.key)!.vip, vip);
    const store = nodes[0].s.o.store!;
    await store.mappings.claim(vip, [{ key: { vip, client: '192.0.2.7', vport: 0, cport: 0, proto: 0 }, target: '10.244.0.9' }]);
    assert.ok(await store.leases.take(vip, 'n0', 60_000));
    const keys = async () => (await raw.keys(`${prefix}lb:{${vip}*`)).sort();
    assert.ok((await keys()).length >= 3, `mappings and lease stored: ${await keys()}`);
    // The Service is deleted: every node releases; the first one's release frees the VIP and drops its keys.
    const before = await serverCommands(raw);
    for (const n of nodes) await n.v.apply(new Map(), new Set());
    const d = serverDelta(before, await serverCommands(raw));
    assert.equal(await keys(), [], 'nothing of the VIP left in the store');
    // One node's drop: a DEL per bucket (16) and one for the lease (the releases' own scripts add a DEL
    // each), not one drop per node (34 and more).
    assert.ok(d.del >= 17 && d.del < 34, `dropped once: ${JSON.stringify(d)}`);
    assert.is(nodes[0].s.vips.size + nodes[1].s.vips.size, 0);
  } finally {
    for (const n of nodes) await n.close();
  }
});

test.run();
