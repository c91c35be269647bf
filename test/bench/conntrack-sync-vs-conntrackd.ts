// Benchmark (not a test): conntrack sync between two namespaces, Tether's sync (ctnetlink events → TCP
// stream → ctnetlink insert on the peer) side by side with conntrackd in FTFW mode over UDP, on the same
// veth and the same entries. N entries are inserted into A's table at once; the clock stops when B
// holds all N (Tether: in B's kernel table; conntrackd: in its external cache, which is where FTFW
// keeps them until a failover commits them). Writes results/bench-sync.json and the README section.
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { ConntrackEvents, ConntrackHandle, type ConntrackEntry } from '../../daemon/conntrack';
import { SyncReceiver, SyncSender } from '../../daemon/conntrack-sync';
import { machine, updateReadme } from './stats';

const SIZES = (process.env.BENCH_SYNC_SIZES ?? '10000,100000').split(',').map(Number);
const repo = path.resolve(__dirname, '../..');

function sh(...argv: string[]): string {
  return execFileSync(argv[0], argv.slice(1), { encoding: 'utf8' });
}

function entries(n: number, salt: number): ConntrackEntry[] {
  const out: ConntrackEntry[] = [];
  for (let i = 0; i < n; i++) {
    const src = `10.${100 + salt}.${(i >> 8) & 255}.${i & 255}`;
    const sport = 10000 + (i % 50000);
    out.push({
      orig: { family: 4, proto: 6, src, dst: '203.0.113.1', sport, dport: 443 },
      reply: { family: 4, proto: 6, src: '203.0.113.1', dst: src, sport: 443, dport: sport },
      status: 0x8 | 0x2 | 0x4,
      timeout: 3600,
      tcp: { state: 3 },
    });
  }
  return out;
}

async function until(cond: () => boolean, timeoutMs: number): Promise<boolean> {
  const end = Date.now() + timeoutMs;
  while (Date.now() < end) {
    if (cond()) return true;
    await new Promise((r) => setTimeout(r, 50));
  }
  return cond();
}

interface Run {
  entries: number;
  ms: number;
  perSec: number;
  complete: boolean;
}

async function tetherRun(a: string, b: string, n: number, salt: number): Promise<Run> {
  const key = randomBytes(32);
  let applied = 0;
  const recv = new SyncReceiver({
    key, id: 'b', host: '127.0.0.1', port: 0,
    apply: (evs) => {
      ConntrackHandle.with(`/run/netns/${b}`, (h) => h.insertMany(evs.filter((e) => e.type !== 'destroy').map((e) => e.entry), { update: true }));
      applied += evs.length;
    },
    replaceAll: (es) => {
      ConntrackHandle.with(`/run/netns/${b}`, (h) => h.insertMany(es, { update: true }));
      applied += es.length;
    },
  });
  const port = await recv.listen();
  const snapshot = () => ConntrackHandle.with(`/run/netns/${a}`, (h) => h.dump({ family: 4 }));
  const sender = new SyncSender({ key, id: 'a', host: '127.0.0.1', port, stream: 'bench', snapshot });
  const events = ConntrackEvents.open(`/run/netns/${a}`, { types: ['new'] });
  events.on('event', (ev) => sender.push(ev));
  events.on('overrun', () => sender.requestResync());
  sender.start();
  await until(() => sender.stats().state === 'streaming', 5000);
  const list = entries(n, salt);
  const t0 = Date.now();
  ConntrackHandle.with(`/run/netns/${a}`, (h) => h.insertMany(list));
  // Poll the receiver's own count (a dump of B would block this process, which is also the sender and
  // receiver, for ~0.8 s per 100k entries); one dump at the end checks the kernel table.
  await until(() => applied >= n, 120_000);
  const ms = Date.now() - t0;
  const complete = ConntrackHandle.with(`/run/netns/${b}`, (h) => h.dump({ family: 4 }).length) >= n;
  await events.close();
  await sender.close();
  await recv.close();
  return { entries: n, ms, perSec: Math.round(n / (ms / 1000)), complete };
}

function conntrackdConf(dir: string, me: string, peer: string, dev: string, name: string): string {
  const conf = `Sync {
  Mode FTFW { }
  UDP {
    IPv4_address ${me}
    IPv4_Destination_Address ${peer}
    Port 3780
    Interface ${dev}
    SndSocketBuffer 24985600
    RcvSocketBuffer 24985600
    Checksum on
  }
}
General {
  HashSize 262144
  HashLimit 1048576
  LogFile ${dir}/${name}.log
  LockFile ${dir}/${name}.lock
  UNIX { Path ${dir}/${name}.ctl }
  NetlinkBufferSize 8388608
  NetlinkBufferSizeMaxGrowth 134217728
  NetlinkEventsReliable On
  Filter From Userspace { Protocol Accept { TCP UDP } }
}
`;
  const p = path.join(dir, `${name}.conf`);
  fs.writeFileSync(p, conf);
  return p;
}

