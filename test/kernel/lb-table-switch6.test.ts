// Record on change for an IPv6 VIP, on the real parts (as lb-table-switch.test.ts for IPv4): LB nodes in this
// process, each an LbController with its own pinned lb.bpf.o maps (lb_maglev6, lb_mappings6, lb_targets6 for
// this VIP) and its own store connections, on one real redis-server; each node has an IPv6 address (FoU in
// outer IPv6 comes from it). Live
// flows are entries of a node's mapping table, picked by its row as the datapath picks them (the kernel
// datapath test holds lbHash to the program's picks). "Where a flow goes on a node" is what the program
// decides there: its mapping if its target is listed, else the row's entry — so a flow checked on every
// node stands for the flow moved there by ECMP. The LB pods' interfaces do not exist (their set-up fails
// as a role problem); slots, services, targets, rows and the store are what is under test.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { Writable } from 'node:stream';
import Redis from 'ioredis';
import { makeLogger, setLogger } from '../../lib/log';
import { ensureBpffs } from '../../daemon/bpf/bpffs';
import { LB_HASH_SEED, LbDatapath } from '../../daemon/bpf/lb';
import { lbHash, type MapKey } from '../../daemon/bpf/lb-structs';
import { ClusterAddresses } from '../../ipam/cluster-addresses';
import { validatePools } from '../../ipam/pool';
import { RedisStore } from '../../ipam/store/redis-store';
import { LbController } from '../../daemon/lb/lb-controller';
import { connectLbStore, type LbStore } from '../../daemon/lb/lb-store';
import { resolveLoadBalancers } from '../../daemon/lb/lb-spec';
import { fieldOf } from '../../daemon/lb/mapping-fields';
import { maglevTable, pickOf } from '../../daemon/lb/maglev';
import { nowNs } from '../../daemon/lb/lb-state';
import { PodStore } from '../../daemon/state/pod-store';
import { AttachService } from '../../daemon/pod/attach-service';
import { LB_CLASS } from '../../daemon/objects/names';
import { startRedis, type TestRedis } from '../lib/redis';
import { addNetns, delNetns, uniqueName } from '../lib/netns';
import { until } from '../lib/wait';

const logger = makeLogger({ level: process.env.LB_SWITCH_LOG ? 'info' : 'error', stream: process.env.LB_SWITCH_LOG ? process.stdout : new Writable({ write: (_c, _e, cb) => cb() }) });
setLogger(logger);

const M = 251;
// Target addresses whose first 4 bytes are alike: an IPv4-width compare or sort would not tell them apart.
const A = 'fd00:10:244:9::2';
const B = 'fd00:10:244:9::3';
const C = 'fd00:10:244:9::4';
const D = 'fd00:10:244:9::5';
const FLOWS = 300;
const pools = validatePools([{ apiVersion: 'tether.dev/v1alpha1', kind: 'AddressPool', metadata: { name: 'lb' }, spec: { usage: 'loadBalancer', ipv4: { cidr: '198.18.7.0/28' }, ipv6: { cidr: '2001:db8:18:7::/124' } } }]);

function config(targets: string[], terminating: string[] = []) {
  return resolveLoadBalancers([
    { apiVersion: 'v1', kind: 'Service', metadata: { name: 'db', namespace: 'shop', annotations: { 'lb.tether.dev/affinity': 'flow' } }, spec: { type: 'LoadBalancer', loadBalancerClass: LB_CLASS, ipFamilyPolicy: 'SingleStack', ipFamilies: ['IPv6'], ports: [{ port: 9000, protocol: 'TCP' }] } },
    {
      apiVersion: 'discovery.k8s.io/v1', kind: 'EndpointSlice', metadata: { name: 'db-x', namespace: 'shop', labels: { 'kubernetes.io/service-name': 'db' } }, addressType: 'IPv6',
      endpoints: [
        ...targets.map((a) => ({ addresses: [a], conditions: { ready: true }, nodeName: 'w1' })),
        ...terminating.map((a) => ({ addresses: [a], conditions: { ready: false, serving: true, terminating: true }, nodeName: 'w1' })),
      ],
    },
  ], pools);
}

interface Node {
  name: string;
  ctl: LbController;
  store: LbStore;
  ipam: RedisStore;
  pinDir: string;
  dir: string;
  ns: string;
  alive: boolean;
}

interface Flow {
  key: MapKey;
  target: string;
  node: string;
}

class Cluster {
  readonly nodes: Node[] = [];
  readonly prefix = `${uniqueName('sw')}:`;
  vip = '';

