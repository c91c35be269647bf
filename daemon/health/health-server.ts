// Health checks with kube-proxy's contract (kubernetes/kubernetes pkg/proxy/healthcheck), so that cloud and
// hardware load balancers, HAProxy or F5 probing a node get the answers they were built for:
//  - per Service with externalTrafficPolicy Local, on its healthCheckNodePort, any path: 200 when the node
//    has ready local endpoints and tether's programming is not stale, else 503; JSON body
//    {"service":{"namespace","name"},"localEndpoints":N,"serviceProxyHealthy":B}; headers Content-Type
//    application/json, X-Content-Type-Options nosniff, X-Load-Balancing-Endpoint-Weight N;
//  - per node on the health port: /healthz (503 when tetherd is unhealthy or the node is not eligible:
//    deleted, or tainted ToBeDeletedByClusterAutoscaler) and /livez (the same without eligibility), body
//    {"lastUpdated": T,"currentTime": T, "nodeEligible": B} (livez without nodeEligible).
// The bodies keep kube-proxy's exact layout (its Go formatting, spacing included), since some probers
// match on them.
import * as http from 'node:http';
import type { AddressInfo } from 'node:net';

export const TO_BE_DELETED_TAINT = 'ToBeDeletedByClusterAutoscaler';

/** kube-proxy's per-Service body: Go's %q strings, tab-indented, no trailing newline. */
export function serviceBody(namespace: string, name: string, localEndpoints: number, proxyHealthy: boolean): string {
  return `{\n\t"service": {\n\t\t"namespace": ${JSON.stringify(namespace)},\n\t\t"name": ${JSON.stringify(name)}\n\t},\n\t"localEndpoints": ${localEndpoints},\n\t"serviceProxyHealthy": ${proxyHealthy}\n}`;
}

/** Go's time.Time String() without the monotonic part: "2006-01-02 15:04:05.999999999 +0000 UTC". */
export function goTime(d: Date): string {
  const p = (n: number, w = 2) => String(n).padStart(w, '0');
  const ns = String(d.getUTCMilliseconds() * 1_000_000).padStart(9, '0').replace(/0+$/, '');
  return `${d.getUTCFullYear()}-${p(d.getUTCMonth() + 1)}-${p(d.getUTCDate())} ${p(d.getUTCHours())}:${p(d.getUTCMinutes())}:${p(d.getUTCSeconds())}${ns ? `.${ns}` : ''} +0000 UTC`;
}

export function healthzBody(lastUpdated: Date, now: Date, nodeEligible: boolean): string {
  return `{"lastUpdated": ${JSON.stringify(goTime(lastUpdated))},"currentTime": ${JSON.stringify(goTime(now))}, "nodeEligible": ${nodeEligible}}`;
}

export function livezBody(lastUpdated: Date, now: Date): string {
  return `{"lastUpdated": ${JSON.stringify(goTime(lastUpdated))},"currentTime": ${JSON.stringify(goTime(now))}}`;
}

const HEADERS = { 'Content-Type': 'application/json', 'X-Content-Type-Options': 'nosniff' };

/** The answer to a Service health check, as a pure function of its inputs (table-tested). */
export function serviceAnswer(namespace: string, name: string, localEndpoints: number, proxyHealthy: boolean): { status: number; headers: Record<string, string>; body: string } {
  return {
    status: localEndpoints > 0 && proxyHealthy ? 200 : 503,
    headers: { ...HEADERS, 'X-Load-Balancing-Endpoint-Weight': String(localEndpoints) },
    body: serviceBody(namespace, name, localEndpoints, proxyHealthy),
  };
}

/** The node's /healthz or /livez answer; any other path is 404, as kube-proxy's mux does. */
export function nodeAnswer(path: string, s: { healthy: boolean; nodeEligible: boolean; lastUpdated: Date; now: Date }): { status: number; headers: Record<string, string>; body: string } {
  const p = path.split('?')[0];
  if (p === '/healthz') {
    const ok = s.healthy && s.nodeEligible;
    // A healthy proxy reports "now" as its last update (kube-proxy keeps that meaning for old clients).
    return { status: ok ? 200 : 503, headers: { ...HEADERS }, body: healthzBody(ok ? s.now : s.lastUpdated, s.now, s.nodeEligible) };
  }
  if (p === '/livez') return { status: s.healthy ? 200 : 503, headers: { ...HEADERS }, body: livezBody(s.healthy ? s.now : s.lastUpdated, s.now) };
  return { status: 404, headers: { 'Content-Type': 'text/plain; charset=utf-8', 'X-Content-Type-Options': 'nosniff' }, body: '404 page not found\n' };
}

function reply(res: http.ServerResponse, a: { status: number; headers: Record<string, string>; body: string }): void {
  res.writeHead(a.status, { ...a.headers, 'Content-Length': Buffer.byteLength(a.body) });
  res.end(a.body);
}

/** One HTTP listener answering every path with `answer()` (evaluated per request). */
export class HealthListener {
  private server?: http.Server;

  constructor(private readonly answer: (path: string) => { status: number; headers: Record<string, string>; body: string }) {}

  /** Listens on host:port; rejects with the listen error (EADDRINUSE: the port is taken on this node). */
  listen(port: number, host = '0.0.0.0'): Promise<number> {
    const server = http.createServer((req, res) => reply(res, this.answer(req.url ?? '/')));
    // Probers open a connection per check: keep-alive is allowed but idle sockets must not pile up.
    server.keepAliveTimeout = 5000;
    server.headersTimeout = 5000;
    server.requestTimeout = 5000;
    this.server = server;
    return new Promise((resolve, reject) => {
      server.once('error', reject);
      server.listen({ port, host, exclusive: true }, () => {
        server.off('error', reject);
        resolve((server.address() as AddressInfo).port);
      });
    });
  }

  close(): Promise<void> {
    const s = this.server;
    this.server = undefined;
    if (!s) return Promise.resolve();
    return new Promise((resolve) => {
      s.close(() => resolve());
      s.closeAllConnections();
    });
  }
}

/**
 * localEndpoints as kube-proxy counts them: endpoints on this node that are ready, each address once;
 * serving-but-terminating ones do not count (the check fails when only they remain, KEP-1669).
 */
export function countLocalEndpoints(targets: ReadonlyArray<{ address: string; state: 'active' | 'terminating'; node?: string }>, node: string): number {
  return new Set(targets.filter((t) => t.node === node && t.state === 'active').map((t) => t.address)).size;
}
