// The egress failover scenario on the testbed, shared by its tests and the demo: 3 nodes, gateway pods
// gw1 (n1) and gw2 (n2), a client pod on n3, an Egress over one floating address, an echo server outside
// that records sources, and long-lived traffic from the client pod while something happens.
import type { ChildProcess } from 'node:child_process';
import type { Testbed } from './testbed';
import type { Topology } from './topology';
import { ECHO_SERVER, TRAFFIC_CLIENT, type TrafficReport } from '../lib/traffic';
import type { IpFamily } from '../../lib/ip';

export const FLOAT_POOL = '198.18.0.200/29';
/** The IPv6 floating addresses, on the fabric's IPv6 prefix as the IPv4 ones are on its IPv4 subnet. */
export const FLOAT_POOL6 = 'fd00:18::200/125';
export const PORT = 9000;

const familyOf = (address: string): IpFamily => (address.includes(':') ? 6 : 4);

/** The scenario's objects (topology's extraObjects) with the Egress asking for `count` addresses of each family. */
export function objectsWithCount(families: IpFamily[], underlay: IpFamily, count: number): Record<string, unknown>[] {
  return topology([], families, underlay).extraObjects!.map((o) => (o.kind === 'Egress' ? { ...o, spec: { ...(o.spec as Record<string, unknown>), addresses: { pool: 'float', count } } } : o));
}

/**
 * The scenario's testbed. families [4, 6]: pods dual-stack (the nodes still talk IPv4), the pool dual-stack,
 * and the Egress steering both families, one address each: IPv4 to the external hosts' IPv4 range and IPv6
 * to theirs (fd00:19::/32), the fabric excluded in both. underlay 6: the nodes talk IPv6 (topology.underlay).
 */
export function topology(extraArgs: string[] = [], families: IpFamily[] = [4], underlay: IpFamily = 4): Topology {
  const v6 = families.includes(6);
  const v4 = families.includes(4);
  return {
    ...(v6 ? { families } : {}),
    ...(underlay === 6 ? { underlay } : {}),
    nodes: [
      { name: 'n1', zone: 'a', pods: [{ name: 'gw1', namespace: 'shop', tether: { labels: { role: 'egress-gw' } } }] },
      { name: 'n2', zone: 'b', pods: [{ name: 'gw2', namespace: 'shop', tether: { labels: { role: 'egress-gw' } } }] },
      // IPv6-only pods are steered in outer IPv6 (their gateways have no IPv4): 48 bytes, not 28.
      { name: 'n3', zone: 'c', pods: [{ name: 'web', namespace: 'shop', tether: { labels: { app: 'web' }, encapOverhead: v4 ? 28 : 48 } }] },
    ],
    tether: true,
    ipam: 'tether-ipam',
    tetherdArgs: extraArgs,
    extraObjects: [
      { apiVersion: 'tether.dev/v1alpha1', kind: 'AddressPool', metadata: { name: 'float' }, spec: { usage: 'floating', ...(v4 ? { ipv4: { cidr: FLOAT_POOL } } : {}), ...(v6 ? { ipv6: { cidr: FLOAT_POOL6 } } : {}) } },
      {
        apiVersion: 'tether.dev/v1alpha1',
        kind: 'Egress',
        metadata: { name: 'out', namespace: 'shop' },
        spec: {
          clients: { podSelector: { matchLabels: { app: 'web' } } },
          gateways: { podSelector: { matchLabels: { role: 'egress-gw' } } },
          ...(v6 ? { ipFamilies: families.map((f) => `IPv${f}`) } : {}),
          destinations: [...(v4 ? ['198.19.0.0/16'] : []), ...(v6 ? ['fd00:19::/32'] : [])],
          excludeDestinations: [...(v4 ? ['198.18.0.0/24'] : []), ...(v6 ? ['fd00:18::/64'] : [])],
          addresses: { pool: 'float', count: 1 },
        },
      },
    ],
  };
}

export interface EgressStatus {
  address: string;
  owner: string;
  epoch: number;
  /** The owner pod's node. */
  ownerNode?: string;
  ownedHere: boolean;
  /** The store holds this node's view (false while it is unreachable and a decision waits to be written). */
  recorded?: boolean;
  storeReachable?: boolean;
  lastTakeover?: { cause: string; ms: number; from?: string; epoch?: number };
}

