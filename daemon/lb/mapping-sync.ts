// The store side of the mappings on one node, for the VIPs that hold a slot here (a local LB pod serves
// them): new mappings the datapath picked are written (first writer wins) within ~20 ms; mappings other
// nodes recorded arrive on the VIP's channel (subscribed only while the VIP is served here) and are
// installed; before a VIP is announced its mappings are loaded in pages. At a fraction of the shortest
// idle timeout (¼, 1 to 30 s) the node reads its map once: idle mappings expire locally, the ones used
// since the last sync are touched in the store in one batch per bucket, and for each VIP whose expirer
// lease this node holds, idle mappings expire in the store. With the store away, forwarding goes on from
// the local maps and new mappings queue; when it is back, only what changed meanwhile is written back and
// read (everything only after a start or after the store lost its data).
import type { LbMapping } from '../bpf/lb';
import { isOomReply, storeFullFailure, storeFullness } from '../common/store-full';
import type { MapKey } from '../bpf/lb-structs';
import { fieldOf, type StoredMapping } from './mapping-fields';
import type { ResolvedLoadBalancer } from './lb-spec';
import { groupByVip, nowNs, type LbShared, type VipState } from './lb-state';

/** How long a VIP waits for its mappings before it is announced anyway (the store is down). */
const LOAD_WAIT_MS = 3000;
/** Reads, touches and expiry run at this fraction of a VIP's idle timeout, within these bounds. */
const SYNC_FRACTION = 4;
const SYNC_MIN_MS = 1000;
const SYNC_MAX_MS = 30_000;
/** An expirer lease outlives this many of its holder's periods (a holder that goes is replaced after). */
const LEASE_PERIODS = 3;
/** What a node away from the store reads back: changes since its last sync, less this margin (clock skew). */
const CHANGED_MARGIN_MS = 2000;
/**
 * The mapping table is a plain hash (a flood of new flows never evicts a live connection's mapping): from
 * this fill on, mappings idle for PRESSURE_IDLE_S (or their own shorter timeout) expire locally, so a flood's
 * one-packet flows leave within a sync or two while flows that send keep theirs. Those installed from the
 * store and not used here since (lastNs 0) stay: they are what keeps a flow moved here by ECMP on its target.
 */
export const PRESSURE_FILL = 0.9;
export const PRESSURE_IDLE_S = 30;
/** A full table is logged at most this often (the datapath counts each flow: mappingFull). */
const FULL_LOG_MS = 10_000;

/** The period of a VIP's touches and store expiry. */
export function syncPeriodMs(idleTimeoutS: number): number {
  return Math.min(SYNC_MAX_MS, Math.max(SYNC_MIN_MS, Math.floor((idleTimeoutS * 1000) / SYNC_FRACTION)));
}

export interface MappingSyncStatus {
  expirer: boolean;
  subscribed: boolean;
  /** New mappings picked here and not yet written to the store (they wait while it is away). */
  queued: number;
}

export class MappingSync {
  /** New mappings this node picked, not yet in the store: VIP → field → mapping. */
  private readonly pending = new Map<string, Map<string, StoredMapping>>();
  private learnt: StoredMapping[] = [];
  private flushing = false;
  /** Served VIPs (with a slot here) → their Service. */
  private serving = new Map<string, ResolvedLoadBalancer>();
  /** The last store sync that went through: wall clock and CLOCK_MONOTONIC. */
  private synced?: { ms: number; ns: bigint };
  /** Something since then failed or the store reconnected: write back and read what changed. */
  private away = false;
  /** The store lost its data: write back everything held. */
  private wiped = false;
  private nextReadMs = 0;
  private readonly nextExpire = new Map<string, number>();
  private readonly expiring = new Set<string>();
  /** The table is nearly full (idle mappings expire sooner); when a full table was last logged. */
  /** Each family's mapping table is nearly full (each holds --lb-max-mappings). */
  private pressure = { 4: false, 6: false };
  private fullLoggedAt = 0;

  constructor(
    private readonly s: LbShared,
    /** Of a VIP's mappings, those the store must hold (table-switch.ts: record on change or every pick). */
    private readonly needsRecord: (vip: string, list: LbMapping[]) => LbMapping[] = (_vip, list) => list,
  ) {}

  start(): void {
    const store = this.s.o.store;
    store?.notices.on('mapping', (m: StoredMapping) => this.learned(m));
    store?.connection.on('ready', () => {
      this.away = true;
      this.nextReadMs = 0;
    });
    // Notices may have been missed while a Cluster shard's subscription was being made again (its primary
    // failed over): read back what changed, as after an absence.
    store?.notices.on('resubscribed', () => {
      this.away = true;
      this.nextReadMs = 0;
    });
  }

