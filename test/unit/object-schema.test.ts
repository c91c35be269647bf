// One schema per kind (daemon/objects/crds.ts) validates file objects as the API server validates the
// custom resources: structure with ajv, CEL rules with @bufbuild/cel, transition rules against the old
// version. The CRD manifests in install/crds are generated from it and must match.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { parseAllDocuments } from 'yaml';
import { schemaProblems } from '../../daemon/objects/schema';
import { generatedCrds } from '../../install/gen-crds';

const V = 'tether.dev/v1alpha1';
const egress = (spec: Record<string, unknown> = {}, meta: Record<string, unknown> = {}) => ({
  apiVersion: V,
  kind: 'Egress',
  metadata: { name: 'out', namespace: 'shop', ...meta },
  spec: {
    clients: { podSelector: { matchLabels: { app: 'web' } } },
    gateways: { podSelector: { matchLabels: { role: 'gw' } } },
    addresses: { pool: 'float', count: 1 },
    ...spec,
  },
});
const pool = (spec: Record<string, unknown>, name = 'p') => ({ apiVersion: V, kind: 'AddressPool', metadata: { name }, spec });
const block = (spec: Record<string, unknown>) => ({ apiVersion: V, kind: 'AddressBlock', metadata: { name: 'default-10-244-0-0-26' }, spec });

test('install/crds holds exactly what install/gen-crds.ts generates from the schemas', () => {
  const dir = path.join(__dirname, '../../install/crds');
  const gen = generatedCrds();
  assert.equal(fs.readdirSync(dir).sort(), [...gen.keys()].sort());
  for (const [name, text] of gen) assert.is(fs.readFileSync(path.join(dir, name), 'utf8'), text, `${name} is stale: run node_modules/.bin/tsx install/gen-crds.ts`);
});

test('every example in conf/ passes its schema', () => {
  const dir = path.join(__dirname, '../../conf');
  let checked = 0;
  for (const f of fs.readdirSync(dir).filter((x) => /\.ya?ml$/.test(x))) {
    for (const doc of parseAllDocuments(fs.readFileSync(path.join(dir, f), 'utf8'))) {
      const obj = doc.toJS() as Record<string, unknown> | null;
      if (!obj) continue;
      assert.equal(schemaProblems(obj), [], `${f}: ${String(obj.kind)}`);
      checked++;
    }
  }
  assert.ok(checked >= 6, `only ${checked} objects checked`);
});

test('good objects pass: count, explicit, routeTable, dual-stack pod pool, block claim', () => {
  assert.equal(schemaProblems(egress()), []);
  assert.equal(schemaProblems(egress({ addresses: { explicit: ['198.51.100.3'] }, announce: { mode: 'routeTable', table: 300 }, destinations: ['203.0.113.0/24'] })), []);
  assert.equal(schemaProblems(pool({ usage: 'pod', ipv4: { cidr: '10.244.0.0/16', blockSize: 26 }, ipv6: { cidr: 'fd00::/56', blockSize: 122 } })), []);
  assert.equal(schemaProblems(block({ pool: 'default', cidr: '10.244.0.0/26', node: 'n1' })), []);
});

