// AddressPool validation: a table of bad definitions (each message must name the pool and the field),
// resolved numbers of good pools, cross-pool checks, and node matching.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { poolMatchesNode, validatePool, validatePools } from '../../ipam/pool';
import { parseIp } from '../../lib/ip';
import { TetherError } from '../../lib/errors';

type Spec = Record<string, unknown>;
const pool = (name: string, spec: Spec, top: Record<string, unknown> = {}) => ({
  apiVersion: 'tether.dev/v1alpha1',
  kind: 'AddressPool',
  metadata: { name },
  spec,
  ...top,
});
const pod4 = (cidr: string, extra: Spec = {}) => ({ usage: 'pod', ipv4: { cidr }, ...extra });
const ip = (s: string) => parseIp(s)!.value;

/** The InvalidConfig error thrown by fn; fails the test when fn does not throw one. */
function configError(fn: () => unknown): TetherError {
  try {
    fn();
  } catch (e) {
    assert.instance(e, TetherError);
    assert.is((e as TetherError).code, 'INVALID_CONFIG');
    return e as TetherError;
  }
  assert.unreachable('expected an InvalidConfig error');
  throw new Error('unreachable');
}

const BAD: Array<[string, unknown, RegExp]> = [
  ['host bits set', pool('blue', pod4('10.1.2.3/16')),
    /^AddressPool "blue": spec\.ipv4\.cidr "10\.1\.2\.3\/16" is not a network address \(did you mean 10\.1\.0\.0\/16\?\)$/],
  ['blockSize too long', pool('blue', { usage: 'pod', ipv4: { cidr: '10.1.0.0/16', blockSize: 33 } }),
    /^AddressPool "blue": spec\.ipv4\.blockSize 33 does not fit the subnet \/16 \(must be 16\.\.30\)$/],
  ['blockSize shorter than subnet', pool('blue', { usage: 'pod', ipv4: { cidr: '10.1.0.0/16', blockSize: 15 } }),
    /^AddressPool "blue": spec\.ipv4\.blockSize 15 does not fit the subnet \/16 \(must be 16\.\.30\)$/],
  ['blockSize as text', pool('blue', { usage: 'pod', ipv4: { cidr: '10.1.0.0/16', blockSize: '26' } }),
    /^AddressPool "blue": spec\.ipv4\.blockSize "26" must be an integer/],
  ['blockSize fractional', pool('blue', { usage: 'pod', ipv4: { cidr: '10.1.0.0/16', blockSize: 25.5 } }),
    /^AddressPool "blue": spec\.ipv4\.blockSize 25\.5 must be an integer/],
  ['v6 blockSize 127', pool('blue', { usage: 'pod', ipv6: { cidr: 'fd00::/64', blockSize: 127 } }),
    /^AddressPool "blue": spec\.ipv6\.blockSize 127 does not fit the subnet \/64 \(must be 64\.\.126\)$/],
  ['bad v6 text', pool('blue', { usage: 'pod', ipv6: { cidr: 'fd00::g/64' } }),
    /^AddressPool "blue": spec\.ipv6\.cidr "fd00::g\/64" is not an IPv6 network$/],
  ['v6 prefix under ipv4', pool('blue', pod4('fd00::/64')),
    /^AddressPool "blue": spec\.ipv4\.cidr is an IPv6 prefix/],
  ['v4 prefix under ipv6', pool('blue', { usage: 'pod', ipv6: { cidr: '10.0.0.0/8' } }),
    /^AddressPool "blue": spec\.ipv6\.cidr is an IPv4 prefix/],
  ['v4-mapped v6', pool('blue', { usage: 'floating', ipv6: { cidr: '::ffff:10.0.0.0/120' } }),
    /^AddressPool "blue": spec\.ipv6\.cidr "::ffff:10\.0\.0\.0\/120" is IPv4-mapped/],
  ['v6 multicast', pool('blue', { usage: 'pod', ipv6: { cidr: 'ff05::/64' } }),
    /^AddressPool "blue": spec\.ipv6\.cidr "ff05::\/64" overlaps multicast space ff00::\/8/],
  ['v6 link-local', pool('blue', { usage: 'pod', ipv6: { cidr: 'fe80::/64' } }),
    /^AddressPool "blue": spec\.ipv6\.cidr "fe80::\/64" overlaps link-local space fe80::\/10/],
  ['v6 covering everything', pool('blue', { usage: 'loadBalancer', ipv6: { cidr: '::/0' } }),
    /^AddressPool "blue": spec\.ipv6\.cidr "::\/0" overlaps unspecified space ::\/128/],
  ['v6 around v4-mapped', pool('blue', { usage: 'floating', ipv6: { cidr: '::fffe:0:0/95' } }),
    /^AddressPool "blue": spec\.ipv6\.cidr "::fffe:0:0\/95" overlaps IPv4-mapped space ::ffff:0:0\/96/],
  ['v4 multicast', pool('blue', pod4('239.1.0.0/16')),
    /^AddressPool "blue": spec\.ipv4\.cidr "239\.1\.0\.0\/16" overlaps multicast space 224\.0\.0\.0\/4/],
  ['v4 loopback', pool('blue', { usage: 'floating', ipv4: { cidr: '127.0.0.0/24' } }),
    /^AddressPool "blue": spec\.ipv4\.cidr "127\.0\.0\.0\/24" overlaps loopback/],
  ['pod subnet too small', pool('blue', pod4('10.0.0.0/31')),
    /^AddressPool "blue": spec\.ipv4\.cidr "10\.0\.0\.0\/31" is too small for a pod pool \(node blocks are at most \/30\)$/],
  ['prefix length out of range', pool('blue', pod4('10.0.0.0/33')),
    /^AddressPool "blue": spec\.ipv4\.cidr "10\.0\.0\.0\/33" has an invalid prefix length \(0\.\.32\)$/],
  ['no prefix length', pool('blue', pod4('10.0.0.0')),
    /^AddressPool "blue": spec\.ipv4\.cidr "10\.0\.0\.0" has no prefix length/],
  ['cidr missing', pool('blue', { usage: 'pod', ipv4: {} }), /^AddressPool "blue": spec\.ipv4\.cidr is missing$/],
  ['cidr not a string', pool('blue', { usage: 'pod', ipv4: { cidr: 10 } }), /^AddressPool "blue": spec\.ipv4\.cidr 10 must be a string/],
  ['usage misspelt', pool('blue', pod4('10.0.0.0/16', { usage: 'pods' })),
    /^AddressPool "blue": spec\.usage "pods" must be one of pod, floating, loadBalancer$/],
  ['usage missing', pool('blue', { ipv4: { cidr: '10.0.0.0/16' } }), /^AddressPool "blue": spec\.usage is missing/],
  ['name missing', { ...pool('x', pod4('10.0.0.0/16')), metadata: {} }, /^AddressPool \(no name\): metadata\.name is missing$/],
  ['name not DNS-1123', pool('Blue_1', pod4('10.0.0.0/16')),
    /^AddressPool "Blue_1": metadata\.name "Blue_1" must be a DNS-1123 label/],
  ['name too long', pool('a'.repeat(64), pod4('10.0.0.0/16')), /^AddressPool "a{64}": metadata\.name "a{64}" must be a DNS-1123 label/],
  ['apiVersion wrong', pool('blue', pod4('10.0.0.0/16'), { apiVersion: 'tether.dev/v1' }),
    /^AddressPool "blue": apiVersion "tether\.dev\/v1" must be tether\.dev\/v1alpha1$/],
  ['kind wrong', pool('blue', pod4('10.0.0.0/16'), { kind: 'Pool' }), /^AddressPool "blue": kind "Pool" must be AddressPool$/],
  ['no family', pool('blue', { usage: 'pod' }), /^AddressPool "blue": spec needs ipv4, ipv6 or both$/],
  ['blockSize on floating', pool('blue', { usage: 'floating', ipv4: { cidr: '10.0.0.0/24', blockSize: 28 } }),
    /^AddressPool "blue": spec\.ipv4\.blockSize is not allowed for a floating pool/],
  ['blockSize on loadBalancer', pool('blue', { usage: 'loadBalancer', ipv6: { cidr: 'fd00::/120', blockSize: 124 } }),
    /^AddressPool "blue": spec\.ipv6\.blockSize is not allowed for a loadBalancer pool/],
  ['reserved not an address', pool('blue', pod4('10.1.0.0/16', { reserved: ['10.1.0.300'] })),
    /^AddressPool "blue": spec\.reserved\[0\] "10\.1\.0\.300" is not an address or CIDR$/],
  ['reserved outside', pool('blue', pod4('10.1.0.0/16', { reserved: ['10.1.0.1', '10.2.0.0/24'] })),
    /^AddressPool "blue": spec\.reserved\[1\] "10\.2\.0\.0\/24" lies outside the pool's 10\.1\.0\.0\/16$/],
  ['reserved partly outside', pool('blue', pod4('10.1.0.0/16', { reserved: ['10.0.0.0/15'] })),
    /^AddressPool "blue": spec\.reserved\[0\] "10\.0\.0\.0\/15" lies outside the pool's 10\.1\.0\.0\/16$/],
  ['reserved of a missing family', pool('blue', pod4('10.1.0.0/16', { reserved: ['fd00::1'] })),
    /^AddressPool "blue": spec\.reserved\[0\] "fd00::1" lies outside the pool \(it has no IPv6 subnet\)$/],
  ['reserved host bits', pool('blue', pod4('10.1.0.0/16', { reserved: ['10.1.0.5/30'] })),
    /^AddressPool "blue": spec\.reserved\[0\] "10\.1\.0\.5\/30" is not a network address \(did you mean 10\.1\.0\.4\/30\?\)$/],
  ['reserved not a list', pool('blue', pod4('10.1.0.0/16', { reserved: '10.1.0.1' })), /^AddressPool "blue": spec\.reserved must be a list/],
  ['unknown spec field', pool('blue', pod4('10.1.0.0/16', { nodeselector: { a: 'b' } })),
    /^AddressPool "blue": unknown field spec\.nodeselector$/],
  ['unknown family field', pool('blue', { usage: 'pod', ipv4: { cidr: '10.1.0.0/16', blocksize: 24 } }),
    /^AddressPool "blue": unknown field spec\.ipv4\.blocksize$/],
  ['unknown top-level field', { ...pool('blue', pod4('10.1.0.0/16')), sepc: {} }, /^AddressPool "blue": unknown field sepc$/],
  ['spec missing', { apiVersion: 'tether.dev/v1alpha1', kind: 'AddressPool', metadata: { name: 'blue' } },
    /^AddressPool "blue": spec is missing$/],
  ['not an object', 'blue', /^AddressPool \(no name\): must be an object, not "blue"$/],
  ['zone contradicts selector',
    pool('blue', pod4('10.1.0.0/16', { zone: 'a', nodeSelector: { 'topology.kubernetes.io/zone': 'b' } })),
    /^AddressPool "blue": spec\.zone "a" contradicts spec\.nodeSelector\.topology\.kubernetes\.io\/zone "b"$/],
  ['selector value not a string', pool('blue', pod4('10.1.0.0/16', { nodeSelector: { role: 1 } })),
    /^AddressPool "blue": spec\.nodeSelector\.role 1 is not a valid label value$/],
  ['selector key invalid', pool('blue', pod4('10.1.0.0/16', { nodeSelector: { 'bad key': 'x' } })),
    /^AddressPool "blue": spec\.nodeSelector key "bad key" is not a valid label name$/],
];

test(`bad pools: ${BAD.length} rows, each one line naming pool and field`, () => {
  assert.ok(BAD.length >= 20);
  for (const [what, raw, re] of BAD) {
    const e = configError(() => validatePool(raw));
    const lines = e.message.split('\n');
    assert.is(lines.length, 1, `${what}: exactly one problem, got:\n${e.message}`);
    assert.match(lines[0], re, what);
  }
});

test('where prefixes every message', () => {
  const e = configError(() => validatePool(pool('blue', pod4('10.1.2.3/16')), 'pools.yaml document 2'));
  assert.match(e.message, /^pools\.yaml document 2: AddressPool "blue": spec\.ipv4\.cidr/);
});

test('dual-stack pod pool resolves with default block sizes', () => {
  const p = validatePool(pool('default', { usage: 'pod', ipv4: { cidr: '10.244.0.0/16' }, ipv6: { cidr: 'fd00:10:244::/56' } }));
  assert.is(p.name, 'default');
  assert.is(p.usage, 'pod');
  assert.equal(p.nodeSelector, {});
  assert.equal(p.families.map((f) => [f.family, f.cidr, f.base, f.prefix, f.blockSize, f.reserved]), [
    [4, '10.244.0.0/16', 0x0af40000n, 16, 26, []],
    [6, 'fd00:10:244::/56', 0xfd000010024400000000000000000000n, 56, 122, []],
  ]);
});

test('small pod subnets default to a single block; explicit block sizes and bounds are kept', () => {
  const small = validatePool(pool('s', { usage: 'pod', ipv4: { cidr: '10.0.0.16/28' }, ipv6: { cidr: 'fd00::40/124' } }));
  assert.equal(small.families.map((f) => [f.prefix, f.blockSize]), [[28, 28], [124, 124]]);
  const edges = validatePool(pool('e', { usage: 'pod', ipv4: { cidr: '10.0.0.0/16', blockSize: 30 }, ipv6: { cidr: 'fd00::/64', blockSize: 64 } }));
  assert.equal(edges.families.map((f) => f.blockSize), [30, 64]);
  const v6max = validatePool(pool('m', { usage: 'pod', ipv6: { cidr: 'fd00::/64', blockSize: 126 } }));
  assert.is(v6max.families[0].blockSize, 126);
});

test('cluster-wide pools: block size is the subnet prefix; text is canonicalised', () => {
  const f = validatePool(pool('f', { usage: 'floating', ipv4: { cidr: '192.0.2.0/24' }, ipv6: { cidr: 'FD00:0:0:1::/64' } }));
  assert.equal(f.families.map((x) => [x.cidr, x.prefix, x.blockSize]), [['192.0.2.0/24', 24, 24], ['fd00:0:0:1::/64', 64, 64]]);
  const lb = validatePool(pool('lb', { usage: 'loadBalancer', ipv4: { cidr: '198.51.100.0/25' } }));
  assert.is(lb.families[0].blockSize, 25);
  assert.is(lb.usage, 'loadBalancer');
});

test('reserved entries become sorted inclusive ranges per family', () => {
  const p = validatePool(pool('r', {
    usage: 'pod',
    ipv4: { cidr: '10.1.0.0/16' },
    ipv6: { cidr: 'fd00::/64' },
    reserved: ['10.1.255.255', '10.1.0.0/30', 'fd00::/126', ' 10.1.8.1 '],
  }));
  assert.equal(p.families[0].reserved, [
    [ip('10.1.0.0'), ip('10.1.0.3')],
    [ip('10.1.8.1'), ip('10.1.8.1')],
    [ip('10.1.255.255'), ip('10.1.255.255')],
  ]);
  assert.equal(p.families[1].reserved, [[ip('fd00::'), ip('fd00::3')]]);
});

test('zone merges into the node selector; the source object is kept', () => {
  const raw = pool('z', pod4('10.1.0.0/16', { zone: 'zone-a', nodeSelector: { 'tether.dev/role': 'edge' } }));
  const p = validatePool(raw);
  assert.equal(p.nodeSelector, { 'tether.dev/role': 'edge', 'topology.kubernetes.io/zone': 'zone-a' });
  assert.is(p.source, raw);
});

test('overlapping subnets name both pools and both CIDRs, in IPv4 and IPv6', () => {
  const e4 = configError(() => validatePools([pool('a', pod4('10.0.0.0/16')), pool('b', { usage: 'floating', ipv4: { cidr: '10.0.128.0/17' } })]));
  assert.is(e4.message, 'AddressPool "b": spec.ipv4.cidr 10.0.128.0/17 overlaps AddressPool "a" spec.ipv4.cidr 10.0.0.0/16');
  const e6 = configError(() => validatePools([
    pool('a', { usage: 'pod', ipv4: { cidr: '10.0.0.0/16' }, ipv6: { cidr: 'fd00::/56' } }),
    pool('b', { usage: 'loadBalancer', ipv4: { cidr: '10.1.0.0/24' }, ipv6: { cidr: 'fd00:0:0:ff::/120' } }),
  ]));
  assert.is(e6.message, 'AddressPool "b": spec.ipv6.cidr fd00:0:0:ff::/120 overlaps AddressPool "a" spec.ipv6.cidr fd00::/56');
});

test('adjacent subnets and different families do not overlap', () => {
  const pools = validatePools([
    pool('a', pod4('10.0.0.0/16')),
    pool('b', pod4('10.1.0.0/16')),
    pool('c', { usage: 'pod', ipv6: { cidr: 'fd00::/56' } }),
    pool('d', { usage: 'floating', ipv6: { cidr: 'fd00:0:0:100::/120' } }),
  ]);
  assert.equal(pools.map((p) => p.name), ['a', 'b', 'c', 'd']);
});

test('all problems of all pools are collected into one error, one line each', () => {
  const e = configError(() => validatePools([
    pool('a', pod4('10.0.0.0/16')),
    pool('a', pod4('10.9.0.0/16')),
    pool('bad', { usage: 'pods', ipv4: { cidr: '10.5.0.1/16' } }),
    pool('c', pod4('10.0.64.0/18')),
    42,
  ]));
  const lines = e.message.split('\n');
  assert.is(lines.length, 5, e.message);
  assert.ok(lines.includes('AddressPool "bad": spec.usage "pods" must be one of pod, floating, loadBalancer'));
  assert.ok(lines.includes('AddressPool "bad": spec.ipv4.cidr "10.5.0.1/16" is not a network address (did you mean 10.5.0.0/16?)'));
  assert.ok(lines.includes('AddressPool (no name): must be an object, not 42'));
  assert.ok(lines.includes('AddressPool "a": metadata.name is already used by pools[0]'));
  assert.ok(lines.includes('AddressPool "c": spec.ipv4.cidr 10.0.64.0/18 overlaps AddressPool "a" spec.ipv4.cidr 10.0.0.0/16'));
  assert.is(e.details, '5 problems');
});

test('a pool matches a node when every selector label matches; zone counts as the zone label', () => {
  const any = validatePool(pool('any', pod4('10.0.0.0/16')));
  const zoned = validatePool(pool('z', pod4('10.1.0.0/16', { zone: 'zone-a', nodeSelector: { role: 'edge' } })));
  assert.ok(poolMatchesNode(any, { name: 'n', labels: {} }));
  assert.ok(poolMatchesNode(zoned, { name: 'n', zone: 'zone-a', labels: { role: 'edge' } }));
  assert.ok(poolMatchesNode(zoned, { name: 'n', labels: { role: 'edge', 'topology.kubernetes.io/zone': 'zone-a' } }));
  assert.not.ok(poolMatchesNode(zoned, { name: 'n', zone: 'zone-b', labels: { role: 'edge' } }));
  assert.not.ok(poolMatchesNode(zoned, { name: 'n', zone: 'zone-a', labels: {} }), 'every label must match');
  assert.not.ok(poolMatchesNode(zoned, { name: 'n', zone: 'zone-a', labels: { role: 'core' } }));
  // The node's zone fact wins over a stale label.
  assert.not.ok(poolMatchesNode(zoned, { name: 'n', zone: 'zone-b', labels: { role: 'edge', 'topology.kubernetes.io/zone': 'zone-a' } }));
});

test.run();
