// Each slotted VIP's Maglev row on this node, and when a flow needs a record in the store.
//
// Record on change (Services with externalTrafficPolicy Cluster, with a store): while a VIP's target set
// holds still every LB node picks the same target for a client, so a flow that ECMP moves to another LB
// node keeps its target without any record, and the datapath reports nothing (LB_F_QUIET). When the
// target set changes, the new row is a table version agreed through the store (table-versions.ts): each LB
// node of the VIP records the flows of its local map that the new row would move, acknowledges, and only
// once every live LB node has does any of them write the new row; until a few seconds after it did, new
// picks are recorded too (a flow that starts during the switch). So the store holds mappings only for
// flows a change moved, and a change costs about (live flows ÷ targets) records, not one per connection.
//
// Record every pick (externalTrafficPolicy Local, whose rows differ per node; or no store): the row is
// written as soon as the configuration changes, and the datapath reports every new pick.
//
// The store away: a change waits (the row stays the active version every LB node has), except that a
// target this node no longer knows gets no new client (its entries take the new row's picks: patchTable).
// A node that starts with the store away writes the row of its configuration.
import { LB_F_PER_FLOW, LB_F_QUIET, decodeMapKey, lbHashKeyBytes } from '../bpf/lb-structs';
import { formatV4, formatV6, ipFamily, ipToBytes, v4ToUint32 } from '../../lib/ip';
import { LB_HASH_SEED, type LbMapping } from '../bpf/lb';
import type { StoredMapping } from './mapping-fields';
import { maglevTable, patchTable, pickOf, type MaglevTable } from './maglev';
import type { ResolvedLoadBalancer } from './lb-spec';
import type { LbShared } from './lb-state';
import type { TableState, TableVersion } from './table-versions';

/** A member beats this often; one silent for MEMBER_TTL_MS no longer holds a change back. */
export const BEAT_MS = 1000;
/**
 * How long a killed LB node holds a change back. Its flows reach the other LB nodes once its route is
 * withdrawn (BGP hold time, BFD); those that arrive before the change takes effect keep the old pick and
 * are recorded, so this should exceed the route's withdrawal time.
 */
export const MEMBER_TTL_MS = 8000;
/** The table hash lapses this long after the last step of any member. */
const KEY_TTL_MS = 120_000;
/** After a failed step the store is left alone this long (the next pass or beat asks again). */
const AWAY_MS = 3000;
/** While a change waits, its state is read this often. */
const STEP_MS = 50;
/** After a row is written, new picks are still recorded this long (other LB nodes switch around then too). */
export const SETTLE_MS = 3000;
/** Records of the change are read back from this long before it was proposed (clock skew between nodes). */
const MARGIN_MS = 2000;

export type RecordMode = 'change' | 'pick';

interface VipTable {
  service: string;
  vip: string;
  slot: number;
  /** The affinity's datapath flags (LB_F_PER_FLOW or 0). */
  base: number;
  mode: RecordMode;
  /** The row this node's configuration wants (active targets it may pick, sorted, joined). */
  want: string;
  /** The VIP's targets (any state): a mapping or an entry to another one is void here. */
  known: Set<string>;
  active?: TableVersion;
  next?: TableVersion;
  /** The live members that have not acknowledged next (as of the last step). */
  waiting?: string[];
  /** When this node first saw the change waiting (records of it are read back from then). */
  nextSeenMs?: number;
  acked?: number;
  /** What the datapath row holds ("<active row>" or "<active row>><wanted row>" when patched), and that table. */
  written?: string;
  table?: MaglevTable;
  /** The active version the written row is (undefined while it is the configuration's, in an outage at start). */
  writtenVersion?: number;
  /** New picks are reported (recorded) until then. */
  recordUntil: number;
  nextStepAt: number;
  quiet?: boolean;
}

export interface TableSwitchStatus {
  mode: RecordMode;
  version?: number;
  /** A change waits: its version, and the LB nodes that have not acknowledged it. */
  pending?: { version: number; waitingFor: string[] };
  recording: boolean;
}

