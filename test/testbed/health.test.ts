// Health checks with kube-proxy's contract on the testbed: a load balancer Service with
// externalTrafficPolicy Local answers on its healthCheckNodePort on every node — 200 where the node has a
// ready local target, 503 elsewhere — and flips within a second when the EndpointSlice changes; the node's
// /healthz and /livez answer on the health port; a port clash and a port in use are reported, nothing
// else disturbed. Probed from the router, as an external load balancer would. In a cluster (fake API server):
// the Service's tether.dev/HealthCheck condition per node, and node eligibility from a taint.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { withTestbed, type Testbed } from './testbed';
import { PORT, pool, routerPaths, service, slice, startBgp, startTargets, topology, traffic, until } from './lb-scenario';
import { HC, colocated, local, probe } from './health-scenario';

test('health-check node port: 200 exactly on nodes with a ready local target, flips within 1 s, terminating-only is 503; node /healthz and /livez; clashes reported', async () => {
  await withTestbed(topology(), async (tb) => {
    tb.rewriteConfig({ extraObjects: [pool, local(), slice(tb, ['n4-t1', 'n5-t3'])] });
    // Each node opens its listener when its own tetherd has programmed the Service: wait for all five.
    const answers = await until('every node answers its health check', async () => {
      const a = Object.fromEntries(await Promise.all(['n1', 'n2', 'n3', 'n4', 'n5'].map(async (n) => [n, await probe(tb, n)] as const)));
      return Object.values(a).every((x) => x.status !== undefined) ? a : undefined;
    }, 20_000);
    process.stdout.write(`  ${Object.entries(answers).map(([n, a]) => `${n} ${a.status} (${a.weight})`).join(', ')}\n`);
    for (const n of ['n1', 'n2', 'n3']) assert.is(answers[n].status, 503, `${n} has no local target`);
    for (const n of ['n4', 'n5']) assert.is(answers[n].status, 200, `${n} has a local target`);
    assert.is(answers.n4.type, 'application/json');
    assert.is(answers.n4.weight, '1');
    assert.equal(JSON.parse(answers.n4.body!), { service: { namespace: 'shop', name: 'db' }, localEndpoints: 1, serviceProxyHealthy: true });

    // The last local target of n5 goes: its answer flips to 503 within a second of the change.
    const t0 = Date.now();
    tb.rewriteConfig({ extraObjects: [pool, local(), slice(tb, ['n4-t1'])] });
    await until('n5 unhealthy', async () => (await probe(tb, 'n5')).status === 503, 5000);
    const flipMs = Date.now() - t0;
    process.stdout.write(`  n5 lost its last local target: 503 after ${flipMs} ms\n`);
    assert.ok(flipMs < 1000, `flipped within 1 s (${flipMs} ms)`);

    // Only a terminating target left on n4: not counted, 503 (KEP-1669).
    tb.rewriteConfig({ extraObjects: [pool, local(), slice(tb, [], ['n4-t1'])] });
    await until('n4 unhealthy with only a terminating target', async () => (await probe(tb, 'n4')).status === 503, 5000);
    assert.is(JSON.parse((await probe(tb, 'n4')).body!).localEndpoints, 0);

    // The node's own health port.
    const hz = await probe(tb, 'n1', 10266, '/healthz');
    const lz = await probe(tb, 'n1', 10266, '/livez');
    assert.is(hz.status, 200);
    assert.is(JSON.parse(hz.body!).nodeEligible, true);
    assert.is(lz.status, 200);
    assert.is((await probe(tb, 'n1', 10266, '/other')).status, 404);

    // A second Service on the same health-check port is refused naming the first; a port taken on the node
    // is reported; the first Service keeps answering.
    const squatter = tb.spawn('n4', [process.execPath, '-e', "require('net').createServer().listen(32101, '0.0.0.0', () => console.log('ready'))"]);
    await until('squatter listening', async () => true, 1000);
    await new Promise((r) => setTimeout(r, 500));
    try {
      tb.rewriteConfig({ extraObjects: [pool, local(), slice(tb, ['n4-t1']), local({}, 'twin'), local({ healthCheckNodePort: 32101 }, 'taken')] });
      const st = await until('clash and port in use reported', async () => {
        const s = (await tb.status('n4')) as unknown as { loadBalancers: Array<{ service: string; refused?: string[] }>; health: { services: Array<{ service: string; problem?: string }> } };
        const twin = s.loadBalancers.find((l) => l.service === 'shop/twin');
        const taken = s.health.services.find((x) => x.service === 'shop/taken');
        return twin?.refused && taken?.problem ? { twin: twin.refused.join('; '), taken: taken.problem } : undefined;
      }, 10_000);
      process.stdout.write(`  twin: ${st.twin}\n  taken: ${st.taken}\n`);
      assert.match(st.twin, /32100 is already the health-check port of Service shop\/db/);
      // In the DaemonSet's container (no host PID namespace) the holder cannot be named.
      assert.match(st.taken, /32101: in use on this node (by node \(pid \d+\)|\(the holder is not visible from tetherd's container\))$/);
      assert.is((await probe(tb, 'n4')).status, 200, 'the first Service still answers');
    } finally {
      squatter.kill('SIGKILL');
    }
  });
});

type Cond = { type: string; status: string; reason: string; message: string };

/** The Service's tether.dev/HealthCheck condition once `ok` holds for it (written by tether-operator). */
async function healthCondition(tb: Testbed, what: string, ok: (c: Cond) => boolean): Promise<Cond> {
  return until(what, async () => {
    const s = tb.api.get('Service', 'db', 'shop') as { status?: { conditions?: Cond[] } } | undefined;
    const c = s?.status?.conditions?.find((x) => x.type === 'tether.dev/HealthCheck');
    return c && ok(c) ? c : undefined;
  }, 20_000);
}

test('in a cluster: the Service status says per node the local endpoint count and the answer, and names the node whose port is taken and by what; a Node tainted for removal fails /healthz (not /livez) until the taint goes', async () => {
  await withTestbed({ ...topology(), configSource: 'kubernetes' }, async (tb) => {
    // n3's health-check port is taken before the Service exists.
    const squatter = tb.spawn('n3', [process.execPath, '-e', `require('net').createServer().listen(${HC}, '0.0.0.0')`]);
    try {
      await new Promise((r) => setTimeout(r, 500));
      tb.api.apply(structuredClone(local()));
      tb.api.apply(structuredClone(slice(tb, ['n4-t1', 'n5-t3'])));
      const taken = await healthCondition(tb, 'PortUnavailable naming n3', (c) => c.reason === 'PortUnavailable' && c.message.endsWith('200 on n4 (1 local endpoint), n5 (1 local endpoint); 503 on n1, n2'));
      process.stdout.write(`  ${taken.status} ${taken.reason}: ${taken.message}\n`);
      assert.is(taken.status, 'False');
      assert.match(taken.message, new RegExp(`^not answered on 1 of 5 nodes: n3: health-check port ${HC}: in use on this node (by node \\(pid \\d+\\)|\\(the holder is not visible)`));
      assert.match(taken.message, /200 on n4 \(1 local endpoint\), n5 \(1 local endpoint\); 503 on n1, n2$/);
      assert.is((await probe(tb, 'n4')).status, 200, 'the other nodes answer meanwhile');
    } finally {
      squatter.kill('SIGKILL');
    }
    // The port freed: n3 takes it (retried) and the condition turns True.
    const ok = await healthCondition(tb, 'Answering on every node', (c) => c.status === 'True');
    process.stdout.write(`  ${ok.status} ${ok.reason}: ${ok.message}\n`);
    assert.is(ok.message, `port ${HC} answered on 5 nodes: 200 on n4 (1 local endpoint), n5 (1 local endpoint); 503 on n1, n2, n3`);
    // n5's last target goes: the flip reaches the status.
    const t0 = Date.now();
    tb.api.apply(structuredClone(slice(tb, ['n4-t1', 'n4-t2'])));
    const flipped = await healthCondition(tb, 'n5 503 in status', (c) => c.message.endsWith('503 on n1, n2, n3, n5'));
    process.stdout.write(`  after the EndpointSlice change (${Date.now() - t0} ms): ${flipped.message}\n`);
    assert.match(flipped.message, /200 on n4 \(2 local endpoints\)/);

    // Node eligibility (KEP-3836): n2 tainted ToBeDeletedByClusterAutoscaler fails /healthz, /livez stays 200.
    const n2 = tb.api.get('Node', 'n2') as { spec?: Record<string, unknown> };
    tb.api.apply({ ...n2, spec: { ...(n2.spec ?? {}), taints: [{ key: 'ToBeDeletedByClusterAutoscaler', value: '1732500000', effect: 'NoSchedule' }] } });
    await until('n2 /healthz 503', async () => (await probe(tb, 'n2', 10266, '/healthz')).status === 503, 10_000);
    const hz = await probe(tb, 'n2', 10266, '/healthz');
    assert.is(JSON.parse(hz.body!).nodeEligible, false);
    assert.is((await probe(tb, 'n2', 10266, '/livez')).status, 200, '/livez ignores eligibility');
    assert.is((await probe(tb, 'n1', 10266, '/healthz')).status, 200, 'other nodes stay eligible');
    const tainted = tb.api.get('Node', 'n2') as { spec?: Record<string, unknown> };
    tb.api.apply({ ...tainted, spec: { ...(tainted.spec ?? {}), taints: [] } });
    await until('n2 /healthz 200 again', async () => (await probe(tb, 'n2', 10266, '/healthz')).status === 200, 10_000);
  });
});

const CLIENT_PODS = ['n1-c', 'n2-c', 'n4-c'];

const SRC = `
const net = require('net');
const [host, port] = process.argv.slice(1);
const s = net.connect({ host, port: Number(port) });
let got = '';
s.on('connect', () => s.write('0 0\\n'));
s.on('data', (b) => { got += b; if (got.includes('\\n')) { console.log(JSON.stringify({ ok: got.trim() === '0 0', local: s.localAddress })); s.destroy(); process.exit(0); } });
s.on('error', (e) => { console.log(JSON.stringify({ error: e.code })); process.exit(1); });
setTimeout(() => { console.log(JSON.stringify({ error: 'timeout' })); process.exit(1); }, 5000);`;

/** One TCP exchange from a namespace to vip:PORT: ok when the echo came back, and the local address used. */
async function connectOnce(tb: Testbed, from: string, vip: string): Promise<{ ok?: boolean; local?: string; error?: string }> {
  return JSON.parse((await tb.exec(from, [process.execPath, '-e', SRC, vip, String(PORT)])).stdout.trim().split('\n').pop()!);
}

test('Local policy in tether\'s load balancer: only nodes with a ready local target announce; targets see the client; a node whose last target is terminating withdraws and its flows keep that target; Cluster beside Local; pods on other nodes reach the VIP', async () => {
  await withTestbed(colocated(), async (tb) => {
    const bgp = await startBgp(tb, ['n1', 'n4', 'n5']);
    try {
      const cluster = { ...service(), metadata: { name: 'web', namespace: 'shop', annotations: { 'lb.tether.dev/affinity': 'flow' } } };
      const webSlice = { ...(slice(tb, ['n4-t1', 'n5-t3']) as Record<string, unknown>), metadata: { name: 'web-1', namespace: 'shop', labels: { 'kubernetes.io/service-name': 'web' } } };
      tb.rewriteConfig({ extraObjects: [pool, local(), slice(tb, ['n4-t1', 'n4-t2', 'n5-t3']), cluster, webSlice] });
      const vips = await until('both VIPs allocated', async () => {
        const l = ((await tb.status('n1')) as unknown as { loadBalancers: Array<{ service: string; vip?: string }> }).loadBalancers;
        const db = l.find((x) => x.service === 'shop/db')?.vip;
        const web = l.find((x) => x.service === 'shop/web')?.vip;
        return db && web ? { db, web } : undefined;
      });
      const ip = (n: string) => tb.node(n).fabricIp;
      await until('Local VIP over exactly n4 and n5', async () => (await routerPaths(tb, vips.db)).join() === [ip('n4'), ip('n5')].sort().join());
      await until('Cluster VIP over n1, n4 and n5', async () => (await routerPaths(tb, vips.web)).join() === [ip('n1'), ip('n4'), ip('n5')].sort().join());
      process.stdout.write(`  Local VIP ${vips.db} via ${(await routerPaths(tb, vips.db)).join(', ')}; Cluster VIP ${vips.web} via ${(await routerPaths(tb, vips.web)).join(', ')}\n`);

      const servers = await startTargets(tb, ['n4-t1', 'n4-t2', 'n5-t3'], vips.db);
      try {
        // From pods on every kind of node: n1 (an LB pod but no local target: the VIP is not routed there, so
        // through the router), n2 (neither: through the router) and n4 (its own LB pod and targets).
        for (const c of CLIENT_PODS) {
          const fromPod = await connectOnce(tb, c, vips.db);
          assert.ok(fromPod.ok, `pod ${c} reaches the Local VIP: ${JSON.stringify(fromPod)}`);
          assert.is(fromPod.local, tb.podIp(c), `${c} spoke from its own address`);
        }
        // The Cluster Service beside it serves too: from the external client and from the same pods (n1's
        // own LB pod forwards to targets on other nodes).
        for (const c of ['client', ...CLIENT_PODS]) {
          const r = await connectOnce(tb, c, vips.web);
          assert.ok(r.ok, `${c} reaches the Cluster VIP: ${JSON.stringify(r)}`);
        }
        // Long-lived connections while n5's only target turns terminating: n5 withdraws (its health check
        // fails), ECMP moves its flows to n4, which still honours their mappings to the terminating t3.
        const report = await traffic(tb, vips.db, 100, 12_000, async () => {
          tb.rewriteConfig({ extraObjects: [pool, local(), slice(tb, ['n4-t1', 'n4-t2'], ['n5-t3']), cluster, webSlice] });
          await until('n5 withdrawn', async () => (await routerPaths(tb, vips.db)).join() === ip('n4'), 10_000);
        }, false);
        const peers = await servers.stop();
        const onT3 = peers.get('n5-t3')?.length ?? 0;
        process.stdout.write(`  n5's only target terminating: n5 withdrew; ${report.intact}/100 intact (${onT3} on t3); targets saw ${[...new Set([...peers.values()].flat().map((p) => p.split(':')[0]))].join(', ')}\n`);
        assert.ok(onT3 > 0, 'some connections were on t3');
        assert.is(report.intact, 100, `every connection kept: ${report.errors.slice(0, 3).join('; ')}`);
        // Targets saw the real source: the external client, and the in-cluster pods' own addresses for their probes.
        const sources = [...peers.values()].flat().map((p) => p.split(':')[0]);
        for (const s of sources) assert.ok([tb.externalIp('client'), ...CLIENT_PODS.map((c) => tb.podIp(c))].includes(s), `a target saw ${s}`);
        for (const c of CLIENT_PODS) assert.ok(sources.includes(tb.podIp(c)), `a target saw ${c}'s own address`);
      } finally {
        await servers.stop().catch(() => undefined);
      }
    } finally {
      await bgp.stop();
    }
  });
});

test.run();
