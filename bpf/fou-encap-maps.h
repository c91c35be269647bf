/* fou-encap-maps.h: maps of the FoU encapsulation program. */
#ifndef TETHER_FOU_ENCAP_MAPS_H
#define TETHER_FOU_ENCAP_MAPS_H

#include "fou-types.h"

#ifndef FOU_MAX_DESTS
#define FOU_MAX_DESTS 65536
#endif

/* Encap settings (outer source, default port, flags); key 0. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct fou_encap_config);
} fou_encap_cfg SEC(".maps");

/* Inner destination IPv4 (e.g. a VIP) -> outer destination to encapsulate to. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, FOU_MAX_DESTS);
	__type(key, __be32);
	__type(value, struct fou_dest);
} fou_dests SEC(".maps");

/* Per-CPU counters so the hot path never contends on a shared cache line; key 0. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct fou_stats);
} fou_encap_stats SEC(".maps");

#endif
