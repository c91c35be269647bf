// A pod's set-up for direct server return, in one place for both callers: VIPs from the CNI config
// (pod-network.ts, on ADD) and load balancer targets (lb/targets.ts, while the pod is a target). ARP
// silence for the VIPs (sysctls), the device holding them (a dummy `tether0`, or lo where the kernel has no
// dummy), the VIPs, and for an LB target its MTU lowered by the encapsulation and the FoU decapsulation on
// its host-side veth. Every action is recorded with what it replaced, in JSON the pod record keeps, so
// removing the pod (or the pod ceasing to be a target, even after a restart) undoes exactly those actions.
// IPv6 VIPs: the VIP is added as /128 without duplicate address detection (the VIP is on every target: DAD
// would find it "duplicated", and a tentative address cannot be a source), and IPv6 needs no counterpart of
// arp_ignore: Linux answers a neighbour solicitation only for an address on the interface it arrives on
// (ndisc_recv_ns looks the target up strictly on that device), so a VIP on tether0 or lo stays silent on
// eth0 (test/kernel/dsr-target.test.ts checks it). An IPv6 VIP's packets come in FoU over outer IPv6
// (48 bytes, not 28): the pod's IPv6 MTU (net.ipv6.conf.<if>.mtu, recorded like the other sysctls) is
// lowered by the difference, so the MSS the target advertises over IPv6 leaves room for it.
import { log } from '../../lib/log';
import { NetlinkHandle, isNetlinkError } from '../netlink';
import { ipFamily } from '../../lib/ip';
import { netnsExists, readNetSysctl, writeNetSysctl, writeNetSysctls } from '../sys/netns';
import { detachFou } from '../bpf/fou';

export const VIP_LINK_NAME = 'tether0';

/** What FoU in outer IPv6 (an IPv6 VIP's) costs beyond FoU in outer IPv4: 48 − 28 bytes. */
export const FOU6_EXTRA_OVERHEAD = 20;
/** IPv6's minimum link MTU (RFC 8200 5). */
const IPV6_MIN_MTU = 1280;

/** What a DSR set-up changed, in order (plain JSON: persisted in the pod record). */
export interface DsrApplied {
  sysctls: Array<{ key: string; previous: string; value: string }>;
  /** Dummy link created for the VIPs (absent when they sit on lo, or on a link someone else created). */
  vipLink?: { name: string; mac?: string };
  /** lo was down and was brought up to hold the VIPs. */
  loBroughtUp?: boolean;
  vips: Array<{ address: string; prefixLen: number; dev: string }>;
}

type Who = Record<string, unknown>;

// Errors meaning "already gone", which undo treats as done.
const GONE = ['ENODEV', 'ESRCH', 'ENOENT', 'EADDRNOTAVAIL', 'ENXIO'];

export function ignoreGone(fn: () => void): void {
  try {
    fn();
  } catch (e) {
    if (!isNetlinkError(e, ...GONE)) throw e;
  }
}

/**
 * Addresses on any interface answer ARP on every interface by default; DSR needs the pod to stay silent
 * for its VIPs (the load balancer owns them on the wire): arp_ignore 1, arp_announce 2 on `all` and the
 * pod interface. Each write is recorded with the value it replaced.
 */
export function silenceArp(netns: string, podIfName: string, applied: DsrApplied, who: Who): void {
  const entries: Array<[string, string]> = [];
  for (const [key, value] of [['arp_ignore', '1'], ['arp_announce', '2']]) {
    for (const dev of ['all', podIfName]) entries.push([`net/ipv4/conf/${dev}/${key}`, value]);
  }
  // One entry into the pod's namespace for all four; each write is recorded as soon as it is made.
  const from = applied.sysctls.length;
  try {
    writeNetSysctls(netns, entries, (key, value, previous) => void applied.sysctls.push({ key, previous, value }));
  } finally {
    for (const s of applied.sysctls.slice(from)) log().info('pod sysctl set', { ...who, key: s.key, value: s.value, previous: s.previous });
  }
}

/** The device that holds the VIPs, by name and index (the index spares a lookup when adding each VIP). */
export interface VipDevice {
  name: string;
  index: number;
}

/**
 * The device that holds the VIPs: a dummy `tether0` where the kernel has the dummy driver, else lo
 * (brought up if down). With `adopt`, a `tether0` already there (the CNI config's VIPs made it) is used
 * and left out of the record: its creator removes it.
 */
export function vipDevice(pod: NetlinkHandle, applied: DsrApplied, o: { adopt: boolean }, who: Who): string {
  return openVipDevice(pod, applied, o, who).name;
}

