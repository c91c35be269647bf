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

/* Copies the slot that takes a flow with this hash into *out; -1 when the count is out of range.
 * TODO(egress consistent hashing): hash % count moves most flows whenever count changes. The next step
 * replaces this with a consistent-hash table per Egress, prefers slots in the client's zone
 * (egress_slot.zone), and pins each flow to its floating address in an LRU map keyed by the 5-tuple so a
 * flow never moves while its address lives (egress_slot.floating is the pin's value). */
static __always_inline int egress_pick_slot(const struct egress_gateways *gw, __u32 hash, struct egress_slot *out)
{
	__u32 count = gw->count;
	__u32 idx;

	if (count == 0 || count > EGRESS_MAX_SLOTS)
		return -1;
	idx = hash % count;
	/* clang turns the modulo into 64-bit div/mul/sub and, knowing idx < count <= MAX, drops a plain bound
	 * check — leaving the verifier an unbounded index. The empty asm hides what clang knows, so the
	 * check stays in the code and gives the verifier its bound. */
	asm volatile("" : "+r"(idx));
	if (idx >= EGRESS_MAX_SLOTS)
		return -1;
	__builtin_memcpy(out, &gw->slots[idx], sizeof(*out));
	return 0;
}

#endif
