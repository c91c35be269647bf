// The node's target pods (endpoints of a served Service running here) set up for direct server return
// (pod/dsr-target.ts: the VIPs on a dummy link or lo, ARP silent, the MTU lowered by the encapsulation
// overhead) with FoU decapsulation accepted from registered node addresses only. A pod is a target of an
// IPv4 VIP by its IPv4 address and of an IPv6 VIP by its IPv6 address (FoU in outer IPv6 to it, from the
// LB nodes' IPv6 addresses). The set-up is kept in the pod record: undone when the pod is no longer a
// target, or by the pod's DEL.
import { netnsExists } from '../sys/netns';
import { attachFouDecap } from '../bpf/fou';
import { setTargetVips, setUpDsrTarget, undoDsrTarget, type DsrTarget } from '../pod/dsr-target';
import { podKeyOf, type PodRecord } from '../state/pod-store';
import type { ResolvedLoadBalancer } from './lb-spec';
import { FOU_OVERHEAD, type LbShared, type TargetPod } from './lb-state';

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
      const ip4 = r.ips?.find((i) => !i.includes(':'));
      const ip6 = r.ips?.find((i) => i.includes(':'));
      const vips = new Set([...(ip4 ? byIp.get(ip4) ?? [] : []), ...(ip6 ? byIp.get(ip6) ?? [] : [])]);
      if (!vips.size || !netnsExists(r.netns)) continue;
      seen.add(pod);
      try {
        this.up(pod, r, { ip4, ip6 }, vips);
        this.s.o.attach.roleProblems.ok(pod, 'lb target');
      } catch (e) {
        if (this.s.o.attach.roleProblems.failed(pod, 'lb target', (e as Error).message)) this.s.logger.error('lb: target setup failed', { pod, error: (e as Error).message });
      }
    }
    for (const [pod, t] of this.s.targets) if (!seen.has(pod)) this.down(pod, t);
    // A set-up recorded by a previous run is adopted once its pod is a target again, and undone by its DEL
    // otherwise: a first pass after a restart may not know every VIP yet, and must not strip targets.
  }

  /** The registered node addresses changed: every target's decapsulation accepts the new list. */
  setSources(nodes: string[]): void {
    for (const t of this.s.targets.values()) t.decap?.setAllowedSources(nodes);
  }

  private up(pod: string, r: PodRecord, ips: { ip4?: string; ip6?: string }, vips: Set<string>): void {
    let t = this.s.targets.get(pod);
    const ip = ips.ip4 ?? ips.ip6!;
    const who = { pod, ip };
    if (!t) {
      // Set up by a previous run (recorded), or now: the set-up adopts what is there either way.
      const recorded = r.dsrTarget ? structuredClone(r.dsrTarget as DsrTarget) : undefined;
      const setup = recorded ?? setUpDsrTarget({ netns: r.netns, ifName: r.ifName, hostIfName: r.hostIfName, overhead: FOU_OVERHEAD }, who);
      t = { pod, key: { network: r.network, containerId: r.containerId, ifName: r.ifName }, netns: r.netns, ifName: r.ifName, ip, vips: new Set(setup.vips.map((v) => v.address)), setup };
      // Decapsulated on the host side, before the pod: a full-size encapsulated frame would exceed the
      // pod interface's lowered MTU, and a veth drops what is longer than its peer's MTU.
      const own = this.s.o.node.address6 ? [this.s.o.node.address, this.s.o.node.address6] : [this.s.o.node.address];
      const sources = this.s.nodes.length ? this.s.nodes : own;
      // Outer IPv6 to the pod's IPv6 address is unwrapped too (an IPv6 VIP's), whether or not the pod is a
      // target of one yet: the decapsulation is attached once per pod.
      const addrs = { port: this.s.o.fouPort, localAddress: ips.ip4, ...(ips.ip6 ? { localAddress6: ips.ip6 } : {}), allowedSources: sources };
      try {
        t.decap = r.hostIfName
          ? attachFouDecap({ ifName: r.hostIfName, direction: 'egress', ...addrs })
          : attachFouDecap({ netns: r.netns, ifName: r.ifName, ...addrs });
      } catch (e) {
        if (!r.dsrTarget) undoDsrTarget(setup, who);
        throw e;
      }
      setup.decap = r.hostIfName ? { ifName: r.hostIfName, direction: 'egress' } : { netns: r.netns, ifName: r.ifName, direction: 'ingress' };
      this.s.targets.set(pod, t);
      this.record(t);
      if (!r.dsrTarget) this.s.logger.info('lb: target pod ready for DSR', { pod, ip, vipDev: setup.vipDev, mtuLoweredFrom: setup.podMtu?.previous });
    }
    const cur = t;
    const { added, removed } = setTargetVips(cur.setup, vips, who);
    if (added.length || removed.length) {
      cur.vips = new Set(vips);
      this.record(cur);
      this.s.logger.info('lb: target VIPs', { pod, added, removed });
    }
  }

  /** The set-up goes into the pod record, which a DEL undoes (and a restarted tetherd adopts). */
  private record(t: TargetPod): boolean {
    return this.s.o.attach.updateRecord(t.key, (r) => ({ ...r, dsrTarget: t.setup }));
  }

  private down(pod: string, t: TargetPod): void {
    this.s.targets.delete(pod);
    try {
      t.decap?.detach();
    } catch {
      // the pod (and its veth, with the filter) is gone
    }
    // Still recorded: undone here. Gone from the records: its DEL undid the set-up already.
    if (this.s.o.attach.updateRecord(t.key, (r) => ({ ...r, dsrTarget: undefined }))) undoDsrTarget({ ...t.setup, decap: undefined }, { pod });
    this.s.logger.info('lb: pod no longer a target', { pod });
  }
}
