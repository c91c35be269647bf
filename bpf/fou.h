/* fou.h: Foo-over-UDP encapsulation and decapsulation of IPv4 and IPv6 in IPv4/UDP, and of IPv6 in IPv6/UDP. */
#ifndef TETHER_FOU_H
#define TETHER_FOU_H

#include "common.h"
#include "fou-types.h"

/* The 28 bytes written in front of the inner packet. Not packed: both headers are 4-byte multiples,
 * and packing would make taking &h.ip for the checksum an unaligned access. */
struct fou_hdr {
	struct iphdr ip;
	struct udphdr udp;
};
_Static_assert(sizeof(struct fou_hdr) == FOU_OVERHEAD, "outer headers must be exactly FOU_OVERHEAD bytes");

/* RFC 1071 checksum of an option-less IPv4 header; the loop is unrolled because the verifier of some
 * kernels rejects back-edges and the trip count is a constant 10 anyway. */
static __always_inline __sum16 fou_ipv4_csum(const struct iphdr *ip)
{
	const __u16 *w = (const __u16 *)ip;
	__u32 sum = 0;

#pragma unroll
	for (int i = 0; i < (int)(sizeof(*ip) / 2); i++)
		sum += w[i];
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return (__sum16)~sum;
}

/* Hash of the inner flow (the flow dissector's, over addresses and ports). The hash is invalidated first:
 * a locally generated skb carries the socket's random txhash, which the stack re-rolls after a timeout
 * and which would move the flow mid-stream. Stable per flow on one node (the seed is per boot). */
static __always_inline __u32 fou_flow_hash(struct __sk_buff *skb)
{
	bpf_set_hash_invalid(skb);
	return bpf_get_hash_recalc(skb);
}

/* Outer UDP source port from a flow hash, so ECMP and receive-side scaling spread flows while each flow
 * keeps one path. */
static __always_inline __be16 fou_sport_of(__u32 hash)
{
	return bpf_htons(FOU_SPORT_MIN + (__u16)(((__u64)hash * (FOU_SPORT_MAX - FOU_SPORT_MIN + 1)) >> 32));
}

static __always_inline __be16 fou_sport(struct __sk_buff *skb)
{
	return fou_sport_of(fou_flow_hash(skb));
}

/* skb->mark of a decapsulated packet whose outer IP ID (outer IPv4) or flow label (outer IPv6, low 16 bits)
 * named a floating address (low 16 bits). Must match daemon/egress/gateway-datapath.ts. */
#define FOU_FLOAT_MARK 0x7e7e0000u

/* Wraps the packet behind the Ethernet header (inner_len bytes, IPv4 or IPv6) in outer IPv4 + UDP. The
 * ENCAP flags make adjust_room mark the skb as a UDP tunnel (inner header offsets, gso_type, and the inner
 * protocol taken from skb->protocol before it becomes IPv4), so a GSO super-packet is segmented correctly
 * after this hook and each segment gets its own outer header. The outer UDP
 * checksum is 0 (allowed for IPv4; the inner transport checksum protects the data). DF is set: the
 * target's MSS is lowered by FOU_OVERHEAD so outer packets fit, and fragmenting FoU would make the
 * receiver reassemble before it can decapsulate. sport: outer UDP source port (fou_sport_of a flow hash).
 * Returns 0 or a negative value (packet unusable). */
static __always_inline int fou_push(struct __sk_buff *skb, __u32 inner_len, __u8 tos, __be32 saddr, __be32 daddr,
				    __be16 dport, __be16 sport, __be16 id)
{
	struct fou_hdr h = {};

	if (inner_len + FOU_OVERHEAD > 0xffff)
		return -1;

	h.ip.version = 4;
	h.ip.ihl = 5;
	h.ip.tos = tos;
	h.ip.tot_len = bpf_htons(inner_len + FOU_OVERHEAD);
	/* DF is set, so the ID plays no part in reassembly (RFC 6864): egress steering carries the low 16 bits
	 * of the flow's floating address in it, for the gateway's SNAT (fou-decap marks the packet with it). */
	h.ip.id = id;
	h.ip.frag_off = bpf_htons(IP_DF);
	h.ip.ttl = FOU_TTL;
	h.ip.protocol = IPPROTO_UDP_;
	h.ip.saddr = saddr;
	h.ip.daddr = daddr;
	h.ip.check = fou_ipv4_csum(&h.ip);
	h.udp.source = sport;
	h.udp.dest = dport;
	h.udp.len = bpf_htons(inner_len + sizeof(struct udphdr));

	if (bpf_skb_adjust_room(skb, FOU_OVERHEAD, BPF_ADJ_ROOM_MAC,
				BPF_F_ADJ_ROOM_ENCAP_L3_IPV4 | BPF_F_ADJ_ROOM_ENCAP_L4_UDP))
		return -1;
	if (bpf_skb_store_bytes(skb, ETH_HLEN, &h, sizeof(h), 0))
		return -1;
	return 0;
}

