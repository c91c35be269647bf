/* egress-lookup.h: egress steering decisions — which Egress (if any) a client's packet belongs to, and which
 * gateway slot of that Egress takes the flow. */
#ifndef TETHER_EGRESS_LOOKUP_H
#define TETHER_EGRESS_LOOKUP_H

#include "common.h"
#include "egress-types.h"
#include "egress-maps.h"

/* Action of the longest prefix of egress_id that covers daddr; 0 when none does. */
static __always_inline __u8 egress_lookup_dest4(__u32 egress_id, __be32 daddr)
{
	struct egress_dest_key key = { .prefixlen = 64, .egress_id = egress_id, .daddr = daddr };
	struct egress_dest *d = bpf_map_lookup_elem(&egress_dest, &key);

	return d ? d->action : 0;
}

/* The Egress that steers a packet from client to daddr, or 0 (not steered). A global BYPASS beats every
 * Egress; otherwise the client's Egresses are asked in order, and one whose longest match is BYPASS (or
 * that has no match) leaves the packet to the next. */
static __always_inline __u32 egress_classify4(const struct egress_client *client, __be32 daddr)
{
	__u32 n = client->count;

	if (egress_lookup_dest4(EGRESS_ID_GLOBAL, daddr) == EGRESS_ACT_BYPASS)
		return 0;
	/* Constant trip count with an explicit bound on count: the verifier accepts it unrolled on any kernel. */
#pragma unroll
	for (int i = 0; i < EGRESS_MAX_PER_CLIENT; i++) {
		__u32 id = client->ids[i];

		if ((__u32)i >= n)
			break;
		if (id != EGRESS_ID_GLOBAL && egress_lookup_dest4(id, daddr) == EGRESS_ACT_STEER)
			return id;
	}
	return 0;
}

/* Rendezvous score of a slot for a flow: the flow hash mixed with the slot's floating address
 * (murmur3's finaliser). The highest score of the best tier wins, so adding a slot moves only the flows
 * that now score best on it, and removing one moves only its own. */
static __always_inline __u32 egress_score(__u32 flow_hash, __be32 floating)
{
	__u32 x = flow_hash ^ ((__u32)floating * 0x9e3779b1u);

	x ^= x >> 16;
	x *= 0x85ebca6bu;
	x ^= x >> 13;
	x *= 0xc2b2ae35u;
	x ^= x >> 16;
	return x;
}

#define EGRESS_PICK_PINNED 0 /* the flow's pinned address is still a slot */
#define EGRESS_PICK_NEW 1    /* chosen now: lowest tier, then highest score */
#define EGRESS_PICK_NONE -1  /* every slot is excluded for this node */
#define EGRESS_PICK_BAD -2   /* slot count out of range */

/* The slot that takes a flow: the one holding its pinned floating address (pinned != 0) whatever its tier
 * (a live flow never moves), else the best by tier and rendezvous score. Copies it into *out. */
static __always_inline int egress_pick_slot(const struct egress_gateways *gw, __u32 flow_hash, __be32 pinned,
					    struct egress_slot *out)
{
	__u32 count = gw->count;
	__u32 best_tier = EGRESS_TIER_EXCLUDED, best_score = 0;
	int best = -1;

	if (count == 0 || count > EGRESS_MAX_SLOTS)
		return EGRESS_PICK_BAD;
#pragma unroll
	for (int i = 0; i < EGRESS_MAX_SLOTS; i++) {
		const struct egress_slot *s = &gw->slots[i];
		__u32 score;

		if ((__u32)i >= count)
			break;
		if (pinned && s->floating == pinned) {
			__builtin_memcpy(out, s, sizeof(*out));
			return EGRESS_PICK_PINNED;
		}
		if (s->tier >= EGRESS_TIER_EXCLUDED)
			continue;
		score = egress_score(flow_hash, s->floating);
		if (best < 0 || s->tier < best_tier || (s->tier == best_tier && score > best_score)) {
			best = i;
			best_tier = s->tier;
			best_score = score;
		}
	}
	if (best < 0)
		return EGRESS_PICK_NONE;
	/* Hide what clang knows about best from the verifier's view of the index (see the bound below). */
	asm volatile("" : "+r"(best));
	if (best >= EGRESS_MAX_SLOTS)
		return EGRESS_PICK_BAD;
	__builtin_memcpy(out, &gw->slots[best], sizeof(*out));
	return EGRESS_PICK_NEW;
}