export class TableSwitch {
  private readonly vips = new Map<string, VipTable>();
  private running: Promise<void> = Promise.resolve();
  private readonly memberTtlMs: number;
  /** The store is not asked until then (a step failed). */
  private awayUntil = 0;

  constructor(
    private readonly s: LbShared,
    /** Targets new clients may be given here. */
    private readonly pickable: (lb: ResolvedLoadBalancer) => ResolvedLoadBalancer['targets'],
    /** Installs mappings read from the store (MappingSync.installValid). */
    private readonly install: (page: StoredMapping[]) => number,
  ) {
    this.memberTtlMs = s.o.changeWaitMs ?? MEMBER_TTL_MS;
  }

  /** How a Service's flows are recorded on this node. */
  modeOf(lb: ResolvedLoadBalancer): RecordMode {
    return this.s.o.store && lb.externalTrafficPolicy !== 'Local' ? 'change' : 'pick';
  }

  /** The datapath flags this node wants for vip beyond its affinity: quiet while no change is under way. */
  flags(vip: string): number {
    const t = this.vips.get(vip);
    return t && this.isQuiet(t) ? LB_F_QUIET : 0;
  }

  /** Per pass, after the VIPs' services and targets are programmed: each slotted VIP's row. */
  apply(slotted: ResolvedLoadBalancer[]): Promise<void> {
    return this.serial(() => this.applyNow(slotted));
  }

  /** Every poll: VIPs with a change under way (or a beat due) are stepped. */
  tick(): void {
    const now = Date.now();
    let due = false;
    for (const t of this.vips.values()) {
      if (t.mode !== 'change') continue;
      if (now >= t.nextStepAt || t.quiet !== this.isQuiet(t, now)) due = true;
    }
    if (due) void this.serial(() => this.stepDue()).catch(() => undefined);
  }

  /**
   * Of vip's mappings, those the store must hold: in record-on-change mode only those whose target the
   * row written here would not pick (a change moved them); every one in record-every-pick mode.
   */
  needsRecord(vip: string, list: LbMapping[]): LbMapping[] {
    const t = this.vips.get(vip);
    if (!t || t.mode !== 'change' || !t.table) return list;
    const table = t.table;
    return list.filter((m) => pickOf(table, m, LB_HASH_SEED) !== m.target);
  }

  status(vip: string): TableSwitchStatus | undefined {
    const t = this.vips.get(vip);
    if (!t) return undefined;
    return {
      mode: t.mode,
      ...(t.writtenVersion !== undefined ? { version: t.writtenVersion } : {}),
      ...(t.next ? { pending: { version: t.next.version, waitingFor: t.waiting ?? [] } } : {}),
      recording: !this.isQuiet(t),
    };
  }

  /** The last table computed (a change's row is computed to record its moves, then again to write it). */
  private lastTable?: { key: string; table: MaglevTable };

  private tableOf(targets: string[], size: number): MaglevTable {
    const key = `${size}:${targets.join(',')}`;
    if (this.lastTable?.key !== key) this.lastTable = { key, table: maglevTable(targets, size) };
    return this.lastTable.table;
  }

  /** No step starts any more; the one under way ends first. */
  async stop(): Promise<void> {
    this.stopped = true;
    await this.running;
  }

  private stopped = false;

  private serial(fn: () => Promise<void>): Promise<void> {
    const run = this.running.then(() => (this.stopped ? undefined : fn()));
    this.running = run.catch(() => undefined);
    return run;
  }

  private isQuiet(t: VipTable, now = Date.now()): boolean {
    return t.mode === 'change' && !this.s.earlierReleases && t.written !== undefined && !t.next && now >= t.recordUntil;
  }

