// Conntrack sync pieces without sockets: entry codec round trips and bounds, frame sealing and the
// streaming reader, coalescing rules, key validation. (Address text: ip.test.ts.)
import { randomBytes } from 'node:crypto';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { IPS, type ConntrackEntry, type ConntrackEvent } from '../../daemon/conntrack/types';
import { SyncReceiver, SyncSender } from '../../daemon/conntrack-sync';
import { CoalescingQueue } from '../../daemon/conntrack-sync/coalescing-queue';
import { CodecError, Cursor, MAX_EVENT_BYTES, readEntry, readEvent, readList, writeEntry, writeEvent, writeList } from '../../daemon/conntrack-sync/entry-codec';
import { FrameReader, FrameRejected, FrameType, FrameWriter, MIN_FRAME_LENGTH, openFrame } from '../../daemon/conntrack-sync/frame';
import { TetherError } from '../../lib/errors';
import { entry, entry6 } from './conntrack-sync-fixtures';

const samples: ConntrackEntry[] = [
  entry(1),
  entry6(2),
  { orig: { family: 4, proto: 1, src: '10.0.0.1', dst: '8.8.8.8', icmpId: 77, icmpType: 8, icmpCode: 0 },
    reply: { family: 4, proto: 1, src: '8.8.8.8', dst: '203.0.113.10', icmpId: 77, icmpType: 0, icmpCode: 0 }, status: IPS.CONFIRMED, zone: 65535, id: 0xffffffff },
  { orig: { family: 4, proto: 47, src: '0.0.0.0', dst: '255.255.255.255' }, reply: { family: 4, proto: 47, src: '255.255.255.255', dst: '0.0.0.0' }, status: 0 },
  { ...entry(3), tcp: { state: 3 } },
  { orig: { family: 6, proto: 58, src: '::ffff:10.1.2.3', dst: '::', icmpId: 1 }, reply: { family: 6, proto: 58, src: '::', dst: '2001:db8::1:0:0:1' }, status: 0x3fff, timeout: 0 },
];

test('entries and events round-trip exactly, with only the fields they had', () => {
  const buf = Buffer.alloc(MAX_EVENT_BYTES * samples.length * 3);
  const events: ConntrackEvent[] = samples.flatMap((e) => [{ type: 'new', entry: e }, { type: 'update', entry: e }, { type: 'destroy', entry: e }]);
  const r = writeList(buf, 0, buf.length, events, 0, 1000, writeEvent, () => assert.unreachable('nothing is bad'));
  assert.is(r.count, events.length);
  assert.equal(readList(buf.subarray(0, r.end), 1000, readEvent), events);
  for (const e of samples) {
    const end = writeEntry(buf, 0, e);
    assert.ok(end <= MAX_EVENT_BYTES - 1);
    const c = new Cursor(buf, 0, end);
    assert.equal(readEntry(c), e);
    c.done();
  }
  assert.is(writeEntry(buf, 0, entry(1)), 55, 'a TCP/IPv4 entry with every option is 55 bytes');
});

test('decoding refuses truncation, trailing bytes, unknown bits and lying counts', () => {
  const buf = Buffer.alloc(256);
  const end = writeList(buf, 0, buf.length, [entry(1)], 0, 10, writeEntry, () => undefined).end;
  const good = buf.subarray(0, end);
  assert.is(readList(good, 10, readEntry).length, 1);
  for (let cut = 0; cut < good.length; cut++) assert.throws(() => readList(good.subarray(0, cut), 10, readEntry), (e: Error) => e instanceof CodecError, `cut at ${cut}`);
  assert.throws(() => readList(Buffer.concat([good, Buffer.from([0])]), 10, readEntry), (e: Error) => e instanceof CodecError && /after the payload/.test(e.message));
  const flags = Buffer.from(good);
  flags[4] |= 0x80;
  assert.throws(() => readList(flags, 10, readEntry), (e: Error) => e instanceof CodecError && /entry flags/.test(e.message));
  const lying = Buffer.from(good);
  lying.writeUInt32BE(1_000_000, 0);
  assert.throws(() => readList(lying, 2_000_000, readEntry), (e: Error) => e instanceof CodecError && /cannot fit/.test(e.message));
  assert.throws(() => readList(good, 0, readEntry), (e: Error) => e instanceof CodecError && /over the limit/.test(e.message));
  const evType = Buffer.alloc(64);
  const evEnd = writeEvent(evType, 0, { type: 'new', entry: entry(1) });
  evType[0] = 3;
  assert.throws(() => readEvent(new Cursor(evType, 0, evEnd)), /event type 3/);
});

test('an entry that cannot be encoded is skipped and reported, the rest goes out', () => {
  const bad = { ...entry(2), orig: { ...entry(2).orig, src: '10.0.0.256' } };
  const buf = Buffer.alloc(MAX_EVENT_BYTES * 4);
  const skipped: string[] = [];
  const r = writeList(buf, 0, buf.length, [entry(1), bad, entry(3)], 0, 10, writeEntry, (_i, e) => skipped.push(e.message));
  assert.equal(skipped, ["'10.0.0.256' is not an IPv4 address"]);
  assert.equal(readList(buf.subarray(0, r.end), 10, readEntry), [entry(1), entry(3)]);
});

