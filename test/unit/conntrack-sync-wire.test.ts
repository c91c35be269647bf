// The sync paths that work on entries in their wire form, without an object per entry: received lists
// validated as strictly as the decoder, ctnetlink messages written from wire bytes exactly as from the
// decoded entry, key hashes from bytes equal to those from entries, the in-memory EntryStore against a
// Map model, the byte queue's coalescing and framing, the event sink, and frames built in a reused buffer.
import { canonicalIp } from '../../lib/ip';
import { randomBytes } from 'node:crypto';
import { EventEmitter } from 'node:events';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { ConntrackEvents, IPS, entryKey, type ConntrackEntry, type ConntrackEvent } from '../../daemon/conntrack';
import { writeCreate, writeLookup, writeUpdate } from '../../daemon/conntrack/codec';
import { createRing } from '../../daemon/conntrack/event-ring';
import { Writer } from '../../daemon/conntrack/wire';
import { EntryStore, KeySet, keyHash, keyHashAt, WireList } from '../../daemon/conntrack-sync';
import { CoalescingQueue } from '../../daemon/conntrack-sync/coalescing-queue';
import { bucketOf } from '../../daemon/conntrack-sync/digest';
import { CodecError, Cursor, EncodedEntries, MAX_EVENT_BYTES, readEvent, readList, writeEntry, writeEvent, writeList } from '../../daemon/conntrack-sync/entry-codec';
import { encodeEventAt, encodeEventPayload } from '../../daemon/conntrack-sync/event-transcode';
import { FrameWriter, openFrame, FrameType } from '../../daemon/conntrack-sync/frame';
import { writeCreateAt, writeLookupAt, writeUpdateAt } from '../../daemon/conntrack-sync/table-wire';
import { KERNEL_TCP_SNAT, KERNEL_UDP6_SNAT, kernelShape, ringPut, tcpSnat } from './ctnetlink-fixtures';
import { entry, entry6 } from './conntrack-sync-fixtures';

const ping: ConntrackEntry = {
  orig: { family: 4, proto: 1, src: '10.0.0.2', dst: '192.0.2.1', icmpId: 4242, icmpType: 8, icmpCode: 0 },
  reply: { family: 4, proto: 1, src: '192.0.2.1', dst: '10.99.0.1', icmpId: 777, icmpType: 0, icmpCode: 0 }, status: 0, timeout: 30,
};
const ping6: ConntrackEntry = {
  orig: { family: 6, proto: 58, src: 'fd00::2', dst: '2001:db8::1', icmpId: 9, icmpType: 128, icmpCode: 0 },
  reply: { family: 6, proto: 58, src: '2001:db8::1', dst: 'fd00::99', icmpId: 9, icmpType: 129, icmpCode: 0 }, status: IPS.SRC_NAT, timeout: 30,
};
const dnat: ConntrackEntry = {
  orig: { family: 4, proto: 17, src: '10.0.0.2', dst: '10.96.0.10', sport: 5000, dport: 53 },
  reply: { family: 4, proto: 17, src: '10.1.2.3', dst: '10.0.0.2', sport: 5353, dport: 5000 }, status: IPS.DST_NAT, timeout: 20, mark: 1,
};
const noNat: ConntrackEntry = {
  orig: { family: 4, proto: 6, src: '10.0.0.2', dst: '10.0.0.3', sport: 1, dport: 2 },
  reply: { family: 4, proto: 6, src: '10.0.0.3', dst: '10.0.0.2', sport: 2, dport: 1 }, status: IPS.SEEN_REPLY | IPS.ASSURED, tcp: { state: 3 },
};
const gre: ConntrackEntry = {
  orig: { family: 4, proto: 47, src: '10.0.0.2', dst: '10.0.0.3' }, reply: { family: 4, proto: 47, src: '10.0.0.3', dst: '10.9.9.9' }, status: IPS.SRC_NAT, timeout: 5, zone: 9,
};
const shapes: ConntrackEntry[] = [
  ping, ping6, dnat, noNat, gre, tcpSnat, { ...entry(3), zone: 5 },
  ...Array.from({ length: 40 }, (_, i) => entry(i * 7919, i)), ...Array.from({ length: 20 }, (_, i) => entry6(i + 1)),
];

function wire(e: ConntrackEntry): Buffer {
  const buf = Buffer.alloc(MAX_EVENT_BYTES);
  return buf.subarray(0, writeEntry(buf, 0, e));
}

