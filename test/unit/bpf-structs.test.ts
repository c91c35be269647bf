// The TS mirrors in daemon/bpf/fou-structs.ts against the BTF of the compiled objects: a field added,
// moved or resized in bpf/fou-types.h without updating the mirror fails here, not in production.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { execFileSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as net from 'node:net';
import * as path from 'node:path';
import { FOU_LAYOUTS, ipv4Bytes, encodeFouDecapConfig, encodeFouDest, encodeFouEncapConfig, sumFouStats } from '../../daemon/bpf/fou-structs';
import {
  EGRESS_LAYOUTS, decodeEgressClient, decodeEgressDestKey, decodeEgressGateways, encodeEgressClient, encodeEgressConfig, encodeEgressDestKey,
  encodeEgressGateways, parseIpv4Prefix, sumEgressStats, parseIpPrefix, encodeEgressDest6Key, decodeEgressDest6Key, encodeEgressGateways6,
  decodeEgressGateways6, splitSlotsByFamily,
} from '../../daemon/bpf/egress-structs';
import {
  LB_LAYOUTS, PROTO, decodeEvent, decodeEvent6, decodeMapKey, decodeMapping, decodeServiceKey, decodeTargetKey, encodeMapKey, encodeMapping, encodeServiceKey, encodeTargetKey,
  lbHash, lbHashKeyBytes,
} from '../../daemon/bpf/lb-structs';

const root = path.resolve(__dirname, '../..');
const objects = ['fou-encap', 'fou-decap'].map((n) => path.join(root, 'dist/bpf', `${n}.bpf.o`));

interface BtfType {
  id: number;
  kind: string;
  name?: string;
  size?: number;
  type_id?: number;
  nr_elems?: number;
  members?: Array<{ name: string; type_id: number; bits_offset: number }>;
}

function btfOf(obj: string): Map<number, BtfType> {
  const out = execFileSync('bpftool', ['-j', 'btf', 'dump', 'file', obj, 'format', 'raw'], { encoding: 'utf8' });
  return new Map((JSON.parse(out).types as BtfType[]).map((t) => [t.id, t]));
}

function sizeOf(types: Map<number, BtfType>, id: number): number {
  const t = types.get(id)!;
  if (t.kind === 'TYPEDEF' || t.kind === 'VOLATILE' || t.kind === 'CONST') return sizeOf(types, t.type_id!);
  if (t.kind === 'ARRAY') return sizeOf(types, t.type_id!) * t.nr_elems!;
  return t.size!;
}

test.before(() => {
  if (objects.some((o) => !fs.existsSync(o))) execFileSync('bash', [path.join(root, 'bpf/build.sh')], { stdio: 'inherit' });
});

test('every mirrored struct matches the BTF of the objects that use it', () => {
  const seen = new Set<string>();
  for (const obj of objects) {
    const types = btfOf(obj);
    for (const t of types.values()) {
      if (t.kind !== 'STRUCT' || !t.name || !(t.name in FOU_LAYOUTS)) continue;
      seen.add(t.name);
      const mirror = FOU_LAYOUTS[t.name];
      assert.is(mirror.size, t.size, `${t.name} size in ${path.basename(obj)}`);
      const btfFields = Object.fromEntries(t.members!.map((m) => [m.name, { offset: m.bits_offset / 8, size: sizeOf(types, m.type_id) }]));
      assert.equal(mirror.fields, btfFields, `${t.name} fields (name → offset, size) in ${path.basename(obj)}`);
    }
  }
  assert.equal([...seen].sort(), Object.keys(FOU_LAYOUTS).sort(), 'each mirror is found in some object');
});

test('encoders write network-order addresses and ports at the mirrored offsets', () => {
  assert.is(encodeFouEncapConfig({ outerSource: '10.1.2.3', port: 5555, flags: 1 }).toString('hex'), '0a010203' + '15b3' + '0100');
  assert.is(encodeFouDest({ backend: '192.168.0.9', port: 0 }).toString('hex'), 'c0a80009' + '0000' + '0000');
  assert.is(encodeFouDecapConfig({ port: 5555, flags: 0 }).toString('hex'), '00000000' + '15b3' + '0000');
  assert.throws(() => encodeFouDest({ backend: '10.0.0.256', port: 0 }), /backend/);
  assert.throws(() => encodeFouEncapConfig({ outerSource: '10.0.0.1', port: 70000, flags: 0 }), /port/);
});

