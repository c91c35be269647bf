/* lb-forward.h: how a load-balanced packet leaves for its target from each attach point of lb.bpf.c, and
 * the ICMP "fragmentation needed" a client gets instead when its packet would not fit once encapsulated. */
#ifndef TETHER_LB_FORWARD_H
#define TETHER_LB_FORWARD_H

#include "common.h"
#include "fou.h"
#include "lb-core.h"
#include "lb-nexthop.h"

#define AF_INET_ 2
#define ICMP_DEST_UNREACH_ 3
#define ICMP_FRAG_NEEDED_ 4
#define IPTOS_PREC_INTERNETCONTROL_ 0xc0
/* The smallest MTU an IPv4 link may have (RFC 791): a next hop below it is not advertised to a client. */
#define IPV4_MIN_MTU 68

/* What is being forwarded: a client's packet (counted as traffic; too big: the client is told), or an ICMP
 * error about a VIP flow (counted apart; never answered with another ICMP error, RFC 1122 3.2.2). */
enum lb_fwd_kind { LB_FWD_DATA, LB_FWD_ICMP };

static __always_inline void lb_count(struct lb_stats *st, enum lb_fwd_kind kind, __u32 len)
{
	if (kind == LB_FWD_ICMP) {
		st->icmp_forwarded++;
		return;
	}
	st->packets++;
	st->bytes += len;
}

/* The LB pod's interface: encapsulated, and back out the interface the packet came in by, to the node. */
static __always_inline int lb_forward_pod(struct __sk_buff *skb, const struct iphdr *ip, const struct lb_config *cfg,
					  struct lb_stats *st, __be32 target, __u32 hash, enum lb_fwd_kind kind)
{
	if (fou_encap4_sport(skb, ip, cfg->saddr, target, cfg->dport, fou_sport_of(hash)) || fou_swap_macs(skb)) {
		st->drop_error++;
		return TC_ACT_SHOT;
	}
	lb_count(st, kind, bpf_ntohs(ip->tot_len));
	return bpf_redirect(skb->ifindex, 0);
}

/* ICMP type 3 code 4 as sent on the wire: the unused half of the rest-of-header, then the next-hop MTU. */
struct lb_icmp_frag {
	__u8 type;
	__u8 code;
	__sum16 csum;
	__be16 unused;
	__be16 mtu;
};

/* The reply built on the stack: new IPv4 header, ICMP header, then the quote of the client's packet. */
struct lb_too_big_reply {
	struct iphdr ip;
	struct lb_icmp_frag icmp;
	struct iphdr quoted;
	__u8 l4[20];
};

static __always_inline __sum16 lb_csum_fold(__s64 c)
{
	__u32 s = (__u32)c;

	s = (s & 0xffff) + (s >> 16);
	s = (s & 0xffff) + (s >> 16);
	return (__sum16)~s;
}

/* Turns the client's packet into ICMP "fragmentation needed" (next-hop MTU mtu) from the VIP to the client
 * and sends it back out the interface it came in by. The quote is the client's IP header and its transport
 * header (UDP 8 bytes, TCP 20): enough for the client's stack to find the socket, and a trim that keeps a
 * whole transport header is one the kernel allows even when that header's checksum is still to be filled
 * in by a device (CHECKSUM_PARTIAL, from a sender on a virtual link; such an skb keeps its checksum
 * offsets, so a device that does fill it in would change the quote: receivers on virtual links do not
 * check it, and real NICs never hand such packets in). */
