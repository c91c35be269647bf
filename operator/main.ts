// tether-operator: the cluster's controllers, in their own Deployment (2 replicas, one leading through the
// Lease tether-operator) with their own ServiceAccount; the nodes' tetherd keeps only its node's work.
// This file wires the parts (operatorParts, started in order by one Lifecycle like tetherd's nodeParts):
//   config source      the Kubernetes API: AddressPools, Egresses, tether Services (the watches the status pass reads)
//   cluster Secrets    the cluster key and the store's password, created when absent (tetherd only reads them)
//   cluster store      the VIPs' allocations; the ownership records; the LB's store (nodes' health reports)
//   probes             /livez, /readyz (ready once every part started)
//   metrics            /metrics on --metrics-bind-address (tetherd's metrics part): leadership, failed API
//                      requests, dropped Events, store reachability, the leader's status passes
//   events             the cluster's Events (refusals, address conflicts), reported as tether-operator
//   config updates     every accepted change, resolved once, into what the status pass reads
//   leader election    the Lease; while leading, the controllers (controllers.ts)
// Stopped in reverse: the leader stops its work and releases the Lease first.
import { makeLogger, setLogger, type Logger } from '../lib/log';
import { VERSION } from '../lib/version';
import { runParts, StartError, Connection, type Part } from '../daemon/lifecycle';
import { KubeSource } from '../daemon/config/kube-source';
import type { ConfigObjects } from '../daemon/config/objects';
import { checkRedisOption, metricsAddressOption, portOption } from '../daemon/options';
import { configFeed, SourcePart } from '../daemon/parts/source';
import { clusterStore, withStorePassword } from '../daemon/parts/ipam';
import { ownershipStore } from '../daemon/parts/egress';
import { uidOf } from '../daemon/parts/kube-reporting';
import { ensureClusterSecret } from '../daemon/kube/cluster-key';
import { EventRecorder } from '../daemon/kube/event-recorder';
import { ProbeServer } from '../daemon/health/probe-server';
import { HealthReports } from '../daemon/health/health-reports';
import { EgressObjects } from '../daemon/egress/egress-config';
import { connectLbStore } from '../daemon/lb/lb-store';
import { metricsServer, type MetricsServer, type MetricsParts } from '../daemon/parts/metrics';
import { TetherMetrics } from '../daemon/metrics/tether-metrics';
import { ClusterAddresses } from '../ipam/cluster-addresses';
import { EgressView, LbView } from './cluster-view';
import { clusterControllers, LeaderRole, OPERATOR_LEASE, resolveCluster, type ClusterDesired } from './controllers';
import { identityOf, parseOperatorOptions, USAGE, type OperatorOptions } from './options';

export const OPERATOR_CONTROLLER = 'tether.dev/tether-operator';

export async function main(argv: string[]): Promise<number> {
  let opts: OperatorOptions;
  try {
    opts = parseOperatorOptions(argv);
  } catch (e) {
    process.stderr.write(`tether-operator: ${(e as Error).message}\n${USAGE}\n`);
    return 2;
  }
  if (opts.help) {
    process.stdout.write(USAGE + '\n');
    return 0;
  }
  const identity = identityOf(opts);
  const logger = makeLogger({ level: opts['log-level'], node: identity });
  setLogger(logger);
  return runParts('tether-operator', logger, operatorParts(opts, { identity, logger }));
}

/** The operator once started, for tests and the scale simulation. */
export interface StartedOperator {
  leader: LeaderRole;
  controllers: ReturnType<typeof clusterControllers>;
  /** Its metrics listener, when --metrics-bind-address is given. */
  metrics?: MetricsServer;
}

