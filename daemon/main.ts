// tetherd: the node daemon. One per node; several can run side by side (the testbed), each with its own
// socket, state dir and bpffs pin dir. Pods it attached are recorded in the state dir and survive restarts.
// This file only wires the parts (daemon/parts/) together: nodeParts() is the list of a node's parts in
// start order, each a Part (lifecycle.ts: name, start, stop, stop budget), started by one Lifecycle.start,
// so a stop (or a failed start) undoes them in reverse order before the logger ends. Every subsystem is
// such a part with desired state (parts/subsystem.ts): each configuration from the config source is
// resolved once into every subsystem's desired state and applied. The scale simulation builds its nodes
// with the same nodeParts(), leaving out what it has no use for.
import * as path from 'node:path';
import { makeLogger, setLogger, type Logger } from '../lib/log';
import { runParts, StartError, stopOnly, type Part } from './lifecycle';
import { LoopLag } from './util/loop-lag';
import type { Reconciler } from './config/source';
import { KubeSource } from './config/kube-source';
import { EgressObjects } from './egress/egress-config';
import type { EgressController } from './egress/egress-controller';
import type { LbController } from './lb/lb-controller';
import type { PodStore } from './state/pod-store';
import type { AttachService } from './pod/attach-service';
import { nodeDeleteQueue } from './pod/delete-queue';
import { checkRedisOption, flowsOption, metricsAddressOption, nodeAddress6Option, nodeNameOf, parseOptions, portOption, USAGE, type Options } from './options';
import { setRegisteredAddress6 } from './common/node-registry';
import { configFeed, CurrentConfig, SourcePart } from './parts/source';
import { clusterStore, Ipam, openPodState, withStorePassword } from './parts/ipam';
import { createEgress, Egress, ownershipStore, planEgress } from './parts/egress';
import { Probes, socketApi } from './parts/api';
import { ensureBpffs, setBpffsMode } from './bpf/bpffs';
import { createLb, Health, LoadBalancer, mappingStore, planLb } from './parts/lb';
import { metricsServer } from './parts/metrics';
import { TetherMetrics } from './metrics/tether-metrics';
import { fed, resolveDesired, type DesiredState, type Subsystem } from './parts/subsystem';
import { VERSION } from '../lib/version';
import { KubeReporting, observeSubsystems } from './parts/kube-reporting';
import { useSysctlJournal } from './sys/sysctl-journal';

export async function main(argv: string[]): Promise<number> {
  let opts: Options;
  try {
    opts = parseOptions(argv);
  } catch (e) {
    process.stderr.write(`tetherd: ${(e as Error).message}\n${USAGE}\n`);
    return 2;
  }
  if (opts.help) {
    process.stdout.write(USAGE + '\n');
    return 0;
  }
  process.umask(0o077);
  const nodeName = nodeNameOf(opts);
  const logger = makeLogger({ level: opts['log-level'], node: nodeName });
  setLogger(logger);
  return runParts('tetherd', logger, nodeParts(opts, { nodeName, logger }));
}

/** What a node leaves out: the scale simulation runs many in one process, with no kernel, CNI clients, kubelet or Prometheus. */
export interface Without {
  /** The host's bpffs (checked, and its mode set) and the sysctl journal in the state dir. */
  host?: boolean;
  /** The socket API, the delete queue the CNI clients fill, and the event loop monitor its status reads. */
  cni?: boolean;
  /** Prometheus metrics. */
  metrics?: boolean;
  /** Kubernetes Events and the node's TetherNode (kube mode). */
  reporting?: boolean;
}

/** A node's parts once started, for those who drive it from outside (the scale simulation). */
export interface StartedNode {
  podStore: PodStore;
  attach: AttachService;
  ipam: Ipam;
  egress?: EgressController;
  lb?: LbController;
}

