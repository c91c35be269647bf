// Conntrack sync under attack, over real TCP: wrong keys both ways, a tampered byte, replayed frames
// (same connection and a new one), garbage from strangers during a live stream, an oversize length.
import { randomBytes } from 'node:crypto';
import * as net from 'node:net';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { entryKey, type ConntrackEntry, type ConntrackEvent } from '../../daemon/conntrack/types';
import { SyncSender, type SyncSenderOptions } from '../../daemon/conntrack-sync';
import { FrameType, FrameWriter } from '../../daemon/conntrack-sync/frame';
import { writeChallenge } from '../../daemon/conntrack-sync/handshake';
import { KEY, captureLogs, restoreLogs, Proxy, entry, ev, rawClient, sameTable, sleep, startReceiver, waitFor } from './conntrack-sync-fixtures';

function sender(port: number, truth: Map<string, ConntrackEntry>, opts: Partial<SyncSenderOptions> = {}): SyncSender {
  return new SyncSender({ key: KEY, id: 'node-a', host: '127.0.0.1', port, stream: '203.0.113.10', epoch: 1, snapshot: () => [...truth.values()], backoffMinMs: 20, backoffMaxMs: 100, ...opts });
}

function feed(tx: SyncSender, truth: Map<string, ConntrackEntry>, events: ConntrackEvent[]): void {
  for (const e of events) {
    if (e.type === 'destroy') truth.delete(entryKey(e.entry));
    else truth.set(entryKey(e.entry), e.entry);
  }
  tx.push(events);
}

const initialTable = () => new Map(Array.from({ length: 100 }, (_, i) => [entryKey(entry(i)), entry(i)] as const));

test.before(captureLogs);
test.after(restoreLogs);

test('wrong key: refused in both directions, counted, nothing applied', async () => {
  const { rx, table, port } = await startReceiver();
  const misconfigured = await startReceiver({ key: randomBytes(32), id: 'misconfigured' });
  const truth = initialTable();
  const badTx = sender(port, truth, { key: randomBytes(32) });
  const txToMisconfigured = sender(misconfigured.port, truth);
  // A receiver impersonated without the key: answers the HELLO with a challenge it can only forge.
  const forgedFramesSeen: number[] = [];
  const forger = net.createServer((s) => {
    let got = 0;
    s.on('data', (chunk) => {
      got += chunk.length;
      forgedFramesSeen.push(got);
      const w = new FrameWriter(Buffer.from('node-b'), randomBytes(32));
      s.write(w.build(FrameType.HELLO, 512, (b, o) => writeChallenge(b, o, randomBytes(32), 'node-b', randomBytes(32))));
    });
    s.on('error', () => undefined);
  });
  await new Promise<void>((r) => forger.listen(0, '127.0.0.1', () => r()));
  const txToForger = sender((forger.address() as net.AddressInfo).port, truth);
  try {
    badTx.start();
    txToMisconfigured.start();
    txToForger.start();
    await waitFor(() => rx.stats().rejected.auth >= 2 && badTx.stats().handshakeFailures >= 2, 'the receiver refusing a sender with another key');
    await waitFor(() => misconfigured.rx.stats().rejected.auth >= 2 && txToMisconfigured.stats().handshakeFailures >= 2, 'a receiver with another key refusing the sender');
    await waitFor(() => txToForger.stats().rejected.auth >= 2, 'the sender refusing a forged challenge');
    assert.is(badTx.stats().connects, 0);
    assert.is(txToMisconfigured.stats().connects, 0);
    assert.is(txToForger.stats().connects, 0);
    assert.is(rx.stats().connectedPeers, 0);
    assert.is(misconfigured.rx.stats().connectedPeers, 0);
    assert.is(table.replaceCalls.length + table.applied.length, 0);
    assert.is(misconfigured.table.replaceCalls.length + misconfigured.table.applied.length, 0, 'no entries reached the other key');
    // The forger only ever saw HELLOs: the sender sent no proof and no entries to it.
    assert.ok(forgedFramesSeen.every((n) => n < 200), `bytes seen by the forger per connection: ${forgedFramesSeen}`);
  } finally {
    await badTx.close();
    await txToMisconfigured.close();
    await txToForger.close();
    await rx.close();
    await misconfigured.rx.close();
    await new Promise<void>((r) => forger.close(() => r()));
  }
});