/* The flow key of an option-less IPv4 packet: ports for TCP and UDP (first fragments), 0 otherwise. */
static __always_inline void egress_flow_key4(struct __sk_buff *skb, const struct iphdr *ip, __u32 egress_id,
					     struct egress_flow_key *k)
{
	__be16 ports[2] = {};

	__builtin_memset(k, 0, sizeof(*k));
	k->saddr = ip->saddr;
	k->daddr = ip->daddr;
	k->proto = ip->protocol;
	k->egress_id = egress_id;
	if ((ip->protocol == IPPROTO_TCP_ || ip->protocol == IPPROTO_UDP_) && !(ip->frag_off & bpf_htons(0x1fff)) &&
	    bpf_skb_load_bytes(skb, ETH_HLEN + sizeof(*ip), ports, sizeof(ports)) == 0) {
		k->sport = ports[0];
		k->dport = ports[1];
	}
}

/* Counts a packet (and a new flow) on its floating address. */
static __always_inline void egress_count_addr(__be32 floating, __u32 bytes, int new_flow)
{
	struct egress_addr_stats *a = bpf_map_lookup_elem(&egress_addr_stats, &floating);

	if (!a) {
		struct egress_addr_stats zero = {};

		bpf_map_update_elem(&egress_addr_stats, &floating, &zero, BPF_NOEXIST);
		a = bpf_map_lookup_elem(&egress_addr_stats, &floating);
		if (!a)
			return;
	}
	a->packets++;
	a->bytes += bytes;
	if (new_flow)
		a->flows++;
}

/* IPv6: the same decisions over the IPv6 maps. */

static __always_inline __u8 egress_lookup_dest6(__u32 egress_id, const struct in6_addr *daddr)
{
	struct egress_dest6_key key = { .prefixlen = 32 + 128, .egress_id = egress_id };
	struct egress_dest *d;

	__builtin_memcpy(&key.daddr, daddr, sizeof(key.daddr));
	d = bpf_map_lookup_elem(&egress_dest6, &key);
	return d ? d->action : 0;
}

/* egress_classify4 for an IPv6 destination (the client's Egress ids come from egress_clients6). */
static __always_inline __u32 egress_classify6(const struct egress_client *client, const struct in6_addr *daddr)
{
	__u32 n = client->count;

	if (egress_lookup_dest6(EGRESS_ID_GLOBAL, daddr) == EGRESS_ACT_BYPASS)
		return 0;
#pragma unroll
	for (int i = 0; i < EGRESS_MAX_PER_CLIENT; i++) {
		__u32 id = client->ids[i];

		if ((__u32)i >= n)
			break;
		if (id != EGRESS_ID_GLOBAL && egress_lookup_dest6(id, daddr) == EGRESS_ACT_STEER)
			return id;
	}
	return 0;
}

/* Rendezvous score over an IPv6 floating address: its four words folded into one. Two addresses of one
 * Egress that fold alike would score alike for every flow; they differ in few bits (one pool), which XOR
 * keeps apart. */
static __always_inline __u32 egress_score6(__u32 flow_hash, const struct in6_addr *floating)
{
	const __u32 *w = floating->in6_u.u6_addr32;

	return egress_score(flow_hash, w[0] ^ w[1] ^ w[2] ^ w[3]);
}

/* egress_pick_slot over IPv6 slots: pinned (non-NULL) first whatever its tier, then lowest tier and
 * highest score. */
