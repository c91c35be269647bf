// The per-node pod allocator and the cluster-wide owner addresses against a real Redis: dual-stack,
// idempotency, blocks claimed when full and returned when empty, reserved addresses, restart from the
// durable state, a claim that raced a crash, the store going away and coming back, bad requests.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { AllocationStore } from '../../ipam/allocation-store';
import { ClusterAddresses } from '../../ipam/cluster-addresses';
import { HOLD_OFF_MS, PodAllocator, firstBlock, ownerKey } from '../../ipam/pod-allocator';
import { validatePools } from '../../ipam/pool';
import { LazyStore } from '../../ipam/store/lazy-store';
import { RedisStore } from '../../ipam/store/redis-store';
import type { PodOwner, ResolvedPool } from '../../ipam/types';
import { makeLogger } from '../../lib/log';
import { TetherError } from '../../lib/errors';
import { startRedis, type TestRedis } from '../lib/redis';
import { Writable } from 'node:stream';

// These tests lay blocks out by hand (block 0 first); the seeded search start has its own tests below.
const FROM_ZERO = () => 0n;
const quiet = makeLogger({ level: 'error', stream: new Writable({ write: (_c, _e, cb) => cb() }) });

const pools: ResolvedPool[] = validatePools([
  pool('default', 'pod', { ipv4: { cidr: '10.60.0.0/24', blockSize: 29 }, ipv6: { cidr: 'fd00:60::/120', blockSize: 125 } }),
  pool('reserved', 'pod', { ipv4: { cidr: '10.61.0.0/28', blockSize: 29 }, reserved: ['10.61.0.1', '10.61.0.2'] }),
  pool('zoned', 'pod', { ipv4: { cidr: '10.62.0.0/24', blockSize: 28 }, zone: 'zone-b' }),
  pool('float', 'floating', { ipv4: { cidr: '198.51.100.0/29' } }),
]);

function pool(name: string, usage: string, spec: Record<string, unknown>) {
  return { apiVersion: 'tether.dev/v1alpha1', kind: 'AddressPool', metadata: { name }, spec: { usage, ...spec } };
}

function owner(id: string, network = 'net'): PodOwner {
  return { network, containerId: id, ifName: 'eth0', podNamespace: 'ns', podName: id };
}

let redis: TestRedis;
const cleanups: Array<() => Promise<void> | void> = [];

async function fixture(node = 'n1', prefix = `t${Math.random().toString(36).slice(2, 8)}:`, stateDir?: string, seeded = false) {
  const dir = stateDir ?? fs.mkdtempSync(path.join(os.tmpdir(), 'tether-ipam-'));
  const store = await RedisStore.connect(redis.url, { keyPrefix: prefix });
  const alloc = new PodAllocator({ name: node, zone: 'zone-a', labels: {} }, pools, store, new AllocationStore(dir), quiet, HOLD_OFF_MS, seeded ? undefined : FROM_ZERO);
  await alloc.start();
  cleanups.push(() => store.close(), () => fs.rmSync(dir, { recursive: true, force: true }));
  return { alloc, store, dir, prefix };
}

test.before(async () => {
  redis = await startRedis();
});
test.after.each(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});
test.after(async () => {
  await redis?.stop();
});

test('dual-stack: one address per family, gateway is the block start and never handed out; ADD again = same', async () => {
  const { alloc, store } = await fixture();
  const a = await alloc.allocate('default', owner('c1'));
  assert.equal(a.ips.map((i) => [i.family, i.address, i.prefix, i.gateway]), [
    [4, '10.60.0.1', 29, '10.60.0.0'],
    [6, 'fd00:60::1', 125, 'fd00:60::'],
  ]);
  assert.equal(await alloc.allocate('default', owner('c1')), a, 'idempotent per attachment');
  assert.equal([...(await store.listBlocks('default'))], [['10.60.0.0/29', 'n1'], ['fd00:60::/125', 'n1']]);
});

