// Which nodes ask the cluster store for a Service's VIP, against a real redis-server (each node's store
// connections through a counting relay, test/lib/redis-meter.ts): a node with no LB pod and no target of
// a Service sends no store command for it, at start and at steady state; a node that gets a target later
// allocates and gets the VIP tether-operator holds (it holds every one); a node whose need ends forgets the VIP without
// releasing it; a deleted Service's VIP is released and its mappings dropped once, by the nodes (and the operator) that held it; one deleted while nobody held it is collected by the operator.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { Writable } from 'node:stream';
import Redis from 'ioredis';
import { makeLogger, setLogger } from '../../lib/log';
import { ClusterAddresses } from '../../ipam/cluster-addresses';
import { validatePools } from '../../ipam/pool';
import { RedisStore } from '../../ipam/store/redis-store';
import { LbController } from '../../daemon/lb/lb-controller';
import { connectLbStore, type LbStore } from '../../daemon/lb/lb-store';
import { resolveLoadBalancers, type LbResolution } from '../../daemon/lb/lb-spec';
import { LbView } from '../../operator/cluster-view';
import { PodStore } from '../../daemon/state/pod-store';
import { AttachService } from '../../daemon/pod/attach-service';
import { lbServiceObjects } from '../lib/lb-objects';
import { startRedis, type TestRedis } from '../lib/redis';
import { meterRedis, type RedisMeter } from '../lib/redis-meter';
import { LB_CLASS } from '../../daemon/objects/names';

const quiet = makeLogger({ level: 'error', stream: new Writable({ write: (_c, _e, cb) => cb() }) });
setLogger(quiet);
const N = 100;
const pools = validatePools([
  { apiVersion: 'tether.dev/v1alpha1', kind: 'AddressPool', metadata: { name: 'lb' }, spec: { usage: 'loadBalancer', ipv4: { cidr: '198.18.0.0/22' } } },
]);

/** N Services; each one's single target on the node `targetNode(i)` names. */
const objects = (targetNode: (i: number) => string, n = N) => lbServiceObjects(n, targetNode);

interface Node {
  ctl: LbController;
  meter: RedisMeter;
  store: LbStore;
  drops: string[];
  close(): Promise<void>;
}

let redis: TestRedis;
let raw: Redis;
let dir: string;
test.before(async () => {
  redis = await startRedis();
  raw = new Redis({ path: redis.socketPath });
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tether-vip-need-'));
});
test.after(async () => {
  raw?.disconnect();
  await redis?.stop();
  if (dir) fs.rmSync(dir, { recursive: true, force: true });
});

/** Store connections (IPAM and mapping store) through one counting relay; the VIPs whose mappings were dropped. */
async function connections(prefix: string) {
  const meter = await meterRedis(redis.socketPath);
  const ipam = await RedisStore.connect(meter.url, { keyPrefix: prefix });
  const store = await connectLbStore(meter.url, { keyPrefix: prefix });
  const drops: string[] = [];
  const drop = store.mappings.drop.bind(store.mappings);
  store.mappings.drop = (vip: string) => (drops.push(vip), drop(vip));
  return { meter, ipam, store, drops };
}

/** A node's LB controller whose store connections go through one counting relay. */
async function node(name: string, prefix: string): Promise<Node> {
  const { meter, ipam, store, drops } = await connections(prefix);
  const d = path.join(dir, `${prefix}${name}`);
  const ctl = new LbController({
    node: { name, address: '127.0.0.1' }, pinDir: path.join(d, 'bpf'), fouPort: 5555, exportTable: 0, maxVips: 16,
    store, addresses: new ClusterAddresses(pools, ipam, quiet, { holdOffMs: 0 }), attach: new AttachService(new PodStore(path.join(d, 'state')), quiet), logger: quiet,
  });
  return {
    ctl, meter, store, drops,
    close: async () => {
      await ctl.stop();
      await store.connection.close();
      await ipam.close();
      await meter.close();
    },
  };
}

/** tether-operator's view of the VIPs (operator/cluster-view.ts), over its own counting relay: it holds every Service's VIP. */
async function leader(prefix: string) {
  const { meter, ipam, store, drops } = await connections(prefix);
  const view = new LbView({ identity: 'tether-operator-0', addresses: new ClusterAddresses(pools, ipam, quiet, { holdOffMs: 0 }), store, logger: quiet });
  let last: LbResolution = resolveLoadBalancers([], pools);
  return {
    view, meter, store, drops,
    apply: async (r: LbResolution) => {
      last = r;
      await view.refresh(r, pools);
    },
    /** Another status pass over the same Services. */
    kick: () => view.refresh(last, pools),
    status: () => view.status(),
    close: async () => {
      await store.connection.close();
      await ipam.close();
      await meter.close();
    },
  };
}

