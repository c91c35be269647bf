// Health checks on this node, a level-triggered reconciler: one listener per load balancer Service with
// externalTrafficPolicy Local on its healthCheckNodePort (answering, per request, from the load balancer's
// current view: this node's ready local targets and whether its programming is fresh), and the node's own
// /healthz and /livez on the health port. A port that cannot be opened (another Service's, or taken on the
// node) is reported in status and retried; nothing else is disturbed. Every flip of an answer is logged.
import type { Logger } from '../log';
import type { ResolvedLoadBalancer } from '../lb/lb-spec';
import { HealthListener, countLocalEndpoints, nodeAnswer, serviceAnswer } from './health-server';

const TICK_MS = 250;

export interface HealthControllerOptions {
  node: string;
  /** The node health port (0: none). */
  port: number;
  /** The load balancer's valid Services now. */
  services: () => ResolvedLoadBalancer[];
  /** tether's programming is not stale (the load balancer converged lately). */
  healthy: () => boolean;
  /** The node is not being deleted nor tainted for removal. */
  eligible: () => boolean;
  logger: Logger;
}

interface Check {
  port: number;
  listener: HealthListener;
  open: boolean;
  problem?: string;
  lastStatus?: number;
  lastLocal?: number;
}

export class HealthController {
  private readonly checks = new Map<string, Check>();
  private node?: HealthListener;
  private nodeProblem?: string;
  private lastUpdated = new Date();
  private timer?: NodeJS.Timeout;
  private busy = false;

  constructor(private readonly o: HealthControllerOptions) {}

  async start(): Promise<void> {
    if (this.o.port) {
      this.node = new HealthListener((path) => {
        const healthy = this.o.healthy();
        if (healthy) this.lastUpdated = new Date();
        return nodeAnswer(path, { healthy, nodeEligible: this.o.eligible(), lastUpdated: this.lastUpdated, now: new Date() });
      });
      try {
        await this.node.listen(this.o.port);
        this.o.logger.info('health: node health port open', { port: this.o.port });
      } catch (e) {
        this.nodeProblem = `node health port ${this.o.port}: ${(e as NodeJS.ErrnoException).code ?? (e as Error).message}`;
        this.o.logger.error('health: node health port not opened', { port: this.o.port, error: this.nodeProblem });
      }
    }
    this.timer = setInterval(() => void this.reconcile(), TICK_MS);
    this.timer.unref();
    await this.reconcile();
  }

  private local(lb: ResolvedLoadBalancer): number {
    return countLocalEndpoints(lb.targets, this.o.node);
  }

  /** Opens and closes listeners to match the Services; logs each answer that flips. */
  async reconcile(): Promise<void> {
    if (this.busy) return;
    this.busy = true;
    try {
      const want = new Map(this.o.services().filter((l) => l.externalTrafficPolicy === 'Local' && l.healthCheckNodePort).map((l) => [l.key, l]));
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
            const cur = this.o.services().find((l) => l.key === key);
            return serviceAnswer(ns, name, cur ? this.local(cur) : 0, this.o.healthy());
          });
          c = { port: lb.healthCheckNodePort!, listener, open: false };
          this.checks.set(key, c);
        }
        if (!c.open) {
          try {
            await c.listener.listen(c.port);
            c.open = true;
            c.problem = undefined;
            this.o.logger.info('health: service health check open', { service: key, port: c.port });
          } catch (e) {
            const why = `health-check port ${c.port}: ${(e as NodeJS.ErrnoException).code === 'EADDRINUSE' ? 'in use on this node' : (e as Error).message}`;
            if (c.problem !== why) this.o.logger.error('health: service health check not opened; retried', { service: key, problem: why });
            c.problem = why;
            continue;
          }
        }
        const local = this.local(lb);
        const status = local > 0 && this.o.healthy() ? 200 : 503;
        if (status !== c.lastStatus || local !== c.lastLocal) {
          this.o.logger.info('health: service health answer', { service: key, port: c.port, localEndpoints: local, status, was: c.lastStatus });
          c.lastStatus = status;
          c.lastLocal = local;
        }
      }
    } finally {
      this.busy = false;
    }
  }

  status(): Record<string, unknown> {
    return {
      nodePort: this.o.port || undefined,
      nodeProblem: this.nodeProblem,
      nodeEligible: this.o.eligible(),
      healthy: this.o.healthy(),
      services: [...this.checks].map(([service, c]) => ({ service, port: c.port, open: c.open, localEndpoints: c.lastLocal, answer: c.lastStatus, problem: c.problem })),
    };
  }

  async stop(): Promise<void> {
    clearInterval(this.timer);
    for (const c of this.checks.values()) await c.listener.close();
    this.checks.clear();
    await this.node?.close();
  }
}
