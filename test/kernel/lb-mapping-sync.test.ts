// The store side of the load balancer's mappings (daemon/lb/mapping-sync.ts) with the real datapath maps
// (lb.bpf.o loaded and pinned under a unique bpffs directory, removed afterwards) and a real redis-server:
// touches go out once per sync period (¼ of the idle timeout), not per pass; after the store was away, a
// node writes back only the mappings new or used meanwhile and reads only what others changed meanwhile.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import * as fs from 'node:fs';
import Redis from 'ioredis';
import { Writable } from 'node:stream';
import { makeLogger, setLogger } from '../../lib/log';
import { LbDatapath } from '../../daemon/bpf/lb';
import { ensureBpffs } from '../../daemon/bpf/bpffs';
import { LB_STORE_BUCKETS, bucketOf, fieldOf } from '../../daemon/lb/mapping-fields';
import { connectLbStore, type LbStore } from '../../daemon/lb/lb-store';
import { MappingSync, syncPeriodMs } from '../../daemon/lb/mapping-sync';
import { LbShared, type LbControllerOptions } from '../../daemon/lb/lb-state';
import type { ResolvedLoadBalancer } from '../../daemon/lb/lb-spec';
import type { MapKey } from '../../daemon/bpf/lb-structs';
import { uniqueName } from '../lib/netns';
import { startRedis } from '../lib/redis';
import { waitFor } from '../lib/wait';

const quiet = makeLogger({ level: 'error', stream: new Writable({ write: (_c, _e, cb) => cb() }) });
setLogger(quiet);
const VIP = '198.51.100.40';
const TARGETS = ['10.244.1.5', '10.244.2.5'];
const key = (i: number): MapKey => ({ vip: VIP, client: `10.${100 + (i >> 16)}.${(i >> 8) & 255}.${i & 255}`, vport: 0, cport: 0, proto: 0 });
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const now = () => process.hrtime.bigint();

function service(idleTimeoutS: number): ResolvedLoadBalancer {
  return {
    key: 'shop/db', service: 'shop/db', namespace: 'shop', name: 'db', family: 'IPv4', ipFamilies: ['IPv4'], ports: [{ port: 80, protocol: 'TCP', proto: 6 }], lbPods: { namespace: 'shop', matchLabels: { role: 'lb' } },
    affinity: 'client', idleTimeoutS, vip: { pool: 'lb' }, targets: TARGETS.map((address) => ({ address, state: 'active' as const })), externalTrafficPolicy: 'Cluster',
  };
}

async function bed(idleTimeoutS: number, fn: (o: { sync: MappingSync; dp: LbDatapath; store: LbStore; raw: Redis; pause: () => void; resume: () => void; restart: () => Promise<void> }) => Promise<void>): Promise<void> {
  const redis = await startRedis();
  const raw = new Redis({ path: redis.socketPath });
  const pinDir = `/sys/fs/bpf/tether-test/${uniqueName('lbsync')}`;
  const store = await connectLbStore(redis.url);
  let dp: LbDatapath | undefined;
  try {
    ensureBpffs(pinDir);
    dp = LbDatapath.load({ pinDir, maxVips: 2, maglevSize: 251, maxMappings: 16384 });
    const s = new LbShared({ node: { name: 'n1', address: '127.0.0.1' }, pinDir, fouPort: 5555, exportTable: 0, store, logger: quiet } as unknown as LbControllerOptions);
    s.dp = dp;
    const lb = service(idleTimeoutS);
    s.vips.set(lb.key, { key: lb.key, pool: 'lb', vip: VIP, slot: 0, loaded: true, announced: true });
    const sync = new MappingSync(s);
    sync.start();
    await sync.serve([lb]);
    await fn({ sync, dp: dp!, store, raw, pause: () => redis.pause(), resume: () => redis.resume(), restart: () => redis.restart() });
  } finally {
    await store.connection.close();
    dp?.close({ unpin: true });
    fs.rmSync(pinDir, { recursive: true, force: true });
    raw.disconnect();
    await redis.stop();
  }
}

async function calls(raw: Redis, cmd: string): Promise<number> {
  const m = new RegExp(`cmdstat_${cmd}:calls=(\\d+)`).exec(await raw.info('commandstats'));
  return m ? Number(m[1]) : 0;
}

async function stored(raw: Redis): Promise<number> {
  let n = 0;
  for (let b = 0; b < LB_STORE_BUCKETS; b++) n += await raw.hlen(`tether:lb:{${VIP}#${b}}:map`);
  return n;
}

