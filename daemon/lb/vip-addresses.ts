// Each Service's VIP: requested or from its loadBalancer pool, allocated idempotently per Service (every
// node that asks names the same owner and gets the same address), released when the Service goes or asks
// for another; after the store lost its data, the VIPs this node holds are put back under their Services.
// A node asks only for the VIPs it needs (the caller says which: a local LB pod selects the Service, a
// local pod is one of its targets; tether-operator, which holds every VIP for the Services' status, asks
// for all): a Service no local pod concerns costs this node no store command. A Service
// whose need here ends is forgotten here only — its VIP stays allocated in the store, for the nodes that
// still serve it. Releasing (the Service deleted, or asking for another pool or address) is done by every
// holder of the VIP then, the operator among them; the one whose release freed it drops its mappings from
// the store. A Service deleted while nobody held its VIP (no operator then) is collected by the operator:
// an lb/ owner of a loadBalancer pool that no Service of its configuration names, seen so on two looks at
// least ORPHAN_GRACE_MS apart, is released and its mappings dropped.
// A node that needs a VIP while the store is unreachable takes it from where it was last recorded — the
// Service's status (the operator writes the store's allocation there), else this node's own record of the
// VIPs it learned (vip-record.ts) — and serves it provisionally: once the store answers, the same request
// confirms it, or the VIP is withdrawn (the store gives the Service another, or refuses it).
import { ErrorCode, TetherError } from '../../lib/errors';
import type { ResolvedLoadBalancer } from './lb-spec';
import { ownerOf, type LbShared, type VipState } from './lb-state';
import { dropVip } from './lb-store';
import { VipRecord, type RecordedVip } from './vip-record';

/**
 * New VIPs asked for per pass: 10,000 Services appearing at once are allocated over many short passes,
 * between which pods, routes and mappings keep being served (and the programming stays fresh).
 */
export const ALLOCATE_PER_PASS = 200;

/** How long an owner no Service names must stay so before it is collected (a node's view may be ahead of the leader's). */
export const ORPHAN_GRACE_MS = 60_000;

export class VipAddresses {
  /** The cluster store's generation last seen (a new one: the store lost its data). */
  private generation?: string;
  /** Owners ("pool\nowner") no Service names, with when that was first seen. */
  private readonly orphans = new Map<string, number>();
  private readonly record: VipRecord;

  constructor(
    private readonly s: LbShared,
    /** Called before a VIP is given up: its routes go first. */
    private readonly withdraw: (st: VipState) => void,
  ) {
    this.record = new VipRecord(s.o.stateDir, s.logger);
  }

  /**
   * Converges the VIPs to the Services: `wiped` when the store lost its data since the last look, `more`
   * when Services still wait for their first allocation attempt (the caller runs another pass).
   */
  async apply(lbs: Map<string, ResolvedLoadBalancer>, needed: Set<string>, opts: { keepRecord?: boolean } = {}): Promise<{ wiped: boolean; more: boolean }> {
    const wiped = await this.reassert();
    await this.release(lbs, needed);
    const more = await this.allocate(lbs, needed);
    // Only once the Services are known: a pass before the configuration holds nothing, and must not forget.
    if (opts.keepRecord) {
      const held = new Map<string, RecordedVip>();
      for (const st of this.s.vips.values()) if (st.vip) held.set(st.key, { pool: st.pool, vip: st.vip });
      this.record.save(held);
    }
    return { wiped, more };
  }

  /**
   * After the store lost its data (restarted empty, FLUSHALL: a new generation), every VIP this node
   * holds is put back under its Service, before anyone may be given it (the store holds new allocations
   * back meanwhile): a Service keeps its VIP, and no other owner gets it.
   */
  private async reassert(): Promise<boolean> {
    const a = this.s.o.addresses;
    const held = [...this.s.vips.values()].filter((v) => v.vip);
    // Holding nothing, nothing is re-asserted: no look at the generation (the first VIP held starts afresh).
    if (!held.length) {
      this.generation = undefined;
      return false;
    }
    if (this.s.storeAway) return false; // asked again on a pass that reaches the store
    let g: string;
    try {
      g = await a.generation();
    } catch {
      return false; // no store, or unreachable: the next pass asks again
    }
    if (g === this.generation) return false;
    const first = this.generation === undefined;
    if (!first && held.length) {
      this.s.logger.warn('lb: cluster store lost its data; re-asserting the VIPs this node serves', { vips: held.map((v) => v.vip), generation: g });
      await a.markRestarted(g);
      for (const st of held) {
        try {
          await a.reassert(st.pool, ownerOf(st.key), st.vip!);
          this.s.logger.info('lb: VIP re-asserted', { service: st.key, vip: st.vip, pool: st.pool });
        } catch (e) {
          if (e instanceof TetherError && e.code === ErrorCode.AddressConflict) {
            this.s.logger.error('lb: VIP this Service uses was given to another owner while the store was empty', { service: st.key, vip: st.vip, error: e.message });
            continue;
          }
          this.s.logger.warn('lb: VIP not re-asserted yet; retried', { service: st.key, vip: st.vip, error: (e as Error).message });
          return false; // the generation stays unseen: the next pass re-asserts again
        }
      }
    }
    this.generation = g;
    return !first;
  }

