// The stateful load balancer on the testbed, with real BIRD, Redis and traffic: LB pods on n1 and n2 (n3's
// added live), targets t1..t3 on n4 and n5. Every connection survives LB pods and nodes coming and going,
// targets scaled out, a tetherd restart and Redis restarted empty; removing a target breaks only its own.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import Redis from 'ioredis';
import { withTestbed, type Testbed } from './testbed';
import type { PodSpec } from './topology';
import {
  announcedOn, baselineAnnounce, baselineWithdraw, PORT, configure, lbPodSpec, pool, slice, lbStatus, routerPaths, service, startBgp, startTargets, targetSpec, topology, traffic, until,
} from './lb-scenario';

const CONNS = Number(process.env.LB_TEST_CONNS ?? 200);
const only = process.env.LB_ONLY;
const scenario = (name: string, fn: () => Promise<void>) => (only && !name.includes(only) ? test.skip(name, fn) : test(name, fn));

async function announcedOnVip(tb: Testbed, vip: string, nodes: string[]): Promise<void> {
  const want = nodes.map((n) => tb.node(n).fabricIp).sort().join();
  await until(`${vip} routed over exactly ${nodes.join(', ')}`, async () => (await routerPaths(tb, vip)).join() === want, 30_000);
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
        // The UDP stream keeps flowing: it loses at most what was in flight to the killed node until BGP's
        // 3 s hold time withdrew it (~70 datagrams at 50 ms when the stream hashed to that node).
        assert.ok((report.udp?.maxGapMs ?? 1e9) < 5000, `the UDP stream resumed (longest gap ${report.udp?.maxGapMs} ms)`);
        assert.ok((report.udp?.received ?? 0) >= (report.udp?.sent ?? 1) * 0.85, `UDP ${report.udp?.received}/${report.udp?.sent}`);
        const st = await lbStatus(tb, 'n3');
        process.stdout.write(`  n3 LB counters: ${JSON.stringify(st?.counters)}\n`);
      } finally {
        await servers.stop().catch(() => undefined);
      }

      // Removing a target breaks only the connections it held, and they fail at once (reset), not hang.
      const again = await startTargets(tb, ['n4-t1', 'n4-t2', 'n5-t3', 'n5-t4'], vip);
      let onT1 = 0;
      const report = await traffic(tb, vip, CONNS, 12_000, async () => {
        configure(tb, ['n4-t2', 'n5-t3', 'n5-t4']);
        await until('t1 no longer a target', async () => !(await lbStatus(tb, 'n4'))?.localTargets.includes('shop/t1'));
      });
      const served = await again.stop();
      onT1 = served.get('n4-t1')?.filter((p) => !p.startsWith('udp')).length ?? 0;
      process.stdout.write(`  target t1 removed: it held ${onT1} connections; ${report.intact}/${CONNS} intact; errors: ${report.errors.slice(0, 2).join('; ')}\n`);
      assert.ok(onT1 > 0, 't1 held some connections');
      assert.is(report.intact, CONNS - onT1, 'exactly the connections on the removed target broke');
      assert.not.ok(report.errors.some((e) => e.startsWith('watchdog')), 'the broken ones failed, none hung');
    } finally {
      await bgp.stop();
    }
  });
});


/** Mappings the store holds for vip (every bucket). */
async function storedMappings(tb: Testbed, vip: string): Promise<number> {
  const raw = new Redis(tb.redis.socketPath);
  try {
    let n = 0;
    for (const k of await raw.keys(`*lb:{${vip}#*}:map`)) n += await raw.hlen(k);
    return n;
  } finally {
    raw.disconnect();
  }
}

/** Waits until the given LB nodes forward by one table version above `above`, none pending; returns it. */
async function switched(tb: Testbed, nodes: string[], above: number): Promise<number> {
  return until(`${nodes.join(', ')} on one table version above ${above}`, async () => {
    const t = await Promise.all(nodes.map(async (n) => (await lbStatus(tb, n))?.table));
    const v = t[0]?.version;
    return v !== undefined && v > above && t.every((x) => x?.version === v && !x.pending) ? v : undefined;
  }, 40_000);
}

