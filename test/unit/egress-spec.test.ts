// Egress validation: a table of bad objects, each rejected with a message naming the Egress and the field,
// and good objects resolved with their defaults.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { addressSlots, slotFamily, slotOwner, validateEgress } from '../../daemon/egress/egress-spec';
import { validatePools } from '../../ipam/pool';
import { TetherError } from '../../lib/errors';
import { selects } from '../../daemon/egress/egress-state';

const pools = validatePools([
  { apiVersion: 'tether.dev/v1alpha1', kind: 'AddressPool', metadata: { name: 'pods' }, spec: { usage: 'pod', ipv4: { cidr: '10.244.0.0/16' } } },
  { apiVersion: 'tether.dev/v1alpha1', kind: 'AddressPool', metadata: { name: 'float' }, spec: { usage: 'floating', ipv4: { cidr: '198.51.100.0/28' } } },
  { apiVersion: 'tether.dev/v1alpha1', kind: 'AddressPool', metadata: { name: 'float2' }, spec: { usage: 'floating', ipv4: { cidr: '198.51.100.16/28' } } },
  { apiVersion: 'tether.dev/v1alpha1', kind: 'AddressPool', metadata: { name: 'lbs' }, spec: { usage: 'loadBalancer', ipv4: { cidr: '203.0.113.0/28' } } },
]);
const ctx = { pools, serviceCidrs: ['10.96.0.0/12'] };

function good(spec: Record<string, unknown> = {}, meta: Record<string, unknown> = {}) {
  return {
    apiVersion: 'tether.dev/v1alpha1',
    kind: 'Egress',
    metadata: { name: 'out', namespace: 'shop', ...meta },
    spec: { clients: { podSelector: { app: 'web' } }, gateways: { podSelector: { app: 'gw' } }, addresses: { pool: 'float', count: 2 }, ...spec },
  };
}

test('a good Egress resolves with defaults: everything outside the cluster, l2, 50 ms × 3', () => {
  const e = validateEgress(good(), ctx);
  assert.is(e.key, 'shop/out');
  assert.equal(e.clients, { matchLabels: { app: 'web' } });
  assert.equal(e.gateways, { matchLabels: { app: 'gw' } });
  assert.equal(e.families, [4]);
  assert.equal(e.destinations, ['0.0.0.0/0']);
  assert.equal(e.excluded, ['10.244.0.0/16', '10.96.0.0/12']);
  assert.equal(e.addresses, [{ pool: 'float', count: 2 }]);
  assert.is(e.zonePolicy, 'any');
  assert.is(e.maxAddressesPerNode, undefined);
  assert.equal(e.failover, { intervalMs: 50, detectMultiplier: 3 });
  assert.equal(e.announce, { mode: 'l2' });
});

test('explicit addresses, routeTable announce, matchLabels form', () => {
  const e = validateEgress(
    good({
      gateways: { podSelector: { matchLabels: { role: 'gw' } } },
      addresses: { explicit: ['198.51.100.3', '198.51.100.4'] },
      destinations: ['203.0.113.0/24'],
      announce: { mode: 'routeTable', table: 300 },
      failover: { intervalMs: 50, detectMultiplier: 4 },
    }),
    ctx,
  );
  assert.equal(e.gateways, { matchLabels: { role: 'gw' } });
  assert.equal(e.addresses, [{ pool: 'float', explicit: ['198.51.100.3', '198.51.100.4'] }]);
  assert.equal(e.announce, { mode: 'routeTable', table: 300 });
  assert.equal(e.failover, { intervalMs: 50, detectMultiplier: 4 });
});

