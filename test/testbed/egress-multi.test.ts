// One Egress, several floating addresses, on the testbed with real traffic: gateway pods gw1..gw3 on n1..n3
// (zones a, b, c), client pods on n4 (zone a) and n3. Placement spreads the addresses over the gateway
// nodes; new flows spread evenly over them and stay pinned; addresses come and go live without moving a
// flow; a lost node moves only its address and every connection survives; zone policies steer new flows.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import type { ChildProcess } from 'node:child_process';
import { withTestbed, type Testbed } from './testbed';
import type { Topology } from './topology';
import { FLOAT_POOL, startServer, PORT } from './egress-scenario';
import { TRAFFIC_CLIENT, type TrafficReport } from '../lib/traffic';

const only = process.env.EGRESS_MULTI_ONLY;
const scenario = (name: string, fn: () => Promise<void>) => (only && !name.includes(only) ? test.skip(name, fn) : test(name, fn));
const CONNS = Number(process.env.EGRESS_TEST_CONNS ?? 200);
const FLOWS = Number(process.env.EGRESS_MULTI_FLOWS ?? 3000);
const V = 'tether.dev/v1alpha1';
const GW = { tether: { labels: { role: 'egress-gw' } }, namespace: 'shop' };
const WEB = { tether: { labels: { app: 'web' } }, namespace: 'shop' };

function egress(spec: Record<string, unknown> = {}): Record<string, unknown> {
  return {
    apiVersion: V, kind: 'Egress', metadata: { name: 'out', namespace: 'shop' },
    spec: {
      clients: { podSelector: { matchLabels: { app: 'web' } } },
      gateways: { podSelector: { matchLabels: { role: 'egress-gw' } } },
      destinations: ['198.19.0.0/16'],
      excludeDestinations: ['198.18.0.0/24'],
      addresses: { pool: 'float', count: 3 },
      ...spec,
    },
  };
}

const pool = { apiVersion: V, kind: 'AddressPool', metadata: { name: 'float' }, spec: { usage: 'floating', ipv4: { cidr: FLOAT_POOL } } };

function topology(spec: Record<string, unknown> = {}): Topology {
  return {
    nodes: [
      { name: 'n1', zone: 'a', pods: [{ name: 'gw1', ...GW }] },
      { name: 'n2', zone: 'b', pods: [{ name: 'gw2', ...GW }] },
      { name: 'n3', zone: 'c', pods: [{ name: 'gw3', ...GW }, { name: 'web', ...WEB }] },
      { name: 'n4', zone: 'a', pods: [{ name: 'web', ...WEB }] },
    ],
    tether: true,
    ipam: 'tether-ipam',
    extraObjects: [pool, egress(spec)],
  };
}

type Addr = { egress: string; address: string; owner: string; ownerNode?: string; epoch: number; ownedHere: boolean };
const addrs = async (tb: Testbed, node: string) => ((await tb.status(node)) as unknown as { egress: Addr[] }).egress;

async function until<T>(what: string, fn: () => Promise<T | undefined | false>, timeoutMs = 20_000): Promise<T> {
  const end = Date.now() + timeoutMs;
  for (;;) {
    const v = await fn().catch(() => undefined);
    if (v) return v;
    if (Date.now() > end) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 150));
  }
}

/** address → node holding it, once `n` addresses are held and every client node knows all owners. */
async function owners(tb: Testbed, n: number, gatewayNodes = ['n1', 'n2', 'n3']): Promise<Map<string, string>> {
  return until(`${n} addresses held and known to the clients`, async () => {
    const held = new Map<string, string>();
    for (const node of gatewayNodes) for (const a of await addrs(tb, node).catch(() => [])) if (a.ownedHere) held.set(a.address, node);
    if (held.size !== n) return undefined;
    for (const c of ['n3', 'n4']) {
      const view = await addrs(tb, c);
      if (view.filter((a) => a.owner && held.get(a.address) === a.ownerNode).length !== n) return undefined;
    }
    return held;
  });
}

// Short flows: `n` connections in batches of 40, each told its source by the server; prints the tally.
const FLOW_CLIENT = `
const net = require('net');
const [host, port, n] = process.argv.slice(1);
const seen = {}; let errors = 0, done = 0, started = 0;
function one() {
  if (started >= Number(n)) return;
  started++;
  let got = '';
  const s = net.connect({ host, port: Number(port) });
  s.setTimeout(5000, () => s.destroy(new Error('timeout')));
  s.on('data', (b) => (got += b));
  s.on('close', () => { const a = got.trim(); if (a) seen[a] = (seen[a] || 0) + 1; else errors++; if (++done === Number(n)) { console.log(JSON.stringify({ seen, errors })); process.exit(0); } else one(); });
  s.on('error', () => {});
}
for (let i = 0; i < 40; i++) one();`;

