// Benchmark (not a test): what recording one new LB mapping costs in CPU, on the real parts, where every pick
// is recorded: Services with externalTrafficPolicy Local (their rows differ per node), and any Service while a
// change of its target set is under way (until a few seconds after the new row is written: table-switch.ts).
// At a steady target set (record on change) nothing is recorded per pick; what a change costs then is
// measured by lb-switch.ts. Two "LB nodes" in this process, each with its own datapath maps (lb.bpf.o pinned
// under a unique bpffs directory) and its own MappingStore on one real redis-server: node A gets RATE new
// picks per second (as its datapath reports them on the ring buffer: the 24-byte event decoded, then
// MappingSync.picked) and writes them to the store every 20 ms pass; node B hears each on the VIP's channel
// and installs it into its maps. Measured: CPU of this process (both nodes) and of redis-server per mapping,
// against the same passes with nothing picked.
// BENCH_LB_RECORD_PROF=<dir> writes a CPU profile. Prints JSON; writes results/bench-lb-record.json.
import * as fs from 'node:fs';
import * as path from 'node:path';
import * as inspector from 'node:inspector';
import Redis from 'ioredis';
import { Writable } from 'node:stream';
import { makeLogger, setLogger } from '../../lib/log';
import { LbDatapath } from '../../daemon/bpf/lb';
import { decodeEvent } from '../../daemon/bpf/lb-structs';
import { ensureBpffs } from '../../daemon/bpf/bpffs';
import { LB_STORE_BUCKETS } from '../../daemon/lb/mapping-fields';
import { connectLbStore, type LbStore } from '../../daemon/lb/lb-store';
import { MappingSync } from '../../daemon/lb/mapping-sync';
import { LbShared, type LbControllerOptions } from '../../daemon/lb/lb-state';
import type { ResolvedLoadBalancer } from '../../daemon/lb/lb-spec';
import { startRedis } from '../lib/redis';
import { machine } from './stats';

const repo = path.resolve(__dirname, '../..');
const RATE = Number(process.env.BENCH_LB_RECORD_RATE ?? 6000);
const SECS = Number(process.env.BENCH_LB_RECORD_SECS ?? 5);
const PROF = process.env.BENCH_LB_RECORD_PROF;
const VIP = '198.51.100.41';
const TARGETS = ['10.244.1.5', '10.244.2.5', '10.244.3.5'];
const quiet = makeLogger({ level: 'error', stream: new Writable({ write: (_c, _e, cb) => cb() }) });
setLogger(quiet);

function service(): ResolvedLoadBalancer {
  return {
    key: 'shop/db', service: 'shop/db', namespace: 'shop', name: 'db', family: 'IPv4', ipFamilies: ['IPv4'], ports: [{ port: 80, protocol: 'TCP', proto: 6 }], lbPods: { namespace: 'shop', matchLabels: { role: 'lb' } },
    affinity: 'flow', idleTimeoutS: 600, vip: { pool: 'lb' }, targets: TARGETS.map((address) => ({ address, state: 'active' as const })), externalTrafficPolicy: 'Cluster',
  };
}

/** A ring-buffer record as lb_core writes it: key (vip, client, vport, cport, proto), target, kind. */
function event(i: number): Buffer {
  const b = Buffer.alloc(24);
  Buffer.from(VIP.split('.').map(Number)).copy(b, 0);
  b.writeUInt32BE((10 << 24) | (200 << 16) | ((i >> 16) & 0xff) << 8 | 1, 4);
  b.writeUInt16BE(80, 8);
  b.writeUInt16BE(1024 + (i & 0xffff) % 64000, 10);
  b.writeUInt8(6, 12);
  Buffer.from(TARGETS[i % TARGETS.length].split('.').map(Number)).copy(b, 16);
  b.writeUInt32LE(1, 20);
  return b;
}

async function redisCpuMs(raw: Redis): Promise<number> {
  const info = await raw.info('cpu');
  const num = (k: string) => Number(new RegExp(`${k}:([0-9.]+)`).exec(info)?.[1] ?? 0);
  return (num('used_cpu_sys') + num('used_cpu_user')) * 1000;
}

