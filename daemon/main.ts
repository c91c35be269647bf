// tetherd: the node daemon. One per node; several can run side by side (the testbed), each with its own
// socket, state dir and bpffs pin dir. Pods it attached are recorded in the state dir and survive restarts.
// This file only wires the parts (daemon/parts/) together: every subsystem has one shape (start / apply
// typed desired state / stop / status, parts/subsystem.ts), each configuration from the config source is
// resolved once into every subsystem's desired state and applied, and every part that starts registers
// its stop, so a stop (or a failed start) undoes them in reverse order before the logger ends.
import * as path from 'node:path';
import { makeLogger, setLogger, type Logger } from '../lib/log';
import { endLogger, Lifecycle, StartError, stopSignal } from './lifecycle';
import { LoopLag } from './util/loop-lag';
import { feedResolved, type Reconciler } from './config/source';
import { KubeSource } from './config/kube-source';
import { EgressObjects } from './egress/egress-config';
import { parseCandidates } from './kube/controllers';
import { checkRedisOption, flowsOption, metricsAddressOption, nodeNameOf, parseOptions, portOption, USAGE, type Options } from './options';
import { CurrentConfig, startSource } from './parts/source';
import { openPodState, startIpam, startStore, withStorePassword } from './parts/ipam';
import { startDeleteQueue } from './pod/delete-queue';
import { createEgress, Egress, planEgress } from './parts/egress';
import { apiServer, startProbes } from './parts/api';
import { ensureBpffs, setBpffsMode } from './bpf/bpffs';
import { createLb, Health, LoadBalancer } from './parts/lb';
import { Controllers } from './parts/controllers';
import { startMetrics } from './parts/metrics';
import { TetherMetrics } from './metrics/tether-metrics';
import { fed, resolveDesired, type DesiredState, type Subsystem } from './parts/subsystem';
import { VERSION } from '../lib/version';
import { observeSubsystems, startReporting } from './parts/kube-reporting';
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
  const stop = stopSignal();
  const life = new Lifecycle(logger);
  let code = 0;
  try {
    await start(opts, nodeName, logger, life);
    const signal = await stop.signal;
    logger.info('tetherd stopping', { signal });
    await life.stopAll();
    logger.info('tetherd stopped', { signal });
  } catch (e) {
    code = e instanceof StartError ? e.exitCode : 1;
    logger.error('tetherd: start failed', { error: (e as Error).message, ...(e instanceof StartError ? {} : { stack: (e as Error).stack }) });
    await life.stopAll();
  } finally {
    stop.dispose();
  }
  await endLogger(logger);
  return code;
}

