// The flows a table change moves, as recordMoved finds them in the raw mapping entries (no full decode):
// the same set, in the same form, as decoding every entry and keeping those whose pick by the new row
// differs from their target; lbHash of a decoded key equals the hash of its bytes at any offset.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { LB_HASH_SEED } from '../../daemon/bpf/lb';
import { decodeMapKey, decodeMapping, encodeMapKey, encodeMapping, lbHash, lbHashKeyBytes, type MapKey } from '../../daemon/bpf/lb-structs';
import { maglevTable, pickOf } from '../../daemon/lb/maglev';
import { movedFlows } from '../../daemon/lb/table-switch';

const VIP = '198.51.100.7';
const OTHER_VIP = '198.51.100.8';
const OLD = ['10.244.1.5', '10.244.2.5', '10.244.3.5'];
const NEW = [...OLD, '10.244.4.5'];

function key(i: number, vip = VIP): MapKey {
  // Per flow for even i, per client (vport, cport, proto 0) for odd i.
  return i % 2 ? { vip, client: `10.${(i >> 16) & 255}.${(i >> 8) & 255}.${i & 255}`, vport: 0, cport: 0, proto: 0 }
    : { vip, client: `10.64.${(i >> 8) & 255}.${i & 255}`, vport: 443, cport: 1024 + (i % 60000), proto: i % 4 ? 6 : 17 };
}

test('lbHash of a key is the hash of its bytes, at any offset', () => {
  for (let i = 0; i < 2000; i++) {
    const k = key(i * 7919);
    const b = Buffer.concat([Buffer.alloc(i % 5), encodeMapKey(k)]);
    assert.is(lbHashKeyBytes(b, LB_HASH_SEED, i % 5), lbHash(k, LB_HASH_SEED));
  }
});

test('movedFlows: the entries whose new pick differs, as decoding every one finds them', () => {
  const before = maglevTable(OLD, 251);
  const after = maglevTable(NEW, 251);
  const entries: Array<[Buffer, Buffer]> = [];
  for (let i = 0; i < 5000; i++) {
    const k = key(i);
    // Mostly the old row's pick; some to a target no longer known, some of another VIP.
    const target = i % 97 === 0 ? '10.244.9.9' : pickOf(before, k, LB_HASH_SEED)!;
    entries.push([encodeMapKey(i % 89 === 0 ? key(i, OTHER_VIP) : k), encodeMapping(target, BigInt(i))]);
  }
  const known = new Set(NEW);
  const decoded = entries.map(([k, v]) => ({ ...decodeMapKey(k), ...decodeMapping(v) }));
  const mine = decoded.filter((m) => m.vip === VIP && known.has(m.target));
  const want = mine.filter((m) => pickOf(after, m, LB_HASH_SEED) !== m.target).map((m) => ({ key: { vip: m.vip, client: m.client, vport: m.vport, cport: m.cport, proto: m.proto }, target: m.target }));
  const got = movedFlows(entries, VIP, known, after);
  assert.is(got.flows, mine.length);
  assert.equal(got.moved, want);
  assert.ok(want.length > 500 && want.length < mine.length / 2, `a new target moves about a quarter (${want.length} of ${mine.length})`);
  // An empty row picks nothing: every flow is moved.
  assert.is(movedFlows(entries, VIP, known, maglevTable([], 251)).moved.length, mine.length);
});

const VIP6 = '2001:db8:18::7';
const OLD6 = ['fd00:10:244:1::5', 'fd00:10:244:2::5', 'fd00:10:244:3::5'];
const NEW6 = [...OLD6, 'fd00:10:244:4::5'];

function key6(i: number, vip = VIP6): MapKey {
  return i % 2 ? { vip, client: `fd00:19:${(i >> 8) & 255}::${(i & 255).toString(16)}`, vport: 0, cport: 0, proto: 0 }
    : { vip, client: `fd00:64::${i.toString(16)}`, vport: 443, cport: 1024 + (i % 60000), proto: i % 4 ? 6 : 17 };
}

test('movedFlows of an IPv6 VIP over lb_mappings6 entries: 16-byte VIP and target, the same set as a full decode', () => {
  const before = maglevTable(OLD6, 251);
  const after = maglevTable(NEW6, 251);
  const entries: Array<[Buffer, Buffer]> = [];
  for (let i = 0; i < 5000; i++) {
    const k = key6(i);
    const target = i % 97 === 0 ? 'fd00:10:244:9::9' : pickOf(before, k, LB_HASH_SEED)!;
    // Another IPv6 VIP sharing the first 4 bytes: an IPv4-width compare would take its flows.
    entries.push([encodeMapKey(i % 89 === 0 ? key6(i, '2001:db8:18::8') : k), encodeMapping(target, BigInt(i))]);
  }
  assert.is(entries[0][0].length, 40, 'lb_map_key6');
  assert.is(entries[0][1].length, 24, 'lb_mapping6');
  const known = new Set(NEW6);
  const decoded = entries.map(([k, v]) => ({ ...decodeMapKey(k), ...decodeMapping(v) }));
  const mine = decoded.filter((m) => m.vip === VIP6 && known.has(m.target));
  const want = mine.filter((m) => pickOf(after, m, LB_HASH_SEED) !== m.target).map((m) => ({ key: { vip: m.vip, client: m.client, vport: m.vport, cport: m.cport, proto: m.proto }, target: m.target }));
  const got = movedFlows(entries, VIP6, known, after);
  assert.is(got.flows, mine.length);
  assert.equal(got.moved, want);
  assert.ok(want.length > 500 && want.length < mine.length / 2, `a new target moves about a quarter (${want.length} of ${mine.length})`);
  // The same row over the same targets moves nothing.
  assert.is(movedFlows(entries, VIP6, known, before).moved.length, mine.filter((m) => !OLD6.includes(m.target)).length);
});

test.run();
