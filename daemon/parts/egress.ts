// Egress: the checks made before anything starts (objects, options, the cluster key), the controller, and
// the subsystem around it (desired state: the Egresses and pods' metadata; Egresses added, changed,
// removed; pod roles from labels).
import * as fs from 'node:fs';
import { isIP } from 'node:net';
import { canonicalIp } from '../../lib/ip';
import type { Logger } from '../../lib/log';
import { Connection, StartError } from '../lifecycle';
import { ErrorCode, TetherError } from '../../lib/errors';
import type { ConfigObjects } from '../config/objects';
import type { ConfigSource } from '../config/source';
import { KubeSource } from '../config/kube-source';
import { awaitClusterSecret } from '../kube/cluster-key';
import type { EgressObjects } from '../egress/egress-config';
import { EgressController, requireClusterKey } from '../egress/egress-controller';
import type { EgressControllerOptions } from '../egress/egress-state';
import type { ResolvedEgress } from '../egress/egress-spec';
import { OwnershipStore } from '../egress/ownership-store';
import type { ClusterAddresses } from '../../ipam/cluster-addresses';
import type { AttachService } from '../pod/attach-service';
import { kubeMode, nodeAddress6Option, requireLocalAddress, uplinkOption, type Options } from '../options';
import type { EgressDesired, Subsystem } from './subsystem';

/** A node's cap on the addresses of one Egress it holds (overrides the Egress's maxAddressesPerNode). */
export const MAX_EGRESS_ADDRESSES_LABEL = 'tether.dev/max-egress-addresses';

export interface EgressPlan {
  resolved: ResolvedEgress[];
  clusterKey: Buffer;
  nodeAddress: string;
  /** The node's IPv6 address for outer IPv6 over an IPv4 underlay (--node-address-6, or found on its interface). */
  nodeAddress6?: string;
}

async function clusterKeyText(opts: Options, source: ConfigSource, logger: Logger): Promise<string | undefined> {
  if (opts['cluster-key-secret'] && source instanceof KubeSource) {
    const ns = process.env.POD_NAMESPACE || 'tether-system';
    try {
      return await awaitClusterSecret(source.kc, ns, opts['cluster-key-secret'], 'clusterKey', { logger });
    } catch (e) {
      throw new TetherError(ErrorCode.InvalidConfig, `--cluster-key-secret: Secret ${ns}/${opts['cluster-key-secret']}: ${(e as Error).message}`);
    }
  }
  if (opts['cluster-key-file']) {
    try {
      return fs.readFileSync(opts['cluster-key-file'], 'utf8');
    } catch (e) {
      throw new TetherError(ErrorCode.InvalidConfig, `--cluster-key-file: cannot read ${opts['cluster-key-file']}: ${(e as NodeJS.ErrnoException).code ?? (e as Error).message}`);
    }
  }
  return undefined;
}

/**
 * Whether this node serves Egress, and with what: when Egresses are configured at start, or when the
 * options for them are given (Egresses may come later). A bad Egress file, a missing option or an
 * unreadable key stops the start (exit 2); in a cluster an invalid Egress is refused alone.
 */
export async function planEgress(opts: Options, source: ConfigSource, config: ConfigObjects, objects: EgressObjects, logger: Logger): Promise<EgressPlan | undefined> {
  const configured = config.others.some((o) => o.kind === 'Egress');
  const optioned = !!opts['node-address'] && !!(opts['cluster-key-file'] || opts['cluster-key-secret']) && !!opts.redis;
  if (!configured && !optioned) return undefined;
  let plan: EgressPlan;
  try {
    const resolved = objects.resolve(config);
    const rejected = Object.values(objects.problems());
    // A file is refused whole at start; in a cluster each object is judged alone (its status says why).
    if (rejected.length && !kubeMode(opts)) throw new TetherError(ErrorCode.InvalidConfig, rejected.join('\n'));
    if (!opts.redis) throw new TetherError(ErrorCode.InvalidConfig, 'Egress objects need the cluster store: start tetherd with --redis');
    if (!opts['node-address']) throw new TetherError(ErrorCode.InvalidConfig, 'Egress objects need --node-address');
    plan = { resolved, clusterKey: requireClusterKey(await clusterKeyText(opts, source, logger)), nodeAddress: opts['node-address'] };
  } catch (e) {
    throw new StartError(2, `egress configuration rejected: ${(e as Error).message}`);
  }
  requireLocalAddress(plan.nodeAddress);
  // The IPv6 source of outer IPv6 FoU over an IPv4 underlay: the node's --node-address-6 (or its one global
  // IPv6 address), the same one the load balancer uses and the node registry carries.
  if (isIP(plan.nodeAddress) === 4) {
    const a6 = nodeAddress6Option(opts);
    if (a6) plan.nodeAddress6 = canonicalIp(a6);
  }
  return plan;
}