/**
 * A node's parts, yielded in start order: each one is started (and its stop registered) by
 * Lifecycle.start before the next is built, so a part is built from what started before it.
 *
 * Start order, and why:
 *   config source      its first configuration is what every part starts from
 *   cluster store      IPAM's (connected lazily: tetherd starts without it)
 *   probes             kubelet sees a starting tetherd (/readyz "starting") rather than a refused port
 *   kubernetes events and node status   the TetherNode says Ready False, Starting, from here on
 *   ipam               pod blocks and allocations, before anything allocates or releases
 *   delete queue       the DELs queued while tetherd was away are replayed before roles start and the socket serves
 *   ownership store, lb mapping store   the egress and LB controllers' connections, opened before they are built
 *   event loop monitor, metrics         served while the rest starts (a metrics port in use is retried, not fatal)
 *   egress, load balancer   only their stops are registered here: they stop after the socket (a CNI ADD under
 *                      way still finds its roles), and also when a later start fails, so what they set up is
 *                      undone; egress's stop is bounded by its own budget, counted from the stop's start
 *   socket API         serves from here
 *   (egress starts; the LB applies the first desired state, then starts)
 *   health checks      once the LB runs; they join the subsystems' status once started
 *   config updates     every accepted change (and the one held since the source started), to each subsystem
 * Stop order, the reverse: config updates, health checks, socket API (requests under way, a CNI
 * ADD, are answered and written before anything they use goes away; the runtime retries what arrives after),
 * load balancer, egress, metrics, event loop monitor, lb mapping store, ownership store, delete queue, ipam,
 * kubernetes events and node status, probes, cluster store, config source.
 */
