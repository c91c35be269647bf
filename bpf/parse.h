/* parse.h: reading Ethernet/IPv4/UDP headers out of a tc skb. */
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
