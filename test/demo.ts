// The demo, in three parts. First: a two-zone testbed with one tetherd per node, pods attached through the real CNI chain
// (Debian's ptp + tether-ipam, then tether), what tether did to each pod, traffic across nodes and to the
// outside, a tetherd killed with -9 and restarted, and a clean DEL. Second: Egress — live connections
// through a floating address while the owning gateway is killed, and the counters after. Third: the load
// balancer with externalTrafficPolicy Local — each node's health-check answer as an external load balancer
// sees it, the VIP announced (BGP) only by nodes with a ready local target, and live connections kept while
// a node's last target turns terminating and the node withdraws. Each part tears its testbed down.
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { withTestbed, type Testbed } from './testbed/testbed';
import { bin } from './lib/binaries';
import { runTraffic, topology, waitOwner } from './testbed/egress-scenario';
import { lbStatus, pool, routerPaths, slice, startBgp, startTargets, traffic, until } from './testbed/lb-scenario';
import { HC, colocated, local, probe as healthProbe } from './testbed/health-scenario';

const say = (s = '') => process.stdout.write(s + '\n');
const ipj = (ns: string, args: string[]) => JSON.parse(execFileSync('ip', ['-n', ns, '-j', ...args], { encoding: 'utf8' }) || '[]');

function showPod(tb: Testbed, key: string) {
  const pod = tb.pod(key);
  const eth0 = ipj(pod.ns, ['link', 'show', 'eth0'])[0];
  const host = pod.result.interfaces?.find((i) => !i.sandbox)?.name ?? '?';
  const hostMtu = ipj(tb.nodeNs(pod.node), ['link', 'show', host])[0]?.mtu;
  const vips = ipj(pod.ns, ['addr', 'show', 'lo'])[0].addr_info.filter((a: any) => a.family === 'inet' && a.local !== '127.0.0.1').map((a: any) => a.local);
  const routes = ipj(pod.ns, ['route', 'show']).map((r: any) => `${r.dst}${r.gateway ? ` via ${r.gateway}` : ''}${r.metrics?.[0]?.mtu ? ` mtu ${r.metrics[0].mtu}` : ''}`);
  say(`  ${key.padEnd(6)} ip ${pod.ip.padEnd(12)} eth0 mtu ${eth0.mtu} (host side ${host} mtu ${hostMtu})  VIPs on lo: ${vips.join(', ') || '-'}`);
  say(`         routes: ${routes.join(' | ')}   ADD took ${pod.add.ms.toFixed(0)} ms (tether ${pod.add.invocations.find((i) => i.plugin === 'tether')?.ms.toFixed(0)} ms)`);
}

async function probe(tb: Testbed, from: string, ip: string, what: string) {
  const r = await tb.tcpProbe(from, ip, 7000);
  say(`  ${from} → ${what} (${ip}): ${r.ok ? `answered by ${r.reply}` : `FAILED ${r.error}`}`);
  if (!r.ok) throw new Error(`${from} cannot reach ${what}`);
}

