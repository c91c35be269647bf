// One Egress, several floating addresses, on the testbed with real traffic: gateway pods gw1..gw3 on n1..n3
// (zones a, b, c), client pods on n4 (zone a) and n3. Placement spreads the addresses over the gateway
// nodes; new flows spread evenly over them and stay pinned; addresses come and go live without moving a
// flow; a lost node moves only its address and every connection survives; zone policies steer new flows.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { withTestbed } from './testbed';
import { egress, owners, pool, shortFlows, sourceServer, topology, traffic, until } from './egress-multi-scenario';

const only = process.env.EGRESS_MULTI_ONLY;
const scenario = (name: string, fn: () => Promise<void>) => (only && !name.includes(only) ? test.skip(name, fn) : test(name, fn));
const CONNS = Number(process.env.EGRESS_TEST_CONNS ?? 200);
const FLOWS = Number(process.env.EGRESS_MULTI_FLOWS ?? 3000);

scenario('3 addresses on 3 distinct gateway nodes; short flows from 2 nodes spread 33 % ± 5 %; a lost node moves only its address and every connection survives', async () => {
  await withTestbed(topology(), async (tb) => {
    const held = await owners(tb, 3);
    assert.is(new Set(held.values()).size, 3, `three distinct nodes: ${JSON.stringify([...held])}`);
    const server = await sourceServer(tb);
    let tally: Record<string, number> = {};
    try {
      const [a, b] = await Promise.all([shortFlows(tb, 'n4-web', FLOWS / 2), shortFlows(tb, 'n3-web', FLOWS / 2)]);
      process.stdout.write(`  short flows: longest ${Math.max(a.maxMs, b.maxMs)} ms; over 1 s: n4 ${JSON.stringify(a.slow)}, n3 ${JSON.stringify(b.slow)}\n`);
      assert.is(a.errors + b.errors, 0, `every short flow answered; unanswered: ${JSON.stringify([a, b].map((r) => ({ why: r.why, failed: r.failed })))}`);
      for (const r of [a, b]) for (const [k, v] of Object.entries(r.seen)) tally[k] = (tally[k] ?? 0) + v;
    } finally {
      server.kill('SIGTERM');
    }
    const total = Object.values(tally).reduce((x, y) => x + y, 0);
    process.stdout.write(`  fairness over ${total} flows: ${Object.entries(tally).map(([k, v]) => `${k} ${((100 * v) / total).toFixed(1)} %`).join(', ')}\n`);
    assert.equal(Object.keys(tally).sort(), [...held.keys()].sort(), 'the server saw exactly the three floating addresses');
    for (const [k, v] of Object.entries(tally)) assert.ok(Math.abs(v / total - 1 / 3) <= 0.05, `${k}: ${((100 * v) / total).toFixed(1)} % of the flows`);

    // A gateway node is lost (not n3, which also hosts a client) under 200 live connections.
    const lost = [...held.values()].find((n) => n !== 'n3')!;
    const moved = [...held].find(([, n]) => n === lost)![0];
    const { report } = await traffic(tb, CONNS, 10_000, async () => {
      await tb.killTetherd(lost, 'SIGKILL');
      await tb.mustExec(lost, ['ip', 'link', 'set', 'eth0', 'down']);
    });
    const survivors = ['n1', 'n2', 'n3'].filter((n) => n !== lost);
    const after = await owners(tb, 3, survivors);
    process.stdout.write(`  node ${lost} lost: ${moved} moved to ${after.get(moved)}; ${report.intact}/${CONNS} intact, longest gap ${report.maxGapAfterMarkMs} ms\n`);
    for (const [address, node] of held) if (address !== moved) assert.is(after.get(address), node, `${address} stayed on ${node}`);
    assert.ok(survivors.includes(after.get(moved)!), 'the lost address moved to a live gateway node');
    assert.is(report.intact, CONNS, `${report.intact}/${CONNS} intact; ${report.errors.slice(0, 4).join('; ')}`);
  });
});

