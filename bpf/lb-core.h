/* lb-core.h: the load balancer's decisions, shared by both attach points of lb.bpf.c: the flow hash, a
 * client's mapping, the Maglev pick recorded and reported, and the targets of fragmented datagrams. */
#ifndef TETHER_LB_CORE_H
#define TETHER_LB_CORE_H

#include "common.h"
#include "parse.h"
#include "lb-maps.h"

#define IPPROTO_TCP_ 6
#define IPPROTO_ICMP_ 1
#define IP_MF_ 0x2000
#define IP_OFFSET_ 0x1fff
#define E2BIG_ 7
/* A mapping's last-use time is rewritten at most this often: a write per packet would bounce the
 * entry's cache line between CPUs for nothing (idle timeouts are seconds or more). */
#define LB_TOUCH_NS 1000000000ull

/* murmur3's finaliser over a few words: the same on every node for the same seed, unlike the kernel's
 * per-boot flow hash, so LB nodes pick the same target for the same client. */
static __always_inline __u32 lb_mix(__u32 h, __u32 k)
{
	k *= 0xcc9e2d51u;
	k = (k << 15) | (k >> 17);
	k *= 0x1b873593u;
	h ^= k;
	h = (h << 13) | (h >> 19);
	return h * 5 + 0xe6546b64u;
}

static __always_inline __u32 lb_hash(const struct lb_map_key *k, __u32 seed)
{
	__u32 h = seed;

	h = lb_mix(h, k->vip);
	h = lb_mix(h, k->client);
	h = lb_mix(h, ((__u32)k->vport << 16) | k->cport);
	h = lb_mix(h, k->proto);
	h ^= 16;
	h ^= h >> 16;
	h *= 0x85ebca6bu;
	h ^= h >> 13;
	h *= 0xc2b2ae35u;
	h ^= h >> 16;
	return h;
}

static __always_inline struct lb_stats *lb_stats_of(__u32 slot)
{
	return bpf_map_lookup_elem(&lb_stats, &slot);
}

/* The mapping key of a client's packet to (vip, vport). */
static __always_inline void lb_key(struct lb_map_key *k, __u32 flags, __be32 vip, __be32 client, __be16 vport,
				   __be16 cport, __u8 proto)
{
	__builtin_memset(k, 0, sizeof(*k));
	k->vip = vip;
	k->client = client;
	if (flags & LB_F_PER_FLOW) {
		k->vport = vport;
		k->cport = cport;
		k->proto = proto;
	}
}

/* The target of a mapping that is still valid, refreshing its last-use time; 0 when there is none. */
static __always_inline __be32 lb_mapped(const struct lb_map_key *k)
{
	struct lb_target_key tk = { .vip = k->vip };
	struct lb_mapping *m = bpf_map_lookup_elem(&lb_mappings, k);
	__u64 now;

	if (!m)
		return 0;
	tk.target = m->target;
	if (!bpf_map_lookup_elem(&lb_targets, &tk))
		return 0; /* the target was removed: the mapping is void and is replaced */
	now = bpf_ktime_get_ns();
	if (now - m->last_ns > LB_TOUCH_NS)
		m->last_ns = now;
	return m->target;
}

/* A new client: the VIP's Maglev row picks its target, which is recorded here and, unless the service is
 * quiet, reported on the ring buffer (tetherd writes it to the store later: the packet never waits for that). A full table does not
 * stop the flow: it is forwarded by the same pick, counted, and still reported so the store holds it.
 * 0 when the VIP has no active target. */
static __always_inline __be32 lb_pick(const struct lb_map_key *k, const struct lb_service *svc,
				      const struct lb_config *cfg, struct lb_stats *st, __u32 hash)
{
	struct lb_mapping m = {};
	struct lb_event *ev;
	__u32 idx = svc->slot * cfg->maglev_size + hash % cfg->maglev_size;
	__be32 *t = bpf_map_lookup_elem(&lb_maglev, &idx);
	long err;

	if (!t || !*t) {
		st->drop_no_target++;
		return 0;
	}
	m.target = *t;
	m.last_ns = bpf_ktime_get_ns();
	/* ANY: a void mapping (its target removed) is replaced. -E2BIG only for a new key in a full table. */
	err = bpf_map_update_elem(&lb_mappings, k, &m, BPF_ANY);
	if (err == -E2BIG_)
		st->mapping_full++;
	st->misses++;
	/* Quiet: nothing to report while the target set holds still (every LB node picks alike); a pick this
	 * map could not hold is reported all the same, so the store holds what no local mapping does. */
	if ((svc->flags & LB_F_QUIET) && err != -E2BIG_)
		return m.target;
	ev = bpf_ringbuf_reserve(&lb_events, sizeof(*ev), 0);
	if (ev) {
		ev->key = *k;
		ev->target = m.target;
		ev->kind = LB_EV_NEW;
		bpf_ringbuf_submit(ev, 0);
	} else {
		st->report_lost++;
	}
	return m.target;
}

