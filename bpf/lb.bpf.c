/* lb.bpf.c: the stateful L4 load balancer. One object with two attach points over one set of maps (so
 * both see every mapping, target and counter; tetherd's --lb-datapath picks where VIP traffic is handled):
 *  - lb_node, tc ingress of the node's uplink (--lb-datapath=node): a VIP packet is handled where it
 *    arrives and leaves encapsulated straight for its target (FIB lookup, redirect), never entering an LB
 *    pod; what it does not handle (other protocols, local senders on other interfaces) takes the pod path;
 *  - lb_ingress, tc ingress of an LB pod's interface (--lb-datapath=pod, and traffic from this node's own
 *    pods in either mode): the packet leaves encapsulated back out the interface it came in by.
 * A packet for a VIP port is sent to its client's target: the mapping (installed from the store, or chosen
 * here before) when it names a live target, else a pick from the VIP's Maglev table, recorded and reported
 * on the ring buffer for tetherd to publish. The target answers the client directly (DSR). An ICMP error
 * about a VIP flow (a reply the target sent) goes to the target holding that flow, found on the reversed
 * inner tuple. Bad input is dropped and counted per VIP: a bad or inconsistent IPv4 header, IP options,
 * later fragments whose first fragment was not seen; a packet over the path MTU once encapsulated is
 * answered with ICMP frag-needed (node path). Only frames addressed to this host (PACKET_HOST) are
 * balanced; a VIP frame flooded to the node or seen by a promiscuous uplink passes to the stack, which drops it.
 * IPv6 VIPs take the same path in lb6.h, over maps of their own and FoU in outer IPv6 to IPv6 targets. */
#include "common.h"
#include "fou.h"
#include "lb-core.h"
#include "lb-forward.h"
#include "lb6.h"

#define ICMP_TIME_EXCEEDED_ 11

/* An ICMP error whose quoted packet is a reply from a VIP: forward it to the target holding the flow. */
static __always_inline int lb_icmp(struct __sk_buff *skb, const struct iphdr *ip, const struct lb_config *cfg, const bool node)
{
	struct { __u8 type, code; __u16 csum; __u32 rest; } icmp;
	struct lb_service_key sk = {};
	struct lb_service *svc;
	struct lb_stats *st;
	struct lb_map_key k;
	struct iphdr inner;
	__be16 ports[2];
	__be32 target;
	int off = ETH_HLEN + sizeof(*ip);

	if (bpf_skb_load_bytes(skb, off, &icmp, sizeof(icmp)) ||
	    (icmp.type != ICMP_DEST_UNREACH_ && icmp.type != ICMP_TIME_EXCEEDED_))
		return TC_ACT_OK;
	off += sizeof(icmp);
	if (bpf_skb_load_bytes(skb, off, &inner, sizeof(inner)) || inner.ihl != 5 ||
	    bpf_skb_load_bytes(skb, off + sizeof(inner), ports, sizeof(ports)))
		return TC_ACT_OK;
	/* The quoted packet went VIP:port -> client:cport; the flow is client:cport -> VIP:port. */
	sk.vip = inner.saddr;
	sk.port = ports[0];
	sk.proto = inner.protocol;
	svc = bpf_map_lookup_elem(&lb_services, &sk);
	if (!svc)
		return TC_ACT_OK;
	st = lb_stats_of(svc->slot);
	if (!st)
		return TC_ACT_OK;
	lb_key(&k, svc->flags, inner.saddr, inner.daddr, ports[0], ports[1], inner.protocol);
	target = lb_mapped(&k);
	if (!target) {
		st->drop_icmp_no_flow++;
		return TC_ACT_SHOT;
	}
	return lb_forward(skb, ip, cfg, st, target, lb_hash(&k, cfg->seed), LB_FWD_ICMP, node);
}

/* A later fragment (offset > 0) of a datagram to a VIP: no ports to look up, so it follows its first
 * fragment (the target reassembles). One seen before its first fragment is dropped: the sender's
 * retransmission, if any, comes in order again. */
static __always_inline int lb_fragment(struct __sk_buff *skb, const struct iphdr *ip, const struct lb_config *cfg,
				       struct lb_stats *st, const bool node)
{
	struct lb_frag *f = lb_frag_lookup(ip);
	__be32 target;
	__u32 hash;

	if (!f) {
		st->drop_fragment++;
		return TC_ACT_SHOT;
	}
	target = f->target;
	hash = f->hash;
	st->fragments++;
	return lb_forward(skb, ip, cfg, st, target, hash, LB_FWD_DATA, node);
}