const BAD: Array<[string, Record<string, unknown>, RegExp]> = [
  ['unknown pool', good({ addresses: { pool: 'nope' } }), /Egress "shop\/out": spec\.addresses\.pool "nope" is not a floating pool \(floating pools: float, float2\)/],
  ['pod pool used as floating', good({ addresses: { pool: 'pods' } }), /spec\.addresses\.pool "pods" is not a floating pool/],
  ['lb pool used as floating', good({ addresses: { pool: 'lbs' } }), /spec\.addresses\.pool "lbs" is not a floating pool/],
  ['address outside pools', good({ addresses: { explicit: ['192.0.2.1'] } }), /spec\.addresses\.explicit\[0\] 192\.0\.2\.1 is outside every floating pool/],
  ['explicit not an IP', good({ addresses: { explicit: ['gw1'] } }), /spec\.addresses\.explicit\[0\] "gw1" is not an IP address/],
  ['explicit in the wrong named pool', good({ addresses: { pool: 'float', explicit: ['198.51.100.20'] } }), /explicit\[0\] 198\.51\.100\.20 is in pool "float2", not "float"/],
  ['pools and count', good({ addresses: { pools: [{ pool: 'float', count: 1 }], count: 2 } }), /give one of count, pools, explicit \(got pools and count\)/],
  ['a pool listed twice in pools', good({ addresses: { pools: [{ pool: 'float' }, { pool: 'float', count: 2 }] } }), /pools\[1\]\.pool "float" is listed twice/],
  ['pools asking for more than 16', good({ addresses: { pools: [{ pool: 'float', count: 9 }, { pool: 'float2', count: 9 }] } }), /ask for 18 addresses; an Egress has at most 16/],
  ['unknown pool in pools', good({ addresses: { pools: [{ pool: 'nope', count: 1 }] } }), /spec\.addresses\.pools\[0\]\.pool "nope" is not a floating pool/],
  ['zone policy', good({ zonePolicy: 'nearest' }), /spec\.zonePolicy "nearest" must be one of any, preferLocalNode, preferZone, requireZone/],
  ['cap of 0', good({ maxAddressesPerNode: 0 }), /spec\.maxAddressesPerNode 0 must be an integer 1\.\.16/],
  ['explicit twice', good({ addresses: { explicit: ['198.51.100.3', '198.51.100.3'] } }), /lists an address twice/],
  ['count and explicit', good({ addresses: { explicit: ['198.51.100.3'], count: 2 } }), /give one of count, pools, explicit/],
  ['count 0', good({ addresses: { pool: 'float', count: 0 } }), /spec\.addresses\.count 0 must be an integer 1\.\.16/],
  ['no addresses', good({ addresses: undefined }), /spec\.addresses must be an object/],
  ['no gateways', good({ gateways: undefined }), /spec\.gateways must be an object .*without gateways cannot work/],
  ['gateways select everything', good({ gateways: { podSelector: {} } }), /spec\.gateways\.podSelector must name at least one label/],
  ['bad label', good({ clients: { podSelector: { 'bad key!': 'x' } } }), /spec\.clients\.podSelector key "bad key!" is not a valid label name/],
  ['bad CIDR', good({ destinations: ['203.0.113.0/33'] }), /spec\.destinations\[0\] "203\.0\.113\.0\/33" is not a CIDR/],
  ['host bits', good({ destinations: ['203.0.113.5/24'] }), /spec\.destinations\[0\] 203\.0\.113\.5\/24 is not a network address \(did you mean 203\.0\.113\.0\/24\?\)/],
  // An IPv4 pool's Egress cannot steer IPv6: its traffic would leave from no address of its own family.
  ['IPv6 destination, IPv4 addresses', good({ destinations: ['2001:db8::/32', '203.0.113.0/24'] }), /spec\.destinations 2001:db8::\/32: the Egress steers IPv6 but none of its addresses is IPv6/],
  ['IPv6 destination only, IPv4 pool', good({ destinations: ['2001:db8::/32'] }), /spec\.addresses pool "float" has no IPv6 subnet \(it has IPv4\)/],
  ['ipFamilies IPv6 on an IPv4 pool', good({ ipFamilies: ['IPv6'] }), /spec\.addresses pool "float" has no IPv6 subnet/],
  ['ipFamilies unknown', good({ ipFamilies: ['IPv5'] }), /spec\.ipFamilies \["IPv5"\] must list IPv4, IPv6 or both, once each/],
  ['ipFamilies twice', good({ ipFamilies: ['IPv4', 'IPv4'] }), /spec\.ipFamilies .* once each/],
  ['empty destinations', good({ destinations: [] }), /spec\.destinations must not be empty/],
  ['bad exclude', good({ excludeDestinations: 'all' }), /spec\.excludeDestinations must be a list of CIDRs/],
  ['bad interval', good({ failover: { intervalMs: 1 } }), /spec\.failover\.intervalMs 1 must be an integer 10\.\.10000/],
  ['bad multiplier', good({ failover: { detectMultiplier: 1 } }), /spec\.failover\.detectMultiplier 1 must be an integer 2\.\.255/],
  ['unknown failover field', good({ failover: { holdMs: 5 } }), /spec\.failover\.holdMs is not a field/],
  ['bad announce mode', good({ announce: { mode: 'bgp' } }), /spec\.announce\.mode "bgp" must be "l2" or "routeTable"/],
  ['reserved table', good({ announce: { mode: 'routeTable', table: 254 } }), /spec\.announce\.table 254 must be a routing table id/],
  ['table with l2', good({ announce: { mode: 'l2', table: 7 } }), /spec\.announce\.table only applies to mode routeTable/],
  ['typo in spec', good({ gatways: {} }), /spec\.gatways is not a field of Egress/],
  ['no namespace', good({}, { namespace: undefined }), /metadata\.namespace missing must be a DNS-1123 label/],
  ['bad name', good({}, { name: 'Out_1' }), /metadata\.name "Out_1" must be a DNS-1123 label/],
  ['wrong kind', { ...good(), kind: 'Egres' }, /kind "Egres" must be "Egress"/],
  // An Egress selects pods of its own namespace only: a selector naming any namespace is refused by name.
  ['clients in another namespace', good({ clients: { namespace: 'bank', podSelector: { matchLabels: { app: 'web' } } } }), /Egress "shop\/out": spec\.clients\.namespace: an Egress selects pods in its own namespace only/],
  ['gateways in another namespace', good({ gateways: { namespace: 'egress', podSelector: { matchLabels: { role: 'gw' } } } }), /Egress "shop\/out": spec\.gateways\.namespace: an Egress selects pods in its own namespace only/],
  ['clients naming its own namespace', good({ clients: { namespace: 'shop', podSelector: { matchLabels: { app: 'web' } } } }), /spec\.clients\.namespace: an Egress selects pods in its own namespace only/],
];

