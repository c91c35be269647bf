// Incremental conntrack sync over real TCP on 127.0.0.1 (the receiver's table modelled in memory; the
// kernel version is in test/kernel/conntrack-sync.test.ts): the consistency check costs O(buckets) bytes
// whatever the table's size, differing buckets alone travel again, a transfer cut off halfway deletes
// nothing, and the digest / key-set structures themselves.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { entryKey, type ConntrackEntry } from '../../daemon/conntrack/types';
import { Digests, KeySet, StandbyDigests, SyncSender, bucketOf, keyHash, type SyncSenderOptions } from '../../daemon/conntrack-sync';
import { FrameType } from '../../daemon/conntrack-sync/frame';
import { KEY, captureLogs, logLines, restoreLogs, Proxy, Table, entry, ev, sameTable, sleep, startReceiver, waitFor } from './conntrack-sync-fixtures';

function sender(port: number, truth: Map<string, ConntrackEntry>, opts: Partial<SyncSenderOptions> = {}): SyncSender {
  return new SyncSender({ key: KEY, id: 'node-a', host: '127.0.0.1', port, stream: '203.0.113.10', epoch: 1, snapshot: () => [...truth.values()], backoffMinMs: 20, backoffMaxMs: 100, ...opts });
}

function tableOf(n: number, from = 0): Map<string, ConntrackEntry> {
  const m = new Map<string, ConntrackEntry>();
  for (let i = from; i < from + n; i++) m.set(entryKey(entry(i)), entry(i));
  return m;
}

test.before(captureLogs);
test.after(restoreLogs);

test('digests: order-independent, blind to timeouts, a changed NAT mapping or TCP state shows in its bucket only', () => {
  const es = [...tableOf(5000).values()];
  const a = Digests.of(es, 64);
  const b = Digests.of([...es].reverse().map((e) => ({ ...e, timeout: 5, id: 1 })), 64);
  assert.equal(a.diff(b), [], 'order and timeouts do not matter');
  assert.is(a.entries, 5000);
  const changed = { ...es[17], reply: { ...es[17].reply, dport: 1 } };
  const c = Digests.of([...es.slice(0, 17), changed, ...es.slice(18)], 64);
  assert.equal(a.diff(c), [bucketOf(es[17], 64)]);
  const tcp = { ...es[18], tcp: { ...es[18].tcp!, state: 7 } };
  assert.equal(a.diff(Digests.of([...es.slice(0, 18), tcp, ...es.slice(19)], 64)), [bucketOf(es[18], 64)]);
  const buf = Buffer.alloc(a.wireBytes);
  assert.is(a.write(buf, 0), a.wireBytes);
  assert.equal(Digests.read(buf).diff(a), [], 'wire round trip');
  assert.throws(() => Digests.read(buf.subarray(0, buf.length - 1)), /64 buckets in/);
});

test('key set: every added key is found, others are not, across growth', () => {
  const s = new KeySet(4);
  const keys = [...tableOf(50_000).values()].map((e) => keyHash(e));
  for (const [h, l] of keys) s.add(h, l);
  s.add(0, 0);
  assert.is(s.size, 50_001);
  assert.ok(keys.every(([h, l]) => s.has(h, l)));
  assert.ok(s.has(0, 0));
  const others = [...tableOf(5000, 100_000).values()].map((e) => keyHash(e));
  assert.is(others.filter(([h, l]) => s.has(h, l)).length, 0);
  assert.ok(s.bytes <= 50_001 * 32, `${s.bytes} bytes`);
});

test('standby digests are kept until the stream writes, or until they are old enough to re-arm copies', async () => {
  const c = new StandbyDigests(200);
  let n = 0;
  const compute = async () => {
    n++;
    return new Digests(8);
  };
  await c.get('s#a', 8, compute);
  await c.get('s#a', 8, compute);
  assert.is(n, 1, 'an idle check computes nothing');
  c.invalidatePrefix('s#');
  await c.get('s#a', 8, compute);
  assert.is(n, 2, 'after a write');
  await c.get('s#a', 16, compute);
  assert.is(n, 3, 'another bucket count');
  await sleep(220);
  await c.get('s#a', 16, compute);
  assert.is(n, 4, 'after maxAge');
});

