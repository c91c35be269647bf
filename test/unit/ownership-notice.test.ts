// Ownership notices between tetherds: authenticated, checked field by field, replays and stale ones refused,
// over real UDP sockets on loopback.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { randomBytes } from 'node:crypto';
import { decodeNotices, encodeNotices, MAX_NOTICE_BYTES, NoticeChannel, NoticeRejected, noticeKey, packNotices, type GatewayAnnouncement, type OwnershipNotice } from '../../daemon/egress/ownership-notice';

const clusterKey = randomBytes(32);
const key = noticeKey(clusterKey);
const notice: OwnershipNotice = {
  egress: 'shop/out', address: '198.18.0.201', owner: 'shop/gw2', epoch: 4, ownerNode: 'n2', ownerNodeAddress: '198.18.0.12', ownerPodIp: '10.244.1.5', cause: 'failover: owner shop/gw1 on n1 is down', inSync: ['n1'],
};
const env = (over: Record<string, unknown> = {}) => ({ from: 'n2', boot: '0123456789abcdef', seq: 1, at: Date.now(), notices: [notice], ...over });

test('round trip', () => {
  const d = decodeNotices(key, encodeNotices(key, env()));
  assert.equal(d.notices, [notice]);
  assert.is(d.from, 'n2');
});

test('rejections name their reason', () => {
  const reason = (data: Buffer) => {
    try {
      decodeNotices(key, data);
      return 'accepted';
    } catch (e) {
      return (e as NoticeRejected).reason;
    }
  };
  const good = encodeNotices(key, env());
  const flipped = Buffer.from(good);
  flipped[flipped.length - 3] ^= 1;
  assert.is(reason(flipped), 'badMac');
  assert.is(reason(encodeNotices(noticeKey(randomBytes(32)), env())), 'badMac', 'another cluster key');
  assert.is(reason(good.subarray(0, 20)), 'malformed');
  assert.is(reason(Buffer.alloc(2000)), 'oversize');
  assert.is(reason(Buffer.concat([Buffer.from('XOWN'), good.subarray(4)])), 'malformed');
  // Authentic but with a bad field: refused, naming the field.
  for (const [bad, field] of [
    [{ ...notice, address: 'not-an-ip' }, 'address'],
    [{ ...notice, epoch: -1 }, 'epoch'],
    [{ ...notice, inSync: [3] }, 'inSync'],
    [{ ...notice, ownerPodIp: '10.0.0.300' }, 'ownerPodIp'],
  ] as const) {
    try {
      decodeNotices(key, encodeNotices(key, env({ notices: [bad] })));
      assert.unreachable(`accepted a bad ${field}`);
    } catch (e) {
      assert.instance(e, NoticeRejected);
      assert.match((e as Error).message, field);
    }
  }
});

test('channel: delivers authentic notices, refuses replays, stale and forged datagrams', async () => {
  const a = await NoticeChannel.open({ clusterKey, node: 'n1', address: '127.0.0.1', port: 0 });
  const b = await NoticeChannel.open({ clusterKey, node: 'n2', address: '127.0.0.1', port: 0 });
  const forger = await NoticeChannel.open({ clusterKey: randomBytes(32), node: 'n9', address: '127.0.0.1', port: 0 });
  try {
    const got: Array<[OwnershipNotice, string]> = [];
    a.on('notice', (n: OwnershipNotice, from: string) => got.push([n, from]));
    // send() skips its own address; on loopback every channel shares it, so send raw datagrams instead.
    const dgram = await import('node:dgram');
    const raw = dgram.createSocket('udp4');
    const sendRaw = (data: Buffer) => new Promise<void>((r) => raw.send(data, a.port, '127.0.0.1', () => r()));
    const first = encodeNotices(key, env({ seq: 100 }));
    await sendRaw(first);
    await sendRaw(first); // replay
    const older = encodeNotices(key, env({ seq: 99, notices: [{ ...notice, epoch: 3 }] }));
    await sendRaw(older); // sent before, arrived after (one heartbeat split over datagrams): accepted once
    await sendRaw(older); // replay of it
    await sendRaw(encodeNotices(key, env({ seq: 100 - 64 }))); // beyond the reordering window
    await sendRaw(encodeNotices(key, env({ seq: 106, at: Date.now() - 60_000 }))); // stale
    await sendRaw(encodeNotices(noticeKey(randomBytes(32)), env({ seq: 107 }))); // forged
    await sendRaw(encodeNotices(key, env({ seq: 1, boot: 'fedcba9876543210', notices: [{ ...notice, epoch: 5 }] }))); // sender restarted
    await new Promise((r) => setTimeout(r, 100));
    raw.close();
    assert.equal(got.map(([n, from]) => [n.epoch, from]), [[4, 'n2'], [3, 'n2'], [5, 'n2']]);
    assert.equal(a.stats().rejected, { malformed: 0, badMac: 1, replay: 3, stale: 1, oversize: 0 });
  } finally {
    await Promise.all([a.close(), b.close(), forger.close()]);
  }
});

/** A heartbeat's notice for the i-th of many addresses, with names as long as Kubernetes allows. */
function longNotice(i: number): OwnershipNotice {
  const long = (p: string) => `${p}-${'x'.repeat(60)}`;
  return {
    egress: `${long('team')}/${long('egress')}`, address: `198.18.${i >> 8}.${i & 255}`, owner: `${long('team')}/${long('gateway')}-${i}`, epoch: 7,
    ownerNode: long('node'), ownerNodeAddress: '198.18.0.12', ownerPodIp: '10.244.1.5', cause: `failover: owner ${long('team')}/gw on ${long('node')} is down`, inSync: [long('node-a'), long('node-b')],
  };
}

