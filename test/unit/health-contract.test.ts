// The health-check contract against kube-proxy's (LOADBALANCER.md; pkg/proxy/healthcheck): status codes,
// the exact bodies and headers, over real HTTP, for 0, 1 and 2 local endpoints, only terminating ones, and
// stale programming; the node's /healthz and /livez with eligibility.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import * as http from 'node:http';
import * as net from 'node:net';
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync, symlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { HealthListener, countLocalEndpoints, goTime, nodeAnswer, serviceAnswer } from '../../daemon/health/health-server';
import { HealthController, holderOf, type NodeHealthReport } from '../../daemon/health/health-controller';
import { healthCondition } from '../../daemon/kube/status-controller';
import { portHolder } from '../../daemon/sys/port-holder';
import type { ResolvedLoadBalancer } from '../../daemon/lb/lb-spec';
import { log } from '../../daemon/log';

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

test('a port in use names the process holding it (from /proc); a free port names none', async () => {
  const srv = net.createServer();
  await new Promise<void>((r) => srv.listen(0, '127.0.0.1', () => r()));
  const port = (srv.address() as net.AddressInfo).port;
  try {
    assert.is(portHolder(port)?.pid, process.pid);
  } finally {
    await new Promise((r) => srv.close(r));
  }
  assert.is(portHolder(port), undefined);
  // A process named kube-proxy (node under that name: the kernel names a process after the path it ran).
  const dir = mkdtempSync(join(tmpdir(), 'tether-holder-'));
  symlinkSync(process.execPath, join(dir, 'kube-proxy'));
  const child = spawn(join(dir, 'kube-proxy'), ['-e', "const s = require('net').createServer().listen(0, '127.0.0.1', () => process.stdout.write(s.address().port + '\\n'))"], { stdio: ['ignore', 'pipe', 'inherit'] });
  try {
    const p = await new Promise<number>((resolve) => child.stdout!.once('data', (d) => resolve(Number(String(d).trim()))));
    assert.equal(portHolder(p), { name: 'kube-proxy', pid: child.pid });
  } finally {
    child.kill('SIGKILL');
    rmSync(dir, { recursive: true, force: true });
  }
});

const svc = (port: number, open: boolean, localEndpoints: number, status: number, problem?: string) => ({ port, open, localEndpoints, status, ...(problem ? { problem } : {}) });
const node = (services: NodeHealthReport['services']): NodeHealthReport => ({ eligible: true, healthy: true, services });

test('Service health condition from the nodes\' reports: answers and local counts per node, ports not open named, none reported', () => {
  const ok = healthCondition('shop/db', {
    n2: node({ 'shop/db': svc(32100, true, 0, 503) }),
    n1: node({ 'shop/db': svc(32100, true, 2, 200) }),
    n3: node({ 'shop/db': svc(32100, true, 1, 503) }),
    n4: node({ 'shop/other': svc(32101, true, 1, 200) }),
  });
  assert.is(ok.status, 'True');
  assert.is(ok.reason, 'Answering');
  assert.is(ok.message, "port 32100 answered on 3 nodes: 200 on n1 (2 local endpoints); 503 on n2, n3 (1 local, tether's programming stale)");
  const bad = healthCondition('shop/db', {
    n1: node({ 'shop/db': svc(32100, true, 1, 200) }),
    n2: node({ 'shop/db': svc(32100, false, 0, 503, 'health-check port 32100: in use on this node by kube-proxy (pid 7)') }),
  });
  assert.is(bad.status, 'False');
  assert.is(bad.reason, 'PortUnavailable');
  assert.is(bad.message, 'not answered on 1 of 2 nodes: n2: health-check port 32100: in use on this node by kube-proxy (pid 7); 200 on n1 (1 local endpoint); 503 on no node');
  const kp = healthCondition('shop/db', {
    n1: node({ 'shop/db': svc(32100, true, 1, 200) }),
    n2: node({ 'shop/db': { ...svc(32100, false, 0, 503, 'health-check port 32100: in use on this node by kube-proxy (pid 7)'), heldBy: 'kube-proxy' } }),
  });
  assert.is(kp.status, 'True', 'kube-proxy answering a node is not a failure');
  assert.is(kp.message, 'port 32100 answered on 2 nodes: 200 on n1 (1 local endpoint); 503 on no node; kube-proxy answers on n2');
  const none = healthCondition('shop/db', { n1: node({}) });
  assert.is(none.status, 'Unknown');
  assert.is(none.reason, 'NoReports');
});