test('a tampered byte: rejected as auth, connection dropped, sender reconnects and resyncs to consistency', async () => {
  const { rx, table, port } = await startReceiver();
  const proxy = new Proxy(port);
  const truth = initialTable();
  const tx = sender(await proxy.listen(), truth);
  let tampered = 0;
  proxy.rewrite = (f) => {
    if (f.conn === 0 && f.type === FrameType.EVENTS && tampered === 0) {
      tampered++;
      const b = Buffer.from(f.bytes);
      b[b.length - 40] ^= 0x01;
      return [b];
    }
    return [f.bytes];
  };
  try {
    tx.start();
    await waitFor(() => table.replaceCalls.length === 1 && tx.stats().state === 'streaming', 'first resync');
    feed(tx, truth, [ev('new', entry(500)), ev('destroy', entry(3)), ev('update', entry(4, 9))]);
    await waitFor(() => rx.stats().rejected.auth === 1, 'the tampered frame rejected');
    await waitFor(() => tx.stats().connects === 2 && table.replaceCalls.length === 2, 'reconnect and resync');
    assert.is(tampered, 1);
    assert.is(table.applied.length, 0, 'the tampered batch was never applied');
    assert.is(sameTable(truth, table.map), undefined, 'consistent after the resync');
    feed(tx, truth, [ev('new', entry(501))]);
    await waitFor(() => table.map.has(entryKey(entry(501))), 'streaming again');
    assert.is(rx.stats().rejected.auth, 1);
  } finally {
    await tx.close();
    await rx.close();
    await proxy.close();
  }
});

test('replay: a frame re-injected into the stream, and a captured session re-sent on a new connection', async () => {
  const { rx, table, port } = await startReceiver();
  const proxy = new Proxy(port);
  const truth = initialTable();
  const tx = sender(await proxy.listen(), truth);
  let duplicated = 0;
  proxy.rewrite = (f) => {
    if (f.conn === 0 && f.type === FrameType.EVENTS && duplicated === 0) {
      duplicated++;
      return [f.bytes, f.bytes];
    }
    return [f.bytes];
  };
  try {
    tx.start();
    await waitFor(() => table.replaceCalls.length === 1 && tx.stats().state === 'streaming', 'first resync');
    feed(tx, truth, [ev('new', entry(700))]);
    await waitFor(() => rx.stats().rejected.replay === 1, 'the duplicate rejected as replay');
    assert.is(table.applied.length, 1, 'the original applied once, the copy not at all');
    await waitFor(() => tx.stats().connects === 2 && table.replaceCalls.length === 2, 'reconnect and resync');
    assert.is(sameTable(truth, table.map), undefined);

    // Now replay connection 0 wholesale (HELLO, resync, events) on a fresh connection of our own.
    const captured = proxy.frames.filter((f) => f.conn === 0);
    assert.ok(captured.length >= 4, `captured ${captured.length} frames`);
    const appliedBefore = table.applied.length;
    const authBefore = rx.stats().rejected.auth;
    const c = await rawClient(port);
    try {
      for (const f of captured) c.s.write(f.bytes);
      await c.closed;
      assert.ok(c.got().length > 0, 'the recorded HELLO got a fresh challenge');
    } finally {
      c.s.destroy();
    }
    assert.is(rx.stats().rejected.auth, authBefore + 1, 'the old HELLO does not answer the new challenge');
    // A session frame as the first frame of a new connection fails too (it is sealed with another key).
    const c2 = await rawClient(port);
    try {
      c2.s.write(captured.find((f) => f.type === FrameType.EVENTS)!.bytes);
      await c2.closed;
    } finally {
      c2.s.destroy();
    }
    assert.is(rx.stats().rejected.auth, authBefore + 2);
    assert.is(table.applied.length, appliedBefore, 'no replayed event was applied');
    assert.is(table.replaceCalls.length, 2, 'no replayed resync was applied');
    assert.is(rx.stats().connectedPeers, 1, 'the legitimate sender is still connected');
    assert.is(tx.stats().connects, 2);
  } finally {
    await tx.close();
    await rx.close();
    await proxy.close();
  }
});

