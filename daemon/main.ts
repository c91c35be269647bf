// tetherd: the node daemon. One per node; several can run side by side (the testbed), each with its own
// socket, state dir and bpffs pin dir. Pods it attached are recorded in the state dir and survive restarts.
import * as fs from 'node:fs';
import * as os from 'node:os';
import { parseArgs } from 'node:util';
import { DEFAULT_SOCKET_PATH, type CniParams } from './api/protocol';
import { makeLogger, setLogger } from './log';
import { ApiServer } from './server';
import { PodStore } from './state/pod-store';
import { AttachService } from './pod/attach-service';
import { ErrorCode, TetherError } from './errors';
import { loadConfig, type ConfigObjects } from './config/objects';
import { AllocationStore } from '../ipam/allocation-store';
import { ClusterAddresses, type OwnerRequest } from '../ipam/cluster-addresses';
import { IpamService } from '../ipam/ipam-service';
import { MAINTAIN_EVERY_MS, PodAllocator } from '../ipam/pod-allocator';
import { LazyStore } from '../ipam/store/lazy-store';
import { parseRedisUrl, RedisStore } from '../ipam/store/redis-store';
import { EgressController, requireClusterKey } from './egress/egress-controller';
import { validateEgress } from './egress/egress-spec';
import { OwnershipStore } from './egress/ownership-store';

const VERSION = '0.1.0';

