// What one node's periodic store pass (the Egress controller's real StoreRecords, against a real Redis
// through a counting relay) costs the store as the cluster grows: the same commands and the same reply
// bytes with 4 or 200 registered nodes (and 200 client nodes reporting usage); a node that plays no part
// in any Egress sends only its own registration and reads nothing; entries of nodes that stopped are
// removed by whichever pass first sees them expired.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { Writable } from 'node:stream';
import Redis from 'ioredis';
import { makeLogger, setLogger } from '../../lib/log';
import { ClusterAddresses } from '../../ipam/cluster-addresses';
import { validatePools } from '../../ipam/pool';
import { RedisStore } from '../../ipam/store/redis-store';
import type { ResolvedPool } from '../../ipam/types';
import { OwnershipStore, type GatewayInfo } from '../../daemon/egress/ownership-store';
import type { EgressShared } from '../../daemon/egress/egress-state';
import { egressParts, type EgressParts } from '../../daemon/egress/egress-controller';
import type { GatewayDatapath } from '../../daemon/egress/gateway-datapath';
import type { ResolvedEgress } from '../../daemon/egress/egress-spec';
import type { AttachService } from '../../daemon/pod/attach-service';
import { LEFT_GRACE_MS, registerNode } from '../../daemon/common/node-registry';
import { startRedis, type TestRedis } from '../lib/redis';
import { meterRedis, serverCommands, serverDelta, totalOf, type RedisMeter } from '../lib/redis-meter';
import { SAFETY_EVERY_MS } from '../../daemon/egress/store-records';

// Passes run 1 s apart on a virtual clock (Date.now moved forward between passes), as the controller's
// timer runs them: what is sent only every few seconds shows at its real rate. The store's own clock (TTLs)
// is not moved, so nothing expires meanwhile.
const realNow = Date.now;
let skew = 0;
Date.now = () => realNow() + skew;
const later = (ms: number) => {
  skew += ms;
};

const quiet = makeLogger({ level: 'error', stream: new Writable({ write: (_c, _e, cb) => cb() }) });
setLogger(quiet);

const pools: ResolvedPool[] = validatePools([
  { apiVersion: 'tether.dev/v1alpha1', kind: 'AddressPool', metadata: { name: 'float' }, spec: { usage: 'floating', ipv4: { cidr: '198.51.100.0/28' } } },
]);
const EGRESS: ResolvedEgress = {
  key: 'shop/out', name: 'out', namespace: 'shop',
  clients: { matchLabels: { app: 'client' } }, gateways: { matchLabels: { app: 'gw' } },
  families: [4], destinations: ['203.0.113.0/24'], excluded: [], addresses: [{ pool: 'float', count: 1 }], zonePolicy: 'any',
  failover: { intervalMs: 50, detectMultiplier: 3 }, announce: { mode: 'l2' },
};
const PASSES = 8;
const addressOf = (i: number) => `10.1.${i >> 8}.${i & 255}`;
const gw = (i: number): GatewayInfo => ({ pod: `shop/gw-${i}`, node: `n${i}`, nodeAddress: addressOf(i), podIp: `10.244.${i >> 8}.${i & 255}` });

let redis: TestRedis;
let raw: Redis;
const cleanups: Array<() => Promise<void> | void> = [];

test.before(async () => {
  redis = await startRedis();
  raw = new Redis({ path: redis.socketPath });
});
test.after.each(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});
test.after(async () => {
  raw?.disconnect();
  await redis?.stop();
});

type Role = 'gateway' | 'client' | 'none';

