// Egress where pods have no IPv4 (testbed families [6]), over either node underlay.
// IPv4 underlay: the nodes talk IPv4 (BFD, sync, notices); FoU to the gateway pods, which have only an IPv6
// address, goes in outer IPv6 from each node's --node-address-6 (its fabric IPv6 address), the floating
// address's low bits in the flow label.
// IPv6 underlay (topology underlay 6): every tetherd's --node-address is its fabric IPv6 address, so the node
// registry, BFD, conntrack sync, ownership notices and FoU all run between IPv6 node addresses.
// The owner gateway is killed abruptly (or its whole node lost) under long-lived IPv6 connections: every
// connection must continue from the IPv6 floating address; without conntrack sync they must not. Over the
// IPv6 underlay a gateway also joins and addresses come and go under the connections, which must not move.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { withTestbed, type Testbed } from './testbed';
import { egressOf, FLOAT_POOL6, objectsWithCount, runTrafficIn, topology, waitOwner, waitStandbyReady } from './egress-scenario';
import { peerAddress } from '../lib/traffic';
import { until } from '../lib/wait';

const CONNS = Number(process.env.EGRESS_TEST_CONNS ?? 100);
const only = process.env.EGRESS_ONLY;
const scenario = (name: string, fn: () => Promise<void>) => (only && !name.includes(only) ? test.skip(name, fn) : test(name, fn));

const podOf = (node: string, owner: string) => `${node}-${owner.split('/')[1]}`;

/** The peers the owner streams conntrack entries to (its sync senders are keyed by node address). */
async function syncPeers(tb: Testbed, owner: string): Promise<string[]> {
  const st = await egressOf(tb, owner, 6);
  return ((st as unknown as { sync?: Array<{ peer: string; state: string }> }).sync ?? []).map((x) => `${x.peer} ${x.state}`);
}

/** The owner's gateway pod killed abruptly under CONNS IPv6 connections; returns what happened. */
async function ownerKilled(tb: Testbed, opts: { sync?: boolean } = {}) {
  const initial = await waitOwner(tb, undefined, 15_000, false, 6);
  assert.ok(initial.st.address.startsWith(FLOAT_POOL6.split('/')[0].slice(0, 8)), `the address ${initial.st.address} is from ${FLOAT_POOL6}`);
  await waitStandbyReady(tb, initial.node, initial.node === 'n1' ? 'n2' : 'n1', 20_000, opts.sync ?? true, undefined, 6);
  // The owner once both nodes see each other: BFD flapping while the nodes start up can move the address
  // (seen on a busy machine), and killing what was the owner a moment ago would then prove nothing.
  const first = await waitOwner(tb, undefined, 15_000, false, 6);
  const peersBefore = await syncPeers(tb, first.node);
  const { reports, peers } = await runTrafficIn(tb, [6], CONNS, 9000, async () => {
    await tb.mustExec('router', ['ip', 'netns', 'del', tb.pod(podOf(first.node, first.st.owner)).ns]);
  });
  const next = await waitOwner(tb, first.st.owner, 8000, false, 6);
  assert.is.not(next.node, first.node, 'the other gateway took the address over');
  assert.ok(next.st.epoch > first.st.epoch, `epoch grew: ${first.st.epoch} → ${next.st.epoch}`);
  assert.is(next.st.lastTakeover?.from, first.st.owner, `the takeover was from the killed owner: ${JSON.stringify(next.st.lastTakeover)}`);
  return { first, next, report: reports[0], peers, syncPeers: peersBefore };
}

scenario('IPv6-only pods over the IPv4 underlay: the owner gateway killed abruptly, every IPv6 connection continues from the floating address', async () => {
  await withTestbed(topology([], [6]), async (tb) => {
    const { first, next, report: r, peers } = await ownerKilled(tb);
    assert.is(r.intact, CONNS, `${r.intact}/${CONNS} connections intact; first errors: ${r.errors.slice(0, 4).join('; ')}`);
    assert.equal(r.errors, [], 'no connection error');
    const tcp = peers.filter((p) => !p.startsWith('udp')).map(peerAddress);
    assert.is(tcp.length, CONNS, `the server saw ${tcp.length} TCP peers`);
    assert.ok(tcp.every((a) => a === first.st.address), `every connection came from ${first.st.address}: ${[...new Set(tcp)]}`);
    process.stdout.write(`  IPv6-only pods over IPv4: owner killed, longest gap ${r.maxGapAfterMarkMs} ms over ${CONNS} connections; takeover ${JSON.stringify(next.st.lastTakeover)}\n`);
  });
});

scenario('IPv6-only pods over the IPv6 underlay: the owner gateway killed abruptly, every IPv6 connection continues from the floating address', async () => {
  await withTestbed(topology([], [6], 6), async (tb) => {
    const { first, next, report: r, peers, syncPeers: streams } = await ownerKilled(tb);
    // The owner's conntrack stream to the standby runs between the nodes' IPv6 addresses.
    assert.ok(streams.length === 1 && /^fd00:18::1[12] streaming$/.test(streams[0]), `the owner streams to the standby's IPv6 address: ${streams}`);
    assert.is(r.intact, CONNS, `${r.intact}/${CONNS} connections intact; first errors: ${r.errors.slice(0, 4).join('; ')}`);
    assert.equal(r.errors, [], 'no connection error');
    const tcp = peers.filter((p) => !p.startsWith('udp')).map(peerAddress);
    assert.is(tcp.length, CONNS, `the server saw ${tcp.length} TCP peers`);
    assert.ok(tcp.every((a) => a === first.st.address), `every connection came from ${first.st.address}: ${[...new Set(tcp)]}`);
    assert.ok(r.maxGapAfterMarkMs !== undefined && r.maxGapAfterMarkMs < 1000, `longest gap during the event ${r.maxGapAfterMarkMs} ms`);
    process.stdout.write(`  IPv6-only pods over IPv6: owner killed, longest gap ${r.maxGapAfterMarkMs} ms over ${CONNS} connections; takeover ${JSON.stringify(next.st.lastTakeover)}\n`);
  });
});

