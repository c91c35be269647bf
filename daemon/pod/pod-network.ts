// Pod network primitives tetherd applies on CNI ADD and undoes on DEL: lowered MTU (pod interface and
// its host-side veth), DSR VIPs (on a dummy `tether0`, or on `lo` where the kernel has no dummy) with
// ARP suppression sysctls, and extra routes. Everything changed is recorded with its previous value in
// a JSON-serialisable AppliedPodNetwork, so undo works after a daemon restart.
import { ErrorCode, TetherError } from '../../lib/errors';
import { log } from '../../lib/log';
import { NetlinkHandle, type Link } from '../netlink';
import { ipFamily } from '../../lib/ip';
import { netnsExists, readNetSysctl } from '../sys/netns';
import { MIN_MTU, type PodNetConfig } from './pod-net-config';
import { addVip, ignoreGone, openVipDevice, silenceArp, undoDsr, type DsrApplied } from './dsr-target';

export { validatePodNetConfig, type PodNetConfig } from './pod-net-config';

export interface PodTarget {
  /** Path of the pod's network namespace (CNI_NETNS). */
  netns: string;
  /** The pod interface (CNI_IFNAME). */
  ifName: string;
  /** Host-side veth, from prevResult.interfaces (the entry without sandbox). */
  hostIfName?: string;
  /** Namespace holding the host side; default: the daemon's own. Tests use a separate one. */
  hostNetns?: string;
}

export { VIP_LINK_NAME } from './dsr-target';

interface MtuChange { ifName: string; ifIndex: number; previous: number; value: number }

/**
 * What applyPodNetwork changed, in order. Plain JSON: it is persisted and read back by a later daemon.
 * The DSR part (sysctls, VIP link or lo, VIPs) is dsr-target.ts's record.
 */
export interface AppliedPodNetwork extends DsrApplied {
  version: 1;
  netns: string;
  ifName: string;
  hostNetns?: string;
  podMtu?: MtuChange;
  hostMtu?: MtuChange;
  routes: Array<{ dst: string; gw?: string; dev: string; table?: number; mtu?: number }>;
}

function who(t: { netns: string; ifName: string }) {
  return { netns: t.netns, ifName: t.ifName };
}

/**
 * Applies cfg to the pod. Not idempotent on purpose: it expects a pod Tether has not configured yet
 * (an existing VIP or route is EEXIST, not adopted, so undo never removes what it did not add).
 * On any failure it undoes what it already did, then throws: no half-configured pod.
 */
export function applyPodNetwork(target: PodTarget, cfg: PodNetConfig): AppliedPodNetwork {
  const applied: AppliedPodNetwork = { version: 1, netns: target.netns, ifName: target.ifName, sysctls: [], vips: [], routes: [] };
  if (target.hostNetns) applied.hostNetns = target.hostNetns;
  const pod = NetlinkHandle.open(target.netns);
  try {
    const podIf = pod.requireLink(target.ifName);
    applyMtu(pod, podIf, target, cfg, applied);
    applyVips(pod, podIf, cfg, applied);
    applyRoutes(pod, podIf, cfg, applied);
    return applied;
  } catch (e) {
    try {
      undoPodNetwork(applied);
    } catch (undoErr) {
      // The original error matters more to the caller; the failed rollback is logged for the operator.
      log().error('pod network rollback failed', { ...who(target), error: (undoErr as Error).message });
    }
    throw e;
  } finally {
    pod.close();
  }
}

function applyMtu(pod: NetlinkHandle, podIf: Link, target: PodTarget, cfg: PodNetConfig, applied: AppliedPodNetwork): void {
  if (cfg.mtu === undefined && !cfg.encapOverhead) return;
  const value = cfg.mtu ?? podIf.mtu - (cfg.encapOverhead ?? 0);
  if (value < MIN_MTU) {
    throw new TetherError(ErrorCode.InvalidConfig, `encapOverhead: ${cfg.encapOverhead} would lower ${target.ifName}'s MTU ${podIf.mtu} to ${value}, below ${MIN_MTU}`);
  }
  const host = hostHandle(target.hostNetns);
  try {
    const hostIf = findHostPeer(host, podIf, target);
    if (podIf.mtu !== value) {
      pod.setLinkMtu(podIf.index, value);
      applied.podMtu = { ifName: podIf.name, ifIndex: podIf.index, previous: podIf.mtu, value };
      log().info('pod interface MTU set', { ...who(target), mtu: value, previous: podIf.mtu });
    }
    if (!hostIf) {
      // Without a host-side veth (e.g. chained after macvlan) only the pod side can be lowered; the pod's
      // MSS is what keeps TCP segments within the encapsulated path, so this is a warning, not an error.
      log().warn('host-side interface not found; only the pod interface MTU was set', { ...who(target), hostIfName: target.hostIfName });
    } else if (hostIf.mtu !== value) {
      host.setLinkMtu(hostIf.index, value);
      applied.hostMtu = { ifName: hostIf.name, ifIndex: hostIf.index, previous: hostIf.mtu, value };
      log().info('host-side veth MTU set', { ...who(target), hostIfName: hostIf.name, mtu: value, previous: hostIf.mtu });
    }
  } catch (e) {
    // After a failure the kept handle is not trusted further: closed below, the next pod opens a new one.
    if (host === ownHandle) ownHandle = undefined;
    throw e;
  } finally {
    if (host !== ownHandle) host.close();
  }
}

