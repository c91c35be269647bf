// The cluster store through Redis Sentinel on the testbed (a primary, a replica and three sentinels on the
// router; tetherds use redis+sentinel://). The primary is SIGKILLed during traffic, and again during a
// takeover: every connection survives, the sentinels promote the replica, and the ownership record on the
// new primary names the owner every node agrees on, with its epoch.
import * as fs from 'node:fs';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { withTestbed, type Testbed } from './testbed';
import { egressOf, runTraffic, topology, waitOwner, waitStandbyReady } from './egress-scenario';

const CONNS = 50;

function sentinelTopology() {
  return { ...topology(), redis: 'sentinel' as const };
}

/** The ownership record of the floating address on the current primary. */
function record(tb: Testbed, address: string): Record<string, string> {
  const { port } = tb.sentinel.master();
  const lines = tb.sentinel.cli(port, 'hgetall', `${tb.redisPrefix}egress:shop/out:owner:${address}`).split('\n');
  const out: Record<string, string> = {};
  for (let i = 0; i + 1 < lines.length; i += 2) out[lines[i]] = lines[i + 1];
  return out;
}

/** What each gateway node believes about the store, and its store-related log lines (for a failure). */
async function diagnose(tb: Testbed): Promise<string> {
  const out: string[] = [];
  for (const node of ['n1', 'n2']) {
    const st = await egressOf(tb, node).catch((e) => `status failed: ${(e as Error).message}`);
    out.push(`${node} status: ${JSON.stringify(st)}`);
    const lines = fs.readFileSync(tb.tetherdLog(node), 'utf8').split('\n').filter((l) => /store|recorded|ownership/.test(l));
    out.push(...lines.slice(-12).map((l) => `${node}: ${l.slice(0, 400)}`));
  }
  return out.join('\n');
}

async function waitRecord(tb: Testbed, address: string, owner: string, epoch: number): Promise<Record<string, string>> {
  const end = Date.now() + 15_000;
  for (;;) {
    const r = record(tb, address);
    if (r.owner === owner && Number(r.epoch) === epoch) return r;
    if (Date.now() > end) throw new Error(`the record on the new primary is ${JSON.stringify(r)}, not ${owner} epoch ${epoch}\n${await diagnose(tb)}`);
    await new Promise((res) => setTimeout(res, 200));
  }
}

test('the Redis primary killed during traffic: connections continue, the store fails over, the record stays', async () => {
  await withTestbed(sentinelTopology(), async (tb) => {
    const first = await waitOwner(tb);
    await tb.sentinel.waitReplicated();
    let failover = { port: 0, ms: 0 };
    const { report } = await runTraffic(tb, CONNS, 9000, async () => {
      failover = await tb.sentinel.waitFailover(tb.sentinel.killPrimary());
    });
    assert.is(report.intact, CONNS, `${report.intact}/${CONNS} intact: ${report.errors.slice(0, 3)}`);
    const now = await egressOf(tb, first.node);
    assert.is(now?.owner, first.st.owner, 'no takeover: the owner lives');
    await waitRecord(tb, first.st.address, first.st.owner, first.st.epoch);
    process.stdout.write(`  primary killed during traffic: promoted in ${failover.ms} ms, ${report.intact}/${CONNS} intact, longest gap ${report.maxGapAfterMarkMs} ms\n`);
  });
});

test('the Redis primary killed during a takeover: the takeover happens, connections continue, the new primary records it', async () => {
  await withTestbed(sentinelTopology(), async (tb) => {
    const first = await waitOwner(tb);
    await waitStandbyReady(tb, first.node, first.node === 'n1' ? 'n2' : 'n1');
    await tb.sentinel.waitReplicated();
    let failoverMs = 0;
    const { report } = await runTraffic(tb, CONNS, 9000, async () => {
      const old = tb.sentinel.killPrimary();
      await new Promise((r) => setTimeout(r, 300));
      // The owning gateway pod vanishes while the store has no primary.
      await tb.mustExec('router', ['ip', 'netns', 'del', tb.pod(`${first.node}-${first.st.owner.split('/')[1]}`).ns]);
      failoverMs = (await tb.sentinel.waitFailover(old)).ms;
    });
    const next = await waitOwner(tb, first.st.owner, 15_000, true);
    assert.ok(next.st.epoch > first.st.epoch, `epoch grew: ${first.st.epoch} → ${next.st.epoch}`);
    assert.is(report.intact, CONNS, `${report.intact}/${CONNS} intact: ${report.errors.slice(0, 3)}`);
    const client = await egressOf(tb, 'n3');
    assert.is(client?.owner, next.st.owner, 'the client node follows the new owner');
    const rec = await waitRecord(tb, first.st.address, next.st.owner, next.st.epoch);
    process.stdout.write(`  primary killed during a takeover: promoted in ${failoverMs} ms; takeover ${JSON.stringify(next.st.lastTakeover)}; record ${JSON.stringify(rec)}; longest gap ${report.maxGapAfterMarkMs} ms\n`);
  });
});

test.run();
