// RedisStore against a real redis-server: claim races over separate connections, address allocation
// semantics, key-prefix isolation, an outage (kill, hang, restart) and input validation.
import Redis from 'ioredis';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { captureLog } from '../lib/log-capture';
import { makeLogger, setLogger } from '../../lib/log';
import { ErrorCode, TetherError } from '../../lib/errors';
import { parseRedisUrl, RedisStore, storeKeys, untaggedKeys, type RedisStoreOptions } from '../../ipam/store/redis-store';
import { CLAIM_BLOCK, MARK_POOL } from '../../ipam/store/redis-scripts';
import { withRedis, type TestRedis } from '../lib/redis';

// The store logs every claim; keep test output readable unless asked for.
setLogger(makeLogger({ level: process.env.TETHER_LOG_LEVEL ?? 'error' }));

const POOL = 'floating-a';
const range = (n: number, from = 1) => Array.from({ length: n }, (_, i) => `192.0.2.${from + i}`);

/** A fresh Redis plus a store factory; every store and the Redis are closed even when the body throws. */
async function withStores(fn: (open: (opts?: RedisStoreOptions) => Promise<RedisStore>, redis: TestRedis) => Promise<void>): Promise<void> {
  await withRedis(async (redis) => {
    const stores: RedisStore[] = [];
    const open = async (opts?: RedisStoreOptions) => {
      const s = await RedisStore.connect(redis.url, opts);
      stores.push(s);
      return s;
    };
    try {
      await fn(open, redis);
    } finally {
      await Promise.all(stores.map((s) => s.close()));
    }
  });
}

async function rejectsWith(p: Promise<unknown>): Promise<TetherError> {
  try {
    await p;
  } catch (e) {
    assert.instance(e, TetherError);
    return e as TetherError;
  }
  assert.unreachable('expected a TetherError');
  throw new Error('unreachable');
}

function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

/** Retries `fn` until it stops throwing TRY_AGAIN_LATER (Redis coming back), up to `ms`. */
async function eventually<T>(fn: () => Promise<T>, ms = 5000): Promise<T> {
  const deadline = Date.now() + ms;
  for (;;) {
    try {
      return await fn();
    } catch (e) {
      if (!(e instanceof TetherError) || e.code !== ErrorCode.TryAgainLater || Date.now() > deadline) throw e;
      await sleep(50);
    }
  }
}

test('50 nodes race for one block over separate connections: exactly one wins', async () => {
  await withStores(async (open) => {
    const stores = await Promise.all(Array.from({ length: 50 }, () => open()));
    const block = '10.244.1.0/26';
    const results = await Promise.all(stores.map((s, i) => s.claimBlock('pods', block, `node-${i}`)));
    const winners = results.flatMap((won, i) => (won ? [i] : []));
    assert.is(winners.length, 1, `winners: ${winners}`);
    const w = winners[0];
    const loser = (w + 1) % 50;

    assert.equal(await stores[loser].listBlocks('pods'), new Map([[block, `node-${w}`]]));
    assert.is(await stores[w].claimBlock('pods', block, `node-${w}`), true, 'the winner claiming again keeps it');
    assert.is(await stores[loser].claimBlock('pods', block, `node-${loser}`), false, 'a loser claiming again still loses');
    assert.is(await stores[loser].releaseBlock('pods', block, `node-${loser}`), false, 'a loser cannot release it');
    assert.equal(await stores[0].listBlocks('pods'), new Map([[block, `node-${w}`]]));
    assert.is(await stores[w].releaseBlock('pods', block, `node-${w}`), true);
    assert.is(await stores[w].releaseBlock('pods', block, `node-${w}`), false, 'releasing twice is a no-op');
    assert.equal(await stores[0].listBlocks('pods'), new Map());
  });
});

