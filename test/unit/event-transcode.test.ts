// The owner's fast path: ctnetlink event payloads encoded for the sync wire without decoding to objects
// must give exactly the bytes of the decode-then-encode path, filter by floating address, key one flow
// the same across events, refuse malformed payloads, and stream through SyncSender to a receiver.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { IPS, entryKey, type ConntrackEntry, type ConntrackEvent } from '../../daemon/conntrack';
import { decodeEntry } from '../../daemon/conntrack/codec';
import { SyncSender, encodeEventPayload } from '../../daemon/conntrack-sync';
import { CodecError, Cursor, MAX_EVENT_BYTES, readEntry, writeEntry } from '../../daemon/conntrack-sync/entry-codec';
import { ipToBytes } from '../../lib/ip';
import { KERNEL_TCP_SNAT, KERNEL_UDP6_SNAT, kernelShape, tcpSnat } from './ctnetlink-fixtures';
import { KEY, captureLogs, restoreLogs, startReceiver, waitFor } from './conntrack-sync-fixtures';

test.before(captureLogs);
test.after(restoreLogs);

function slowPath(payload: Buffer): Buffer {
  const buf = Buffer.alloc(MAX_EVENT_BYTES);
  return Buffer.from(buf.subarray(0, writeEntry(buf, 0, decodeEntry(payload))));
}

const ping: ConntrackEntry = {
  orig: { family: 4, proto: 1, src: '10.0.0.2', dst: '192.0.2.1', icmpId: 4242, icmpType: 8, icmpCode: 0 },
  reply: { family: 4, proto: 1, src: '192.0.2.1', dst: '10.99.0.1', icmpId: 777, icmpType: 0, icmpCode: 0 }, status: 0, timeout: 30,
};
const v6: ConntrackEntry = {
  orig: { family: 6, proto: 6, src: 'fd00::2', dst: '2001:db8::7', sport: 4000, dport: 443 },
  reply: { family: 6, proto: 6, src: '2001:db8::7', dst: 'fd00:99::1', sport: 443, dport: 24000 },
  status: IPS.SEEN_REPLY | IPS.ASSURED, timeout: 300, mark: 0xabcdef01, zone: 7, id: 123456789,
  tcp: { state: 3, wscaleOrig: 14, wscaleReply: 2, flagsOrig: 0x33, flagsReply: 0x0b },
};
const udpNoTimeout: ConntrackEntry = {
  orig: { family: 4, proto: 17, src: '10.0.0.3', dst: '198.51.100.9', sport: 5353, dport: 53 },
  reply: { family: 4, proto: 17, src: '198.51.100.9', dst: '10.99.0.1', sport: 53, dport: 61000 }, status: IPS.SEEN_REPLY,
};

test('the same bytes as decode + writeEntry: captured kernel payloads and built ones of every shape', () => {
  const payloads = [
    Buffer.from(KERNEL_TCP_SNAT, 'hex'), Buffer.from(KERNEL_UDP6_SNAT, 'hex'),
    kernelShape(tcpSnat), kernelShape(ping), kernelShape(v6), kernelShape(udpNoTimeout),
  ];
  for (const p of payloads) {
    const ev = encodeEventPayload('update', p)!;
    assert.ok(ev.bytes.equals(slowPath(p)), `bytes for ${JSON.stringify(decodeEntry(p).orig)}`);
    assert.is(ev.type, 'update');
    assert.equal(readEntry(new Cursor(ev.bytes)), decodeEntry(p), 'and they read back as the entry');
  }
});

test('only entries whose reply goes to the floating address; one key per flow whatever its state', () => {
  const p = Buffer.from(KERNEL_TCP_SNAT, 'hex');
  assert.ok(encodeEventPayload('new', p, ipToBytes('10.99.0.1')), 'SNATed to 10.99.0.1');
  assert.is(encodeEventPayload('new', p, ipToBytes('10.99.0.2')), undefined);
  assert.is(encodeEventPayload('new', p, ipToBytes('fd00:99::1')), undefined, 'an IPv6 scope never matches IPv4');
  assert.ok(encodeEventPayload('new', kernelShape(v6), ipToBytes('fd00:99::1')));
  const a = encodeEventPayload('new', kernelShape(tcpSnat))!;
  const b = encodeEventPayload('update', kernelShape({ ...tcpSnat, status: IPS.CONFIRMED, timeout: 5, tcp: { state: 7 } }))!;
  const c = encodeEventPayload('new', kernelShape({ ...tcpSnat, orig: { ...tcpSnat.orig, sport: 40001 } }))!;
  assert.is(a.key, b.key);
  assert.is.not(a.key, c.key);
});

test('malformed payloads are a CodecError, never a crash or a wrong entry', () => {
  const good = kernelShape(tcpSnat);
  for (const [what, p] of [
    ['shorter than nfgenmsg', good.subarray(0, 3)],
    ['attribute running past the end', good.subarray(0, 30)],
    ['no reply tuple', kernelShape(tcpSnat).subarray(0, 4 + good.readUInt16LE(4))],
  ] as Array<[string, Buffer]>) {
    assert.throws(() => encodeEventPayload('new', p), (e: unknown) => e instanceof CodecError, what);
  }
});

test('encoded events stream through SyncSender like decoded ones; coalescing works on them too', async () => {
  const { rx, table, port } = await startReceiver();
  const entries = Array.from({ length: 300 }, (_, i) => ({ ...tcpSnat, orig: { ...tcpSnat.orig, sport: 1000 + i }, reply: { ...tcpSnat.reply, dport: 1000 + i } }));
  const tx = new SyncSender({ key: KEY, id: 'node-a', host: '127.0.0.1', port, stream: '10.99.0.1', snapshot: () => [] });
  try {
    tx.start();
    await waitFor(() => tx.stats().state === 'streaming', 'connected');
    const truth = new Map<string, ConntrackEntry>();
    const push = (type: ConntrackEvent['type'], e: ConntrackEntry) => {
      if (type === 'destroy') truth.delete(entryKey(e));
      else truth.set(entryKey(e), e);
      tx.push(encodeEventPayload(type, kernelShape(e))!);
    };
    for (const e of entries) push('new', e);
    for (const e of entries.slice(0, 100)) push('update', { ...e, timeout: 17 });
    for (const e of entries.slice(100, 150)) push('destroy', e);
    await waitFor(() => table.map.size === truth.size && [...truth.keys()].every((k) => table.map.has(k)), 'receiver holds the truth');
    for (const [k, e] of truth) assert.equal(table.map.get(k), e);
    assert.is(table.map.get(entryKey(entries[0]))!.timeout, 17);
  } finally {
    await tx.close();
    await rx.close();
  }
});

test.run();