test('garbage from strangers is counted and dropped while the legitimate stream goes on undisturbed', async () => {
  const { rx, table, port } = await startReceiver();
  const truth = initialTable();
  const tx = sender(port, truth);
  const stranger = new FrameWriter(Buffer.from('stranger'), randomBytes(32));
  const garbage: Buffer[] = [];
  for (let i = 0; i < 8; i++) garbage.push(randomBytes(200 + i * 50)); // random: mostly an oversize length
  for (let i = 0; i < 8; i++) {
    // A plausible length, then noise: bad version or bad MAC.
    const g = randomBytes(60);
    g.writeUInt32BE(56, 0);
    if (i % 2 === 0) g[4] = 9;
    garbage.push(g);
  }
  for (let i = 0; i < 4; i++) garbage.push(stranger.build(FrameType.HELLO, 8, (b, o) => o + 8)); // well-formed, unknown key
  garbage.push(Buffer.from([0, 0, 0, 3, 1, 2, 3])); // a length under the minimum
  try {
    tx.start();
    await waitFor(() => tx.stats().state === 'streaming' && table.replaceCalls.length === 1, 'connected');
    const rejectedBefore = Object.values(rx.stats().rejected).reduce((a, b) => a + b, 0);
    let next = 1000;
    let streaming = true;
    const pump = (async () => {
      while (streaming) {
        feed(tx, truth, Array.from({ length: 50 }, () => ev('new', entry(next++))));
        await sleep(2);
      }
    })();
    await Promise.all(garbage.map(async (g, i) => {
      await sleep(i * 10);
      const c = await rawClient(port);
      try {
        c.s.write(g);
        await c.closed;
      } finally {
        c.s.destroy();
      }
    }));
    streaming = false;
    await pump;
    await waitFor(() => sameTable(truth, table.map) === undefined, 'every streamed event applied');
    const r = rx.stats().rejected;
    assert.is(Object.values(r).reduce((a, b) => a + b, 0) - rejectedBefore, garbage.length, 'one rejection per stranger');
    // A frame of another protocol version is refused as `version` (before its MAC is looked at).
    assert.ok(r.version >= 4, `version ${r.version}`);
    assert.ok(r.malformed + r.version >= 5, `malformed ${r.malformed}, version ${r.version}`);
    assert.ok(r.oversize >= 1, `oversize ${r.oversize}`);
    assert.ok(r.auth >= 4, `auth ${r.auth}`);
    assert.ok(next - 1000 >= 500, `streamed ${next - 1000} events during the garbage`);
    assert.is(tx.stats().connects, 1, 'the legitimate connection was never dropped');
    assert.is(tx.stats().disconnects, 0);
    assert.is(tx.stats().resyncs, 1);
    assert.is(rx.stats().connectedPeers, 1);
  } finally {
    await tx.close();
    await rx.close();
  }
});

test('an oversize length prefix is refused without allocating it', async () => {
  const { rx, port } = await startReceiver();
  try {
    const before = process.memoryUsage().arrayBuffers;
    const c = await rawClient(port);
    try {
      const head = Buffer.alloc(4);
      head.writeUInt32BE(512 << 20, 0);
      c.s.write(head);
      c.s.write(Buffer.alloc(1024));
      await c.closed;
    } finally {
      c.s.destroy();
    }
    const grew = process.memoryUsage().arrayBuffers - before;
    assert.is(rx.stats().rejected.oversize, 1);
    assert.ok(grew < 64 << 20, `array buffers grew by ${grew} bytes`);
    // And a stranger that says nothing at all is dropped by the handshake timeout.
    const quiet = await startReceiver({ handshakeTimeoutMs: 200 });
    try {
      const q = await rawClient(quiet.port);
      try {
        await q.closed;
      } finally {
        q.s.destroy();
      }
      assert.is(quiet.rx.stats().rejected.timeout, 1);
    } finally {
      await quiet.rx.close();
    }
  } finally {
    await rx.close();
  }
});

test('a fenced former owner (lower epoch for the same stream) is refused', async () => {
  const { rx, table, port } = await startReceiver();
  const truth = initialTable();
  const owner = sender(port, truth, { epoch: 7 });
  const stale = sender(port, new Map(), { id: 'node-c', epoch: 6 });
  try {
    owner.start();
    await waitFor(() => table.replaceCalls.length === 1, 'owner synced');
    stale.start();
    await waitFor(() => rx.stats().rejected.stale >= 1, 'stale owner refused');
    assert.is(stale.stats().connects, 0);
    assert.is(table.replaceCalls.length, 1, 'the stale owner replaced nothing');
    assert.is(sameTable(truth, table.map), undefined);
  } finally {
    await owner.close();
    await stale.close();
    await rx.close();
  }
});

test.run();