test('a claim writes one JSON log line naming pool, block and node', async () => {
  await withStores(async (open) => {
    const store = await open();
    const lines = await captureLog(async () => {
      await store.claimBlock('pods', '10.244.2.0/26', 'node-a');
      await store.claimBlock('pods', '10.244.2.0/26', 'node-a'); // idempotent repeat: no second "claimed"
      await store.releaseBlock('pods', '10.244.2.0/26', 'node-a');
    });
    const pick = ({ message, pool, block, node }: Record<string, unknown>) => ({ message, pool, block, node });
    assert.equal(lines.map(pick), [
      { message: 'block claimed', pool: 'pods', block: '10.244.2.0/26', node: 'node-a' },
      { message: 'block released', pool: 'pods', block: '10.244.2.0/26', node: 'node-a' },
    ]);
  });
});

test('allocateAddresses: count from candidates, idempotent, exclusive, explicit conflicts, needCandidates', async () => {
  await withStores(async (open) => {
    const store = await open();
    const a = await store.allocateAddresses(POOL, 'egress/ns/a#0', { count: 3, candidates: range(6) });
    assert.equal(a, { ok: true, addresses: range(3) }, 'the first free candidates, in order');

    const again = await store.allocateAddresses(POOL, 'egress/ns/a#0', { count: 3, candidates: range(4, 10) });
    assert.equal(again, a, 'asking again, even with other candidates, returns the same addresses');
    const fewer = await store.allocateAddresses(POOL, 'egress/ns/a#0', { count: 1, candidates: [] });
    assert.equal(fewer, a, 'holding more than asked: all are returned, none released');

    const b = await store.allocateAddresses(POOL, 'egress/ns/b#0', { count: 2, candidates: range(6) });
    assert.equal(b, { ok: true, addresses: ['192.0.2.4', '192.0.2.5'] }, 'a second owner skips the first one\'s addresses');

    const before = await store.listAddresses(POOL);
    const conflict = await store.allocateAddresses(POOL, 'lb/ns/c', { explicit: ['192.0.2.9', '192.0.2.2'] });
    assert.equal(conflict, { ok: false, conflict: { address: '192.0.2.2', holder: 'egress/ns/a#0' } });
    assert.equal(await store.listAddresses(POOL), before, 'a conflict claims nothing, not even the free 192.0.2.9');

    const explicit = await store.allocateAddresses(POOL, 'lb/ns/c', { explicit: ['192.0.2.9', '192.0.2.8'] });
    assert.equal(explicit, { ok: true, addresses: ['192.0.2.9', '192.0.2.8'] });
    const explicitAgain = await store.allocateAddresses(POOL, 'lb/ns/c', { explicit: ['192.0.2.8'] });
    assert.equal(explicitAgain, explicit, 'explicit is idempotent and returns all the owner holds');

    // d holds 192.0.2.6 and wants 3: of the candidates only 192.0.2.7 is free, so nothing is claimed.
    assert.equal(await store.allocateAddresses(POOL, 'd', { count: 1, candidates: ['192.0.2.6'] }), { ok: true, addresses: ['192.0.2.6'] });
    const snapshot = await store.listAddresses(POOL);
    const need = await store.allocateAddresses(POOL, 'd', { count: 3, candidates: range(9) });
    assert.equal(need, { ok: false, needCandidates: true, have: ['192.0.2.6'] });
    assert.equal(await store.listAddresses(POOL), snapshot, 'needCandidates leaves nothing claimed by that call');
    assert.not.ok((await store.listAddresses(POOL)).has('192.0.2.7'));

    const owners = [...(await store.listAddresses(POOL)).entries()].sort();
    assert.equal(owners, [
      ['192.0.2.1', 'egress/ns/a#0'],
      ['192.0.2.2', 'egress/ns/a#0'],
      ['192.0.2.3', 'egress/ns/a#0'],
      ['192.0.2.4', 'egress/ns/b#0'],
      ['192.0.2.5', 'egress/ns/b#0'],
      ['192.0.2.6', 'd'],
      ['192.0.2.8', 'lb/ns/c'],
      ['192.0.2.9', 'lb/ns/c'],
    ]);
  });
});

