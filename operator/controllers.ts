// The cluster's controllers, run by one operator replica at a time: the holder of the Lease
// tether-operator in the operator's namespace (every replica competes; the nodes never touch a Lease).
// While it leads: status of AddressPools, Egresses and tether Services (StatusController, with the store's
// view of the egress addresses and VIPs, cluster-view.ts), collection of deleted nodes' block claims (its
// second loop), and the Service labeler. A leader that loses the Lease stops all of it before another
// replica can be elected (LeaderElection steps down within the lease duration).
import type { Logger } from '../lib/log';
import type { Part } from '../daemon/lifecycle';
import type { KubeSource } from '../daemon/config/kube-source';
import type { ConfigObjects } from '../daemon/config/objects';
import type { EgressObjects } from '../daemon/egress/egress-config';
import { LeaderElection } from '../daemon/kube/leader';
import { StatusController, type StatusControllerOptions } from '../daemon/kube/status-controller';
import { ServiceLabeler } from '../daemon/kube/service-labeler';
import type { HealthReports } from '../daemon/health/health-reports';
import { resolveLoadBalancers, type LbResolution } from '../daemon/lb/lb-spec';
import type { ResolvedEgress } from '../daemon/egress/egress-spec';
import type { EgressView, LbView } from './cluster-view';

export const OPERATOR_LEASE = 'tether-operator';

/** The leader's work, started on election and stopped on loss. */
export interface LeaderWork {
  start(): void;
  stop(): Promise<void>;
}

/** Runs the leader's work while this replica holds the Lease. */
export class LeaderRole implements Part {
  readonly name = 'leader election';
  private readonly election: LeaderElection;
  private chain: Promise<void> = Promise.resolve();

  constructor(o: { election: ConstructorParameters<typeof LeaderElection>[0]; work: LeaderWork }) {
    this.election = new LeaderElection(o.election);
    // Starts and stops in order: a stop under way finishes before the next start.
    this.election.on('elected', () => void (this.chain = this.chain.then(() => o.work.start())));
    this.election.on('lost', () => void (this.chain = this.chain.then(() => o.work.stop())));
    this.work = o.work;
  }

  private readonly work: LeaderWork;

  start(): void {
    this.election.start();
  }

  isLeader(): boolean {
    return this.election.isLeader();
  }

  /** The Lease, whether this replica holds it, and how often that changed (the metrics). */
  leadership(): ReturnType<LeaderElection['leadership']> {
    return this.election.leadership();
  }

  async stop(): Promise<void> {
    const was = this.election.isLeader();
    await this.election.stop();
    await this.chain;
    if (was) await this.work.stop();
  }
}

/** What the operator's passes work from: each configuration resolved once, as it comes. */
export interface ClusterDesired {
  config: ConfigObjects;
  egresses: ResolvedEgress[];
  lb: LbResolution;
}

/** The resolve step: the Egresses through `egressObjects` (which keeps a refused one's reason, for status). */
export function resolveCluster(config: ConfigObjects, egressObjects: EgressObjects): ClusterDesired {
  return { config, egresses: egressObjects.resolve(config), lb: resolveLoadBalancers(config.others, config.pools) };
}

/** The status controller and the Service labeler over the operator's watches and its view of the store. */
export function clusterControllers(o: {
  source: KubeSource; desired: () => ClusterDesired; egressObjects: EgressObjects; egressView?: EgressView; lbView?: LbView; healthReports?: HealthReports; logger: Logger;
  events?: StatusControllerOptions['events'];
  everyMs?: number; gcEveryMs?: number;
}): LeaderWork & { status: StatusController } {
  const { source, logger } = o;
  const status = new StatusController({
    kc: source.kc,
    logger,
    // The store's view, read before each pass; unreadable (the store away), the pass goes on with the view
    // last read, so the pools' and refused objects' status does not wait for the store.
    refresh: async () => {
      const d = o.desired();
      await o.egressView?.refresh(d.egresses, d.config.pools); // keeps what it cannot read, itself
      await o.lbView?.refresh(d.lb, d.config.pools).catch((e: Error) => logger.warn('operator: VIPs not read from the store; status keeps what was last read', { error: e.message }));
    },
    verdicts: () => source.currentVerdicts(),
    refused: () => o.egressObjects.problems(),
    egressAddresses: () => o.egressView?.status() ?? [],
    egressSummary: () => o.egressView?.summary() ?? {},
    loadBalancers: () => o.lbView?.status() ?? [],
    services: () => new Map(source.cachedObjects('services').map((x) => [`${x.metadata?.namespace}/${x.metadata?.name}`, x])),
    addressPools: () => new Map(source.cachedObjects('addresspools').map((x) => [String(x.metadata?.name), x])),
    egresses: () => new Map(source.cachedObjects('egresses').map((x) => [`${x.metadata?.namespace}/${x.metadata?.name}`, x])),
    healthReports: o.healthReports && (() => o.healthReports!.read()),
    events: o.events,
    everyMs: o.everyMs,
    gcEveryMs: o.gcEveryMs,
  });
  let labeler: ServiceLabeler | undefined;
  return {
    status,
    start: () => {
      status.start();
      labeler ??= new ServiceLabeler({ kc: source.kc, logger });
      labeler.start();
    },
    stop: async () => {
      await status.stop();
      await labeler?.stop();
    },
  };
}
