// Conntrack sync wire framing: length-prefixed, versioned, sequenced frames sealed with a truncated
// HMAC-SHA256, and a streaming reader that refuses an oversize length before allocating anything.
import { createHmac, timingSafeEqual } from 'node:crypto';

/**
 * Frame layout, big-endian:
 *   0  u32  length of what follows (rest of header + payload + MAC)
 *   4  u8   protocol version (2: RESYNC_BEGIN names its buckets, DIGEST and BUCKET_REQUEST exist).
 *           HELLO frames are always HELLO_VERSION; the frames after them carry the version the two sides
 *           negotiated in the HELLO exchange (handshake.ts), the highest both speak.
 *   5  u8   frame type (FrameType)
 *   6  u8   flags (0; reserved)
 *   7  u8   sender id length n (1..64)
 *   8  8B   session id (zero during the handshake)
 *  16  u64  sequence number, per connection and direction, starting at 0, each frame exactly +1
 *  24  n    sender id (UTF-8)
 *  24+n     payload
 *  end-16   MAC: HMAC-SHA256(key, bytes 0 .. end-16) truncated to 128 bits
 */
export const PROTOCOL_VERSION = 2;
/**
 * The versions this release speaks, lowest and highest. The previous release (ccd851b) speaks exactly 2
 * and advertises nothing; a peer that advertises nothing is taken to speak exactly 2.
 */
export const MIN_PROTOCOL_VERSION = 2;
export const MAX_PROTOCOL_VERSION = 2;
/**
 * The version of every HELLO frame, whatever the two sides speak afterwards: ccd851b reads only version 2,
 * and the HELLO exchange is where two releases learn each other's range, so it must stay readable by both.
 */
export const HELLO_VERSION = PROTOCOL_VERSION;
export interface VersionRange {
  min: number;
  max: number;
}
export const SUPPORTED_VERSIONS: VersionRange = { min: MIN_PROTOCOL_VERSION, max: MAX_PROTOCOL_VERSION };
export const FrameType = {
  HELLO: 1,
  EVENTS: 2,
  /** Sender → receiver: a transfer starts. u32 entries, then its bucket set (digest.ts; no buckets = the
   *  whole table). Its CHUNKs are applied as they arrive; at END the receiver deletes what the transfer's
   *  buckets hold and the transfer did not carry (mark and sweep). */
  RESYNC_BEGIN: 3,
  RESYNC_CHUNK: 4,
  RESYNC_END: 5,
  ACK: 6,
  HEARTBEAT: 7,
  /** Receiver → sender, empty: send the whole table again (a new standby on the receiving node needs it). */
  RESYNC_REQUEST: 8,
  /** Sender → receiver: the owner's per-bucket digests (digest.ts), the periodic consistency check. */
  DIGEST: 9,
  /** Receiver → sender: u32 k, u32 n, n bucket numbers whose digest differs here: send those buckets. */
  BUCKET_REQUEST: 10,
} as const;
export type FrameType = (typeof FrameType)[keyof typeof FrameType];

export const FIXED_HEADER = 24;
export const MAC_LEN = 16;
export const SESSION_LEN = 8;
export const MAX_SENDER_ID = 64;
/** Smallest legal value of the length field: header after it, a 1-byte sender id, the MAC. */
export const MIN_FRAME_LENGTH = FIXED_HEADER - 4 + 1 + MAC_LEN;
export const DEFAULT_MAX_FRAME = 1 << 20;

/** `version`: the peer speaks no protocol version this side speaks (a frame of another version, or no shared one). */
export type RejectReason = 'auth' | 'replay' | 'malformed' | 'oversize' | 'stale' | 'timeout' | 'version';
export function emptyRejects(): Record<RejectReason, number> {
  return { auth: 0, replay: 0, malformed: 0, oversize: 0, stale: 0, timeout: 0, version: 0 };
}

