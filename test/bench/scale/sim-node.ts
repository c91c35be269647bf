// One simulated tetherd: the wiring of daemon/main.ts's start() through the same daemon/parts functions
// (config source, cluster store, pod state, IPAM, egress, load balancer, health, config feed), with its
// own store connections, config source, state dir and node address (127.x, so notices and conntrack sync
// between simulated nodes are real UDP/TCP). Not wired: the socket API, probes and the delete queue (no
// CNI clients here). Pods are recorded and announced to the controllers the way attach.add does after its
// kernel work, which the simulation has none of. Only ever run bundled (bundle.ts), with the fakes in place.
import * as fs from 'node:fs';
import * as path from 'node:path';
import type { Logger } from '../../../lib/log';
import { Lifecycle } from '../../../daemon/lifecycle';
import { feedReconcilers } from '../../../daemon/config/source';
import { EgressObjects } from '../../../daemon/egress/egress-config';
import { flowsOption, parseOptions, portOption } from '../../../daemon/options';
import { CurrentConfig, startSource } from '../../../daemon/parts/source';
import { openPodState, startIpam, startStore } from '../../../daemon/parts/ipam';
import { createEgress, egressReconciler, planEgress } from '../../../daemon/parts/egress';
import { createHealth, createLb, lbReconciler } from '../../../daemon/parts/lb';
import { resolveLoadBalancers } from '../../../daemon/lb/lb-spec';
import { KubeSource } from '../../../daemon/config/kube-source';
import { Controllers } from '../../../daemon/parts/controllers';
import type { EgressController } from '../../../daemon/egress/egress-controller';
import type { LbController } from '../../../daemon/lb/lb-controller';
import type { PodRecord, PodStore } from '../../../daemon/state/pod-store';
import type { AttachService } from '../../../daemon/pod/attach-service';
import type { Ipam } from '../../../daemon/parts/ipam';

export interface SimNodeOptions {
  name: string;
  /** A 127.x address: the node's address (BFD peer name, notices, sync). */
  address: string;
  redisUrl: string;
  redisPrefix: string;
  /** The file config source's file; or, with `kubeconfig`, none: the Kubernetes source (the fake API server). */
  configFile?: string;
  /** Kube mode: this node's kubeconfig (its own token, so the fake API server tallies its load). */
  kubeconfig?: string;
  /** Kube mode: --controller-candidates (the few nodes that compete for the controllers' Lease). */
  controllerCandidates?: string;
  clusterKeyFile: string;
  /** This node's own directory (state, pin dir, pod namespace stand-ins). */
  dir: string;
  maxVips: number;
  syncPort: number;
  logger: Logger;
}

export interface SimPod {
  namespace: string;
  name: string;
  ip: string;
  labels: Record<string, string>;
}

const NETWORK = 'tether-sim';

export class SimNode {
  private constructor(
    readonly o: SimNodeOptions,
    private readonly life: Lifecycle,
    private readonly podStore: PodStore,
    private readonly attach: AttachService,
    readonly ipam: Ipam,
    readonly egress: EgressController | undefined,
    readonly lb: LbController | undefined,
  ) {}

  get pinDir(): string {
    return path.join(this.o.dir, 'bpf');
  }