  private async applyNow(slotted: ResolvedLoadBalancer[]): Promise<void> {
    const seen = new Set<string>();
    for (const lb of slotted) {
      const st = this.s.vips.get(lb.key)!;
      const vip = st.vip!;
      seen.add(vip);
      let t = this.vips.get(vip);
      const mode = this.modeOf(lb);
      if (!t || t.slot !== st.slot) {
        t = { service: lb.key, vip, slot: st.slot!, base: 0, mode, want: '', known: new Set(), recordUntil: 0, nextStepAt: 0 };
        this.vips.set(vip, t);
      }
      if (t.mode !== mode) {
        this.s.logger.info('lb: VIP\'s flows now recorded ' + (mode === 'change' ? 'on change' : 'at every pick'), { service: lb.key, vip });
        if (t.mode === 'change') void this.s.o.store?.tables.leave(vip, this.s.o.node.name).catch(() => undefined);
        t.mode = mode;
        t.active = t.next = undefined;
        t.written = undefined;
      }
      t.service = lb.key;
      t.base = affinityFlags(lb);
      t.want = this.pickable(lb).map((x) => x.address).sort().join(',');
      t.known = new Set(lb.targets.map((x) => x.address));
      if (t.mode === 'pick') this.write(t, t.want, '');
      else await this.stepOne(t).catch((e) => this.s.logger.debug('lb: table version step failed; the row stays, retried', { service: t?.service, vip, error: (e as Error).message }));
      this.setFlags(t);
    }
    for (const [vip, t] of this.vips) {
      if (seen.has(vip)) continue;
      this.vips.delete(vip);
      if (t.mode === 'change' && !this.s.storeAway) void this.s.o.store?.tables.leave(vip, this.s.o.node.name).catch(() => undefined);
    }
  }

  private async stepDue(): Promise<void> {
    const now = Date.now();
    for (const t of this.vips.values()) {
      if (t.mode !== 'change') continue;
      if (now >= t.nextStepAt) await this.stepOne(t).catch((e) => this.s.logger.debug('lb: table version step failed; retried', { service: t.service, vip: t.vip, error: (e as Error).message }));
      this.setFlags(t);
    }
  }

  /** One VIP in record-on-change mode: beat, propose, record and acknowledge, activate. */
  private async stepOne(t: VipTable): Promise<void> {
    const store = this.s.o.store!;
    // After a step failed (a store that hangs answers nothing until its command timeout), the store is not
    // asked again for AWAY_MS: steps must not hold the pass, which announces VIPs, behind that timeout.
    const away = this.s.storeAway || !store.connection.connected || Date.now() < this.awayUntil;
    if (away) {
      t.nextStepAt = Date.now() + BEAT_MS;
      // The change waits; a target this node no longer knows gets no new client meanwhile.
      this.hold(t);
      return;
    }
    const node = this.s.o.node.name;
    // A new table hash (first LB node, or the store restarted empty) starts from the row forwarded by here.
    const have = t.written?.split('>')[0] ?? t.want;
    const opts = { memberTtlMs: this.memberTtlMs, keyTtlMs: KEY_TTL_MS, have };
    let r: TableState;
    try {
      r = await store.tables.step(t.vip, node, t.want, opts);
      this.seen(t, r);
      if (r.next && r.next.row === t.want && t.acked !== r.next.version) {
        // Recording before the dump: a flow that starts after it is reported by the datapath.
        t.recordUntil = Number.MAX_SAFE_INTEGER;
        this.setFlags(t);
        await this.recordMoved(t, r.next);
        t.acked = r.next.version;
        r = await store.tables.step(t.vip, node, t.want, { ...opts, ack: r.next.version });
        this.seen(t, r);
      }
      t.nextStepAt = Date.now() + (t.next ? STEP_MS : BEAT_MS);
      await this.activate(t);
      this.awayUntil = 0;
    } catch (e) {
      this.awayUntil = Date.now() + AWAY_MS;
      t.nextStepAt = this.awayUntil;
      this.hold(t);
      throw e;
    }
  }

  private seen(t: VipTable, r: TableState): void {
    if (r.next && t.next?.version !== r.next.version) {
      t.nextSeenMs ??= Date.now();
      this.s.logger.info('lb: Maglev table change proposed: LB nodes record the flows it moves', { service: t.service, vip: t.vip, version: r.next.version, targets: r.next.row.split(',').filter(Boolean).length, members: r.members });
    }
    t.active = r.active;
    t.next = r.next;
    t.waiting = r.waiting;
  }

