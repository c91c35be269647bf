/* fou-decap.bpf.c (tc ingress, or egress of a pod's host-side veth): strips outer IPv4 + UDP from FoU packets
 * addressed to this interface's configured address and port, from allowed sources only, and passes the inner
 * packet (IPv4 without options, or IPv6) up the stack. Outer IPv6 + UDP (an IPv6 VIP's load balancer sends
 * that to an IPv6 target) is unwrapped the same way under its own settings and allow-list (fou_decap_cfg6,
 * fou_sources6). */
#include "common.h"
#include "parse.h"
#include "fou.h"
#include "fou-decap-maps.h"

#define IP_MF 0x2000

/* Outer IPv6 + UDP to the configured IPv6 address and port. The outer header must be followed by UDP at once:
 * encapsulators write no extension headers, and a Fragment header would mean a piece of an inner packet.
 * The UDP checksum is not checked, and 0 is accepted: the encapsulator sends 0 (fou.h, RFC 6935/6936) and
 * this runs before the stack's UDP, which would refuse it. */
static __always_inline int fou_decap_outer6(struct __sk_buff *skb)
{
	struct fou_decap_config6 *cfg;
	struct fou_stats *st;
	struct ipv6hdr ip6;
	struct udphdr udp;
	__u8 inner_vihl;
	__u32 key = 0;
	int v6;

	if (parse_ipv6(skb, &ip6) || ip6.nexthdr != IPPROTO_UDP_ ||
	    bpf_skb_load_bytes(skb, ETH_HLEN + sizeof(ip6), &udp, sizeof(udp)))
		return TC_ACT_OK;
	cfg = bpf_map_lookup_elem(&fou_decap_cfg6, &key);
	st = bpf_map_lookup_elem(&fou_decap_stats, &key);
	if (!cfg || !st)
		return TC_ACT_OK;
	if (!cfg->dport || udp.dest != cfg->dport)
		return TC_ACT_OK;
	if (!in6_is_zero(&cfg->daddr) && !in6_equal(&ip6.daddr, &cfg->daddr)) {
		st->rejected_dest++;
		return TC_ACT_OK;
	}
	if ((cfg->flags & FOU_DECAP_F_CHECK_SOURCES) && !bpf_map_lookup_elem(&fou_sources6, &ip6.saddr)) {
		st->rejected_source++;
		return TC_ACT_SHOT;
	}
	if (bpf_skb_load_bytes(skb, ETH_HLEN + FOU6_OVERHEAD, &inner_vihl, 1)) {
		st->errors++;
		return TC_ACT_SHOT;
	}
	if (inner_vihl == 0x45)
		v6 = 0;
	else if ((inner_vihl >> 4) == 6)
		v6 = 1;
	else {
		st->errors++;
		return TC_ACT_SHOT;
	}
	if (fou6_decap(skb, v6)) {
		st->errors++;
		return TC_ACT_SHOT;
	}
	/* Egress steering in outer IPv6 put the floating address's low 16 bits in the flow label (the outer IP
	 * ID of IPv4): the same mark for the pod's SNAT. */
	if (cfg->flags & FOU_DECAP_F_LABEL_MARK) {
		__u16 bits = ((__u16)ip6.flow_lbl[1] << 8) | ip6.flow_lbl[2];

		if (bits)
			skb->mark = FOU_FLOAT_MARK | bits;
	}
	st->packets++;
	st->bytes += skb->len - ETH_HLEN;
	return TC_ACT_OK;
}

SEC("tc")
int fou_decap(struct __sk_buff *skb)
{
	struct fou_decap_config *cfg;
	struct fou_stats *st;
	struct udphdr udp;
	struct iphdr ip;
	__u8 inner_vihl;
	__u32 key = 0;
	int v6;

	if (skb->protocol == bpf_htons(ETH_P_IPV6))
		return fou_decap_outer6(skb);
	if (parse_ipv4(skb, &ip) || parse_udp(skb, &ip, &udp))
		return TC_ACT_OK;
	cfg = bpf_map_lookup_elem(&fou_decap_cfg, &key);
	st = bpf_map_lookup_elem(&fou_decap_stats, &key);
	if (!cfg || !st)
		return TC_ACT_OK;
	/* Not FoU (or decap not configured yet): ordinary traffic, untouched and uncounted. */
	if (!cfg->dport || udp.dest != cfg->dport)
		return TC_ACT_OK;

	/* Arriving here proves nothing: anyone who can reach the port could inject packets with any inner
	 * source. So check who it is for and who sent it before unwrapping. */
	if (cfg->daddr && ip.daddr != cfg->daddr) {
		st->rejected_dest++;
		return TC_ACT_OK; /* not ours to unwrap; the stack treats it as plain UDP */
	}
	if ((cfg->flags & FOU_DECAP_F_CHECK_SOURCES) && !bpf_map_lookup_elem(&fou_sources, &ip.saddr)) {
		st->rejected_source++;
		return TC_ACT_SHOT;
	}
	/* Encapsulators set DF; a first fragment carries only part of the inner packet. The inner packet's first
	 * byte tells its family (one port carries both, as steering sends both); the stack checks the rest of
	 * the inner header once it is unwrapped. */
	if (ip.frag_off & bpf_htons(IP_MF) || bpf_skb_load_bytes(skb, ETH_HLEN + FOU_OVERHEAD, &inner_vihl, 1)) {
		st->errors++;
		return TC_ACT_SHOT;
	}
	if (inner_vihl == 0x45)
		v6 = 0;
	else if ((inner_vihl >> 4) == 6)
		v6 = 1;
	else {
		st->errors++;
		return TC_ACT_SHOT;
	}
	if (v6 ? fou_decap6(skb) : fou_decap4(skb)) {
		st->errors++;
		return TC_ACT_SHOT;
	}
	/* Egress steering put the low 16 bits of the flow's floating address in the outer IP ID: the gateway
	 * pod's SNAT picks the address by this mark (its nft map; unmarked flows get its first address). */
	if (ip.id)
		skb->mark = FOU_FLOAT_MARK | bpf_ntohs(ip.id);
	st->packets++;
	st->bytes += skb->len - ETH_HLEN;
	return TC_ACT_OK;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
