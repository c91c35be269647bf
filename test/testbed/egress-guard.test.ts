// Never unNATed: gateway pods are killed under traffic 20 times, with conntrack sync disabled and with it
// enabled, while tcpdump on the external server records every packet whose source is in the cluster's pod
// range. None may arrive: whatever a dying gateway pod still sends toward the Egress's destinations with
// a source it does not own (a client's address once its NAT is gone) is dropped at its node by the guard.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { withTestbed, type Testbed } from './testbed';
import { runTraffic, topology, waitOwner } from './egress-scenario';

const KILLS = Number(process.env.EGRESS_GUARD_KILLS ?? 20);
const CONNS = 30;
const POD_RANGE = '10.244.0.0/16';

async function killRepeatedly(tb: Testbed, label: string): Promise<{ kills: number; leaked: string[] }> {
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
  try {
    await runTraffic(tb, CONNS, KILLS * 2500 + 4000, async () => {
      for (let i = 0; i < KILLS; i++) {
        const owner = await waitOwner(tb, undefined, 15_000, true);
        const key = `${owner.node}-${owner.st.owner.split('/')[1]}`;
        await tb.mustExec('router', ['ip', 'netns', 'del', tb.pod(key).ns]);
        kills++;
        await waitOwner(tb, owner.st.owner, 15_000, true);
        await tb.addPod(owner.node, { name: `gw${owner.node.slice(1)}k${++seq}`, namespace: 'shop', tether: { labels: { role: 'egress-gw' } } });
        await new Promise((r) => setTimeout(r, 600));
      }
    });
  } finally {
    await new Promise((r) => setTimeout(r, 300));
    dump.kill('SIGTERM');
  }
  const leaked = out.split('\n').filter((l) => / IP /.test(l));
  process.stdout.write(`  ${label}: ${kills} gateway pods killed under traffic; packets from pod addresses at the server: ${leaked.length}\n`);
  return { kills, leaked };
}

test('conntrack sync disabled: 20 gateway pods killed under traffic, no packet from a pod address reaches the server', async () => {
  await withTestbed(topology(['--no-conntrack-sync']), async (tb) => {
    await waitOwner(tb);
    const r = await killRepeatedly(tb, 'without sync');
    assert.is(r.kills, KILLS);
    assert.equal(r.leaked.slice(0, 5), [], `pod-address packets reached the server (${r.leaked.length})`);
  });
});

test('conntrack sync enabled: the same, and the guard let the owners traffic out', async () => {
  await withTestbed(topology(), async (tb) => {
    await waitOwner(tb);
    const r = await killRepeatedly(tb, 'with sync');
    assert.is(r.kills, KILLS);
    assert.equal(r.leaked.slice(0, 5), [], `pod-address packets reached the server (${r.leaked.length})`);
    const owner = await waitOwner(tb, undefined, 15_000, true);
    const g = ((await tb.status(owner.node)) as unknown as { egressSecurity: { guard: Record<string, { allowed: number } | undefined> } }).egressSecurity.guard[owner.st.owner];
    assert.ok(g && g.allowed > 0, `the current owner's guard let its traffic out: ${JSON.stringify(g)}`);
  });
});

test.run();
