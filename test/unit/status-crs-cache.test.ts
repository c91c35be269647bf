// The leader's status pass over AddressPools and Egresses, against the FAKE API server
// (test/lib/fake-apiserver.ts) with the objects read from the leader's own watch (KubeSource's cache): a
// pass over unchanged objects sends no request at all (before: a GET per pool and per Egress per pass); a
// change is one PUT (no GET) and keeps the Ready condition's lastTransitionTime while its status stays; a
// write the watch has not brought back yet is not written again (nor a condition's new transition time
// re-stamped); a write over an object changed since the cache read meets a 409 and is made on a later pass
// with the new observedGeneration; an object the cache has no copy of is read with a GET.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { Writable } from 'node:stream';
import { apiWithSource } from '../lib/kube-fixture';
import { waitFor } from '../lib/wait';
import { StatusController, type EgressAddressStatus } from '../../daemon/kube/status-controller';
import { makeLogger } from '../../lib/log';

const quiet = makeLogger({ level: 'error', stream: new Writable({ write: (_c, _e, cb) => cb() }) });
const V = 'tether.dev/v1alpha1';
const POOLS = 5;
const EGRESSES = 20;

type Obj = Record<string, any>;


const pool = (i: number) => ({ apiVersion: V, kind: 'AddressPool', metadata: { name: `p-${i}` }, spec: { usage: 'floating', ipv4: { cidr: `198.51.100.${16 * i}/28` } } });
const egress = (i: number, p = i % POOLS, labels: Record<string, string> = {}) => ({ apiVersion: V, kind: 'Egress', metadata: { name: `e-${i}`, namespace: 'shop', labels }, spec: { clients: { podSelector: { matchLabels: { app: 'web' } } }, gateways: { podSelector: { matchLabels: { app: 'gw' } } }, addresses: { pool: `p-${p}` } } });

