/* lb6.h: the IPv6 path of lb.bpf.c, for both attach points: a packet for an IPv6 VIP port goes to its
 * client's target (mapping, else the VIP's Maglev row in lb_maglev6) in FoU over outer IPv6; ICMPv6 errors
 * about a VIP flow go to the target holding it; later fragments follow their first fragment. The checks the
 * stack would make (ip6_rcv) are made first: a bad version or lengths are dropped and counted. Headers, keys
 * and addresses live in the per-CPU lb_scratch6, not on the stack (lb-maps.h). */
#ifndef TETHER_LB6_H
#define TETHER_LB6_H

#include "common.h"
#include "parse.h"
#include "fou.h"
#include "lb-core.h"
#include "lb-forward.h"

#define NEXTHDR_HOP_ 0
#define NEXTHDR_ROUTING_ 43
#define NEXTHDR_FRAGMENT_ 44
#define NEXTHDR_DEST_ 60
#define ICMPV6_DEST_UNREACH_ 1
#define ICMPV6_TIME_EXCEED_ 3
#define IP6_OFFSET_ 0xfff8
#define IP6_MF_ 0x0001

struct lb_frag_hdr6 {
	__u8 nexthdr;
	__u8 reserved;
	__be16 frag_off; /* offset in 8-byte units << 3, then 2 reserved bits and M */
	__be32 id;
};

/* An ICMPv6 error whose quoted packet is a reply from an IPv6 VIP (VIP:port -> client:cport): forwarded to
 * the target holding the flow client:cport -> VIP:port, found on the reversed inner tuple. Informational
 * messages (echo, neighbour discovery) and errors about anything else pass to the stack. */
static __always_inline int lb_icmp6(struct __sk_buff *skb, struct lb_scratch6 *s, const struct lb_config *cfg,
				    const struct lb_config6 *cfg6, const bool node)
{
	struct { __u8 type, code; __u16 csum; __u32 rest; } icmp;
	struct lb_service *svc;
	struct lb_stats *st;
	__be16 ports[2];
	__u8 proto;
	int off = ETH_HLEN + sizeof(s->ip6);

	if (bpf_skb_load_bytes(skb, off, &icmp, sizeof(icmp)) ||
	    (icmp.type != ICMPV6_DEST_UNREACH_ && icmp.type != ICMPV6_PKT_TOOBIG_ && icmp.type != ICMPV6_TIME_EXCEED_))
		return TC_ACT_OK;
	off += sizeof(icmp);
	if (bpf_skb_load_bytes(skb, off, &s->inner, sizeof(s->inner)))
		return TC_ACT_OK;
	proto = s->inner.nexthdr;
	if ((proto != IPPROTO_TCP_ && proto != IPPROTO_UDP_) ||
	    bpf_skb_load_bytes(skb, off + sizeof(s->inner), ports, sizeof(ports)))
		return TC_ACT_OK;
	__builtin_memset(&s->sk, 0, sizeof(s->sk));
	s->sk.vip = s->inner.saddr;
	s->sk.port = ports[0];
	s->sk.proto = proto;
	svc = bpf_map_lookup_elem(&lb_services6, &s->sk);
	if (!svc)
		return TC_ACT_OK;
	st = lb_stats_of(svc->slot);
	if (!st)
		return TC_ACT_OK;
	lb_key6(&s->k, svc->flags, &s->inner.saddr, &s->inner.daddr, ports[0], ports[1], proto);
	if (!lb_mapped6(&s->k, s)) {
		st->drop_icmp_no_flow++;
		return TC_ACT_SHOT;
	}
	return lb_forward6(skb, s, cfg, cfg6, st, lb_hash6(&s->k, cfg->seed), LB_FWD_ICMP, 0, node);
}

