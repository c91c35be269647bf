// An LB pod's CNI DEL with the cluster store unreachable (Redis SIGSTOPped): the node-local work (no more
// steering to the pod, the VIP withdrawn when it was the node's last serving LB pod, the pod's program
// removed) happens at once and the DEL returns; nothing of it waits on the store. The node is left as a DEL
// with the store up leaves it.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import * as fs from 'node:fs';
import { withTestbed, type Testbed } from './testbed';
import { EXPORT_TABLE, announcedOn, lbDatapathArgs, lbStatus, pool, routerPaths, slice, service, startBgp, until } from './lb-scenario';

const LB = { name: 'lb', namespace: 'shop', tether: { labels: { 'tether.dev/role': 'lb' } } };
/**
 * A bound on tetherd's part of the DEL: the drain (1.5 s) and netlink work, far under the VIP's slot
 * release delay (60 s) that the DEL used to wait for while the store was away. A correctness bound, not a
 * benchmark.
 */
const DEL_BOUND_MS = 8000;

/** tetherd's own duration of the pod's DEL, from its 'pod detached' line. */
function detachedMs(tb: Testbed, node: string, pod: string): number | undefined {
  const lines = fs.readFileSync(tb.tetherdLog(node), 'utf8').split('\n').filter((l) => l.includes('"message":"pod detached"') && l.includes(`"pod":"${pod}"`));
  const last = lines.pop();
  return last ? (JSON.parse(last) as { durationMs: number }).durationMs : undefined;
}

/** The VIP's routes on the node (main table and the export table BGP advertises). */
async function vipRoutes(tb: Testbed, node: string, vip: string): Promise<string[]> {
  const out: string[] = [];
  for (const table of ['main', String(EXPORT_TABLE)]) {
    const r = await tb.exec(node, ['ip', '-j', 'route', 'show', 'table', table, `${vip}/32`]);
    if ((JSON.parse(r.stdout || '[]') as unknown[]).length) out.push(table);
  }
  return out;
}

/** Whether the LB program is still on the node (tc filters at the host side of the pod are gone with it; the datapath reports its LB pods). */
async function nodeState(tb: Testbed, node: string, vip: string): Promise<{ routes: string[]; lbPods: string[]; announced: boolean }> {
  const st = await lbStatus(tb, node);
  return { routes: await vipRoutes(tb, node, vip), lbPods: st?.localLbPods ?? [], announced: st?.announced ?? false };
}

test('an LB pod\'s DEL with the store unreachable returns within the drain, not after the slot delay, and leaves the node as with the store up', async () => {
  await withTestbed({
    nodes: [
      { name: 'n1', pods: [LB] },
      { name: 'n2', pods: [LB] },
      { name: 'n3', pods: [{ name: 't1', namespace: 'shop', tether: { labels: { app: 'db' } } }] },
    ],
    tether: true,
    ipam: 'tether-ipam',
    tetherdArgs: ['--lb-export-table', String(EXPORT_TABLE), ...lbDatapathArgs()],
    extraObjects: [pool],
  }, async (tb) => {
    const bgp = await startBgp(tb, ['n1', 'n2']);
    try {
      tb.rewriteConfig({ extraObjects: [pool, service(), slice(tb, ['n3-t1'])] });
      const vip = await announcedOn(tb, ['n1', 'n2']);

      // With the store up: n2's LB pod goes.
      await tb.delPod('n2-lb');
      const upMs = detachedMs(tb, 'n2', 'shop/lb');
      const upState = await nodeState(tb, 'n2', vip);
      await announcedOn(tb, ['n1']);
      process.stdout.write(`  store up: DEL took ${upMs} ms in tetherd; n2 ${JSON.stringify(upState)}\n`);
      assert.equal(upState, { routes: [], lbPods: [], announced: false }, 'store up: the VIP withdrawn from n2, its LB pod gone');

      // With the store unreachable: n1's (the last) LB pod goes.
      tb.pauseRedis();
      let downMs: number | undefined;
      let downState: Awaited<ReturnType<typeof nodeState>>;
      let wall: number;
      try {
        const t0 = Date.now();
        await tb.delPod('n1-lb');
        wall = Date.now() - t0;
        downMs = detachedMs(tb, 'n1', 'shop/lb');
        downState = await nodeState(tb, 'n1', vip);
        const paths = await until('the router no longer sends the VIP anywhere', async () => (await routerPaths(tb, vip)).length === 0, 15_000).catch(() => false);
        process.stdout.write(`  store unreachable: DEL took ${downMs} ms in tetherd (${wall} ms for the whole chain); n1 ${JSON.stringify(downState)}; router withdrawn: ${paths}\n`);
      } finally {
        tb.resumeRedis();
      }
      assert.ok(downMs !== undefined, 'tetherd logged the DEL');
      assert.ok(downMs! < DEL_BOUND_MS, `tetherd's DEL took ${downMs} ms with the store unreachable (bound ${DEL_BOUND_MS} ms; ${upMs} ms with the store up)`);
      assert.equal(downState!, upState, 'the node is left as a DEL with the store up leaves it');
    } finally {
      await bgp.stop();
    }
  });
});

test.run();