test('status of unchanged AddressPools and Egresses: no request per pass; a change is one PUT; a 409 retried on a later pass; lastTransitionTime kept', async () => {
  const { api, source, close } = await apiWithSource([...Array.from({ length: POOLS }, (_, i) => pool(i)), ...Array.from({ length: EGRESSES }, (_, i) => egress(i))], quiet);
  let ctl: StatusController | undefined;
  try {
    const addrs = new Map<string, EgressAddressStatus>();
    for (let i = 0; i < EGRESSES; i++) addrs.set(`shop/e-${i}`, { egress: `shop/e-${i}`, address: `198.51.100.${16 * (i % POOLS) + 1 + Math.floor(i / POOLS)}`, owner: `shop/gw-${i}`, ownerNode: 'n1', epoch: 1 });
    const livePools = () => new Map(source.cachedObjects('addresspools').map((o) => [String(o.metadata?.name), o]));
    const liveEgresses = () => new Map(source.cachedObjects('egresses').map((o) => [`${o.metadata?.namespace}/${o.metadata?.name}`, o]));
    let frozen: Map<string, Obj> | undefined;
    let poolCache: () => Map<string, Obj> = livePools;
    let refused: Record<string, string> = {};
    ctl = new StatusController({
      kc: source.kc, logger: quiet, verdicts: () => source.currentVerdicts(), refused: () => refused, egressAddresses: () => [...addrs.values()],
      everyMs: 3_600_000, gcEveryMs: 3_600_000, addressPools: () => poolCache(), egresses: () => frozen ?? liveEgresses(),
    });
    const crCalls = (from: number) => api.requests.slice(from).filter((r) => /\/(addresspools|egresses)\b/.test(r) && !r.endsWith('(watch)'));
    let before = api.requests.length;
    await ctl.pass();
    assert.is(ctl.stats.statusWrites, POOLS + EGRESSES, 'every object\'s status written once');
    assert.not.ok(crCalls(before).some((r) => r.startsWith('GET')), `no GET of a pool or an Egress: ${crCalls(before).slice(0, 3)}`);
    const st = (kind: string, name: string, ns?: string) => api.get(kind, name, ns)!.status as Obj;
    const ready = (name: string) => (st('Egress', name, 'shop').conditions as Obj[]).find((c) => c.type === 'Ready')!;
    assert.equal([ready("e-3").status, ready("e-3").reason], ["True", "Owned"], ready("e-3").message);
    assert.equal((st('AddressPool', 'p-1').conditions as Obj[])[0].reason, 'Valid');
    const since = ready('e-3').lastTransitionTime;

    // The watch brings the writes back; passes over unchanged objects send nothing.
    await waitFor(() => [...livePools().values(), ...liveEgresses().values()].every((o) => o.status?.conditions?.length), 'the writes back in the watch cache');
    before = api.requests.length;
    for (let i = 0; i < 3; i++) await ctl.pass();
    assert.equal(crCalls(before), [], 'no request for unchanged pools and Egresses (before: a GET of each per pass)');
    assert.is(ctl.stats.statusWrites, POOLS + EGRESSES);

    // One Egress's address changes epoch: one PUT, no GET; Ready stayed True: its lastTransitionTime is kept.
    await new Promise((r) => setTimeout(r, 1100)); // a new condition would carry a later second
    addrs.set('shop/e-3', { ...addrs.get('shop/e-3')!, epoch: 2 });
    before = api.requests.length;
    await ctl.pass();
    assert.equal(crCalls(before), ['PUT /apis/tether.dev/v1alpha1/namespaces/shop/egresses/e-3/status']);
    assert.is(st('Egress', 'e-3', 'shop').addresses[0].epoch, 2);
    assert.is(ready('e-3').lastTransitionTime, since, 'lastTransitionTime kept');

    // One pool refused: one PUT of that pool.
    refused = { 'AddressPool p-1': 'refused for the test' };
    before = api.requests.length;
    await ctl.pass();
    assert.equal(crCalls(before), ['PUT /apis/tether.dev/v1alpha1/addresspools/p-1/status']);
    assert.equal([(st('AddressPool', 'p-1').conditions as Obj[])[0].status, (st('AddressPool', 'p-1').conditions as Obj[])[0].reason], ['False', 'Invalid']);

    // Written, not seen back by the watch yet (frozen cache): the same status is not written again, even a
    // second later when a condition that changed would be stamped with a new transition time.
    await waitFor(() => liveEgresses().get('shop/e-3')?.status?.addresses?.[0]?.epoch === 2, 'the writes back in the watch cache');
    const preWrite = structuredClone(liveEgresses().get('shop/e-4')!);
    addrs.set('shop/e-4', { ...addrs.get('shop/e-4')!, owner: '', ownerNode: undefined });
    before = api.requests.length;
    await ctl.pass();
    assert.equal(crCalls(before), ['PUT /apis/tether.dev/v1alpha1/namespaces/shop/egresses/e-4/status']);
    const lost = ready('e-4');
    assert.equal([lost.status, lost.reason], ['False', 'NoOwner']);
    frozen = new Map([...liveEgresses()].map(([k, v]) => [k, structuredClone(v)]));
    frozen.set('shop/e-4', preWrite); // as the cache was before the write came back
    await new Promise((r) => setTimeout(r, 1100));
    // Meanwhile e-7 changes in the API (its pool: a new generation) and loses its owner: the write over
    // the (frozen) cached version meets a 409 and waits.
    api.apply(egress(7, 0, { team: 'a' }));
    addrs.set('shop/e-7', { ...addrs.get('shop/e-7')!, owner: '', ownerNode: undefined });
    const conflicts = ctl.stats.conflicts;
    before = api.requests.length;
    await ctl.pass();
    assert.equal(crCalls(before), ['PUT /apis/tether.dev/v1alpha1/namespaces/shop/egresses/e-7/status'], 'no second write of e-4; the stale write of e-7');
    assert.is(ctl.stats.conflicts, conflicts + 1, 'the stale write refused');
    assert.is(ready('e-4').lastTransitionTime, lost.lastTransitionTime);
    assert.is(ready('e-7').status, 'True', 'the status as it was');
    frozen = undefined;
    await waitFor(() => liveEgresses().get('shop/e-7')?.metadata?.labels?.team === 'a', 'the change in the watch cache');
    before = api.requests.length;
    await ctl.pass();
    assert.equal(crCalls(before), ['PUT /apis/tether.dev/v1alpha1/namespaces/shop/egresses/e-7/status'], 'written on a later pass, with no GET');
    assert.equal([ready('e-7').status, ready('e-7').reason, ready('e-7').observedGeneration], ['False', 'NoOwner', 2]);
    assert.is(st('Egress', 'e-7', 'shop').observedGeneration, 2);
    assert.is(ready('e-4').lastTransitionTime, lost.lastTransitionTime, 'e-4 not rewritten once its write came back');

    // A pool the cache has no copy of (yet): read with a GET, not written when unchanged.
    await waitFor(() => liveEgresses().get('shop/e-7')?.status?.observedGeneration === 2, 'the writes back in the watch cache');
    poolCache = () => {
      const m = livePools();
      m.delete('p-2');
      return m;
    };
    before = api.requests.length;
    await ctl.pass();
    assert.equal(crCalls(before), ['GET /apis/tether.dev/v1alpha1/addresspools/p-2']);
  } finally {
    await ctl?.stop();
    await close();
  }
});

test.run();
