// The metrics part under bad input: --metrics-bind-address malformed (refused at start) or its port taken
// (one error line naming the address and the holder; retried while the rest serves), the cluster store
// down or never reached (a scrape answers from what was last read, the store gauge at 0, without waiting
// on a store call), a section whose read throws (left out, logged once, counted; the scrape answers).
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import * as fs from 'node:fs';
import * as net from 'node:net';
import * as os from 'node:os';
import * as path from 'node:path';
import { Writable } from 'node:stream';
import { makeLogger, setLogger } from '../../lib/log';
import { validatePools } from '../../ipam/pool';
import { RedisStore } from '../../ipam/store/redis-store';
import { LazyStore } from '../../ipam/store/lazy-store';
import type { ClusterStore } from '../../ipam/types';
import { LbController } from '../../daemon/lb/lb-controller';
import { connectLbStore } from '../../daemon/lb/lb-store';
import { PodStore } from '../../daemon/state/pod-store';
import { AttachService } from '../../daemon/pod/attach-service';
import { Ipam } from '../../daemon/parts/ipam';
import { MetricsServer, metricsServer, StaleWhileRead } from '../../daemon/parts/metrics';
import { TetherMetrics, type LbServiceView } from '../../daemon/metrics/tether-metrics';
import { DEFAULT_METRICS_ADDRESS, metricsAddressOption, parseOptions } from '../../daemon/options';
import { StartError } from '../../daemon/lifecycle';
import type { ConfigSource } from '../../daemon/config/source';
import { captureLogger } from '../lib/log-capture';
import { startRedis } from '../lib/redis';
import { until, waitFor, sleep } from '../lib/wait';
import { compareWithStatus, parseExposition, scrapeMetrics } from '../lib/metrics';

const quiet = makeLogger({ level: 'error', stream: new Writable({ write: (_c, _e, cb) => cb() }) });
setLogger(quiet);

const pools = validatePools([
  { apiVersion: 'tether.dev/v1alpha1', kind: 'AddressPool', metadata: { name: 'float' }, spec: { usage: 'floating', ipv4: { cidr: '198.51.100.0/29' } } },
]);
const config = { pools, nodes: { n1: { labels: {} } }, others: [] };

test('--metrics-bind-address: kube-proxy\'s form; empty or port 0 is off; anything else is refused at start, naming the flag', () => {
  assert.is(parseOptions([])['metrics-bind-address'], DEFAULT_METRICS_ADDRESS);
  assert.equal(metricsAddressOption(DEFAULT_METRICS_ADDRESS), { host: '127.0.0.1', port: 10268 });
  assert.equal(metricsAddressOption('0.0.0.0:9100'), { host: '0.0.0.0', port: 9100 });
  assert.equal(metricsAddressOption('[::]:10268'), { host: '::', port: 10268 });
  assert.equal(metricsAddressOption('[fd00::1]:1'), { host: 'fd00::1', port: 1 });
  assert.is(metricsAddressOption(''), undefined);
  assert.is(metricsAddressOption('127.0.0.1:0'), undefined);
  for (const bad of ['localhost:10268', '10268', ':10268', '::1:10268', '[127.0.0.1]:80', '1.2.3.4:65536', '1.2.3.4:', '1.2.3.4:80/metrics', '300.1.1.1:80']) {
    try {
      metricsAddressOption(bad);
      assert.unreachable(`${bad} accepted`);
    } catch (e) {
      assert.instance(e, StartError, bad);
      assert.is((e as StartError).exitCode, 2);
      assert.match((e as Error).message, `--metrics-bind-address: ${JSON.stringify(bad)} is not IP:PORT`);
    }
  }
});

test('port in use: one error line naming the address and the process holding it; retried, and served once the port is free', async () => {
  const holder = net.createServer();
  await new Promise<void>((r) => holder.listen(0, '127.0.0.1', r));
  const port = (holder.address() as net.AddressInfo).port;
  const { logger, lines, settle } = captureLogger();
  const metrics = new TetherMetrics(logger);
  const server = metricsServer({ address: { host: '127.0.0.1', port }, metrics, parts: {}, logger, retryMs: 20 });
  await server.start(); // a taken port does not fail the start
  try {
    assert.is(server.boundAddress(), undefined);
    const st = server.status().metrics as { address: string; listening: boolean; problem: string };
    assert.is(st.address, `127.0.0.1:${port}`);
    assert.is(st.listening, false);
    assert.match(st.problem, new RegExp(`^cannot listen on 127\\.0\\.0\\.1:${port}: port ${port} is in use by \\S+ \\(pid ${process.pid}\\)$`));
    await sleep(150); // several retries
    await settle();
    const errors = lines.filter((l) => l.level === 'error');
    assert.is(errors.length, 1, 'the same problem is logged once, not at every retry');
    assert.is(errors[0].address, `127.0.0.1:${port}`);
    assert.is(errors[0].problem, st.problem);
    await new Promise((r) => holder.close(r));
    await waitFor(() => server.boundAddress() !== undefined, 'the metrics listener after the port was freed');
    assert.is(server.boundAddress()!.port, port);
    assert.ok((await scrapeMetrics(`http://127.0.0.1:${port}/metrics`)).families.has('tether_build_info'));
    assert.equal(server.status().metrics, { address: `127.0.0.1:${port}`, listening: true });
    await settle();
    assert.ok(lines.some((l) => l.level === 'info' && l.message === 'metrics: serving' && l.address === `127.0.0.1:${port}`));
  } finally {
    await server.stop();
    holder.close();
  }
});

