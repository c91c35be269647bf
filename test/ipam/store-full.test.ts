// A full cluster store, for real: a redis-server with a tiny maxmemory and noeviction (as tether's
// manifests run it) is filled with load-balancer mappings until it refuses writes. Checked: an address
// allocation then fails with TRY_AGAIN_LATER naming the store as full (CNI code 11, not INTERNAL), the
// metrics and a Warning Event on the node's TetherNode say so, registrations and ownership records still
// go through (nothing about a live node or owner changes because of it), the VIP's expirer takes its lease
// and frees the store (two nodes expiring at once remove each mapping once), touched mappings survive it,
// and allocations succeed again afterwards. The load balancer's own sync does the same on a full store
// (touches and expires although writing back is refused), an Egress node keeps reading and following
// records (not store-down), and a server older than 7.0 is refused.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import Redis from 'ioredis';
import * as net from 'node:net';
import { Writable } from 'node:stream';
import { makeLogger, setLogger } from '../../lib/log';
import { cniCodeFor, ErrorCode, TetherError } from '../../lib/errors';
import { RedisStore } from '../../ipam/store/redis-store';
import { LazyStore } from '../../ipam/store/lazy-store';
import { connectLbStore, type LbStore } from '../../daemon/lb/lb-store';
import type { StoredMapping } from '../../daemon/lb/mapping-fields';
import { OwnershipStore } from '../../daemon/egress/ownership-store';
import { isOomReply, StoreFullError, storeFullness } from '../../daemon/common/store-full';
import { KubeReporting } from '../../daemon/parts/kube-reporting';
import { metricsServer } from '../../daemon/parts/metrics';
import { TetherMetrics } from '../../daemon/metrics/tether-metrics';
import { MappingSync } from '../../daemon/lb/mapping-sync';
import { LbShared, nowNs } from '../../daemon/lb/lb-state';
import type { LbMapping } from '../../daemon/bpf/lb';
import type { MapKey } from '../../daemon/bpf/lb-structs';
import type { ResolvedLoadBalancer } from '../../daemon/lb/lb-spec';
import { ClusterAddresses } from '../../ipam/cluster-addresses';
import { validatePools } from '../../ipam/pool';
import { egressParts } from '../../daemon/egress/egress-controller';
import type { ResolvedEgress } from '../../daemon/egress/egress-spec';
import type { AttachService } from '../../daemon/pod/attach-service';
import { apiWithSource } from '../lib/kube-fixture';
import { scrapeMetrics } from '../lib/metrics';
import { startRedis, type TestRedis } from '../lib/redis';

const quiet = makeLogger({ level: "error", stream: new Writable({ write: (_c, _e, cb) => cb() }) });
setLogger(quiet);
const VIP = '192.0.2.20';
const IDLE_S = 60;
const key = (i: number) => ({ vip: VIP, client: `10.${(i >> 16) & 255}.${(i >> 8) & 255}.${i & 255}`, vport: 0, cport: 0, proto: 0 });
const mapping = (i: number): StoredMapping => ({ key: key(i), target: '10.244.0.5' });

const usedMemory = async (r: Redis) => Number(/^used_memory:(\d+)/m.exec(await r.info('memory'))![1]);

