// The mapping store on a real Redis Cluster (test/lib/redis-cluster.ts) when the primary serving a VIP's
// notice channel is SIGKILLed while the primaries of its mapping buckets stay up: a claim then records the
// mapping but cannot publish its notice, and its retry finds the mapping recorded (not fresh). The notice
// must still reach the nodes serving the VIP once a replica took over (it did not: seen on the testbed as
// LB nodes whose mapping counts never met the store's after a failover), and the serving node's store
// tells that its sharded subscription was made again ('resubscribed': notices may have been missed).
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { Writable } from 'node:stream';
import { startRedisCluster, type RedisCluster } from '../lib/redis-cluster';
import { makeLogger, setLogger } from '../../daemon/log';
import { bucketOf, fieldOf, LB_STORE_BUCKETS, MappingStore, type StoredMapping } from '../../daemon/lb/mapping-store';
import { waitFor } from '../lib/wait';

setLogger(makeLogger({ level: 'error', stream: new Writable({ write: (_c, _e, cb) => cb() }) }));

const VIP = '192.0.2.70';
const PREFIX = 'tether:';
const mapping = (i: number): StoredMapping => ({ key: { vip: VIP, client: `10.7.${i >> 8}.${i & 255}`, vport: 0, cport: 0, proto: 0 }, target: '10.244.0.9' });

let cluster: RedisCluster;
const stores: MappingStore[] = [];

test.before(async () => {
  cluster = await startRedisCluster();
});

test.after(async () => {
  for (const s of stores) await s.close();
  await cluster?.stop();
});

async function store(): Promise<MappingStore> {
  const s = await MappingStore.connect(cluster.url, { keyPrefix: PREFIX });
  stores.push(s);
  await waitFor(() => s.connected, 'cluster client ready');
  return s;
}

test('a notice whose publish failed while its channel primary was down reaches the serving node after the failover', async () => {
  const writer = await store();
  const serving = await store();
  const heard = new Set<string>();
  serving.on('mapping', (m: StoredMapping) => heard.add(m.key.client));
  let resubscribedAt = 0;
  serving.on('resubscribed', () => (resubscribedAt = Date.now()));
  await serving.serve([VIP]);
  await waitFor(() => serving.hears(VIP), 'subscribed');

  const victim = await cluster.primaryOf(await cluster.slotOf(`${PREFIX}lb:{${VIP}}:notices`));
  // Mappings whose bucket lives on another primary: their claim's script runs while the channel is down.
  const bucketPrimary = new Map<number, number>();
  const onLive: StoredMapping[] = [];
  for (let i = 1; onLive.length < 6 && i < 2000; i++) {
    const m = mapping(i);
    const b = bucketOf(fieldOf(m.key));
    if (!bucketPrimary.has(b)) bucketPrimary.set(b, await cluster.primaryOf(await cluster.slotOf(`${PREFIX}lb:{${VIP}#${b}}:map`)));
    if (bucketPrimary.get(b) !== victim) onLive.push(m);
  }
  assert.is(onLive.length, 6, 'mappings with buckets away from the channel primary');
  const last = onLive.pop()!;
  // A writer that has been at work (connections to every primary open, the script loaded on each): one
  // mapping in each bucket, heard, then forgotten.
  const warm: StoredMapping[] = [];
  for (let i = 5000, seen = new Set<number>(); seen.size < LB_STORE_BUCKETS; i++) {
    const b = bucketOf(fieldOf(mapping(i).key));
    if (!seen.has(b)) warm.push(mapping(i));
    seen.add(b);
  }
  await writer.claim(VIP, warm);
  await waitFor(() => heard.size === warm.length, 'the warm-up mappings heard');
  heard.clear();

  await cluster.waitReplicated();
  cluster.kill(victim);
  const killedAt = Date.now();
  let failedPublishes = 0;
  for (const m of onLive) {
    await writer.claim(VIP, [m]).then(
      () => undefined,
      () => failedPublishes++,
    );
  }
  assert.is(failedPublishes, onLive.length, 'every claim failed at its publish');
  for (const m of onLive) {
    const b = bucketOf(fieldOf(m.key));
    const got = await cluster.cli(bucketPrimary.get(b)!, 'hget', `${PREFIX}lb:{${VIP}#${b}}:map`, fieldOf(m.key));
    assert.is(got, m.target, `yet ${fieldOf(m.key)} was recorded`);
  }

  await cluster.waitFailover(victim);
  await waitFor(() => resubscribedAt > killedAt && serving.hears(VIP), "the serving node's subscription made again", { timeoutMs: 10_000 });
  await new Promise((r) => setTimeout(r, 500));
  assert.is(heard.size, 0, 'nothing heard before the writer tries again');
  // The retried claim (as MappingSync retries what failed, every ~20 ms, until its client found the new
  // primary) finds them recorded; then a new one.
  const retried = async (list: StoredMapping[]) => {
    for (const end = Date.now() + 10_000; Date.now() < end; await new Promise((r) => setTimeout(r, 20))) {
      const got = await writer.claim(VIP, list).catch(() => undefined);
      if (got) return got;
    }
    throw new Error('a claim did not go through within 10 s of the failover');
  };
  const again = await retried(onLive);
  assert.equal(again.map((m) => m.target), onLive.map((m) => m.target), 'the retried claim went through');
  await retried([last]);
  await waitFor(() => heard.size === onLive.length + 1, `the serving node heard all ${onLive.length + 1}`, { timeoutMs: 5000 }).catch(() => undefined);
  assert.equal([...heard].sort(), [...onLive, last].map((m) => m.key.client).sort(), 'the notices of the mappings recorded during the failover arrived');
  await writer.dropVip(VIP);
});

test.run();
