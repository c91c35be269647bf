// Prometheus metrics on --metrics-bind-address (kube-proxy's flag): GET /metrics, read from the parts'
// status when scraped (daemon/metrics/tether-metrics.ts). A port already in use is one error line naming
// the address and its holder, and the listener is tried again every LISTEN_RETRY_MS while everything
// else serves. A scrape never waits on the cluster store: the one figure only the store knows (how many
// addresses of a cluster-wide pool are allocated) is the last one read, read again in the background.
import * as http from 'node:http';
import type { AddressInfo } from 'node:net';
import type { Logger } from '../../lib/log';
import { portHolder } from '../sys/port-holder';
import type { TetherMetrics, BfdView, ClusterPoolView, EgressAddressView, EgressSecurityView, HealthView, LbServiceView, MetricSources, PodPoolView, StatusPassView } from '../metrics/tether-metrics';
import type { EgressController } from '../egress/egress-controller';
import type { LbController } from '../lb/lb-controller';
import type { HealthController } from '../health/health-controller';
import type { LazyStore } from '../../ipam/store/lazy-store';
import type { Ipam } from './ipam';
import type { KubeApiCalls } from '../config/kube-api-calls';
import type { EventRecorder } from '../kube/event-recorder';
import type { LeaderElection } from '../kube/leader';
import type { Subsystem } from './subsystem';
import { Backoff } from '../../lib/backoff';
import { storeFullness } from '../common/store-full';
import { ReconcileLoop } from '../util/reconcile-loop';
import { hostPort } from '../../lib/ip';

/** A metrics port that could not be opened is tried again this often. */
export const LISTEN_RETRY_MS = 10_000;
/** The cluster store is asked for cluster-wide pool use at most this often, and only while scraped. */
export const CLUSTER_USAGE_MAX_AGE_MS = 30_000;

/** What the metrics read: the parts this process runs (absent ones are left out of the scrape). */
export interface MetricsParts {
  ipam?: Ipam;
  egress?: EgressController;
  lb?: LbController;
  /** The health checks, once they start. */
  health?: () => HealthController | undefined;
  /** The cluster store IPAM uses (--redis). */
  store?: LazyStore;
  /** Other cluster store connections, by subsystem (tether-operator's: lb, the nodes' health reports). */
  storeConnections?: Record<string, { readonly connected: boolean }>;
  /** Kubernetes (kube mode): failed API requests, the Event recorder, the leader elections this process runs. */
  kube?: { apiCalls?: KubeApiCalls; events?: EventRecorder; elections?: () => Array<Pick<LeaderElection, 'leadership'>> };
  /** The status controller's passes (tether-operator's leader). */
  statusPasses?: () => StatusPassView | undefined;
  /** Pods whose datapath role setup failed (retried). */
  roleProblems?: () => Array<{ role: string }>;
}

/** A value read in the background: get() answers the last one at once and starts a new read when it is stale. */
export class StaleWhileRead<T> {
  private value?: T;
  private readAt = -Infinity;
  private reading?: Promise<void>;

  constructor(
    private readonly read: () => Promise<T>,
    private readonly maxAgeMs: number,
    private readonly onError: (e: Error) => void,
  ) {}

  get(): T | undefined {
    if (!this.reading && Date.now() - this.readAt >= this.maxAgeMs) this.refresh();
    return this.value;
  }

  refresh(): void {
    if (this.reading) return;
    this.reading = this.read()
      .then((v) => {
        this.value = v;
      }, this.onError)
      .finally(() => {
        this.readAt = Date.now();
        this.reading = undefined;
      });
  }
}

