// Micro-benchmark (not a test): conntrack sync payload codec, binary against JSON, and end-to-end
// throughput over loopback TCP (resync and streamed events, encode+MAC+send+verify+decode+apply).
// Run: node_modules/.bin/tsx test/bench/conntrack-sync.ts
import { randomBytes } from 'node:crypto';
import { Writable } from 'node:stream';
import { IPS, type ConntrackEntry, type ConntrackEvent } from '../../daemon/conntrack/types';
import { MAX_EVENT_BYTES, readEvent, readList, writeEvent, writeList } from '../../daemon/conntrack-sync/entry-codec';
import { SyncReceiver, SyncSender } from '../../daemon/conntrack-sync';
import { makeLogger, setLogger } from '../../lib/log';

setLogger(makeLogger({ stream: new Writable({ write: (_c, _e, cb) => cb() }) }));
const KEY = randomBytes(32);

function entry(i: number, v6 = false): ConntrackEntry {
  const sport = 1024 + (i % 60000);
  const src = v6 ? `fd00::${(i >>> 16).toString(16)}:${(i & 0xffff).toString(16)}` : `10.${(i >> 16) & 255}.${(i >> 8) & 255}.${i & 255}`;
  const fl = v6 ? 6 : 4;
  const dst = v6 ? '2001:db8::7' : '198.51.100.7';
  const nat = v6 ? '2001:db8:ffff::10' : '203.0.113.10';
  return {
    orig: { family: fl, proto: 6, src, dst, sport, dport: 443 },
    reply: { family: fl, proto: 6, src: dst, dst: nat, sport: 443, dport: sport },
    status: IPS.CONFIRMED | IPS.SEEN_REPLY | IPS.ASSURED | IPS.SRC_NAT | IPS.SRC_NAT_DONE,
    timeout: 431999, mark: 0x100, zone: 0, tcp: { state: 3, wscaleOrig: 7, wscaleReply: 7, flagsOrig: 0x2323, flagsReply: 0x2323 }, id: i,
  };
}

const rate = (n: number, ms: number) => `${Math.round(n / (ms / 1000)).toLocaleString('en')} entries/s`;
const time = (f: () => void) => {
  const t0 = process.hrtime.bigint();
  f();
  return Number(process.hrtime.bigint() - t0) / 1e6;
};

function codec(v6: boolean): void {
  const N = 200_000;
  const events: ConntrackEvent[] = Array.from({ length: N }, (_, i) => ({ type: 'new', entry: entry(i, v6) }));
  const frames: Buffer[] = [];
  const enc = time(() => {
    for (let i = 0; i < N; ) {
      const buf = Buffer.allocUnsafe(1000 * MAX_EVENT_BYTES + 4);
      const r = writeList(buf, 0, buf.length, events, i, 1000, writeEvent, () => undefined);
      frames.push(buf.subarray(0, r.end));
      i = r.next;
    }
  });
  let n = 0;
  const dec = time(() => {
    for (const f of frames) n += readList(f, 1000, readEvent).length;
  });
  const bytes = frames.reduce((a, f) => a + f.length, 0);
  const json: Buffer[] = [];
  const jenc = time(() => {
    for (let i = 0; i < N; i += 1000) json.push(Buffer.from(JSON.stringify(events.slice(i, i + 1000))));
  });
  const jdec = time(() => {
    for (const j of json) JSON.parse(j.toString());
  });
  const jbytes = json.reduce((a, f) => a + f.length, 0);
  if (n !== N) throw new Error('decode lost entries');
  console.log(`codec ${v6 ? 'IPv6' : 'IPv4'}: binary ${(bytes / N).toFixed(1)} B/entry, encode ${rate(N, enc)}, decode ${rate(N, dec)}`);
  console.log(`             JSON ${(jbytes / N).toFixed(1)} B/entry, encode ${rate(N, jenc)}, decode ${rate(N, jdec)}`);
}

async function loopback(n: number, streamed: number): Promise<void> {
  const truth = Array.from({ length: n }, (_, i) => entry(i, i % 10 === 9));
  let replaced = 0;
  let applied = 0;
  let t1 = 0;
  const rx = new SyncReceiver({
    key: KEY, id: 'rx', host: '127.0.0.1',
    upsert: () => undefined,
    sweep: (keep) => { replaced = keep.size; t1 = Date.now(); },
    digests: () => undefined,
    apply: (e) => { applied += e.length; },
  });
  const port = await rx.listen();
  const tx = new SyncSender({ key: KEY, id: 'tx', host: '127.0.0.1', port, snapshot: () => truth });
  try {
    const t0 = Date.now();
    tx.start();
    while (!replaced) await new Promise((r) => setTimeout(r, 1));
    console.log(`loopback resync ${n.toLocaleString('en')} entries: ${t1 - t0} ms, ${rate(n, t1 - t0)}`);
    const t2 = Date.now();
    for (let i = 0; i < streamed; i += 5000) {
      const batch: ConntrackEvent[] = [];
      for (let j = i; j < i + 5000; j++) batch.push({ type: 'update', entry: entry(n + j) });
      tx.push(batch);
      await new Promise((r) => setImmediate(r));
    }
    while (applied < streamed) await new Promise((r) => setTimeout(r, 1));
    const ms = Date.now() - t2;
    console.log(`loopback stream ${streamed.toLocaleString('en')} events (batches of 5000 per tick): ${ms} ms, ${rate(streamed, ms)}`);
  } finally {
    await tx.close();
    await rx.close();
  }
}

(async () => {
  codec(false);
  codec(true);
  await loopback(100_000, 200_000);
  await loopback(1_000_000, 500_000);
})();
