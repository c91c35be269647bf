// Conntrack sync protocol versions: this release beside the previous one (release/previous, its modules taken
// from this repository's history) over real TCP in both directions, the bytes both write, and the negotiation.
import { randomBytes } from 'node:crypto';
import * as net from 'node:net';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { entryKey, type ConntrackEntry } from '../../daemon/conntrack/types';
import { SyncSender, SyncReceiver, type SyncSenderOptions } from '../../daemon/conntrack-sync';
import { FrameType, FrameWriter, HELLO_VERSION, MAX_PROTOCOL_VERSION, openFrame } from '../../daemon/conntrack-sync/frame';
import { advertisedVersions, handshakeKey, LEGACY_VERSIONS, negotiate, newNonce, readHello, writeHello } from '../../daemon/conntrack-sync/handshake';
import { writeEntry } from '../../daemon/conntrack-sync/entry-codec';
import { previousModule } from '../lib/releases';
import { KEY, Table, captureLogs, entry, ev, restoreLogs, sameTable, startReceiver, waitFor } from './conntrack-sync-fixtures';

// The previous release's modules (release/previous, from this repository's history), typed as this release's.
const { SyncSender: OldSender } = previousModule<typeof import('../../daemon/conntrack-sync/sender')>('daemon/conntrack-sync/sender');
const { SyncReceiver: OldReceiver } = previousModule<typeof import('../../daemon/conntrack-sync/receiver')>('daemon/conntrack-sync/receiver');
const oldFrame = previousModule<typeof import('../../daemon/conntrack-sync/frame')>('daemon/conntrack-sync/frame');
const oldHandshake = previousModule<typeof import('../../daemon/conntrack-sync/handshake')>('daemon/conntrack-sync/handshake');
const oldCodec = previousModule<typeof import('../../daemon/conntrack-sync/entry-codec')>('daemon/conntrack-sync/entry-codec');
const oldLog = previousModule<typeof import('../../lib/log')>('daemon/log');
oldLog.setLogger(oldLog.makeLogger({ level: 'error' }));

test.before(captureLogs);
test.after(restoreLogs);

const table = (n: number, from = 0) => new Map(Array.from({ length: n }, (_, i) => [entryKey(entry(from + i)), entry(from + i)] as const));

function sender(port: number, truth: Map<string, ConntrackEntry>, opts: Partial<SyncSenderOptions> = {}): SyncSender {
  return new SyncSender({ key: KEY, id: 'node-a', host: '127.0.0.1', port, stream: 'default/e|203.0.113.10', epoch: 3, snapshot: () => [...truth.values()], backoffMinMs: 20, backoffMaxMs: 100, ...opts });
}

test('ccd851b sender → this receiver: handshake at version 2, the table and then events arrive', async () => {
  const { rx, table: got, port } = await startReceiver();
  const truth = table(300);
  const tx = new OldSender({ key: KEY, id: 'node-a', host: '127.0.0.1', port, stream: 'default/e|203.0.113.10', epoch: 3, snapshot: () => [...truth.values()], backoffMinMs: 20, backoffMaxMs: 100 });
  try {
    tx.start();
    await waitFor(() => got.replaceCalls.length === 1 && got.map.size === 300, 'the old sender\'s transfer applied');
    const more = [entry(1000), entry(1001)];
    for (const e of more) truth.set(entryKey(e), e);
    truth.delete(entryKey(entry(0)));
    tx.push([ev('new', more[0]), ev('new', more[1]), ev('destroy', entry(0))]);
    await waitFor(() => got.map.size === 301 && !got.map.has(entryKey(entry(0))), 'the old sender\'s events applied');
    assert.is(sameTable(truth, got.map), undefined);
    const peer = rx.stats().peers[0];
    assert.is(peer.version, 2);
    assert.is(peer.id, 'node-a');
    assert.equal(Object.values(rx.stats().rejected).reduce((a, b) => a + b, 0), 0, JSON.stringify(rx.stats().rejected));
    assert.equal(Object.values(tx.stats().rejected).reduce((a, b) => a + b, 0), 0, JSON.stringify(tx.stats().rejected));
  } finally {
    await tx.close();
    await rx.close();
  }
});

