// Health checks on this node, a level-triggered reconciler: one listener per load balancer Service with
// externalTrafficPolicy Local on its healthCheckNodePort (answering, per request, from the load balancer's
// current view: this node's ready local targets and whether its programming is stale), and the node's own
// /healthz and /livez on the health port. A port that cannot be opened (another Service's, or taken on the
// node) is reported in status and retried; nothing else is disturbed. Every flip of an answer is logged,
// and the answers are counted by check and code (status(), for the metrics).
import type { Logger } from '../../lib/log';
import { HealthListener, countLocalEndpoints, nodeAnswer, serviceAnswer, type HealthAnswer } from './health-server';
import { HEALTH_TIMEOUT_MS, oldestPending, proxyHealth, type FamilyProgramming, type ProxyHealth } from './proxy-health';
import { portHolder } from '../sys/port-holder';

/**
 * What the health server needs of a load-balanced Service (the load balancer's resolved Service has these
 * fields): which Services want a health check, on which port, and where their endpoints run.
 */
export interface HealthCheckedService {
  key: string;
  /**
   * The Service ("namespace/name") when `key` is one of its VIPs (lb-spec.ts: a dual-stack Service has one
   * per family, all on its one healthCheckNodePort): the Service is checked once, answered from its first
   * family's entry (its primary, ipFamilies[0], as the list orders them).
   */
  service?: string;
  externalTrafficPolicy?: string;
  healthCheckNodePort?: number;
  targets: ReadonlyArray<{ address: string; state: 'active' | 'terminating'; node?: string }>;
}
import { ReconcileLoop } from '../util/reconcile-loop';

const TICK_MS = 250;
/** This node's answers are reported (for the Services' status) on every change and at least this often. */
const REPORT_EVERY_MS = 10_000;
/** A node's report counts this long (a node that stopped reporting drops out of the status). */
export const REPORT_TTL_MS = 3 * REPORT_EVERY_MS;

/** One Service's health check on one node, as reported for its status. */
export interface ServiceHealthReport {
  port: number;
  open: boolean;
  problem?: string;
  /** The process holding the port when it is in use on the node (kube-proxy answers Local Services too). */
  heldBy?: string;
  localEndpoints: number;
  status: number;
}

/**
 * A VIP a local LB pod selects that this node does not forward (an IPv6 VIP on a node without an IPv6
 * address): nothing of it is programmed there (LbController.forwardable). Reported with the answers, for the
 * Service's status.
 */
export interface NotForwardedVip {
  /** The VIP's key ("namespace/name#IPv6") and its Service ("namespace/name"). */
  key: string;
  service: string;
  family: string;
  vip: string;
  /** Why, naming the node, the VIP and the LB pods. */
  problem: string;
}

/**
 * One node's health answers: its own (healthz) and each Local Service's; and the VIPs its LB pods select
 * that it does not forward (optional, left out when none: a release before neither writes nor reads it).
 */
export interface NodeHealthReport {
  eligible: boolean;
  healthy: boolean;
  services: Record<string, ServiceHealthReport>;
  notForwarded?: NotForwardedVip[];
}

export interface HealthControllerOptions {
  node: string;
  /** The node health port (0: none). */
  port: number;
  /** The load balancer's valid Services now. */
  services: () => HealthCheckedService[];
  /** Per family programmed: when the load balancer's programming last caught up, and since when a change waits (LbController.programming). */
  programming: () => FamilyProgramming;
  /** How long a change may wait before this node is unhealthy (kube-proxy's healthTimeout; default 60 s). */
  timeoutMs?: number;
  /** The node is not being deleted nor tainted for removal. */
  eligible: () => boolean;
  /** The load balancer's VIPs this node does not forward (LbController.notForwarded), reported with the answers. */
  notForwarded?: () => NotForwardedVip[];
  /** Publishes this node's answers (to the store, for the leader's Service status); errors are retried. */
  report?: (r: NodeHealthReport) => Promise<void>;
  /** Told when a Service's answer flips between 200 and 503 (Kubernetes Events); must not throw or wait. */
  onFlip?: (f: { service: string; port: number; status: number; was: number; localEndpoints: number }) => void;
  logger: Logger;
  /** The clock, ms (tests fix it). */
  now?: () => number;
}

/** Which check answered: the node's /healthz or /livez, or a Service's health-check port. */
export type HealthCheckKind = 'healthz' | 'livez' | 'service';

interface Check {
  port: number;
  listener: HealthListener;
  open: boolean;
  problem?: string;
  heldBy?: string;
  lastStatus?: number;
  lastLocal?: number;
}

