// The owner's hot path: a ctnetlink event payload straight to the sync wire encoding of its entry,
// without building a ConntrackEntry (objects and address strings per event were most of the sender's
// CPU, garbage collection included). The bytes are exactly writeEntry(decodeEntry(payload)); a test
// holds the two paths to that. Events whose reply does not go to the stream's floating address are
// skipped before anything is written.
import { CTA, CTA_IP, CTA_PROTO, CTA_PROTOINFO_TCP, CTA_PROTOINFO_TCP_ATTR as TCPA, CTA_TUPLE, NFGENMSG_LEN } from '../conntrack/constants';
import type { ConntrackEventType } from '../conntrack/types';
import { attrLen, attrType } from '../conntrack/wire';
import { AF_INET6 } from '../netlink/constants';
import {
  CodecError, E_ID, E_MARK, E_TCP, E_TIMEOUT, E_ZONE, MAX_EVENT_BYTES, P_FL_ORIG, P_FL_REPLY, P_WS_ORIG, P_WS_REPLY, T_DPORT,
  T_ICMP_CODE, T_ICMP_ID, T_ICMP_TYPE, T_SPORT, T_V6, type EncodedEvent,
} from './entry-codec';

export type { EncodedEvent };

/** One tuple, as offsets into the payload and numbers: nothing allocated per event. */
class TupleScratch {
  src = -1;
  dst = -1;
  addrLen = 0;
  proto = -1;
  flags = 0;
  sport = 0;
  dport = 0;
  icmpId = 0;
  icmpType = 0;
  icmpCode = 0;

  reset(): void {
    this.src = -1;
    this.dst = -1;
    this.addrLen = 0;
    this.proto = -1;
    this.flags = 0;
  }
}

const orig = new TupleScratch();
const reply = new TupleScratch();

// Encoded entries are written straight into a slab and handed out as views of it: no allocation and
// copy per event. A slab lives while any of its views is queued or in flight.
const SLAB_BYTES = 256 << 10;
let slab = Buffer.allocUnsafe(SLAB_BYTES);
let slabOff = 0;

function readTuple(buf: Buffer, start: number, end: number, t: TupleScratch, family: 4 | 6): void {
  t.reset();
  t.addrLen = family === 6 ? 16 : 4;
  let seen = false;
  for (let o = start; o + 4 <= end; ) {
    const len = attrLen(buf, o, end);
    const type = attrType(buf, o);
    const a = o + 4, aEnd = o + len;
    o += (len + 3) & ~3;
    if (type === CTA_TUPLE.IP) {
      for (let p = a; p + 4 <= aEnd; ) {
        const l = attrLen(buf, p, aEnd);
        const ty = attrType(buf, p);
        const b = p + 4, bl = l - 4;
        p += (l + 3) & ~3;
        if (ty === CTA_IP.V4_SRC || ty === CTA_IP.V6_SRC) t.src = b;
        else if (ty === CTA_IP.V4_DST || ty === CTA_IP.V6_DST) t.dst = b;
        else continue;
        if (bl !== 4 && bl !== 16) throw new CodecError(`address of ${bl} bytes`);
        if (seen && bl !== t.addrLen) throw new CodecError('tuple mixes IPv4 and IPv6 addresses');
        t.addrLen = bl;
        seen = true;
      }
    } else if (type === CTA_TUPLE.PROTO) {
      for (let p = a; p + 4 <= aEnd; ) {
        const l = attrLen(buf, p, aEnd);
        const ty = attrType(buf, p);
        const b = p + 4, bl = l - 4;
        p += (l + 3) & ~3;
        if (bl < 1) continue;
        switch (ty) {
          case CTA_PROTO.NUM: t.proto = buf[b]; break;
          case CTA_PROTO.SRC_PORT: if (bl >= 2) { t.sport = (buf[b] << 8) | buf[b + 1]; t.flags |= T_SPORT; } break;
          case CTA_PROTO.DST_PORT: if (bl >= 2) { t.dport = (buf[b] << 8) | buf[b + 1]; t.flags |= T_DPORT; } break;
          case CTA_PROTO.ICMP_ID: case CTA_PROTO.ICMPV6_ID: if (bl >= 2) { t.icmpId = (buf[b] << 8) | buf[b + 1]; t.flags |= T_ICMP_ID; } break;
          case CTA_PROTO.ICMP_TYPE: case CTA_PROTO.ICMPV6_TYPE: t.icmpType = buf[b]; t.flags |= T_ICMP_TYPE; break;
          case CTA_PROTO.ICMP_CODE: case CTA_PROTO.ICMPV6_CODE: t.icmpCode = buf[b]; t.flags |= T_ICMP_CODE; break;
        }
      }
    }
  }
  if (t.src < 0 || t.dst < 0 || t.proto < 0) throw new CodecError('ctnetlink tuple without addresses or protocol');
}