// Each bad object fails with one line naming the field (ajv for structure, CEL for the rules).
const BAD: Array<[string, unknown, string]> = [
  ['count above 16', egress({ addresses: { pool: 'float', count: 20 } }), 'spec.addresses.count 20 must be <= 16'],
  ['pools and count (CEL one-of)', egress({ addresses: { pools: [{ pool: 'float' }], count: 2 } }), 'spec.addresses: give one of count, pools, explicit'],
  ['a zone policy that is not one (enum)', egress({ zonePolicy: 'nearest', addresses: { pool: 'float' } }), 'spec.zonePolicy "nearest" must be one of "any", "preferLocalNode", "preferZone", "requireZone"'],
  ['count and explicit (CEL one-of)', egress({ addresses: { pool: 'float', count: 1, explicit: ['198.51.100.3'] } }), 'spec.addresses: give one of count, pools, explicit'],
  ['neither pool nor explicit (CEL)', egress({ addresses: { count: 2 } }), 'spec.addresses: name a floating pool, pools, or explicit addresses'],
  ['explicit not an address', egress({ addresses: { explicit: ['gw1'] } }), 'spec.addresses.explicit[0] "gw1" is not an IPv4 address'],
  ['destination not a CIDR', egress({ destinations: ['203.0.113.0/33'] }), 'spec.destinations[0] "203.0.113.0/33" is not a CIDR like "203.0.113.0/24"'],
  ['empty destinations', egress({ destinations: [] }), 'spec.destinations must list at least 1 item(s)'],
  ['interval too short', egress({ failover: { intervalMs: 1 } }), 'spec.failover.intervalMs 1 must be >= 10'],
  ['unknown failover field', egress({ failover: { holdMs: 5 } }), 'unknown field spec.failover.holdMs'],
  ['typo in spec', egress({ gatways: {} }), 'unknown field spec.gatways'],
  ['announce mode', egress({ announce: { mode: 'bgp' } }), 'spec.announce.mode "bgp" must be one of "l2", "routeTable"'],
  ['kernel table (CEL, int list)', egress({ announce: { mode: 'routeTable', table: 254 } }), 'spec.announce: table must not be one of the kernel tables 253, 254, 255'],
  ['table with l2 (CEL)', egress({ announce: { mode: 'l2', table: 7 } }), 'spec.announce: table applies to mode routeTable only'],
  ['selector shorthand', egress({ clients: { podSelector: { app: 'web' } } }), 'unknown field spec.clients.podSelector.app'],
  ['no gateways', { ...egress(), spec: { clients: { podSelector: {} }, addresses: { pool: 'f' } } }, 'spec.gateways is missing'],
  ['namespace not a label', egress({}, { namespace: 'Shop' }), 'metadata.namespace "Shop" must be a DNS-1123 label'],
  ['pool usage', pool({ usage: 'pods', ipv4: { cidr: '10.0.0.0/16' } }), 'spec.usage "pods" must be one of "pod", "floating", "loadBalancer"'],
  ['pool without family (CEL)', pool({ usage: 'pod' }), 'spec: needs ipv4, ipv6 or both'],
  ['blockSize on floating (CEL)', pool({ usage: 'floating', ipv4: { cidr: '10.0.0.0/24', blockSize: 26 } }), 'spec: blockSize applies to pod pools only (floating and loadBalancer addresses are allocated cluster-wide)'],
  ['blockSize too long', pool({ usage: 'pod', ipv4: { cidr: '10.0.0.0/16', blockSize: 33 } }), 'spec.ipv4.blockSize 33 must be <= 32'],
  ['pool name not a label', pool({ usage: 'pod', ipv4: { cidr: '10.0.0.0/16' } }, 'a.b'), 'metadata.name "a.b" must be a DNS-1123 label'],
  ['pool with a namespace', { ...pool({ usage: 'pod', ipv4: { cidr: '10.0.0.0/16' } }), metadata: { name: 'p', namespace: 'x' } }, 'metadata.namespace: a AddressPool is cluster-scoped and has no namespace'],
  ['block without node', block({ pool: 'default', cidr: '10.244.0.0/26' }), 'spec.node is missing'],
  ['wrong apiVersion', { ...egress(), apiVersion: 'tether.dev/v1' }, 'apiVersion "tether.dev/v1" must be "tether.dev/v1alpha1"'],
  ['unknown kind', { apiVersion: V, kind: 'Egres', metadata: { name: 'x' } }, 'kind "Egres" has no schema (one of AddressPool, Egress, AddressBlock, Node, Service, EndpointSlice)'],
  ['Service with the CRD apiVersion', { apiVersion: V, kind: 'Service', metadata: { name: 'db', namespace: 's' }, spec: {} }, 'apiVersion "tether.dev/v1alpha1" must be "v1"'],
  ['Service port out of range', { apiVersion: 'v1', kind: 'Service', metadata: { name: 'db', namespace: 's' }, spec: { type: 'LoadBalancer', ports: [{ port: 70000 }] } }, 'spec.ports[0].port 70000 must be <= 65535'],
  ['Service class on a ClusterIP (CEL)', { apiVersion: 'v1', kind: 'Service', metadata: { name: 'db', namespace: 's' }, spec: { type: 'ClusterIP', loadBalancerClass: 'tether.dev/lb' } }, 'spec: loadBalancerClass may only be set on a Service of type LoadBalancer'],
  ['Service affinity timeout', { apiVersion: 'v1', kind: 'Service', metadata: { name: 'db', namespace: 's' }, spec: { sessionAffinityConfig: { clientIP: { timeoutSeconds: 90000 } } } }, 'spec.sessionAffinityConfig.clientIP.timeoutSeconds 90000 must be <= 86400'],
  ['EndpointSlice address type', { apiVersion: 'discovery.k8s.io/v1', kind: 'EndpointSlice', metadata: { name: 'x', namespace: 's' }, addressType: 'IPv5', endpoints: [] }, 'addressType "IPv5" must be one of "IPv4", "IPv6", "FQDN"'],
];

test(`bad objects: ${BAD.length} rows, each rejected naming the field`, () => {
  for (const [name, obj, want] of BAD) {
    const got = schemaProblems(obj);
    assert.ok(got.includes(want), `${name}: expected ${JSON.stringify(want)}, got ${JSON.stringify(got)}`);
  }
});

test('transition rules: usage, a family cidr and a block claim are immutable; other edits pass', () => {
  const before = pool({ usage: 'pod', ipv4: { cidr: '10.0.0.0/16' }, reserved: ['10.0.0.1'] });
  assert.equal(schemaProblems(pool({ usage: 'pod', ipv4: { cidr: '10.0.0.0/16' }, reserved: ['10.0.0.2'] }), before), []);
  assert.equal(schemaProblems(pool({ usage: 'floating', ipv4: { cidr: '10.1.0.0/16' } }), before), [
    'spec: usage is immutable',
    'spec.ipv4: cidr is immutable: addresses are allocated from it; create a new pool instead',
  ]);
  // A family added later has no old version: no transition rule applies to it.
  assert.equal(schemaProblems(pool({ usage: 'pod', ipv4: { cidr: '10.0.0.0/16' }, ipv6: { cidr: 'fd00::/56' } }), before), []);
  const claim = block({ pool: 'default', cidr: '10.244.0.0/26', node: 'n1' });
  assert.equal(schemaProblems(block({ pool: 'default', cidr: '10.244.0.0/26', node: 'n2' }), claim), ['spec: a block claim is immutable: delete it to release the block']);
  // Without the old version (a create), transition rules do not run.
  assert.equal(schemaProblems(pool({ usage: 'floating', ipv4: { cidr: '10.1.0.0/16' } })), []);
});

test.run();
