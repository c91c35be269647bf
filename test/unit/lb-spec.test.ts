// What a tether load balancer is, read from a Service and its EndpointSlices: the defaults, each
// annotation, the targets' states, and every refusal with the field it names.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { validatePools } from '../../ipam/pool';
import { ANNOTATION, DATAPATH_FAMILIES, DEFAULT_IDLE_TIMEOUT_S, parseSelector, resolveLoadBalancers } from '../../daemon/lb/lb-spec';
import { maglevTable, isPrime } from '../../daemon/lb/maglev';

const pools = validatePools([
  { apiVersion: 'tether.dev/v1alpha1', kind: 'AddressPool', metadata: { name: 'lb' }, spec: { usage: 'loadBalancer', ipv4: { cidr: '198.51.100.0/28' } } },
  { apiVersion: 'tether.dev/v1alpha1', kind: 'AddressPool', metadata: { name: 'lb2' }, spec: { usage: 'loadBalancer', ipv4: { cidr: '203.0.113.0/28' } } },
  { apiVersion: 'tether.dev/v1alpha1', kind: 'AddressPool', metadata: { name: 'float' }, spec: { usage: 'floating', ipv4: { cidr: '192.0.2.0/28' } } },
]);

function svc(o: { annotations?: Record<string, string>; spec?: Record<string, unknown>; name?: string } = {}): Record<string, unknown> {
  return {
    apiVersion: 'v1', kind: 'Service', metadata: { name: o.name ?? 'db', namespace: 'shop', annotations: o.annotations ?? {} },
    spec: { type: 'LoadBalancer', loadBalancerClass: 'tether.dev/lb', ports: [{ port: 5432 }], ...o.spec },
  };
}

function slice(endpoints: Array<Record<string, unknown>>, service = 'db'): Record<string, unknown> {
  return { apiVersion: 'discovery.k8s.io/v1', kind: 'EndpointSlice', metadata: { name: `${service}-x`, namespace: 'shop', labels: { 'kubernetes.io/service-name': service } }, addressType: 'IPv4', endpoints };
}

test('defaults: client affinity, the Kubernetes idle timeout, LB pods labelled tether.dev/role=lb, the first loadBalancer pool', () => {
  const r = resolveLoadBalancers([svc()], pools);
  assert.is(r.refused.length, 0);
  const lb = r.loadBalancers[0];
  assert.is(lb.key, 'shop/db');
  assert.is(lb.affinity, 'client');
  assert.is(lb.idleTimeoutS, DEFAULT_IDLE_TIMEOUT_S);
  assert.equal(lb.lbPods, { namespace: 'shop', matchLabels: { 'tether.dev/role': 'lb' } });
  assert.equal(lb.vip, { pool: 'lb' });
  assert.equal(lb.ports, [{ port: 5432, protocol: 'TCP', proto: 6 }]);
});

test("other classes, other types and Services without a class are ignored", () => {
  const others = [
    svc({ spec: { loadBalancerClass: 'metallb.io/lb' } }),
    svc({ spec: { type: 'ClusterIP', loadBalancerClass: undefined } }),
    { ...svc(), spec: { type: 'LoadBalancer', ports: [{ port: 1 }] } },
  ];
  const r = resolveLoadBalancers(others, pools);
  assert.equal([r.loadBalancers.length, r.refused.length], [0, 0]);
});

test('annotations and fields: affinity, selector, namespace, pool, requested VIP, ClientIP timeout', () => {
  const r = resolveLoadBalancers([
    svc({
      annotations: { [ANNOTATION.affinity]: 'flow', [ANNOTATION.lbPods]: 'app=lb, tier=edge', [ANNOTATION.lbPodsNamespace]: 'edge', [ANNOTATION.vip]: '203.0.113.5' },
      spec: { sessionAffinity: 'ClientIP', sessionAffinityConfig: { clientIP: { timeoutSeconds: 600 } }, ports: [{ port: 53, protocol: 'UDP' }, { port: 53, protocol: 'TCP' }] },
    }),
    svc({ name: 'b', annotations: { [ANNOTATION.pool]: 'lb2', [ANNOTATION.idleTimeout]: '120' } }),
    svc({ name: 'c', spec: { loadBalancerIP: '198.51.100.9' } }),
  ], pools);
  assert.equal(r.refused, []);
  const [a, b, c] = r.loadBalancers;
  assert.is(a.affinity, 'flow');
  assert.equal(a.lbPods, { namespace: 'edge', matchLabels: { app: 'lb', tier: 'edge' } });
  assert.equal(a.vip, { pool: 'lb2', address: '203.0.113.5' });
  assert.is(a.idleTimeoutS, 600);
  assert.equal(a.ports.map((p) => `${p.port}/${p.protocol}`), ['53/UDP', '53/TCP']);
  assert.equal([b.vip, b.idleTimeoutS], [{ pool: 'lb2' }, 120]);
  assert.equal(c.vip, { pool: 'lb', address: '198.51.100.9' });
});