  /** The flows of this node's map that `next` would send elsewhere: recorded in the store. */
  private async recordMoved(t: VipTable, next: TableVersion): Promise<void> {
    const dp = this.s.dp;
    if (!dp) return;
    const t0 = Date.now();
    const table = this.tableOf(rowTargets(next.row), dp.maglevSize);
    // The VIP's family's map: an IPv6 VIP's flows are in lb_mappings6.
    const { flows, moved } = movedFlows(dp.mappingEntries(ipFamily(t.vip) === 6 ? 6 : 4), t.vip, t.known, table);
    if (moved.length) await this.s.o.store!.mappings.claim(t.vip, moved);
    this.s.logger.info('lb: flows a Maglev table change moves recorded', { service: t.service, vip: t.vip, version: next.version, flows, recorded: moved.length, ms: Date.now() - t0 });
  }

  /** The active version's row, once what its change recorded is installed here. */
  private async activate(t: VipTable): Promise<void> {
    const active = t.active!;
    const key = rowKey(active.row, this.unknown(t, active.row) ? t.want : '');
    if (key === t.written) return;
    const first = t.written === undefined;
    if (!first && this.s.o.store) {
      // The records of the change reach this node on the VIP's channel too; read here, none is missed.
      const since = Math.min(t.nextSeenMs ?? active.atMs, active.atMs) - MARGIN_MS;
      let read = 0;
      await this.s.o.store.mappings.loadChangedSince(t.vip, since, (page) => {
        read += page.length;
        this.install(page);
      });
      if (read) this.s.logger.debug('lb: records of the change installed before its row', { service: t.service, vip: t.vip, read });
    }
    const proposed = t.nextSeenMs;
    t.nextSeenMs = undefined;
    t.acked = undefined;
    this.write(t, active.row, this.unknown(t, active.row) ? t.want : '');
    if (!first) this.s.logger.info('lb: Maglev table version active', { service: t.service, vip: t.vip, version: active.version, targets: rowTargets(active.row).length, ...(proposed ? { ms: Date.now() - proposed } : {}) });
  }

  /**
   * The store cannot be asked: the row forwarded by stays (a change waits), with the entries of a target this
   * node no longer knows taken from the wanted row; a node with no row yet writes the wanted one.
   */
  private hold(t: VipTable): void {
    const held = t.written?.split('>')[0];
    if (held === undefined) this.write(t, t.want, '');
    else this.write(t, held, t.want);
  }

  /** Whether row names a target this node does not know (removed, or not in its configuration yet). */
  private unknown(t: VipTable, row: string): boolean {
    return rowTargets(row).some((a) => !t.known.has(a));
  }

  /** Writes the row for `row` (entries of targets this node does not know filled from `fill`) when it changed. */
  private write(t: VipTable, row: string, fill: string): void {
    const dp = this.s.dp;
    if (!dp) return;
    const patched = fill !== '' && this.unknown(t, row);
    const key = rowKey(row, patched ? fill : '');
    const version = t.mode === 'change' && t.active?.row === row ? t.active.version : undefined;
    if (key === t.written) {
      if (version !== undefined) t.writtenVersion = version;
      return;
    }
    const sameBase = row === t.written?.split('>')[0];
    const base = this.tableOf(rowTargets(row), dp.maglevSize);
    const table = patched ? patchTable(base, maglevTable(rowTargets(fill), dp.maglevSize), t.known) : base;
    dp.setMaglevRow(t.slot, table.table, table.targets);
    t.writtenVersion = version ?? (sameBase ? t.writtenVersion : undefined);
    const firstWrite = t.written === undefined;
    t.written = key;
    t.table = table;
    t.recordUntil = t.mode === 'change' && !firstWrite ? Date.now() + SETTLE_MS : t.recordUntil;
    this.s.logger.info('lb: Maglev row written', { service: t.service, vip: t.vip, slot: t.slot, targets: table.targets.length, record: t.mode === 'change' ? 'on change' : 'every pick', ...(patched ? { withoutUnknownTargets: true } : {}) });
  }

