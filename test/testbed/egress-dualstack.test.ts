// Egress failover in both families on the testbed: the egress scenario's 3 nodes with dual-stack pods (the
// nodes talk IPv4: FoU, BFD and sync stay on the IPv4 underlay), a dual-stack floating pool, and an Egress
// steering IPv4 and IPv6, one address of each family. A client pod runs long-lived connections of both
// families at once while a gateway dies, a node goes down, or addresses come and go: every connection of
// either family must continue from its own family's floating address. The negative control shows the IPv6
// connections die without conntrack sync.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { withTestbed, type Testbed } from './testbed';
import { egressOf, FLOAT_POOL, FLOAT_POOL6, objectsWithCount, runTrafficIn, topology, waitOwner, waitStandbyReady } from './egress-scenario';
import { peerAddress, type TrafficReport } from '../lib/traffic';
import { until } from '../lib/wait';

/** Connections per family. */
const CONNS = Number(process.env.EGRESS_TEST_CONNS ?? 100);
const only = process.env.EGRESS_ONLY;
const scenario = (name: string, fn: () => Promise<void>) => (only && !name.includes(only) ? test.skip(name, fn) : test(name, fn));
const BOTH = [4, 6] as const;

const podOf = (node: string, owner: string) => `${node}-${owner.split('/')[1]}`;

/** Both families' connections intact, each from its own family's floating address(es) only. */
function assertKept(reports: TrafficReport[], peers: string[], addresses: { 4: string[]; 6: string[] }, what: string): void {
  BOTH.forEach((f, i) => {
    const r = reports[i];
    assert.is(r.intact, CONNS, `IPv${f}: ${r.intact}/${CONNS} connections intact ${what}; first errors: ${r.errors.slice(0, 4).join('; ')}`);
    assert.equal(r.errors, [], `IPv${f}: no connection error`);
  });
  const tcp = peers.filter((p) => !p.startsWith('udp')).map(peerAddress);
  const v6 = tcp.filter((a) => a.includes(':'));
  const v4 = tcp.filter((a) => !a.includes(':'));
  assert.is(v4.length, CONNS, `the server saw ${v4.length} IPv4 TCP peers`);
  assert.is(v6.length, CONNS, `the server saw ${v6.length} IPv6 TCP peers`);
  assert.ok(v4.every((a) => addresses[4].includes(a)), `IPv4 connections came only from ${addresses[4]}: ${[...new Set(v4)]}`);
  assert.ok(v6.every((a) => addresses[6].includes(a)), `IPv6 connections came only from ${addresses[6]}: ${[...new Set(v6)]}`);
}

async function owners(tb: Testbed): Promise<{ 4: { node: string; address: string; owner: string; epoch: number }; 6: { node: string; address: string; owner: string; epoch: number } }> {
  const [a, b] = await Promise.all(BOTH.map((f) => waitOwner(tb, undefined, 15_000, false, f)));
  return { 4: { node: a.node, ...a.st }, 6: { node: b.node, ...b.st } };
}

scenario('dual-stack: the IPv6 owner gateway killed abruptly: every IPv6 and IPv4 connection continues from its family\'s floating address', async () => {
  await withTestbed(topology([], [4, 6]), async (tb) => {
    const first = await owners(tb);
    assert.ok(first[6].address.startsWith(FLOAT_POOL6.split('/')[0].slice(0, 8)), `the IPv6 address ${first[6].address} is from ${FLOAT_POOL6}`);
    assert.ok(first[4].address.startsWith('198.18.0.'), `the IPv4 address ${first[4].address} is from ${FLOAT_POOL}`);
    const standby = first[6].node === 'n1' ? 'n2' : 'n1';
    for (const f of BOTH) if (first[f].node === first[6].node) await waitStandbyReady(tb, first[f].node, standby, 20_000, true, undefined, f);
    const { reports, peers } = await runTrafficIn(tb, [...BOTH], CONNS, 9000, async () => {
      await tb.mustExec('router', ['ip', 'netns', 'del', tb.pod(podOf(first[6].node, first[6].owner)).ns]);
    });
    const next = await waitOwner(tb, first[6].owner, 8000, false, 6);
    assert.is.not(next.node, first[6].node, 'the other gateway took the IPv6 address over');
    assert.ok(next.st.epoch > first[6].epoch, `epoch grew: ${first[6].epoch} → ${next.st.epoch}`);
    assertKept(reports, peers, { 4: [first[4].address], 6: [first[6].address] }, 'after the IPv6 owner was killed');
    BOTH.forEach((f, i) => assert.ok(reports[i].maxGapAfterMarkMs !== undefined && reports[i].maxGapAfterMarkMs! < 1000, `IPv${f}: longest gap during the event ${reports[i].maxGapAfterMarkMs} ms`));
    assert.ok(reports[1].udp && reports[1].udp.received > reports[1].udp.sent * 0.8, `IPv6 UDP continued: ${JSON.stringify(reports[1].udp)}`);
    process.stdout.write(`  dual-stack, IPv6 owner killed: longest gap IPv6 ${reports[1].maxGapAfterMarkMs} ms, IPv4 ${reports[0].maxGapAfterMarkMs} ms over ${CONNS}+${CONNS} connections; takeover ${JSON.stringify(next.st.lastTakeover)}\n`);
  });
});

