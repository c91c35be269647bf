// The stateful load balancer on the testbed, with real BIRD, Redis and traffic: LB pods on n1 and n2 (n3's
// added live), targets t1..t3 on n4 and n5. Every connection survives LB pods and nodes coming and going,
// targets scaled out, a tetherd restart and Redis restarted empty; removing a target breaks only its own.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { withTestbed, type Testbed } from './testbed';
import {
  LB_NODES, PORT, configure, lbPodSpec, lbStatus, routerPaths, service, startBgp, startTargets, targetSpec, topology, traffic, until,
} from './lb-scenario';

const CONNS = Number(process.env.LB_TEST_CONNS ?? 200);
const only = process.env.LB_ONLY;
const scenario = (name: string, fn: () => Promise<void>) => (only && !name.includes(only) ? test.skip(name, fn) : test(name, fn));

async function announcedOn(tb: Testbed, nodes: string[]): Promise<string> {
  return until(`VIP announced by exactly ${nodes.join(', ')}`, async () => {
    const st = await lbStatus(tb, nodes[0]);
    if (!st?.vip) return undefined;
    const paths = await routerPaths(tb, st.vip);
    const want = nodes.map((n) => tb.node(n).fabricIp).sort();
    return paths.join() === want.join() ? st.vip : undefined;
  }, 30_000);
}

const SOURCE_CLIENT = `
const net = require('net');
const [host, port] = process.argv.slice(1);
const s = net.connect({ host, port: Number(port) });
let got = '';
s.on('connect', () => s.write('0 0\\n'));
s.on('data', (b) => { got += b; if (got.includes('\\n')) { console.log(JSON.stringify({ local: s.localAddress, echo: got.trim() })); s.destroy(); process.exit(0); } });
s.on('error', (e) => { console.log(JSON.stringify({ error: e.code })); process.exit(1); });
setTimeout(() => { console.log(JSON.stringify({ error: 'timeout' })); process.exit(1); }, 5000);`;

scenario('through the VIP: targets see the client, replies bypass the LB pods, and every connection survives LB pods and nodes coming and going, scale-out, a tetherd restart and Redis restarted empty', async () => {
  await withTestbed(topology(), async (tb) => {
    const bgp = await startBgp(tb);
    try {
      configure(tb, ['n4-t1', 'n4-t2', 'n5-t3']);
      const vip = await announcedOn(tb, ['n1', 'n2']);
      const servers = await startTargets(tb, ['n4-t1', 'n4-t2', 'n5-t3'], vip);
      let peers = new Map<string, string[]>();
      try {
        const probe = await tb.exec('client', [process.execPath, '-e', SOURCE_CLIENT, vip, String(PORT)]);
        const p = JSON.parse(probe.stdout.trim().split('\n').pop()!);
        assert.is(p.echo, '0 0', `echo through the VIP: ${probe.stdout}`);
        const report = await traffic(tb, vip, CONNS, 40_000, async () => {
          process.stdout.write('  LB pod added on n3\n');
          await tb.addPod('n3', lbPodSpec);
          await announcedOn(tb, ['n1', 'n2', 'n3']);
          await new Promise((r) => setTimeout(r, 2000));
          process.stdout.write('  LB pod on n1 removed gracefully\n');
          await tb.delPod('n1-lb');
          await announcedOn(tb, ['n2', 'n3']);
          await new Promise((r) => setTimeout(r, 2000));
          process.stdout.write('  target t4 added (scale-out)\n');
          await tb.addPod('n5', targetSpec('t4'));
          configure(tb, ['n4-t1', 'n4-t2', 'n5-t3', 'n5-t4']);
          await until('t4 ready as a target', async () => (await lbStatus(tb, 'n5'))?.localTargets.includes('shop/t4'));
          await servers.add('n5-t4');
          await new Promise((r) => setTimeout(r, 2000));
          process.stdout.write('  tetherd restarted on n3\n');
          await tb.restartTetherd('n3');
          await new Promise((r) => setTimeout(r, 2000));
          process.stdout.write('  Redis restarted empty\n');
          await tb.restartRedis();
          await new Promise((r) => setTimeout(r, 3000));
          process.stdout.write('  LB node n2 killed\n');
          await tb.killTetherd('n2', 'SIGKILL');
          await tb.mustExec('n2', ['ip', 'link', 'set', 'eth0', 'down']);
          await announcedOn(tb, ['n3']);
        });
        peers = await servers.stop();
        const served = [...peers].map(([k, v]) => `${k} ${v.length}`).join(', ');
        process.stdout.write(`  ${report.intact}/${CONNS} intact, longest gap ${report.maxGapAfterMarkMs} ms; UDP ${report.udp?.received}/${report.udp?.sent}; connections per target: ${served}\n`);
        const clientIp = tb.externalIp('client');
        for (const [pod, list] of peers) for (const peer of list) assert.ok(peer.startsWith(`${clientIp}:`), `${pod} saw ${peer}, not the client's address`);
        assert.is(report.intact, CONNS, `${report.intact}/${CONNS} intact; ${report.errors.slice(0, 4).join('; ')}`);
        assert.ok((report.udp?.received ?? 0) >= (report.udp?.sent ?? 1) * 0.9, `UDP ${report.udp?.received}/${report.udp?.sent}`);
        const st = await lbStatus(tb, 'n3');
        process.stdout.write(`  n3 LB counters: ${JSON.stringify(st?.counters)}\n`);
      } finally {
        await servers.stop().catch(() => undefined);
      }
    } finally {
      await bgp.stop();
    }
  });
});

test.run();
void LB_NODES;
void service;