test('this sender → ccd851b receiver: handshake at version 2, the table and then events arrive', async () => {
  const got = new Table();
  const rx = new OldReceiver({
    key: KEY, id: 'node-b', host: '127.0.0.1', port: 0,
    // The old module's KeySet and BucketSet: the same shapes as this release's, other declarations.
    apply: (evs) => got.apply(evs), upsert: (entries) => got.upsert(entries), sweep: (keep, set) => got.sweep(keep as never, set), digests: (k) => got.digests(k) as never,
  });
  const port = await rx.listen();
  const truth = table(300);
  const tx = sender(port, truth);
  try {
    tx.start();
    await waitFor(() => got.replaceCalls.length === 1 && got.map.size === 300, 'the transfer applied by the old receiver');
    assert.is(tx.stats().version, 2);
    const more = entry(2000);
    truth.set(entryKey(more), more);
    tx.push(ev('new', more));
    await waitFor(() => got.map.size === 301, 'events applied by the old receiver');
    assert.is(sameTable(truth, got.map), undefined);
    // The periodic consistency check (DIGEST, BUCKET_REQUEST) also speaks the old receiver's language.
    got.map.delete(entryKey(entry(5)));
    tx.checkConsistency();
    await waitFor(() => got.map.size === 301, 'a bucket the old receiver lost sent again');
    assert.equal(Object.values(rx.stats().rejected).reduce((a, b) => a + b, 0), 0, JSON.stringify(rx.stats().rejected));
    assert.equal(Object.values(tx.stats().rejected).reduce((a, b) => a + b, 0), 0, JSON.stringify(tx.stats().rejected));
  } finally {
    await tx.close();
    await rx.close();
  }
});

test('bytes: this release writes version 2 frames exactly as ccd851b does; each side reads the other\'s HELLO', () => {
  const id = Buffer.from('node-a');
  const nonce = randomBytes(32);
  const session = randomBytes(8);
  const hk = handshakeKey(KEY);
  const mine = new FrameWriter(id, hk);
  const theirs = new oldFrame.FrameWriter(id, oldHandshake.handshakeKey(KEY));
  const a = mine.build(FrameType.HELLO, 512, (b, o) => writeHello(b, o, nonce, 'default/e|203.0.113.10', 7));
  const b = theirs.build(oldFrame.FrameType.HELLO, 512, (buf, o) => oldHandshake.writeHello(buf, o, nonce, 'default/e|203.0.113.10', 7));
  assert.equal(a.toString('hex'), b.toString('hex'), 'HELLO');
  // A session frame (EVENTS with two entries), after the switch to session keys.
  const sk = randomBytes(32);
  mine.key = sk;
  mine.session = session;
  mine.version = negotiate({ min: 2, max: MAX_PROTOCOL_VERSION }, LEGACY_VERSIONS)!;
  theirs.key = sk;
  theirs.session = session;
  const fill = (w: typeof writeEntry) => (buf: Buffer, o: number) => {
    buf.writeUInt32BE(2, o);
    return w(buf, w(buf, o + 4, entry(1)), entry(2));
  };
  const c = mine.build(FrameType.RESYNC_CHUNK, 4096, fill(writeEntry));
  const d = theirs.build(oldFrame.FrameType.RESYNC_CHUNK, 4096, fill(oldCodec.writeEntry));
  assert.equal(c.toString('hex'), d.toString('hex'), 'RESYNC_CHUNK');
  // Each opens the other's frames; ccd851b reads this release's HELLO, advertisement in its nonce and all.
  assert.is(openFrame(d, sk, 2).seq, 1);
  assert.is(oldFrame.openFrame(c, sk).seq, 1);
  const advertising = newNonce();
  const e = new FrameWriter(id, hk).build(FrameType.HELLO, 512, (buf, o) => writeHello(buf, o, advertising, 's', 1));
  const read = oldHandshake.readHello(oldFrame.openFrame(e, oldHandshake.handshakeKey(KEY)).payload);
  assert.ok(read.nonceS.equals(advertising));
  assert.equal(readHello(openFrame(b, hk).payload).nonceS, nonce);
});

