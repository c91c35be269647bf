// One simulated tetherd: daemon/main.ts's nodeParts(), started as tetherd starts them, with its own store
// connections, config source, state dir and node address (127.x, so notices and conntrack sync between
// simulated nodes are real UDP/TCP). Left out (nodeParts' `without`): the host's bpffs and sysctl journal,
// the socket API and the delete queue (no CNI clients here), metrics, Kubernetes Events and TetherNodes;
// probes are off (--probe-port 0); the cluster's controllers run in the simulation's operator (sim-operator.ts).
// Pods are recorded and announced to the role controllers the way attach.add
// does after its kernel work, which the simulation has none of. Only ever run bundled (bundle.ts), with
// the fakes in place.
import * as fs from 'node:fs';
import * as path from 'node:path';
import type { Logger } from '../../../lib/log';
import { Lifecycle } from '../../../daemon/lifecycle';
import { nodeParts } from '../../../daemon/main';
import { parseOptions } from '../../../daemon/options';
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
      '--state-dir', path.join(o.dir, 'state'), '--socket', path.join(o.dir, 'tether.sock'), '--bpf-pin-dir', path.join(o.dir, 'bpf'),
      '--node-address', o.address, '--cluster-key-file', o.clusterKeyFile, '--sync-port', String(o.syncPort),
      '--lb-max-vips', String(o.maxVips), '--health-port', '0', '--probe-port', '0', '--log-level', 'warn',
    ]);
    const life = new Lifecycle(logger);
    try {
      const n = await life.start(nodeParts(opts, { nodeName, logger, without: { host: true, cni: true, metrics: true, reporting: true } }));
      return new SimNode(o, life, n.podStore, n.attach, n.ipam, n.egress, n.lb);
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
