// The IPAM store against a real Redis Cluster (3 primaries + 3 replicas, test/lib/redis-cluster.ts): the
// store URL's Cluster form; every script's keys in one slot; claims, allocations and ClusterAddresses as
// on one server (including a wipe of the whole store); a wipe of only the node serving one pool's keys
// (which a single global generation could not see); a slot migrated key by key under a stream of
// allocations; and a primary SIGKILLed under a stream of allocations: calls fail with TRY_AGAIN_LATER
// while its replica takes over and go on after, and no address is ever handed to two owners (checked
// at every answer, not only at the end), nor is an acknowledged one lost.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { Writable } from 'node:stream';
import { randomBytes } from 'node:crypto';
import { ClusterAddresses } from '../../ipam/cluster-addresses';
import { validatePools } from '../../ipam/pool';
import { parseRedisUrl, RedisStore, storeKeys } from '../../ipam/store/redis-store';
import type { ResolvedPool } from '../../ipam/types';
import { makeLogger, setLogger } from '../../lib/log';
import { ErrorCode, TetherError } from '../../lib/errors';
import { captureLog } from '../lib/log-capture';
import { startRedisCluster, type RedisCluster } from '../lib/redis-cluster';

const quiet = makeLogger({ level: 'error', stream: new Writable({ write: (_c, _e, cb) => cb() }) });
setLogger(quiet);
const HOLD_OFF = 1500;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

let cluster: RedisCluster;
const cleanups: Array<() => Promise<void> | void> = [];

test.before(async () => {
  cluster = await startRedisCluster();
  await warmReplication();
});

/**
 * Until every primary's replica acknowledges a claim: "online" in INFO replication comes before the
 * replica's first acknowledgement, which on a loaded machine took more than a claim's 500 ms WAIT (seen
 * once in CI: the first test's claim refused as not acknowledged, correctly, by a cluster just started).
 */
async function warmReplication(): Promise<void> {
  const store = await RedisStore.connect(cluster.url, { keyPrefix: 'warm:' });
  try {
    const k = storeKeys('warm:');
    const warmed = new Set<number>();
    for (let i = 0; warmed.size < 3 && i < 200; i++) {
      const port = await cluster.primaryOf(await cluster.slotOf(k.blocks(`p${i}`)));
      if (warmed.has(port)) continue;
      for (const end = Date.now() + 15_000; ; ) {
        const ok = await store.claimBlock(`p${i}`, '10.0.0.0/26', 'warm').catch((e) => {
          if (Date.now() > end) throw e;
          return false;
        });
        if (ok) break;
        await sleep(100);
      }
      warmed.add(port);
    }
    assert.is(warmed.size, 3, 'a claim acknowledged on every primary before the tests');
  } finally {
    await store.close();
  }
}
test.after.each(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});
test.after(async () => {
  await cluster?.stop();
});

function floating(name: string, cidr: string): ResolvedPool {
  return validatePools([{ apiVersion: 'tether.dev/v1alpha1', kind: 'AddressPool', metadata: { name }, spec: { usage: 'floating', ipv4: { cidr } } }])[0];
}

async function open(prefix = `rc${randomBytes(3).toString('hex')}:`, opts: { commandTimeoutMs?: number } = {}) {
  const store = await RedisStore.connect(cluster.url, { keyPrefix: prefix, ...opts });
  cleanups.push(() => store.close());
  return { store, prefix, keys: storeKeys(prefix) };
}

/** A pool name whose keys live on a different primary than the generation's keys (and than `avoid`). */
async function poolAwayFromGeneration(prefix: string, avoid: number[] = []): Promise<{ name: string; port: number; genPort: number }> {
  const k = storeKeys(prefix);
  const genPort = await cluster.primaryOf(await cluster.slotOf(k.generation));
  for (let i = 0; i < 200; i++) {
    const name = `float${i}`;
    const port = await cluster.primaryOf(await cluster.slotOf(k.addrs(name)));
    if (port !== genPort && !avoid.includes(port)) return { name, port, genPort };
  }
  throw new Error('no pool name away from the generation slot');
}

async function refused(p: Promise<unknown>, code: string, re: RegExp): Promise<void> {
  await p.then(
    (v) => assert.unreachable(`expected ${code}, got ${JSON.stringify(v)}`),
    (e) => {
      assert.instance(e, TetherError);
      assert.is((e as TetherError).code, code, (e as Error).message);
      assert.match((e as Error).message, re);
    },
  );
}