test('addresses are stored in canonical form, so two spellings of one address conflict', async () => {
  await withStores(async (open) => {
    const store = await open();
    assert.equal(await store.allocateAddresses(POOL, 'x', { explicit: ['fd00:0:0::1'] }), { ok: true, addresses: ['fd00::1'] });
    assert.equal(await store.allocateAddresses(POOL, 'y', { explicit: ['FD00::0001'] }), { ok: false, conflict: { address: 'fd00::1', holder: 'x' } });
  });
});

test('20 owners race for one address each from 20 candidates over separate connections: all distinct', async () => {
  await withStores(async (open) => {
    const candidates = range(20);
    const stores = await Promise.all(Array.from({ length: 20 }, () => open()));
    let firstRoundWins = 0;
    const got = await Promise.all(
      stores.map(async (s, i) => {
        // Every owner tries the first address its (stale) view says is free, so they collide on purpose.
        let view = new Map<string, string>();
        for (let round = 0; round < 100; round++) {
          const free = candidates.filter((c) => !view.has(c));
          const r = await s.allocateAddresses(POOL, `owner-${i}`, { count: 1, candidates: free.slice(0, 1) });
          if (r.ok) {
            if (round === 0) firstRoundWins++;
            return r.addresses;
          }
          assert.ok('needCandidates' in r, JSON.stringify(r));
          view = await s.listAddresses(POOL);
        }
        throw new Error(`owner-${i} never got an address`);
      }),
    );
    assert.is(firstRoundWins, 1, 'all 20 asked for the same address first; exactly one may get it');
    assert.ok(got.every((a) => a.length === 1));
    assert.equal(new Set(got.flat()).size, 20, `addresses: ${got.flat()}`);
    const all = await stores[0].listAddresses(POOL);
    assert.is(all.size, 20);
    got.forEach((a, i) => assert.is(all.get(a[0]), `owner-${i}`));
  });
});

test('releaseOwner frees exactly that owner\'s addresses and is idempotent', async () => {
  await withStores(async (open) => {
    const store = await open();
    await store.allocateAddresses(POOL, 'a', { count: 2, candidates: range(4) });
    await store.allocateAddresses(POOL, 'b', { count: 2, candidates: range(4) });
    assert.equal(await store.releaseOwner(POOL, 'a'), ['192.0.2.1', '192.0.2.2']);
    assert.equal(await store.listAddresses(POOL), new Map([['192.0.2.3', 'b'], ['192.0.2.4', 'b']]));
    assert.equal(await store.releaseOwner(POOL, 'a'), [], 'a second release frees nothing');
    assert.equal(await store.releaseOwner(POOL, 'nobody'), []);
    assert.equal(await store.releaseOwner('other-pool', 'b'), [], 'pools are separate');
    assert.is((await store.listAddresses(POOL)).size, 2);
    // A released address can be taken by someone else, and a's fresh allocation starts clean.
    assert.equal(await store.allocateAddresses(POOL, 'c', { count: 1, candidates: range(4) }), { ok: true, addresses: ['192.0.2.1'] });
    assert.equal(await store.allocateAddresses(POOL, 'a', { count: 1, candidates: range(4) }), { ok: true, addresses: ['192.0.2.2'] });
  });
});

test('stores with different key prefixes do not see each other\'s claims', async () => {
  await withStores(async (open) => {
    const one = await open({ keyPrefix: 'cluster-one:' });
    const two = await open({ keyPrefix: 'cluster-two:' });
    assert.ok(await one.claimBlock('pods', '10.244.0.0/26', 'node-1'));
    assert.ok(await two.claimBlock('pods', '10.244.0.0/26', 'node-2'), 'the same block is free under the other prefix');
    assert.equal(await one.listBlocks('pods'), new Map([['10.244.0.0/26', 'node-1']]));
    assert.equal(await two.listBlocks('pods'), new Map([['10.244.0.0/26', 'node-2']]));
    await one.allocateAddresses(POOL, 'x', { explicit: ['192.0.2.1'] });
    assert.equal(await two.listAddresses(POOL), new Map());
    assert.equal(await two.allocateAddresses(POOL, 'y', { explicit: ['192.0.2.1'] }), { ok: true, addresses: ['192.0.2.1'] });
  });
});

