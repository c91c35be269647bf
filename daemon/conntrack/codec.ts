// ctnetlink message bodies <-> ConntrackEntry: nfgenmsg, tuples, status, timeout, mark, zone, TCP
// protoinfo and the NAT ranges a create needs. ctnetlink integers are big-endian, unlike rtnetlink's.
import { attr } from '../netlink/codec';
import { AF_INET, AF_INET6 } from '../netlink/constants';
import {
  CTA, CTA_IP, CTA_NAT, CTA_PROTO, CTA_PROTOINFO_TCP, CTA_PROTOINFO_TCP_ATTR as TCPA, CTA_PROTONAT, CTA_TUPLE,
  IP_CT_TCP_FLAG, IPPROTO, NFGENMSG_LEN, NFNETLINK_V0,
} from './constants';
import { IPS, type ConntrackEntry, type CtTcpInfo, type CtTuple } from './types';
import { eachAttr, readIp, Writer } from './wire';

export function be8(type: number, v: number): Buffer {
  return attr(type, Buffer.from([v & 0xff]));
}

export function be16(type: number, v: number): Buffer {
  const b = Buffer.alloc(2);
  b.writeUInt16BE(v & 0xffff);
  return attr(type, b);
}

export function be32(type: number, v: number): Buffer {
  const b = Buffer.alloc(4);
  b.writeUInt32BE(v >>> 0);
  return attr(type, b);
}

function familyByte(family: 0 | 4 | 6): number {
  return family === 4 ? AF_INET : family === 6 ? AF_INET6 : 0;
}

/** struct nfgenmsg; family 0 (AF_UNSPEC) means "all families" in dumps and flushes. */
export function nfgenmsg(family: 0 | 4 | 6 = 0): Buffer {
  const b = Buffer.alloc(NFGENMSG_LEN);
  b.writeUInt8(familyByte(family), 0);
  b.writeUInt8(NFNETLINK_V0, 1);
  return b;
}

/** Protocols whose tuple carries 16-bit ports (the kernel's nf_ct_port_nlattr_to_tuple users). */
function hasPorts(proto: number): boolean {
  return proto === IPPROTO.TCP || proto === IPPROTO.UDP || proto === IPPROTO.UDPLITE || proto === IPPROTO.SCTP || proto === IPPROTO.DCCP;
}

function isIcmp(proto: number): boolean {
  return proto === IPPROTO.ICMP || proto === IPPROTO.ICMPV6;
}

export function writeTuple(w: Writer, type: number, t: CtTuple): void {
  const v6 = t.family === 6;
  const tuple = w.start(type);
  const ip = w.start(CTA_TUPLE.IP);
  w.ip(v6 ? CTA_IP.V6_SRC : CTA_IP.V4_SRC, t.src, t.family);
  w.ip(v6 ? CTA_IP.V6_DST : CTA_IP.V4_DST, t.dst, t.family);
  w.end(ip);
  const l4 = w.start(CTA_TUPLE.PROTO);
  w.u8(CTA_PROTO.NUM, t.proto);
  if (hasPorts(t.proto)) {
    w.be16(CTA_PROTO.SRC_PORT, t.sport ?? 0);
    w.be16(CTA_PROTO.DST_PORT, t.dport ?? 0);
  } else if (isIcmp(t.proto)) {
    // The kernel wants all three ICMP fields in a tuple or refuses it with EINVAL.
    const six = t.proto === IPPROTO.ICMPV6;
    w.be16(six ? CTA_PROTO.ICMPV6_ID : CTA_PROTO.ICMP_ID, t.icmpId ?? 0);
    w.u8(six ? CTA_PROTO.ICMPV6_TYPE : CTA_PROTO.ICMP_TYPE, t.icmpType ?? 0);
    w.u8(six ? CTA_PROTO.ICMPV6_CODE : CTA_PROTO.ICMP_CODE, t.icmpCode ?? 0);
  }
  w.end(l4);
  w.end(tuple);
}