scenario('record on change under live traffic: a target added while an LB node is killed, then two added in quick succession while new connections start; an LB node withdrawn after: every connection survives, and the store holds only moved flows', async () => {
  const topo = topology();
  const more: Record<string, Array<string | PodSpec>> = { n3: [lbPodSpec], n4: [targetSpec('t5')], n5: [targetSpec('t4'), targetSpec('t6')] };
  const nodes = topo.nodes.map((n) => (more[n.name] ? { ...n, pods: [...((n.pods as Array<string | PodSpec>) ?? []), ...more[n.name]] } : n));
  await withTestbed({ ...topo, nodes }, async (tb) => {
    const bgp = await startBgp(tb);
    const all = ['n4-t1', 'n4-t2', 'n5-t3', 'n5-t4', 'n4-t5', 'n5-t6'];
    try {
      configure(tb, ['n4-t1', 'n4-t2', 'n5-t3']);
      const vip = await announcedOn(tb, ['n1', 'n2', 'n3']);
      const servers = await startTargets(tb, ['n4-t1', 'n4-t2', 'n5-t3'], vip);
      const v0 = await switched(tb, ['n1', 'n2', 'n3'], 0);
      let late: Awaited<ReturnType<typeof traffic>> | undefined;
      let stored = -1;
      try {
        const report = await traffic(tb, vip, CONNS, 120_000, async () => {
          process.stdout.write('  LB node n2 killed and target t4 added at once\n');
          await tb.killTetherd('n2', 'SIGKILL');
          await tb.mustExec('n2', ['ip', 'link', 'set', 'eth0', 'down']);
          configure(tb, ['n4-t1', 'n4-t2', 'n5-t3', 'n5-t4']);
          // The change waits for n2's membership to lapse: 100 connections start meanwhile.
          late = await traffic(tb, vip, 100, 90_000, async () => {
            const during = (await lbStatus(tb, 'n1'))?.table;
            process.stdout.write(`  100 connections started while the change waits: ${JSON.stringify(during?.pending)}\n`);
            await until('t4 ready as a target', async () => (await lbStatus(tb, 'n5'))?.localTargets.includes('shop/t4'));
            await servers.add('n5-t4');
            await announcedOn(tb, ['n1', 'n3']);
            const v1 = await switched(tb, ['n1', 'n3'], v0);
            stored = await storedMappings(tb, vip);
            process.stdout.write(`  version ${v0} → ${v1} on n1 and n3 once n2 lapsed; ${stored} mappings in the store; targets t5 and t6 added in quick succession\n`);
            configure(tb, ['n4-t1', 'n4-t2', 'n5-t3', 'n5-t4', 'n4-t5']);
            configure(tb, all);
            await until('t5 and t6 ready as targets', async () => (await lbStatus(tb, 'n4'))?.localTargets.includes('shop/t5') && (await lbStatus(tb, 'n5'))?.localTargets.includes('shop/t6'));
            await servers.add('n4-t5');
            await servers.add('n5-t6');
            const v2 = await switched(tb, ['n1', 'n3'], v1);
            process.stdout.write(`  version ${v2} on n1 and n3; LB pod on n1 removed: its flows move to n3\n`);
            await tb.delPod('n1-lb');
            await announcedOn(tb, ['n3']);
            await new Promise((r) => setTimeout(r, 3000));
          }, false, { endWhenDone: true });
        }, true, { endWhenDone: true });
        const peers = await servers.stop();
        process.stdout.write(`  ${report.intact}/${CONNS} intact (longest gap ${report.maxGapAfterMarkMs} ms), ${late?.intact}/100 started during the switch intact; ${stored} mappings stored after the first change; per target: ${[...peers].map(([k, v]) => `${k} ${v.length}`).join(', ')}\n`);
        assert.is(report.intact, CONNS, `${report.intact}/${CONNS} intact; ${report.errors.slice(0, 4).join('; ')}`);
        assert.is(late?.intact, 100, `connections started during the switch: ${late?.intact}/100; ${late?.errors.slice(0, 4).join('; ')}`);
        assert.ok(stored >= 0 && stored < CONNS, `the store holds the moved flows only (${stored} for ${CONNS} connections)`);
      } finally {
        await servers.stop().catch(() => undefined);
      }
    } finally {
      await bgp.stop();
    }
  });
});