test('Redis killed: TRY_AGAIN_LATER within ~2 s; restarted: the same store works again', async () => {
  await withStores(async (open, redis) => {
    const store = await open({ commandTimeoutMs: 1000 });
    assert.ok(await store.claimBlock('pods', '10.244.3.0/26', 'node-a'));
    await redis.kill();

    for (const call of [() => store.claimBlock('pods', '10.244.4.0/26', 'node-a'), () => store.listAddresses(POOL)]) {
      const t0 = Date.now();
      const e = await rejectsWith(call());
      const ms = Date.now() - t0;
      assert.is(e.code, ErrorCode.TryAgainLater);
      assert.match(e.message, `cluster store (redis at unix:${redis.socketPath}) unreachable`);
      assert.ok(ms < 2000, `took ${ms} ms`);
    }

    await redis.restart();
    // Nothing is persisted, so the restarted Redis is empty; the point is that the same store reconnects.
    assert.ok(await eventually(() => store.claimBlock('pods', '10.244.4.0/26', 'node-a')));
    assert.equal(await store.listBlocks('pods'), new Map([['10.244.4.0/26', 'node-a']]));
  });
});

test('Redis hung (SIGSTOP): a call times out with TRY_AGAIN_LATER; resumed: it answers again', async () => {
  await withStores(async (open, redis) => {
    const store = await open({ commandTimeoutMs: 300 });
    assert.equal(await store.listBlocks('pods'), new Map());
    process.kill(redis.pid!, 'SIGSTOP');
    try {
      const t0 = Date.now();
      const e = await rejectsWith(store.claimBlock('pods', '10.244.5.0/26', 'node-a'));
      assert.is(e.code, ErrorCode.TryAgainLater);
      assert.match(e.message, 'cluster store (redis at unix:');
      assert.ok(Date.now() - t0 < 1000, `took ${Date.now() - t0} ms`);
    } finally {
      process.kill(redis.pid!, 'SIGCONT');
    }
    assert.ok(await eventually(() => store.claimBlock('pods', '10.244.6.0/26', 'node-a')));
  });
});

test('a primary run with min-replicas-to-write and no replica refuses claims as TRY_AGAIN_LATER, not as a bug', async () => {
  await withStores(async (open, redis) => {
    const store = await open();
    const raw = new Redis({ path: redis.socketPath });
    try {
      await raw.config('SET', 'min-replicas-to-write', '1');
      const e = await rejectsWith(store.claimBlock('pods', '10.244.7.0/26', 'node-a'));
      assert.is(e.code, ErrorCode.TryAgainLater);
      assert.match(e.message, /NOREPLICAS/);
      await raw.config('SET', 'min-replicas-to-write', '0');
      assert.ok(await store.claimBlock('pods', '10.244.7.0/26', 'node-a'));
    } finally {
      raw.disconnect();
    }
  });
});

