// A standby's hot path: synced entries written into ctnetlink messages straight from their sync wire
// bytes (entry-codec.ts), without building a ConntrackEntry per entry (objects and address strings per
// entry were most of the receiver's CPU). The messages are byte for byte what conntrack/codec.ts writes
// for the decoded entry (writeCreate, writeUpdate, writeLookup); a test holds the two paths to that.
import { CTA, CTA_IP, CTA_NAT, CTA_PROTO, CTA_PROTOINFO_TCP, CTA_PROTOINFO_TCP_ATTR as TCPA, CTA_PROTONAT, CTA_TUPLE, IP_CT_TCP_FLAG, IPPROTO } from '../conntrack/constants';
import { IPS } from '../conntrack/types';
import type { Writer } from '../conntrack/wire';
import { AF_INET, AF_INET6 } from '../netlink/constants';
import { E_MARK, E_TCP, E_TIMEOUT, E_ZONE, P_FL_ORIG, P_FL_REPLY, P_WS_ORIG, P_WS_REPLY, T_DPORT, T_ICMP_CODE, T_ICMP_ID, T_ICMP_TYPE, T_SPORT, T_V6 } from './entry-codec';

/** One wire tuple as offsets and numbers (-1: absent), read in place. */
class TupleAt {
  /** Offsets of the source and destination address bytes. */
  src = 0;
  dst = 0;
  v6 = false;
  proto = 0;
  sport = -1;
  dport = -1;
  icmpId = -1;
  icmpType = -1;
  icmpCode = -1;
  buf: Buffer = Buffer.alloc(0);

  /** Reads the tuple at buf[o]; returns where it ends. */
  read(buf: Buffer, o: number): number {
    this.buf = buf;
    const f = buf[o];
    this.v6 = (f & T_V6) !== 0;
    this.proto = buf[o + 1];
    const al = this.v6 ? 16 : 4;
    this.src = o + 2;
    this.dst = o + 2 + al;
    let q = o + 2 + 2 * al;
    this.sport = this.dport = this.icmpId = this.icmpType = this.icmpCode = -1;
    if (f & T_SPORT) { this.sport = (buf[q] << 8) | buf[q + 1]; q += 2; }
    if (f & T_DPORT) { this.dport = (buf[q] << 8) | buf[q + 1]; q += 2; }
    if (f & T_ICMP_ID) { this.icmpId = (buf[q] << 8) | buf[q + 1]; q += 2; }
    if (f & T_ICMP_TYPE) this.icmpType = buf[q++];
    if (f & T_ICMP_CODE) this.icmpCode = buf[q++];
    return q;
  }
}

const orig = new TupleAt();
const reply = new TupleAt();

/** The parts of one wire entry a ctnetlink message needs, read in place. */
const E = { status: 0, timeout: -1, mark: -1, zone: -1, tcp: false, tcpState: 0, wsO: -1, wsR: -1, flO: -1, flR: -1 };

function readEntryAt(buf: Buffer, o: number): void {
  const flags = buf[o];
  E.status = buf.readUInt32BE(o + 1);
  let q = orig.read(buf, o + 5);
  q = reply.read(buf, q);
  E.timeout = E.mark = E.zone = E.wsO = E.wsR = E.flO = E.flR = -1;
  if (flags & E_TIMEOUT) { E.timeout = buf.readUInt32BE(q); q += 4; }
  if (flags & E_MARK) { E.mark = buf.readUInt32BE(q); q += 4; }
  if (flags & E_ZONE) { E.zone = (buf[q] << 8) | buf[q + 1]; q += 2; }
  E.tcp = (flags & E_TCP) !== 0;
  if (E.tcp) {
    E.tcpState = buf[q];
    const p = buf[q + 1];
    q += 2;
    if (p & P_WS_ORIG) E.wsO = buf[q++];
    if (p & P_WS_REPLY) E.wsR = buf[q++];
    if (p & P_FL_ORIG) { E.flO = (buf[q] << 8) | buf[q + 1]; q += 2; }
    if (p & P_FL_REPLY) { E.flR = (buf[q] << 8) | buf[q + 1]; q += 2; }
  }
}

function hasPorts(proto: number): boolean {
  return proto === IPPROTO.TCP || proto === IPPROTO.UDP || proto === IPPROTO.UDPLITE || proto === IPPROTO.SCTP || proto === IPPROTO.DCCP;
}