const USAGE = `usage: tetherd [--node-name NAME] [--socket PATH] [--state-dir DIR] [--bpf-pin-dir DIR] [--config FILE]
               [--redis URL] [--redis-prefix PREFIX] [--log-level LEVEL]
               [--node-address IP] [--uplink IF] [--cluster-key-file FILE] [--fou-port N] [--sync-port N]
  --config FILE   YAML/JSON objects: AddressPool, Node (zone, labels)
  --redis URL     the cluster store for block claims and floating addresses:
                  redis://[:password@]host:port[/db] or unix:///path.sock[?password=…]
  Egress (objects of kind Egress in --config) also needs:
  --node-address IP       this node's address: BFD, conntrack sync and FoU between nodes use it
  --uplink IF             the node's interface on the L2 segment (announcements); default: eth0
  --cluster-key-file FILE shared secret (≥ 32 bytes, hex or base64) authenticating tetherd-to-tetherd traffic
  --fou-port N            UDP port of FoU encapsulation (default 5555); --sync-port N conntrack sync (default 3785)`;


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
        redis: { type: 'string', default: process.env.TETHER_REDIS_URL },
        'redis-prefix': { type: 'string', default: 'tether:' },
        'node-address': { type: 'string' },
        uplink: { type: 'string', default: 'eth0' },
        'cluster-key-file': { type: 'string' },
        'fou-port': { type: 'string', default: '5555' },
        'sync-port': { type: 'string', default: '3785' },
        // Testing only: the negative control of the failover tests (takeover without conntrack state).
        'no-conntrack-sync': { type: 'boolean', default: false },
        'log-level': { type: 'string', default: 'info' },
        help: { type: 'boolean' },
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

  let config: ConfigObjects = { pools: [], nodes: {}, others: [] };
  try {
    if (opts.config) config = loadConfig(opts.config);
  } catch (e) {
    logger.error('config rejected', { error: (e as Error).message });
    return 2;
  }
  const nodeConfig = config.nodes[nodeName] ?? { labels: {} };
  let store: LazyStore | undefined;
  if (opts.redis) {
    const url = opts.redis;
    const keyPrefix = opts['redis-prefix'];
    try {
      parseRedisUrl(url);
    } catch (e) {
      logger.error('--redis rejected', { error: (e as Error).message });
      return 2;
    }
    store = new LazyStore(() => RedisStore.connect(url, { keyPrefix }));
    if (!(await store.warmUp())) logger.warn('cluster store not reachable yet; will retry on use', { redis: parseRedisUrl(url).where });
  }
  const stateDir = opts['state-dir'] as string;
  fs.mkdirSync(stateDir, { recursive: true, mode: 0o700 });
  const podStore = new PodStore(stateDir);
  const { loaded, broken } = podStore.load();
  for (const b of broken) logger.error('state: unreadable pod record set aside', { file: b });
  const attach = new AttachService(podStore, logger);
  const node = { name: nodeName, zone: nodeConfig.zone, labels: nodeConfig.labels };
  const pods = new PodAllocator(node, config.pools, store, new AllocationStore(stateDir), logger);
  await pods.start();
  const addresses = new ClusterAddresses(config.pools, store, logger);
  const ipam = new IpamService(pods, logger);
  let egress: EgressController | undefined;
  let ownership: OwnershipStore | undefined;
  const egressObjects = config.others.filter((o) => o.kind === 'Egress');
  if (egressObjects.length) {
    try {
      const resolved = egressObjects.map((o) => validateEgress(o, { pools: config.pools }));
      if (!opts.redis) throw new TetherError(ErrorCode.InvalidConfig, 'Egress objects need the cluster store: start tetherd with --redis');
      if (!opts['node-address']) throw new TetherError(ErrorCode.InvalidConfig, 'Egress objects need --node-address');
      const clusterKey = requireClusterKey(opts['cluster-key-file'] ? fs.readFileSync(opts['cluster-key-file'], 'utf8') : undefined);
      ownership = await OwnershipStore.connect(opts.redis, { keyPrefix: opts['redis-prefix'] });
      egress = new EgressController({
        node: { name: nodeName, zone: nodeConfig.zone, address: opts['node-address'], uplink: opts.uplink as string },
        pinDir: opts['bpf-pin-dir'] as string,
        fouPort: Number(opts['fou-port']),
        syncPort: Number(opts['sync-port']),
        clusterKey,
        egresses: resolved,
        ownership,
        addresses,
        attach,
        logger,
        conntrackSync: !opts['no-conntrack-sync'],
      });
    } catch (e) {
      logger.error('egress configuration rejected', { error: (e as Error).message });
      return 2;
    }
  }
  const maintain = setInterval(() => void pods.maintain().catch((e) => logger.warn('ipam: maintenance failed', { error: (e as Error).message })), MAINTAIN_EVERY_MS);
  maintain.unref();
  const started = Date.now();

  const asObject = <T>(p: unknown): T => {
    if (!p || typeof p !== 'object' || Array.isArray(p)) throw new TetherError(ErrorCode.BadRequest, 'params must be an object');
    return p as T;
  };
  const asCni = (p: unknown): CniParams => {
    if (!p || typeof p !== 'object') throw new TetherError(ErrorCode.BadRequest, 'params must be an object');
    const c = p as CniParams;
    if (!c.config || typeof c.config !== 'object') throw new TetherError(ErrorCode.BadRequest, 'params.config must be an object');
    if (!c.args || typeof c.args !== 'object') c.args = {};
    return c;
  };
  const server = new ApiServer(
    opts.socket as string,
    {
      ping: () => ({ pong: true, node: nodeName }),
      'cni.add': (p) => attach.add(asCni(p)),
      'cni.del': (p) => attach.del(asCni(p)),
      'cni.check': (p) => attach.check(asCni(p)),
      'cni.gc': (p) => attach.gc(asCni(p)),
      'cni.status': () => ({ ready: true }),
      'ipam.add': (p) => ipam.add(asCni(p)),
      'ipam.del': (p) => ipam.del(asCni(p)),
      'ipam.check': (p) => ipam.check(asCni(p)),
      'ipam.gc': (p) => ipam.gc(asCni(p)),
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
  try {
    await server.listen();
  } catch (e) {
    logger.error('cannot serve socket', { socket: opts.socket, error: (e as Error).message });
    return 1;
  }
  if (egress) {
    try {
      await egress.start();
    } catch (e) {
      logger.error('egress controller failed to start', { error: (e as Error).message, stack: (e as Error).stack });
      await server.close();
      return 1;
    }
  }
  logger.info('tetherd started', { version: VERSION, socket: opts.socket, stateDir, bpfPinDir: opts['bpf-pin-dir'], podsRecorded: loaded });

  return new Promise<number>((resolve) => {
    const stop = (signal: string) => {
      logger.info('tetherd stopping', { signal });
      clearInterval(maintain);
      void (async () => {
        // Everything that may still log stops before the logger ends.
        await egress?.stop().catch((e) => logger.warn('egress: stop failed', { error: (e as Error).message }));
        await ownership?.close();
        await server.close();
        await store?.close();
        logger.info('tetherd stopped', { signal });
        logger.on('finish', () => resolve(0));
        logger.end();
      })();
    };
    process.once('SIGTERM', () => stop('SIGTERM'));
    process.once('SIGINT', () => stop('SIGINT'));
  });
}
