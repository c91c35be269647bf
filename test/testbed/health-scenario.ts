// Health checks on the testbed, shared by the health tests and the demo: a load balancer Service with
// externalTrafficPolicy Local (health-check node port HC), the probe an external load balancer would make
// from the router, and a topology with LB pods beside the targets (Local policy routes the VIP only to
// nodes with a ready local target, so every such node runs an LB pod).
import type { Testbed } from './testbed';
import type { Topology } from './topology';
import { pool, service } from './lb-scenario';

export const HC = 32100;

const PROBE = `
const http = require('http');
const [host, port, path] = process.argv.slice(1);
http.get({ host, port: Number(port), path, timeout: 2000 }, (res) => {
  let body = ''; res.on('data', (d) => (body += d));
  res.on('end', () => console.log(JSON.stringify({ status: res.statusCode, weight: res.headers['x-load-balancing-endpoint-weight'], type: res.headers['content-type'], body })));
}).on('error', (e) => console.log(JSON.stringify({ error: e.code })));`;

export interface Probe { status?: number; weight?: string; type?: string; body?: string; error?: string }

/** An HTTP GET from the router to a node's health-check port (or `port`), as an external load balancer probes. */
export async function probe(tb: Testbed, node: string, port = HC, path = '/'): Promise<Probe> {
  const r = await tb.exec('router', [process.execPath, '-e', PROBE, tb.node(node).fabricIp, String(port), path]);
  return JSON.parse(r.stdout.trim().split('\n').pop() ?? '{}') as Probe;
}

/** The scenario's Service (lb-scenario's) with externalTrafficPolicy Local on health-check port HC. */
export function local(extra: Record<string, unknown> = {}, name = 'db'): Record<string, unknown> {
  const s = service() as { metadata: Record<string, unknown>; spec: Record<string, unknown> };
  return { ...s, metadata: { ...s.metadata, name }, spec: { ...s.spec, externalTrafficPolicy: 'Local', healthCheckNodePort: HC, ...extra } };
}

const LBP = { tether: { labels: { 'tether.dev/role': 'lb' } }, namespace: 'shop' };
const APP = { tether: { labels: { app: 'db' } }, namespace: 'shop' };

/**
 * LB pods on n1, n4 and n5; targets t1, t2 on n4 and t3 on n5; a plain client pod c on n1 (an LB pod but no
 * target), n2 (neither) and n4 (both).
 */
export function colocated(): Topology {
  return {
    nodes: [
      { name: 'n1', pods: [{ name: 'lb', ...LBP }, { name: 'c', namespace: 'shop' }] },
      { name: 'n2', pods: [{ name: 'c', namespace: 'shop' }] },
      { name: 'n4', pods: [{ name: 'lb', ...LBP }, { name: 't1', ...APP }, { name: 't2', ...APP }, { name: 'c', namespace: 'shop' }] },
      { name: 'n5', pods: [{ name: 'lb', ...LBP }, { name: 't3', ...APP }] },
    ],
    tether: true,
    ipam: 'tether-ipam',
    tetherdArgs: ['--lb-export-table', '100'],
    extraObjects: [pool],
  };
}
