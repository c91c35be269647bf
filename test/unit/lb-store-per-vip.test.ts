// The mapping store per VIP against a real redis-server: new mappings reach only the nodes that serve
// their VIP (per-VIP channels, nothing on a shared one); one expirer per VIP however many nodes ask; keys
// hash-tagged per VIP and bucket; loads in pages (100,000 mappings, never one whole-hash read); and what
// changed since a moment read without the rest.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import Redis from 'ioredis';
import { Writable } from 'node:stream';
import { makeLogger, setLogger } from '../../lib/log';
import { LB_STORE_BUCKETS, type StoredMapping } from '../../daemon/lb/mapping-fields';
import { connectLbStore, dropVip, type LbStore } from '../../daemon/lb/lb-store';
import { startRedis, type TestRedis } from '../lib/redis';
import { waitFor } from '../lib/wait';

setLogger(makeLogger({ level: 'error', stream: new Writable({ write: (_c, _e, cb) => cb() }) }));

const V1 = '192.0.2.11';
const V2 = '192.0.2.12';
const client = (i: number) => `10.${100 + (i >> 16)}.${(i >> 8) & 255}.${i & 255}`;
const mapping = (vip: string, i: number, target = '10.244.0.5'): StoredMapping => ({ key: { vip, client: client(i), vport: 0, cport: 0, proto: 0 }, target });
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

let redis: TestRedis;
let raw: Redis;
const stores: LbStore[] = [];

async function store(): Promise<LbStore> {
  const s = await connectLbStore(redis.url);
  stores.push(s);
  await waitFor(() => s.connection.connected, 'store connected');
  return s;
}

async function commandCalls(cmd: string): Promise<number> {
  const info = await raw.info('commandstats');
  const m = new RegExp(`cmdstat_${cmd}:calls=(\\d+)`).exec(info);
  return m ? Number(m[1]) : 0;
}

test.before(async () => {
  redis = await startRedis();
  raw = new Redis({ path: redis.socketPath });
});

test.after(async () => {
  for (const s of stores) await s.connection.close();
  raw?.disconnect();
  await redis?.stop();
});

test('a node not serving a VIP receives none of its mappings; one that stops serving it hears no more', async () => {
  const a = await store();
  const b = await store();
  const writer = await store();
  const heardA: StoredMapping[] = [];
  const heardB: StoredMapping[] = [];
  a.notices.on('mapping', (m: StoredMapping) => heardA.push(m));
  b.notices.on('mapping', (m: StoredMapping) => heardB.push(m));
  // A witness of every channel under the prefix: what travels where.
  const witness = new Redis({ path: redis.socketPath });
  const channels = new Map<string, number>();
  witness.on('pmessage', (_p: string, ch: string) => channels.set(ch, (channels.get(ch) ?? 0) + 1));
  await witness.psubscribe('tether:*');
  try {
    await a.notices.serve([V1]);
    await b.notices.serve([V2]);
    await waitFor(() => a.notices.hears(V1) && b.notices.hears(V2), 'subscribed');
    assert.ok(!a.notices.hears(V2) && !b.notices.hears(V1));
    await writer.mappings.claim(V1, Array.from({ length: 50 }, (_, i) => mapping(V1, i)));
    await writer.mappings.claim(V2, Array.from({ length: 30 }, (_, i) => mapping(V2, i)));
    await waitFor(() => heardA.length === 50 && heardB.length === 30, 'notices of both VIPs');
    await sleep(200);
    assert.ok(heardA.every((m) => m.key.vip === V1), 'a heard only V1');
    assert.ok(heardB.every((m) => m.key.vip === V2), 'b heard only V2');
    assert.is(heardA.length, 50);
    assert.is(heardB.length, 30);
    assert.equal([...channels.keys()].sort(), [a.notices.channel(V1), a.notices.channel(V2)].sort(), 'only the two per-VIP channels carried anything');
    assert.ok((channels.get(a.notices.channel(V1)) ?? 0) <= LB_STORE_BUCKETS, 'notices are batched (one per bucket written)');
    // A mapping already stored is not announced again.
    await writer.mappings.claim(V1, [mapping(V1, 0, '10.244.0.9')]);
    await b.notices.serve([]);
    await waitFor(() => !b.notices.hears(V2), 'b unsubscribed');
    await writer.mappings.claim(V2, [mapping(V2, 1000)]);
    await sleep(300);
    assert.is(heardB.length, 30, 'b no longer serves V2: nothing more');
    assert.is(heardA.length, 50, 'a did not hear the re-claim of a stored mapping');
  } finally {
    witness.disconnect();
  }
});