/** One simulated node: the controller's shared state and parts, its store connections through `meter`. */
async function simNode(prefix: string, i: number, role: Role, meter: RedisMeter): Promise<EgressParts> {
  const ownership = await OwnershipStore.connect(meter.url, { keyPrefix: prefix });
  const store = await RedisStore.connect(meter.url, { keyPrefix: prefix });
  cleanups.push(() => ownership.close(), () => store.close());
  const n = egressParts({
    node: { name: `n${i}`, address: addressOf(i), uplink: 'eth0' }, pinDir: '/nonexistent', fouPort: 0, syncPort: 0, clusterKey: Buffer.alloc(32),
    egresses: [EGRESS], ownership, addresses: new ClusterAddresses(pools, store, quiet, { holdOffMs: 0 }), attach: {} as AttachService, logger: quiet,
  });
  // Recording stand-ins for the kernel side: only what the store pass touches.
  const allowed: string[][] = [];
  if (role === 'gateway') n.s.gateways.set(`shop/gw-${i}`, { info: gw(i), datapath: { setAllowedSources: (n: string[]) => allowed.push(n) } as unknown as GatewayDatapath, egresses: new Set([EGRESS.key]), guarded: '', netns: '' });
  if (role === 'client') n.s.clients.set('shop/client', { ip: '10.244.200.1', hostIfName: 'vethc', egressIds: [1] });
  return n;
}

/** A cluster of `n` registered nodes, 3 of them gateways of the Egress, every one reporting usage; all live for a minute. */
async function cluster(prefix: string, n: number): Promise<void> {
  const other = await OwnershipStore.connect(redis.url, { keyPrefix: prefix });
  cleanups.push(() => other.close());
  for (let i = 1; i <= n; i++) {
    await registerNode(raw, prefix, `n${i}`, addressOf(i), 60_000);
    await other.reportUsage(EGRESS.key, `n${i}`, { '198.51.100.1': { flows: 1, bytes: 10 } }, 60_000);
  }
  for (let i = 1; i <= 3; i++) await other.registerGateways(EGRESS.key, `n${i}`, [gw(i)], 60_000);
}

/** Commands and reply bytes of PASSES periodic passes of node `i` (after warm-up passes). */
async function steadyCost(prefix: string, i: number, role: Role, observed = false) {
  const meter = await meterRedis(redis.socketPath);
  cleanups.push(() => meter.close());
  const n = await simNode(prefix, i, role, meter);
  for (let k = 0; k < 3; k++) {
    later(1000);
    await n.store.storePass();
  }
  if (observed) n.s.observedUntil = Date.now() + 60_000;
  meter.reset();
  const before = await serverCommands(raw);
  for (let k = 0; k < PASSES; k++) {
    later(1000);
    await n.store.storePass();
  }
  // What the server ran, scripts' inner commands included (the scale bench's count).
  const server = serverDelta(before, await serverCommands(raw));
  return { commands: Object.fromEntries([...meter.commands].sort()), total: meter.totalCommands(), bytes: meter.replyBytes, server, s: n.s };
}

for (const role of ['gateway', 'client', 'none'] as Role[]) {
  test(`a ${role === 'none' ? 'node with no part in the Egress' : `${role} node`}: the same commands and reply bytes per pass with 4 or 200 registered nodes`, async () => {
    const small = `load${role}4:`;
    const large = `load${role}200:`;
    await cluster(small, 4);
    await cluster(large, 200);
    // The measured node is one more node (a gateway: the fourth gateway of the Egress).
    const a = await steadyCost(small, 500, role, role !== 'none');
    const b = await steadyCost(large, 500, role, role !== 'none');
    process.stdout.write(`\n  ${role}: 4 nodes ${a.total / PASSES} commands/pass ${a.bytes / PASSES} B/pass; 200 nodes ${b.total / PASSES} commands/pass ${b.bytes / PASSES} B/pass ${JSON.stringify(b.commands)}; server-side ${totalOf(b.server) / PASSES}/pass ${JSON.stringify(b.server)}\n`);
    assert.equal(b.commands, a.commands, 'the same commands');
    assert.ok(Math.abs(b.bytes - a.bytes) <= a.bytes * 0.1, `reply bytes within 10 %: ${a.bytes} vs ${b.bytes}`);
    assert.ok(b.bytes / PASSES < 400, `a pass's replies are small: ${b.bytes / PASSES} B`);
    // The pass still knows the cluster: every node's address (FoU allow-lists), the Egress's candidates.
    assert.is(b.s.nodes.length, role === 'none' ? 201 : 201);
    if (role !== 'none') assert.is(b.s.registry.get(EGRESS.key)?.length, role === 'gateway' ? 4 : 3);
    if (role !== 'none') assert.equal(b.s.usage.get(EGRESS.key)?.['198.51.100.1']?.flows, 200, 'usage summed in the store over 200 nodes');
    // Server-side commands (inside scripts too) per 1 s pass. Before issue 21's store-load cuts: 6 (none),
    // 16 (client), 18 (gateway): a registration refreshed every pass with its value read back, the
    // generation script (TIME + 3 GETs) every pass, the Egress's record read every pass.
    // Measured without a status reader (one sums the usage in the store, an HGET per reporting node).
    const c = role === 'none' ? b : await steadyCost(large, 501, role);
    const perPass = totalOf(c.server) / PASSES;
    process.stdout.write(`  ${role}: unobserved, server-side ${perPass}/pass ${JSON.stringify(c.server)}\n`);
    const cap = { none: 3, client: 8, gateway: 7 }[role];
    assert.ok(perPass <= cap, `${role}: ${perPass} server-side commands per pass (at most ${cap}): ${JSON.stringify(c.server)}`);
    // A record is followed by the store's change notices: no periodic read of it (this node holds none).
    assert.not.ok(c.server.hgetall, `no record read in the steady state: ${JSON.stringify(c.server)}`);
    // A registration's value is compared (HGET) only when it changed: not in the steady state.
    assert.not.ok(c.server.hget, `no registration read back in the steady state: ${JSON.stringify(c.server)}`);
    if (role === 'none') {
      // Nothing but its own registration: one script call every other pass (refreshed every 1.5 s: 0.1 of its 15 s TTL), whose reply is a version number.
      assert.equal(b.commands, { evalsha: PASSES / 2 }, `only the node's own registration: ${JSON.stringify(b.commands)}`);
    }
  });
}

