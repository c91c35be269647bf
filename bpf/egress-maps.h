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

/* Per-CPU counters; key 0. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct egress_stats);
} egress_stats SEC(".maps");

#endif
