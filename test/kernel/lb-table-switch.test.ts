// Record on change, on the real parts: LB nodes in this process, each an LbController with its own pinned
// lb.bpf.o maps (a unique bpffs directory) and its own store connections, on one real redis-server. Live
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
import { memberCall } from '../../daemon/common/member-registry';
import { nodesKey } from '../../daemon/common/node-registry';
import { recordsOnChange } from '../../daemon/lb/table-switch';
import { until } from '../lib/wait';

const logger = makeLogger({ level: process.env.LB_SWITCH_LOG ? 'info' : 'error', stream: process.env.LB_SWITCH_LOG ? process.stdout : new Writable({ write: (_c, _e, cb) => cb() }) });
setLogger(logger);

const M = 251;
const A = '10.244.9.2';
const B = '10.244.9.3';
const C = '10.244.9.4';
const D = '10.244.9.5';
const E = '10.244.9.6';
const FLOWS = 300;
const pools = validatePools([{ apiVersion: 'tether.dev/v1alpha1', kind: 'AddressPool', metadata: { name: 'lb' }, spec: { usage: 'loadBalancer', ipv4: { cidr: '198.18.7.0/28' } } }]);

function config(targets: string[], terminating: string[] = []) {
  return resolveLoadBalancers([
    { apiVersion: 'v1', kind: 'Service', metadata: { name: 'db', namespace: 'shop', annotations: { 'lb.tether.dev/affinity': 'flow' } }, spec: { type: 'LoadBalancer', loadBalancerClass: LB_CLASS, ports: [{ port: 9000, protocol: 'TCP' }] } },
    {
      apiVersion: 'discovery.k8s.io/v1', kind: 'EndpointSlice', metadata: { name: 'db-x', namespace: 'shop', labels: { 'kubernetes.io/service-name': 'db' } }, addressType: 'IPv4',
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
      network: 'tether', containerId: `c-${name}`, ifName: 'eth0', netns, podNamespace: 'shop', podName: `lb-${name}`, ips: [`10.244.${i}.9`], hostIfName: `tswnone${i}`,
      labels: { 'tether.dev/role': 'lb' }, phase: 'attached', config: {}, createdAt: new Date().toISOString(),
    });
    const ipam = await RedisStore.connect(this.redis.url, { keyPrefix: this.prefix });
    const store = await connectLbStore(this.redis.url, { keyPrefix: this.prefix, timeoutMs: 500 });
    const ctl = new LbController({
      node: { name, address: `127.0.0.${i}` }, pinDir, fouPort: 5555, exportTable: 0, maxVips: 2, maglevSize: M, changeWaitMs: this.changeWaitMs, datapath: 'pod', uplink: 'tswnone',
      store, addresses: new ClusterAddresses(pools, ipam, logger), attach: new AttachService(pods, logger), logger,
    });
    const node: Node = { name, ctl, store, ipam, pinDir, dir, ns, alive: true };
    this.nodes.push(node);
    await ctl.start();
    await ctl.apply(config(targets, terminating));
    const st = await until(`${name} has the VIP in a slot`, async () => this.status(node)?.slot !== undefined && this.status(node)).catch((e) => {
      throw new Error(`${(e as Error).message}: ${JSON.stringify(this.status(node))}`);
    });
    this.vip = String(st.vip);
    return node;
  }

  status(n: Node): Record<string, unknown> | undefined {
    return n.ctl.status().find((s) => s.service === 'shop/db');
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
      const row = dp.maglevRow(this.slot(n));
      const flows = Array.from({ length: count }, (_, i): Flow => {
        const key: MapKey = { vip: this.vip, client: `10.${50 + Number(n.name.slice(1))}.${(base + i) >> 8 & 255}.${(base + i) & 255}`, vport: 9000, cport: 30000 + ((base + i) % 30000), proto: 6 };
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
      const row = dp.maglevRow(this.slot(n));
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

test('a steady target set records nothing per flow; a target added: each node records only the flows it moves, all switch together, no flow moves anywhere', async () => {
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

test('two changes in quick succession while one node\'s configuration lags: nothing switches before every live node recorded; a node joining mid-switch forwards by the active table until the switch', async () => {
  await withCluster(async (c) => {
    const [n1, n2, n3] = [await c.add('n1', [A, B, C]), await c.add('n2', [A, B, C]), await c.add('n3', [A, B, C])];
    const v1 = await c.settled('one table version on every node');
    const flows = [n1, n2, n3].flatMap((n, i) => c.establish(n, FLOWS, i * FLOWS));
    await n1.ctl.apply(config([A, B, C, D]));
    await n2.ctl.apply(config([A, B, C, D]));
    await n1.ctl.apply(config([A, B, C, D, E]));
    await n2.ctl.apply(config([A, B, C, D, E]));
    const pending = await until('the change waits for n3', async () => {
      const t = c.table(n1);
      return t.pending?.waitingFor.includes('n3') ? t : undefined;
    });
    await new Promise((r) => setTimeout(r, 1000));
    for (const n of [n1, n2, n3]) {
      assert.is(c.table(n).version, v1, `${n.name} still forwards by version ${v1}`);
      assert.ok(c.table(n).recording, `${n.name} records new picks while the change waits`);
    }
    assert.equal(c.moved(flows), []);
    // A node joins mid-switch: it forwards by the active version too.
    const n4 = await c.add('n4', [A, B, C, D, E]);
    await until('n4 forwards by the active version', async () => c.table(n4).version === v1);
    const probe = Array.from({ length: 200 }, (_, i) => ({ key: { vip: c.vip, client: `10.99.0.${i}`, vport: 9000, cport: 1000 + i, proto: 6 } }));
    const old = maglevTable([A, B, C], M);
    assert.equal(c.decide(n4, probe), probe.map((p) => pickOf(old, p.key, LB_HASH_SEED)), 'n4 picks as the active version does');
    assert.ok(pending.pending!.version > v1);
    await n3.ctl.apply(config([A, B, C, D, E]));
    const v = await c.settled('the last target set on every node', v1 + 1);
    const newest = maglevTable([A, B, C, D, E], M);
    assert.equal(c.decide(n4, probe), probe.map((p) => pickOf(newest, p.key, LB_HASH_SEED)), 'the last target set is the one in force');
    assert.equal(c.moved(flows), [], `no flow moved through versions ${v1}→${v}`);
    assert.is(await c.storedMappings(), pickChanges(flows, [A, B, C], [A, B, C, D, E]) + pickChanges(flows, [A, B, C], [A, B, C, D]) - pickChanges(flows.filter((f) => {
      // Flows recorded for both proposals are one record each.
      const x = maglevTable([A, B, C, D], M);
      const y = maglevTable([A, B, C, D, E], M);
      return pickOf(x, f.key, LB_HASH_SEED) !== f.target && pickOf(y, f.key, LB_HASH_SEED) !== f.target;
    }), [A, B, C], [A, B, C, D]), 'the store holds the flows either proposal would have moved, once each');
  });
});

test('an LB node killed during a change: the change waits until its membership lapses (--lb-change-wait), then the live nodes switch and none of their flows moves', async () => {
  await withCluster(async (c) => {
    const [n1, n2, n3] = [await c.add('n1', [A, B, C]), await c.add('n2', [A, B, C]), await c.add('n3', [A, B, C])];
    const v1 = await c.settled('one table version on every node');
    const flows = [n1, n2].flatMap((n, i) => c.establish(n, FLOWS, i * FLOWS));
    await c.kill(n3);
    const t0 = Date.now();
    await n1.ctl.apply(config([A, B, C, D]));
    await n2.ctl.apply(config([A, B, C, D]));
    await until('the change waits for the killed node', async () => c.table(n1).pending?.waitingFor.join() === 'n3');
    assert.is(c.table(n1).version, v1);
    assert.ok(c.table(n1).recording && c.table(n2).recording, 'the live nodes record new picks meanwhile');
    const v2 = await c.settled('the live nodes switch once n3 lapsed', v1 + 1, 20_000);
    const waited = Date.now() - t0;
    process.stdout.write(`  change waited ${waited} ms for the killed LB node (--lb-change-wait 4 s)\n`);
    assert.ok(waited >= 2500, `the change waited for the killed node (${waited} ms)`);
    assert.is(v2, v1 + 1);
    assert.equal(c.moved(flows), []);
  }, 4000);
});

test('the store hung during a change: every node keeps the active row (no flow moves) and a removed target gets no new client; once the store answers the change is recorded and made', async () => {
  await withCluster(async (c) => {
    const [n1, n2, n3] = [await c.add('n1', [A, B, C]), await c.add('n2', [A, B, C]), await c.add('n3', [A, B, C])];
    const v1 = await c.settled('one table version on every node');
    const flows = [n1, n2, n3].flatMap((n, i) => c.establish(n, FLOWS, i * FLOWS));
    c.redis.pause();
    try {
      // A removed, D added, while the store does not answer.
      for (const n of [n1, n2, n3]) await n.ctl.apply(config([B, C, D]));
      await new Promise((r) => setTimeout(r, 2500));
      for (const n of [n1, n2, n3]) assert.is(c.table(n).version, v1, `${n.name} forwards by version ${v1} still`);
      const kept = flows.filter((f) => f.target !== A);
      assert.equal(c.moved(kept), [], 'no flow moved during the outage');
      const probe = Array.from({ length: 300 }, (_, i) => ({ key: { vip: c.vip, client: `10.98.${i >> 8}.${i & 255}`, vport: 9000, cport: 2000 + i, proto: 6 } }));
      for (const n of [n1, n2, n3]) assert.not.ok(c.decide(n, probe).includes(A), `${n.name} gives the removed target no new client`);
    } finally {
      c.redis.resume();
    }
    await c.settled('the change made once the store answers', v1 + 1, 30_000);
    assert.equal(c.moved(flows.filter((f) => f.target !== A)), [], 'no flow moved through the change');
  });
});

test('a terminating target drains: its flows are recorded at the change and keep it on every node, new clients go elsewhere; removed, its flows go', async () => {
  await withCluster(async (c) => {
    const [n1, n2] = [await c.add('n1', [A, B, C]), await c.add('n2', [A, B, C])];
    const v1 = await c.settled('one table version on every node');
    const flows = [n1, n2].flatMap((n, i) => c.establish(n, FLOWS, i * FLOWS));
    const onA = flows.filter((f) => f.target === A);
    assert.ok(onA.length > 0);
    for (const n of [n1, n2]) await n.ctl.apply(config([B, C], [A]));
    await c.settled('A no longer in the row', v1 + 1);
    assert.equal(c.moved(flows), [], 'every flow, those on the terminating target too, keeps its target on every node');
    const probe = Array.from({ length: 300 }, (_, i) => ({ key: { vip: c.vip, client: `10.97.${i >> 8}.${i & 255}`, vport: 9000, cport: 3000 + i, proto: 6 } }));
    for (const n of [n1, n2]) assert.not.ok(c.decide(n, probe).includes(A), 'no new client for the terminating target');
    for (const n of [n1, n2]) await n.ctl.apply(config([B, C]));
    await until('A gone from the datapath', async () => [n1, n2].every((n) => c.withMaps(n, (dp) => !dp.targetsOf(c.vip).has(A))));
    for (const n of [n1, n2]) assert.not.ok(c.decide(n, onA).includes(A), `${n.name}: the removed target's flows go elsewhere`);
    assert.equal(c.moved(flows.filter((f) => f.target !== A)), []);
  });
});

test('beside a node of a release before table versions (0.1.0 registers no release): every new pick is recorded, as that release does; once it is gone, nothing is', async () => {
  assert.equal(['', '0.1.0', '0.1.9', '0.2.0', '0.2.1', '0.10.0', '1.0.0', 'x'].map(recordsOnChange), [false, false, false, true, true, true, true, false]);
  await withCluster(async (c) => {
    const [n1, n2] = [await c.add('n1', [A, B, C]), await c.add('n2', [A, B, C])];
    await c.settled('one table version on every node');
    await until('quiet on both', async () => [n1, n2].every((n) => !c.table(n).recording));
    const raw = new Redis(c.redis.socketPath);
    try {
      // A node of 0.1.0 registers its address only.
      await memberCall(raw, nodesKey(c.prefix), 'old1', JSON.stringify({ address: '127.0.0.99' }), 20_000, -1);
      await until('every new pick recorded beside the 0.1.0 node', async () => [n1, n2].every((n) => c.table(n).recording));
      await memberCall(raw, nodesKey(c.prefix), 'old1', undefined, 0, -1);
      await until('quiet again once it left', async () => [n1, n2].every((n) => !c.table(n).recording));
    } finally {
      raw.disconnect();
    }
  });
});

test.run();