test('entries of nodes that stopped are removed by the first pass that sees them expired, and every copy drops them', async () => {
  const p = 'prune:';
  await cluster(p, 4);
  const meter = await meterRedis(redis.socketPath);
  cleanups.push(() => meter.close());
  const n = await simNode(p, 9, 'client', meter);
  await n.store.storePass();
  const other = await OwnershipStore.connect(redis.url, { keyPrefix: p });
  cleanups.push(() => other.close());
  await registerNode(raw, p, 'n7', addressOf(7), 300);
  await other.registerGateways(EGRESS.key, 'n7', [gw(7)], 300);
  later(2000); // past the node registration's refresh interval: this pass reads what changed
  await n.store.storePass();
  assert.ok(n.s.nodes.includes(addressOf(7)), 'n7 registered');
  assert.ok(n.s.registry.get(EGRESS.key)?.some((g) => g.node === 'n7'), 'n7 a candidate');
  await new Promise((r) => setTimeout(r, 500));
  later(2000);
  await n.store.storePass();
  // Its address stays accepted a grace longer (the registry refills so after a store wipe), then goes.
  assert.ok(n.s.nodes.includes(addressOf(7)), 'n7 still accepted within LEFT_GRACE_MS');
  later(LEFT_GRACE_MS);
  await n.store.storePass();
  assert.not.ok(n.s.nodes.includes(addressOf(7)), 'n7 gone from the node list');
  assert.not.ok(n.s.registry.get(EGRESS.key)?.some((g) => g.node === 'n7'), 'n7 gone from the candidates');
  assert.is(await raw.hexists(`{${p}nodes}`, 'n7'), 0, 'node entry deleted');
  assert.is(await raw.zscore(`{${p}nodes}:expiry`, 'n7'), null, 'node expiry deleted');
  assert.is(await raw.hexists(`{${p}egress:${EGRESS.key}}:gateways`, 'n7'), 0, 'gateway entry deleted');
  // A copy that was current before is brought up to date by the changes alone.
  assert.not.ok((await other.listGateways(EGRESS.key)).some((g) => g.node === 'n7'), 'the other copy dropped it too');
});

test('a node whose last part in an Egress ends (its client pod gone) drops its copy of the registry', async () => {
  const p = 'noshare:';
  await cluster(p, 4);
  const meter = await meterRedis(redis.socketPath);
  cleanups.push(() => meter.close());
  const n = await simNode(p, 9, 'client', meter);
  await n.store.storePass();
  assert.is(n.s.registry.get(EGRESS.key)?.length, 3, 'a client knows the 3 candidates');
  n.s.clients.clear();
  await n.store.storePass();
  assert.is(n.s.registry.get(EGRESS.key), undefined, 'no copy kept once it reads none');
  assert.equal(n.peers.liveRegistry(EGRESS.key), [], 'and no candidates left in its view');
});

