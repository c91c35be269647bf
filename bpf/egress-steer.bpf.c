/* egress-steer.bpf.c (tc ingress of a client pod's host-side veth, i.e. packets the pod sends): packets
 * of listed client pods to an Egress's destination prefixes are encapsulated in FoU to the gateway pod
 * that owns the floating address of the flow, then continue into the node's stack, which routes them to
 * that pod. A new flow picks an address by tier (zone policy) and rendezvous hash and is pinned to it in
 * an LRU map for its life; everything else passes untouched. IPv4 and IPv6 inner packets, each over its own
 * maps; the outer packet is IPv4 for both, except to an IPv6 gateway (egress_gateways66): outer IPv6. */
#include "common.h"
#include "parse.h"
#include "fou.h"
#include "egress-lookup.h"

/* No owner right now (a standby is taking the address over): drop. Leaving by the node's normal path would
 * reach the destination with the pod's own address, and its reply (a RST for TCP) would kill the very
 * connection the takeover is about to save; a dropped segment is simply retransmitted.
 * From the gateway lookup on the packet belongs to an Egress: leaving unencapsulated would send it out with
 * the wrong source address, so every failure drops it. */

static __always_inline int egress_steer4(struct __sk_buff *skb, const struct iphdr *ip, struct egress_config *cfg,
					 struct egress_stats *st)
{
	struct egress_client *client;
	struct egress_gateways *gw;
	struct egress_flow_key fk;
	struct egress_flow *pin, fresh = {};
	struct egress_slot slot;
	__u32 id, hash;
	int picked;

	client = bpf_map_lookup_elem(&egress_clients, &ip->saddr);
	if (!client) {
		st->not_client++;
		return TC_ACT_OK;
	}
	id = egress_classify4(client, ip->daddr);
	if (!id) {
		st->bypassed++;
		return TC_ACT_OK;
	}
	gw = bpf_map_lookup_elem(&egress_gateways, &id);
	if (!gw || gw->count == 0) {
		st->no_gateway++;
		return TC_ACT_SHOT;
	}

	hash = fou_flow_hash(skb);
	egress_flow_key4(skb, ip, id, &fk);
	pin = bpf_map_lookup_elem(&egress_flows, &fk);
	picked = egress_pick_slot(gw, hash, pin ? pin->floating : 0, &slot);
	if (picked == EGRESS_PICK_NONE) {
		/* requireZone with no address in this node's zone: dropped, never sent elsewhere. */
		st->excluded++;
		return TC_ACT_SHOT;
	}
	if (picked < 0 || !cfg->saddr || !cfg->dport || !slot.gateway) {
		st->errors++;
		return TC_ACT_SHOT;
	}
	if (picked == EGRESS_PICK_NEW) {
		/* A new flow, or one whose address was removed (it fails over to a new source address, which
		 * the destination answers with a reset: a clean failure rather than a hang). */
		fresh.floating = slot.floating;
		bpf_map_update_elem(&egress_flows, &fk, &fresh, BPF_ANY);
		if (pin)
			st->repinned++;
		else
			st->pinned++;
	}
	/* The outer IP ID carries the low 16 bits of the floating address (network order: its last two bytes),
	 * so a gateway holding several addresses SNATs the flow's first packet to the one it is pinned to. */
	if (fou_encap4_id(skb, ip, cfg->saddr, slot.gateway, cfg->dport, fou_sport_of(hash), (__be16)(slot.floating >> 16))) {
		st->errors++;
		return TC_ACT_SHOT;
	}
	st->steered++;
	st->steered_bytes += bpf_ntohs(ip->tot_len);
	egress_count_addr(slot.floating, bpf_ntohs(ip->tot_len), picked == EGRESS_PICK_NEW);
	return TC_ACT_OK;
}

/* True when a is an IPv4-mapped IPv6 address (::ffff:a.b.c.d): an egress_slot66 gateway reached in outer IPv4. */
static __always_inline int in6_is_v4mapped(const struct in6_addr *a)
{
	const __u32 *w = a->in6_u.u6_addr32;

	return w[0] == 0 && w[1] == 0 && w[2] == bpf_htonl(0xffff);
}

/* egress_steer6 for an Egress in egress_gateways66 (a gateway without IPv4): the slot's gateway is an IPv6
 * address, reached in outer IPv6 + UDP from the node's IPv6 address (egress_cfg6), the floating address's
 * low 16 bits in the outer flow label's low 16 bits (its top 4 bits from the flow hash, for ECMP); or an
 * IPv4-mapped one, reached in outer IPv4 as egress_steer6 does. */
static __always_inline int egress_steer66(struct __sk_buff *skb, const struct ipv6hdr *ip6, struct egress_config *cfg,
					  struct egress_stats *st, const struct egress_gateways66 *gw, __u32 id)
{
	struct egress_config6 *cfg6;
	struct egress_flow6_key fk;
	struct egress_flow6 *pin, fresh = {};
	struct egress_slot66 slot;
	struct fou6_hdr h;
	__u32 hash, key = 0, len = bpf_ntohs(ip6->payload_len) + sizeof(*ip6);
	int picked, err;

