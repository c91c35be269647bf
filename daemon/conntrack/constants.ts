// ctnetlink numbers from the kernel uapi headers (linux/netfilter/nfnetlink.h, nfnetlink_conntrack.h,
// nf_conntrack_tcp.h). Only what Tether speaks; names keep the kernel's spelling minus the prefix.

export const NETLINK_NETFILTER = 12;
export const NFNL_SUBSYS_CTNETLINK = 1;
export const NFNETLINK_V0 = 0;
/** struct nfgenmsg { u8 family; u8 version; be16 res_id } precedes the attributes of every message. */
export const NFGENMSG_LEN = 4;

export const IPCTNL_MSG = { CT_NEW: 0, CT_GET: 1, CT_DELETE: 2 } as const;

/** nlmsg_type of a ctnetlink message: subsystem in the high byte. */
export function ctMsgType(msg: number): number {
  return (NFNL_SUBSYS_CTNETLINK << 8) | msg;
}

export function ctMsgName(type: number): string {
  for (const [k, v] of Object.entries(IPCTNL_MSG)) if (v === (type & 0xff)) return `IPCTNL_MSG_${k}`;
  return `IPCTNL_MSG_${type & 0xff}`;
}

// Multicast groups (bit n-1 of the bind() group mask, or NETLINK_ADD_MEMBERSHIP n).
export const NFNLGRP = { CONNTRACK_NEW: 1, CONNTRACK_UPDATE: 2, CONNTRACK_DESTROY: 3 } as const;

export const CTA = {
  TUPLE_ORIG: 1, TUPLE_REPLY: 2, STATUS: 3, PROTOINFO: 4, HELP: 5, NAT_SRC: 6, TIMEOUT: 7, MARK: 8,
  COUNTERS_ORIG: 9, COUNTERS_REPLY: 10, USE: 11, ID: 12, NAT_DST: 13, TUPLE_MASTER: 14, ZONE: 18,
  MARK_MASK: 21,
} as const;
export const CTA_TUPLE = { IP: 1, PROTO: 2, ZONE: 3 } as const;
export const CTA_IP = { V4_SRC: 1, V4_DST: 2, V6_SRC: 3, V6_DST: 4 } as const;
export const CTA_PROTO = {
  NUM: 1, SRC_PORT: 2, DST_PORT: 3, ICMP_ID: 4, ICMP_TYPE: 5, ICMP_CODE: 6, ICMPV6_ID: 7, ICMPV6_TYPE: 8,
  ICMPV6_CODE: 9,
} as const;
export const CTA_PROTOINFO_TCP = 1;
export const CTA_PROTOINFO_TCP_ATTR = { STATE: 1, WSCALE_ORIGINAL: 2, WSCALE_REPLY: 3, FLAGS_ORIGINAL: 4, FLAGS_REPLY: 5 } as const;
export const CTA_NAT = { V4_MINIP: 1, V4_MAXIP: 2, PROTO: 3, V6_MINIP: 4, V6_MAXIP: 5 } as const;
export const CTA_PROTONAT = { PORT_MIN: 1, PORT_MAX: 2 } as const;

/** IP_CT_TCP_FLAG_* (struct nf_ct_tcp_flags.flags). */
export const IP_CT_TCP_FLAG = {
  WINDOW_SCALE: 0x01, SACK_PERM: 0x02, CLOSE_INIT: 0x04, BE_LIBERAL: 0x08, DATA_UNACKNOWLEDGED: 0x10,
  MAXACK_SET: 0x20, EXP_CHALLENGE_ACK: 0x40, SIMULTANEOUS_OPEN: 0x80,
} as const;

export const TCP_CONNTRACK = {
  NONE: 0, SYN_SENT: 1, SYN_RECV: 2, ESTABLISHED: 3, FIN_WAIT: 4, CLOSE_WAIT: 5, LAST_ACK: 6, TIME_WAIT: 7,
  CLOSE: 8, SYN_SENT2: 9,
} as const;

export const IPPROTO = { ICMP: 1, TCP: 6, UDP: 17, ICMPV6: 58, SCTP: 132, UDPLITE: 136, DCCP: 33 } as const;
