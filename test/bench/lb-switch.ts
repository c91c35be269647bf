// Benchmark (not a test): what a change of a VIP's target set costs in record-on-change mode, on the real
// parts. Three LB nodes in this process (n1..n3), each a real LbController with its own datapath maps (lb.bpf.o
// pinned under a unique bpffs directory, Maglev rows of 65,537 entries as in production) and its own store
// connections, on one real redis-server; one LB pod record per node selects the Service (its interface does
// not exist, so its set-up fails as a role problem, but the slot, maps and row are programmed), which has 3
// targets and per-flow affinity. Each node's map is filled with its share of N live flows as its datapath
// would have picked them (the current row's pick, lastNs now; nothing in the store, as in a steady target
// set), then every node is given a 4th target at once. Measured per N: the time from that configuration to
// the new table version active on every node (each node's "Maglev table version active" line), the records
// in the store after (the flows the change moved, each node's share recorded) against the flows whose pick
// changed, each node's recording time, and the parts of one node's recording timed apart (its map read, the
// picks of the new row, the row itself, the records read back). All three nodes share this process and the
// machine's 2 cores: their recording runs one after the other here, where on three nodes it would run at once.
// BENCH_LB_SWITCH_FLOWS=10000,100000 picks the sizes. Writes `tableChange` into results/bench-lb.json (the
// rest of the file kept) and its own block of docs/performance.md.
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import * as inspector from 'node:inspector';
import { Writable } from 'node:stream';
import Redis from 'ioredis';
import { makeLogger, setLogger, type Logger } from '../../lib/log';
import { ensureBpffs } from '../../daemon/bpf/bpffs';
import { LB_HASH_SEED, LbDatapath } from '../../daemon/bpf/lb';
import type { MapKey } from '../../daemon/bpf/lb-structs';
import { ClusterAddresses } from '../../ipam/cluster-addresses';
import { validatePools } from '../../ipam/pool';
import { RedisStore } from '../../ipam/store/redis-store';
import { LbController } from '../../daemon/lb/lb-controller';
import { connectLbStore, type LbStore } from '../../daemon/lb/lb-store';
import { resolveLoadBalancers } from '../../daemon/lb/lb-spec';
import { LB_STORE_BUCKETS } from '../../daemon/lb/mapping-fields';
import { maglevTable, pickOf } from '../../daemon/lb/maglev';
import { movedFlows } from '../../daemon/lb/table-switch';
import { PodStore } from '../../daemon/state/pod-store';
import { AttachService } from '../../daemon/pod/attach-service';
import { LB_CLASS } from '../../daemon/objects/names';
import { addNetns, delNetns, uniqueName } from '../lib/netns';
import { startRedis } from '../lib/redis';
import { machine, updateReadme } from './stats';

const repo = path.resolve(__dirname, '../..');
const SIZES = (process.env.BENCH_LB_SWITCH_FLOWS ?? '10000,100000,1000000').split(',').map(Number);
const MAGLEV = 65537;
const NODES = ['n1', 'n2', 'n3'];
const TARGETS = ['10.244.1.5', '10.244.2.5', '10.244.3.5'];
const ADDED = '10.244.4.5';
const PREFIX = 'sw:';
const PORT = 80;
const TIMEOUT_MS = 300_000;
/** A directory: a CPU profile of each change is written there (and results are not). */
const PROF = process.env.BENCH_LB_SWITCH_PROF;

setLogger(makeLogger({ level: 'error', stream: new Writable({ write: (_c, _e, cb) => cb() }) }));

function objects(targets: string[]): Array<Record<string, unknown>> {
  return [
    {
      apiVersion: 'v1', kind: 'Service', metadata: { name: 'db', namespace: 'shop', annotations: { 'lb.tether.dev/affinity': 'flow' } },
      spec: { type: 'LoadBalancer', loadBalancerClass: LB_CLASS, ports: [{ port: PORT, protocol: 'TCP' }] },
    },
    {
      apiVersion: 'discovery.k8s.io/v1', kind: 'EndpointSlice', metadata: { name: 'db-x', namespace: 'shop', labels: { 'kubernetes.io/service-name': 'db' } },
      // On nodes of their own: the LB nodes hold no target (no DSR set-up here).
      addressType: 'IPv4', endpoints: targets.map((a, i) => ({ addresses: [a], conditions: { ready: true }, nodeName: `w${i + 1}` })),
    },
  ];
}

/** Flow i of the VIP: 16 flows per client address. */
function flowKey(vip: string, i: number): MapKey {
  const c = 0x0a400000 + (i >>> 4); // 10.64.0.0 up
  return { vip, client: `${c >>> 24}.${(c >>> 16) & 255}.${(c >>> 8) & 255}.${c & 255}`, vport: PORT, cport: 20000 + (i & 15), proto: 6 };
}