test('frames: sealed and opened; any flipped bit is refused; sequence numbers count up', () => {
  const key = randomBytes(32);
  const w = new FrameWriter(Buffer.from('node-a'), key);
  const payload = Buffer.from('hello, frames');
  const f0 = w.build(FrameType.EVENTS, payload.length, (b, o) => o + payload.copy(b, o));
  const f1 = w.build(FrameType.HEARTBEAT, 0);
  const o0 = openFrame(f0, key);
  assert.equal([o0.type, o0.seq, o0.sender.toString(), o0.payload.toString()], [FrameType.EVENTS, 0, 'node-a', 'hello, frames']);
  assert.is(openFrame(f1, key).seq, 1);
  for (let i = 0; i < f0.length; i++) {
    for (const bit of [0x01, 0x80]) {
      const t = Buffer.from(f0);
      t[i] ^= bit;
      assert.throws(() => openFrame(t, key), (e: Error) => e instanceof FrameRejected && (e.reason === 'auth' || e.reason === 'malformed' || (i === 4 && e.reason === 'version')), `byte ${i}`);
    }
  }
  assert.throws(() => openFrame(f0, randomBytes(32)), (e: Error) => e instanceof FrameRejected && e.reason === 'auth');
});

test('frame reader: frames split at every byte boundary come out whole; bad lengths stop it', () => {
  const w = new FrameWriter(Buffer.from('x'), randomBytes(32));
  const frames = [0, 1, 100, 5000].map((n) => w.build(FrameType.EVENTS, n, (b, o) => {
    b.fill(n & 255, o, o + n);
    return o + n;
  }));
  const stream = Buffer.concat(frames);
  for (const step of [1, 3, 7, 64, 1000, stream.length]) {
    const got: Buffer[] = [];
    const r = new FrameReader(1 << 20, (f) => got.push(Buffer.from(f)), (e) => assert.unreachable(e.message));
    for (let i = 0; i < stream.length; i += step) r.push(stream.subarray(i, i + step));
    assert.equal(got, frames, `chunks of ${step}`);
  }
  const errors: FrameRejected[] = [];
  const seen: Buffer[] = [];
  const big = new FrameReader(1 << 20, (f) => seen.push(f), (e) => errors.push(e));
  const head = Buffer.alloc(4);
  head.writeUInt32BE((1 << 20) + 1);
  big.push(head.subarray(0, 2));
  big.push(Buffer.concat([head.subarray(2), frames[0]]));
  assert.equal(errors.map((e) => e.reason), ['oversize']);
  assert.is(seen.length, 0, 'nothing after the error');
  const small = new FrameReader(1 << 20, () => assert.unreachable(), (e) => errors.push(e));
  head.writeUInt32BE(MIN_FRAME_LENGTH - 1);
  small.push(head);
  assert.equal(errors.map((e) => e.reason), ['oversize', 'malformed']);
});

test('coalescing rules', () => {
  const q = new CoalescingQueue();
  const a = entry(1), a2 = entry(1, 2), b = entry(2), c = entry(3), c2 = entry(3, 1), d = entry(4);
  q.push({ type: 'new', entry: a }, 1);
  q.push({ type: 'update', entry: a2 }, 2); // new+update → new with the latest
  q.push({ type: 'new', entry: b }, 3);
  q.push({ type: 'destroy', entry: b }, 4); // new+destroy → nothing
  q.push({ type: 'destroy', entry: c }, 5);
  q.push({ type: 'new', entry: c2 }, 6); // destroy+new → destroy, then new
  q.push({ type: 'update', entry: d }, 7);
  q.push({ type: 'destroy', entry: d }, 8); // update+destroy → destroy
  assert.is(q.size, 4);
  assert.is(q.coalesced, 4);
  const first = q.take(1);
  assert.equal(first, { events: [{ type: 'new', entry: a2 }], since: 1 });
  const rest = q.take(100);
  assert.equal(rest.events, [{ type: 'destroy', entry: c2 }, { type: 'new', entry: c2 }, { type: 'destroy', entry: d }]);
  assert.is(rest.since, 5);
  assert.is(q.size, 0);
  q.push({ type: 'destroy', entry: c }, 9);
  q.push({ type: 'new', entry: c }, 10);
  q.push({ type: 'destroy', entry: c }, 11); // destroy, new, destroy → the first destroy
  assert.equal(q.take(10).events, [{ type: 'destroy', entry: c }]);
});

test('a cluster key under 32 bytes or a bad id is refused up front, naming the problem', () => {
  const noop = () => undefined;
  assert.throws(() => new SyncSender({ key: randomBytes(31), id: 'a', host: '127.0.0.1', port: 1, snapshot: () => [] }),
    (e: Error) => e instanceof TetherError && e.code === 'INVALID_CONFIG' && /conntrack sync key/.test(e.message));
  assert.throws(() => new SyncReceiver({ key: randomBytes(16), id: 'b', apply: noop, upsert: noop, sweep: noop, digests: () => undefined }), (e: Error) => e instanceof TetherError);
  assert.throws(() => new SyncReceiver({ key: randomBytes(32), id: '', apply: noop, upsert: noop, sweep: noop, digests: () => undefined }), /sender id/);
  assert.throws(() => new SyncSender({ key: randomBytes(32), id: 'x'.repeat(65), host: '127.0.0.1', port: 1, snapshot: () => [] }), /sender id/);
});

test.run();
