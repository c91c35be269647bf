// The health-check contract against kube-proxy's (LOADBALANCER.md; pkg/proxy/healthcheck): status codes,
// the exact bodies and headers, over real HTTP, for 0, 1 and 2 local endpoints, only terminating ones, and
// stale programming; the node's /healthz and /livez with eligibility, in kube-proxy 1.33+'s body; local
// endpoints counted from EndpointSlices as kube-proxy counts them; staleness by kube-proxy's rule (a change
// waiting longer than 60 s); listeners on both IP families; the answers counted by check and code.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import * as http from 'node:http';
import * as net from 'node:net';
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync, symlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { existsSync, readFileSync } from 'node:fs';
import type { ListenOptions } from 'node:net';
import { HealthListener, countLocalEndpoints, listenAnyAddress, nodeAnswer, rfc3339, serviceAnswer } from '../../daemon/health/health-server';
import { HealthController, holderOf, type NodeHealthReport } from '../../daemon/health/health-controller';
import { FamilyTrackers, ProgrammingTracker, proxyHealth, type FamilyProgramming, type ProgrammingState } from '../../daemon/health/proxy-health';
import { resolveLoadBalancers } from '../../daemon/lb/lb-spec';
import { validatePools } from '../../ipam/pool';
import { healthCondition } from '../../daemon/kube/status-controller';
import { portHolder } from '../../daemon/sys/port-holder';
import type { ResolvedLoadBalancer } from '../../daemon/lb/lb-spec';
import { log } from '../../lib/log';
import { freePort } from '../lib/ports';