test('targets: ready ones active (terminating or not), not-ready terminating-but-serving ones keep their clients, others are not targets; IPv4 only; an endpoint is its first address; one entry per address', () => {
  const r = resolveLoadBalancers([svc(), slice([
    { addresses: ['10.244.0.5'], conditions: { ready: true }, nodeName: 'n4', targetRef: { kind: 'Pod', name: 't1' } },
    { addresses: ['10.244.0.6'], conditions: { ready: false, serving: true, terminating: true } },
    { addresses: ['10.244.0.7'], conditions: { ready: false, serving: false, terminating: true } },
    { addresses: ['10.244.0.8'], conditions: { ready: false } },
    { addresses: ['10.244.0.9'] },
    { addresses: ['10.244.0.5'], conditions: { ready: false, serving: true, terminating: true } },
    // publishNotReadyAddresses: a terminating pod stays ready (kube-proxy sends it new connections).
    { addresses: ['10.244.0.10'], conditions: { ready: true, serving: true, terminating: true } },
    // Fungible addresses of one endpoint: kube-proxy uses the first only.
    { addresses: ['10.244.0.11', '10.244.0.12'], conditions: { ready: true } },
  ]), { ...slice([{ addresses: ['fd00::1'] }]), addressType: 'IPv6' }], pools);
  assert.equal(r.loadBalancers[0].targets, [
    { address: '10.244.0.10', state: 'active' },
    { address: '10.244.0.11', state: 'active' },
    { address: '10.244.0.5', state: 'active', node: 'n4', pod: 'shop/t1' },
    { address: '10.244.0.6', state: 'terminating' },
    { address: '10.244.0.9', state: 'active' },
  ]);
});

test('bad input is refused with the field: VIP outside every pool, VIP in another pool than asked, unknown pool, port clash, SCTP, targetPort, affinity, selector, timeout', () => {
  const cases: Array<[Record<string, unknown>, RegExp]> = [
    [svc({ annotations: { [ANNOTATION.vip]: '192.0.2.5' } }), /lb\.tether\.dev\/vip.*192\.0\.2\.5 is outside every loadBalancer pool/],
    [svc({ annotations: { [ANNOTATION.vip]: '198.51.100.5', [ANNOTATION.pool]: 'lb2' } }), /in pool "lb", not in the requested pool "lb2"/],
    [svc({ annotations: { [ANNOTATION.pool]: 'float' } }), /"float" is not a loadBalancer AddressPool/],
    [svc({ spec: { ports: [{ port: 80 }, { port: 80, protocol: 'TCP' }] } }), /spec\.ports\[1\]: TCP port 80 clashes with spec\.ports\[0\]/],
    [svc({ spec: { ports: [{ port: 80, protocol: 'SCTP' }] } }), /spec\.ports\[0\]\.protocol: SCTP is not supported/],
    [svc({ spec: { ports: [{ port: 80, targetPort: 8080 }] } }), /spec\.ports\[0\]\.targetPort: 8080 must equal port 80/],
    [svc({ spec: { ports: [] } }), /spec\.ports: a load balancer needs at least one port/],
    [svc({ annotations: { [ANNOTATION.affinity]: 'sticky' } }), /affinity.*"sticky" must be client or flow/],
    [svc({ annotations: { [ANNOTATION.lbPods]: 'app' } }), /lb-pods.*"app" is not key=value/],
    [svc({ annotations: { [ANNOTATION.idleTimeout]: '0' } }), /idle-timeout.*must be whole seconds/],
  ];
  for (const [s, re] of cases) {
    const r = resolveLoadBalancers([s], pools);
    assert.is(r.loadBalancers.length, 0, `refused: ${re}`);
    assert.match(r.refused[0].problems.join('\n'), re);
  }
  const none = resolveLoadBalancers([svc()], pools.filter((p) => p.usage !== 'loadBalancer'));
  assert.match(none.refused[0].problems.join(), /no AddressPool with usage loadBalancer/);
});