scenario('addresses added and removed live: a 4th address moves no live connection; removing it again breaks none; new flows use it meanwhile', async () => {
  await withTestbed(topology(), async (tb) => {
    const held = await owners(tb, 3);
    let four = new Map<string, string>();
    let newFlows: Record<string, number> = {};
    const { report, peers } = await traffic(tb, CONNS, 12_000, async () => {
      tb.rewriteConfig({ extraObjects: [pool, egress({ addresses: { pool: 'float', count: 4 } })] });
      four = await owners(tb, 4);
      const server = await sourceServer(tb);
      try {
        newFlows = (await shortFlows(tb, 'n4-web', 400)).seen;
      } finally {
        server.kill('SIGTERM');
      }
      tb.rewriteConfig({ extraObjects: [pool, egress()] });
      await owners(tb, 3);
    });
    const added = [...four.keys()].find((a) => !held.has(a))!;
    process.stdout.write(`  4th address ${added} on ${four.get(added)}: new flows ${JSON.stringify(newFlows)}; ${report.intact}/${CONNS} live connections intact\n`);
    assert.ok(added, 'a fourth address was allocated and held');
    assert.ok((newFlows[added] ?? 0) > 0, 'new flows used the fourth address');
    assert.is(report.intact, CONNS, `${report.intact}/${CONNS} intact; ${report.errors.slice(0, 4).join('; ')}`);
    // Every live connection kept one source: the server saw each client port from one address only.
    const tcp = peers.filter((p) => !p.startsWith('udp'));
    assert.is(tcp.length, CONNS, `the server saw ${tcp.length} TCP peers for ${CONNS} connections`);
    assert.ok(tcp.every((p) => held.has(p.split(':')[0])), 'no live connection ever came from the added address');
  });
});

scenario('zones: preferZone clients use their zone\'s address and fall back when it goes; requireZone clients are dropped and status says why', async () => {
  await withTestbed(topology({ zonePolicy: 'preferZone' }), async (tb) => {
    const held = await owners(tb, 3);
    assert.is(new Set(held.values()).size, 3, `three distinct nodes: ${JSON.stringify([...held])}`);
    const zoneA = [...held].find(([, n]) => n === 'n1')![0];
    const server = await sourceServer(tb);
    try {
      const pref = await shortFlows(tb, 'n4-web', 60);
      assert.equal(pref.seen, { [zoneA]: 60 }, `n4 (zone a) used only n1's address ${zoneA}`);
      // Zone a's only gateway goes: its address moves to another zone; the clients fall back.
      await tb.delPod('n1-gw1');
      const moved = await until('zone a address moved', async () => {
        const h = await owners(tb, 3, ['n2', 'n3']);
        return h.get(zoneA) !== 'n1' && h;
      });
      const fb = await shortFlows(tb, 'n4-web', 60);
      assert.is(fb.errors, 0);
      assert.is(Object.values(fb.seen).reduce((x, y) => x + y, 0), 60, `fell back: ${JSON.stringify(fb.seen)} (addresses on ${JSON.stringify([...moved])})`);
      // requireZone: no address in zone a now, so n4's clients are dropped, and its status says why.
      tb.rewriteConfig({ extraObjects: [pool, egress({ zonePolicy: 'requireZone' })] });
      const reason = await until('n4 reports the zone problem', async () => {
        const s = (await tb.status('n4')) as unknown as { egressSummary?: Record<string, { zoneProblem?: string }> };
        return s.egressSummary?.['shop/out']?.zoneProblem;
      });
      const req = await shortFlows(tb, 'n4-web', 10);
      process.stdout.write(`  preferZone: all 60 flows on ${zoneA}, then fell back to ${JSON.stringify(fb.seen)}; requireZone: ${req.errors}/10 dropped ("${reason}")\n`);
      assert.is(req.errors, 10, 'requireZone: no flow left through another zone');
      assert.match(reason, /no address is held in zone a/);
    } finally {
      server.kill('SIGTERM');
    }
  });
});

scenario('bad input: more addresses than the pool has free; the reason is in status and the addresses that could be had work', async () => {
  // The pool is a /29: 6 usable addresses (its first and last are not given out). Ask for 10.
  await withTestbed(topology({ addresses: { pool: 'float', count: 10 } }), async (tb) => {
    type Summary = Record<string, { asked: number; allocated: number; shortfall?: string }>;
    const sum = await until('the shortfall reported', async () => {
      const s = ((await tb.status('n4')) as unknown as { egressSummary: Summary }).egressSummary['shop/out'];
      return s && !!s.shortfall && s.allocated === 6 ? s : undefined;
    });
    process.stdout.write(`  10 asked from a /29: ${sum.allocated} allocated; "${sum.shortfall}"\n`);
    assert.is(sum.asked, 10);
    assert.match(sum.shortfall!, /pool "float" has no 1 free IPv4 address/);
    const held = await owners(tb, 6);
    assert.equal([...new Set(held.values())].map((n) => [...held.values()].filter((x) => x === n).length), [2, 2, 2], 'the six addresses spread 2 + 2 + 2 over the three gateway nodes');
    const server = await sourceServer(tb);
    try {
      const r = await shortFlows(tb, 'n4-web', 80);
      assert.is(r.errors, 0, 'flows go out through the addresses that could be had');
    } finally {
      server.kill('SIGTERM');
    }
  });
});

test.run();