static __always_inline int lb_process6(struct __sk_buff *skb, const bool node)
{
	struct lb_frag_hdr6 fh = {};
	struct lb_scratch6 *s;
	struct lb_service *svc;
	struct lb_config *cfg;
	struct lb_config6 *cfg6;
	struct lb_stats *st;
	__be16 ports[2];
	__u32 key0 = 0, hash, l4off = ETH_HLEN + sizeof(struct ipv6hdr);
	__u8 proto;
	int first_frag = 0, l4_direct = 1;

	cfg = bpf_map_lookup_elem(&lb_cfg, &key0);
	cfg6 = bpf_map_lookup_elem(&lb_cfg6, &key0);
	s = bpf_map_lookup_elem(&lb_scratch6, &key0);
	if (!cfg || !cfg6 || !s || in6_is_zero(&cfg6->saddr) || !cfg->dport || !cfg->maglev_size)
		return TC_ACT_OK; /* IPv6 not configured: everything takes the stack's path */
	if (bpf_skb_load_bytes(skb, ETH_HLEN, &s->ip6, sizeof(s->ip6)))
		return TC_ACT_OK;

	__builtin_memset(&s->sk, 0, sizeof(s->sk));
	s->sk.vip = s->ip6.daddr;
	svc = bpf_map_lookup_elem(&lb_services6, &s->sk);
	if (!svc)
		return TC_ACT_OK;
	if (skb->pkt_type != PACKET_HOST_) {
		struct lb_node_stats *ns = bpf_map_lookup_elem(&lb_node_stats, &key0);

		if (ns)
			ns->not_for_host++;
		return TC_ACT_OK;
	}
	st = lb_stats_of(svc->slot);
	if (!st)
		return TC_ACT_SHOT;
	/* ip6_rcv's checks: the version, and a payload length that the frame holds. 0 would be a jumbogram (a
	 * Hop-by-Hop option, refused below anyway). */
	if (s->ip6.version != 6 || !s->ip6.payload_len ||
	    bpf_ntohs(s->ip6.payload_len) + sizeof(struct ipv6hdr) + ETH_HLEN > skb->len) {
		st->drop_bad_header++;
		return TC_ACT_SHOT;
	}
	proto = s->ip6.nexthdr;
	if (proto == IPPROTO_ICMPV6_)
		return lb_icmp6(skb, s, cfg, cfg6, node);
	/* Extension headers other than Fragment are refused, as IPv4 options are: no client of a VIP needs them,
	 * and they would put the ports at a variable offset. */
	if (proto == NEXTHDR_HOP_ || proto == NEXTHDR_ROUTING_ || proto == NEXTHDR_DEST_) {
		st->drop_ip_options++;
		return TC_ACT_SHOT;
	}
	if (proto == NEXTHDR_FRAGMENT_) {
		if (bpf_skb_load_bytes(skb, l4off, &fh, sizeof(fh))) {
			st->drop_bad_header++;
			return TC_ACT_SHOT;
		}
		proto = fh.nexthdr;
		l4_direct = 0;
		if (proto != IPPROTO_TCP_ && proto != IPPROTO_UDP_)
			return TC_ACT_OK;
		if (fh.frag_off & bpf_htons(IP6_OFFSET_)) {
			/* A later fragment: it follows its first fragment, as in lb_fragment; one seen first is dropped. */
			struct lb_frag6 *f;

			lb_frag_key6_of(&s->fk, &s->ip6, fh.id);
			f = bpf_map_lookup_elem(&lb_frags6, &s->fk);
			if (!f) {
				st->drop_fragment++;
				return TC_ACT_SHOT;
			}
			s->target = f->target;
			hash = f->hash;
			st->fragments++;
			goto forward;
		}
		first_frag = (fh.frag_off & bpf_htons(IP6_MF_)) != 0;
		l4off += sizeof(fh);
	} else if (proto != IPPROTO_TCP_ && proto != IPPROTO_UDP_) {
		return TC_ACT_OK;
	}

	if (bpf_skb_load_bytes(skb, l4off, ports, sizeof(ports))) {
		st->drop_bad_header++;
		return TC_ACT_SHOT;
	}
	s->sk.port = ports[1];
	s->sk.proto = proto;
	svc = bpf_map_lookup_elem(&lb_services6, &s->sk);
	if (!svc) {
		st->drop_no_port++;
		return TC_ACT_SHOT;
	}

	lb_key6(&s->k, svc->flags, &s->ip6.daddr, &s->ip6.saddr, ports[1], ports[0], proto);
	/* The key's hash picks a new client's target only: a mapped client's packet needs just the per-flow one. */
	if (!lb_mapped6(&s->k, s) && !lb_pick6(&s->k, svc, cfg, st, lb_hash6(&s->k, cfg->seed), s))
		return TC_ACT_SHOT;
	/* Per flow for the outer port and flow label even with client affinity, as for IPv4. */
	if (!(svc->flags & LB_F_PER_FLOW))
		lb_key6(&s->k, LB_F_PER_FLOW, &s->ip6.daddr, &s->ip6.saddr, ports[1], ports[0], proto);
	hash = lb_hash6(&s->k, cfg->seed);
	if (first_frag) {
		s->frag.target = s->target;
		s->frag.hash = hash;
		s->frag.pad = 0;
		lb_frag_key6_of(&s->fk, &s->ip6, fh.id);
		bpf_map_update_elem(&lb_frags6, &s->fk, &s->frag, BPF_ANY);
	}
forward:
	/* A packet with a Fragment header is not quoted in a Packet Too Big (l4_direct 0): dropped, counted. */
	return lb_forward6(skb, s, cfg, cfg6, st, hash, LB_FWD_DATA, l4_direct, node);
}

#endif