  /** The store lost its data (a new generation): everything held is written back on the next sync. */
  storeWiped(): void {
    this.wiped = true;
    this.nextReadMs = 0;
  }

  /** The VIPs served here now: only their notices are subscribed, only their mappings kept in sync. */
  async serve(slotted: ResolvedLoadBalancer[]): Promise<void> {
    this.serving = new Map(slotted.map((l) => [this.s.vips.get(l.key)!.vip!, l]));
    for (const vip of [...this.nextExpire.keys()]) {
      if (this.serving.has(vip)) continue;
      this.nextExpire.delete(vip);
      this.expiring.delete(vip);
    }
    // Every pass, not only on a change: a subscription that failed is retried (nothing is sent when the
    // subscriptions match already) — on a pass that reaches the store.
    if (!this.s.storeAway) await this.s.o.store?.notices.serve(this.serving.keys());
  }

  /** Whether this node holds vip's expirer lease (as of its last renewal). */
  expires(vip: string): boolean {
    return this.expiring.has(vip);
  }

  /** The datapath picked a target for a new client: queue it for the store. */
  picked(key: MapKey, target: string): void {
    const q = this.pending.get(key.vip) ?? new Map<string, StoredMapping>();
    q.set(fieldOf(key), { key, target });
    this.pending.set(key.vip, q);
  }

  /** Another LB pod recorded a mapping of a VIP served here: installed with the next poll's batch. */
  private learned(m: StoredMapping): void {
    if (this.s.dp && this.serving.has(m.key.vip)) this.learnt.push(m);
  }

  /** Every ~20 ms: new picks from the datapath, learnt mappings installed, queued ones written. */
  poll(): void {
    try {
      this.s.dp?.pollEvents();
      if (this.learnt.length) {
        const batch = this.learnt;
        this.learnt = [];
        this.installValid(batch);
      }
    } catch (e) {
      this.s.logger.warn('lb: reading or installing mappings failed', { error: (e as Error).message });
    }
    if (this.pending.size && this.s.o.store?.connection.connected) void this.flushPending();
  }

  private async flushPending(): Promise<void> {
    const store = this.s.o.store;
    if (this.flushing || !store) return;
    this.flushing = true;
    try {
      for (const [vip, q] of [...this.pending]) {
        const list = [...q.values()];
        const got = await store.mappings.claim(vip, list);
        storeFullness.written('lb');
        // Another LB pod was first for some clients: follow its choice.
        const lost = got.filter((m, i) => m.target !== list[i].target);
        if (lost.length) this.installValid(lost);
        for (const m of list) if (q.get(fieldOf(m.key)) === m) q.delete(fieldOf(m.key));
        if (!q.size) this.pending.delete(vip);
      }
    } catch (e) {
      this.away = true;
      storeFullFailure('lb', 'lb mapping store', 'new load-balancer mappings', e);
      this.s.logger.debug('lb: writing new mappings failed; kept queued', { error: (e as Error).message });
    } finally {
      this.flushing = false;
    }
  }

  /** Installs mappings whose VIP is served here and whose target the VIP still has; returns how many. */
  installValid(list: StoredMapping[]): number {
    const ok = list.filter((m) => this.serving.get(m.key.vip)?.targets.some((t) => t.address === m.target));
    const r = this.s.dp?.installMappings(ok);
    if (r?.full && Date.now() - this.fullLoggedAt >= FULL_LOG_MS) {
      this.fullLoggedAt = Date.now();
      this.s.logger.warn('lb: mapping table full: mappings from the store left out (those clients follow their Maglev pick here)', { leftOut: r.full, installed: r.installed, max: this.s.dp?.maxMappings });
    }
    return r ? r.installed : ok.length;
  }