function get(port: number, path: string, host = '127.0.0.1'): Promise<{ status: number; headers: http.IncomingHttpHeaders; body: string }> {
  return new Promise((resolve, reject) => {
    http.get({ host, port, path }, (res) => {
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

// Times of the node checks: T0 is when the programming last caught up.
const T0 = Date.parse('2026-11-24T10:00:00.120Z');
const at = (s: number) => T0 + s * 1000;

test('node /healthz and /livez: kube-proxy 1.33+ bodies (healthy, per-family status, RFC 3339 times, old fields kept); an unhealthy lastUpdated is the last programming', () => {
  const now = new Date(at(90.5));
  const N = '"currentTime":"2026-11-24T10:01:30.62Z"';
  const fresh = proxyHealth({ IPv4: { lastUpdated: T0 } }, now.getTime());
  const stale = proxyHealth({ IPv4: { lastUpdated: T0, pendingSince: at(10) } }, now.getTime());
  const never = proxyHealth({}, now.getTime());
  const ok4 = '"status":{"IPv4":{"lastUpdated":"2026-11-24T10:00:00.12Z","healthy":true}}';
  const bad4 = '"status":{"IPv4":{"lastUpdated":"2026-11-24T10:00:00.12Z","healthy":false}}';
  const rows: Array<[string, typeof fresh, boolean, number, string, number, string]> = [
    ['healthy, eligible', fresh, true,
      200, `{"lastUpdated":"2026-11-24T10:01:30.62Z",${N},"nodeEligible":true,"healthy":true,${ok4}}`,
      200, `{"lastUpdated":"2026-11-24T10:01:30.62Z",${N},"healthy":true,${ok4}}`],
    ['healthy, not eligible (healthz 503 keeps the last programming time)', fresh, false,
      503, `{"lastUpdated":"2026-11-24T10:00:00.12Z",${N},"nodeEligible":false,"healthy":true,${ok4}}`,
      200, `{"lastUpdated":"2026-11-24T10:01:30.62Z",${N},"healthy":true,${ok4}}`],
    ['stale: a change waits 80.5 s', stale, true,
      503, `{"lastUpdated":"2026-11-24T10:00:00.12Z",${N},"nodeEligible":true,"healthy":false,${bad4}}`,
      503, `{"lastUpdated":"2026-11-24T10:00:00.12Z",${N},"healthy":false,${bad4}}`],
    ['never programmed, not eligible: Go\'s zero time, no status', never, false,
      503, `{"lastUpdated":"0001-01-01T00:00:00Z",${N},"nodeEligible":false,"healthy":true}`,
      200, `{"lastUpdated":"2026-11-24T10:01:30.62Z",${N},"healthy":true}`],
  ];
  for (const [what, proxy, nodeEligible, hz, hzBody, lz, lzBody] of rows) {
    const h = nodeAnswer('/healthz', { proxy, nodeEligible, now });
    const l = nodeAnswer('/livez?verbose', { proxy, nodeEligible, now });
    assert.is(h.status, hz, `healthz: ${what}`);
    assert.is(h.body, hzBody, `healthz body: ${what}`);
    assert.is(l.status, lz, `livez: ${what}`);
    assert.is(l.body, lzBody, `livez body: ${what}`);
    // Decoded as kube-proxy's own test does: times parse, per-family health, nodeEligible only in healthz.
    const d = JSON.parse(h.body);
    assert.ok(!Number.isNaN(Date.parse(d.lastUpdated)) && Date.parse(d.currentTime) === now.getTime(), what);
    assert.is(d.healthy, proxy.healthy);
    assert.not.ok('nodeEligible' in JSON.parse(l.body), `livez has no nodeEligible: ${what}`);
    assert.equal([h.headers['Content-Type'], h.headers['X-Content-Type-Options']], ['application/json', 'nosniff']);
  }
  assert.equal([rfc3339(new Date('2026-11-24T10:00:05Z')), rfc3339(new Date('2026-11-24T10:00:05.100Z')), rfc3339(undefined)], ['2026-11-24T10:00:05Z', '2026-11-24T10:00:05.1Z', '0001-01-01T00:00:00Z']);
  assert.is(nodeAnswer('/metrics', { proxy: fresh, nodeEligible: true, now }).status, 404);
});

test('staleness by kube-proxy\'s rule: unhealthy only when a change has waited 60 s or more; an old last pass with nothing waiting is healthy', () => {
  const rows: Array<[string, ProgrammingState, number, boolean]> = [
    ['last pass 30 s ago, nothing waits', { lastUpdated: T0 }, at(30), true],
    ['last pass 10 min ago, nothing waits', { lastUpdated: T0 }, at(600), true],
    ['a change waits 5 s', { lastUpdated: T0, pendingSince: at(100) }, at(105), true],
    ['a change waits 59.999 s', { lastUpdated: T0, pendingSince: at(100) }, at(159.999), true],
    ['a change waits 60 s', { lastUpdated: T0, pendingSince: at(100) }, at(160), false],
    ['a change waits 5 min', { lastUpdated: T0, pendingSince: at(100) }, at(400), false],
    ['never programmed (starting), a change waits 2 min', { pendingSince: T0 }, at(120), true],
  ];
  for (const [what, st, now, healthy] of rows) assert.is(proxyHealth({ IPv4: st }, now).healthy, healthy, what);
  assert.is(proxyHealth({ IPv4: { lastUpdated: T0, pendingSince: at(100) } }, at(110), 10_000).healthy, false, 'the timeout is an option');

  // The tracker: the oldest change waiting sets the age; a completed pass programs all of them.
  let now = T0;
  const t = new ProgrammingTracker(() => now);
  t.started();
  now = at(10);
  t.queued();
  now = at(20);
  t.queued();
  assert.equal(t.state(), { lastUpdated: T0, pendingSince: at(10) });
  assert.is(proxyHealth({ IPv4: t.state() }, at(69.9)).healthy, true);
  assert.is(proxyHealth({ IPv4: t.state() }, at(70)).healthy, false);
  now = at(75);
  t.updated();
  assert.equal(t.state(), { lastUpdated: at(75), pendingSince: undefined });
  assert.is(proxyHealth({ IPv4: t.state() }, at(1000)).healthy, true);
});


const hasIPv6Loopback = existsSync('/proc/net/if_inet6') && /^0{31}1 /m.test(readFileSync('/proc/net/if_inet6', 'utf8'));

test('through the controller over HTTP: a stall answers 503 only after 60 s, with lastUpdated the last programming (not the last healthy probe); answers counted by check and code', async () => {
  const [port, hcPort] = [await freePort(), await freePort()];
  let now = at(100);
  let prog: ProgrammingState = { lastUpdated: T0 };
  const lb = { key: 'shop/db', externalTrafficPolicy: 'Local', healthCheckNodePort: hcPort, targets: [{ address: '10.244.0.1', state: 'active', node: 'n1' }] } as unknown as ResolvedLoadBalancer;
  const hc = new HealthController({ node: 'n1', port, services: () => [lb], programming: () => ({ IPv4: prog }), eligible: () => true, logger: log(), now: () => now });
  try {
    await hc.start();
    let r = await get(port, '/healthz');
    assert.is(r.status, 200, 'last pass 100 s ago, nothing waits: healthy (the old 5 s rule said 503)');
    assert.is(JSON.parse(r.body).lastUpdated, rfc3339(new Date(at(100))), 'healthy: lastUpdated is now');
    prog = { lastUpdated: T0, pendingSince: at(100) };
    now = at(159);
    assert.is((await get(port, '/healthz')).status, 200, 'a change waits 59 s');
    assert.is((await get(hcPort, '/')).status, 200);
    now = at(161);
    r = await get(port, '/healthz');
    assert.is(r.status, 503, 'a change waits 61 s');
    assert.is(JSON.parse(r.body).lastUpdated, rfc3339(new Date(T0)), 'unhealthy: lastUpdated is the last programming, not the last healthy probe (at 159 s)');
    assert.is((await get(port, '/livez')).status, 503);
    const s = await get(hcPort, '/');
    assert.is(s.status, 503);
    assert.is(JSON.parse(s.body).serviceProxyHealthy, false);
    assert.is((await get(port, '/metrics')).status, 404);
    assert.equal(hc.status().answers, [
      { check: 'healthz', code: 200, count: 2 }, { check: 'healthz', code: 503, count: 1 },
      { check: 'livez', code: 503, count: 1 },
      { check: 'service', code: 200, count: 1 }, { check: 'service', code: 503, count: 1 },
    ]);
  } finally {
    await hc.stop();
  }
});

test('the health ports listen on both IP families (:: accepting IPv4), as kube-proxy\'s; IPv4 only where the host has no IPv6', async () => {
  const [port, hcPort] = [await freePort(), await freePort()];
  const lb = { key: 'shop/db', externalTrafficPolicy: 'Local', healthCheckNodePort: hcPort, targets: [{ address: '10.244.0.1', state: 'active', node: 'n1' }] } as unknown as ResolvedLoadBalancer;
  const hc = new HealthController({ node: 'n1', port, services: () => [lb], programming: () => ({ IPv4: { lastUpdated: Date.now() } }), eligible: () => true, logger: log() });
  try {
    await hc.start();
    for (const p of [port, hcPort]) {
      assert.is((await get(p, p === port ? '/healthz' : '/')).status, 200, `IPv4 on ${p}`);
      if (hasIPv6Loopback) assert.is((await get(p, p === port ? '/healthz' : '/', '::1')).status, 200, `IPv6 on ${p}`);
    }
  } finally {
    await hc.stop();
  }
  // The choice of address: '::' dual-stack first; 0.0.0.0 only when IPv6 is unavailable; a port in use is not retried.
  const rows: Array<[string | undefined, string[], string]> = [
    [undefined, ['::/dual'], '::'],
    ['EAFNOSUPPORT', ['::/dual', '0.0.0.0'], '0.0.0.0'],
    ['EADDRNOTAVAIL', ['::/dual', '0.0.0.0'], '0.0.0.0'],
    ['EADDRINUSE', ['::/dual'], 'EADDRINUSE'],
  ];
  for (const [v6error, tried, want] of rows) {
    const seen: string[] = [];
    const open = async (o: ListenOptions) => {
      seen.push(o.host === '::' ? (o.ipv6Only === false ? '::/dual' : '::/v6only') : o.host!);
      if (o.host === '::' && v6error) throw Object.assign(new Error(v6error), { code: v6error });
      return o.host!;
    };
    const got = await listenAnyAddress(open).catch((e: NodeJS.ErrnoException) => e.code!);
    assert.is(got, want, `IPv6 ${v6error ?? 'available'}`);
    assert.equal(seen, tried, `IPv6 ${v6error ?? 'available'}`);
  }
});

test('local endpoints from EndpointSlices, as kube-proxy counts them: ready (terminating or not), one per endpoint (its first address), distinct addresses, this node', () => {
  const pools = validatePools([{ apiVersion: 'tether.dev/v1alpha1', kind: 'AddressPool', metadata: { name: 'lb' }, spec: { usage: 'loadBalancer', ipv4: { cidr: '198.51.100.0/28' } } }]);
  const service = { apiVersion: 'v1', kind: 'Service', metadata: { name: 'db', namespace: 'shop' }, spec: { type: 'LoadBalancer', loadBalancerClass: 'tether.dev/lb', ports: [{ port: 5432 }], externalTrafficPolicy: 'Local', healthCheckNodePort: 32100, publishNotReadyAddresses: true } };
  const count = (endpoints: Array<Record<string, unknown>>, addressType = 'IPv4') => {
    const slice = { apiVersion: 'discovery.k8s.io/v1', kind: 'EndpointSlice', metadata: { name: 'db-x', namespace: 'shop', labels: { 'kubernetes.io/service-name': 'db' } }, addressType, endpoints };
    const r = resolveLoadBalancers([service, slice], pools);
    assert.equal(r.refused, []);
    return countLocalEndpoints(r.loadBalancers[0].targets, 'n1');
  };
  const ep = (addresses: string[], conditions: Record<string, boolean>, nodeName = 'n1') => ({ addresses, conditions, nodeName });
  const rows: Array<[string, Array<Record<string, unknown>>, number]> = [
    ['ready and terminating (publishNotReadyAddresses)', [ep(['10.244.0.1'], { ready: true, serving: true, terminating: true })], 1],
    ['ready and terminating, not serving (publishNotReadyAddresses, pod not ready)', [ep(['10.244.0.1'], { ready: true, serving: false, terminating: true })], 1],
    ['one endpoint with two addresses', [ep(['10.244.0.1', '10.244.0.2'], { ready: true })], 1],
    ['two endpoints, the second address of one is the other', [ep(['10.244.0.1', '10.244.0.2'], { ready: true }), ep(['10.244.0.2'], { ready: true })], 2],
    ['one address in two endpoints', [ep(['10.244.0.1'], { ready: true }), ep(['10.244.0.1'], { ready: true })], 1],
    ['ready not given (ready)', [ep(['10.244.0.1'], {})], 1],
    ['serving while terminating, not ready', [ep(['10.244.0.1'], { ready: false, serving: true, terminating: true })], 0],
    ['not ready', [ep(['10.244.0.1'], { ready: false })], 0],
    ['another node', [ep(['10.244.0.1'], { ready: true }, 'n2')], 0],
  ];
  for (const [what, endpoints, want] of rows) assert.is(count(endpoints), want, what);
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
  const free = await freePort();
  const lb = (name: string, hc: number, local: number) => ({
    key: `shop/${name}`, externalTrafficPolicy: 'Local', healthCheckNodePort: hc,
    targets: Array.from({ length: local }, (_, i) => ({ address: `10.244.0.${i + 1}`, state: 'active', node: 'n1' })),
  }) as unknown as ResolvedLoadBalancer;
  let services = [lb('db', free, 1), lb('web', taken, 1)];
  const reports: NodeHealthReport[] = [];
  const hc = new HealthController({ node: 'n1', port: 0, services: () => services, programming: () => ({ IPv4: { lastUpdated: Date.now() } }), eligible: () => true, report: async (r) => void reports.push(structuredClone(r)), logger: log() });
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

test('per family, as kube-proxy reports its proxiers: each family programmed in status.IPv4 / status.IPv6, healthy only when every one is, lastUpdated the latest; a family reported only once something of it was programmed', () => {
  const now = at(200);
  const N = '"currentTime":"2026-11-24T10:03:20.12Z"';
  const both = proxyHealth({ IPv4: { lastUpdated: T0 }, IPv6: { lastUpdated: at(50) } }, now);
  assert.equal([both.healthy, both.lastUpdated, Object.keys(both.status)], [true, new Date(at(50)), ['IPv4', 'IPv6']]);
  // The IPv6 proxier's change waits 100 s: the node is unhealthy, IPv4 still says healthy.
  const v6stale = proxyHealth({ IPv4: { lastUpdated: at(150) }, IPv6: { lastUpdated: at(50), pendingSince: at(100) } }, now);
  assert.equal([v6stale.healthy, v6stale.status.IPv4.healthy, v6stale.status.IPv6.healthy], [false, true, false]);
  assert.is(nodeAnswer('/livez', { proxy: v6stale, nodeEligible: true, now: new Date(now) }).body,
    `{"lastUpdated":"2026-11-24T10:02:30.12Z",${N},"healthy":false,"status":{"IPv4":{"lastUpdated":"2026-11-24T10:02:30.12Z","healthy":true},"IPv6":{"lastUpdated":"2026-11-24T10:00:50.12Z","healthy":false}}}`);
  const h = nodeAnswer('/healthz', { proxy: both, nodeEligible: true, now: new Date(now) });
  assert.equal([h.status, JSON.parse(h.body).status], [200, { IPv4: { lastUpdated: '2026-11-24T10:00:00.12Z', healthy: true }, IPv6: { lastUpdated: '2026-11-24T10:00:50.12Z', healthy: true } }]);
  // A family never updated is not reported (kube-proxy's map has no entry for it).
  assert.equal(Object.keys(proxyHealth({ IPv4: { lastUpdated: T0 }, IPv6: { pendingSince: T0 } }, now).status), ['IPv4']);

  // The trackers: IPv6 appears when tracked (its first VIP programmed); changes and passes count for every family tracked.
  let t = T0;
  const f = new FamilyTrackers(() => t);
  assert.equal(f.state(), {});
  f.track('IPv4');
  t = at(10);
  f.queued();
  assert.equal(f.state(), { IPv4: { lastUpdated: T0, pendingSince: at(10) } } satisfies FamilyProgramming, 'no IPv6 before anything of it is programmed');
  t = at(20);
  f.updated();
  f.track('IPv6');
  f.track('IPv6');
  t = at(30);
  f.queued();
  assert.equal(f.state(), { IPv4: { lastUpdated: at(20), pendingSince: at(30) }, IPv6: { lastUpdated: at(20), pendingSince: at(30) } });
  assert.is(proxyHealth(f.state(), at(95)).healthy, false, 'a change waiting 65 s in both');
  t = at(96);
  f.updated();
  assert.equal(proxyHealth(f.state(), at(97)).status, { IPv4: { lastUpdated: new Date(at(96)), healthy: true }, IPv6: { lastUpdated: new Date(at(96)), healthy: true } });
});

test('a dual-stack Local Service is checked once on its port (its two VIPs share it), answered from its first family\'s endpoints', async () => {
  const hcPort = await freePort();
  const pools = validatePools([{ apiVersion: 'tether.dev/v1alpha1', kind: 'AddressPool', metadata: { name: 'lb' }, spec: { usage: 'loadBalancer', ipv4: { cidr: '198.51.100.0/28' }, ipv6: { cidr: '2001:db8:5::/120' } } }]);
  const sl = (addressType: string, addresses: string[]) => ({ kind: 'EndpointSlice', metadata: { name: `db-${addressType}`, namespace: 'shop', labels: { 'kubernetes.io/service-name': 'db' } }, addressType, endpoints: addresses.map((a) => ({ addresses: [a], nodeName: 'n1' })) });
  const r = resolveLoadBalancers([
    { apiVersion: 'v1', kind: 'Service', metadata: { name: 'db', namespace: 'shop' }, spec: { type: 'LoadBalancer', loadBalancerClass: 'tether.dev/lb', ports: [{ port: 80 }], externalTrafficPolicy: 'Local', healthCheckNodePort: hcPort, ipFamilyPolicy: 'RequireDualStack', ipFamilies: ['IPv6', 'IPv4'] } },
    sl('IPv4', ['10.244.0.1']), sl('IPv6', ['fd00::1', 'fd00::2']),
  ], pools, { datapathFamilies: ['IPv4', 'IPv6'] });
  assert.equal(r.loadBalancers.map((l) => [l.key, l.healthCheckNodePort]), [['shop/db#IPv6', hcPort], ['shop/db', hcPort]]);
  const hc = new HealthController({ node: 'n1', port: 0, services: () => r.loadBalancers, programming: () => ({ IPv4: { lastUpdated: Date.now() }, IPv6: { lastUpdated: Date.now() } }), eligible: () => true, logger: log() });
  try {
    await hc.start();
    const st = hc.status().services as Array<Record<string, unknown>>;
    assert.equal(st.map((x) => [x.service, x.port, x.open, x.problem]), [['shop/db', hcPort, true, undefined]], 'one check, opened (no clash of the Service with itself)');
    const res = await fetch(`http://127.0.0.1:${hcPort}/`);
    assert.equal([res.status, (await res.json() as { localEndpoints: number }).localEndpoints], [200, 2], 'the primary family (IPv6) endpoints');
  } finally {
    await hc.stop();
  }
});

test.run();