interface LogLine {
  message: string;
  timestamp: string;
  [k: string]: unknown;
}

/** A logger whose lines (info and above) are parsed into `lines`. */
function capture(lines: LogLine[]): Logger {
  let rest = '';
  return makeLogger({
    level: 'info',
    stream: new Writable({
      write(chunk, _e, cb) {
        rest += String(chunk);
        const parts = rest.split('\n');
        rest = parts.pop()!;
        for (const p of parts) if (p.trim()) lines.push(JSON.parse(p) as LogLine);
        cb();
      },
    }),
  });
}

interface Node {
  name: string;
  ctl: LbController;
  store: LbStore;
  ipam: RedisStore;
  pinDir: string;
  lines: LogLine[];
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function until<T>(what: string, fn: () => T | undefined | false, timeoutMs = TIMEOUT_MS, everyMs = 5): Promise<T> {
  const end = Date.now() + timeoutMs;
  for (;;) {
    const v = fn();
    if (v) return v;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await sleep(everyMs);
  }
}

type Table = { mode: string; version?: number; pending?: unknown; recording: boolean };
function tableOf(n: Node): { vip?: string; slot?: number; table?: Table } {
  const st = n.ctl.status().find((s) => s.service === 'shop/db');
  return { vip: st?.vip as string | undefined, slot: st?.slot as number | undefined, table: st?.table as Table | undefined };
}

async function storedRecords(raw: Redis, vip: string): Promise<number> {
  let n = 0;
  for (let b = 0; b < LB_STORE_BUCKETS; b++) n += await raw.hlen(`${PREFIX}lb:{${vip}#${b}}:map`);
  return n;
}

async function redisCpuMs(raw: Redis): Promise<number> {
  const info = await raw.info('cpu');
  const num = (k: string) => Number(new RegExp(`${k}:([0-9.]+)`).exec(info)?.[1] ?? 0);
  return (num('used_cpu_sys') + num('used_cpu_user')) * 1000;
}

const ms = (t0: bigint) => +(Number(process.hrtime.bigint() - t0) / 1e6).toFixed(1);

async function one(flows: number): Promise<Record<string, unknown>> {
  const redis = await startRedis();
  const raw = new Redis({ path: redis.socketPath });
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tether-lb-switch-'));
  const ns = uniqueName('tlbsw');
  const netns = addNetns(ns);
  const pools = validatePools([{ apiVersion: 'tether.dev/v1alpha1', kind: 'AddressPool', metadata: { name: 'lb' }, spec: { usage: 'loadBalancer', ipv4: { cidr: '198.18.6.0/28' } } }]);
  // Room for the node's share and the flows the other nodes record (about a sixth of all after the change).
  const maxMappings = Math.max(262_144, Math.ceil((flows * 0.6) / 1024) * 1024);
  const nodes: Node[] = [];
  const dps: LbDatapath[] = [];
  try {
    for (const [i, name] of NODES.entries()) {
      const pinDir = `/sys/fs/bpf/tether-test/${uniqueName(`lbsw${name}`)}`;
      ensureBpffs(pinDir);
      const lines: LogLine[] = [];
      const logger = capture(lines);
      const ipam = await RedisStore.connect(redis.url, { keyPrefix: PREFIX });
      const store = await connectLbStore(redis.url, { keyPrefix: PREFIX });
      const pods = new PodStore(path.join(dir, `state-${name}`));
      pods.put({
        network: 'tether', containerId: `c-${name}`, ifName: 'eth0', netns, podNamespace: 'shop', podName: `lb-${name}`, ips: [`10.244.0.${9 + i}`], hostIfName: `tlbswnone${i}`,
        labels: { 'tether.dev/role': 'lb' }, phase: 'attached', config: {}, createdAt: new Date().toISOString(),
      });
      const ctl = new LbController({
        node: { name, address: `127.0.0.${i + 1}` }, pinDir, fouPort: 5555, exportTable: 0, maxVips: 2, maglevSize: MAGLEV, maxMappings,
        // The LB pods' datapath (the node program stays off this machine's uplink: the name does not exist).
        datapath: 'pod', uplink: 'tlbswnoup0',
        store, addresses: new ClusterAddresses(pools, ipam, logger), attach: new AttachService(pods, logger), logger,
      });
      nodes.push({ name, ctl, store, ipam, pinDir, lines });
      await ctl.start();
    }
    await Promise.all(nodes.map((n) => n.ctl.apply(resolveLoadBalancers(objects(TARGETS), pools))));
    const vip = await until('version 1 active on every node', () => {
      const t = nodes.map(tableOf);
      return t.every((x) => x.slot !== undefined && x.table?.version === 1 && !x.table.pending && x.vip === t[0].vip) && t[0].vip;
    }, 30_000, 50);
    if (nodes.map(tableOf).some((x) => x.table?.mode !== 'change')) throw new Error(`not in record-on-change mode: ${JSON.stringify(nodes.map(tableOf))}`);

    // Each node's share of the live flows, as its datapath picked them from the current row.
    const before = maglevTable(TARGETS, MAGLEV);
    const after = maglevTable([...TARGETS, ADDED], MAGLEV);
    const CHUNK = 50_000;
    let moved = 0;
    const tf = process.hrtime.bigint();
    for (const [k, n] of nodes.entries()) {
      const dp = LbDatapath.load({ pinDir: n.pinDir, maxVips: 2, maglevSize: MAGLEV, maxMappings, nodeProgram: false });
      dps.push(dp);
      const now = process.hrtime.bigint();
      for (let from = k; from < flows; from += CHUNK * 3) {
        const list: Array<{ key: MapKey; target: string; lastNs: bigint }> = [];
        for (let i = from; i < Math.min(flows, from + CHUNK * 3); i += 3) {
          const key = flowKey(vip, i);
          const target = pickOf(before, key, LB_HASH_SEED)!;
          if (pickOf(after, key, LB_HASH_SEED) !== target) moved++;
          list.push({ key, target, lastNs: now });
        }
        const r = dp.installMappings(list);
        if (r.full) throw new Error(`${n.name}: map full (${maxMappings})`);
      }
    }
    const fillMs = ms(tf);
    const held = dps.map((dp) => dp.mappings().length);
    if (held.reduce((a, b) => a + b, 0) !== flows) throw new Error(`the maps hold ${held.join('+')}, not ${flows}`);
    const storedBefore = await storedRecords(raw, vip);
    const rss = process.memoryUsage().rss;
    process.stdout.write(`  ${flows} flows: filled in ${fillMs} ms (per node ${held.join(', ')}), ${moved} whose pick the 4th target changes, ${storedBefore} records in the store\n`);

    // The change: a 4th target, given to every node at once.
    for (const n of nodes) n.lines.length = 0;
    let session: inspector.Session | undefined;
    if (PROF) {
      session = new inspector.Session();
      session.connect();
      await new Promise<void>((res) => session!.post('Profiler.enable', () => session!.post('Profiler.start', () => res())));
    }
    const cpu0 = process.cpuUsage();
    const r0 = await redisCpuMs(raw);
    const t0 = Date.now();
    const h0 = process.hrtime.bigint();
    await Promise.all(nodes.map((n) => n.ctl.apply(resolveLoadBalancers(objects([...TARGETS, ADDED]), pools))));
    const active = await until('the new table active on every node', () => {
      const at = nodes.map((n) => n.lines.find((l) => l.message === 'lb: Maglev table version active' && l.version === 2));
      return at.every(Boolean) && at.map((l) => Date.parse(l!.timestamp));
    });
    const wallMs = ms(h0);
    const cpu = process.cpuUsage(cpu0);
    if (session) {
      const prof = await new Promise<unknown>((res) => session!.post('Profiler.stop', (_e, p) => res(p.profile)));
      fs.mkdirSync(PROF!, { recursive: true });
      fs.writeFileSync(path.join(PROF!, `lb-switch-${flows}.cpuprofile`), JSON.stringify(prof));
      session.disconnect();
    }
    const redisMs = (await redisCpuMs(raw)) - r0;
    const activeMs = Math.max(...active) - t0;
    const tables = nodes.map(tableOf);
    if (tables.some((t) => t.table?.version !== 2 || t.table.pending)) throw new Error(`not active everywhere: ${JSON.stringify(tables)}`);
    const recorded = await storedRecords(raw, vip);
    const perNode = nodes.map((n, k) => {
      const rec = n.lines.find((l) => l.message === 'lb: flows a Maglev table change moves recorded' && l.version === 2);
      return { node: n.name, flows: rec?.flows as number, recorded: rec?.recorded as number, recordMs: rec?.ms as number, activeAtMs: active[k] - t0 };
    });

    // One node's recording, in parts (recordMoved's own steps), on its map as it is now: its own flows and the
    // records of the other nodes it installed.
    const dp = dps[0];
    let p0 = process.hrtime.bigint();
    const table = maglevTable([...TARGETS, ADDED], MAGLEV);
    const maglevMs = ms(p0);
    p0 = process.hrtime.bigint();
    const entries = dp.mappingEntries();
    const readMs = ms(p0);
    p0 = process.hrtime.bigint();
    const differ = movedFlows(entries, vip, new Set([...TARGETS, ADDED]), table).moved.length;
    const pickMs = ms(p0);
    p0 = process.hrtime.bigint();
    let readBack = 0;
    await nodes[0].store.mappings.loadChangedSince(vip, t0 - 2000, (page) => {
      readBack += page.length;
    });
    const loadChangedMs = ms(p0);
    const parts = {
      node: 'n1', mappings: entries.length, readMs, pickMs, nowDiffering: differ, maglevTableMs: maglevMs, loadChangedSince: readBack, loadChangedSinceMs: loadChangedMs,
    };

    const row = {
      flows, targetsBefore: TARGETS.length, targetsAfter: TARGETS.length + 1, maglevSize: MAGLEV, maxMappingsPerNode: maxMappings,
      activeMs, wallMs, movedExpected: moved, recorded, storedBefore, recordedPerFlow: +(recorded / flows).toFixed(3), movedFraction: +(moved / flows).toFixed(3),
      cpuMs: Math.round((cpu.user + cpu.system) / 1000), redisCpuMs: Math.round(redisMs), rssMiB: Math.round(rss / 2 ** 20), fillMs, perNode, parts,
    };
    process.stdout.write(`  ${JSON.stringify(row)}\n`);
    return row;
  } finally {
    for (const dp of dps) dp.close();
    for (const n of nodes) {
      await n.ctl.stop().catch(() => undefined);
      await n.store.connection.close().catch(() => undefined);
      await n.ipam.close().catch(() => undefined);
      fs.rmSync(n.pinDir, { recursive: true, force: true });
    }
    raw.disconnect();
    await redis.stop();
    delNetns(ns);
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

async function main(): Promise<void> {
  const rows: Array<Record<string, unknown>> = [];
  for (const n of SIZES) {
    process.stdout.write(`lb-switch: ${n} live flows over ${NODES.length} LB nodes\n`);
    rows.push(await one(n));
  }
  if (PROF) return;
  const m = machine();
  const result = {
    machine: m,
    date: m.date,
    nodes: NODES.length,
    note: 'three LB nodes in one process on the same 2 cores: their recording runs one after the other, where on three nodes it runs at once',
    sizes: rows,
  };
  const file = path.join(repo, 'results/bench-lb.json');
  const all = fs.existsSync(file) ? (JSON.parse(fs.readFileSync(file, 'utf8')) as Record<string, unknown>) : {};
  all.tableChange = result;
  fs.mkdirSync(path.dirname(file), { recursive: true });
  fs.writeFileSync(file, JSON.stringify(all, null, 2) + '\n');

  type Row = { flows: number; activeMs: number; recorded: number; movedExpected: number; recordedPerFlow: number; perNode: Array<{ recordMs: number }>; parts: { mappings: number; readMs: number; pickMs: number; loadChangedSince: number; loadChangedSinceMs: number } };
  const r = rows as unknown as Row[];
  const md = `A target added to a Service whose 3 LB nodes hold N live flows (record on change, per-flow affinity, Maglev rows of ${MAGLEV}): measured by \`test/bench/lb-switch.ts\` (in \`npm run bench\`) on ${String(m.cpu)} (${String(m.cores)} cores), ${String(m.date).slice(0, 10)}; raw numbers in \`results/bench-lb.json\` (\`tableChange\`). Three real LbControllers share one process and one redis-server: their recording runs one after the other on these 2 cores, where on three nodes it runs at once, so the time to active is an upper bound.

| live flows | new table active on every node | records written (store) | flows whose pick changed | records per live flow | each node's recording (ms) | n1's map after: read / scanned for moved flows (ms) | records read back by a node (ms) |
|---|---|---|---|---|---|---|---|
${r.map((x) => `| ${x.flows} | ${x.activeMs} ms | ${x.recorded} | ${x.movedExpected} | ${x.recordedPerFlow} | ${x.perNode.map((p) => p.recordMs).join(' / ')} | ${x.parts.readMs} / ${x.parts.pickMs} (${x.parts.mappings} mappings) | ${x.parts.loadChangedSince} in ${x.parts.loadChangedSinceMs} |`).join('\n')}
`;
  updateReadme(path.join(repo, 'README.md'), 'lb-switch', md);
  process.stdout.write(md);
}

main().then(() => process.exit(0), (e) => {
  process.stderr.write(`lb-switch bench failed: ${(e as Error).stack}\n`);
  process.exit(1);
});
