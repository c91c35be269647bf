// tether-operator against the FAKE API server and a real redis-server: two replicas, one leader on the Lease
// tether-operator; the leader writes the status of AddressPools, Egresses (owners from the store's records,
// as the nodes record them) and tether Services (a VIP from the loadBalancer pool), labels the Services,
// collects the blocks of deleted nodes and creates the cluster Secrets (type Opaque); a leader stopped is
// replaced and the status keeps following the store.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { Writable } from 'node:stream';
import { FakeApiServer, kubeconfigFor } from '../lib/fake-apiserver';
import { startRedis, type TestRedis } from '../lib/redis';
import { makeLogger, setLogger } from '../../lib/log';
import { Lifecycle } from '../../daemon/lifecycle';
import { LB_CLASS, TETHER_SERVICE_LABEL } from '../../daemon/objects/names';
import { ClusterAddresses } from '../../ipam/cluster-addresses';
import { validatePools } from '../../ipam/pool';
import { RedisStore } from '../../ipam/store/redis-store';
import { OwnershipStore } from '../../daemon/egress/ownership-store';
import { slotOwner } from '../../daemon/egress/egress-spec';
import { operatorParts, type StartedOperator } from '../../operator/main';
import { parseOperatorOptions } from '../../operator/options';
import { answerCommandLine } from '../../lib/version';
import { OPERATOR_LEASE } from '../../operator/controllers';
import { nodeParts } from '../../daemon/main';
import { parseOptions } from '../../daemon/options';
import { readyAnswer } from '../../daemon/health/probe-server';

const quiet = makeLogger({ level: 'error', stream: new Writable({ write: (_c, _e, cb) => cb() }) });
setLogger(quiet);
const V = 'tether.dev/v1alpha1';

const until = async (what: string, fn: () => boolean, ms = 10_000) => {
  const end = Date.now() + ms;
  while (!fn()) {
    if (Date.now() > end) throw new Error(`timed out: ${what}`);
    await new Promise((r) => setTimeout(r, 25));
  }
};

