// tetherd: the node daemon. One per node; several can run side by side (the testbed), each with its own
// socket, state dir and bpffs pin dir. Pods it attached are recorded in the state dir and survive restarts.
import * as fs from 'node:fs';
import * as os from 'node:os';
import { isIP } from 'node:net';
import { parseArgs } from 'node:util';
import { DEFAULT_SOCKET_PATH, type CniParams } from './api/protocol';
import { makeLogger, setLogger, type Logger } from './log';
import { endLogger, Lifecycle, StartError, stopSignal } from './lifecycle';
import { InFlight } from './util/in-flight';
import { LoopLag } from './util/loop-lag';
import { ApiServer } from './server';
import { PodStore } from './state/pod-store';
import { AttachService } from './pod/attach-service';
import { ErrorCode, TetherError } from './errors';
import type { ConfigObjects } from './config/objects';
import { EmptySource, FileSource, serialApply, type ConfigSource } from './config/source';
import { KubeSource } from './config/kube-source';
import { KubeBlockClaims } from './kube/block-claims';
import { clusterKeyFromSecret } from './kube/cluster-key';
import { LeaderElection } from './kube/leader';
import { StatusController } from './kube/status-controller';
import type { ClusterStore } from '../ipam/types';
import { EgressObjects } from './egress/egress-config';
import { AllocationStore } from '../ipam/allocation-store';
import { ClusterAddresses, type OwnerRequest } from '../ipam/cluster-addresses';
import { IpamService } from '../ipam/ipam-service';
import { MAINTAIN_EVERY_MS, PodAllocator } from '../ipam/pod-allocator';
import { LazyStore } from '../ipam/store/lazy-store';
import { RedisStore } from '../ipam/store/redis-store';
import { parseRedisUrl } from './common/redis';
import { EgressController, requireClusterKey } from './egress/egress-controller';
import type { ResolvedEgress } from './egress/egress-spec';
import { OwnershipStore } from './egress/ownership-store';
import { VERSION } from '../cni/about';
import { validateCniRequest, type CniRequestFields } from '../cni/validate';


const USAGE = `usage: tetherd [--node-name NAME] [--socket PATH] [--state-dir DIR] [--bpf-pin-dir DIR] [--config FILE | --kubernetes | --kubeconfig FILE]
               [--redis URL] [--redis-prefix PREFIX] [--log-level LEVEL]
               [--node-address IP] [--uplink IF] [--cluster-key-file FILE] [--fou-port N] [--sync-port N]
  --config FILE   YAML/JSON objects: AddressPool, Egress, Node (zone, labels), Pod (labels); watched,
                  every valid edit applied live (an invalid one is refused whole, nothing changes)
  --kubernetes    objects from the Kubernetes API with the pod's service account (in a cluster):
                  AddressPool and Egress resources, this node's Node and Pods; --kubeconfig FILE: same, from FILE
  --redis URL     the cluster store for block claims (standalone) and floating addresses:
                  redis://[:password@]host:port[/db] or unix:///path.sock[?password=…]
  Egress (objects of kind Egress in --config) also needs:
  --node-address IP       this node's address: BFD, conntrack sync and FoU between nodes use it
  --uplink IF             the node's interface on the L2 segment (announcements); default: eth0
  --cluster-key-file FILE shared secret (≥ 32 bytes, hex or base64) authenticating tetherd-to-tetherd traffic
  --cluster-key-secret NAME  in a cluster: the key from Secret NAME in $POD_NAMESPACE (created by the first tetherd)
  --fou-port N            UDP port of FoU encapsulation (default 5555); --sync-port N conntrack sync (default 3785)
  --help, --version`;