const SOURCE_SERVER = "require('net').createServer((s) => s.end(s.remoteAddress + '\\n')).listen(9100, '0.0.0.0', () => console.log('ready'))";

async function shortFlows(tb: Testbed, pod: string, n: number): Promise<{ seen: Record<string, number>; errors: number }> {
  const r = await tb.exec(pod, [process.execPath, '-e', FLOW_CLIENT, tb.externalIp('server'), '9100', String(n)], { timeoutMs: 120_000 });
  const line = r.stdout.split('\n').find((l) => l.startsWith('{'));
  if (!line) throw new Error(`flow client: ${r.stdout} ${r.stderr}`);
  return JSON.parse(line);
}

async function sourceServer(tb: Testbed): Promise<ChildProcess> {
  const child = tb.spawn('server', [process.execPath, '-e', SOURCE_SERVER]);
  await new Promise<void>((resolve, reject) => {
    child.stdout?.on('data', (b: Buffer) => b.toString().includes('ready') && resolve());
    child.once('exit', () => reject(new Error('source server exited')));
  });
  return child;
}

/** Long-lived traffic from n4-web while `during` runs (after a 3 s warm-up, marked). */
async function traffic(tb: Testbed, conns: number, durationMs: number, during: () => Promise<void>): Promise<{ report: TrafficReport; peers: string[] }> {
  const server = await startServer(tb);
  const client = tb.spawn('n4-web', [process.execPath, '-e', TRAFFIC_CLIENT, tb.externalIp('server'), String(PORT), String(conns), String(durationMs), '50', '0']);
  let out = '';
  client.stdout?.on('data', (b: Buffer) => (out += b.toString()));
  const exited = new Promise<void>((r) => client.on('exit', () => r()));
  await until('traffic client ready', async () => out.includes('ready'), 10_000);
  await new Promise((r) => setTimeout(r, 3000));
  client.kill('SIGUSR2');
  await during();
  await exited;
  const peers = await server.stop();
  const line = out.split('\n').find((l) => l.startsWith('{'));
  if (!line) throw new Error(`traffic client printed no report: ${out.slice(0, 400)}`);
  return { report: JSON.parse(line), peers };
}

scenario('3 addresses on 3 distinct gateway nodes; short flows from 2 nodes spread 33 % ± 5 %; a lost node moves only its address and every connection survives', async () => {
  await withTestbed(topology(), async (tb) => {
    const held = await owners(tb, 3);
    assert.is(new Set(held.values()).size, 3, `three distinct nodes: ${JSON.stringify([...held])}`);
    const server = await sourceServer(tb);
    let tally: Record<string, number> = {};
    try {
      const [a, b] = await Promise.all([shortFlows(tb, 'n4-web', FLOWS / 2), shortFlows(tb, 'n3-web', FLOWS / 2)]);
      assert.is(a.errors + b.errors, 0, 'every short flow answered');
      for (const r of [a, b]) for (const [k, v] of Object.entries(r.seen)) tally[k] = (tally[k] ?? 0) + v;
    } finally {
      server.kill('SIGTERM');
    }
    const total = Object.values(tally).reduce((x, y) => x + y, 0);
    process.stdout.write(`  fairness over ${total} flows: ${Object.entries(tally).map(([k, v]) => `${k} ${((100 * v) / total).toFixed(1)} %`).join(', ')}\n`);
    assert.equal(Object.keys(tally).sort(), [...held.keys()].sort(), 'the server saw exactly the three floating addresses');
    for (const [k, v] of Object.entries(tally)) assert.ok(Math.abs(v / total - 1 / 3) <= 0.05, `${k}: ${((100 * v) / total).toFixed(1)} % of the flows`);

    // A gateway node is lost (not n3, which also hosts a client) under 200 live connections.
    const lost = [...held.values()].find((n) => n !== 'n3')!;
    const moved = [...held].find(([, n]) => n === lost)![0];
    const { report } = await traffic(tb, CONNS, 10_000, async () => {
      await tb.killTetherd(lost, 'SIGKILL');
      await tb.mustExec(lost, ['ip', 'link', 'set', 'eth0', 'down']);
    });
    const survivors = ['n1', 'n2', 'n3'].filter((n) => n !== lost);
    const after = await owners(tb, 3, survivors);
    process.stdout.write(`  node ${lost} lost: ${moved} moved to ${after.get(moved)}; ${report.intact}/${CONNS} intact, longest gap ${report.maxGapAfterMarkMs} ms\n`);
    for (const [address, node] of held) if (address !== moved) assert.is(after.get(address), node, `${address} stayed on ${node}`);
    assert.ok(survivors.includes(after.get(moved)!), 'the lost address moved to a live gateway node');
    assert.is(report.intact, CONNS, `${report.intact}/${CONNS} intact; ${report.errors.slice(0, 4).join('; ')}`);
  });
});

