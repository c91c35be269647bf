/* common.h: kernel types (generated vmlinux.h), libbpf helpers and the uapi constants BTF cannot carry. */
#ifndef TETHER_COMMON_H
#define TETHER_COMMON_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

/* #defines from uapi headers do not survive into BTF, so vmlinux.h lacks them. */
#ifndef ETH_P_IP
#define ETH_P_IP 0x0800
#endif
#ifndef ETH_P_IPV6
#define ETH_P_IPV6 0x86DD
#endif
#ifndef ETH_HLEN
#define ETH_HLEN 14
#endif
#ifndef ETH_ALEN
#define ETH_ALEN 6
#endif
#define IPPROTO_TCP_ 6 /* IPPROTO_* are enums in vmlinux.h; macros keep switch/if code uniform */
#define IPPROTO_UDP_ 17
#define IPPROTO_ICMPV6_ 58
#define IP_DF 0x4000

#define PACKET_HOST_ 0 /* skb->pkt_type of a frame addressed to this host (PACKET_HOST is an enum in vmlinux.h) */
#define TC_ACT_OK 0
#define TC_ACT_SHOT 2
#define TC_ACT_REDIRECT 7

#endif
