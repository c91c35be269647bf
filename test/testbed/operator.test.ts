// tether-operator on the testbed (configSource kubernetes: the run's FAKE API server): the nodes' work never
// waits for it. With the operator scaled to 0, new pods are attached (their Pod objects, their blocks) and
// the egress owner's node is lost under traffic: every connection survives, as with the operator up; the
// status, which only the operator writes, stays as it was until a replica is back, then catches up. No
// tetherd ever touches a Lease, writes a Service or an object's status (its own TetherNode's apart), or
// creates a Secret: the fake API server's calls, by token, say so. Two replicas (the Deployment's; in
// container mode run from its manifest) elect one leader, and a lost leader is replaced by the other. Both
// admission policies are enforced on every write: none is denied.
import * as fs from 'node:fs';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { NODE_SA, OPERATOR_SA, withTestbed, type Testbed } from './testbed';
import { egressOf, runTraffic, topology, waitOwner, waitStandbyReady } from './egress-scenario';
import { until } from '../lib/wait';

const CONNS = Number(process.env.EGRESS_TEST_CONNS ?? 100);
type Obj = Record<string, any>; // eslint-disable-line @typescript-eslint/no-explicit-any

const holder = (tb: Testbed) => tb.api.get('Lease', 'tether-operator', 'tether-system')?.spec?.holderIdentity as string | undefined;

/** Operator writes other than the Lease's since `from`, by replica (its token is its identity). */
function writersSince(tb: Testbed, from: number): string[] {
  const calls = tb.api.calls.filter((c) => c.at >= from && c.method !== 'GET' && !/\/leases\b/.test(c.path) && tb.userOf(c.token)?.username === OPERATOR_SA);
  return [...new Set(calls.map((c) => c.token!))].sort();
}