/** The operator's parts, in start order (see the head of this file); timing options for tests. */
export async function* operatorParts(
  opts: OperatorOptions,
  o: { identity: string; logger: Logger; everyMs?: number; gcEveryMs?: number; retryMs?: number },
): AsyncGenerator<Part, StartedOperator, void> {
  const { identity, logger } = o;
  checkRedisOption(opts);
  let probePort: number | undefined;
  try {
    if (opts['probe-port'] !== '0') probePort = portOption('probe-port', opts['probe-port']);
  } catch (e) {
    throw new StartError(2, (e as Error).message);
  }
  const metricsAddress = metricsAddressOption(opts['metrics-bind-address']);
  const namespace = process.env.POD_NAMESPACE || 'tether-system';
  // Its configuration: the Kubernetes API only (no node of its own: the Node and Pod watches find nothing).
  const src = new SourcePart(opts, identity, logger);
  yield src;
  const source = src.source as KubeSource;
  const first: ConfigObjects = src.config;

  if (opts['cluster-key-secret']) {
    const name = opts['cluster-key-secret'];
    yield {
      name: 'cluster key Secret',
      start: async () => {
        try {
          await ensureClusterSecret(source.kc, namespace, name, 'clusterKey');
        } catch (e) {
          throw new StartError(1, `--cluster-key-secret: Secret ${namespace}/${name}: ${(e as Error).message}`);
        }
      },
      stop: () => {},
    };
  }
  opts = await withStorePassword(opts, source, logger, (kc, ns, name) => ensureClusterSecret(kc, ns, name, 'redisPassword'));

  let egressView: EgressView | undefined;
  let lbView: LbView | undefined;
  let healthReports: HealthReports | undefined;
  // What the metrics read; the leader election and the controllers join once made (below).
  const measured: MetricsParts = { kube: { apiCalls: source.apiCalls } };
  const store = clusterStore(opts, logger);
  if (store) {
    yield store;
    const addresses = new ClusterAddresses(first.pools, store.store, logger);
    const ownership = ownershipStore(opts);
    yield ownership;
    const url = opts.redis!;
    const lbStore = new Connection('lb store', () => connectLbStore(url, { keyPrefix: opts['redis-prefix'] }));
    yield lbStore;
    measured.store = store.store;
    measured.storeConnections = { lb: lbStore.value.connection };
    egressView = new EgressView({ ownership: ownership.value, addresses, logger });
    lbView = new LbView({ identity, addresses, store: lbStore.value, logger });
    healthReports = new HealthReports(lbStore.value.connection);
  } else {
    logger.warn('no --redis: Egress addresses, VIPs and health checks are not in the status the operator writes');
  }

  let started = false;
  if (probePort !== undefined) {
    const probes = new ProbeServer({ what: 'tether-operator', started: () => started, roleProblems: () => [] });
    const port = probePort;
    yield { name: 'probes', start: async () => void (await probes.listen(port, opts['probe-address'])), stop: () => probes.close() };
  }

  // Served while the rest starts (a port in use is retried, not fatal).
  let metrics: MetricsServer | undefined;
  if (metricsAddress) {
    metrics = metricsServer({ address: metricsAddress, metrics: new TetherMetrics(logger), parts: measured, logger });
    yield metrics;
  }

  const events = new EventRecorder({ kc: source.kc, nodeName: identity, controller: OPERATOR_CONTROLLER, logger, uidOf: (ref) => uidOf(source, ref) });
  yield { name: 'events', start: () => {}, stop: () => events.stop() };
  measured.kube!.events = events;

  // Each configuration resolved once, as it comes (the Egresses' refusals kept for status).
  const egressObjects = new EgressObjects(logger);
  let desired = resolveCluster(first, egressObjects);
  yield configFeed(src, (c) => resolveCluster(c, egressObjects), [{ name: 'cluster configuration', apply: (d: ClusterDesired) => void (desired = d) }], logger);

  const controllers = clusterControllers({
    source, desired: () => desired, egressObjects, egressView, lbView, healthReports, logger, events: (e) => events.emit(e), everyMs: o.everyMs, gcEveryMs: o.gcEveryMs,
  });
  const leader = new LeaderRole({
    election: { kc: source.kc, namespace, name: OPERATOR_LEASE, identity, logger, leaseDurationSeconds: Number(opts['lease-duration']), retryMs: o.retryMs },
    work: controllers,
  });
  measured.kube!.elections = () => [leader];
  measured.statusPasses = () => controllers.status.passes;
  yield leader;
  started = true;
  logger.info('tether-operator started', { version: VERSION, identity, lease: `${namespace}/${OPERATOR_LEASE}` });
  return { leader, controllers, metrics };
}
