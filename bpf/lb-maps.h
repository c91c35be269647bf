/* lb-maps.h: maps of the load balancer programs (lb.bpf.c), pinned per node and shared by both attach points. */
#ifndef TETHER_LB_MAPS_H
#define TETHER_LB_MAPS_H

#include "lb-types.h"
#include "fou.h"

#ifndef LB_MAX_SERVICES
#define LB_MAX_SERVICES 1024
#endif
#ifndef LB_MAX_MAPPINGS
#define LB_MAX_MAPPINGS 262144
#endif
#ifndef LB_MAX_FRAGS
#define LB_MAX_FRAGS 8192
#endif
#ifndef LB_MAX_TARGETS
#define LB_MAX_TARGETS 16384
#endif

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct lb_config);
} lb_cfg SEC(".maps");

/* (VIP, port, protocol) -> slot and flags. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, LB_MAX_SERVICES);
	__type(key, struct lb_service_key);
	__type(value, struct lb_service);
} lb_services SEC(".maps");

/* Client -> target. A plain hash, not an LRU: a flood of new flows must not evict the mapping of a live
 * connection (after a scale-out its Maglev pick may name another target). When it is full, new flows are
 * forwarded by their Maglev pick unrecorded here (counted: mapping_full); tetherd expires idle mappings,
 * sooner while the table is nearly full (daemon/lb/mapping-sync.ts). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, LB_MAX_MAPPINGS);
	__type(key, struct lb_map_key);
	__type(value, struct lb_mapping);
} lb_mappings SEC(".maps");

/* (VIP, target) -> LB_TARGET_*: a mapping to a target not listed here is void (the target was removed). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, LB_MAX_TARGETS);
	__type(key, struct lb_target_key);
	__type(value, __u32);
} lb_targets SEC(".maps");

/* Maglev lookup tables, one row of lb_config.maglev_size entries per VIP slot: target address, 0 = none. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, LB_MAX_VIPS_DEFAULT * LB_MAGLEV_DEFAULT);
	__type(key, __u32);
	__type(value, __be32);
} lb_maglev SEC(".maps");

/* Datagram identity -> where its first fragment went. LRU: entries are never deleted (fragments come in
 * any order and may repeat); an old one is simply evicted. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, LB_MAX_FRAGS);
	__type(key, struct lb_frag_key);
	__type(value, struct lb_frag);
} lb_frags SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 20);
} lb_events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, LB_MAX_VIPS_DEFAULT);
	__type(key, __u32);
	__type(value, struct lb_stats);
} lb_stats SEC(".maps");

/* ---- IPv6 VIPs: maps of their own beside the IPv4 ones (whose pinned layouts stay as they were). Counters
 * are lb_stats', by the VIP's slot. */

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct lb_config6);
} lb_cfg6 SEC(".maps");

/* (IPv6 VIP, port, protocol) -> slot and flags; port 0 / protocol 0 is the VIP's own entry. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, LB_MAX_SERVICES);
	__type(key, struct lb_service_key6);
	__type(value, struct lb_service);
} lb_services6 SEC(".maps");

/* IPv6 client -> target: a plain hash for the reason lb_mappings is one. Not preallocated: a node with no
 * IPv6 VIP pays nothing for it (entries are allocated as flows arrive). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, LB_MAX_MAPPINGS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct lb_map_key6);
	__type(value, struct lb_mapping6);
} lb_mappings6 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, LB_MAX_TARGETS);
	__type(key, struct lb_target_key6);
	__type(value, __u32);
} lb_targets6 SEC(".maps");

/* Maglev rows of IPv6 VIPs, indexed as lb_maglev (slot * maglev_size + i): target address, :: = none. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, LB_MAX_VIPS_DEFAULT * LB_MAGLEV_DEFAULT);
	__type(key, __u32);
	__type(value, struct in6_addr);
} lb_maglev6 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, LB_MAX_FRAGS);
	__type(key, struct lb_frag_key6);
	__type(value, struct lb_frag6);
} lb_frags6 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 20);
} lb_events6 SEC(".maps");

/* ICMPv6 Packet Too Big as sent on the wire (RFC 4443 3.2). */
struct lb_icmp6_too_big {
	__u8 type;
	__u8 code;
	__sum16 csum;
	__be32 mtu;
};

