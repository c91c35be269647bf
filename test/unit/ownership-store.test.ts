// The egress ownership store reading garbage and older-schema records from a real Redis: a garbled
// ownership record is never read as "nobody owns it" (that could move a live owner's address) but refused
// with a typed error and one warn line naming key and field; an older tetherd's record is read without
// owner location; a garbled epoch is replaced by a holder's decision but refuses the first-owner claim;
// registrations, node addresses, usage and change notices that are garbled are left out, the rest kept.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { captureLog } from '../lib/log-capture';
import Redis from 'ioredis';
import { ErrorCode } from '../../lib/errors';
import { makeLogger, setLogger } from '../../lib/log';
import { OwnershipStore, UnreadableRecordError, type GatewayInfo, type Ownership } from '../../daemon/egress/ownership-store';
import { startRedis, type TestRedis } from '../lib/redis';
import { waitFor } from '../lib/wait';
import { isCanonicalIp, readNodeAddress } from '../../daemon/common/store-record';

// Quiet unless a test captures the log itself.
test.before(() => setLogger(makeLogger({ level: process.env.TETHER_LOG_LEVEL ?? 'error' })));

let redis: TestRedis;
let raw: Redis;
let store: OwnershipStore;
let n = 0;
const prefix = () => `own${++n}:`;

test.before(async () => {
  redis = await startRedis();
  raw = new Redis({ path: redis.socketPath });
});
test.after.each(async () => {
  await store?.close();
});
test.after(async () => {
  raw?.disconnect();
  await redis?.stop();
});

const logged = captureLog;

const gw = (pod: string, node: string, nodeAddress: string, podIp: string): GatewayInfo => ({ pod, node, nodeAddress, podIp });

test('get(): no record is "nobody"; a garbled one throws UnreadableRecordError (TRY_AGAIN_LATER) with one warn line naming key and field', async () => {
  const p = prefix();
  store = await OwnershipStore.connect(redis.url, { keyPrefix: p });
  assert.equal(await store.get('shop/out', '198.51.100.1'), { egress: 'shop/out', address: '198.51.100.1', owner: '', epoch: 0 });
  const good: Ownership & { score: string } = { egress: 'shop/out', address: '198.51.100.2', owner: 'shop/gw1', epoch: 2, cause: 'failover', ownerNode: 'n1', ownerNodeAddress: '10.0.0.1', ownerPodIp: '10.244.0.5', score: 'a1' };
  assert.is(await store.record(good), 'recorded');

  const key = (a: string) => `${p}egress:shop/out:owner:${a}`;
  const cases: Array<[string, Record<string, string>, string, RegExp]> = [
    ['198.51.100.10', { owner: 'shop/gw1', epoch: 'abc' }, 'epoch', /not a non-negative integer/],
    ['198.51.100.11', { owner: 'shop/gw1', epoch: '-1' }, 'epoch', /not a non-negative integer/],
    ['198.51.100.12', { owner: 'shop/gw1', epoch: '1.5' }, 'epoch', /not a non-negative integer/],
    ['198.51.100.13', { owner: 'shop/gw1' }, 'epoch', /missing/],
    ['198.51.100.14', { epoch: '3' }, 'owner', /missing/],
    ['198.51.100.15', { owner: 'not a pod', epoch: '3' }, 'owner', /not a pod name/],
    ['198.51.100.16', { owner: 'shop/gw1', epoch: '3', score: 'x', ownerNode: 'n1', ownerNodeAddress: '10.0.0.300' }, 'ownerNodeAddress', /not an IP/],
    ['198.51.100.17', { owner: 'shop/gw1', epoch: '3', score: 'x', ownerNode: 'n\nforged', ownerPodIp: '10.244.0.5' }, 'ownerNode', /not a node name/],
  ];
  for (const [a, h, field, re] of cases) {
    await raw.hset(key(a), h);
    const lines = await logged(async () => {
      for (let i = 0; i < 2; i++) {
        try {
          await store.get('shop/out', a);
          assert.unreachable(`${a} ${JSON.stringify(h)} read as a record`);
        } catch (e) {
          assert.instance(e, UnreadableRecordError, (e as Error).message);
          const u = e as UnreadableRecordError;
          assert.is(u.code, ErrorCode.TryAgainLater);
          assert.is(u.key, key(a));
          assert.is(u.field, field);
          assert.match(u.problem, re);
          assert.match(u.message, /unreachable/);
        }
      }
    });
    const warns = lines.filter((l) => l.level === 'warn');
    assert.is(warns.length, 1, `one warn line for ${a} over two reads: ${JSON.stringify(lines)}`);
    assert.is(warns[0].key, key(a));
    assert.is(warns[0].field, field);
    assert.match(String(warns[0].problem), re);
  }
  assert.equal(await store.get('shop/out', '198.51.100.2'), { egress: 'shop/out', address: '198.51.100.2', owner: 'shop/gw1', epoch: 2, cause: 'failover', ownerNode: 'n1', ownerNodeAddress: '10.0.0.1', ownerPodIp: '10.244.0.5' }, 'the good record is unaffected');
});

