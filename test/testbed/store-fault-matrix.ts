// The store-fault matrix (issue 20): each fault of the cluster store crossed with each event that needs
// or touches the store, every cell checked against the invariants, not for survival:
// - at no moment do two nodes hold one floating address (on a gateway pod, in a SNAT rule, or announced),
//   sampled from every node's kernel every 100 ms (floating-sampler.ts), in both families on a dual-stack testbed;
// - no address or block is given to two owners: at the end, after the store is back, the store and every
//   node agree — each floating and LB address has one owner in the store and at most one holder (and
//   asking the store for it on behalf of someone else is refused), each pod block belongs to one node and
//   the store says so, no two pods share an address;
// - no move from a live owner: owner and epoch of every address whose owner lives are the same after the
//   cell, and no sample showed it held anywhere else;
// - established connections kept: long-lived TCP connections through the Egress (and through the VIP in
//   the LB columns) across the whole cell; the expectation per cell is in EVENTS (100 % in every cell);
// - a VIP keeps serving when its only LB node is lost during the fault: another node's new LB pod takes it
//   over and new connections through it succeed while the store is still away.
// In dual-stack (families [4, 6]) the Egress and the Service are dual-stack too: every cell runs IPv6 Egress
// connections beside the IPv4 ones, the LB cells IPv6 connections through the Service's IPv6 VIP beside
// those through its IPv4 VIP, and the checks above on the IPv6 VIP are those on the IPv4 one.
// One testbed per fault row (tetherd in the DaemonSet's container when TETHER_TESTBED_CONTAINERS=1), cells
// one after another on it, each starting from a settled state; a cell that leaves the testbed unsettled
// (e.g. an address owned twice) makes the row continue on a fresh testbed, so one defect is not counted
// again in the cells after it.
import * as fs from 'node:fs';
import { call } from '../../lib/api/client';
import { startServer, FLOAT_POOL, PORT } from './egress-scenario';
import { egress, pool as floatPool } from './egress-multi-scenario';
import { lbStatus, pool as lbPool, routerPaths, service, slice, startBgp, startTargets, type LbStatus, type Servers } from './lb-scenario';
import { FloatingSampler } from './floating-sampler';
import { withTestbed, type Testbed } from './testbed';
import { inCidr, type Topology } from './topology';
import { FLOAT_POOL6 } from './egress-scenario';
import type { IpFamily } from '../../lib/ip';
import { TRAFFIC_CLIENT, type TrafficReport } from '../lib/traffic';

export type FaultId = 'down' | 'paused' | 'empty' | 'sentinel' | 'cut' | 'none';
export type EventId = 'block' | 'join' | 'address' | 'lbpod' | 'podkill' | 'nodelost' | 'lblost';

export const FAULTS: Array<{ id: FaultId; label: string; what: string; control?: boolean }> = [
  { id: 'down', label: 'down', what: 'Redis is SIGKILLed (after a SAVE: a store with durable storage crashing) for the cell and started again with its data' },
  { id: 'paused', label: 'paused (SIGSTOP)', what: 'Redis is SIGSTOPped: connections stay open and nothing is answered, until SIGCONT' },
  { id: 'empty', label: 'restarted empty', what: 'Redis is SIGKILLed without its data and started again empty 1.5 s into the event; the check waits out the hold-off' },
  { id: 'sentinel', label: 'Sentinel failover', what: 'the replica lags (SIGSTOPped) while the event writes, then the primary is SIGKILLed and Sentinel promotes the replica (which lacks those writes)' },
  { id: 'cut', label: 'one node cut off', what: "one node's path to Redis stops moving (a partition: its connections hang, new ones wait) while the other nodes still reach the store" },
  // Not in the suite's run (STORE_MATRIX_FAULTS=none runs it): the same cells with a healthy store, to tell
  // a defect of the store's handling from one of the event itself or of the harness.
  { id: 'none', label: 'no fault (control)', what: 'the store stays healthy', control: true },
];

export const EVENTS: Array<{ id: EventId; label: string; kept: string }> = [
  { id: 'join', label: 'gateway pod joins', kept: '100 %: a live owner is never moved; the newcomer only becomes a standby' },
  { id: 'block', label: 'new pod, new block', kept: '100 %: egress flows do not touch pod IPAM' },
  { id: 'address', label: 'Egress address added', kept: '100 %: adding an address moves no flow' },
  { id: 'lbpod', label: 'LB pod added', kept: '100 % (Egress and VIP): a new LB pod serves only with the mappings (or Maglev picks the same target)' },
  { id: 'podkill', label: 'owner pod killed', kept: '100 %: the standbys were in sync before the fault, and a takeover needs no store' },
  { id: 'nodelost', label: 'owner node lost', kept: '100 %: the standbys were in sync before the fault, and a takeover needs no store' },
  {
    id: 'lblost',
    label: 'only LB node lost',
    kept: '100 % (Egress and VIP), and new VIP connections succeed before the store is back: the replacement LB pod\'s node learns the VIP from the Service\'s record (status), not the store, and Maglev picks the targets the lost node picked',
  },
];

/** Which node the 'cut' fault cuts off, per event. */
export const CUT_NODE: Record<EventId, string> = {
  join: "the address's owner, which must learn the newcomer without the store",
  block: 'n4, the node adding the pod',
  address: 'a gateway node holding no address (the likely new owner), else the owner',
  lbpod: 'n4, the node of the new LB pod',
  podkill: "the owner's node",
  nodelost: 'the gateway node that takes over when it is the only one left, else the client node n5',
  lblost: 'n2, the node of the replacement LB pod (it must learn the VIP without the store)',
};

export const CONNS = Number(process.env.STORE_MATRIX_CONNS ?? 20);
/** The fault lasts at least this long after the event starts (a joining gateway's BFD start-up grace is 3 s). */
// lblost: long enough for the takeover (BGP hold 3 s, the new LB pod's VIP and its 3 s wait for mappings) and
// new connections, all before the store is back.
const HOLD_MS: Record<EventId, number> = { join: 4500, block: 3000, address: 3000, lbpod: 3000, podkill: 3000, nodelost: 3000, lblost: 20_000 };
/** An event that has not finished by then is waited for only after the fault heals. */
const EVENT_CAP_MS = 12_000;
const SETTLE_MS = 20_000;
/** The store's hold-off after an empty restart is ~12 s: recovery may take that long. */
const RECOVER_MS: Record<FaultId, number> = { down: 12_000, paused: 12_000, empty: 18_000, sentinel: 15_000, cut: 12_000, none: 12_000 };
const PROBE_OWNER = 'matrix/probe';
const EGRESS = 'shop/out';
const LB_OWNER = 'lb/shop/db';
/** The allocation owner of the Service's IPv6 VIP (daemon/lb/lb-spec.ts familyKey). */
const LB_OWNER6 = 'lb/shop/db#IPv6';
/** The LB pool's IPv6 subnet in dual-stack (as lb-dualstack.test.ts). */
const LB_POOL6 = 'fd00:5100::/124';
const NODES = ['n1', 'n2', 'n3', 'n4', 'n5'];
const CLIENT_NODE = 'n5';
/** Where the gateway pod joins (a node with a block already, see topology()). */
const JOIN_NODE = 'n2';
const TARGETS = ['n5-t1', 'n5-t2'];
/** The only LB node (its LB pod is in the topology) and where its replacement goes: a node with a block, so the ADD needs no store. */
const LB_NODE = 'n3';
const TAKEOVER_NODE = 'n2';
/** New connections opened through the VIP after the takeover, during the fault. */
const FRESH_CONNS = 5;

const GW = (name: string) => ({ name, namespace: 'shop', tether: { labels: { role: 'egress-gw' } } });
const LB = (name: string) => ({ name, namespace: 'shop', tether: { labels: { 'tether.dev/role': 'lb' } } });

