// Egress failover on the testbed, with real traffic: 3 nodes, gateway pods on n1 and n2, client pods on
// n3, an external server that records each connection's source address. Long-lived TCP connections (and
// a UDP stream) run through the floating address while the owning gateway is killed abruptly; every
// connection must continue with intact data, from the same floating address, with a short gap.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { withTestbed } from './testbed';
import { egressOf, runTraffic, topology, waitOwner, waitStandbyReady } from './egress-scenario';
import { until } from '../lib/wait';

const CONNS = Number(process.env.EGRESS_TEST_CONNS ?? 200);
/** EGRESS_ONLY=<part of a test name> runs just that scenario (for debugging). */
const only = process.env.EGRESS_ONLY;
const scenario = (name: string, fn: () => Promise<void>) => (only && !name.includes(only) ? test.skip(name, fn) : test(name, fn));

scenario('owner gateway killed abruptly: every TCP connection continues from the same floating address', async () => {
  await withTestbed(topology(), async (tb) => {
    const first = await waitOwner(tb);
    const floating = first.st.address;
    const ownerKey = `${first.node}-${first.st.owner.split('/')[1]}`;
    const { report, peers } = await runTraffic(tb, CONNS, 9000, async () => {
      // No goodbye: the gateway pod's namespace (and with it its veth) vanishes.
      await tb.mustExec('router', ['ip', 'netns', 'del', tb.pod(ownerKey).ns]);
    });
    const next = await waitOwner(tb, first.st.owner);
    if (process.env.EGRESS_DEBUG) {
      const gwKey = `${next.node}-${next.st.owner.split('/')[1]}`;
      const ct = await tb.exec(gwKey, ['sh', '-c', 'nft list table ip tether_egress; conntrack -S']);
      process.stdout.write(`DEBUG new owner conntrack (${ct.stdout.split('\n').length} lines):\n${ct.stdout.split('\n').slice(0, 8).join('\n')}\n${ct.stderr}\n`);
      process.stdout.write(`DEBUG status: ${JSON.stringify(await tb.status(next.node))}\n`.slice(0, 3000));
    }
    assert.is.not(next.node, first.node, 'the other gateway took over');
    assert.ok(next.st.epoch > first.st.epoch, `epoch grew: ${first.st.epoch} → ${next.st.epoch}`);
    assert.is(report.intact, CONNS, `${report.intact}/${CONNS} connections intact; first errors: ${report.errors.slice(0, 6).join('; ')}`);
    assert.equal(report.errors, [], 'no connection error');
    // The event's gap: connection set-up stalls before the mark (a SYN retransmitted while 200 connections
    // open at once) are the harness's, not the failover's; they are printed, not asserted.
    assert.ok(report.maxGapAfterMarkMs !== undefined && report.maxGapAfterMarkMs < 1000, `longest gap during the event ${report.maxGapAfterMarkMs} ms`);
    const tcpPeers = peers.filter((p) => !p.startsWith('udp'));
    assert.is(tcpPeers.length, CONNS);
    assert.ok(tcpPeers.every((p) => p.startsWith(`${floating}:`)), `server saw only the floating address: ${tcpPeers.slice(0, 3)}`);
    assert.ok(report.udp && report.udp.received > report.udp.sent * 0.8, `UDP continued: ${JSON.stringify(report.udp)}`);
    process.stdout.write(`  failover: longest gap ${report.maxGapAfterMarkMs} ms during the failover (${report.maxGapMs} ms over the whole run, ${report.gaps.filter((g) => g >= 900).length} connections with a gap ≥ 900 ms) over ${CONNS} connections, UDP ${report.udp?.received}/${report.udp?.sent}, takeover ${JSON.stringify(next.st.lastTakeover)}\n`);
  });
});

