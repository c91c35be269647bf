// L2 announcement of a floating address: the owner's node answers ARP (IPv4) or neighbour solicitations
// (IPv6, proxy NDP) for it on its uplink (a proxy neighbour entry) and sends gratuitous ARP or unsolicited
// Neighbor Advertisements so the segment's router moves its neighbour entry at once instead of waiting
// for it to age out. Withdrawal removes the proxy entry (the next owner's announcement does the rest).
import { NetlinkHandle, isNetlinkError } from '../netlink';
import { RT_SCOPE } from '../netlink/constants';
import { canonicalIp, ipFamily, ipToBytes, macToBytes } from '../../lib/ip';
import { closeInBackground, sendto, socket, SOCK_CLOEXEC, SOCK_RAW } from '../sys/libc';
import { inNetns, readNetSysctl, writeNetSysctl } from '../sys/netns';
import { log } from '../../lib/log';

const AF_PACKET = 17;
const ETH_P_ARP = 0x0806;
const ETH_P_IPV6 = 0x86dd;
const ARPHRD_ETHER = 1;
const IPPROTO_ICMPV6 = 58;
const ND_NEIGHBOR_ADVERT = 136;
const ND_OPT_TARGET_LL_ADDR = 2;
/** ff02::1, all nodes on the link, and its Ethernet multicast address (33:33 + its low 32 bits). */
const ALL_NODES = ipToBytes('ff02::1');
const ALL_NODES_MAC = Buffer.from([0x33, 0x33, 0, 0, 0, 1]);
/** GARP (and unsolicited NA) is repeated: a router that was busy or lost the first frame still learns within a second. */
const REPEAT_MS = [0, 200, 1000];

export interface L2Target {
  /** Namespace of the node (undefined: tetherd's own). */
  netns?: string;
  /** The node's uplink on the L2 segment, e.g. eth0. */
  ifName: string;
  address: string;
  /**
   * Who announces (the gateway pod). Two gateway pods of one node can hand an address to each other:
   * the node keeps answering until the last local holder withdraws.
   */
  holder?: string;
}

/** Local holders per announcement (namespace, link, address). */
const holders = new Map<string, Set<string>>();

/** Repeats still scheduled per announcement, cancelled by withdrawal. */
const pending = new Map<string, NodeJS.Timeout[]>();
const keyOf = (t: L2Target) => `${t.netns ?? ''}|${t.ifName}|${t.address}`;

/**
 * Starts answering ARP for the address and announces it. Idempotent. The kernel answers for a proxy
 * entry only when the node forwards and routes the address through another link (the gateway pod's
 * veth), which is exactly the owner's setup.
 */
export function announceL2(t: L2Target): void {
  const v6 = ipFamily(t.address) === 6;
  const hs = holders.get(keyOf(t)) ?? new Set<string>();
  hs.add(t.holder ?? '');
  holders.set(keyOf(t), hs);
  cancelRepeats(t);
  if (v6) {
    // The kernel answers solicitations for a proxy entry only with proxy_ndp on and the uplink forwarding,
    // and (like proxy ARP) delays answers to multicast solicitations by up to proxy_delay: answer at once.
    writeNetSysctl(t.netns ?? null, `net/ipv6/conf/${t.ifName}/proxy_ndp`, '1');
    writeNetSysctl(t.netns ?? null, `net/ipv6/neigh/${t.ifName}/proxy_delay`, '0');
    // Forwarding is the node's setting (turning it on would make the node ignore router advertisements):
    // without it the unsolicited advertisements still move the router, but solicitations go unanswered.
    if (readNetSysctl(t.netns ?? null, `net/ipv6/conf/${t.ifName}/forwarding`) !== '1') {
      log().warn('IPv6 forwarding is off on the uplink: the node will not answer neighbour solicitations for the floating address', { address: t.address, ifName: t.ifName });
    }
  } else {
    // The kernel delays proxy ARP answers by a random time up to proxy_delay (0.8 s by default): a router
    // that asks during a failover would wait that long, so answer at once.
    writeNetSysctl(t.netns ?? null, `net/ipv4/neigh/${t.ifName}/proxy_delay`, '0');
  }
  NetlinkHandle.with(t.netns, (h) => {
    const link = h.requireLink(t.ifName);
    h.replaceNeighbour({ address: t.address, index: link.index, proxy: true });
    if (!link.mac) throw new Error(`${t.ifName} has no MAC address: cannot send ${v6 ? 'neighbor advertisements' : 'gratuitous ARP'}`);
    const mac = link.mac;
    // An advertisement's source is an address of the sending link: its link-local one (what the kernel's
    // own proxy answers use); an uplink without one sends from the floating address it speaks for.
    const source = v6 ? (h.listAddresses({ family: 6, index: link.index }).find((a) => a.scope === RT_SCOPE.LINK)?.address ?? t.address) : '';
    for (const delay of REPEAT_MS) {
      const send = () => {
        try {
          if (v6) sendNeighborAdvert(t.netns, link.index, mac, source, t.address);
          else sendGratuitousArp(t.netns, link.index, mac, t.address);
        } catch (e) {
          log().warn(v6 ? 'unsolicited neighbor advertisement failed' : 'gratuitous ARP failed', { address: t.address, ifName: t.ifName, error: (e as Error).message });
        }
      };
      if (delay === 0) send();
      else {
        const timer = setTimeout(send, delay);
        timer.unref();
        pending.set(keyOf(t), [...(pending.get(keyOf(t)) ?? []), timer]);
      }
    }
  });
  if (v6) log().info('floating address announced (proxy NDP + unsolicited neighbor advertisement)', { address: t.address, ifName: t.ifName });
  else log().info('floating address announced (proxy ARP + gratuitous ARP)', { address: t.address, ifName: t.ifName });
}

