// tetherd: the node daemon. One per node; several can run side by side (the testbed), each with its own
// socket, state dir and bpffs pin dir. Pods it attached are recorded in the state dir and survive restarts.
// This file only wires the parts (daemon/parts/) together: the config source feeds each subsystem's
// reconciler, and every part that starts registers its stop, so a stop (or a failed start) undoes them in
// reverse order before the logger ends.
import * as path from 'node:path';
import { makeLogger, setLogger, type Logger } from './log';
import { endLogger, Lifecycle, StartError, stopSignal } from './lifecycle';
import { LoopLag } from './util/loop-lag';
import { feedReconcilers } from './config/source';
import { KubeSource } from './config/kube-source';
import { EgressObjects } from './egress/egress-config';
import { parseCandidates, startControllers } from './kube/controllers';
import { checkRedisOption, flowsOption, nodeNameOf, parseOptions, portOption, USAGE, type Options } from './options';
import { CurrentConfig, startSource } from './parts/source';
import { openPodState, startIpam, startStore } from './parts/ipam';
import { startDeleteQueue } from './pod/delete-queue';
import { createEgress, egressReconciler, planEgress } from './parts/egress';
import { apiServer, startProbes } from './parts/api';
import { ensureBpffs, setBpffsMode } from './bpf/bpffs';
import { createHealth, createLb, lbReconciler } from './parts/lb';
import { resolveLoadBalancers } from './lb/lb-spec';
import { VERSION } from '../cni/about';
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
  const { source, config } = await startSource(opts, nodeName, logger, life);
  const current = new CurrentConfig(config, nodeName);
  const fouPort = portOption('fou-port', opts['fou-port']);
  const syncPort = portOption('sync-port', opts['sync-port']);
  const maxFlows = flowsOption(opts['egress-flows']);
  checkRedisOption(opts);
  const egressObjects = new EgressObjects(logger);
  const egressPlan = await planEgress(opts, source, config, egressObjects);

  const store = await startStore(opts, logger, life);
  const stateDir = opts['state-dir'];
  // The node sysctls tetherd changes are journalled here before each change, for uninstall to restore.
  useSysctlJournal(path.join(stateDir, 'sysctl-journal.json'));
  const { podStore, attach, loaded } = openPodState(stateDir, logger);
  const probes = await startProbes(opts, attach, logger, (name, close) => life.started(name, close));
  const ipam = await startIpam({ nodeName, config, source, store, stateDir, logger }, life);
  // DELs the CNI clients queued while tetherd was away are replayed before roles start and the socket serves.
  await startDeleteQueue({ stateDir, attach, ipam: ipam.service, logger }, life);
  const egress = egressPlan
    ? await createEgress(opts, egressPlan, { nodeName, config, fouPort, syncPort, maxFlows, addresses: ipam.addresses, attach, logger }, (close) => life.started('ownership store', close))
    : undefined;
  const lb = await createLb(opts, { config, fouPort, addresses: ipam.addresses, attach, nodeName, logger }, (close) => life.started('lb mapping store', close));
  // The main event loop's worst delay since start (status): what a busy tetherd does to its timers.
  const loopLag = new LoopLag();
  life.started('event loop monitor', () => loopLag.stop());

  let healthStatus: (() => Record<string, unknown>) | undefined;
  const server = apiServer({
    socket: opts.socket, nodeName, stateDir, bpfPinDir: opts['bpf-pin-dir'], current, podStore, attach, ipam, egress, lb, health: () => healthStatus?.(), loopLag, logger,
    kubernetes: source instanceof KubeSource ? () => ({ problems: source.problems(), resources: source.stats() }) : undefined,
  });
  // Egress stops after the socket (a CNI ADD under way still finds its roles), and also when its own start
  // fails half-way, so whatever it set up is undone.
  if (egress) life.started('egress', () => egress.stop(), 15_000);
  if (lb) life.started('load balancer', () => lb.stop(), 15_000);
  try {
    await server.listen();
  } catch (e) {
    throw new StartError(1, `cannot serve socket ${opts.socket}: ${(e as Error).message}`);
  }
  // The socket stops first: requests under way (a CNI ADD) are answered and written before anything
  // they use goes away; the runtime retries what arrives after.
  life.started('socket API', () => server.close());
  if (egress) {
    try {
      await egress.start();
    } catch (err) {
      throw new StartError(1, `egress controller failed to start: ${(err as Error).message}`, { cause: err });
    }
  }
  if (lb) {
    try {
      await lb.apply(resolveLoadBalancers(config.others, config.pools), config.pods);
      await lb.start();
    } catch (err) {
      throw new StartError(1, `load balancer failed to start: ${(err as Error).message}`, { cause: err });
    }
    const health = createHealth(opts, { lb, nodeName, eligible: () => current.node.eligible !== false, logger });
    await health.start();
    healthStatus = () => health.status();
    life.started('health checks', () => health.stop());
  }
  // Every accepted configuration change reaches each subsystem, which converges to it.
  const feed = feedReconcilers(source, [current, ipam.reconciler, egressReconciler(egressObjects, egress, logger), lbReconciler(lb, logger)], logger);
  life.started('config updates', () => feed.stop());
  if (source instanceof KubeSource) startControllers(source, nodeName, egress, egressObjects, logger, life, lb, opts['controller-candidates']);
  probes.markStarted();
  logger.info('tetherd started', { version: VERSION, socket: opts.socket, stateDir, bpfPinDir: opts['bpf-pin-dir'], podsRecorded: loaded });
}