scenario('the owner returns: it does not take the address back while the new owner lives', async () => {
  await withTestbed(topology(), async (tb) => {
    const first = await waitOwner(tb);
    const oldNode = first.node;
    await tb.mustExec('router', ['ip', 'netns', 'del', tb.pod(`${oldNode}-${first.st.owner.split('/')[1]}`).ns]);
    const next = await waitOwner(tb, first.st.owner);
    // A new gateway pod appears on the old owner's node, and that node's tetherd restarts.
    await tb.addPod(oldNode, { name: `gw${oldNode.slice(1)}b`, namespace: 'shop', tether: { labels: { role: 'egress-gw' } } });
    await tb.restartTetherd(oldNode);
    await new Promise((r) => setTimeout(r, 2500));
    const after = await egressOf(tb, next.node);
    assert.is(after?.owner, next.st.owner, 'ownership stayed with the new owner');
    assert.is(after?.epoch, next.st.epoch, 'no further epoch: no flapping back');
    assert.not.ok((await egressOf(tb, oldNode))?.ownedHere, 'the returning node holds nothing');
  });
});

scenario("the owner's whole node goes down (tetherd killed, links down): connections continue", async () => {
  await withTestbed(topology(), async (tb) => {
    const first = await waitOwner(tb);
    const { report, peers } = await runTraffic(tb, CONNS, 9000, async () => {
      await tb.killTetherd(first.node, 'SIGKILL');
      await tb.mustExec(first.node, ['ip', 'link', 'set', 'eth0', 'down']);
    });
    const other = first.node === 'n1' ? 'n2' : 'n1';
    const st = await egressOf(tb, other);
    assert.ok(st?.ownedHere, 'the surviving gateway node owns the address');
    assert.match(String(st?.lastTakeover?.cause), /failover: owner .* is down/);
    assert.is(report.intact, CONNS, `${report.intact}/${CONNS} intact; ${report.errors.slice(0, 4).join('; ')}`);
    // The event's gap: connection set-up stalls before the mark (a SYN retransmitted while 200 connections
    // open at once) are the harness's, not the failover's; they are printed, not asserted.
    assert.ok(report.maxGapAfterMarkMs !== undefined && report.maxGapAfterMarkMs < 1000, `longest gap during the event ${report.maxGapAfterMarkMs} ms`);
    assert.ok(peers.filter((p) => !p.startsWith('udp')).every((p) => p.startsWith(`${first.st.address}:`)));
    process.stdout.write(`  node down: longest gap ${report.maxGapAfterMarkMs} ms during the failover (${report.maxGapMs} ms over the whole run, ${report.gaps.filter((g) => g >= 900).length} connections with a gap ≥ 900 ms) over ${CONNS} connections, takeover ${JSON.stringify(st?.lastTakeover)}\n`);
  });
});

// A planned handover must stay under the 200 ms target: the old owner keeps forwarding for the
// drain, so nothing should be lost. It was ~260 ms, one TCP retransmission timeout: for the ~30 ms between
// the clients' switch (the store's notice) and the new owner's GARP, the echo of a segment sent through
// the new owner came back through the old one, whose strict conntrack window tracking judged it invalid
// ("ACKed data not seen yet") and dropped it; gateways now track windows liberally. The gap measured is
// the longest one that ended after the handover began: 200 connections starting at once can stall for
// over 100 ms on a busy 2-core machine, which says nothing about the handover.
scenario('planned handover (the owner gateway pod is deleted through the CNI chain): no connection lost, gap under 200 ms', async () => {
  await withTestbed(topology(), async (tb) => {
    const first = await waitOwner(tb);
    const { report } = await runTraffic(tb, CONNS, 8000, async () => {
      await tb.delPod(`${first.node}-${first.st.owner.split('/')[1]}`);
    });
    const next = await waitOwner(tb, first.st.owner);
    assert.match(String(next.st.lastTakeover?.cause ?? ''), /handover/);
    assert.is(report.intact, CONNS, `${report.intact}/${CONNS} intact; ${report.errors.slice(0, 4).join('; ')}`);
    assert.ok(report.maxGapAfterMarkMs !== undefined && report.maxGapAfterMarkMs < 200, `longest gap during the handover ${report.maxGapAfterMarkMs} ms`);
    process.stdout.write(`  planned handover: longest gap ${report.maxGapAfterMarkMs} ms during the handover (${report.maxGapMs} ms over the whole run, ${report.gaps.filter((g) => g >= 900).length} connections with a gap ≥ 900 ms) over ${CONNS} connections\n`);
  });
});