test('an older tetherd\'s record (owner, epoch, cause, at) is read as it is, without owner location, and said so once', async () => {
  const p = prefix();
  store = await OwnershipStore.connect(redis.url, { keyPrefix: p });
  await raw.hset(`${p}egress:shop/out:owner:198.51.100.1`, { owner: 'shop/gw1', epoch: '3', cause: 'initial', at: '2026-01-01T00:00:00.000Z' });
  const lines = await logged(async () => {
    assert.equal(await store.get('shop/out', '198.51.100.1'), { egress: 'shop/out', address: '198.51.100.1', owner: 'shop/gw1', epoch: 3, cause: 'initial', ownerNode: undefined, ownerNodeAddress: undefined, ownerPodIp: undefined });
    await store.get('shop/out', '198.51.100.1');
  });
  assert.is(lines.filter((l) => /older tetherd/.test(String(l.message))).length, 1, JSON.stringify(lines));
  // Its owner's next record upgrades it (the score-less record loses the tie to a scored one at the same epoch).
  assert.is(await store.record({ egress: 'shop/out', address: '198.51.100.1', owner: 'shop/gw1', epoch: 3, ownerNode: 'n1', ownerNodeAddress: '10.0.0.1', ownerPodIp: '10.244.0.5', score: 'a1' }), 'same');
  assert.is(await store.record({ egress: 'shop/out', address: '198.51.100.1', owner: 'shop/gw1', epoch: 4, cause: 'restart', ownerNode: 'n1', ownerNodeAddress: '10.0.0.1', ownerPodIp: '10.244.0.5', score: 'a1' }), 'recorded');
  assert.is((await store.get('shop/out', '198.51.100.1')).ownerNode, 'n1');
});

test('a garbled epoch refuses the first-owner claim, and a holder\'s decision replaces it', async () => {
  const p = prefix();
  store = await OwnershipStore.connect(redis.url, { keyPrefix: p });
  const key = `${p}egress:shop/out:owner:198.51.100.1`;
  await raw.hset(key, { owner: 'shop/gw9', epoch: 'garbage' });
  const first = { egress: 'shop/out', address: '198.51.100.1', owner: 'shop/gw1', epoch: 1, cause: 'initial', ownerNode: 'n1', ownerNodeAddress: '10.0.0.1', ownerPodIp: '10.244.0.5', score: 'a1' };
  await store.record(first, { firstOnly: true }).then(
    () => assert.unreachable('a first-owner claim over an unreadable record'),
    (e) => {
      assert.instance(e, UnreadableRecordError);
      assert.is((e as UnreadableRecordError).field, 'epoch');
    },
  );
  assert.is(await raw.hget(key, 'owner'), 'shop/gw9', 'nothing written');
  const lines = await logged(async () => {
    assert.is(await store.record({ ...first, epoch: 5, cause: 'failover' }), 'recorded');
  });
  assert.ok(lines.some((l) => l.level === 'warn' && /garbled epoch replaced/.test(String(l.message))), JSON.stringify(lines));
  assert.equal(await store.get('shop/out', '198.51.100.1'), { egress: 'shop/out', address: '198.51.100.1', owner: 'shop/gw1', epoch: 5, cause: 'failover', ownerNode: 'n1', ownerNodeAddress: '10.0.0.1', ownerPodIp: '10.244.0.5' });
});