test('a full store: TRY_AGAIN_LATER naming it, metric and Event; registrations, records, touches and the expirer still run; it empties and takes writes again', async () => {
  const redis: TestRedis = await startRedis({ args: ['--maxmemory-policy', 'noeviction'] });
  const cleanups: Array<() => Promise<unknown> | unknown> = [];
  const { api, source, close } = await apiWithSource([{ apiVersion: 'v1', kind: 'Node', metadata: { name: 'n1' } }], quiet);
  cleanups.push(close);
  try {
    const admin = new Redis({ path: redis.socketPath });
    cleanups.push(() => admin.disconnect());
    const ipam = new LazyStore(() => RedisStore.connect(redis.url, { keyPrefix: 'tether:' }));
    cleanups.push(() => ipam.close());
    const lbA: LbStore = await connectLbStore(redis.url);
    const lbB: LbStore = await connectLbStore(redis.url);
    cleanups.push(() => lbA.close(), () => lbB.close());
    const ownership = await OwnershipStore.connect(redis.url);
    cleanups.push(() => ownership.close());
    const reporting = new KubeReporting({ source, nodeName: 'n1', version: '9.9.9', storeConfigured: true, bpfPinDir: '/x', roleProblems: () => [], logger: quiet });
    cleanups.push(() => reporting.stop());
    const server = metricsServer({ address: { host: '127.0.0.1', port: 0 }, metrics: new TetherMetrics(quiet), parts: { store: ipam }, logger: quiet });
    await server.start();
    cleanups.push(() => server.stop());
    const metricsUrl = `http://127.0.0.1:${server.boundAddress()!.port}/metrics`;

    // Before: writes go through, nothing full, the series exist at 0.
    assert.equal((await ipam.allocateAddresses('float', 'egress/shop/out#0', { count: 1, candidates: ['198.51.100.1', '198.51.100.2', '198.51.100.3'] })).ok, true);
    assert.is((await scrapeMetrics(metricsUrl)).value('tether_store_full', { subsystem: 'ipam' }), 0);
    assert.equal(await ownership.beatNode('n1', '10.1.0.1', 15_000), ['10.1.0.1']);

    // Mappings in use (touched while full, below) and idle ones, all last used 10 minutes ago.
    const old = Date.now() - 10 * 60_000;
    const LIVE = 20;
    await lbA.mappings.claim(VIP, Array.from({ length: LIVE }, (_, i) => mapping(i)), old);
    // A cap just above what the store holds now; then fill it until it refuses.
    await admin.config('SET', 'maxmemory', String((await usedMemory(admin)) + 256 * 1024));
    // Large batches first, then single mappings: a big request's own buffers count until it is answered, so
    // the store is full only once a single mapping is refused.
    let refused: unknown;
    let n = LIVE;
    for (const size of [500, 20, 1]) {
      refused = undefined;
      for (let round = 0; round < 400 && !refused; round++) {
        const list = Array.from({ length: size }, (_, i) => mapping(n + i));
        n += size;
        await lbA.mappings.claim(VIP, list, old).catch((e: unknown) => {
          refused = e;
        });
      }
      assert.ok(refused, `the store refused a batch of ${size} before ${n} mappings`);
      assert.ok(isOomReply(refused), `refused as full: ${(refused as Error).message}`);
    }
    // Full for good while the test looks (a connection's buffers freed would otherwise let a small write in).
    const cap = (await usedMemory(admin)) - 16 * 1024;
    await admin.config('SET', 'maxmemory', String(cap));

    // An allocation: TRY_AGAIN_LATER (CNI 11) naming the store as full, not INTERNAL.
    const err = await ipam.allocateAddresses('float', 'egress/shop/out#1', { count: 1, candidates: ['198.51.100.1', '198.51.100.2', '198.51.100.3'] }).then(
      () => undefined,
      (e: unknown) => e,
    );
    assert.instance(err, StoreFullError, String(err));
    assert.is((err as TetherError).code, ErrorCode.TryAgainLater);
    assert.is(cniCodeFor((err as TetherError).code), 11);
    assert.match((err as Error).message, /cluster store \(redis at unix:.*\) is full: it refused allocateAddresses .*try again later/);
    assert.ok(storeFullness.isFull('ipam'));

    // The metric and tetherctl status say so.
    let s = await scrapeMetrics(metricsUrl);
    assert.is(s.value('tether_store_full', { subsystem: 'ipam' }), 1);
    assert.ok(s.value('tether_store_full_refusals_total', { subsystem: 'ipam' })! >= 1);
    assert.equal((server.status().storeFull as Record<string, unknown>).ipam, { full: true, refusals: storeFullness.state().ipam.refusals });

    // One Warning Event on this node's TetherNode, however many refusals.
    await ipam.allocateAddresses('float', 'egress/shop/out#2', { count: 1, candidates: ['198.51.100.3'] }).catch(() => undefined);
    await reporting.events.flush();
    const full = api.list('Event').filter((e) => e.reason === 'StoreFull');
    assert.is(full.length, 1, JSON.stringify(full.map((e) => e.note)));
    assert.equal([full[0].type, full[0].regarding.kind, full[0].regarding.name, full[0].reportingInstance], ['Warning', 'TetherNode', 'n1', 'n1']);
    assert.match(full[0].note, /cluster store \(.*\) is full: it refused allocateAddresses of the ipam on node n1/);

    // While full: a node's registration and an ownership record go through (nothing live changes because
    // the store is full); a usage report (grows with traffic) is refused.
    assert.equal(await ownership.beatNode('n1', '10.1.0.1', 15_000), ['10.1.0.1']);
    assert.equal(await ownership.registerGateways('shop/out', 'n1', [{ pod: 'shop/gw-a', node: 'n1', nodeAddress: '10.1.0.1', podIp: '10.244.1.5' }], 15_000), [{ pod: 'shop/gw-a', node: 'n1', nodeAddress: '10.1.0.1', podIp: '10.244.1.5' }]);
    const decision = { egress: 'shop/out', address: '198.51.100.1', owner: 'shop/gw-a', epoch: 1, cause: 'initial', ownerNode: 'n1', ownerNodeAddress: '10.1.0.1', ownerPodIp: '10.244.1.5' };
    assert.is(await ownership.record({ ...decision, score: 'x' }, { firstOnly: true }), 'recorded');
    assert.is((await ownership.get('shop/out', '198.51.100.1')).owner, 'shop/gw-a');
    const usage = await ownership.reportUsage('shop/out', 'n1', { '198.51.100.1': { flows: 1, bytes: 2 } }, 90_000).then(() => undefined, (e: unknown) => e);
    assert.ok(isOomReply(usage), 'a usage report is refused while full');

    // The mappings in use are touched (a full store takes touches: only idle ones are expired).
    const now = Date.now();
    await lbA.mappings.touch(VIP, Array.from({ length: LIVE }, (_, i) => key(i)), now);
    // The expirer's lease is taken on a full store: one node holds it.
    assert.is(await lbA.leases.take(VIP, 'n1', 10_000), true);
    assert.is(await lbB.leases.take(VIP, 'n2', 10_000), false);
    // Two nodes expiring at once (a lease that lapsed between one's check and its expiry) remove each
    // idle mapping once, and nothing else.
    const [ga, gb] = await Promise.all([lbA.mappings.expire(VIP, IDLE_S, now, 1000), lbB.mappings.expire(VIP, IDLE_S, now, 1000)]);
    const gone = new Set([...ga, ...gb].map((k) => k.client));
    assert.is(ga.length + gb.length, gone.size, 'no mapping removed twice');
    const left = (await lbA.mappings.load(VIP)).mappings.map((m) => m.key.client).sort();
    assert.equal(left, Array.from({ length: LIVE }, (_, i) => key(i).client).sort(), 'the touched mappings stay');
    assert.ok(gone.size > 1000, `idle mappings expired: ${gone.size}`);

    // Space again: allocations succeed, and the store is no longer reported full.
    assert.ok((await usedMemory(admin)) < cap, 'the expiry freed the store');
    const again = await ipam.allocateAddresses('float', 'egress/shop/out#1', { count: 1, candidates: ['198.51.100.2'] });
    assert.equal(again, { ok: true, addresses: ['198.51.100.2'] });
    assert.not.ok(storeFullness.isFull('ipam'));
    s = await scrapeMetrics(metricsUrl);
    assert.is(s.value('tether_store_full', { subsystem: 'ipam' }), 0);
    assert.ok(s.value('tether_store_full_refusals_total', { subsystem: 'ipam' })! >= 2);
  } finally {
    for (const c of cleanups.reverse()) await c();
    await redis.stop();
  }
});