// Issue 29: a stopping owner handed its address to a standby that could not sync with it (their sync
// protocol versions differed), and every connection the standby did not have died. Here the standby's sync
// port is blocked (TCP only: BFD and notices go on, so it is live but out of sync) before the owner's
// tetherd gets SIGTERM: the owner must keep the address (the standby says why it is out of sync) until the
// sync is back and the standby in sync, and then hand it over, every connection intact.
scenario('tetherd stopping while its only standby is out of sync: the address stays until the standby is in sync, then moves; no connection lost', async () => {
  await withTestbed(topology(), async (tb) => {
    const first = await waitOwner(tb);
    const standby = first.node === 'n1' ? 'n2' : 'n1';
    await waitStandbyReady(tb, first.node, standby);
    const block = 'table inet test_block_sync {\n  chain input {\n    type filter hook input priority -10;\n    tcp dport 3785 drop\n  }\n}\n';
    let stopped: Promise<unknown> | undefined;
    let heldMs = 0;
    let standbyView: { reason?: string } | undefined;
    const { report } = await runTraffic(tb, CONNS, 60_000, async () => {
      await tb.mustExec(standby, ['nft', '-f', '-'], { input: block });
      // The owner sees the standby's stream die (its dead-peer timer), then reports it out of sync.
      await until('the owner sees the standby out of sync', async () => {
        const o = (await tb.status(first.node)) as unknown as { egress: Array<{ candidates: Array<{ node: string; inSync: boolean }> }> };
        return o.egress[0].candidates.some((c) => c.node === standby && !c.inSync);
      }, 10_000);
      const t0 = Date.now();
      stopped = tb.killTetherd(first.node, 'SIGTERM');
      await new Promise((r) => setTimeout(r, 3000));
      // Still the owner, as the standby knows it: nothing moved to a standby without the connections.
      const st = await egressOf(tb, standby);
      assert.is(st?.owner, first.st.owner, 'the stopping owner kept the address');
      assert.is(st?.epoch, first.st.epoch);
      standbyView = ((await tb.status(standby)) as unknown as { egress: Array<{ standbySync?: { reason?: string } }> }).egress[0].standbySync;
      await tb.mustExec(standby, ['nft', 'delete', 'table', 'inet', 'test_block_sync']);
      await stopped;
      heldMs = Date.now() - t0;
    }, { endWhenDone: true });
    const next = await waitOwner(tb, first.st.owner);
    assert.is(next.node, standby);
    assert.match(String(next.st.lastTakeover?.cause ?? ''), /tetherd stopping/);
    assert.not.match(String(next.st.lastTakeover?.cause ?? ''), /no standby in sync/, 'handed over to a standby in sync, not at the end of the wait');
    assert.ok(standbyView && standbyView.reason === 'unreachable', `the standby said why it was out of sync: ${JSON.stringify(standbyView)}`);
    assert.is(report.intact, CONNS, `${report.intact}/${CONNS} intact; ${report.errors.slice(0, 4).join('; ')}`);
    process.stdout.write(`  owner stopping with its standby out of sync: address kept ${heldMs} ms until the standby was in sync; ${report.intact}/${CONNS} intact, longest gap ${report.maxGapAfterMarkMs} ms\n`);
  });
});