  private async release(lbs: Map<string, ResolvedLoadBalancer>, needed: Set<string>): Promise<void> {
    for (const [key, st] of this.s.vips) {
      const lb = lbs.get(key);
      const changed = lb && (lb.vip.pool !== st.pool || (lb.vip.address !== undefined && lb.vip.address !== st.vip));
      if (lb && !changed) {
        // No longer needed here, and nothing of it left on this node (its slot given back, its routes
        // withdrawn, no local target): forgotten here, not released (other nodes may serve it).
        if (!needed.has(key) && st.slot === undefined && !st.announced && !this.inUse(st)) {
          this.s.vips.delete(key);
          if (st.vip) this.s.logger.info('lb: VIP no longer needed on this node; forgotten here, kept allocated in the store', { service: key, vip: st.vip });
        }
        continue;
      }
      if (st.vip) this.withdraw(st);
      let freed: string[];
      try {
        freed = await this.s.o.addresses.release(st.pool, ownerOf(key));
      } catch (e) {
        this.s.logger.warn('lb: VIP release failed; retried', { service: key, error: (e as Error).message });
        continue;
      }
      if (st.vip) this.s.logger.info('lb: VIP released', { service: key, vip: st.vip, pool: st.pool });
      // The one node whose release freed the VIP (the others find it freed already) removes its mappings
      // and expirer lease from the store: nothing of a deleted Service stays there, and a Service given
      // the address later starts with no stale mappings.
      if (st.vip && freed.includes(st.vip) && this.s.o.store) {
        const vip = st.vip;
        await dropVip(this.s.o.store, vip).then(
          () => this.s.logger.info('lb: mappings of a released VIP removed from the store', { service: key, vip }),
          (e: Error) => this.s.logger.warn('lb: mappings of a released VIP not removed from the store (left there)', { service: key, vip, error: e.message }),
        );
      }
      this.s.vips.delete(key);
    }
  }

  /**
   * tether-operator's: releases the VIPs of Services that no longer exist and that no node held
   * when they went (their owner in a loadBalancer pool named by no Service here, on two looks at least
   * ORPHAN_GRACE_MS apart), and drops their mappings. Returns the VIPs collected.
   */
  async collect(lbs: Map<string, ResolvedLoadBalancer>, now = Date.now()): Promise<string[]> {
    const a = this.s.o.addresses;
    const named = new Set([...lbs.values()].map((l) => `${l.vip.pool}\n${ownerOf(l.key)}`));
    const seen = new Set<string>();
    const out: string[] = [];
    for (const pool of a.loadBalancerPools()) {
      const owners = new Set([...(await a.holders(pool)).values()].filter((o) => o.startsWith('lb/')));
      for (const owner of owners) {
        const k = `${pool}\n${owner}`;
        if (named.has(k)) continue;
        seen.add(k);
        const first = this.orphans.get(k);
        if (first === undefined) this.orphans.set(k, now);
        if (first === undefined || now - first < ORPHAN_GRACE_MS) continue;
        const freed = await a.release(pool, owner);
        this.orphans.delete(k);
        this.s.logger.info('lb: VIP of a Service that no longer exists collected (no node held it when it went)', { owner, pool, vips: freed });
        for (const vip of freed) {
          out.push(vip);
          const store = this.s.o.store;
          if (store) await dropVip(store, vip).catch((e: Error) => this.s.logger.warn('lb: mappings of a collected VIP not removed from the store (left there)', { owner, vip, error: e.message }));
        }
      }
    }
    for (const k of this.orphans.keys()) if (!seen.has(k)) this.orphans.delete(k);
    return out;
  }

  /** A local LB pod or target pod still carries the VIP. */
  private inUse(st: VipState): boolean {
    if (!st.vip) return false;
    for (const p of this.s.lbPods.values()) if (p.vips.has(st.vip)) return true;
    for (const t of this.s.targets.values()) if (t.vips.has(st.vip)) return true;
    return false;
  }