scenario("dual-stack: the IPv6 owner's whole node goes down (tetherd killed, links down): connections of both families continue", async () => {
  await withTestbed(topology([], [4, 6]), async (tb) => {
    const first = await owners(tb);
    const down = first[6].node;
    const other = down === 'n1' ? 'n2' : 'n1';
    for (const f of BOTH) if (first[f].node === down) await waitStandbyReady(tb, down, other, 20_000, true, undefined, f);
    const { reports, peers } = await runTrafficIn(tb, [...BOTH], CONNS, 9000, async () => {
      await tb.killTetherd(down, 'SIGKILL');
      await tb.mustExec(down, ['ip', 'link', 'set', 'eth0', 'down']);
    });
    const st6 = await egressOf(tb, other, 6);
    assert.ok(st6?.ownedHere, 'the surviving gateway node owns the IPv6 address');
    assert.match(String(st6?.lastTakeover?.cause), /failover: owner .* is down/);
    assertKept(reports, peers, { 4: [first[4].address], 6: [first[6].address] }, 'after the IPv6 owner\'s node went down');
    process.stdout.write(`  dual-stack, node down: longest gap IPv6 ${reports[1].maxGapAfterMarkMs} ms, IPv4 ${reports[0].maxGapAfterMarkMs} ms; IPv4 address was on ${first[4].node === down ? 'the same node' : 'the other node'}\n`);
  });
});

scenario('dual-stack: a gateway joins, then addresses are added and removed live: no live connection of either family moves or breaks', async () => {
  await withTestbed(topology([], [4, 6]), async (tb) => {
    const first = await owners(tb);
    const objects = (count: number) => objectsWithCount([4, 6], 4, count);
    let during: { 4: string[]; 6: string[] } = { 4: [], 6: [] };
    const { reports, peers } = await runTrafficIn(tb, [...BOTH], CONNS, 14_000, async () => {
      // A third gateway pod, on the node that does not hold the IPv6 address.
      const joiner = first[6].node === 'n1' ? 'n2' : 'n1';
      await tb.addPod(joiner, { name: `gw${joiner.slice(1)}b`, namespace: 'shop', tether: { labels: { role: 'egress-gw' } } });
      await new Promise((r) => setTimeout(r, 2500));
      for (const f of BOTH) {
        const now = await egressOf(tb, first[f].node, f);
        assert.is(now?.owner, first[f].owner, `IPv${f}: the joining gateway took nothing from the live owner`);
      }
      // Two addresses of each family, then one again.
      tb.rewriteConfig({ extraObjects: objects(2) });
      await until('two addresses of each family held', async () => {
        const all = ((await tb.status('n3')) as unknown as { egress: Array<{ address: string; owner: string }> }).egress.filter((e) => e.owner);
        during = { 4: all.filter((e) => !e.address.includes(':')).map((e) => e.address), 6: all.filter((e) => e.address.includes(':')).map((e) => e.address) };
        return during[4].length === 2 && during[6].length === 2;
      }, 20_000);
      tb.rewriteConfig({ extraObjects: objects(1) });
      await until('one address of each family again', async () => {
        const all = ((await tb.status('n3')) as unknown as { egress: Array<{ address: string; owner: string }> }).egress;
        return all.length === 2;
      }, 20_000);
    });
    assert.ok(during[6].includes(first[6].address) && during[6].length === 2, `a second IPv6 address was added beside ${first[6].address}: ${during[6]}`);
    // Every live connection stayed on the address it started from: the first ones.
    assertKept(reports, peers, { 4: [first[4].address], 6: [first[6].address] }, 'while a gateway joined and addresses came and went');
    process.stdout.write(`  dual-stack, gateway joined and addresses ${JSON.stringify(during)} added then removed: ${reports[0].intact}+${reports[1].intact} intact\n`);
  });
});

scenario('dual-stack negative control: with conntrack sync disabled, killing the IPv6 owner breaks the IPv6 connections', async () => {
  await withTestbed(topology(['--no-conntrack-sync'], [4, 6]), async (tb) => {
    const first = await owners(tb);
    const { reports } = await runTrafficIn(tb, [...BOTH], CONNS, 8000, async () => {
      await tb.mustExec('router', ['ip', 'netns', 'del', tb.pod(podOf(first[6].node, first[6].owner)).ns]);
    });
    await waitOwner(tb, first[6].owner, 8000, false, 6);
    assert.ok(reports[1].intact < CONNS / 2, `only ${reports[1].intact}/${CONNS} IPv6 connections may survive without sync`);
    process.stdout.write(`  dual-stack negative control: ${reports[1].intact}/${CONNS} IPv6 connections survived without conntrack sync (IPv4 ${reports[0].intact}/${CONNS}, its owner ${first[4].node === first[6].node ? 'was' : 'was not'} the same pod)\n`);
  });
});

test.run();