/** Fills the store with idle mappings of `vip` until even one more is refused; returns how many went in. */
async function fill(lb: LbStore, vip: string, from: number, at: number): Promise<number> {
  let n = from;
  for (const size of [500, 20, 1]) {
    let refused: unknown;
    for (let round = 0; round < 400 && !refused; round++) {
      const list = Array.from({ length: size }, (_, i) => ({ key: { ...key(n + i), vip }, target: '10.244.0.5' }));
      n += size;
      await lb.mappings.claim(vip, list, at).catch((e: unknown) => {
        refused = e;
      });
    }
    assert.ok(isOomReply(refused), `a batch of ${size} refused as full: ${String(refused)}`);
  }
  return n - from;
}

test('the load balancer\'s sync on a full store: writing back is refused and counted, but it touches the mappings in use, takes the expirer lease and expires the idle ones; then it writes back', async () => {
  const redis: TestRedis = await startRedis({ args: ['--maxmemory-policy', 'noeviction'] });
  const admin = new Redis({ path: redis.socketPath });
  const store = await connectLbStore(redis.url);
  try {
    const vip = '192.0.2.30';
    const lb = { key: 'shop/db', idleTimeoutS: IDLE_S, targets: [{ address: '10.244.0.5', state: 'active' }] } as unknown as ResolvedLoadBalancer;
    const s = new LbShared({ node: { name: 'n1', address: '10.0.0.1' }, pinDir: '/nonexistent', fouPort: 5555, exportTable: 0, logger: quiet, store } as never);
    // The datapath's table: a few flows in use now.
    let rows: LbMapping[] = Array.from({ length: 5 }, (_, i) => ({ ...key(100_000 + i), vip, target: '10.244.0.5', lastNs: nowNs() - 1_000_000_000n }));
    s.dp = {
      maxMappings: 1000,
      mappings: () => [...rows],
      deleteMappingKeys: (keys: MapKey[]) => {
        const gone = new Set(keys.map((k) => k.client));
        const before = rows.length;
        rows = rows.filter((m) => !gone.has(m.client));
        return before - rows.length;
      },
      installMappings: (l: unknown[]) => ({ installed: l.length, full: 0 }),
    } as never;
    s.vips.set(lb.key, { key: lb.key, pool: 'lb', vip, slot: 0, loaded: true, announced: true } as never);
    const sync = new MappingSync(s);
    await sync.serve([lb]);
    // In the store: the flows in use (recorded 10 minutes ago, by another node) and a crowd of idle ones.
    const old = Date.now() - 10 * 60_000;
    await store.mappings.claim(vip, rows.map((m) => ({ key: { vip, client: m.client, vport: 0, cport: 0, proto: 0 }, target: m.target })), old);
    await admin.config('SET', 'maxmemory', String((await usedMemory(admin)) + 256 * 1024));
    const idle = await fill(store, vip, 0, old);
    await admin.config('SET', 'maxmemory', String((await usedMemory(admin)) - 8 * 1024));
    const filled = await usedMemory(admin);
    const before = storeFullness.state().lb?.refusals ?? 0;

    // The first sync writes back everything held: refused. It still touches and expires.
    await sync.sync();
    assert.ok((await usedMemory(admin)) < filled, 'the expiry freed memory');
    assert.ok(storeFullness.isFull('lb'), 'the refusal is counted for the load balancer');
    assert.is(storeFullness.state().lb.refusals, before + 1);
    assert.ok(sync.expires(vip), 'this node took the expirer lease on the full store');
    const left = (await store.mappings.load(vip)).mappings.map((m) => m.key.client).sort();
    assert.equal(left, rows.map((m) => m.client).sort(), `the ${idle} idle mappings expired, the ones in use stay (touched)`);

    // Room again (here: maxmemory raised): the next sync (a period later) writes back what it holds, and the
    // load balancer is no longer reported full.
    await admin.config('SET', 'maxmemory', String((await usedMemory(admin)) + 256 * 1024));
    (sync as unknown as { nextReadMs: number }).nextReadMs = 0;
    await sync.sync();
    assert.not.ok(storeFullness.isFull('lb'));
  } finally {
    await store.close();
    admin.disconnect();
    await redis.stop();
  }
});