test('store URL: redis+cluster:// with nodes, default port, password; a db or an unknown parameter is refused; never the password in messages', () => {
  assert.equal(parseRedisUrl('redis+cluster://:p%40ss@10.0.0.1,10.0.0.2:7001,[fd00::3]:7002'), {
    options: { username: undefined, password: 'p@ss' },
    cluster: [
      { host: '10.0.0.1', port: 6379 },
      { host: '10.0.0.2', port: 7001 },
      { host: 'fd00::3', port: 7002 },
    ],
    where: 'redis cluster via 10.0.0.1:6379,10.0.0.2:7001,[fd00::3]:7002',
  });
  assert.equal(parseRedisUrl('redis+cluster://h1:7000/?password=s3cret').options.password, 's3cret');
  assert.not.match(parseRedisUrl('redis+cluster://:s3cret@h1').where, /s3cret/);
  for (const [url, why] of [
    ['redis+cluster://', /no node address/],
    ['redis+cluster://h1:99999', /node port 99999/],
    ['redis+cluster://h1/2', /no databases/],
    ['redis+cluster://h1?db=2', /unknown parameter "db"/],
  ] as const) {
    assert.throws(() => parseRedisUrl(url), (e: Error) => why.test(e.message) && /redis\+cluster:\/\//.test(e.message), url);
  }
});

test('every key of a pool, and every key of the generation, hashes to one slot; braces in a prefix are refused', async () => {
  const k = storeKeys('tether:');
  const poolSlots = new Set(await Promise.all([k.blocks('p'), k.addrs('p'), k.owner('p', 'egress/ns/a#p/0'), k.mark('p')].map((x) => cluster.slotOf(x))));
  const genSlots = new Set(await Promise.all([k.generation, k.born, k.restarted, k.pools].map((x) => cluster.slotOf(x))));
  assert.is(poolSlots.size, 1);
  assert.is(genSlots.size, 1);
  assert.is.not([...poolSlots][0], [...genSlots][0]);
  assert.is.not(await cluster.slotOf(k.addrs('q')), [...poolSlots][0], 'another pool: another slot');
  await refused(RedisStore.connect(cluster.url, { keyPrefix: 'a{b}:' }), ErrorCode.InvalidConfig, /keyPrefix: must not contain '\{' or '\}'/);
});

test('claims on a Cluster: 10 connections race for one block, exactly one wins, acknowledged by the slot\'s replica; release is compare-and-delete', async () => {
  const { prefix } = await open();
  const stores = await Promise.all(Array.from({ length: 10 }, () => open(prefix).then((o) => o.store)));
  let wins: boolean[] = [];
  const lines = await captureLog(async () => {
    wins = await Promise.all(stores.map((s, i) => s.claimBlock('pods', '10.244.0.64/26', `node-${i}`)));
  });
  assert.is(wins.filter(Boolean).length, 1);
  const winner = `node-${wins.indexOf(true)}`;
  assert.equal(await stores[3].listBlocks('pods'), new Map([['10.244.0.64/26', winner]]));
  const claimed = lines.find((l) => l.message === 'block claimed');
  assert.is(Number(claimed?.replicas), 1, 'the claim waited for the slot primary\'s replica');
  assert.is(await stores[0].releaseBlock('pods', '10.244.0.64/26', winner === 'node-0' ? 'node-1' : 'node-0'), false);
  assert.is(await stores[0].releaseBlock('pods', '10.244.0.64/26', winner), true);
  assert.equal(await stores[5].listBlocks('pods'), new Map());
});

test('allocations on a Cluster as on one server: count, idempotent, explicit conflict, needCandidates, release', async () => {
  const { store } = await open();
  const P = 'floating-a';
  assert.equal(await store.allocateAddresses(P, 'lb/ns/a', { count: 2, candidates: ['192.0.2.1', '192.0.2.2', '192.0.2.3'] }), { ok: true, addresses: ['192.0.2.1', '192.0.2.2'] });
  assert.equal(await store.allocateAddresses(P, 'lb/ns/a', { count: 2, candidates: ['192.0.2.3'] }), { ok: true, addresses: ['192.0.2.1', '192.0.2.2'] }, 'idempotent');
  assert.equal(await store.allocateAddresses(P, 'lb/ns/b', { explicit: ['192.0.2.2'] }), { ok: false, conflict: { address: '192.0.2.2', holder: 'lb/ns/a' } });
  assert.equal(await store.allocateAddresses(P, 'lb/ns/b', { count: 1, candidates: ['192.0.2.1'] }), { ok: false, needCandidates: true, have: [] });
  assert.equal(await store.releaseOwner(P, 'lb/ns/a'), ['192.0.2.1', '192.0.2.2']);
  assert.equal(await store.allocateAddresses(P, 'lb/ns/b', { explicit: ['192.0.2.2'] }), { ok: true, addresses: ['192.0.2.2'] });
  assert.equal(await store.listAddresses(P), new Map([['192.0.2.2', 'lb/ns/b']]));
});

test('a new store: 12 nodes\' first allocations in one pool race; none takes the new store for one that lost data (no restart mark, no hold-off)', async () => {
  const { prefix } = await open();
  const { name } = await poolAwayFromGeneration(prefix);
  // Each node with its own connection and ClusterAddresses, as 12 tetherds starting together.
  const nodes = await Promise.all(Array.from({ length: 12 }, () => open(prefix)));
  const cas = nodes.map(({ store }) => new ClusterAddresses([floating(name, '198.51.100.0/26')], store, quiet, { holdOffMs: 60_000 }));
  const got = await Promise.all(cas.map((ca, i) => ca.allocate({ pool: name, owner: `egress/ns/e${i}#f/0` })));
  const all = got.flatMap((g) => g.addresses);
  assert.is(new Set(all).size, 12, `12 distinct addresses: ${all.join(' ')}`);
  assert.is((await nodes[0].store.generation()).restarted, false, 'the new store is not marked as restarted');
  // A loss of the pool's keys after that is still seen (the pool is recorded as marked).
  await cluster.cli(await cluster.primaryOf(await cluster.slotOf(storeKeys(prefix).addrs(name))), 'FLUSHALL');
  await refused(cas[0].allocate({ pool: name, owner: 'egress/ns/late#f/0' }), ErrorCode.TryAgainLater, /restarted empty/);
});

test('ClusterAddresses on a Cluster, whole store wiped (FLUSHALL on every primary): new owners wait, holders re-assert, nobody else gets a re-asserted address', async () => {
  const { store, prefix } = await open();
  const { name } = await poolAwayFromGeneration(prefix);
  const ca = new ClusterAddresses([floating(name, '198.51.100.0/29')], store, quiet, { holdOffMs: HOLD_OFF });
  const x = (await ca.allocate({ pool: name, owner: 'egress/ns/a#f/0' })).addresses;
  const y = (await ca.allocate({ pool: name, owner: 'lb/ns/b', addresses: ['198.51.100.5'] })).addresses;
  assert.equal([x, y], [['198.51.100.1'], ['198.51.100.5']]);
  const before = await ca.generation();
  await cluster.flushAll();
  const t0 = Date.now();
  const after = await ca.generation();
  assert.is.not(after, before);
  await refused(ca.allocate({ pool: name, owner: 'egress/ns/d#f/0' }), ErrorCode.TryAgainLater, /restarted empty/);
  assert.equal((await ca.reassert(name, 'egress/ns/a#f/0', x[0])).addresses, x);
  await ca.reassert(name, 'lb/ns/b', y[0]);
  await sleep(HOLD_OFF - (Date.now() - t0) + 100);
  const d = (await ca.allocate({ pool: name, owner: 'egress/ns/d#f/0', count: 3 })).addresses;
  assert.equal(d, ['198.51.100.2', '198.51.100.3', '198.51.100.4']);
});

test('only the node serving one pool\'s keys lost its data: the next allocation replaces the generation as a restart, holders re-assert, and nobody else gets their address', async () => {
  const { store, prefix, keys } = await open();
  const { name, port } = await poolAwayFromGeneration(prefix);
  const ca = new ClusterAddresses([floating(name, '198.51.100.0/29')], store, quiet, { holdOffMs: HOLD_OFF });
  const x = (await ca.allocate({ pool: name, owner: 'egress/ns/a#f/0' })).addresses;
  assert.equal(x, ['198.51.100.1']);
  const before = await ca.generation();
  await cluster.cli(port, 'flushall'); // the pool's primary only: the generation's keys survive
  assert.is(await store.listAddresses(name).then((m) => m.size), 0, 'the pool lost its addresses');
  assert.is((await store.generation()).token, before, 'a single global token cannot see it');
  // The next allocation finds the pool's mark gone although the pool was marked in this generation.
  await refused(ca.allocate({ pool: name, owner: 'egress/ns/d#f/0' }), ErrorCode.TryAgainLater, /restarted empty/);
  const after = await ca.generation();
  assert.is.not(after, before, 'a new generation: every holder re-asserts');
  assert.is((await store.generation()).restarted, true, 'replaced as a restart: new addresses are held off');
  assert.is.not(await cluster.primaryOf(await cluster.slotOf(keys.generation)), port);
  assert.equal((await ca.reassert(name, 'egress/ns/a#f/0', x[0])).addresses, x);
  await sleep(HOLD_OFF + 100);
  const d = (await ca.allocate({ pool: name, owner: 'egress/ns/d#f/0' })).addresses;
  assert.equal(d, ['198.51.100.2'], 'the re-asserted address is not handed out again');
});

/**
 * Allocates for new owners, `workers` at a time, until stop() is called; checks at every answer that
 * the address was never answered to another owner. Returns what was handed out and how calls failed.
 */
function allocationStream(ca: ClusterAddresses, pool: string, workers: number) {
  const handedOut = new Map<string, string>(); // address → owner
  const failures: Record<string, number> = {};
  const violations: string[] = [];
  let stopping = false;
  let seq = 0;
  let okAfterMark = 0;
  let mark: number | undefined;
  const worker = async () => {
    while (!stopping) {
      const owner = `egress/ns/o${seq++}#${pool}/0`;
      // An owner retries until it gets its address (as a holder would), so a failed try leaves no gap.
      for (;;) {
        try {
          const { addresses } = await ca.allocate({ pool, owner });
          for (const a of addresses) {
            const prev = handedOut.get(a);
            if (prev !== undefined && prev !== owner) violations.push(`${a} handed to ${prev} and to ${owner}`);
            handedOut.set(a, owner);
          }
          if (mark !== undefined) okAfterMark++;
          break;
        } catch (e) {
          const code = e instanceof TetherError ? e.code : `not a TetherError: ${(e as Error).message}`;
          failures[code] = (failures[code] ?? 0) + 1;
          if (stopping && code !== ErrorCode.TryAgainLater) break;
          if (code !== ErrorCode.TryAgainLater) throw e;
          await sleep(20);
        }
      }
    }
  };
  const running = Promise.all(Array.from({ length: workers }, worker));
  // A worker's unexpected error is rethrown by stop(); until then it is held here, not left unhandled.
  running.catch(() => undefined);
  return {
    handedOut,
    failures,
    violations,
    /** From now on, count successful answers (e.g. after a failover). */
    markNow: () => {
      mark = Date.now();
      okAfterMark = 0;
    },
    okAfterMark: () => okAfterMark,
    stop: async () => {
      stopping = true;
      await running;
    },
  };
}

test('a slot migrated key by key (CLUSTER SETSLOT / MIGRATE) under a stream of allocations: nothing lost, nothing handed out twice', async () => {
  const { store, prefix, keys } = await open();
  const { name, port } = await poolAwayFromGeneration(prefix);
  const ca = new ClusterAddresses([floating(name, '198.51.100.0/22')], store, quiet, { holdOffMs: 0 });
  const stream = allocationStream(ca, name, 4);
  try {
    while (stream.handedOut.size < 30) await sleep(20);
    const slot = await cluster.slotOf(keys.addrs(name));
    const to = (await cluster.nodes()).find((n) => n.role === 'master' && !n.failed && n.port !== port)!.port;
    const { keys: moved } = await cluster.migrateSlot(slot, to, { batch: 3, pauseMs: 30 });
    assert.ok(moved >= 30, `moved ${moved} keys`);
    assert.is(await cluster.primaryOf(slot), to);
    stream.markNow();
    while (stream.okAfterMark() < 20) await sleep(20);
  } finally {
    await stream.stop();
  }
  assert.equal(stream.violations, []);
  const stored = await store.listAddresses(name);
  for (const [a, owner] of stream.handedOut) assert.is(stored.get(a), owner, `${a} answered to ${owner} is still its`);
  assert.is(stored.size, stream.handedOut.size, 'nothing stored that was not answered');
  const odd = Object.keys(stream.failures).filter((c) => c !== ErrorCode.TryAgainLater);
  assert.equal(odd, [], `only TRY_AGAIN_LATER while the slot moved: ${JSON.stringify(stream.failures)}`);
});

test('a pool\'s slot moved to another primary: a claim sent first (script + WAIT in one pipeline) follows the slot and waits for the new primary\'s replica', async () => {
  const { store, prefix, keys } = await open();
  const { name, port } = await poolAwayFromGeneration(prefix);
  assert.ok(await store.claimBlock(name, '10.244.1.0/26', 'node-a'), 'first claim, before the move');
  const slot = await cluster.slotOf(keys.blocks(name));
  const to = (await cluster.nodes()).find((n) => n.role === 'master' && !n.failed && n.port !== port)!.port;
  await cluster.migrateSlot(slot, to);
  assert.is(await cluster.primaryOf(slot), to);
  // The store's client still maps the slot to the old primary: its next call is a claim (a pipeline
  // with the keyless WAIT, which a Cluster client never redirects as a whole).
  let won = false;
  const lines = await captureLog(async () => {
    won = await store.claimBlock(name, '10.244.1.64/26', 'node-b');
  });
  assert.ok(won, 'the claim after the move went through');
  assert.is(Number(lines.find((l) => l.message === 'block claimed')?.replicas), 1, 'and waited for the replica of the slot\'s new primary');
  assert.equal(await store.listBlocks(name), new Map([['10.244.1.0/26', 'node-a'], ['10.244.1.64/26', 'node-b']]));
});

// Last: it leaves the cluster with one primary that has no replica.
test('a primary SIGKILLed mid-stream: TRY_AGAIN_LATER while its replica takes over, then allocations go on; no address ever handed out twice, none acknowledged lost', async () => {
  const { store, prefix, keys } = await open(undefined, { commandTimeoutMs: 500 });
  const { name, port } = await poolAwayFromGeneration(prefix);
  const ca = new ClusterAddresses([floating(name, '198.51.100.0/22')], store, quiet, { holdOffMs: 0 });
  assert.is(await cluster.primaryOf(await cluster.slotOf(keys.addrs(name))), port);
  await cluster.nodes(); // which replica serves which primary, for waitFailover
  const stream = allocationStream(ca, name, 4);
  let failover: { port: number; ms: number };
  try {
    while (stream.handedOut.size < 30) await sleep(20);
    const before = stream.handedOut.size;
    cluster.kill(port);
    failover = await cluster.waitFailover(port);
    stream.markNow();
    const t = Date.now();
    while (stream.okAfterMark() < 30) {
      if (Date.now() - t > 20_000) assert.unreachable(`allocations did not resume after the failover: ${JSON.stringify(stream.failures)}`);
      await sleep(20);
    }
    // Each answer counted after the mark is a new owner's new address: at least 30 more (exactly 30 when the
    // loop above stops on the 30th and none came between the kill and the mark).
    assert.ok(stream.handedOut.size >= before + 30, `${stream.handedOut.size - before} addresses handed out since the kill`);
  } finally {
    await stream.stop();
  }
  assert.equal(stream.violations, [], 'no address answered to two owners');
  assert.ok((stream.failures[ErrorCode.TryAgainLater] ?? 0) > 0, `calls failed with TRY_AGAIN_LATER during the failover (${failover!.ms} ms)`);
  const odd = Object.keys(stream.failures).filter((c) => c !== ErrorCode.TryAgainLater);
  assert.equal(odd, [], `only TRY_AGAIN_LATER: ${JSON.stringify(stream.failures)}`);
  assert.is(await cluster.primaryOf(await cluster.slotOf(keys.addrs(name))), failover!.port, 'the replica serves the pool now');
  const stored = await store.listAddresses(name);
  for (const [a, owner] of stream.handedOut) assert.is(stored.get(a), owner, `${a} acknowledged to ${owner} survived the failover`);
});

test.run();