static __always_inline int lb_too_big(struct __sk_buff *skb, const struct iphdr *ip, __u16 mtu)
{
	struct lb_too_big_reply r;
	__u32 l4 = ip->protocol == IPPROTO_TCP_ ? 20 : 8;
	__s64 sum;

	__builtin_memset(&r, 0, sizeof(r));
	r.quoted = *ip;
	if (l4 == 20) {
		if (bpf_skb_load_bytes(skb, ETH_HLEN + sizeof(*ip), r.l4, 20))
			return TC_ACT_SHOT;
	} else if (bpf_skb_load_bytes(skb, ETH_HLEN + sizeof(*ip), r.l4, 8)) {
		return TC_ACT_SHOT;
	}
	if (bpf_skb_change_tail(skb, ETH_HLEN + sizeof(*ip) + l4, 0) ||
	    bpf_skb_adjust_room(skb, sizeof(r.ip) + sizeof(r.icmp), BPF_ADJ_ROOM_MAC, 0))
		return TC_ACT_SHOT;

	r.icmp.type = ICMP_DEST_UNREACH_;
	r.icmp.code = ICMP_FRAG_NEEDED_;
	r.icmp.mtu = bpf_htons(mtu);
	/* ICMP checksum over the ICMP header and the quote (36 or 48 bytes: csum_diff wants multiples of 4). */
	if (l4 == 20)
		sum = bpf_csum_diff(NULL, 0, (__be32 *)&r.icmp, sizeof(r.icmp) + sizeof(r.quoted) + 20, 0);
	else
		sum = bpf_csum_diff(NULL, 0, (__be32 *)&r.icmp, sizeof(r.icmp) + sizeof(r.quoted) + 8, 0);
	if (sum < 0)
		return TC_ACT_SHOT;
	r.icmp.csum = lb_csum_fold(sum);

	r.ip.version = 4;
	r.ip.ihl = 5;
	r.ip.tos = IPTOS_PREC_INTERNETCONTROL_;
	r.ip.tot_len = bpf_htons(sizeof(r.ip) + sizeof(r.icmp) + sizeof(*ip) + l4);
	r.ip.ttl = 64;
	r.ip.protocol = IPPROTO_ICMP_;
	r.ip.saddr = ip->daddr; /* the VIP: the address the client sent to */
	r.ip.daddr = ip->saddr;
	r.ip.check = fou_ipv4_csum(&r.ip);
	if (bpf_skb_store_bytes(skb, ETH_HLEN, &r, sizeof(r.ip) + sizeof(r.icmp), 0) || fou_swap_macs(skb))
		return TC_ACT_SHOT;
	return bpf_redirect(skb->ifindex, 0);
}

/* The length a lookup checks against the path MTU: the packet once encapsulated, or 0 for a GSO packet (the
 * kernel then checks only the device, as for the segments it will become). */
static __always_inline __u32 lb_fib_len(const struct __sk_buff *skb, __u32 inner_len, __u32 overhead)
{
	return skb->gso_size ? 0 : inner_len + overhead;
}

static __always_inline void lb_fib4_ask(struct bpf_fib_lookup *fib, const struct __sk_buff *skb, const struct iphdr *ip,
					__be32 saddr, __be32 target, __u16 tot_len)
{
	__builtin_memset(fib, 0, sizeof(*fib));
	fib->family = AF_INET_;
	fib->tos = ip->tos;
	fib->l4_protocol = IPPROTO_UDP_;
	fib->tot_len = tot_len;
	fib->ifindex = skb->ifindex;
	fib->ipv4_src = saddr;
	fib->ipv4_dst = target;
}

/* An encapsulated packet to its next hop (cached or just looked up): the hop's MACs, then the redirect. */
static __always_inline int lb_send_to_hop(struct __sk_buff *skb, struct lb_stats *st, const struct lb_nexthop *hop)
{
	if (bpf_skb_store_bytes(skb, 0, hop->macs, sizeof(hop->macs), 0)) {
		st->drop_error++;
		return TC_ACT_SHOT;
	}
	return bpf_redirect(hop->ifindex, 0);
}

/* The node's uplink: the FIB names the egress device and next hop towards the target (the uplink for a
 * target on another node, a pod's veth for one on this node) and checks the encapsulated length against the
 * path MTU; the packet is encapsulated and redirected straight there, with the neighbour's MAC from the
 * FIB, or from the neighbour subsystem when not resolved yet (bpf_redirect_neigh). The node's stack never
 * sees it: no second pass through routing, conntrack or netfilter. A resolved answer is cached for
 * LB_NH_TTL_NS (lb-nexthop.h), and a packet over its MTU is answered as the FIB would have. */