  /** Before a VIP is announced: its mappings, loaded from the store page by page and installed as read. */
  async ensureLoaded(lb: ResolvedLoadBalancer, st: VipState): Promise<void> {
    st.loadStarted ??= Date.now();
    const store = this.s.o.store;
    if (!store) {
      st.loaded = true;
      return;
    }
    const waited = Date.now() - st.loadStarted > LOAD_WAIT_MS;
    if (!store.connection.connected || this.s.storeAway) {
      if (waited) {
        st.loaded = true;
        this.s.logger.warn('lb: mapping store unreachable; VIP announced with the mappings this node holds', { service: lb.key, vip: st.vip });
      }
      return;
    }
    // Loaded once the VIP's new mappings reach this node too, so none falls between load and notice (past
    // the wait, loaded anyway: a notice channel that does not come back must not keep the VIP dark).
    if (!store.notices.hears(st.vip!) && !waited) return;
    try {
      const t0 = Date.now();
      let installed = 0;
      const { loaded, garbled } = await store.mappings.loadPages(st.vip!, (page) => {
        installed += this.installValid(page);
      });
      st.loaded = true;
      this.s.logger.info('lb: mappings loaded before announcing', { service: lb.key, vip: st.vip, installed, stale: loaded - installed, garbled, ms: Date.now() - t0 });
    } catch (e) {
      // Past the wait a store that is connected but does not answer (hung, partitioned) keeps the VIP dark no
      // longer than one that is down.
      if (waited) {
        st.loaded = true;
        this.s.logger.warn('lb: loading mappings failed past the wait; VIP announced with the mappings this node holds', { service: lb.key, vip: st.vip, error: (e as Error).message });
        return;
      }
      this.s.logger.warn('lb: loading mappings failed; retried', { service: lb.key, vip: st.vip, error: (e as Error).message });
    }
  }

  /** A VIP left its slot: the next LB pod for it loads its mappings again before announcing. */
  released(st: VipState): void {
    st.loaded = false;
    st.loadStarted = undefined;
    st.targets = undefined;
  }

  /** Each pass: at the sync period (or at once after an absence), the store and local expiry work. */
  async sync(): Promise<void> {
    const dp = this.s.dp;
    if (!dp || !this.serving.size) return;
    const nowMs = Date.now();
    if (nowMs < this.nextReadMs) return;
    const periods = [...this.serving.values()].map((l) => syncPeriodMs(l.idleTimeoutS));
    this.nextReadMs = nowMs + Math.min(...periods);
    const ns = nowNs();
    const all = dp.mappings();
    // Local idle expiry by each VIP's timeout (sooner while the table is nearly full), from the one read of
    // the map this sync makes.
    // Per family: each family's VIPs have their own table (lb_mappings, lb_mappings6) of maxMappings entries.
    const counts = { 4: 0, 6: 0 };
    for (const m of all) counts[m.vip.includes(':') ? 6 : 4]++;
    for (const f of [4, 6] as const) {
      const pressure = counts[f] >= dp.maxMappings * PRESSURE_FILL;
      if (pressure === this.pressure[f]) continue;
      const family = f === 4 ? 'IPv4' : 'IPv6';
      if (pressure) this.s.logger.warn('lb: mapping table nearly full: mappings idle for a while expire sooner', { family, mappings: counts[f], max: dp.maxMappings, idleSeconds: PRESSURE_IDLE_S });
      else this.s.logger.info('lb: mapping table no longer nearly full', { family, mappings: counts[f], max: dp.maxMappings });
      this.pressure[f] = pressure;
    }
    const pressed = (vip: string) => this.pressure[vip.includes(':') ? 6 : 4];
    const idleS = (vip: string, l: ResolvedLoadBalancer) => (pressed(vip) ? Math.min(l.idleTimeoutS, PRESSURE_IDLE_S) : l.idleTimeoutS);
    const idle = new Map([...this.serving].map(([vip, l]) => [vip, BigInt(idleS(vip, l)) * 1_000_000_000n]));
    const isIdle = (m: LbMapping) => {
      const limit = idle.get(m.vip);
      return limit !== undefined && m.lastNs > 0n && ns - m.lastNs > limit;
    };
    const expired = dp.deleteMappingKeys(all.filter(isIdle));
    if (expired) this.s.logger.info('lb: idle mappings expired', { count: expired, ...(this.pressure[4] || this.pressure[6] ? { underPressure: true } : {}) });
    const store = this.s.o.store;
    if (!store) return;
    if (!store.connection.connected || this.s.storeAway) {
      this.away = true;
      return;
    }
    // Only what the store must hold: in record-on-change mode the flows a change moved, not every flow.
    const byVip = new Map([...groupByVip(all.filter((m) => !isIdle(m) && this.serving.has(m.vip)))].map(([vip, list]) => [vip, this.needsRecord(vip, list)]));
    try {
      const full = this.synced === undefined || this.wiped;
      // Mappings recorded (what a full store refuses; touches run on a full one too).
      let wrote = false;
      try {
        if (full || this.away) wrote = (await this.writeBack(byVip, full)) > 0;
        // The steady state: one batched touch per VIP of what was used since the last sync.
        else await this.touchUsed(byVip, this.synced!.ns, nowMs);
      } catch (e) {
        // A full store refuses mappings written back, but takes touches, and its expiry still runs:
        // deleting idle mappings is what frees it (touched first, so only idle ones go). What was not
        // written is written back (as after an absence) once it takes writes again.
        if (!storeFullFailure('lb', 'lb mapping store', 'load-balancer mappings written back', e)) throw e;
        await this.touchUsed(byVip, this.synced?.ns ?? 0n, nowMs);
        await this.expireStore(nowMs);
        throw e;
      }
      if (wrote) storeFullness.written('lb');
      await this.expireStore(nowMs);
      this.synced = { ms: nowMs, ns };
      this.away = false;
      this.wiped = false;
    } catch (e) {
      this.away = true;
      // Retried at once, unless the store is full: then at the next period (the expiry that frees it ran).
      if (!isOomReply(e)) this.nextReadMs = 0;
      this.s.logger.debug('lb: mapping store sync failed; retried', { error: (e as Error).message });
    }
  }