/** Decodes a CTA_TUPLE_* nest found at buf[at, at+len). */
export function readTuple(buf: Buffer, at: number, len: number, family: 4 | 6): CtTuple {
  const t: CtTuple = { family, proto: -1, src: '', dst: '' };
  eachAttr(buf, at, at + len, (type, a, l) => {
    if (type === CTA_TUPLE.IP) {
      eachAttr(buf, a, a + l, (ty, b, bl) => {
        if (ty === CTA_IP.V4_SRC || ty === CTA_IP.V6_SRC) t.src = readIp(buf, b, bl);
        else if (ty === CTA_IP.V4_DST || ty === CTA_IP.V6_DST) t.dst = readIp(buf, b, bl);
        if (bl === 16) t.family = 6; else if (bl === 4) t.family = 4;
      });
    } else if (type === CTA_TUPLE.PROTO) {
      eachAttr(buf, a, a + l, (ty, b, bl) => {
        if (bl < 1) return;
        switch (ty) {
          case CTA_PROTO.NUM: t.proto = buf[b]; break;
          case CTA_PROTO.SRC_PORT: if (bl >= 2) t.sport = buf.readUInt16BE(b); break;
          case CTA_PROTO.DST_PORT: if (bl >= 2) t.dport = buf.readUInt16BE(b); break;
          case CTA_PROTO.ICMP_ID: case CTA_PROTO.ICMPV6_ID: if (bl >= 2) t.icmpId = buf.readUInt16BE(b); break;
          case CTA_PROTO.ICMP_TYPE: case CTA_PROTO.ICMPV6_TYPE: t.icmpType = buf[b]; break;
          case CTA_PROTO.ICMP_CODE: case CTA_PROTO.ICMPV6_CODE: t.icmpCode = buf[b]; break;
        }
      });
    }
  });
  if (!t.src || !t.dst || t.proto < 0) throw new Error('ctnetlink tuple without addresses or protocol');
  return t;
}

function writeTcpInfo(w: Writer, tcp: CtTcpInfo): void {
  // Dumps report flags with mask 0; a create applies only masked bits, so send a full mask.
  // MAXACK_SET is dropped: td_maxack itself is not carried by ctnetlink, and claiming it is valid (as 0)
  // would make the new table judge RSTs against a bogus maximum ack.
  const flags = (f: number | undefined) => (f ?? 0) & ~IP_CT_TCP_FLAG.MAXACK_SET & 0xff;
  const pi = w.start(CTA.PROTOINFO);
  const t = w.start(CTA_PROTOINFO_TCP);
  w.u8(TCPA.STATE, tcp.state);
  if (tcp.wscaleOrig !== undefined) w.u8(TCPA.WSCALE_ORIGINAL, tcp.wscaleOrig);
  if (tcp.wscaleReply !== undefined) w.u8(TCPA.WSCALE_REPLY, tcp.wscaleReply);
  w.pair(TCPA.FLAGS_ORIGINAL, flags(tcp.flagsOrig), 0xff);
  w.pair(TCPA.FLAGS_REPLY, flags(tcp.flagsReply), 0xff);
  w.end(t);
  w.end(pi);
}

function readTcpInfo(buf: Buffer, at: number, len: number): CtTcpInfo | undefined {
  let out: CtTcpInfo | undefined;
  eachAttr(buf, at, at + len, (type, a, l) => {
    if (type !== CTA_PROTOINFO_TCP) return;
    out = { state: 0 };
    const o = out;
    eachAttr(buf, a, a + l, (ty, b, bl) => {
      if (bl < 1) return;
      if (ty === TCPA.STATE) o.state = buf[b];
      else if (ty === TCPA.WSCALE_ORIGINAL) o.wscaleOrig = buf[b];
      else if (ty === TCPA.WSCALE_REPLY) o.wscaleReply = buf[b];
      else if (ty === TCPA.FLAGS_ORIGINAL) o.flagsOrig = buf[b];
      else if (ty === TCPA.FLAGS_REPLY) o.flagsReply = buf[b];
    });
  });
  return out;
}

/** The 16-bit "port" NAT rewrites in a tuple: the port, or the ICMP echo id. */
function natPort(t: CtTuple, side: 'src' | 'dst'): number | undefined {
  if (hasPorts(t.proto)) return side === 'src' ? t.sport : t.dport;
  if (isIcmp(t.proto)) return t.icmpId;
  return undefined;
}

