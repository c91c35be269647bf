/* fou-decap-maps.h: maps of the FoU decapsulation program. */
#ifndef TETHER_FOU_DECAP_MAPS_H
#define TETHER_FOU_DECAP_MAPS_H

#include "fou-types.h"

#ifndef FOU_MAX_SOURCES
#define FOU_MAX_SOURCES 4096
#endif

/* Decap settings (port, accepted outer destination, flags); key 0. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct fou_decap_config);
} fou_decap_cfg SEC(".maps");

/* Allow-list of outer source IPv4 addresses (value unused); enforced while FOU_DECAP_F_CHECK_SOURCES. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, FOU_MAX_SOURCES);
	__type(key, __be32);
	__type(value, __u8);
} fou_sources SEC(".maps");

/* Decap settings for outer IPv6 (port, accepted outer destination, flags); key 0. Added beside
 * fou_decap_cfg, whose layout an older release's pin keeps. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct fou_decap_config6);
} fou_decap_cfg6 SEC(".maps");

/* Allow-list of outer source IPv6 addresses (value unused); enforced while fou_decap_cfg6 has
 * FOU_DECAP_F_CHECK_SOURCES. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, FOU_MAX_SOURCES);
	__type(key, struct in6_addr);
	__type(value, __u8);
} fou_sources6 SEC(".maps");

/* Per-CPU counters; key 0. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct fou_stats);
} fou_decap_stats SEC(".maps");

#endif
