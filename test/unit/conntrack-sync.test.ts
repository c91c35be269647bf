// Conntrack sync over real TCP on 127.0.0.1: ordered streaming and acks, large resyncs (timed),
// reconnect after a receiver restart, coalescing, dead-peer detection, and a receiver that stops reading.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { entryKey, type ConntrackEntry, type ConntrackEvent } from '../../daemon/conntrack/types';
import { SyncSender, type SyncSenderOptions } from '../../daemon/conntrack-sync';
import { MAX_EVENT_BYTES } from '../../daemon/conntrack-sync/entry-codec';
import { KEY, captureLogs, restoreLogs, Proxy, Table, entry, entry6, ev, logLines, sameTable, sleep, startReceiver, waitFor } from './conntrack-sync-fixtures';

function sender(port: number, truth: Map<string, ConntrackEntry>, opts: Partial<SyncSenderOptions> = {}): SyncSender {
  return new SyncSender({ key: KEY, id: 'node-a', host: '127.0.0.1', port, stream: '203.0.113.10', epoch: 1, snapshot: () => [...truth.values()], ...opts });
}

/** Applies events to the owner's own table (the truth the snapshot reads) and pushes them. */
function feed(tx: SyncSender, truth: Map<string, ConntrackEntry>, events: ConntrackEvent[]): void {
  for (const e of events) {
    if (e.type === 'destroy') truth.delete(entryKey(e.entry));
    else truth.set(entryKey(e.entry), e.entry);
  }
  tx.push(events);
}

test.before(captureLogs);
test.after(restoreLogs);

test('events flow in order, acks advance to the last frame, one log line per connect', async () => {
  const { rx, table, port } = await startReceiver();
  const truth = new Map<string, ConntrackEntry>();
  const tx = sender(port, truth);
  const logsBefore = logLines.length;
  try {
    tx.start();
    await waitFor(() => tx.stats().state === 'streaming' && table.replaceCalls.length === 1, 'the initial (empty) resync');
    const pushed: ConntrackEvent[] = [];
    for (let burst = 0; burst < 10; burst++) {
      const evs = Array.from({ length: 500 }, (_, i) => ev('new', entry(burst * 500 + i)));
      pushed.push(...evs);
      feed(tx, truth, evs);
      await sleep(1);
    }
    await waitFor(() => table.applied.length === pushed.length, 'all events applied');
    assert.equal(table.applied.map((e) => entryKey(e.entry)), pushed.map((e) => entryKey(e.entry)), 'applied in push order');
    assert.equal(table.applied[1234], pushed[1234], 'content survives the codec');
    await waitFor(() => tx.stats().ackedSeq === tx.stats().lastSeq, 'ack of the last frame');
    const s = tx.stats();
    assert.ok(s.lastSeq >= 11, `at least BEGIN, END and 10 EVENTS frames (${s.lastSeq})`);
    assert.is(s.entriesSent, 5000);
    assert.is(s.lagEntries, 0);
    assert.is(s.inflightFrames, 0);
    assert.ok(s.maxLagMs >= s.lagMs && s.maxLagMs < 2000, `lag ${s.lagMs} ms, worst ${s.maxLagMs} ms`);
    const r = rx.stats();
    assert.is(r.connectedPeers, 1);
    assert.is(r.peers[0].id, 'node-a');
    assert.is(r.peers[0].stream, '203.0.113.10');
    assert.is(r.peers[0].ackedSeq, s.ackedSeq);
    assert.is(r.entriesApplied, 5000);
    assert.ok(r.maxAckLagMs < 2000, `receiver ack lag ${r.maxAckLagMs} ms`);
    const lines = logLines.slice(logsBefore).filter((l) => l.message === 'conntrack sync connected');
    assert.equal(lines.map((l) => l.role).sort(), ['receiver', 'sender']);
  } finally {
    await tx.close();
    await rx.close();
  }
});

