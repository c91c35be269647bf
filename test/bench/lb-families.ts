// Benchmark (not a test): the load balancer's IPv6 VIPs beside its IPv4 ones, in one run on one dual-stack
// testbed (lb-scenario's, pods dual-stack, the fabric carrying IPv6 beside the nodes' IPv4 underlay; the LB
// nodes advertise both VIPs over BGP). Dual-stack Services: through each VIP (FoU in outer IPv4, or outer
// IPv6 to the target's IPv6 address) and by plain routing to the same target pod in the same family, the
// measures of lb.ts (its pathThroughput and storm): 1 and 8 TCP streams, 64-byte UDP packets per second,
// new connections per second. Rounds alternate which family goes first, so the shared machine's noise hits
// both; each figure is the median of its rounds. Writes results/bench-lb-families.json and its
// docs/performance.md block, with each IPv6 figure over its IPv4 one.
// Run: node_modules/.bin/tsx test/bench/lb-families.ts (BENCH_LB_FAMILY_ROUNDS, BENCH_LB_SECS, BENCH_LB_STORM)
import * as fs from 'node:fs';
import * as path from 'node:path';
import type { ChildProcess } from 'node:child_process';
import { withTestbed, type Testbed } from '../testbed/testbed';
import { service, slice, startBgp, startTargets, topology, until } from '../testbed/lb-scenario';
import type { IpFamily } from '../../lib/ip';
import { PERF_LB_NODES, PERF_PORT, VIP_PERF_PORT, announced, pathThroughput, perfService, perfSlice, storm, type PathThroughput } from './lb';
import { machine, updateReadme } from './stats';

const ROUNDS = Number(process.env.BENCH_LB_FAMILY_ROUNDS ?? 5);
const SECS = Number(process.env.BENCH_LB_SECS ?? 5);
const STORM = Number(process.env.BENCH_LB_STORM ?? 3000);
const DATAPATH = process.env.BENCH_LB_DATAPATH ?? 'node';
const repo = path.resolve(__dirname, '../..');
const FAMILIES: IpFamily[] = [4, 6];
const DUAL = { ipFamilyPolicy: 'RequireDualStack', ipFamilies: ['IPv4', 'IPv6'] };
const pool = {
  apiVersion: 'tether.dev/v1alpha1', kind: 'AddressPool', metadata: { name: 'lb' },
  spec: { usage: 'loadBalancer', ipv4: { cidr: '198.51.100.0/28' }, ipv6: { cidr: 'fd00:5100::/124' } },
};

/** One family's figures in one round: through its VIP, and by plain routing to the same target. */
interface Round {
  family: IpFamily;
  vip: PathThroughput & { connsPerSecond: number };
  plain: PathThroughput & { connsPerSecond: number };
}

const FIGURES = ['mbps1', 'mbps8', 'pps64', 'connsPerSecond'] as const;
type Figure = (typeof FIGURES)[number];
type Figures = Record<Figure, number>;

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : Math.round((s[s.length / 2 - 1] + s[s.length / 2]) / 2);
}

const r2 = (x: number) => Math.round(x * 100) / 100;

/** The VIPs of the two Services, per family, once n1 announces all four. */
async function vips(tb: Testbed): Promise<Record<'db' | 'perf', Record<IpFamily, string>>> {
  return until('both Services\' VIPs of both families announced', async () => {
    const l = ((await tb.status('n1')) as unknown as { loadBalancers: Array<{ service: string; vip?: string; announced: boolean }> }).loadBalancers;
    const vip = (name: string) => l.find((x) => x.service === name && x.announced)?.vip;
    const got = { db: { 4: vip('shop/db'), 6: vip('shop/db#IPv6') }, perf: { 4: vip('shop/perf'), 6: vip('shop/perf#IPv6') } };
    return Object.values(got).every((f) => f[4] && f[6]) ? (got as Record<'db' | 'perf', Record<IpFamily, string>>) : undefined;
  }, 30_000);
}