static __always_inline int fou_encap4_id(struct __sk_buff *skb, const struct iphdr *inner, __be32 saddr,
					 __be32 daddr, __be16 dport, __be16 sport, __be16 id)
{
	return fou_push(skb, bpf_ntohs(inner->tot_len), inner->tos, saddr, daddr, dport, sport, id);
}

/* fou_encap4_id for an IPv6 inner packet (still in outer IPv4: the underlay is IPv4, 28 bytes as for IPv4).
 * The outer TOS is the inner traffic class, so DSCP and ECN mean the same on the underlay; the outer TTL is
 * FOU_TTL as for IPv4 (the inner hop limit counts the inner path, which the tunnel is one hop of). The
 * Ethernet type becomes IPv4 with the outer header: anything reading the frame (a later tc program, an
 * egress-side redirect, a capture) must see what skb->protocol now says. */
static __always_inline int fou_encap6_id(struct __sk_buff *skb, const struct ipv6hdr *inner, __be32 saddr,
					 __be32 daddr, __be16 dport, __be16 sport, __be16 id)
{
	__u32 payload = bpf_ntohs(inner->payload_len);
	__u8 tclass = (inner->priority << 4) | (inner->flow_lbl[0] >> 4);
	__be16 ethertype = bpf_htons(ETH_P_IP);

	/* 0 is a jumbogram (or a BIG TCP super-packet): no outer IPv4 length can describe it. */
	if (!payload)
		return -1;
	if (fou_push(skb, payload + sizeof(*inner), tclass, saddr, daddr, dport, sport, id))
		return -1;
	return bpf_skb_store_bytes(skb, 2 * ETH_ALEN, &ethertype, sizeof(ethertype), 0) ? -1 : 0;
}

static __always_inline int fou_encap4_sport(struct __sk_buff *skb, const struct iphdr *inner, __be32 saddr,
					    __be32 daddr, __be16 dport, __be16 sport)
{
	return fou_encap4_id(skb, inner, saddr, daddr, dport, sport, 0);
}

/* fou_encap4_sport with the source port from the flow hash, for callers that need no hash themselves. */
static __always_inline int fou_encap4(struct __sk_buff *skb, const struct iphdr *inner, __be32 saddr,
				      __be32 daddr, __be16 dport)
{
	return fou_encap4_sport(skb, inner, saddr, daddr, dport, fou_sport(skb));
}

/* Removes outer IPv4 + UDP. DECAP_L3_IPV4 tells adjust_room the remaining packet is IPv4 so it clears
 * the tunnel GSO state of the skb instead of leaving it marked as UDP-encapsulated. */
static __always_inline int fou_decap4(struct __sk_buff *skb)
{
	return bpf_skb_adjust_room(skb, -FOU_OVERHEAD, BPF_ADJ_ROOM_MAC, BPF_F_ADJ_ROOM_DECAP_L3_IPV4);
}

/* Removes outer IPv4 + UDP from an IPv6 inner packet. DECAP_L3_IPV6 also sets skb->protocol to IPv6; the
 * Ethernet type follows, so the frame says what it carries when it leaves (decap at a veth's egress) or is
 * read again. */
static __always_inline int fou_decap6(struct __sk_buff *skb)
{
	__be16 ethertype = bpf_htons(ETH_P_IPV6);

	if (bpf_skb_adjust_room(skb, -FOU_OVERHEAD, BPF_ADJ_ROOM_MAC, BPF_F_ADJ_ROOM_DECAP_L3_IPV6))
		return -1;
	return bpf_skb_store_bytes(skb, 2 * ETH_ALEN, &ethertype, sizeof(ethertype), 0) ? -1 : 0;
}

/* The 48 bytes written in front of an inner IPv6 packet when the underlay is IPv6 (no extension headers). */
struct fou6_hdr {
	struct ipv6hdr ip;
	struct udphdr udp;
};
_Static_assert(sizeof(struct fou6_hdr) == FOU6_OVERHEAD, "outer IPv6 headers must be exactly FOU6_OVERHEAD bytes");

