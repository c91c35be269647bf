// The rolling scenario shared by the rolling restart and the upgrade test: one testbed holding both the egress
// failover scenario (gateway pods on n1 and n2, the client pod on n3, conntrack sync) and the load balancer
// scenario (LB pods on n1 and n2, targets on n4 and n5, BIRD, Redis), what "a node is ready" means there, and
// one node's turn of a DaemonSet RollingUpdate (SIGTERM, the exit, a new container, ready).
import * as fs from 'node:fs';
import * as path from 'node:path';
import type { Testbed } from './testbed';
import type { Topology } from './topology';
import type { ExitStatus } from './tetherd';
import type { Release } from '../lib/releases';
import { bpfDir } from './cleanup';
import { run } from './proc';
import * as egress from './egress-scenario';
import * as lb from './lb-scenario';
import { until } from '../lib/wait';

/** An upper bound for the traffic runs: they end once the rolling restart is over. */
export const TRAFFIC_MAX_MS = 15 * 60_000;
/** The DaemonSet's terminationGracePeriodSeconds: SIGKILL after it, as kubelet would. */
export const GRACE_MS = 30_000;
/** How long the traffic keeps running after the last node is ready (bytes must keep flowing). */
export const AFTER_MS = 3000;
export const NODES = ['n1', 'n2', 'n3', 'n4', 'n5'];
export const GATEWAYS = ['n1', 'n2'];
export const LB_NODES = ['n1', 'n2'];
/** Where the egress connections' ends live (the client pod, the external server). */
export const EGRESS_HOSTS = ['n3-web', 'server'];
export const TARGETS: Record<string, string[]> = { n4: ['n4-t1', 'n4-t2'], n5: ['n5-t3'] };

/** The egress topology's nodes and objects merged with the load balancer's (same node names). */
export function topology(): Topology {
  const e = egress.topology();
  const l = lb.topology();
  const nodes = l.nodes.map((n) => {
    const en = e.nodes.find((x) => x.name === n.name);
    return { ...n, zone: en?.zone, pods: [...((en?.pods as object[]) ?? []), ...((n.pods as object[]) ?? [])] } as Topology['nodes'][number];
  });
  return { ...l, nodes, extraObjects: [...(e.extraObjects ?? []), ...(l.extraObjects ?? [])] };
}

/** The egress objects plus the Service and its EndpointSlice (lb.configure() would drop the Egress). */
export function configure(tb: Testbed): void {
  const targets = Object.values(TARGETS).flat();
  tb.rewriteConfig({ extraObjects: [...(egress.topology().extraObjects ?? []), lb.pool, lb.service(), lb.slice(tb, targets)] });
}

export const other = (gw: string) => GATEWAYS.find((g) => g !== gw)!;

/** The VIP once it is routed over exactly the LB nodes. */
export async function vipServed(tb: Testbed, timeoutMs = 30_000): Promise<string> {
  const want = LB_NODES.map((n) => tb.node(n).fabricIp).sort().join();
  return until(`VIP announced by exactly ${LB_NODES.join(', ')}`, async () => {
    const st = await lb.lbStatus(tb, LB_NODES[0]).catch(() => undefined);
    return st?.vip && (await lb.routerPaths(tb, st.vip)).join() === want ? st.vip : undefined;
  }, timeoutMs);
}

/** The egress side is whole: one gateway owns the address, the other is Up and in sync, n3 knows the owner. */
export async function egressReady(tb: Testbed): Promise<{ node: string; owner: string; address: string }> {
  const o = await egress.waitOwner(tb, undefined, 30_000);
  await egress.waitStandbyReady(tb, o.node, other(o.node), 30_000);
  await until('n3 knows the owner', async () => (await egress.egressOf(tb, 'n3').catch(() => undefined))?.owner === o.st.owner, 15_000);
  return { node: o.node, owner: o.st.owner, address: o.st.address };
}