test('the health controller reports its answers on a change (and only then, within the report period); a port in use is reported with its holder', async () => {
  const squat = net.createServer();
  await new Promise<void>((r) => squat.listen(0, '0.0.0.0', () => r()));
  const taken = (squat.address() as net.AddressInfo).port;
  const free = await new Promise<number>((r) => { const s = net.createServer().listen(0, () => { const p = (s.address() as net.AddressInfo).port; s.close(() => r(p)); }); });
  const lb = (name: string, hc: number, local: number) => ({
    key: `shop/${name}`, externalTrafficPolicy: 'Local', healthCheckNodePort: hc,
    targets: Array.from({ length: local }, (_, i) => ({ address: `10.244.0.${i + 1}`, state: 'active', node: 'n1' })),
  }) as unknown as ResolvedLoadBalancer;
  let services = [lb('db', free, 1), lb('web', taken, 1)];
  const reports: NodeHealthReport[] = [];
  const hc = new HealthController({ node: 'n1', port: 0, services: () => services, healthy: () => true, eligible: () => true, report: async (r) => void reports.push(structuredClone(r)), logger: log() });
  try {
    await hc.start();
    await hc.reconcile();
    await new Promise((r) => setImmediate(r));
    const first = reports.at(-1)!;
    assert.equal(first.services['shop/db'], { port: free, open: true, localEndpoints: 1, status: 200 });
    assert.is(first.services['shop/web'].open, false);
    assert.match(first.services['shop/web'].problem!, new RegExp(`^health-check port ${taken}: in use on this node by .+ \\(pid ${process.pid}\\)$`));
    assert.ok(first.services['shop/web'].heldBy, 'the holder is reported');
    const n = reports.length;
    await hc.reconcile();
    await new Promise((r) => setImmediate(r));
    assert.is(reports.length, n, 'nothing changed: no new report');
    services = [lb('db', free, 0), lb('web', taken, 1)];
    await hc.reconcile();
    await new Promise((r) => setImmediate(r));
    assert.equal(reports.at(-1)!.services['shop/db'], { port: free, open: true, localEndpoints: 0, status: 503 }, 'the flip is reported');
  } finally {
    await hc.stop();
    await new Promise((r) => squat.close(r));
  }
});

test('without the host\'s processes (the DaemonSet\'s container, no hostPID) kube-proxy is recognised by its answer naming the Service; anything else is "not visible"', async () => {
  const noProc = mkdtempSync(join(tmpdir(), 'tether-noproc-'));
  const kubeProxy = http.createServer((_q, res) => res.end(serviceAnswer('shop', 'web', 1, true).body));
  const other = http.createServer((_q, res) => res.end('{"hello": 1}'));
  try {
    const port = (s: http.Server) => new Promise<number>((r) => s.listen(0, '127.0.0.1', () => r((s.address() as net.AddressInfo).port)));
    const [kp, ot] = [await port(kubeProxy), await port(other)];
    assert.equal(await holderOf(kp, 'shop/web', noProc), { name: 'kube-proxy', text: 'by kube-proxy (its answer names this Service)' });
    assert.equal(await holderOf(kp, 'shop/db', noProc), { text: "(the holder is not visible from tetherd's container)" }, 'an answer for another Service is not kube-proxy serving this one');
    assert.equal(await holderOf(ot, 'shop/web', noProc), { text: "(the holder is not visible from tetherd's container)" });
    assert.match((await holderOf(ot, 'shop/web'))!.text, new RegExp(`^by .+ \\(pid ${process.pid}\\)$`), 'with /proc the process is named');
  } finally {
    kubeProxy.close();
    other.close();
    rmSync(noProc, { recursive: true, force: true });
  }
});

test.run();