/** A handle on tetherd's own namespace, kept open between pods (opening one costs more than a request). */
let ownHandle: NetlinkHandle | undefined;

/** The host side's handle: the kept one for tetherd's own namespace, a new one for another (tests). */
function hostHandle(hostNetns: string | undefined): NetlinkHandle {
  if (hostNetns) return NetlinkHandle.open(hostNetns);
  if (!ownHandle || ownHandle.socket.closed) ownHandle = NetlinkHandle.open();
  return ownHandle;
}

/** The host end of the pod's veth: by name when the runtime told us, else by the peer ifindex. */
function findHostPeer(host: NetlinkHandle, podIf: Link, target: PodTarget): Link | undefined {
  if (target.hostIfName) return host.getLink(target.hostIfName);
  if (podIf.kind !== 'veth' || podIf.linkIndex === undefined) return undefined;
  const cand = host.getLink(podIf.linkIndex);
  // An index alone could name an unrelated link here; a real peer is a veth pointing back at us.
  return cand && cand.kind === 'veth' && cand.linkIndex === podIf.index ? cand : undefined;
}

function applyVips(pod: NetlinkHandle, podIf: Link, cfg: PodNetConfig, applied: AppliedPodNetwork): void {
  const vips = cfg.vips ?? [];
  if (vips.length === 0) return;
  const t = { netns: applied.netns, ifName: applied.ifName };
  if (vips.some((v) => ipFamily(v) === 4)) silenceArp(applied.netns, podIf.name, applied, t);
  // Not adopted: a tether0 already there is EEXIST (undo never removes what it did not add).
  const dev = openVipDevice(pod, applied, { adopt: false }, t);
  for (const vip of vips) addVip(pod, dev, vip, applied, {}, t);
}

function applyRoutes(pod: NetlinkHandle, podIf: Link, cfg: PodNetConfig, applied: AppliedPodNetwork): void {
  for (const r of cfg.routes ?? []) {
    pod.addRoute({ dst: r.dst, gateway: r.gw, index: podIf.index, table: r.table, mtu: r.mtu });
    applied.routes.push({ dst: r.dst, gw: r.gw, dev: podIf.name, table: r.table, mtu: r.mtu });
    log().info('pod route added', { netns: applied.netns, ifName: applied.ifName, dst: r.dst, gw: r.gw, table: r.table, mtu: r.mtu });
  }
}

/**
 * Reverts everything in `applied`, newest first. Idempotent: anything already gone (the netns, the
 * interface, an address) counts as undone, which is the normal case on CNI DEL after the pod died.
 */
export function undoPodNetwork(applied: AppliedPodNetwork): void {
  const t = who(applied);
  if (netnsExists(applied.netns)) {
    let pod: NetlinkHandle | undefined;
    try {
      pod = NetlinkHandle.open(applied.netns);
    } catch (e) {
      if (!(e instanceof TetherError && e.code === ErrorCode.NetnsGone)) throw e;
    }
    if (pod) {
      try {
        undoInPod(pod, applied);
      } finally {
        pod.close();
      }
    }
  } else {
    log().info('pod netns already gone; nothing to undo inside it', t);
  }
  if (applied.hostMtu) {
    const m = applied.hostMtu;
    try {
      NetlinkHandle.with(applied.hostNetns, (host) => {
        const l = host.getLink(m.ifName);
        // Names can be reused by a later pod's veth: only touch the very link we changed.
        if (l && l.index === m.ifIndex) {
          ignoreGone(() => host.setLinkMtu(l.index, m.previous));
          log().info('host-side veth MTU restored', { ...t, hostIfName: m.ifName, mtu: m.previous });
        }
      });
    } catch (e) {
      // A separate host namespace that is gone took the veth with it: nothing to restore.
      if (!(e instanceof TetherError && e.code === ErrorCode.NetnsGone)) throw e;
    }
  }
}