test('garbled block and address entries are left out with one warn line each, the rest listed; the claim script still sees them', async () => {
  await withStores(async (open, redis) => {
    const store = await open();
    assert.ok(await store.claimBlock('pods', '10.244.8.0/26', 'node-a'));
    assert.equal(await store.allocateAddresses(POOL, 'lb/ns/a', { explicit: ['192.0.2.1'] }), { ok: true, addresses: ['192.0.2.1'] });
    const raw = new Redis({ path: redis.socketPath });
    try {
      await raw.hset('tether:pool:{pods}:blocks', { garbage: 'node-b', '10.244.9.1/26': 'node-b', '10.244.10.0/26': '', '10.244.11.0/26': 'node\nx' });
      await raw.hset(`tether:pool:{${POOL}}:addrs`, { 'FD00::1': 'x', '192.0.2.300': 'y', '192.0.2.50': '' });
    } finally {
      raw.disconnect();
    }
    const lines = await captureLog(async () => {
      assert.equal(await store.listBlocks('pods'), new Map([['10.244.8.0/26', 'node-a']]));
      assert.equal(await store.listBlocks('pods'), new Map([['10.244.8.0/26', 'node-a']]), 'read twice: still one line each');
      assert.equal(await store.listAddresses(POOL), new Map([['192.0.2.1', 'lb/ns/a']]));
    });
    const warns = lines.filter((l) => l.level === 'warn');
    assert.equal(warns.map((l) => `${l.key} ${l.field}: ${l.problem}`).sort(), [
      'tether:pool:{floating-a}:addrs 192.0.2.300: not an IP address in canonical form',
      'tether:pool:{floating-a}:addrs 192.0.2.50: the owner is not a name (empty, too long, or control characters)',
      'tether:pool:{floating-a}:addrs FD00::1: not an IP address in canonical form',
      'tether:pool:{pods}:blocks 10.244.10.0/26: the node is not a name (empty, too long, or control characters)',
      'tether:pool:{pods}:blocks 10.244.11.0/26: the node is not a name (empty, too long, or control characters)',
      'tether:pool:{pods}:blocks 10.244.9.1/26: not a block (a canonical network CIDR)',
      'tether:pool:{pods}:blocks garbage: not a block (a canonical network CIDR)',
    ]);
    // Left out of the list, not given away: the claim script still finds the entry.
    assert.is(await store.claimBlock('pods', '10.244.11.0/26', 'node-c'), false);
    assert.equal(await store.allocateAddresses(POOL, 'lb/ns/c', { explicit: ['192.0.2.50'] }), { ok: false, conflict: { address: '192.0.2.50', holder: '' } });
  });
});

test('connect to a Redis that is not there fails fast with TRY_AGAIN_LATER', async () => {
  const t0 = Date.now();
  const e = await rejectsWith(RedisStore.connect('unix:///nonexistent/tether-redis.sock', { connectTimeoutMs: 500 }));
  assert.is(e.code, ErrorCode.TryAgainLater);
  assert.match(e.message, 'cluster store (redis at unix:/nonexistent/tether-redis.sock) unreachable');
  assert.ok(Date.now() - t0 < 1500);
});

test('bad input is INVALID_CONFIG naming the field', async () => {
  await withStores(async (open) => {
    const s = await open();
    const cases: Array<[string, () => Promise<unknown>, string]> = [
      ['empty pool', () => s.claimBlock('', '10.0.0.0/26', 'n'), 'pool: must not be empty'],
      ['pool with colon', () => s.listBlocks('a:b'), 'pool: must not contain'],
      ['empty node', () => s.claimBlock('p', '10.0.0.0/26', ''), 'node: must not be empty'],
      ['node with newline', () => s.releaseBlock('p', '10.0.0.0/26', 'n\nx'), 'node: must not contain a newline'],
      ['block not a CIDR', () => s.claimBlock('p', '10.0.0.0', 'n'), 'block: not a CIDR'],
      ['block with host bits', () => s.claimBlock('p', '10.0.0.1/26', 'n'), 'block: has host bits'],
      ['owner with newline', () => s.allocateAddresses('p', 'o\n', { count: 1, candidates: [] }), 'owner: must not contain a newline'],
      ['empty owner', () => s.releaseOwner('p', ''), 'owner: must not be empty'],
      ['long owner', () => s.releaseOwner('p', 'o'.repeat(600)), 'owner: longer than'],
      ['count 0', () => s.allocateAddresses('p', 'o', { count: 0, candidates: [] }), 'count: must be an integer 1..1024'],
      ['count 5000', () => s.allocateAddresses('p', 'o', { count: 5000, candidates: [] }), 'count: must be an integer 1..1024'],
      ['bad candidate', () => s.allocateAddresses('p', 'o', { count: 1, candidates: ['192.0.2.1', 'nope'] }), 'candidates[1]: not an IP'],
      ['empty explicit', () => s.allocateAddresses('p', 'o', { explicit: [] }), 'explicit: must list'],
      ['bad url scheme', () => RedisStore.connect('http://localhost:6379'), 'store url: unsupported scheme'],
      ['relative unix path', () => RedisStore.connect('unix://redis.sock'), 'store url: unix:// needs an absolute'],
    ];
    for (const [name, call, message] of cases) {
      const e = await rejectsWith(call());
      assert.is(e.code, ErrorCode.InvalidConfig, name);
      assert.match(e.message, message, name);
    }
    assert.equal(await s.listBlocks('p'), new Map(), 'nothing reached Redis');
  });
});

