/* lb-nexthop.h: the node program's next-hop cache (lb_nexthops, lb_nexthops6 in lb-maps.h). A FIB lookup per
 * packet cost more than the rest of the node program in IPv6 (bpf_fib_lookup ~200 ns against ~80 in IPv4;
 * test/bench/lb-prog-cost.ts), so a resolved answer towards a target (egress device, MACs, path MTU) is reused
 * for LB_NH_TTL_NS: a route, neighbour or MTU change reaches the packets within that. Only a lookup that found
 * the next hop's MAC is cached; one still to be resolved goes through the neighbour subsystem every time.
 * Per CPU: the program runs to completion on its CPU, so nothing else writes an entry while it is read. */
#ifndef TETHER_LB_NEXTHOP_H
#define TETHER_LB_NEXTHOP_H

#include "common.h"
#include "lb-maps.h"

#define LB_NH_TTL_NS 100000000ull

/* A target's set: a multiplicative hash, so targets that differ in any bits of the low word spread. */
static __always_inline __u32 lb_nh_base(__u32 word)
{
	return ((word * 2654435761u) >> 16) % LB_NH_SETS * LB_NH_WAYS;
}

/*
 * The fresh cached next hop for k, or NULL. On NULL, *victim is the entry an answer for k is to be written to:
 * k's own stale entry, else an empty or stale one of its set; NULL when every way holds another target's
 * fresh entry (that answer is then not cached: the lookup per packet of a third busy target in a set costs
 * no more than without a cache, where replacing would make it and its neighbours miss in turn).
 */
static __always_inline struct lb_nexthop *lb_nh_find(const struct lb_nh_key *k, __u64 now, struct lb_nh_entry **victim)
{
	__u32 base = lb_nh_base(k->target);

	*victim = NULL;
#pragma unroll
	for (__u32 w = 0; w < LB_NH_WAYS; w++) {
		__u32 i = base + w;
		struct lb_nh_entry *e = bpf_map_lookup_elem(&lb_nexthops, &i);

		if (!e)
			return NULL;
		if (e->key.target == k->target && e->key.ifindex == k->ifindex && e->key.tos == k->tos) {
			if (now < e->hop.expires_ns)
				return &e->hop;
			*victim = e;
			return NULL;
		}
		if (!*victim && now >= e->hop.expires_ns)
			*victim = e;
	}
	return NULL;
}

static __always_inline int lb_in6_eq(const struct in6_addr *a, const struct in6_addr *b)
{
	return a->in6_u.u6_addr32[0] == b->in6_u.u6_addr32[0] && a->in6_u.u6_addr32[1] == b->in6_u.u6_addr32[1] &&
	       a->in6_u.u6_addr32[2] == b->in6_u.u6_addr32[2] && a->in6_u.u6_addr32[3] == b->in6_u.u6_addr32[3];
}

/* lb_nh_find for an IPv6 target. */
static __always_inline struct lb_nexthop *lb_nh_find6(const struct lb_nh_key6 *k, __u64 now, struct lb_nh_entry6 **victim)
{
	const __u32 *a = k->target.in6_u.u6_addr32;
	__u32 base = lb_nh_base(a[0] ^ a[1] ^ a[2] ^ a[3]);

	*victim = NULL;
#pragma unroll
	for (__u32 w = 0; w < LB_NH_WAYS; w++) {
		__u32 i = base + w;
		struct lb_nh_entry6 *e = bpf_map_lookup_elem(&lb_nexthops6, &i);

		if (!e)
			return NULL;
		if (e->key.ifindex == k->ifindex && lb_in6_eq(&e->key.target, &k->target)) {
			if (now < e->hop.expires_ns)
				return &e->hop;
			*victim = e;
			return NULL;
		}
		if (!*victim && now >= e->hop.expires_ns)
			*victim = e;
	}
	return NULL;
}

/* The next hop a successful lookup found: its device and MACs (the caller adds MTU and expiry to cache it). */
static __always_inline void lb_nh_learn(struct lb_nexthop *h, const struct bpf_fib_lookup *fib)
{
	h->ifindex = fib->ifindex;
	__builtin_memcpy(h->macs, fib->dmac, ETH_ALEN);
	__builtin_memcpy(h->macs + ETH_ALEN, fib->smac, ETH_ALEN);
	h->pad = 0;
}

/*
 * The path MTU of a lookup that just succeeded (fib: its question again): a successful lookup does not report
 * the MTU, one for the largest length does (FRAG_NEEDED, from the same route, PMTU exception and device,
 * before any neighbour lookup). 0 when that answer is neither (the route changed in between): not cached.
 */
static __always_inline __u32 lb_nh_mtu(struct __sk_buff *skb, struct bpf_fib_lookup *fib)
{
	long rc;

	fib->tot_len = 0xffff;
	rc = bpf_fib_lookup(skb, fib, sizeof(*fib), 0);
	if (rc == BPF_FIB_LKUP_RET_FRAG_NEEDED)
		return fib->mtu_result;
	return rc == BPF_FIB_LKUP_RET_SUCCESS ? 0xffff : 0;
}

#endif