/** A problem with a received frame; the connection it came on is dropped. */
export class FrameRejected extends Error {
  constructor(readonly reason: RejectReason, message: string) {
    super(message);
    this.name = 'FrameRejected';
  }
}

export function senderBytes(id: string): Buffer {
  const b = Buffer.from(id, 'utf8');
  if (b.length < 1 || b.length > MAX_SENDER_ID) throw new RangeError(`sender id '${id}': must be 1..${MAX_SENDER_ID} bytes`);
  return b;
}

// Sequence numbers stay below 2^53 so they are exact JS numbers; 2^53 frames is centuries at any rate.
function writeU64(buf: Buffer, off: number, v: number): void {
  buf.writeUInt32BE(Math.floor(v / 0x100000000), off);
  buf.writeUInt32BE(v >>> 0, off + 4);
}
export function readU64(buf: Buffer, off: number): number {
  const hi = buf.readUInt32BE(off);
  if (hi >= 0x200000) throw new FrameRejected('malformed', 'sequence number beyond 2^53');
  return hi * 0x100000000 + buf.readUInt32BE(off + 4);
}
export { writeU64 };

export function mac(key: Buffer, data: Buffer): Buffer {
  return createHmac('sha256', key).update(data).digest().subarray(0, MAC_LEN);
}

/** Builds this side's outgoing frames: numbers them and seals them with the current key. */
export class FrameWriter {
  /** Sequence number of the next frame. */
  seq = 0;
  key: Buffer;
  session: Buffer = Buffer.alloc(SESSION_LEN);
  /** Written in every frame: HELLO_VERSION until the HELLO exchange settles on one. */
  version = HELLO_VERSION;

  constructor(readonly sender: Buffer, key: Buffer) {
    this.key = key;
  }

  /** Where frames are assembled: reused, so a frame costs one buffer of its exact size. */
  private scratch = Buffer.allocUnsafe(0);

  /** `fill` writes at most `maxPayload` bytes at `off` and returns where it stopped. */
  build(type: FrameType, maxPayload: number, fill?: (buf: Buffer, off: number) => number): Buffer {
    const start = FIXED_HEADER + this.sender.length;
    const size = start + maxPayload + MAC_LEN;
    if (this.scratch.length < size) this.scratch = Buffer.allocUnsafe(Math.max(size, 2 * this.scratch.length));
    const buf = this.scratch;
    const end = fill ? fill(buf, start) : start;
    if (end > start + maxPayload) throw new RangeError(`payload overran its ${maxPayload} bytes`);
    const total = end + MAC_LEN;
    buf.writeUInt32BE(total - 4, 0);
    buf[4] = this.version;
    buf[5] = type;
    buf[6] = 0;
    buf[7] = this.sender.length;
    this.session.copy(buf, 8);
    writeU64(buf, 16, this.seq++);
    this.sender.copy(buf, FIXED_HEADER);
    const out = Buffer.allocUnsafe(total);
    buf.copy(out, 0, 0, end);
    createHmac('sha256', this.key).update(out.subarray(0, end)).digest().copy(out, end, 0, MAC_LEN);
    // A very large scratch (one huge frame) is not kept for good.
    if (this.scratch.length > 4 * DEFAULT_MAX_FRAME) this.scratch = Buffer.allocUnsafe(0);
    return out;
  }
}

export interface Frame {
  type: number;
  seq: number;
  session: Buffer;
  sender: Buffer;
  payload: Buffer;
}

/**
 * Parses a whole frame (length prefix included) of protocol `version` and checks its MAC with `key`. The
 * version is checked first: another version's layout after it is not known, so nothing else can be.
 */
