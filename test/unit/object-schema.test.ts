// One schema per kind (daemon/objects/crds.ts) validates file objects as the API server validates the
// custom resources: structure with ajv, CEL rules with @bufbuild/cel, transition rules against the old
// version. The CRD manifests in install/crds are generated from it and must match.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { parseAllDocuments } from 'yaml';
import { celProblemsOf, isTransitionRule, schemaProblems } from '../../daemon/objects/schema';
import { CRDS } from '../../daemon/objects/crds';
import { parseConfig } from '../../daemon/config/objects';
import { celEnv, parse, plan } from '@bufbuild/cel';
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
  ['explicit not an address', egress({ addresses: { explicit: ['gw1'] } }), 'spec.addresses.explicit[0] "gw1" is not an IP address'],
  ['destination not a CIDR', egress({ destinations: ['203.0.113.0/33'] }), 'spec.destinations[0] "203.0.113.0/33" is not a CIDR like "203.0.113.0/24"'],
  ['empty destinations', egress({ destinations: [] }), 'spec.destinations must list at least 1 item(s)'],
  ['interval too short', egress({ failover: { intervalMs: 1 } }), 'spec.failover.intervalMs 1 must be >= 10'],
  ['unknown failover field', egress({ failover: { holdMs: 5 } }), 'unknown field spec.failover.holdMs'],
  ['typo in spec', egress({ gatways: {} }), 'unknown field spec.gatways'],
  ['announce mode', egress({ announce: { mode: 'bgp' } }), 'spec.announce.mode "bgp" must be one of "l2", "routeTable"'],
  ['kernel table (CEL, int list)', egress({ announce: { mode: 'routeTable', table: 254 } }), 'spec.announce: table must not be one of the kernel tables 253, 254, 255'],
  ['table with l2 (CEL)', egress({ announce: { mode: 'l2', table: 7 } }), 'spec.announce: table applies to mode routeTable only'],
  ['selector shorthand', egress({ clients: { podSelector: { app: 'web' } } }), 'unknown field spec.clients.podSelector.app'],
  ['clients in another namespace (CEL)', egress({ clients: { namespace: 'bank', podSelector: { matchLabels: { app: 'web' } } } }), "spec.clients.namespace: an Egress selects pods in its own namespace only: remove namespace and create the Egress in the pods' namespace"],
  ['gateways in another namespace (CEL)', egress({ gateways: { namespace: 'egress', podSelector: { matchLabels: { role: 'gw' } } } }), "spec.gateways.namespace: an Egress selects pods in its own namespace only: remove namespace and create the Egress in the pods' namespace"],
  ['a selector naming the own namespace (CEL cannot read metadata.namespace)', egress({ clients: { namespace: 'shop', podSelector: {} } }), "spec.clients.namespace: an Egress selects pods in its own namespace only: remove namespace and create the Egress in the pods' namespace"],
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

test('transition rules: usage, a family and a block claim are immutable; other edits pass', () => {
  const before = pool({ usage: 'pod', ipv4: { cidr: '10.0.0.0/16' }, reserved: ['10.0.0.1'] });
  assert.equal(schemaProblems(pool({ usage: 'pod', ipv4: { cidr: '10.0.0.0/16' }, reserved: ['10.0.0.2'] }), before), []);
  assert.equal(schemaProblems(pool({ usage: 'floating', ipv4: { cidr: '10.1.0.0/16' } }), before), [
    'spec.usage: usage is immutable: create a new pool instead',
    'spec.ipv4: ipv4 is immutable once set (cidr and blockSize): addresses are allocated from it; create a new pool instead',
  ]);
  // A family may be added to a pool (it has no old version to keep).
  assert.equal(schemaProblems(pool({ usage: 'pod', ipv4: { cidr: '10.0.0.0/16' }, ipv6: { cidr: 'fd00::/56' } }), before), []);
  const claim = block({ pool: 'default', cidr: '10.244.0.0/26', node: 'n1' });
  assert.equal(schemaProblems(block({ pool: 'default', cidr: '10.244.0.0/26', node: 'n2' }), claim), ['spec: a block claim is immutable: delete it to release the block']);
  // Without the old version (a create), transition rules do not run.
  assert.equal(schemaProblems(pool({ usage: 'floating', ipv4: { cidr: '10.1.0.0/16' } })), []);
});

