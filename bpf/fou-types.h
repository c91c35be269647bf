/* fou-types.h: structs and constants shared with user space (TS mirrors in daemon/bpf/fou-structs.ts). */
#ifndef TETHER_FOU_TYPES_H
#define TETHER_FOU_TYPES_H

/* Outer IPv4 (20, no options) + UDP (8): what FoU adds in front of the inner IPv4 packet. */
#define FOU_OVERHEAD 28

/* Outer IPv6 (40, no extension headers) + UDP (8): what FoU adds in front of an inner IPv6 packet when the
 * underlay between the two ends is IPv6 too (an IPv6 VIP's targets are IPv6 endpoints). */
#define FOU6_OVERHEAD 48

#ifndef FOU_TTL
#define FOU_TTL 64
#endif

/* Outer UDP source ports come from this range, like the kernel's udp_flow_src_port(). */
#ifndef FOU_SPORT_MIN
#define FOU_SPORT_MIN 49152
#endif
#ifndef FOU_SPORT_MAX
#define FOU_SPORT_MAX 65535
#endif

/* fou_encap_config.flags: after encapsulating at ingress, swap MACs and send back out the same device
 * (the LB pod's arrangement: packets arrive from the gateway and leave towards it again). */
#define FOU_ENCAP_F_REDIRECT_BACK 0x1
/* fou_decap_config.flags: the fou_sources allow-list is in force. User space sets this while the map is
 * non-empty because BPF cannot ask a hash map for its element count. */
#define FOU_DECAP_F_CHECK_SOURCES 0x1
/* fou_decap_config6.flags: the outer flow label's low 16 bits name the flow's floating address (egress
 * steering to a gateway pod in outer IPv6): the unwrapped packet is marked FOU_FLOAT_MARK | bits. Only an
 * egress gateway's decap sets it: the load balancer puts a flow hash in the label, which means nothing. */
#define FOU_DECAP_F_LABEL_MARK 0x2

/* All addresses and ports are in network byte order, as they sit in the packet. */

/* Encap settings, one entry. Must match daemon/bpf/fou-structs.ts FouEncapConfig. */
struct fou_encap_config {
	__be32 saddr;  /* outer source address */
	__be16 dport;  /* default outer UDP destination port */
	__u16 flags;   /* FOU_ENCAP_F_* */
};

/* Where packets for one inner destination go. Must match daemon/bpf/fou-structs.ts FouDest. */
struct fou_dest {
	__be32 daddr;  /* outer destination (the real backend address) */
	__be16 dport;  /* outer UDP port; 0 = fou_encap_config.dport */
	__u16 pad;
};

/* Decap settings, one entry. Must match daemon/bpf/fou-structs.ts FouDecapConfig. */
struct fou_decap_config {
	__be32 daddr;  /* accepted outer destination; 0 = any address on this interface */
	__be16 dport;  /* FoU UDP port; 0 = decap disabled */
	__u16 flags;   /* FOU_DECAP_F_* */
};

/* Decap settings for outer IPv6, one entry (a map of its own: fou_decap_config keeps its pinned layout).
 * Must match daemon/bpf/fou-structs.ts FouDecapConfig6. */
struct fou_decap_config6 {
	struct in6_addr daddr; /* accepted outer destination; :: = any address on this interface */
	__be16 dport;          /* FoU UDP port; 0 = outer IPv6 decap disabled */
	__u16 flags;           /* FOU_DECAP_F_*: CHECK_SOURCES enforces fou_sources6 */
};

/* Per-CPU counters of one program. Must match daemon/bpf/fou-structs.ts FouStats. */
struct fou_stats {
	__u64 packets;         /* encapsulated / decapsulated */
	__u64 bytes;           /* inner bytes of those packets */
	__u64 rejected_source; /* decap: outer source not in the allow-list */
	__u64 rejected_dest;   /* decap: outer destination not ours */
	__u64 errors;          /* malformed packets and failed helper calls */
};

#endif
