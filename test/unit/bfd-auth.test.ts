// BFD authentication: the Keyed SHA1 digest against a vector built by hand from RFC 5880 §4.4/§6.7.4,
// HMAC-SHA256, key validation, and the sequence-number replay window in 32-bit circular space.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { createHash, createHmac } from 'node:crypto';
import { BfdAuthType, resolveAuth, SeqWindow, signPacket, verifyDigest } from '../../daemon/bfd/auth';
import { BfdDiag, BfdState, encodeControl } from '../../daemon/bfd/packet';
import { isTetherError } from '../../lib/errors';

const KEY = Buffer.from('000102030405060708090a0b0c0d0e0f10111213', 'hex');

// Written out field by field: v1/diag 0 = 0x20; Up (0xc0) + A (0x04); mult 3; length 52; My 0x11111111;
// Your 0x22222222; TX 100000 µs; RX 100000 µs; echo 0 | type 5, len 28, key id 1, reserved, seq 7.
const HEADER_HEX = '20c40334' + '11111111' + '22222222' + '000186a0' + '000186a0' + '00000000' + '051c0100' + '00000007';
// SHA1 of HEADER_HEX followed by the key in the digest field, computed once and pinned.
const DIGEST_HEX = '52fe5bd32cc07d0b7b88e60a9b45b49b72c648e7';

function packet(type: number, seq: number, digestLen = 20): Buffer {
  return encodeControl({
    diag: BfdDiag.None,
    state: BfdState.Up,
    poll: false,
    final: false,
    cpi: false,
    demand: false,
    multipoint: false,
    detectMult: 3,
    myDiscr: 0x11111111,
    yourDiscr: 0x22222222,
    desiredMinTxUs: 100_000,
    requiredMinRxUs: 100_000,
    requiredMinEchoRxUs: 0,
    auth: { type, keyId: 1, seq, digest: Buffer.alloc(digestLen) },
  });
}

test('Meticulous Keyed SHA1: digest over the packet with the key in the digest field', () => {
  const a = resolveAuth({ keyId: 1, key: KEY });
  assert.is(a.type, BfdAuthType.MeticulousKeyedSha1, 'default type');
  const signed = signPacket(a, packet(5, 7));
  assert.is(signed.subarray(0, 32).toString('hex'), HEADER_HEX);
  const expected = createHash('sha1').update(Buffer.concat([Buffer.from(HEADER_HEX, 'hex'), KEY])).digest('hex');
  assert.is(expected, DIGEST_HEX);
  assert.is(signed.subarray(32).toString('hex'), DIGEST_HEX);
  assert.ok(verifyDigest(a, signed));
});

test('a key shorter than 20 bytes is zero-padded in the digest field', () => {
  const key = KEY.subarray(0, 16);
  const a = resolveAuth({ type: BfdAuthType.KeyedSha1, keyId: 1, key });
  const signed = signPacket(a, packet(4, 7));
  const m = Buffer.from(signed);
  m.fill(0, 32);
  key.copy(m, 32);
  assert.is(signed.subarray(32).toString('hex'), createHash('sha1').update(m).digest('hex'));
});

test('verification fails on any changed bit, a wrong key or a truncated packet', () => {
  const a = resolveAuth({ keyId: 1, key: KEY });
  const good = signPacket(a, packet(5, 7));
  for (const i of [0, 1, 7, 13, 24, 28, 31, 40, 51]) {
    const bad = Buffer.from(good);
    bad[i] ^= 0x01;
    assert.not.ok(verifyDigest(a, bad), `bit flipped at byte ${i}`);
  }
  const other = resolveAuth({ keyId: 1, key: Buffer.alloc(20, 7) });
  assert.not.ok(verifyDigest(other, good));
  assert.not.ok(verifyDigest(a, good.subarray(0, 48)));
});

test('HMAC-SHA256 (private type 0xf5): HMAC over the packet with a zeroed digest field', () => {
  const key = Buffer.alloc(32, 0x5a);
  const a = resolveAuth({ type: BfdAuthType.MeticulousHmacSha256, keyId: 2, key });
  const signed = signPacket(a, packet(0xf5, 9, 32));
  assert.is(signed.length, 24 + 40);
  const m = Buffer.from(signed);
  m.fill(0, 32);
  assert.is(signed.subarray(32).toString('hex'), createHmac('sha256', key).update(m).digest('hex'));
  assert.ok(verifyDigest(a, signed));
});

test('auth config errors name the field', () => {
  const bad: Array<[unknown, string]> = [
    [{ keyId: 1, key: Buffer.alloc(8) }, 'auth.key'],
    [{ keyId: 1, key: Buffer.alloc(21) }, 'auth.key'],
    [{ keyId: 256, key: KEY }, 'auth.keyId'],
    [{ type: 2, keyId: 1, key: KEY }, 'auth.type'],
  ];
  for (const [cfg, field] of bad) {
    try {
      resolveAuth(cfg as never);
      assert.unreachable(field);
    } catch (e) {
      assert.ok(isTetherError(e) && e.code === 'INVALID_CONFIG' && e.message.includes(field), String(e));
    }
  }
});

test('replay window, meticulous: strictly increasing, at most 3 × Detect Mult ahead', () => {
  const w = new SeqWindow();
  assert.ok(w.check(1000, 3, true), 'anything goes while the sequence is unknown');
  w.commit(1000);
  assert.not.ok(w.check(1000, 3, true), 'same number again');
  assert.not.ok(w.check(999, 3, true), 'older');
  assert.ok(w.check(1001, 3, true));
  assert.ok(w.check(1009, 3, true), '+9 = 3 × 3');
  assert.not.ok(w.check(1010, 3, true), '+10');
  w.reset();
  assert.ok(w.check(5, 3, true), 'forgotten after reset');
});

test('replay window, keyed: the last number may repeat (§6.7.4)', () => {
  const w = new SeqWindow();
  w.commit(50);
  assert.ok(w.check(50, 3, false));
  assert.ok(w.check(59, 3, false));
  assert.not.ok(w.check(60, 3, false));
  assert.not.ok(w.check(49, 3, false));
});

test('replay window wraps around 2^32', () => {
  const w = new SeqWindow();
  w.commit(0xfffffffe);
  assert.ok(w.check(0xffffffff, 3, true));
  assert.ok(w.check(0, 3, true));
  assert.ok(w.check(7, 3, true), '0xfffffffe + 9');
  assert.not.ok(w.check(8, 3, true));
  assert.not.ok(w.check(0xfffffffd, 3, true));
});

test.run();
