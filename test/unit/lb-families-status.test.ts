// A tether Service in both IP families, from the spec to its status, against a real redis-server and the
// fake API server: tether-operator's view (LbView) allocates one VIP per family (the IPv4 one under the
// Service's own owner lb/<ns>/<name>, as every release before; the IPv6 one under lb/<ns>/<name>#IPv6) and
// the status pass lists them in status.loadBalancer.ingress in the Service's ipFamilies order (the default:
// DATAPATH_FAMILIES holds both); with a datapath of IPv4 only (datapathFamilies) no IPv6 VIP is allocated or
// listed, and the status says so by name; PreferDualStack on IPv4-only pools is served in IPv4 and says IPv6 is not available.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { Writable } from 'node:stream';
import { makeLogger, setLogger } from '../../lib/log';
import { ClusterAddresses } from '../../ipam/cluster-addresses';
import { validatePools } from '../../ipam/pool';
import { RedisStore } from '../../ipam/store/redis-store';
import { connectLbStore } from '../../daemon/lb/lb-store';
import { resolveLoadBalancers } from '../../daemon/lb/lb-spec';
import { StatusController } from '../../daemon/kube/status-controller';
import { LbView } from '../../operator/cluster-view';
import { LB_CLASS, TETHER_SERVICE_LABEL } from '../../daemon/objects/names';
import { apiWithSource } from '../lib/kube-fixture';
import { startRedis, type TestRedis } from '../lib/redis';

const quiet = makeLogger({ level: 'error', stream: new Writable({ write: (_c, _e, cb) => cb() }) });
setLogger(quiet);
const pools = validatePools([
  { apiVersion: 'tether.dev/v1alpha1', kind: 'AddressPool', metadata: { name: 'lb' }, spec: { usage: 'loadBalancer', ipv4: { cidr: '198.18.0.0/28' }, ipv6: { cidr: '2001:db8:18::/124' } } },
]);
const v4Pools = validatePools([
  { apiVersion: 'tether.dev/v1alpha1', kind: 'AddressPool', metadata: { name: 'lb' }, spec: { usage: 'loadBalancer', ipv4: { cidr: '198.18.0.0/28' } } },
]);

const service = (name: string, spec: Record<string, unknown>) => ({
  apiVersion: 'v1', kind: 'Service', metadata: { name, namespace: 'shop', labels: { [TETHER_SERVICE_LABEL]: 'true' } },
  spec: { type: 'LoadBalancer', loadBalancerClass: LB_CLASS, ports: [{ port: 80, protocol: 'TCP' }], ...spec },
});
const slices = (name: string) => [
  { apiVersion: 'discovery.k8s.io/v1', kind: 'EndpointSlice', metadata: { name: `${name}-4`, namespace: 'shop', labels: { 'kubernetes.io/service-name': name } }, addressType: 'IPv4', endpoints: [{ addresses: ['10.244.1.5'] }] },
  { apiVersion: 'discovery.k8s.io/v1', kind: 'EndpointSlice', metadata: { name: `${name}-6`, namespace: 'shop', labels: { 'kubernetes.io/service-name': name } }, addressType: 'IPv6', endpoints: [{ addresses: ['fd00:244::5'] }] },
];

let redis: TestRedis;
let seq = 0;
test.before(async () => {
  redis = await startRedis();
});
test.after(async () => {
  await redis?.stop();
});

/** The operator's view and status pass over these Services, resolved with `families` programmed; `fn` gets the fake API server and the store's holders. */
async function operator(objects: Array<Record<string, unknown>>, poolList: typeof pools, families: ReadonlyArray<'IPv4' | 'IPv6'> | undefined, fn: (o: { ingress: (n: string) => unknown; ready: (n: string) => Record<string, string>; holders: () => Promise<Record<string, string>>; view: LbView }) => Promise<void>): Promise<void> {
  const prefix = `fam${++seq}:`;
  const ipam = await RedisStore.connect(redis.url, { keyPrefix: prefix });
  const store = await connectLbStore(redis.url, { keyPrefix: prefix });
  const addresses = new ClusterAddresses(poolList, ipam, quiet, { holdOffMs: 0 });
  const { api, source, close } = await apiWithSource(objects.filter((o) => o.kind === 'Service'), quiet);
  try {
    const view = new LbView({ identity: 'tether-operator-0', addresses, store, logger: quiet });
    await view.refresh(resolveLoadBalancers(objects, poolList, families ? { datapathFamilies: families } : {}), poolList);
    const ctl = new StatusController({
      kc: source.kc, logger: quiet, verdicts: () => new Map(), egressAddresses: () => [], everyMs: 3_600_000, gcEveryMs: 3_600_000,
      loadBalancers: () => view.status(),
    });
    await ctl.pass();
    await fn({
      view,
      ingress: (n) => api.get('Service', n, 'shop')?.status?.loadBalancer?.ingress,
      ready: (n) => (api.get('Service', n, 'shop')?.status?.conditions as Array<Record<string, string>>).find((c) => c.type === 'tether.dev/Ready')!,
      holders: async () => Object.fromEntries([...(await ipam.listAddresses('lb'))].map(([a, o]) => [o, a])),
    });
  } finally {
    await close();
    await store.connection.close();
    await ipam.close();
  }
}

