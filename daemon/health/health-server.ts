// Health checks with kube-proxy's contract (kubernetes/kubernetes pkg/proxy/healthcheck), so that cloud and
// hardware load balancers, HAProxy or F5 probing a node get the answers they were built for:
//  - per Service with externalTrafficPolicy Local, on its healthCheckNodePort, any path: 200 when the node
//    has ready local endpoints and tether's programming is not stale, else 503; JSON body
//    {"service":{"namespace","name"},"localEndpoints":N,"serviceProxyHealthy":B}; headers Content-Type
//    application/json, X-Content-Type-Options nosniff, X-Load-Balancing-Endpoint-Weight N;
//  - per node on the health port: /healthz (503 when tetherd is unhealthy or the node is not eligible:
//    deleted, or tainted ToBeDeletedByClusterAutoscaler) and /livez (the same without eligibility), body as
//    kube-proxy 1.33+ marshals it: {"lastUpdated","currentTime","nodeEligible" (healthz only),"healthy",
//    "status":{"IPv4":{"lastUpdated","healthy"},"IPv6":{…}}} (each family programmed), times in RFC 3339 (Go's form: UTC, no trailing zeros).
// The Service body keeps kube-proxy's exact layout (its Go formatting, tabs included), since some probers
// match on it. Both kinds of port listen on every address of both families, as kube-proxy's Go listener.
import * as http from 'node:http';
import type { AddressInfo, ListenOptions } from 'node:net';
import type { ProxyHealth } from './proxy-health';


/** kube-proxy's per-Service body: Go's %q strings, tab-indented, no trailing newline. */
export function serviceBody(namespace: string, name: string, localEndpoints: number, proxyHealthy: boolean): string {
  return `{\n\t"service": {\n\t\t"namespace": ${JSON.stringify(namespace)},\n\t\t"name": ${JSON.stringify(name)}\n\t},\n\t"localEndpoints": ${localEndpoints},\n\t"serviceProxyHealthy": ${proxyHealthy}\n}`;
}

/** A time as Go's encoding/json writes a time.Time (RFC 3339, fraction without trailing zeros), in UTC; none: Go's zero time. */
export function rfc3339(d?: Date): string {
  if (!d) return '0001-01-01T00:00:00Z';
  return d.toISOString().replace(/\.(\d*?)0*Z$/, (_m, f: string) => (f ? `.${f}Z` : 'Z'));
}

/**
 * kube-proxy's ProxyHealth as json.Marshal writes it: fields in its struct order, nodeEligible only for
 * /healthz, status left out while no family has been programmed, families in key order.
 */
export function nodeBody(lastUpdated: Date | undefined, now: Date, proxy: ProxyHealth, nodeEligible?: boolean): string {
  const families = Object.keys(proxy.status).sort();
  return JSON.stringify({
    lastUpdated: rfc3339(lastUpdated),
    currentTime: rfc3339(now),
    ...(nodeEligible === undefined ? {} : { nodeEligible }),
    healthy: proxy.healthy,
    ...(families.length ? { status: Object.fromEntries(families.map((f) => [f, { lastUpdated: rfc3339(proxy.status[f].lastUpdated), healthy: proxy.status[f].healthy }])) } : {}),
  });
}

const HEADERS = { 'Content-Type': 'application/json', 'X-Content-Type-Options': 'nosniff' };

/** The answer to a Service health check, as a pure function of its inputs (table-tested). */
export function serviceAnswer(namespace: string, name: string, localEndpoints: number, proxyHealthy: boolean): HealthAnswer {
  return {
    status: localEndpoints > 0 && proxyHealthy ? 200 : 503,
    headers: { ...HEADERS, 'X-Load-Balancing-Endpoint-Weight': String(localEndpoints) },
    body: serviceBody(namespace, name, localEndpoints, proxyHealthy),
  };
}

export interface HealthAnswer {
  status: number;
  headers: Record<string, string>;
  body: string;
  /** Which node check answered (for the answer counts); none for a path that is not one. */
  check?: 'healthz' | 'livez';
}

/**
 * The node's /healthz or /livez answer; any other path is 404, as kube-proxy's mux does. A healthy answer's
 * lastUpdated is now (kube-proxy keeps that meaning for old clients); an unhealthy one's is the last time
 * the programming caught up. "healthy" is the proxy's own health, without eligibility.
 */