/* Wraps an IPv6 packet behind the Ethernet header in outer IPv6 + UDP (48 bytes) from saddr to daddr. The
 * ENCAP flags make adjust_room mark the skb as a UDP tunnel over IPv6, so a GSO super-packet is segmented
 * after this hook with an outer header per segment (and its gso_size lowered by 48).
 * The outer UDP checksum is 0. IPv6 forbids that in general (RFC 8200 8.1), but RFC 6935/6936 allow it for
 * tunnels whose receiver is prepared for it: ours is fou-decap's IPv6 path, which unwraps the packet before
 * the stack (whose UDP would drop it) sees it, checks the outer destination and source against its
 * configuration, and leaves the inner transport checksum (which covers the inner addresses) to protect the
 * data. Computing a real checksum here would mean summing the whole payload of every packet, and a GSO
 * super-packet's segments get no outer checksum from the kernel either (SKB_GSO_UDP_TUNNEL without _CSUM).
 * The outer traffic class is the inner one (DSCP and ECN mean the same on the underlay); the flow label is
 * 20 bits of the flow hash (RFC 6438), so ECMP on the underlay spreads flows as the UDP source port does;
 * the hop limit is FOU_TTL. skb->protocol and the Ethernet type stay IPv6. Returns 0 or a negative value.
 * fou6_encap6_label takes the 20-bit label from the caller: egress steering puts the floating address's low 16
 * bits in it (as the outer IP ID in IPv4), for the gateway's SNAT. */
static __always_inline int fou6_encap6_label(struct __sk_buff *skb, const struct ipv6hdr *inner, const struct in6_addr *saddr,
					     const struct in6_addr *daddr, __be16 dport, __be16 sport, __u32 label, struct fou6_hdr *h)
{
	__u32 inner_len = bpf_ntohs(inner->payload_len) + sizeof(*inner);

	/* payload_len 0 is a jumbogram (or a BIG TCP super-packet): no outer IPv6 length can describe it. */
	if (!inner->payload_len || inner_len + sizeof(struct udphdr) > 0xffff)
		return -1;
	/* h: where the headers are built (the caller's stack, or a per-CPU scratch where the stack is short). */
	__builtin_memset(h, 0, sizeof(*h));
	h->ip.version = 6;
	h->ip.priority = inner->priority;
	h->ip.flow_lbl[0] = (inner->flow_lbl[0] & 0xf0) | ((label >> 16) & 0x0f);
	h->ip.flow_lbl[1] = label >> 8;
	h->ip.flow_lbl[2] = label;
	h->ip.payload_len = bpf_htons(inner_len + sizeof(struct udphdr));
	h->ip.nexthdr = IPPROTO_UDP_;
	h->ip.hop_limit = FOU_TTL;
	h->ip.saddr = *saddr;
	h->ip.daddr = *daddr;
	h->udp.source = sport;
	h->udp.dest = dport;
	h->udp.len = h->ip.payload_len;

	if (bpf_skb_adjust_room(skb, FOU6_OVERHEAD, BPF_ADJ_ROOM_MAC,
				BPF_F_ADJ_ROOM_ENCAP_L3_IPV6 | BPF_F_ADJ_ROOM_ENCAP_L4_UDP))
		return -1;
	if (bpf_skb_store_bytes(skb, ETH_HLEN, h, sizeof(*h), 0))
		return -1;
	return 0;
}

static __always_inline int fou6_encap6(struct __sk_buff *skb, const struct ipv6hdr *inner, const struct in6_addr *saddr,
				       const struct in6_addr *daddr, __be16 dport, __be16 sport, __u32 hash, struct fou6_hdr *h)
{
	return fou6_encap6_label(skb, inner, saddr, daddr, dport, sport, hash & 0xfffff, h);
}

/* Removes outer IPv6 + UDP (48 bytes) from an inner packet of family v6 ? IPv6 : IPv4. The DECAP flag names
 * the inner family (skb->protocol follows it, and the tunnel GSO state is cleared); the Ethernet type is
 * rewritten to match, as fou_decap6 does. */
static __always_inline int fou6_decap(struct __sk_buff *skb, int v6)
{
	__be16 ethertype = v6 ? bpf_htons(ETH_P_IPV6) : bpf_htons(ETH_P_IP);

	if (bpf_skb_adjust_room(skb, -FOU6_OVERHEAD, BPF_ADJ_ROOM_MAC,
				v6 ? BPF_F_ADJ_ROOM_DECAP_L3_IPV6 : BPF_F_ADJ_ROOM_DECAP_L3_IPV4))
		return -1;
	return bpf_skb_store_bytes(skb, 2 * ETH_ALEN, &ethertype, sizeof(ethertype), 0) ? -1 : 0;
}

/* Turns an ingress packet around: it leaves through the device it came in by, back to the sender's MAC. */
static __always_inline int fou_swap_macs(struct __sk_buff *skb)
{
	__u8 macs[2 * ETH_ALEN], swapped[2 * ETH_ALEN];

	if (bpf_skb_load_bytes(skb, 0, macs, sizeof(macs)))
		return -1;
	__builtin_memcpy(swapped, macs + ETH_ALEN, ETH_ALEN);
	__builtin_memcpy(swapped + ETH_ALEN, macs, ETH_ALEN);
	return bpf_skb_store_bytes(skb, 0, swapped, sizeof(swapped), 0);
}

#endif