test('per-CPU stats are summed', () => {
  const a = Buffer.alloc(40);
  const b = Buffer.alloc(40);
  a.writeBigUInt64LE(3n, 0);
  b.writeBigUInt64LE(4n, 0);
  b.writeBigUInt64LE(9n, 16);
  const s = sumFouStats([a, b]);
  assert.is(s.packets, 7n);
  assert.is(s.rejectedSource, 9n);
});

/** Every mirror in layouts matches the BTF of dist/bpf/<object>.bpf.o, and each is found there. */
function checkMirrors(object: string, layouts: Record<string, { size: number; fields: unknown }>, notInBtf: string[] = []): void {
  const obj = path.join(root, 'dist/bpf', `${object}.bpf.o`);
  if (!fs.existsSync(obj)) execFileSync('bash', [path.join(root, 'bpf/build.sh')], { stdio: 'inherit' });
  const types = btfOf(obj);
  const seen = new Set<string>();
  for (const t of types.values()) {
    if (t.kind !== 'STRUCT' || !t.name || !(t.name in layouts)) continue;
    seen.add(t.name);
    const mirror = layouts[t.name];
    assert.is(mirror.size, t.size, `${t.name} size`);
    const btfFields = Object.fromEntries(t.members!.map((m) => [m.name, { offset: m.bits_offset / 8, size: sizeOf(types, m.type_id) }]));
    assert.equal(mirror.fields, btfFields, `${t.name} fields (name → offset, size)`);
  }
  assert.equal([...seen].sort(), Object.keys(layouts).filter((n) => !notInBtf.includes(n)).sort(), `each mirror is in ${object}.bpf.o`);
}

// Egress steering mirrors (daemon/bpf/egress-structs.ts) against egress-steer.bpf.o.
test('every egress mirror matches the BTF of egress-steer.bpf.o', () => checkMirrors('egress-steer', EGRESS_LAYOUTS));

// Load balancer mirrors (daemon/bpf/lb-structs.ts) against lb.bpf.o.
test('every load balancer mirror matches the BTF of lb.bpf.o', () => checkMirrors('lb', LB_LAYOUTS, ['lb_event', 'lb_event6'])); // ring buffer records have no BTF; lb-types.h asserts its size

test('load balancer encoders: service keys, mapping keys and values, events', () => {
  assert.is(encodeServiceKey('10.0.0.1', 443, PROTO.TCP).toString('hex'), '0a000001' + '01bb' + '06' + '00');
  const k = { vip: '10.0.0.1', client: '192.0.2.7', vport: 443, cport: 40000, proto: PROTO.UDP };
  assert.equal(decodeMapKey(encodeMapKey(k)), k);
  assert.equal(decodeMapping(encodeMapping('10.244.1.5', 7n)), { target: '10.244.1.5', lastNs: 7n });
  const ev = Buffer.concat([encodeMapKey(k), Buffer.from([10, 244, 0, 9]), Buffer.from([1, 0, 0, 0])]);
  assert.equal(decodeEvent(ev), { key: k, target: '10.244.0.9', kind: 1 });
});

test('load balancer IPv6 encoders: keys of the IPv6 structs, picked by the VIP\'s family, decoded by size', () => {
  const sk = encodeServiceKey('fd00:100::10', 443, PROTO.TCP);
  assert.is(sk.length, LB_LAYOUTS.lb_service_key6.size);
  assert.is(sk.toString('hex'), 'fd000100000000000000000000000010' + '01bb' + '06' + '00');
  assert.equal(decodeServiceKey(sk), { vip: 'fd00:100::10', port: 443, proto: PROTO.TCP });
  const k = { vip: 'fd00:100::10', client: '2001:db8::7', vport: 443, cport: 40000, proto: PROTO.UDP };
  const kb = encodeMapKey(k);
  assert.is(kb.length, LB_LAYOUTS.lb_map_key6.size);
  assert.equal(decodeMapKey(kb), k);
  const m = encodeMapping('fd00:3::2', 9n);
  assert.is(m.length, LB_LAYOUTS.lb_mapping6.size);
  assert.equal(decodeMapping(m), { target: 'fd00:3::2', lastNs: 9n });
  assert.equal(decodeTargetKey(encodeTargetKey('fd00:100::10', 'fd00:3::2')), { vip: 'fd00:100::10', target: 'fd00:3::2' });
  const ev = Buffer.concat([kb, encodeMapping('fd00:3::2').subarray(0, 16), Buffer.from([1, 0, 0, 0, 0, 0, 0, 0])]);
  assert.is(ev.length, LB_LAYOUTS.lb_event6.size);
  assert.equal(decodeEvent6(ev), { key: k, target: 'fd00:3::2', kind: 1 });
  // The hash of a key is the hash of its bytes (the mirror of lb_hash6; the kernel test holds it to the program).
  assert.is(lbHashKeyBytes(kb, 0x7e7e1b5d), lbHash(k, 0x7e7e1b5d));
  assert.is.not(lbHash(k, 1), lbHash({ ...k, cport: 40001 }, 1));
});