static __always_inline int egress_pick_slot6(const struct egress_gateways6 *gw, __u32 flow_hash,
					     const struct in6_addr *pinned, struct egress_slot6 *out)
{
	__u32 count = gw->count;
	__u32 best_tier = EGRESS_TIER_EXCLUDED, best_score = 0;
	int best = -1;

	if (count == 0 || count > EGRESS_MAX_SLOTS)
		return EGRESS_PICK_BAD;
#pragma unroll
	for (int i = 0; i < EGRESS_MAX_SLOTS; i++) {
		const struct egress_slot6 *s = &gw->slots[i];
		__u32 score;

		if ((__u32)i >= count)
			break;
		if (pinned && in6_equal(&s->floating, pinned)) {
			__builtin_memcpy(out, s, sizeof(*out));
			return EGRESS_PICK_PINNED;
		}
		if (s->tier >= EGRESS_TIER_EXCLUDED)
			continue;
		score = egress_score6(flow_hash, &s->floating);
		if (best < 0 || s->tier < best_tier || (s->tier == best_tier && score > best_score)) {
			best = i;
			best_tier = s->tier;
			best_score = score;
		}
	}
	if (best < 0)
		return EGRESS_PICK_NONE;
	asm volatile("" : "+r"(best));
	if (best >= EGRESS_MAX_SLOTS)
		return EGRESS_PICK_BAD;
	__builtin_memcpy(out, &gw->slots[best], sizeof(*out));
	return EGRESS_PICK_NEW;
}

/* egress_pick_slot6 over egress_gateways66's slots (same rules; only the gateway is wider). */
static __always_inline int egress_pick_slot66(const struct egress_gateways66 *gw, __u32 flow_hash,
					      const struct in6_addr *pinned, struct egress_slot66 *out)
{
	__u32 count = gw->count;
	__u32 best_tier = EGRESS_TIER_EXCLUDED, best_score = 0;
	int best = -1;

	if (count == 0 || count > EGRESS_MAX_SLOTS)
		return EGRESS_PICK_BAD;
#pragma unroll
	for (int i = 0; i < EGRESS_MAX_SLOTS; i++) {
		const struct egress_slot66 *s = &gw->slots[i];
		__u32 score;

		if ((__u32)i >= count)
			break;
		if (pinned && in6_equal(&s->floating, pinned)) {
			__builtin_memcpy(out, s, sizeof(*out));
			return EGRESS_PICK_PINNED;
		}
		if (s->tier >= EGRESS_TIER_EXCLUDED)
			continue;
		score = egress_score6(flow_hash, &s->floating);
		if (best < 0 || s->tier < best_tier || (s->tier == best_tier && score > best_score)) {
			best = i;
			best_tier = s->tier;
			best_score = score;
		}
	}
	if (best < 0)
		return EGRESS_PICK_NONE;
	asm volatile("" : "+r"(best));
	if (best >= EGRESS_MAX_SLOTS)
		return EGRESS_PICK_BAD;
	__builtin_memcpy(out, &gw->slots[best], sizeof(*out));
	return EGRESS_PICK_NEW;
}

/* The flow key of an IPv6 packet: ports when the next header is TCP or UDP, 0 otherwise (ICMPv6, and
 * extension headers, which are not walked: such a flow is pinned by addresses and next header alone). */
static __always_inline void egress_flow_key6(struct __sk_buff *skb, const struct ipv6hdr *ip6, __u32 egress_id,
					     struct egress_flow6_key *k)
{
	__be16 ports[2] = {};

	__builtin_memset(k, 0, sizeof(*k));
	__builtin_memcpy(&k->saddr, &ip6->saddr, sizeof(k->saddr));
	__builtin_memcpy(&k->daddr, &ip6->daddr, sizeof(k->daddr));
	k->proto = ip6->nexthdr;
	k->egress_id = egress_id;
	if ((ip6->nexthdr == IPPROTO_TCP_ || ip6->nexthdr == IPPROTO_UDP_) &&
	    bpf_skb_load_bytes(skb, ETH_HLEN + sizeof(*ip6), ports, sizeof(ports)) == 0) {
		k->sport = ports[0];
		k->dport = ports[1];
	}
}

static __always_inline void egress_count_addr6(const struct in6_addr *floating, __u32 bytes, int new_flow)
{
	struct egress_addr_stats *a = bpf_map_lookup_elem(&egress_addr_stats6, floating);

	if (!a) {
		struct egress_addr_stats zero = {};

		bpf_map_update_elem(&egress_addr_stats6, floating, &zero, BPF_NOEXIST);
		a = bpf_map_lookup_elem(&egress_addr_stats6, floating);
		if (!a)
			return;
	}
	a->packets++;
	a->bytes += bytes;
	if (new_flow)
		a->flows++;
}

#endif