/** One CTA_NAT_SRC/CTA_NAT_DST: the exact address and port the original side was rewritten to. */
function writeNat(w: Writer, type: number, addr: string, family: 4 | 6, port: number | undefined): void {
  const v6 = family === 6;
  const nat = w.start(type);
  w.ip(v6 ? CTA_NAT.V6_MINIP : CTA_NAT.V4_MINIP, addr, family);
  w.ip(v6 ? CTA_NAT.V6_MAXIP : CTA_NAT.V4_MAXIP, addr, family);
  // With a proto range the kernel sets NF_NAT_RANGE_PROTO_SPECIFIED and keeps exactly this port; without
  // it, a remapped source port would be chosen anew and the server would see a different connection.
  if (port !== undefined) {
    const p = w.start(CTA_NAT.PROTO);
    w.be16(CTA_PROTONAT.PORT_MIN, port);
    w.be16(CTA_PROTONAT.PORT_MAX, port);
    w.end(p);
  }
  w.end(nat);
}

/**
 * Which NAT the entry carries. The tuples are the truth: a source-NATed flow's reply goes back to an
 * address/port other than the original source; the status bits say the same when they are present.
 */
export function natOf(e: ConntrackEntry): { src: boolean; dst: boolean } {
  const { orig, reply } = e;
  // ICMP ids sit in the "src" slot of both tuples, so for ICMP only addresses and bits tell the kinds apart.
  if (isIcmp(orig.proto)) {
    return { src: (e.status & IPS.SRC_NAT) !== 0 || reply.dst !== orig.src || reply.icmpId !== orig.icmpId, dst: (e.status & IPS.DST_NAT) !== 0 || reply.src !== orig.dst };
  }
  return {
    src: (e.status & IPS.SRC_NAT) !== 0 || reply.dst !== orig.src || natPort(reply, 'dst') !== natPort(orig, 'src'),
    dst: (e.status & IPS.DST_NAT) !== 0 || reply.src !== orig.dst || natPort(reply, 'src') !== natPort(orig, 'dst'),
  };
}

/**
 * The reply tuple as it was before NAT. A create must carry this one, not the translated reply: the
 * kernel's NAT setup derives the translated reply from CTA_NAT_* itself and sets IPS_SRC_NAT/DST_NAT only
 * when that changes the tuple; without those bits packets are never translated (nf_nat_packet checks them).
 */
export function unNatedReply(e: ConntrackEntry, nat: { src: boolean; dst: boolean }): CtTuple {
  const r: CtTuple = { ...e.reply };
  if (nat.src) {
    r.dst = e.orig.src;
    if (isIcmp(r.proto)) r.icmpId = e.orig.icmpId;
    else if (hasPorts(r.proto)) r.dport = e.orig.sport;
  }
  if (nat.dst) {
    r.src = e.orig.dst;
    if (hasPorts(r.proto)) r.sport = e.orig.dport;
  }
  return r;
}

// Status bits a create may set. CONFIRMED is required (the kernel answers EBUSY otherwise); NAT bits
// are not settable through CTA_STATUS and come from CTA_NAT_*; EXPECTED/DYING would be refused.
const SETTABLE = IPS.SEEN_REPLY | IPS.ASSURED;

const scratch = new Writer(1024);

/** Writes the body of an IPCTNL_MSG_CT_NEW that creates the entry (tuples, NAT, status, timeout, mark, zone, TCP). */
export function writeCreate(w: Writer, e: ConntrackEntry, defaultTimeout = 120): void {
  w.nfgen(familyByte(e.orig.family));
  writeTuple(w, CTA.TUPLE_ORIG, e.orig);
  const nat = natOf(e);
  const icmp = isIcmp(e.orig.proto);
  writeTuple(w, CTA.TUPLE_REPLY, nat.src || nat.dst ? unNatedReply(e, nat) : e.reply);
  if (nat.dst) writeNat(w, CTA.NAT_DST, e.reply.src, e.orig.family, icmp ? undefined : natPort(e.reply, 'src'));
  if (nat.src) writeNat(w, CTA.NAT_SRC, e.reply.dst, e.orig.family, natPort(e.reply, icmp ? 'src' : 'dst'));
  writeCommon(w, e, defaultTimeout, 0);
}

/**
 * Writes the body of an IPCTNL_MSG_CT_NEW that updates an existing entry in place. The kernel refuses
 * NAT changes here (EOPNOTSUPP) and refuses clearing SEEN_REPLY/ASSURED (EBUSY), hence `keepStatus`.
 */
export function writeUpdate(w: Writer, e: ConntrackEntry, keepStatus: number, defaultTimeout = 120): void {
  w.nfgen(familyByte(e.orig.family));
  writeTuple(w, CTA.TUPLE_ORIG, e.orig);
  writeCommon(w, e, defaultTimeout, keepStatus & SETTABLE);
}