test('a gateway node whose last gateway pod leaves removes its entry at once', async () => {
  const p = 'leave:';
  await cluster(p, 4);
  const meter = await meterRedis(redis.socketPath);
  cleanups.push(() => meter.close());
  const n = await simNode(p, 8, 'gateway', meter);
  await n.store.storePass();
  assert.is(await raw.hexists(`{${p}egress:${EGRESS.key}}:gateways`, 'n8'), 1);
  n.s.gateways.clear();
  await n.store.storePass();
  assert.is(await raw.hexists(`{${p}egress:${EGRESS.key}}:gateways`, 'n8'), 0, 'entry removed by the pass after the pod left');
  meter.reset();
  later(2000);
  await n.store.storePass();
  assert.is(meter.commands.get('evalsha'), 1, `no longer a gateway nor a client: only the node registration (${JSON.stringify(Object.fromEntries(meter.commands))})`);
});

test('a record that changed without a notice (lost) is followed by the safety-net pass, not before', async () => {
  const p = 'safety:';
  await cluster(p, 4);
  const meter = await meterRedis(redis.socketPath);
  cleanups.push(() => meter.close());
  const n = await simNode(p, 9, 'client', meter);
  later(1000);
  await n.store.storePass();
  const st = [...n.s.addresses.values()][0];
  assert.ok(st, 'the address is tracked');
  const key = `${p}egress:${EGRESS.key}:owner:${st.address}`;
  // Written by hand: no notice goes out, as if the notice had been lost.
  await raw.hset(key, 'owner', 'shop/gw-2', 'epoch', String(st.own.epoch + 5), 'cause', 'test', 'score', '1', 'ownerNode', 'n2', 'ownerNodeAddress', addressOf(2), 'ownerPodIp', gw(2).podIp);
  meter.reset();
  for (let k = 0; k < 5; k++) {
    later(1000);
    await n.store.storePass();
  }
  assert.not.ok(meter.commands.get('hgetall'), 'no periodic read of the record between safety-net passes');
  assert.is.not(st.own.owner, 'shop/gw-2', 'not followed yet');
  later(SAFETY_EVERY_MS * 1.25);
  await n.store.storePass();
  assert.is(meter.commands.get('hgetall'), 1, 'the safety-net pass reads it');
  assert.is(st.own.owner, 'shop/gw-2', 'and follows it');
  assert.is(st.own.epoch, 5 + (st.own.epoch - 5));
});


test("the election tick looks only at Egresses the node plays a part in (and addresses an owner record puts on it)", async () => {
  const p = 'tick:';
  await cluster(p, 4);
  const meter = await meterRedis(redis.socketPath);
  cleanups.push(() => meter.close());
  const count = (n: EgressParts) => {
    const seen = new Map<string, number>();
    const real = n.peers.liveRegistry.bind(n.peers);
    n.peers.liveRegistry = (egress: string) => {
      seen.set(egress, (seen.get(egress) ?? 0) + 1);
      return real(egress);
    };
    return seen;
  };
  const tick = (n: EgressParts) => (n.election as unknown as { pass(): Promise<void> }).pass();
  // 40 more Egresses this node has no part in, each with one address whose owner is a node elsewhere.
  const others: ResolvedEgress[] = Array.from({ length: 40 }, (_, i) => ({ ...EGRESS, key: `shop/other-${i}`, name: `other-${i}` }));
  const setUp = async (i: number, role: Role) => {
    const n = await simNode(p, i, role, meter);
    await n.store.storePass();
    others.forEach((e, k) => {
      n.s.egresses.set(e.key, e);
      n.s.egressIds.set(e.key, k + 2);
      n.s.track(e, `198.51.100.${k + 2}`, { pool: 'float', index: 0 }, { egress: e.key, address: `198.51.100.${k + 2}`, owner: 'shop/gw-1', epoch: 3, ownerNode: 'n1', ownerNodeAddress: addressOf(1), ownerPodIp: gw(1).podIp });
    });
    return n;
  };
  const client = await setUp(9, 'client');
  const seen = count(client);
  await tick(client);
  assert.equal([...seen.keys()], [EGRESS.key], `a client of one Egress evaluates that one alone: ${[...seen.keys()].slice(0, 5).join(', ')}`);
  assert.ok([...client.s.addresses.values()].filter((st) => st.egress.key !== EGRESS.key).every((st) => st.candidates.length === 0), 'no candidates listed for Egresses it has no part in');

  // An owner record naming this node (its gateway pod gone, nothing held): it still looks, to hand over.
  const former = await setUp(1, 'none');
  const seen1 = count(former);
  await tick(former);
  const namedN1 = [...former.s.addresses.values()].filter((st) => st.own.ownerNode === 'n1').map((st) => st.egress.key).sort();
  assert.ok(namedN1.length >= others.length, `the 40 records name n1 (${namedN1.length})`);
  assert.equal([...seen1.keys()].sort(), namedN1, 'every Egress whose record names n1 is looked at, and no other');
  const none = await setUp(12, 'none');
  const seen2 = count(none);
  await tick(none);
  assert.is(seen2.size, 0, `no part in anything: nothing evaluated (${[...seen2.keys()].slice(0, 3).join(', ')})`);
});

