// The load balancer: whether this node serves it (Services of tether's class configured, or the options
// for them given), its mapping store connection, the controller, and the subsystems around it and its
// health checks.
import type { Logger } from '../../lib/log';
import { StartError } from '../lifecycle';
import type { ConfigObjects } from '../config/objects';
import type { Reconciler } from '../config/source';
import { LbController } from '../lb/lb-controller';
import { HealthController, REPORT_TTL_MS, type HealthControllerOptions } from '../health/health-controller';
import { HealthReports } from '../health/health-reports';
import { connectLbStore } from '../lb/lb-store';
import { resolveLoadBalancers } from '../lb/lb-spec';
import type { ClusterAddresses } from '../../ipam/cluster-addresses';
import type { AttachService } from '../pod/attach-service';
import { lbOptions, requireLocalAddress, uplinkOption, type Options } from '../options';
import type { HealthDesired, LbDesired, Subsystem } from './subsystem';
import { isTetherService } from '../objects/names';

/**
 * The controller when this node can serve load balancers: it needs --node-address (the outer source of
 * forwarded packets, which targets accept) and --redis (the mapping store). Without them a configured
 * tether Service is an error at start; without any, the load balancer stays off.
 */
export async function createLb(
  opts: Options,
  o: { config: ConfigObjects; fouPort: number; addresses: ClusterAddresses; attach: AttachService; nodeName: string; logger: Logger },
  onStoreStarted: (close: () => Promise<void>) => void,
): Promise<LbController | undefined> {
  const configured = o.config.others.some(isTetherService);
  const lb = lbOptions(opts);
  if (!opts['node-address'] || !opts.redis) {
    if (configured) throw new StartError(2, 'load balancer Services need --node-address and --redis');
    return undefined;
  }
  requireLocalAddress(opts['node-address']);
  const store = await connectLbStore(opts.redis, { keyPrefix: opts['redis-prefix'] });
  onStoreStarted(() => store.connection.close());
  return new LbController({
    node: { name: o.nodeName, address: opts['node-address'] },
    pinDir: opts['bpf-pin-dir'],
    fouPort: o.fouPort,
    exportTable: lb.exportTable,
    maxVips: lb.maxVips,
    maglevSize: lb.maglevSize,
    maxMappings: lb.maxMappings,
    datapath: lb.datapath,
    uplink: uplinkOption(opts),
    store,
    addresses: o.addresses,
    attach: o.attach,
    stateDir: opts['state-dir'],
    logger: o.logger,
  });
}

/** The load balancer on this node: the controller when the node serves it (createLb), else only the error saying why not. */
export class LoadBalancer implements Subsystem<LbDesired> {
  readonly name = 'load balancer';

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

/** A reconciler of whole configurations (for wiring without the resolve step: the scale simulation). */
export function lbReconciler(controller: LbController | undefined, logger: Logger): Reconciler {
  const lb = new LoadBalancer(controller, logger);
  return { name: lb.name, apply: (c) => lb.apply({ resolution: resolveLoadBalancers(c.others, c.pools), podMeta: c.pods }) };
}

/** Health checks of the load balancer's Services (desired state: whether the node is eligible; the Services are the LB's). */
export class Health implements Subsystem<HealthDesired> {
  readonly name = 'health checks';
  private eligible: boolean;
  readonly checks: HealthController;

  constructor(opts: Options, o: { lb: LbController; nodeName: string; eligible: boolean; logger: Logger; onFlip?: HealthControllerOptions['onFlip'] }) {
    this.eligible = o.eligible;
    this.checks = createHealth(opts, { ...o, eligible: () => this.eligible });
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

/** Health checks for the load balancer's Services with Local policy, and the node's health port. */
export function createHealth(opts: Options, o: { lb: LbController; nodeName: string; eligible: () => boolean; logger: Logger; onFlip?: HealthControllerOptions['onFlip'] }): HealthController {
  const raw = opts['health-port'];
  const port = Number(raw);
  if (!/^[0-9]+$/.test(raw) || port > 65535) throw new StartError(2, `--health-port: ${JSON.stringify(raw)} is not a port (0 turns it off)`);
  const store = o.lb.store;
  const reports = store && new HealthReports(store.connection);
  return new HealthController({
    node: o.nodeName, port, services: () => o.lb.current(), programming: () => o.lb.programming(), eligible: o.eligible, logger: o.logger,
    report: reports && ((r) => reports.write(o.nodeName, r, REPORT_TTL_MS)), onFlip: o.onFlip,
  });
}
