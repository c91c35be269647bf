// The node's VIP slot budget. The datapath's maps are sized at start for --lb-max-vips VIPs; a VIP takes
// a slot only on a node with a local LB pod for it, so the budget is per node and the cluster has no cap.
// A slot stays with its VIP while a local LB pod serves it, and for a release delay after the last one
// goes (an LB pod restarted in place finds its VIP, mappings and counters where they were); a VIP whose
// Service is gone gives its slot back at once. A VIP that finds no slot free is refused on this node only,
// by name, and takes nothing from a VIP that holds one: nothing that serves stops.
export const SLOT_RELEASE_MS = 60_000;

export interface SlotChanges {
  /** VIPs given a slot now. */
  assigned: Array<{ vip: string; slot: number }>;
  /** VIPs that left their slot (the datapath clears the slot). */
  released: Array<{ vip: string; slot: number }>;
  /** VIPs wanted here that got no slot. */
  overflow: string[];
}

export class VipSlots {
  private readonly byVip = new Map<string, { slot: number; wantedAt: number }>();

  constructor(
    readonly max: number,
    private readonly releaseMs = SLOT_RELEASE_MS,
  ) {
    if (!Number.isInteger(max) || max < 1) throw new Error(`VIP slots: ${max} is not a positive whole number`);
  }

  /**
   * Slots a previous run of tetherd left programmed (from the pinned maps): each VIP keeps its slot, so
   * its Maglev row and counters stay valid across the restart. Slots out of range are ignored.
   */
  adopt(prior: Map<string, number>, now = Date.now()): void {
    const used = new Set([...this.byVip.values()].map((s) => s.slot));
    for (const [vip, slot] of prior) {
      if (this.byVip.has(vip) || used.has(slot) || slot < 0 || slot >= this.max) continue;
      this.byVip.set(vip, { slot, wantedAt: now });
      used.add(slot);
    }
  }

  /**
   * wanted: the VIPs a local LB pod serves now (in a stable order: who is first gets a slot first);
   * served: every VIP this node knows a Service for. Idempotent.
   */
  apply(wanted: string[], served: Set<string>, now = Date.now()): SlotChanges {
    const out: SlotChanges = { assigned: [], released: [], overflow: [] };
    const want = new Set(wanted);
    for (const [vip, s] of this.byVip) {
      if (want.has(vip)) s.wantedAt = now;
      else if (!served.has(vip) || now - s.wantedAt >= this.releaseMs) {
        this.byVip.delete(vip);
        out.released.push({ vip, slot: s.slot });
      }
    }
    const used = new Set([...this.byVip.values()].map((s) => s.slot));
    let next = 0;
    for (const vip of wanted) {
      if (this.byVip.has(vip)) continue;
      while (next < this.max && used.has(next)) next++;
      if (next >= this.max) {
        out.overflow.push(vip);
        continue;
      }
      this.byVip.set(vip, { slot: next, wantedAt: now });
      used.add(next);
      out.assigned.push({ vip, slot: next });
    }
    return out;
  }

  slotOf(vip: string): number | undefined {
    return this.byVip.get(vip)?.slot;
  }

  /** VIPs holding a slot. */
  held(): string[] {
    return [...this.byVip.keys()];
  }

  get used(): number {
    return this.byVip.size;
  }
}

/** The problem a VIP without a slot has on this node, for status and the log. */
export function overflowProblem(node: string, vip: string, max: number): string {
  return `no VIP slot left on node ${node}: all ${max} are held by VIPs with LB pods here (tetherd --lb-max-vips); VIP ${vip} is not served by this node's LB pods`;
}
