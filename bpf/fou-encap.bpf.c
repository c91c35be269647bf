/* fou-encap.bpf.c (tc, ingress or egress): encapsulates IPv4 packets whose destination is in fou_dests
 * in FoU towards the listed backend. On an LB pod it runs at ingress and sends packets back out. */
#include "common.h"
#include "parse.h"
#include "fou.h"
#include "fou-encap-maps.h"

SEC("tc")
int fou_encap(struct __sk_buff *skb)
{
	struct fou_encap_config *cfg;
	struct fou_stats *st;
	struct fou_dest *dest;
	struct iphdr ip;
	__u32 key = 0;

	if (parse_ipv4(skb, &ip))
		return TC_ACT_OK;
	dest = bpf_map_lookup_elem(&fou_dests, &ip.daddr);
	if (!dest)
		return TC_ACT_OK;
	/* Array lookups of key 0 cannot fail, but the verifier insists on the NULL check. */
	cfg = bpf_map_lookup_elem(&fou_encap_cfg, &key);
	st = bpf_map_lookup_elem(&fou_encap_stats, &key);
	if (!cfg || !st)
		return TC_ACT_OK;

	/* Dropping is right both when unconfigured and when encapsulation fails half-way: an inner packet
	 * for a VIP has nowhere else to go, and a half-written one is garbage. */
	if (!cfg->saddr || !(dest->dport | cfg->dport) ||
	    fou_encap4(skb, &ip, cfg->saddr, dest->daddr, dest->dport ? dest->dport : cfg->dport)) {
		st->errors++;
		return TC_ACT_SHOT;
	}
	st->packets++;
	st->bytes += bpf_ntohs(ip.tot_len);

	if (cfg->flags & FOU_ENCAP_F_REDIRECT_BACK) {
		if (fou_swap_macs(skb)) {
			st->errors++;
			return TC_ACT_SHOT;
		}
		return bpf_redirect(skb->ifindex, 0);
	}
	return TC_ACT_OK;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