/** Starts every part in order, registering each one's stop with `life` as soon as it runs. */
async function start(opts: Options, nodeName: string, logger: Logger, life: Lifecycle): Promise<void> {
  try {
    setBpffsMode(opts.bpffs);
    // In a container the host's bpffs must already be there: say so before anything starts.
    if (opts.bpffs === 'host') ensureBpffs(opts['bpf-pin-dir']);
    parseCandidates(opts['controller-candidates']);
  } catch (e) {
    throw new StartError(2, (e as Error).message);
  }
  const { source, config, takeMissed } = await startSource(opts, nodeName, logger, life);
  const current = new CurrentConfig(config, nodeName);
  const fouPort = portOption('fou-port', opts['fou-port']);
  const syncPort = portOption('sync-port', opts['sync-port']);
  const maxFlows = flowsOption(opts['egress-flows']);
  const metricsAddress = metricsAddressOption(opts['metrics-bind-address']);
  checkRedisOption(opts);
  opts = await withStorePassword(opts, source, logger);
  const egressObjects = new EgressObjects(logger);
  const egressPlan = await planEgress(opts, source, config, egressObjects);
  // The resolve step: each configuration into every subsystem's desired state, once.
  const resolve = (c: typeof config): DesiredState => resolveDesired(c, { nodeName, egressObjects });

  const store = await startStore(opts, logger, life);
  const stateDir = opts['state-dir'];
  // The node sysctls tetherd changes are journalled here before each change, for uninstall to restore.
  useSysctlJournal(path.join(stateDir, 'sysctl-journal.json'));
  const { podStore, attach, loaded } = openPodState(stateDir, logger);
  const probes = await startProbes(opts, attach, logger, (name, close) => life.started(name, close));
  // Kubernetes Events and this node's TetherNode (with a config file there is no API: none of it).
  const reporting = source instanceof KubeSource ? startReporting(opts, { source, nodeName, version: VERSION, roleProblems: () => attach.roleProblems.list(), logger }, life) : undefined;
  const ipam = await startIpam({ nodeName, config, source, store, stateDir, logger }, life);
  // DELs the CNI clients queued while tetherd was away are replayed before roles start and the socket serves.
  await startDeleteQueue({ stateDir, attach, ipam: ipam.service, logger }, life);
  const egress = new Egress(
    egressPlan
      ? await createEgress(opts, egressPlan, { nodeName, config, fouPort, syncPort, maxFlows, addresses: ipam.addresses, attach, logger, onOwnershipChanged: reporting?.onOwnershipChanged, onStandbySyncChanged: reporting?.onStandbySyncChanged }, (close) => life.started('ownership store', close))
      : undefined,
    logger,
  );
  const lb = new LoadBalancer(await createLb(opts, { config, fouPort, addresses: ipam.addresses, attach, nodeName, logger }, (close) => life.started('lb mapping store', close)), logger);
  if (reporting) observeSubsystems(reporting, { egress: egress.controller, lb: lb.controller });
  const egressController = egress.controller;
  if (egressController) probes.egressSync(() => egressController.standbyProblems());
  // The main event loop's worst delay since start (status): what a busy tetherd does to its timers.
  const loopLag = new LoopLag();
  life.started('event loop monitor', () => loopLag.stop());

  // Prometheus metrics: served while the rest starts (a port in use is retried, not fatal); CNI requests counted from the first.
  let health: Health | undefined;
  const metrics = new TetherMetrics(logger);
  const metricsServer = await startMetrics(
    { address: metricsAddress, metrics, parts: { ipam, egress: egress.controller, lb: lb.controller, health: () => health?.checks, store }, logger },
    (close) => life.started('metrics', close),
  );

  // In status order; the health checks join once they start.
  const subsystems: Array<Subsystem<never>> = [ipam, egress, lb, metricsServer, ...(reporting ? [reporting] : [])];
  const server = apiServer({
    socket: opts.socket, nodeName, stateDir, bpfPinDir: opts['bpf-pin-dir'], current, podStore, attach, ipam, subsystems, loopLag, logger,
    kubernetes: source instanceof KubeSource ? () => ({ problems: source.problems(), resources: source.stats() }) : undefined,
    cniAnswered: (plugin, command, seconds, code) => metrics.cniAnswered(plugin, command, seconds, code),
  });
  // Egress stops after the socket (a CNI ADD under way still finds its roles), and also when its own start
  // fails half-way, so whatever it set up is undone.
  // Its stop may keep an address while no standby is in sync (HANDOVER_WAIT_MS): bounded by its own budget.
  if (egress.controller) life.started('egress', () => egress.stop(life.stoppingSince), egress.controller.stopBudgetMs);
  if (lb.controller) life.started('load balancer', () => lb.stop(), 15_000);
  try {
    await server.listen();
  } catch (e) {
    throw new StartError(1, `cannot serve socket ${opts.socket}: ${(e as Error).message}`);
  }
  // The socket stops first: requests under way (a CNI ADD) are answered and written before anything
  // they use goes away; the runtime retries what arrives after.
  life.started('socket API', () => server.close());
  if (egress.controller) {
    try {
      await egress.start();
    } catch (err) {
      throw new StartError(1, `egress controller failed to start: ${(err as Error).message}`, { cause: err });
    }
  }
  const desired = resolve(config);
  if (lb.controller) {
    try {
      await lb.apply(desired.lb);
      await lb.start();
    } catch (err) {
      throw new StartError(1, `load balancer failed to start: ${(err as Error).message}`, { cause: err });
    }
    health = new Health(opts, { lb: lb.controller, nodeName, eligible: desired.health.eligible, logger, onFlip: reporting?.onHealthFlip });
    await health.start();
    subsystems.push(health);
    life.started('health checks', () => health!.stop());
  }
  const controllers = source instanceof KubeSource
    ? new Controllers({ source, nodeName, egress: egress.controller, egressObjects, lb: lb.controller, candidates: opts['controller-candidates'], labels: source.nodeLabels(), logger, events: reporting?.emit })
    : undefined;
  // Every accepted configuration change, resolved once, reaches each subsystem, which converges to it.
  // Eligibility and candidacy first: they are cheap and were never held up by the others' passes.
  const reconcilers = [
    { name: current.name, apply: (d) => current.apply(d.config) },
    ...(health ? [fed(health, (d) => d.health)] : []),
    ...(controllers ? [fed(controllers, (d) => d.controllers)] : []),
    fed(ipam, (d) => d.ipam),
    fed(egress, (d) => d.egress),
    fed(lb, (d) => d.lb),
  ] satisfies Array<Reconciler<DesiredState>>;
  const feed = feedResolved(source, resolve, reporting?.track(reconcilers) ?? reconcilers, logger, takeMissed);
  life.started('config updates', () => feed.stop());
  if (controllers) {
    await controllers.start();
    life.started('controllers', () => controllers.stop());
  }
  probes.markStarted();
  reporting?.markStarted();
  logger.info('tetherd started', { version: VERSION, socket: opts.socket, stateDir, bpfPinDir: opts['bpf-pin-dir'], podsRecorded: loaded });
}