scenario('forged BFD packets, ownership notices and garbage on the sync port are rejected and counted; the stream is not disturbed', async () => {
  await withTestbed(topology(), async (tb) => {
    const first = await waitOwner(tb);
    const standby = first.node === 'n1' ? 'n2' : 'n1';
    const standbyIp = tb.node(standby).fabricIp;
    const ownerIp = tb.node(first.node).fabricIp;
    const ATTACK = `
const dgram = require('dgram'), net = require('net');
const [owner, standby] = process.argv.slice(1);
const u = dgram.createSocket('udp4');
// A well-formed BFD control packet claiming Up, with meticulous keyed SHA1 and a made-up digest.
const p = Buffer.alloc(52); p[0] = 0x20; p[1] = 0xc4; p[2] = 3; p[3] = 52; p.writeUInt32BE(7, 4); p.writeUInt32BE(0, 8);
p.writeUInt32BE(100000, 12); p.writeUInt32BE(100000, 16); p[24] = 5; p[25] = 28; p[26] = 1; p.writeUInt32BE(9, 28); p.fill(0xab, 32);
let n = 0;
const t = setInterval(() => {
  for (const h of [owner, standby]) { u.send(p, 3784, h); u.send(Buffer.from('garbage ' + n), 3784, h); }
  // An ownership notice naming an attacker's pod, with a made-up MAC, and garbage on the notice port.
  const body = Buffer.from(JSON.stringify({ from: 'n9', boot: '0123456789abcdef', seq: n + 1, at: Date.now(), notices: [{ egress: 'shop/out', address: '198.18.0.201', owner: 'evil/gw', epoch: 999, ownerNode: 'n9', ownerNodeAddress: '', ownerPodIp: '', cause: 'forged', inSync: [] }] }));
  const notice = Buffer.concat([Buffer.from([84, 79, 87, 78, 1, 0, 0, 0]), Buffer.alloc(32, 0xcd), body]);
  for (const h of [owner, standby]) { u.send(notice, 3785, h); u.send(Buffer.from('garbage ' + n), 3785, h); }
  // A complete frame of junk (fails authentication) and a frame claiming 2 GB (refused before allocation).
  const junk = Buffer.alloc(64, n); junk.writeUInt32BE(60, 0);
  const c = net.connect(3785, standby, () => c.write(junk));
  c.on('error', () => {});
  const big = Buffer.alloc(8, 0); big.writeUInt32BE(0x7fffffff, 0);
  const d = net.connect(3785, standby, () => d.write(big));
  d.on('error', () => {});
  if (++n === 20) { clearInterval(t); setTimeout(() => process.exit(0), 200); }
}, 100);
`;
    const { report } = await runTraffic(tb, CONNS, 7000, async () => {
      await tb.mustExec('client', [process.execPath, '-e', ATTACK, ownerIp, standbyIp]);
      // The stream keeps flowing after the attack: kill the owner so the standby's synced state is used.
      await tb.mustExec('router', ['ip', 'netns', 'del', tb.pod(`${first.node}-${first.st.owner.split('/')[1]}`).ns]);
    });
    const sec = ((await tb.status(standby)) as unknown as { egressSecurity: { bfdRejected: Record<string, number>; syncRejected: Record<string, number>; noticesRejected: Record<string, number> } }).egressSecurity;
    const bfdRejected = Object.values(sec.bfdRejected).reduce((a, b) => a + b, 0);
    const syncRejected = Object.values(sec.syncRejected).reduce((a, b) => a + b, 0);
    assert.ok(sec.noticesRejected.badMac >= 20 && sec.noticesRejected.malformed >= 20, `forged and garbage ownership notices counted: ${JSON.stringify(sec.noticesRejected)}`);
    const after = await egressOf(tb, standby);
    assert.not.match(String(after?.owner), /evil/, 'a forged notice changed nothing');
    assert.ok(bfdRejected >= 20, `BFD rejections counted: ${JSON.stringify(sec.bfdRejected)}`);
    assert.ok(syncRejected >= 10, `sync rejections counted: ${JSON.stringify(sec.syncRejected)}`);
    assert.is(report.intact, CONNS, `${report.intact}/${CONNS} intact after the attack and a takeover`);
  });
});

scenario('negative control: with conntrack sync disabled, the same takeover breaks the connections', async () => {
  await withTestbed(topology(['--no-conntrack-sync']), async (tb) => {
    const first = await waitOwner(tb);
    const { report } = await runTraffic(tb, CONNS, 8000, async () => {
      await tb.mustExec('router', ['ip', 'netns', 'del', tb.pod(`${first.node}-${first.st.owner.split('/')[1]}`).ns]);
    });
    await waitOwner(tb, first.st.owner);
    assert.ok(report.intact < CONNS / 2, `only ${report.intact}/${CONNS} may survive without sync`);
    process.stdout.write(`  negative control: ${report.intact}/${CONNS} connections survived without conntrack sync\n`);
  });
});

test.run();