test('externalTrafficPolicy Local needs a healthCheckNodePort, and two Services cannot share one', () => {
  const none = resolveLoadBalancers([svc({ spec: { externalTrafficPolicy: 'Local' } })], pools);
  assert.match(none.refused[0].problems.join(), /spec\.healthCheckNodePort: undefined: externalTrafficPolicy Local needs a health-check port/);
  const r = resolveLoadBalancers([
    svc({ spec: { externalTrafficPolicy: 'Local', healthCheckNodePort: 32000 } }),
    svc({ name: 'twin', spec: { externalTrafficPolicy: 'Local', healthCheckNodePort: 32000 } }),
    svc({ name: 'cluster', spec: { healthCheckNodePort: 32000 } }),
  ], pools);
  assert.equal(r.loadBalancers.map((l) => [l.key, l.externalTrafficPolicy, l.healthCheckNodePort]), [['shop/db', 'Local', 32000], ['shop/cluster', 'Cluster', undefined]]);
  assert.match(r.refused[0].problems.join(), /32000 is already the health-check port of Service shop\/db/);
});

test('no targets is accepted (the status says so, nothing is announced)', () => {
  const r = resolveLoadBalancers([svc()], pools);
  assert.equal([r.loadBalancers.length, r.loadBalancers[0].targets.length], [1, 0]);
});

test('selectors parse key=value lists and refuse the empty one', () => {
  assert.equal(parseSelector('a=b,c=d'), { a: 'b', c: 'd' });
  assert.throws(() => parseSelector(''), /empty/);
  assert.throws(() => parseSelector('a=b,=c'), /key=value/);
});

test('Maglev: identical for the same targets in any order, balanced, and a new target moves ~1/N of the table and nothing between old ones', () => {
  const ts = Array.from({ length: 7 }, (_, i) => `10.244.1.${i + 10}`);
  const m = 65537;
  assert.ok(isPrime(m) && !isPrime(65536));
  const a = maglevTable(ts, m);
  const b = maglevTable([...ts].reverse(), m);
  assert.equal(Array.from(a.table), Array.from(b.table), 'order of the target list does not matter');
  const counts = new Map<number, number>();
  for (const x of a.table) counts.set(x, (counts.get(x) ?? 0) + 1);
  for (const n of counts.values()) assert.ok(Math.abs(n - m / 7) <= m / 7 * 0.02, `each target gets ~1/7 (got ${n})`);
  const c = maglevTable([...ts, '10.244.1.99'], m);
  let toNew = 0;
  let between = 0;
  for (let i = 0; i < m; i++) {
    const before = a.targets[a.table[i]];
    const after = c.targets[c.table[i]];
    if (after === '10.244.1.99') toNew++;
    else if (after !== before) between++;
  }
  assert.ok(Math.abs(toNew - m / 8) <= m / 8 * 0.05, `the new target takes ~1/8 (${toNew})`);
  assert.ok(between < m * 0.01, `< 1 % moves between old targets (${between})`);
  assert.throws(() => maglevTable(ts, 65536), /not a prime/);
  assert.ok(Array.from(maglevTable([], 7).table).every((x) => x === -1));
});


// ---------------------------------------------------------------------------------------------------
// IP families: spec.ipFamilyPolicy and spec.ipFamilies as the API server defaults and validates them, one
// VIP per family, each family's own targets, and every refusal naming the Service, the field and the family.