export class HealthController {
  private readonly checks = new Map<string, Check>();
  private node?: HealthListener;
  private nodeProblem?: string;
  /** Answers given, by "check|code". */
  private readonly answers = new Map<string, number>();
  private wasHealthy = true;
  /** Listeners reconciled with the Services every TICK_MS. */
  private readonly loop = new ReconcileLoop({
    run: () => this.reconcileOnce(),
    everyMs: TICK_MS,
    skipBusyTicks: true,
    onError: (e) => this.o.logger.error('health: reconcile failed', { error: e.message }),
  });
  private lastReport = '';
  private lastReportAt = 0;
  private reporting = false;
  private stopped = false;

  constructor(private readonly o: HealthControllerOptions) {}

  async start(): Promise<void> {
    if (this.o.port) {
      this.node = new HealthListener((path) => {
        const now = this.now();
        const a = nodeAnswer(path, { proxy: this.proxy(now), nodeEligible: this.o.eligible(), now: new Date(now) });
        return a.check ? this.counted(a.check, a) : a;
      });
      try {
        await this.node.listen(this.o.port);
        this.o.logger.info('health: node health port open', { port: this.o.port, address: this.node.address });
      } catch (e) {
        this.nodeProblem = `node health port ${this.o.port}: ${(e as NodeJS.ErrnoException).code ?? (e as Error).message}`;
        this.o.logger.error('health: node health port not opened', { port: this.o.port, error: this.nodeProblem });
      }
    }
    this.loop.start();
    await this.reconcile();
  }

  private now(): number {
    return this.o.now?.() ?? Date.now();
  }

  /** tether's programming health now, by kube-proxy's staleness rule. */
  private proxy(now = this.now()): ProxyHealth {
    return proxyHealth(this.o.programming(), now, this.o.timeoutMs ?? HEALTH_TIMEOUT_MS);
  }

  private healthy(): boolean {
    return this.proxy().healthy;
  }

  private counted(check: HealthCheckKind, a: HealthAnswer): HealthAnswer {
    const k = `${check}|${a.status}`;
    this.answers.set(k, (this.answers.get(k) ?? 0) + 1);
    return a;
  }

  private local(lb: HealthCheckedService): number {
    return countLocalEndpoints(lb.targets, this.o.node);
  }

  /** Opens and closes listeners to match the Services; logs each answer that flips. */
  reconcile(): Promise<void> {
    return this.loop.kick();
  }

  /** The Services last read and the health-checked ones among them (kept while the list is the same array). */
  private seen?: { services: HealthCheckedService[]; want: Map<string, HealthCheckedService> };

  private async reconcileOnce(): Promise<void> {
    const services = this.o.services();
    if (this.seen?.services !== services) {
      const want = new Map<string, HealthCheckedService>();
      for (const l of services) if (l.externalTrafficPolicy === 'Local' && l.healthCheckNodePort && !want.has(l.service ?? l.key)) want.set(l.service ?? l.key, l);
      this.seen = { services, want };
    }
    const want = this.seen.want;
    const proxy = this.proxy();
    if (proxy.healthy !== this.wasHealthy) {
      const since = oldestPending(this.o.programming());
      const stale = Object.entries(proxy.status).filter(([, s]) => !s.healthy).map(([f]) => f);
      if (proxy.healthy) this.o.logger.info('health: programming caught up: healthy again', { lastUpdated: proxy.lastUpdated?.toISOString() });
      else this.o.logger.warn('health: programming stale: a change waits longer than the timeout; answering 503', { families: stale, waitingSince: since === undefined ? undefined : new Date(since).toISOString(), timeoutMs: this.o.timeoutMs ?? HEALTH_TIMEOUT_MS });
      this.wasHealthy = proxy.healthy;
    }
    for (const [key, c] of this.checks) {
      const lb = want.get(key);
      if (lb && lb.healthCheckNodePort === c.port) continue;
      await c.listener.close();
      this.checks.delete(key);
      this.o.logger.info('health: service health check closed', { service: key, port: c.port });
    }
    for (const [key, lb] of want) {
      let c = this.checks.get(key);
      if (!c) {
        const [ns, name] = key.split('/');
        const listener = new HealthListener(() => {
          const cur = this.o.services().find((l) => (l.service ?? l.key) === key);
          return this.counted('service', serviceAnswer(ns, name, cur ? this.local(cur) : 0, this.healthy()));
        });
        c = { port: lb.healthCheckNodePort!, listener, open: false };
        this.checks.set(key, c);
      }
      if (!c.open) {
        try {
          await c.listener.listen(c.port);
          c.open = true;
          c.problem = undefined;
          c.heldBy = undefined;
          this.o.logger.info('health: service health check open', { service: key, port: c.port, address: c.listener.address });
        } catch (e) {
          const inUse = (e as NodeJS.ErrnoException).code === 'EADDRINUSE';
          const holder = inUse ? await holderOf(c.port, key) : undefined;
          const why = `health-check port ${c.port}: ${inUse ? `in use on this node ${holder?.text ?? ''}`.trimEnd() : (e as Error).message}`;
          c.heldBy = holder?.name;
          if (c.problem !== why) this.o.logger.error('health: service health check not opened; retried', { service: key, problem: why });
          c.problem = why;
          continue;
        }
      }
      const local = this.local(lb);
      const status = local > 0 && proxy.healthy ? 200 : 503;
      if (status !== c.lastStatus || local !== c.lastLocal) {
        this.o.logger.info('health: service health answer', { service: key, port: c.port, localEndpoints: local, status, was: c.lastStatus });
        if (c.lastStatus !== undefined && status !== c.lastStatus) this.o.onFlip?.({ service: key, port: c.port, status, was: c.lastStatus, localEndpoints: local });
        c.lastStatus = status;
        c.lastLocal = local;
      }
    }
    this.publish(want);
  }