async function node(name: string, redisUrl: string): Promise<{ sync: MappingSync; dp: LbDatapath; store: LbStore; pinDir: string }> {
  const pinDir = `/sys/fs/bpf/tether-bench/lbrec-${name}-${process.pid}`;
  ensureBpffs(pinDir);
  const store = await connectLbStore(redisUrl);
  const dp = LbDatapath.load({ pinDir, maxVips: 2, maglevSize: 251, maxMappings: 262144 });
  const s = new LbShared({ node: { name, address: '127.0.0.1' }, pinDir, fouPort: 5555, exportTable: 0, store, logger: quiet } as unknown as LbControllerOptions);
  s.dp = dp;
  const lb = service();
  s.vips.set(lb.key, { key: lb.key, pool: 'lb', vip: VIP, slot: 0, loaded: true, announced: true });
  const sync = new MappingSync(s);
  sync.start();
  await sync.serve([lb]);
  return { sync, dp, store, pinDir };
}

/** Runs 20 ms passes on both nodes for SECS; A picks `rate` mappings a second. Returns CPU figures. */
async function phase(a: Awaited<ReturnType<typeof node>>, b: Awaited<ReturnType<typeof node>>, raw: Redis, rate: number, from: number): Promise<{ cpuMs: number; redisCpuMs: number; picked: number }> {
  const r0 = await redisCpuMs(raw);
  const c0 = process.cpuUsage();
  const t0 = Date.now();
  let picked = 0;
  while (Date.now() - t0 < SECS * 1000) {
    const due = Math.floor(((Date.now() - t0) / 1000) * rate);
    for (; picked < due; picked++) {
      const e = decodeEvent(event(from + picked));
      a.sync.picked(e.key, e.target);
    }
    a.sync.poll();
    b.sync.poll();
    await new Promise((r) => setTimeout(r, 20));
  }
  // Let the last writes and notices land.
  for (let i = 0; i < 10; i++) {
    a.sync.poll();
    b.sync.poll();
    await new Promise((r) => setTimeout(r, 20));
  }
  const c = process.cpuUsage(c0);
  return { cpuMs: (c.user + c.system) / 1000, redisCpuMs: (await redisCpuMs(raw)) - r0, picked };
}

async function main(): Promise<void> {
  const redis = await startRedis();
  const raw = new Redis({ path: redis.socketPath });
  const a = await node('a', redis.url);
  const b = await node('b', redis.url);
  let session: inspector.Session | undefined;
  try {
    const idle = await phase(a, b, raw, 0, 0);
    if (PROF) {
      session = new inspector.Session();
      session.connect();
      await new Promise<void>((res) => session!.post('Profiler.enable', () => session!.post('Profiler.start', () => res())));
    }
    const busy = await phase(a, b, raw, RATE, 0);
    if (session) {
      const prof = await new Promise<unknown>((res) => session!.post('Profiler.stop', (_e, p) => res(p.profile)));
      fs.mkdirSync(PROF!, { recursive: true });
      fs.writeFileSync(path.join(PROF!, `lb-record-${process.pid}.cpuprofile`), JSON.stringify(prof));
    }
    let stored = 0;
    for (let i = 0; i < LB_STORE_BUCKETS; i++) stored += await raw.hlen(`tether:lb:{${VIP}#${i}}:map`);
    const installedOnB = b.dp.mappings().length;
    const per = (x: number, y: number) => +(((x - y) * 1000) / busy.picked).toFixed(1);
    const result = {
      benchmark: 'lb-record', records: 'every pick (externalTrafficPolicy Local; any Service while a target set change is under way)', machine: machine(), rate: RATE, secs: SECS, picked: busy.picked, stored, installedOnB,
      idle, busy,
      // µs of CPU per mapping recorded, above the same passes with nothing picked.
      perMappingUs: { tetherd: per(busy.cpuMs, idle.cpuMs), redis: per(busy.redisCpuMs, idle.redisCpuMs) },
    };
    process.stdout.write(JSON.stringify(result) + '\n');
    if (!PROF) {
      fs.mkdirSync(path.join(repo, 'results'), { recursive: true });
      fs.writeFileSync(path.join(repo, 'results/bench-lb-record.json'), JSON.stringify(result, null, 2) + '\n');
    }
  } finally {
    for (const n of [a, b]) {
      await n.store.connection.close();
      n.dp.close({ unpin: true });
      fs.rmSync(n.pinDir, { recursive: true, force: true });
    }
    raw.disconnect();
    await redis.stop();
  }
}

main().then(() => process.exit(0), (e) => {
  console.error(e);
  process.exit(1);
});
