// Cluster-wide (floating / LB) addresses when the store loses its data, against a real Redis: every store
// generation holds new addresses off while holders re-assert theirs (a brand-new store too: it cannot tell
// itself from one restarted empty), re-asserting is allowed meanwhile and refused naming the holder when
// someone else has the address, and a re-asserted address is never handed to anyone else afterwards.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { Writable } from 'node:stream';
import Redis from 'ioredis';
import { ClusterAddresses } from '../../ipam/cluster-addresses';
import { validatePools } from '../../ipam/pool';
import { RedisStore, storeKeys } from '../../ipam/store/redis-store';
import type { ResolvedPool } from '../../ipam/types';
import { makeLogger, setLogger } from '../../lib/log';
import { ErrorCode, TetherError } from '../../lib/errors';
import { startRedis, type TestRedis } from '../lib/redis';

const quiet = makeLogger({ level: 'error', stream: new Writable({ write: (_c, _e, cb) => cb() }) });
setLogger(quiet);

const pools: ResolvedPool[] = validatePools([
  { apiVersion: 'tether.dev/v1alpha1', kind: 'AddressPool', metadata: { name: 'float' }, spec: { usage: 'floating', ipv4: { cidr: '198.51.100.0/29' } } },
]);
const HOLD_OFF = 1500;

let redis: TestRedis;
let raw: Redis;
const cleanups: Array<() => Promise<void> | void> = [];

test.before(async () => {
  redis = await startRedis();
  raw = new Redis({ path: redis.socketPath });
});
test.after.each(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});
test.after(async () => {
  raw?.disconnect();
  await redis?.stop();
});

