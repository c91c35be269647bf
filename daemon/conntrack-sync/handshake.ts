// The HELLO exchange: mutual proof of the cluster key over fresh nonces from both sides, and the
// per-connection keys derived from it. Nothing here touches a socket.
import { createHmac, randomBytes, timingSafeEqual } from 'node:crypto';
import { ErrorCode, TetherError } from '../../lib/errors';
import { Cursor, CodecError } from './entry-codec';
import { readU64, writeU64, SUPPORTED_VERSIONS, type VersionRange } from './frame';

/**
 * Four HELLO frames, each opening with its step number:
 *   1. sender → receiver    u8 1 | nonceS[32] | u8 n | stream | u64 epoch
 *   2. receiver → sender    u8 2 | nonceR[32] | u8 n | receiver id | proofR[32]
 *   3. sender → receiver    u8 3 | proofS[32]
 *   4. receiver → sender    u8 4                     (accepted; otherwise the connection is closed)
 * transcript = label | nonceR | nonceS | lp(sender id) | lp(receiver id) | lp(stream) | epoch
 * proofR = HMAC(K, "server" | transcript), proofS = HMAC(K, "client" | transcript).
 * Each side proves the key over a nonce the other side just chose, so a recorded handshake is useless on
 * a new connection, and the labels keep one side's proof from being reflected as the other's.
 * HELLO frames are sealed with HMAC(K, "handshake"), so a peer with another key is refused at its
 * first frame, by whichever side receives it: a wrong-key sender by the receiver, and vice versa.
 * From step 4 on each direction has its own session key.
 *
 * Version negotiation. ccd851b's HELLO reader refuses trailing bytes, flags and any frame version but 2,
 * so nothing can be added to the HELLO it reads; what each side may choose freely is its nonce. A side
 * advertises the protocol versions it speaks in the last 8 bytes of its nonce (nonceS in step 1, nonceR
 * in step 2): the marker "tether", then u8 min, u8 max; the first 24 bytes stay random. A nonce without
 * the marker (ccd851b's: 32 random bytes; the marker appears there by chance once in 2^48) advertises
 * nothing, and its side speaks exactly version 2. Both sides then speak negotiate()'s answer, the highest
 * version both speak, from step 4 on; with none, each side refuses the other (reason `version`) once the
 * proofs have checked out. The nonces are in the transcript both proofs cover, so a changed advertisement
 * fails the handshake.
 */
export const NONCE_LEN = 32;
const PROOF_LEN = 32;
const LABEL = 'tether conntrack-sync v1';
export const MIN_KEY_LEN = 32;

export function checkClusterKey(key: Buffer): void {
  if (!Buffer.isBuffer(key) || key.length < MIN_KEY_LEN) {
    throw new TetherError(ErrorCode.InvalidConfig, `conntrack sync key: must be a Buffer of at least ${MIN_KEY_LEN} bytes`);
  }
}

function hmac(key: Buffer, ...parts: Buffer[]): Buffer {
  const h = createHmac('sha256', key);
  for (const p of parts) h.update(p);
  return h.digest();
}

export function handshakeKey(key: Buffer): Buffer {
  return hmac(key, Buffer.from(`${LABEL} handshake`));
}

function lp(s: string): Buffer {
  const b = Buffer.from(s, 'utf8');
  if (b.length > 255) throw new CodecError(`'${s.slice(0, 20)}…' is longer than 255 bytes`);
  return Buffer.concat([Buffer.from([b.length]), b]);
}

export interface HelloParams {
  nonceR: Buffer;
  nonceS: Buffer;
  senderId: string;
  receiverId: string;
  stream: string;
  epoch: number;
}

export interface SessionKeys {
  /** Seals sender → receiver frames. */
  toReceiver: Buffer;
  /** Seals receiver → sender frames. */
  toSender: Buffer;
  session: Buffer;
  proofS: Buffer;
  proofR: Buffer;
}

export function deriveSession(key: Buffer, p: HelloParams): SessionKeys {
  const epoch = Buffer.alloc(8);
  writeU64(epoch, 0, p.epoch);
  const t = Buffer.concat([Buffer.from(LABEL), p.nonceR, p.nonceS, lp(p.senderId), lp(p.receiverId), lp(p.stream), epoch]);
  return {
    toReceiver: hmac(key, Buffer.from('s2r'), t),
    toSender: hmac(key, Buffer.from('r2s'), t),
    session: hmac(key, Buffer.from('session'), t).subarray(0, 8),
    proofS: hmac(key, Buffer.from('client'), t),
    proofR: hmac(key, Buffer.from('server'), t),
  };
}

