// The cluster store, the pod records, and IPAM: per-node blocks and allocations for pods, cluster-wide
// floating and load-balancer addresses. Its desired state (pools, this node's facts) adds, updates and
// retires pools live.
import * as fs from 'node:fs';
import type { Logger } from '../../lib/log';
import { StartError, type Part } from '../lifecycle';
import { ReconcileLoop } from '../util/reconcile-loop';
import { PodStore } from '../state/pod-store';
import { AttachService } from '../pod/attach-service';
import { parseRedisUrl, withRedisPassword } from '../common/redis';
import { awaitClusterSecret } from '../kube/cluster-key';
import type * as k8s from '@kubernetes/client-node';
import type { ConfigObjects } from '../config/objects';
import type { ConfigSource } from '../config/source';
import type { IpamDesired, Subsystem } from './subsystem';
import { KubeSource } from '../config/kube-source';
import { KubeBlockClaims } from '../kube/block-claims';
import type { ClusterStore } from '../../ipam/types';
import { AllocationStore } from '../../ipam/allocation-store';
import { ClusterAddresses } from '../../ipam/cluster-addresses';
import { IpamService } from '../../ipam/ipam-service';
import { MAINTAIN_EVERY_MS, PodAllocator } from '../../ipam/pod-allocator';
import { LazyStore } from '../../ipam/store/lazy-store';
import { RedisStore } from '../../ipam/store/redis-store';
import type { Options } from '../options';

/**
 * The options with the store's password from --redis-password-secret put into the store URL (every store
 * client reads the URL). Outside a cluster the option cannot be used: said at start, not ignored.
 */
export async function withStorePassword<O extends Pick<Options, 'redis' | 'redis-password-secret'>>(
  opts: O, source: ConfigSource, logger: Logger,
  /** How the Secret's value is had: tetherd reads it (waiting for the operator to create it); the operator creates it. */
  secretValue: (kc: k8s.KubeConfig, namespace: string, name: string) => Promise<string> = (kc, ns, name) => awaitClusterSecret(kc, ns, name, 'redisPassword', { logger }),
): Promise<O> {
  const secret = opts['redis-password-secret'];
  if (!secret || !opts.redis) return opts;
  if (!(source instanceof KubeSource)) throw new StartError(2, '--redis-password-secret needs the Kubernetes API (--kubernetes or --kubeconfig); give the password in the --redis URL instead');
  const ns = process.env.POD_NAMESPACE || 'tether-system';
  let password: string;
  try {
    password = await secretValue(source.kc, ns, secret);
  } catch (e) {
    throw new StartError(1, `--redis-password-secret: Secret ${ns}/${secret}: ${(e as Error).message}`);
  }
  const redis = withRedisPassword(opts.redis, password);
  logger.info('cluster store password from Secret', { secret: `${ns}/${secret}`, store: parseRedisUrl(redis).where, inUrl: redis === opts.redis });
  return { ...opts, redis };
}

/** The cluster store (Redis), connected lazily: tetherd starts without it and retries on use. None without --redis. */
export function clusterStore(opts: Pick<Options, 'redis' | 'redis-prefix'>, logger: Logger): (Part & { store: LazyStore }) | undefined {
  if (!opts.redis) return undefined;
  const url = opts.redis;
  const keyPrefix = opts['redis-prefix'];
  const store = new LazyStore(() => RedisStore.connect(url, { keyPrefix }));
  return {
    name: 'cluster store',
    store,
    start: async () => {
      if (!(await store.warmUp())) logger.warn('cluster store not reachable yet; will retry on use', { redis: parseRedisUrl(url).where });
    },
    stop: () => store.close(),
  };
}

/** The pods this node attached (records in the state dir, surviving restarts) and the attach service. */
export function openPodState(stateDir: string, logger: Logger): { podStore: PodStore; attach: AttachService; loaded: number } {
  try {
    fs.mkdirSync(stateDir, { recursive: true, mode: 0o700 });
    fs.accessSync(stateDir, fs.constants.W_OK);
  } catch (e) {
    throw new StartError(1, `--state-dir ${stateDir}: ${(e as NodeJS.ErrnoException).code ?? (e as Error).message}`);
  }
  const podStore = new PodStore(stateDir);
  const { loaded, broken } = podStore.load();
  for (const b of broken) logger.error('state: unreadable pod record set aside', { file: b });
  return { podStore, attach: new AttachService(podStore, logger), loaded };
}

export class Ipam implements Subsystem<IpamDesired> {
  readonly name = 'ipam';
  readonly pods: PodAllocator;
  readonly addresses: ClusterAddresses;
  readonly service: IpamService;
  /** Maintenance (returning empty blocks), awaited on stop, not cut off mid-write. */
  private readonly maintenance: ReconcileLoop;

  constructor(o: { nodeName: string; config: ConfigObjects; source: ConfigSource; store?: LazyStore; stateDir: string; logger: Logger }) {
    const { logger } = o;
    const nodeConfig = o.config.nodes[o.nodeName] ?? { labels: {} };
    const node = { name: o.nodeName, zone: nodeConfig.zone, labels: nodeConfig.labels };
    // In a cluster, block claims are AddressBlock resources (etcd is their durable record); Redis keeps
    // only what can be rebuilt (cluster-wide addresses, ownership records).
    const blocks: ClusterStore | undefined = o.source instanceof KubeSource ? new KubeBlockClaims(o.source.kc, o.store) : o.store;
    this.pods = new PodAllocator(node, o.config.pools, blocks, new AllocationStore(o.stateDir), logger);
    this.addresses = new ClusterAddresses(o.config.pools, o.store, logger);
    this.service = new IpamService(this.pods, logger);
    this.maintenance = new ReconcileLoop({
      run: () => this.pods.maintain(),
      everyMs: MAINTAIN_EVERY_MS,
      skipBusyTicks: true,
      onError: (e) => logger.warn('ipam: maintenance failed', { error: e.message }),
    });
  }

  async start(): Promise<void> {
    await this.pods.start();
    this.maintenance.start();
  }

  apply(d: IpamDesired): void {
    this.pods.setPools(d.pools, d.node);
    this.addresses.setPools(d.pools);
  }

  async stop(): Promise<void> {
    await this.maintenance.stop(5000);
  }

  async status(): Promise<Record<string, unknown>> {
    return { ipam: { pods: this.pods.usage(), cluster: await this.addresses.usage() } };
  }
}
