/* parse.h: reading Ethernet/IPv4/IPv6/UDP headers out of a tc skb. */
#ifndef TETHER_PARSE_H
#define TETHER_PARSE_H

#include "common.h"

/* Headers are copied with bpf_skb_load_bytes rather than read in place: at tc the linear part of a
 * (GSO, veth-forwarded) skb may end before the headers we need, and a copy needs no data/data_end
 * bounds dance for the verifier. A few dozen bytes per packet is cheap next to adjust_room. */

/* Loads the IPv4 header behind an Ethernet header; returns 0 when the packet is IPv4 without options. */
static __always_inline int parse_ipv4(struct __sk_buff *skb, struct iphdr *ip)
{
	if (skb->protocol != bpf_htons(ETH_P_IP))
		return -1;
	if (bpf_skb_load_bytes(skb, ETH_HLEN, ip, sizeof(*ip)) < 0)
		return -1;
	/* Options would shift every later offset; FoU and the traffic it carries do not use them. */
	if (ip->version != 4 || ip->ihl != 5)
		return -1;
	return 0;
}

/* Loads the IPv6 header behind an Ethernet header: 0 when the packet is IPv6, -1 when it is not, -2 when
 * the ethertype says IPv6 but the header is short or of another version (malformed: callers drop it). */
static __always_inline int parse_ipv6(struct __sk_buff *skb, struct ipv6hdr *ip6)
{
	if (skb->protocol != bpf_htons(ETH_P_IPV6))
		return -1;
	if (bpf_skb_load_bytes(skb, ETH_HLEN, ip6, sizeof(*ip6)) < 0 || ip6->version != 6)
		return -2;
	return 0;
}

/* Link-local (fe80::/10) and multicast (ff00::/8) destinations never leave the link: neighbour discovery
 * lives there, and steering or guarding it would cut a pod off from its node whatever the prefixes say. */
static __always_inline int ipv6_link_scope(const struct in6_addr *a)
{
	__u8 b0 = a->in6_u.u6_addr8[0], b1 = a->in6_u.u6_addr8[1];

	return b0 == 0xff || (b0 == 0xfe && (b1 & 0xc0) == 0x80);
}

static __always_inline int in6_equal(const struct in6_addr *a, const struct in6_addr *b)
{
	return !((a->in6_u.u6_addr32[0] ^ b->in6_u.u6_addr32[0]) | (a->in6_u.u6_addr32[1] ^ b->in6_u.u6_addr32[1]) |
		 (a->in6_u.u6_addr32[2] ^ b->in6_u.u6_addr32[2]) | (a->in6_u.u6_addr32[3] ^ b->in6_u.u6_addr32[3]));
}

static __always_inline int in6_is_zero(const struct in6_addr *a)
{
	return !(a->in6_u.u6_addr32[0] | a->in6_u.u6_addr32[1] | a->in6_u.u6_addr32[2] | a->in6_u.u6_addr32[3]);
}

/* Loads the UDP header behind an option-less IPv4 header. */
static __always_inline int parse_udp(struct __sk_buff *skb, const struct iphdr *ip, struct udphdr *udp)
{
	if (ip->protocol != IPPROTO_UDP_)
		return -1;
	/* A non-first fragment has no UDP header at this offset. */
	if (ip->frag_off & bpf_htons(0x1fff))
		return -1;
	return bpf_skb_load_bytes(skb, ETH_HLEN + sizeof(*ip), udp, sizeof(*udp)) < 0 ? -1 : 0;
}

#endif