test('listGateways, listNodes and usage leave out garbled entries (one warn line each) and keep the rest', async () => {
  const p = prefix();
  store = await OwnershipStore.connect(redis.url, { keyPrefix: p });
  await store.registerGateways('shop/out', 'n1', [gw('shop/gw1', 'n1', '10.0.0.1', '10.244.0.5')], 30_000);
  await store.registerGateways('shop/out', 'n4', [gw('shop/gw4', 'n4', '10.0.0.4', '10.244.4.5')], -1); // expired: not garbage
  const gkey = `{${p}egress:shop/out}:gateways`;
  const later = Date.now() + 30_000;
  // Garbage as a bug or a hand edit could leave it: live entries (an expiry in the future) with bad values.
  const live = async (key: string, h: Record<string, string>) => {
    await raw.hset(key, h);
    for (const m of Object.keys(h)) await raw.zadd(`${key}:expiry`, later, m);
  };
  await live(gkey, {
    n2: 'not json',
    n3: JSON.stringify({ gateways: [gw('shop/gw3', 'n3', '10.0.0.300', '10.244.3.5')] }),
    n5: JSON.stringify({ gateways: 'shop/gw5' }),
    n6: JSON.stringify({ gateways: [{ ...gw('shop/gw6', 'n6', '10.0.0.6', '10.244.6.5'), maxAddresses: -2 }] }),
  });
  // An entry without an expiry (nobody heartbeats it) is removed by the first whole read.
  await raw.hset(gkey, 'n7', JSON.stringify({ gateways: [gw('shop/gw7', 'n7', '10.0.0.7', '10.244.7.5')] }));
  await store.registerNode('n1', '10.0.0.1', 30_000);
  await live(`{${p}nodes}`, { n2: 'not json', n3: JSON.stringify({ address: '10.0.0.300' }), n4: JSON.stringify({ addr: '10.0.0.4' }) });
  await store.reportUsage('shop/out', 'n1', { '198.51.100.1': { flows: 2, bytes: 100 } }, 30_000);
  await live(`{${p}egress:shop/out}:usage`, { n2: JSON.stringify({ usage: { '198.51.100.1': { flows: 'many', bytes: 1 } } }) });

  // Read by a node that has read nothing yet (one whose copy is current would be sent no changes: the
  // garbage was written behind the registry's back, without a new version).
  const reader = await OwnershipStore.connect(redis.url, { keyPrefix: p });
  const lines = await logged(async () => {
    assert.equal(await reader.listGateways('shop/out'), [gw('shop/gw1', 'n1', '10.0.0.1', '10.244.0.5')]);
    assert.equal(await reader.listNodes(), ['10.0.0.1']);
    assert.equal(await reader.usage('shop/out'), { '198.51.100.1': { flows: 2, bytes: 100 } });
  }).finally(() => reader.close());
  assert.is(await raw.hexists(gkey, 'n7'), 0, 'the entry without an expiry is gone');
  assert.is(await raw.hexists(gkey, 'n4'), 0, 'the expired entry is gone');
  // Hash order is Redis's: compare sorted.
  const warns = lines.filter((l) => l.level === 'warn').map((l) => `${String(l.key).replace(`{${p}`, '').replace('}', '')} ${l.field}: ${l.problem}`).sort();
  assert.equal(warns, [
    'egress:shop/out:gateways n2: not JSON',
    'egress:shop/out:gateways n3: gateways[0].nodeAddress is not an IPv4 address or an IPv6 one in brackets',
    'egress:shop/out:gateways n5: gateways is not a list',
    'egress:shop/out:gateways n6: gateways[0].maxAddresses is not a non-negative integer',
    'nodes n2: not JSON',
    'nodes n3: address is not an IPv4 address or an IPv6 one in brackets',
    'nodes n4: address is not an IPv4 address or an IPv6 one in brackets',
    'egress:shop/out:usage n2: not a usage entry ({usage: {address: {flows, bytes}}})',
  ].sort());
});

test('a node on an IPv6 underlay: its address is stored in brackets (0.1.0 refuses those records by that field) and read back plain', async () => {
  const p = prefix();
  store = await OwnershipStore.connect(redis.url, { keyPrefix: p });
  const got = await store.registerGateways('shop/out', 'n1', [gw('shop/gw1', 'n1', 'fd00:18::11', 'fd00:10:244::5')], 30_000);
  assert.equal(got.map((g) => g.nodeAddress), ['fd00:18::11']);
  const stored = JSON.parse((await raw.hget(`{${p}egress:shop/out}:gateways`, 'n1'))!);
  assert.is(stored.gateways[0].nodeAddress, '[fd00:18::11]');
  // 0.1.0 checks these fields with isCanonicalIp: a bracketed address is not one, so it refuses the record.
  assert.not.ok(isCanonicalIp('[fd00:18::11]'));
  await store.record({ egress: 'shop/out', address: 'fd00:18::200', owner: 'shop/gw1', epoch: 1, cause: 'initial', score: '1', ownerNode: 'n1', ownerNodeAddress: 'fd00:18::11', ownerPodIp: 'fd00:10:244::5' });
  const own = await store.get('shop/out', 'fd00:18::200');
  assert.is(own.ownerNodeAddress, 'fd00:18::11');
  const keys = await raw.keys(`${p}*owner*`);
  assert.is(await raw.hget(keys[0], 'ownerNodeAddress'), '[fd00:18::11]');
  // IPv4 node addresses are written as before, which 0.1.0 reads beside this release.
  await store.registerGateways('shop/out', 'n2', [gw('shop/gw2', 'n2', '10.0.0.2', '10.244.2.5')], 30_000);
  assert.is(JSON.parse((await raw.hget(`{${p}egress:shop/out}:gateways`, 'n2'))!).gateways[0].nodeAddress, '10.0.0.2');
  // A plain IPv6 node address is no registration this release writes: refused like any garbled one.
  assert.is(readNodeAddress('fd00:18::11'), undefined);
  assert.is(readNodeAddress('[10.0.0.1]'), undefined);
});

test('change notices that are not ownership decisions are refused (one warn line each); good ones arrive', async () => {
  const p = prefix();
  store = await OwnershipStore.connect(redis.url, { keyPrefix: p });
  const heard: Ownership[] = [];
  store.on('change', (o: Ownership) => heard.push(o));
  await new Promise((r) => setTimeout(r, 100)); // subscribed on ready
  const ch = `${p}egress-ownership`;
  const good = { egress: 'shop/out', address: '198.51.100.1', owner: 'shop/gw1', epoch: 2, cause: 'failover', ownerNode: 'n1', ownerNodeAddress: '10.0.0.1', ownerPodIp: '10.244.0.5' };
  const lines = await logged(async () => {
    for (const bad of ['not json', '[1,2]', JSON.stringify({ ...good, epoch: -1 }), JSON.stringify({ ...good, epoch: '2' }), JSON.stringify({ ...good, address: 'x' }), JSON.stringify({ ...good, owner: 7 }), JSON.stringify({ ...good, ownerPodIp: '10.244.0.500' })]) {
      await raw.publish(ch, bad);
    }
    await raw.publish(ch, JSON.stringify(good));
    await waitFor(() => heard.length === 1, 'the good notice');
  });
  assert.equal(heard, [good]);
  const warns = lines.filter((l) => l.level === 'warn');
  assert.equal(warns.map((l) => l.field ?? '-'), ['-', '-', 'epoch', 'epoch', 'address', 'owner', 'ownerPodIp']);
  assert.ok(warns.every((l) => l.key === ch));
});

test.run();