function externalCount(ns: string, conf: string): number {
  try {
    const out = execFileSync('nsenter', [`--net=/run/netns/${ns}`, 'conntrackd', '-C', conf, '-s', 'cache'], { encoding: 'utf8' });
    const m = /cache:external\s+active objects:\s+(\d+)/.exec(out);
    return m ? Number(m[1]) : 0;
  } catch {
    return 0;
  }
}

async function conntrackdRun(a: string, b: string, dir: string, n: number, salt: number): Promise<Run> {
  const confA = conntrackdConf(dir, '10.77.0.1', '10.77.0.2', 'synca', 'a');
  const confB = conntrackdConf(dir, '10.77.0.2', '10.77.0.1', 'syncb', 'b');
  const procs: ChildProcess[] = [
    spawn('nsenter', [`--net=/run/netns/${a}`, 'conntrackd', '-C', confA], { stdio: 'ignore' }),
    spawn('nsenter', [`--net=/run/netns/${b}`, 'conntrackd', '-C', confB], { stdio: 'ignore' }),
  ];
  try {
    await until(() => fs.existsSync(path.join(dir, 'a.ctl')) && fs.existsSync(path.join(dir, 'b.ctl')), 5000);
    await new Promise((r) => setTimeout(r, 500));
    const base = externalCount(b, confB);
    const list = entries(n, salt);
    const t0 = Date.now();
    ConntrackHandle.with(`/run/netns/${a}`, (h) => h.insertMany(list));
    const complete = await until(() => externalCount(b, confB) - base >= n, 120_000);
    const ms = Date.now() - t0;
    return { entries: n, ms, perSec: Math.round(n / (ms / 1000)), complete };
  } finally {
    for (const p of procs) p.kill('SIGTERM');
    await new Promise((r) => setTimeout(r, 300));
  }
}

async function main() {
  const id = randomBytes(3).toString('hex');
  const [a, b] = [`tbs-${id}-a`, `tbs-${id}-b`];
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tether-syncbench-'));
  const results: Array<{ size: number; tether: Run; conntrackd: Run }> = [];
  try {
    sh('ip', 'netns', 'add', a);
    sh('ip', 'netns', 'add', b);
    sh('ip', 'link', 'add', 'synca', 'netns', a, 'type', 'veth', 'peer', 'name', 'syncb', 'netns', b);
    sh('ip', '-n', a, 'addr', 'add', '10.77.0.1/24', 'dev', 'synca');
    sh('ip', '-n', b, 'addr', 'add', '10.77.0.2/24', 'dev', 'syncb');
    for (const [ns, dev] of [[a, 'synca'], [b, 'syncb']]) {
      sh('ip', '-n', ns, 'link', 'set', 'lo', 'up');
      sh('ip', '-n', ns, 'link', 'set', dev, 'up');
    }
    let salt = 0;
    for (const size of SIZES) {
      for (const ns of [a, b]) ConntrackHandle.with(`/run/netns/${ns}`, (h) => h.flush());
      const tether = await tetherRun(a, b, size, ++salt);
      for (const ns of [a, b]) ConntrackHandle.with(`/run/netns/${ns}`, (h) => h.flush());
      const ctd = await conntrackdRun(a, b, dir, size, ++salt);
      results.push({ size, tether, conntrackd: ctd });
      process.stdout.write(`  ${size}: tether ${tether.ms} ms (${tether.perSec}/s${tether.complete ? '' : ', INCOMPLETE'}), conntrackd ${ctd.ms} ms (${ctd.perSec}/s${ctd.complete ? '' : ', INCOMPLETE'})\n`);
    }
  } finally {
    for (const ns of [a, b]) spawnQuiet('ip', 'netns', 'del', ns);
    fs.rmSync(dir, { recursive: true, force: true });
  }
  const m = machine();
  fs.writeFileSync(path.join(repo, 'results/bench-sync.json'), JSON.stringify({ benchmark: 'conntrack-sync', machine: m, results }, null, 2) + '\n');
  const rows = results.map((r) => `| ${r.size} | ${r.tether.ms} | ${r.tether.perSec} | ${r.conntrackd.ms}${r.conntrackd.complete ? '' : ' (incomplete)'} | ${r.conntrackd.perSec} | ${Math.round((r.tether.perSec / r.conntrackd.perSec) * 100) / 100}× |`);
  const md = `Conntrack sync between two namespaces on ${m.cpu} (${m.cores} cores), ${String(m.date).slice(0, 10)}: N entries inserted into A's table at once, time until B holds all N (Tether: in B's kernel table; conntrackd FTFW over UDP: in its external cache).

| entries | Tether ms | Tether entries/s | conntrackd ms | conntrackd entries/s | ratio |
|---|---|---|---|---|---|
${rows.join('\n')}

Raw figures: \`results/bench-sync.json\`.`;
  updateReadme(path.join(repo, 'README.md'), 'sync', md);
  process.stdout.write(md + '\n');
}

function spawnQuiet(...argv: string[]): void {
  try {
    execFileSync(argv[0], argv.slice(1), { stdio: 'ignore' });
  } catch {
    // already gone
  }
}

main().catch((e) => {
  process.stderr.write(`bench failed: ${(e as Error).stack ?? e}\n`);
  process.exit(1);
});
