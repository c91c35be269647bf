// Benchmark (not a test): incremental conntrack sync at 10k, 100k and 1M entries for one floating address.
// Namespace A (the owner) is filled with N SNATed entries; a SyncSender in this process transfers them to
// a SyncReceiver in a child process that writes namespace B's kernel table as the chunks arrive (as
// tetherd does). Then the steady state: consistency checks with nothing changed. Reported per N: the
// transfer (entries/s, bytes), the receiver's CPU and peak memory, and per check the bytes sent and each
// side's CPU. Writes results/bench-sync.json. Root; raises nf_conntrack_max for the run and restores it.
// Run: node_modules/.bin/tsx test/bench/conntrack-sync-scale.ts [N ...]
import { execFileSync, fork, type ChildProcess } from 'node:child_process';
import * as crypto from 'node:crypto';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { Writable } from 'node:stream';
import { ConntrackHandle, IPS, type ConntrackEntry } from '../../daemon/conntrack';
import { applyWireList, Digests, dumpScope, dumpScopeEncoded, scopeDigests, StandbyDigests, SyncReceiver, SyncSender, sweepSyncedEntries, syncedDigests } from '../../daemon/conntrack-sync';
import { ipToBytes } from '../../lib/ip';
import { makeLogger, setLogger } from '../../lib/log';

// Connection-level lines (connect, disconnect and why) go to stderr; the rest is dropped.
setLogger(makeLogger({ stream: new Writable({ write: (c, _e, cb) => {
  if (/disconnected|rejected|silent/.test(String(c))) process.stderr.write(c);
  cb();
} }) }));
const FLOATING = '10.99.0.1';
const K = 1024;
const CHECKS = 3;
const inScope = (e: ConntrackEntry) => e.reply.dst === FLOATING;

function flow(i: number): ConntrackEntry {
  const port = 1024 + (i % 60000), svc = 53 + Math.floor(i / 60000);
  return {
    orig: { family: 4, proto: 17, src: '10.0.0.2', dst: '192.0.2.1', sport: port, dport: svc },
    reply: { family: 4, proto: 17, src: '192.0.2.1', dst: FLOATING, sport: svc, dport: port },
    status: IPS.SEEN_REPLY | IPS.SRC_NAT, timeout: 3600,
  };
}

// ---- the receiver, in its own process (argv: receiver <keyHex> <nsPath>) ----
if (process.argv[2] === 'receiver') {
  const key = Buffer.from(process.argv[3], 'hex');
  const ns = process.argv[4];
  let checkCpu = 0;
  // As tetherd: digests kept until something is written (or re-armed), so an idle check dumps nothing.
  const cache = new StandbyDigests();
  const rx = new SyncReceiver({
    key, id: 'b', host: '127.0.0.1', port: 0,
    apply: async () => cache.invalidate(FLOATING),
    upsertWire: async (list) => {
      cache.invalidate(FLOATING);
      await applyWireList(ns, list);
    },
    sweep: async (keep, buckets) => {
      cache.invalidate(FLOATING);
      return (await sweepSyncedEntries(ns, inScope, keep, buckets)).deleted;
    },
    digests: async (k) => {
      const c0 = process.cpuUsage();
      const digests = await cache.get(FLOATING, k, async () => (await syncedDigests(ns, inScope, k)).digests);
      const c = process.cpuUsage(c0);
      checkCpu += (c.user + c.system) / 1000;
      return digests;
    },
  });
  void rx.listen().then((port) => process.send!({ port }));
  process.on('message', () => {
    const cpu = process.cpuUsage();
    process.send!({ stats: rx.stats(), cpuMs: (cpu.user + cpu.system) / 1000, checkCpuMs: checkCpu, maxRssMiB: process.resourceUsage().maxRSS / 1024, heapMiB: process.memoryUsage().heapUsed / 2 ** 20 });
  });
  process.on('disconnect', () => void rx.close().then(() => process.exit(0)));
} else {
  void main();
}