  /** This node's answers now, as reported. */
  report(services?: Map<string, HealthCheckedService>): NodeHealthReport {
    const notForwarded = this.o.notForwarded?.() ?? [];
    const out: NodeHealthReport = { eligible: this.o.eligible(), healthy: this.healthy(), services: {}, ...(notForwarded.length ? { notForwarded } : {}) };
    for (const [key, c] of this.checks) {
      const lb = services?.get(key);
      const local = lb ? this.local(lb) : c.lastLocal ?? 0;
      out.services[key] = { port: c.port, open: c.open, ...(c.problem ? { problem: c.problem } : {}), ...(c.heldBy ? { heldBy: c.heldBy } : {}), localEndpoints: local, status: c.open && local > 0 && out.healthy ? 200 : 503 };
    }
    return out;
  }

  /** Reports on a change, and every REPORT_EVERY_MS so the report does not expire; never waits for it. */
  private publish(services: Map<string, HealthCheckedService>): void {
    if (!this.o.report || this.reporting || this.stopped) return;
    const r = this.report(services);
    const text = JSON.stringify(r);
    if (text === this.lastReport && Date.now() - this.lastReportAt < REPORT_EVERY_MS) return;
    this.reporting = true;
    this.o.report(r).then(
      () => {
        this.lastReport = text;
        this.lastReportAt = Date.now();
      },
      (e) => this.o.logger.debug('health: report not stored; retried', { error: (e as Error).message }),
    ).finally(() => (this.reporting = false));
  }

  status(): Record<string, unknown> {
    return {
      nodePort: this.o.port || undefined,
      nodeProblem: this.nodeProblem,
      nodeEligible: this.o.eligible(),
      healthy: this.healthy(),
      answers: this.answerCounts(),
      services: [...this.checks].map(([service, c]) => ({ service, port: c.port, open: c.open, localEndpoints: c.lastLocal, answer: c.lastStatus, problem: c.problem })),
    };
  }

  /** The answers given since start, by check and HTTP code (sorted). */
  answerCounts(): Array<{ check: HealthCheckKind; code: number; count: number }> {
    return [...this.answers].map(([k, count]) => {
      const [check, code] = k.split('|');
      return { check: check as HealthCheckKind, code: Number(code), count };
    }).sort((a, b) => a.check.localeCompare(b.check) || a.code - b.code);
  }

  async stop(): Promise<void> {
    this.stopped = true;
    await this.loop.stop();
    for (const c of this.checks.values()) await c.listener.close();
    this.checks.clear();
    await this.node?.close();
  }
}

/**
 * Who holds a Service's health-check port on this node. By /proc when tetherd sees the node's processes
 * (run as a plain process); in the DaemonSet's container (no hostPID) it cannot, so it asks the port: an
 * answer in kube-proxy's layout naming this very Service is kube-proxy serving it.
 */
export async function holderOf(port: number, service: string, proc = '/proc'): Promise<{ name?: string; text: string } | undefined> {
  let seen: { name: string; pid: number } | undefined;
  try {
    seen = portHolder(port, proc);
  } catch {
    // /proc unreadable: fall through to asking the port
  }
  if (seen) return { name: seen.name, text: `by ${seen.name} (pid ${seen.pid})` };
  try {
    const res = await fetch(`http://127.0.0.1:${port}/`, { signal: AbortSignal.timeout(500) });
    const body = (await res.json()) as { service?: { namespace?: string; name?: string }; localEndpoints?: unknown };
    if (`${body.service?.namespace}/${body.service?.name}` === service && typeof body.localEndpoints === 'number') {
      return { name: 'kube-proxy', text: 'by kube-proxy (its answer names this Service)' };
    }
  } catch {
    // not HTTP, or not kube-proxy's answer
  }
  return { text: '(the holder is not visible from tetherd\'s container)' };
}