/**
 * The matrix's objects in the pods' families: in dual-stack the floating pool and the Egress are dual-stack
 * too (one address of each family per count), so every Egress event moves IPv6 addresses as well.
 */
function egressObjects(families: IpFamily[], count: number): Record<string, unknown>[] {
  if (!families.includes(6)) return [floatPool, egress({ addresses: { pool: 'float', count } })];
  const pool = { ...floatPool, spec: { ...(floatPool.spec as Record<string, unknown>), ipv6: { cidr: FLOAT_POOL6 } } };
  return [pool, egress({ ipFamilies: ['IPv4', 'IPv6'], destinations: ['198.19.0.0/16', 'fd00:19::/32'], excludeDestinations: ['198.18.0.0/24', 'fd00:18::/64'], addresses: { pool: 'float', count } })];
}

/** In dual-stack the LB pool has an IPv6 subnet too, and the Service asks for a VIP of each family. */
function lbPoolFor(families: IpFamily[]): Record<string, unknown> {
  if (!families.includes(6)) return lbPool;
  return { ...lbPool, spec: { ...(lbPool.spec as Record<string, unknown>), ipv6: { cidr: LB_POOL6 } } };
}

export function topology(fault: FaultId, families: IpFamily[] = [4]): Topology {
  return {
    ...(families.includes(6) ? { families } : {}),
    nodes: [
      // The owner starts alone: a gateway that joins finds no in-sync standby whose heartbeats hold others back.
      { name: 'n1', pods: [GW('gw1')] },
      // A plain pod, so n2 has a block and the gateway joining there needs no new one under the fault.
      { name: 'n2', pods: ['p1'] },
      { name: 'n3', pods: [LB('lb')] },
      // Nothing: its first pod needs a new block.
      { name: 'n4', pods: [] },
      {
        name: 'n5',
        pods: [
          { name: 'web', namespace: 'shop', tether: { labels: { app: 'web' }, encapOverhead: 28 } },
          ...['t1', 't2'].map((name) => ({ name, namespace: 'shop', tether: { labels: { app: 'db' } } })),
        ],
      },
    ],
    tether: true,
    ipam: 'tether-ipam',
    tetherdArgs: ['--lb-export-table', '100'],
    extraObjects: [...egressObjects(families, 1), lbPoolFor(families)],
    ...(fault === 'sentinel' ? { redis: 'sentinel' as const } : {}),
  };
}

export interface CellResult {
  fault: FaultId;
  event: EventId;
  pass: boolean;
  /** Short text for the matrix. */
  cell: string;
  /** The key measurement, in words. */
  measured: string;
  failures: string[];
  notes: string[];
  ms: number;
}

interface Row {
  fault: FaultId;
  tb: Testbed;
  sampler: FloatingSampler;
  targets: Servers;
  bgp: { stop: () => Promise<void> };
  vip: string;
  /** Dual-stack: the Service's IPv6 VIP and the target servers behind it. */
  vip6?: string;
  targets6?: Servers;
  egressCount: number;
  gateways: string[];
  lbNodes: string[];
  lost: Set<string>;
  gone: Set<string>;
  /** Sentinel: the killed primary's port, revived before the next cell. */
  dead?: number;
  /** Until when a cell's event may retry what the fault refused (the heal plus the fault's recovery time). */
  retryUntil: number;
}

interface Owned {
  owner: string;
  ownerNode: string;
  epoch: number;
}

type AddrView = {
  egress: string;
  address: string;
  owner: string;
  ownerNode?: string;
  epoch: number;
  ownedHere: boolean;
  recorded?: boolean;
  storeReachable?: boolean;
  candidates?: Array<{ pod: string; node: string; bfd: string; inSync: boolean }>;
};

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));
const short = (a: string) => a.replace(/^198\.18\.0\./, '.');

// ---- the row's testbed ---------------------------------------------------------------------------------

function writeConfig(row: Row): void {
  if (row.tb.hasFamily(6)) return writeConfigDual(row);
  // Once allocated, the VIP is in the Service's status, as the controllers' status controller records it in a
  // cluster: what a node that newly needs the VIP reads when the store is away.
  const svc = row.vip ? { ...service(), status: { loadBalancer: { ingress: [{ ip: row.vip, ipMode: 'Proxy' }] } } } : service();
  row.tb.rewriteConfig({ extraObjects: [...egressObjects(row.tb.hasFamily(6) ? [4, 6] : [4], row.egressCount), lbPool, svc, slice(row.tb, TARGETS)] });
}

/**
 * Dual-stack: a RequireDualStack Service over the dual-stack LB pool, an EndpointSlice per family, and in its
 * status each VIP once allocated (a node that newly needs the IPv6 VIP under the fault reads it there too).
 */
function writeConfigDual(row: Row): void {
  const ingress = [row.vip, row.vip6].filter((ip): ip is string => Boolean(ip)).map((ip) => ({ ip, ipMode: 'Proxy' }));
  const dual = service(undefined, { ipFamilyPolicy: 'RequireDualStack', ipFamilies: ['IPv4', 'IPv6'] });
  const svc = ingress.length ? { ...dual, status: { loadBalancer: { ingress } } } : dual;
  row.tb.rewriteConfig({ extraObjects: [...egressObjects([4, 6], row.egressCount), lbPoolFor([4, 6]), svc, slice(row.tb, TARGETS, [], 4), slice(row.tb, TARGETS, [], 6)] });
}

/** The nodes' addresses the router should spread the VIP of `family` over: the live LB nodes'. */
function lbPathsWanted(row: Row, family: IpFamily): string {
  return row.lbNodes.filter((n) => !row.lost.has(n)).map((n) => (family === 4 ? row.tb.node(n).fabricIp : row.tb.node(n).fabricIp6!)).sort().join();
}

async function prepareRow(tb: Testbed, fault: FaultId): Promise<Row> {
  const row = { fault, tb, egressCount: 1, gateways: ['n1-gw1'], lbNodes: ['n3'], lost: new Set<string>(), gone: new Set<string>(), retryUntil: 0 } as Row;
  writeConfig(row);
  // Dual-stack: IPv6 BGP sessions beside the IPv4 ones, so the router learns the IPv6 VIP's paths.
  row.bgp = tb.hasFamily(6) ? await startBgp(tb, ['n2', 'n3', 'n4'], { ipv6: true }) : await startBgp(tb, ['n2', 'n3', 'n4']);
  try {
    row.vip = await waitFor('the VIP', async () => (await lbStatus(tb, 'n3'))?.vip, 20_000);
    if (tb.hasFamily(6)) row.vip6 = await waitFor('the IPv6 VIP', async () => (await lbStatus(tb, 'n3', 6))?.vip, 20_000);
    writeConfig(row);
    row.targets = await startTargets(tb, TARGETS, row.vip);
    if (row.vip6) row.targets6 = await startTargets(tb, TARGETS, row.vip6);
    // Dual-stack: the IPv6 floating addresses are sampled from the kernel too (lo, ip6 SNAT, proxy NDP and /128).
    row.sampler = new FloatingSampler(tb, FLOAT_POOL, NODES, undefined, tb.hasFamily(6) ? FLOAT_POOL6 : undefined);
    row.sampler.start();
    for (const g of row.gateways) await row.sampler.addGateway(g);
  } catch (e) {
    await closeRow(row);
    throw e;
  }
  return row;
}

async function closeRow(row: Row): Promise<void> {
  await row.sampler?.stop().catch(() => undefined);
  await row.targets?.stop().catch(() => undefined);
  await row.targets6?.stop().catch(() => undefined);
  await row.bgp?.stop().catch(() => undefined);
}