test('egress on a full store: not store-down; the pass goes on reading and follows a decision recorded meanwhile; only the usage report is refused and counted', async () => {
  const redis: TestRedis = await startRedis({ args: ['--maxmemory-policy', 'noeviction'] });
  const admin = new Redis({ path: redis.socketPath });
  const closers: Array<() => Promise<unknown> | unknown> = [() => admin.disconnect()];
  try {
    const pools = validatePools([{ apiVersion: 'tether.dev/v1alpha1', kind: 'AddressPool', metadata: { name: 'float' }, spec: { usage: 'floating', ipv4: { cidr: '198.51.100.0/28' } } }]);
    const egress: ResolvedEgress = {
      key: 'shop/out', name: 'out', namespace: 'shop', clients: { matchLabels: { app: 'client' } }, gateways: { matchLabels: { app: 'gw' } },
      families: [4], destinations: ['203.0.113.0/24'], excluded: [], addresses: [{ pool: 'float', count: 1 }], zonePolicy: 'any',
      failover: { intervalMs: 50, detectMultiplier: 3 }, announce: { mode: 'l2' },
    };
    const ownership = await OwnershipStore.connect(redis.url);
    const ipam = await RedisStore.connect(redis.url);
    closers.push(() => ownership.close(), () => ipam.close());
    // A client node of the Egress (its clients use the address: it reports their use).
    const n = egressParts({
      node: { name: 'n2', address: '10.1.0.2', uplink: 'eth0' }, pinDir: '/nonexistent', fouPort: 0, syncPort: 0, clusterKey: Buffer.alloc(32),
      egresses: [egress], ownership, addresses: new ClusterAddresses(pools, ipam, quiet, { holdOffMs: 0 }), attach: {} as AttachService, logger: quiet,
    });
    n.s.clients.set('shop/client', { ip: '10.244.200.1', hostIfName: 'vethc', egressIds: [1] });
    await n.store.storePass({ full: true });
    const [st] = [...n.s.addresses.values()];
    assert.ok(st, 'the node tracks the Egress\'s address');
    // The client steering maps: only what the pass reads (the use of the address) and writes (its gateways).
    n.s.maps = { addressStats: () => new Map([[st.address, { flows: 3n, packets: 4n, bytes: 5n }]]), setGateways: () => undefined, setDestinations: () => undefined } as never;
    const other = await OwnershipStore.connect(redis.url);
    closers.push(() => other.close());
    const decision = { egress: egress.key, address: st.address, owner: 'shop/gw-1', epoch: 1, cause: 'initial', ownerNode: 'n1', ownerNodeAddress: '10.1.0.1', ownerPodIp: '10.244.1.5' };
    await other.record({ ...decision, score: 'a' });
    await n.store.storePass({ full: true });
    assert.is(st.own.epoch, 1);

    // Full: LB-like clutter up to the cap.
    const lb = await connectLbStore(redis.url);
    closers.push(() => lb.close());
    await admin.config('SET', 'maxmemory', String((await usedMemory(admin)) + 128 * 1024));
    await fill(lb, '192.0.2.40', 0, Date.now());
    await admin.config('SET', 'maxmemory', String((await usedMemory(admin)) - 16 * 1024));
    const before = storeFullness.state().egress?.refusals ?? 0;

    // A failover decided elsewhere while the store is full is recorded (ownership records run on a full store)...
    assert.is(await other.record({ ...decision, owner: 'shop/gw-2', epoch: 2, cause: 'failover', ownerNode: 'n3', ownerNodeAddress: '10.1.0.3', ownerPodIp: '10.244.3.5', score: 'b' }), 'recorded');
    // ...and this node's pass follows it: the store is read, not treated as down.
    await n.store.storePass({ full: true });
    assert.is(n.s.storeDown, false, 'a full store is not a store that is down');
    assert.equal([st.own.owner, st.own.epoch], ['shop/gw-2', 2]);
    assert.is(storeFullness.state().egress.refusals, before + 1, 'the usage report was refused and counted');
    assert.ok(storeFullness.isFull('egress'));
    n.s.stopped = true;
  } finally {
    for (const c of closers.reverse()) await c();
    await redis.stop();
  }
});