for (const n of [10_000, 100_000]) {
  test(`resync of ${n} entries arrives complete, applied while it streams, swept at its end`, async () => {
    const truth = new Map<string, ConntrackEntry>();
    for (let i = 0; i < n; i++) {
      const e = i % 10 === 9 ? entry6(i) : entry(i);
      truth.set(entryKey(e), e);
    }
    const table = new Table();
    // A stale entry the owner does not have: only the sweep at the end may remove it.
    const stale = entry(n + 7);
    table.map.set(entryKey(stale), stale);
    let sizeSeenAtSweep = -1;
    let staleAtSweep = false;
    const { rx, port } = await startReceiver({
      sweep: (keep, set) => {
        sizeSeenAtSweep = table.map.size;
        staleAtSweep = table.map.has(entryKey(stale));
        return table.sweep(keep, set);
      },
    }, table);
    const tx = sender(port, truth);
    try {
      const t0 = process.hrtime.bigint();
      tx.start();
      await waitFor(() => table.replaceCalls.length === 1, 'the transfer swept', 20_000);
      const ms = Number(process.hrtime.bigint() - t0) / 1e6;
      console.log(`    resync ${n} entries: ${ms.toFixed(0)} ms, ${Math.round(n / (ms / 1000))} entries/s (connect+handshake+snapshot+encode+send+decode)`);
      assert.is(sizeSeenAtSweep, n + 1, 'every chunk was applied before END');
      assert.ok(staleAtSweep, 'nothing deleted before END');
      assert.is(table.swept, 1, 'the sweep removed the stale entry only');
      assert.ok(rx.stats().maxKeySetBytes <= 32 * n + 1024, `receiver key set ${rx.stats().maxKeySetBytes} bytes for ${n} entries`);
      assert.is(table.replaceCalls[0], n);
      assert.is(sameTable(truth, table.map), undefined);
      assert.is(tx.stats().resyncs, 1);
      assert.is(tx.stats().lastResyncEntries, n);
    } finally {
      await tx.close();
      await rx.close();
    }
  });
}

test('receiver restart: the sender reconnects, resyncs the current table, then streams', async () => {
  let { rx, table, port } = await startReceiver();
  const truth = new Map<string, ConntrackEntry>();
  for (let i = 0; i < 1000; i++) truth.set(entryKey(entry(i)), entry(i));
  const tx = sender(port, truth, { backoffMinMs: 20, backoffMaxMs: 200 });
  try {
    tx.start();
    await waitFor(() => table.replaceCalls.length === 1, 'first resync');
    await rx.close();
    await waitFor(() => tx.stats().disconnects === 1, 'sender noticed');
    // The owner's table moves on while the candidate is down.
    feed(tx, truth, [ev('destroy', entry(0)), ev('new', entry(5000)), ev('update', entry(1, 7))]);
    ({ rx, table } = await startReceiver({ port }));
    await waitFor(() => table.replaceCalls.length === 1, 'resync to the restarted receiver');
    assert.is(sameTable(truth, table.map), undefined, 'resync carries the changes made while down');
    feed(tx, truth, [ev('new', entry(6000)), ev('destroy', entry(2))]);
    await waitFor(() => table.applied.length === 2, 'streaming after the resync');
    assert.is(sameTable(truth, table.map), undefined);
    const s = tx.stats();
    assert.is(s.connects, 2);
    assert.is(s.resyncs, 2);
  } finally {
    await tx.close();
    await rx.close();
  }
});

test('a receiver asks for a resync (a new standby there): the sender sends its whole table on the same connection', async () => {
  const { rx, table, port } = await startReceiver();
  const truth = new Map<string, ConntrackEntry>();
  for (let i = 0; i < 300; i++) truth.set(entryKey(entry(i)), entry(i));
  const tx = sender(port, truth);
  try {
    tx.start();
    await waitFor(() => tx.stats().state === 'streaming' && table.replaceCalls.length === 1, 'the first resync');
    // What a pod that joins now lacks: the receiver's table is emptied as a new pod's would be.
    table.map.clear();
    assert.is(rx.requestResync((s) => s === 'another stream'), 0, 'no other stream is asked');
    assert.is(rx.requestResync((s) => s === '203.0.113.10'), 1, 'the stream is asked');
    await waitFor(() => table.replaceCalls.length === 2, 'the requested resync');
    assert.is(sameTable(truth, table.map), undefined, 'the whole table again');
    const s = tx.stats();
    assert.is(s.resyncsRequested, 1);
    assert.is(s.connects, 1, 'on the same connection');
    assert.is(s.rejected.malformed, 0);
    await waitFor(() => tx.stats().state === 'streaming', 'streaming again');
    feed(tx, truth, [ev('new', entry(7000))]);
    await waitFor(() => table.map.size === 301, 'events after it');
  } finally {
    await tx.close();
    await rx.close();
  }
});