for (const [what, raw, re] of BAD) {
  test(`rejected: ${what}`, () => {
    try {
      validateEgress(raw, ctx);
      assert.unreachable('accepted');
    } catch (e) {
      assert.instance(e, TetherError);
      assert.is((e as TetherError).code, 'INVALID_CONFIG');
      assert.match((e as Error).message, re);
    }
  });
}

test("selects: pods of the Egress's own namespace only, whatever their labels", () => {
  const e = validateEgress(good(), ctx);
  assert.ok(selects(e, 'clients', 'shop', { app: 'web', tier: 'front' }));
  assert.not.ok(selects(e, 'clients', 'bank', { app: 'web' }), 'same labels, another namespace');
  assert.not.ok(selects(e, 'clients', 'shop', { app: 'db' }));
  assert.ok(selects(e, 'gateways', 'shop', { app: 'gw' }));
  assert.not.ok(selects(e, 'gateways', 'kube-system', { app: 'gw' }), 'same labels, another namespace');
});

test('several pools, explicit across pools, zone policy and cap; slots and their owners', () => {
  const e = validateEgress(good({ addresses: { pools: [{ pool: 'float', count: 2 }, { pool: 'float2' }] }, zonePolicy: 'preferZone', maxAddressesPerNode: 1 }), ctx);
  assert.equal(e.addresses, [{ pool: 'float', count: 2 }, { pool: 'float2', count: 1 }]);
  assert.is(e.zonePolicy, 'preferZone');
  assert.is(e.maxAddressesPerNode, 1);
  assert.equal(addressSlots(e).map((x) => slotOwner(e.key, x)), ['egress/shop/out#float/0', 'egress/shop/out#float/1', 'egress/shop/out#float2/0']);
  const x = validateEgress(good({ addresses: { explicit: ['198.51.100.3', '198.51.100.20'] } }), ctx);
  assert.equal(x.addresses, [{ pool: 'float', explicit: ['198.51.100.3'] }, { pool: 'float2', explicit: ['198.51.100.20'] }]);
  assert.equal(addressSlots(x).map((s) => slotOwner(x.key, s)), ['egress/shop/out#float/198.51.100.3', 'egress/shop/out#float2/198.51.100.20']);
});

