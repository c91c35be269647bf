// The scale bench's "1M mappings of one VIP loaded and expired in the Cluster with no error": tetherd's own
// mapping store (daemon/lb/mapping-store.ts) against a real 3-primary Redis Cluster (test/lib/redis-cluster.ts):
// 1,000,000 per-flow mappings of one VIP claimed (as LB pods record new connections, several claims at once),
// loaded back in pages as an LB node does after a reconnect (loadPages, into a Map the size of its LRU's
// contents), and expired by the VIP's one expirer (lease, then expire()). The VIP's bucketed keys
// lb:{<vip>#<bucket>} spread it over the primaries: the keys and mappings each primary holds are counted.
// Every error is counted (a claim, page or expire call that throws, a garbled entry, a count that differs);
// the target is 0.
//
//   tsx test/bench/scale/mappings-1m.ts [--mappings 1000000] [--out FILE]   (run.ts --mappings-1m runs it too)
import * as fs from 'node:fs';
import { parseArgs } from 'node:util';
import Redis from 'ioredis';
import { startRedisCluster } from '../../lib/redis-cluster';
import type { StoredMapping } from '../../../daemon/lb/mapping-fields';
import { connectLbStore, type LbStore } from '../../../daemon/lb/lb-store';

export interface MillionResult {
  vip: string;
  mappings: number;
  errors: number;
  errorSamples: string[];
  write: { ms: number; perSec: number; concurrentClaims: number; claimCalls: number; warmupFailures: number };
  load: { ms: number; perSec: number; loaded: number; garbled: number; pageSize: number; heapMiB: number };
  expire: { ms: number; expired: number; leftInStore: number; expirerLease: boolean };
  perPrimary: Array<{ port: number; keys: number; mappings: number; usedMemoryMiB: number }>;
  process: { rssPeakMiB: number };
  ok: boolean;
}

const VIP = '172.31.0.1';
const CHUNK = 10_000;
const CONCURRENT = 8;

/** The i-th mapping: a distinct flow (client, client port) to one of 4 targets. */
function mapping(i: number): StoredMapping {
  const c = 0x0a000000 + Math.floor(i / 50_000);
  const client = [c >>> 24, (c >>> 16) & 255, (c >>> 8) & 255, c & 255].join('.');
  return { key: { vip: VIP, client, vport: 80, cport: 1024 + (i % 50_000), proto: 6 }, target: `10.128.0.${1 + (i % 4)}` };
}

