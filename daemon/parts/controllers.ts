// The cluster's controllers (daemon/kube/controllers.ts): the leader's work (status of AddressPools,
// Egresses and tether Services, block claim collection, the Service labeler) run by the holder of the
// Lease; this node competes while its labels make it a candidate (its desired state).
import type { Logger } from '../../lib/log';
import type { KubeSource } from '../config/kube-source';
import type { EgressController } from '../egress/egress-controller';
import type { EgressObjects } from '../egress/egress-config';
import type { LbController } from '../lb/lb-controller';
import { HealthReports } from '../health/health-reports';
import { Candidacy, parseCandidates, type LeaderWork } from '../kube/controllers';
import { StatusController, type StatusControllerOptions } from '../kube/status-controller';
import { ServiceLabeler } from '../kube/service-labeler';
import type { ControllersDesired, Subsystem } from './subsystem';

export class Controllers implements Subsystem<ControllersDesired> {
  readonly name = 'controllers';
  private labels: Record<string, string>;
  private readonly candidacy: Candidacy;

  constructor(o: {
    source: KubeSource; nodeName: string; egress?: EgressController; egressObjects: EgressObjects; lb?: LbController; candidates?: string;
    labels: Record<string, string>; logger: Logger;
    /** Records the leader's Events (refusals, address conflicts); none when absent. */
    events?: StatusControllerOptions['events'];
  }) {
    const { source, egress, lb, logger } = o;
    this.labels = o.labels;
    const reports = lb?.store && new HealthReports(lb.store.connection);
    const status = new StatusController({
      kc: source.kc,
      logger,
      verdicts: () => source.currentVerdicts(),
      refused: () => o.egressObjects.problems(),
      egressAddresses: () => (egress?.status() ?? []).map((a) => ({
        egress: String(a.egress), address: String(a.address), owner: String(a.owner ?? ''), ownerNode: a.ownerNode as string | undefined, ownerZone: a.ownerZone as string | undefined, epoch: Number(a.epoch),
        ...(a.clusterFlows !== undefined ? { flows: Number(a.clusterFlows), bytes: Number(a.clusterBytes ?? 0) } : {}),
      })),
      egressSummary: () => egress?.egressSummary() ?? {},
      loadBalancers: () => lb?.status() ?? [],
      services: () => new Map(source.cachedObjects('services').map((o) => [`${o.metadata?.namespace}/${o.metadata?.name}`, o])),
      addressPools: () => new Map(source.cachedObjects('addresspools').map((o) => [String(o.metadata?.name), o])),
      egresses: () => new Map(source.cachedObjects('egresses').map((o) => [`${o.metadata?.namespace}/${o.metadata?.name}`, o])),
      healthReports: reports && (() => reports.read()),
      events: o.events,
    });
    let labeler: ServiceLabeler | undefined;
    const work: LeaderWork = {
      start: () => {
        // The leader holds every Service's VIP (its status shows them); the others only those they serve.
        lb?.setControllers(true);
        status.start();
        labeler ??= new ServiceLabeler({ kc: source.kc, logger });
        labeler.start();
      },
      stop: async () => {
        await status.stop();
        await labeler?.stop();
        lb?.setControllers(false);
      },
    };
    this.candidacy = new Candidacy({
      kc: source.kc, nodeName: o.nodeName, mode: parseCandidates(o.candidates), labels: () => this.labels, work, logger,
      namespace: process.env.POD_NAMESPACE || 'tether-system',
    });
  }

  async start(): Promise<void> {
    // Not awaited: in auto mode it first asks the API whether any node is labelled a candidate.
    void this.candidacy.start();
  }

  /** New labels: starts or stops competing for the Lease (a leader that stops being a candidate hands it over). */
  apply(d: ControllersDesired): void {
    this.labels = d.labels;
    this.candidacy.evaluate();
  }

  stop(): Promise<void> {
    return this.candidacy.stop();
  }

  /** Nothing of its own in tetherd's status: what it writes is in the objects' status. */
  status(): Record<string, unknown> {
    return {};
  }
}