// The bypass of a rule on the family itself (self.cidr == oldSelf.cidr on spec.ipv4): it does not run when
// the family is absent on either side, so removing the family in one update and adding it back with a new
// cidr in the next passed both steps. Each step is checked against the version before it, as the API
// server (and the file source, against the configuration in force) does.
for (const f of ['ipv4', 'ipv6'] as const) {
  const other = f === 'ipv4' ? 'ipv6' : 'ipv4';
  const cidrs = { ipv4: ['10.0.0.0/16', '10.9.0.0/16'], ipv6: ['fd00::/56', 'fd09::/56'] }[f];
  const keep = { [other]: { cidr: other === 'ipv4' ? '10.0.0.0/16' : 'fd00::/56' } };
  const v1 = pool({ usage: 'pod', ...keep, [f]: { cidr: cidrs[0] } });
  const removed = pool({ usage: 'pod', ...keep });
  const readded = pool({ usage: 'pod', ...keep, [f]: { cidr: cidrs[1] } });

  test(`${f}: removing it is refused, so it cannot come back with a new cidr`, () => {
    assert.equal(schemaProblems(removed, v1), [`spec.${f}: ${f} cannot be removed once set: addresses are allocated from it; create a new pool instead`]);
    // Had the removal been stored, its re-adding would be a family added (allowed): the removal is the step that must fail.
    assert.equal(schemaProblems(readded, removed), []);
    // In one step: a changed cidr is refused too.
    assert.equal(schemaProblems(readded, v1), [`spec.${f}: ${f} is immutable once set (cidr and blockSize): addresses are allocated from it; create a new pool instead`]);
  });

  test(`${f}: blockSize is fixed with it (a new size would let nodes claim overlapping blocks); legit edits pass`, () => {
    const sized = pool({ usage: 'pod', ...keep, [f]: { cidr: cidrs[0], blockSize: f === 'ipv4' ? 26 : 122 } });
    assert.equal(schemaProblems(pool({ usage: 'pod', ...keep, [f]: { cidr: cidrs[0], blockSize: f === 'ipv4' ? 24 : 120 } }), sized), [
      `spec.${f}: ${f} is immutable once set (cidr and blockSize): addresses are allocated from it; create a new pool instead`,
    ]);
    assert.equal(schemaProblems(pool({ usage: 'pod', ...keep, [f]: { cidr: cidrs[0] } }), sized).length, 1, 'blockSize dropped (back to the default) is a change');
    // Unchanged family, other fields edited; the same object again; the other family removed is refused on its own.
    assert.equal(schemaProblems(pool({ usage: 'pod', ...keep, [f]: { cidr: cidrs[0], blockSize: f === 'ipv4' ? 26 : 122 }, zone: 'a', reserved: [] }), sized), []);
    assert.equal(schemaProblems(sized, sized), []);
    assert.equal(schemaProblems(pool({ usage: 'pod', [f]: { cidr: cidrs[0], blockSize: f === 'ipv4' ? 26 : 122 } }), sized), [
      `spec.${other}: ${other} cannot be removed once set: addresses are allocated from it; create a new pool instead`,
    ]);
  });
}

test('a floating pool: a family added later, then kept; the bypass fails there too', () => {
  const v1 = pool({ usage: 'floating', ipv4: { cidr: '198.51.100.0/28' } });
  const v2 = pool({ usage: 'floating', ipv4: { cidr: '198.51.100.0/28' }, ipv6: { cidr: '2001:db8::/120' } });
  assert.equal(schemaProblems(v2, v1), []);
  assert.equal(schemaProblems(v1, v2), ['spec.ipv6: ipv6 cannot be removed once set: addresses are allocated from it; create a new pool instead']);
});

test('file source: the two-step bypass fails at the removal, against the configuration in force', () => {
  const text = (v4: string | undefined) =>
    `apiVersion: tether.dev/v1alpha1\nkind: AddressPool\nmetadata: { name: default }\nspec: { usage: pod, ${v4 ? `ipv4: { cidr: ${v4} }, ` : ''}ipv6: { cidr: "fd00::/56" } }\n`;
  const v1 = parseConfig(text('10.244.0.0/16'), 'pools.yaml');
  assert.throws(() => parseConfig(text(undefined), 'pools.yaml', v1), (e: Error) => /pools\.yaml.*AddressPool "default": spec\.ipv4: ipv4 cannot be removed once set/.test(e.message));
  // The refused removal leaves v1 in force: the new cidr is then a change of v1's, refused too.
  assert.throws(() => parseConfig(text('10.9.0.0/16'), 'pools.yaml', v1), (e: Error) => /spec\.ipv4: ipv4 is immutable once set/.test(e.message));
});