test('egress encoders: LPM keys, clients, gateway slots, config, stats', () => {
  assert.is(encodeEgressDestKey(7, parseIpv4Prefix('10.1.2.3/16')).toString('hex'), '30000000' + '07000000' + '0a010000', 'prefixlen 32+16, host bits cleared');
  assert.equal(decodeEgressDestKey(encodeEgressDestKey(0, parseIpv4Prefix('0.0.0.0/0'))), { egressId: 0, prefix: { address: '0.0.0.0', length: 0 } });
  assert.equal(parseIpv4Prefix('192.0.2.1'), { address: '192.0.2.1', length: 32 });
  assert.throws(() => parseIpv4Prefix('10.0.0.0/33', 'steer[0]'), /steer\[0\]/);
  assert.throws(() => parseIpv4Prefix('10.0.0/8'), /IPv4/);
  assert.equal(decodeEgressClient(encodeEgressClient([3, 9])), [3, 9]);
  assert.throws(() => encodeEgressClient([]), /egressIds/);
  assert.throws(() => encodeEgressClient([1, 2, 3, 4, 5]), /egressIds/);
  assert.throws(() => encodeEgressClient([1, 1]), /repeats/);
  assert.throws(() => encodeEgressClient([0]), /egressIds\[0\]/);
  const slots = [{ gatewayIp: '10.0.0.2', floatingIp: '203.0.113.7', epoch: 5n, zone: 2, tier: 1 }, { gatewayIp: '10.0.0.3', floatingIp: '203.0.113.8', epoch: 1n, zone: 0, tier: 0 }];
  const gw = encodeEgressGateways(slots);
  assert.is(gw.length, EGRESS_LAYOUTS.egress_gateways.size);
  assert.is(gw.subarray(0, 8 + 8).toString('hex'), '02000000' + '00000000' + '0a000002' + 'cb007107', 'count, flags, slot 0 addresses in network order');
  assert.equal(decodeEgressGateways(gw), slots);
  assert.is(encodeEgressGateways([]).readUInt32LE(0), 0);
  assert.throws(() => encodeEgressGateways(Array(9).fill(slots[0])), /slots/);
  assert.throws(() => encodeEgressGateways([{ ...slots[0], floatingIp: 'x' }]), /slots\[0\]\.floatingIp/);
  assert.throws(() => encodeEgressGateways([{ ...slots[0], tier: 256 }]), /slots\[0\]\.tier/);
  assert.is(encodeEgressConfig({ nodeAddress: '192.0.2.1', port: 5555 }).toString('hex'), 'c0000201' + '15b3' + '0000');
  assert.throws(() => encodeEgressConfig({ nodeAddress: '192.0.2.1', port: 0 }), /port/);
  const a = Buffer.alloc(EGRESS_LAYOUTS.egress_stats.size);
  const b = Buffer.alloc(EGRESS_LAYOUTS.egress_stats.size);
  a.writeBigUInt64LE(2n, 0);
  b.writeBigUInt64LE(3n, 0);
  b.writeBigUInt64LE(4n, 32);
  b.writeBigUInt64LE(6n, 64);
  const st = sumEgressStats([a, b]);
  assert.is(st.steered, 5n);
  assert.is(st.noGateway, 4n);
  assert.is(st.excluded, 6n);
});