test('rolling upgrade: a store with the untagged keys of an older tetherd is read and written under both names; a new store never gets them', async () => {
  await withStores(async (open, redis) => {
    const raw = new Redis({ path: redis.socketPath });
    try {
      const old = untaggedKeys('tether:');
      const now = storeKeys('tether:');
      // What a tetherd from before the tags left: its generation, a block, an owner's address.
      await raw.mset(old.generation, 'gen-of-old', old.born, String(Date.now() - 3_600_000));
      await raw.hset(old.blocks('pods'), '10.244.0.0/26', 'old-node');
      await raw.hset(old.addrs(POOL), '192.0.2.1', 'lb/ns/old');
      await raw.rpush(old.owner(POOL, 'lb/ns/old'), '192.0.2.1');

      const store = await open();
      const g = await store.generation();
      assert.equal([g.token, g.restarted], ['gen-of-old', false], 'the generation is carried over: the upgrade is not a wipe');
      assert.ok(g.ageMs >= 3_500_000, `its age too (${g.ageMs} ms)`);

      assert.is(await store.claimBlock('pods', '10.244.0.0/26', 'new-node'), false, 'an old tetherd\'s block is taken');
      assert.ok(await store.claimBlock('pods', '10.244.0.64/26', 'new-node'));
      assert.is(await raw.hget(old.blocks('pods'), '10.244.0.64/26'), 'new-node', 'an old tetherd sees the new claim');
      assert.is(await raw.hget(now.blocks('pods'), '10.244.0.64/26'), 'new-node');
      // The old tetherd claims on afterwards with its script (the same text, on the untagged key only).
      const oldClaim = (block: string, node: string) => raw.eval(CLAIM_BLOCK, 1, old.blocks('pods'), block, node) as Promise<[string, string]>;
      assert.equal(await oldClaim('10.244.0.64/26', 'old-node'), ['taken', 'new-node'], 'the old tetherd cannot take the new claim');
      assert.equal(await oldClaim('10.244.0.128/26', 'old-node'), ['claimed', 'old-node']);
      assert.is(await store.claimBlock('pods', '10.244.0.128/26', 'new-node'), false, 'nor the new one the old tetherd\'s later claim');
      assert.equal(await store.listBlocks('pods'), new Map([['10.244.0.0/26', 'old-node'], ['10.244.0.64/26', 'new-node'], ['10.244.0.128/26', 'old-node']]));
      assert.is(await store.releaseBlock('pods', '10.244.0.64/26', 'new-node'), true);
      assert.is(await raw.hget(old.blocks('pods'), '10.244.0.64/26'), null, 'released under both names');

      assert.equal(await store.allocateAddresses(POOL, 'lb/ns/new', { count: 1, candidates: ['192.0.2.1', '192.0.2.2'] }), { ok: true, addresses: ['192.0.2.2'] }, 'the old tetherd\'s address is not handed out');
      assert.is(await raw.hget(old.addrs(POOL), '192.0.2.2'), 'lb/ns/new', 'an old tetherd sees the new address');
      assert.equal(await raw.lrange(old.owner(POOL, 'lb/ns/new'), 0, -1), ['192.0.2.2']);
      assert.equal(await store.allocateAddresses(POOL, 'lb/ns/old', { count: 1, candidates: ['192.0.2.3'] }), { ok: true, addresses: ['192.0.2.1'] }, 'the old owner keeps its address');
      assert.equal(await store.allocateAddresses(POOL, 'lb/ns/x', { explicit: ['192.0.2.1'] }), { ok: false, conflict: { address: '192.0.2.1', holder: 'lb/ns/old' } });
      assert.equal(await store.listAddresses(POOL), new Map([['192.0.2.1', 'lb/ns/old'], ['192.0.2.2', 'lb/ns/new']]));
      assert.equal(await store.releaseOwner(POOL, 'lb/ns/old'), ['192.0.2.1']);
      assert.is(await raw.hget(old.addrs(POOL), '192.0.2.1'), null, 'freed under both names');
      assert.is(await raw.exists(old.owner(POOL, 'lb/ns/old')), 0);

      // A store no older tetherd used gets no untagged key.
      const fresh = await open({ keyPrefix: 'fresh:' });
      assert.ok(await fresh.claimBlock('pods', '10.244.0.0/26', 'n1'));
      assert.ok((await fresh.allocateAddresses(POOL, 'lb/ns/a', { count: 1, candidates: ['192.0.2.1'] })).ok);
      assert.equal((await raw.keys('fresh:*')).filter((k) => !k.includes('{')), [], 'only tagged keys');
    } finally {
      raw.disconnect();
    }
  });
});

