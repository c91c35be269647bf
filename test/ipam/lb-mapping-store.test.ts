// The load balancer's mapping store against a real Redis: first writer wins, notices reach other LB pods,
// idle mappings expire by last use, a removed target's mappings go, and garbled data is refused by name.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import Redis from 'ioredis';
import { PassThrough } from 'node:stream';
import { log, makeLogger, setLogger } from '../../lib/log';
import { LB_STORE_BUCKETS, bucketOf, fieldOf, keyOf, type StoredMapping } from '../../daemon/lb/mapping-fields';
import { connectLbStore, dropVip, type LbStore } from '../../daemon/lb/lb-store';
import { HealthReports } from '../../daemon/health/health-reports';
import { startRedis, type TestRedis } from '../lib/redis';
import { waitFor } from '../lib/wait';

const VIP = '192.0.2.10';
/** The hash that holds a field of vip's mappings (its bucket's). */
const hashOf = (vip: string, field: string) => `tether:lb:{${vip}#${bucketOf(field)}}:map`;
const key = (client: string, vip = VIP) => ({ vip, client, vport: 0, cport: 0, proto: 0 });
let redis: TestRedis;
let a: LbStore;
let b: LbStore;

test.before(async () => {
  redis = await startRedis();
  a = await connectLbStore(redis.url);
  b = await connectLbStore(redis.url);
});

test.after(async () => {
  await a?.connection.close();
  await b?.connection.close();
  await redis?.stop();
});

test('fields name the client, or the whole tuple per flow, and read back', () => {
  assert.is(fieldOf(key('10.0.0.1')), 'c:10.0.0.1');
  const flow = { vip: VIP, client: '10.0.0.1', vport: 443, cport: 40000, proto: 6 };
  assert.is(fieldOf(flow), 'f:10.0.0.1:6:443:40000');
  assert.equal(keyOf(VIP, fieldOf(flow)), flow);
  for (const bad of ['x:10.0.0.1', 'c:10.0.0', 'f:10.0.0.1:6:443', 'f:10.0.0.1:6:70000:1', 'c:10.0.0.1:5']) assert.is(keyOf(VIP, bad), undefined, bad);
});

test('the first writer wins; the loser learns the winner; nodes serving the VIP get a notice', async () => {
  const heard: StoredMapping[] = [];
  b.notices.on('mapping', (m: StoredMapping) => heard.push(m));
  await waitFor(() => a.connection.connected && b.connection.connected, 'both connected');
  await b.notices.serve([VIP]);
  await waitFor(() => b.notices.hears(VIP), 'b subscribed to the VIP\'s channel');
  const won = await a.mappings.claim(VIP, [{ key: key('10.0.0.1'), target: '10.244.0.5' }]);
  assert.equal(won, [{ key: key('10.0.0.1'), target: '10.244.0.5' }]);
  const lost = await b.mappings.claim(VIP, [{ key: key('10.0.0.1'), target: '10.244.0.9' }, { key: key('10.0.0.2'), target: '10.244.0.9' }]);
  assert.equal(lost.map((m) => m.target), ['10.244.0.5', '10.244.0.9'], 'the existing mapping stays; the new one is recorded');
  await waitFor(() => heard.length >= 2, 'notices of both recorded mappings');
  assert.equal(heard.map((m) => `${m.key.client}>${m.target}`).sort(), ['10.0.0.1>10.244.0.5', '10.0.0.2>10.244.0.9']);
  const { mappings } = await a.mappings.load(VIP);
  assert.is(mappings.length, 2);
});

test('idle mappings expire by last use; touched ones stay', async () => {
  const t0 = Date.now();
  await a.mappings.claim(VIP, [{ key: key('10.0.1.1'), target: '10.244.0.5' }, { key: key('10.0.1.2'), target: '10.244.0.5' }], t0 - 60_000);
  await a.mappings.touch(VIP, [key('10.0.1.2')], t0);
  const gone = await a.mappings.expire(VIP, 30, t0);
  assert.equal(gone.map((k) => k.client), ['10.0.1.1']);
  const left = (await a.mappings.load(VIP)).mappings.map((m) => m.key.client);
  assert.ok(left.includes('10.0.1.2') && !left.includes('10.0.1.1'));
});

test('expiry works at any count: 12,000 idle mappings of one VIP all go in one call, fresh ones stay', async () => {
  // Redis's Lua unpacks at most ~8,000 values at once; one VIP easily has more idle clients than that.
  const vip = '192.0.2.77';
  const k = (i: number) => ({ vip, client: `10.${100 + (i >> 16)}.${(i >> 8) & 255}.${i & 255}`, vport: 0, cport: 0, proto: 0 });
  const t0 = Date.now();
  const idle = Array.from({ length: 12_000 }, (_, i) => ({ key: k(i), target: '10.244.0.5' }));
  const fresh = Array.from({ length: 50 }, (_, i) => ({ key: k(20_000 + i), target: '10.244.0.6' }));
  await a.mappings.claim(vip, idle, t0 - 600_000);
  await a.mappings.claim(vip, fresh, t0);
  const gone = await a.mappings.expire(vip, 300, t0);
  assert.is(gone.length, 12_000, 'every idle mapping expired');
  assert.is(new Set(gone.map((x) => x.client)).size, 12_000);
  const left = (await a.mappings.load(vip)).mappings;
  assert.equal(left.map((m) => m.key.client).sort(), fresh.map((m) => m.key.client).sort(), 'exactly the fresh ones are left');
  const raw = new Redis({ path: redis.socketPath });
  try {
    let used = 0;
    for (let i = 0; i < LB_STORE_BUCKETS; i++) used += await raw.zcard(`tether:lb:{${vip}#${i}}:used`);
    assert.is(used, 50, 'their last-use entries went too');
  } finally {
    raw.disconnect();
  }
  await dropVip(a, vip);
});

