// What a tether load balancer is, read from a Service and its EndpointSlices: the defaults, each
// annotation, the targets' states, and every refusal with the field it names.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { validatePools } from '../../ipam/pool';
import { ANNOTATION, DEFAULT_IDLE_TIMEOUT_S, parseSelector, resolveLoadBalancers } from '../../daemon/lb/lb-spec';
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

test.run();
