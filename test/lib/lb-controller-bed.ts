// One node's LbController in process, on the real lb.bpf.o (pinned under a unique bpffs directory) and a
// real redis-server (address allocation and the mapping store), with one LB pod in the pod store whose
// interface does not exist: its set-up fails before touching the kernel (a role problem), so slots, maps,
// subscriptions and routes are what a test of it sees. Everything is removed afterwards, even on failure.
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { PassThrough } from 'node:stream';
import { makeLogger } from '../../lib/log';
import { ensureBpffs } from '../../daemon/bpf/bpffs';
import { ClusterAddresses } from '../../ipam/cluster-addresses';
import { validatePools } from '../../ipam/pool';
import { RedisStore } from '../../ipam/store/redis-store';
import { LbController, type LbControllerOptions } from '../../daemon/lb/lb-controller';
import { connectLbStore } from '../../daemon/lb/lb-store';
import { PodStore } from '../../daemon/state/pod-store';
import { AttachService } from '../../daemon/pod/attach-service';
import { addNetns, delNetns, uniqueName } from './netns';
import { startRedis } from './redis';

export interface LbControllerBed {
  ctl: LbController;
  store: Awaited<ReturnType<typeof connectLbStore>>;
  pools: ReturnType<typeof validatePools>;
  pinDir: string;
  logger: ReturnType<typeof makeLogger>;
  /** What the controller logged so far (JSON lines). */
  logText(): string;
}

export async function withLbControllerBed(
  o: {
    /** Short name: the namespace, pin directory and key prefix are made from it. */
    name: string;
    pools: unknown[];
    /** The LB pod's addresses (the pod shop/lb, labelled tether.dev/role=lb). */
    podIps: string[];
    /** The controller's options besides what the bed provides (node n1 at 127.0.0.1, the pod datapath). */
    controller: Partial<LbControllerOptions> & { maxVips: number };
  },
  fn: (b: LbControllerBed) => Promise<void>,
): Promise<void> {
  const redis = await startRedis();
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), `tether-${o.name}-`));
  const ns = uniqueName(`t${o.name}`);
  const pinDir = `/sys/fs/bpf/tether-test/${uniqueName(o.name)}`;
  const out = new PassThrough();
  let text = '';
  out.on('data', (d) => (text += d));
  const logger = makeLogger({ level: 'info', stream: out });
  const pools = validatePools(o.pools);
  const ipam = await RedisStore.connect(redis.url, { keyPrefix: `${o.name}:` });
  const store = await connectLbStore(redis.url, { keyPrefix: `${o.name}:` });
  let ctl: LbController | undefined;
  try {
    const netns = addNetns(ns);
    ensureBpffs(pinDir);
    const pods = new PodStore(path.join(dir, 'state'));
    pods.put({
      network: 'tether', containerId: 'c1', ifName: 'eth0', netns, podNamespace: 'shop', podName: 'lb', ips: o.podIps, hostIfName: 'tlbnone0',
      labels: { 'tether.dev/role': 'lb' }, phase: 'attached', config: {}, createdAt: new Date().toISOString(),
    });
    ctl = new LbController({
      node: { name: 'n1', address: '127.0.0.1' }, pinDir, fouPort: 5555, exportTable: 0, maglevSize: 251, datapath: 'pod', uplink: 'tlbnone',
      store, addresses: new ClusterAddresses(pools, ipam, logger), attach: new AttachService(pods, logger), logger,
      ...o.controller,
    });
    await fn({ ctl, store, pools, pinDir, logger, logText: () => text });
  } finally {
    await ctl?.stop();
    await store.connection.close();
    await ipam.close();
    await redis.stop();
    delNetns(ns);
    fs.rmSync(pinDir, { recursive: true, force: true });
    fs.rmSync(dir, { recursive: true, force: true });
  }
}