test('a full block makes the node claim the next one; empty blocks go back to the store', async () => {
  const { alloc, store } = await fixture();
  const got: string[] = [];
  for (let i = 0; i < 9; i++) got.push((await alloc.allocate('default', owner(`c${i}`))).ips[0].address);
  assert.is(new Set(got).size, 9, 'distinct');
  assert.equal(got.slice(0, 7), ['10.60.0.1', '10.60.0.2', '10.60.0.3', '10.60.0.4', '10.60.0.5', '10.60.0.6', '10.60.0.7']);
  assert.equal(got.slice(7), ['10.60.0.9', '10.60.0.10'], 'second /29 block, its .8 kept as gateway');
  assert.equal([...(await store.listBlocks('default')).keys()].filter((b) => b.includes('.')).sort(), ['10.60.0.0/29', '10.60.0.8/29']);
  for (let i = 7; i < 9; i++) await alloc.release(ownerKey(owner(`c${i}`)));
  assert.not.ok((await store.listBlocks('default')).has('10.60.0.8/29'), 'emptied block returned');
  for (let i = 0; i < 7; i++) await alloc.release(ownerKey(owner(`c${i}`)));
  assert.is((await store.listBlocks('default')).size, 0, 'pool back to empty');
  assert.equal(await alloc.release(ownerKey(owner('c0'))), [], 'release is idempotent');
});

test('a released address is not reused at once (the search moves on)', async () => {
  const { alloc } = await fixture();
  await alloc.allocate('default', owner('keep'));
  const a = (await alloc.allocate('default', owner('x'))).ips[0].address;
  await alloc.release(ownerKey(owner('x')));
  const b = (await alloc.allocate('default', owner('y'))).ips[0].address;
  assert.is.not(a, b);
});

test('reserved addresses are skipped; exhaustion is a clear error and leaves nothing behind', async () => {
  const { alloc, store } = await fixture();
  const got: string[] = [];
  // 10.61.0.0/28 in /29 blocks: .0 and .8 gateways, .1 .2 reserved → 5 + 7 = 12 usable.
  for (let i = 0; i < 12; i++) got.push((await alloc.allocate('reserved', owner(`r${i}`))).ips[0].address);
  assert.not.ok(got.includes('10.61.0.1') || got.includes('10.61.0.2') || got.includes('10.61.0.0') || got.includes('10.61.0.8'));
  try {
    await alloc.allocate('reserved', owner('one-too-many'));
    assert.unreachable('allocated past the end of the pool');
  } catch (e) {
    assert.instance(e, TetherError);
    assert.is((e as TetherError).code, 'POOL_EXHAUSTED');
    assert.match((e as TetherError).message, /pool "reserved" is exhausted/);
  }
  assert.is(alloc.lookup(ownerKey(owner('one-too-many'))), undefined, 'no half allocation');
  assert.is((await store.listBlocks('reserved')).size, 2);
});

test('restart: allocations and blocks come back from the state dir; a claim made just before a crash is adopted and returned', async () => {
  const first = await fixture('n1');
  const a = await first.alloc.allocate('default', owner('c1'));
  // A claim that made it to Redis but not to the node's own files (killed in between):
  await first.store.claimBlock('default', '10.60.0.248/29', 'n1');
  const again = new PodAllocator({ name: 'n1', labels: {} }, pools, first.store, new AllocationStore(first.dir), quiet, HOLD_OFF_MS, FROM_ZERO);
  const st = await again.start();
  assert.is(st.allocations, 2);
  assert.equal(again.lookup(ownerKey(owner('c1'))), a);
  assert.not.ok((await first.store.listBlocks('default')).has('10.60.0.248/29'), 'orphan claim returned');
  const b = await again.allocate('default', owner('c2'));
  assert.is(b.ips[0].address, '10.60.0.2', 'no duplicate after restart');
});

test('restart after the store lost its data: blocks holding allocations are claimed back', async () => {
  const first = await fixture('n1');
  await first.alloc.allocate('default', owner('c1'));
  await first.store.releaseBlock('default', '10.60.0.0/29', 'n1'); // as if Redis had restarted empty
  const again = new PodAllocator({ name: 'n1', labels: {} }, pools, first.store, new AllocationStore(first.dir), quiet, HOLD_OFF_MS, FROM_ZERO);
  await again.start();
  assert.is((await first.store.listBlocks('default')).get('10.60.0.0/29'), 'n1');
});

