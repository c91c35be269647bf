// The per-VIP mapping store on a real 3-primary Redis Cluster (test/lib/redis-cluster.ts) through tetherd's
// connection factory (redis+cluster://, ioredis's Cluster client): every script stays in one slot
// while a VIP's buckets spread over the primaries, new mappings go by sharded pub/sub (SPUBLISH /
// SSUBSCRIBE) to nodes serving the VIP only, and paged loads, the expirer lease and expiry work as on one
// server.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { startRedisCluster, type RedisCluster } from '../lib/redis-cluster';
import { Writable } from 'node:stream';
import { makeLogger, setLogger } from '../../lib/log';
import { bucketOf, fieldOf, LB_STORE_BUCKETS, type StoredMapping } from '../../daemon/lb/mapping-fields';
import { connectLbStore, dropVip, type LbStore } from '../../daemon/lb/lb-store';
import { waitFor } from '../lib/wait';

setLogger(makeLogger({ level: 'error', stream: new Writable({ write: (_c, _e, cb) => cb() }) }));

const VIP = '192.0.2.60';
const OTHER = '192.0.2.61';
const mapping = (vip: string, i: number): StoredMapping => ({ key: { vip, client: `10.${100 + (i >> 16)}.${(i >> 8) & 255}.${i & 255}`, vport: 0, cport: 0, proto: 0 }, target: '10.244.0.5' });

let cluster: RedisCluster;
const stores: LbStore[] = [];

test.before(async () => {
  cluster = await startRedisCluster();
});

test.after(async () => {
  for (const s of stores) await s.connection.close();
  await cluster?.stop();
});

/** A node's store, connected the way tetherd connects (redis+cluster:// through the connection factory). */
async function store(): Promise<LbStore> {
  const s = await connectLbStore(cluster.url);
  stores.push(s);
  await waitFor(() => s.connection.connected, 'cluster client ready');
  return s;
}

test('a VIP spreads over the primaries; scripts, paged loads, the expirer and expiry work on the Cluster', async () => {
  const a = await store();
  assert.ok(a.connection.sharded, 'notices go by sharded pub/sub');
  const t0 = Date.now();
  await a.mappings.claim(VIP, Array.from({ length: 3000 }, (_, i) => mapping(VIP, i)), t0 - 60_000);
  // Each bucket's keys sit on one primary; together the buckets cover more than one.
  const owners = new Set<number>();
  for (let b = 0; b < LB_STORE_BUCKETS; b++) {
    const slot = await cluster.slotOf(`tether:lb:{${VIP}#${b}}:map`);
    assert.is(await cluster.slotOf(`tether:lb:{${VIP}#${b}}:used`), slot, 'hash and sorted set share a slot');
    owners.add(await cluster.primaryOf(slot));
  }
  assert.ok(owners.size >= 2, `buckets on ${owners.size} primaries`);
  let pages = 0;
  const { loaded } = await a.mappings.loadPages(VIP, () => pages++, 100);
  assert.is(loaded, 3000);
  assert.ok(pages >= LB_STORE_BUCKETS);
  assert.ok(await a.leases.take(VIP, 'n1', 10_000));
  assert.not.ok(await a.leases.take(VIP, 'n2', 10_000));
  await a.mappings.touch(VIP, [mapping(VIP, 1).key], t0);
  assert.is((await a.mappings.expire(VIP, 30, t0)).length, 2999);
  assert.is(await a.mappings.dropTarget(VIP, '10.244.0.5'), 1);
  await dropVip(a, VIP);
});

test('on the Cluster, new mappings reach by sharded pub/sub only the nodes serving their VIP', async () => {
  const writer = await store();
  const serving = await store();
  const elsewhere = await store();
  const heard: StoredMapping[] = [];
  const heardElsewhere: StoredMapping[] = [];
  serving.notices.on('mapping', (m: StoredMapping) => heard.push(m));
  elsewhere.notices.on('mapping', (m: StoredMapping) => heardElsewhere.push(m));
  await serving.notices.serve([VIP]);
  await elsewhere.notices.serve([OTHER]);
  await waitFor(() => serving.notices.hears(VIP) && elsewhere.notices.hears(OTHER), 'subscribed');
  await writer.mappings.claim(VIP, Array.from({ length: 200 }, (_, i) => mapping(VIP, i)));
  await waitFor(() => heard.length === 200, 'the serving node heard all 200', { timeoutMs: 5000 });
  await new Promise((r) => setTimeout(r, 200));
  assert.is(heardElsewhere.length, 0, 'a node serving another VIP heard none');
  assert.ok(heard.every((m) => m.key.vip === VIP));
  await dropVip(writer, VIP);
});