scenario('addresses added and removed live: a 4th address moves no live connection; removing it again breaks none; new flows use it meanwhile', async () => {
  await withTestbed(topology(), async (tb) => {
    const held = await owners(tb, 3);
    let four = new Map<string, string>();
    let newFlows: Record<string, number> = {};
    const { report, peers } = await traffic(tb, CONNS, 12_000, async () => {
      tb.rewriteConfig({ extraObjects: [pool, egress({ addresses: { pool: 'float', count: 4 } })] });
      four = await owners(tb, 4);
      const server = await sourceServer(tb);
      try {
        newFlows = (await shortFlows(tb, 'n4-web', 400)).seen;
      } finally {
        server.kill('SIGTERM');
      }
      tb.rewriteConfig({ extraObjects: [pool, egress()] });
      await owners(tb, 3);
    });
    const added = [...four.keys()].find((a) => !held.has(a))!;
    process.stdout.write(`  4th address ${added} on ${four.get(added)}: new flows ${JSON.stringify(newFlows)}; ${report.intact}/${CONNS} live connections intact\n`);
    assert.ok(added, 'a fourth address was allocated and held');
    assert.ok((newFlows[added] ?? 0) > 0, 'new flows used the fourth address');
    assert.is(report.intact, CONNS, `${report.intact}/${CONNS} intact; ${report.errors.slice(0, 4).join('; ')}`);
    // Every live connection kept one source: the server saw each client port from one address only.
    const tcp = peers.filter((p) => !p.startsWith('udp'));
    assert.is(tcp.length, CONNS, `the server saw ${tcp.length} TCP peers for ${CONNS} connections`);
    assert.ok(tcp.every((p) => held.has(p.split(':')[0])), 'no live connection ever came from the added address');
  });
});

scenario('zones: preferZone clients use their zone\'s address and fall back when it goes; requireZone clients are dropped and status says why', async () => {
  await withTestbed(topology({ zonePolicy: 'preferZone' }), async (tb) => {
    const held = await owners(tb, 3);
    assert.is(new Set(held.values()).size, 3, `three distinct nodes: ${JSON.stringify([...held])}`);
    const zoneA = [...held].find(([, n]) => n === 'n1')![0];
    const server = await sourceServer(tb);
    try {
      const pref = await shortFlows(tb, 'n4-web', 60);
      assert.equal(pref.seen, { [zoneA]: 60 }, `n4 (zone a) used only n1's address ${zoneA}`);
      // Zone a's only gateway goes: its address moves to another zone; the clients fall back.
      await tb.delPod('n1-gw1');
      const moved = await until('zone a address moved', async () => {
        const h = await owners(tb, 3, ['n2', 'n3']);
        return h.get(zoneA) !== 'n1' && h;
      });
      const fb = await shortFlows(tb, 'n4-web', 60);
      assert.is(fb.errors, 0);
      assert.is(Object.values(fb.seen).reduce((x, y) => x + y, 0), 60, `fell back: ${JSON.stringify(fb.seen)} (addresses on ${JSON.stringify([...moved])})`);
      // requireZone: no address in zone a now, so n4's clients are dropped, and its status says why.
      tb.rewriteConfig({ extraObjects: [pool, egress({ zonePolicy: 'requireZone' })] });
      const reason = await until('n4 reports the zone problem', async () => {
        const s = (await tb.status('n4')) as unknown as { egressSummary?: Record<string, { zoneProblem?: string }> };
        return s.egressSummary?.['shop/out']?.zoneProblem;
      });
      const req = await shortFlows(tb, 'n4-web', 10);
      process.stdout.write(`  preferZone: all 60 flows on ${zoneA}, then fell back to ${JSON.stringify(fb.seen)}; requireZone: ${req.errors}/10 dropped ("${reason}")\n`);
      assert.is(req.errors, 10, 'requireZone: no flow left through another zone');
      assert.match(reason, /no address is held in zone a/);
    } finally {
      server.kill('SIGTERM');
    }
  });
});

test.run();