const famPools = validatePools([
  { apiVersion: 'tether.dev/v1alpha1', kind: 'AddressPool', metadata: { name: 'v4' }, spec: { usage: 'loadBalancer', ipv4: { cidr: '198.51.100.0/28' } } },
  { apiVersion: 'tether.dev/v1alpha1', kind: 'AddressPool', metadata: { name: 'dual' }, spec: { usage: 'loadBalancer', ipv4: { cidr: '203.0.113.0/28' }, ipv6: { cidr: '2001:db8:5::/120' } } },
  { apiVersion: 'tether.dev/v1alpha1', kind: 'AddressPool', metadata: { name: 'v6' }, spec: { usage: 'loadBalancer', ipv6: { cidr: '2001:db8:6::/120' } } },
]);
const v4Only = famPools.filter((p) => p.name === 'v4');
const BOTH = { datapathFamilies: ['IPv4', 'IPv6'] as const };
const fam = (spec: Record<string, unknown> = {}, annotations: Record<string, string> = {}) => svc({ spec, annotations });
/** Each resolved VIP as "key family pool[ address]". */
const shown = (r: ReturnType<typeof resolveLoadBalancers>) => r.loadBalancers.map((l) => `${l.key} ${l.family} ${l.vip.pool}${l.vip.address ? ` ${l.vip.address}` : ''}`);

test('families by policy (table): defaults as the API server applies them, one VIP per family, the IPv4 one under the Service\'s own key', () => {
  const cases: Array<[string, Record<string, unknown>, Record<string, string>, typeof famPools, string[], string[]]> = [
    // [what, spec, annotations, pools, VIPs, ipFamilies]
    ['no policy, no families: SingleStack in the first pool\'s first family (as before)', {}, {}, famPools, ['shop/db IPv4 v4'], ['IPv4']],
    ['SingleStack IPv6: the IPv6 VIP under <key>#IPv6, from the first pool with IPv6', { ipFamilies: ['IPv6'] }, {}, famPools, ['shop/db#IPv6 IPv6 dual'], ['IPv6']],
    ['PreferDualStack, no families: the default family first, the other appended', { ipFamilyPolicy: 'PreferDualStack' }, {}, famPools, ['shop/db IPv4 v4', 'shop/db#IPv6 IPv6 dual'], ['IPv4', 'IPv6']],
    ['RequireDualStack [IPv6, IPv4]: in that order, IPv4 still under the plain key', { ipFamilyPolicy: 'RequireDualStack', ipFamilies: ['IPv6', 'IPv4'] }, {}, famPools, ['shop/db#IPv6 IPv6 dual', 'shop/db IPv4 v4'], ['IPv6', 'IPv4']],
    ['the named dual-stack pool serves both', { ipFamilyPolicy: 'RequireDualStack' }, { [ANNOTATION.pool]: 'dual' }, famPools, ['shop/db IPv4 dual', 'shop/db#IPv6 IPv6 dual'], ['IPv4', 'IPv6']],
    ['PreferDualStack on IPv4-only pools: served in IPv4', { ipFamilyPolicy: 'PreferDualStack', ipFamilies: ['IPv4', 'IPv6'] }, {}, v4Only, ['shop/db IPv4 v4'], ['IPv4', 'IPv6']],
    ['requested VIPs, one per family: families inferred in their order', { ipFamilyPolicy: 'RequireDualStack' }, { [ANNOTATION.vip]: '2001:DB8:6::0005, 203.0.113.7' }, famPools, ['shop/db#IPv6 IPv6 v6 2001:db8:6::5', 'shop/db IPv4 dual 203.0.113.7'], ['IPv6', 'IPv4']],
    ['loadBalancerIP IPv6 alone: SingleStack IPv6', { loadBalancerIP: '2001:db8:5::9' }, {}, famPools, ['shop/db#IPv6 IPv6 dual 2001:db8:5::9'], ['IPv6']],
    ['PreferDualStack with one requested VIP: the other family from a pool', { ipFamilyPolicy: 'PreferDualStack' }, { [ANNOTATION.vip]: '198.51.100.3' }, famPools, ['shop/db IPv4 v4 198.51.100.3', 'shop/db#IPv6 IPv6 dual'], ['IPv4', 'IPv6']],
  ];
  for (const [what, spec, ann, pools, want, families] of cases) {
    const r = resolveLoadBalancers([fam(spec, ann)], pools, BOTH);
    assert.equal(r.refused, [], what);
    assert.equal(shown(r), want, what);
    for (const l of r.loadBalancers) assert.equal([l.service, l.ipFamilies], ['shop/db', families], what);
  }
});