function isIcmp(proto: number): boolean {
  return proto === IPPROTO.ICMP || proto === IPPROTO.ICMPV6;
}

function sameAddr(a: Buffer, ao: number, b: Buffer, bo: number, len: number): boolean {
  for (let i = 0; i < len; i++) if (a[ao + i] !== b[bo + i]) return false;
  return true;
}

/**
 * A tuple nest as codec.ts writeTuple writes it, with the addresses (offsets into the entry's bytes) and
 * ports given: the tuple's own, or for the un-NATed reply partly the original tuple's.
 */
function writeTupleAt(w: Writer, type: number, t: TupleAt, src: number, dst: number, sport: number, dport: number, icmpId: number): void {
  const al = t.v6 ? 16 : 4;
  const tuple = w.start(type);
  const ip = w.start(CTA_TUPLE.IP);
  w.copyAttr(t.v6 ? CTA_IP.V6_SRC : CTA_IP.V4_SRC, t.buf, src, al);
  w.copyAttr(t.v6 ? CTA_IP.V6_DST : CTA_IP.V4_DST, t.buf, dst, al);
  w.end(ip);
  const l4 = w.start(CTA_TUPLE.PROTO);
  w.u8(CTA_PROTO.NUM, t.proto);
  if (hasPorts(t.proto)) {
    w.be16(CTA_PROTO.SRC_PORT, sport < 0 ? 0 : sport);
    w.be16(CTA_PROTO.DST_PORT, dport < 0 ? 0 : dport);
  } else if (isIcmp(t.proto)) {
    const six = t.proto === IPPROTO.ICMPV6;
    w.be16(six ? CTA_PROTO.ICMPV6_ID : CTA_PROTO.ICMP_ID, icmpId < 0 ? 0 : icmpId);
    w.u8(six ? CTA_PROTO.ICMPV6_TYPE : CTA_PROTO.ICMP_TYPE, t.icmpType < 0 ? 0 : t.icmpType);
    w.u8(six ? CTA_PROTO.ICMPV6_CODE : CTA_PROTO.ICMP_CODE, t.icmpCode < 0 ? 0 : t.icmpCode);
  }
  w.end(l4);
  w.end(tuple);
}

function writeOwnTuple(w: Writer, type: number, t: TupleAt): void {
  writeTupleAt(w, type, t, t.src, t.dst, t.sport, t.dport, t.icmpId);
}

/** natPort of codec.ts: the port NAT rewrites in a tuple (-1: none). */
function natPort(t: TupleAt, side: 'src' | 'dst'): number {
  if (hasPorts(t.proto)) return side === 'src' ? t.sport : t.dport;
  if (isIcmp(t.proto)) return t.icmpId;
  return -1;
}

/** A CTA_NAT_* nest as codec.ts writeNat writes it; port -1: none (no CTA_NAT_PROTO). */
function writeNatAt(w: Writer, type: number, buf: Buffer, addr: number, v6: boolean, port: number): void {
  const al = v6 ? 16 : 4;
  const nat = w.start(type);
  w.copyAttr(v6 ? CTA_NAT.V6_MINIP : CTA_NAT.V4_MINIP, buf, addr, al);
  w.copyAttr(v6 ? CTA_NAT.V6_MAXIP : CTA_NAT.V4_MAXIP, buf, addr, al);
  if (port >= 0) {
    const p = w.start(CTA_NAT.PROTO);
    w.be16(CTA_PROTONAT.PORT_MIN, port);
    w.be16(CTA_PROTONAT.PORT_MAX, port);
    w.end(p);
  }
  w.end(nat);
}

const SETTABLE = IPS.SEEN_REPLY | IPS.ASSURED;

function nfgen(w: Writer): void {
  w.nfgen(orig.v6 ? AF_INET6 : AF_INET);
}