test('two nodes never share a block', async () => {
  const prefix = `race${Date.now()}:`;
  const [a, b] = [await fixture('n1', prefix), await fixture('n2', prefix)];
  const ips = await Promise.all(Array.from({ length: 20 }, (_, i) => (i % 2 ? a : b).alloc.allocate('default', owner(`p${i}`)).then((x) => x.ips[0])));
  assert.is(new Set(ips.map((i) => i.address)).size, 20);
  const blocks = await a.store.listBlocks('default');
  for (const [i, ip] of ips.entries()) assert.is(blocks.get(ip.block), i % 2 ? 'n1' : 'n2', `${ip.address} in a block of its node`);
});

test('cluster store down: owned blocks still serve; a new block is TRY_AGAIN_LATER; DEL works and the return is retried', async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tether-ipam-'));
  cleanups.push(() => fs.rmSync(dir, { recursive: true, force: true }));
  const store = new LazyStore(() => RedisStore.connect(redis.url, { keyPrefix: 'down:', commandTimeoutMs: 300, connectTimeoutMs: 300 }));
  cleanups.push(() => store.close());
  const alloc = new PodAllocator({ name: 'n1', labels: {} }, pools, store, new AllocationStore(dir), quiet, HOLD_OFF_MS, FROM_ZERO);
  await alloc.start();
  await alloc.allocate('default', owner('a'));
  await redis.kill();
  try {
    for (let i = 0; i < 6; i++) await alloc.allocate('default', owner(`b${i}`)); // fits the owned /29
    try {
      await alloc.allocate('default', owner('needs-new-block'));
      assert.unreachable('claimed a block with Redis down');
    } catch (e) {
      assert.is((e as TetherError).code, 'TRY_AGAIN_LATER');
    }
    assert.is(alloc.lookup(ownerKey(owner('needs-new-block'))), undefined);
    for (let i = 0; i < 6; i++) await alloc.release(ownerKey(owner(`b${i}`)));
    await alloc.release(ownerKey(owner('a')));
    assert.is(alloc.lookup(ownerKey(owner('a'))), undefined, 'DEL succeeded without the store');
  } finally {
    await redis.restart();
  }
  await alloc.maintain();
  const check = await RedisStore.connect(redis.url, { keyPrefix: 'down:' });
  cleanups.push(() => check.close());
  // Redis restarted empty here, so nothing is claimed either way; what matters is that maintain() cleared its debt.
  assert.equal((alloc.usage()[0].families as Array<{ blocks: string[] }>)[0].blocks, [], 'deferred block return done');
});

test('store restarted empty: holders re-assert their blocks, others hold off new claims, no address twice', async () => {
  const prefix = `wipe${Date.now()}:`;
  const dirA = fs.mkdtempSync(path.join(os.tmpdir(), 'tether-ipam-'));
  const dirB = fs.mkdtempSync(path.join(os.tmpdir(), 'tether-ipam-'));
  cleanups.push(() => fs.rmSync(dirA, { recursive: true, force: true }), () => fs.rmSync(dirB, { recursive: true, force: true }));
  const store = await RedisStore.connect(redis.url, { keyPrefix: prefix });
  cleanups.push(() => store.close());
  const a = new PodAllocator({ name: 'n1', labels: {} }, pools, store, new AllocationStore(dirA), quiet, 1500, FROM_ZERO);
  const b = new PodAllocator({ name: 'n2', labels: {} }, pools, store, new AllocationStore(dirB), quiet, 1500, FROM_ZERO);
  await a.start();
  await b.start();
  const heldByA = (await a.allocate('reserved', owner('a1'))).ips[0];
  // Fill n2's block of the same pool; the pool has two /29 blocks, so n2's next claim would be n1's.
  const bIps = [];
  for (let i = 0; i < 7; i++) bIps.push((await b.allocate('reserved', owner(`b${i}`))).ips[0].address);
  const wipe = new (require('ioredis'))(redis.url.replace('unix://', ''), { lazyConnect: false });
  await wipe.flushall();
  wipe.disconnect();
  // n2 needs a new block right after the wipe: it notices the new generation and holds off.
  await b.allocate('reserved', owner('b-next')).then(
    () => assert.unreachable('claimed a block right after the store was wiped'),
    (e) => {
      assert.is((e as TetherError).code, 'TRY_AGAIN_LATER');
      assert.match((e as Error).message, /restarted empty/);
    },
  );
  await a.maintain(); // n1 notices too and re-asserts its block
  assert.is((await store.listBlocks('reserved')).get(heldByA.block), 'n1');
  await new Promise((r) => setTimeout(r, 1600));
  await b.allocate('reserved', owner('b-next')).then(
    () => assert.unreachable('the pool is full: both blocks held'),
    (e) => assert.is((e as TetherError).code, 'POOL_EXHAUSTED'),
  );
  assert.not.ok(bIps.includes(heldByA.address));
});