async function main(): Promise<void> {
  const rounds: Round[] = [];
  await withTestbed({ ...topology(DATAPATH), families: FAMILIES, extraObjects: [pool] }, async (tb) => {
    const bgp = await startBgp(tb, undefined, { ipv6: true });
    const servers: ChildProcess[] = [];
    try {
      const targets = ['n4-t1', 'n4-t2', 'n5-t3'];
      tb.rewriteConfig({
        extraObjects: [
          pool, service(undefined, DUAL), ...FAMILIES.map((f) => slice(tb, targets, [], f)),
          perfService(DUAL), ...FAMILIES.map((f) => perfSlice(tb, f)),
        ],
      });
      const vip = await vips(tb);
      for (const f of FAMILIES) for (const s of ['db', 'perf'] as const) await announced(tb, vip[s][f], PERF_LB_NODES);
      // One iperf3 server per path and family, each bound to its address: the VIP's answers its UDP
      // handshake from the VIP (DSR), as in lb.ts.
      const podIp = (f: IpFamily) => (f === 4 ? tb.podIp('n4-t1') : tb.podIp6('n4-t1'));
      for (const f of FAMILIES) {
        servers.push(tb.spawn('n4-t1', ['iperf3', '-s', '-p', String(PERF_PORT), '-B', podIp(f)]));
        servers.push(tb.spawn('n4-t1', ['iperf3', '-s', '-p', String(VIP_PERF_PORT), '-B', vip.perf[f]]));
      }
      // One echo server per family in each target: an IPv6 VIP's listens on IPv6 only, so without the IPv4 one
      // every IPv4 connection was refused, and a burst of refusals ran at about twice a real burst's rate.
      const echo4 = await startTargets(tb, targets, vip.db[4]);
      const echo6 = await startTargets(tb, targets, vip.db[6]);
      try {
        // Each burst leaves TIME_WAIT ports behind for 60 s: the client gets the whole range (as in lb.ts).
        await tb.mustExec('client', ['sysctl', '-q', '-w', 'net.ipv4.ip_local_port_range=1024 65535']);
        await new Promise((r) => setTimeout(r, 500));
        const direct = (f: IpFamily) => (f === 4 ? tb.podIp('n4-t2') : tb.podIp6('n4-t2'));
        for (let round = 0; round < ROUNDS; round++) {
          const order: IpFamily[] = round % 2 ? [6, 4] : [4, 6];
          for (const f of order) {
            // Within a family too, the first path alternates from round to round.
            const through = async () => ({ ...(await pathThroughput(tb, vip.perf[f], VIP_PERF_PORT)), connsPerSecond: Math.round((await storm(tb, vip.db[f], STORM)).perSecond) });
            const plain = async () => ({ ...(await pathThroughput(tb, podIp(f), PERF_PORT)), connsPerSecond: Math.round((await storm(tb, direct(f), STORM)).perSecond) });
            const r: Partial<Round> = { family: f };
            if (Math.floor(round / 2) % 2) {
              r.plain = await plain();
              r.vip = await through();
            } else {
              r.vip = await through();
              r.plain = await plain();
            }
            rounds.push(r as Round);
            process.stdout.write(`  round ${round + 1} IPv${f}: VIP ${JSON.stringify(r.vip)}, plain ${JSON.stringify(r.plain)}\n`);
          }
        }
      } finally {
        await echo6.stop().catch(() => undefined);
        await echo4.stop().catch(() => undefined);
      }
    } finally {
      for (const s of servers) s.kill('SIGKILL');
      await bgp.stop();
    }
  });

  const of = (f: IpFamily, p: 'vip' | 'plain'): Figures =>
    Object.fromEntries(FIGURES.map((k) => [k, median(rounds.filter((r) => r.family === f).map((r) => r[p][k]))])) as Figures;
  const fam = (f: IpFamily) => {
    const v = of(f, 'vip');
    const p = of(f, 'plain');
    return { vip: v, plain: p, vipVsPlain: Object.fromEntries(FIGURES.map((k) => [k, r2(v[k] / p[k])])) as Figures };
  };
  const ipv4 = fam(4);
  const ipv6 = fam(6);
  const over = (a: Figures, b: Figures) => Object.fromEntries(FIGURES.map((k) => [k, r2(a[k] / b[k])])) as Figures;
  // IPv6 ÷ IPv4: through the VIPs, by plain routing, and of the VIP's share of plain routing (what the load
  // balancer itself costs in each family, the families' own routing costs set aside).
  const ratio = { vip: over(ipv6.vip, ipv4.vip), plain: over(ipv6.plain, ipv4.plain), vipVsPlain: over(ipv6.vipVsPlain, ipv4.vipVsPlain) };
  const result = {
    benchmark: 'lb-families', machine: machine(), datapath: DATAPATH, iperfSeconds: SECS, connectionsPerBurst: STORM, rounds: ROUNDS,
    ipv4, ipv6, ratio, runs: rounds,
  };
  fs.mkdirSync(path.join(repo, 'results'), { recursive: true });
  fs.writeFileSync(path.join(repo, 'results/bench-lb-families.json'), JSON.stringify(result, null, 2) + '\n');

  const m = result.machine as Record<string, unknown>;
  const label: Record<Figure, string> = { mbps1: '1 TCP stream (Mbit/s)', mbps8: '8 TCP streams (Mbit/s)', pps64: '64-byte UDP (packets/s)', connsPerSecond: 'new connections/s' };
  // Within 10 %: not more than a tenth below (above is no shortfall).
  const within = (x: number) => x >= 0.9;
  const row = (k: Figure) => `| ${label[k]} | ${ipv4.vip[k]} | ${ipv4.plain[k]} | ${ipv4.vipVsPlain[k]} | ${ipv6.vip[k]} | ${ipv6.plain[k]} | ${ipv6.vipVsPlain[k]} | **${ratio.vip[k]}** | ${ratio.plain[k]} | **${ratio.vipVsPlain[k]}** |`;
  const missed = FIGURES.filter((k) => !within(ratio.vip[k]));
  const md = `Measured by \`test/bench/lb-families.ts\` (part of \`npm run bench\`) on ${m.cpu} (${m.cores} cores), kernel ${m.kernel}, ${String(m.date).slice(0, 10)}, on one dual-stack testbed (the ${DATAPATH} datapath; the nodes talk IPv4): a dual-stack Service's VIPs, the IPv6 one forwarded in FoU over outer IPv6 to the target's IPv6 address, against plain routing to the same target pod in the same family; iperf3 for ${SECS} s per figure, bursts of ${STORM} connections (to a Service of 3 targets; plain: straight to one). Median of ${ROUNDS} rounds; the families alternate which goes first from round to round.

| figure | IPv4 VIP | IPv4 plain | IPv4 VIP ÷ plain | IPv6 VIP | IPv6 plain | IPv6 VIP ÷ plain | IPv6 ÷ IPv4, VIP | IPv6 ÷ IPv4, plain | IPv6 ÷ IPv4, VIP ÷ plain |
|---|---|---|---|---|---|---|---|---|---|
${FIGURES.map(row).join('\n')}

Target: each IPv6 figure through the VIP within 10 % of its IPv4 figure: ${missed.length ? `not met for ${missed.map((k) => label[k]).join(', ')}` : 'met'}. Raw figures: \`results/bench-lb-families.json\`.`;
  updateReadme(path.join(repo, 'README.md'), 'lb-families', md);
  process.stdout.write(md + '\n');
}

main().then(() => process.exit(0), (e) => {
  process.stderr.write(`lb families bench failed: ${(e as Error).stack ?? e}\n`);
  process.exit(1);
});
