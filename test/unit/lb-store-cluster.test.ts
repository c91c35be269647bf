// The per-VIP mapping store on a real 3-primary Redis Cluster (test/lib/redis-cluster.ts) through tetherd's
// connection factory (redis+cluster://, ioredis's Cluster client): every script stays in one slot
// while a VIP's buckets spread over the primaries, new mappings go by sharded pub/sub (SPUBLISH /
// SSUBSCRIBE) to nodes serving the VIP only, and paged loads, the expirer lease and expiry work as on one
// server.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { startRedisCluster, type RedisCluster } from '../lib/redis-cluster';
import { Writable } from 'node:stream';
import { makeLogger, setLogger } from '../../daemon/log';
import { LB_STORE_BUCKETS, MappingStore, type StoredMapping } from '../../daemon/lb/mapping-store';
import { waitFor } from '../lib/wait';

setLogger(makeLogger({ level: 'error', stream: new Writable({ write: (_c, _e, cb) => cb() }) }));

const VIP = '192.0.2.60';
const OTHER = '192.0.2.61';
const mapping = (vip: string, i: number): StoredMapping => ({ key: { vip, client: `10.${100 + (i >> 16)}.${(i >> 8) & 255}.${i & 255}`, vport: 0, cport: 0, proto: 0 }, target: '10.244.0.5' });

let cluster: RedisCluster;
const stores: MappingStore[] = [];

test.before(async () => {
  cluster = await startRedisCluster();
});

test.after(async () => {
  for (const s of stores) await s.close();
  await cluster?.stop();
});

/** A node's store, connected the way tetherd connects (redis+cluster:// through the connection factory). */
async function store(): Promise<MappingStore> {
  const s = await MappingStore.connect(cluster.url);
  stores.push(s);
  await waitFor(() => s.connected, 'cluster client ready');
  return s;
}

test('a VIP spreads over the primaries; scripts, paged loads, the expirer and expiry work on the Cluster', async () => {
  const a = await store();
  assert.ok(a.sharded, 'notices go by sharded pub/sub');
  const t0 = Date.now();
  await a.claim(VIP, Array.from({ length: 3000 }, (_, i) => mapping(VIP, i)), t0 - 60_000);
  // Each bucket's keys sit on one primary; together the buckets cover more than one.
  const owners = new Set<number>();
  for (let b = 0; b < LB_STORE_BUCKETS; b++) {
    const slot = await cluster.slotOf(`tether:lb:{${VIP}#${b}}:map`);
    assert.is(await cluster.slotOf(`tether:lb:{${VIP}#${b}}:used`), slot, 'hash and sorted set share a slot');
    owners.add(await cluster.primaryOf(slot));
  }
  assert.ok(owners.size >= 2, `buckets on ${owners.size} primaries`);
  let pages = 0;
  const { loaded } = await a.loadPages(VIP, () => pages++, 100);
  assert.is(loaded, 3000);
  assert.ok(pages >= LB_STORE_BUCKETS);
  assert.ok(await a.expirer(VIP, 'n1', 10_000));
  assert.not.ok(await a.expirer(VIP, 'n2', 10_000));
  await a.touch(VIP, [mapping(VIP, 1).key], t0);
  assert.is((await a.expire(VIP, 30, t0)).length, 2999);
  assert.is(await a.dropTarget(VIP, '10.244.0.5'), 1);
  await a.dropVip(VIP);
});

test('on the Cluster, new mappings reach by sharded pub/sub only the nodes serving their VIP', async () => {
  const writer = await store();
  const serving = await store();
  const elsewhere = await store();
  const heard: StoredMapping[] = [];
  const heardElsewhere: StoredMapping[] = [];
  serving.on('mapping', (m: StoredMapping) => heard.push(m));
  elsewhere.on('mapping', (m: StoredMapping) => heardElsewhere.push(m));
  await serving.serve([VIP]);
  await elsewhere.serve([OTHER]);
  await waitFor(() => serving.hears(VIP) && elsewhere.hears(OTHER), 'subscribed');
  await writer.claim(VIP, Array.from({ length: 200 }, (_, i) => mapping(VIP, i)));
  await waitFor(() => heard.length === 200, 'the serving node heard all 200', { timeoutMs: 5000 });
  await new Promise((r) => setTimeout(r, 200));
  assert.is(heardElsewhere.length, 0, 'a node serving another VIP heard none');
  assert.ok(heard.every((m) => m.key.vip === VIP));
  await writer.dropVip(VIP);
});

test.run();