/** A node's view of the Egress's address (of `family` when given; the first one otherwise). */
export async function egressOf(tb: Testbed, node: string, family?: IpFamily): Promise<EgressStatus | undefined> {
  const all = ((await tb.status(node)) as unknown as { egress: EgressStatus[] }).egress;
  return family ? all.find((e) => familyOf(e.address) === family) : all[0];
}

/** Waits until a gateway node holds the address (its own gwN pod unless anyPod: replacement pods count). */
export async function waitOwner(tb: Testbed, notPod?: string, timeoutMs = 8000, anyPod = false, family?: IpFamily): Promise<{ node: string; st: EgressStatus }> {
  const end = Date.now() + timeoutMs;
  for (;;) {
    for (const node of ['n1', 'n2']) {
      const st = await egressOf(tb, node, family).catch(() => undefined);
      // The owner's own node must agree it holds the address (gw1 lives on n1, gw2 on n2).
      const mine = anyPod ? st?.owner.startsWith(`shop/gw${node.slice(1)}`) : st?.owner === `shop/gw${node.slice(1)}`;
      if (st?.ownedHere && mine && st.owner !== notPod) return { node, st };
    }
    if (Date.now() > end) throw new Error(`no gateway owns the floating address after ${timeoutMs} ms`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

/**
 * Waits until the standby is ready to take over: the owner reports it Up and in sync (unless inSync is
 * false: conntrack sync disabled), and the standby sees the owner's node Up (BFD) among its candidates.
 * With `pod`, that gateway pod of the standby node must be among the owner's candidates.
 */
export async function waitStandbyReady(tb: Testbed, ownerNode: string, standby: string, timeoutMs = 20_000, inSync = true, pod?: string, family?: IpFamily): Promise<void> {
  type View = { egress: Array<{ address: string; candidates: Array<{ pod: string; node: string; bfd: string; inSync: boolean }> }> };
  const entry = (v: View | undefined) => (family ? v?.egress.find((e) => familyOf(e.address) === family) : v?.egress[0]);
  const end = Date.now() + timeoutMs;
  for (;;) {
    const o = (await tb.status(ownerNode).catch(() => undefined)) as unknown as View | undefined;
    const s = (await tb.status(standby).catch(() => undefined)) as unknown as View | undefined;
    const ownerSees = entry(o)?.candidates.some((c) => c.node === standby && (!pod || c.pod === pod) && c.bfd === 'Up' && (c.inSync || !inSync));
    const standbySees = entry(s)?.candidates.some((c) => c.node === ownerNode && c.bfd === 'Up');
    if (ownerSees && standbySees) return;
    if (Date.now() > end) {
      const view = (v: View | undefined) => JSON.stringify(entry(v)?.candidates.map((c) => `${c.pod}@${c.node}:${c.bfd}${c.inSync ? '+sync' : ''}`) ?? 'no answer');
      throw new Error(`${standby} is not ready to take over from ${ownerNode}: owner sees it ${ownerSees ? 'Up and in sync' : 'not Up or not in sync'}, it sees the owner ${standbySees ? 'Up' : 'not Up'} (owner's candidates ${view(o)}; standby's ${view(s)})`);
    }
    await new Promise((r) => setTimeout(r, 200));
  }
}

/**
 * Waits until the client node steers to an owner whose gateway already holds the address (the owner's node
 * reports ownedHere for the same owner and epoch): a SYN sent earlier is dropped and waits out TCP's 1 s
 * initial retransmission timeout. Until the client node knows an owner, its steering drops the Egress's
 * packets (never out un-NATed). And knowing is not enough: a first owner is recorded in the store (its
 * compare-and-set) before its node takes the address, so client nodes learn it from the store ~60 ms
 * before the gateway pod has its SNAT rule, and what they steer meanwhile is dropped in the pod (the
 * unnated chain; seen on the testbed: 30 SYNs in a 55 ms window, each connection 1 s late).
 */
export async function waitClientSteered(tb: Testbed, client = 'n3', timeoutMs = 20_000, family?: IpFamily): Promise<EgressStatus> {
  const end = Date.now() + timeoutMs;
  for (;;) {
    const c = await egressOf(tb, client, family).catch(() => undefined);
    const o = c?.owner && c.ownerNode ? await egressOf(tb, c.ownerNode, family).catch(() => undefined) : undefined;
    if (c?.owner && o?.ownedHere && o.owner === c.owner && o.epoch === c.epoch) return c;
    if (Date.now() > end) {
      throw new Error(`the client node ${client} does not steer to an owner holding the address after ${timeoutMs} ms: it knows ${c?.owner ? `${c.owner} (epoch ${c.epoch}) on ${c.ownerNode}` : 'no owner'}; that node ${o ? (o.ownedHere ? `holds it for ${o.owner} (epoch ${o.epoch})` : `does not hold it (it knows ${o.owner}, epoch ${o.epoch})`) : 'did not answer'}`);
    }
    await new Promise((r) => setTimeout(r, 50));
  }
}

/** Everything a child prints (stdout and stderr), once it exits. */
export function collect(child: ChildProcess): Promise<string> {
  return new Promise((resolve) => {
    let out = '';
    child.stdout?.on('data', (b: Buffer) => (out += b.toString()));
    child.stderr?.on('data', (b: Buffer) => (out += b.toString()));
    child.on('exit', () => resolve(out));
  });
}

/** The echo server on the external server host (port PORT unless given); stop() returns the peers it saw. */
export async function startServer(tb: Testbed, port = PORT): Promise<{ stop: () => Promise<string[]> }> {
  const child = tb.spawn('server', [process.execPath, '-e', ECHO_SERVER, String(port)]);
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

/**
 * Long-lived connections (and a UDP stream) from the client pod n3-web to the server through the Egress
 * while `during` runs; with endWhenDone, durationMs is an upper bound and the run ends when `during` does.
 */
export async function runTraffic(tb: Testbed, conns: number, durationMs: number, during: () => Promise<void>, opts: { endWhenDone?: boolean; family?: IpFamily } = {}): Promise<{ report: TrafficReport; peers: string[] }> {
  const { reports, peers } = await runTrafficIn(tb, [opts.family ?? 4], conns, durationMs, during, opts);
  return { report: reports[0], peers };
}

/**
 * The same with one client per family at once (conns connections each, to the server's address of that
 * family); the reports in the order of `families`, and every peer the server saw.
 */
export async function runTrafficIn(tb: Testbed, families: IpFamily[], conns: number, durationMs: number, during: () => Promise<void>, opts: { endWhenDone?: boolean } = {}): Promise<{ reports: TrafficReport[]; peers: string[] }> {
  for (const f of families) await waitClientSteered(tb, 'n3', 20_000, tb.hasFamily(6) ? f : undefined);
  const server = await startServer(tb);
  const clients = families.map((f) => tb.spawn('n3-web', [process.execPath, '-e', TRAFFIC_CLIENT, f === 6 ? tb.externalIp6('server') : tb.externalIp('server'), String(PORT), String(conns), String(durationMs), '50', '1']));
  const outs = clients.map(collect);
  // The mark (SIGUSR2) must not reach a client before its handler: the default action would kill it.
  await Promise.all(clients.map((client) => new Promise<void>((resolve, reject) => {
    client.stdout?.on('data', (b: Buffer) => b.toString().includes('ready') && resolve());
    client.once('exit', () => reject(new Error('traffic client exited before it was ready')));
  })));
  await new Promise((r) => setTimeout(r, Math.min(3000, durationMs / 3)));
  // Gaps that end from here on are the event's (report.maxGapAfterMarkMs); set-up stalls are not.
  for (const client of clients) client.kill('SIGUSR2');
  await during();
  if (opts.endWhenDone) for (const client of clients) client.kill('SIGINT');
  const texts = await Promise.all(outs);
  const peers = await server.stop();
  const reports = texts.map((text) => {
    const line = text.split('\n').find((l) => l.startsWith('{'));
    if (!line) throw new Error(`traffic client printed no report: ${text.slice(0, 500)}`);
    return JSON.parse(line) as TrafficReport;
  });
  return { reports, peers };
}