/** What the readiness of a node means here: its probe, then the roles the scenario gives it. */
export async function nodeReady(tb: Testbed, node: string, vip: string): Promise<void> {
  await until(`${node} /readyz`, async () => (await tb.exec(node, ['curl', '-sf', '-m', '2', 'http://127.0.0.1:10267/readyz'])).code === 0, 30_000);
  await egressReady(tb);
  await vipServed(tb);
  await until(`${node}'s load balancer roles`, async () => {
    const st = await lb.lbStatus(tb, node).catch(() => undefined);
    // A node with neither an LB pod nor a target of the Service does not hold its VIP (it never asks).
    if (!LB_NODES.includes(node) && !TARGETS[node]) return !!st && st.vip === undefined && /not needed/.test(String((st as { vipHere?: string }).vipHere));
    if (st?.vip !== vip) return false;
    if (LB_NODES.includes(node)) return st.announced && st.localLbPods.includes('shop/lb');
    return (TARGETS[node] ?? []).every((k) => st.localTargets.includes(`shop/${tb.pod(k).name}`));
  }, 30_000);
}

/** Every pinned map of every node: pin path → map id (bpftool), and which pins are not maps. */
export async function pinnedMaps(tb: Testbed): Promise<{ maps: Map<string, number>; others: string[] }> {
  const maps = new Map<string, number>();
  const others: string[] = [];
  const walk = (d: string): string[] => fs.readdirSync(d, { withFileTypes: true }).flatMap((e) => (e.isDirectory() ? walk(path.join(d, e.name)) : [path.join(d, e.name)]));
  for (const pin of walk(bpfDir(tb.prefix))) {
    const r = await run(['bpftool', '-j', 'map', 'show', 'pinned', pin]);
    if (r.code === 0) maps.set(pin, (JSON.parse(r.stdout) as { id: number }).id);
    else others.push(pin);
  }
  return { maps, others };
}

/** TCP segments retransmitted so far in each of these namespaces (their /proc/net/snmp), summed. */
export async function retransmits(tb: Testbed, hosts: string[]): Promise<number> {
  let sum = 0;
  for (const h of hosts) {
    const lines = (await tb.mustExec(h, ['cat', '/proc/net/snmp'])).stdout.split('\n').filter((l) => l.startsWith('Tcp:'));
    const [names, values] = lines.map((l) => l.trim().split(/\s+/));
    sum += Number(values[names.indexOf('RetransSegs')]);
  }
  return sum;
}

export interface Step {
  node: string;
  exit: ExitStatus;
  stopMs: number;
  startMs: number;
  readyMs: number;
  oldContainer?: string;
  newContainer?: string;
  /** Where the node's log stood when SIGTERM was sent. */
  logFrom: number;
  /** When SIGTERM was sent and when the node was ready again (Date.now()). */
  at: number;
  readyAt: number;
}

/** Which part of the roll a moment falls in (where a gap ended). */
export function phaseOf(steps: Step[], t: number | undefined): string {
  if (t === undefined || !steps.length) return 'unknown';
  const s = [...steps].reverse().find((x) => x.at <= t);
  if (!s) return 'before the first restart';
  const which = steps.filter((x) => x.node === s.node).length > 1 ? ` (turn ${steps.indexOf(s) + 1} of ${steps.length})` : '';
  return t <= s.readyAt ? `while ${s.node} restarted${which}, ${t - s.at} ms after its SIGTERM` : `after ${s.node} was ready${which}`;
}

/**
 * One node's turn: SIGTERM, wait for the exit (SIGKILL after the grace period), a new container (of `release`
 * when given: its image, its CNI executables), ready.
 */
export async function restartNode(tb: Testbed, node: string, vip: string, release?: Release): Promise<Step> {
  const d = tb.tetherd(node);
  const logFrom = fs.statSync(tb.tetherdLog(node)).size;
  const oldContainer = d.container?.id;
  const t0 = Date.now();
  const exit = await d.kill('SIGTERM', GRACE_MS);
  const t1 = Date.now();
  if (release) tb.setRelease(node, release);
  await d.start();
  const t2 = Date.now();
  await tb.syncBlockRoutes();
  await nodeReady(tb, node, vip);
  const t3 = Date.now();
  const step: Step = { node, exit, stopMs: t1 - t0, startMs: t2 - t1, readyMs: t3 - t2, oldContainer, newContainer: d.container?.id, logFrom, at: t0, readyAt: t3 };
  process.stdout.write(`  ${node}${release ? ` → ${release.name}` : ''}: exit ${JSON.stringify(exit)} after ${step.stopMs} ms, new container answered ping after ${step.startMs} ms, ready ${step.readyMs} ms later\n`);
  return step;
}