async function waitFor<T>(what: string, fn: () => Promise<T | undefined | false>, timeoutMs: number): Promise<T> {
  const end = Date.now() + timeoutMs;
  let last = '';
  for (;;) {
    try {
      const v = await fn();
      if (v) return v;
    } catch (e) {
      last = (e as Error).message;
    }
    if (Date.now() > end) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}${last ? ` (${last})` : ''}`);
    await sleep(150);
  }
}

const liveNodes = (row: Row) => NODES.filter((n) => !row.lost.has(n));

async function views(row: Row): Promise<Map<string, AddrView[]>> {
  const out = new Map<string, AddrView[]>();
  await Promise.all(liveNodes(row).map(async (n) => {
    const st = (await row.tb.status(n).catch(() => undefined)) as unknown as { egress?: AddrView[] } | undefined;
    if (st) out.set(n, (st.egress ?? []).filter((a) => a.egress === EGRESS));
  }));
  return out;
}

/** A hash of the store, from the single Redis or the Sentinel set's current primary. */
async function storeHash(row: Row, key: string): Promise<Record<string, string>> {
  const { tb } = row;
  if (row.fault !== 'sentinel') return tb.withRedisClient((r) => r.hgetall(key));
  const lines = tb.sentinel.cli(tb.sentinel.master().port, 'hgetall', key).split('\n');
  const out: Record<string, string> = {};
  for (let i = 0; i + 1 < lines.length; i += 2) if (lines[i]) out[lines[i]] = lines[i + 1];
  return out;
}

/**
 * The settled state: every address of the Egress owned once, every node agreeing (owner, epoch), the owner
 * seeing every other live candidate Up and in sync and its decision recorded in the store, the kernel
 * holding each address on its owner's node only, and the VIP routed over exactly the LB nodes. Returns
 * the owners, or why it is not settled (`timeoutMs` to wait for it).
 */
async function settle(row: Row, timeoutMs: number): Promise<{ owners?: Map<string, Owned>; why: string }> {
  const { tb } = row;
  const end = Date.now() + timeoutMs;
  for (;;) {
    const r = await (async (): Promise<{ owners?: Map<string, Owned>; why: string }> => {
      const no = (why: string) => ({ why });
      const v = await views(row);
      const agreed = new Map<string, Owned>();
      for (const [node, list] of v) {
        const seen = new Set<string>();
        for (const a of list) {
          if (seen.has(a.address)) return no(`${node} reports ${a.address} for two slots`);
          seen.add(a.address);
          if (!a.owner) return no(`${node} knows no owner of ${a.address}`);
          const o = agreed.get(a.address);
          if (o && (o.owner !== a.owner || o.epoch !== a.epoch)) return no(`${a.address}: ${node} says ${a.owner} e${a.epoch}, another node ${o.owner} e${o.epoch}`);
          agreed.set(a.address, { owner: a.owner, ownerNode: a.ownerNode ?? '', epoch: a.epoch });
          if (a.storeReachable === false) return no(`${node} does not reach the store`);
        }
      }
      // A count is per family: a dual-stack Egress holds one address of each family per count.
      const asked = row.egressCount * (row.tb.hasFamily(6) ? 2 : 1);
      if (agreed.size !== asked) return no(`${agreed.size} addresses owned of ${asked}`);
      const client = v.get(CLIENT_NODE) ?? [];
      for (const [a, o] of agreed) {
        if (!client.some((x) => x.address === a && x.owner === o.owner)) return no(`the client node does not know ${a}'s owner`);
        const own = v.get(o.ownerNode)?.find((x) => x.address === a);
        if (!own?.ownedHere) return no(`${o.ownerNode} does not hold ${a} it owns`);
        if (!own.recorded) return no(`${a}: ${o.owner} e${o.epoch} not recorded yet`);
        for (const c of own.candidates ?? []) {
          if (c.node === o.ownerNode || row.lost.has(c.node) || row.gone.has(`${c.node}-${c.pod.split('/')[1]}`)) continue;
          if (c.bfd !== 'Up' || !c.inSync) return no(`${a}: standby ${c.pod} on ${c.node} is ${c.bfd}${c.inSync ? '' : ', not in sync'}`);
        }
        const rec = await storeHash(row, `${tb.redisPrefix}egress:${EGRESS}:owner:${a}`);
        if (rec.owner !== o.owner || Number(rec.epoch) !== o.epoch) return no(`${a}: the store records ${rec.owner || 'nobody'} e${rec.epoch ?? 0}, the nodes ${o.owner} e${o.epoch}`);
      }
      row.sampler.sample();
      const held = row.sampler.latest();
      for (const [a, nodes] of held) {
        const o = agreed.get(a);
        if (!o) return no(`${a} is held on ${nodes.join('+')} but nobody owns it`);
        if (nodes.length !== 1 || nodes[0] !== o.ownerNode) return no(`${a} is held on ${nodes.map((n) => `${n} (${row.sampler.describe(n, a)})`).join(' and ')}, owned on ${o.ownerNode}`);
      }
      // The sampler reads the kernel's state of both families when the testbed has IPv6 (covers): every
      // owned address is in its owner's kernel, whatever its family.
      for (const [a, o] of agreed) if (!held.has(a) && row.sampler.covers(a)) return no(`${a} is not in ${o.ownerNode}'s kernel`);
      const want = row.lbNodes.filter((n) => !row.lost.has(n)).map((n) => tb.node(n).fabricIp).sort().join();
      const paths = (await routerPaths(tb, row.vip)).join();
      if (paths !== want) return no(`the VIP is routed over ${paths || 'nothing'}, not ${want}`);
      if (row.vip6) {
        const want6 = lbPathsWanted(row, 6);
        const paths6 = (await routerPaths(tb, row.vip6)).join();
        if (paths6 !== want6) return no(`the IPv6 VIP is routed over ${paths6 || 'nothing'}, not ${want6}`);
      }
      return { owners: agreed, why: '' };
    })().catch((e) => ({ why: `status: ${(e as Error).message}` }) as { owners?: Map<string, Owned>; why: string });
    if (r.owners || Date.now() > end) return r;
    await sleep(200);
  }
}

// ---- traffic ---------------------------------------------------------------------------------------------

interface Flows {
  mark(): void;
  stop(): Promise<TrafficReport>;
}

/** Long-lived connections from a namespace to host:PORT until stop() (SIGINT ends the client's run). */
async function flows(tb: Testbed, from: string, host: string, conns: number): Promise<Flows> {
  const child = tb.spawn(from, [process.execPath, '-e', TRAFFIC_CLIENT, host, String(PORT), String(conns), '300000', '50', '0']);
  let out = '';
  child.stdout?.on('data', (b: Buffer) => (out += b.toString()));
  const exited = new Promise<void>((r) => child.once('exit', () => r()));
  await waitFor(`traffic client in ${from}`, async () => out.includes('ready'), 10_000);
  return {
    mark: () => child.kill('SIGUSR2'),
    async stop() {
      child.kill('SIGINT');
      await exited;
      const line = out.split('\n').find((l) => l.startsWith('{'));
      if (!line) throw new Error(`traffic client in ${from} printed no report: ${out.slice(0, 300)}`);
      return JSON.parse(line) as TrafficReport;
    },
  };
}

// ---- faults ----------------------------------------------------------------------------------------------

interface FaultRun {
  notes: string[];
  /** After the event started; resolves when the fault is fully in place (Sentinel: the failover done). */
  during(evStart: number, event: Promise<unknown>): Promise<void>;
  heal(): Promise<void>;
}