async function main() {
  say('Tether demo: a testbed of network namespaces on this machine');
  await withTestbed(
    {
      nodes: [
        { name: 'n1', zone: 'zone-a', tether: { encapOverhead: 28, routes: [{ dst: '203.0.113.0/24', mtu: 1400 }] } },
        { name: 'n2', zone: 'zone-b', tether: { encapOverhead: 28 } },
      ],
      tether: true,
    },
    async (tb) => {
      say(`\n1. testbed ${tb.prefix}: router, external client and server, nodes n1 (zone-a) and n2 (zone-b), one tetherd each`);
      await tb.addPod('n1', { name: 'p1', namespace: 'shop' });
      await tb.addPod('n1', { name: 'lb', namespace: 'shop', tether: { vips: ['198.51.100.10', '198.51.100.11'] } });
      await tb.addPod('n2', { name: 'p1', namespace: 'shop' });
      say('\n2. pods attached through ptp with tether-ipam (addresses from blocks claimed in Redis), then tether (FoU overhead 28 bytes, VIPs for DSR):');
      for (const p of tb.listPods()) showPod(tb, p.key);

      say('\n3. traffic (real TCP, each server answers with its name):');
      for (const p of tb.listPods()) await tb.tcpServe(p.key, 7000);
      await tb.tcpServe('server', 7000);
      await probe(tb, 'n1-p1', tb.podIp('n1-lb'), 'n1-lb, same node');
      await probe(tb, 'n1-p1', tb.podIp('n2-p1'), 'n2-p1, other node');
      await probe(tb, 'n2-p1', tb.externalIp('server'), 'the external server');
      await probe(tb, 'client', tb.podIp('n2-p1'), 'n2-p1 from the external client');

      say('\n4. tetherd on n1 knows its pods:');
      const st = JSON.parse(execFileSync(bin('tetherctl'), ['--socket', tb.socketPath('n1'), 'status'], { encoding: 'utf8' }));
      for (const p of st.pods) say(`  ${p.pod}  container ${p.containerId.slice(0, 12)}…  ${p.phase}`);

      say('\n5. tetherd on n1 killed with -9, restarted; it reloads its pods from its state dir');
      await tb.killTetherd('n1', 'SIGKILL');
      await tb.restartTetherd('n1');
      const st2 = JSON.parse(execFileSync(bin('tetherctl'), ['--socket', tb.socketPath('n1'), 'status'], { encoding: 'utf8' }));
      say(`  after restart: ${st2.pods.length} pods recorded`);
      await tb.checkPod('n1-lb');
      say('  CHECK of shop/lb passes after the restart');

      say('\n6. DEL of shop/lb through the chain: tether undoes its VIPs, MTU and sysctls, ptp removes the veth');
      const del = await tb.delPod('n1-lb');
      say(`  DEL took ${del.ms.toFixed(0)} ms; tetherd on n1 now records ${JSON.parse(execFileSync(bin('tetherctl'), ['--socket', tb.socketPath('n1'), 'status'], { encoding: 'utf8' })).pods.length} pod(s)`);

      say('\n7. a line of tetherd\'s log (JSON, one line per action):');
      const line = execFileSync('grep', ['-m1', 'pod attached', tb.tetherdLog('n2')], { encoding: 'utf8' }).trim();
      say('  ' + (line.length > 300 ? line.slice(0, 300) + '…' : line));
    },
  );
  say('\n8. testbed torn down: no namespaces, state or pins left.');

  await egressDemo();
  await localPolicyDemo();
}

/** Egress that survives its gateway: live connections through the floating address, the owner killed. */
async function egressDemo() {
  const CONNS = 100;
  say('\nEgress on a floating address: gateway pods on n1 and n2, a client pod on n3, an external server');
  await withTestbed(topology(), async (tb) => {
    const first = await waitOwner(tb);
    say(`  floating address ${first.st.address} owned by ${first.st.owner} on ${first.node} (epoch ${first.st.epoch})`);
    say(`  ${CONNS} TCP connections (request/response every 50 ms, sequence-checked) and a UDP stream run from shop/web…`);
    const t0 = Date.now();
    let killedAt = 0;
    const { report, peers } = await runTraffic(tb, CONNS, 8000, async () => {
      killedAt = Date.now() - t0;
      await tb.mustExec('router', ['ip', 'netns', 'del', tb.pod(`${first.node}-${first.st.owner.split('/')[1]}`).ns]);
      say(`  ${killedAt} ms in: gateway ${first.st.owner} killed (its namespace deleted, no goodbye)`);
    });
    const next = await waitOwner(tb, first.st.owner);
    const tcpPeers = peers.filter((p) => !p.startsWith('udp'));
    say(`  new owner ${next.st.owner} on ${next.node}, epoch ${next.st.epoch}: ${next.st.lastTakeover?.cause}`);
    say(`  connections kept: ${report.intact}/${report.connections}; echoes checked: ${report.echoes}; errors: ${report.errors.length}`);
    say(`  longest gap on any connection during the takeover: ${report.maxGapAfterMarkMs ?? report.maxGapMs} ms; UDP ${report.udp?.received}/${report.udp?.sent} datagrams answered`);
    say(`  the server saw ${new Set(tcpPeers.map((p) => p.split(':')[0])).size} source address(es): ${[...new Set(tcpPeers.map((p) => p.split(':')[0]))].join(', ')}`);
  });
  say('  testbed torn down.');
}