static __always_inline int lb_process(struct __sk_buff *skb, const bool node)
{
	struct lb_service_key sk = {};
	struct lb_service *svc;
	struct lb_config *cfg;
	struct lb_stats *st;
	struct lb_map_key k;
	struct iphdr ip;
	__be16 ports[2];
	__be32 target;
	__u32 key0 = 0, hash, len;

	if (skb->protocol != bpf_htons(ETH_P_IP) || bpf_skb_load_bytes(skb, ETH_HLEN, &ip, sizeof(ip)))
		return TC_ACT_OK;
	cfg = bpf_map_lookup_elem(&lb_cfg, &key0);
	if (!cfg || !cfg->saddr || !cfg->dport || !cfg->maglev_size)
		return TC_ACT_OK; /* not configured yet: everything takes the stack's path */

	/* The VIP's own entry (port 0, protocol 0) says whether the destination is a VIP served here: any
	 * other packet is the node's (or the pod's) own traffic and passes after this one lookup. */
	sk.vip = ip.daddr;
	svc = bpf_map_lookup_elem(&lb_services, &sk);
	if (!svc)
		return TC_ACT_OK;
	/* Only frames addressed to this host are balanced. A bridge that forgot the node's MAC floods the frame
	 * to every port, and a promiscuous uplink sees frames for other hosts: the stack drops those
	 * (ip_rcv, PACKET_OTHERHOST), and so must this, or every LB node on the segment (a drained one
	 * too) forwards the same frame. They pass untouched, counted. */
	if (skb->pkt_type != PACKET_HOST_) {
		struct lb_node_stats *ns = bpf_map_lookup_elem(&lb_node_stats, &key0);

		if (ns)
			ns->not_for_host++;
		return TC_ACT_OK;
	}
	st = lb_stats_of(svc->slot);
	if (!st)
		return TC_ACT_SHOT;
	/* This runs before the stack's own checks (ip_rcv), so it makes them: what the kernel would refuse is
	 * not forwarded. Options are refused too: no client of a VIP needs them, and the ports would sit at a
	 * variable offset. The transport checksum is the target's to check (its stack does, after decap). */
	len = bpf_ntohs(ip.tot_len);
	if (ip.version != 4 || ip.ihl < 5 || len < ip.ihl * 4u || len + ETH_HLEN > skb->len) {
		st->drop_bad_header++;
		return TC_ACT_SHOT;
	}
	if (ip.ihl != 5) {
		st->drop_ip_options++;
		return TC_ACT_SHOT;
	}
	if (fou_ipv4_csum(&ip)) {
		st->drop_bad_header++;
		return TC_ACT_SHOT;
	}
	if (ip.protocol == IPPROTO_ICMP_)
		return lb_icmp(skb, &ip, cfg, node);
	if (ip.protocol != IPPROTO_TCP_ && ip.protocol != IPPROTO_UDP_)
		return TC_ACT_OK;
	if (ip.frag_off & bpf_htons(IP_OFFSET_))
		return lb_fragment(skb, &ip, cfg, st, node);

	if (bpf_skb_load_bytes(skb, ETH_HLEN + sizeof(ip), ports, sizeof(ports))) {
		st->drop_bad_header++;
		return TC_ACT_SHOT;
	}
	sk.port = ports[1];
	sk.proto = ip.protocol;
	svc = bpf_map_lookup_elem(&lb_services, &sk);
	if (!svc) {
		/* A VIP's other ports are refused here: nothing behind it serves them. */
		st->drop_no_port++;
		return TC_ACT_SHOT;
	}

	lb_key(&k, svc->flags, ip.daddr, ip.saddr, ports[1], ports[0], ip.protocol);
	target = lb_mapped(&k);
	/* The key's hash picks a new client's target only: a mapped client's packet needs just the per-flow one. */
	if (!target)
		target = lb_pick(&k, svc, cfg, st, lb_hash(&k, cfg->seed));
	if (!target)
		return TC_ACT_SHOT;
	/* Per flow for the outer port even with client affinity: ECMP and RSS then spread a client's flows. */
	if (!(svc->flags & LB_F_PER_FLOW))
		lb_key(&k, LB_F_PER_FLOW, ip.daddr, ip.saddr, ports[1], ports[0], ip.protocol);
	hash = lb_hash(&k, cfg->seed);
	if (ip.frag_off & bpf_htons(IP_MF_))
		lb_frag_remember(&ip, target, hash);
	return lb_forward(skb, &ip, cfg, st, target, hash, LB_FWD_DATA, node);
}

/* Each family's path is a function of its own (a BPF-to-BPF call from the program), so the verifier's
 * 512-byte limit on the stack of a call chain counts one family's frame, never both (the IPv6 path keeps
 * most of its working memory in lb_scratch6 even so). One function per attach point and family, so the pod
 * program keeps none of the node program's helpers (lb.ts: nodeProgram). */
static __noinline int lb_pod4(struct __sk_buff *skb)
{
	return lb_process(skb, false);
}

static __noinline int lb_node4(struct __sk_buff *skb)
{
	return lb_process(skb, true);
}

static __noinline int lb_pod6(struct __sk_buff *skb)
{
	return lb_process6(skb, false);
}

static __noinline int lb_node6(struct __sk_buff *skb)
{
	return lb_process6(skb, true);
}

SEC("tc")
int lb_ingress(struct __sk_buff *skb)
{
	if (skb->protocol == bpf_htons(ETH_P_IPV6))
		return lb_pod6(skb);
	return lb_pod4(skb);
}

SEC("tc")
int lb_node(struct __sk_buff *skb)
{
	if (skb->protocol == bpf_htons(ETH_P_IPV6))
		return lb_node6(skb);
	return lb_node4(skb);
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
