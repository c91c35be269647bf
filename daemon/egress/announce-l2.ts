// L2 announcement of a floating address: the owner's node answers ARP for it on its uplink (a proxy
// neighbour entry) and sends gratuitous ARP so the segment's router moves its ARP entry at once instead
// of waiting for it to age out. Withdrawal removes the proxy entry (the next owner's GARP does the rest).
import { NetlinkHandle, isNetlinkError } from '../netlink';
import { ipToBytes, macToBytes } from '../../lib/ip';
import { close, sendto, socket, SOCK_CLOEXEC, SOCK_RAW } from '../sys/libc';
import { inNetns, writeNetSysctl } from '../sys/netns';
import { log } from '../../lib/log';

const AF_PACKET = 17;
const ETH_P_ARP = 0x0806;
const ARPHRD_ETHER = 1;
/** GARP is repeated: a router that was busy or lost the first frame still learns within a second. */
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
  const hs = holders.get(keyOf(t)) ?? new Set<string>();
  hs.add(t.holder ?? '');
  holders.set(keyOf(t), hs);
  cancelRepeats(t);
  // The kernel delays proxy ARP answers by a random time up to proxy_delay (0.8 s by default): a router
  // that asks during a failover would wait that long, so answer at once.
  writeNetSysctl(t.netns ?? null, `net/ipv4/neigh/${t.ifName}/proxy_delay`, '0');
  NetlinkHandle.with(t.netns, (h) => {
    const link = h.requireLink(t.ifName);
    h.replaceNeighbour({ address: t.address, index: link.index, proxy: true });
    if (!link.mac) throw new Error(`${t.ifName} has no MAC address: cannot send gratuitous ARP`);
    const mac = link.mac;
    for (const delay of REPEAT_MS) {
      const send = () => {
        try {
          sendGratuitousArp(t.netns, link.index, mac, t.address);
        } catch (e) {
          log().warn('gratuitous ARP failed', { address: t.address, ifName: t.ifName, error: (e as Error).message });
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
  log().info('floating address announced (proxy ARP + gratuitous ARP)', { address: t.address, ifName: t.ifName });
}

/** Stops answering ARP for the address, unless another local holder still announces it. Idempotent. */
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

/** Whether this node currently answers ARP for the address on ifName. */
export function isAnnouncedL2(t: L2Target): boolean {
  return NetlinkHandle.with(t.netns, (h) => {
    const link = h.getLink(t.ifName);
    return !!link && h.listNeighbours({ family: 4, proxy: true }).some((n) => n.address === t.address && n.index === link.index);
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
    close(fd);
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

function htons(v: number): number {
  return ((v & 0xff) << 8) | ((v >> 8) & 0xff);
}