const BIG_CLIENT = `
const net = require('net'), crypto = require('crypto'), dgram = require('dgram');
const [host, port, mb, dgrams] = process.argv.slice(1);
const payload = crypto.randomBytes(Number(mb) * 1024 * 1024);
const want = crypto.createHash('sha256').update(payload).digest('hex');
const h = crypto.createHash('sha256'); let got = 0;
const s = net.connect({ host, port: Number(port) });
const t = setTimeout(() => { console.log(JSON.stringify({ error: 'timeout', got })); setTimeout(() => process.exit(1), 3000); }, 60000);
s.on('connect', () => s.write(payload));
s.on('data', (b) => { h.update(b); got += b.length; if (got >= payload.length) { s.destroy(); udp(); } });
s.on('error', (e) => { console.log(JSON.stringify({ error: e.code, got })); process.exit(1); });
function udp() {
  const u = dgram.createSocket('udp4'); let back = 0, sent = 0;
  u.on('message', (m) => { if (m.length === 1400) back++; });
  const iv = setInterval(() => { if (sent === Number(dgrams)) { clearInterval(iv); setTimeout(() => { clearTimeout(t); console.log(JSON.stringify({ same: h.digest('hex') === want, bytes: got, udpSent: sent, udpBack: back })); process.exit(0); }, 1000); return; } u.send(crypto.randomBytes(1400), Number(port), host); sent++; }, 5);
}`;

// A FoU packet to a target from an address that is no registered node: an inner SYN to the VIP.
const FORGE = `
const dgram = require('dgram');
const [target, fouPort, vip, src] = process.argv.slice(1);
const ip = (a) => Buffer.from(a.split('.').map(Number));
const inner = Buffer.alloc(40);
inner[0] = 0x45; inner.writeUInt16BE(40, 2); inner[8] = 64; inner[9] = 6; ip(src).copy(inner, 12); ip(vip).copy(inner, 16);
inner.writeUInt16BE(4242, 20); inner.writeUInt16BE(9000, 22); inner[32] = 0x50; inner[33] = 0x02;
const u = dgram.createSocket('udp4');
let n = 0; const iv = setInterval(() => { u.send(inner, Number(fouPort), target); if (++n === 20) { clearInterval(iv); setTimeout(() => process.exit(0), 200); } }, 10);`;