/** The egress controller's connection to the ownership records (a store it cannot reach fails the start, exit 1). */
export function ownershipStore(opts: Pick<Options, 'redis' | 'redis-prefix'>): Connection<OwnershipStore> {
  return new Connection('ownership store', async () => {
    try {
      return await OwnershipStore.connect(opts.redis!, { keyPrefix: opts['redis-prefix'] });
    } catch (e) {
      throw new StartError(1, `egress: ${(e as Error).message}`);
    }
  });
}

/** The egress controller of a node that serves Egress (planEgress), not started. */
export function createEgress(
  opts: Options,
  plan: EgressPlan,
  o: {
    nodeName: string; config: ConfigObjects; fouPort: number; syncPort: number; maxFlows: number; addresses: ClusterAddresses; attach: AttachService; logger: Logger;
    ownership: OwnershipStore;
    onOwnershipChanged?: EgressControllerOptions['onOwnershipChanged'];
    onStandbySyncChanged?: EgressControllerOptions['onStandbySyncChanged'];
  },
): EgressController {
  const nodeConfig = o.config.nodes[o.nodeName] ?? { labels: {} };
  const cap = nodeConfig.labels[MAX_EGRESS_ADDRESSES_LABEL];
  const maxEgressAddresses = cap !== undefined && /^[1-9][0-9]{0,2}$/.test(cap) ? Number(cap) : undefined;
  if (cap !== undefined && maxEgressAddresses === undefined) o.logger.warn('egress: node label ignored: not a count 1..999', { label: MAX_EGRESS_ADDRESSES_LABEL, value: cap });
  return new EgressController({
    node: { name: o.nodeName, zone: nodeConfig.zone, address: plan.nodeAddress, ...(plan.nodeAddress6 ? { address6: plan.nodeAddress6 } : {}), uplink: uplinkOption(opts), maxEgressAddresses },
    maxFlows: o.maxFlows,
    pinDir: opts['bpf-pin-dir'],
    fouPort: o.fouPort,
    syncPort: o.syncPort,
    clusterKey: plan.clusterKey,
    egresses: plan.resolved,
    podLabels: o.config.pods,
    ownership: o.ownership,
    addresses: o.addresses,
    attach: o.attach,
    logger: o.logger,
    conntrackSync: !opts['no-conntrack-sync'],
    onOwnershipChanged: o.onOwnershipChanged,
    onStandbySyncChanged: o.onStandbySyncChanged,
  });
}

/** Egress on this node: the controller when the node serves Egress (planEgress), else only the error saying why not. */
export class Egress implements Subsystem<EgressDesired> {
  readonly name = 'egress';

  constructor(
    readonly controller: EgressController | undefined,
    private readonly logger: Logger,
  ) {}

  async start(): Promise<void> {
    await this.controller?.start();
  }

  async apply(d: EgressDesired): Promise<void> {
    if (this.controller) await this.controller.apply(d.egresses, d.podMeta);
    else if (d.egresses.length) this.logger.error('egress: Egress objects need --node-address, --cluster-key-file and --redis; not served', { egresses: d.egresses.map((x) => x.key) });
  }

  /** Its stop may keep an address while no standby is in sync (HANDOVER_WAIT_MS): bounded by its own budget. */
  get stopBudgetMs(): number | undefined {
    return this.controller?.stopBudgetMs;
  }

  /** stoppingSince: when tetherd began to stop (the handover wait counts from there). */
  async stop(stoppingSince?: number): Promise<void> {
    await this.controller?.stop(stoppingSince);
  }

  status(): Record<string, unknown> {
    const c = this.controller;
    return { egress: c?.status() ?? [], egressSummary: c?.egressSummary() ?? {}, egressSecurity: c?.security(), bfd: c?.bfdStatus() };
  }
}
