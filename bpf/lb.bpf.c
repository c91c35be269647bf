/* lb.bpf.c (tc ingress of an LB pod's interface): the stateful L4 load balancer. A packet for a VIP port
 * is sent to its client's target: the mapping (installed from the store, or chosen here before) when it
 * names a live target, else a pick from the VIP's Maglev table, which is recorded and reported on the ring
 * buffer for tetherd to publish. The packet leaves FoU-encapsulated to the target pod, back out the
 * interface it came in by; the target answers the client directly (DSR). An ICMP error about a VIP flow
 * (a reply the target sent) goes to the target holding that flow, found on the reversed inner tuple. */
#include "common.h"
#include "parse.h"
#include "fou.h"
#include "lb-maps.h"

#define IPPROTO_TCP_ 6
#define IPPROTO_ICMP_ 1
#define ICMP_DEST_UNREACH_ 3
#define ICMP_TIME_EXCEEDED_ 11
/* A mapping's last-use time is rewritten at most this often: a write per packet would bounce the
 * entry's cache line between CPUs for nothing (idle timeouts are seconds or more). */
#define LB_TOUCH_NS 1000000000ull

/* murmur3's finaliser over a few words: the same on every node for the same seed, unlike the kernel's
 * per-boot flow hash, so LB pods on different nodes pick the same target for the same client. */
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
static __always_inline void lb_key(struct lb_map_key *k, const struct lb_service *svc, __be32 vip, __be32 client,
				   __be16 vport, __be16 cport, __u8 proto)
{
	__builtin_memset(k, 0, sizeof(*k));
	k->vip = vip;
	k->client = client;
	if (svc->flags & LB_F_PER_FLOW) {
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

/* Encapsulates to target and sends the packet back out the interface it arrived on. */
static __always_inline int lb_forward(struct __sk_buff *skb, const struct iphdr *ip, const struct lb_config *cfg,
				      struct lb_stats *st, __be32 target, __u32 hash)
{
	if (fou_encap4_sport(skb, ip, cfg->saddr, target, cfg->dport, fou_sport_of(hash)) || fou_swap_macs(skb)) {
		st->drop_error++;
		return TC_ACT_SHOT;
	}
	return bpf_redirect(skb->ifindex, 0);
}

/* An ICMP error whose quoted packet is a reply from a VIP: forward it to the target holding the flow. */
static __always_inline int lb_icmp(struct __sk_buff *skb, const struct iphdr *ip, const struct lb_config *cfg)
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
	lb_key(&k, svc, inner.saddr, inner.daddr, ports[0], ports[1], inner.protocol);
	target = lb_mapped(&k);
	if (!target) {
		st->drop_icmp_no_flow++;
		return TC_ACT_SHOT;
	}
	st->icmp_forwarded++;
	return lb_forward(skb, ip, cfg, st, target, lb_hash(&k, cfg->seed));
}

SEC("tc")
int lb_ingress(struct __sk_buff *skb)
{
	struct lb_service_key sk = {};
	struct lb_service *svc;
	struct lb_config *cfg;
	struct lb_stats *st;
	struct lb_map_key k;
	struct iphdr ip;
	__be16 ports[2];
	__be32 target;
	__u32 key0 = 0, hash, idx;

	if (parse_ipv4(skb, &ip))
		return TC_ACT_OK;
	cfg = bpf_map_lookup_elem(&lb_cfg, &key0);
	if (!cfg || !cfg->saddr || !cfg->dport || !cfg->maglev_size)
		return TC_ACT_OK; /* not configured yet: the pod's own stack sees everything */
	if (ip.protocol == IPPROTO_ICMP_)
		return lb_icmp(skb, &ip, cfg);
	if (ip.protocol != IPPROTO_TCP_ && ip.protocol != IPPROTO_UDP_)
		return TC_ACT_OK;

	sk.vip = ip.daddr;
	sk.proto = ip.protocol;
	if (ip.frag_off & bpf_htons(0x1fff)) {
		/* No ports in a later fragment to look the flow up by: refused when the VIP is ours (the
		 * VIP's port-0 entry says so), the pod's own traffic otherwise. */
		sk.proto = 0;
		svc = bpf_map_lookup_elem(&lb_services, &sk);
		if (svc && (st = lb_stats_of(svc->slot)))
			st->drop_fragment++;
		return svc ? TC_ACT_SHOT : TC_ACT_OK;
	}
	if (bpf_skb_load_bytes(skb, ETH_HLEN + sizeof(ip), ports, sizeof(ports)))
		return TC_ACT_OK;
	sk.port = ports[1];
	svc = bpf_map_lookup_elem(&lb_services, &sk);
	if (!svc) {
		/* A VIP's other ports are refused here: nothing behind this pod serves them. Any other
		 * destination is the pod's own traffic. */
		sk.port = 0;
		sk.proto = 0;
		svc = bpf_map_lookup_elem(&lb_services, &sk);
		if (svc && (st = lb_stats_of(svc->slot)))
			st->drop_no_port++;
		return svc ? TC_ACT_SHOT : TC_ACT_OK;
	}
	st = lb_stats_of(svc->slot);
	if (!st)
		return TC_ACT_SHOT;

	lb_key(&k, svc, ip.daddr, ip.saddr, ports[1], ports[0], ip.protocol);
	hash = lb_hash(&k, cfg->seed);
	target = lb_mapped(&k);
	if (!target) {
		struct lb_mapping m = {};
		struct lb_event *ev;
		__be32 *t;

		idx = svc->slot * cfg->maglev_size + hash % cfg->maglev_size;
		t = bpf_map_lookup_elem(&lb_maglev, &idx);
		if (!t || !*t) {
			st->drop_no_target++;
			return TC_ACT_SHOT;
		}
		target = *t;
		m.target = target;
		m.last_ns = bpf_ktime_get_ns();
		bpf_map_update_elem(&lb_mappings, &k, &m, BPF_ANY);
		st->misses++;
		ev = bpf_ringbuf_reserve(&lb_events, sizeof(*ev), 0);
		if (ev) {
			ev->key = k;
			ev->target = target;
			ev->kind = LB_EV_NEW;
			bpf_ringbuf_submit(ev, 0);
		} else {
			st->report_lost++;
		}
	}
	st->packets++;
	st->bytes += bpf_ntohs(ip.tot_len);
	/* Per flow for the outer port even with client affinity: ECMP and RSS then spread a client's flows. */
	if (!(svc->flags & LB_F_PER_FLOW)) {
		struct lb_map_key fk;

		lb_key(&fk, &(struct lb_service){ .flags = LB_F_PER_FLOW }, ip.daddr, ip.saddr, ports[1], ports[0], ip.protocol);
		hash = lb_hash(&fk, cfg->seed);
	}
	return lb_forward(skb, &ip, cfg, st, target, hash);
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