test('one expirer per VIP however many nodes ask; its lease lapses when it stops renewing, and another takes over', async () => {
  const a = await store();
  const b = await store();
  const nodes = Array.from({ length: 200 }, (_, i) => `node-${i}`);
  for (const vip of [V1, V2, '192.0.2.13']) {
    const got = await Promise.all(nodes.map((n, i) => (i % 2 ? a : b).leases.take(vip, n, 60_000)));
    assert.is(got.filter(Boolean).length, 1, `exactly one expirer of ${vip}`);
    const holder = nodes[got.indexOf(true)];
    assert.ok(await a.leases.take(vip, holder, 60_000), 'the holder renews');
    assert.not.ok(await a.leases.take(vip, 'someone-else', 60_000));
  }
  const vip = '192.0.2.14';
  assert.ok(await a.leases.take(vip, 'n1', 150));
  assert.not.ok(await b.leases.take(vip, 'n2', 150));
  await sleep(300);
  assert.ok(await b.leases.take(vip, 'n2', 150), 'the lease lapsed: n2 expires the VIP now');
  assert.not.ok(await a.leases.take(vip, 'n1', 150));
});

test('keys are hash-tagged per VIP and bucket: a VIP spreads over every bucket, each script stays in one slot', async () => {
  const a = await store();
  const vip = '192.0.2.20';
  await a.mappings.claim(vip, Array.from({ length: 2000 }, (_, i) => mapping(vip, i)));
  await a.leases.take(vip, 'n1', 60_000);
  const keys = await raw.keys(`tether:lb:{${vip}*`);
  const tags = new Set(keys.map((k) => /\{([^}]*)\}/.exec(k)?.[1]));
  assert.ok(keys.every((k) => /^tether:lb:\{192\.0\.2\.20(#\d+)?\}:(map|used|expirer)$/.test(k)), keys.join(' '));
  assert.is([...tags].filter((t) => t?.includes('#')).length, LB_STORE_BUCKETS, 'every bucket holds some of 2,000 mappings');
  assert.is((await a.mappings.load(vip)).mappings.length, 2000);
  await dropVip(a, vip);
  assert.equal(await raw.keys(`tether:lb:{${vip}*`), [], 'dropVip leaves nothing');
});

test('paged load of 100,000 mappings of one VIP: every one read, in pages, with no whole-hash read', async () => {
  const a = await store();
  const vip = '192.0.2.30';
  const N = 100_000;
  const list = Array.from({ length: N }, (_, i) => mapping(vip, i, `10.244.${i % 7}.5`));
  for (let i = 0; i < N; i += 10_000) await a.mappings.claim(vip, list.slice(i, i + 10_000));
  const hgetallBefore = await commandCalls('hgetall');
  const hscanBefore = await commandCalls('hscan');
  const pages: number[] = [];
  const seen = new Set<string>();
  const { loaded, garbled } = await a.mappings.loadPages(vip, (p) => {
    pages.push(p.length);
    for (const m of p) seen.add(m.key.client);
  }, 1000);
  assert.is(loaded, N);
  assert.is(garbled, 0);
  assert.is(seen.size, N, 'every client once');
  assert.ok(pages.length >= 80, `${pages.length} pages`);
  assert.ok(Math.max(...pages) <= 2000, `largest page ${Math.max(...pages)}`);
  assert.is(await commandCalls('hgetall'), hgetallBefore, 'no HGETALL');
  assert.ok((await commandCalls('hscan')) - hscanBefore >= pages.length);
  await dropVip(a, vip);
});

test('what changed since a moment is read without the rest; a touch never re-creates an expired mapping', async () => {
  const a = await store();
  const vip = '192.0.2.40';
  const t0 = Date.now();
  await a.mappings.claim(vip, Array.from({ length: 1000 }, (_, i) => mapping(vip, i)), t0 - 60_000);
  const touched = [3, 70, 500, 999].map((i) => mapping(vip, i).key);
  await a.mappings.touch(vip, touched, t0);
  await a.mappings.claim(vip, [mapping(vip, 5000, '10.244.0.8')], t0);
  const got: StoredMapping[] = [];
  const n = await a.mappings.loadChangedSince(vip, t0 - 1000, (p) => got.push(...p), 2);
  assert.is(n, 5);
  assert.equal(got.map((m) => m.key.client).sort(), [...touched.map((k) => k.client), client(5000)].sort());
  // Expire all but the fresh ones, then touch an expired one: no orphan last-use entry appears.
  const gone = await a.mappings.expire(vip, 30, t0);
  assert.is(gone.length, 996);
  await a.mappings.touch(vip, [mapping(vip, 1).key], t0 + 1);
  let used = 0;
  for (let b = 0; b < LB_STORE_BUCKETS; b++) used += await raw.zcard(`tether:lb:{${vip}#${b}}:used`);
  assert.is(used, 5);
  await dropVip(a, vip);
});

test('a removed target loses its mappings page by page; other targets keep theirs', async () => {
  const a = await store();
  const vip = '192.0.2.50';
  await a.mappings.claim(vip, Array.from({ length: 5000 }, (_, i) => mapping(vip, i, i % 5 ? '10.244.0.5' : '10.244.0.6')));
  assert.is(await a.mappings.dropTarget(vip, '10.244.0.6'), 1000);
  const left = (await a.mappings.load(vip)).mappings;
  assert.is(left.length, 4000);
  assert.ok(left.every((m) => m.target === '10.244.0.5'));
  await dropVip(a, vip);
});

test.run();