export async function main(argv: string[]): Promise<number> {
  let opts;
  try {
    opts = parseArgs({
      args: argv,
      options: {
        'node-name': { type: 'string' },
        socket: { type: 'string', default: DEFAULT_SOCKET_PATH },
        'state-dir': { type: 'string', default: '/var/lib/tether' },
        'bpf-pin-dir': { type: 'string', default: '/sys/fs/bpf/tether' },
        config: { type: 'string' },
        kubernetes: { type: 'boolean', default: false },
        kubeconfig: { type: 'string' },
        redis: { type: 'string', default: process.env.TETHER_REDIS_URL },
        'redis-prefix': { type: 'string', default: 'tether:' },
        'node-address': { type: 'string' },
        uplink: { type: 'string', default: 'eth0' },
        'cluster-key-file': { type: 'string' },
        'cluster-key-secret': { type: 'string' },
        'fou-port': { type: 'string', default: '5555' },
        'sync-port': { type: 'string', default: '3785' },
        // Testing only: the negative control of the failover tests (takeover without conntrack state).
        'no-conntrack-sync': { type: 'boolean', default: false },
        'log-level': { type: 'string', default: 'info' },
        help: { type: 'boolean', short: 'h' },
      },
    }).values;
  } catch (e) {
    process.stderr.write(`tetherd: ${(e as Error).message}\n${USAGE}\n`);
    return 2;
  }
  if (opts.help) {
    process.stdout.write(USAGE + '\n');
    return 0;
  }
  process.umask(0o077);
  const nodeName = opts['node-name'] ?? process.env.NODE_NAME ?? os.hostname();
  const logger = makeLogger({ level: opts['log-level'], node: nodeName });
  setLogger(logger);
  const stop = stopSignal();
  const life = new Lifecycle(logger);
  let code = 0;
  try {
    await start(opts as Options, nodeName, logger, life);
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

type Options = {
  socket: string;
  'state-dir': string;
  'bpf-pin-dir': string;
  config?: string;
  kubernetes: boolean;
  kubeconfig?: string;
  redis?: string;
  'redis-prefix': string;
  'node-address'?: string;
  uplink: string;
  'cluster-key-file'?: string;
  'cluster-key-secret'?: string;
  'fou-port': string;
  'sync-port': string;
  'no-conntrack-sync': boolean;
};

function portOption(name: string, raw: string): number {
  const n = Number(raw);
  if (!/^[0-9]+$/.test(raw) || n < 1 || n > 65535) throw new StartError(2, `--${name}: ${JSON.stringify(raw)} is not a port number (1-65535)`);
  return n;
}

/** An address tetherd binds BFD and sync to must be one of this node's (namespace's) own. */
function requireLocalAddress(addr: string): void {
  if (!isIP(addr)) throw new StartError(2, `--node-address: ${JSON.stringify(addr)} is not an IP address`);
  const local = Object.values(os.networkInterfaces()).flatMap((l) => (l ?? []).map((a) => a.address));
  if (!local.includes(addr)) throw new StartError(2, `--node-address: ${addr} is not an address of any local interface (have: ${local.join(', ') || 'none'})`);
}

/**
 * The cluster's controllers (status of AddressPools and Egresses, collection of dead nodes' block claims)
 * run on one tetherd at a time, the holder of a Lease in tetherd's own namespace.
 */
function startControllers(source: KubeSource, nodeName: string, egress: EgressController | undefined, egressConfig: EgressObjects, logger: Logger, life: Lifecycle): void {
  const leader = new LeaderElection({ kc: source.kc, namespace: process.env.POD_NAMESPACE || 'tether-system', name: 'tether-controllers', identity: nodeName, logger });
  const status = new StatusController({
    kc: source.kc,
    logger,
    verdicts: () => source.currentVerdicts(),
    refused: () => egressConfig.problems(),
    egressAddresses: () => (egress?.status() ?? []).map((a) => ({ egress: String(a.egress), address: String(a.address), owner: String(a.owner ?? ''), ownerNode: a.ownerNode as string | undefined, epoch: Number(a.epoch) })),
  });
  leader.on('elected', () => status.start());
  leader.on('lost', () => void status.stop());
  leader.start();
  life.started('controllers', async () => {
    await status.stop();
    await leader.stop();
  });
}

/** Starts every part in order, registering each one's stop with `life` as soon as it runs. */
async function start(opts: Options, nodeName: string, logger: Logger, life: Lifecycle): Promise<void> {
  const kube = opts.kubernetes || opts.kubeconfig !== undefined;
  if (kube && opts.config) throw new StartError(2, '--config and --kubernetes/--kubeconfig are two config sources: give one');
  let source: ConfigSource;
  try {
    source = kube ? new KubeSource({ kubeconfig: opts.kubeconfig, nodeName, logger }) : opts.config ? new FileSource(opts.config, logger) : new EmptySource();
  } catch (e) {
    throw new StartError(2, `config source: ${(e as Error).message}`);
  }
  let config: ConfigObjects;
  try {
    config = await source.start();
  } catch (e) {
    await source.stop();
    throw new StartError(kube ? 1 : 2, `config rejected: ${(e as Error).message}`);
  }
  life.started('config source', () => source.stop());
  const fouPort = portOption('fou-port', opts['fou-port']);
  const syncPort = portOption('sync-port', opts['sync-port']);
  let nodeConfig = config.nodes[nodeName] ?? { labels: {} };
  const egressObjects = config.others.filter((o) => o.kind === 'Egress');
  const egressConfig = new EgressObjects(logger);
  // Egress runs when it is configured at start, or when its options are given (Egresses may come later).
  const egressWanted = egressObjects.length > 0 || (!!opts['node-address'] && !!(opts['cluster-key-file'] || opts['cluster-key-secret']) && !!opts.redis);
  let egressSetup: { resolved: ResolvedEgress[]; clusterKey: Buffer; nodeAddress: string } | undefined;
  if (opts.redis) {
    try {
      parseRedisUrl(opts.redis);
    } catch (e) {
      throw new StartError(2, `--redis rejected: ${(e as Error).message}`);
    }
  }
  if (egressWanted) {
    try {
      const resolved = egressConfig.resolve(config);
      const rejected = Object.values(egressConfig.problems());
      // A file is refused whole at start; in a cluster each object is judged alone (its status says why).
      if (rejected.length && !kube) throw new TetherError(ErrorCode.InvalidConfig, rejected.join('\n'));
      if (!opts.redis) throw new TetherError(ErrorCode.InvalidConfig, 'Egress objects need the cluster store: start tetherd with --redis');
      if (!opts['node-address']) throw new TetherError(ErrorCode.InvalidConfig, 'Egress objects need --node-address');
      let keyText: string | undefined;
      if (opts['cluster-key-secret'] && source instanceof KubeSource) {
        const ns = process.env.POD_NAMESPACE || 'tether-system';
        try {
          keyText = await clusterKeyFromSecret(source.kc, ns, opts['cluster-key-secret']);
        } catch (e) {
          throw new TetherError(ErrorCode.InvalidConfig, `--cluster-key-secret: Secret ${ns}/${opts['cluster-key-secret']}: ${(e as Error).message}`);
        }
      } else if (opts['cluster-key-file']) {
        try {
          keyText = fs.readFileSync(opts['cluster-key-file'], 'utf8');
        } catch (e) {
          throw new TetherError(ErrorCode.InvalidConfig, `--cluster-key-file: cannot read ${opts['cluster-key-file']}: ${(e as NodeJS.ErrnoException).code ?? (e as Error).message}`);
        }
      }
      egressSetup = { resolved, clusterKey: requireClusterKey(keyText), nodeAddress: opts['node-address'] };
    } catch (e) {
      throw new StartError(2, `egress configuration rejected: ${(e as Error).message}`);
    }
    requireLocalAddress(egressSetup.nodeAddress);
  }

  let store: LazyStore | undefined;
  if (opts.redis) {
    const url = opts.redis;
    const keyPrefix = opts['redis-prefix'];
    store = new LazyStore(() => RedisStore.connect(url, { keyPrefix }));
    const s = store;
    life.started('cluster store', () => s.close());
    if (!(await store.warmUp())) logger.warn('cluster store not reachable yet; will retry on use', { redis: parseRedisUrl(url).where });
  }
  const stateDir = opts['state-dir'];
  try {
    fs.mkdirSync(stateDir, { recursive: true, mode: 0o700 });
    fs.accessSync(stateDir, fs.constants.W_OK);
  } catch (e) {
    throw new StartError(1, `--state-dir ${stateDir}: ${(e as NodeJS.ErrnoException).code ?? (e as Error).message}`);
  }
  const podStore = new PodStore(stateDir);
  const { loaded, broken } = podStore.load();
  for (const b of broken) logger.error('state: unreadable pod record set aside', { file: b });
  const attach = new AttachService(podStore, logger);
  const node = { name: nodeName, zone: nodeConfig.zone, labels: nodeConfig.labels };
  // In a cluster, block claims are AddressBlock resources (etcd is their durable record); Redis keeps
  // only what can be rebuilt (cluster-wide addresses, ownership records).
  const blocks: ClusterStore | undefined = source instanceof KubeSource ? new KubeBlockClaims(source.kc, store) : store;
  const pods = new PodAllocator(node, config.pools, blocks, new AllocationStore(stateDir), logger);
  await pods.start();
  const addresses = new ClusterAddresses(config.pools, store, logger);
  const ipam = new IpamService(pods, logger);
  // IPAM maintenance (returning empty blocks) is awaited on stop, not cut off mid-write.
  const maintenance = new InFlight();
  const maintain = setInterval(
    () => void maintenance.run(() => pods.maintain()).catch((e) => logger.warn('ipam: maintenance failed', { error: (e as Error).message })),
    MAINTAIN_EVERY_MS,
  );
  maintain.unref();
  life.started('ipam maintenance', async () => {
    clearInterval(maintain);
    await maintenance.close(5000);
  });

  let egress: EgressController | undefined;
  if (egressSetup) {
    let ownership: OwnershipStore;
    try {
      ownership = await OwnershipStore.connect(opts.redis!, { keyPrefix: opts['redis-prefix'] });
    } catch (e) {
      throw new StartError(1, `egress: ${(e as Error).message}`);
    }
    life.started('ownership store', () => ownership.close());
    egress = new EgressController({
      node: { name: nodeName, zone: nodeConfig.zone, address: egressSetup.nodeAddress, uplink: opts.uplink },
      pinDir: opts['bpf-pin-dir'],
      fouPort,
      syncPort,
      clusterKey: egressSetup.clusterKey,
      egresses: egressSetup.resolved,
      podLabels: config.pods,
      ownership,
      addresses,
      attach,
      logger,
      conntrackSync: !opts['no-conntrack-sync'],
    });
  }
  const started = Date.now();
  // The main event loop's worst delay since start (status): what a busy tetherd does to its timers.
  const loopLag = new LoopLag();
  life.started('event loop monitor', () => loopLag.stop());

  const asObject = <T>(p: unknown): T => {
    if (!p || typeof p !== 'object' || Array.isArray(p)) throw new TetherError(ErrorCode.BadRequest, 'params must be an object');
    return p as T;
  };
  const asCni = (p: unknown, requireNetns = true): CniParams => {
    if (!p || typeof p !== 'object') throw new TetherError(ErrorCode.BadRequest, 'params must be an object');
    const c = p as CniParams;
    if (!c.config || typeof c.config !== 'object') throw new TetherError(ErrorCode.BadRequest, 'params.config must be an object');
    if (c.args === undefined || c.args === null) c.args = {};
    // The thin clients checked all of this; a request that bypassed them is checked the same way.
    validateCniRequest(c as unknown as CniRequestFields, { requireNetns });
    return c;
  };
  const server = new ApiServer(
    opts.socket,
    {
      ping: () => ({ pong: true, node: nodeName }),
      'cni.add': (p) => attach.add(asCni(p)),
      'cni.del': (p) => attach.del(asCni(p)),
      'cni.check': (p) => attach.check(asCni(p)),
      'cni.gc': (p) => attach.gc(asCni(p)),
      'cni.status': () => ({ ready: true }),
      'ipam.add': (p) => ipam.add(asCni(p, false)),
      'ipam.del': (p) => ipam.del(asCni(p, false)),
      'ipam.check': (p) => ipam.check(asCni(p, false)),
      'ipam.gc': (p) => ipam.gc(asCni(p, false)),
      'address.allocate': (p) => addresses.allocate(asObject<OwnerRequest>(p)),
      'address.release': (p) => {
        const r = asObject<{ pool: string; owner: string }>(p);
        return addresses.release(r.pool, r.owner).then((released) => ({ released }));
      },
      status: async () => ({
        node: nodeName,
        zone: nodeConfig.zone,
        version: VERSION,
        uptimeSeconds: Math.round((Date.now() - started) / 1000),
        stateDir,
        bpfPinDir: opts['bpf-pin-dir'],
        pools: config.pools.map((p) => p.name),
        ipam: { pods: pods.usage(), cluster: await addresses.usage() },
        egress: egress?.status() ?? [],
        egressSecurity: egress?.security(),
        bfd: egress?.bfdStatus(),
        eventLoop: { lagMaxMs: loopLag.maxMs(), lagMaxPerSecondMs: loopLag.series() },
        pods: podStore.all().map((r) => ({
          network: r.network,
          containerId: r.containerId,
          ifName: r.ifName,
          pod: r.podNamespace && r.podName ? `${r.podNamespace}/${r.podName}` : undefined,
          netns: r.netns,
          phase: r.phase,
        })),
      }),
    },
    logger,
  );
  if (egress) {
    // Stopped after the socket (a CNI ADD under way still finds its roles) and also when its own start
    // fails half-way, so whatever it set up is undone.
    const e = egress;
    life.started('egress', () => e.stop(), 15_000);
  }
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
  // Every accepted configuration change reaches each subsystem, which converges to it.
  const e = egress;
  const apply = serialApply(
    async (c) => {
      config = c;
      nodeConfig = c.nodes[nodeName] ?? { labels: {} };
      pods.setPools(c.pools, nodeConfig);
      addresses.setPools(c.pools);
      const egresses = egressConfig.resolve(c);
      if (e) await e.apply(egresses, c.pods);
      else if (egresses.length) logger.error('egress: Egress objects need --node-address, --cluster-key-file and --redis; not served', { egresses: egresses.map((x) => x.key) });
    },
    (err) => logger.error('config: applying a change failed', { error: err.message, stack: err.stack }),
  );
  source.on('update', apply);
  if (source instanceof KubeSource) startControllers(source, nodeName, egress, egressConfig, logger, life);
  logger.info('tetherd started', { version: VERSION, socket: opts.socket, stateDir, bpfPinDir: opts['bpf-pin-dir'], podsRecorded: loaded });
}