/** The load balancer with externalTrafficPolicy Local: health checks, announcements, a node's last target going. */
async function localPolicyDemo() {
  const CONNS = 50;
  const NODES = ['n1', 'n2', 'n4', 'n5'];
  say('\nLoad balancer with externalTrafficPolicy: Local: LB pods on n1, n4, n5; targets t1, t2 on n4 and t3 on n5; n2 has neither');
  await withTestbed(colocated(), async (tb) => {
    const bgp = await startBgp(tb, ['n1', 'n4', 'n5']);
    try {
      tb.rewriteConfig({ extraObjects: [pool, local(), slice(tb, ['n4-t1', 'n4-t2', 'n5-t3'])] });
      const vip = await until('VIP allocated', async () => (await lbStatus(tb, 'n1'))?.vip);
      const ip = (n: string) => tb.node(n).fabricIp;
      const answers = async () => Object.fromEntries(await Promise.all(NODES.map(async (n) => [n, await healthProbe(tb, n)] as const)));
      const show = async (what: string) => {
        const a = await answers();
        say(`  ${what}: health-check port ${HC} probed from the router: ${NODES.map((n) => `${n} ${a[n].status ?? a[n].error}`).join(', ')}`);
        return a;
      };
      await until('every node answers', async () => Object.values(await answers()).every((x) => x.status !== undefined), 20_000);
      await until('VIP over n4 and n5', async () => (await routerPaths(tb, vip)).join() === [ip('n4'), ip('n5')].sort().join(), 20_000);
      say(`  Service shop/db got VIP ${vip}`);
      const a = await show('answers');
      say(`  n4's answer, kube-proxy's contract: ${a.n4.type}, X-Load-Balancing-Endpoint-Weight ${a.n4.weight}, ${JSON.stringify(JSON.parse(a.n4.body ?? '{}'))}`);
      say(`  the router reaches the VIP over: ${(await routerPaths(tb, vip)).map((g) => NODES.find((n) => ip(n) === g)).join(', ')} (n1 has an LB pod but no local target: it does not announce)`);

      const servers = await startTargets(tb, ['n4-t1', 'n4-t2', 'n5-t3'], vip);
      try {
        say(`  ${CONNS} TCP connections from the external client to the VIP (request/response every 50 ms)…`);
        const t0 = Date.now();
        const report = await traffic(tb, vip, CONNS, 10_000, async () => {
          tb.rewriteConfig({ extraObjects: [pool, local(), slice(tb, ['n4-t1', 'n4-t2'], ['n5-t3'])] });
          say(`  ${Date.now() - t0} ms in: n5's only target t3 turns terminating (EndpointSlice: ready false, serving true)`);
          // Both watched at once (tether takes the route out of the export table before its answer flips; the
          // router sees the withdrawal once BGP has carried it).
          const seen: { withdrawn?: number; failed?: number } = {};
          await until('n5 withdrawn and answering 503', async () => {
            const [paths, answer] = await Promise.all([routerPaths(tb, vip), healthProbe(tb, 'n5')]);
            if (seen.withdrawn === undefined && paths.join() === ip('n4')) seen.withdrawn = Date.now() - t0;
            if (seen.failed === undefined && answer.status === 503) seen.failed = Date.now() - t0;
            return seen.withdrawn !== undefined && seen.failed !== undefined;
          }, 10_000);
          say(`  seen from the router, polling both: n5's route withdrawn ${seen.withdrawn} ms in, its health check 503 ${seen.failed} ms in; the router sends everything to n4`);
        }, false);
        const peers = await servers.stop();
        const sources = [...new Set([...peers.values()].flat().map((p) => p.split(':')[0]))];
        await show('after');
        say(`  connections kept: ${report.intact}/${report.connections} (${peers.get('n5-t3')?.length ?? 0} of them on the terminating t3, now reached through n4); errors: ${report.errors.length}`);
        say(`  the targets saw the client's own address: ${sources.join(', ')} (the external client is ${tb.externalIp('client')})`);
      } finally {
        await servers.stop().catch(() => undefined);
      }
      const flip = readFileSync(tb.tetherdLog('n5'), 'utf8').split('\n').filter((l) => l.includes('health: service health answer') && l.includes('"status":503')).pop() ?? '(none)';
      say(`  n5's log of the flip: ${flip.length > 300 ? flip.slice(0, 300) + '…' : flip}`);
    } finally {
      await bgp.stop();
    }
  });
  say('  testbed torn down.');
}

main().catch((e) => {
  process.stderr.write(`demo failed: ${(e as Error).stack ?? e}\n`);
  process.exit(1);
});
