// The stateful load balancer on a Redis Cluster (3 primaries + 3 replicas on the router, Debian's
// redis-server --cluster-enabled; tetherds use redis+cluster://): lb.test.ts's main scenario (LB pods on
// n1 and n2, long-lived connections through the VIP, an LB pod added on n3 and n1's removed) with the
// primary serving the VIP's notice channel SIGKILLed mid-traffic. Asserted: every long-lived connection
// survives, new connections through the VIP keep working through and after the failover, and the mappings
// recorded during the failover reach the other LB nodes: a target-set change made while the primary is down
// (t3 turns terminating) is made once the store answers, with its records stored, and every connection, those
// opened during the failover too, survives ECMP moving it to n2 and n3.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import type { ChildProcess } from 'node:child_process';
import { withTestbed, type Testbed } from './testbed';
import { announcedOn, PORT, configure, lbPodSpec, lbStatus, startBgp, startTargets, topology, traffic, until } from './lb-scenario';
import { LB_STORE_BUCKETS } from '../../daemon/lb/mapping-fields';

const CONNS = Number(process.env.LB_TEST_CONNS ?? 200);
/** Long-lived connections opened while the primary is down (their mappings are recorded during the failover). */
const LATE = Number(process.env.LB_CLUSTER_LATE ?? 100);
const TARGETS = ['n4-t1', 'n4-t2', 'n5-t3'];
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

// New connections through the VIP, one every 100 ms (each: connect, one echo, close; 3 s at most), until
// SIGTERM; then one JSON line: how many, the failures (with when), and the longest time between two
// successful ones.
const PROBER = `
const net = require('net');
const [host, port] = process.argv.slice(1);
const res = []; let seq = 0;
const one = () => { const t0 = Date.now(), i = seq++; let done = false;
  const s = net.connect({ host, port: Number(port) });
  const end = (ok, why) => { if (done) return; done = true; clearTimeout(t); s.destroy(); res.push({ i, t0, t1: Date.now(), ok, why }); };
  const t = setTimeout(() => end(false, 'timeout'), 3000);
  s.on('connect', () => s.write('p ' + i + '\\n'));
  s.on('data', (b) => { if (String(b).includes('\\n')) end(true); });
  s.on('error', (e) => end(false, e.code));
};
const iv = setInterval(one, 100);
process.stdout.write('ready\\n');
process.on('SIGTERM', () => { clearInterval(iv); setTimeout(() => {
  const ok = res.filter((r) => r.ok).sort((a, b) => a.t1 - b.t1);
  let gap = 0; for (let k = 1; k < ok.length; k++) gap = Math.max(gap, ok[k].t1 - ok[k - 1].t1);
  process.stdout.write(JSON.stringify({ tried: res.length, ok: ok.length, failed: res.filter((r) => !r.ok).map((r) => ({ at: r.t0, why: r.why })), maxGapMs: gap }) + '\\n');
  process.exit(0);
}, 3200); });`;

interface ProbeReport {
  tried: number;
  ok: number;
  failed: Array<{ at: number; why: string }>;
  maxGapMs: number;
}

function startProber(tb: Testbed, vip: string): { child: ChildProcess; ready: Promise<void>; stop: () => Promise<ProbeReport> } {
  const child = tb.spawn('client', [process.execPath, '-e', PROBER, vip, String(PORT)]);
  let out = '';
  child.stdout?.on('data', (b: Buffer) => (out += b.toString()));
  const exited = new Promise<void>((r) => child.on('exit', () => r()));
  return {
    child,
    ready: until('prober ready', async () => out.includes('ready'), 10_000).then(() => undefined),
    async stop() {
      child.kill('SIGTERM');
      await exited;
      const line = out.split('\n').find((l) => l.startsWith('{'));
      if (!line) throw new Error(`prober printed no report: ${out.slice(0, 300)}`);
      return JSON.parse(line) as ProbeReport;
    },
  };
}

/** A node's mapping store state for the VIP (status): whether it hears the VIP's notices, expires it. */
const storeState = (s: unknown) => (s as { mappingStore?: { subscribed: boolean; expirer: boolean } } | undefined)?.mappingStore;

