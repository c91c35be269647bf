// The load balancer's store formats with IPv6 VIPs, clients and targets, against a real redis-server: the
// hash fields (an IPv6 client in brackets, canonical text, so one mapping is one field and one bucket), the
// first writer winning, notices on the VIP's own channel, paged and since-a-moment loads, expiry, a target's
// removal, the node's VIP record; IPv4 fields exactly as before; and what is refused by name: an IPv6 client
// unbracketed or not canonical, a client or target of the other family, a field a release before could
// misread.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import Redis from 'ioredis';
import { Writable } from 'node:stream';
import { makeLogger, setLogger } from '../../lib/log';
import { bucketOf, fieldOf, keyOf, type StoredMapping } from '../../daemon/lb/mapping-fields';
import { connectLbStore, type LbStore } from '../../daemon/lb/lb-store';
import { VIP_RECORD_FILE, VipRecord } from '../../daemon/lb/vip-record';
import { startRedis, type TestRedis } from '../lib/redis';
import { waitFor } from '../lib/wait';

const quiet = makeLogger({ level: 'error', stream: new Writable({ write: (_c, _e, cb) => cb() }) });
setLogger(quiet);

const V6 = '2001:db8:80::1';
const V4 = '192.0.2.11';
/** Canonical text (inet_ntop's, as the datapath prints it): no "::0". */
const client = (i: number) => `2001:db8:51::${(i + 1).toString(16)}`;
const m6 = (i: number, target = 'fd00:244::5', flow = false): StoredMapping => ({ key: { vip: V6, client: client(i), vport: flow ? 443 : 0, cport: flow ? 40000 + i : 0, proto: flow ? 6 : 0 }, target });

