// Conntrack entries as Tether handles them: decoded from ctnetlink, streamed between tetherds by
// conntrack sync, and inserted into a standby gateway's table. Plain JSON so they can travel as-is.

/** One direction of a connection. Addresses are canonical text (v4 dotted, v6 compressed). */
export interface CtTuple {
  family: 4 | 6;
  /** IP protocol number: 6 TCP, 17 UDP, 1 ICMP, 58 ICMPv6. */
  proto: number;
  src: string;
  dst: string;
  /** TCP/UDP ports (host byte order). */
  sport?: number;
  dport?: number;
  /** ICMP echo id/type/code. */
  icmpId?: number;
  icmpType?: number;
  icmpCode?: number;
}

export interface CtTcpInfo {
  /** TCP_CONNTRACK_* state (3 = ESTABLISHED). */
  state: number;
  wscaleOrig?: number;
  wscaleReply?: number;
  flagsOrig?: number;
  flagsReply?: number;
}

export interface ConntrackEntry {
  orig: CtTuple;
  /** The reply tuple: for a source-NATed flow its dst is the NAT address (the floating address). */
  reply: CtTuple;
  /** IPS_* status bits (CONFIRMED, SEEN_REPLY, ASSURED, SRC_NAT, SRC_NAT_DONE, …). */
  status: number;
  /** Seconds until the entry expires. */
  timeout?: number;
  mark?: number;
  zone?: number;
  tcp?: CtTcpInfo;
  /** Kernel id of the entry in the table it came from (not meaningful elsewhere). */
  id?: number;
}

export type ConntrackEventType = 'new' | 'update' | 'destroy';

export interface ConntrackEvent {
  type: ConntrackEventType;
  entry: ConntrackEntry;
}

/** IPS_* bits from nf_conntrack_common.h that Tether reads or sets. */
export const IPS = {
  EXPECTED: 1 << 0,
  SEEN_REPLY: 1 << 1,
  ASSURED: 1 << 2,
  CONFIRMED: 1 << 3,
  SRC_NAT: 1 << 4,
  DST_NAT: 1 << 5,
  SRC_NAT_DONE: 1 << 7,
  DST_NAT_DONE: 1 << 8,
  DYING: 1 << 9,
} as const;

/** A stable key for an entry: its original tuple. */
export function entryKey(e: Pick<ConntrackEntry, 'orig'>): string {
  const t = e.orig;
  return `${t.family}/${t.proto}/${t.src}/${t.sport ?? t.icmpId ?? 0}/${t.dst}/${t.dport ?? t.icmpType ?? 0}`;
}