  /** Where the Service's VIP was last recorded: its status (the operator's), else this node's record. */
  private lastRecorded(lb: ResolvedLoadBalancer): { vip: string; from: NonNullable<VipState['provisional']> } | undefined {
    if (lb.vip.recorded) return { vip: lb.vip.recorded, from: 'Service status' };
    const mine = this.record.get(lb.key, lb.vip.pool);
    // A requested address the record does not match is the Service's new wish: not served from the record.
    if (mine && (lb.vip.address === undefined || lb.vip.address === mine)) return { vip: mine, from: 'node record' };
    return undefined;
  }

  private serveRecorded(st: VipState, last: { vip: string; from: NonNullable<VipState['provisional']> }, why: string): void {
    st.vip = last.vip;
    st.provisional = last.from;
    st.problem = undefined;
    this.s.logger.warn('lb: cluster store unreachable: VIP taken from its record, served until the store confirms it', { service: st.key, vip: last.vip, from: last.from, error: why });
  }

  /** A provisional VIP the store does not confirm: its routes go, and the Service starts afresh on the next pass. */
  private giveUp(st: VipState): void {
    this.withdraw(st);
    this.s.vips.delete(st.key);
  }

  private async allocate(lbs: Map<string, ResolvedLoadBalancer>, needed: Set<string>): Promise<boolean> {
    let asked = 0;
    let more = false;
    for (const key of needed) {
      const lb = lbs.get(key);
      if (!lb) continue;
      let st = this.s.vips.get(lb.key);
      if (st?.vip && !st.provisional) continue;
      // Past the limit: a new Service makes the caller run another pass at once; one refused before is
      // asked again on a later tick (a refusal does not spin).
      if (asked >= ALLOCATE_PER_PASS) {
        more ||= !st;
        continue;
      }
      // The store did not answer this pass: a VIP served from its record waits for a pass that reaches it to
      // be confirmed, and a VIP needed now is served from its record without waiting for the store first.
      if (this.s.storeAway && st?.provisional) continue;
      const last = this.s.storeAway ? this.lastRecorded(lb) : undefined;
      if (last) {
        st ??= { key: lb.key, pool: lb.vip.pool, loaded: false, announced: false };
        this.s.vips.set(lb.key, st);
        this.serveRecorded(st, last, 'the cluster store does not answer');
        continue;
      }
      asked++;
      st ??= { key: lb.key, pool: lb.vip.pool, loaded: false, announced: false };
      this.s.vips.set(lb.key, st);
      try {
        const owner = ownerOf(lb.key);
        // The VIP's family asked for by name: a dual-stack pool gives each of a Service's VIPs its own.
        const req = lb.vip.address ? { pool: lb.vip.pool, owner, addresses: [lb.vip.address] } : { pool: lb.vip.pool, owner, count: 1, family: lb.family === 'IPv6' ? (6 as const) : (4 as const) };
        const { addresses } = await this.s.o.addresses.allocate(req);
        if (st.provisional && st.vip !== addresses[0]) {
          this.s.logger.error('lb: the store gives the Service another VIP than the one served from its record; that one is withdrawn', { service: lb.key, served: st.vip, from: st.provisional, store: addresses[0] });
          this.giveUp(st);
          continue;
        }
        if (st.provisional) this.s.logger.info('lb: VIP served from its record confirmed by the store', { service: lb.key, vip: st.vip, from: st.provisional });
        else this.s.logger.info('lb: VIP allocated', { service: lb.key, vip: addresses[0], pool: lb.vip.pool });
        st.vip = addresses[0];
        st.provisional = undefined;
        st.problem = undefined;
      } catch (e) {
        const refused = e instanceof TetherError && (e.code === ErrorCode.AddressConflict || e.code === ErrorCode.PoolExhausted || e.code === ErrorCode.UnknownPool);
        if (refused && st.provisional) {
          this.s.logger.error('lb: VIP served from its record refused by the store; withdrawn', { service: lb.key, vip: st.vip, from: st.provisional, error: (e as Error).message });
          this.giveUp(st);
          continue;
        }
        // Not refused: the store did not answer (or holds new allocations back). Served meanwhile from
        // where the VIP was last recorded, if anywhere; confirmed on a later pass.
        if (st.provisional) continue;
        const recorded = refused ? undefined : this.lastRecorded(lb);
        if (recorded) {
          this.serveRecorded(st, recorded, (e as Error).message);
          continue;
        }
        const msg = refused ? (e as Error).message : `VIP not allocated yet: ${(e as Error).message}`;
        if (st.problem !== msg) this.s.logger.error('lb: VIP refused', { service: lb.key, problem: msg });
        st.problem = msg;
      }
    }
    return more;
  }
}