test('a receiver whose apply fails drops the connection; the sender resyncs and all ends consistent', async () => {
  const table = new Table();
  let failures = 0;
  const { rx, port } = await startReceiver({
    apply: (evs) => {
      if (failures === 0 && evs.some((e) => e.entry.orig.src === entry(42).orig.src)) {
        failures++;
        throw new Error('kernel said EPERM');
      }
      table.apply(evs);
    },
  }, table);
  const truth = new Map<string, ConntrackEntry>();
  const tx = sender(port, truth, { backoffMinMs: 20 });
  try {
    tx.start();
    await waitFor(() => tx.stats().state === 'streaming', 'connected');
    feed(tx, truth, [ev('new', entry(41)), ev('new', entry(42))]);
    await waitFor(() => tx.stats().connects === 2 && table.replaceCalls.length === 2, 'reconnect and resync');
    assert.is(failures, 1);
    assert.is(sameTable(truth, table.map), undefined);
    assert.ok(logLines.some((l) => l.message === 'conntrack sync: applying received state failed' && l.error === 'kernel said EPERM'), 'the failure is logged');
  } finally {
    await tx.close();
    await rx.close();
  }
});

test('coalescing: latest wins per key, new+destroy cancels, destroy+new keeps the destroy first', async () => {
  const { rx, table, port } = await startReceiver();
  const truth = new Map<string, ConntrackEntry>([[entryKey(entry(9)), entry(9)]]);
  const tx = sender(port, truth);
  try {
    tx.start();
    await waitFor(() => tx.stats().state === 'streaming' && table.map.size === 1, 'initial resync');
    // All in one tick, so nothing is sent in between.
    const burst: ConntrackEvent[] = [ev('new', entry(1))];
    for (let r = 1; r <= 100; r++) burst.push(ev('update', entry(1, r)));
    burst.push(ev('new', entry(2)), ev('destroy', entry(2)));
    burst.push(ev('destroy', entry(9)), ev('new', entry(9, 5)));
    for (let i = 100; i < 110; i++) burst.push(ev('new', entry(i)), ev('update', entry(i, 1)), ev('destroy', entry(i)));
    feed(tx, truth, burst);
    assert.is(tx.stats().queuedEntries, 3, 'entry 1, then destroy+new of entry 9');
    await waitFor(() => table.applied.length >= 3, 'coalesced events');
    await sleep(30);
    assert.equal(table.applied.map((e) => [e.type, e.entry.orig.src, e.entry.timeout]), [
      ['new', entry(1).orig.src, entry(1, 100).timeout],
      ['destroy', entry(9).orig.src, entry(9, 5).timeout],
      ['new', entry(9).orig.src, entry(9, 5).timeout],
    ]);
    // 13 keys were touched; every other event folded into one of their slots.
    assert.is(tx.stats().coalesced, burst.length - 13);
    assert.is(sameTable(truth, table.map), undefined);
  } finally {
    await tx.close();
    await rx.close();
  }
});

test('a silent peer is detected by heartbeat within about a second on both sides', async () => {
  const { rx, table, port } = await startReceiver();
  const proxy = new Proxy(port);
  const truth = new Map<string, ConntrackEntry>();
  const tx = sender(await proxy.listen(), truth, { backoffMinMs: 5000 });
  try {
    tx.start();
    await waitFor(() => table.replaceCalls.length === 1 && tx.stats().state === 'streaming', 'connected');
    await sleep(600);
    assert.is(tx.stats().disconnects, 0, 'heartbeats keep an idle connection up');
    proxy.blackhole = true;
    const t = await waitFor(() => tx.stats().disconnects === 1, 'sender drops the dead peer', 3000);
    await waitFor(() => rx.stats().connectedPeers === 0, 'receiver drops the dead sender', 1000);
    assert.ok(t <= 1500, `sender detection took ${t} ms`);
  } finally {
    await tx.close();
    await rx.close();
    await proxy.close();
  }
});