export function nodeAnswer(path: string, s: { proxy: ProxyHealth; nodeEligible: boolean; now: Date }): HealthAnswer {
  const p = path.split('?')[0];
  if (p === '/healthz') {
    const ok = s.proxy.healthy && s.nodeEligible;
    return { status: ok ? 200 : 503, headers: { ...HEADERS }, body: nodeBody(ok ? s.now : s.proxy.lastUpdated, s.now, s.proxy, s.nodeEligible), check: 'healthz' };
  }
  if (p === '/livez') {
    const ok = s.proxy.healthy;
    return { status: ok ? 200 : 503, headers: { ...HEADERS }, body: nodeBody(ok ? s.now : s.proxy.lastUpdated, s.now, s.proxy), check: 'livez' };
  }
  return { status: 404, headers: { 'Content-Type': 'text/plain; charset=utf-8', 'X-Content-Type-Options': 'nosniff' }, body: '404 page not found\n' };
}

function reply(res: http.ServerResponse, a: HealthAnswer): void {
  res.writeHead(a.status, { ...a.headers, 'Content-Length': Buffer.byteLength(a.body) });
  res.end(a.body);
}

/** IPv6 cannot be used on this host (no IPv6 in the kernel, or disabled): listen on IPv4 only. */
function ipv6Unavailable(e: unknown): boolean {
  const code = (e as NodeJS.ErrnoException).code;
  return code === 'EAFNOSUPPORT' || code === 'EADDRNOTAVAIL' || code === 'EPROTONOSUPPORT';
}

/**
 * Listens on every address: '::' accepting IPv4 too (ipv6Only false), as kube-proxy's Go listener does; on a
 * host without IPv6, 0.0.0.0. Any other error (EADDRINUSE: the port is taken) is the caller's.
 */
export async function listenAnyAddress<T>(open: (o: ListenOptions) => Promise<T>): Promise<T> {
  try {
    return await open({ host: '::', ipv6Only: false });
  } catch (e) {
    if (!ipv6Unavailable(e)) throw e;
    return open({ host: '0.0.0.0' });
  }
}

/** One HTTP listener answering every path with `answer()` (evaluated per request). */
export class HealthListener {
  private server?: http.Server;

  constructor(private readonly answer: (path: string) => HealthAnswer) {}

  /** The address it listens on ('::' is both families). */
  get address(): string | undefined {
    return (this.server?.address() as AddressInfo | null)?.address;
  }

  /**
   * Listens on port, on every address of both families (or on host when given); rejects with the listen
   * error (EADDRINUSE: the port is taken on this node).
   */
  listen(port: number, host?: string): Promise<number> {
    return host === undefined ? listenAnyAddress((o) => this.listenOn({ ...o, port })) : this.listenOn({ host, port });
  }

  private listenOn(o: ListenOptions): Promise<number> {
    const server = http.createServer((req, res) => reply(res, this.answer(req.url ?? '/')));
    // Probers open a connection per check: keep-alive is allowed but idle sockets must not pile up.
    server.keepAliveTimeout = 5000;
    server.headersTimeout = 5000;
    server.requestTimeout = 5000;
    return new Promise((resolve, reject) => {
      server.once('error', reject);
      server.listen({ ...o, exclusive: true }, () => {
        server.off('error', reject);
        this.server = server;
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
 * localEndpoints as kube-proxy counts them (pkg/proxy endpointschangetracker.go, LocalReadyEndpoints): the
 * distinct addresses of ready endpoints on this node. Ready is the endpoint's ready condition, terminating
 * or not (lb-spec.ts makes such targets active: publishNotReadyAddresses keeps a terminating pod ready);
 * serving-but-not-ready terminating ones do not count (the check fails when only they remain, KEP-1669).
 * One endpoint is one address (its first, as kube-proxy reads it), so it counts once.
 */
export function countLocalEndpoints(targets: ReadonlyArray<{ address: string; state: 'active' | 'terminating'; node?: string }>, node: string): number {
  return new Set(targets.filter((t) => t.node === node && t.state === 'active').map((t) => t.address)).size;
}