for (const n of [2000, 50_000]) {
  test(`steady state with ${n} entries: a consistency check sends O(buckets) bytes and nothing is re-sent`, async () => {
    const truth = tableOf(n);
    const { rx, table, port } = await startReceiver();
    const tx = sender(port, truth, { buckets: 256 });
    try {
      tx.start();
      await waitFor(() => tx.stats().state === 'streaming' && table.replaceCalls.length === 1, 'the initial transfer', 20_000);
      await waitFor(() => tx.stats().inflightFrames === 0, 'acked');
      const before = tx.stats();
      const rxBefore = rx.stats().checks;
      for (let i = 0; i < 3; i++) tx.checkConsistency();
      tx.checkConsistency();
      await waitFor(() => rx.stats().checks >= rxBefore + 1, 'the receiver compared');
      await sleep(50);
      const after = tx.stats();
      const bytes = after.bytesSent - before.bytesSent;
      // 256 buckets × 12 bytes + header: the same for 2,000 and 50,000 entries (today's resync: ~n × 60 B).
      assert.ok(after.checks - before.checks === 1, `one check while the first was pending (${after.checks - before.checks})`);
      assert.ok(bytes < 256 * 12 + 200, `a check sent ${bytes} bytes for ${n} entries`);
      assert.is(after.entriesSent, before.entriesSent, 'no entry was sent again');
      assert.is(after.resyncs, 1);
      assert.is(after.bucketResyncs, 0);
      assert.is(rx.stats().bucketsRequested, 0);
      assert.is(sameTable(truth, table.map), undefined);
    } finally {
      await tx.close();
      await rx.close();
    }
  });
}

test('a standby that lost and gained entries behind the stream gets just those buckets again', async () => {
  const truth = tableOf(20_000);
  const { rx, table, port } = await startReceiver();
  const tx = sender(port, truth, { buckets: 1024 });
  try {
    tx.start();
    await waitFor(() => tx.stats().state === 'streaming' && table.replaceCalls.length === 1, 'the initial transfer');
    // The standby's copies change without the stream: one expired, one left over, one altered.
    const lost = entry(5), extra = entry(90_000), altered = { ...entry(6), tcp: { ...entry(6).tcp!, state: 8 } };
    table.map.delete(entryKey(lost));
    table.map.set(entryKey(extra), extra);
    table.map.set(entryKey(altered), altered);
    const sentBefore = tx.stats().entriesSent;
    tx.checkConsistency();
    await waitFor(() => table.bucketCalls.length === 1, 'the differing buckets sent again');
    const buckets = new Set([lost, extra, altered].map((e) => bucketOf(e, 1024)));
    assert.equal(table.bucketCalls[0], [...buckets].sort((a, b) => a - b));
    assert.is(sameTable(truth, table.map), undefined, 'consistent again');
    const resent = tx.stats().entriesSent - sentBefore;
    assert.ok(resent < 200, `${resent} entries re-sent for ${buckets.size} buckets of ~20 entries`);
    assert.is(rx.stats().bucketsRequested, buckets.size);
    // Nothing left to fix: the next check asks for nothing (sent once the last one is acked).
    await waitFor(() => tx.stats().ackedSeq === tx.stats().lastSeq, 'all acked');
    tx.checkConsistency();
    await waitFor(() => rx.stats().checks === 2, 'second check');
    await sleep(50);
    assert.is(table.bucketCalls.length, 1);
  } finally {
    await tx.close();
    await rx.close();
  }
});

test('an entry deleted at the owner while the stream was down is gone from the standby after reconnect', async () => {
  const truth = tableOf(3000);
  let { rx, table, port } = await startReceiver();
  const tx = sender(port, truth);
  try {
    tx.start();
    await waitFor(() => table.replaceCalls.length === 1, 'first transfer');
    await rx.close();
    await waitFor(() => tx.stats().disconnects === 1, 'sender noticed');
    // The standby keeps its table (a kernel table outlives the connection); the owner moves on.
    const kept = table;
    truth.delete(entryKey(entry(10)));
    truth.set(entryKey(entry(3, 9)), entry(3, 9));
    tx.push([ev('destroy', entry(10))]); // dropped: not connected
    ({ rx, table } = await startReceiver({ port }, kept));
    await waitFor(() => table.replaceCalls.length === 2, 'transfer after reconnect');
    assert.not.ok(table.map.has(entryKey(entry(10))), 'deleted while down: swept');
    assert.is(table.map.get(entryKey(entry(3)))!.timeout, entry(3, 9).timeout, 'changed while down: updated');
    assert.is(sameTable(truth, table.map), undefined);
  } finally {
    await tx.close();
    await rx.close();
  }
});

test('an entry changed and one created mid-transfer are right at the end', async () => {
  const truth = tableOf(40_000);
  const table = new Table();
  // A slow standby: the transfer takes a while, so the owner's table moves on in its middle.
  const { rx, port } = await startReceiver({ upsert: async (es) => { await sleep(5); table.upsert(es); } }, table);
  const tx = sender(port, truth, { chunkEntries: 500, maxInflightFrames: 4 });
  try {
    tx.start();
    await waitFor(() => tx.stats().state === 'resync' && table.upserted > 0, 'transfer under way');
    const changed = entry(39_999, 4), created = entry(77_777);
    truth.set(entryKey(changed), changed);
    truth.set(entryKey(created), created);
    truth.delete(entryKey(entry(1)));
    tx.push([ev('update', changed), ev('new', created), ev('destroy', entry(1))]);
    assert.ok(table.upserted < 40_000, 'the changes came mid-transfer');
    await waitFor(() => table.replaceCalls.length === 1 && table.applied.length === 3, 'transfer and events applied', 20_000);
    assert.is(sameTable(truth, table.map), undefined);
  } finally {
    await tx.close();
    await rx.close();
  }
});