function startFault(row: Row, cutNode: string): Promise<FaultRun> {
  const { tb } = row;
  const notes: string[] = [];
  const fault = row.fault;
  return (async (): Promise<FaultRun> => {
    switch (fault) {
      case 'down':
        await tb.killRedis({ keepData: true });
        return { notes, during: async () => undefined, heal: () => tb.restartRedis() };
      case 'paused':
        tb.pauseRedis();
        return { notes, during: async () => undefined, heal: async () => tb.resumeRedis() };
      case 'empty': {
        await tb.killRedis();
        let restarted: Promise<void> | undefined;
        const restart = () => (restarted ??= tb.restartRedis());
        return {
          notes,
          during: async (evStart) => {
            await sleep(Math.max(0, evStart + 1500 - Date.now()));
            await restart();
          },
          heal: () => restart(),
        };
      }
      case 'sentinel': {
        tb.sentinel.pauseReplica();
        return {
          notes,
          during: async (evStart, event) => {
            // The event's writes land on the primary only; then the primary dies and the lagging replica wins.
            await Promise.race([event, sleep(Math.max(0, evStart + 1500 - Date.now()))]);
            await sleep(200);
            const old = tb.sentinel.killPrimary();
            tb.sentinel.resumeReplica();
            row.dead = old;
            const f = await tb.sentinel.waitFailover(old);
            notes.push(`promoted in ${f.ms} ms`);
          },
          heal: async () => tb.sentinel.resumeReplica(),
        };
      }
      case 'none':
        return { notes, during: async () => undefined, heal: async () => undefined };
      case 'cut':
        tb.cutStore(cutNode);
        notes.push(`${cutNode} cut off`);
        return { notes, during: async () => undefined, heal: async () => tb.healStore(cutNode) };
    }
  })();
}

// ---- events ----------------------------------------------------------------------------------------------

interface EventRun {
  /** Runs under the fault; resolves with a note (never rejects: an ADD refused under the fault is a result). */
  run(): Promise<string>;
  /** After the fault healed: what the event still needs (a refused ADD retried), its own checks, a measurement. */
  after(failures: string[]): Promise<string>;
  /** Addresses whose owner the event removes (their move is expected). */
  ownerDies: Set<string>;
  at?: number;
}

/**
 * After the fault: the ADD again every second until it works or `deadline` passes, as a runtime retries a
 * failed sandbox (after an empty restart new blocks wait out the store's hold-off). The last error, if any.
 */
async function addPodRetrying(tb: Testbed, node: string, spec: { name: string; namespace?: string; tether?: Record<string, unknown> }, deadline: number): Promise<string | undefined> {
  for (;;) {
    const err = await addPodOnce(tb, node, spec);
    if (!err || Date.now() > deadline) return err;
    await sleep(1000);
  }
}

async function addPodOnce(tb: Testbed, node: string, spec: { name: string; namespace?: string; tether?: Record<string, unknown> }): Promise<string | undefined> {
  try {
    await tb.addPod(node, spec);
    return undefined;
  } catch (e) {
    return ((e as Error).message.split('\n')[0] ?? '').slice(0, 160);
  }
}