test('operator status of a dual-stack Service: two ingress entries in ipFamilies order, each VIP under its own owner (IPv4 under the Service\'s own)', async () => {
  const objects = [service('web', { ipFamilyPolicy: 'RequireDualStack', ipFamilies: ['IPv6', 'IPv4'] }), ...slices('web'), service('db', {}), ...slices('db')];
  await operator(objects, pools, ['IPv4', 'IPv6'], async ({ ingress, ready, holders, view }) => {
    const owners = await holders();
    assert.equal(Object.keys(owners).sort(), ['lb/shop/db', 'lb/shop/web', 'lb/shop/web#IPv6']);
    assert.ok(owners['lb/shop/web'].startsWith('198.18.0.'), `IPv4 under the plain owner: ${owners['lb/shop/web']}`);
    assert.ok(owners['lb/shop/web#IPv6'].startsWith('2001:db8:18::'), `IPv6 under #IPv6: ${owners['lb/shop/web#IPv6']}`);
    assert.equal(ingress('web'), [{ ip: owners['lb/shop/web#IPv6'], ipMode: 'Proxy' }, { ip: owners['lb/shop/web'], ipMode: 'Proxy' }], 'IPv6 first, as ipFamilies');
    assert.equal(ingress('db'), [{ ip: owners['lb/shop/db'], ipMode: 'Proxy' }], 'a Service without families: one IPv4 entry, as before');
    assert.equal([ready('web').status, ready('web').reason, ready('web').message], ['True', 'Serving', `VIPs ${owners['lb/shop/web#IPv6']}, ${owners['lb/shop/web']} served by tether's load balancer`]);
    const st = view.status().find((s) => s.service === 'shop/web')!;
    assert.equal(st.vips, [owners['lb/shop/web#IPv6'], owners['lb/shop/web']]);
  });
});

test('the default families: an IPv6-only Service gets its IPv6 VIP and is served', async () => {
  await operator([service('six', { ipFamilies: ['IPv6'] }), ...slices('six')], pools, undefined, async ({ ingress, ready, holders }) => {
    const owners = await holders();
    assert.equal(Object.keys(owners), ['lb/shop/six#IPv6']);
    assert.equal(ingress('six'), [{ ip: owners['lb/shop/six#IPv6'], ipMode: 'Proxy' }]);
    assert.equal([ready('six').status, ready('six').reason], ['True', 'Serving']);
  });
});

test('a datapath of IPv4 only (datapathFamilies): no IPv6 VIP is allocated or listed; a dual-stack Service is served in IPv4 and says why not in IPv6, an IPv6-only one is not served and says so', async () => {
  const objects = [service('web', { ipFamilyPolicy: 'RequireDualStack', ipFamilies: ['IPv6', 'IPv4'] }), ...slices('web'), service('six', { ipFamilies: ['IPv6'] }), ...slices('six')];
  await operator(objects, pools, ['IPv4'], async ({ ingress, ready, holders }) => {
    const owners = await holders();
    assert.equal(Object.keys(owners), ['lb/shop/web'], 'no IPv6 VIP allocated');
    assert.equal(ingress('web'), [{ ip: owners['lb/shop/web'], ipMode: 'Proxy' }]);
    assert.equal([ready('web').status, ready('web').message], ['True', `VIP ${owners['lb/shop/web']} served by tether's load balancer; IPv6 VIPs are not programmed by this release's datapath yet; served in IPv4 only`]);
    assert.is(ingress('six'), undefined, 'no ingress');
    assert.equal([ready('six').status, ready('six').reason, ready('six').message], ['False', 'FamilyNotServed', "IPv6 VIPs are not programmed by this release's datapath yet"]);
  });
});

test('PreferDualStack on IPv4-only pools: served in IPv4, its status says IPv6 is not available', async () => {
  await operator([service('web', { ipFamilyPolicy: 'PreferDualStack', ipFamilies: ['IPv4', 'IPv6'] }), ...slices('web')], v4Pools, ['IPv4', 'IPv6'], async ({ ingress, ready, holders }) => {
    const owners = await holders();
    assert.equal(ingress('web'), [{ ip: owners['lb/shop/web'], ipMode: 'Proxy' }]);
    assert.equal([ready('web').status, ready('web').message], ['True', `VIP ${owners['lb/shop/web']} served by tether's load balancer; spec.ipFamilyPolicy PreferDualStack: no IPv6 VIP, no loadBalancer AddressPool has an IPv6 subnet; served in IPv4 only`]);
  });
});

test('RequireDualStack on IPv4-only pools: refused by name, nothing allocated', async () => {
  await operator([service('web', { ipFamilyPolicy: 'RequireDualStack' }), ...slices('web')], v4Pools, ['IPv4', 'IPv6'], async ({ ingress, ready, holders }) => {
    assert.equal(await holders(), {});
    assert.is(ingress('web'), undefined);
    assert.equal([ready('web').status, ready('web').reason], ['False', 'Invalid']);
    assert.match(ready('web').message, /spec\.ipFamilyPolicy: RequireDualStack: Service shop\/web needs an IPv6 VIP, and no loadBalancer AddressPool has an IPv6 subnet/);
  });
});

test.run();