  constructor(readonly redis: TestRedis, readonly changeWaitMs = 8000) {}

  async add(name: string, targets: string[], terminating: string[] = []): Promise<Node> {
    const i = this.nodes.length + 1;
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), `tether-sw-${name}-`));
    const pinDir = `/sys/fs/bpf/tether-test/${uniqueName(`sw${name}`)}`;
    ensureBpffs(pinDir);
    const ns = uniqueName(`tsw${name}`);
    const netns = addNetns(ns);
    const pods = new PodStore(path.join(dir, 'state'));
    pods.put({
      network: 'tether', containerId: `c-${name}`, ifName: 'eth0', netns, podNamespace: 'shop', podName: `lb-${name}`, ips: [`10.244.${i}.9`, `fd00:10:244:${i}::9`], hostIfName: `tswnone${i}`,
      labels: { 'tether.dev/role': 'lb' }, phase: 'attached', config: {}, createdAt: new Date().toISOString(),
    });
    const ipam = await RedisStore.connect(this.redis.url, { keyPrefix: this.prefix });
    const store = await connectLbStore(this.redis.url, { keyPrefix: this.prefix, timeoutMs: 500 });
    const ctl = new LbController({
      node: { name, address: `127.0.0.${i}`, address6: `fd00:127::${i}` }, pinDir, fouPort: 5555, exportTable: 0, maxVips: 2, maglevSize: M, changeWaitMs: this.changeWaitMs, datapath: 'pod', uplink: 'tswnone',
      store, addresses: new ClusterAddresses(pools, ipam, logger), attach: new AttachService(pods, logger), logger,
    });
    const node: Node = { name, ctl, store, ipam, pinDir, dir, ns, alive: true };
    this.nodes.push(node);
    await ctl.start();
    await ctl.apply(config(targets, terminating));
    const st = await until(`${name} has the VIP in a slot`, async () => this.status(node)?.slot !== undefined && this.status(node)).catch((e) => {
      throw new Error(`${(e as Error).message}: ${JSON.stringify(node.ctl.status())}`);
    });
    this.vip = String(st.vip);
    assert.ok(this.vip.includes(':'), `an IPv6 VIP (${this.vip})`);
    return node;
  }

  status(n: Node): Record<string, unknown> | undefined {
    return n.ctl.status().find((s) => s.service === 'shop/db#IPv6');
  }

  table(n: Node): { mode: string; version?: number; pending?: { version: number; waitingFor: string[] }; recording: boolean } {
    return this.status(n)?.table as never;
  }

  live(): Node[] {
    return this.nodes.filter((n) => n.alive);
  }

  /** Waits until every live node forwards by one version, none pending; returns it. */
  async settled(what: string, min = 1, timeoutMs = 15_000): Promise<number> {
    return until(what, async () => {
      const t = this.live().map((n) => this.table(n));
      const v = t[0]?.version;
      return v !== undefined && v >= min && t.every((x) => x.version === v && !x.pending) ? v : undefined;
    }, timeoutMs);
  }

  /** Opens a node's pinned maps, read-only use. */
  withMaps<T>(n: Node, fn: (dp: LbDatapath) => T): T {
    const dp = LbDatapath.load({ pinDir: n.pinDir, maxVips: 2, maglevSize: M });
    try {
      return fn(dp);
    } finally {
      dp.close();
    }
  }

  /** New flows at node n, each given the target its row picks (as its datapath does) and recorded in its map only. */
  establish(n: Node, count: number, base: number): Flow[] {
    return this.withMaps(n, (dp) => {
      const row = dp.maglevRow(this.slot(n), 6);
      const flows = Array.from({ length: count }, (_, i): Flow => {
        const key: MapKey = { vip: this.vip, client: `fd00:${50 + Number(n.name.slice(1))}::${(base + i).toString(16)}`, vport: 9000, cport: 30000 + ((base + i) % 30000), proto: 6 };
        return { key, target: row[lbHash(key, LB_HASH_SEED) % M], node: n.name };
      });
      assert.ok(flows.every((f) => f.target), 'every new flow found a target in the row');
      dp.installMappings(flows.map((f) => ({ key: f.key, target: f.target, lastNs: nowNs() })));
      return flows;
    });
  }

  slot(n: Node): number {
    return Number(this.status(n)?.slot);
  }

  /** Where each flow goes if it arrives at node n: its mapping there if still valid, else n's row. */
  decide(n: Node, flows: Array<{ key: MapKey }>): string[] {
    return this.withMaps(n, (dp) => {
      const row = dp.maglevRow(this.slot(n), 6);
      const targets = dp.targetsOf(this.vip);
      const local = new Map(dp.mappings().filter((m) => m.vip === this.vip).map((m) => [fieldOf(m), m.target]));
      return flows.map((f) => {
        const t = local.get(fieldOf(f.key));
        return t && targets.has(t) ? t : row[lbHash(f.key, LB_HASH_SEED) % M];
      });
    });
  }

  /** Flows that would reach another target than their own on some live node (ECMP may send any flow to any node). */
  moved(flows: Flow[]): string[] {
    const out: string[] = [];
    for (const n of this.live()) {
      const got = this.decide(n, flows);
      flows.forEach((f, i) => {
        if (got[i] !== f.target) out.push(`${f.node}'s ${f.key.client}:${f.key.cport} → ${got[i]} on ${n.name} (was ${f.target})`);
      });
    }
    return out;
  }

  async storedMappings(): Promise<number> {
    const raw = new Redis(this.redis.socketPath);
    try {
      let n = 0;
      for (const k of await raw.keys(`${this.prefix}lb:{${this.vip}#*}:map`)) n += await raw.hlen(k);
      return n;
    } finally {
      raw.disconnect();
    }
  }

  kill(n: Node): Promise<void> {
    n.alive = false;
    return n.ctl.stop();
  }

  async close(): Promise<void> {
    for (const n of this.nodes) {
      if (n.alive) await n.ctl.stop().catch(() => undefined);
      await n.store.close().catch(() => undefined);
      await n.ipam.close().catch(() => undefined);
      try {
        const dp = LbDatapath.load({ pinDir: n.pinDir, maxVips: 2, maglevSize: M });
        dp.close({ unpin: true });
      } catch {
        // the directory goes next
      }
      delNetns(n.ns);
      fs.rmSync(n.pinDir, { recursive: true, force: true });
      fs.rmSync(n.dir, { recursive: true, force: true });
    }
  }
}