/** The sections of a scrape, each read from its part's own status (what `tetherctl status` shows). */
export function metricSources(p: MetricsParts, logger: Logger): { sources: MetricSources; clusterUsage?: StaleWhileRead<ClusterPoolView[]> } {
  const ipam = p.ipam;
  const clusterUsage = ipam
    ? new StaleWhileRead(async () => (await ipam.addresses.usage()) as unknown as ClusterPoolView[], CLUSTER_USAGE_MAX_AGE_MS, (e) =>
        logger.warn('metrics: cluster pool use not read', { error: e.message }))
    : undefined;
  const sources: MetricSources = {
    store: () => ({
      ...(p.store ? { ipam: p.store.connected } : {}),
      ...(p.egress ? { egress: p.egress.storeReachable() } : {}),
      ...(p.lb?.store ? { lb: p.lb.store.connection.connected } : {}),
      ...Object.fromEntries(Object.entries(p.storeConnections ?? {}).map(([subsystem, c]) => [subsystem, c.connected])),
    }),
    // Every subsystem with a store has its series (0 until a refusal), so an alert sees them from the start.
    storeFull: () => {
      const seen = storeFullness.state();
      const none = { full: false, refusals: 0 };
      return {
        ...(p.store ? { ipam: none } : {}),
        ...(p.egress ? { egress: none } : {}),
        ...(p.lb?.store ? { lb: none } : {}),
        ...seen,
      };
    },
  };
  if (ipam) {
    sources.ipam = () => {
      // Capacity from the configuration; allocations as last read from the store (none shown before the first read).
      const read = new Map((clusterUsage?.get() ?? []).map((p) => [p.pool, p.allocated]));
      const cluster = ipam.addresses.capacities().map((p): ClusterPoolView => ({ ...p, allocated: read.get(p.pool) ?? 'not read yet' }));
      return { pods: ipam.pods.usage() as unknown as PodPoolView[], cluster };
    };
  }
  const egress = p.egress;
  if (egress) {
    sources.egress = () => egress.status({ observe: false }) as unknown as EgressAddressView[];
    sources.egressSecurity = () => egress.security() as EgressSecurityView;
    sources.bfd = () => egress.bfdStatus() as BfdView | undefined;
  }
  const lb = p.lb;
  if (lb) sources.lb = () => lb.status() as unknown as LbServiceView[];
  const roleProblems = p.roleProblems;
  if (roleProblems) sources.roleProblems = () => roleProblems().map((r) => ({ role: r.role }));
  const kube = p.kube;
  if (kube) {
    sources.kube = () => ({
      ...(kube.apiCalls ? { apiErrors: kube.apiCalls.list() } : {}),
      ...(kube.events ? { events: kube.events.stats } : {}),
      ...(kube.elections ? { leadership: kube.elections().map((e) => e.leadership()) } : {}),
    });
  }
  // Read when scraped: the operator's status controller is made after its metrics part.
  sources.statusPasses = () => p.statusPasses?.();
  const health = p.health;
  if (health) sources.health = () => health()?.status() as HealthView | undefined;
  return { sources, clusterUsage };
}

/** The metrics listener, as a subsystem: its status says where it serves (or why not) and the store's reachability. */
export class MetricsServer implements Subsystem<never> {
  readonly name = 'metrics';
  private server?: http.Server;
  private listening = false;
  private problem?: string;
  /** Listens; a listener that cannot be opened is tried again every retryMs. */
  private readonly listener: ReconcileLoop;
  private stopped = false;

  constructor(
    private readonly o: {
      /** Where to listen; undefined: off. Port 0 picks a free port (tests). */
      address?: { host: string; port: number };
      metrics: TetherMetrics;
      sources: MetricSources;
      clusterUsage?: StaleWhileRead<ClusterPoolView[]>;
      logger: Logger;
      retryMs?: number;
    },
  ) {
    const retryMs = o.retryMs ?? LISTEN_RETRY_MS;
    // tryListen() logs its failure (once per problem).
    this.listener = new ReconcileLoop({ run: () => this.tryListen(), backoff: new Backoff(retryMs, retryMs, Math.random, 0), onError: () => {} });
  }

  get metrics(): TetherMetrics {
    return this.o.metrics;
  }

  /** The address and port it listens on, once it does. */
  boundAddress(): AddressInfo | undefined {
    return this.listening ? (this.server?.address() as AddressInfo) : undefined;
  }

  /** Tries to listen; a failure is logged and retried, never thrown (nothing else waits on metrics). */
  async start(): Promise<void> {
    if (!this.o.address) {
      this.o.logger.info('metrics: off (--metrics-bind-address is empty or port 0)');
      return;
    }
    this.o.clusterUsage?.refresh();
    await this.listener.kick();
  }

  apply(): void {
    // nothing configured from the config source
  }

