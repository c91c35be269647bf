// BFD authentication (RFC 5880 §6.7): Keyed / Meticulous Keyed SHA1, a private Meticulous HMAC-SHA256
// for tetherd-to-tetherd use, and the sequence-number window that rejects replayed packets (§6.7.4).
import { createHash, createHmac, timingSafeEqual } from 'node:crypto';
import { ErrorCode, TetherError } from '../../lib/errors';
import { AUTH_DIGEST_OFFSET, BFD_HEADER_LEN } from './packet';

export enum BfdAuthType {
  KeyedSha1 = 4,
  MeticulousKeyedSha1 = 5,
  /**
   * Not assigned by IANA: only ever spoken between tetherds that are configured for it. HMAC avoids the
   * secret-suffix construction of keyed SHA1 (key placed in the packet, then hashed) and SHA-1 itself.
   */
  MeticulousHmacSha256 = 0xf5,
}

export interface BfdAuthConfig {
  /** Default Meticulous Keyed SHA1: the strongest standard type, with strictly increasing sequence numbers. */
  type?: BfdAuthType;
  keyId: number;
  key: Buffer;
}

export interface ResolvedAuth {
  type: BfdAuthType;
  keyId: number;
  key: Buffer;
  meticulous: boolean;
  digestLen: number;
}

const SHA1_LEN = 20;
const SHA256_LEN = 32;

export function resolveAuth(cfg: BfdAuthConfig): ResolvedAuth {
  const type = cfg.type ?? BfdAuthType.MeticulousKeyedSha1;
  if (!(type in BfdAuthType)) throw new TetherError(ErrorCode.InvalidConfig, `bfd auth.type: unsupported type ${type} (supported: 4, 5, 245)`);
  if (!Number.isInteger(cfg.keyId) || cfg.keyId < 0 || cfg.keyId > 255) throw new TetherError(ErrorCode.InvalidConfig, `bfd auth.keyId: ${cfg.keyId} is not 0..255`);
  const sha1 = type !== BfdAuthType.MeticulousHmacSha256;
  // Keyed SHA1 places the key in a 20-byte field (shorter keys are zero-padded per §4.4); HMAC takes any
  // length, but fewer than 16 bytes is too weak to be the only thing standing between peers and forgery.
  if (!Buffer.isBuffer(cfg.key) || cfg.key.length < 16 || (sha1 && cfg.key.length > SHA1_LEN)) {
    throw new TetherError(ErrorCode.InvalidConfig, `bfd auth.key: need ${sha1 ? '16..20' : 'at least 16'} bytes, got ${Buffer.isBuffer(cfg.key) ? cfg.key.length : typeof cfg.key}`);
  }
  return { type, keyId: cfg.keyId, key: cfg.key, meticulous: type !== BfdAuthType.KeyedSha1, digestLen: sha1 ? SHA1_LEN : SHA256_LEN };
}

/** Auth Len for the type: 8 bytes of type/len/key id/reserved/seq plus the digest. */
export function authLen(a: ResolvedAuth): number {
  return 8 + a.digestLen;
}

function computeDigest(a: ResolvedAuth, packet: Buffer): Buffer {
  // Work on a copy: the digest field is overwritten by the key (SHA1) or zeros (HMAC) before hashing.
  const m = Buffer.from(packet);
  const field = m.subarray(AUTH_DIGEST_OFFSET, AUTH_DIGEST_OFFSET + a.digestLen);
  field.fill(0);
  if (a.type === BfdAuthType.MeticulousHmacSha256) return createHmac('sha256', a.key).update(m).digest();
  a.key.copy(field);
  return createHash('sha1').update(m).digest();
}

/** Fills the digest of an encoded packet whose Authentication Section header is already in place. */
export function signPacket(a: ResolvedAuth, packet: Buffer): Buffer {
  computeDigest(a, packet).copy(packet, AUTH_DIGEST_OFFSET);
  return packet;
}

/** True when the carried digest matches; `packet` is the datagram cut to its Length field. */
export function verifyDigest(a: ResolvedAuth, packet: Buffer): boolean {
  if (packet.length !== BFD_HEADER_LEN + authLen(a)) return false;
  const carried = packet.subarray(AUTH_DIGEST_OFFSET, AUTH_DIGEST_OFFSET + a.digestLen);
  return timingSafeEqual(carried, computeDigest(a, packet));
}

/**
 * bfd.RcvAuthSeq / bfd.AuthSeqKnown. Keyed: accept RcvAuthSeq..RcvAuthSeq+3·DM; meticulous: RcvAuthSeq+1..
 * RcvAuthSeq+3·DM, both in 32-bit circular space, so a captured packet can never be accepted twice.
 */
export class SeqWindow {
  known = false;
  last = 0;

  /** Whether `seq` is acceptable; commit() only after the digest has been verified too. */
  check(seq: number, detectMult: number, meticulous: boolean): boolean {
    if (!this.known) return true;
    const lo = (this.last + (meticulous ? 1 : 0)) >>> 0;
    const span = (3 * detectMult - (meticulous ? 1 : 0)) >>> 0;
    return ((seq - lo) >>> 0) <= span;
  }

  commit(seq: number): void {
    this.known = true;
    this.last = seq >>> 0;
  }

  /** §6.8.1: forget after twice the detection time without a valid packet, so a restarted peer can join. */
  reset(): void {
    this.known = false;
    this.last = 0;
  }
}