test('a node with no LB pod and no target of 100 Services sends no store command for them, at start and at steady state', async () => {
  const n1 = await node('n1', 'quiet:');
  try {
    // The node's own store traffic with no Service at all (its registry beat), then none counted after.
    await n1.ctl.apply(resolveLoadBalancers([], pools));
    n1.meter.reset();
    const r = resolveLoadBalancers(objects(() => 'n9'), pools);
    assert.is(r.loadBalancers.length, N);
    await n1.ctl.apply(r); // start: the Services appear
    for (let i = 0; i < 3; i++) await n1.ctl.kick(); // steady state
    const sent = Object.fromEntries(n1.meter.commands);
    // Before: every node allocated every Service's VIP (an allocation script each, and the generation polled).
    assert.is(n1.meter.totalCommands(), 0, `store commands for Services this node does not concern: ${JSON.stringify(sent)}`);
    const st = n1.ctl.status();
    assert.is(st.length, N);
    assert.ok(st.every((s) => s.vip === undefined && String(s.vipHere).startsWith('not needed')), `status says the VIP is not needed here: ${JSON.stringify(st[0])}`);
    assert.not.ok(st.some((s) => s.problem), 'not reported as a problem');
    assert.is(n1.ctl.current().length, N, 'health checks still answer for every Service');
  } finally {
    await n1.close();
  }
});

test('a node that gets a target later asks for that VIP only and gets the one the operator holds; when its need ends it forgets it without releasing', async () => {
  const lead = await leader('later:');
  const n1 = await node('n1', 'later:');
  try {
    const r = resolveLoadBalancers(objects(() => 'n9'), pools);
    await lead.apply(r);
    const held = new Map(lead.status().map((s) => [s.service, s.vip]));
    assert.is(new Set(held.values()).size, N, 'the operator holds every VIP');
    await n1.ctl.apply(r);
    assert.ok(n1.ctl.status().every((s) => s.vip === undefined));
    // svc-7 gets a target on n1.
    n1.meter.reset();
    await n1.ctl.apply(resolveLoadBalancers(objects((i) => (i === 7 ? 'n1' : 'n9')), pools));
    const st = n1.ctl.status();
    const mine = st.filter((s) => s.vip);
    assert.equal(mine.map((s) => s.service), ['shop/svc-7'], 'only the Service with a target here');
    assert.is(mine[0].vip, held.get('shop/svc-7'), 'the VIP the operator holds');
    assert.ok(n1.meter.totalCommands() > 0 && n1.meter.totalCommands() < 20, `one allocation's commands: ${JSON.stringify(Object.fromEntries(n1.meter.commands))}`);
    // The target moves away: forgotten here, still allocated to the Service in the store.
    n1.meter.reset();
    await n1.ctl.apply(r);
    await n1.ctl.kick();
    assert.ok(n1.ctl.status().every((s) => s.vip === undefined), 'forgotten here');
    assert.not.ok(n1.meter.commands.get('evalsha') || n1.meter.commands.get('eval'), `no release script sent: ${JSON.stringify(Object.fromEntries(n1.meter.commands))}`);
    assert.is(n1.drops.length, 0);
    // Asked again by the operator: still the same VIP (it was not freed).
    await lead.kick();
    assert.equal(new Map(lead.status().map((s) => [s.service, s.vip])), held);
  } finally {
    await n1.close();
    await lead.close();
  }
});

