// The load balancer: whether this node serves it (Services of tether's class configured, or the options
// for them given), its mapping store connection, the controller, and its reconciler.
import type { Logger } from '../log';
import { StartError } from '../lifecycle';
import type { ConfigObjects } from '../config/objects';
import type { Reconciler } from '../config/source';
import { LbController } from '../lb/lb-controller';
import { HealthController, REPORT_TTL_MS } from '../health/health-controller';
import { MappingStore } from '../lb/mapping-store';
import { isTetherService, resolveLoadBalancers } from '../lb/lb-spec';
import type { ClusterAddresses } from '../../ipam/cluster-addresses';
import type { AttachService } from '../pod/attach-service';
import { lbOptions, requireLocalAddress, type Options } from '../options';

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
  const store = await MappingStore.connect(opts.redis, { keyPrefix: opts['redis-prefix'] });
  onStoreStarted(() => store.close());
  return new LbController({
    node: { name: o.nodeName, address: opts['node-address'] },
    pinDir: opts['bpf-pin-dir'],
    fouPort: o.fouPort,
    exportTable: lb.exportTable,
    maxVips: lb.maxVips,
    maglevSize: lb.maglevSize,
    maxMappings: lb.maxMappings,
    store,
    addresses: o.addresses,
    attach: o.attach,
    logger: o.logger,
  });
}

export function lbReconciler(controller: LbController | undefined, logger: Logger): Reconciler {
  return {
    name: 'load balancer',
    async apply(c) {
      const r = resolveLoadBalancers(c.others, c.pools);
      if (controller) await controller.apply(r, c.pods);
      else if (r.loadBalancers.length || r.refused.length) logger.error('lb: load balancer Services need --node-address and --redis; not served', { services: [...r.loadBalancers.map((l) => l.key)] });
    },
  };
}

/** Health checks for the load balancer's Services with Local policy, and the node's health port. */
export function createHealth(opts: Options, o: { lb: LbController; nodeName: string; eligible: () => boolean; logger: Logger }): HealthController {
  const raw = opts['health-port'];
  const port = Number(raw);
  if (!/^[0-9]+$/.test(raw) || port > 65535) throw new StartError(2, `--health-port: ${JSON.stringify(raw)} is not a port (0 turns it off)`);
  const store = o.lb.store;
  return new HealthController({
    node: o.nodeName, port, services: () => o.lb.current(), healthy: () => o.lb.fresh(), eligible: o.eligible, logger: o.logger,
    report: store && ((r) => store.reportHealth(o.nodeName, r, REPORT_TTL_MS)),
  });
}