scenario("IPv6-only pods over the IPv6 underlay: the owner's whole node lost (tetherd killed, links down), every IPv6 connection continues", async () => {
  await withTestbed(topology([], [6], 6), async (tb) => {
    const first = await waitOwner(tb, undefined, 15_000, false, 6);
    const standby = first.node === 'n1' ? 'n2' : 'n1';
    await waitStandbyReady(tb, first.node, standby, 20_000, true, undefined, 6);
    const { reports, peers } = await runTrafficIn(tb, [6], CONNS, 9000, async () => {
      await tb.killTetherd(first.node, 'SIGKILL');
      await tb.mustExec(first.node, ['ip', 'link', 'set', 'eth0', 'down']);
    });
    const st = await egressOf(tb, standby, 6);
    assert.ok(st?.ownedHere, 'the surviving gateway node owns the address');
    // Only BFD over IPv6 can have told the standby: the owner's tetherd said nothing before it died.
    assert.match(String(st?.lastTakeover?.cause), /failover: owner .* is down/);
    const r = reports[0];
    assert.is(r.intact, CONNS, `${r.intact}/${CONNS} intact; ${r.errors.slice(0, 4).join('; ')}`);
    assert.ok(r.maxGapAfterMarkMs !== undefined && r.maxGapAfterMarkMs < 1000, `longest gap during the event ${r.maxGapAfterMarkMs} ms`);
    const tcp = peers.filter((p) => !p.startsWith('udp')).map(peerAddress);
    assert.ok(tcp.length === CONNS && tcp.every((a) => a === first.st.address), `every connection came from ${first.st.address}: ${[...new Set(tcp)]}`);
    process.stdout.write(`  IPv6-only pods over IPv6: owner node lost, longest gap ${r.maxGapAfterMarkMs} ms over ${CONNS} connections; takeover ${JSON.stringify(st?.lastTakeover)}\n`);
  });
});

scenario('IPv6-only pods over the IPv6 underlay: a gateway joins, then addresses are added and removed live: no live connection moves or breaks', async () => {
  await withTestbed(topology([], [6], 6), async (tb) => {
    const first = await waitOwner(tb, undefined, 15_000, false, 6);
    const objects = (count: number) => objectsWithCount([6], 6, count);
    let during: string[] = [];
    const { reports, peers } = await runTrafficIn(tb, [6], CONNS, 14_000, async () => {
      // A third gateway pod, on the node that does not hold the address: it learns the owner over IPv6.
      const joiner = first.node === 'n1' ? 'n2' : 'n1';
      await tb.addPod(joiner, { name: `gw${joiner.slice(1)}b`, namespace: 'shop', tether: { labels: { role: 'egress-gw' } } });
      await new Promise((r) => setTimeout(r, 2500));
      assert.is((await egressOf(tb, first.node, 6))?.owner, first.st.owner, 'the joining gateway took nothing from the live owner');
      tb.rewriteConfig({ extraObjects: objects(2) });
      await until('two addresses held', async () => {
        const all = ((await tb.status('n3')) as unknown as { egress: Array<{ address: string; owner: string }> }).egress.filter((e) => e.owner);
        during = all.map((e) => e.address);
        return during.length === 2;
      }, 20_000);
      tb.rewriteConfig({ extraObjects: objects(1) });
      await until('one address again', async () => ((await tb.status('n3')) as unknown as { egress: unknown[] }).egress.length === 1, 20_000);
    });
    assert.ok(during.includes(first.st.address) && during.length === 2, `a second address was added beside ${first.st.address}: ${during}`);
    const r = reports[0];
    assert.is(r.intact, CONNS, `${r.intact}/${CONNS} intact; ${r.errors.slice(0, 4).join('; ')}`);
    assert.equal(r.errors, [], 'no connection error');
    const tcp = peers.filter((p) => !p.startsWith('udp')).map(peerAddress);
    assert.ok(tcp.length === CONNS && tcp.every((a) => a === first.st.address), `every live connection stayed on ${first.st.address}: ${[...new Set(tcp)]}`);
    process.stdout.write(`  IPv6-only pods over IPv6: gateway joined, addresses ${JSON.stringify(during)} added then removed: ${r.intact}/${CONNS} intact\n`);
  });
});

scenario('negative control over the IPv6 underlay: with conntrack sync disabled, the same takeover breaks the connections', async () => {
  await withTestbed(topology(['--no-conntrack-sync'], [6], 6), async (tb) => {
    const { report: r } = await ownerKilled(tb, { sync: false });
    assert.ok(r.intact < CONNS / 2, `only ${r.intact}/${CONNS} may survive without sync`);
    process.stdout.write(`  negative control over IPv6: ${r.intact}/${CONNS} connections survived without conntrack sync\n`);
  });
});

test.run();