test('a block the store records as this node\'s but that it does not hold (a claim whose answer was lost) is taken back, not leaked', async () => {
  const { alloc, store } = await fixture('n1');
  // The claim reached the store, its answer never reached the node.
  assert.ok(await store.claimBlock('reserved', '10.61.0.0/29', 'n1'));
  const ip = (await alloc.allocate('reserved', owner('x'))).ips[0];
  assert.is(ip.block, '10.61.0.0/29', 'the recorded block is used');
  assert.equal(await store.listBlocks('reserved'), new Map([['10.61.0.0/29', 'n1']]), 'no second block claimed beside it');
});

test('pool selection errors name the pool', async () => {
  const { alloc } = await fixture();
  const cases: Array<[string, string, RegExp]> = [
    ['nope', 'UNKNOWN_POOL', /unknown pod pool "nope" \(this node knows: default, reserved, zoned\)/],
    ['float', 'UNKNOWN_POOL', /unknown pod pool "float"/],
    ['zoned', 'INVALID_CONFIG', /pool "zoned" does not serve node n1/],
    ['', 'INVALID_CONFIG', /ipam\.pool: missing/],
  ];
  for (const [name, code, re] of cases) {
    try {
      await alloc.allocate(name, owner('x'));
      assert.unreachable(name);
    } catch (e) {
      assert.is((e as TetherError).code, code, name);
      assert.match((e as Error).message, re);
    }
  }
  await alloc.allocate('default', owner('x'));
  try {
    await alloc.allocate('reserved', owner('x'));
    assert.unreachable('one attachment, two pools');
  } catch (e) {
    assert.is((e as TetherError).code, 'ADDRESS_CONFLICT');
  }
});

test('cluster-wide owners: idempotent, explicit honoured or refused naming the holder, release frees all, exhaustion', async () => {
  const { store } = await fixture();
  // No hold-off: this store is new, and hold-offs are cluster-addresses.test.ts's subject.
  const ca = new ClusterAddresses(pools, store, quiet, { holdOffMs: 0 });
  const e1 = await ca.allocate({ pool: 'float', owner: 'egress/ns/a', count: 2 });
  assert.equal(e1.addresses, ['198.51.100.1', '198.51.100.2'], 'network address .0 skipped');
  assert.equal((await ca.allocate({ pool: 'float', owner: 'egress/ns/a', count: 2 })).addresses, e1.addresses, 'idempotent');
  assert.equal((await ca.allocate({ pool: 'float', owner: 'lb/ns/b', addresses: ['198.51.100.5'] })).addresses, ['198.51.100.5']);
  try {
    await ca.allocate({ pool: 'float', owner: 'lb/ns/c', addresses: ['198.51.100.2'] });
    assert.unreachable('conflict');
  } catch (e) {
    assert.is((e as TetherError).code, 'ADDRESS_CONFLICT');
    assert.match((e as Error).message, /198\.51\.100\.2 of pool "float" is held by egress\/ns\/a/);
  }
  for (const [req, re] of [
    [{ pool: 'float', owner: 'x', addresses: ['10.0.0.1'] }, /outside pool "float"/],
    [{ pool: 'float', owner: 'bad owner' }, /owner:/],
    [{ pool: 'float', owner: 'x', count: 0 }, /count: must be an integer/],
    [{ pool: 'default', owner: 'x' }, /unknown floating\/loadBalancer pool "default"/],
  ] as const) {
    await ca.allocate(req as never).then(
      () => assert.unreachable(String(re)),
      (e) => assert.match((e as Error).message, re),
    );
  }
  // 198.51.100.0/29: .1–.6 usable; 3 taken, 3 left.
  await ca.allocate({ pool: 'float', owner: 'egress/ns/big', count: 3 });
  await ca.allocate({ pool: 'float', owner: 'egress/ns/more' }).then(
    () => assert.unreachable('exhausted pool gave an address'),
    (e) => assert.is((e as TetherError).code, 'POOL_EXHAUSTED'),
  );
  assert.equal(await ca.release('float', 'egress/ns/a'), ['198.51.100.1', '198.51.100.2']);
  assert.equal(await ca.release('float', 'egress/ns/a'), [], 'release idempotent');
  assert.equal((await ca.allocate({ pool: 'float', owner: 'egress/ns/more' })).addresses, ['198.51.100.1']);
});