  static async start(o: SimNodeOptions): Promise<SimNode> {
    const { logger, name: nodeName } = o;
    fs.mkdirSync(path.join(o.dir, 'netns'), { recursive: true });
    const opts = parseOptions([
      '--node-name', nodeName, ...(o.kubeconfig ? ['--kubeconfig', o.kubeconfig] : ['--config', o.configFile!]), '--redis', o.redisUrl, '--redis-prefix', o.redisPrefix,
      ...(o.controllerCandidates ? ['--controller-candidates', o.controllerCandidates] : []),
      '--state-dir', path.join(o.dir, 'state'), '--socket', path.join(o.dir, 'tether.sock'), '--bpf-pin-dir', path.join(o.dir, 'bpf'),
      '--node-address', o.address, '--cluster-key-file', o.clusterKeyFile, '--sync-port', String(o.syncPort),
      '--lb-max-vips', String(o.maxVips), '--health-port', '0', '--probe-port', '0', '--log-level', 'warn',
    ]);
    const life = new Lifecycle(logger);
    try {
      const { source, config, takeMissed } = await startSource(opts, nodeName, logger, life);
      const current = new CurrentConfig(config, nodeName);
      const fouPort = portOption('fou-port', opts['fou-port']);
      const syncPort = portOption('sync-port', opts['sync-port']);
      const maxFlows = flowsOption(opts['egress-flows']);
      const egressObjects = new EgressObjects(logger);
      const egressPlan = await planEgress(opts, source, config, egressObjects);
      const store = await startStore(opts, logger, life);
      const stateDir = opts['state-dir'];
      const { podStore, attach } = openPodState(stateDir, logger);
      const ipam = await startIpam({ nodeName, config, source, store, stateDir, logger }, life);
      const egress = egressPlan
        ? await createEgress(opts, egressPlan, { nodeName, config, fouPort, syncPort, maxFlows, addresses: ipam.addresses, attach, logger }, (close) => life.started('ownership store', close))
        : undefined;
      const lb = await createLb(opts, { config, fouPort, addresses: ipam.addresses, attach, nodeName, logger }, (close) => life.started('lb mapping store', close));
      if (egress) life.started('egress', () => egress.stop(), 15_000);
      if (lb) life.started('load balancer', () => lb.stop(), 15_000);
      if (egress) await egress.start();
      if (lb) {
        await lb.apply(resolveLoadBalancers(config.others, config.pools), config.pods);
        await lb.start();
        const health = createHealth(opts, { lb, nodeName, eligible: () => current.node.eligible !== false, logger });
        await health.start();
        life.started('health checks', () => health.stop());
      }
      const feed = feedReconcilers(source, [current, ipam.reconciler, egressReconciler(egressObjects, egress, logger), lbReconciler(lb, logger)], logger, takeMissed);
      life.started('config updates', () => feed.stop());
      // As main.ts: in kube mode the controllers' Lease candidacy (and on the leader, status and the labeler).
      if (source instanceof KubeSource) {
        const controllers = new Controllers({ source, nodeName, egress, egressObjects, lb: lb ?? undefined, candidates: opts['controller-candidates'], labels: source.nodeLabels(), logger });
        await controllers.start();
        life.started('controllers', () => controllers.stop());
      }
      return new SimNode(o, life, podStore, attach, ipam, egress, lb);
    } catch (e) {
      await life.stopAll();
      throw e;
    }
  }

  /** A pod attached: recorded (as attach.add records it) and announced to the role controllers. */
  addPod(p: SimPod): void {
    const netns = path.join(this.o.dir, 'netns', `${p.namespace}_${p.name}`);
    fs.writeFileSync(netns, '');
    const rec: PodRecord = {
      network: NETWORK, containerId: `${p.namespace}-${p.name}`, ifName: 'eth0', netns, podNamespace: p.namespace, podName: p.name,
      ips: [p.ip], hostIfName: `veth${(p.namespace + p.name).length}`, labels: p.labels, phase: 'attached', config: { name: NETWORK }, createdAt: new Date().toISOString(),
    };
    this.podStore.put(rec);
    this.attach.emit('attached', rec);
  }

  /** A pod deleted: through attach.del, so the controllers' before-detach steps (handover) run. */
  async removePod(namespace: string, name: string): Promise<void> {
    await this.attach.del({ config: { name: NETWORK }, containerId: `${namespace}-${name}`, ifName: 'eth0', netns: '', args: {} } as never);
    fs.rmSync(path.join(this.o.dir, 'netns', `${namespace}_${name}`), { force: true });
  }

  /**
   * The controllers' status, for the simulation's own questions (who owns what). Asking an egress
   * controller for status marks it observed (someone is looking: for 30 s every pass also reads each
   * Egress's cluster-wide usage from the store); the coordinator polling owners is not such a user, so
   * the mark is put back as it was (else the benchmark's polling would be measured as store load).
   */
  status(): { egress: Array<Record<string, unknown>>; loadBalancers: unknown[] } {
    const ctx = (this.egress as unknown as { s?: { observedUntil: number } } | undefined)?.s;
    const observed = ctx?.observedUntil;
    const egress = this.egress?.status() ?? [];
    if (ctx && observed !== undefined) ctx.observedUntil = observed;
    return { egress, loadBalancers: this.lb?.status() ?? [] };
  }

  stop(): Promise<void> {
    return this.life.stopAll();
  }
}