/** The VIP's keys in the Cluster: which primary (port) serves its notice channel and each mapping bucket. */
async function vipPlacement(tb: Testbed, vip: string): Promise<{ notice: number; buckets: Map<number, number[]> }> {
  const c = tb.redisCluster;
  const notice = await c.primaryOf(await c.slotOf(`${tb.redisPrefix}lb:{${vip}}:notices`));
  const buckets = new Map<number, number[]>();
  for (let b = 0; b < LB_STORE_BUCKETS; b++) {
    const port = await c.primaryOf(await c.slotOf(`${tb.redisPrefix}lb:{${vip}#${b}}:map`));
    buckets.set(port, [...(buckets.get(port) ?? []), b]);
  }
  return { notice, buckets };
}

/** How many mappings of vip the store holds (HLEN of every bucket, through any live node: -c follows MOVED). */
async function storedMappings(tb: Testbed, vip: string): Promise<number> {
  const c = tb.redisCluster;
  const live = (await c.nodes()).find((n) => n.role === 'master' && !n.failed)!.port;
  let n = 0;
  for (let b = 0; b < LB_STORE_BUCKETS; b++) n += Number(await c.cli(live, '-c', 'hlen', `${tb.redisPrefix}lb:{${vip}#${b}}:map`));
  return n;
}