// Both families: a dual-stack pool, an IPv6-only pool, pod and service ranges of both families.
const pools6 = validatePools([
  { apiVersion: 'tether.dev/v1alpha1', kind: 'AddressPool', metadata: { name: 'pods' }, spec: { usage: 'pod', ipv4: { cidr: '10.244.0.0/16' }, ipv6: { cidr: 'fd00:10:244::/56', blockSize: 64 } } },
  { apiVersion: 'tether.dev/v1alpha1', kind: 'AddressPool', metadata: { name: 'float' }, spec: { usage: 'floating', ipv4: { cidr: '198.51.100.0/28' } } },
  { apiVersion: 'tether.dev/v1alpha1', kind: 'AddressPool', metadata: { name: 'float6' }, spec: { usage: 'floating', ipv6: { cidr: '2001:db8:f::/120' } } },
  { apiVersion: 'tether.dev/v1alpha1', kind: 'AddressPool', metadata: { name: 'dual' }, spec: { usage: 'floating', ipv4: { cidr: '198.51.100.32/28' }, ipv6: { cidr: '2001:db8:d::/120' } } },
]);
const ctx6 = { pools: pools6, serviceCidrs: ['10.96.0.0/12', 'fd00:10:96::/112'] };

test('an IPv6 pool: IPv6 destinations by default, the IPv6 cluster ranges excluded', () => {
  const e = validateEgress(good({ addresses: { pool: 'float6', count: 2 } }), ctx6);
  assert.equal(e.families, [6]);
  assert.equal(e.destinations, ['::/0']);
  assert.equal(e.excluded, ['fd00:10:244::/56', 'fd00:10:96::/112']);
  assert.equal(addressSlots(e).map((x) => slotOwner(e.key, x)), ['egress/shop/out#float6/0', 'egress/shop/out#float6/1']);
});

test('a dual-stack pool: one family unless asked for both, and the first family keeps its slot owners', () => {
  // Written before Egresses had families: the pool's first family only, owners as every release wrote them.
  const before = validateEgress(good({ addresses: { pool: 'dual', count: 1 } }), ctx6);
  assert.equal(before.families, [4]);
  assert.equal(before.destinations, ['0.0.0.0/0']);
  assert.equal(addressSlots(before).map((x) => slotOwner(before.key, x)), ['egress/shop/out#dual/0']);
  const both = validateEgress(good({ ipFamilies: ['IPv4', 'IPv6'], addresses: { pool: 'dual', count: 2 } }), ctx6);
  assert.equal(both.families, [4, 6]);
  assert.equal(both.destinations, ['0.0.0.0/0', '::/0']);
  assert.equal(both.excluded, ['10.244.0.0/16', 'fd00:10:244::/56', '10.96.0.0/12', 'fd00:10:96::/112']);
  assert.equal(both.addresses, [{ pool: 'dual', count: 2 }, { pool: 'dual', count: 2, family: 6 }]);
  assert.equal(addressSlots(both).map((x) => slotOwner(both.key, x)), ['egress/shop/out#dual/0', 'egress/shop/out#dual/1', 'egress/shop/out#dual/IPv6/0', 'egress/shop/out#dual/IPv6/1']);
  assert.equal(addressSlots(both).map((x) => slotFamily(x, pools6)), [4, 4, 6, 6]);
  // The families of the destinations decide when ipFamilies is not given.
  const v6 = validateEgress(good({ destinations: ['2001:db8:100::/48'], addresses: { pool: 'dual' } }), ctx6);
  assert.equal(v6.families, [6]);
  assert.equal(v6.addresses, [{ pool: 'dual', count: 1, family: 6 }]);
});

