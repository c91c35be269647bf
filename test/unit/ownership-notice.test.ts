// Ownership notices between tetherds: authenticated, checked field by field, replays and stale ones refused,
// over real UDP sockets on loopback.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { randomBytes } from 'node:crypto';
import { decodeNotices, encodeNotices, NoticeChannel, NoticeRejected, noticeKey, type OwnershipNotice } from '../../daemon/egress/ownership-notice';

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
    const first = encodeNotices(key, env({ seq: 5 }));
    await sendRaw(first);
    await sendRaw(first); // replay
    await sendRaw(encodeNotices(key, env({ seq: 4 }))); // older sequence number
    await sendRaw(encodeNotices(key, env({ seq: 6, at: Date.now() - 60_000 }))); // stale
    await sendRaw(encodeNotices(noticeKey(randomBytes(32)), env({ seq: 7 }))); // forged
    await sendRaw(encodeNotices(key, env({ seq: 8, boot: 'fedcba9876543210', notices: [{ ...notice, epoch: 5 }] }))); // sender restarted
    await new Promise((r) => setTimeout(r, 100));
    raw.close();
    assert.equal(got.map(([n, from]) => [n.epoch, from]), [[4, 'n2'], [5, 'n2']]);
    assert.equal(a.stats().rejected, { malformed: 0, badMac: 1, replay: 2, stale: 1, oversize: 0 });
  } finally {
    await Promise.all([a.close(), b.close(), forger.close()]);
  }
});

test.run();