test('a removed target takes only its own mappings', async () => {
  const n = await a.mappings.dropTarget(VIP, '10.244.0.9');
  assert.is(n, 1);
  const left = (await a.mappings.load(VIP)).mappings;
  assert.ok(left.every((m) => m.target !== '10.244.0.9') && left.length >= 2);
});

test('garbled notices and fields are refused, not installed', async () => {
  const garbled: string[] = [];
  const heard: StoredMapping[] = [];
  b.notices.on('garbled', (m: string) => garbled.push(m));
  b.notices.on('mapping', (m: StoredMapping) => heard.push(m));
  const raw = new Redis({ path: redis.socketPath });
  try {
    await raw.publish(b.notices.channel(VIP), 'not json');
    await raw.publish(b.notices.channel(VIP), JSON.stringify({ vip: VIP, mappings: [['c:10.0.0.300', '10.244.0.5']] }));
    await raw.hset(hashOf(VIP, 'c:bogus'), 'c:bogus', '10.244.0.5');
    await waitFor(() => garbled.length === 2, 'both garbled notices seen');
    assert.is(heard.length, 0);
    const { garbled: bad } = await a.mappings.load(VIP);
    assert.is(bad, 1);
  } finally {
    raw.disconnect();
  }
});

test('a garbled stored mapping is refused with one warn line naming it: load leaves it out, claim keeps its own pick', async () => {
  const vip = '192.0.2.88';
  const raw = new Redis({ path: redis.socketPath });
  const out = new PassThrough();
  let text = '';
  out.on('data', (d) => (text += d));
  const prev = log();
  try {
    for (const [f, t] of [['c:10.0.9.1', 'not-an-address'], ['c:10.0.9.2', '10.244.0.5'], ['x:10.0.9.3', '10.244.0.5']]) await raw.hset(hashOf(vip, f), f, t);
    setLogger(makeLogger({ level: 'info', stream: out }));
    const { mappings, garbled } = await a.mappings.load(vip);
    assert.equal(mappings, [{ key: key('10.0.9.2', vip), target: '10.244.0.5' }]);
    assert.is(garbled, 2);
    const got = await a.mappings.claim(vip, [{ key: key('10.0.9.1', vip), target: '10.244.0.7' }]);
    assert.equal(got, [{ key: key('10.0.9.1', vip), target: '10.244.0.7' }], 'the garbage is not followed');
  } finally {
    setLogger(prev);
    raw.disconnect();
  }
  const warns = text.trim().split('\n').map((l) => JSON.parse(l) as Record<string, string>).filter((l) => l.level === 'warn');
  assert.equal(warns.map((l) => `${l.key} ${l.field}: ${l.problem}`).sort(), [
    `${hashOf(vip, 'c:10.0.9.1')} c:10.0.9.1: target is not an IPv4 address`,
    `${hashOf(vip, 'x:10.0.9.3')} x:10.0.9.3: not a mapping field (c:<client> or f:<client>:<proto>:<vport>:<cport>, an IPv6 client in brackets)`,
  ].sort());
  await dropVip(a, vip);
});

test('health reports: each node\'s latest one is read back; expired and garbled ones are dropped (and removed)', async () => {
  const report = (local: number) => ({ eligible: true, healthy: true, services: { 'shop/db': { port: 32100, open: true, localEndpoints: local, status: local ? 200 : 503 } } });
  const [ra, rb] = [new HealthReports(a.connection), new HealthReports(b.connection)];
  await ra.write('n1', report(2), 30_000);
  await rb.write('n2', report(0), 30_000);
  await ra.write('n1', report(1), 30_000); // the latest counts
  await rb.write('n3', report(1), -1); // expired
  const raw = new Redis({ path: redis.socketPath });
  try {
    await raw.hset('tether:lb:health', 'n4', 'not json', 'n5', JSON.stringify({ expiresAt: Date.now() + 30_000 }));
    const got = await ra.read();
    assert.equal(Object.keys(got).sort(), ['n1', 'n2']);
    assert.is(got.n1.services['shop/db'].localEndpoints, 1);
    assert.is(got.n2.services['shop/db'].status, 503);
    assert.equal((await raw.hkeys('tether:lb:health')).sort(), ['n1', 'n2'], 'expired and garbled entries removed');
  } finally {
    raw.disconnect();
  }
});

test('with Redis gone, calls fail fast instead of hanging; after a restart (empty) the store works again', async () => {
  await redis.kill();
  const t0 = Date.now();

  let failed = false;
  try {
    await a.mappings.claim(VIP, [{ key: key('10.0.2.1'), target: '10.244.0.5' }]);
  } catch {
    failed = true;
  }
  assert.ok(failed && Date.now() - t0 < 3000, 'a claim without Redis fails within the command timeout');
  await redis.restart();
  await waitFor(() => a.connection.connected, 'reconnected', { timeoutMs: 5000 });
  assert.is((await a.mappings.load(VIP)).mappings.length, 0, 'the restarted Redis is empty');
  await a.mappings.claim(VIP, [{ key: key('10.0.2.1'), target: '10.244.0.5' }]);
  assert.is((await a.mappings.load(VIP)).mappings.length, 1);
});

test.run();
