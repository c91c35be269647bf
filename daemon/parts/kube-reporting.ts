// What this node tells the cluster about itself through the Kubernetes API (kube mode only; with a config
// file there is no API and none of this runs): Events on the objects things happen to (egress ownership
// changes this node decided, its health-check answers flipping, and, through the leader's status
// controller, refusals), and its TetherNode, whose conditions say whether its tetherd is ready, its
// datapath attached and its cluster store reachable.
import type { Logger } from '../../lib/log';
import type { KubeSource } from '../config/kube-source';
import type { Reconciler } from '../config/source';
import type { OwnershipChange, StandbySyncChange } from '../egress/egress-state';
import type { RoleProblem } from '../pod/role-problems';
import { EventRecorder, type EventObject, type TetherEvent } from '../kube/event-recorder';
import { NodeStatusWriter, type NodeCondition } from '../kube/node-status';
import { healthFlipEvent, notForwardedEvent, ownershipEvent, standbySyncEvent, storeFullEvent } from '../kube/tether-events';
import { storeFullness } from '../common/store-full';
import type { Subsystem } from './subsystem';

/** Condition messages stay short: they are compared on every check and shown by kubectl. */
const MESSAGE_MAX = 1000;
const cut = (s: string) => (s.length > MESSAGE_MAX ? `${s.slice(0, MESSAGE_MAX - 3)}...` : s);

export interface KubeReportingOptions {
  source: KubeSource;
  nodeName: string;
  version: string;
  /** --redis was given (a cluster store is configured). */
  storeConfigured: boolean;
  bpfPinDir: string;
  /** Pods whose role (egress gateway or client, LB pod or target) could not be set up in the datapath. */
  roleProblems: () => RoleProblem[];
  logger: Logger;
  /** For tests: the node status writer's and the event recorder's timings. */
  heartbeatMs?: number;
  checkEveryMs?: number;
  events?: { burst?: number; refillMs?: number; seriesWindowMs?: number; queueSize?: number };
}

/** The inputs of the three conditions, from local state (conditions() turns them into conditions). */
export interface NodeFacts {
  version: string;
  started: boolean;
  stopped: boolean;
  /** Reconcilers whose last apply failed, with the error. */
  reconcileFailures: Map<string, string>;
  /** Resources the config source cannot follow now. */
  notFollowed: string[];
  roleProblems: RoleProblem[];
  bpfPinDir: string;
  /** Subsystems of this node with a datapath (egress, load balancer). */
  datapaths: string[];
  storeConfigured: boolean;
  /** Each subsystem that talks to the cluster store, and whether it answers it now. */
  store: Array<{ name: string; reachable: boolean }>;
}

/** Ready, DatapathAttached and StoreReachable from what this node knows now. Pure. */
export function nodeConditions(f: NodeFacts): NodeCondition[] {
  let ready: NodeCondition;
  if (f.stopped) ready = { type: 'Ready', status: 'False', reason: 'Stopped', message: 'tetherd stopped' };
  else if (!f.started) ready = { type: 'Ready', status: 'False', reason: 'Starting', message: 'tetherd is starting: not every subsystem runs yet' };
  else if (f.reconcileFailures.size) {
    const failed = [...f.reconcileFailures].sort(([a], [b]) => a.localeCompare(b)).map(([n, e]) => `${n}: ${e}`);
    ready = { type: 'Ready', status: 'False', reason: 'ReconcileFailed', message: cut(`the last configuration change could not be applied by ${failed.join('; ')}`) };
  } else if (f.notFollowed.length) {
    ready = { type: 'Ready', status: 'False', reason: 'WatchFailing', message: cut(`changes of ${f.notFollowed.join(', ')} are not followed now (tetherctl status shows why); the last ones known stay in force`) };
  } else ready = { type: 'Ready', status: 'True', reason: 'Running', message: `tetherd ${f.version} runs; every reconciler applied the last configuration` };

  const serving = f.datapaths.length ? f.datapaths.join(' and ') : 'no egress or load balancer on this node';
  const datapath: NodeCondition = f.roleProblems.length
    ? {
        type: 'DatapathAttached', status: 'False', reason: 'RoleSetupFailed',
        message: cut(`eBPF programs not attached for ${f.roleProblems.length} pod role(s), retried: ${f.roleProblems.map((p) => `${p.pod} (${p.role}): ${p.error}`).join('; ')}`),
      }
    : { type: 'DatapathAttached', status: 'True', reason: 'Attached', message: `every pod role's eBPF programs attached (${serving}); maps pinned under ${f.bpfPinDir}` };

  let store: NodeCondition;
  if (!f.storeConfigured) store = { type: 'StoreReachable', status: 'Unknown', reason: 'NotConfigured', message: 'tetherd runs without a cluster store (no --redis)' };
  else if (!f.store.length) store = { type: 'StoreReachable', status: 'Unknown', reason: 'NotUsed', message: 'no subsystem of this node talks to the cluster store (no egress or load balancer here)' };
  else {
    const down = f.store.filter((s) => !s.reachable).map((s) => s.name);
    store = down.length
      ? { type: 'StoreReachable', status: 'False', reason: 'Unreachable', message: `the cluster store does not answer the ${down.join(' and ')}; the datapath goes on with what it holds` }
      : { type: 'StoreReachable', status: 'True', reason: 'Reachable', message: `the cluster store answers the ${f.store.map((s) => s.name).join(' and ')}` };
  }
  return [ready, datapath, store];
}

const RESOURCE_OF: Record<string, 'egresses' | 'services' | 'addresspools'> = { Egress: 'egresses', Service: 'services', AddressPool: 'addresspools' };

