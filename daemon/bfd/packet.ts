// BFD Control packet codec (RFC 5880 §4.1, §4.4) and the reception checks of §6.8.6 that need no session.
// Anything that fails here is counted as "malformed" by the endpoint; session-level checks live in session.ts.
import { ErrorCode, TetherError } from '../../lib/errors';

export const BFD_VERSION = 1;
/** Mandatory section length; the Length field covers it plus the Authentication Section when A is set. */
export const BFD_HEADER_LEN = 24;

export enum BfdState {
  AdminDown = 0,
  Down = 1,
  Init = 2,
  Up = 3,
}

/** RFC 5880 §4.1 diagnostic codes; Tether sets 0, 1, 3 and 7. */
export enum BfdDiag {
  None = 0,
  ControlDetectionTimeExpired = 1,
  EchoFunctionFailed = 2,
  NeighborSignaledDown = 3,
  ForwardingPlaneReset = 4,
  PathDown = 5,
  ConcatenatedPathDown = 6,
  AdministrativelyDown = 7,
  ReverseConcatenatedPathDown = 8,
}

/** Authentication Section of the keyed types (§4.3/§4.4 layout: type, len, key id, reserved, seq, digest). */
export interface BfdAuthSection {
  type: number;
  keyId: number;
  seq: number;
  /** Digest bytes as carried (zeros before signing). */
  digest: Buffer;
}

export interface BfdControl {
  diag: BfdDiag;
  state: BfdState;
  poll: boolean;
  final: boolean;
  /** C bit: forwarding independent of the control plane. Tether runs in user space, so always false. */
  cpi: boolean;
  demand: boolean;
  multipoint: boolean;
  detectMult: number;
  myDiscr: number;
  yourDiscr: number;
  desiredMinTxUs: number;
  requiredMinRxUs: number;
  requiredMinEchoRxUs: number;
  auth?: BfdAuthSection;
}

/** Offset of the digest inside an encoded packet with a keyed Authentication Section. */
export const AUTH_DIGEST_OFFSET = BFD_HEADER_LEN + 8;

export function encodeControl(p: BfdControl): Buffer {
  const authLen = p.auth ? 8 + p.auth.digest.length : 0;
  const b = Buffer.alloc(BFD_HEADER_LEN + authLen);
  b[0] = (BFD_VERSION << 5) | (p.diag & 0x1f);
  b[1] =
    ((p.state & 3) << 6) |
    (p.poll ? 0x20 : 0) |
    (p.final ? 0x10 : 0) |
    (p.cpi ? 0x08 : 0) |
    (p.auth ? 0x04 : 0) |
    (p.demand ? 0x02 : 0) |
    (p.multipoint ? 0x01 : 0);
  b[2] = p.detectMult;
  b[3] = b.length;
  b.writeUInt32BE(p.myDiscr >>> 0, 4);
  b.writeUInt32BE(p.yourDiscr >>> 0, 8);
  b.writeUInt32BE(p.desiredMinTxUs >>> 0, 12);
  b.writeUInt32BE(p.requiredMinRxUs >>> 0, 16);
  b.writeUInt32BE(p.requiredMinEchoRxUs >>> 0, 20);
  if (p.auth) {
    b[24] = p.auth.type;
    b[25] = authLen;
    b[26] = p.auth.keyId;
    b[27] = 0;
    b.writeUInt32BE(p.auth.seq >>> 0, 28);
    p.auth.digest.copy(b, AUTH_DIGEST_OFFSET);
  }
  return b;
}

function malformed(field: string, message: string): TetherError {
  return new TetherError(ErrorCode.DecodeFailure, `BFD control packet: ${field}: ${message}`, { details: field });
}

/**
 * Decodes one datagram and applies the §6.8.6 checks that need no session. Throws a DecodeFailure
 * TetherError whose `details` names the offending field. Digest and sequence checks are the session's.
 */
export function decodeControl(buf: Buffer): BfdControl {
  if (buf.length < BFD_HEADER_LEN) throw malformed('length', `datagram of ${buf.length} bytes is shorter than ${BFD_HEADER_LEN}`);
  const version = buf[0] >> 5;
  if (version !== BFD_VERSION) throw malformed('version', `version ${version}, expected ${BFD_VERSION}`);
  const flags = buf[1];
  const a = (flags & 0x04) !== 0;
  const length = buf[3];
  if (length < (a ? BFD_HEADER_LEN + 2 : BFD_HEADER_LEN)) throw malformed('length', `Length ${length} is too short`);
  if (length > buf.length) throw malformed('length', `Length ${length} exceeds the ${buf.length}-byte datagram`);
  const p: BfdControl = {
    diag: buf[0] & 0x1f,
    state: flags >> 6,
    poll: (flags & 0x20) !== 0,
    final: (flags & 0x10) !== 0,
    cpi: (flags & 0x08) !== 0,
    demand: (flags & 0x02) !== 0,
    multipoint: (flags & 0x01) !== 0,
    detectMult: buf[2],
    myDiscr: buf.readUInt32BE(4),
    yourDiscr: buf.readUInt32BE(8),
    desiredMinTxUs: buf.readUInt32BE(12),
    requiredMinRxUs: buf.readUInt32BE(16),
    requiredMinEchoRxUs: buf.readUInt32BE(20),
  };
  if (p.detectMult === 0) throw malformed('detectMult', 'Detect Mult is zero');
  if (p.multipoint) throw malformed('multipoint', 'Multipoint (M) bit is set');
  if (p.myDiscr === 0) throw malformed('myDiscr', 'My Discriminator is zero');
  if (p.yourDiscr === 0 && p.state !== BfdState.Down && p.state !== BfdState.AdminDown) {
    throw malformed('yourDiscr', `Your Discriminator is zero in state ${BfdState[p.state]}`);
  }
  // §6.5 forbids sending both; a packet that claims both cannot be answered sensibly.
  if (p.poll && p.final) throw malformed('flags', 'Poll and Final are both set');
  if (a) {
    const authLen = buf[25];
    if (authLen < 2 || BFD_HEADER_LEN + authLen > length) throw malformed('authLen', `Auth Len ${authLen} does not fit in Length ${length}`);
    // Every type Tether accepts is keyed (type, len, key id, reserved, seq, digest); others fail later
    // as an auth type mismatch, so only the keyed layout needs to be readable here.
    if (authLen >= 8) {
      p.auth = { type: buf[24], keyId: buf[26], seq: buf.readUInt32BE(28), digest: Buffer.from(buf.subarray(AUTH_DIGEST_OFFSET, BFD_HEADER_LEN + authLen)) };
    } else {
      p.auth = { type: buf[24], keyId: 0, seq: 0, digest: Buffer.alloc(0) };
    }
  }
  return p;
}