async function withCluster(fn: (c: Cluster) => Promise<void>, changeWaitMs?: number): Promise<void> {
  const redis = await startRedis();
  const c = new Cluster(redis, changeWaitMs);
  try {
    await fn(c);
  } finally {
    await c.close();
    await redis.stop();
  }
}

/** The flows whose pick differs between two target sets. */
function pickChanges(flows: Flow[], from: string[], to: string[]): number {
  const a = maglevTable(from, M);
  const b = maglevTable(to, M);
  return flows.filter((f) => pickOf(a, f.key, LB_HASH_SEED) !== pickOf(b, f.key, LB_HASH_SEED)).length;
}

test('IPv6 VIP: a steady target set records nothing per flow; a target added: each node records only the flows it moves (read from lb_mappings6), all switch together, no flow moves anywhere', async () => {
  await withCluster(async (c) => {
    const nodes = [await c.add('n1', [A, B, C]), await c.add('n2', [A, B, C]), await c.add('n3', [A, B, C])];
    const v1 = await c.settled('one table version on every node');
    for (const n of nodes) assert.is(c.table(n).mode, 'change');
    const flows = nodes.flatMap((n, i) => c.establish(n, FLOWS, i * FLOWS));
    await until('the datapath is quiet on every node', async () => nodes.every((n) => !c.table(n).recording));
    // A sync period passes (mappings used since the last sync would be written back or touched here).
    await new Promise((r) => setTimeout(r, 2500));
    assert.is(await c.storedMappings(), 0, 'a steady target set: no mapping in the store');
    assert.equal(c.moved(flows), [], 'every flow goes to its target from every node');

    c.withMaps(nodes[0], (dp) => {
      assert.is(dp.mappingCounts()[6], FLOWS, 'the flows are in the IPv6 mapping table');
      assert.ok(dp.maglevRow(c.slot(nodes[0]), 4).every((t) => t === ''), 'the slot\'s IPv4 row is empty');
    });
    for (const n of nodes) await n.ctl.apply(config([A, B, C, D]));
    const v2 = await c.settled('the new version on every node', v1 + 1);
    assert.is(v2, v1 + 1);
    const expected = pickChanges(flows, [A, B, C], [A, B, C, D]);
    assert.ok(expected > 0 && expected < flows.length / 2, `some flows' pick changed (${expected} of ${flows.length})`);
    assert.equal(c.moved(flows), [], 'no flow moved, on any node');
    assert.is(await c.storedMappings(), expected, 'the store holds exactly the flows the change moved');
    // New flows after the change go by the new row, everywhere alike.
    const fresh = c.establish(nodes[0], 100, 10_000);
    assert.equal(c.moved(fresh), []);
  });
});

test.run();