  async stop(): Promise<void> {
    this.stopped = true;
    void this.listener.stop();
    const s = this.server;
    this.server = undefined;
    this.listening = false;
    if (!s) return;
    s.closeAllConnections();
    await new Promise<void>((resolve) => s.close(() => resolve()));
  }

  status(): Record<string, unknown> {
    const a = this.o.address;
    let storeReachable: Record<string, boolean> | undefined;
    let storeFull: Record<string, { full: boolean; refusals: number }> | undefined;
    try {
      storeReachable = this.o.sources.store?.();
      storeFull = this.o.sources.storeFull?.();
    } catch {
      // the scrape logs it; status answers without it
    }
    return {
      metrics: a ? { address: hostPort(a.host, this.boundAddress()?.port ?? a.port), listening: this.listening, ...(this.problem ? { problem: this.problem } : {}) } : { address: 'off' },
      ...(storeReachable && Object.keys(storeReachable).length ? { storeReachable } : {}),
      ...(storeFull && Object.keys(storeFull).length ? { storeFull } : {}),
    };
  }

  private async tryListen(): Promise<void> {
    const { host, port } = this.o.address!;
    const where = hostPort(host, port);
    const server = http.createServer((req, res) => void this.answer(req, res));
    try {
      await new Promise<void>((resolve, reject) => {
        server.once('error', reject);
        server.listen({ host, port }, () => {
          server.off('error', reject);
          resolve();
        });
      });
    } catch (e) {
      const err = e as NodeJS.ErrnoException;
      let why = err.code ?? err.message;
      if (err.code === 'EADDRINUSE') {
        let holder: { name: string; pid: number } | undefined;
        try {
          holder = portHolder(port);
        } catch {
          // /proc unreadable: the holder goes unnamed
        }
        why = `port ${port} is in use ${holder ? `by ${holder.name} (pid ${holder.pid})` : '(its holder is not visible from here)'}`;
      } else if (err.code === 'EADDRNOTAVAIL') {
        why = `${host} is not an address of this node`;
      }
      const problem = `cannot listen on ${where}: ${why}`;
      if (problem !== this.problem) this.o.logger.error('metrics: not served; retried', { address: where, problem, retryMs: this.o.retryMs ?? LISTEN_RETRY_MS });
      this.problem = problem;
      throw new Error(problem);
    }
    if (this.stopped) {
      server.close();
      return;
    }
    this.server = server;
    this.listening = true;
    this.problem = undefined;
    this.o.logger.info('metrics: serving', { address: hostPort(host, (server.address() as AddressInfo).port), path: '/metrics' });
  }

  private async answer(req: http.IncomingMessage, res: http.ServerResponse): Promise<void> {
    const path = (req.url ?? '/').split('?')[0];
    const text = (status: number, body: string, headers: Record<string, string> = {}) => {
      res.writeHead(status, { 'Content-Type': 'text/plain; charset=utf-8', 'X-Content-Type-Options': 'nosniff', ...headers });
      res.end(body);
    };
    if (path !== '/metrics') return text(404, 'unknown path: /metrics\n');
    if (req.method !== 'GET' && req.method !== 'HEAD') return text(405, 'GET /metrics\n', { Allow: 'GET, HEAD' });
    let body: string;
    try {
      body = await this.o.metrics.scrape();
    } catch (e) {
      // scrape() does not throw; should it, the answer says so rather than hanging up
      this.o.logger.error('metrics: scrape failed', { error: (e as Error).message });
      return text(500, `scrape failed: ${(e as Error).message}\n`);
    }
    res.writeHead(200, { 'Content-Type': this.o.metrics.contentType });
    res.end(req.method === 'HEAD' ? undefined : body);
  }
}

/**
 * The metrics listener, reading from the parts this process runs, not started (its start never fails: a port
 * it cannot open is retried). `address` is --metrics-bind-address checked (metricsAddressOption).
 */
export function metricsServer(o: { address?: { host: string; port: number }; metrics: TetherMetrics; parts: MetricsParts; logger: Logger; retryMs?: number }): MetricsServer {
  const { sources, clusterUsage } = metricSources(o.parts, o.logger);
  o.metrics.use(sources);
  return new MetricsServer({ address: o.address, metrics: o.metrics, sources, clusterUsage, logger: o.logger, retryMs: o.retryMs });
}