test('advertisements: ccd851b\'s random nonce advertises nothing (version 2); ours our range; negotiation takes the highest shared', () => {
  for (let i = 0; i < 1000; i++) assert.equal(advertisedVersions(randomBytes(32)), LEGACY_VERSIONS);
  assert.equal(advertisedVersions(newNonce()), { min: 2, max: MAX_PROTOCOL_VERSION });
  assert.equal(advertisedVersions(newNonce({ min: 3, max: 9 })), { min: 3, max: 9 });
  // A marker with an impossible range is not an advertisement.
  const bad = newNonce({ min: 5, max: 4 });
  assert.equal(advertisedVersions(bad), LEGACY_VERSIONS);
  assert.is(negotiate({ min: 2, max: 2 }, { min: 2, max: 9 }), 2);
  assert.is(negotiate({ min: 2, max: 4 }, { min: 3, max: 9 }), 4);
  assert.is(negotiate({ min: 2, max: 2 }, { min: 3, max: 9 }), undefined);
  assert.is(negotiate({ min: 3, max: 5 }, LEGACY_VERSIONS), undefined);
});

test('a peer advertising a higher max than this release knows gets this release\'s max, both directions', async () => {
  const future = { min: 2, max: 9 };
  const { rx, table: got, port } = await startReceiver();
  const truth = table(50);
  const tx = sender(port, truth, { versions: future });
  const got2 = new Table();
  const rx2 = new SyncReceiver({
    key: KEY, id: 'node-c', host: '127.0.0.1', port: 0, versions: future,
    apply: (evs) => got2.apply(evs), upsert: (entries) => got2.upsert(entries), sweep: (keep, set) => got2.sweep(keep, set), digests: (k) => got2.digests(k),
  });
  const tx2 = sender(await rx2.listen(), truth);
  try {
    tx.start();
    tx2.start();
    await waitFor(() => got.map.size === 50 && got2.map.size === 50, 'both transfers applied');
    assert.is(tx.stats().version, MAX_PROTOCOL_VERSION);
    assert.is(rx.stats().peers[0].version, MAX_PROTOCOL_VERSION);
    assert.is(tx2.stats().version, MAX_PROTOCOL_VERSION);
    assert.is(rx2.stats().peers[0].version, MAX_PROTOCOL_VERSION);
  } finally {
    await tx.close();
    await tx2.close();
    await rx.close();
    await rx2.close();
  }
});

test('no version in common: refused on both sides as `version`, after the proofs; the receiver names the sender', async () => {
  const { rx, table: got, port } = await startReceiver();
  const tx = sender(port, table(10), { versions: { min: MAX_PROTOCOL_VERSION + 1, max: MAX_PROTOCOL_VERSION + 3 } });
  try {
    tx.start();
    await waitFor(() => rx.stats().rejected.version >= 2 && tx.stats().rejected.version >= 2, 'both sides refusing for the version');
    assert.is(tx.stats().connects, 0);
    assert.is(rx.stats().connectedPeers, 0);
    assert.is(got.map.size, 0);
    assert.is(rx.stats().rejected.auth, 0);
    const r = rx.refusalFrom('node-a', undefined);
    assert.ok(r, 'refusal recorded');
    assert.is(r!.reason, 'version');
    assert.match(r!.message, /speaks sync protocol versions 3\.\.5, this node 2: none in common/);
    assert.is(tx.stats().lastRejected?.reason, 'version');
    assert.match(tx.stats().lastRejected!.message, /receiver 'node-b' speaks sync protocol versions 2, this node 3\.\.5/);
  } finally {
    await tx.close();
    await rx.close();
  }
});

test('a frame of a version this release does not speak (an older release\'s v1): refused as `version`, naming the sender it claims', async () => {
  const { rx, port } = await startReceiver();
  const w = new FrameWriter(Buffer.from('node-old'), handshakeKey(KEY));
  w.version = 1;
  const s = net.connect({ host: '127.0.0.1', port });
  try {
    await new Promise<void>((r) => s.once('connect', () => r()));
    s.on('error', () => undefined);
    s.write(w.build(FrameType.HELLO, 512, (b, o) => writeHello(b, o, newNonce(), 'default/e|203.0.113.10', 1)));
    await waitFor(() => rx.stats().rejected.version === 1, 'the v1 frame refused');
    const r = rx.refusalFrom('node-old', undefined)!;
    assert.is(r.reason, 'version');
    assert.match(r.message, /frame of protocol version 1, 2 expected/);
    assert.is(r.address, '127.0.0.1');
    // By address too (the owner's node address), and not for another node.
    assert.ok(rx.refusalFrom('someone', '127.0.0.1'));
    assert.is(rx.refusalFrom('someone', '192.0.2.1'), undefined);
    assert.is(HELLO_VERSION, 2);
  } finally {
    s.destroy();
    await rx.close();
  }
});

test.run();