static __always_inline int lb_forward_node(struct __sk_buff *skb, const struct iphdr *ip, const struct lb_config *cfg,
					   struct lb_stats *st, __be32 target, __u32 hash, enum lb_fwd_kind kind)
{
	struct lb_nh_key key = { .ifindex = skb->ifindex, .target = target, .tos = ip->tos };
	struct bpf_fib_lookup fib;
	struct bpf_redir_neigh nh = {};
	struct lb_nexthop learnt, *hop;
	struct lb_nh_entry *victim;
	__u32 inner_len = bpf_ntohs(ip->tot_len);
	__u32 len = lb_fib_len(skb, inner_len, FOU_OVERHEAD);
	__u64 now = bpf_ktime_get_ns();
	__u32 mtu;
	long rc;

	hop = lb_nh_find(&key, now, &victim);
	if (hop) {
		mtu = hop->mtu;
		if (len > mtu)
			goto too_big;
		goto send;
	}
	lb_fib4_ask(&fib, skb, ip, cfg->saddr, target, len);
	rc = bpf_fib_lookup(skb, &fib, sizeof(fib), 0);
	if (rc == BPF_FIB_LKUP_RET_FRAG_NEEDED) {
		/* mtu_result: the path MTU towards the target (route, PMTU exception or device). */
		mtu = fib.mtu_result;
		goto too_big;
	}
	if (rc != BPF_FIB_LKUP_RET_SUCCESS && rc != BPF_FIB_LKUP_RET_NO_NEIGH) {
		st->drop_no_route++;
		return TC_ACT_SHOT;
	}
	/* Resolved: cached when a way of the set is free (its MTU asked for separately). */
	if (rc == BPF_FIB_LKUP_RET_SUCCESS) {
		lb_nh_learn(&learnt, &fib);
		hop = &learnt;
		if (victim) {
			lb_fib4_ask(&fib, skb, ip, cfg->saddr, target, 0);
			learnt.mtu = lb_nh_mtu(skb, &fib);
			learnt.expires_ns = learnt.mtu ? now + LB_NH_TTL_NS : 0;
			victim->key = key;
			victim->pad = 0;
			victim->hop = learnt;
		}
	}
send:
	if (fou_encap4_sport(skb, ip, cfg->saddr, target, cfg->dport, fou_sport_of(hash))) {
		st->drop_error++;
		return TC_ACT_SHOT;
	}
	lb_count(st, kind, inner_len);
	if (hop)
		return lb_send_to_hop(skb, st, hop);
	/* Not resolved yet (no hop): the neighbour subsystem resolves the FIB's next hop, the gateway or the
	 * target itself when on-link. */
	nh.nh_family = AF_INET_;
	nh.ipv4_nh = fib.ipv4_dst;
	return bpf_redirect_neigh(fib.ifindex, &nh, sizeof(nh), 0);
too_big:
	st->too_big++;
	if (kind != LB_FWD_DATA || skb->gso_size || mtu < FOU_OVERHEAD + IPV4_MIN_MTU)
		return TC_ACT_SHOT;
	return lb_too_big(skb, ip, mtu - FOU_OVERHEAD);
}

/* node: a compile-time constant, so each program keeps only its own branch. */
static __always_inline int lb_forward(struct __sk_buff *skb, const struct iphdr *ip, const struct lb_config *cfg,
				      struct lb_stats *st, __be32 target, __u32 hash, enum lb_fwd_kind kind, const bool node)
{
	if (node)
		return lb_forward_node(skb, ip, cfg, st, target, hash, kind);
	return lb_forward_pod(skb, ip, cfg, st, target, hash, kind);
}

/* ---- IPv6 ---------------------------------------------------------------------------------------------- */

#define AF_INET6_ 10
/* The smallest MTU an IPv6 link may have (RFC 8200 5): no Packet Too Big names less. */
#define IPV6_MIN_MTU 1280
#define ICMPV6_PKT_TOOBIG_ 2

/* lb_forward_pod for an IPv6 packet: outer IPv6 + UDP from the node's IPv6 address to the target. */
static __always_inline int lb_forward6_pod(struct __sk_buff *skb, struct lb_scratch6 *s, const struct lb_config *cfg,
					   const struct lb_config6 *cfg6, struct lb_stats *st, __u32 hash, enum lb_fwd_kind kind)
{
	if (fou6_encap6(skb, &s->ip6, &cfg6->saddr, &s->target, cfg->dport, fou_sport_of(hash), hash, &s->h) ||
	    fou_swap_macs(skb)) {
		st->drop_error++;
		return TC_ACT_SHOT;
	}
	lb_count(st, kind, bpf_ntohs(s->ip6.payload_len) + sizeof(s->ip6));
	return bpf_redirect(skb->ifindex, 0);
}