test('PreferDualStack with one family available is served in it, and says the other is not available', () => {
  const r = resolveLoadBalancers([fam({ ipFamilyPolicy: 'PreferDualStack', ipFamilies: ['IPv4', 'IPv6'] })], v4Only, BOTH);
  assert.equal(shown(r), ['shop/db IPv4 v4']);
  assert.equal(r.unserved, [{ key: 'shop/db', family: 'IPv6', why: 'spec.ipFamilyPolicy PreferDualStack: no IPv6 VIP, no loadBalancer AddressPool has an IPv6 subnet; served in IPv4 only' }]);
  const named = resolveLoadBalancers([fam({ ipFamilyPolicy: 'PreferDualStack' }, { [ANNOTATION.pool]: 'v6' })], famPools, BOTH);
  assert.equal(shown(named), ['shop/db#IPv6 IPv6 v6'], 'the named pool\'s one family, no other appended');
});

test('bad families are refused as the API server refuses them, naming the Service, the field and the family; nothing of the Service is served', () => {
  const cases: Array<[string, Record<string, unknown>, Record<string, string>, typeof famPools, RegExp]> = [
    ['RequireDualStack, no IPv6 pool', { ipFamilyPolicy: 'RequireDualStack' }, {}, v4Only, /spec\.ipFamilyPolicy: RequireDualStack: Service shop\/db needs an IPv6 VIP, and no loadBalancer AddressPool has an IPv6 subnet/],
    ['RequireDualStack, the named pool has one family', { ipFamilyPolicy: 'RequireDualStack' }, { [ANNOTATION.pool]: 'v4' }, famPools, /spec\.ipFamilyPolicy: RequireDualStack: Service shop\/db needs an IPv6 VIP, and pool "v4" has no IPv6 subnet/],
    ['an IPv6 VIP in an IPv4-only pool', {}, { [ANNOTATION.vip]: '2001:db8:5::9', [ANNOTATION.pool]: 'v4' }, famPools, /lb\.tether\.dev\/vip.*2001:db8:5::9 is an IPv6 address, and pool "v4" has no IPv6 subnet/],
    ['an IPv6 VIP outside every pool', {}, { [ANNOTATION.vip]: '2001:db8:7::1' }, famPools, /2001:db8:7::1 is outside every loadBalancer pool/],
    ['two families under SingleStack', { ipFamilyPolicy: 'SingleStack', ipFamilies: ['IPv4', 'IPv6'] }, {}, famPools, /spec\.ipFamilyPolicy: must be 'RequireDualStack' or 'PreferDualStack' when multiple IP families are specified/],
    ['two families, no policy (SingleStack)', { ipFamilies: ['IPv4', 'IPv6'] }, {}, famPools, /must be 'RequireDualStack' or 'PreferDualStack' when multiple IP families/],
    ['two requested VIPs under SingleStack', {}, { [ANNOTATION.vip]: '198.51.100.3,2001:db8:5::9' }, famPools, /spec\.ipFamilyPolicy: must be 'RequireDualStack' or 'PreferDualStack' when .*lb\.tether\.dev\/vip.* requests a VIP in each family/],
    ['a family listed twice', { ipFamilyPolicy: 'PreferDualStack', ipFamilies: ['IPv4', 'IPv4'] }, {}, famPools, /spec\.ipFamilies\[1\]: IPv4 is listed twice/],
    ['an unknown family', { ipFamilies: ['IPv5'] }, {}, famPools, /spec\.ipFamilies\[0\]: "IPv5" is not supported \(IPv4 or IPv6\)/],
    ['three families', { ipFamilyPolicy: 'PreferDualStack', ipFamilies: ['IPv4', 'IPv6', 'IPv4'] }, {}, famPools, /may specify no more than 2 ipFamilies/],
    ['an unknown policy', { ipFamilyPolicy: 'DualStack' }, {}, famPools, /spec\.ipFamilyPolicy: "DualStack" is not supported/],
    ['SingleStack IPv6 with no IPv6 pool', { ipFamilies: ['IPv6'] }, {}, v4Only, /spec\.ipFamilies\[0\]: IPv6: Service shop\/db needs an IPv6 VIP, and no loadBalancer AddressPool has an IPv6 subnet/],
    ['a requested VIP of a family ipFamilies does not list', { ipFamilies: ['IPv4'] }, { [ANNOTATION.vip]: '2001:db8:5::9' }, famPools, /2001:db8:5::9 is an IPv6 address, and spec\.ipFamilies \(IPv4\) does not list IPv6/],
    ['two VIPs of one family', { ipFamilyPolicy: 'PreferDualStack' }, { [ANNOTATION.vip]: '198.51.100.3,198.51.100.4' }, famPools, /lists two IPv4 addresses: at most one per family/],
    ['three VIPs', { ipFamilyPolicy: 'PreferDualStack' }, { [ANNOTATION.vip]: '198.51.100.3,2001:db8:5::9,198.51.100.4' }, famPools, /lists 3 addresses: at most one per family/],
    ['not an address', {}, { [ANNOTATION.vip]: 'fe80::1%eth0' }, famPools, /"fe80::1%eth0" is not an IPv4 or IPv6 address/],
  ];
  for (const [what, spec, ann, pools, re] of cases) {
    const r = resolveLoadBalancers([fam(spec, ann)], pools, BOTH);
    assert.equal(r.loadBalancers, [], `${what}: nothing served`);
    assert.is(r.refused[0]?.key, 'shop/db', what);
    assert.match(r.refused[0].problems.join('\n'), re, what);
  }
});

