// Profiling harness (not a test, not part of `npm run bench`): the sync path without a kernel, for CPU
// profiles on any machine. The sender side takes synthetic ctnetlink event datagrams (as the kernel sends
// them) through ConntrackEvents' ring and main-thread path, encodeEventAt and a SyncSender (this thread
// also plays the reader worker's part, so its ringPut shows in the profile); the receiver side is a
// SyncReceiver keeping the entries in an EntryStore, as sync-peer.ts does. Each side in its own process.
// Nothing throttles the producer, so keep N under the sender's queue bound (200,000).
// Run: node_modules/.bin/esbuild test/bench/sync-synthetic.ts --bundle --platform=node --format=cjs
//   --external:koffi --outfile=/tmp/syn.js && NODE_PATH=$PWD/node_modules node --cpu-prof /tmp/syn.js 150000
import { fork } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { Writable } from 'node:stream';
import { CTA, CTA_PROTOINFO_TCP, CTA_PROTOINFO_TCP_ATTR as TCPA } from '../../daemon/conntrack/constants';
import { writeTuple } from '../../daemon/conntrack/codec';
import { Writer } from '../../daemon/conntrack/wire';
import { ConntrackEvents } from '../../daemon/conntrack';
import { createRing, RING_PRODUCER_SOURCE } from '../../daemon/conntrack/event-ring';
import { EventEmitter } from 'node:events';
import { encodeEventAt, EntryStore, SyncReceiver, SyncSender } from '../../daemon/conntrack-sync';
import { ipToBytes } from '../../lib/ip';
import { makeLogger, setLogger } from '../../lib/log';
import { MAX_EVENT_BYTES } from '../../daemon/conntrack-sync/entry-codec';

setLogger(makeLogger({ stream: new Writable({ write: (_c, _e, cb) => cb() }) }));
const NAT = '10.77.0.100';

/** A kernel-like IPCTNL_MSG_CT_NEW event payload for flow i. */
export function eventPayload(i: number, w = new Writer(512)): Buffer {
  w.off = 0;
  const sport = 10000 + (i % 50000), dport = 1000 + Math.floor(i / 50000);
  w.nfgen(2);
  writeTuple(w, CTA.TUPLE_ORIG, { family: 4, proto: 6, src: `10.${100 + ((i >> 16) & 127)}.${(i >> 8) & 255}.${i & 255}`, dst: '203.0.113.1', sport, dport });
  writeTuple(w, CTA.TUPLE_REPLY, { family: 4, proto: 6, src: '203.0.113.1', dst: NAT, sport: dport, dport: sport });
  w.be32(CTA.STATUS, 0x18e);
  w.be32(CTA.TIMEOUT, 3600);
  const pi = w.start(CTA.PROTOINFO);
  const t = w.start(CTA_PROTOINFO_TCP);
  w.u8(TCPA.STATE, 3);
  w.u8(TCPA.WSCALE_ORIGINAL, 7);
  w.u8(TCPA.WSCALE_REPLY, 7);
  w.pair(TCPA.FLAGS_ORIGINAL, 0x23, 0);
  w.pair(TCPA.FLAGS_REPLY, 0x23, 0);
  w.end(t);
  w.end(pi);
  w.be32(CTA.USE, 1);
  w.be32(CTA.ID, 0x10000 + i);
  return Buffer.from(w.buf.subarray(0, w.off));
}

const role = process.argv[2];
if (role === 'rx') {
  const key = Buffer.from(process.argv[3], 'hex');
  const expected = Number(process.argv[4]);
  const store = new EntryStore();
  let applied = 0;
  let c0 = process.cpuUsage();
  let t0 = 0;
  const rx = new SyncReceiver({
    key, id: 'b', host: '127.0.0.1', port: 0,
    applyWire: (list) => {
      if (!t0) { t0 = Date.now(); c0 = process.cpuUsage(); }
      store.applyEvents(list);
      applied += list.count;
      if (applied >= expected) {
        const c = process.cpuUsage(c0);
        process.send!({ done: true, cpuMs: (c.user + c.system) / 1000, ms: Date.now() - t0, held: store.size });
      }
    },
    upsertWire: () => undefined, sweep: () => undefined, digests: () => undefined,
  });
  void rx.listen().then((port) => process.send!({ port }));
  process.on('disconnect', () => void rx.close().then(() => process.exit(0)));
} else {
  void (async () => {
    const n = Number(process.argv[2] ?? 100_000);
    const key = randomBytes(32);
    const child = fork(__filename, ['rx', key.toString('hex'), String(n)], { execArgv: process.execArgv });
    const port = await new Promise<number>((r) => child.once('message', (m) => r((m as { port: number }).port)));
    const tx = new SyncSender({ key, id: 'a', host: '127.0.0.1', port, stream: NAT, snapshot: () => [] });
    tx.start();
    while (tx.stats().state !== 'streaming') await new Promise((r) => setTimeout(r, 5));
    // Datagrams as the kernel sends them (nlmsghdr + payload, one event each), built before the clock.
    const w = new Writer(512);
    const dgrams = Array.from({ length: n }, (_, i) => {
      const p = eventPayload(i, w);
      const d = Buffer.alloc(16 + p.length);
      d.writeUInt32LE(d.length, 0);
      d.writeUInt16LE((1 << 8) | 0, 4);
      d.writeUInt16LE(0x400 /* NLM_F_CREATE */, 6);
      p.copy(d, 16);
      return d;
    });
    // ConntrackEvents' main-thread path, fed through its ring by this thread instead of the reader worker.
    const ring = createRing(8 << 20);
    const reader = Object.assign(new EventEmitter(), { stop: () => undefined });
    const events = new ConntrackEvents(reader, () => undefined, ring);
    const scope = ipToBytes(NAT);
  // As the egress owner: each event's netlink bytes encoded for the wire in one scratch buffer, no objects.
  const scratch = Buffer.allocUnsafe(MAX_EVENT_BYTES);
  events.sink((type, buf, start, end) => {
    const n = encodeEventAt(buf, start, end, scope, scratch, 0);
    if (n > 0) tx.pushEncoded(type, scratch, 0, n);
  });
    const put = new Function(`${RING_PRODUCER_SOURCE}; return ringPut;`)() as (c: Int32Array, d: Uint8Array, b: Uint8Array, n: number) => string;
    const done = new Promise<{ cpuMs: number; ms: number; held: number }>((r) => child.on('message', (m) => { if ((m as { done?: boolean }).done) r(m as { cpuMs: number; ms: number; held: number }); }));
    const c0 = process.cpuUsage();
    const t0 = Date.now();
    for (let i = 0; i < n; ) {
      // As the worker: put while there is room, wake the consumer, let it run.
      while (i < n) {
        const r = put(ring.ctrl, ring.data, dgrams[i], dgrams[i].length);
        if (r === 'full') break;
        if (r === 'woke') reader.emit('message', { kind: 'wake' });
        i++;
      }
      await new Promise((r) => setImmediate(r));
    }
    const rxr = await done;
    const c = process.cpuUsage(c0);
    console.log(JSON.stringify({ n, ms: Date.now() - t0, txCpuMs: Math.round((c.user + c.system) / 1000), rxCpuMs: Math.round(rxr.cpuMs), held: rxr.held }));
    await tx.close();
    child.disconnect();
  })();
}