/** Writes a body naming one entry by its original tuple (get, delete). */
export function writeLookup(w: Writer, t: CtTuple, zone?: number): void {
  w.nfgen(familyByte(t.family));
  writeTuple(w, CTA.TUPLE_ORIG, t);
  if (zone) w.be16(CTA.ZONE, zone);
}

/** encodeCreate/encodeUpdate/encodeLookup: the same bodies as one Buffer each, for single requests. */
export function encodeCreate(e: ConntrackEntry, defaultTimeout = 120): Buffer[] {
  writeCreate(scratch, e, defaultTimeout);
  return [scratch.take()];
}

export function encodeUpdate(e: ConntrackEntry, keepStatus: number, defaultTimeout = 120): Buffer[] {
  writeUpdate(scratch, e, keepStatus, defaultTimeout);
  return [scratch.take()];
}

function writeCommon(w: Writer, e: ConntrackEntry, defaultTimeout: number, extraStatus: number): void {
  w.be32(CTA.STATUS, (e.status & SETTABLE) | extraStatus | IPS.CONFIRMED);
  // The timeout is mandatory on create; 0 would expire the entry at once.
  w.be32(CTA.TIMEOUT, Math.max(1, e.timeout ?? defaultTimeout));
  if (e.mark !== undefined) w.be32(CTA.MARK, e.mark);
  if (e.zone) w.be16(CTA.ZONE, e.zone);
  if (e.tcp && e.orig.proto === IPPROTO.TCP) writeTcpInfo(w, e.tcp);
}

export function encodeLookup(t: CtTuple, zone?: number): Buffer[] {
  writeLookup(scratch, t, zone);
  return [scratch.take()];
}

/** Decodes the payload (nfgenmsg + attributes) of an IPCTNL_MSG_CT_NEW/DELETE from a dump, get or event. */
export function decodeEntry(payload: Buffer): ConntrackEntry {
  if (payload.length < NFGENMSG_LEN) throw new Error('ctnetlink message shorter than nfgenmsg');
  const family: 4 | 6 = payload[0] === AF_INET6 ? 6 : 4;
  let orig: CtTuple | undefined;
  let reply: CtTuple | undefined;
  let status = 0;
  const rest: Partial<ConntrackEntry> = {};
  eachAttr(payload, NFGENMSG_LEN, payload.length, (type, at, len) => {
    switch (type) {
      case CTA.TUPLE_ORIG: orig = readTuple(payload, at, len, family); break;
      case CTA.TUPLE_REPLY: reply = readTuple(payload, at, len, family); break;
      case CTA.STATUS: if (len >= 4) status = payload.readUInt32BE(at); break;
      case CTA.TIMEOUT: if (len >= 4) rest.timeout = payload.readUInt32BE(at); break;
      case CTA.MARK: if (len >= 4) rest.mark = payload.readUInt32BE(at); break;
      case CTA.ZONE: if (len >= 2) rest.zone = payload.readUInt16BE(at); break;
      case CTA.ID: if (len >= 4) rest.id = payload.readUInt32BE(at); break;
      case CTA.PROTOINFO: { const tcp = readTcpInfo(payload, at, len); if (tcp) rest.tcp = tcp; break; }
    }
  });
  if (!orig || !reply) throw new Error('ctnetlink entry without original and reply tuples');
  return { orig, reply, status, ...rest };
}

const PROTO_NAMES: Record<number, string> = { 1: 'icmp', 6: 'tcp', 17: 'udp', 58: 'icmpv6', 132: 'sctp', 136: 'udplite', 33: 'dccp' };

/** "tcp 10.0.0.2:1234 → 1.1.1.1:80", "udp [fd00::1]:53 → [fd00::2]:53", "icmp 10.0.0.2 → 10.0.0.1 id 7": for errors and logs. */
export function formatTuple(t: CtTuple): string {
  const name = PROTO_NAMES[t.proto] ?? `proto ${t.proto}`;
  const host = (a: string) => (t.family === 6 && hasPorts(t.proto) ? `[${a}]` : a);
  if (hasPorts(t.proto)) return `${name} ${host(t.src)}:${t.sport ?? 0} → ${host(t.dst)}:${t.dport ?? 0}`;
  if (isIcmp(t.proto)) return `${name} ${t.src} → ${t.dst} id ${t.icmpId ?? 0}`;
  return `${name} ${t.src} → ${t.dst}`;
}
