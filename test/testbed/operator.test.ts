// tether-operator on the testbed (configSource kubernetes: the run's FAKE API server): the nodes' work never
// waits for it. With the operator scaled to 0, new pods are attached (their Pod objects, their blocks) and
// the egress owner's node is lost under traffic: every connection survives, as with the operator up; the
// status, which only the operator writes, stays as it was until a replica is back, then catches up. No
// tetherd ever touches a Lease, writes a Service or an object's status (its own TetherNode's apart), or
// creates a Secret: the fake API server's calls, by token, say so.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { OPERATOR_TOKEN, withTestbed } from './testbed';
import { egressOf, runTraffic, topology, waitOwner, waitStandbyReady } from './egress-scenario';
import { until } from '../lib/wait';

const CONNS = Number(process.env.EGRESS_TEST_CONNS ?? 100);
type Obj = Record<string, any>; // eslint-disable-line @typescript-eslint/no-explicit-any

test('operator scaled to 0: pods created and the owner node lost keep 100 % of connections; status catches up once it is back', async () => {
  await withTestbed({ ...topology(), configSource: 'kubernetes' }, async (tb) => {
    const first = await waitOwner(tb);
    const egressStatus = () => tb.api.get('Egress', 'out', 'shop')?.status as Obj | undefined;
    await until('the operator writes the owner into the Egress status', async () => egressStatus()?.addresses?.[0]?.ownerNode === first.node, 15_000);
    assert.equal(tb.api.list('Lease').map((l) => l.metadata.name), ['tether-operator']);

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
    const fromNodes = tb.api.calls.filter((c) => c.token !== OPERATOR_TOKEN);
    const nodeCalls = fromNodes.filter((c) => c.method !== 'GET');
    const forbidden = [
      ...fromNodes.filter((c) => /\/leases\b/.test(c.path)),
      ...nodeCalls.filter((c) => /\/services\//.test(c.path) || /\/secrets\b/.test(c.path) || (/\/status$/.test(c.path) && !/\/tethernodes\//.test(c.path))),
    ];
    assert.equal(forbidden.map((c) => `${c.method} ${c.path}`), [], 'tetherd makes no cluster-wide write');
    assert.ok(nodeCalls.some((c) => /\/addressblocks/.test(c.path)), 'the nodes did write (their block claims): the filter sees their calls');
    assert.ok(tb.api.calls.some((c) => c.token === OPERATOR_TOKEN && c.method === 'PUT' && /\/egresses\/out\/status$/.test(c.path)), 'the operator wrote the Egress status');
  });
});

test.run();