export function proofsEqual(a: Buffer, b: Buffer): boolean {
  return a.length === b.length && timingSafeEqual(a, b);
}

const ADVERT_MARKER = Buffer.from('tether', 'ascii');
const ADVERT_AT = NONCE_LEN - ADVERT_MARKER.length - 2;
/** What a peer that advertises nothing (ccd851b) speaks. */
export const LEGACY_VERSIONS: VersionRange = { min: 2, max: 2 };

/** A fresh nonce advertising `versions` (undefined: a plain random nonce, as ccd851b sends). */
export function newNonce(versions: VersionRange | undefined = SUPPORTED_VERSIONS): Buffer {
  const n = randomBytes(NONCE_LEN);
  if (versions) {
    ADVERT_MARKER.copy(n, ADVERT_AT);
    n[NONCE_LEN - 2] = versions.min;
    n[NONCE_LEN - 1] = versions.max;
  }
  return n;
}

/** The versions a peer's nonce advertises; LEGACY_VERSIONS when it advertises none. */
export function advertisedVersions(nonce: Buffer): VersionRange {
  if (nonce.length !== NONCE_LEN || !nonce.subarray(ADVERT_AT, ADVERT_AT + ADVERT_MARKER.length).equals(ADVERT_MARKER)) return LEGACY_VERSIONS;
  const min = nonce[NONCE_LEN - 2], max = nonce[NONCE_LEN - 1];
  // An impossible range is a nonce that only looks like an advertisement.
  return min >= 1 && min <= max ? { min, max } : LEGACY_VERSIONS;
}

/** The highest version both ranges hold, or undefined when they share none. */
export function negotiate(mine: VersionRange, theirs: VersionRange): number | undefined {
  const v = Math.min(mine.max, theirs.max);
  return v >= mine.min && v >= theirs.min ? v : undefined;
}

export const rangeText = (r: VersionRange): string => (r.min === r.max ? `${r.min}` : `${r.min}..${r.max}`);

export function writeHello(buf: Buffer, o: number, nonceS: Buffer, stream: string, epoch: number): number {
  buf[o++] = 1;
  o += nonceS.copy(buf, o);
  o += lp(stream).copy(buf, o);
  writeU64(buf, o, epoch);
  return o + 8;
}

export function readHello(payload: Buffer): { nonceS: Buffer; stream: string; epoch: number } {
  const c = step(payload, 1);
  const nonceS = bytes(c, NONCE_LEN);
  const stream = bytes(c, c.u8()).toString('utf8');
  c.need(8);
  const epoch = readU64(payload, c.off);
  c.off += 8;
  c.done();
  return { nonceS, stream, epoch };
}

export function writeChallenge(buf: Buffer, o: number, nonceR: Buffer, receiverId: string, proofR: Buffer): number {
  buf[o++] = 2;
  o += nonceR.copy(buf, o);
  o += lp(receiverId).copy(buf, o);
  return o + proofR.copy(buf, o);
}

export function readChallenge(payload: Buffer): { nonceR: Buffer; receiverId: string; proofR: Buffer } {
  const c = step(payload, 2);
  const nonceR = bytes(c, NONCE_LEN);
  const receiverId = bytes(c, c.u8()).toString('utf8');
  const proofR = bytes(c, PROOF_LEN);
  c.done();
  return { nonceR, receiverId, proofR };
}

export function writeProof(buf: Buffer, o: number, proofS: Buffer): number {
  buf[o++] = 3;
  return o + proofS.copy(buf, o);
}

export function readProof(payload: Buffer): Buffer {
  const c = step(payload, 3);
  const proof = bytes(c, PROOF_LEN);
  c.done();
  return proof;
}

export function writeAccept(buf: Buffer, o: number): number {
  buf[o] = 4;
  return o + 1;
}

export function readAccept(payload: Buffer): void {
  step(payload, 4).done();
}

function step(payload: Buffer, n: number): Cursor {
  const c = new Cursor(payload);
  const got = c.u8();
  if (got !== n) throw new CodecError(`HELLO step ${got}, expected ${n}`);
  return c;
}

function bytes(c: Cursor, n: number): Buffer {
  c.need(n);
  const b = c.buf.subarray(c.off, c.off + n);
  c.off += n;
  return b;
}