test('a pool mark read before another node wrote and recorded it is not taken for lost data: MARK_POOL asks for a fresh read first', async () => {
  await withStores(async (open, redis) => {
    const store = await open();
    const token = (await store.generation()).token;
    const k = storeKeys('tether:');
    const raw = new Redis({ path: redis.socketPath });
    try {
      // Node A set the pool's first mark and recorded the pool; node B read the mark (none) just before.
      await raw.set(k.mark(POOL), token);
      await raw.sadd(k.pools, POOL);
      const ask = (readAfterMember: string) => raw.eval(MARK_POOL, 4, k.generation, k.born, k.restarted, k.pools, token, POOL, '', 'fresh-token', readAfterMember);
      assert.is(await ask('0'), 'recheck', "B's stale read: read the mark again");
      assert.is(await raw.get(k.generation), token, 'the generation is not replaced');
      assert.is((await store.generation()).restarted, false, 'nor marked as a restart');
      // B's next allocation reads the mark and goes ahead under the generation.
      assert.equal(await store.allocateAddresses(POOL, 'lb/ns/b', { count: 1, candidates: range(2) }, { generation: token }), { ok: true, addresses: ['192.0.2.1'] });
      // A mark gone after the pool was seen recorded is a loss: generation replaced as a restart.
      await raw.del(k.mark(POOL));
      assert.is(await ask('1'), 'lost');
      assert.is.not(await raw.get(k.generation), token);
    } finally {
      raw.disconnect();
    }
  });
});

test('store URLs: redis:// and unix:// forms; messages never carry the password', () => {
  assert.equal(parseRedisUrl('redis://:p%40ss@10.0.0.1:6380/2'), {
    options: { host: '10.0.0.1', port: 6380, username: undefined, password: 'p@ss', db: 2 },
    where: 'redis at 10.0.0.1:6380/2',
  });
  assert.equal(parseRedisUrl('redis://[fd00::1]'), {
    options: { host: 'fd00::1', port: 6379, username: undefined, password: undefined, db: undefined },
    where: 'redis at [fd00::1]:6379',
  });
  assert.equal(parseRedisUrl('unix:///run/redis/redis.sock?password=s3cret&db=1'), {
    options: { path: '/run/redis/redis.sock', password: 's3cret', db: 1 },
    where: 'redis at unix:/run/redis/redis.sock',
  });
  try {
    parseRedisUrl('redis://:s3cret@host/x');
    assert.unreachable('db "x" must be refused');
  } catch (e) {
    assert.instance(e, TetherError);
    assert.match((e as Error).message, 'store url: db must be a number');
    assert.not.match((e as Error).message, 's3cret');
  }
});

test.run();