interface RxReport {
  stats: ReturnType<SyncReceiver['stats']>;
  cpuMs: number;
  checkCpuMs: number;
  maxRssMiB: number;
  heapMiB: number;
}

function ask(child: ChildProcess): Promise<RxReport> {
  return new Promise((resolve) => {
    child.once('message', (m) => resolve(m as RxReport));
    child.send('stats');
  });
}

async function until(cond: () => Promise<boolean> | boolean, what: string, ms: number): Promise<void> {
  const end = Date.now() + ms;
  while (!(await cond())) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

function netns(role: string): { name: string; path: string } {
  const name = `bcs-${crypto.randomBytes(3).toString('hex')}-${role}`;
  execFileSync('ip', ['netns', 'add', name]);
  execFileSync('nsenter', [`--net=/run/netns/${name}`, 'nft', 'add table ip b; add chain ip b f { type filter hook forward priority 0; }; add rule ip b f ct state established accept; add chain ip b p { type nat hook postrouting priority 100; }']);
  return { name, path: `/run/netns/${name}` };
}

async function run(n: number): Promise<Record<string, unknown>> {
  const a = netns('a');
  const b = netns('b');
  const key = crypto.randomBytes(32);
  let child: ChildProcess | undefined;
  let tx: SyncSender | undefined;
  try {
    const fill0 = Date.now();
    ConntrackHandle.with(a.path, (h) => {
      h.batchSize = 1024;
      for (let i = 0; i < n; i += 50_000) {
        const r = h.insertMany(Array.from({ length: Math.min(50_000, n - i) }, (_, j) => flow(i + j)));
        if (r.failed.length) throw new Error(`filling A: ${r.failed.length} refused, first: ${r.failed[0].error.message}`);
      }
    });
    const fillMs = Date.now() - fill0;
    child = fork(__filename, ['receiver', key.toString('hex'), b.path], { execArgv: ['--import', 'tsx', '--max-old-space-size=4096'] });
    const port = await new Promise<number>((resolve) => child!.once('message', (m) => resolve((m as { port: number }).port)));
    // Production shares one digest computation per address and keeps it until an event (none here).
    // Both read the table in slices (as tetherd does), so the loop keeps serving heartbeats.
    let cached: Promise<Digests> | undefined;
    let senderDigestMs = 0;
    const snapshot = () => dumpScopeEncoded(a.path, 4, ipToBytes(FLOATING));
    tx = new SyncSender({
      key, id: 'a', host: '127.0.0.1', port, stream: FLOATING, buckets: K, snapshot, deadAfterMs: 10_000,
      digests: (k) => {
        if (cached) return cached;
        const t = performance.now();
        cached = scopeDigests(a.path, 4, inScope, k).then((d) => {
          senderDigestMs = performance.now() - t;
          return d;
        });
        return cached;
      },
    });
    const c0 = process.cpuUsage();
    const t0 = Date.now();
    tx.start();
    const rx = child;
    await until(async () => (await ask(rx)).stats.resyncs === 1, 'the transfer', 600_000);
    const transferMs = Date.now() - t0;
    const txCpu = process.cpuUsage(c0);
    const afterTransfer = await ask(child);
    const sent = tx.stats();
    const inB = (await dumpScope(b.path, 4, inScope)).length;
    if (inB !== n) throw new Error(`B holds ${inB} of ${n}`);
    // Steady state: checks with nothing changed.
    const checks: Array<Record<string, number>> = [];
    for (let i = 0; i < CHECKS; i++) {
      const before = tx.stats();
      const rxBefore = await ask(rx);
      const s0 = process.cpuUsage();
      // A check is skipped while a transfer runs (e.g. after a reconnect) or the last is unanswered:
      // ask until one goes out, then wait for the receiver to have compared it.
      const sentBefore = tx.stats().checks;
      await until(async () => {
        if (tx!.stats().checks === sentBefore) tx!.checkConsistency();
        return tx!.stats().checks > sentBefore && (await ask(rx)).stats.checks > rxBefore.stats.checks;
      }, 'a check', 120_000).catch(async (e) => {
        const r = await ask(rx);
        console.error(JSON.stringify({ tx: tx!.stats(), rx: { ...r.stats, peers: undefined } }));
        throw e;
      });
      const s = process.cpuUsage(s0);
      const rxAfter = await ask(rx);
      const after = tx.stats();
      checks.push({
        bytes: after.bytesSent - before.bytesSent,
        entriesResent: after.entriesSent - before.entriesSent,
        bucketsRequested: rxAfter.stats.bucketsRequested - rxBefore.stats.bucketsRequested,
        senderCpuMs: Math.round((s.user + s.system) / 1000),
        receiverCpuMs: Math.round(rxAfter.checkCpuMs - rxBefore.checkCpuMs),
      });
    }
    const row = {
      entries: n,
      fillMs,
      transfer: {
        ms: transferMs,
        entriesPerSec: Math.round(n / (transferMs / 1000)),
        bytes: sent.bytesSent,
        bytesPerEntry: +(sent.bytesSent / n).toFixed(1),
        senderCpuMs: Math.round((txCpu.user + txCpu.system) / 1000),
        receiverCpuMs: Math.round(afterTransfer.cpuMs),
        receiverMaxRssMiB: Math.round(afterTransfer.maxRssMiB),
        receiverKeySetMiB: +(afterTransfer.stats.maxKeySetBytes / 2 ** 20).toFixed(1),
      },
      // The first check computes the owner's digests (one sliced dump, wall time); later ones reuse them (no event came).
      senderDigestMs: Math.round(senderDigestMs),
      checks,
    };
    console.log(JSON.stringify(row));
    return row;
  } finally {
    await tx?.close();
    child?.disconnect();
    for (const ns of [a, b]) {
      try { execFileSync('ip', ['netns', 'del', ns.name]); } catch { /* gone */ }
    }
  }
}

async function main(): Promise<void> {
  const sizes = process.argv.slice(2).map(Number).filter((x) => x > 0);
  const ns = sizes.length ? sizes : [10_000, 100_000, 1_000_000];
  const maxFile = '/proc/sys/net/netfilter/nf_conntrack_max';
  const oldMax = fs.readFileSync(maxFile, 'utf8').trim();
  const want = Math.max(...ns) + 100_000;
  if (Number(oldMax) < want) fs.writeFileSync(maxFile, String(want));
  const rows: Array<Record<string, unknown>> = [];
  try {
    for (const n of ns) rows.push(await run(n));
  } finally {
    fs.writeFileSync(maxFile, oldMax);
  }
  // results/bench-sync.json also holds the comparison with conntrackd (conntrack-sync-vs-conntrackd.ts):
  // this run goes under "incremental" and leaves the rest.
  const out = path.join(__dirname, '../../results/bench-sync.json');
  fs.mkdirSync(path.dirname(out), { recursive: true });
  const prev = fs.existsSync(out) ? JSON.parse(fs.readFileSync(out, 'utf8')) : {};
  const last = (r: Record<string, unknown>) => (r.checks as Array<Record<string, number>>).at(-1)!;
  fs.writeFileSync(out, JSON.stringify({ ...prev, incremental: {
    date: new Date().toISOString(), cpu: os.cpus()[0]?.model, cores: os.cpus().length, buckets: K,
    what: 'Owner namespace A with N SNATed entries of one floating address; a full transfer to a receiver process writing namespace B as chunks arrive, then consistency checks with nothing changed.',
    summary: {
      checkBytes: Object.fromEntries(rows.map((r) => [String(r.entries), last(r).bytes])),
      transferEntriesPerSec: Object.fromEntries(rows.map((r) => [String(r.entries), (r.transfer as Record<string, number>).entriesPerSec])),
      receiverMaxRssMiB: Object.fromEntries(rows.map((r) => [String(r.entries), (r.transfer as Record<string, number>).receiverMaxRssMiB])),
    },
    rows,
  } }, null, 2) + '\n');
  console.log(`wrote ${out}`);
}
