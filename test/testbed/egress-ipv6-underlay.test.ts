// Egress where pods have no IPv4: IPv6-only pods (testbed families [6]) over the IPv4 node underlay. The
// nodes talk IPv4 (BFD, sync, notices); FoU to the gateway pods, which have only an IPv6 address, goes in
// outer IPv6 from each node's --node-address-6 (its fabric IPv6 address), the floating address's low bits in
// the flow label. The owner gateway is killed abruptly under long-lived IPv6 connections: every connection
// must continue from the IPv6 floating address.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { withTestbed } from './testbed';
import { FLOAT_POOL6, runTrafficIn, topology, waitOwner, waitStandbyReady } from './egress-scenario';
import { peerAddress } from '../lib/traffic';

const CONNS = Number(process.env.EGRESS_TEST_CONNS ?? 100);
const only = process.env.EGRESS_ONLY;
const scenario = (name: string, fn: () => Promise<void>) => (only && !name.includes(only) ? test.skip(name, fn) : test(name, fn));

const podOf = (node: string, owner: string) => `${node}-${owner.split('/')[1]}`;

scenario('IPv6-only pods over the IPv4 underlay: the owner gateway killed abruptly, every IPv6 connection continues from the floating address', async () => {
  await withTestbed(topology([], [6]), async (tb) => {
    const first = await waitOwner(tb, undefined, 15_000, false, 6);
    assert.ok(first.st.address.startsWith(FLOAT_POOL6.split('/')[0].slice(0, 8)), `the address ${first.st.address} is from ${FLOAT_POOL6}`);
    const standby = first.node === 'n1' ? 'n2' : 'n1';
    await waitStandbyReady(tb, first.node, standby, 20_000, true, undefined, 6);
    const { reports, peers } = await runTrafficIn(tb, [6], CONNS, 9000, async () => {
      await tb.mustExec('router', ['ip', 'netns', 'del', tb.pod(podOf(first.node, first.st.owner)).ns]);
    });
    const next = await waitOwner(tb, first.st.owner, 8000, false, 6);
    assert.is.not(next.node, first.node, 'the other gateway took the address over');
    assert.ok(next.st.epoch > first.st.epoch, `epoch grew: ${first.st.epoch} → ${next.st.epoch}`);
    const r = reports[0];
    assert.is(r.intact, CONNS, `${r.intact}/${CONNS} connections intact; first errors: ${r.errors.slice(0, 4).join('; ')}`);
    assert.equal(r.errors, [], 'no connection error');
    const tcp = peers.filter((p) => !p.startsWith('udp')).map(peerAddress);
    assert.is(tcp.length, CONNS, `the server saw ${tcp.length} TCP peers`);
    assert.ok(tcp.every((a) => a === first.st.address), `every connection came from ${first.st.address}: ${[...new Set(tcp)]}`);
    process.stdout.write(`  IPv6-only pods over IPv4: owner killed, longest gap ${r.maxGapAfterMarkMs} ms over ${CONNS} connections; takeover ${JSON.stringify(next.st.lastTakeover)}\n`);
  });
});

test.run();