scenario('bad input programs nothing and disturbs nothing; forged FoU is dropped and counted; large transfers, 1400-byte datagrams and a path MTU drop pass', async () => {
  await withTestbed(topology(), async (tb) => {
    const bgp = await startBgp(tb);
    try {
      configure(tb, ['n4-t1', 'n4-t2', 'n5-t3']);
      const vip = await announcedOn(tb, ['n1', 'n2']);
      const servers = await startTargets(tb, ['n4-t1', 'n4-t2', 'n5-t3'], vip);
      try {
        // Bad input beside the working Service.
        const bad = (name: string, annotations: Record<string, string>, spec: Record<string, unknown> = {}) => ({ ...service(annotations, spec), metadata: { name, namespace: 'shop', annotations } });
        tb.rewriteConfig({ extraObjects: [
          pool, service(), slice(tb, ['n4-t1', 'n4-t2', 'n5-t3']),
          bad('outside', { 'lb.tether.dev/vip': '192.0.2.77' }),
          bad('taken', { 'lb.tether.dev/vip': vip }),
          bad('clash', {}, { ports: [{ port: 80, protocol: 'TCP' }, { port: 80, protocol: 'TCP' }] }),
          bad('empty', {}),
        ] });
        const all = async () => ((await tb.status('n1')) as unknown as { loadBalancers: Array<Record<string, unknown>> }).loadBalancers;
        const lbs = await until('bad Services reported', async () => {
          const l = await all();
          const taken = l.find((x) => x.service === 'shop/taken');
          const empty = l.find((x) => x.service === 'shop/empty');
          return taken?.problem && empty?.vip ? l : undefined;
        });
        const by = (k: string) => lbs.find((x) => x.service === `shop/${k}`)!;
        process.stdout.write(`  outside: ${JSON.stringify(by('outside').refused)}\n  taken: ${by('taken').problem}\n  clash: ${JSON.stringify(by('clash').refused)}\n  empty: ${by('empty').problem}\n`);
        assert.match(String(by('outside').refused), /192\.0\.2\.77 is outside every loadBalancer pool/);
        assert.match(String(by('taken').problem), /held by lb\/shop\/db/);
        assert.match(String(by('clash').refused), /TCP port 80 clashes with spec\.ports\[0\]/);
        assert.match(String(by('empty').problem), /no targets/);
        assert.is(by('empty').announced, false);
        assert.equal(await routerPaths(tb, String(by('empty').vip)), [], 'a Service without targets is not announced');
        assert.is(by('db').announced, true, 'the good Service is undisturbed');

        // Large transfer through the LB (uploads pass it; the echo comes back direct) and 1400-byte datagrams.
        for (let i = 0; i < Number(process.env.LB_BIG_REPEAT ?? 1); i++) {
          const t0 = Date.now();
          const big = await tb.exec('client', [process.execPath, '-e', BIG_CLIENT, vip, String(PORT), '16', '300'], { timeoutMs: 90_000 });
          const r = JSON.parse(big.stdout.trim().split('\n').pop()!);
          process.stdout.write(`  16 MB echoed through the VIP in ${Date.now() - t0} ms: ${JSON.stringify(r)}\n`);
          if (!r.same) process.stdout.write((await tb.exec('client', ['ss', '-tin'])).stdout.slice(0, 3000));
          assert.ok(r.same, `16 MB came back intact: ${big.stdout}`);
          assert.ok(r.udpBack >= r.udpSent * 0.99, `1400-byte datagrams: ${r.udpBack}/${r.udpSent}`);
        }

        // A path MTU drop behind the targets (towards the client): the router's "fragmentation needed" goes
        // to the VIP, i.e. to an LB pod, which forwards it to the target holding the flow.
        const rport = tb.plan.externals.find((x) => x.name === 'client')!.routerPort;
        await tb.mustExec('router', ['ip', 'link', 'set', rport, 'mtu', '1200']);
        const before = (await Promise.all(['n1', 'n2'].map((n) => lbStatus(tb, n)))).reduce((a, st) => a + (st?.counters?.icmpForwarded ?? 0), 0);
        const pm = await tb.exec('client', [process.execPath, '-e', BIG_CLIENT, vip, String(PORT), '4', '0'], { timeoutMs: 90_000 });
        await tb.mustExec('router', ['ip', 'link', 'set', rport, 'mtu', '1500']);
        const after = (await Promise.all(['n1', 'n2'].map((n) => lbStatus(tb, n)))).reduce((a, st) => a + (st?.counters?.icmpForwarded ?? 0), 0);
        const pr = JSON.parse(pm.stdout.trim().split('\n').pop()!);
        process.stdout.write(`  path MTU 1200 behind the targets: ${JSON.stringify(pr)}, ICMP errors forwarded to targets: ${after - before}\n`);
        assert.ok(pr.same, 'the transfer completed through the smaller MTU');
        assert.ok(after > before, 'the ICMP error reached the target through an LB pod');

        // Forged FoU from the external client (not a registered node) to a target: dropped, counted.
        const target = tb.podIp('n4-t1');
        const fou0 = (await lbStatus(tb, 'n4'))!;
        const rej0 = Object.values((fou0 as unknown as { targetFou: Record<string, { rejectedSource: number }> }).targetFou).reduce((a, x) => a + (x?.rejectedSource ?? 0), 0);
        await tb.mustExec('client', [process.execPath, '-e', FORGE, target, '5555', vip, '203.0.113.66']);
        const fou1 = (await lbStatus(tb, 'n4'))!;
        const rej1 = Object.values((fou1 as unknown as { targetFou: Record<string, { rejectedSource: number }> }).targetFou).reduce((a, x) => a + (x?.rejectedSource ?? 0), 0);
        process.stdout.write(`  forged FoU from the client: ${rej1 - rej0} of 20 dropped as unregistered\n`);
        assert.is(rej1 - rej0, 20);
      } finally {
        await servers.stop().catch(() => undefined);
      }
    } finally {
      await bgp.stop();
    }
  });
});

