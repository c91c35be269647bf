/* lb-maps.h: maps of the load balancer programs (lb.bpf.c), pinned per node and shared by both attach points. */
#ifndef TETHER_LB_MAPS_H
#define TETHER_LB_MAPS_H

#include "lb-types.h"

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

/* Node counters, key 0 (struct lb_node_stats): apart from lb_stats, whose pinned layout stays as it was. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct lb_node_stats);
} lb_node_stats SEC(".maps");

#endif