function makeEvent(row: Row, id: EventId, first: string, owners: Map<string, Owned>, cellStart: number): EventRun {
  const { tb } = row;
  const o = owners.get(first)!;
  switch (id) {
    case 'block': {
      const name = freeName(row, 'b', 1);
      let refused: string | undefined;
      let had: string[] = [];
      return {
        ownerDies: new Set(),
        run: async () => {
          had = await podBlocks(tb, 'n4');
          refused = await addPodOnce(tb, 'n4', { name });
          return refused ? `ADD refused under the fault (${refused})` : 'ADD done under the fault';
        },
        after: async (failures) => {
          if (refused) {
            const again = await addPodRetrying(tb, 'n4', { name }, row.retryUntil);
            if (again) {
              failures.push(`the ADD of n4-${name} failed again after recovery: ${again}`);
              return 'no pod';
            }
          }
          const pod = tb.pod(`n4-${name}`);
          const blocks = await podBlocks(tb, 'n4');
          const store = await storeHash(row, `${tb.redisPrefix}pool:{${tb.plan.podPool.name}}:blocks`);
          // Dual-stack: the pod has an address of each family, each from a new block of its family.
          const placed: string[] = [];
          for (const ip of [pod.ip, pod.ip6].filter((x): x is string => !!x)) {
            const block = blocks.find((b) => inCidr(ip, b));
            placed.push(`${ip} in ${block ?? '?'}`);
            if (block && had.includes(block)) failures.push(`setup: n4 already had ${block} before the ADD, so it needed no new block`);
            if (!block) failures.push(`n4-${name} ${ip} is in none of n4's blocks (${blocks.join(', ')})`);
            else if (store[block] !== 'n4') failures.push(`block ${block} lost: n4 uses it (n4-${name} ${ip}) but the store gives it to ${store[block] ?? 'nobody'}`);
          }
          if (tb.hasFamily(6) && !pod.ip6) failures.push(`n4-${name} has no IPv6 address on a dual-stack testbed`);
          return `${refused ? `ADD refused, worked ${sinceHeal(row)} after the heal` : 'ADD under the fault'}; ${placed.join(', ')}`;
        },
      };
    }
    case 'join': {
      const node = JOIN_NODE;
      const name = freeName(row, 'gw', 2);
      let refused: string | undefined;
      const joined = async () => {
        row.gateways.push(`${node}-${name}`);
        await row.sampler.addGateway(`${node}-${name}`);
      };
      return {
        ownerDies: new Set(),
        run: async () => {
          refused = await addPodOnce(tb, node, GW(name));
          if (refused) return `the gateway's ADD refused under the fault (${refused})`;
          await joined();
          return 'gateway joined under the fault';
        },
        after: async (failures) => {
          if (refused) {
            const again = await addPodRetrying(tb, node, GW(name), row.retryUntil);
            if (again) failures.push(`the gateway pod's ADD failed again after recovery: ${again}`);
            else await joined();
          }
          return `${refused ? `joined ${sinceHeal(row)} after the heal` : 'joined under the fault'}`;
        },
      };
    }
    case 'address':
      return {
        ownerDies: new Set(),
        run: async () => {
          row.egressCount++;
          writeConfig(row);
          return `count ${row.egressCount - 1} → ${row.egressCount}`;
        },
        after: async () => '',
      };
    case 'lbpod': {
      const name = freeName(row, 'lb', 2);
      let refused: string | undefined;
      let healedAt = 0;
      return {
        ownerDies: new Set(),
        run: async () => ((refused = await addPodOnce(tb, 'n4', LB(name))) ? `the LB pod's ADD refused under the fault (${refused})` : 'LB pod added under the fault'),
        after: async (failures) => {
          healedAt = Date.now();
          if (refused) {
            const again = await addPodRetrying(tb, 'n4', LB(name), row.retryUntil);
            if (again) {
              failures.push(`the LB pod's ADD failed again after recovery: ${again}`);
              return '';
            }
          }
          if (!row.lbNodes.includes('n4')) row.lbNodes.push('n4');
          const want = row.lbNodes.map((n) => tb.node(n).fabricIp).sort().join();
          // Dual-stack: n4 must announce the IPv6 VIP too.
          const want6 = row.vip6 ? lbPathsWanted(row, 6) : undefined;
          const routed6 = async () => !row.vip6 || (await routerPaths(tb, row.vip6)).join() === want6;
          if (!refused && (await routerPaths(tb, row.vip)).join() === want && (await routed6())) return 'n4 announced before the store was back';
          try {
            await waitFor('the VIP routed over n4 too', async () => (await routerPaths(tb, row.vip)).join() === want && (await routed6()), 15_000);
            return `n4 serving ${((Date.now() - healedAt) / 1000).toFixed(1)} s after the heal`;
          } catch {
            const v6 = row.vip6 ? `; IPv6 VIP: ${(await routerPaths(tb, row.vip6)).join() || 'nothing'}` : '';
            failures.push(`the new LB pod on n4 was not announced within 15 s after the store came back (router: ${(await routerPaths(tb, row.vip)).join() || 'nothing'}${v6})`);
            return '';
          }
        },
      };
    }
    case 'lblost': {
      const name = freeName(row, 'lb', 2);
      let refused: string | undefined;
      let routedMs: number | undefined;
      let fresh: TrafficReport | undefined;
      let freshError: string | undefined;
      // Dual-stack: the replacement must route and serve the IPv6 VIP under the fault as well.
      let fresh6: TrafficReport | undefined;
      let fresh6Error: string | undefined;
      /** Dual-stack, no takeover under the fault: where the router sent each VIP at the deadline. */
      let unrouted: string | undefined;
      const routedOver = async (node: string) =>
        (await routerPaths(tb, row.vip)).join() === tb.node(node).fabricIp && (!row.vip6 || (await routerPaths(tb, row.vip6)).join() === tb.node(node).fabricIp6);
      const ev: EventRun = {
        ownerDies: new Set(),
        run: async () => {
          ev.at = Date.now();
          // Lost at one instant, as in nodelost: cut off, then its tetherd dies.
          await tb.setUplink(LB_NODE, 'down');
          row.sampler.loseNode(LB_NODE);
          await tb.killTetherd(LB_NODE, 'SIGKILL');
          row.lost.add(LB_NODE);
          row.lbNodes = row.lbNodes.filter((n) => n !== LB_NODE);
          // Its replacement is scheduled on a node that never needed the VIP.
          refused = await addPodOnce(tb, TAKEOVER_NODE, LB(name));
          if (refused) return `${LB_NODE} lost; the replacement LB pod's ADD refused under the fault (${refused})`;
          row.lbNodes.push(TAKEOVER_NODE);
          const deadline = ev.at + HOLD_MS.lblost - 5000;
          if (row.vip6) {
            while (Date.now() < deadline && !(await routedOver(TAKEOVER_NODE))) await sleep(200);
            if (!(await routedOver(TAKEOVER_NODE))) {
              unrouted = `router: IPv4 VIP over ${(await routerPaths(tb, row.vip)).join() || 'nothing'}, IPv6 VIP over ${(await routerPaths(tb, row.vip6)).join() || 'nothing'}`;
              return `${LB_NODE} lost; ${TAKEOVER_NODE} did not announce both VIPs under the fault`;
            }
            routedMs = Date.now() - ev.at;
            // New connections through both VIPs at once, still under the fault.
            const [r4, r6] = await Promise.all([row.vip, row.vip6].map(async (vip) => {
              try {
                const f = await flows(tb, 'client', vip, FRESH_CONNS);
                await sleep(1000);
                return { report: await f.stop() };
              } catch (e) {
                return { error: (e as Error).message.slice(0, 160) };
              }
            }));
            [fresh, freshError, fresh6, fresh6Error] = [r4.report, r4.error, r6.report, r6.error];
            return `${LB_NODE} lost; ${TAKEOVER_NODE} announced both VIPs ${routedMs} ms later, under the fault`;
          }
          const want = tb.node(TAKEOVER_NODE).fabricIp;
          while (Date.now() < deadline && (await routerPaths(tb, row.vip)).join() !== want) await sleep(200);
          if ((await routerPaths(tb, row.vip)).join() !== want) return `${LB_NODE} lost; ${TAKEOVER_NODE} did not announce the VIP under the fault`;
          routedMs = Date.now() - ev.at;
          try {
            const f = await flows(tb, 'client', row.vip, FRESH_CONNS);
            await sleep(1000);
            fresh = await f.stop();
          } catch (e) {
            freshError = (e as Error).message.slice(0, 160);
          }
          return `${LB_NODE} lost; ${TAKEOVER_NODE} announced the VIP ${routedMs} ms later, under the fault`;
        },
        after: async (failures) => {
          const st = await lbStatus(tb, TAKEOVER_NODE).catch(() => undefined);
          if (refused) failures.push(`the replacement LB pod's ADD on ${TAKEOVER_NODE} was refused under the fault: ${refused}`);
          else if (routedMs === undefined) failures.push(`the VIP was not routed over ${TAKEOVER_NODE} while the store was away (${TAKEOVER_NODE}: ${st?.problem ?? (st?.vip ? `VIP ${st.vip}, announced ${st.announced}` : 'no VIP')})`);
          else if (!fresh || fresh.intact !== FRESH_CONNS) failures.push(`${fresh?.intact ?? 0}/${FRESH_CONNS} new VIP connections during the fault: ${freshError ?? fresh?.errors.slice(0, 2).join('; ')}`);
          if (row.vip6 && routedMs !== undefined && (!fresh6 || fresh6.intact !== FRESH_CONNS)) failures.push(`${fresh6?.intact ?? 0}/${FRESH_CONNS} new IPv6 VIP connections during the fault: ${fresh6Error ?? fresh6?.errors.slice(0, 2).join('; ')}`);
          if (row.vip6 && refused === undefined && routedMs === undefined) {
            const st6 = await lbStatus(tb, TAKEOVER_NODE, 6).catch(() => undefined);
            failures.push(`both VIPs were not routed over ${TAKEOVER_NODE} while the store was away (${unrouted ?? 'router: ?'}; ${TAKEOVER_NODE}'s IPv6 VIP: ${st6?.problem ?? (st6?.vip ? `${st6.vip}, announced ${st6.announced}` : 'none')})`);
          }
          const fresh6Text = row.vip6 ? ` v6 ${fresh6?.intact ?? 0}/${FRESH_CONNS}` : '';
          return routedMs === undefined ? 'no takeover under the fault' : `${TAKEOVER_NODE} serving ${(routedMs / 1000).toFixed(1)} s after ${LB_NODE} was lost; ${fresh?.intact ?? 0}/${FRESH_CONNS}${fresh6Text} new connections under the fault`;
        },
      };
      return ev;
    }
    case 'podkill': {
      const key = `${o.ownerNode}-${o.owner.split('/')[1]}`;
      const ev: EventRun = {
        ownerDies: new Set([...owners].filter(([, x]) => x.owner === o.owner).map(([a]) => a)),
        run: async () => {
          await row.sampler.dropGateway(key);
          ev.at = Date.now();
          await tb.mustExec('router', ['ip', 'netns', 'del', tb.pod(key).ns]);
          row.gone.add(key);
          row.gateways = row.gateways.filter((g) => g !== key);
          return `${key} deleted`;
        },
        after: async () => takeover(row, first, o, ev.at ?? cellStart),
      };
      return ev;
    }
    case 'nodelost': {
      const node = o.ownerNode;
      const ev: EventRun = {
        ownerDies: new Set([...owners].filter(([, x]) => x.ownerNode === node).map(([a]) => a)),
        run: async () => {
          ev.at = Date.now();
          // Cut off first, then its tetherd dies: the node is lost at one instant (killing tetherd first
          // would let a standby take over, on BFD, while the node still answers for the address).
          await tb.setUplink(node, 'down');
          row.sampler.loseNode(node);
          await tb.killTetherd(node, 'SIGKILL');
          row.lost.add(node);
          row.lbNodes = row.lbNodes.filter((n) => n !== node);
          row.gateways = row.gateways.filter((g) => tb.pod(g).node !== node);
          return `${node} lost`;
        },
        after: async () => takeover(row, first, o, ev.at ?? cellStart),
      };
      return ev;
    }
  }
}

const sinceHeal = (row: Row) => `${((Date.now() - (row.retryUntil - RECOVER_MS[row.fault])) / 1000).toFixed(1)} s`;