function writeCommonAt(w: Writer, defaultTimeout: number, extraStatus: number, minTimeout: number): void {
  w.be32(CTA.STATUS, (E.status & SETTABLE) | extraStatus | IPS.CONFIRMED);
  let timeout = E.timeout;
  // standby(): a copy lives at least minTimeout (table-apply.ts).
  if (timeout >= 0 && timeout < minTimeout) timeout = minTimeout;
  w.be32(CTA.TIMEOUT, Math.max(1, timeout < 0 ? defaultTimeout : timeout));
  if (E.mark >= 0) w.be32(CTA.MARK, E.mark);
  if (E.zone > 0) w.be16(CTA.ZONE, E.zone);
  if (E.tcp && orig.proto === IPPROTO.TCP) {
    const flags = (f: number) => (f < 0 ? 0 : f) & ~IP_CT_TCP_FLAG.MAXACK_SET & 0xff;
    const pi = w.start(CTA.PROTOINFO);
    const t = w.start(CTA_PROTOINFO_TCP);
    w.u8(TCPA.STATE, E.tcpState);
    if (E.wsO >= 0) w.u8(TCPA.WSCALE_ORIGINAL, E.wsO);
    if (E.wsR >= 0) w.u8(TCPA.WSCALE_REPLY, E.wsR);
    w.pair(TCPA.FLAGS_ORIGINAL, flags(E.flO), 0xff);
    w.pair(TCPA.FLAGS_REPLY, flags(E.flR), 0xff);
    w.end(t);
    w.end(pi);
  }
}

/**
 * The body of an IPCTNL_MSG_CT_NEW creating the wire entry at buf[o], as codec.ts writeCreate writes it
 * for the decoded entry with its timeout raised to at least `minTimeout` (table-apply.ts standby()).
 */
export function writeCreateAt(w: Writer, buf: Buffer, o: number, minTimeout = 0, defaultTimeout = 120): void {
  readEntryAt(buf, o);
  nfgen(w);
  writeOwnTuple(w, CTA.TUPLE_ORIG, orig);
  const al = orig.v6 ? 16 : 4;
  const icmp = isIcmp(orig.proto);
  // natOf(): the tuples are the truth, the status bits say the same when present.
  let natSrc: boolean, natDst: boolean;
  const replyDstIsOrigSrc = sameAddr(buf, reply.dst, buf, orig.src, al);
  const replySrcIsOrigDst = sameAddr(buf, reply.src, buf, orig.dst, al);
  if (icmp) {
    natSrc = (E.status & IPS.SRC_NAT) !== 0 || !replyDstIsOrigSrc || reply.icmpId !== orig.icmpId;
    natDst = (E.status & IPS.DST_NAT) !== 0 || !replySrcIsOrigDst;
  } else {
    natSrc = (E.status & IPS.SRC_NAT) !== 0 || !replyDstIsOrigSrc || natPort(reply, 'dst') !== natPort(orig, 'src');
    natDst = (E.status & IPS.DST_NAT) !== 0 || !replySrcIsOrigDst || natPort(reply, 'src') !== natPort(orig, 'dst');
  }
  if (natSrc || natDst) {
    // unNatedReply(): the reply as it was before NAT (addresses and ports of the original tuple).
    let src = reply.src, dst = reply.dst, sport = reply.sport, dport = reply.dport, icmpId = reply.icmpId;
    if (natSrc) {
      dst = orig.src;
      if (isIcmp(reply.proto)) icmpId = orig.icmpId;
      else if (hasPorts(reply.proto)) dport = orig.sport;
    }
    if (natDst) {
      src = orig.dst;
      if (hasPorts(reply.proto)) sport = orig.dport;
    }
    writeTupleAt(w, CTA.TUPLE_REPLY, reply, src, dst, sport, dport, icmpId);
  } else {
    writeOwnTuple(w, CTA.TUPLE_REPLY, reply);
  }
  if (natDst) {
    const port = icmp ? -1 : natPort(reply, 'src');
    writeNatAt(w, CTA.NAT_DST, buf, reply.src, orig.v6, port);
  }
  if (natSrc) writeNatAt(w, CTA.NAT_SRC, buf, reply.dst, orig.v6, natPort(reply, icmp ? 'src' : 'dst'));
  writeCommonAt(w, defaultTimeout, 0, minTimeout);
}

/** The body of an IPCTNL_MSG_CT_NEW updating the entry in place, as writeUpdate with keepStatus 0. */
export function writeUpdateAt(w: Writer, buf: Buffer, o: number, minTimeout = 0, defaultTimeout = 120): void {
  readEntryAt(buf, o);
  nfgen(w);
  writeOwnTuple(w, CTA.TUPLE_ORIG, orig);
  writeCommonAt(w, defaultTimeout, 0, minTimeout);
}

/** The body naming the entry by its original tuple (delete), as writeLookup. */
export function writeLookupAt(w: Writer, buf: Buffer, o: number): void {
  readEntryAt(buf, o);
  nfgen(w);
  writeOwnTuple(w, CTA.TUPLE_ORIG, orig);
  if (E.zone > 0) w.be16(CTA.ZONE, E.zone);
}