test('block search starts at a node-seeded block: nodes start apart, the same node always at the same block', async () => {
  const starts = new Set(Array.from({ length: 100 }, (_, i) => firstBlock(`node-${i}`, 'pods', 4, 1024n)));
  assert.ok(starts.size >= 90, `100 nodes over 1024 blocks start at ${starts.size} different blocks (all at block 0 before)`);
  assert.is(firstBlock('node-7', 'pods', 4, 1024n), firstBlock('node-7', 'pods', 4, 1024n));
  assert.ok([...starts].every((b) => b >= 0n && b < 1024n));
  assert.is(firstBlock('n1', 'pods', 4, 1n), 0n, 'a pool of one block');

  // Two real allocators (the default, seeded search) in one pool: each claims the block its name picks.
  const prefix = `seed${Date.now()}:`;
  const dirs = ['n1', 'n2'].map(() => fs.mkdtempSync(path.join(os.tmpdir(), 'tether-ipam-')));
  const store = await RedisStore.connect(redis.url, { keyPrefix: prefix });
  cleanups.push(() => store.close(), ...dirs.map((d) => () => fs.rmSync(d, { recursive: true, force: true })));
  const [a, b] = ['n1', 'n2'].map((n, i) => new PodAllocator({ name: n, labels: {} }, pools, store, new AllocationStore(dirs[i]), quiet));
  await a.start();
  await b.start();
  const blockOf = (start: bigint) => `10.60.0.${Number(start) * 8}/29`;
  const [s1, s2] = [firstBlock('n1', 'default', 4, 32n), firstBlock('n2', 'default', 4, 32n)];
  assert.is.not(s1, s2);
  const [ipA, ipB] = await Promise.all([a.allocate('default', owner('pa')), b.allocate('default', owner('pb'))]);
  assert.is(ipA.ips[0].block, blockOf(s1));
  assert.is(ipB.ips[0].block, blockOf(s2));
  assert.is.not(ipA.ips[0].block, '10.60.0.0/29', 'not block 0');
});

test('the seeded search still finds the only free block wherever it is (before the start: the walk wraps)', async () => {
  const { alloc, store } = await fixture('n1', undefined, undefined, true);
  const start4 = firstBlock('n1', 'default', 4, 32n);
  const start6 = firstBlock('n1', 'default', 6, 32n);
  const free4 = (start4 + 31n) % 32n; // just before the start: found last
  const free6 = (start6 + 17n) % 32n;
  for (let i = 0n; i < 32n; i++) {
    if (i !== free4) assert.ok(await store.claimBlock('default', `10.60.0.${Number(i) * 8}/29`, 'other'));
    if (i !== free6) assert.ok(await store.claimBlock('default', `fd00:60::${(Number(i) * 8).toString(16)}/125`, 'other'));
  }
  const got = await alloc.allocate('default', owner('only'));
  assert.equal(got.ips.map((i) => i.block), [`10.60.0.${Number(free4) * 8}/29`, `fd00:60::${(Number(free6) * 8).toString(16)}/125`]);
  await alloc.allocate('default', owner('more')); // same blocks, room left
  for (let i = 0; i < 5; i++) await alloc.allocate('default', owner(`fill${i}`));
  await alloc.allocate('default', owner('full')).then(
    () => assert.unreachable('every block is claimed and the node\'s is full'),
    (e) => assert.is((e as TetherError).code, 'POOL_EXHAUSTED'),
  );
});

test.run();