  /** The VIP's ports get the quiet flag while no change is under way, and lose it while one is. */
  private setFlags(t: VipTable): void {
    const quiet = this.isQuiet(t);
    if (quiet === t.quiet || !this.s.dp) return;
    this.s.dp.setServiceFlags(t.vip, t.base | (quiet ? LB_F_QUIET : 0));
    t.quiet = quiet;
  }
}

/**
 * Of the mapping table's entries (raw, as LbDatapath.mappingEntries reads them), vip's to a target in `known`:
 * how many (flows), and those `table` would send to another target, decoded (moved). The same as decoding
 * every entry and keeping those whose pickOf(table, key) differs from its target, without decoding the rest.
 */
export function movedFlows(entries: Array<[Buffer, Buffer]>, vip: string, known: ReadonlySet<string>, table: MaglevTable): { flows: number; moved: StoredMapping[] } {
  if (ipFamily(vip) === 6) return movedFlows6(entries, vip, known, table);
  const vipN = v4ToUint32(vip);
  const knownN = new Set([...known].map((a) => v4ToUint32(a)));
  const targetsN = table.targets.map((a) => v4ToUint32(a));
  const size = table.table.length;
  let flows = 0;
  const moved: StoredMapping[] = [];
  for (const [k, v] of entries) {
    if (k.readUInt32BE(0) !== vipN) continue;
    const target = v.readUInt32BE(0);
    if (!knownN.has(target)) continue;
    flows++;
    const i = table.table[lbHashKeyBytes(k, LB_HASH_SEED) % size];
    if (i >= 0 && targetsN[i] === target) continue;
    moved.push({ key: decodeMapKey(k), target: formatV4(v, 0) });
  }
  return { flows, moved };
}

/**
 * movedFlows for an IPv6 VIP over lb_mappings6's entries: the VIP is the key's first 16 bytes and the target
 * the value's first 16 (lb_map_key6, lb_mapping6), compared as bytes.
 */
function movedFlows6(entries: Array<[Buffer, Buffer]>, vip: string, known: ReadonlySet<string>, table: MaglevTable): { flows: number; moved: StoredMapping[] } {
  const vipB = ipToBytes(vip);
  const hex6 = (a: string) => (ipFamily(a) === 6 ? ipToBytes(a).toString('hex') : undefined);
  const knownH = new Set([...known].map(hex6));
  const targetsH = table.targets.map(hex6);
  const size = table.table.length;
  let flows = 0;
  const moved: StoredMapping[] = [];
  for (const [k, v] of entries) {
    if (k.length < 16 || v.length < 16 || vipB.compare(k, 0, 16) !== 0) continue;
    const target = v.toString('hex', 0, 16);
    if (!knownH.has(target)) continue;
    flows++;
    const i = table.table[lbHashKeyBytes(k, LB_HASH_SEED) % size];
    if (i >= 0 && targetsH[i] === target) continue;
    moved.push({ key: decodeMapKey(k), target: formatV6(v, 0) });
  }
  return { flows, moved };
}

/** The first release that records on change (table versions); releases before it record every pick. */
export const TABLE_VERSIONS_SINCE = '0.2.0';

/** Whether a node of `release` (its registration's; '' for 0.1.0, which wrote none) records on change. */
export function recordsOnChange(release: string): boolean {
  const v = /^(\d+)\.(\d+)\.(\d+)/.exec(release);
  if (!v) return false;
  const since = TABLE_VERSIONS_SINCE.split('.').map(Number);
  for (let i = 0; i < 3; i++) if (Number(v[i + 1]) !== since[i]) return Number(v[i + 1]) > since[i];
  return true;
}

/** The datapath flags of a Service's affinity. */
export function affinityFlags(lb: ResolvedLoadBalancer): number {
  return lb.affinity === 'flow' ? LB_F_PER_FLOW : 0;
}

function rowTargets(row: string): string[] {
  return row ? row.split(',') : [];
}

function rowKey(row: string, fill: string): string {
  return fill ? `${row}>${fill}` : row;
}
