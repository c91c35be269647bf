/* egress-types.h: structs and constants of egress steering shared with user space (TS mirrors in
 * daemon/bpf/egress-structs.ts). */
#ifndef TETHER_EGRESS_TYPES_H
#define TETHER_EGRESS_TYPES_H

/* Floating addresses (gateway slots) one Egress spreads its flows over. */
#ifndef EGRESS_MAX_SLOTS
#define EGRESS_MAX_SLOTS 8
#endif
/* Egresses one client pod can belong to; the first whose destinations steer a packet wins. */
#ifndef EGRESS_MAX_PER_CLIENT
#define EGRESS_MAX_PER_CLIENT 4
#endif

/* Egress id 0 is not an Egress: its destinations (BYPASS only) apply to every client, which is where
 * the cluster's pod and service ranges go. */
#define EGRESS_ID_GLOBAL 0

/* egress_dest.action */
#define EGRESS_ACT_STEER 1
#define EGRESS_ACT_BYPASS 2

/* Addresses and ports are in network byte order, as they sit in the packet; ids and counts in host order. */

/* LPM key of egress_dest. The egress id comes first so one trie holds every Egress's prefixes (two Egresses
 * with different clients may both steer 0.0.0.0/0); prefixlen is 32 (the id, always fully matched, so its
 * byte order does not matter) + the CIDR's length. Must match daemon/bpf/egress-structs.ts. */
struct egress_dest_key {
	__u32 prefixlen;
	__u32 egress_id;
	__be32 daddr;
};

/* What one destination prefix means for one Egress. Must match daemon/bpf/egress-structs.ts. */
struct egress_dest {
	__u8 action; /* EGRESS_ACT_* */
	__u8 pad[3];
};

/* The Egresses a client pod (by source IPv4) belongs to, in priority order. Must match
 * daemon/bpf/egress-structs.ts. */
struct egress_client {
	__u32 count;                       /* used entries of ids */
	__u32 ids[EGRESS_MAX_PER_CLIENT];  /* egress ids, never 0 */
};

/* egress_slot.tier: a new flow takes a slot of the lowest tier present (0 before 1); EXCLUDED slots take
 * no new flow (requireZone: out-of-zone addresses). The controller of each node computes the tiers from
 * the Egress's zone policy and the node's own zone and node name. */
#define EGRESS_TIER_PREFERRED 0
#define EGRESS_TIER_FALLBACK 1
#define EGRESS_TIER_EXCLUDED 255

/* One floating address of an Egress and the gateway pod that currently owns it. Must match
 * daemon/bpf/egress-structs.ts. */
struct egress_slot {
	__be32 gateway;  /* gateway pod IPv4: outer destination of the FoU packet */
	__be32 floating; /* the floating IPv4 the gateway SNATs to: what a flow is pinned to */
	__u64 epoch;     /* ownership epoch the controller wrote this slot with (diagnostics, fencing) */
	__u32 zone;      /* zone id of the gateway's node, 0 = unknown (diagnostics; the tier carries the policy) */
	__u32 tier;      /* EGRESS_TIER_* for new flows from this node */
};

/* A flow of a client pod, for pinning: the 5-tuple (ports 0 for protocols without them, and for non-first
 * fragments) and the Egress. Must match daemon/bpf/egress-structs.ts. */
struct egress_flow_key {
	__be32 saddr;
	__be32 daddr;
	__be16 sport;
	__be16 dport;
	__u8 proto;
	__u8 pad[3];
	__u32 egress_id;
};

/* Where a flow is pinned: its floating address (the owner may change; the address does not). Must match
 * daemon/bpf/egress-structs.ts. */
struct egress_flow {
	__be32 floating;
	__u32 pad;
};

/* Per-CPU counters of one floating address on this node. Must match daemon/bpf/egress-structs.ts. */
struct egress_addr_stats {
	__u64 flows;   /* flows pinned to it here */
	__u64 packets; /* packets steered to it */
	__u64 bytes;   /* inner bytes of those */
};

/* The gateways of one Egress, replaced as a whole on every ownership change. Must match
 * daemon/bpf/egress-structs.ts. */
struct egress_gateways {
	__u32 count; /* used slots; 0 = no owner right now (takeover in progress): packets pass untouched */
	__u32 flags; /* reserved, 0 */
	struct egress_slot slots[EGRESS_MAX_SLOTS];
};

/* Node-wide settings, key 0. Must match daemon/bpf/egress-structs.ts. */
struct egress_config {
	__be32 saddr; /* outer source: an address of this node */
	__be16 dport; /* outer UDP destination port (the gateways' FoU port) */
	__u16 flags;  /* reserved, 0 */
};