test('the executable called tether-operator answers as itself, not as a CNI plugin', () => {
  const out: string[] = [];
  assert.is(answerCommandLine('tether-operator', ['--version'], {}, { write: (t) => out.push(t) }), 0);
  assert.match(out.join(''), /^tether-operator, the cluster's controllers of Tether v\d/);
  assert.not.match(out.join(''), /CNI/);
  // No CNI_COMMAND and no --version: its own main runs (a CNI plugin would print its "about" and exit).
  assert.is(answerCommandLine('tether-operator', ['--kubernetes'], {}, { write: () => undefined }, { write: () => undefined }), undefined);
});

test('--help, and a command line without the API or with a bad lease duration is refused naming the option', () => {
  assert.ok(parseOperatorOptions(['--help']).help);
  assert.throws(() => parseOperatorOptions([]), /needs the Kubernetes API: give --kubernetes or --kubeconfig/);
  assert.throws(() => parseOperatorOptions(['--kubernetes', '--lease-duration', '1']), /--lease-duration "1"/);
  assert.throws(() => parseOperatorOptions(['--kubernetes', '--controller-candidates', 'all']), /controller-candidates/);
});

test('tetherd: --controller-candidates (an older manifest) is accepted and ignored with a warning', async () => {
  const lines: string[] = [];
  const logger = makeLogger({ level: 'warn', stream: new Writable({ write: (c, _e, cb) => (lines.push(String(c)), cb()) }) });
  const opts = parseOptions(['--controller-candidates', 'all', '--node-name', 'n1']);
  const parts = nodeParts(opts, { nodeName: 'n1', logger, without: { host: true, cni: true, metrics: true, reporting: true } });
  const first = await parts.next();
  assert.is((first.value as { name: string }).name, 'config source', 'tetherd goes on to its parts');
  await parts.return(undefined as never);
  assert.ok(lines.some((l) => l.includes('--controller-candidates is ignored') && l.includes('tether-operator') && l.includes('"given":"all"')), lines.join(''));
});

test('the operator\'s probes: /readyz names tether-operator while it starts', () => {
  const a = readyAnswer({ what: 'tether-operator', started: () => false, roleProblems: () => [] });
  assert.equal([a.status, a.body], [503, 'not ready:\ntether-operator is starting\n']);
  assert.is(readyAnswer({ what: 'tether-operator', started: () => true, roleProblems: () => [] }).status, 200);
});

test('two replicas: one leader on its Lease; status, label, block collection and Secrets; a stopped leader is replaced', async () => {
  const api = new FakeApiServer('fake-token');
  const url = (await api.listen({ port: 0 }))!;
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tether-op-'));
  const kubeconfig = path.join(dir, 'kubeconfig');
  fs.writeFileSync(kubeconfig, kubeconfigFor(url));
  let redis: TestRedis | undefined;
  const lives: Lifecycle[] = [];
  const stores: Array<{ close(): Promise<void> }> = [];
  try {
    redis = await startRedis();
    api.apply({ apiVersion: 'v1', kind: 'Node', metadata: { name: 'n1' } });
    api.apply({ apiVersion: V, kind: 'AddressPool', metadata: { name: 'float' }, spec: { usage: 'floating', ipv4: { cidr: '198.51.100.0/28' } } });
    const tiny = { apiVersion: V, kind: 'AddressPool', metadata: { name: 'tiny' }, spec: { usage: 'floating', ipv4: { cidr: '198.51.100.16/29' } } };
    api.apply(tiny);
    api.apply({ apiVersion: V, kind: 'Egress', metadata: { name: 'big', namespace: 'shop' }, spec: { clients: { podSelector: { matchLabels: { app: 'c' } } }, gateways: { podSelector: { matchLabels: { app: 'gw' } } }, addresses: { pool: 'tiny', count: 16 } } });
    api.apply({ apiVersion: V, kind: 'AddressPool', metadata: { name: 'vips' }, spec: { usage: 'loadBalancer', ipv4: { cidr: '203.0.113.0/28' } } });
    api.apply({ apiVersion: V, kind: 'Egress', metadata: { name: 'out', namespace: 'shop' }, spec: { clients: { podSelector: { matchLabels: { app: 'c' } } }, gateways: { podSelector: { matchLabels: { app: 'gw' } } }, addresses: { pool: 'float' } } });
    api.apply({ apiVersion: 'v1', kind: 'Service', metadata: { name: 'web', namespace: 'shop' }, spec: { type: 'LoadBalancer', loadBalancerClass: LB_CLASS, ports: [{ port: 80, protocol: 'TCP' }] } });
    api.apply({ apiVersion: 'v1', kind: 'Service', metadata: { name: 'other', namespace: 'shop' }, spec: { type: 'ClusterIP', ports: [{ port: 80, protocol: 'TCP' }] } });
    api.apply({ apiVersion: V, kind: 'AddressBlock', metadata: { name: 'default-10-244-0-64-26', labels: { 'tether.dev/node': 'gone' } }, spec: { pool: 'default', cidr: '10.244.0.64/26', node: 'gone' } });
    api.apply({ apiVersion: V, kind: 'AddressBlock', metadata: { name: 'default-10-244-0-0-26', labels: { 'tether.dev/node': 'n1' } }, spec: { pool: 'default', cidr: '10.244.0.0/26', node: 'n1' } });

    // A node's egress controller allocated the Egress's address and recorded its owner, as nodes do.
    const rs = await RedisStore.connect(redis.url, { keyPrefix: 'tether:' });
    stores.push(rs);
    const pools = validatePools([{ apiVersion: V, kind: 'AddressPool', metadata: { name: 'float' }, spec: { usage: 'floating', ipv4: { cidr: '198.51.100.0/28' } } }, tiny]);
    const addrs = new ClusterAddresses(pools, rs, quiet, { holdOffMs: 0 });
    const { addresses: [address] } = await addrs.allocate({ pool: 'float', owner: slotOwner('shop/out', { pool: 'float', index: 0 }) });
    // The big Egress asks for more than its pool holds: the nodes allocated what there was.
    let tinyHeld = 0;
    for (let index = 0; index < 16; index++) {
      const got = await addrs.allocate({ pool: 'tiny', owner: slotOwner('shop/big', { pool: 'tiny', index }) }).catch(() => undefined);
      if (got) tinyHeld++;
    }
    assert.ok(tinyHeld > 0 && tinyHeld < 16, `tiny held ${tinyHeld}`);
    const own = await OwnershipStore.connect(redis.url, { keyPrefix: 'tether:' });
    stores.push(own);
    await own.record({ egress: 'shop/out', address, owner: 'shop/gw1', epoch: 1, ownerNode: 'n1', ownerNodeAddress: '192.0.2.1', ownerPodIp: '10.244.0.5', score: '1' });

    process.env.POD_NAMESPACE = 'tether-system';
    const start = async (identity: string) => {
      const life = new Lifecycle(quiet);
      lives.push(life);
      const opts = parseOperatorOptions(['--kubeconfig', kubeconfig, '--redis', redis!.url, '--lease-duration', '2', '--cluster-key-secret', 'tether-cluster-key', '--redis-password-secret', 'tether-redis-auth']);
      const started = (await life.start(operatorParts(opts, { identity, logger: quiet, everyMs: 100, gcEveryMs: 200, retryMs: 100 }))) as StartedOperator;
      return { life, started };
    };
    const [a, b] = await Promise.all([start('op-a'), start('op-b')]);
    await until('a leader', () => a.started.leader.isLeader() || b.started.leader.isLeader());
    await new Promise((r) => setTimeout(r, 300));
    assert.ok(a.started.leader.isLeader() !== b.started.leader.isLeader(), 'exactly one leader');
    const leaderId = a.started.leader.isLeader() ? 'op-a' : 'op-b';
    assert.is(api.get('Lease', OPERATOR_LEASE, 'tether-system')?.spec.holderIdentity, leaderId);
    assert.not.ok(api.list('Lease').some((l) => l.metadata.name === 'tether-controllers'), 'no node Lease');

    // The cluster Secrets, created once, type Opaque.
    for (const s of ['tether-cluster-key', 'tether-redis-auth']) assert.is(api.get('Secret', s, 'tether-system')?.type, 'Opaque', s);

    // The Egress: its address and owner as the store holds them.
    await until('Egress status', () => api.get('Egress', 'out', 'shop')?.status?.addresses?.[0]?.ownerPod === 'shop/gw1');
    const eg = api.get('Egress', 'out', 'shop')!.status;
    assert.equal(eg.addresses, [{ address, ownerNode: 'n1', ownerPod: 'shop/gw1', epoch: 1 }]);
    assert.equal([eg.wanted, eg.allocated, eg.held, eg.nodes], [1, 1, 1, 1]);
    assert.is(eg.conditions.find((c: { type: string }) => c.type === 'Ready').status, 'True');
    assert.is(api.get('AddressPool', 'float')!.status?.conditions?.[0]?.status, 'True');
    // Fewer than asked, and why as far as the store tells: the pool is full.
    await until('the big Egress\'s status', () => api.get('Egress', 'big', 'shop')?.status?.allocated === tinyHeld);
    const big = api.get('Egress', 'big', 'shop')!.status;
    assert.is(big.wanted, 16);
    const complete = big.conditions.find((c: { type: string }) => c.type === 'AddressesComplete');
    assert.equal([complete.status, complete.reason], ['False', 'FewerAddresses']);
    assert.match(complete.message, new RegExp(`pool tiny has no free address \\(${tinyHeld} of ${tinyHeld} allocated\\)`));

    // The Service: labelled (only tether's), then its VIP from the loadBalancer pool in its status.
    await until('Service labelled', () => api.get('Service', 'web', 'shop')?.metadata.labels?.[TETHER_SERVICE_LABEL] === 'true');
    assert.not.ok(api.get('Service', 'other', 'shop')?.metadata.labels?.[TETHER_SERVICE_LABEL], 'not tether\'s: not labelled');
    await until('Service VIP', () => !!api.get('Service', 'web', 'shop')?.status?.loadBalancer?.ingress?.[0]?.ip);
    const ingress = api.get('Service', 'web', 'shop')!.status.loadBalancer.ingress[0];
    assert.match(ingress.ip, /^203\.0\.113\./);
    assert.is(ingress.ipMode, 'Proxy');

    // The deleted node's block is collected; the live node's stays.
    await until('claim collected', () => api.list('AddressBlock').length === 1);
    assert.equal(api.list('AddressBlock').map((c) => c.spec.node), ['n1']);

    // The leader stops: the other takes over, and the status follows the store again.
    const [leader, other] = leaderId === 'op-a' ? [a, b] : [b, a];
    await leader.life.stopAll();
    await until('the other replica leads', () => other.started.leader.isLeader(), 5000);
    await own.record({ egress: 'shop/out', address, owner: 'shop/gw2', epoch: 2, ownerNode: 'n1', ownerNodeAddress: '192.0.2.1', ownerPodIp: '10.244.0.6', score: '1' });
    await until('Egress status follows the new owner', () => api.get('Egress', 'out', 'shop')?.status?.addresses?.[0]?.ownerPod === 'shop/gw2');
    assert.is(api.get('Lease', OPERATOR_LEASE, 'tether-system')?.spec.holderIdentity, leaderId === 'op-a' ? 'op-b' : 'op-a');
    assert.is(api.get('Service', 'web', 'shop')!.status.loadBalancer.ingress[0].ip, ingress.ip, 'the same VIP under the new leader');

    // The store lost: the status pass goes on with what it last read (a new pool gets its status; the
    // Egress keeps its owner rather than losing it).
    await redis.kill();
    api.apply({ apiVersion: V, kind: 'AddressPool', metadata: { name: 'later' }, spec: { usage: 'floating', ipv4: { cidr: '192.0.2.0/28' } } });
    await until('a pool\'s status with the store away', () => api.get('AddressPool', 'later')?.status?.conditions?.[0]?.status === 'True', 15_000);
    assert.is(api.get('Egress', 'out', 'shop')!.status.addresses[0].ownerPod, 'shop/gw2', 'the owner last read is kept');
  } finally {
    for (const l of lives) await l.stopAll();
    for (const s of stores) await s.close();
    await redis?.stop();
    await api.close();
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test.run();