function writeTuple(buf: Buffer, o: number, payload: Buffer, t: TupleScratch): number {
  const v6 = t.addrLen === 16;
  buf[o++] = t.flags | (v6 ? T_V6 : 0);
  buf[o++] = t.proto;
  // Byte loops: Buffer.copy makes a view object per call, which costs more than 4 or 16 bytes do.
  for (let i = 0; i < t.addrLen; i++) buf[o + i] = payload[t.src + i];
  o += t.addrLen;
  for (let i = 0; i < t.addrLen; i++) buf[o + i] = payload[t.dst + i];
  o += t.addrLen;
  if (t.flags & T_SPORT) o = buf.writeUInt16BE(t.sport, o);
  if (t.flags & T_DPORT) o = buf.writeUInt16BE(t.dport, o);
  if (t.flags & T_ICMP_ID) o = buf.writeUInt16BE(t.icmpId, o);
  if (t.flags & T_ICMP_TYPE) buf[o++] = t.icmpType;
  if (t.flags & T_ICMP_CODE) buf[o++] = t.icmpCode;
  return o;
}

function equalBytes(a: Buffer, at: number, b: Buffer, len: number): boolean {
  for (let i = 0; i < len; i++) if (a[at + i] !== b[i]) return false;
  return true;
}

/**
 * The wire form of one ctnetlink event payload (nfgenmsg + attributes); undefined when `replyDst` (4 or
 * 16 address bytes) is given and the entry's reply goes elsewhere. Throws CodecError on a malformed payload.
 */
export function encodeEventPayload(type: ConntrackEventType, payload: Buffer, replyDst?: Buffer): EncodedEvent | undefined {
  if (SLAB_BYTES - slabOff < MAX_EVENT_BYTES) {
    slab = Buffer.allocUnsafe(SLAB_BYTES);
    slabOff = 0;
  }
  const start = slabOff;
  const end = encodeEventAt(payload, 0, payload.length, replyDst, slab, start);
  if (end < 0) return undefined;
  slabOff = (end + 7) & ~7;
  return { type, key: slab.toString('latin1', start + 5, start + 5 + tupleBytes(slab, start + 5)), bytes: slab.subarray(start, end) };
}

/**
 * encodeEventPayload without objects: the payload is bytes [start, end) of `buf` (as ConntrackEvents.sink
 * hands it over), the wire form is written at out[at] (room for MAX_EVENT_BYTES needed). Returns where it
 * ends, or -1 when `replyDst` is given and the entry's reply goes elsewhere. Throws CodecError on a
 * malformed payload. The same bytes as encodeEventPayload.
 */
export function encodeEventAt(buf: Buffer, start: number, end: number, replyDst: Buffer | undefined, out: Buffer, at: number): number {
  try {
    return encode(buf, start, end, replyDst, out, at);
  } catch (e) {
    // A malformed attribute (wire.ts) is reported as what callers of the sync codec catch.
    throw e instanceof CodecError ? e : new CodecError((e as Error).message);
  }
}

/** Length of the wire tuple at buf[o] (its flags byte first). */
export function tupleBytes(buf: Buffer, o: number): number {
  const f = buf[o];
  const addr = f & T_V6 ? 16 : 4;
  return 2 + 2 * addr + (f & T_SPORT ? 2 : 0) + (f & T_DPORT ? 2 : 0) + (f & T_ICMP_ID ? 2 : 0) + (f & T_ICMP_TYPE ? 1 : 0) + (f & T_ICMP_CODE ? 1 : 0);
}