function bytesOf(fn: (w: Writer) => void): Buffer {
  const w = new Writer(16);
  fn(w);
  return Buffer.from(w.buf.subarray(0, w.off));
}

test('ctnetlink messages written from wire bytes are the bytes written from the decoded entry', () => {
  for (const e of shapes) {
    const b = wire(e);
    for (const min of [0, 600]) {
      const standby = e.timeout !== undefined && e.timeout < min ? { ...e, timeout: min } : e;
      const what = `${JSON.stringify(e.orig)} min ${min}`;
      assert.ok(bytesOf((w) => writeCreateAt(w, b, 0, min)).equals(bytesOf((w) => writeCreate(w, standby))), `create ${what}`);
      assert.ok(bytesOf((w) => writeUpdateAt(w, b, 0, min)).equals(bytesOf((w) => writeUpdate(w, standby, 0))), `update ${what}`);
    }
    assert.ok(bytesOf((w) => writeLookupAt(w, b, 0)).equals(bytesOf((w) => writeLookup(w, e.orig, e.zone))), `lookup ${JSON.stringify(e.orig)}`);
  }
});

/** IPv6 addresses of every text shape: runs of zero groups at the start, middle and end, ties, single zero groups, mapped and compatible IPv4, all zeros. */
const v6Shapes = ['::', '::1', '1::', 'fd00::1', '2001:db8:0:0:1:0:0:1', '2001:0:0:1:0:0:0:1', '1:0:2:0:3:0:4:0', 'ffff:abcd:1234:ff:f:0:10:a', '::ffff:10.1.2.3', '::10.1.2.3', '0:0:1::', 'fe80::a:0:0:0:b'].map(canonicalIp);

test('key hashes from wire bytes equal those of the decoded entry (buckets and sweeps agree)', () => {
  const v6 = v6Shapes.flatMap((src, i) => [src, v6Shapes[(i + 5) % v6Shapes.length]].map((dst) => ({ ...ping6, orig: { ...ping6.orig, src, dst }, reply: { ...ping6.reply, src: dst, dst: src } })));
  for (const e of [...shapes, ...v6]) {
    assert.equal(keyHashAt(wire(e), 0), keyHash(e), JSON.stringify(e.orig));
    assert.is(keyHashAt(wire(e), 0)[1] % 1024, bucketOf(e, 1024));
  }
});

test('a received list is refused on truncation, trailing bytes, unknown bits, lying counts and mixed families, as the decoder refuses it', () => {
  const buf = Buffer.alloc(MAX_EVENT_BYTES * 8);
  const events: ConntrackEvent[] = [{ type: 'new', entry: entry(1) }, { type: 'destroy', entry: ping }, { type: 'update', entry: entry6(3) }];
  const good = buf.subarray(0, writeList(buf, 0, buf.length, events, 0, 10, writeEvent, () => undefined).end);
  const list = WireList.parse(good, 10, true);
  assert.is(list.count, 3);
  assert.equal(list.events(), events, 'decodes to what was written');
  assert.equal([0, 1, 2].map((i) => list.len(i)), events.map((ev) => wire(ev.entry).length));
  for (let cut = 0; cut < good.length; cut++) {
    assert.throws(() => WireList.parse(good.subarray(0, cut), 10, true), (e: Error) => e instanceof CodecError, `cut at ${cut}`);
  }
  assert.throws(() => WireList.parse(Buffer.concat([good, Buffer.from([0])]), 10, true), /after the payload/);
  const flags = Buffer.from(good);
  flags[5] |= 0x80;
  assert.throws(() => WireList.parse(flags, 10, true), /entry flags/);
  const type = Buffer.from(good);
  type[4] = 3;
  assert.throws(() => WireList.parse(type, 10, true), /event type 3/);
  const lying = Buffer.from(good);
  lying.writeUInt32BE(1_000_000, 0);
  assert.throws(() => WireList.parse(lying, 2_000_000, true), /cannot fit/);
  assert.throws(() => WireList.parse(good, 2, true), /over the limit/);
  // Every single-byte change: refused as the decoder refuses it, or read as the decoder reads it. The one
  // stricter rule: both tuples of an entry in one address family (a kernel entry always is).
  const outcome = (f: () => unknown) => {
    try {
      return f();
    } catch (e) {
      if (!(e instanceof CodecError)) throw e;
      return /two address families/.test(e.message) ? 'mixed' : 'refused';
    }
  };
  for (let i = 0; i < good.length; i++) {
    const bad = Buffer.from(good);
    bad[i] ^= 0xff;
    const decoded = outcome(() => readList(bad, 10, readEvent));
    const parsed = outcome(() => WireList.parse(bad, 10, true).events());
    if (parsed !== 'mixed') assert.equal(parsed, decoded, `byte ${i}`);
  }
  const mixed = Buffer.alloc(MAX_EVENT_BYTES + 4);
  const n = writeList(mixed, 0, mixed.length, [{ ...entry(1), reply: entry6(1).reply }], 0, 1, writeEntry, () => undefined).end;
  assert.throws(() => WireList.parse(mixed.subarray(0, n), 1, false), /two address families/);
});