async function open(opts: { born?: 'long ago' } = {}) {
  const prefix = `ca${Math.random().toString(36).slice(2, 8)}:`;
  const keys = storeKeys(prefix);
  if (opts.born) await raw.mset(keys.generation, 'seeded', keys.born, '0');
  const store = await RedisStore.connect(redis.url, { keyPrefix: prefix });
  cleanups.push(() => store.close());
  return { store, prefix, keys, ca: new ClusterAddresses(pools, store, quiet, { holdOffMs: HOLD_OFF }) };
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

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

test('a brand-new store (a fresh install: no node saw an older generation) hands addresses out at once', async () => {
  const { ca, store } = await open();
  assert.equal((await ca.allocate({ pool: 'float', owner: 'egress/ns/a#float/0' })).addresses, ['198.51.100.1']);
  assert.equal((await ca.allocate({ pool: 'float', owner: 'lb/ns/b', addresses: ['198.51.100.5'] })).addresses, ['198.51.100.5']);
  const g = await store.generation();
  assert.is(g.restarted, false, 'nobody marked it as a restart');
});

test('an owner that holds its address is answered without reading the pool; only a new owner reads it (once)', async () => {
  const { store, ca } = await open({ born: 'long ago' });
  let reads = 0;
  const list = store.listAddresses.bind(store);
  store.listAddresses = (pool: string) => {
    reads++;
    return list(pool);
  };
  const a = await ca.allocate({ pool: 'float', owner: 'sim/s1', count: 1 });
  assert.is(reads, 1, 'a new owner reads the pool for candidates');
  const b = await ca.allocate({ pool: 'float', owner: 'sim/s2', count: 1 });
  assert.is(reads, 2);
  assert.is.not(b.addresses[0], a.addresses[0]);
  // Asked again (as every other node does for the same Service): same address, no pool read.
  for (let i = 0; i < 5; i++) assert.equal((await ca.allocate({ pool: 'float', owner: 'sim/s1', count: 1 })).addresses, a.addresses);
  assert.is(reads, 2, 'held addresses are answered by the script alone');
  // An owner asking for more than it holds reads the pool and gets a second, distinct address.
  const c = await ca.allocate({ pool: 'float', owner: 'sim/s1', count: 2 });
  assert.is(reads, 3);
  assert.is(c.addresses.length, 2);
  assert.ok(c.addresses.includes(a.addresses[0]) && !c.addresses.includes(b.addresses[0]), JSON.stringify(c));
});

test('store wiped (FLUSHALL): new owners wait, holders re-assert, and after the hold-off nobody else gets a re-asserted address', async () => {
  const { ca, store } = await open({ born: 'long ago' });
  const x = (await ca.allocate({ pool: 'float', owner: 'egress/ns/a#float/0' })).addresses;
  const y = (await ca.allocate({ pool: 'float', owner: 'lb/ns/b', addresses: ['198.51.100.5'] })).addresses;
  const z = (await ca.allocate({ pool: 'float', owner: 'egress/ns/c#float/0', count: 2 })).addresses;
  assert.equal([x, y, z], [['198.51.100.1'], ['198.51.100.5'], ['198.51.100.2', '198.51.100.3']]);
  const before = await ca.generation();

  await raw.flushall();
  const t0 = Date.now();
  const after = await ca.generation();
  assert.is.not(after, before, 'a new generation: holders know to re-assert');
  // This node saw the old generation: its first look at the new one marks it as a restart.
  assert.is((await store.generation()).restarted, true, 'a node that saw the old generation marked the new one');
  await ca.markRestarted(after);
  assert.is((await store.generation()).restarted, true, 'marking again changes nothing');
  await ca.markRestarted('not-the-current-token');
  assert.equal((await store.generation()).token, after, 'only the current token can be marked');

  await refused(ca.allocate({ pool: 'float', owner: 'egress/ns/d#float/0' }), ErrorCode.TryAgainLater, /restarted empty 0 s ago/);
  await refused(ca.allocate({ pool: 'float', owner: 'egress/ns/d#float/0', addresses: x }), ErrorCode.TryAgainLater, /new addresses wait/);
  await refused(ca.allocate({ pool: 'float', owner: 'egress/ns/a#float/0' }), ErrorCode.TryAgainLater, /egress\/ns\/a#float\/0 holds none/);
  assert.equal(await store.listAddresses('float'), new Map(), 'nothing handed out during the hold-off');

  assert.equal((await ca.reassert('float', 'egress/ns/a#float/0', x[0])).addresses, x, 'the holder puts its address back');
  assert.equal((await ca.reassert('float', 'egress/ns/a#float/0', x[0])).addresses, x, 're-asserting is idempotent');
  await refused(ca.reassert('float', 'egress/ns/d#float/0', x[0]), ErrorCode.AddressConflict, /198\.51\.100\.1 of pool "float" is held by egress\/ns\/a#float\/0; egress\/ns\/d#float\/0 cannot re-assert it/);
  assert.equal((await ca.allocate({ pool: 'float', owner: 'egress/ns/a#float/0' })).addresses, x, 'a holder asking for what it holds is answered during the hold-off');
  await ca.reassert('float', 'lb/ns/b', y[0]);
  // egress/ns/c never re-asserts (its node is gone): its addresses are free again after the hold-off.

  await sleep(HOLD_OFF - (Date.now() - t0) + 100);
  assert.is(await ca.generation(), after, 'same generation');
  const d = (await ca.allocate({ pool: 'float', owner: 'egress/ns/d#float/0', count: 3 })).addresses;
  assert.equal(d, ['198.51.100.2', '198.51.100.3', '198.51.100.4']);
  assert.not.ok(d.includes(x[0]) || d.includes(y[0]), 'no re-asserted address handed out again');
  assert.equal((await ca.allocate({ pool: 'float', owner: 'egress/ns/a#float/0' })).addresses, x);
  await refused(ca.allocate({ pool: 'float', owner: 'lb/ns/e', addresses: y }), ErrorCode.AddressConflict, /held by lb\/ns\/b/);
});

test('a wipe between reading the generation and claiming refuses the claim; it is never written into the new generation', async () => {
  const { store } = await open({ born: 'long ago' });
  const gen = await store.generation();
  assert.is(gen.token, 'seeded');
  assert.ok(gen.ageMs > 1_000_000_000, `age ${gen.ageMs}`);
  await raw.flushall();
  const out = await store.allocateAddresses('float', 'egress/ns/a#float/0', { count: 1, candidates: ['198.51.100.1'] }, { generation: gen.token, holdOff: false });
  assert.equal(out, { ok: false, staleGeneration: true });
  assert.equal(await store.listAddresses('float'), new Map());
  const held = await store.allocateAddresses('float', 'x', { count: 1, candidates: ['198.51.100.1'] }, { holdOff: true });
  assert.equal(held, { ok: false, holdOff: true, have: [] }, 'held off: nothing new');
  assert.equal(await store.listAddresses('float'), new Map());
});

test('the generation carries its age by the store\'s clock; a token an older tetherd wrote (no birth time) is upgraded with birth now', async () => {
  const { store, keys } = await open();
  const g1 = await store.generation();
  assert.ok(g1.ageMs < 100, `new: age ${g1.ageMs}`);
  await sleep(300);
  const g2 = await store.generation();
  assert.is(g2.token, g1.token);
  assert.ok(g2.ageMs >= 250 && g2.ageMs < 2000, `age ${g2.ageMs}`);

  await raw.del(keys.born);
  await raw.set(keys.generation, 'from-an-older-tetherd');
  const old = await store.generation();
  assert.equal(old, { token: 'from-an-older-tetherd', ageMs: 0, restarted: false }, 'kept, and as young as can be: holders get a full hold-off');
  assert.match((await raw.get(keys.born)) ?? '', /^\d{13}$/);
  await raw.set(keys.born, 'garbage');
  assert.equal(await store.generation(), { token: 'from-an-older-tetherd', ageMs: 0, restarted: false }, 'a garbled birth time is refused and replaced by now');
});

test('without a store: TRY_AGAIN_LATER naming --redis; a bad hold-off is refused', async () => {
  const ca = new ClusterAddresses(pools, undefined, quiet);
  await refused(ca.generation(), ErrorCode.TryAgainLater, /--redis/);
  await refused(ca.reassert('float', 'lb/ns/b', '198.51.100.5'), ErrorCode.TryAgainLater, /--redis/);
  assert.throws(() => new ClusterAddresses(pools, undefined, quiet, { holdOffMs: -1 }), /holdOffMs: must be 0\.\.600000/);
});

test.run();