function encode(payload: Buffer, pStart: number, end: number, replyDst: Buffer | undefined, buf: Buffer, start: number): number {
  if (end - pStart < NFGENMSG_LEN) throw new CodecError('ctnetlink message shorter than nfgenmsg');
  const family: 4 | 6 = payload[pStart] === AF_INET6 ? 6 : 4;
  let haveOrig = false, haveReply = false;
  let status = 0, timeout = -1, mark = -1, zone = -1, id = -1;
  let tcp = -1; // offset of the last CTA_PROTOINFO_TCP nest's data
  let tcpEnd = 0;
  for (let o = pStart + NFGENMSG_LEN; o + 4 <= end; ) {
    const len = attrLen(payload, o, end);
    const type = attrType(payload, o);
    const at = o + 4, l = len - 4;
    o += (len + 3) & ~3;
    switch (type) {
      case CTA.TUPLE_ORIG: readTuple(payload, at, at + l, orig, family); haveOrig = true; break;
      case CTA.TUPLE_REPLY: readTuple(payload, at, at + l, reply, family); haveReply = true; break;
      case CTA.STATUS: if (l >= 4) status = payload.readUInt32BE(at); break;
      case CTA.TIMEOUT: if (l >= 4) timeout = payload.readUInt32BE(at); break;
      case CTA.MARK: if (l >= 4) mark = payload.readUInt32BE(at); break;
      case CTA.ZONE: if (l >= 2) zone = payload.readUInt16BE(at); break;
      case CTA.ID: if (l >= 4) id = payload.readUInt32BE(at); break;
      case CTA.PROTOINFO:
        for (let p = at; p + 4 <= at + l; ) {
          const pl = attrLen(payload, p, at + l);
          if (attrType(payload, p) === CTA_PROTOINFO_TCP) {
            tcp = p + 4;
            tcpEnd = p + pl;
          }
          p += (pl + 3) & ~3;
        }
        break;
    }
  }
  if (!haveOrig || !haveReply) throw new CodecError('ctnetlink entry without original and reply tuples');
  if (replyDst && (reply.addrLen !== replyDst.length || !equalBytes(payload, reply.dst, replyDst, replyDst.length))) return -1;

  let o = start;
  buf[o++] = (timeout >= 0 ? E_TIMEOUT : 0) | (mark >= 0 ? E_MARK : 0) | (zone >= 0 ? E_ZONE : 0) | (tcp >= 0 ? E_TCP : 0) | (id >= 0 ? E_ID : 0);
  o = buf.writeUInt32BE(status >>> 0, o);
  o = writeTuple(buf, o, payload, orig);
  o = writeTuple(buf, o, payload, reply);
  if (timeout >= 0) o = buf.writeUInt32BE(timeout, o);
  if (mark >= 0) o = buf.writeUInt32BE(mark, o);
  if (zone >= 0) o = buf.writeUInt16BE(zone, o);
  if (tcp >= 0) {
    let state = 0, p = 0, wsO = 0, wsR = 0, flO = 0, flR = 0;
    for (let q = tcp; q + 4 <= tcpEnd; ) {
      const ql = attrLen(payload, q, tcpEnd);
      const ty = attrType(payload, q);
      const b = q + 4;
      q += (ql + 3) & ~3;
      if (ql - 4 < 1) continue;
      if (ty === TCPA.STATE) state = payload[b];
      else if (ty === TCPA.WSCALE_ORIGINAL) { wsO = payload[b]; p |= P_WS_ORIG; }
      else if (ty === TCPA.WSCALE_REPLY) { wsR = payload[b]; p |= P_WS_REPLY; }
      else if (ty === TCPA.FLAGS_ORIGINAL) { flO = payload[b]; p |= P_FL_ORIG; }
      else if (ty === TCPA.FLAGS_REPLY) { flR = payload[b]; p |= P_FL_REPLY; }
    }
    buf[o++] = state;
    buf[o++] = p;
    if (p & P_WS_ORIG) buf[o++] = wsO;
    if (p & P_WS_REPLY) buf[o++] = wsR;
    if (p & P_FL_ORIG) o = buf.writeUInt16BE(flO, o);
    if (p & P_FL_REPLY) o = buf.writeUInt16BE(flR, o);
  }
  if (id >= 0) o = buf.writeUInt32BE(id, o);
  return o;
}

/** Where the reply tuple's destination address of the wire entry at buf[at] lies: [offset, offset + length). */
export function replyDstAt(buf: Buffer, at: number): { off: number; len: number } {
  const r = at + 5 + tupleBytes(buf, at + 5);
  const len = buf[r] & T_V6 ? 16 : 4;
  return { off: r + 2 + len, len };
}

/**
 * The reply tuple's destination address of an encoded event, as a latin1 string of its 4 or 16 bytes
 * (compare with `ipToBytes(address).toString('latin1')`): how one event socket per namespace is shared
 * among the floating addresses of that namespace.
 */
export function encodedReplyDst(ev: EncodedEvent): string {
  const { off, len } = replyDstAt(ev.bytes, 0);
  return ev.bytes.toString('latin1', off, off + len);
}

/** Whether the reply tuple of the wire entry at buf[at] goes to `addr` (its 4 or 16 bytes). */
export function replyDstIs(buf: Buffer, at: number, addr: Buffer): boolean {
  const r = at + 5 + tupleBytes(buf, at + 5);
  const len = buf[r] & T_V6 ? 16 : 4;
  return len === addr.length && equalBytes(buf, r + 2 + len, addr, len);
}
