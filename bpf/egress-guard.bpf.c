/* egress-guard.bpf.c (tc ingress of a gateway pod's host-side veth, i.e. packets the pod sends): a packet
 * toward a destination of an Egress the pod is a gateway of leaves only with a source address the pod owns
 * right now (a floating address). Anything else toward those destinations is dropped and counted by
 * reason: the pod's own address, or any other source (a client pod's address that left un-NATed because
 * the pod's NAT went away before its interfaces, a floating address it no longer owns). The node enforces
 * this, not the pod's namespace. Packets to other destinations pass untouched. IPv4 and IPv6 alike, each
 * over maps of its own (the IPv6 ones added beside the IPv4 ones, whose layouts stay). Maps are per veth
 * (pinned under <pinDir>/egress-guard-<veth>/). */
#include "common.h"
#include "parse.h"

#define GUARD_MAX_DESTS 4096
#define GUARD_MAX_OWNED 256
#define GUARD_ACTION_GUARD 1
#define GUARD_ACTION_BYPASS 2

struct guard_dest_key {
	__u32 prefixlen;
	__be32 addr;
};

struct guard_config {
	__be32 pod_ip; /* the gateway pod's own address */
};

struct guard_dest6_key {
	__u32 prefixlen;
	struct in6_addr addr;
};

struct guard_config6 {
	struct in6_addr pod_ip6; /* the gateway pod's own IPv6 address; :: when it has none */
};

/* Counters of both families. New fields go at the end only: the release before reads the prefix it knows
 * (a pin of another size is migrated, 'prefix'). */
struct guard_stats {
	__u64 allowed;            /* toward a guarded destination from an owned floating address */
	__u64 not_guarded;        /* toward any other destination (passed), IPv6 link-local and multicast included */
	__u64 not_ipv4;           /* neither IPv4 nor IPv6: ARP and the like (passed); the name predates IPv6 */
	__u64 dropped_pod_source; /* toward a guarded destination from the pod's own address */
	__u64 dropped_other_source; /* from any other address that is not an owned floating address */
	__u64 dropped_truncated;  /* an IP packet too short to read its addresses, or IPv6 of another version */
	__u64 ipv6;               /* IPv6 packets, also counted by their outcome above */
};

/* Destination prefix -> GUARD or BYPASS (longest prefix wins: excluded ranges inside a destination). */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, GUARD_MAX_DESTS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct guard_dest_key);
	__type(value, __u8);
} guard_dest SEC(".maps");

/* Floating addresses the pod owns now. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, GUARD_MAX_OWNED);
	__type(key, __be32);
	__type(value, __u8);
} guard_owned SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct guard_config);
} guard_cfg SEC(".maps");

/* IPv6 destination prefix -> GUARD or BYPASS. */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, GUARD_MAX_DESTS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct guard_dest6_key);
	__type(value, __u8);
} guard_dest6 SEC(".maps");

/* IPv6 floating addresses the pod owns now. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, GUARD_MAX_OWNED);
	__type(key, struct in6_addr);
	__type(value, __u8);
} guard_owned6 SEC(".maps");

/* The pod's own IPv6; key 0. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct guard_config6);
} guard_cfg6 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct guard_stats);
} guard_stats SEC(".maps");

/* The IPv6 path: addresses at fixed offsets (extension headers come after them). */
static __always_inline int guard6(struct __sk_buff *skb, struct guard_stats *st)
{
	struct guard_dest6_key k = { .prefixlen = 128 };
	struct guard_config6 *cfg6;
	struct ipv6hdr ip6;
	__u32 key = 0;
	__u8 *act;

	st->ipv6++;
	if (parse_ipv6(skb, &ip6)) {
		st->dropped_truncated++;
		return TC_ACT_SHOT;
	}
	/* Neighbour discovery with the pod's own address: it never leaves the link, and without it the pod
	 * reaches nothing. */
	if (ipv6_link_scope(&ip6.daddr)) {
		st->not_guarded++;
		return TC_ACT_OK;
	}
	__builtin_memcpy(&k.addr, &ip6.daddr, sizeof(k.addr));
	act = bpf_map_lookup_elem(&guard_dest6, &k);
	if (!act || *act != GUARD_ACTION_GUARD) {
		st->not_guarded++;
		return TC_ACT_OK;
	}
	if (bpf_map_lookup_elem(&guard_owned6, &ip6.saddr)) {
		st->allowed++;
		return TC_ACT_OK;
	}
	cfg6 = bpf_map_lookup_elem(&guard_cfg6, &key);
	if (cfg6 && in6_equal(&cfg6->pod_ip6, &ip6.saddr))
		st->dropped_pod_source++;
	else
		st->dropped_other_source++;
	return TC_ACT_SHOT;
}

SEC("tc")
int egress_guard(struct __sk_buff *skb)
{
	struct guard_dest_key k = { .prefixlen = 32 };
	struct guard_config *cfg;
	struct guard_stats *st;
	__be32 addrs[2]; /* saddr, daddr: fixed offsets whatever the IP options */
	__u32 key = 0;
	__u8 *act;

	st = bpf_map_lookup_elem(&guard_stats, &key);
	cfg = bpf_map_lookup_elem(&guard_cfg, &key);
	if (!st || !cfg)
		return TC_ACT_SHOT;
	if (skb->protocol == bpf_htons(ETH_P_IPV6))
		return guard6(skb, st);
	if (skb->protocol != bpf_htons(ETH_P_IP)) {
		st->not_ipv4++;
		return TC_ACT_OK;
	}
	if (bpf_skb_load_bytes(skb, ETH_HLEN + 12, addrs, sizeof(addrs))) {
		st->dropped_truncated++;
		return TC_ACT_SHOT;
	}
	k.addr = addrs[1];
	act = bpf_map_lookup_elem(&guard_dest, &k);
	if (!act || *act != GUARD_ACTION_GUARD) {
		st->not_guarded++;
		return TC_ACT_OK;
	}
	if (bpf_map_lookup_elem(&guard_owned, &addrs[0])) {
		st->allowed++;
		return TC_ACT_OK;
	}
	if (addrs[0] == cfg->pod_ip)
		st->dropped_pod_source++;
	else
		st->dropped_other_source++;
	return TC_ACT_SHOT;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