scenario('baseline in the same run: the same LB changes through a stateless ECMP + kube-proxy DNAT path (what MetalLB gives) lose connections', async () => {
  await withTestbed(topology(), async (tb) => {
    const bgp = await startBgp(tb);
    try {
      const vip = '198.51.100.200';
      const targets = ['n4-t1', 'n4-t2', 'n5-t3'];
      for (const n of ['n1', 'n2']) await baselineAnnounce(tb, n, vip, targets);
      await announcedOnVip(tb, vip, ['n1', 'n2']);
      const servers = await startTargets(tb, targets, '0.0.0.0');
      try {
        const report = await traffic(tb, vip, CONNS, 25_000, async () => {
          await baselineAnnounce(tb, 'n3', vip, targets);
          await announcedOnVip(tb, vip, ['n1', 'n2', 'n3']);
          await new Promise((r) => setTimeout(r, 2000));
          await baselineWithdraw(tb, 'n1', vip);
          await announcedOnVip(tb, vip, ['n2', 'n3']);
          await new Promise((r) => setTimeout(r, 2000));
          await tb.mustExec('n2', ['ip', 'link', 'set', 'eth0', 'down']);
          await announcedOnVip(tb, vip, ['n3']);
        }, false);
        process.stdout.write(`  stateless baseline: ${report.intact}/${CONNS} intact, ${CONNS - report.intact} lost (LB node added, one withdrawn, one lost); ${report.echoes} echoes; first errors: ${report.errors.slice(0, 3).join("; ")}\n`);
        assert.ok(report.intact < CONNS, 'the stateless path loses connections when ECMP moves them');
      } finally {
        await servers.stop().catch(() => undefined);
      }
    } finally {
      await bgp.stop();
    }
  });
});

scenario('in a cluster (fake API server): the Service and its EndpointSlice come from the API; the VIP is written to status.loadBalancer.ingress with ipMode Proxy; traffic flows', async () => {
  await withTestbed({ ...topology(), configSource: 'kubernetes' }, async (tb) => {
    const bgp = await startBgp(tb);
    try {
      tb.api.apply(structuredClone(service()));
      tb.api.apply(structuredClone(slice(tb, ['n4-t1', 'n4-t2', 'n5-t3'])));
      const vip = await announcedOn(tb, ['n1', 'n2']);
      const st = await until('Service status written by tether-operator', async () => {
        const s = tb.api.get('Service', 'db', 'shop') as { status?: { loadBalancer?: { ingress?: Array<{ ip: string; ipMode: string }> }; conditions?: Array<{ type: string; status: string }> } } | undefined;
        return s?.status?.loadBalancer?.ingress?.length ? s.status : undefined;
      });
      process.stdout.write(`  Service status: ${JSON.stringify(st.loadBalancer)} ${JSON.stringify(st.conditions?.map((c) => `${c.type}=${c.status}`))}\n`);
      assert.equal(st.loadBalancer?.ingress, [{ ip: vip, ipMode: 'Proxy' }]);
      assert.ok(st.conditions?.some((c) => c.type === 'tether.dev/Ready' && c.status === 'True'));
      const servers = await startTargets(tb, ['n4-t1', 'n4-t2', 'n5-t3'], vip);
      try {
        const probe = await tb.exec('client', [process.execPath, '-e', SOURCE_CLIENT, vip, String(PORT)]);
        assert.match(probe.stdout, /"echo":"0 0"/);
      } finally {
        await servers.stop();
      }
      // Another class's Service is left alone: no VIP, no status from tether.
      tb.api.apply({ ...structuredClone(service()), metadata: { name: 'other', namespace: 'shop' }, spec: { ...(service().spec as object), loadBalancerClass: 'example.com/lb' } });
      await new Promise((r) => setTimeout(r, 3000));
      const other = tb.api.get('Service', 'other', 'shop') as { status?: unknown };
      assert.equal(other.status ?? {}, {}, 'a Service of another class gets no status from tether');
    } finally {
      await bgp.stop();
    }
  });
});

test.run();