let redis: TestRedis;
let raw: Redis;
const stores: LbStore[] = [];
async function store(): Promise<LbStore> {
  const s = await connectLbStore(redis.url, { keyPrefix: 'six:' });
  stores.push(s);
  await waitFor(() => s.connection.connected, 'store connected');
  return s;
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

test('fields: an IPv6 client in brackets, read back; IPv4 fields as before; what is not a mapping of the VIP is refused', () => {
  const flow = { vip: V6, client: '2001:db8:51::21', vport: 443, cport: 50000, proto: 6 };
  assert.is(fieldOf(flow), 'f:[2001:db8:51::21]:6:443:50000');
  assert.is(fieldOf({ ...flow, vport: 0, cport: 0, proto: 0 }), 'c:[2001:db8:51::21]');
  assert.equal(keyOf(V6, 'f:[2001:db8:51::21]:6:443:50000'), flow);
  assert.equal(keyOf(V6, 'c:[::ffff:10.0.0.1]'), { vip: V6, client: '::ffff:10.0.0.1', vport: 0, cport: 0, proto: 0 }, 'an IPv4-mapped client in its inet_ntop text');
  // IPv4: unchanged, byte for byte.
  assert.is(fieldOf({ vip: V4, client: '198.51.100.21', vport: 443, cport: 50000, proto: 6 }), 'f:198.51.100.21:6:443:50000');
  assert.equal(keyOf(V4, 'c:198.51.100.20'), { vip: V4, client: '198.51.100.20', vport: 0, cport: 0, proto: 0 });
  for (const bad of [
    'c:2001:db8:51::21', // unbracketed: the separators would be ambiguous
    'f:2001:db8:51::21:6:443:50000',
    'c:[2001:DB8:51::21]', // not canonical: another spelling would be another field, in another bucket
    'c:[2001:db8:51:0::21]',
    'c:[fe80::1%eth0]',
    'c:[2001:db8:51::21', 'c:[2001:db8:51::21]x', 'f:[2001:db8:51::21]:6:443', 'f:[2001:db8:51::21]6:443:1', 'f:[2001:db8:51::21]:256:443:1',
    'c:[198.51.100.20]', // an IPv4 client, bracketed
    'c:198.51.100.20', // an IPv4 client of an IPv6 VIP
  ]) assert.is(keyOf(V6, bad), undefined, bad);
  assert.is(keyOf(V4, 'c:[2001:db8:51::21]'), undefined, 'an IPv6 client of an IPv4 VIP');
  // What a release before does with a v2 field: split on ':' finds the wrong number of parts.
  const before = (f: string) => f.split(':').length;
  assert.ok(before('c:[2001:db8:51::21]') !== 2 && before('f:[2001:db8:51::21]:6:443:50000') !== 5, 'a release before reads no bracketed field as a mapping');
  assert.ok(new Set(Array.from({ length: 64 }, (_, i) => bucketOf(fieldOf(m6(i).key)))).size > 8, 'IPv6 fields spread over the buckets');
});

test('an IPv6 VIP\'s mappings: first writer wins, the serving node hears them, loads (paged and since) give them back; expiry and a removed target', async () => {
  const a = await store();
  const b = await store();
  const heard: StoredMapping[] = [];
  b.notices.on('mapping', (m: StoredMapping) => heard.push(m));
  const garbled: string[] = [];
  b.notices.on('garbled', (m: string) => garbled.push(m));
  await b.notices.serve([V6]);
  await waitFor(() => b.notices.hears(V6), 'subscribed');
  const list = [...Array.from({ length: 40 }, (_, i) => m6(i)), ...Array.from({ length: 10 }, (_, i) => m6(100 + i, 'fd00:244::6', true))];
  const got = await a.mappings.claim(V6, list, 1_000_000);
  assert.equal(got, list);
  // Another LB pod picks another target for client 0: the first writer's stands.
  const again = await b.mappings.claim(V6, [m6(0, 'fd00:244::9')], 1_000_100);
  assert.equal(again, [m6(0)]);
  await waitFor(() => heard.length === 50, 'the notices');
  assert.equal([...heard].sort((x, y) => fieldOf(x.key).localeCompare(fieldOf(y.key))), [...list].sort((x, y) => fieldOf(x.key).localeCompare(fieldOf(y.key))));
  assert.equal(garbled, []);
  const { mappings, garbled: bad } = await b.mappings.load(V6);
  assert.equal([mappings.length, bad], [50, 0]);
  const stored = await raw.hgetall(`six:lb:{${V6}#${bucketOf('c:[2001:db8:51::1]')}}:map`);
  assert.is(stored['c:[2001:db8:51::1]'], 'fd00:244::5', 'the field as the golden shows it');
  await a.mappings.touch(V6, [m6(1).key], 2_000_000);
  const since: StoredMapping[] = [];
  assert.is(await b.mappings.loadChangedSince(V6, 1_500_000, (p) => since.push(...p)), 1);
  assert.equal(since, [m6(1)]);
  assert.is(await a.mappings.dropTarget(V6, 'fd00:244::6'), 10, 'the flow mappings to the removed target');
  const gone = await a.mappings.expire(V6, 600, 1_000_000 + 700_000);
  assert.is(gone.length, 39, 'every idle mapping but the touched one');
  assert.equal((await b.mappings.load(V6)).mappings, [m6(1)]);
});

test('refused by name, not followed: an IPv6 VIP\'s stored target of the other family, a field that is not a mapping, a notice with an IPv4 target', async () => {
  const a = await store();
  const hash = `six:lb:{${V6}#${bucketOf('c:[2001:db8:51::78]')}}:map`;
  await raw.hset(hash, 'c:[2001:db8:51::78]', '10.244.0.5', 'c:2001:db8:51::79', 'fd00:244::5');
  const { mappings, garbled } = await a.mappings.load(V6);
  assert.equal([mappings.filter((m) => m.key.client.endsWith('::78')), garbled >= 1], [[], true]);
  // The claim keeps this pod's own pick over a stored target of the wrong family.
  assert.equal(await a.mappings.claim(V6, [m6(0x77)]), [m6(0x77)]);
  const heard: StoredMapping[] = [];
  const garbledNotices: string[] = [];
  a.notices.on('mapping', (m: StoredMapping) => heard.push(m));
  a.notices.on('garbled', (m: string) => garbledNotices.push(m));
  await a.notices.serve([V6]);
  await waitFor(() => a.notices.hears(V6), 'subscribed');
  await raw.publish(a.notices.channel(V6), JSON.stringify({ vip: V6, mappings: [['c:[2001:db8:51::80]', '10.244.0.5'], ['c:[2001:db8:51::81]', 'fd00:244::5']] }));
  await waitFor(() => heard.length + garbledNotices.length === 2, 'both entries');
  assert.equal(heard, [{ key: { vip: V6, client: '2001:db8:51::81', vport: 0, cport: 0, proto: 0 }, target: 'fd00:244::5' }]);
  assert.match(garbledNotices[0], /10\.244\.0\.5/);
});

test('the node\'s VIP record keeps an IPv6 VIP under <ns>/<name>#IPv6 beside the IPv4 one (version 1 unchanged)', () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tether-vip6-'));
  try {
    new VipRecord(dir, quiet).save(new Map([['shop/web', { pool: 'lb', vip: '198.51.100.7' }], ['shop/web#IPv6', { pool: 'lb', vip: '2001:db8:5::7' }]]));
    const text = fs.readFileSync(path.join(dir, VIP_RECORD_FILE), 'utf8');
    assert.is(text, '{"v":1,"vips":{"shop/web":{"pool":"lb","vip":"198.51.100.7"},"shop/web#IPv6":{"pool":"lb","vip":"2001:db8:5::7"}}}\n');
    const r = new VipRecord(dir, quiet);
    assert.equal([r.get('shop/web', 'lb'), r.get('shop/web#IPv6', 'lb')], ['198.51.100.7', '2001:db8:5::7']);
    // What a release before keeps of it: the IPv4 entry (it takes IPv4 VIPs only).
    const before = Object.entries(JSON.parse(text).vips as Record<string, { vip: string }>).filter(([, x]) => /^\d+\.\d+\.\d+\.\d+$/.test(x.vip)).map(([k]) => k);
    assert.equal(before, ['shop/web']);
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test.run();