/** Stops answering ARP (NDP) for the address, unless another local holder still announces it. Idempotent. */
export function withdrawL2(t: L2Target): void {
  const hs = holders.get(keyOf(t));
  hs?.delete(t.holder ?? '');
  if (hs?.size) {
    log().info('floating address still announced for another local holder', { address: t.address, ifName: t.ifName, withdrawn: t.holder, holders: [...hs] });
    return;
  }
  holders.delete(keyOf(t));
  cancelRepeats(t);
  NetlinkHandle.with(t.netns, (h) => {
    const link = h.getLink(t.ifName);
    if (!link) return;
    try {
      h.deleteNeighbour({ address: t.address, index: link.index, proxy: true });
    } catch (e) {
      if (!isNetlinkError(e, 'ENOENT', 'ESRCH')) throw e;
    }
  });
  log().info('floating address withdrawn', { address: t.address, ifName: t.ifName });
}

function cancelRepeats(t: L2Target): void {
  for (const timer of pending.get(keyOf(t)) ?? []) clearTimeout(timer);
  pending.delete(keyOf(t));
}

/** Whether this node currently answers ARP (NDP) for the address on ifName. */
export function isAnnouncedL2(t: L2Target): boolean {
  const family = ipFamily(t.address) === 6 ? 6 : 4;
  return NetlinkHandle.with(t.netns, (h) => {
    const link = h.getLink(t.ifName);
    const address = family === 6 ? canonicalIp(t.address) : t.address;
    return !!link && h.listNeighbours({ family, proxy: true }).some((n) => n.address === address && n.index === link.index);
  });
}

/** One ARP request and one ARP reply, both with sender = target = the address (RFC 5227 announcements). */
function sendGratuitousArp(netns: string | undefined, ifindex: number, mac: string, address: string): void {
  const fd = netns ? inNetns(netns, () => socket(AF_PACKET, SOCK_RAW | SOCK_CLOEXEC, htons(ETH_P_ARP))) : socket(AF_PACKET, SOCK_RAW | SOCK_CLOEXEC, htons(ETH_P_ARP));
  try {
    const bcast = Buffer.alloc(6, 0xff);
    const addr = Buffer.alloc(20);
    addr.writeUInt16LE(AF_PACKET, 0);
    addr.writeUInt16BE(ETH_P_ARP, 2);
    addr.writeInt32LE(ifindex, 4);
    addr.writeUInt16LE(ARPHRD_ETHER, 8);
    addr.writeUInt8(6, 11);
    bcast.copy(addr, 12);
    for (const op of [1, 2]) sendto(fd, arpFrame(op, macToBytes(mac), ipToBytes(address)), addr);
  } finally {
    // A packet socket's close waits out an RCU grace period: not on the event loop (an owner takes
    // the next address's guard meanwhile).
    closeInBackground(fd);
  }
}

export function arpFrame(op: 1 | 2 | number, mac: Buffer, ip: Buffer): Buffer {
  const f = Buffer.alloc(42);
  Buffer.alloc(6, 0xff).copy(f, 0);
  mac.copy(f, 6);
  f.writeUInt16BE(ETH_P_ARP, 12);
  f.writeUInt16BE(ARPHRD_ETHER, 14);
  f.writeUInt16BE(0x0800, 16);
  f.writeUInt8(6, 18);
  f.writeUInt8(4, 19);
  f.writeUInt16BE(op, 20);
  mac.copy(f, 22);
  ip.copy(f, 28);
  // Target hardware address: zero in a request, broadcast in the reply form.
  (op === 1 ? Buffer.alloc(6) : Buffer.alloc(6, 0xff)).copy(f, 32);
  ip.copy(f, 38);
  return f;
}