test('touches are batched at a quarter of the idle timeout, not sent every pass', async () => {
  await bed(8, async ({ sync, dp, raw }) => {
    assert.is(syncPeriodMs(8), 2000);
    const list = Array.from({ length: 200 }, (_, i) => ({ key: key(i), target: TARGETS[i % 2] }));
    dp.installMappings(list.map((m) => ({ ...m, lastNs: now() })));
    await sync.sync(); // the first sync after a start writes everything held
    assert.is(await stored(raw), 200);
    await raw.config('RESETSTAT');
    // 40 passes over 4 s, every mapping used before each: at most 2 touch rounds (4 s / 2 s), one ZADD per bucket.
    const t0 = Date.now();
    let passes = 0;
    while (Date.now() - t0 < 4000) {
      dp.installMappings(list.map((m) => ({ ...m, lastNs: now() })));
      await sync.sync();
      passes++;
      await sleep(100);
    }
    const zadds = await calls(raw, 'zadd');
    assert.ok(passes >= 30, `${passes} passes`);
    assert.ok(zadds >= LB_STORE_BUCKETS && zadds <= 3 * LB_STORE_BUCKETS, `${zadds} ZADDs in ${passes} passes (per-pass touching would be ${passes * LB_STORE_BUCKETS})`);
    const score = Number(await raw.zscore(`tether:lb:{${VIP}#${bucketOf(fieldOf(key(7)))}}:used`, fieldOf(key(7))));
    assert.ok(Date.now() - score < 4000, 'a used mapping\'s last use moved forward');
  });
});

test('after the store was away: only mappings new or used meanwhile are written back, only others\' changes read', async () => {
  await bed(600, async ({ sync, dp, store, raw, pause, resume }) => {
    const N = 5000;
    const old = now() - 5_000_000_000n;
    dp.installMappings(Array.from({ length: N }, (_, i) => ({ key: key(i), target: TARGETS[i % 2], lastNs: old })));
    await sync.sync();
    assert.is(await stored(raw), N, 'the first sync wrote everything held');
    // The store hangs: the next sync fails (command timeout), and the node goes on alone.
    pause();
    const syncing = sync.sync();
    await sleep(200);
    const used = [3, 40, 77, 120, 999, 1500, 2222, 3000, 4001, 4999].map(key);
    const fresh = Array.from({ length: 5 }, (_, i) => key(N + i));
    dp.installMappings([...used, ...fresh].map((k, i) => ({ key: k, target: TARGETS[i % 2], lastNs: now() })));
    await syncing;
    resume();
    // Meanwhile another node recorded 7 mappings (their notices were missed).
    const others = Array.from({ length: 7 }, (_, i) => key(N + 100 + i));
    await raw.config('RESETSTAT');
    for (const k of others) {
      const f = fieldOf(k);
      await raw.hset(`tether:lb:{${VIP}#${bucketOf(f)}}:map`, f, TARGETS[1]);
      await raw.zadd(`tether:lb:{${VIP}#${bucketOf(f)}}:used`, Date.now(), f);
    }
    await store.connection.emit('ready'); // what ioredis reports on a reconnect; the hang above already marked the absence
    for (let i = 0; i < 50 && (await calls(raw, 'hmget')) === 0; i++) {
      await sync.sync();
      await sleep(100);
    }
    assert.is(await calls(raw, 'hsetnx'), used.length + fresh.length, 'written back: the 15 new or used, not the 5,000');
    assert.is(await calls(raw, 'hscan'), 0, 'no full re-read');
    assert.is(await calls(raw, 'hgetall'), 0);
    assert.is(await stored(raw), N + fresh.length + others.length);
    const local = new Map(dp.mappings().map((m) => [m.client, m.target]));
    for (const k of others) assert.is(local.get(k.client), TARGETS[1], `others' mapping of ${k.client} installed here`);
  });
});

test('after the store lost its data: everything held is written back and every served VIP read again', async () => {
  await bed(600, async ({ sync, dp, store, raw, restart }) => {
    const N = 3000;
    dp.installMappings(Array.from({ length: N }, (_, i) => ({ key: key(i), target: TARGETS[i % 2], lastNs: now() - 1_000_000_000n })));
    await sync.sync();
    assert.is(await stored(raw), N);
    await restart();
    await waitFor(() => store.connection.connected, 'reconnected');
    const others = Array.from({ length: 4 }, (_, i) => key(N + 10 + i));
    const fresh = new Redis({ path: (raw.options as { path: string }).path });
    try {
      for (const k of others) await fresh.hset(`tether:lb:{${VIP}#${bucketOf(fieldOf(k))}}:map`, fieldOf(k), TARGETS[0]);
      sync.storeWiped(); // what the controller does when the cluster store's generation changes
      await sync.sync();
      let n = 0;
      for (let b = 0; b < LB_STORE_BUCKETS; b++) n += await fresh.hlen(`tether:lb:{${VIP}#${b}}:map`);
      assert.is(n, N + others.length, 'everything held written back, beside what others wrote');
    } finally {
      fresh.disconnect();
    }
    const local = new Map(dp.mappings().map((m) => [m.client, m.target]));
    for (const k of others) assert.is(local.get(k.client), TARGETS[0], 'others\' mappings read back and installed');
  });
});

test.run();
