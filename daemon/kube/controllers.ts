// The cluster's controllers (status of AddressPools and Egresses, collection of dead nodes' block claims)
// run on one tetherd at a time, the holder of a Lease in tetherd's own namespace.
import type { Logger } from '../log';
import type { Lifecycle } from '../lifecycle';
import type { KubeSource } from '../config/kube-source';
import type { LbController } from '../lb/lb-controller';
import type { EgressController } from '../egress/egress-controller';
import type { EgressObjects } from '../egress/egress-config';
import { LeaderElection } from './leader';
import { StatusController } from './status-controller';

export function startControllers(source: KubeSource, nodeName: string, egress: EgressController | undefined, egressObjects: EgressObjects, logger: Logger, life: Lifecycle, lb?: LbController): void {
  const leader = new LeaderElection({ kc: source.kc, namespace: process.env.POD_NAMESPACE || 'tether-system', name: 'tether-controllers', identity: nodeName, logger });
  const status = new StatusController({
    kc: source.kc,
    logger,
    verdicts: () => source.currentVerdicts(),
    refused: () => egressObjects.problems(),
    egressAddresses: () => (egress?.status() ?? []).map((a) => ({
      egress: String(a.egress), address: String(a.address), owner: String(a.owner ?? ''), ownerNode: a.ownerNode as string | undefined, ownerZone: a.ownerZone as string | undefined, epoch: Number(a.epoch),
      ...(a.clusterFlows !== undefined ? { flows: Number(a.clusterFlows), bytes: Number(a.clusterBytes ?? 0) } : {}),
    })),
    egressSummary: () => egress?.egressSummary() ?? {},
    loadBalancers: () => lb?.status() ?? [],
    healthReports: lb?.store && (() => lb.store!.healthReports()),
  });
  leader.on('elected', () => status.start());
  leader.on('lost', () => void status.stop());
  leader.start();
  life.started('controllers', async () => {
    await status.stop();
    await leader.stop();
  });
}