/**
 * One unsolicited Neighbor Advertisement (RFC 4861 7.2.6) to all nodes, sent as a whole Ethernet frame
 * like the ARP above: it leaves on the uplink as written, whatever the node's IPv6 routing, source
 * address selection and output firewall would make of an ICMPv6 socket's message, and the frame is
 * built (and tested) without a kernel.
 */
function sendNeighborAdvert(netns: string | undefined, ifindex: number, mac: string, source: string, target: string): void {
  // Protocol 0: the socket only sends (one bound to ETH_P_IPV6 would also be handed every IPv6 frame).
  const fd = netns ? inNetns(netns, () => socket(AF_PACKET, SOCK_RAW | SOCK_CLOEXEC, 0)) : socket(AF_PACKET, SOCK_RAW | SOCK_CLOEXEC, 0);
  try {
    const addr = Buffer.alloc(20);
    addr.writeUInt16LE(AF_PACKET, 0);
    addr.writeUInt16BE(ETH_P_IPV6, 2);
    addr.writeInt32LE(ifindex, 4);
    addr.writeUInt16LE(ARPHRD_ETHER, 8);
    addr.writeUInt8(6, 11);
    ALL_NODES_MAC.copy(addr, 12);
    sendto(fd, neighborAdvertFrame(macToBytes(mac), ipToBytes(source), ipToBytes(target)), addr);
  } finally {
    // A packet socket's close waits out an RCU grace period: not on the event loop (an owner takes
    // the next address's guard meanwhile).
    closeInBackground(fd);
  }
}

/**
 * Ethernet + IPv6 + ICMPv6 Neighbor Advertisement to ff02::1: hop limit 255 (receivers drop ND with any
 * other), Override set (replace the cached link-layer address), Solicited clear (a multicast one with it
 * set is invalid) and Router clear (the floating address is a host's), with the Target Link-Layer
 * Address option.
 */
export function neighborAdvertFrame(mac: Buffer, source: Buffer, target: Buffer): Buffer {
  const f = Buffer.alloc(14 + 40 + 32);
  ALL_NODES_MAC.copy(f, 0);
  mac.copy(f, 6);
  f.writeUInt16BE(ETH_P_IPV6, 12);
  const ip = 14;
  f.writeUInt32BE(0x60000000, ip); // version 6, traffic class 0, flow label 0
  f.writeUInt16BE(32, ip + 4);
  f.writeUInt8(IPPROTO_ICMPV6, ip + 6);
  f.writeUInt8(255, ip + 7);
  source.copy(f, ip + 8);
  ALL_NODES.copy(f, ip + 24);
  const icmp = ip + 40;
  f.writeUInt8(ND_NEIGHBOR_ADVERT, icmp);
  f.writeUInt8(0x20, icmp + 4); // R 0x80, S 0x40, O 0x20
  target.copy(f, icmp + 8);
  f.writeUInt8(ND_OPT_TARGET_LL_ADDR, icmp + 24);
  f.writeUInt8(1, icmp + 25); // in units of 8 bytes
  mac.copy(f, icmp + 26);
  f.writeUInt16BE(icmpv6Checksum(source, ALL_NODES, f.subarray(icmp)), icmp + 2);
  return f;
}

/** The ICMPv6 checksum (RFC 4443 2.3): over the pseudo-header (RFC 8200 8.1) and the message, checksum field 0. */
export function icmpv6Checksum(source: Buffer, dest: Buffer, message: Buffer): number {
  const pseudo = Buffer.alloc(40);
  source.copy(pseudo, 0);
  dest.copy(pseudo, 16);
  pseudo.writeUInt32BE(message.length, 32);
  pseudo.writeUInt8(IPPROTO_ICMPV6, 39);
  let sum = 0;
  const add = (b: Buffer, skip?: number) => {
    for (let i = 0; i < b.length; i += 2) if (i !== skip) sum += (b[i] << 8) | (i + 1 < b.length ? b[i + 1] : 0);
  };
  add(pseudo);
  add(message, 2);
  while (sum > 0xffff) sum = (sum & 0xffff) + (sum >>> 16);
  return ~sum & 0xffff;
}

function htons(v: number): number {
  return ((v & 0xff) << 8) | ((v >> 8) & 0xff);
}
