// Shared by the many-address Egress tests and benchmark: gateway pods gw1..gw3 on n1..n3 (zones a, b, c),
// client pods "web" on n3 and n4 (zone a), one Egress over several addresses of a floating pool, and the
// probes (short flows tallied by source address, long-lived traffic from n4-web).
import type { ChildProcess } from 'node:child_process';
import type { Testbed } from './testbed';
import type { Topology } from './topology';
import { FLOAT_POOL, startServer, PORT } from './egress-scenario';
import { TRAFFIC_CLIENT, type TrafficReport } from '../lib/traffic';
import { until } from '../lib/wait';

export const V = 'tether.dev/v1alpha1';
const GW = { tether: { labels: { role: 'egress-gw' } }, namespace: 'shop' };
// Client pods' MTU leaves room for the FoU headers their steered packets get (as tether's encapOverhead does).
const WEB = { tether: { labels: { app: 'web' }, encapOverhead: 28 }, namespace: 'shop' };

export function egress(spec: Record<string, unknown> = {}): Record<string, unknown> {
  return {
    apiVersion: V, kind: 'Egress', metadata: { name: 'out', namespace: 'shop' },
    spec: {
      clients: { podSelector: { matchLabels: { app: 'web' } } },
      gateways: { podSelector: { matchLabels: { role: 'egress-gw' } } },
      destinations: ['198.19.0.0/16'],
      excludeDestinations: ['198.18.0.0/24'],
      addresses: { pool: 'float', count: 3 },
      // Detection at 100 ms x 5, not the default 50 ms x 3: 3,000 short flows through four containerised
      // nodes saturate this 2-core machine, and a gateway node's BFD packets then stall for 150 ms (seen:
      // both peers of one node Down at once, every address reshuffled by "failovers" of live owners, one
      // address's in-flight flows lost). These scenarios are about placement and spread, not detection.
      failover: { intervalMs: 100, detectMultiplier: 5 },
      ...spec,
    },
  };
}

export const pool = { apiVersion: V, kind: 'AddressPool', metadata: { name: 'float' }, spec: { usage: 'floating', ipv4: { cidr: FLOAT_POOL } } };

export function topology(spec: Record<string, unknown> = {}): Topology {
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

export type Addr = { egress: string; address: string; owner: string; ownerNode?: string; epoch: number; ownedHere: boolean };
export const addrs = async (tb: Testbed, node: string) => ((await tb.status(node)) as unknown as { egress: Addr[] }).egress;

export { until } from '../lib/wait';

/** address → node holding it, once `n` addresses are held and every client node knows all owners. */
export async function owners(tb: Testbed, n: number, gatewayNodes = ['n1', 'n2', 'n3']): Promise<Map<string, string>> {
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

// Short flows: `n` connections in batches of 40, each told its source by the server; prints the tally. A flow
// gets 15 s (a SYN lost twice is retried at 7 s; real clients wait far longer); flows that took over 1 s are
// counted per address (a stall of one address shows there), and flows that got no answer say why.
const FLOW_CLIENT = `
const net = require('net');
const [host, port, n] = process.argv.slice(1);
const seen = {}; let errors = 0, done = 0, started = 0, maxMs = 0; const slow = {}, why = {}; const failed = [];
function one() {
  if (started >= Number(n)) return;
  started++;
  let got = '', err = '', lport = 0; const t0 = Date.now();
  const s = net.connect({ host, port: Number(port) });
  s.on('connect', () => { lport = s.localPort; });
  s.setTimeout(15000, () => s.destroy(new Error(lport ? 'timeout after connect' : 'timeout before connect')));
  s.on('data', (b) => (got += b));
  s.on('error', (e) => { err = e.code || e.message; });
  s.on('close', () => {
    const a = got.trim(), ms = Date.now() - t0;
    if (a) { seen[a] = (seen[a] || 0) + 1; maxMs = Math.max(maxMs, ms); if (ms > 1000) slow[a] = (slow[a] || 0) + 1; }
    else { errors++; const k = err || 'closed without an answer'; why[k] = (why[k] || 0) + 1; if (failed.length < 10) failed.push({ k, lport, ms }); }
    if (++done === Number(n)) { console.log(JSON.stringify({ seen, errors, maxMs, slow, why, failed })); process.exit(0); } else one();
  });
}
for (let i = 0; i < 40; i++) one();`;

const SOURCE_SERVER = "require('net').createServer((s) => { s.on('error', () => {}); s.end(s.remoteAddress + '\\n'); }).listen(9100, '0.0.0.0', () => console.log('ready'))";

export interface ShortFlows {
  seen: Record<string, number>;
  errors: number;
  /** The longest answered flow, and answered flows over 1 s per source address. */
  maxMs: number;
  slow: Record<string, number>;
  why: Record<string, number>;
  failed: Array<{ k: string; lport: number; ms: number }>;
}

export async function shortFlows(tb: Testbed, pod: string, n: number): Promise<ShortFlows> {
  const r = await tb.exec(pod, [process.execPath, '-e', FLOW_CLIENT, tb.externalIp('server'), '9100', String(n)], { timeoutMs: 120_000 });
  const line = r.stdout.split('\n').find((l) => l.startsWith('{'));
  if (!line) throw new Error(`flow client: ${r.stdout} ${r.stderr}`);
  return JSON.parse(line);
}

export async function sourceServer(tb: Testbed): Promise<ChildProcess> {
  const child = tb.spawn('server', [process.execPath, '-e', SOURCE_SERVER]);
  await new Promise<void>((resolve, reject) => {
    child.stdout?.on('data', (b: Buffer) => b.toString().includes('ready') && resolve());
    child.once('exit', () => reject(new Error('source server exited')));
  });
  return child;
}

/** Long-lived traffic from n4-web while `during` runs (after a 3 s warm-up, marked). */
export async function traffic(tb: Testbed, conns: number, durationMs: number, during: () => Promise<void>): Promise<{ report: TrafficReport; peers: string[] }> {
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