export class KubeReporting implements Subsystem<unknown> {
  readonly name = 'kubernetes events and node status';
  /** Its last words (Ready False, the Events still queued) are each cut short well within this. */
  readonly stopBudgetMs = 5000;
  readonly events: EventRecorder;
  readonly nodeStatus: NodeStatusWriter;
  private started = false;
  private stopped = false;
  private readonly failures = new Map<string, string>();
  private readonly stores: Array<{ name: string; reachable: () => boolean }> = [];
  private readonly datapaths: string[] = [];
  /** Stops telling this node's Events of a full store. */
  private readonly unwatchFull: () => void;

  constructor(private readonly o: KubeReportingOptions) {
    const { source, nodeName, logger } = o;
    this.events = new EventRecorder({
      kc: source.kc, nodeName, logger, ...o.events,
      uidOf: (ref) => (ref.kind === 'TetherNode' && ref.name === nodeName ? this.nodeStatus.uid : uidOf(source, ref)),
    });
    this.nodeStatus = new NodeStatusWriter({
      kc: source.kc, nodeName, version: o.version, logger, heartbeatMs: o.heartbeatMs, checkEveryMs: o.checkEveryMs,
      conditions: () => nodeConditions(this.facts()),
      nodeUid: () => source.cachedObjects('nodes').find((n) => n.metadata?.name === nodeName)?.metadata?.uid,
    });
    // A write refused by a full store: a Warning on this node's TetherNode, once per episode.
    this.unwatchFull = storeFullness.onFull((n) => this.events.emit(storeFullEvent(nodeName, n)));
  }

  /** For the egress controller: an Event on the Egress for every ownership change this node decides. */
  readonly onOwnershipChanged = (c: OwnershipChange): void => this.events.emit(ownershipEvent(c));

  /** For the egress controller: an Event on the Egress when this node's standby cannot sync with the owner, and when it can again. */
  readonly onStandbySyncChanged = (c: StandbySyncChange): void => this.events.emit(standbySyncEvent(c));

  /** For the health checks: an Event on the Service when this node's answer flips. */
  readonly onHealthFlip = (f: Parameters<typeof healthFlipEvent>[0]): void => this.events.emit(healthFlipEvent(f, this.o.nodeName));

  /** For the load balancer: an Event on the Service when this node cannot forward a VIP its LB pods select. */
  readonly onNotForwarded = (n: Parameters<typeof notForwardedEvent>[0]): void => this.events.emit(notForwardedEvent(n));

  /** For the leader's status controller: refusals and address conflicts. */
  readonly emit = (e: TetherEvent): void => this.events.emit(e);

  /** A subsystem with a datapath (its pod roles' programs count for DatapathAttached). */
  servesDatapath(name: string): void {
    this.datapaths.push(name);
  }

  /** A subsystem that talks to the cluster store, and whether it answers it now (StoreReachable). */
  watchStore(name: string, reachable: () => boolean): void {
    this.stores.push({ name, reachable });
  }

  /** The reconcilers, each apply's outcome remembered (Ready is False while one's last apply failed). */
  track<D>(reconcilers: Array<Reconciler<D>>): Array<Reconciler<D>> {
    return reconcilers.map((r) => ({
      name: r.name,
      apply: async (d: D) => {
        try {
          await r.apply(d);
          if (this.failures.delete(r.name)) this.nodeStatus.changed();
        } catch (e) {
          this.failures.set(r.name, (e as Error).message);
          this.nodeStatus.changed();
          throw e;
        }
      },
    }));
  }

  private facts(): NodeFacts {
    return {
      version: this.o.version, started: this.started, stopped: this.stopped, reconcileFailures: this.failures,
      notFollowed: this.o.source.stats().filter((s) => s.problem).map((s) => s.resource),
      roleProblems: this.o.roleProblems(), bpfPinDir: this.o.bpfPinDir, datapaths: this.datapaths,
      storeConfigured: this.o.storeConfigured, store: this.stores.map((s) => ({ name: s.name, reachable: s.reachable() })),
    };
  }

  /** The node status starts at once (Ready False, Starting); Events are recorded from construction on. */
  start(): Promise<void> {
    this.nodeStatus.start();
    return Promise.resolve();
  }

  /** Every part is up: Ready. */
  markStarted(): void {
    this.started = true;
    this.nodeStatus.changed();
  }

  apply(): void {}

  /** Ready False (Stopped) written once more, and the Events still queued sent, each within a short deadline. */
  async stop(): Promise<void> {
    if (this.stopped) return;
    this.stopped = true;
    this.unwatchFull();
    await this.nodeStatus.stop(nodeConditions(this.facts()));
    await this.events.stop();
  }

  status(): Record<string, unknown> {
    return { kubernetesReporting: { events: { ...this.events.stats }, nodeStatus: { ...this.nodeStatus.stats } } };
  }
}

export function uidOf(source: KubeSource, ref: EventObject): string | undefined {
  const resource = RESOURCE_OF[ref.kind];
  if (!resource) return undefined;
  return source.cachedObjects(resource).find((o) => o.metadata?.name === ref.name && (o.metadata?.namespace ?? undefined) === ref.namespace)?.metadata?.uid;
}

/** The subsystems whose datapath and store use the node status reports, once they exist. */
export function observeSubsystems(
  r: KubeReporting,
  s: { egress?: { storeReachable(): boolean }; lb?: { store?: { connection: { connected: boolean } } } },
): void {
  if (s.egress) {
    const egress = s.egress;
    r.servesDatapath('egress');
    r.watchStore('egress controller', () => egress.storeReachable());
  }
  if (s.lb) {
    r.servesDatapath('load balancer');
    const store = s.lb.store;
    if (store) r.watchStore('load balancer', () => store.connection.connected);
  }
}
