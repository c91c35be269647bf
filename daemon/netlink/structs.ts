// Fixed-size family headers that follow nlmsghdr: ifinfomsg, ifaddrmsg, rtmsg, fib_rule_hdr, ndmsg, and
// rtnexthop (inside RTA_MULTIPATH). Layouts must match linux/rtnetlink.h, if_addr.h, fib_rules.h, neighbour.h.

export interface IfInfoMsg { family: number; type: number; index: number; flags: number; change: number }
export const IFINFOMSG_LEN = 16;

export function encodeIfInfoMsg(m: Partial<IfInfoMsg> = {}): Buffer {
  const b = Buffer.alloc(IFINFOMSG_LEN);
  b.writeUInt8(m.family ?? 0, 0);
  b.writeUInt16LE(m.type ?? 0, 2);
  b.writeInt32LE(m.index ?? 0, 4);
  b.writeUInt32LE((m.flags ?? 0) >>> 0, 8);
  b.writeUInt32LE((m.change ?? 0) >>> 0, 12);
  return b;
}

export function decodeIfInfoMsg(b: Buffer): IfInfoMsg {
  return { family: b.readUInt8(0), type: b.readUInt16LE(2), index: b.readInt32LE(4), flags: b.readUInt32LE(8), change: b.readUInt32LE(12) };
}

export interface IfAddrMsg { family: number; prefixLen: number; flags: number; scope: number; index: number }
export const IFADDRMSG_LEN = 8;

export function encodeIfAddrMsg(m: Partial<IfAddrMsg> = {}): Buffer {
  const b = Buffer.alloc(IFADDRMSG_LEN);
  b.writeUInt8(m.family ?? 0, 0);
  b.writeUInt8(m.prefixLen ?? 0, 1);
  b.writeUInt8(m.flags ?? 0, 2);
  b.writeUInt8(m.scope ?? 0, 3);
  b.writeUInt32LE(m.index ?? 0, 4);
  return b;
}

export function decodeIfAddrMsg(b: Buffer): IfAddrMsg {
  return { family: b.readUInt8(0), prefixLen: b.readUInt8(1), flags: b.readUInt8(2), scope: b.readUInt8(3), index: b.readUInt32LE(4) };
}

export interface RtMsg {
  family: number; dstLen: number; srcLen: number; tos: number; table: number; protocol: number; scope: number;
  type: number; flags: number;
}
export const RTMSG_LEN = 12;

export function encodeRtMsg(m: Partial<RtMsg> = {}): Buffer {
  const b = Buffer.alloc(RTMSG_LEN);
  b.writeUInt8(m.family ?? 0, 0);
  b.writeUInt8(m.dstLen ?? 0, 1);
  b.writeUInt8(m.srcLen ?? 0, 2);
  b.writeUInt8(m.tos ?? 0, 3);
  b.writeUInt8(m.table ?? 0, 4);
  b.writeUInt8(m.protocol ?? 0, 5);
  b.writeUInt8(m.scope ?? 0, 6);
  b.writeUInt8(m.type ?? 0, 7);
  b.writeUInt32LE((m.flags ?? 0) >>> 0, 8);
  return b;
}

export function decodeRtMsg(b: Buffer): RtMsg {
  return {
    family: b.readUInt8(0), dstLen: b.readUInt8(1), srcLen: b.readUInt8(2), tos: b.readUInt8(3), table: b.readUInt8(4),
    protocol: b.readUInt8(5), scope: b.readUInt8(6), type: b.readUInt8(7), flags: b.readUInt32LE(8),
  };
}

// fib_rule_hdr has the same size as rtmsg but different meaning for bytes 4..7.
export interface FibRuleHdr {
  family: number; dstLen: number; srcLen: number; tos: number; table: number; action: number; flags: number;
}
export const FIB_RULE_HDR_LEN = 12;

export function encodeFibRuleHdr(m: Partial<FibRuleHdr> = {}): Buffer {
  const b = Buffer.alloc(FIB_RULE_HDR_LEN);
  b.writeUInt8(m.family ?? 0, 0);
  b.writeUInt8(m.dstLen ?? 0, 1);
  b.writeUInt8(m.srcLen ?? 0, 2);
  b.writeUInt8(m.tos ?? 0, 3);
  b.writeUInt8(m.table ?? 0, 4);
  b.writeUInt8(m.action ?? 0, 7);
  b.writeUInt32LE((m.flags ?? 0) >>> 0, 8);
  return b;
}

export function decodeFibRuleHdr(b: Buffer): FibRuleHdr {
  return {
    family: b.readUInt8(0), dstLen: b.readUInt8(1), srcLen: b.readUInt8(2), tos: b.readUInt8(3), table: b.readUInt8(4),
    action: b.readUInt8(7), flags: b.readUInt32LE(8),
  };
}

export interface NdMsg { family: number; index: number; state: number; flags: number; type: number }
export const NDMSG_LEN = 12;

export function encodeNdMsg(m: Partial<NdMsg> = {}): Buffer {
  const b = Buffer.alloc(NDMSG_LEN);
  b.writeUInt8(m.family ?? 0, 0);
  b.writeInt32LE(m.index ?? 0, 4);
  b.writeUInt16LE(m.state ?? 0, 8);
  b.writeUInt8(m.flags ?? 0, 10);
  b.writeUInt8(m.type ?? 0, 11);
  return b;
}

export function decodeNdMsg(b: Buffer): NdMsg {
  return { family: b.readUInt8(0), index: b.readInt32LE(4), state: b.readUInt16LE(8), flags: b.readUInt8(10), type: b.readUInt8(11) };
}

/** rtnexthop: len u16, flags u8, hops u8 (weight - 1), ifindex s32, then attributes (RTA_GATEWAY). */
export const RTNEXTHOP_LEN = 8;

export function encodeRtNexthop(n: { flags?: number; hops?: number; index?: number }, attrs: Buffer[]): Buffer {
  const body = Buffer.concat(attrs);
  const b = Buffer.alloc(RTNEXTHOP_LEN + body.length);
  b.writeUInt16LE(b.length, 0);
  b.writeUInt8(n.flags ?? 0, 2);
  b.writeUInt8(n.hops ?? 0, 3);
  b.writeInt32LE(n.index ?? 0, 4);
  body.copy(b, RTNEXTHOP_LEN);
  return b;
}
