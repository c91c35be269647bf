// The mapping table is a plain hash that never evicts (bpf/lb-maps.h): tetherd's local expiry
// (daemon/lb/mapping-sync.ts) is what makes room. While the table is nearly full, mappings idle for
// PRESSURE_IDLE_S expire at the next sync even under a long idle timeout — a flood's one-packet flows go,
// flows that send and mappings installed from the store and unused since stay; a full table that leaves
// store mappings out is logged, not thrown.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { MappingSync, PRESSURE_IDLE_S } from '../../daemon/lb/mapping-sync';
import { LbShared, nowNs } from '../../daemon/lb/lb-state';
import type { LbMapping } from '../../daemon/bpf/lb';
import type { MapKey } from '../../daemon/bpf/lb-structs';
import type { ResolvedLoadBalancer } from '../../daemon/lb/lb-spec';
import { captureLogger } from '../lib/log-capture';

const VIP = '198.51.100.1';
const S = 1_000_000_000n;

/** The datapath's mapping table as the sync sees it (daemon/bpf/lb.ts). */
class FakeTable {
  rows: LbMapping[] = [];
  constructor(readonly maxMappings: number) {}
  mappings(): LbMapping[] {
    return [...this.rows];
  }
  deleteMappingKeys(keys: MapKey[]): number {
    const gone = new Set(keys.map((k) => k.client + ':' + k.cport));
    const before = this.rows.length;
    this.rows = this.rows.filter((m) => !gone.has(m.client + ':' + m.cport));
    return before - this.rows.length;
  }
  installMappings(list: Array<{ key: MapKey; target: string }>): { installed: number; full: number } {
    const room = Math.max(0, this.maxMappings - this.rows.length);
    for (const m of list.slice(0, room)) this.rows.push({ ...m.key, target: m.target, lastNs: 0n });
    return { installed: Math.min(room, list.length), full: Math.max(0, list.length - room) };
  }
}

function setup(max: number, idleTimeoutS: number) {
  const cap = captureLogger();
  const s = new LbShared({ node: { name: 'n1', address: '10.0.0.1' }, pinDir: '/nonexistent', fouPort: 5555, exportTable: 0, logger: cap.logger } as never);
  const dp = new FakeTable(max);
  s.dp = dp as never;
  const lb = { key: 'shop/db', idleTimeoutS, targets: [{ address: '10.244.0.2', state: 'active' }] } as unknown as ResolvedLoadBalancer;
  s.vips.set(lb.key, { key: lb.key, pool: 'lb', vip: VIP, slot: 0, loaded: true, announced: true });
  const sync = new MappingSync(s);
  return { s, dp, lb, sync, cap };
}

const row = (i: number, lastNs: bigint): LbMapping => ({ vip: VIP, client: `10.1.${i >> 8}.${i & 255}`, vport: 9000, cport: 1000 + i, proto: 17, target: '10.244.0.2', lastNs });

test('nearly full: a flood\'s idle flows expire at the next sync, flows that send and store mappings stay', async () => {
  const { dp, lb, sync, cap } = setup(100, 3600);
  await sync.serve([lb]);
  const now = nowNs();
  const flood = Array.from({ length: 90 }, (_, i) => row(i, now - BigInt(PRESSURE_IDLE_S + 30) * S));
  const active = Array.from({ length: 5 }, (_, i) => row(200 + i, now - 2n * S));
  const fromStore = Array.from({ length: 3 }, (_, i) => row(300 + i, 0n));
  dp.rows = [...flood, ...active, ...fromStore];
  await sync.sync();
  await cap.settle();
  assert.equal(dp.rows.map((m) => m.cport).sort(), [...active, ...fromStore].map((m) => m.cport).sort());
  assert.ok(cap.lines.some((l) => l.level === 'warn' && /nearly full/.test(l.message)), 'the pressure is logged');
});

test('not nearly full: the same idle flows wait for the Service\'s own idle timeout', async () => {
  const { dp, lb, sync } = setup(1000, 3600);
  await sync.serve([lb]);
  const now = nowNs();
  dp.rows = Array.from({ length: 90 }, (_, i) => row(i, now - BigInt(PRESSURE_IDLE_S + 30) * S));
  await sync.sync();
  assert.is(dp.rows.length, 90);
});

test('a full table leaves store mappings out with a warning instead of failing the install', async () => {
  const { dp, lb, sync, cap } = setup(2, 3600);
  await sync.serve([lb]);
  const list = [0, 1, 2, 3].map((i) => ({ key: { vip: VIP, client: `10.2.0.${i}`, vport: 0, cport: 0, proto: 0 }, target: '10.244.0.2' }));
  assert.is(sync.installValid(list), 2);
  await cap.settle();
  assert.is(dp.rows.length, 2);
  assert.ok(cap.lines.some((l) => l.level === 'warn' && /mapping table full/.test(l.message) && l.leftOut === 2));
});

test.run();