/**
 * vipDevice, with the device's index. A new tether0 is created up in one request, and the kernel's echo of
 * it gives its index and MAC (a kernel that does not echo is asked once more).
 */
export function openVipDevice(pod: NetlinkHandle, applied: DsrApplied, o: { adopt: boolean }, who: Who): VipDevice {
  if (pod.kernelHasDummy()) {
    if (o.adopt) {
      const have = pod.getLink(VIP_LINK_NAME);
      if (have) {
        if (!have.up) pod.setLinkUp(have.index, true);
        return { name: VIP_LINK_NAME, index: have.index };
      }
    }
    const created = pod.createDummy(VIP_LINK_NAME, { up: true });
    applied.vipLink = { name: VIP_LINK_NAME };
    const link = created ?? pod.requireLink(VIP_LINK_NAME);
    applied.vipLink.mac = link.mac;
    log().info('VIP link created', { ...who, link: VIP_LINK_NAME });
    return { name: VIP_LINK_NAME, index: link.index };
  }
  const lo = pod.requireLink('lo');
  if (!lo.up) {
    pod.setLinkUp(lo.index, true);
    applied.loBroughtUp = true;
    log().info('pod lo brought up to hold VIPs', who);
  }
  return { name: 'lo', index: lo.index };
}

/** Adds a VIP on `dev`; `replace` takes an address already there (an LB target re-set-up after a restart). */
export function addVip(pod: NetlinkHandle, dev: string | VipDevice, vip: string, applied: DsrApplied, o: { replace?: boolean }, who: Who): void {
  const prefixLen = ipFamily(vip) === 4 ? 32 : 128;
  const name = typeof dev === 'string' ? dev : dev.name;
  const index = typeof dev === 'string' ? pod.requireLink(dev).index : dev.index;
  pod.addAddress({ address: `${vip}/${prefixLen}`, index, noDad: true, ...(o.replace ? { replace: true } : {}) });
  if (!applied.vips.some((v) => v.address === vip && v.dev === name)) applied.vips.push({ address: vip, prefixLen, dev: name });
  log().info('VIP added', { ...who, vip, dev: name });
}

/** Removes one recorded VIP (gone already counts as removed). */
export function removeVip(pod: NetlinkHandle, vip: string, applied: DsrApplied, who: Who): void {
  for (const v of applied.vips.filter((x) => x.address === vip)) {
    const dev = pod.getLink(v.dev);
    if (!dev) continue; // gone with its device
    ignoreGone(() => pod.deleteAddress({ address: `${v.address}/${v.prefixLen}`, index: dev.index }));
    log().info('VIP removed', { ...who, vip: v.address, dev: v.dev });
  }
  applied.vips = applied.vips.filter((x) => x.address !== vip);
}

/** Reverts a DSR set-up inside the pod, newest first: VIPs, the link, lo, sysctls. Idempotent. */
export function undoDsr(pod: NetlinkHandle, netns: string, applied: DsrApplied, who: Who): void {
  for (const v of [...applied.vips].reverse()) removeVip(pod, v.address, applied, who);
  if (applied.vipLink && pod.getLink(applied.vipLink.name)) {
    ignoreGone(() => pod.deleteLink(applied.vipLink!.name));
    log().info('VIP link deleted', { ...who, link: applied.vipLink.name });
  }
  if (applied.loBroughtUp) {
    ignoreGone(() => pod.setLinkUp('lo', false));
    log().info('pod lo set down again', who);
  }
  for (const s of [...applied.sysctls].reverse()) {
    try {
      writeNetSysctl(netns, s.key, s.previous);
      log().info('pod sysctl restored', { ...who, key: s.key, value: s.previous });
    } catch (e) {
      // A per-interface key disappears with its interface: nothing left to restore.
      if ((e as NodeJS.ErrnoException).code !== 'ENOENT') throw e;
    }
  }
}

// ---- a load balancer target ------------------------------------------------------------------------------

/** An LB target pod's DSR set-up (the pod record's `dsrTarget`). */
export interface DsrTarget extends DsrApplied {
  version: 1;
  netns: string;
  ifName: string;
  /** The device holding the VIPs (tether0 or lo). */
  vipDev: string;
  /** The pod interface's MTU before it was lowered by the encapsulation overhead. */
  podMtu?: { ifName: string; ifIndex: number; previous: number; value: number };
  /** Where the FoU decapsulation is attached (host-side veth egress, else the pod interface's ingress). */
  decap?: { ifName: string; netns?: string; direction: 'ingress' | 'egress' };
}

