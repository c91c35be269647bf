// The health-check contract against kube-proxy's (LOADBALANCER.md; pkg/proxy/healthcheck): status codes,
// the exact bodies and headers, over real HTTP, for 0, 1 and 2 local endpoints, only terminating ones, and
// stale programming; the node's /healthz and /livez with eligibility.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import * as http from 'node:http';
import { HealthListener, countLocalEndpoints, goTime, nodeAnswer, serviceAnswer } from '../../daemon/health/health-server';

function get(port: number, path: string): Promise<{ status: number; headers: http.IncomingHttpHeaders; body: string }> {
  return new Promise((resolve, reject) => {
    http.get({ host: '127.0.0.1', port, path }, (res) => {
      let body = '';
      res.on('data', (d) => (body += d));
      res.on('end', () => resolve({ status: res.statusCode!, headers: res.headers, body }));
    }).on('error', reject);
  });
}

const A = (address: string, state: 'active' | 'terminating', node?: string) => ({ address, state, node });

test('local endpoints: ready ones on this node, each address once; terminating ones and other nodes do not count', () => {
  const rows: Array<[Array<ReturnType<typeof A>>, number, string]> = [
    [[], 0, 'none'],
    [[A('10.0.0.1', 'active', 'n1')], 1, 'one'],
    [[A('10.0.0.1', 'active', 'n1'), A('10.0.0.2', 'active', 'n1')], 2, 'two'],
    [[A('10.0.0.1', 'active', 'n1'), A('10.0.0.1', 'active', 'n1')], 1, 'one address listed twice'],
    [[A('10.0.0.1', 'terminating', 'n1')], 0, 'only terminating'],
    [[A('10.0.0.1', 'active', 'n2'), A('10.0.0.3', 'active')], 0, 'other node, or no node'],
  ];
  for (const [targets, want, what] of rows) assert.is(countLocalEndpoints(targets, 'n1'), want, what);
});

test('service health check: 200 only with local endpoints and fresh programming; kube-proxy body and headers, any path', async () => {
  const rows: Array<[number, boolean, number]> = [[0, true, 503], [1, true, 200], [2, true, 200], [0, false, 503], [1, false, 503], [2, false, 503]];
  for (const [n, healthy, status] of rows) {
    const l = new HealthListener(() => serviceAnswer('shop', 'db', n, healthy));
    const port = await l.listen(0, '127.0.0.1');
    try {
      for (const path of ['/', '/healthz', '/anything?x=1']) {
        const r = await get(port, path);
        assert.is(r.status, status, `${n} local, healthy ${healthy}, ${path}`);
        assert.is(r.headers['content-type'], 'application/json');
        assert.is(r.headers['x-content-type-options'], 'nosniff');
        assert.is(r.headers['x-load-balancing-endpoint-weight'], String(n));
        assert.is(r.body, `{\n\t"service": {\n\t\t"namespace": "shop",\n\t\t"name": "db"\n\t},\n\t"localEndpoints": ${n},\n\t"serviceProxyHealthy": ${healthy}\n}`);
        assert.equal(JSON.parse(r.body), { service: { namespace: 'shop', name: 'db' }, localEndpoints: n, serviceProxyHealthy: healthy });
      }
    } finally {
      await l.close();
    }
  }
});

test('node health: /healthz needs healthy and eligible, /livez only healthy, other paths 404; kube-proxy body layout', () => {
  const last = new Date('2026-11-24T10:00:00.120Z');
  const now = new Date('2026-11-24T10:00:05Z');
  const rows: Array<[boolean, boolean, number, number]> = [[true, true, 200, 200], [true, false, 503, 200], [false, true, 503, 503], [false, false, 503, 503]];
  for (const [healthy, nodeEligible, hz, lz] of rows) {
    const h = nodeAnswer('/healthz', { healthy, nodeEligible, lastUpdated: last, now });
    const l = nodeAnswer('/livez', { healthy, nodeEligible, lastUpdated: last, now });
    assert.is(h.status, hz, `healthz healthy ${healthy} eligible ${nodeEligible}`);
    assert.is(l.status, lz, `livez healthy ${healthy} eligible ${nodeEligible}`);
    const lu = hz === 200 ? goTime(now) : goTime(last);
    assert.is(h.body, `{"lastUpdated": "${lu}","currentTime": "${goTime(now)}", "nodeEligible": ${nodeEligible}}`);
    assert.equal(Object.keys(JSON.parse(l.body)), ['lastUpdated', 'currentTime']);
    assert.is(h.headers['X-Content-Type-Options'], 'nosniff');
  }
  assert.is(goTime(last), '2026-11-24 10:00:00.12 +0000 UTC');
  assert.is(goTime(now), '2026-11-24 10:00:05 +0000 UTC');
  assert.is(nodeAnswer('/metrics', { healthy: true, nodeEligible: true, lastUpdated: last, now }).status, 404);
});

test('a port in use is refused with EADDRINUSE (reported by the caller, nothing else disturbed)', async () => {
  const a = new HealthListener(() => serviceAnswer('a', 'a', 1, true));
  const port = await a.listen(0, '127.0.0.1');
  const b = new HealthListener(() => serviceAnswer('b', 'b', 1, true));
  try {
    await b.listen(port, '127.0.0.1').then(() => assert.unreachable('second listen on the same port'), (e: NodeJS.ErrnoException) => assert.is(e.code, 'EADDRINUSE'));
    assert.is((await get(port, '/')).status, 200, 'the first listener still answers');
  } finally {
    await a.close();
    await b.close();
  }
});

test.run();
