/* lb-maps.h: maps of the load balancer program; pinned per node and shared by its LB pods. */
#ifndef TETHER_LB_MAPS_H
#define TETHER_LB_MAPS_H

#include "lb-types.h"

#ifndef LB_MAX_SERVICES
#define LB_MAX_SERVICES 1024
#endif
#ifndef LB_MAX_MAPPINGS
#define LB_MAX_MAPPINGS 262144
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

/* Client -> target. LRU: an idle mapping the store also expired can be evicted under pressure; the
 * store (Redis) holds the authoritative copy, so an evicted mapping still in use is installed again. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
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

#endif
