// The cluster store, the pod records, and IPAM: per-node blocks and allocations for pods, cluster-wide
// floating and load-balancer addresses. Its reconciler adds, updates and retires pools live.
import * as fs from 'node:fs';
import type { Logger } from '../log';
import { Lifecycle, StartError } from '../lifecycle';
import { ReconcileLoop } from '../util/reconcile-loop';
import { PodStore } from '../state/pod-store';
import { AttachService } from '../pod/attach-service';
import { parseRedisUrl } from '../common/redis';
import type { ConfigObjects } from '../config/objects';
import type { ConfigSource, Reconciler } from '../config/source';
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

/** The cluster store (Redis), connected lazily: tetherd starts without it and retries on use. */
export async function startStore(opts: Options, logger: Logger, life: Lifecycle): Promise<LazyStore | undefined> {
  if (!opts.redis) return undefined;
  const url = opts.redis;
  const keyPrefix = opts['redis-prefix'];
  const store = new LazyStore(() => RedisStore.connect(url, { keyPrefix }));
  life.started('cluster store', () => store.close());
  if (!(await store.warmUp())) logger.warn('cluster store not reachable yet; will retry on use', { redis: parseRedisUrl(url).where });
  return store;
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

export interface Ipam {
  pods: PodAllocator;
  addresses: ClusterAddresses;
  service: IpamService;
  reconciler: Reconciler;
}

export async function startIpam(
  o: { nodeName: string; config: ConfigObjects; source: ConfigSource; store?: LazyStore; stateDir: string; logger: Logger },
  life: Lifecycle,
): Promise<Ipam> {
  const { logger } = o;
  const nodeConfig = o.config.nodes[o.nodeName] ?? { labels: {} };
  const node = { name: o.nodeName, zone: nodeConfig.zone, labels: nodeConfig.labels };
  // In a cluster, block claims are AddressBlock resources (etcd is their durable record); Redis keeps
  // only what can be rebuilt (cluster-wide addresses, ownership records).
  const blocks: ClusterStore | undefined = o.source instanceof KubeSource ? new KubeBlockClaims(o.source.kc, o.store) : o.store;
  const pods = new PodAllocator(node, o.config.pools, blocks, new AllocationStore(o.stateDir), logger);
  await pods.start();
  const addresses = new ClusterAddresses(o.config.pools, o.store, logger);
  // IPAM maintenance (returning empty blocks) is awaited on stop, not cut off mid-write.
  const maintenance = new ReconcileLoop({
    run: () => pods.maintain(),
    everyMs: MAINTAIN_EVERY_MS,
    skipBusyTicks: true,
    onError: (e) => logger.warn('ipam: maintenance failed', { error: e.message }),
  }).start();
  life.started('ipam maintenance', async () => {
    await maintenance.stop(5000);
  });
  return {
    pods,
    addresses,
    service: new IpamService(pods, logger),
    reconciler: {
      name: 'ipam',
      apply(c) {
        pods.setPools(c.pools, c.nodes[o.nodeName] ?? { labels: {} });
        addresses.setPools(c.pools);
      },
    },
  };
}