test('a dual-stack Egress from two pools and from explicit addresses', () => {
  const e = validateEgress(good({ addresses: { pools: [{ pool: 'float' }, { pool: 'float6' }] }, destinations: ['203.0.113.0/24', '2001:db8:100::/48'] }), ctx6);
  assert.equal(e.families, [4, 6]);
  assert.equal(e.addresses, [{ pool: 'float', count: 1 }, { pool: 'float6', count: 1 }]);
  const x = validateEgress(good({ addresses: { explicit: ['198.51.100.3', '2001:db8:f::5'] } }), ctx6);
  assert.equal(x.families, [4, 6]);
  assert.equal(x.destinations, ['0.0.0.0/0', '::/0']);
  assert.equal(x.addresses, [{ pool: 'float', explicit: ['198.51.100.3'] }, { pool: 'float6', explicit: ['2001:db8:f::5'] }]);
});

test('families that do not meet are refused by name', () => {
  const refused = (spec: Record<string, unknown>, re: RegExp) => {
    try {
      validateEgress(good(spec), ctx6);
      assert.unreachable(`accepted ${JSON.stringify(spec)}`);
    } catch (e) {
      assert.instance(e, TetherError);
      assert.match((e as Error).message, re);
    }
  };
  // Destinations and addresses share no family.
  refused({ addresses: { explicit: ['2001:db8:f::5'] }, destinations: ['203.0.113.0/24'] }, /spec\.addresses\.explicit: 2001:db8:f::5 is IPv6, not a family of the Egress \(IPv4\)/);
  refused({ addresses: { pool: 'float6' }, destinations: ['203.0.113.0/24'] }, /spec\.addresses pool "float6" has no IPv4 subnet \(it has IPv6\)/);
  // A family asked for with no address of it.
  refused({ ipFamilies: ['IPv4', 'IPv6'], addresses: { pool: 'float' } }, /spec\.ipFamilies: the Egress steers IPv6 but none of its addresses is IPv6/);
  refused({ ipFamilies: ['IPv6'], addresses: { pool: 'dual' }, destinations: ['203.0.113.0/24'] }, /spec\.destinations\[0\] 203\.0\.113\.0\/24 is IPv4, but the Egress has no IPv4 address/);
  refused({ addresses: { pool: 'float6' }, excludeDestinations: ['203.0.113.0/24'] }, /spec\.excludeDestinations\[0\] 203\.0\.113\.0\/24 is IPv4, which the Egress does not steer/);
  refused({ ipFamilies: ['IPv4', 'IPv6'], addresses: { pool: 'dual', count: 9 } }, /ask for 18 addresses over IPv4, IPv6; an Egress has at most 16/);
});

test('all problems are reported at once', () => {
  try {
    validateEgress(good({ addresses: { pool: 'nope' }, destinations: ['x'], failover: { intervalMs: 0 } }), ctx);
    assert.unreachable('accepted');
  } catch (e) {
    assert.is((e as Error).message.split('\n').length, 3);
  }
});

test.run();
