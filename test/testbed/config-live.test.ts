// Configuration changes applied while traffic flows (file source): every tetherd watches the shared
// config file, which is replaced atomically as a config-management tool would. 200 connections run through
// the Egress while (a) an unrelated pool and a second Egress are added, (b) the Egress's failover timers
// change, (d) the file is replaced by a broken one (and then repaired): every connection survives, no
// failover happens, and each change is visible in status and logs. (c) a client pod's label removed and
// restored through a Pod object: its new connections stop leaving from the floating address, and leave
// from it again once the label returns.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import * as fs from 'node:fs';
import { withTestbed, type Testbed } from './testbed';
import { runTraffic, topology, waitOwner, waitStandbyReady } from './egress-scenario';
import { CLIENT_SCRIPT } from './probe';

const CONNS = Number(process.env.EGRESS_TEST_CONNS ?? 200);
const V = 'tether.dev/v1alpha1';

type Status = {
  pools: string[];
  egress: Array<{ egress: string; address: string; owner: string; epoch: number; ownedHere: boolean }>;
  bfd?: { sessions: Array<{ peer: string; state: string; downs: number }> };
};
const status = async (tb: Testbed, node: string) => (await tb.status(node)) as unknown as Status;

async function until<T>(what: string, fn: () => Promise<T | undefined | false>, timeoutMs = 10_000): Promise<T> {
  const end = Date.now() + timeoutMs;
  for (;;) {
    const v = await fn().catch(() => undefined);
    if (v) return v;
    if (Date.now() > end) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

const baseObjects = () => topology().extraObjects!.map((o) => structuredClone(o));

function logCount(tb: Testbed, node: string, msg: string): number {
  return fs.readFileSync(tb.tetherdLog(node), 'utf8').split('\n').filter((l) => l.includes(`"message":"${msg}"`)).length;
}

test('live changes under traffic: a pool and an Egress added, failover timers changed, a broken file refused', async () => {
  await withTestbed(topology(), async (tb) => {
    const first = await waitOwner(tb);
    const standby = first.node === 'n1' ? 'n2' : 'n1';
    await waitStandbyReady(tb, first.node, standby);
    const downsBefore = (await status(tb, first.node)).bfd?.sessions.reduce((n, s) => n + s.downs, 0) ?? 0;
    const objects = baseObjects();
    const steps: string[] = [];
    const { report, peers } = await runTraffic(tb, CONNS, 14_000, async () => {
      // (a) an unrelated floating pool and a second Egress over it (other clients, same gateways).
      objects.push(
        { apiVersion: V, kind: 'AddressPool', metadata: { name: 'float2' }, spec: { usage: 'floating', ipv4: { cidr: '198.18.0.240/29' } } },
        {
          apiVersion: V, kind: 'Egress', metadata: { name: 'batch', namespace: 'shop' },
          spec: {
            clients: { podSelector: { matchLabels: { app: 'batch' } } }, gateways: { podSelector: { matchLabels: { role: 'egress-gw' } } },
            destinations: ['198.19.0.0/16'], addresses: { pool: 'float2', count: 1 },
          },
        },
      );
      tb.rewriteConfig({ extraObjects: objects });
      const second = await until('the second Egress owned', async () => {
        for (const n of ['n1', 'n2']) {
          const e = (await status(tb, n)).egress.find((x) => x.egress === 'shop/batch' && x.ownedHere);
          if (e) return e;
        }
        return undefined;
      });
      assert.ok((await status(tb, 'n3')).pools.includes('float2'), 'the new pool is served');
      steps.push(`(a) second Egress on ${second.address} owned by ${second.owner}`);
      await new Promise((r) => setTimeout(r, 1500));
      // (b) failover timers: 50 ms × 3 → 100 ms × 5, through a BFD Poll Sequence (no session restart). A node
      // pair's session runs at the fastest timers of the Egresses both serve: both Egresses change.
      for (const o of objects.filter((x) => x.kind === 'Egress')) (o as { spec: Record<string, unknown> }).spec.failover = { intervalMs: 100, detectMultiplier: 5 };
      tb.rewriteConfig({ extraObjects: objects });
      await until('the timers changed on both gateway nodes', async () => logCount(tb, 'n1', 'egress: BFD timers changed') > 0 && logCount(tb, 'n2', 'egress: BFD timers changed') > 0);
      steps.push('(b) BFD timers changed on n1 and n2');
      await new Promise((r) => setTimeout(r, 1500));
      // (d) a broken file: refused whole; then the good one again.
      tb.rewriteConfig({ raw: 'apiVersion: v1\nkind: List\nitems:\n  - { kind: AddressPool, metadata: { name: [broken\n' });
      await until('the broken file refused on every node', async () => ['n1', 'n2', 'n3'].every((n) => logCount(tb, n, 'config: change rejected; the running configuration stays') > 0));
      steps.push('(d) broken file refused on n1, n2, n3');
      await new Promise((r) => setTimeout(r, 1500));
      tb.rewriteConfig({ extraObjects: objects });
    });
    process.stdout.write(`  live changes: ${steps.join('; ')}; longest gap ${report.maxGapAfterMarkMs} ms, ${report.intact}/${CONNS} intact\n`);
    assert.is(report.intact, CONNS, `${report.intact}/${CONNS} intact; ${report.errors.slice(0, 4).join('; ')}`);
    assert.equal(report.errors, []);
    assert.ok(peers.filter((p) => !p.startsWith('udp')).every((p) => p.startsWith(`${first.st.address}:`)), 'the server saw only the floating address');
    const after = (await status(tb, first.node)).egress.find((x) => x.egress === 'shop/out');
    assert.is(after?.owner, first.st.owner, 'no failover happened');
    assert.is(after?.epoch, first.st.epoch, 'no new epoch');
    const downsAfter = (await status(tb, first.node)).bfd?.sessions.reduce((n, s) => n + s.downs, 0) ?? 0;
    assert.is(downsAfter, downsBefore, 'no BFD session went down');
    assert.ok(report.maxGapAfterMarkMs !== undefined && report.maxGapAfterMarkMs < 1000, `longest gap ${report.maxGapAfterMarkMs} ms`);
  });
});

/** The source address the server sees for one new connection from `pod` (or the error). */
async function sourceSeen(tb: Testbed, pod: string): Promise<string> {
  const r = await tb.exec(pod, [process.execPath, '-e', CLIENT_SCRIPT, tb.externalIp('server'), '9100', '2000']);
  return r.code === 0 ? r.stdout.trim() : `error ${r.stderr.trim()}`;
}

test("a client pod's label removed and restored (Pod object): its flows leave the Egress and come back, without re-attaching", async () => {
  await withTestbed(topology(), async (tb) => {
    const first = await waitOwner(tb);
    const server = tb.spawn('server', [process.execPath, '-e', "require('net').createServer((s) => { s.on('error', () => {}); s.end(s.remoteAddress + '\\n'); }).listen(9100, '0.0.0.0', () => console.log('ready'))"]);
    try {
      await until('the probe server', async () => (await sourceSeen(tb, 'n3-web')) === first.st.address);
      const objects = baseObjects();
      const pod = (labels: Record<string, string>) => ({ apiVersion: 'v1', kind: 'Pod', metadata: { name: 'web', namespace: 'shop', labels } });
      tb.rewriteConfig({ extraObjects: [...objects, pod({ app: 'other' })] });
      const without = await until('web no longer steered', async () => {
        const s = await sourceSeen(tb, 'n3-web');
        return s !== first.st.address && s;
      });
      assert.is.not(without, first.st.address);
      tb.rewriteConfig({ extraObjects: [...objects, pod({ app: 'web' })] });
      await until('web steered again', async () => (await sourceSeen(tb, 'n3-web')) === first.st.address);
      process.stdout.write(`  label removed: a new connection was seen as ${without}; restored: ${first.st.address}\n`);
      assert.ok(logCount(tb, 'n3', 'egress: client pod no longer steered') >= 1);
      assert.ok(logCount(tb, 'n3', 'egress: client pod steered') >= 2, 'steered at attach and again after the label returned');
    } finally {
      server.kill('SIGTERM');
    }
  });
});

test.run();
