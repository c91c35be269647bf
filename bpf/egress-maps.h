/* egress-maps.h: maps of the egress steering program, pinned once per node and shared by every client
 * veth's attachment (user space pins them under <pinDir>/egress/). */
#ifndef TETHER_EGRESS_MAPS_H
#define TETHER_EGRESS_MAPS_H

#include "egress-types.h"

#ifndef EGRESS_MAX_DESTS
#define EGRESS_MAX_DESTS 16384
#endif
#ifndef EGRESS_MAX_CLIENTS
#define EGRESS_MAX_CLIENTS 16384
#endif
#ifndef EGRESS_MAX_EGRESSES
#define EGRESS_MAX_EGRESSES 1024
#endif
/* Default size of the flow pin map; tetherd sets its own (--egress-flows) before loading. */
#ifndef EGRESS_MAX_FLOWS
#define EGRESS_MAX_FLOWS 65536
#endif
#ifndef EGRESS_MAX_ADDRESSES
#define EGRESS_MAX_ADDRESSES 8192
#endif

/* Node settings (outer source, FoU port); key 0. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct egress_config);
} egress_cfg SEC(".maps");

/* (egress id, destination prefix) -> STEER or BYPASS; longest prefix wins within one Egress. LPM tries
 * must be created without preallocation. */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, EGRESS_MAX_DESTS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct egress_dest_key);
	__type(value, struct egress_dest);
} egress_dest SEC(".maps");

/* Client pod source IPv4 -> the Egresses it belongs to; other sources are never steered. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, EGRESS_MAX_CLIENTS);
	__type(key, __be32);
	__type(value, struct egress_client);
} egress_clients SEC(".maps");

/* Egress id -> its gateway slots. A hash map, not an array: an update links a fully written new element
 * in place of the old one, so the program sees either the old or the new set, never a torn mix (array
 * updates are a memcpy over the live value). No preallocation, so a replaced element is freed after an
 * RCU grace period instead of going straight back to a freelist where a concurrent update could reuse
 * it under a reader. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, EGRESS_MAX_EGRESSES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u32);
	__type(value, struct egress_gateways);
} egress_gateways SEC(".maps");

/* Flow → the floating address it is pinned to, for the flow's life: least recently used flows go first
 * when the map is full. Pinned on the bpffs like the others, so flows keep their address across a tetherd
 * restart. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, EGRESS_MAX_FLOWS);
	__type(key, struct egress_flow_key);
	__type(value, struct egress_flow);
} egress_flows SEC(".maps");

/* Floating address → per-CPU flow, packet and byte counts of this node's clients. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, EGRESS_MAX_ADDRESSES);
	__type(key, __be32);
	__type(value, struct egress_addr_stats);
} egress_addr_stats SEC(".maps");

/* Per-CPU counters; key 0. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct egress_stats);
} egress_stats SEC(".maps");

/* IPv6 beside IPv4: maps of their own, same sizes and semantics (the egress stats are shared). */

/* (egress id, IPv6 destination prefix) -> STEER or BYPASS. */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, EGRESS_MAX_DESTS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct egress_dest6_key);
	__type(value, struct egress_dest);
} egress_dest6 SEC(".maps");

/* Client pod source IPv6 -> the Egresses it belongs to. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, EGRESS_MAX_CLIENTS);
	__type(key, struct in6_addr);
	__type(value, struct egress_client);
} egress_clients6 SEC(".maps");

/* Egress id -> its IPv6 gateway slots (a hash without preallocation, as egress_gateways and for the same
 * reason). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, EGRESS_MAX_EGRESSES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u32);
	__type(value, struct egress_gateways6);
} egress_gateways6 SEC(".maps");

/* IPv6 flow -> its pinned floating address; sized like egress_flows (tetherd sets both). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, EGRESS_MAX_FLOWS);
	__type(key, struct egress_flow6_key);
	__type(value, struct egress_flow6);
} egress_flows6 SEC(".maps");

/* IPv6 floating address -> per-CPU flow, packet and byte counts. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, EGRESS_MAX_ADDRESSES);
	__type(key, struct in6_addr);
	__type(value, struct egress_addr_stats);
} egress_addr_stats6 SEC(".maps");

/* Node settings for outer IPv6; key 0. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct egress_config6);
} egress_cfg6 SEC(".maps");

/* Egress id -> its IPv6 slots when one of them has an IPv6 gateway (else the Egress is in egress_gateways6
 * alone). Asked before egress_gateways6; a hash without preallocation as the others. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, EGRESS_MAX_EGRESSES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u32);
	__type(value, struct egress_gateways66);
} egress_gateways66 SEC(".maps");

#endif
