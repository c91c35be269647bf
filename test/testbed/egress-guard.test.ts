// Never unNATed: gateway pods are killed under traffic 20 times, with conntrack sync disabled and with it
// enabled, while tcpdump on the external server records every packet whose source is in the cluster's pod
// range. None may arrive: whatever a dying gateway pod still sends toward the Egress's destinations with
// a source it does not own (a client's address once its NAT is gone) is dropped at its node by the guard.
// With sync, every connection (TCP and a UDP stream) also survives all 20 kills: each replacement pod gets
// the owner's table (a resync on request) before the next kill.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { withTestbed, type Testbed } from './testbed';
import type { TrafficReport } from '../lib/traffic';
import { runTraffic, topology, waitOwner, waitStandbyReady } from './egress-scenario';

const KILLS = Number(process.env.EGRESS_GUARD_KILLS ?? 20);
const CONNS = 30;
const POD_RANGE = '10.244.0.0/16';

async function killRepeatedly(tb: Testbed, label: string, sync: boolean): Promise<{ kills: number; leaked: string[]; report: TrafficReport }> {
  // -l: line-buffered; -n: numbers; only packets from pod addresses, which must never reach the outside.
  const dump = tb.spawn('server', ['tcpdump', '-n', '-l', '-i', 'eth0', 'src', 'net', POD_RANGE]);
  let out = '';
  dump.stdout?.on('data', (b: Buffer) => (out += b.toString()));
  let err = '';
  dump.stderr?.on('data', (b: Buffer) => (err += b.toString()));
  const end = Date.now() + 5000;
  while (!/listening on/.test(err) && Date.now() < end) await new Promise((r) => setTimeout(r, 50));
  assert.match(err, /listening on/, `tcpdump on the server did not start: ${err}`);
  let kills = 0;
  let seq = 0;
  let report: TrafficReport;
  try {
    ({ report } = await runTraffic(tb, CONNS, KILLS * 3500 + 4000, async () => {
      let owner = await waitOwner(tb, undefined, 15_000, true);
      for (let i = 0; i < KILLS; i++) {
        await tb.mustExec('router', ['ip', 'netns', 'del', tb.pod(`${owner.node}-${owner.st.owner.split('/')[1]}`).ns]);
        kills++;
        const next = await waitOwner(tb, owner.st.owner, 15_000, true);
        // A replacement on the node that lost its pod; the next kill waits until the new owner knows it
        // as a candidate (in sync with it when sync is on), as a rolling restart would.
        const name = `gw${owner.node.slice(1)}k${++seq}`;
        await tb.addPod(owner.node, { name, namespace: 'shop', tether: { labels: { role: 'egress-gw' } } });
        await waitStandbyReady(tb, next.node, owner.node, 20_000, sync, `shop/${name}`);
        owner = next;
      }
    }));
  } finally {
    await new Promise((r) => setTimeout(r, 300));
    dump.kill('SIGTERM');
  }
  const leaked = out.split('\n').filter((l) => / IP /.test(l));
  process.stdout.write(`  ${label}: ${kills} gateway pods killed under traffic; packets from pod addresses at the server: ${leaked.length}; TCP ${report.intact}/${CONNS} intact (${report.errors.slice(0, 2).join(', ')}), UDP ${report.udp?.received}/${report.udp?.sent}\n`);
  return { kills, leaked, report };
}

test('conntrack sync disabled: 20 gateway pods killed under traffic, no packet from a pod address reaches the server', async () => {
  await withTestbed(topology(['--no-conntrack-sync']), async (tb) => {
    await waitOwner(tb);
    const r = await killRepeatedly(tb, 'without sync', false);
    assert.is(r.kills, KILLS);
    assert.equal(r.leaked.slice(0, 5), [], `pod-address packets reached the server (${r.leaked.length})`);
  });
});

test('conntrack sync enabled: the same, every connection survives, and the guard let the owners traffic out', async () => {
  await withTestbed(topology(), async (tb) => {
    await waitOwner(tb);
    const r = await killRepeatedly(tb, 'with sync', true);
    assert.is(r.kills, KILLS);
    // Each replacement was in sync before the next kill: every connection survives every kill.
    assert.is(r.report.intact, CONNS, `${r.report.intact}/${CONNS} connections intact: ${r.report.errors.slice(0, 3)}`);
    assert.equal(r.leaked.slice(0, 5), [], `pod-address packets reached the server (${r.leaked.length})`);
    const owner = await waitOwner(tb, undefined, 15_000, true);
    const g = ((await tb.status(owner.node)) as unknown as { egressSecurity: { guard: Record<string, { allowed: number } | undefined> } }).egressSecurity.guard[owner.st.owner];
    assert.ok(g && g.allowed > 0, `the current owner's guard let its traffic out: ${JSON.stringify(g)}`);
  });
});

test.run();
