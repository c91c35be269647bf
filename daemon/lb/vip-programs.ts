// The node's datapath for the VIPs that hold a slot here (a local LB pod serves them): ports and targets of
// each (its Maglev row is table-switch.ts's), and a slot cleared when its VIP leaves it. Only bpf/lb.ts touches the kernel.
import type { ResolvedLoadBalancer } from './lb-spec';
import type { LbShared } from './lb-state';

export class VipPrograms {
  constructor(
    private readonly s: LbShared,
    /** The datapath flags beyond affinity (table-switch.ts: quiet while no table change is under way). */
    private readonly flags: (lb: ResolvedLoadBalancer, vip: string) => number,
    /** Whether this node is the VIP's expirer: it alone clears a removed target's mappings from the store. */
    private readonly expirer: (vip: string) => boolean,
  ) {}

  /** Programs every slotted Service; idempotent (rows and targets are rewritten only when they change). */
  apply(slotted: ResolvedLoadBalancer[]): void {
    const dp = this.s.dp;
    if (!dp) return;
    for (const lb of slotted) {
      const st = this.s.vips.get(lb.key)!;
      const vip = st.vip!;
      dp.setService(vip, st.slot!, lb.ports.map((p) => ({ port: p.port, proto: p.proto })), this.flags(lb, vip));
      const targets = new Map(lb.targets.map((t) => [t.address, t.state]));
      const tkey = JSON.stringify([...targets].sort());
      if (tkey !== st.targets) {
        // Targets first, then the row: a new target is valid before Maglev hands it clients; a removed
        // one is void (its clients re-picked) before the row forgets it.
        const removed = st.targets ? (JSON.parse(st.targets) as Array<[string, string]>).map(([a]) => a).filter((a) => !targets.has(a)) : [];
        dp.setTargets(vip, targets);
        const dropped = removed.length ? dp.deleteMappings((m) => m.vip === vip && removed.includes(m.target)) : 0;
        // In the store, once (by the VIP's expirer); elsewhere such mappings are void (the target is not
        // listed) and expire idle.
        if (this.expirer(vip)) for (const t of removed) void this.s.o.store?.mappings.dropTarget(vip, t).catch(() => undefined);
        if (removed.length) this.s.logger.info('lb: targets removed; their clients move', { service: lb.key, vip, targets: removed, mappingsDropped: dropped });
        st.targets = tkey;
      }
    }
  }

  /** A VIP left its slot: its ports, targets, row and mappings go from the datapath; its counters restart. */
  clear(vip: string, slot: number): void {
    const dp = this.s.dp;
    if (!dp) return;
    dp.removeService(vip, slot);
    dp.resetStats(slot);
    this.s.logger.info('lb: VIP slot released (no local LB pod serves it)', { vip, slot });
  }
}