test('CEL as the API server runs it: transition rules on update only, where the old value exists and correlates', () => {
  // On a create nothing is compared; on an update a rule on an optional field does not run when the field is new.
  assert.equal(schemaProblems(pool({ usage: 'pod', ipv6: { cidr: 'fd00::/56' } })), []);
  // A transition rule is one whose expression refers to oldSelf, not one whose text mentions it.
  assert.ok(isTransitionRule('self.x == oldSelf.x'));
  assert.not.ok(isTransitionRule("self.x != 'oldSelf'"));
  // Every rule of every kind parses; none uses optionalOldSelf (tetherd cannot evaluate it: it would skip a
  // rule the API server runs); a transition rule sits only where an old value can correlate (never under an
  // item of a list that is not a map list, where the API server refuses the CRD).
  const walk = (s: Record<string, unknown>, at: string, correlatable: boolean, out: string[]): void => {
    for (const r of (s['x-kubernetes-validations'] ?? []) as Array<Record<string, unknown>>) {
      try {
        plan(celEnv(), parse(String(r.rule)));
      } catch (e) {
        out.push(`${at}: ${String(r.rule)} does not parse: ${(e as Error).message}`);
      }
      if (r.optionalOldSelf !== undefined) out.push(`${at}: optionalOldSelf`);
      if (isTransitionRule(String(r.rule)) && !correlatable) out.push(`${at}: transition rule under a list that is not a map list`);
      if (typeof r.fieldPath === 'string' && !/^(\.[A-Za-z_][A-Za-z0-9_]*)+$/.test(r.fieldPath)) out.push(`${at}: fieldPath ${r.fieldPath}`);
      if (typeof r.fieldPath === 'string') {
        let node: Record<string, unknown> | undefined = s;
        for (const k of r.fieldPath.split('.').slice(1)) node = (node?.properties as Record<string, Record<string, unknown>> | undefined)?.[k];
        if (!node) out.push(`${at}: fieldPath ${r.fieldPath} names no field of the schema`);
      }
    }
    for (const [k, v] of Object.entries((s.properties ?? {}) as Record<string, Record<string, unknown>>)) walk(v, `${at}.${k}`, correlatable, out);
    if (s.items) walk(s.items as Record<string, unknown>, `${at}[]`, correlatable && s['x-kubernetes-list-type'] === 'map', out);
  };
  const out: string[] = [];
  for (const d of CRDS) walk(d.schema, d.kind, true, out);
  assert.equal(out, []);
});

test('printer columns name single values: each a field of the schema, no list ([*] shows only its first value)', () => {
  for (const d of CRDS) {
    for (const c of d.columns) {
      assert.not.ok(c.jsonPath.includes('[*]'), `${d.kind} column ${c.name}: ${c.jsonPath} would show only the first value`);
      const path = c.jsonPath.replace(/\[\?\(@\.type=='\w+'\)\]/, '').split('.').slice(1);
      let node: Record<string, unknown> | undefined = d.schema;
      for (const k of path) node = node?.type === 'array' ? ((node.items as Record<string, any>)?.properties?.[k]) : (node?.properties as Record<string, any> | undefined)?.[k];
      assert.ok(node || path[0] === 'metadata', `${d.kind} column ${c.name}: ${c.jsonPath} names no field of the schema`);
      if (node && c.type === 'integer') assert.is(node.type, 'integer', `${d.kind} column ${c.name}`);
    }
  }
});

test('a map-list item correlates by its keys: a transition rule below it sees the old item of the same key', () => {
  // No CRD has a transition rule inside a list today; a test-only schema checks the walk the API server does.
  const s = {
    type: 'object',
    properties: {
      items: {
        type: 'array',
        'x-kubernetes-list-type': 'map',
        'x-kubernetes-list-map-keys': ['name'],
        items: { type: 'object', properties: { name: { type: 'string' }, size: { type: 'integer' } }, 'x-kubernetes-validations': [{ rule: 'self.size >= oldSelf.size', message: 'size may only grow' }] },
      },
      plain: {
        type: 'array',
        items: { type: 'object', properties: { size: { type: 'integer' } }, 'x-kubernetes-validations': [{ rule: 'self.size >= oldSelf.size', message: 'never run' }] },
      },
    },
  };
  const old = { items: [{ name: 'a', size: 5 }, { name: 'b', size: 1 }], plain: [{ size: 9 }] };
  // Reordered and b shrunk: b is compared with the old b (not the old item at its position); a new item c has no old one.
  assert.equal(celProblemsOf(s, { items: [{ name: 'b', size: 0 }, { name: 'a', size: 5 }, { name: 'c', size: 0 }], plain: [{ size: 1 }] }, old), ['items[0]: size may only grow']);
  assert.equal(celProblemsOf(s, { items: [{ name: 'b', size: 1 }, { name: 'a', size: 6 }], plain: [] }, old), []);
});

test.run();