	cfg6 = bpf_map_lookup_elem(&egress_cfg6, &key);
	if (!cfg6)
		return TC_ACT_OK;
	hash = fou_flow_hash(skb);
	egress_flow_key6(skb, ip6, id, &fk);
	pin = bpf_map_lookup_elem(&egress_flows6, &fk);
	picked = egress_pick_slot66(gw, hash, pin ? &pin->floating : 0, &slot);
	if (picked == EGRESS_PICK_NONE) {
		st->excluded++;
		return TC_ACT_SHOT;
	}
	if (picked < 0 || in6_is_zero(&slot.gateway) || in6_is_zero(&slot.floating)) {
		st->errors++;
		return TC_ACT_SHOT;
	}
	if (in6_is_v4mapped(&slot.gateway)) {
		if (!cfg->saddr || !cfg->dport) {
			st->errors++;
			return TC_ACT_SHOT;
		}
	} else if (in6_is_zero(&cfg6->saddr) || !cfg6->dport) {
		st->errors++;
		return TC_ACT_SHOT;
	}
	if (picked == EGRESS_PICK_NEW) {
		__builtin_memcpy(&fresh.floating, &slot.floating, sizeof(fresh.floating));
		bpf_map_update_elem(&egress_flows6, &fk, &fresh, BPF_ANY);
		if (pin)
			st->repinned++;
		else
			st->pinned++;
	}
	if (in6_is_v4mapped(&slot.gateway))
		err = fou_encap6_id(skb, ip6, cfg->saddr, slot.gateway.in6_u.u6_addr32[3], cfg->dport, fou_sport_of(hash),
				    slot.floating.in6_u.u6_addr16[7]);
	else
		err = fou6_encap6_label(skb, ip6, &cfg6->saddr, &slot.gateway, cfg6->dport, fou_sport_of(hash),
					(hash & 0xf0000) | bpf_ntohs(slot.floating.in6_u.u6_addr16[7]), &h);
	if (err) {
		st->errors++;
		return TC_ACT_SHOT;
	}
	st->steered++;
	st->steered_bytes += len;
	egress_count_addr6(&slot.floating, len, picked == EGRESS_PICK_NEW);
	return TC_ACT_OK;
}

/* egress_steer4 for IPv6, over the IPv6 maps; the outer packet is the same IPv4 + UDP (or, for an Egress with
 * a gateway without IPv4, what egress_steer66 sends). */
static __always_inline int egress_steer6(struct __sk_buff *skb, const struct ipv6hdr *ip6, struct egress_config *cfg,
					 struct egress_stats *st)
{
	struct egress_client *client;
	struct egress_gateways66 *gw66;
	struct egress_gateways6 *gw;
	struct egress_flow6_key fk;
	struct egress_flow6 *pin, fresh = {};
	struct egress_slot6 slot;
	__u32 id, hash, len = bpf_ntohs(ip6->payload_len) + sizeof(*ip6);
	int picked;

	client = bpf_map_lookup_elem(&egress_clients6, &ip6->saddr);
	if (!client) {
		st->not_client++;
		return TC_ACT_OK;
	}
	id = ipv6_link_scope(&ip6->daddr) ? 0 : egress_classify6(client, &ip6->daddr);
	if (!id) {
		st->bypassed++;
		return TC_ACT_OK;
	}
	gw66 = bpf_map_lookup_elem(&egress_gateways66, &id);
	if (gw66 && gw66->count)
		return egress_steer66(skb, ip6, cfg, st, gw66, id);
	gw = bpf_map_lookup_elem(&egress_gateways6, &id);
	if (!gw || gw->count == 0) {
		st->no_gateway++;
		return TC_ACT_SHOT;
	}

	hash = fou_flow_hash(skb);
	egress_flow_key6(skb, ip6, id, &fk);
	pin = bpf_map_lookup_elem(&egress_flows6, &fk);
	picked = egress_pick_slot6(gw, hash, pin ? &pin->floating : 0, &slot);
	if (picked == EGRESS_PICK_NONE) {
		st->excluded++;
		return TC_ACT_SHOT;
	}
	if (picked < 0 || !cfg->saddr || !cfg->dport || !slot.gateway || in6_is_zero(&slot.floating)) {
		st->errors++;
		return TC_ACT_SHOT;
	}
	if (picked == EGRESS_PICK_NEW) {
		__builtin_memcpy(&fresh.floating, &slot.floating, sizeof(fresh.floating));
		bpf_map_update_elem(&egress_flows6, &fk, &fresh, BPF_ANY);
		if (pin)
			st->repinned++;
		else
			st->pinned++;
	}
	/* As for IPv4, the outer IP ID is the floating address's last two bytes. */
	if (fou_encap6_id(skb, ip6, cfg->saddr, slot.gateway, cfg->dport, fou_sport_of(hash), slot.floating.in6_u.u6_addr16[7])) {
		st->errors++;
		return TC_ACT_SHOT;
	}
	st->steered++;
	st->steered_bytes += len;
	egress_count_addr6(&slot.floating, len, picked == EGRESS_PICK_NEW);
	return TC_ACT_OK;
}

SEC("tc")
int egress_steer(struct __sk_buff *skb)
{
	struct egress_config *cfg;
	struct egress_stats *st;
	struct ipv6hdr ip6;
	struct iphdr ip;
	__u32 key = 0;
	int is4, v6 = -1;

	/* ARP and IPv4 with options are not steered (yet) and not counted. */
	is4 = parse_ipv4(skb, &ip) == 0;
	if (!is4 && (v6 = parse_ipv6(skb, &ip6)) == -1)
		return TC_ACT_OK;
	/* Array lookups of key 0 cannot fail, but the verifier insists on the NULL check. */
	st = bpf_map_lookup_elem(&egress_stats, &key);
	cfg = bpf_map_lookup_elem(&egress_cfg, &key);
	if (!st || !cfg)
		return TC_ACT_OK;
	/* IPv6 by its ethertype but too short for the header: the stack would drop it too; dropped here, and
	 * counted, rather than passed on unexamined from a pod that may be a client. */
	if (!is4 && v6 < 0) {
		st->errors++;
		return TC_ACT_SHOT;
	}
	/* Either way the packet continues into the node's stack: the outer destination routes to the gateway
	 * pod, here or on another node. */
	return is4 ? egress_steer4(skb, &ip, cfg, st) : egress_steer6(skb, &ip6, cfg, st);
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