/* A Packet Too Big built for a client: new IPv6 header, ICMPv6 header, the quote of the client's packet. */
struct lb_too_big_reply6 {
	struct ipv6hdr ip;
	struct lb_icmp6_too_big icmp;
	struct ipv6hdr quoted;
	__u8 l4[20];
};

/* The upper-layer pseudo-header of the ICMPv6 checksum (RFC 8200 8.1). */
struct lb_pseudo6 {
	struct in6_addr saddr;
	struct in6_addr daddr;
	__be32 len;
	__u8 zero[3];
	__u8 nexthdr;
};

/* Working memory of the IPv6 path: its headers, keys and 16-byte addresses would take the program past the
 * verifier's 512-byte stack (the IPv4 path's frame is below it on the call chain). Per CPU, and a tc program
 * runs to completion on its CPU before the next packet there, so one entry per CPU is never shared. */
struct lb_scratch6 {
	struct ipv6hdr ip6;          /* the packet's IPv6 header */
	struct ipv6hdr inner;        /* an ICMPv6 error's quoted header */
	struct lb_map_key6 k;
	struct lb_service_key6 sk;
	struct lb_frag_key6 fk;
	struct lb_frag6 frag;
	struct lb_target_key6 tk;
	struct lb_mapping6 m;
	struct in6_addr target;
	struct fou6_hdr h;
	struct bpf_fib_lookup fib;
	struct bpf_redir_neigh nh;
	struct lb_too_big_reply6 reply;
	struct lb_pseudo6 pseudo;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct lb_scratch6);
} lb_scratch6 SEC(".maps");

/* Node counters, key 0 (struct lb_node_stats): apart from lb_stats, whose pinned layout stays as it was. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct lb_node_stats);
} lb_node_stats SEC(".maps");

/* ---- The node program's next-hop cache (lb-nexthop.h): the FIB's answer towards a target, reused for
 * LB_NH_TTL_NS. Per CPU and set-associative (LB_NH_SETS sets of LB_NH_WAYS entries, by the target's hash):
 * an array entry is found without a hash-map lookup, and its place in memory never moves. Not shared with
 * user space (no TypeScript mirror). */

#ifndef LB_NH_SETS
#define LB_NH_SETS 256
#endif
#define LB_NH_WAYS 2

/* What a FIB lookup of lb_forward_node depends on besides the constant source: the ingress device (policy
 * routing may match it), the target and, in IPv4, the packet's TOS. */
struct lb_nh_key {
	__u32 ifindex;
	__be32 target;
	__u8 tos;
	__u8 pad[3];
};

struct lb_nh_key6 {
	__u32 ifindex;
	struct in6_addr target;
};

struct lb_nexthop {
	__u64 expires_ns;            /* bpf_ktime_get_ns after which the FIB is asked again (0: empty) */
	__u32 ifindex;               /* the egress device */
	__u32 mtu;                   /* the path MTU towards the target (route, PMTU exception or device) */
	__u8 macs[2 * ETH_ALEN];     /* the next hop's MAC, then the egress device's: the new Ethernet header */
	__u32 pad;
};

struct lb_nh_entry {
	struct lb_nh_key key;
	__u32 pad;
	struct lb_nexthop hop;
};

struct lb_nh_entry6 {
	struct lb_nh_key6 key;
	__u32 pad;
	struct lb_nexthop hop;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, LB_NH_SETS * LB_NH_WAYS);
	__type(key, __u32);
	__type(value, struct lb_nh_entry);
} lb_nexthops SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, LB_NH_SETS * LB_NH_WAYS);
	__type(key, __u32);
	__type(value, struct lb_nh_entry6);
} lb_nexthops6 SEC(".maps");

#endif