export function openFrame(buf: Buffer, key: Buffer, version = HELLO_VERSION): Frame {
  if (buf[4] !== version) {
    const speaks = MIN_PROTOCOL_VERSION === MAX_PROTOCOL_VERSION ? `${MIN_PROTOCOL_VERSION}` : `${MIN_PROTOCOL_VERSION}..${MAX_PROTOCOL_VERSION}`;
    throw new FrameRejected('version', `frame of protocol version ${buf[4]}, ${version} expected (this node speaks ${speaks})`);
  }
  const n = buf[7];
  if (n < 1 || n > MAX_SENDER_ID || FIXED_HEADER + n + MAC_LEN > buf.length) throw new FrameRejected('malformed', `sender id length ${n}`);
  const end = buf.length - MAC_LEN;
  const want = mac(key, buf.subarray(0, end));
  if (!timingSafeEqual(want, buf.subarray(end))) throw new FrameRejected('auth', `bad MAC on frame type ${buf[5]}`);
  // Only an authenticated frame is looked at further.
  if (buf[6] !== 0) throw new FrameRejected('malformed', `flags ${buf[6]}`);
  return {
    type: buf[5],
    seq: readU64(buf, 16),
    session: buf.subarray(8, 16),
    sender: buf.subarray(FIXED_HEADER, FIXED_HEADER + n),
    payload: buf.subarray(FIXED_HEADER + n, end),
  };
}

/**
 * The sender id a frame claims, unauthenticated (undefined when its header cannot be read): for saying which
 * peer a refused frame came from, never for deciding anything.
 */
export function claimedSender(buf: Buffer): string | undefined {
  const n = buf.length > 7 ? buf[7] : 0;
  if (n < 1 || n > MAX_SENDER_ID || FIXED_HEADER + n > buf.length) return undefined;
  return buf.toString('utf8', FIXED_HEADER, FIXED_HEADER + n);
}

/**
 * Splits a byte stream into whole frames. The length field is checked before any buffer is sized from
 * it, so a hostile prefix costs nothing; after the first error the reader ignores everything.
 */
export class FrameReader {
  private head = Buffer.alloc(4);
  private headHave = 0;
  private body: Buffer | undefined;
  private bodyHave = 0;
  private failed = false;

  constructor(
    private readonly maxFrame: number,
    private readonly onFrame: (frame: Buffer) => void,
    private readonly onError: (e: FrameRejected) => void,
  ) {}

  push(chunk: Buffer): void {
    let off = 0;
    while (off < chunk.length && !this.failed) {
      if (!this.body) {
        // Fast path: a whole frame inside the chunk is handed on without copying.
        if (this.headHave === 0 && chunk.length - off >= 4) {
          const len = chunk.readUInt32BE(off);
          if (!this.lengthOk(len)) return;
          if (chunk.length - off >= 4 + len) {
            this.onFrame(chunk.subarray(off, off + 4 + len));
            off += 4 + len;
            continue;
          }
        }
        const take = Math.min(4 - this.headHave, chunk.length - off);
        chunk.copy(this.head, this.headHave, off, off + take);
        this.headHave += take;
        off += take;
        if (this.headHave < 4) return;
        const len = this.head.readUInt32BE(0);
        if (!this.lengthOk(len)) return;
        this.body = Buffer.allocUnsafe(4 + len);
        this.head.copy(this.body, 0);
        this.bodyHave = 4;
      }
      const take = Math.min(this.body.length - this.bodyHave, chunk.length - off);
      chunk.copy(this.body, this.bodyHave, off, off + take);
      this.bodyHave += take;
      off += take;
      if (this.bodyHave === this.body.length) {
        const frame = this.body;
        this.body = undefined;
        this.headHave = 0;
        this.onFrame(frame);
      }
    }
  }

  /** Stops the reader (the connection is being dropped). */
  stop(): void {
    this.failed = true;
  }

  private lengthOk(len: number): boolean {
    if (len > this.maxFrame) this.fail(new FrameRejected('oversize', `frame length ${len} over the limit of ${this.maxFrame}`));
    else if (len < MIN_FRAME_LENGTH) this.fail(new FrameRejected('malformed', `frame length ${len} under ${MIN_FRAME_LENGTH}`));
    else return true;
    return false;
  }

  private fail(e: FrameRejected): void {
    this.failed = true;
    this.onError(e);
  }
}