test('a deleted Service\'s VIP is released and its mappings dropped exactly once; a node that forgot it sends nothing', async () => {
  const prefix = 'deleted:';
  const lead = await leader(prefix);
  const n1 = await node('n1', prefix);
  const n2 = await node('n2', prefix);
  try {
    const r = resolveLoadBalancers(objects((i) => (i === 3 ? 'n1' : 'n9'), 5), pools);
    await lead.apply(r);
    for (const n of [n1, n2]) await n.ctl.apply(r);
    const vip = String(lead.status().find((s) => s.service === 'shop/svc-3')!.vip);
    assert.is(n1.ctl.status().find((s) => s.service === 'shop/svc-3')!.vip, vip, 'n1 holds it (its target is here)');
    // n2 held it once (a target there), then forgot it.
    await n2.ctl.apply(resolveLoadBalancers(objects((i) => (i === 3 ? 'n2' : 'n9'), 5), pools));
    assert.is(n2.ctl.status().find((s) => s.service === 'shop/svc-3')!.vip, vip);
    await n2.ctl.apply(r);
    assert.is(n2.ctl.status().find((s) => s.service === 'shop/svc-3')!.vip, undefined);
    await lead.store.mappings.claim(vip, [{ key: { vip, client: '192.0.2.7', vport: 0, cport: 0, proto: 0 }, target: '10.244.0.3' }]);
    const keys = async () => (await raw.keys(`${prefix}lb:{${vip}*`)).sort();
    assert.ok((await keys()).length >= 1, 'a mapping stored');
    const ownerKeysBefore = await raw.keys(`${prefix}*`);
    assert.ok(ownerKeysBefore.length > 0);
    // svc-3 deleted.
    const gone = resolveLoadBalancers(objects((i) => (i === 3 ? 'n1' : 'n9'), 5).filter((o) => !String((o.metadata as { name: string }).name).startsWith('svc-3')), pools);
    n2.meter.reset();
    await lead.apply(gone);
    for (const n of [n1, n2]) await n.ctl.apply(gone);
    assert.equal(await keys(), [], 'nothing of the VIP left in the store');
    assert.is(lead.drops.length + n1.drops.length + n2.drops.length, 1, `mappings dropped once: ${JSON.stringify([lead.drops, n1.drops, n2.drops])}`);
    assert.is(n2.meter.totalCommands(), 0, `the node that forgot it sends nothing: ${JSON.stringify(Object.fromEntries(n2.meter.commands))}`);
    // The address is free: a new Service asking for it by address gets it.
    const again = resolveLoadBalancers([...objects(() => 'n9', 5).filter((o) => !String((o.metadata as { name: string }).name).startsWith('svc-3')), {
      apiVersion: 'v1', kind: 'Service', metadata: { name: 'other', namespace: 'shop' },
      spec: { type: 'LoadBalancer', loadBalancerClass: LB_CLASS, loadBalancerIP: vip, ports: [{ port: 80, protocol: 'TCP' }] },
    }], pools);
    await lead.apply(again);
    const other = lead.status().find((s) => s.service === 'shop/other');
    assert.is(other?.vip, vip, `the freed VIP given to another Service: ${JSON.stringify(other)}`);
  } finally {
    for (const n of [n2, n1, lead]) await n.close();
  }
});

test('a Service deleted while no node held its VIP (no operator then) is collected by the operator, after a grace', async () => {
  const prefix = 'orphan:';
  const realNow = Date.now;
  let skew = 0;
  Date.now = () => realNow() + skew;
  const n1 = await node('n1', prefix);
  const lead = await leader(prefix);
  const lookStore = await RedisStore.connect(redis.url, { keyPrefix: prefix });
  const look = new ClusterAddresses(pools, lookStore, quiet);
  try {
    const all = objects((i) => (i === 3 ? 'n1' : 'n9'), 5);
    await n1.ctl.apply(resolveLoadBalancers(all, pools));
    const vip = String(n1.ctl.status().find((s) => s.service === 'shop/svc-3')!.vip);
    assert.ok(vip && vip !== 'undefined');
    // Its target leaves n1 (forgotten, not released), then the Service is deleted: nobody holds it.
    await n1.ctl.apply(resolveLoadBalancers(objects(() => 'n9', 5), pools));
    const without = resolveLoadBalancers(all.filter((o) => !String((o.metadata as { name: string }).name).startsWith('svc-3')), pools);
    await n1.ctl.apply(without);
    const stillHeld = async () => (await look.holders('lb')).get(vip);
    assert.is(await stillHeld(), 'lb/shop/svc-3', 'left allocated in the store');
    // The operator starts: the first look only notes the owner no Service names.
    await lead.apply(without);
    assert.is(await stillHeld(), 'lb/shop/svc-3', 'not collected on the first look');
    const live = new Map(lead.status().map((s) => [s.service, s.vip]));
    assert.is(live.size, 4);
    skew += 61_000;
    await lead.kick();
    assert.is(await stillHeld(), undefined, 'collected after the grace');
    assert.equal(lead.drops, [vip], 'its mappings dropped once');
    assert.equal(new Map(lead.status().map((s) => [s.service, s.vip])), live, 'the live Services keep their VIPs');
  } finally {
    Date.now = realNow;
    await lookStore.close();
    await lead.close();
    await n1.close();
  }
});

test.run();