/* Per-CPU counters of the steering program. Must match daemon/bpf/egress-structs.ts. */
struct egress_stats {
	__u64 steered;       /* packets encapsulated to a gateway */
	__u64 steered_bytes; /* inner bytes of those */
	__u64 bypassed;      /* client packets to a BYPASS prefix, to no destination of its Egresses, or (IPv6) to
			      * a link-local or multicast address */
	__u64 not_client;    /* IP packets from a source not in egress_clients(6) */
	__u64 no_gateway;    /* steerable packets of an Egress with no gateway slot (dropped) */
	__u64 errors;        /* unconfigured node settings, bad slot counts, failed helper calls, IPv6 packets
			      * too short for their header (dropped) */
	__u64 pinned;        /* new flows pinned to an address */
	__u64 repinned;      /* pinned flows whose address was removed, pinned again elsewhere */
	__u64 excluded;      /* packets dropped: every slot of the Egress is excluded for this node (requireZone) */
};

/* IPv6 inner packets. Over an IPv4 underlay (outer IPv4 + UDP, FOU_OVERHEAD bytes) a gateway is an IPv4
 * address (gateways without IPv4: egress_slot66 below); what is IPv6 is the client, the destination and the floating address. These
 * structs sit in maps of their own beside the IPv4 ones, whose layouts (and the program of the release
 * before, which ignores IPv6) stay as they were. Each mirrors its IPv4 counterpart field by field. */

/* LPM key of egress_dest6: prefixlen is 32 (the egress id) + the CIDR's length. Must match
 * daemon/bpf/egress-structs.ts. */
struct egress_dest6_key {
	__u32 prefixlen;
	__u32 egress_id;
	struct in6_addr daddr;
};

/* One IPv6 floating address of an Egress and the gateway pod (by its IPv4: the outer destination) that
 * owns it now. pad keeps epoch 8-byte aligned without a hole the compiler would choose. Must match
 * daemon/bpf/egress-structs.ts. */
struct egress_slot6 {
	__be32 gateway;
	__u32 pad;
	struct in6_addr floating;
	__u64 epoch;
	__u32 zone;
	__u32 tier;
};

/* The IPv6 gateways of one Egress, replaced as a whole like egress_gateways. Must match
 * daemon/bpf/egress-structs.ts. */
struct egress_gateways6 {
	__u32 count;
	__u32 flags;
	struct egress_slot6 slots[EGRESS_MAX_SLOTS];
};

/* An IPv6 flow for pinning: ports for TCP and UDP, 0 for anything else, including packets whose next
 * header is an extension header (a fragment header among them), which are not parsed. Must match
 * daemon/bpf/egress-structs.ts. */
struct egress_flow6_key {
	struct in6_addr saddr;
	struct in6_addr daddr;
	__be16 sport;
	__be16 dport;
	__u8 proto; /* the IPv6 next header */
	__u8 pad[3];
	__u32 egress_id;
};

/* Where an IPv6 flow is pinned. Must match daemon/bpf/egress-structs.ts. */
struct egress_flow6 {
	struct in6_addr floating;
};

/* Gateways without IPv4. A gateway pod with no IPv4 address (IPv6-only pods), or one that the node underlay
 * reaches only in IPv6, is reached with outer IPv6 + UDP (FOU6_OVERHEAD bytes) from this node's IPv6
 * address. egress_slot6 has 4 bytes for the gateway and an older release pins it, so these slots sit in a
 * map of their own (egress_gateways66: inner IPv6, outer either family); the controller writes an Egress
 * there only while one of its IPv6 slots has an IPv6 gateway, and the program asks it first. */

/* Node settings for outer IPv6, key 0 (egress_cfg keeps its pinned IPv4 layout). Must match
 * daemon/bpf/egress-structs.ts. */
struct egress_config6 {
	struct in6_addr saddr; /* outer IPv6 source: an address of this node; :: = no outer IPv6 (dropped, counted as errors) */
	__be16 dport;          /* outer UDP destination port (the gateways' FoU port) */
	__u16 flags;           /* reserved, 0 */
};

/* An IPv6 slot whose gateway may be IPv6: an IPv4-mapped gateway (::ffff:a.b.c.d) is reached in outer IPv4
 * as egress_slot6's is; any other in outer IPv6, the floating address's low 16 bits in the outer flow label
 * (IPv6 has no IP ID). Must match daemon/bpf/egress-structs.ts. */
struct egress_slot66 {
	struct in6_addr gateway;
	struct in6_addr floating;
	__u64 epoch;
	__u32 zone;
	__u32 tier;
};

/* The gateways of one Egress in egress_gateways66, replaced as a whole like egress_gateways6. Must match
 * daemon/bpf/egress-structs.ts. */
struct egress_gateways66 {
	__u32 count;
	__u32 flags; /* reserved, 0 */
	struct egress_slot66 slots[EGRESS_MAX_SLOTS];
};

#endif