/**
 * Sets a target pod up (idempotent on a pod a previous run set up: it adopts what is there): ARP silence,
 * the VIP device, and the pod interface's MTU lowered to the host veth's less `overhead` (the MSS the
 * target advertises must leave room for the encapsulation on the way in). On failure, undoes what it did.
 */
export function setUpDsrTarget(o: { netns: string; ifName: string; hostIfName?: string; overhead: number }, who: Who): DsrTarget {
  const t: DsrTarget = { version: 1, netns: o.netns, ifName: o.ifName, vipDev: VIP_LINK_NAME, sysctls: [], vips: [] };
  try {
    NetlinkHandle.with(o.netns, (h) => {
      t.vipDev = vipDevice(h, t, { adopt: true }, who);
      const link = h.requireLink(o.ifName);
      const host = o.hostIfName ? NetlinkHandle.with(undefined, (hh) => hh.getLink(o.hostIfName!)) : undefined;
      const want = (host?.mtu ?? link.mtu) - o.overhead;
      if (host && link.mtu > want) {
        h.setLinkMtu(link.index, want);
        t.podMtu = { ifName: link.name, ifIndex: link.index, previous: link.mtu, value: want };
      }
    });
    silenceArp(o.netns, o.ifName, t, who);
  } catch (e) {
    try {
      undoDsrTarget(t, who);
    } catch (undoErr) {
      log().error('lb: target set-up rollback failed', { ...who, error: (undoErr as Error).message });
    }
    throw e;
  }
  return t;
}

/** Makes the target's VIPs exactly `vips`; returns what changed. */
export function setTargetVips(t: DsrTarget, vips: Set<string>, who: Who): { added: string[]; removed: string[] } {
  const have = new Set(t.vips.map((v) => v.address));
  const added = [...vips].filter((v) => !have.has(v));
  const removed = [...have].filter((v) => !vips.has(v));
  if (added.some((v) => ipFamily(v) === 6)) lowerIpv6Mtu(t, who);
  if (added.length || removed.length) {
    NetlinkHandle.with(t.netns, (h) => {
      for (const v of added) addVip(h, t.vipDev, v, t, { replace: true }, who);
      for (const v of removed) removeVip(h, v, t, who);
    });
  }
  return { added, removed };
}

/**
 * The pod interface's IPv6 MTU, once, when its first IPv6 VIP comes: the link MTU (already lowered by the
 * outer IPv4 overhead) less FOU6_EXTRA_OVERHEAD, never below 1280. Recorded in t.sysctls, so undoing the
 * set-up (by this release or the one before, which restores every recorded sysctl) restores it.
 */
function lowerIpv6Mtu(t: DsrTarget, who: Who): void {
  const key = `net/ipv6/conf/${t.ifName}/mtu`;
  if (t.sysctls.some((x) => x.key === key)) return;
  let current: number;
  try {
    current = Number(readNetSysctl(t.netns, key));
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') return; // IPv6 is off on the interface: nothing to lower
    throw e;
  }
  const linkMtu = NetlinkHandle.with(t.netns, (h) => h.requireLink(t.ifName).mtu);
  const want = Math.max(IPV6_MIN_MTU, linkMtu - FOU6_EXTRA_OVERHEAD);
  if (!(current > want)) return;
  writeNetSysctls(t.netns, [[key, String(want)]], (k, value, previous) => void t.sysctls.push({ key: k, previous, value }));
  log().info('pod IPv6 MTU lowered for IPv6 VIPs', { ...who, ifName: t.ifName, value: want, previous: current });
}

/**
 * Undoes a target's set-up: the decapsulation (by the record: also after a restart), then inside the pod
 * the VIPs, link, lo and sysctls, and the MTU. A pod already gone counts as undone.
 */
export function undoDsrTarget(t: DsrTarget, who: Who): void {
  if (t.decap) {
    try {
      detachFou({ which: 'decap', netns: t.decap.netns, ifName: t.decap.ifName, direction: t.decap.direction });
    } catch {
      // the pod (and its veth, with the filter) is gone
    }
  }
  if (!netnsExists(t.netns)) return;
  try {
    NetlinkHandle.with(t.netns, (h) => {
      undoDsr(h, t.netns, t, who);
      const m = t.podMtu;
      const l = m && h.getLink(m.ifName);
      // Names can be reused: only the very link that was lowered is restored.
      if (m && l && l.index === m.ifIndex) ignoreGone(() => h.setLinkMtu(l.index, m.previous));
    });
  } catch (e) {
    log().debug('lb: target teardown: pod gone', { ...who, error: (e as Error).message });
  }
}