  /** Marks the mappings used since `sinceNs` as used in the store (touches: a full store takes them). */
  private async touchUsed(byVip: Map<string, LbMapping[]>, sinceNs: bigint, nowMs: number): Promise<void> {
    const store = this.s.o.store!;
    for (const [vip, list] of byVip) {
      const used = list.filter((m) => m.lastNs > sinceNs);
      if (used.length) await store.mappings.touch(vip, used, nowMs);
    }
  }

  /**
   * After a start or a wipe (full): every mapping held is written (first writer wins keeps others' choices),
   * and after a wipe every served VIP read back. After an absence: only mappings new or used since the last sync are
   * written and touched, and only what others recorded or used meanwhile is read.
   */
  private async writeBack(byVip: Map<string, LbMapping[]>, full: boolean): Promise<number> {
    const store = this.s.o.store!;
    const t0 = Date.now();
    const since = this.synced;
    let written = 0;
    let read = 0;
    for (const [vip, list] of byVip) {
      const changed = full || !since ? list : list.filter((m) => m.lastNs > since.ns);
      if (!changed.length) continue;
      const got = await store.mappings.claim(vip, changed.map((m) => ({ key: m, target: m.target })));
      written += changed.length;
      const differ = got.filter((g, i) => g.target !== changed[i].target);
      if (differ.length) this.installValid(differ);
      if (!full) await store.mappings.touch(vip, changed);
    }
    // Read back: after a wipe everything (others wrote theirs back too); after an absence what changed
    // meanwhile; after a start nothing (a VIP loads everything before it is announced, subscribed first).
    const wiped = this.wiped;
    for (const [vip, lb] of this.serving) {
      const st = this.s.vips.get(lb.key);
      if (!st?.loaded) continue; // it loads everything before it is announced anyway
      const install = (page: StoredMapping[]) => {
        read += page.length;
        this.installValid(page);
      };
      if (wiped) await store.mappings.loadPages(vip, install);
      else if (since) await store.mappings.loadChangedSince(vip, since.ms - CHANGED_MARGIN_MS, install);
    }
    const what = wiped ? 'lb: mapping store lost its data: local mappings written back and reloaded'
      : full ? 'lb: local mappings written back (first sync since start)' : 'lb: mapping store back: what changed meanwhile written back and read';
    this.s.logger.info(what, { written, read, ms: Date.now() - t0 });
    return written;
  }

  /** For each served VIP due: take or renew its expirer lease; the holder expires its idle mappings. */
  private async expireStore(nowMs: number): Promise<void> {
    const store = this.s.o.store!;
    for (const [vip, lb] of this.serving) {
      if (nowMs < (this.nextExpire.get(vip) ?? 0)) continue;
      const period = syncPeriodMs(lb.idleTimeoutS);
      this.nextExpire.set(vip, nowMs + period);
      const mine = await store.leases.take(vip, this.s.o.node.name, period * LEASE_PERIODS);
      if (mine !== this.expiring.has(vip)) this.s.logger.info(mine ? 'lb: this node expires the VIP\'s idle mappings' : 'lb: another node expires the VIP\'s idle mappings', { service: lb.key, vip });
      if (mine) this.expiring.add(vip);
      else this.expiring.delete(vip);
      if (!mine) continue;
      const gone = await store.mappings.expire(vip, lb.idleTimeoutS, nowMs);
      if (gone.length) this.s.logger.info('lb: idle mappings expired in the store', { service: lb.key, vip, count: gone.length });
    }
  }

  status(vip: string | undefined): MappingSyncStatus | undefined {
    if (!vip || !this.serving.has(vip)) return undefined;
    return { expirer: this.expiring.has(vip), subscribed: this.s.o.store?.notices.hears(vip) ?? false, queued: this.pending.get(vip)?.size ?? 0 };
  }
}