/** When the address was first held by another node after the event, per the sampler. */
async function takeover(row: Row, address: string, o: Owned, at: number): Promise<string> {
  const t = row.sampler.firstHeldElsewhere(address, o.ownerNode, at);
  return t ? `${short(address)} ${o.ownerNode}→${t.node} in ${t.at - at} ms` : `${short(address)} not taken over`;
}

/** The first `<base><k>` (k ≥ from) that names no pod, live or deleted, on any node (a pod's name is cluster-wide). */
function freeName(row: Row, base: string, from: number): string {
  const taken = new Set([...row.tb.listPods().map((p) => p.name), ...[...row.gone].map((k) => k.split('-').slice(1).join('-'))]);
  for (let k = from; ; k++) if (!taken.has(`${base}${k}`)) return `${base}${k}`;
}

/** A node's pod blocks of every family the pods have (IPv4 and, in dual-stack, IPv6), from its status. */
async function podBlocks(tb: Testbed, node: string): Promise<string[]> {
  const out: string[] = [];
  for (const f of tb.plan.families) out.push(...(await tb.nodeBlocks(node, tb.plan.podPool.name, f)).blocks);
  return out;
}

function cutNodeFor(row: Row, id: EventId, first: string, owners: Map<string, Owned>): string {
  const o = owners.get(first)!;
  const gatewayNodes = [...new Set(row.gateways.map((g) => row.tb.pod(g).node))].filter((n) => !row.lost.has(n));
  switch (id) {
    case 'block':
    case 'lbpod':
      return 'n4';
    case 'lblost':
      return TAKEOVER_NODE;
    case 'join':
    case 'podkill':
      return o.ownerNode;
    case 'address': {
      const holding = new Set([...owners.values()].map((x) => x.ownerNode));
      return gatewayNodes.find((n) => !holding.has(n)) ?? o.ownerNode;
    }
    case 'nodelost': {
      const others = gatewayNodes.filter((n) => n !== o.ownerNode);
      return others.length === 1 ? others[0] : CLIENT_NODE;
    }
  }
}

// ---- the checks at the end of a cell ---------------------------------------------------------------------

/**
 * Store and nodes agree, and nothing is given twice: each address held has the Egress's allocation in the
 * store and is refused to anyone else; the VIP is the same everywhere, allocated to the Service and refused
 * to anyone else; each block a node uses is the store's claim of that node and no other node's; no two pods
 * share an address and each pod is inside its node's blocks.
 */
async function checkStore(row: Row, owners: Map<string, Owned>, failures: string[]): Promise<void> {
  const { tb } = row;
  const probeNode = liveNodes(row).find((n) => n === 'n3') ?? liveNodes(row)[0];
  const floats = await storeHash(row, `${tb.redisPrefix}pool:{float}:addrs`);
  for (const [a, o] of owners) {
    if (!floats[a]?.startsWith(`egress/${EGRESS}`)) failures.push(`${short(a)} (held by ${o.owner} on ${o.ownerNode}) is allocated to ${floats[a] ?? 'nobody'} in the store`);
  }
  const probe = async (pool: string, a: string, holder: string) => {
    try {
      await call(tb.socketPath(probeNode), 'address.allocate', { pool, owner: PROBE_OWNER, addresses: [a] }, { timeoutMs: 5000 });
      failures.push(`${pool === 'float' ? short(a) : a} (held by ${holder}) given to ${PROBE_OWNER} too`);
    } catch (e) {
      const code = (e as { code?: string }).code ?? '';
      if (code !== 'ADDRESS_CONFLICT' && !/held by/.test((e as Error).message)) failures.push(`probe for ${a} could not run: ${code} ${(e as Error).message.slice(0, 120)}`);
    } finally {
      await call(tb.socketPath(probeNode), 'address.release', { pool, owner: PROBE_OWNER }, { timeoutMs: 5000 }).catch(() => undefined);
    }
  };
  for (const [a, o] of owners) await probe('float', a, o.owner);
  const lbs = await storeHash(row, `${tb.redisPrefix}pool:{lb}:addrs`);
  if (lbs[row.vip] !== LB_OWNER) failures.push(`the VIP ${row.vip} is allocated to ${lbs[row.vip] ?? 'nobody'} in the store`);
  for (const n of row.lbNodes.filter((x) => !row.lost.has(x))) {
    const st = await lbStatus(tb, n).catch(() => undefined);
    if (st?.vip !== row.vip) failures.push(`${n} serves the Service on ${st?.vip ?? 'no VIP'}, not ${row.vip}`);
  }
  await probe('lb', row.vip, LB_OWNER);
  // Dual-stack: the IPv6 VIP allocated once, to the Service's IPv6 key, and served on that VIP by every LB node.
  if (row.vip6) {
    if (lbs[row.vip6] !== LB_OWNER6) failures.push(`the IPv6 VIP ${row.vip6} is allocated to ${lbs[row.vip6] ?? 'nobody'} in the store`);
    for (const n of row.lbNodes.filter((x) => !row.lost.has(x))) {
      const st: LbStatus | undefined = await lbStatus(tb, n, 6).catch(() => undefined);
      if (st?.vip !== row.vip6) failures.push(`${n} serves the Service's IPv6 VIP on ${st?.vip ?? 'no VIP'}, not ${row.vip6}`);
    }
    await probe('lb', row.vip6, LB_OWNER6);
  }

  const blocks = await storeHash(row, `${tb.redisPrefix}pool:{${tb.plan.podPool.name}}:blocks`);
  const usedBy = new Map<string, string>();
  const nodeBlocks = new Map<string, string[]>();
  for (const n of liveNodes(row)) {
    const bs = await podBlocks(tb, n).catch(() => undefined);
    if (!bs) continue;
    nodeBlocks.set(n, bs);
    for (const b of bs) {
      if (usedBy.has(b)) failures.push(`block ${b} used by ${usedBy.get(b)} and ${n}`);
      usedBy.set(b, n);
      if (blocks[b] !== n) failures.push(`block ${b} used by ${n}, claimed by ${blocks[b] ?? 'nobody'} in the store`);
    }
  }
  const ips = new Map<string, string>();
  for (const p of tb.listPods()) {
    if (row.gone.has(p.key) || row.lost.has(p.node)) continue;
    for (const ip of [p.ip, p.ip6].filter((x): x is string => !!x)) {
      if (ips.has(ip)) failures.push(`${ip} on two pods: ${ips.get(ip)} and ${p.key}`);
      ips.set(ip, p.key);
      const bs = nodeBlocks.get(p.node);
      if (bs && !bs.some((b) => inCidr(ip, b))) failures.push(`${p.key} ${ip} is outside ${p.node}'s blocks`);
    }
  }
}

// ---- one cell --------------------------------------------------------------------------------------------