// Last, because it leaves one primary dead (its replica serves): the primary serving a VIP's notice channel
// is SIGKILLed while the primaries of its mapping buckets stay up. A claim then records the mapping but cannot
// publish its notice, and its retry finds the mapping recorded (not fresh). The notice must still reach the
// nodes serving the VIP once a replica took over (it did not: seen on the testbed as LB nodes whose mapping
// counts never met the store's after a failover), and the serving node's store tells that its sharded
// subscription was made again ('resubscribed': notices may have been missed).
const FAILOVER_VIP = '192.0.2.70';
const failoverMapping = (i: number): StoredMapping => ({ key: { vip: FAILOVER_VIP, client: `10.7.${i >> 8}.${i & 255}`, vport: 0, cport: 0, proto: 0 }, target: '10.244.0.9' });

test('a notice whose publish failed while its channel primary was down reaches the serving node after the failover', async () => {
  const writer = await store();
  const serving = await store();
  const heard = new Set<string>();
  serving.notices.on('mapping', (m: StoredMapping) => heard.add(m.key.client));
  let resubscribedAt = 0;
  serving.notices.on('resubscribed', () => (resubscribedAt = Date.now()));
  await serving.notices.serve([FAILOVER_VIP]);
  await waitFor(() => serving.notices.hears(FAILOVER_VIP), 'subscribed');

  const victim = await cluster.primaryOf(await cluster.slotOf(`tether:lb:{${FAILOVER_VIP}}:notices`));
  // Mappings whose bucket lives on another primary: their claim's script runs while the channel is down.
  const bucketPrimary = new Map<number, number>();
  const onLive: StoredMapping[] = [];
  for (let i = 1; onLive.length < 6 && i < 2000; i++) {
    const m = failoverMapping(i);
    const b = bucketOf(fieldOf(m.key));
    if (!bucketPrimary.has(b)) bucketPrimary.set(b, await cluster.primaryOf(await cluster.slotOf(`tether:lb:{${FAILOVER_VIP}#${b}}:map`)));
    if (bucketPrimary.get(b) !== victim) onLive.push(m);
  }
  assert.is(onLive.length, 6, 'mappings with buckets away from the channel primary');
  const last = onLive.pop()!;
  // A writer that has been at work (connections to every primary open, the script loaded on each): one
  // mapping in each bucket, heard, then forgotten.
  const warm: StoredMapping[] = [];
  for (let i = 5000, seen = new Set<number>(); seen.size < LB_STORE_BUCKETS; i++) {
    const b = bucketOf(fieldOf(failoverMapping(i).key));
    if (!seen.has(b)) warm.push(failoverMapping(i));
    seen.add(b);
  }
  await writer.mappings.claim(FAILOVER_VIP, warm);
  await waitFor(() => heard.size === warm.length, 'the warm-up mappings heard');
  heard.clear();

  await cluster.waitReplicated();
  cluster.kill(victim);
  const killedAt = Date.now();
  let failedPublishes = 0;
  for (const m of onLive) {
    await writer.mappings.claim(FAILOVER_VIP, [m]).then(
      () => undefined,
      () => failedPublishes++,
    );
  }
  assert.is(failedPublishes, onLive.length, 'every claim failed at its publish');
  for (const m of onLive) {
    const b = bucketOf(fieldOf(m.key));
    const got = await cluster.cli(bucketPrimary.get(b)!, 'hget', `tether:lb:{${FAILOVER_VIP}#${b}}:map`, fieldOf(m.key));
    assert.is(got, m.target, `yet ${fieldOf(m.key)} was recorded`);
  }

  await cluster.waitFailover(victim);
  await waitFor(() => resubscribedAt > killedAt && serving.notices.hears(FAILOVER_VIP), "the serving node's subscription made again", { timeoutMs: 10_000 });
  await new Promise((r) => setTimeout(r, 500));
  assert.is(heard.size, 0, 'nothing heard before the writer tries again');
  // The retried claim (as MappingSync retries what failed, every ~20 ms, until its client found the new
  // primary) finds them recorded; then a new one.
  const retried = async (list: StoredMapping[]) => {
    for (const end = Date.now() + 10_000; Date.now() < end; await new Promise((r) => setTimeout(r, 20))) {
      const got = await writer.mappings.claim(FAILOVER_VIP, list).catch(() => undefined);
      if (got) return got;
    }
    throw new Error('a claim did not go through within 10 s of the failover');
  };
  const again = await retried(onLive);
  assert.equal(again.map((m) => m.target), onLive.map((m) => m.target), 'the retried claim went through');
  await retried([last]);
  await waitFor(() => heard.size === onLive.length + 1, `the serving node heard all ${onLive.length + 1}`, { timeoutMs: 5000 }).catch(() => undefined);
  assert.equal([...heard].sort(), [...onLive, last].map((m) => m.key.client).sort(), 'the notices of the mappings recorded during the failover arrived');
  await dropVip(writer, FAILOVER_VIP);
});

test.run();
