// Health checks with kube-proxy's contract on the testbed: a load balancer Service with
// externalTrafficPolicy Local answers on its healthCheckNodePort on every node — 200 where the node has a
// ready local target, 503 elsewhere — and flips within a second when the EndpointSlice changes; the node's
// /healthz and /livez answer on the health port; a port clash and a port in use are reported, nothing
// else disturbed. Probed from the router, as an external load balancer would.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { withTestbed, type Testbed } from './testbed';
import { pool, service, slice, topology, until } from './lb-scenario';

const HC = 32100;

const PROBE = `
const http = require('http');
const [host, port, path] = process.argv.slice(1);
http.get({ host, port: Number(port), path, timeout: 2000 }, (res) => {
  let body = ''; res.on('data', (d) => (body += d));
  res.on('end', () => console.log(JSON.stringify({ status: res.statusCode, weight: res.headers['x-load-balancing-endpoint-weight'], type: res.headers['content-type'], body })));
}).on('error', (e) => console.log(JSON.stringify({ error: e.code })));`;

interface Probe { status?: number; weight?: string; type?: string; body?: string; error?: string }

async function probe(tb: Testbed, node: string, port = HC, path = '/'): Promise<Probe> {
  const r = await tb.exec('router', [process.execPath, '-e', PROBE, tb.node(node).fabricIp, String(port), path]);
  return JSON.parse(r.stdout.trim().split('\n').pop() ?? '{}') as Probe;
}

function local(extra: Record<string, unknown> = {}, name = 'db'): Record<string, unknown> {
  const s = service() as { metadata: Record<string, unknown>; spec: Record<string, unknown> };
  return { ...s, metadata: { ...s.metadata, name }, spec: { ...s.spec, externalTrafficPolicy: 'Local', healthCheckNodePort: HC, ...extra } };
}

test('health-check node port: 200 exactly on nodes with a ready local target, flips within 1 s, terminating-only is 503; node /healthz and /livez; clashes reported', async () => {
  await withTestbed(topology(), async (tb) => {
    tb.rewriteConfig({ extraObjects: [pool, local(), slice(tb, ['n4-t1', 'n5-t3'])] });
    await until('health checks answer', async () => (await probe(tb, 'n4')).status === 200, 20_000);
    const answers = Object.fromEntries(await Promise.all(['n1', 'n2', 'n3', 'n4', 'n5'].map(async (n) => [n, await probe(tb, n)] as const)));
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
      assert.match(st.taken, /32101: in use on this node/);
      assert.is((await probe(tb, 'n4')).status, 200, 'the first Service still answers');
    } finally {
      squatter.kill('SIGKILL');
    }
  });
});

test.run();