test('EntryStore holds what a Map of decoded entries holds, through creates, replaces, deletes, sweeps and growth', () => {
  const store = new EntryStore(4);
  const model = new Map<string, ConntrackEntry>();
  const keyOf = (e: ConntrackEntry) => `${entryKey(e)}#${e.zone ?? 0}`;
  let seed = 7;
  const rnd = (n: number) => {
    seed = (Math.imul(seed, 1103515245) + 12345) >>> 0;
    return seed % n;
  };
  const buf = Buffer.alloc(MAX_EVENT_BYTES * 1000 + 4);
  for (let round = 0; round < 40; round++) {
    const events: ConntrackEvent[] = [];
    for (let i = 0; i < 500; i++) {
      const k = rnd(3000);
      // Same flow, other content (a longer entry with a mark, or a zone of its own) to replace and to add lengths.
      const base = k % 5 === 0 ? entry6(k + 1) : entry(k, rnd(3));
      const e = rnd(4) === 0 ? { ...base, mark: rnd(1000) } : k % 7 === 0 ? { ...base, zone: 3 } : base;
      events.push({ type: rnd(4) === 0 ? 'destroy' : rnd(2) ? 'new' : 'update', entry: e });
    }
    const end = writeList(buf, 0, buf.length, events, 0, 1000, writeEvent, () => assert.unreachable()).end;
    store.applyEvents(WireList.parse(buf.subarray(0, end), 1000, true));
    for (const ev of events) {
      if (ev.type === 'destroy') model.delete(keyOf(ev.entry));
      else model.set(keyOf(ev.entry), ev.entry);
    }
    assert.is(store.size, model.size, `size after round ${round}`);
  }
  const held = new Map(store.entries().map((e) => [keyOf(e), e]));
  assert.equal(held, model);
  // A transfer that carried only every other entry: the sweep deletes the rest.
  const keep = new KeySet();
  const kept = [...model.values()].filter((_, i) => i % 2 === 0);
  for (const e of kept) keep.add(...keyHash(e));
  assert.is(store.sweep(keep, { k: 64 }), model.size - kept.length);
  assert.equal(new Map(store.entries().map((e) => [keyOf(e), e])), new Map(kept.map((e) => [keyOf(e), e])));
  // Only the listed buckets are swept.
  const none = new KeySet();
  const inBucket3 = kept.filter((e) => bucketOf(e, 64) === 3).length;
  assert.is(store.sweep(none, { k: 64, list: [3] }), inBucket3);
  assert.is(store.size, kept.length - inBucket3);
});

test('the byte queue: encoded and decoded events coalesce alike, frames respect their count and room, the log is reused', () => {
  const q = new CoalescingQueue();
  const e1 = encodeEventPayload('new', kernelShape(tcpSnat))!;
  const e1b = encodeEventPayload('update', kernelShape({ ...tcpSnat, timeout: 5 }))!;
  q.push(e1, 1);
  q.push(e1b, 2);
  q.push({ type: 'destroy', entry: entry(9) }, 3);
  q.push({ type: 'new', entry: { ...entry(9), mark: 7 } }, 4);
  assert.is(q.size, 3, 'new+update is one; destroy+new is two');
  const buf = Buffer.alloc(4096);
  // A count limit of 1 still writes the one slot; a destroy-then-new slot goes out whole or not at all.
  let r = q.writeInto(buf, 0, buf.length, 1);
  assert.is(r.count, 1);
  assert.equal(readEvent(new Cursor(buf, 0, r.end)), { type: 'new', entry: readEvent(new Cursor(Buffer.concat([Buffer.from([0]), e1b.bytes]))).entry });
  assert.is(r.since, 1);
  r = q.writeInto(buf, 0, 10, 10);
  assert.is(r.count, 0, 'no room: nothing written, nothing lost');
  r = q.writeInto(buf, 0, buf.length, 10);
  const c = new Cursor(buf, 0, r.end);
  assert.equal([readEvent(c), readEvent(c)], [{ type: 'destroy', entry: { ...entry(9), mark: 7 } }, { type: 'new', entry: { ...entry(9), mark: 7 } }]);
  assert.is(q.size, 0);
  // Many events through small frames: every one comes out once, in order, while the log is compacted and reused.
  const big = Buffer.alloc(MAX_EVENT_BYTES * 50);
  let out = 0;
  for (let round = 0; round < 30; round++) {
    for (let i = 0; i < 3000; i++) q.push({ type: 'new', entry: entry(round * 3000 + i) }, round);
    while (q.size > 2000) out += q.writeInto(big, 0, big.length, 50).count;
  }
  while (q.size) {
    const w = q.writeInto(big, 0, big.length, 50);
    const cur = new Cursor(big, 0, w.end);
    for (let i = 0; i < w.count; i++) assert.is(readEvent(cur).entry.id, entry(out + i).id);
    out += w.count;
  }
  assert.is(out, 90_000);
});

