// The leader's status pass over tether Services, against the FAKE API server (test/lib/fake-apiserver.ts)
// with the Services read from the leader's own watch (KubeSource's cache): a pass over unchanged Services
// sends no request at all (before: a GET per Service per pass); a change is one PUT (no GET) and keeps the
// Ready condition's lastTransitionTime; a write over a Service changed since the cache read meets a 409
// and is made on a later pass; a Service whose VIP this node does not know yet keeps its status.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { Writable } from 'node:stream';
import { apiWithSource } from '../lib/kube-fixture';
import { waitFor } from '../lib/wait';
import { StatusController } from '../../daemon/kube/status-controller';
import { makeLogger } from '../../lib/log';
import { TETHER_SERVICE_LABEL, LB_CLASS } from '../../daemon/objects/names';

const quiet = makeLogger({ level: 'error', stream: new Writable({ write: (_c, _e, cb) => cb() }) });
const N = 20;


const service = (i: number, labels: Record<string, string> = {}) => ({
  apiVersion: 'v1', kind: 'Service', metadata: { name: `svc-${i}`, namespace: 'shop', labels: { [TETHER_SERVICE_LABEL]: 'true', ...labels } },
  spec: { type: 'LoadBalancer', loadBalancerClass: LB_CLASS, ports: [{ port: 80, protocol: 'TCP' }] },
});

test('status of unchanged Services: no request per pass; a change is one PUT over the cached version; a 409 retried on a later pass', async () => {
  const { api, source, close } = await apiWithSource(Array.from({ length: N }, (_, i) => service(i)), quiet);
  let ctl: StatusController | undefined;
  try {
    const lbs = new Map<string, Record<string, unknown>>();
    for (let i = 0; i < N; i++) lbs.set(`shop/svc-${i}`, { service: `shop/svc-${i}`, vip: `198.18.0.${i + 1}`, externalTrafficPolicy: 'Cluster' });
    const live = () => new Map(source.cachedObjects('services').map((o) => [`${o.metadata?.namespace}/${o.metadata?.name}`, o]));
    let frozen: Map<string, Record<string, any>> | undefined;
    ctl = new StatusController({
      kc: source.kc, logger: quiet, verdicts: () => new Map(), egressAddresses: () => [], everyMs: 3_600_000, gcEveryMs: 3_600_000,
      loadBalancers: () => [...lbs.values()], services: () => frozen ?? live(),
    });
    const serviceCalls = () => api.requests.filter((r) => r.includes('/services/') && !r.endsWith('(watch)'));
    await ctl.pass();
    assert.is(ctl.stats.statusWrites, N, 'every Service\'s status written once');
    const ingress = (i: number) => api.get('Service', `svc-${i}`, 'shop')?.status?.loadBalancer?.ingress;
    assert.equal(ingress(4), [{ ip: '198.18.0.5', ipMode: 'Proxy' }]);
    assert.not.ok(serviceCalls().some((r) => r.startsWith('GET')), `no GET of a Service: ${serviceCalls().slice(0, 3)}`);
    const ready = (i: number) => (api.get('Service', `svc-${i}`, 'shop')?.status?.conditions as Array<Record<string, string>>).find((c) => c.type === 'tether.dev/Ready')!;
    const since = ready(2).lastTransitionTime;
    // The watch brings the writes back; passes over unchanged Services send nothing.
    await waitFor(() => [...live().values()].every((o) => o.status?.loadBalancer?.ingress?.length === 1), 'the writes back in the watch cache');
    let before = api.requests.length;
    for (let i = 0; i < 3; i++) await ctl.pass();
    assert.equal(api.requests.slice(before), [], 'no request for unchanged Services (before: a GET per Service per pass)');
    assert.is(ctl.stats.statusWrites, N);
    // One Service's VIP changes: one PUT, no GET; Ready stayed True, so its lastTransitionTime is kept.
    await new Promise((r) => setTimeout(r, 1100)); // a new condition would carry a later second
    lbs.set('shop/svc-2', { service: 'shop/svc-2', vip: '198.18.1.2', externalTrafficPolicy: 'Cluster' });
    const preWrite = structuredClone(live().get('shop/svc-2')!);
    before = api.requests.length;
    await ctl.pass();
    assert.equal(api.requests.slice(before), ['PUT /api/v1/namespaces/shop/services/svc-2/status']);
    assert.equal(ingress(2), [{ ip: '198.18.1.2', ipMode: 'Proxy' }]);
    assert.is(ready(2).lastTransitionTime, since, 'lastTransitionTime kept');
    // Not seen back by the watch yet (frozen cache): the same status is not written again.
    frozen = new Map([...live()].map(([k, v]) => [k, structuredClone(v)]));
    frozen.set('shop/svc-2', preWrite); // as the cache was before the write came back
    // A Service changed in the API since the (frozen) cache read: its write meets a 409 and waits.
    api.apply(service(5, { team: 'a' }));
    lbs.set('shop/svc-5', { service: 'shop/svc-5', vip: '198.18.1.5', externalTrafficPolicy: 'Cluster' });
    const conflicts = ctl.stats.conflicts;
    before = api.requests.length;
    await ctl.pass();
    assert.is(ctl.stats.conflicts, conflicts + 1, 'the stale write refused (svc-5), no second write of svc-2');
    assert.equal(api.requests.slice(before), ['PUT /api/v1/namespaces/shop/services/svc-5/status']);
    assert.equal(ingress(5), [{ ip: '198.18.0.6', ipMode: 'Proxy' }], 'the status as it was');
    frozen = undefined;
    await waitFor(() => live().get('shop/svc-5')?.metadata?.labels?.team === 'a', 'the change in the watch cache');
    await ctl.pass();
    assert.equal(ingress(5), [{ ip: '198.18.1.5', ipMode: 'Proxy' }], 'written on a later pass');
    // A Service whose VIP this node does not know yet (a new leader's first passes): its status stays.
    lbs.set('shop/svc-9', { service: 'shop/svc-9', vipHere: 'pending: not asked for yet', externalTrafficPolicy: 'Cluster' });
    before = api.requests.length;
    await ctl.pass();
    assert.equal(api.requests.slice(before).filter((r) => r.includes('svc-9')), []);
    assert.equal(ingress(9), [{ ip: '198.18.0.10', ipMode: 'Proxy' }], 'not flapped to no VIP');
  } finally {
    await ctl?.stop();
    await close();
  }
});

test.run();