export async function runMillion(total = 1_000_000, log: (m: string, x?: Record<string, unknown>) => void = () => undefined): Promise<MillionResult> {
  const errors: string[] = [];
  const fail = (what: string, e: unknown) => errors.push(`${what}: ${(e as Error)?.message ?? String(e)}`);
  let rssPeak = 0;
  const sampleRss = () => (rssPeak = Math.max(rssPeak, process.memoryUsage().rss));
  const rssTimer = setInterval(sampleRss, 500);
  const cluster = await startRedisCluster();
  let store: LbStore | undefined;
  const admins: Redis[] = [];
  try {
    const primaries = (await cluster.nodes()).filter((n) => n.role === 'master' && !n.failed && n.slots.length).map((n) => n.port);
    for (const p of primaries) admins.push(new Redis({ host: '127.0.0.1', port: p }));
    store = await connectLbStore(cluster.url, { timeoutMs: 10_000 });
    store.connection.on('error', (e: Error) => fail('store', e));

    // ioredis's Cluster client opens its connection to each primary on first use, and with the offline
    // queue off (the mapping store's choice: no command waits on a store that is down) commands sent to a
    // primary before that connection is up fail with "Connection is closed". An LB node meets this once at
    // start and retries; the bench counts such failures apart (warmupFailures) and waits until every primary
    // answers before the measured writes.
    let warmupFailures = 0;
    for (let attempt = 0; attempt < 50; attempt++) {
      try {
        await Promise.all(Array.from({ length: 64 }, (_, i) => store!.mappings.touch(VIP, [mapping(i).key])));
        break;
      } catch {
        warmupFailures++;
        await new Promise((r) => setTimeout(r, 100));
      }
    }
    // Write: claims of CHUNK mappings, CONCURRENT at a time (many LB pods recording new connections).
    const t0 = Date.now();
    let next = 0;
    let claimCalls = 0;
    await Promise.all(Array.from({ length: CONCURRENT }, async () => {
      for (let start = next; start < total; start = next) {
        next = start + CHUNK;
        const list = Array.from({ length: Math.min(CHUNK, total - start) }, (_, k) => mapping(start + k));
        try {
          const got = await store!.mappings.claim(VIP, list);
          claimCalls++;
          got.forEach((m, k) => {
            if (m.target !== list[k].target) fail('claim', new Error(`mapping ${start + k} came back with target ${m.target}, not ${list[k].target}`));
          });
        } catch (e) {
          fail(`claim of ${start}..${start + list.length}`, e);
        }
        if (start % 100_000 === 0) log('1M: claimed', { upTo: start + list.length });
      }
    }));
    const writeMs = Date.now() - t0;
    sampleRss();

    // Per primary: the VIP's keys and mappings it holds (bucket hashes lb:{vip#b}:map, zsets lb:{vip#b}:used).
    const perPrimary = await Promise.all(admins.map(async (a, i) => {
      const keys: string[] = [];
      let cursor = '0';
      do {
        const [c, ks] = await a.scan(cursor, 'MATCH', `*lb:{${VIP}#*`, 'COUNT', 1000);
        cursor = c;
        keys.push(...ks);
      } while (cursor !== '0');
      let mappings = 0;
      for (const k of keys.filter((x) => x.endsWith(':map'))) mappings += await a.hlen(k);
      const mem = Number(/used_memory:(\d+)/.exec(await a.info('memory'))?.[1] ?? 0);
      return { port: primaries[i], keys: keys.length, mappings, usedMemoryMiB: Math.round((mem / 2 ** 20) * 10) / 10 };
    }));
    const stored = perPrimary.reduce((s, p) => s + p.mappings, 0);
    if (stored !== total) fail('store', new Error(`${stored} mappings stored, ${total} written`));
    log('1M: written', { ms: writeMs, perPrimary });

    // Load back in pages, as an LB node does: into a Map (its local view), page by page.
    const heap0 = process.memoryUsage().heapUsed;
    const held = new Map<string, string>();
    const t1 = Date.now();
    let loaded = 0;
    let garbled = 0;
    try {
      const r = await store.mappings.loadPages(VIP, (page) => {
        for (const m of page) held.set(`${m.key.client}:${m.key.cport}`, m.target);
      });
      loaded = r.loaded;
      garbled = r.garbled;
    } catch (e) {
      fail('loadPages', e);
    }
    const loadMs = Date.now() - t1;
    sampleRss();
    // The loaded Map is still referenced here: the heap over the one before the load is what holding it costs.
    const heapMiB = Math.max(0, process.memoryUsage().heapUsed - heap0) / 2 ** 20;
    if (garbled) fail('loadPages', new Error(`${garbled} garbled entries`));
    if (loaded !== total || held.size !== total) fail('loadPages', new Error(`${loaded} loaded (${held.size} distinct), ${total} stored`));
    for (let i = 0; i < total; i += 9973) {
      const m = mapping(i);
      if (held.get(`${m.key.client}:${m.key.cport}`) !== m.target) fail('loadPages', new Error(`mapping ${i} loaded wrong or missing`));
    }
    held.clear();
    log('1M: loaded', { ms: loadMs, loaded });

    // Expire: the VIP's expirer (lease), everything idle past a cutoff after the writes.
    const t2 = Date.now();
    let expired = 0;
    let lease = false;
    try {
      lease = await store.leases.take(VIP, 'bench-expirer', 30_000);
      if (!lease) fail('expirer', new Error('expirer lease not taken'));
      expired = (await store.mappings.expire(VIP, 1, Date.now() + 60_000)).length;
    } catch (e) {
      fail('expire', e);
    }
    const expireMs = Date.now() - t2;
    let left = 0;
    for (const a of admins) {
      let cursor = '0';
      do {
        const [c, ks] = await a.scan(cursor, 'MATCH', `*lb:{${VIP}#*`, 'COUNT', 1000);
        cursor = c;
        for (const k of ks) left += k.endsWith(':map') ? await a.hlen(k) : await a.zcard(k);
      } while (cursor !== '0');
    }
    if (expired !== total) fail('expire', new Error(`${expired} expired, ${total} stored`));
    if (left) fail('expire', new Error(`${left} entries left in the store after expiry`));
    log('1M: expired', { ms: expireMs, expired, left });

    const r1 = (x: number) => Math.round(x * 10) / 10;
    return {
      vip: VIP, mappings: total, errors: errors.length, errorSamples: errors.slice(0, 5),
      write: { ms: writeMs, perSec: Math.round(total / (writeMs / 1000)), concurrentClaims: CONCURRENT, claimCalls, warmupFailures },
      load: { ms: loadMs, perSec: Math.round(loaded / (loadMs / 1000)), loaded, garbled, pageSize: 1000, heapMiB: r1(heapMiB) },
      expire: { ms: expireMs, expired, leftInStore: left, expirerLease: lease },
      perPrimary, process: { rssPeakMiB: r1(rssPeak / 2 ** 20) }, ok: errors.length === 0,
    };
  } finally {
    clearInterval(rssTimer);
    await store?.connection.close().catch(() => undefined);
    for (const a of admins) a.disconnect();
    await cluster.stop();
  }
}

if (require.main === module) {
  const a = parseArgs({ options: { mappings: { type: 'string', default: '1000000' }, out: { type: 'string' } } }).values;
  runMillion(Number(a.mappings), (m, x = {}) => process.stdout.write(`${new Date().toISOString()} ${m} ${JSON.stringify(x)}\n`)).then(
    (r) => {
      process.stdout.write(JSON.stringify(r, null, 2) + '\n');
      if (a.out) fs.writeFileSync(a.out, JSON.stringify(r, null, 2) + '\n');
      process.exit(r.ok ? 0 : 1);
    },
    (e) => {
      process.stderr.write(`mappings-1m failed: ${(e as Error).stack}\n`);
      process.exit(1);
    },
  );
}
