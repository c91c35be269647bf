// rtnetlink numbers from the kernel uapi headers (linux/netlink.h, rtnetlink.h, if_link.h, if_addr.h,
// fib_rules.h, neighbour.h). Only what Tether speaks; names keep the kernel's spelling minus the prefix.

export const NETLINK_ROUTE = 0;

// nlmsghdr types and flags
export const NLMSG_NOOP = 1;
export const NLMSG_ERROR = 2;
export const NLMSG_DONE = 3;
export const NLMSG_OVERRUN = 4;

export const NLM_F_REQUEST = 0x1;
export const NLM_F_MULTI = 0x2;
export const NLM_F_ACK = 0x4;
export const NLM_F_ECHO = 0x8;
export const NLM_F_DUMP_INTR = 0x10;
export const NLM_F_ROOT = 0x100;
export const NLM_F_MATCH = 0x200;
export const NLM_F_DUMP = NLM_F_ROOT | NLM_F_MATCH;
export const NLM_F_REPLACE = 0x100;
export const NLM_F_EXCL = 0x200;
export const NLM_F_CREATE = 0x400;
export const NLM_F_APPEND = 0x800;
// Flags on an NLMSG_ERROR (ack) message.
export const NLM_F_CAPPED = 0x100;
export const NLM_F_ACK_TLVS = 0x200;
export const NLMSGERR_ATTR_MSG = 1;
export const NLMSGERR_ATTR_OFFS = 2;

export const NETLINK_CAP_ACK = 10;

export const RTM = {
  NEWLINK: 16, DELLINK: 17, GETLINK: 18, SETLINK: 19,
  NEWADDR: 20, DELADDR: 21, GETADDR: 22,
  NEWROUTE: 24, DELROUTE: 25, GETROUTE: 26,
  NEWNEIGH: 28, DELNEIGH: 29, GETNEIGH: 30,
  NEWRULE: 32, DELRULE: 33, GETRULE: 34,
} as const;

export function rtmName(type: number): string {
  for (const [k, v] of Object.entries(RTM)) if (v === type) return `RTM_${k}`;
  return `RTM_${type}`;
}

export const AF_UNSPEC = 0;
export const AF_INET = 2;
export const AF_INET6 = 10;

// Links
export const IFLA = {
  ADDRESS: 1, BROADCAST: 2, IFNAME: 3, MTU: 4, LINK: 5, MASTER: 10, TXQLEN: 13, OPERSTATE: 16,
  LINKINFO: 18, NET_NS_PID: 19, NET_NS_FD: 28, EXT_MASK: 29, LINK_NETNSID: 37,
} as const;
export const IFLA_INFO_KIND = 1;
export const IFLA_INFO_DATA = 2;
export const VETH_INFO_PEER = 1;
export const IFF_UP = 0x1;
export const IFF_LOOPBACK = 0x8;
export const IFF_RUNNING = 0x40;
export const IFF_LOWER_UP = 0x10000;

// Addresses
export const IFA = { ADDRESS: 1, LOCAL: 2, LABEL: 3, BROADCAST: 4, CACHEINFO: 6, FLAGS: 8 } as const;
export const IFA_F_NODAD = 0x02;
export const IFA_F_PERMANENT = 0x80;

// Routes
export const RTA = {
  DST: 1, SRC: 2, IIF: 3, OIF: 4, GATEWAY: 5, PRIORITY: 6, PREFSRC: 7, METRICS: 8, MULTIPATH: 9,
  TABLE: 15, MARK: 16, PREF: 20,
} as const;
export const RTAX_MTU = 2;
export const RT_TABLE_UNSPEC = 0;
export const RT_TABLE_COMPAT = 252;
export const RT_TABLE_MAIN = 254;
export const RT_TABLE_LOCAL = 255;
export const RTPROT_KERNEL = 2;
export const RTPROT_BOOT = 3;
export const RTPROT_STATIC = 4;
export const RT_SCOPE = { UNIVERSE: 0, SITE: 200, LINK: 253, HOST: 254, NOWHERE: 255 } as const;
export const RTN = {
  UNSPEC: 0, UNICAST: 1, LOCAL: 2, BROADCAST: 3, ANYCAST: 4, MULTICAST: 5, BLACKHOLE: 6, UNREACHABLE: 7,
  PROHIBIT: 8,
} as const;

// Rules
export const FRA = {
  DST: 1, SRC: 2, IIFNAME: 3, GOTO: 4, PRIORITY: 6, FWMARK: 10, TABLE: 15, FWMASK: 16, OIFNAME: 17,
  PROTOCOL: 21,
} as const;
export const FR_ACT_TO_TBL = 1;

// Neighbours
export const NDA = { DST: 1, LLADDR: 2 } as const;
export const NUD = {
  INCOMPLETE: 0x01, REACHABLE: 0x02, STALE: 0x04, DELAY: 0x08, PROBE: 0x10, FAILED: 0x20, NOARP: 0x40,
  PERMANENT: 0x80,
} as const;