test('store outage: the scrape answers with the store gauges at 0 and the cluster figures last read; a store never reached is never waited on', async () => {
  const redis = await startRedis();
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tether-metrics-store-'));
  const cleanups: Array<() => Promise<void> | void> = [];
  try {
    const store = new LazyStore(() => RedisStore.connect(redis.url, { keyPrefix: 'f:', connectTimeoutMs: 300, commandTimeoutMs: 300 }));
    cleanups.push(() => store.close());
    const ipam = new Ipam({ nodeName: 'n1', config, source: {} as ConfigSource, store, stateDir: path.join(dir, 'state'), logger: quiet });
    await ipam.addresses.allocate({ pool: 'float', owner: 'egress/shop/out#0', count: 2 });
    const mappings = await connectLbStore(redis.url, { keyPrefix: 'f:', timeoutMs: 300 });
    cleanups.push(() => mappings.connection.close());
    const lb = new LbController({
      node: { name: 'n1', address: '127.0.0.1' }, pinDir: path.join(dir, 'bpf'), fouPort: 5555, exportTable: 0, maxVips: 16,
      store: mappings, addresses: ipam.addresses, attach: new AttachService(new PodStore(path.join(dir, 'state')), quiet), logger: quiet,
    });
    cleanups.push(() => lb.stop());
    const server = metricsServer({ address: { host: '127.0.0.1', port: 0 }, metrics: new TetherMetrics(quiet), parts: { ipam, lb, store }, logger: quiet });
    await server.start();
    cleanups.push(() => server.stop());
    const url = `http://127.0.0.1:${server.boundAddress()!.port}/metrics`;
    await waitFor(() => store.connected && mappings.connection.connected, 'the store connections');
    // The cluster figures are read from the store in the background, not by the scrape: wait until the
    // allocation above is read (a busy machine may scrape before the first read).
    let s = await until('the first read of the cluster figures', async () => {
      const x = await scrapeMetrics(url);
      return x.value('tether_ipam_cluster_addresses_allocated', { pool: 'float' }) === 2 ? x : undefined;
    }, 10_000);
    assert.is(s.value('tether_store_reachable', { subsystem: 'ipam' }), 1);
    assert.is(s.value('tether_store_reachable', { subsystem: 'lb' }), 1);
    assert.is(s.value('tether_ipam_cluster_addresses_allocated', { pool: 'float' }), 2);

    await redis.kill();
    await waitFor(() => !store.connected && !mappings.connection.connected, 'the store connections to notice the outage');
    s = await scrapeMetrics(url);
    assert.is(s.value('tether_store_reachable', { subsystem: 'ipam' }), 0);
    assert.is(s.value('tether_store_reachable', { subsystem: 'lb' }), 0);
    assert.is(s.value('tether_ipam_cluster_addresses_allocated', { pool: 'float' }), 2, 'the figure last read');
    assert.is(s.value('tether_ipam_cluster_addresses_capacity', { pool: 'float' }), 6);
    assert.equal(server.status().storeReachable, { ipam: false, lb: false }, 'tetherctl status says the same');

    // A store whose connection never completes (a blackholed address): every call to it hangs. The
    // scrape answers all the same: nothing in it waits on the store.
    let asked = 0;
    const hanging = new LazyStore(() => {
      asked++;
      return new Promise<ClusterStore>(() => undefined);
    });
    const ipam2 = new Ipam({ nodeName: 'n1', config, source: {} as ConfigSource, store: hanging, stateDir: path.join(dir, 'state2'), logger: quiet });
    const server2 = metricsServer({ address: { host: '127.0.0.1', port: 0 }, metrics: new TetherMetrics(quiet), parts: { ipam: ipam2, store: hanging }, logger: quiet });
    await server2.start();
    cleanups.push(() => server2.stop());
    // Bounded, so that a scrape waiting on the store fails here instead of hanging the group.
    let deadline: NodeJS.Timeout | undefined;
    const s2 = await Promise.race([
      scrapeMetrics(`http://127.0.0.1:${server2.boundAddress()!.port}/metrics`),
      new Promise<never>((_, reject) => (deadline = setTimeout(() => reject(new Error('the scrape waited on a store that never answers')), 5000))),
    ]).finally(() => clearTimeout(deadline));
    assert.is(asked, 1, 'the cluster figure was asked for (in the background)');
    assert.is(s2.value('tether_store_reachable', { subsystem: 'ipam' }), 0);
    assert.is(s2.samples('tether_ipam_cluster_addresses_allocated').length, 0, 'no figure read yet: none shown');
    assert.is(s2.value('tether_ipam_cluster_addresses_capacity', { pool: 'float' }), 6, 'from the configuration');
  } finally {
    for (const c of cleanups.reverse()) await c();
    await redis.stop();
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test('a section that throws is left out, logged once while it keeps failing, and counted; the rest of the scrape answers', async () => {
  const { logger, lines, settle } = captureLogger();
  const metrics = new TetherMetrics(logger);
  let broken = true;
  metrics.use({
    store: () => ({ lb: true }),
    lb: () => {
      if (broken) throw new Error('map read failed: EBADF');
      return [];
    },
  });
  const server = new MetricsServer({ address: { host: '127.0.0.1', port: 0 }, metrics, sources: {}, logger });
  await server.start();
  try {
    const url = `http://127.0.0.1:${server.boundAddress()!.port}/metrics`;
    await scrapeMetrics(url);
    const s = await scrapeMetrics(url);
    assert.is(s.value('tether_store_reachable', { subsystem: 'lb' }), 1);
    assert.is(s.value('tether_metrics_collect_errors_total', { section: 'lb' }), 2);
    await settle();
    const errors = lines.filter((l) => l.level === 'error');
    assert.equal(errors.map((l) => [l.message, l.section, l.error]), [['metrics: reading failed; left out of the scrape', 'lb', 'map read failed: EBADF']]);
    broken = false;
    assert.is((await scrapeMetrics(url)).value('tether_metrics_collect_errors_total', { section: 'lb' }), 2);
  } finally {
    await server.stop();
  }
});

test('LB per VIP: packets, bytes, misses, drops by reason, mappings and the store queue, as the status has them', async () => {
  const lbStatus: LbServiceView[] = [
    {
      service: 'shop/web', vip: '198.18.0.7', announced: true, targets: { active: 2, terminating: 1 }, mappings: 40, mappingStore: { queued: 5 },
      counters: { packets: 1000, bytes: 64000, misses: 40, icmpForwarded: 1, dropNoTarget: 2, dropNoPort: 3, dropIcmpNoFlow: 4, dropFragment: 5, dropError: 6, reportLost: 7 },
    },
    { service: 'shop/away', vip: '198.18.0.8', announced: false, targets: { active: 1, terminating: 0 }, mappings: 0 },
  ];
  const metrics = new TetherMetrics(quiet);
  metrics.use({ lb: () => lbStatus });
  const s = parseExposition(await metrics.scrape());
  assert.equal(compareWithStatus({ loadBalancers: lbStatus }, s), []);
  const web = { service: 'shop/web', vip: '198.18.0.7' };
  assert.equal(s.samples('tether_lb_dropped_packets_total', web).map((x) => [x.labels.reason, x.value]), [['noTarget', 2], ['noPort', 3], ['icmpNoFlow', 4], ['fragment', 5], ['error', 6]]);
  assert.is(s.value('tether_lb_store_queued_mappings', web), 5);
  assert.is(s.value('tether_lb_lost_reports_total', web), 7);
  assert.is(s.value('tether_lb_icmp_forwarded_packets_total', web), 1);
  assert.is(s.samples('tether_lb_packets_total', { vip: '198.18.0.8' }).length, 0, 'a VIP without a slot here has no counters: none shown');
  assert.is(s.value('tether_lb_mappings', { vip: '198.18.0.8' }), 0);
});

test('the cluster figure: the last value read at once, read again in the background once older than its age', async () => {
  let n = 0;
  let release: () => void = () => undefined;
  const cache = new StaleWhileRead(() => new Promise<number>((r) => (release = () => r(++n))), 50, () => undefined);
  assert.is(cache.get(), undefined, 'nothing read yet; a read starts');
  release();
  await waitFor(() => cache.get() === 1, 'the first read');
  assert.is(cache.get(), 1, 'fresh: no new read');
  await sleep(60);
  assert.is(cache.get(), 1, 'stale: the old value, while a read runs');
  assert.is(cache.get(), 1, 'one read at a time');
  release();
  await waitFor(() => cache.get() === 2, 'the second read');
});

test.run();