/* lb_too_big for IPv6: the client's packet (s->ip6) becomes ICMPv6 Packet Too Big (MTU mtu) from the VIP to
 * the client, quoting the client's IPv6 header and its transport header (TCP 20 bytes, UDP 8: enough for its
 * stack to find the socket; RFC 4443 asks for no more than fits 1280 bytes, which this is), and leaves by the
 * interface it came in by. Only a packet whose transport header follows the IPv6 header directly gets here. */
static __always_inline int lb_too_big6(struct __sk_buff *skb, struct lb_scratch6 *s, __u32 mtu)
{
	struct lb_too_big_reply6 *r = &s->reply;
	struct lb_pseudo6 *ph = &s->pseudo;
	__u32 l4 = s->ip6.nexthdr == IPPROTO_TCP_ ? 20 : 8;
	__u32 icmp_len = sizeof(r->icmp) + sizeof(r->quoted) + l4;
	__s64 sum;

	__builtin_memset(r, 0, sizeof(*r));
	__builtin_memset(ph, 0, sizeof(*ph));
	r->quoted = s->ip6;
	if (l4 == 20) {
		if (bpf_skb_load_bytes(skb, ETH_HLEN + sizeof(s->ip6), r->l4, 20))
			return TC_ACT_SHOT;
	} else if (bpf_skb_load_bytes(skb, ETH_HLEN + sizeof(s->ip6), r->l4, 8)) {
		return TC_ACT_SHOT;
	}
	if (bpf_skb_change_tail(skb, ETH_HLEN + sizeof(s->ip6) + l4, 0) ||
	    bpf_skb_adjust_room(skb, sizeof(r->ip) + sizeof(r->icmp), BPF_ADJ_ROOM_MAC, 0))
		return TC_ACT_SHOT;

	r->icmp.type = ICMPV6_PKT_TOOBIG_;
	r->icmp.mtu = bpf_htonl(mtu);
	ph->saddr = s->ip6.daddr; /* the VIP: the address the client sent to */
	ph->daddr = s->ip6.saddr;
	ph->len = bpf_htonl(icmp_len);
	ph->nexthdr = IPPROTO_ICMPV6_;
	sum = bpf_csum_diff(NULL, 0, (__be32 *)ph, sizeof(*ph), 0);
	if (sum < 0)
		return TC_ACT_SHOT;
	/* 68 or 56 bytes: csum_diff wants multiples of 4. */
	if (l4 == 20)
		sum = bpf_csum_diff(NULL, 0, (__be32 *)&r->icmp, sizeof(r->icmp) + sizeof(r->quoted) + 20, sum);
	else
		sum = bpf_csum_diff(NULL, 0, (__be32 *)&r->icmp, sizeof(r->icmp) + sizeof(r->quoted) + 8, sum);
	if (sum < 0)
		return TC_ACT_SHOT;
	r->icmp.csum = lb_csum_fold(sum);

	r->ip.version = 6;
	r->ip.payload_len = bpf_htons(icmp_len);
	r->ip.nexthdr = IPPROTO_ICMPV6_;
	r->ip.hop_limit = 64;
	r->ip.saddr = s->ip6.daddr;
	r->ip.daddr = s->ip6.saddr;
	if (bpf_skb_store_bytes(skb, ETH_HLEN, r, sizeof(r->ip) + sizeof(r->icmp), 0) || fou_swap_macs(skb))
		return TC_ACT_SHOT;
	return bpf_redirect(skb->ifindex, 0);
}

static __always_inline void lb_fib6_ask(struct bpf_fib_lookup *fib, const struct __sk_buff *skb,
					const struct in6_addr *saddr, const struct in6_addr *target, __u16 tot_len)
{
	__builtin_memset(fib, 0, sizeof(*fib));
	fib->family = AF_INET6_;
	fib->l4_protocol = IPPROTO_UDP_;
	fib->tot_len = tot_len;
	fib->ifindex = skb->ifindex;
	__builtin_memcpy(fib->ipv6_src, saddr, 16);
	__builtin_memcpy(fib->ipv6_dst, target, 16);
}