test('a process that was busy for longer than the dead interval does not drop a healthy stream', async () => {
  const { rx, table, port } = await startReceiver();
  const truth = new Map<string, ConntrackEntry>();
  const tx = sender(port, truth);
  try {
    tx.start();
    await waitFor(() => table.replaceCalls.length === 1 && tx.stats().state === 'streaming', 'connected');
    // Sender and receiver share this process: both loops stall 1.5 s, beyond deadAfterMs (1 s), as a
    // large synchronous dump would. Frames from the peer sit unread meanwhile; that is not silence.
    const until = Date.now() + 1500;
    while (Date.now() < until) { /* busy */ }
    feed(tx, truth, [ev('new', entry(1))]);
    await waitFor(() => table.map.size === 1, 'event after the stall applied');
    await sleep(300);
    assert.is(tx.stats().disconnects, 0, 'sender kept the connection');
    assert.is(rx.stats().connectionsAccepted, 1, 'no reconnect');
    assert.is(table.replaceCalls.length, 1, 'no second resync');
  } finally {
    await tx.close();
    await rx.close();
  }
});

test('backpressure: a receiver that stops reading keeps sender memory bounded, then gets a resync', async () => {
  // A long dead-peer timeout on the receiver: its heartbeats still flow, it just doesn't read.
  const { rx, table, port } = await startReceiver({ deadAfterMs: 20_000 });
  const proxy = new Proxy(port);
  const truth = new Map<string, ConntrackEntry>();
  const bounds = { maxInflightFrames: 8, maxInflightBytes: 256 << 10, maxQueuedEntries: 5000, batchEntries: 500, chunkEntries: 1000 };
  // The bound is checked before each frame, so one more frame (at most 1000 entries) may go out.
  const oneFrame = 1000 * MAX_EVENT_BYTES + 128;
  const tx = sender(await proxy.listen(), truth, bounds);
  try {
    tx.start();
    await waitFor(() => tx.stats().state === 'streaming' && table.replaceCalls.length === 1, 'connected');
    proxy.pauseUpstream();
    let worstInflight = 0;
    let worstQueued = 0;
    let worstUnsent = 0;
    for (let round = 0; round < 40; round++) {
      feed(tx, truth, Array.from({ length: 5000 }, (_, i) => ev('new', entry(round * 5000 + i))));
      await sleep(2);
      const s = tx.stats();
      worstInflight = Math.max(worstInflight, s.inflightBytes);
      worstQueued = Math.max(worstQueued, s.queuedEntries);
      worstUnsent = Math.max(worstUnsent, s.unsentBytes);
    }
    const s = tx.stats();
    assert.ok(s.overflows >= 1, 'the queue overflowed into a resync');
    assert.ok(worstQueued <= bounds.maxQueuedEntries, `queued ${worstQueued}`);
    assert.ok(worstInflight <= bounds.maxInflightBytes + oneFrame, `in flight ${worstInflight} bytes`);
    assert.ok(worstUnsent <= bounds.maxInflightBytes + oneFrame, `Node socket buffer ${worstUnsent} bytes`);
    assert.ok(table.map.size < truth.size, 'the stalled receiver is behind');
    proxy.resumeUpstream();
    // Chunks are applied as they arrive, so the table can match before the transfer's END: wait for it.
    await waitFor(() => table.replaceCalls.length >= 2 && tx.stats().state === 'streaming' && sameTable(truth, table.map) === undefined, 'receiver consistent after resume', 20_000);
    const end = tx.stats();
    assert.ok(end.resyncs >= 2, `resyncs ${end.resyncs}`);
    // Everything was pushed while stalled, so only a resync taken after that carries all 200k.
    assert.is(end.lastResyncEntries, 200_000);
    await waitFor(() => tx.stats().inflightFrames === 0 && tx.stats().queuedEntries === 0, 'all acked');
    assert.is(tx.stats().connects, 1, 'recovered on the same connection');
    assert.is(truth.size, 200_000);
  } finally {
    await tx.close();
    await rx.close();
    await proxy.close();
  }
});

test.run();