test('a server older than Redis 7.0 (no script flags) is refused at connect, naming its version', async () => {
  // A stand-in speaking just enough RESP: INFO says 6.2.14, everything else is OK.
  const server = net.createServer((sock) => {
    let buf = '';
    sock.on('data', (d) => {
      buf += d.toString('latin1');
      // One command per *N array; answer each complete one (the stand-in's clients send small ones).
      for (let m = /^\*(\d+)\r\n/.exec(buf); m; m = /^\*(\d+)\r\n/.exec(buf)) {
        const parts = buf.split('\r\n');
        const n = Number(m[1]);
        if (parts.length < 1 + 2 * n + 1) return;
        const cmd = parts[2].toUpperCase();
        buf = parts.slice(1 + 2 * n).join('\r\n');
        if (cmd === 'INFO') {
          const body = 'redis_version:6.2.14\r\nloading:0\r\n';
          sock.write(`$${Buffer.byteLength(body)}\r\n${body}\r\n`);
        } else sock.write('+OK\r\n');
      }
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  try {
    const port = (server.address() as net.AddressInfo).port;
    const err = await RedisStore.connect(`redis://127.0.0.1:${port}`, { connectTimeoutMs: 1000 }).then(async (st) => {
      await st.close();
      return undefined;
    }, (e: unknown) => e);
    assert.instance(err, TetherError);
    assert.is((err as TetherError).code, ErrorCode.InvalidConfig);
    assert.match((err as Error).message, /cluster store \(redis at 127\.0\.0\.1:\d+\) is Redis 6\.2\.14: tether needs Redis 7\.0 or later/);
  } finally {
    server.close();
  }
});

test.run();