test('targets per family: a VIP balances only the endpoints of its family\'s slices, IPv6 text canonical', () => {
  const v6slice = { ...slice([{ addresses: ['FD00:0:0::5'], conditions: { ready: true }, nodeName: 'n1' }, { addresses: ['10.244.0.9'] }]), addressType: 'IPv6' };
  const r = resolveLoadBalancers([fam({ ipFamilyPolicy: 'RequireDualStack' }), slice([{ addresses: ['10.244.0.5'] }, { addresses: ['fd00::7'] }]), v6slice], famPools, BOTH);
  const [v4, v6] = r.loadBalancers;
  assert.equal(v4.targets, [{ address: '10.244.0.5', state: 'active' }]);
  assert.equal(v6.targets, [{ address: 'fd00::5', state: 'active', node: 'n1' }]);
});

test('the status\'s VIPs are read per family (the recorded one of each family in its pool)', () => {
  const s = { ...fam({ ipFamilyPolicy: 'RequireDualStack' }, { [ANNOTATION.pool]: 'dual' }), status: { loadBalancer: { ingress: [{ ip: '2001:db8:5:0::3' }, { ip: '203.0.113.4' }] } } };
  const r = resolveLoadBalancers([s], famPools, BOTH);
  assert.equal(r.loadBalancers.map((l) => [l.family, l.vip.recorded]), [['IPv4', '203.0.113.4'], ['IPv6', '2001:db8:5::3']]);
});

test('the datapath gate: IPv6 is in DATAPATH_FAMILIES; a datapath without it (datapathFamilies IPv4) does not resolve an IPv6 VIP for programming, and says so by name; the IPv4 VIP is served as before', () => {
  const services = [fam({ ipFamilyPolicy: 'RequireDualStack' }), fam({ ipFamilies: ['IPv6'] }, {})].map((s, i) => ({ ...s, metadata: { ...(s.metadata as object), name: i ? 'six' : 'db' } }));
  assert.equal([...DATAPATH_FAMILIES], ['IPv4', 'IPv6']);
  const all = resolveLoadBalancers(services, famPools);
  assert.equal([all.loadBalancers.map((l) => `${l.key} ${l.family}`), all.unserved ?? []], [['shop/db IPv4', 'shop/db#IPv6 IPv6', 'shop/six#IPv6 IPv6'], []], 'both families resolved by default');
  const r = resolveLoadBalancers(services, famPools, { datapathFamilies: ['IPv4'] });
  assert.equal(shown(r), ['shop/db IPv4 v4']);
  assert.equal(r.refused, []);
  assert.equal(r.unserved, [
    { key: 'shop/db', family: 'IPv6', why: "IPv6 VIPs are not programmed by this release's datapath yet; served in IPv4 only" },
    { key: 'shop/six', family: 'IPv6', why: "IPv6 VIPs are not programmed by this release's datapath yet" },
  ]);
  // A dual-stack Local Service's two VIPs share its health-check port: not a clash with itself.
  const local = resolveLoadBalancers([fam({ ipFamilyPolicy: 'RequireDualStack', externalTrafficPolicy: 'Local', healthCheckNodePort: 32000 })], famPools, BOTH);
  assert.equal([local.refused, local.loadBalancers.map((l) => l.healthCheckNodePort)], [[], [32000, 32000]]);
});

test.run();
