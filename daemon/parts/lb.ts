// The load balancer: whether this node serves it (Services of tether's class configured, or the options
// for them given), its mapping store connection, the controller, and the subsystems around it and its
// health checks.
import type { Logger } from '../../lib/log';
import { Connection, StartError } from '../lifecycle';
import type { ConfigObjects } from '../config/objects';
import { LbController, type LbControllerOptions } from '../lb/lb-controller';
import { HealthController, REPORT_TTL_MS, type HealthControllerOptions } from '../health/health-controller';
import { HealthReports } from '../health/health-reports';
import { connectLbStore, type LbStore } from '../lb/lb-store';
import type { ClusterAddresses } from '../../ipam/cluster-addresses';
import type { AttachService } from '../pod/attach-service';
import { lbOptions, nodeAddress6Option, requireLocalAddress, uplinkOption, type Options } from '../options';
import type { HealthDesired, LbDesired, Subsystem } from './subsystem';
import { isTetherService } from '../objects/names';

/** What a node that serves load balancers serves them with. */
export interface LbPlan extends ReturnType<typeof lbOptions> {
  nodeAddress: string;
  /** The node's IPv6 address (nodeAddress6Option): IPv6 VIPs are forwarded from it; none, not forwarded. */
  nodeAddress6?: string;
  redis: string;
}

/**
 * Whether this node can serve load balancers: it needs --node-address (the outer source of forwarded
 * packets, which targets accept) and --redis (the mapping store). Without them a configured tether Service
 * is an error at start; without any, the load balancer stays off.
 */
export function planLb(opts: Options, config: ConfigObjects): LbPlan | undefined {
  const configured = config.others.some(isTetherService);
  const lb = lbOptions(opts);
  if (!opts['node-address'] || !opts.redis) {
    if (configured) throw new StartError(2, 'load balancer Services need --node-address and --redis');
    return undefined;
  }
  requireLocalAddress(opts['node-address']);
  return { ...lb, nodeAddress: opts['node-address'], nodeAddress6: nodeAddress6Option(opts), redis: opts.redis };
}

/** The load balancer's connection to the mapping store. */
export function mappingStore(opts: Options, plan: LbPlan): Connection<LbStore> {
  return new Connection('lb mapping store', () => connectLbStore(plan.redis, { keyPrefix: opts['redis-prefix'] }));
}

/** The load balancer's controller (planLb), not started. */
export function createLb(
  opts: Options,
  plan: LbPlan,
  o: { fouPort: number; addresses: ClusterAddresses; attach: AttachService; nodeName: string; store: LbStore; logger: Logger; onNotForwarded?: LbControllerOptions['onNotForwarded'] },
): LbController {
  return new LbController({
    node: { name: o.nodeName, address: plan.nodeAddress, ...(plan.nodeAddress6 ? { address6: plan.nodeAddress6 } : {}) },
    pinDir: opts['bpf-pin-dir'],
    fouPort: o.fouPort,
    exportTable: plan.exportTable,
    maxVips: plan.maxVips,
    maglevSize: plan.maglevSize,
    maxMappings: plan.maxMappings,
    changeWaitMs: plan.changeWaitMs,
    datapath: plan.datapath,
    uplink: uplinkOption(opts),
    store: o.store,
    addresses: o.addresses,
    attach: o.attach,
    stateDir: opts['state-dir'],
    logger: o.logger,
    onNotForwarded: o.onNotForwarded,
  });
}

/** The load balancer on this node: the controller when the node serves it (createLb), else only the error saying why not. */
export class LoadBalancer implements Subsystem<LbDesired> {
  readonly name = 'load balancer';
  readonly stopBudgetMs = 15_000;

  constructor(
    readonly controller: LbController | undefined,
    private readonly logger: Logger,
  ) {}

  async start(): Promise<void> {
    await this.controller?.start();
  }

  async apply(d: LbDesired): Promise<void> {
    const r = d.resolution;
    if (this.controller) await this.controller.apply(r, d.podMeta);
    else if (r.loadBalancers.length || r.refused.length) this.logger.error('lb: load balancer Services need --node-address and --redis; not served', { services: [...r.loadBalancers.map((l) => l.key)] });
  }

  async stop(): Promise<void> {
    await this.controller?.stop();
  }

  status(): Record<string, unknown> {
    return { loadBalancers: this.controller?.status() ?? [], ...(this.controller ? { lbDatapath: this.controller.datapathStatus() } : {}) };
  }
}

/**
 * Health checks of the load balancer's Services with Local policy, and the node's health port (desired
 * state: whether the node is eligible; the Services are the LB's).
 */
export class Health implements Subsystem<HealthDesired> {
  readonly name = 'health checks';
  private eligible: boolean;
  readonly checks: HealthController;

  constructor(opts: Options, o: { lb: LbController; nodeName: string; eligible: boolean; logger: Logger; onFlip?: HealthControllerOptions['onFlip'] }) {
    this.eligible = o.eligible;
    const raw = opts['health-port'];
    const port = Number(raw);
    if (!/^[0-9]+$/.test(raw) || port > 65535) throw new StartError(2, `--health-port: ${JSON.stringify(raw)} is not a port (0 turns it off)`);
    const store = o.lb.store;
    const reports = store && new HealthReports(store.connection);
    this.checks = new HealthController({
      node: o.nodeName, port, services: () => o.lb.current(), programming: () => o.lb.programming(), eligible: () => this.eligible, logger: o.logger,
      notForwarded: () => o.lb.notForwarded(),
      report: reports && ((r) => reports.write(o.nodeName, r, REPORT_TTL_MS)), onFlip: o.onFlip,
    });
  }

  start(): Promise<void> {
    return this.checks.start();
  }

  apply(d: HealthDesired): void {
    this.eligible = d.eligible;
  }

  stop(): Promise<void> {
    return this.checks.stop();
  }

  status(): Record<string, unknown> {
    return { health: this.checks.status() };
  }
}