async function runCell(row: Row, id: EventId, before: Map<string, Owned>): Promise<{ result: CellResult; clean: boolean }> {
  const { tb, fault } = row;
  const t0 = Date.now();
  const failures: string[] = [];
  const notes: string[] = [];
  const first = [...before.keys()].sort()[0];
  row.sampler.trim(t0);
  const server = await startServer(tb);
  const eg = await flows(tb, `${CLIENT_NODE}-web`, tb.externalIp('server'), CONNS);
  // Dual-stack: IPv6 connections through the Egress beside the IPv4 ones, under the same fault and event.
  const eg6 = tb.hasFamily(6) ? await flows(tb, `${CLIENT_NODE}-web`, tb.externalIp6('server'), CONNS) : undefined;
  const lb = id === 'lbpod' || id === 'lblost' ? await flows(tb, 'client', row.vip, CONNS) : undefined;
  // Dual-stack: IPv6 connections through the IPv6 VIP beside the IPv4 VIP's.
  const lb6 = row.vip6 && (id === 'lbpod' || id === 'lblost') ? await flows(tb, 'client', row.vip6, CONNS) : undefined;
  await sleep(1000);
  eg.mark();
  eg6?.mark();
  lb?.mark();
  lb6?.mark();
  const tWin = Date.now();
  const cutNode = cutNodeFor(row, id, first, before);
  const ev = makeEvent(row, id, first, before, tWin);
  let measured = '';
  let clean = true;
  let egReport: TrafficReport | undefined;
  let eg6Report: TrafficReport | undefined;
  let lbReport: TrafficReport | undefined;
  let lb6Report: TrafficReport | undefined;
  try {
    const f = await startFault(row, cutNode);
    const evStart = Date.now();
    const evP = ev.run();
    await f.during(evStart, evP);
    const evNote = await Promise.race([evP, sleep(EVENT_CAP_MS).then(() => undefined)]);
    await sleep(Math.max(0, evStart + HOLD_MS[id] - Date.now()));
    await f.heal();
    const healedAt = Date.now();
    row.retryUntil = healedAt + RECOVER_MS[fault];
    const note = evNote ?? (await evP);
    notes.push(note, ...f.notes);
    measured = await ev.after(failures);
    const s = await settle(row, Math.max(3000, row.retryUntil - Date.now()));
    if (!s.owners) {
      failures.push(`not settled ${RECOVER_MS[fault] / 1000} s after the store came back: ${s.why}`);
      clean = false;
    } else {
      notes.push(`settled ${((Date.now() - healedAt) / 1000).toFixed(1)} s after the heal`);
    }
    const after = s.owners ?? new Map<string, Owned>();
    egReport = await eg.stop();
    eg6Report = await eg6?.stop();
    lbReport = await lb?.stop();
    lb6Report = await lb6?.stop();
    await server.stop();

    // At no moment two holders.
    for (const v of row.sampler.violationsSince(tWin)) {
      failures.push(`${short(v.address)} held on two nodes at +${((v.from - tWin) / 1000).toFixed(1)} s for ${v.samples} samples: ${v.detail}`);
    }
    // No move from a live owner.
    const seen = row.sampler.holdersSince(tWin);
    for (const [a, o] of before) {
      const now = after.get(a);
      if (ev.ownerDies.has(a)) {
        if (now && (now.ownerNode === o.ownerNode || now.epoch <= o.epoch)) failures.push(`${short(a)}: its owner died but ${now.owner} e${now.epoch} on ${now.ownerNode} still owns it`);
        continue;
      }
      const elsewhere = [...(seen.get(a) ?? [])].filter((n) => n !== o.ownerNode);
      if (elsewhere.length) failures.push(`${short(a)} moved from its live owner ${o.owner} on ${o.ownerNode} (held on ${elsewhere.join(', ')} during the cell)`);
      if (now && (now.owner !== o.owner || now.epoch !== o.epoch)) failures.push(`${short(a)}: live owner ${o.owner} e${o.epoch} replaced by ${now.owner} e${now.epoch}`);
    }
    if (id === 'address' && after.size) {
      const added = [...after].find(([a]) => !before.has(a));
      measured = added ? `+${short(added[0])} on ${added[1].ownerNode}` : 'no new address';
    }
    if (after.size) await checkStore(row, after, failures);
    // Connections.
    if (egReport.intact !== CONNS) failures.push(`${egReport.intact}/${CONNS} Egress connections kept: ${egReport.errors.slice(0, 2).join('; ')}`);
    if (eg6Report && eg6Report.intact !== CONNS) failures.push(`${eg6Report.intact}/${CONNS} IPv6 Egress connections kept: ${eg6Report.errors.slice(0, 2).join('; ')}`);
    if (lbReport && lbReport.intact !== CONNS) failures.push(`${lbReport.intact}/${CONNS} VIP connections kept: ${lbReport.errors.slice(0, 2).join('; ')}`);
    if (lb6Report && lb6Report.intact !== CONNS) failures.push(`${lb6Report.intact}/${CONNS} IPv6 VIP connections kept: ${lb6Report.errors.slice(0, 2).join('; ')}`);
  } catch (e) {
    failures.push(`cell aborted: ${(e as Error).message.split('\n')[0].slice(0, 300)}`);
    clean = false;
    await eg.stop().catch(() => undefined);
    await eg6?.stop().catch(() => undefined);
    await lb?.stop().catch(() => undefined);
    await lb6?.stop().catch(() => undefined);
    await server.stop().catch(() => undefined);
  } finally {
    // Whatever happened, the store is whole again for the next cell.
    if (fault === 'paused') tb.resumeRedis();
    if (fault === 'cut') for (const n of NODES) tb.healStore(n);
    if (fault === 'sentinel') {
      tb.sentinel.resumeReplica();
      if (row.dead !== undefined) {
        await tb.sentinel.revive(row.dead).catch((e) => notes.push(`revive failed: ${(e as Error).message}`));
        row.dead = undefined;
      }
    }
    if ((fault === 'down' || fault === 'empty') && tb.redis.pid === undefined) await tb.restartRedis();
  }
  const conns = `${egReport?.intact ?? '?'}/${CONNS}${eg6Report ? ` v6 ${eg6Report.intact}/${CONNS}` : ''}${lbReport ? ` +${lbReport.intact}/${CONNS}` : ''}${lb6Report ? ` v6 ${lb6Report.intact}/${CONNS}` : ''}`;
  const pass = failures.length === 0;
  const result: CellResult = {
    fault,
    event: id,
    pass,
    cell: pass ? `ok ${conns}` : `FAIL ${shortFailure(failures[0])}`,
    measured: [`${conns} kept`, measured].filter(Boolean).join('; '),
    failures,
    notes: notes.filter(Boolean),
    ms: Date.now() - t0,
  };
  return { result, clean };
}

function shortFailure(f: string): string {
  if (/held on two nodes/.test(f)) return `${f.split(' ')[0]} 2 holders`;
  if (/moved from its live owner|live owner .* replaced/.test(f)) return `${f.split(' ')[0].replace(':', '')} moved`;
  if (/given to matrix\/probe/.test(f)) return `${f.split(' ')[0]} given twice`;
  if (/Egress connections kept|VIP connections kept/.test(f)) return `${f.split(' ')[0]} kept`;
  if (/claimed by|block .* lost/.test(f)) return 'block lost';
  if (/allocated to/.test(f)) return `${f.split(' ')[0]} not in store`;
  if (/not settled/.test(f)) return 'unsettled';
  if (/aborted/.test(f)) return 'aborted';
  return f.slice(0, 16);
}

// ---- a row -----------------------------------------------------------------------------------------------

export interface RowLog {
  (line: string): void;
}

/**
 * Runs every event of the matrix under one fault, one cell after another on one testbed; a cell that leaves
 * the testbed unsettled makes the rest of the row run on a fresh one (at most 2 fresh testbeds per row).
 */