test('heartbeats go to the Egress\'s candidates and its clients\' nodes, not to every registered node', async () => {
  const p = 'beat:';
  await cluster(p, 200);
  const meter = await meterRedis(redis.socketPath);
  cleanups.push(() => meter.close());
  type Sent = { peers: string[]; notices: number; gateways: number; clients: string[] };
  const recorder = (n: EgressParts) => {
    const sent: Sent[] = [];
    n.s.notices = { send: (peers: Iterable<string>, notices: unknown[], gateways: unknown[] = [], opts: { clients?: string[] } = {}) => {
      sent.push({ peers: [...peers].sort(), notices: notices.length, gateways: gateways.length, clients: opts.clients ?? [] });
    } } as unknown as EgressShared['notices'];
    return sent;
  };
  const owner = await simNode(p, 1, 'gateway', meter);
  await owner.store.storePass();
  const st = [...owner.s.addresses.values()][0];
  assert.ok(st, 'the address is tracked');
  st.own = { egress: EGRESS.key, address: st.address, owner: 'shop/gw-1', epoch: 1, ownerNode: 'n1', ownerNodeAddress: addressOf(1), ownerPodIp: gw(1).podIp };
  st.holder = owner.s.gateways.get('shop/gw-1');
  const ownerSent = recorder(owner);
  owner.election.heartbeat();
  const beat = ownerSent.filter((x) => x.notices);
  assert.equal(beat.map((x) => x.peers), [[addressOf(2), addressOf(3)]], `the other two candidates only, not the 200 nodes: ${JSON.stringify(beat.map((x) => x.peers.length))}`);

  // A client node tells the candidates and the owner that it has clients of the Egress...
  const client = await simNode(p, 150, 'client', meter);
  await client.store.storePass();
  const cst = [...client.s.addresses.values()][0];
  cst.own = { ...st.own };
  const clientSent = recorder(client);
  client.election.heartbeat();
  assert.equal(clientSent, [{ peers: [addressOf(1), addressOf(2), addressOf(3)], notices: 0, gateways: 0, clients: [EGRESS.key] }]);
  // ...and the owner's heartbeats reach it from then on (until its word lapses).
  owner.peers.onClients([EGRESS.key], addressOf(150));
  owner.peers.onClients(['shop/unknown'], addressOf(151));
  ownerSent.length = 0;
  owner.election.heartbeat();
  assert.equal(ownerSent.filter((x) => x.notices).map((x) => x.peers), [[addressOf(150), addressOf(2), addressOf(3)]]);
  later(4000);
  ownerSent.length = 0;
  owner.election.heartbeat();
  assert.equal(ownerSent.filter((x) => x.notices).map((x) => x.peers), [[addressOf(2), addressOf(3)]], 'a client that stopped saying so is dropped');
});

test.run();
