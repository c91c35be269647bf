// Egress failover on the testbed, with real traffic: 3 nodes, gateway pods on n1 and n2, client pods on
// n3, an external server that records each connection's source address. Long-lived TCP connections (and
// a UDP stream) run through the floating address while the owning gateway is killed abruptly; every
// connection must continue with intact data, from the same floating address, with a short gap.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import type { ChildProcess } from 'node:child_process';
import { withTestbed, type Testbed } from './testbed';
import type { Topology } from './topology';
import { ECHO_SERVER, TRAFFIC_CLIENT, type TrafficReport } from '../lib/traffic';

const FLOAT_POOL = '198.18.0.200/29';
const PORT = 9000;
const CONNS = Number(process.env.EGRESS_TEST_CONNS ?? 200);

function topology(extraArgs: string[] = []): Topology {
  return {
    nodes: [
      { name: 'n1', zone: 'a', pods: [{ name: 'gw1', namespace: 'shop', tether: { labels: { role: 'egress-gw' } } }] },
      { name: 'n2', zone: 'b', pods: [{ name: 'gw2', namespace: 'shop', tether: { labels: { role: 'egress-gw' } } }] },
      { name: 'n3', zone: 'c', pods: [{ name: 'web', namespace: 'shop', tether: { labels: { app: 'web' }, encapOverhead: 28 } }] },
    ],
    tether: true,
    ipam: 'tether-ipam',
    tetherdArgs: extraArgs,
    extraObjects: [
      { apiVersion: 'tether.dev/v1alpha1', kind: 'AddressPool', metadata: { name: 'float' }, spec: { usage: 'floating', ipv4: { cidr: FLOAT_POOL } } },
      {
        apiVersion: 'tether.dev/v1alpha1',
        kind: 'Egress',
        metadata: { name: 'out', namespace: 'shop' },
        spec: {
          clients: { podSelector: { app: 'web' } },
          gateways: { podSelector: { role: 'egress-gw' } },
          destinations: ['198.19.0.0/16'],
          excludeDestinations: ['198.18.0.0/24'],
          addresses: { pool: 'float', count: 1 },
          failover: { intervalMs: 100, detectMultiplier: 3 },
        },
      },
    ],
  };
}

interface EgressStatus {
  address: string;
  owner: string;
  epoch: number;
  ownedHere: boolean;
  lastTakeover?: { cause: string; ms: number };
}

async function egressOf(tb: Testbed, node: string): Promise<EgressStatus | undefined> {
  return ((await tb.status(node)) as unknown as { egress: EgressStatus[] }).egress[0];
}

async function waitOwner(tb: Testbed, notPod?: string, timeoutMs = 8000): Promise<{ node: string; st: EgressStatus }> {
  const end = Date.now() + timeoutMs;
  for (;;) {
    for (const node of ['n1', 'n2']) {
      const st = await egressOf(tb, node).catch(() => undefined);
      // The owner's own node must agree it holds the address (gw1 lives on n1, gw2 on n2).
      if (st?.ownedHere && st.owner === `shop/gw${node.slice(1)}` && st.owner !== notPod) return { node, st };
    }
    if (Date.now() > end) throw new Error(`no gateway owns the floating address after ${timeoutMs} ms`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

function collect(child: ChildProcess): Promise<string> {
  return new Promise((resolve) => {
    let out = '';
    child.stdout?.on('data', (b: Buffer) => (out += b.toString()));
    child.on('exit', () => resolve(out));
  });
}

async function startServer(tb: Testbed): Promise<{ stop: () => Promise<string[]> }> {
  const child = tb.spawn('server', [process.execPath, '-e', ECHO_SERVER, String(PORT)]);
  const out = collect(child);
  await new Promise<void>((resolve, reject) => {
    child.stdout?.on('data', (b: Buffer) => b.toString().includes('ready') && resolve());
    child.once('exit', () => reject(new Error('echo server exited')));
  });
  return {
    stop: async () => {
      child.kill('SIGTERM');
      const text = await out;
      const line = text.split('\n').find((l) => l.startsWith('{'));
      return line ? (JSON.parse(line).peers as string[]) : [];
    },
  };
}

async function runTraffic(tb: Testbed, durationMs: number, during: () => Promise<void>): Promise<{ report: TrafficReport; peers: string[] }> {
  const server = await startServer(tb);
  const client = tb.spawn('n3-web', [process.execPath, '-e', TRAFFIC_CLIENT, tb.externalIp('server'), String(PORT), String(CONNS), String(durationMs), '50', '1']);
  const out = collect(client);
  await new Promise((r) => setTimeout(r, Math.min(3000, durationMs / 3)));
  await during();
  const text = await out;
  const peers = await server.stop();
  const line = text.split('\n').find((l) => l.startsWith('{'));
  if (!line) throw new Error(`traffic client printed no report: ${text.slice(0, 500)}`);
  return { report: JSON.parse(line) as TrafficReport, peers };
}

test('owner gateway killed abruptly: every TCP connection continues from the same floating address', async () => {
  await withTestbed(topology(), async (tb) => {
    const first = await waitOwner(tb);
    const floating = first.st.address;
    const ownerKey = `${first.node}-${first.st.owner.split('/')[1]}`;
    const { report, peers } = await runTraffic(tb, 9000, async () => {
      // No goodbye: the gateway pod's namespace (and with it its veth) vanishes.
      await tb.mustExec('router', ['ip', 'netns', 'del', tb.pod(ownerKey).ns]);
    });
    const next = await waitOwner(tb, first.st.owner);
    if (process.env.EGRESS_DEBUG) {
      const gwKey = `${next.node}-${next.st.owner.split('/')[1]}`;
      const ct = await tb.exec(gwKey, ['sh', '-c', 'nft list table ip tether_egress; conntrack -S']);
      process.stdout.write(`DEBUG new owner conntrack (${ct.stdout.split('\n').length} lines):\n${ct.stdout.split('\n').slice(0, 8).join('\n')}\n${ct.stderr}\n`);
      process.stdout.write(`DEBUG status: ${JSON.stringify(await tb.status(next.node))}\n`.slice(0, 3000));
    }
    assert.is.not(next.node, first.node, 'the other gateway took over');
    assert.ok(next.st.epoch > first.st.epoch, `epoch grew: ${first.st.epoch} → ${next.st.epoch}`);
    assert.is(report.intact, CONNS, `${report.intact}/${CONNS} connections intact; first errors: ${report.errors.slice(0, 6).join('; ')}`);
    assert.equal(report.errors, [], 'no connection error');
    assert.ok(report.maxGapMs < 1000, `longest gap ${report.maxGapMs} ms`);
    const tcpPeers = peers.filter((p) => !p.startsWith('udp'));
    assert.is(tcpPeers.length, CONNS);
    assert.ok(tcpPeers.every((p) => p.startsWith(`${floating}:`)), `server saw only the floating address: ${tcpPeers.slice(0, 3)}`);
    assert.ok(report.udp && report.udp.received > report.udp.sent * 0.8, `UDP continued: ${JSON.stringify(report.udp)}`);
    process.stdout.write(`  failover: longest gap ${report.maxGapMs} ms over ${CONNS} connections, UDP ${report.udp?.received}/${report.udp?.sent}, takeover ${JSON.stringify(next.st.lastTakeover)}\n`);
  });
});

test.run();