export async function runRow(fault: FaultId, log: RowLog, only?: EventId[], families: IpFamily[] = [4]): Promise<CellResult[]> {
  const results: CellResult[] = [];
  const remaining = EVENTS.map((e) => e.id).filter((e) => !only || only.includes(e));
  let testbeds = 0;
  while (remaining.length) {
    testbeds++;
    const t0 = Date.now();
    await withTestbed(topology(fault, families), async (tb) => {
      const row = await prepareRow(tb, fault);
      log(`  ${fault}: testbed ${tb.prefix} ready in ${((Date.now() - t0) / 1000).toFixed(1)} s`);
      try {
        let firstHere = true;
        while (remaining.length) {
          const id = remaining[0];
          const s = await settle(row, SETTLE_MS);
          if (!s.owners) {
            if (!firstHere && testbeds < 3) {
              log(`  ${fault}: not settled before ${id} (${s.why}): the row continues on a fresh testbed`);
              return;
            }
            remaining.shift();
            results.push({ fault, event: id, pass: false, cell: 'FAIL no start', measured: '', failures: [`no settled start: ${s.why}`], notes: [], ms: 0 });
            continue;
          }
          remaining.shift();
          let owners = s.owners;
          // The takeover events need standbys: 3 gateway nodes before the owner's pod dies, 2 before its node does.
          const want = id === 'podkill' ? 3 : id === 'nodelost' ? 2 : 0;
          const added = await ensureGateways(row, want)
            .then(async (g) => (id === 'lblost' ? (await onlyLbNode(row)) || g : g))
            .then(async (g) => (id === 'lbpod' && row.vip6 ? (await blocksBeforeLbPod(row)) || g : g))
            .catch((e: Error) => e);
          if (added instanceof Error) {
            results.push({ fault, event: id, pass: false, cell: 'FAIL no start', measured: '', failures: [`no start: ${added.message}`], notes: [], ms: 0 });
            continue;
          }
          if (added) {
            const again = await settle(row, SETTLE_MS);
            if (!again.owners) {
              results.push({ fault, event: id, pass: false, cell: 'FAIL no start', measured: '', failures: [`no settled start after adding gateways: ${again.why}`], notes: [], ms: 0 });
              continue;
            }
            owners = again.owners;
          }
          const cellResult = await runCell(row, id, owners);
          const result = cellResult.result;
          let clean = cellResult.clean;
          if (firstHere && testbeds > 1) result.notes.push('on a fresh testbed (the previous cell left the last one unsettled)');
          firstHere = false;
          // Another session's sweep (a test process in another PID namespace sees this one as dead) can tear a
          // live testbed down: then the cell measured nothing of ours.
          if (!fs.existsSync(tb.runDir)) {
            result.pass = false;
            result.cell = 'VOID torn down';
            result.failures.unshift('void: the testbed was torn down from outside during the cell (its run dir is gone: another process swept it)');
            clean = false;
          }
          results.push(result);
          log(`  [${fault} × ${id}] ${result.pass ? 'ok' : 'FAIL'} in ${(result.ms / 1000).toFixed(1)} s: ${result.measured}${result.notes.length ? ` (${result.notes.join('; ')})` : ''}${result.failures.map((f) => `\n      ✗ ${f}`).join('')}`);
          if (!clean && remaining.length && testbeds < 3) {
            log(`  ${fault}: the cell left the testbed unsettled: the row continues on a fresh testbed`);
            return;
          }
        }
      } finally {
        log(`  ${fault}: sampler ${row.sampler.samples} samples, longest interval ${row.sampler.maxIntervalMs} ms, slowest sample ${row.sampler.sampleMsMax} ms`);
        await closeRow(row);
      }
      // noSweep: the suite sweeps once before it starts (test/run.sh); sweeping again at every fresh testbed
      // would tear down the testbeds of other sessions on this machine whose processes this one cannot see.
    }, { storeRelay: fault === 'cut', noSweep: true });
  }
  return results;
}

/**
 * Leaves LB_NODE the only LB node (outside any fault): the LB pods an earlier cell added elsewhere go.
 * Whether it removed any.
 */
async function onlyLbNode(row: Row): Promise<boolean> {
  const { tb } = row;
  if (row.lost.has(LB_NODE)) throw new Error(`${LB_NODE}, the LB node, was lost in an earlier cell`);
  const others = tb.listPods().filter((p) => p.node !== LB_NODE && p.namespace === 'shop' && /^lb\d*$/.test(p.name));
  for (const p of others) {
    await tb.delPod(p.key);
    row.gone.add(p.key);
  }
  row.lbNodes = [LB_NODE];
  return others.length > 0;
}

/**
 * Dual-stack: n4 gets its blocks of both families before 'LB pod added' (a plain pod, outside any fault), so
 * the LB pod's ADD under the fault needs no new block and the cell adds it under the fault, as in the IPv4
 * suite, where the 'new block' cell before it has left n4 a block. (The dual-stack run has no 'new block'
 * cell: without this the ADD is refused under the fault and the LB pod only comes after the heal.)
 */
async function blocksBeforeLbPod(row: Row): Promise<boolean> {
  const { tb } = row;
  const blocks = await podBlocks(tb, 'n4');
  if (blocks.some((b) => b.includes(':')) && blocks.some((b) => !b.includes(':'))) return false;
  const name = freeName(row, 'b', 1);
  const err = await addPodRetrying(tb, 'n4', { name }, Date.now() + SETTLE_MS);
  if (err) throw new Error(`adding pod n4-${name} for n4's blocks: ${err}`);
  return true;
}

/** Adds gateway pods (outside any fault) until `n` live nodes have one; whether it added any. */
async function ensureGateways(row: Row, n: number): Promise<boolean> {
  const { tb } = row;
  let added = false;
  for (const node of ['n1', JOIN_NODE, 'n4']) {
    const have = new Set(row.gateways.map((g) => tb.pod(g).node));
    if (have.size >= n) break;
    if (have.has(node) || row.lost.has(node)) continue;
    const name = freeName(row, 'gw', 2);
    const err = await addPodRetrying(tb, node, GW(name), Date.now() + SETTLE_MS);
    if (err) throw new Error(`adding gateway pod ${node}-${name}: ${err}`);
    row.gateways.push(`${node}-${name}`);
    await row.sampler.addGateway(`${node}-${name}`);
    added = true;
  }
  return added;
}

// ---- printing --------------------------------------------------------------------------------------------

/** The matrix as text: faults down, events across, each cell ok/FAIL with its key measurement; then the failures. */
export function formatMatrix(results: CellResult[], totalMs?: number): string {
  // Dual-stack cells carry the IPv6 counts ("v6 n/m") too: wide enough for the longest of them.
  const W = Math.max(20, ...results.filter((r) => / v6 /.test(r.cell)).map((r) => r.cell.length));
  const label = 18;
  const pad = (s: string, n: number) => (s.length > n ? s.slice(0, n - 1) + '…' : s.padEnd(n));
  const lines: string[] = [];
  lines.push(`${pad('store fault', label)} | ${EVENTS.map((e) => pad(e.label, W)).join(' | ')}`);
  lines.push(`${'-'.repeat(label)}-+-${EVENTS.map(() => '-'.repeat(W)).join('-+-')}`);
  for (const f of FAULTS) {
    const cells = EVENTS.map((e) => results.find((r) => r.fault === f.id && r.event === e.id));
    if (cells.every((c) => !c)) continue;
    lines.push(`${pad(f.label, label)} | ${cells.map((c) => pad(c ? c.cell : 'not run', W)).join(' | ')}`);
  }
  const ran = results.length;
  const passed = results.filter((r) => r.pass).length;
  lines.push('');
  const v6 = results.some((r) => / v6 /.test(r.cell)) ? ' v6 n/m after a count: the IPv6 connections through the Egress or the IPv6 VIP.' : '';
  lines.push(`${passed}/${ran} cells pass${totalMs ? `; ${(totalMs / 1000).toFixed(0)} s` : ''}. ok n/m = Egress connections kept (+ VIP connections in the LB column).${v6}`);
  for (const r of results) {
    lines.push(`  ${r.pass ? 'ok  ' : 'FAIL'} ${FAULTS.find((f) => f.id === r.fault)!.label} × ${EVENTS.find((e) => e.id === r.event)!.label}: ${r.measured}${r.notes.length ? ` (${r.notes.join('; ')})` : ''}`);
    for (const f of r.failures) lines.push(`       ✗ ${f}`);
  }
  return lines.join('\n');
}
