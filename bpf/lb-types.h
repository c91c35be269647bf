/* lb-types.h: structs and constants of the load balancer program shared with user space (TS mirrors in
 * daemon/bpf/lb-structs.ts). Addresses and ports are in network byte order, as in the packet. */
#ifndef TETHER_LB_TYPES_H
#define TETHER_LB_TYPES_H

/* VIP slots (one per VIP of the node's LB pods) and the Maglev table size; the table map holds
 * LB_MAX_VIPS_DEFAULT * size entries unless user space sizes it before loading. */
#define LB_MAX_VIPS_DEFAULT 16
#define LB_MAGLEV_DEFAULT 65537

/* lb_service.flags */
#define LB_F_PER_FLOW 0x1 /* the mapping key is the 5-tuple; default: the client address */
/* New picks are recorded in this node's map but not reported (tetherd records on change: a flow needs a
 * store record only when a new Maglev table would move it). A pick the full map cannot hold is still
 * reported. Releases before this flag never set it, and ignore it. */
#define LB_F_QUIET 0x2

/* lb_target.state: both keep their existing mappings; only active ones are in the Maglev table. */
#define LB_TARGET_ACTIVE 1
#define LB_TARGET_TERMINATING 2

/* lb_frag_key / lb_frag: a fragmented datagram's later fragments carry no ports; its first fragment's
 * decision is kept under the datagram's identity (RFC 791: source, destination, protocol, ID). */
struct lb_frag_key {
	__be32 saddr;
	__be32 daddr;
	__be16 id;
	__u8 proto;
	__u8 pad;
};

struct lb_frag {
	__be32 target;
	__u32 hash; /* the first fragment's outer source port hash: every fragment takes one path */
};

/* lb_event.kind */
#define LB_EV_NEW 1 /* a mapping was chosen by Maglev on this LB pod */

/* Settings, key 0. */
struct lb_config {
	__be32 saddr;       /* outer source: this node's address (registered, so targets accept it) */
	__be16 dport;       /* FoU UDP port at the targets */
	__u16 pad;
	__u32 maglev_size;  /* entries per VIP slot in lb_maglev (a prime) */
	__u32 seed;         /* flow-hash seed, identical on every node */
};

/* One service port of a VIP. */
struct lb_service_key {
	__be32 vip;
	__be16 port;
	__u8 proto;
	__u8 pad;
};

struct lb_service {
	__u32 slot;  /* the VIP's slot: Maglev table row and counters index */
	__u32 flags; /* LB_F_* */
};

/* A client's mapping. Client affinity: vport, cport and proto are 0, so every port of the VIP goes to
 * the same target for that client. Per flow: the full tuple. */
struct lb_map_key {
	__be32 vip;
	__be32 client;
	__be16 vport;
	__be16 cport;
	__u8 proto;
	__u8 pad[3];
};

struct lb_mapping {
	__be32 target;
	__u32 pad;
	__u64 last_ns; /* bpf_ktime_get_ns of the last packet (refreshed at most every LB_TOUCH_NS) */
};

/* A target of a VIP. */
struct lb_target_key {
	__be32 vip;
	__be32 target;
};

/* Reported on the ring buffer for every mapping this node chose. */
struct lb_event {
	struct lb_map_key key;
	__be32 target;
	__u32 kind;
};
/* A ring buffer carries no BTF of its records, so the mirror test cannot see this one: pin its size here. */
_Static_assert(sizeof(struct lb_event) == 24, "lb_event must match daemon/bpf/lb-structs.ts");

/* ---- IPv6 VIPs ----------------------------------------------------------------------------------------
 * An IPv6 VIP's targets are IPv6 endpoints, reached by FoU in outer IPv6 (fou.h fou6_encap6). Its structs
 * and maps are apart from the IPv4 ones, whose pinned layouts a release before IPv6 VIPs keeps; a VIP's
 * slot (Maglev row index and lb_stats index) is per VIP whatever its family. */

/* Settings for IPv6 VIPs, key 0; the port, Maglev size and seed are lb_config's. */
struct lb_config6 {
	struct in6_addr saddr; /* outer source: this node's IPv6 address (registered, so targets accept it) */
};

struct lb_service_key6 {
	struct in6_addr vip;
	__be16 port;
	__u8 proto;
	__u8 pad;
};

/* As lb_map_key: client affinity leaves vport, cport and proto 0. */
struct lb_map_key6 {
	struct in6_addr vip;
	struct in6_addr client;
	__be16 vport;
	__be16 cport;
	__u8 proto;
	__u8 pad[3];
};

struct lb_mapping6 {
	struct in6_addr target;
	__u64 last_ns;
};

struct lb_target_key6 {
	struct in6_addr vip;
	struct in6_addr target;
};

/* An IPv6 datagram's identity (RFC 8200 4.5: source, destination, Fragment header identification). */
struct lb_frag_key6 {
	struct in6_addr saddr;
	struct in6_addr daddr;
	__be32 id;
};

struct lb_frag6 {
	struct in6_addr target;
	__u32 hash;
	__u32 pad;
};

/* Reported on lb_events6 for every IPv6 mapping this node chose (lb_events keeps its 24-byte records). */
struct lb_event6 {
	struct lb_map_key6 key;
	struct in6_addr target;
	__u32 kind;
	__u32 pad;
};
_Static_assert(sizeof(struct lb_event6) == 64, "lb_event6 must match daemon/bpf/lb-structs.ts");

/* Per-CPU counters per VIP slot. Must match daemon/bpf/lb-structs.ts LbStats. */
struct lb_stats {
	__u64 packets;          /* forwarded to a target */
	__u64 bytes;            /* inner bytes forwarded */
	__u64 misses;           /* no valid mapping: picked from the Maglev table */
	__u64 icmp_forwarded;   /* ICMP errors sent to the target holding the flow */
	__u64 drop_no_target;   /* the VIP has no active target */
	__u64 drop_no_port;     /* addressed to the VIP on a port it does not serve */
	__u64 drop_icmp_no_flow;/* ICMP error about a flow no target holds here */
	__u64 drop_fragment;    /* a later fragment whose first fragment was not seen (no ports to look up) */
	__u64 drop_error;       /* failed encapsulation or redirect */
	__u64 report_lost;      /* new mapping not reported: ring buffer full */
	/* Appended fields (the map-layout converter of lb_stats keeps the prefix of older pins). */
	__u64 drop_bad_header;  /* IPv4 header checksum wrong, or its lengths inconsistent */
	__u64 drop_ip_options;  /* IPv4 options: not forwarded (ports at a variable offset; no client needs them) */
	__u64 fragments;        /* later fragments forwarded to their first fragment's target */
	__u64 too_big;          /* over the path MTU once encapsulated: ICMP frag-needed sent to the client */
	__u64 mapping_full;     /* mapping table full: forwarded by the Maglev pick, not recorded on this node */
	__u64 drop_no_route;    /* node datapath: no route (or neighbour) towards the target */
};

/* Per-CPU node counters, key 0: what no VIP slot's counters can hold. Must match daemon/bpf/lb-structs.ts
 * LbNodeStats. A map of its own, so the pinned lb_stats keeps its layout. */
struct lb_node_stats {
	__u64 not_for_host; /* VIP frames not addressed to this host (a bridge's flood, a promiscuous uplink): not balanced */
};

#endif
