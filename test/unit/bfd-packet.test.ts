// BFD control packet codec: round trips, and every RFC 5880 §6.8.6 check that needs no session.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { BfdDiag, BfdState, decodeControl, encodeControl, type BfdControl } from '../../daemon/bfd/packet';
import { isTetherError } from '../../lib/errors';

const base: BfdControl = {
  diag: BfdDiag.NeighborSignaledDown,
  state: BfdState.Up,
  poll: true,
  final: false,
  cpi: false,
  demand: false,
  multipoint: false,
  detectMult: 3,
  myDiscr: 0x01020304,
  yourDiscr: 0xfffffffe,
  desiredMinTxUs: 100_000,
  requiredMinRxUs: 250_000,
  requiredMinEchoRxUs: 0,
};

test('round trip without authentication, byte layout per §4.1', () => {
  const b = encodeControl(base);
  assert.is(b.length, 24);
  // version 1, diag 3 | state Up (3<<6) + P (0x20) | mult 3 | length 24
  assert.is(b.subarray(0, 4).toString('hex'), '23e00318');
  assert.is(b.readUInt32BE(12), 100_000);
  assert.equal(decodeControl(b), base);
});

test('round trip of every flag and state', () => {
  for (const state of [BfdState.AdminDown, BfdState.Down, BfdState.Init, BfdState.Up]) {
    for (const [poll, final] of [[false, false], [true, false], [false, true]]) {
      const p = { ...base, state, poll, final, cpi: true, demand: true, yourDiscr: 7 };
      assert.equal(decodeControl(encodeControl(p)), p);
    }
  }
});

test('round trip with a keyed Authentication Section (§4.4 layout)', () => {
  const auth = { type: 5, keyId: 9, seq: 0xdeadbeef, digest: Buffer.alloc(20, 0xab) };
  const b = encodeControl({ ...base, auth });
  assert.is(b.length, 52);
  assert.is(b[1] & 0x04, 0x04, 'A bit');
  assert.is(b.subarray(24, 32).toString('hex'), '051c0900deadbeef');
  assert.equal(decodeControl(b), { ...base, auth });
});

test('trailing bytes beyond Length are ignored', () => {
  const b = Buffer.concat([encodeControl(base), Buffer.alloc(8)]);
  assert.equal(decodeControl(b), base);
});

function rejects(buf: Buffer, field: string): void {
  try {
    decodeControl(buf);
  } catch (e) {
    assert.ok(isTetherError(e), 'TetherError');
    assert.is(e.code, 'DECODE_FAILURE');
    assert.is(e.details, field, e.message);
    assert.ok(e.message.includes(field), `message names ${field}: ${e.message}`);
    return;
  }
  assert.unreachable(`accepted a packet with a bad ${field}`);
}

const mutate = (p: Partial<BfdControl>, f?: (b: Buffer) => void) => {
  const b = encodeControl({ ...base, ...p });
  f?.(b);
  return b;
};

test('§6.8.6 rejections', () => {
  rejects(Buffer.alloc(10), 'length');
  rejects(mutate({}, (b) => (b[0] = (2 << 5) | 3)), 'version');
  rejects(mutate({}, (b) => (b[0] = 3)), 'version');
  rejects(mutate({}, (b) => (b[3] = 23)), 'length');
  rejects(mutate({}, (b) => (b[3] = 40)), 'length'); // larger than the datagram
  rejects(mutate({ detectMult: 0 }), 'detectMult');
  rejects(mutate({ multipoint: true }), 'multipoint');
  rejects(mutate({ myDiscr: 0 }), 'myDiscr');
  rejects(mutate({ yourDiscr: 0, state: BfdState.Up }), 'yourDiscr');
  rejects(mutate({ yourDiscr: 0, state: BfdState.Init }), 'yourDiscr');
  rejects(mutate({ poll: true, final: true }), 'flags');
  // A bit set but no room for the section, and an Auth Len running past Length.
  rejects(mutate({}, (b) => (b[1] |= 0x04)), 'length');
  const withAuth = encodeControl({ ...base, auth: { type: 5, keyId: 1, seq: 1, digest: Buffer.alloc(20) } });
  withAuth[25] = 40;
  rejects(withAuth, 'authLen');
});

test('Your Discriminator zero is fine in Down and AdminDown', () => {
  for (const state of [BfdState.Down, BfdState.AdminDown]) {
    assert.is(decodeControl(encodeControl({ ...base, state, yourDiscr: 0 })).yourDiscr, 0);
  }
});

test.run();
