// The node's LB pods: which local pods serve which VIPs (ready pods the Service's selector picks), the
// datapath's program at each one's interface, and each VIP routed through its local serving LB pods and
// put in the route-export table (the BGP speaker announces it) — but only once the VIP's mappings are
// loaded from the store, so a new or restarted LB pod never re-picks live clients. An LB pod being
// deleted is taken out of the VIP's routes (the VIP withdrawn when it was the node's last) and its program
// removed at once, node-locally: its DEL never waits on the store; the reconciler does the rest later.
import { NetlinkHandle, isNetlinkError } from '../netlink';
import { hostPrefix } from '../../lib/ip';
import { netnsExists, readNetSysctl, writeNetSysctl } from '../sys/netns';
import { podKeyOf, type PodRecord } from '../state/pod-store';
import type { PodMeta } from '../config/objects';
import type { ResolvedLoadBalancer } from './lb-spec';
import { pickableTargets, type LbPod, type LbShared, type VipState } from './lb-state';

/** An LB pod being deleted keeps forwarding this long after its routes are withdrawn (BGP converges). */
const DRAIN_MS = 1500;

/** Local pods and the Services (keys) each one's labels select. */
export type Selections = Map<string, { r: PodRecord; services: Set<string> }>;

export class LbPods {
  private podMeta = new Map<string, PodMeta>();
  /**
   * Attachments (container IDs) of LB pods being deleted: never selected again, even by a pass that read
   * the pods before the DEL came. Forgotten once their record is gone (a pod re-created under the same
   * name is another container).
   */
  private readonly draining = new Set<string>();

  constructor(private readonly s: LbShared) {}

  setPodMeta(meta: Record<string, PodMeta> | undefined): void {
    this.podMeta = new Map(Object.entries(meta ?? {}));
  }

  private selected(r: PodRecord, lb: ResolvedLoadBalancer): boolean {
    const pod = podKeyOf(r);
    if (!pod || r.podNamespace !== lb.lbPods.namespace || this.draining.has(r.containerId)) return false;
    const meta = this.podMeta.get(pod);
    if (meta?.ready === false || meta?.deleting) return false;
    const labels = meta?.labels ?? r.labels ?? {};
    return Object.entries(lb.lbPods.matchLabels).every(([k, v]) => labels[k] === v);
  }

  /** Which local pods would serve which of the served Services (before slots are given). */
  selections(served: ResolvedLoadBalancer[]): Selections {
    const out: Selections = new Map();
    const records = this.s.o.attach.pods();
    const live = new Set(records.map((r) => r.containerId));
    for (const c of this.draining) if (!live.has(c)) this.draining.delete(c);
    for (const r of records) {
      const pod = podKeyOf(r);
      // Its IPv4 address, else its IPv6 one (an IPv6-only pod serves IPv6 VIPs; the VIP is routed by its veth).
      const ip = r.ips?.find((i) => !i.includes(':')) ?? r.ips?.[0];
      if (!pod || !ip || !r.hostIfName || !netnsExists(r.netns)) continue;
      for (const lb of served) {
        if (!this.selected(r, lb)) continue;
        const w = out.get(pod) ?? { r, services: new Set<string>() };
        w.services.add(lb.key);
        out.set(pod, w);
      }
    }
    return out;
  }

  /**
   * Attaches the program to the pods that serve a slotted VIP, detaches it from the others, and routes
   * each served VIP through its local serving LB pods once ensureLoaded has loaded its mappings.
   */
  async apply(served: ResolvedLoadBalancer[], sel: Selections, ensureLoaded: (lb: ResolvedLoadBalancer, st: VipState) => Promise<void>): Promise<void> {
    const want = new Map<string, { r: PodRecord; vips: Set<string> }>();
    for (const [pod, w] of sel) {
      // Selected before its DEL came (this pass waited on the store meanwhile): leaving() has it.
      if (this.draining.has(w.r.containerId)) continue;
      const vips = new Set<string>();
      for (const key of w.services) {
        const st = this.s.vips.get(key);
        if (st?.vip && st.slot !== undefined) vips.add(st.vip);
      }
      if (vips.size) want.set(pod, { r: w.r, vips });
    }
    for (const [pod, w] of want) {
      const have = this.s.lbPods.get(pod);
      if (have) {
        have.vips = w.vips;
        continue;
      }
      this.up(pod, w.r, w.vips);
    }
    for (const [pod, p] of this.s.lbPods) if (!want.has(pod)) this.down(pod, p);
    // Routes per VIP: through every local serving LB pod, once the VIP's mappings are loaded.
    for (const lb of served) {
      const st = this.s.vips.get(lb.key)!;
      if (!st.loaded && this.serving(st.vip!).length) await ensureLoaded(lb, st);
      // Read after the load: an LB pod may have left meanwhile.
      const pods = this.serving(st.vip!);
      // An IPv6 VIP is forwarded only from the node's IPv6 address (FoU in outer IPv6): without one, not announced here.
      const forwards = !st.vip!.includes(':') || !!this.s.o.node.address6;
      const announce = forwards && pods.length > 0 && st.loaded && pickableTargets(lb, this.s.o.node.name).length > 0;
      if (announce || st.announced) this.route(st, announce ? pods : []);
    }
  }

  /** The local LB pods serving vip now. */
  private serving(vip: string): LbPod[] {
    return [...this.s.lbPods.values()].filter((p) => p.vips.has(vip));
  }

