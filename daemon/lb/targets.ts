// The node's target pods (endpoints of a served Service running here) set up for direct server return:
// the VIPs on a dummy link or lo (ARP silent), FoU decapsulation accepted from registered node addresses
// only, the MTU lowered by the encapsulation overhead. Undone when the pod is no longer a target.
import { NetlinkHandle } from '../netlink';
import { netnsExists, writeNetSysctl } from '../sys/netns';
import { attachFouDecap } from '../bpf/fou';
import { podKeyOf, type PodRecord } from '../state/pod-store';
import type { ResolvedLoadBalancer } from './lb-spec';
import { FOU_OVERHEAD, ignoreGone, type LbShared, type TargetPod } from './lb-state';

export class LbTargets {
  constructor(private readonly s: LbShared) {}

  /** Sets up every local pod that is a target of a served Service; undoes the others. Idempotent. */
  apply(served: ResolvedLoadBalancer[]): void {
    const byIp = new Map<string, Set<string>>();
    for (const lb of served) for (const t of lb.targets) {
      const s = byIp.get(t.address) ?? new Set<string>();
      s.add(this.s.vips.get(lb.key)!.vip!);
      byIp.set(t.address, s);
    }
    const seen = new Set<string>();
    for (const r of this.s.o.attach.pods()) {
      const pod = podKeyOf(r) ?? r.containerId;
      const ip = r.ips?.find((i) => !i.includes(':'));
      const vips = ip ? byIp.get(ip) : undefined;
      if (!ip || !vips || !netnsExists(r.netns)) continue;
      seen.add(pod);
      try {
        this.up(pod, r, ip, vips);
        this.s.o.attach.roleProblems.ok(pod, 'lb target');
      } catch (e) {
        if (this.s.o.attach.roleProblems.failed(pod, 'lb target', (e as Error).message)) this.s.logger.error('lb: target setup failed', { pod, error: (e as Error).message });
      }
    }
    for (const [pod, t] of this.s.targets) if (!seen.has(pod)) this.down(pod, t);
  }

  /** The registered node addresses changed: every target's decapsulation accepts the new list. */
  setSources(nodes: string[]): void {
    for (const t of this.s.targets.values()) t.decap?.setAllowedSources(nodes);
  }

  private up(pod: string, r: PodRecord, ip: string, vips: Set<string>): void {
    let t = this.s.targets.get(pod);
    if (!t) {
      t = { pod, netns: r.netns, ifName: r.ifName, ip, vips: new Set(), vipDev: 'lo' };
      const tt = t;
      NetlinkHandle.with(r.netns, (h) => {
        if (h.kernelHasDummy()) {
          if (!h.getLink('tether0')) h.createDummy('tether0');
          h.setLinkUp('tether0', true);
          tt.vipDev = 'tether0';
        } else h.setLinkUp('lo', true);
        // The MSS the target advertises must leave room for the encapsulation on the way in.
        const link = h.requireLink(r.ifName);
        const host = r.hostIfName ? NetlinkHandle.with(undefined, (hh) => hh.getLink(r.hostIfName!)) : undefined;
        const want = (host?.mtu ?? link.mtu) - FOU_OVERHEAD;
        if (host && link.mtu > want) {
          tt.mtuBefore = link.mtu;
          h.setLinkMtu(link.index, want);
        }
      });
      for (const dev of ['all', r.ifName]) {
        writeNetSysctl(r.netns, `net/ipv4/conf/${dev}/arp_ignore`, '1');
        writeNetSysctl(r.netns, `net/ipv4/conf/${dev}/arp_announce`, '2');
      }
      // Decapsulated on the host side, before the pod: a full-size encapsulated frame would exceed the
      // pod interface's lowered MTU, and a veth drops what is longer than its peer's MTU.
      const sources = this.s.nodes.length ? this.s.nodes : [this.s.o.node.address];
      const port = this.s.o.fouPort;
      t.decap = r.hostIfName
        ? attachFouDecap({ ifName: r.hostIfName, direction: 'egress', port, localAddress: ip, allowedSources: sources })
        : attachFouDecap({ netns: r.netns, ifName: r.ifName, port, localAddress: ip, allowedSources: sources });
      this.s.targets.set(pod, t);
      this.s.logger.info('lb: target pod ready for DSR', { pod, ip, vipDev: t.vipDev, mtuLoweredFrom: t.mtuBefore });
    }
    const cur = t;
    const add = [...vips].filter((v) => !cur.vips.has(v));
    const del = [...cur.vips].filter((v) => !vips.has(v));
    if (add.length || del.length) {
      NetlinkHandle.with(r.netns, (h) => {
        const dev = h.requireLink(cur.vipDev);
        for (const v of add) h.addAddress({ address: `${v}/32`, index: dev.index, replace: true, noDad: true });
        for (const v of del) ignoreGone(() => h.deleteAddress({ address: `${v}/32`, index: dev.index }));
      });
      cur.vips = new Set(vips);
      this.s.logger.info('lb: target VIPs', { pod, added: add, removed: del });
    }
  }

  private down(pod: string, t: TargetPod): void {
    this.s.targets.delete(pod);
    try {
      t.decap?.detach();
    } catch {
      // the pod (and its veth, with the filter) is gone
    }
    if (netnsExists(t.netns)) {
      try {
        NetlinkHandle.with(t.netns, (h) => {
          const dev = h.getLink(t.vipDev);
          if (dev) for (const v of t.vips) ignoreGone(() => h.deleteAddress({ address: `${v}/32`, index: dev.index }));
          if (t.vipDev === 'tether0') ignoreGone(() => h.deleteLink('tether0'));
          const link = h.getLink(t.ifName);
          if (link && t.mtuBefore) h.setLinkMtu(link.index, t.mtuBefore);
        });
      } catch (e) {
        this.s.logger.debug('lb: target teardown: pod gone', { pod, error: (e as Error).message });
      }
    }
    this.s.logger.info('lb: pod no longer a target', { pod });
  }
}