test('a transfer cut off halfway deletes nothing at the receiver; the next one completes and sweeps', async () => {
  const truth = tableOf(40_000);
  const table = new Table();
  // What the standby held before: 1000 of the owner's entries and 50 the owner no longer has.
  for (const e of [...tableOf(1000).values(), ...tableOf(50, 500_000).values()]) table.map.set(entryKey(e), e);
  const { rx, port } = await startReceiver({}, table);
  const proxy = new Proxy(port);
  let chunks = 0;
  let cut = false;
  proxy.rewrite = (f) => {
    if (f.type === FrameType.RESYNC_CHUNK && f.conn === 0 && ++chunks === 5) {
      cut = true;
      // Drop the connection in the middle of the transfer.
      setImmediate(() => void proxy.close().catch(() => undefined));
      return [];
    }
    return cut && f.conn === 0 ? [] : [f.bytes];
  };
  const proxyPort = await proxy.listen();
  const tx = sender(proxyPort, truth, { chunkEntries: 1000 });
  try {
    tx.start();
    await waitFor(() => cut && tx.stats().disconnects >= 1, 'the cut');
    await waitFor(() => rx.stats().connectedPeers === 0, 'receiver saw it');
    assert.is(table.replaceCalls.length, 0, 'no sweep');
    assert.is(table.swept, 0, 'nothing deleted');
    assert.ok(table.upserted >= 1000 && table.upserted < 40_000, `${table.upserted} upserted before the cut`);
    // The first chunk carried entries 0..999, which the standby had: nothing but upserts happened.
    assert.is(table.map.size, table.upserted + 50, 'what was there is still there');
    assert.ok([...tableOf(50, 500_000).keys()].every((k) => table.map.has(k)), 'entries the owner no longer has wait for a complete transfer');
    // A direct connection completes the transfer and only then removes the 50.
    await tx.close();
    const tx2 = sender(port, truth);
    tx2.start();
    await waitFor(() => table.replaceCalls.length === 1, 'a complete transfer', 20_000);
    assert.is(table.swept, 50);
    assert.is(sameTable(truth, table.map), undefined);
    await tx2.close();
  } finally {
    await tx.close();
    await rx.close();
  }
});

test('a garbled BUCKET_REQUEST or DIGEST is refused with a reason, counted, and the stream recovers with nothing lost', async () => {
  const truth = tableOf(500);
  const { rx, table, port } = await startReceiver();
  const tx = sender(port, truth, { buckets: 16 });
  try {
    tx.start();
    await waitFor(() => tx.stats().state === 'streaming' && table.replaceCalls.length === 1, 'connected');
    // A BUCKET_REQUEST over another bucket count: the sender refuses it as malformed and reconnects.
    const c = (rx as unknown as { conns: Set<{ ch: { send: (t: number, n: number, f: (b: Buffer, o: number) => number) => number } }> }).conns;
    for (const x of c) x.ch.send(FrameType.BUCKET_REQUEST, 12, (b, o) => {
      b.writeUInt32BE(8, o);
      b.writeUInt32BE(1, o + 4);
      b.writeUInt32BE(3, o + 8);
      return o + 12;
    });
    await waitFor(() => tx.stats().rejected.malformed === 1, 'refused');
    await waitFor(() => tx.stats().connects === 2 && tx.stats().state === 'streaming', 'reconnected');
    assert.is(sameTable(truth, table.map), undefined, 'nothing lost');
    // A DIGEST whose length does not match its bucket count: the receiver refuses it, counted, by reason.
    const ch = (tx as unknown as { ch: { send: (t: number, n: number, f: (b: Buffer, o: number) => number) => number } }).ch;
    ch.send(FrameType.DIGEST, 8, (b, o) => {
      b.writeUInt32BE(4, o);
      b.writeUInt32BE(0, o + 4);
      return o + 8;
    });
    await waitFor(() => rx.stats().rejected.malformed === 1, 'the receiver refused it');
    assert.ok(logLines.some((l) => l.role === 'receiver' && l.reason === 'malformed' && /digest of 4 buckets in 8 bytes/.test(JSON.stringify(l))), 'a clear reason is logged');
    await waitFor(() => tx.stats().connects === 3 && table.replaceCalls.length === 3, 'reconnected with a full transfer');
    assert.is(sameTable(truth, table.map), undefined, 'nothing lost');
  } finally {
    await tx.close();
    await rx.close();
  }
});

test.run();