test('on a Redis Cluster: the primary serving the VIP is SIGKILLed mid-traffic; every connection survives LB pods coming and going, new connections keep working, and mappings recorded during the failover reach the other LB nodes', async () => {
  await withTestbed({ ...topology(), redis: 'cluster' }, async (tb) => {
    const bgp = await startBgp(tb);
    try {
      configure(tb, TARGETS);
      const vip = await announcedOn(tb, ['n1', 'n2']);
      const servers = await startTargets(tb, TARGETS, vip);
      const cluster = tb.redisCluster;
      try {
        const place = await vipPlacement(tb, vip);
        const victim = place.notice;
        const spread = [...place.buckets].map(([p, bs]) => `${p}: ${bs.length} bucket(s)`).join(', ');
        process.stdout.write(`  VIP ${vip}: notice channel and expirer lease on primary ${victim} (${place.buckets.get(victim)?.length ?? 0}/${LB_STORE_BUCKETS} buckets there); buckets per primary: ${spread}\n`);

        let failover: { port: number; ms: number } | undefined;
        let probes: ProbeReport | undefined;
        let killedAt = 0;
        let reached: { n1: number; n2: number; store: number; ms: number } | undefined;
        const report = await traffic(tb, vip, CONNS, 120_000, async () => {
          const prober = startProber(tb, vip);
          await prober.ready;
          try {
            await sleep(2000);
            // The mappings recorded so far are on the replicas (new ones keep coming: the probes).
            await cluster.waitCaughtUp();
            process.stdout.write(`  primary ${victim} SIGKILLed\n`);
            cluster.kill(victim);
            killedAt = Date.now();
            const failed = cluster.waitFailover(victim, 30_000).then((f) => {
              failover = f;
              process.stdout.write(`  replica ${f.port} took over in ${f.ms} ms\n`);
            });
            // A target-set change while the primary is down (t3 turns terminating: its flows must keep it):
            // the change waits for the store (its table key is on the killed primary's slot), and the LB nodes
            // record every new pick meanwhile; once it is made, the flows it moved are recorded too.
            configure(tb, TARGETS.filter((t) => t !== 'n5-t3'), { terminating: ['n5-t3'] });
            // A second batch of long-lived connections, opened while the primary is down: their mappings are
            // recorded during the failover. ECMP then moves every flow (n3 added, n1 removed): they survive
            // only if the records reached n2 (notices) and n3 (its load before announcing).
            const late = await traffic(tb, vip, LATE, 90_000, async () => {
              await failed;
              // New connections for 3 s after the failover, then none: the mapping counts can settle.
              await sleep(3000);
              probes = await prober.stop();
              const t0 = Date.now();
              reached = await until('the change made on both LB nodes and its records stored', async () => {
                const [a, b] = await Promise.all(['n1', 'n2'].map((n) => lbStatus(tb, n)));
                const store = await storedMappings(tb, vip);
                const done = (x: typeof a) => x?.table?.version !== undefined && x.table.version > 1 && !x.table.pending;
                const ok = a && b && done(a) && done(b) && a.table!.version === b.table!.version && store > 0;
                return ok ? { n1: a.mappings, n2: b.mappings, store, ms: Date.now() - t0 } : undefined;
              // 10 s: the change waits out the failover's failed steps (3 s apart), then is made in ms.
              }, 10_000).catch(async (e) => {
                const [a, b] = await Promise.all(['n1', 'n2'].map((n) => lbStatus(tb, n)));
                throw new Error(`${(e as Error).message}: n1 ${a?.mappings}, n2 ${b?.mappings}, store ${await storedMappings(tb, vip).catch((x) => String(x))}; n1 ${JSON.stringify(storeState(a))} n2 ${JSON.stringify(storeState(b))}`);
              });
              process.stdout.write('  LB pod added on n3\n');
              await tb.addPod('n3', lbPodSpec);
              await announcedOn(tb, ['n1', 'n2', 'n3']);
              await sleep(2000);
              process.stdout.write('  LB pod on n1 removed gracefully\n');
              await tb.delPod('n1-lb');
              await announcedOn(tb, ['n2', 'n3']);
              await sleep(3000);
            }, false, { endWhenDone: true });
            process.stdout.write(`  connections opened during the failover: ${late.intact}/${LATE} intact, longest gap ${late.maxGapAfterMarkMs} ms\n`);
            assert.is(late.intact, LATE, `connections opened during the failover: ${late.intact}/${LATE} intact; ${late.errors.slice(0, 4).join('; ')}`);
          } finally {
            if (!probes) await prober.stop().catch(() => undefined);
          }
        }, true, { endWhenDone: true });

        process.stdout.write(`  ${report.intact}/${CONNS} intact, longest gap ${report.maxGapAfterMarkMs} ms (ended ${report.maxGapAfterMarkEndedAt ? report.maxGapAfterMarkEndedAt - killedAt : '?'} ms after the kill); UDP ${report.udp?.received}/${report.udp?.sent}, longest UDP gap ${report.udp?.maxGapMs} ms\n`);
        process.stdout.write(`  failover ${failover?.ms} ms (${victim} → ${failover?.port}); mappings on n1/n2/store ${reached?.n1}/${reached?.n2}/${reached?.store}, the change made ${reached?.ms} ms after the failover + 3 s\n`);
        const p = probes!;
        process.stdout.write(`  new connections through the VIP: ${p.ok}/${p.tried} ok, longest time between two ${p.maxGapMs} ms; failures: ${JSON.stringify(p.failed.slice(0, 5).map((f) => ({ ms: f.at - killedAt, why: f.why })))}\n`);
        assert.is(report.intact, CONNS, `${report.intact}/${CONNS} intact; ${report.errors.slice(0, 4).join('; ')}`);
        assert.ok((report.udp?.received ?? 0) >= (report.udp?.sent ?? 1) * 0.85, `UDP ${report.udp?.received}/${report.udp?.sent}`);
        // After the failover (and the 3 s after it) every new connection worked.
        const after = p.failed.filter((f) => failover && f.at > killedAt + failover.ms);
        assert.equal(after, [], 'new connections after the failover all worked');
        assert.ok(p.ok > 0 && p.maxGapMs < 5000, `new connections kept working (longest time between two: ${p.maxGapMs} ms)`);
        const st = await Promise.all(['n2', 'n3'].map((n) => lbStatus(tb, n)));
        process.stdout.write(`  n2 store ${JSON.stringify(storeState(st[0]))}, n3 store ${JSON.stringify(storeState(st[1]))}\n`);
        for (const s of st) assert.ok(storeState(s)?.subscribed, 'the serving nodes hear the VIP\'s notices after the failover');
      } finally {
        await servers.stop().catch(() => undefined);
      }
    } finally {
      await bgp.stop();
    }
  });
});

test.run();