test('operator scaled to 0: pods created and the owner node lost keep 100 % of connections; status catches up once it is back', async () => {
  await withTestbed({ ...topology(), configSource: 'kubernetes', operatorReplicas: 2 }, async (tb) => {
    const t0 = Date.now();
    const first = await waitOwner(tb);
    const egressStatus = () => tb.api.get('Egress', 'out', 'shop')?.status as Obj | undefined;
    await until('the operator writes the owner into the Egress status', async () => egressStatus()?.addresses?.[0]?.ownerNode === first.node, 15_000);
    assert.equal(tb.api.list('Lease').map((l) => l.metadata.name), ['tether-operator']);

    // Two replicas, one leader: the Lease names one of them, and only that one writes anything else.
    assert.equal(tb.operatorIdentities, ['tether-operator-0', 'tether-operator-1']);
    if (tb.operator('tether-operator-0').inContainer) {
      // The Deployment's container: its user, no capability at all (not even in the bounding set).
      for (const id of tb.operatorIdentities) {
        const st = fs.readFileSync(`/proc/${tb.operator(id).pid}/status`, 'utf8');
        const field = (k: string) => new RegExp(`^${k}:[ \\t]*(.*)$`, 'm').exec(st)?.[1].trim().split(/\s+/).filter(Boolean);
        assert.equal([field('Uid')?.[0], field('Gid')?.[0], field('Groups') ?? []], ['65532', '65532', []], `${id} runs as the manifest's runAsUser/runAsGroup`);
        assert.equal(['CapEff', 'CapPrm', 'CapBnd'].map((k) => field(k)?.[0]), ['0000000000000000', '0000000000000000', '0000000000000000'], `${id} has no capability`);
      }
      // It created the cluster key's Secret (--cluster-key-secret of its manifest), through the operator's policy.
      assert.is(tb.api.get('Secret', 'tether-cluster-key', 'tether-system')?.type, 'Opaque');
    }
    const leader = holder(tb)!;
    assert.ok(tb.operatorIdentities.includes(leader), `the Lease holder ${leader} is one of the replicas`);
    assert.equal(writersSince(tb, t0), [leader], 'only the leader writes (the other replica stands by)');

    // The leader lost (SIGKILL: it cannot release the Lease): the other replica takes over once the Lease
    // expires, and its writes follow (a new Egress status needs writing: a Service-less status change).
    const second = tb.operatorIdentities.find((i) => i !== leader)!;
    await tb.stopOperator(leader, 'SIGKILL');
    const lost = Date.now();
    await until(`the standby replica ${second} holding the Lease`, async () => holder(tb) === second, 40_000);
    process.stdout.write(`  leader ${leader} lost: ${second} leads after ${Date.now() - lost} ms\n`);
    tb.api.apply({ apiVersion: 'tether.dev/v1alpha1', kind: 'AddressPool', metadata: { name: 'spare' }, spec: { usage: 'floating', ipv4: { cidr: '198.18.1.0/28' } } });
    await until('the new leader writing the new AddressPool\'s status', async () => !!tb.api.get('AddressPool', 'spare')?.status, 15_000);
    assert.equal(writersSince(tb, lost), [second], 'after the takeover only the new leader writes');

    await tb.scaleOperator(0);
    assert.is(tb.operatorReplicas, 0);
    const lagged = { ...egressStatus()!.addresses[0] };

    // New pods while no operator runs: a second gateway on the standby node, a second client. Each gets its
    // address through the CNI chain (tetherd's IPAM, a block claimed as an AddressBlock if needed).
    const other = first.node === 'n1' ? 'n2' : 'n1';
    const gw = await tb.addPod(other, { name: `gw${other.slice(1)}b`, namespace: 'shop', tether: { labels: { role: 'egress-gw' } } });
    const web2 = await tb.addPod('n3', { name: 'web2', namespace: 'shop', tether: { labels: { app: 'web' } } });
    for (const p of [gw, web2]) assert.ok(p.ip, `${p.key} attached with an address while the operator is away`);

    // The owner's node (whichever holds the address now) is lost under traffic (tetherd killed, its uplink
    // down): the standby takes over.
    const owner = await waitOwner(tb, undefined, 8000, true);
    const standby = owner.node === 'n1' ? 'n2' : 'n1';
    await waitStandbyReady(tb, owner.node, standby);
    const { report } = await runTraffic(tb, CONNS, 9000, async () => {
      await tb.killTetherd(owner.node, 'SIGKILL');
      await tb.mustExec(owner.node, ['ip', 'link', 'set', 'eth0', 'down']);
    });
    process.stdout.write(`  operator at 0: ${report.intact}/${CONNS} intact, longest gap ${report.maxGapAfterMarkMs} ms\n`);
    assert.is(report.intact, CONNS, `${report.intact}/${CONNS} intact; ${report.errors.slice(0, 4).join('; ')}`);
    const now = await egressOf(tb, standby);
    assert.ok(now?.ownedHere, `the standby node owns the address: ${JSON.stringify(now)}`);
    // Nobody wrote the status meanwhile: it still names the owner of when the operator stopped.
    const still = egressStatus()!.addresses[0];
    assert.equal([still.ownerNode, still.ownerPod, still.epoch], [lagged.ownerNode, lagged.ownerPod, lagged.epoch], 'the status lags while no operator runs');

    // The operator back: the status catches up with what the nodes decided.
    await tb.scaleOperator(1);
    await until(`the Egress status naming the new owner ${standby}`, async () => {
      const a = egressStatus()?.addresses?.[0];
      return a?.ownerNode === standby && a.epoch > lagged.epoch;
    }, 30_000).catch((e: Error) => {
      throw new Error(`${e.message}; status: ${JSON.stringify(egressStatus())}`);
    });
    assert.is(tb.api.get('Lease', 'tether-operator', 'tether-system')?.spec?.holderIdentity, 'tether-operator-0');

    // What the nodes asked of the API server: no Lease at all (not even a read), no Service write, no status
    // but their TetherNode's, no Secret create.
    const fromNodes = tb.api.calls.filter((c) => tb.userOf(c.token)?.username !== OPERATOR_SA);
    const nodeCalls = fromNodes.filter((c) => c.method !== 'GET');
    const forbidden = [
      ...fromNodes.filter((c) => /\/leases\b/.test(c.path)),
      ...nodeCalls.filter((c) => /\/services\//.test(c.path) || /\/secrets\b/.test(c.path) || (/\/status$/.test(c.path) && !/\/tethernodes\//.test(c.path))),
    ];
    assert.equal(forbidden.map((c) => `${c.method} ${c.path}`), [], 'tetherd makes no cluster-wide write');
    assert.ok(nodeCalls.some((c) => /\/addressblocks/.test(c.path)), 'the nodes did write (their block claims): the filter sees their calls');
    assert.ok(tb.api.calls.some((c) => tb.userOf(c.token)?.username === OPERATOR_SA && c.method === 'PUT' && /\/egresses\/out\/status$/.test(c.path)), 'the operator wrote the Egress status');

    // Every write went through both admission policies as its component's user, and none was denied.
    assert.equal(tb.admissionDenials, [], 'no write of a node or a replica was denied');
    const admitted = (sa: string) => tb.api.admissions.filter((a) => tb.userOf(a.token)?.username === sa).length;
    assert.ok(admitted(NODE_SA) > 0 && admitted(OPERATOR_SA) > 0, 'the nodes\' and the replicas\' writes were admitted');
  });
});

test.run();
