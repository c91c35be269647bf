// What the periodic store reads cost on the server (commands inside scripts included, as the scale bench
// counts them) and that the cheaper forms still see what they are for: the generation polled with one GET
// while unchanged (a wipe still noticed and marked), a registration refreshed without reading its value
// back (re-created after a wipe, a garbled own entry repaired), and not before 0.3 of its TTL.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { Writable } from 'node:stream';
import Redis from 'ioredis';
import { makeLogger, setLogger } from '../../daemon/log';
import { ClusterAddresses } from '../../ipam/cluster-addresses';
import { RedisStore } from '../../ipam/store/redis-store';
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
  raw.disconnect();
  await redis.stop();
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

test.run();