test('ConntrackEvents.sink gets each event in place, the same bytes a raw listener gets, and encodes as encodeEventPayload', () => {
  const ring = createRing(64 << 10);
  const reader = Object.assign(new EventEmitter(), { stop: () => undefined });
  const ev = new ConntrackEvents(reader, () => undefined, ring);
  const payloads = [Buffer.from(KERNEL_TCP_SNAT, 'hex'), Buffer.from(KERNEL_UDP6_SNAT, 'hex'), kernelShape(ping)];
  const raw: Buffer[] = [];
  const sunk: Array<[string, Buffer]> = [];
  const enc: Buffer[] = [];
  const scratch = Buffer.alloc(MAX_EVENT_BYTES);
  ev.on('raw', (_t, p) => raw.push(Buffer.from(p)));
  ev.sink((type, buf, start, end) => {
    sunk.push([type, Buffer.from(buf.subarray(start, end))]);
    enc.push(Buffer.from(scratch.subarray(0, encodeEventAt(buf, start, end, undefined, scratch, 0))));
  });
  const types = [0x400, 0, 0]; // NLM_F_CREATE (new), update, then a delete message
  payloads.forEach((p, i) => {
    const d = Buffer.alloc(16 + p.length);
    d.writeUInt32LE(d.length, 0);
    d.writeUInt16LE((1 << 8) | (i === 2 ? 2 : 0), 4);
    d.writeUInt16LE(types[i], 6);
    p.copy(d, 16);
    ringPut(ring.ctrl, ring.data, d, d.length);
  });
  reader.emit('message', { kind: 'wake' });
  assert.equal(sunk.map(([t]) => t), ['new', 'update', 'destroy']);
  assert.equal(sunk.map(([, b]) => b), raw);
  assert.equal(sunk.map(([, b]) => b), payloads);
  assert.equal(enc, payloads.map((p, i) => encodeEventPayload(sunk[i][0] as 'new', p)!.bytes));
  assert.is(ev.received, 3);
});

test('frames built in the reused buffer are each sealed on their own bytes', () => {
  const key = randomBytes(32);
  const w = new FrameWriter(Buffer.from('a'), key);
  const big = w.build(FrameType.EVENTS, 5000, (b, o) => { b.fill(7, o, o + 5000); return o + 5000; });
  const small = w.build(FrameType.HEARTBEAT, 0);
  const mid = w.build(FrameType.EVENTS, 5000, (b, o) => { b.fill(9, o, o + 10); return o + 10; });
  assert.equal([big.length, small.length, mid.length], [24 + 1 + 5000 + 16, 24 + 1 + 16, 24 + 1 + 10 + 16]);
  assert.equal([openFrame(big, key).seq, openFrame(small, key).seq, openFrame(mid, key).seq], [0, 1, 2]);
  assert.ok(openFrame(big, key).payload.equals(Buffer.alloc(5000, 7)), 'a later frame did not overwrite an earlier one');
});

test('an encoded snapshot reads back as its entries', () => {
  const s = new EncodedEntries(2);
  for (const e of shapes) s.append(wire(e), 0, wire(e).length);
  assert.is(s.count, shapes.length);
  assert.equal(s.entries(), shapes.map((e) => readEvent(new Cursor(Buffer.concat([Buffer.from([0]), wire(e)]))).entry));
});

test.run();