test('egress IPv6 encoders: prefixes of both families, LPM keys, slots split by family', () => {
  assert.equal(parseIpPrefix('2001:db8:1:2::5/48'), { family: 6, address: '2001:db8:1::', length: 48 }, 'host bits cleared, canonical text');
  assert.equal(parseIpPrefix('10.1.2.3/16'), { family: 4, address: '10.1.0.0', length: 16 });
  assert.equal(parseIpPrefix('::1'), { family: 6, address: '::1', length: 128 });
  assert.throws(() => parseIpPrefix('2001:db8::/129', 'steer[1]'), /steer\[1\].*IPv6/);
  assert.throws(() => parseIpPrefix('fe80::1%eth0/64', 'steer[2]'), /steer\[2\]/);
  const k = encodeEgressDest6Key(7, parseIpPrefix('2001:db8::/32'));
  assert.is(k.toString('hex'), '40000000' + '07000000' + '20010db8' + '00'.repeat(12), 'prefixlen 32+32, address in network order');
  assert.equal(decodeEgressDest6Key(k), { egressId: 7, prefix: { address: '2001:db8::', length: 32 } });
  const slots = [
    { gatewayIp: '10.0.0.2', floatingIp: '203.0.113.7', epoch: 1n, zone: 0, tier: 0 },
    { gatewayIp: '10.0.0.3', floatingIp: '2001:db8:f::7', epoch: 5n, zone: 2, tier: 1 },
  ];
  const { v4, v6 } = splitSlotsByFamily(slots);
  assert.equal([v4, v6], [[slots[0]], [slots[1]]]);
  const gw6 = encodeEgressGateways6(v6);
  assert.is(gw6.length, EGRESS_LAYOUTS.egress_gateways6.size);
  assert.is(gw6.subarray(8, 8 + 24).toString('hex'), '0a000003' + '00000000' + '20010db8000f' + '00'.repeat(8) + '0007', 'IPv4 gateway, pad, IPv6 floating');
  assert.equal(decodeEgressGateways6(gw6), v6);
  assert.throws(() => encodeEgressGateways6([{ ...slots[1], gatewayIp: 'fd00::1' }]), /slots\[0\]\.gatewayIp/, 'the underlay is IPv4');
  assert.throws(() => splitSlotsByFamily([{ ...slots[0], floatingIp: 'nope' }]), /slots\[0\]\.floatingIp/);
});

test.run();

test('ipv4Bytes accepts exactly what net.isIPv4 does, and writes the same bytes', () => {
  const cases = [
    '0.0.0.0', '255.255.255.255', '10.244.1.5', '1.2.3.4', '192.168.0.1', '01.2.3.4', '1.2.3.04', '1.2.3', '1.2.3.4.5', '1..3.4', '.1.2.3',
    '1.2.3.', '256.1.1.1', '1.2.3.256', '1.2.3.4 ', ' 1.2.3.4', '1.2.3.-4', '1.2.3.4a', 'a.b.c.d', '', '::1', '1.2.3.4/32', '1000.1.1.1', '00.0.0.0',
    '0.0.0.00', '099.1.1.1', '99.1.1.1', '1.2.3.٣', '１.2.3.4', '1.2.3.4\n', '255.255.255.2550',
  ];
  // And every 4-part string over a small alphabet of parts, plus random strings of digits and dots.
  const parts = ['0', '00', '01', '1', '9', '10', '99', '100', '199', '200', '249', '250', '255', '256', '300', '999', '1000', ''];
  for (const a of parts) for (const b of ['0', '01', '255', '256', '']) cases.push(`${a}.${b}.${a}.${b}`, `${b}.${a}.1.2`);
  let seed = 7;
  const rnd = () => (seed = (seed * 1103515245 + 12345) & 0x7fffffff) / 0x7fffffff;
  for (let i = 0; i < 20000; i++) cases.push(Array.from({ length: 1 + Math.floor(rnd() * 16) }, () => '0123456789.'[Math.floor(rnd() * 11)]).join(''));
  for (const c of cases) {
    let got: Buffer | undefined;
    try {
      got = ipv4Bytes(c, 'client');
    } catch (e) {
      assert.match((e as Error).message, `client: "${c}" is not an IPv4 address`);
    }
    assert.is(got !== undefined, net.isIPv4(c), `${JSON.stringify(c)}: net.isIPv4 says ${net.isIPv4(c)}`);
    if (got) assert.equal([...got], c.split('.').map(Number), c);
  }
});