test('a heartbeat of many addresses is split over datagrams of at most 1,400 bytes, and every notice arrives', async () => {
  // Before: every held address went into one datagram, refused above 1,400 bytes (4 addresses: 1,811 B).
  for (const count of [1, 4, 64]) {
    const notices = Array.from({ length: count }, (_, i) => longNotice(i));
    let seq = 0;
    const { datagrams, tooLarge } = packNotices(key, { from: 'n2', boot: '0123456789abcdef', at: Date.now() }, () => ++seq, notices);
    assert.is(tooLarge.length, 0);
    assert.ok(datagrams.every((d) => d.length <= MAX_NOTICE_BYTES), `${count}: datagram sizes ${datagrams.map((d) => d.length)}`);
    const back = datagrams.flatMap((d) => decodeNotices(key, d).notices);
    assert.equal(back, notices, `${count} addresses round-trip in ${datagrams.length} datagram(s)`);
    if (count >= 4) assert.ok(datagrams.length > 1);
  }
  const a = await NoticeChannel.open({ clusterKey, node: 'n1', address: '127.0.0.1', port: 0 });
  const b = await NoticeChannel.open({ clusterKey, node: 'n2', address: '127.0.0.2', port: 0 });
  try {
    const got: OwnershipNotice[] = [];
    a.on('notice', (n: OwnershipNotice) => got.push(n));
    const notices = Array.from({ length: 64 }, (_, i) => longNotice(i));
    b.send(['127.0.0.1'], notices, [], { port: a.port });
    for (let i = 0; i < 50 && got.length < 64; i++) await new Promise((r) => setTimeout(r, 20));
    assert.is(got.length, 64, `${got.length}/64 notices of one heartbeat arrived`);
    assert.equal(new Set(got.map((n) => n.address)).size, 64);
    assert.equal(a.stats().rejected, { malformed: 0, badMac: 0, replay: 0, stale: 0, oversize: 0 });
  } finally {
    await Promise.all([a.close(), b.close()]);
  }
});

test('a datagram carrying 64 notices, or a node announcing another node\'s gateway, is refused whole', () => {
  const reason = (data: Buffer) => {
    try {
      decodeNotices(key, data);
      return 'accepted';
    } catch (e) {
      return (e as Error).message;
    }
  };
  // Authentic (the sender has the key) but more than a datagram may carry: nothing of it is applied.
  const big = Buffer.concat([Buffer.from('TOWN'), Buffer.from([1, 0, 0, 0])]);
  const body = Buffer.from(JSON.stringify(env({ notices: Array.from({ length: 64 }, () => notice) })));
  const { createHmac } = require('node:crypto') as typeof import('node:crypto');
  const mac = createHmac('sha256', key).update(big).update(body).digest();
  const crafted = Buffer.concat([big, mac, body]);
  assert.match(reason(crafted), crafted.length > MAX_NOTICE_BYTES ? 'oversize' : 'notices: 64 in one datagram');
  const gw: GatewayAnnouncement = { egress: 'shop/out', pod: 'shop/gw3', node: 'n3', nodeAddress: '198.18.0.13', podIp: '10.244.3.7', zone: 'a' };
  assert.match(reason(encodeNotices(key, env({ notices: [], gateways: [gw] }))), 'gateways[0].node: n3 announced by n2');
  const own = { ...gw, node: 'n2', nodeAddress: '198.18.0.12' };
  assert.equal(decodeNotices(key, encodeNotices(key, env({ notices: [], gateways: [own] }))).gateways, [own]);
  assert.match(reason(encodeNotices(key, env({ notices: [], gateways: [{ ...own, podIp: 'nope' }] }))), 'gateways[0].podIp');
});

test('client Egresses: carried, packed over datagrams, delivered with the sender\'s address; a garbled list is refused whole', async () => {
  const d = decodeNotices(key, encodeNotices(key, env({ notices: [], clients: ['shop/out', 'shop/other'] })));
  assert.equal(d.clients, ['shop/out', 'shop/other']);
  for (const bad of [[3], [''], 'shop/out', Array.from({ length: 17 }, (_, i) => `shop/e${i}`)]) {
    try {
      decodeNotices(key, encodeNotices(key, env({ clients: bad })));
      assert.unreachable(`accepted clients ${JSON.stringify(bad).slice(0, 40)}`);
    } catch (e) {
      assert.instance(e, NoticeRejected);
      assert.match((e as Error).message, /clients/);
    }
  }
  let seq = 0;
  const many = Array.from({ length: 40 }, (_, i) => `ns-${'x'.repeat(50)}/egress-${i}`);
  const { datagrams } = packNotices(key, { from: 'n2', boot: '0123456789abcdef', at: Date.now() }, () => ++seq, [], [], many);
  assert.ok(datagrams.length >= 3, `40 Egresses in ${datagrams.length} datagrams`);
  assert.equal(datagrams.flatMap((g) => decodeNotices(key, g).clients ?? []), many, 'every one, in order');
  const a = await NoticeChannel.open({ clusterKey, node: 'n1', address: '127.0.0.1', port: 0 });
  const b = await NoticeChannel.open({ clusterKey, node: 'n2', address: '127.0.0.2', port: 0 });
  try {
    const got: Array<[string[], string, string]> = [];
    a.on('clients', (list: string[], from: string, address: string) => got.push([list, from, address]));
    b.send(['127.0.0.1'], [], [], { clients: ['shop/out'], port: a.port });
    for (let i = 0; i < 50 && !got.length; i++) await new Promise((r) => setTimeout(r, 10));
    assert.equal(got, [[['shop/out'], 'n2', '127.0.0.2']]);
  } finally {
    await a.close();
    await b.close();
  }
});

test.run();