static __always_inline void lb_frag_key_of(struct lb_frag_key *fk, const struct iphdr *ip)
{
	__builtin_memset(fk, 0, sizeof(*fk));
	fk->saddr = ip->saddr;
	fk->daddr = ip->daddr;
	fk->id = ip->id;
	fk->proto = ip->protocol;
}

/* A first fragment (MF set, offset 0): its later fragments follow it to target. */
static __always_inline void lb_frag_remember(const struct iphdr *ip, __be32 target, __u32 hash)
{
	struct lb_frag_key fk;
	struct lb_frag f = { .target = target, .hash = hash };

	lb_frag_key_of(&fk, ip);
	bpf_map_update_elem(&lb_frags, &fk, &f, BPF_ANY);
}

/* Where a later fragment's datagram went; NULL when its first fragment was not seen (yet). */
static __always_inline struct lb_frag *lb_frag_lookup(const struct iphdr *ip)
{
	struct lb_frag_key fk;

	lb_frag_key_of(&fk, ip);
	return bpf_map_lookup_elem(&lb_frags, &fk);
}

/* ---- IPv6 ---------------------------------------------------------------------------------------------- */

/* lb_hash over an lb_map_key6: the addresses' words as the program loads them, then ports and protocol as
 * lb_hash mixes them, and the key's length (40). Mirrored bit for bit by lbHash6 in daemon/bpf/lb-structs.ts. */
static __always_inline __u32 lb_hash6(const struct lb_map_key6 *k, __u32 seed)
{
	__u32 h = seed;

#pragma unroll
	for (int i = 0; i < 4; i++)
		h = lb_mix(h, k->vip.in6_u.u6_addr32[i]);
#pragma unroll
	for (int i = 0; i < 4; i++)
		h = lb_mix(h, k->client.in6_u.u6_addr32[i]);
	h = lb_mix(h, ((__u32)k->vport << 16) | k->cport);
	h = lb_mix(h, k->proto);
	h ^= 40;
	h ^= h >> 16;
	h *= 0x85ebca6bu;
	h ^= h >> 13;
	h *= 0xc2b2ae35u;
	h ^= h >> 16;
	return h;
}

static __always_inline void lb_key6(struct lb_map_key6 *k, __u32 flags, const struct in6_addr *vip,
				    const struct in6_addr *client, __be16 vport, __be16 cport, __u8 proto)
{
	__builtin_memset(k, 0, sizeof(*k));
	k->vip = *vip;
	k->client = *client;
	if (flags & LB_F_PER_FLOW) {
		k->vport = vport;
		k->cport = cport;
		k->proto = proto;
	}
}

/* lb_mapped for an IPv6 client: 1 when k has a still valid mapping, its target copied to s->target. */
static __always_inline int lb_mapped6(const struct lb_map_key6 *k, struct lb_scratch6 *s)
{
	struct lb_mapping6 *m = bpf_map_lookup_elem(&lb_mappings6, k);
	__u64 now;

	if (!m)
		return 0;
	s->tk.vip = k->vip;
	s->tk.target = m->target;
	if (!bpf_map_lookup_elem(&lb_targets6, &s->tk))
		return 0;
	now = bpf_ktime_get_ns();
	if (now - m->last_ns > LB_TOUCH_NS)
		m->last_ns = now;
	s->target = m->target;
	return 1;
}

/* lb_pick for an IPv6 client: the VIP's row in lb_maglev6, recorded in lb_mappings6 and reported on
 * lb_events6 unless the service is quiet (a pick the full table cannot hold is reported all the same).
 * 1 with the target in s->target; 0 when the VIP has no active target. */
static __always_inline int lb_pick6(const struct lb_map_key6 *k, const struct lb_service *svc, const struct lb_config *cfg,
				    struct lb_stats *st, __u32 hash, struct lb_scratch6 *s)
{
	struct lb_event6 *ev;
	__u32 idx = svc->slot * cfg->maglev_size + hash % cfg->maglev_size;
	struct in6_addr *t = bpf_map_lookup_elem(&lb_maglev6, &idx);
	long err;

	if (!t || in6_is_zero(t)) {
		st->drop_no_target++;
		return 0;
	}
	s->m.target = *t;
	s->m.last_ns = bpf_ktime_get_ns();
	err = bpf_map_update_elem(&lb_mappings6, k, &s->m, BPF_ANY);
	if (err == -E2BIG_)
		st->mapping_full++;
	st->misses++;
	s->target = s->m.target;
	if ((svc->flags & LB_F_QUIET) && err != -E2BIG_)
		return 1;
	ev = bpf_ringbuf_reserve(&lb_events6, sizeof(*ev), 0);
	if (ev) {
		ev->key = *k;
		ev->target = s->m.target;
		ev->kind = LB_EV_NEW;
		ev->pad = 0;
		bpf_ringbuf_submit(ev, 0);
	} else {
		st->report_lost++;
	}
	return 1;
}

static __always_inline void lb_frag_key6_of(struct lb_frag_key6 *fk, const struct ipv6hdr *ip6, __be32 id)
{
	__builtin_memset(fk, 0, sizeof(*fk));
	fk->saddr = ip6->saddr;
	fk->daddr = ip6->daddr;
	fk->id = id;
}

#endif