/* lb_forward_node for an IPv6 packet: the FIB (IPv6) names the device and next hop towards the target and
 * checks the length once encapsulated (48 bytes more) against the path MTU, its resolved answers cached in
 * lb_nexthops6; over it, a client's packet is answered with Packet Too Big (the path MTU less 48), when that
 * is still a legal IPv6 MTU. l4_direct: the transport header follows the IPv6 header (no Fragment header),
 * so it can be quoted. */
static __always_inline int lb_forward6_node(struct __sk_buff *skb, struct lb_scratch6 *s, const struct lb_config *cfg,
					    const struct lb_config6 *cfg6, struct lb_stats *st, __u32 hash, enum lb_fwd_kind kind,
					    int l4_direct)
{
	struct lb_nh_key6 key = { .ifindex = skb->ifindex, .target = s->target };
	struct bpf_fib_lookup *fib = &s->fib;
	struct bpf_redir_neigh *nh = &s->nh;
	struct lb_nexthop learnt, *hop;
	struct lb_nh_entry6 *victim;
	__u32 inner_len = bpf_ntohs(s->ip6.payload_len) + sizeof(s->ip6);
	__u32 len = lb_fib_len(skb, inner_len, FOU6_OVERHEAD);
	__u64 now = bpf_ktime_get_ns();
	__u32 mtu;
	long rc;

	hop = lb_nh_find6(&key, now, &victim);
	if (hop) {
		mtu = hop->mtu;
		if (len > mtu)
			goto too_big;
		goto send;
	}
	lb_fib6_ask(fib, skb, &cfg6->saddr, &s->target, len);
	rc = bpf_fib_lookup(skb, fib, sizeof(*fib), 0);
	if (rc == BPF_FIB_LKUP_RET_FRAG_NEEDED) {
		mtu = fib->mtu_result;
		goto too_big;
	}
	if (rc != BPF_FIB_LKUP_RET_SUCCESS && rc != BPF_FIB_LKUP_RET_NO_NEIGH) {
		st->drop_no_route++;
		return TC_ACT_SHOT;
	}
	if (rc == BPF_FIB_LKUP_RET_SUCCESS) {
		lb_nh_learn(&learnt, fib);
		hop = &learnt;
		if (victim) {
			lb_fib6_ask(fib, skb, &cfg6->saddr, &s->target, 0);
			learnt.mtu = lb_nh_mtu(skb, fib);
			learnt.expires_ns = learnt.mtu ? now + LB_NH_TTL_NS : 0;
			victim->key = key;
			victim->pad = 0;
			victim->hop = learnt;
		}
	}
send:
	if (fou6_encap6(skb, &s->ip6, &cfg6->saddr, &s->target, cfg->dport, fou_sport_of(hash), hash, &s->h)) {
		st->drop_error++;
		return TC_ACT_SHOT;
	}
	lb_count(st, kind, inner_len);
	if (hop)
		return lb_send_to_hop(skb, st, hop);
	__builtin_memset(nh, 0, sizeof(*nh));
	nh->nh_family = AF_INET6_;
	__builtin_memcpy(nh->ipv6_nh, fib->ipv6_dst, 16);
	return bpf_redirect_neigh(fib->ifindex, nh, sizeof(*nh), 0);
too_big:
	st->too_big++;
	if (kind != LB_FWD_DATA || skb->gso_size || !l4_direct || mtu < FOU6_OVERHEAD + IPV6_MIN_MTU)
		return TC_ACT_SHOT;
	return lb_too_big6(skb, s, mtu - FOU6_OVERHEAD);
}

static __always_inline int lb_forward6(struct __sk_buff *skb, struct lb_scratch6 *s, const struct lb_config *cfg,
				       const struct lb_config6 *cfg6, struct lb_stats *st, __u32 hash, enum lb_fwd_kind kind,
				       int l4_direct, const bool node)
{
	if (node)
		return lb_forward6_node(skb, s, cfg, cfg6, st, hash, kind, l4_direct);
	return lb_forward6_pod(skb, s, cfg, cfg6, st, hash, kind);
}

#endif