export async function* nodeParts(opts: Options, o: { nodeName: string; logger: Logger; without?: Without }): AsyncGenerator<Part, StartedNode, void> {
  const { nodeName, logger } = o;
  const without = o.without ?? {};
  try {
    if (!without.host) {
      setBpffsMode(opts.bpffs);
      // In a container the host's bpffs must already be there: say so before anything starts.
      if (opts.bpffs === 'host') ensureBpffs(opts['bpf-pin-dir']);
    }
  } catch (e) {
    throw new StartError(2, (e as Error).message);
  }
  // The cluster's controllers run in tether-operator: an older manifest may still pass this.
  if (opts['controller-candidates'] !== undefined) logger.warn('--controller-candidates is ignored: the cluster\'s controllers run in tether-operator, not on the nodes', { given: opts['controller-candidates'] });
  const src = new SourcePart(opts, nodeName, logger);
  yield src;
  const { source, config } = src;
  const current = new CurrentConfig(config, nodeName);
  const fouPort = portOption('fou-port', opts['fou-port']);
  const syncPort = portOption('sync-port', opts['sync-port']);
  const maxFlows = flowsOption(opts['egress-flows']);
  const metricsAddress = metricsAddressOption(opts['metrics-bind-address']);
  checkRedisOption(opts);
  // Registered beside the node address by every registry writer of this tetherd (egress's, the LB's).
  if (opts['node-address']) setRegisteredAddress6(nodeAddress6Option(opts));
  opts = await withStorePassword(opts, source, logger);
  const egressObjects = new EgressObjects(logger);
  const egressPlan = await planEgress(opts, source, config, egressObjects, logger);
  // The resolve step: each configuration into every subsystem's desired state, once.
  const resolve = (c: typeof config): DesiredState => resolveDesired(c, { nodeName, egressObjects });

  const store = clusterStore(opts, logger);
  if (store) yield store;
  const stateDir = opts['state-dir'];
  // The node sysctls tetherd changes are journalled here before each change, for uninstall to restore.
  if (!without.host) useSysctlJournal(path.join(stateDir, 'sysctl-journal.json'));
  const { podStore, attach, loaded } = openPodState(stateDir, logger);
  const probes = new Probes(opts, attach, logger);
  if (probes.serves) yield probes;
  // Kubernetes Events and this node's TetherNode (with a config file there is no API: none of it).
  const reporting = source instanceof KubeSource && !without.reporting
    ? new KubeReporting({ source, nodeName, version: VERSION, storeConfigured: !!opts.redis, bpfPinDir: opts['bpf-pin-dir'], roleProblems: () => attach.roleProblems.list(), logger })
    : undefined;
  if (reporting) yield reporting;
  const ipam = new Ipam({ nodeName, config, source, store: store?.store, stateDir, logger });
  yield ipam;
  if (!without.cni) yield nodeDeleteQueue({ stateDir, attach, ipam: ipam.service, logger });
  let egressController: EgressController | undefined;
  if (egressPlan) {
    const ownership = ownershipStore(opts);
    yield ownership;
    egressController = createEgress(opts, egressPlan, {
      nodeName, config, fouPort, syncPort, maxFlows, addresses: ipam.addresses, attach, logger, ownership: ownership.value,
      onOwnershipChanged: reporting?.onOwnershipChanged, onStandbySyncChanged: reporting?.onStandbySyncChanged,
    });
  }
  const egress = new Egress(egressController, logger);
  const lbPlan = planLb(opts, config);
  let lbController: LbController | undefined;
  if (lbPlan) {
    const mappings = mappingStore(opts, lbPlan);
    yield mappings;
    lbController = createLb(opts, lbPlan, { fouPort, addresses: ipam.addresses, attach, nodeName, store: mappings.value, logger, onNotForwarded: reporting?.onNotForwarded });
  }
  const lb = new LoadBalancer(lbController, logger);
  if (reporting) observeSubsystems(reporting, { egress: egressController, lb: lbController });
  if (egressController) probes.egressSync(() => egressController.standbyProblems());
  // The main event loop's worst delay since start (status): what a busy tetherd does to its timers.
  const loopLag = new LoopLag();
  if (!without.cni) yield loopLag;

  // Prometheus metrics; CNI requests counted from the first.
  let health: Health | undefined;
  const metrics = without.metrics ? undefined : new TetherMetrics(logger);
  // In status order; the health checks join once they start.
  const subsystems: Array<Subsystem<never>> = [ipam, egress, lb];
  if (metrics) {
    const server = metricsServer({ address: metricsAddress, metrics, parts: {
      ipam, egress: egressController, lb: lbController, health: () => health?.checks, store: store?.store,
      kube: source instanceof KubeSource ? { apiCalls: source.apiCalls, events: reporting?.events } : undefined,
      roleProblems: () => attach.roleProblems.list(),
    }, logger });
    yield server;
    subsystems.push(server);
  }
  if (reporting) subsystems.push(reporting);

  if (egressController) yield stopOnly(egress);
  if (lbController) yield stopOnly(lb);
  if (!without.cni) {
    yield socketApi({
      socket: opts.socket, nodeName, stateDir, bpfPinDir: opts['bpf-pin-dir'], current, podStore, attach, ipam, subsystems, loopLag, logger,
      kubernetes: source instanceof KubeSource ? () => ({ problems: source.problems(), resources: source.stats() }) : undefined,
      cniAnswered: metrics && ((plugin, command, seconds, code) => metrics.cniAnswered(plugin, command, seconds, code)),
    });
  }
  if (egressController) {
    try {
      await egress.start();
    } catch (err) {
      throw new StartError(1, `egress controller failed to start: ${(err as Error).message}`, { cause: err });
    }
  }
  const desired = resolve(config);
  if (lbController) {
    try {
      await lb.apply(desired.lb);
      await lb.start();
    } catch (err) {
      throw new StartError(1, `load balancer failed to start: ${(err as Error).message}`, { cause: err });
    }
    health = new Health(opts, { lb: lbController, nodeName, eligible: desired.health.eligible, logger, onFlip: reporting?.onHealthFlip });
    yield health;
    subsystems.push(health);
  }
  // Eligibility first: it is cheap and never held up by the others' passes.
  const reconcilers = [
    { name: current.name, apply: (d) => current.apply(d.config) },
    ...(health ? [fed(health, (d) => d.health)] : []),
    fed(ipam, (d) => d.ipam),
    fed(egress, (d) => d.egress),
    fed(lb, (d) => d.lb),
  ] satisfies Array<Reconciler<DesiredState>>;
  yield configFeed(src, resolve, reporting?.track(reconcilers) ?? reconcilers, logger);
  probes.markStarted();
  reporting?.markStarted();
  logger.info('tetherd started', { version: VERSION, socket: opts.socket, stateDir, bpfPinDir: opts['bpf-pin-dir'], podsRecorded: loaded });
  return { podStore, attach, ipam, egress: egressController, lb: lbController };
}