  private up(pod: string, r: PodRecord, vips: Set<string>): void {
    const p: LbPod = { pod, netns: r.netns, ifName: r.ifName, hostIfName: r.hostIfName!, ip: r.ips!.find((i) => !i.includes(':')) ?? r.ips![0], vips };
    try {
      // What the pod sends back (encapsulated, from the node's address) must be accepted by the node.
      p.acceptLocalBefore = readNetSysctl(null, `net/ipv4/conf/${p.hostIfName}/accept_local`);
      writeNetSysctl(null, `net/ipv4/conf/${p.hostIfName}/accept_local`, '1');
      writeNetSysctl(null, `net/ipv4/conf/${p.hostIfName}/rp_filter`, '0');
      this.s.dp!.attach(p.netns, p.ifName);
      this.s.lbPods.set(pod, p);
      this.s.logger.info('lb: LB pod serving', { pod, vips: [...p.vips], hostIfName: p.hostIfName });
      this.s.o.attach.roleProblems.ok(pod, 'lb pod');
    } catch (e) {
      // Retried on the next pass; reported (status, /readyz) meanwhile, logged once.
      if (this.s.o.attach.roleProblems.failed(pod, 'lb pod', (e as Error).message)) this.s.logger.error('lb: LB pod setup failed', { pod, error: (e as Error).message });
    }
  }

  private down(pod: string, p: LbPod): void {
    this.s.lbPods.delete(pod);
    this.s.dp?.detach(p.netns, p.ifName);
    try {
      if (p.acceptLocalBefore !== undefined) writeNetSysctl(null, `net/ipv4/conf/${p.hostIfName}/accept_local`, p.acceptLocalBefore);
    } catch {
      // the veth is gone with the pod
    }
    this.s.logger.info('lb: LB pod no longer serving', { pod });
  }

  private route(st: VipState, pods: LbPod[]): void {
    const vip = st.vip!;
    NetlinkHandle.with(undefined, (h) => {
      const hops = pods.flatMap((p) => {
        const veth = h.getLink(p.hostIfName);
        if (!veth) return [];
        const mac = NetlinkHandle.with(p.netns, (ph) => ph.getLink(p.ifName)?.mac);
        // The pod does not hold the VIP (it only forwards), so it would not answer ARP for it: a
        // permanent neighbour entry on the pod's veth says where the VIP's packets go.
        if (mac) h.replaceNeighbour({ address: vip, index: veth.index, lladdr: mac });
        return mac ? [{ index: veth.index }] : [];
      });
      const tables = this.s.tables();
      if (hops.length) {
        for (const table of tables) {
          if (hops.length === 1) h.replaceRoute({ dst: hostPrefix(vip), index: hops[0].index, table });
          else h.replaceRoute({ dst: hostPrefix(vip), nexthops: hops, table });
        }
        if (!st.announced) this.s.logger.info('lb: VIP routed to local LB pods and announced', { service: st.key, vip, pods: pods.map((p) => p.pod), exportTable: this.s.o.exportTable || undefined });
        st.announced = true;
      } else if (st.announced) {
        unroute(h, vip, tables);
        this.s.logger.info('lb: VIP withdrawn (no serving local LB pod, or no active target)', { service: st.key, vip });
        st.announced = false;
      }
    });
  }

  /** The VIP's routes go (its Service goes, or asks for another VIP). */
  withdraw(st: VipState): void {
    if (!st.vip) return;
    NetlinkHandle.with(undefined, (h) => unroute(h, st.vip!, this.s.tables()));
    st.announced = false;
  }

  /**
   * An LB pod about to be deleted (its CNI DEL): at once and without the store, the VIPs it served are
   * routed through the node's other serving LB pods only, or withdrawn when it was the last, and its
   * program is removed; then the DEL waits DRAIN_MS (BGP converges while the node still forwards what
   * arrives) and returns. What needs the store (slots, mappings, VIPs no longer needed) is the reconciler's,
   * on the pass `request` asks for and does not wait for: a pass may wait on an unreachable store for as
   * long as the store is away.
   */
  async leaving(r: PodRecord, request: () => void): Promise<void> {
    const pod = podKeyOf(r);
    const p = pod ? this.s.lbPods.get(pod) : undefined;
    if (!pod || !p || p.netns !== r.netns) return;
    this.draining.add(r.containerId);
    const withdrawn: string[] = [];
    for (const st of this.s.vips.values()) {
      if (!st.vip || !p.vips.has(st.vip) || !st.announced) continue;
      const rest = this.serving(st.vip).filter((x) => x !== p);
      try {
        this.route(st, rest);
      } catch (e) {
        this.s.logger.error('lb: VIP not re-routed without a leaving LB pod; the next pass retries', { pod, service: st.key, vip: st.vip, error: (e as Error).message });
      }
      if (!rest.length) withdrawn.push(st.vip);
    }
    this.down(pod, p);
    request();
    this.s.logger.info('lb: LB pod leaving; taken out of the VIP routes, draining', { pod, withdrawn, ms: DRAIN_MS });
    await new Promise((res) => setTimeout(res, DRAIN_MS));
  }
}

function unroute(h: NetlinkHandle, vip: string, tables: number[]): void {
  for (const table of [...tables].reverse()) {
    try {
      h.deleteRoute({ dst: hostPrefix(vip), table });
    } catch (e) {
      if (!isNetlinkError(e, 'ESRCH', 'ENOENT')) throw e;
    }
  }
}