function undoInPod(pod: NetlinkHandle, applied: AppliedPodNetwork): void {
  const t = who(applied);
  for (const r of [...applied.routes].reverse()) {
    const dev = pod.getLink(r.dev);
    if (!dev) continue; // routes die with their device
    ignoreGone(() => pod.deleteRoute({ dst: r.dst, gateway: r.gw, index: dev.index, table: r.table }));
    log().info('pod route removed', { ...t, dst: r.dst, table: r.table });
  }
  undoDsr(pod, applied.netns, { ...applied, vips: [...applied.vips] }, t);
  if (applied.podMtu) {
    const m = applied.podMtu;
    const l = pod.getLink(m.ifName);
    if (l && l.index === m.ifIndex) {
      ignoreGone(() => pod.setLinkMtu(l.index, m.previous));
      log().info('pod interface MTU restored', { ...t, mtu: m.previous });
    }
  }
}

/** Verifies that everything in `applied` is still in place; throws TetherError(CHECK_FAILED) listing each difference. */
export function checkPodNetwork(applied: AppliedPodNetwork): void {
  const where = `${applied.netns} ${applied.ifName}`;
  if (!netnsExists(applied.netns)) throw new TetherError(ErrorCode.CheckFailed, `pod network check ${where}: netns is gone`);
  const diffs: string[] = [];
  NetlinkHandle.with(applied.netns, (pod) => {
    if (applied.podMtu) {
      const l = pod.getLink(applied.podMtu.ifName);
      if (!l) diffs.push(`interface ${applied.podMtu.ifName} is missing`);
      else if (l.mtu !== applied.podMtu.value) diffs.push(`${l.name} MTU is ${l.mtu}, expected ${applied.podMtu.value}`);
    }
    if (applied.vipLink) {
      const l = pod.getLink(applied.vipLink.name);
      if (!l) diffs.push(`VIP link ${applied.vipLink.name} is missing`);
      else if (!l.up) diffs.push(`VIP link ${applied.vipLink.name} is down`);
    }
    const links = new Map(pod.listLinks().map((l) => [l.name, l.index]));
    const addrs = pod.listAddresses();
    for (const v of applied.vips) {
      const idx = links.get(v.dev);
      if (!addrs.some((a) => a.index === idx && a.address === v.address && a.prefixLen === v.prefixLen)) {
        diffs.push(`VIP ${v.address}/${v.prefixLen} is missing on ${v.dev}`);
      }
    }
    const routes = pod.listRoutes();
    for (const r of applied.routes) {
      const [dst, len] = r.dst.split('/');
      const table = r.table ?? 254;
      const found = routes.find((x) => x.dst === dst && x.dstLen === Number(len) && x.table === table && x.index === links.get(r.dev));
      if (!found) diffs.push(`route ${r.dst}${table !== 254 ? ` table ${table}` : ''} is missing`);
      else if (found.gateway !== r.gw) diffs.push(`route ${r.dst} goes via ${found.gateway ?? 'no gateway'}, expected ${r.gw ?? 'no gateway'}`);
      else if (found.mtu !== r.mtu) diffs.push(`route ${r.dst} has MTU ${found.mtu ?? 'unset'}, expected ${r.mtu ?? 'unset'}`);
    }
  });
  for (const s of applied.sysctls) {
    let cur: string;
    try {
      cur = readNetSysctl(applied.netns, s.key);
    } catch {
      cur = 'missing';
    }
    if (cur !== s.value) diffs.push(`sysctl ${s.key} is ${cur}, expected ${s.value}`);
  }
  if (applied.hostMtu) {
    const m = applied.hostMtu;
    try {
      NetlinkHandle.with(applied.hostNetns, (host) => {
        const l = host.getLink(m.ifName);
        if (!l) diffs.push(`host-side interface ${m.ifName} is missing`);
        else if (l.mtu !== m.value) diffs.push(`host-side ${m.ifName} MTU is ${l.mtu}, expected ${m.value}`);
      });
    } catch (e) {
      if (!(e instanceof TetherError && e.code === ErrorCode.NetnsGone)) throw e;
      diffs.push(`host netns ${applied.hostNetns} is gone`);
    }
  }
  if (diffs.length) throw new TetherError(ErrorCode.CheckFailed, `pod network check ${where}: ${diffs.join('; ')}`);
}

/** CNI result entries for links the plugin created (the dummy VIP link); empty when VIPs sit on lo. */
export function addedInterfaces(applied: AppliedPodNetwork): Array<{ name: string; mac?: string; sandbox: string }> {
  return applied.vipLink ? [{ name: applied.vipLink.name, mac: applied.vipLink.mac, sandbox: applied.netns }] : [];
}
