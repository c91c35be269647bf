// The FAKE API server (test/lib/fake-apiserver.ts) where it claims to behave as upstream does: MicroTime,
// resourceVersion conflicts, DELETE preconditions, finalizers, field selectors, watches without a
// resourceVersion, Status bodies, ObjectMeta's omitempty, admission before storage. docs/testing.md lists
// what it still does differently.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { FakeApiServer } from '../lib/fake-apiserver';

type Obj = Record<string, any>;

async function server(): Promise<{ api: FakeApiServer; call: (method: string, p: string, body?: unknown) => Promise<{ code: number; body: Obj }>; url: string }> {
  const api = new FakeApiServer();
  const url = (await api.listen({ port: 0 }))!;
  const call = async (method: string, p: string, body?: unknown) => {
    const r = await fetch(url + p, { method, headers: { 'content-type': 'application/json' }, body: body === undefined ? undefined : JSON.stringify(body) });
    return { code: r.status, body: (await r.json()) as Obj };
  };
  return { api, call, url };
}

const LEASES = '/apis/coordination.k8s.io/v1/namespaces/tether-system/leases';
const lease = (renewTime: string) => ({ apiVersion: 'coordination.k8s.io/v1', kind: 'Lease', metadata: { name: 'l' }, spec: { holderIdentity: 'a', renewTime } });

test('MicroTime: six fractional digits or 400; stale resourceVersion 409; messages and details as upstream', async () => {
  const { api, call } = await server();
  try {
    const bad = await call('POST', LEASES, lease('2026-11-29T04:00:00.123Z'));
    assert.is(bad.code, 400);
    assert.match(bad.body.message, /cannot be handled as a Lease: parsing time .*2006-01-02T15:04:05.000000Z07:00/);
    const made = await call('POST', LEASES, lease('2026-11-29T04:00:00.123000Z'));
    assert.is(made.code, 201);
    assert.match(made.body.metadata.creationTimestamp, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$/, 'metav1.Time in whole seconds');
    const stale = await call('PUT', `${LEASES}/l`, { ...lease('2026-11-29T04:00:01.000000Z'), metadata: { name: 'l', resourceVersion: '1' } });
    assert.is(stale.code, 409);
    assert.is(stale.body.reason, 'Conflict');
    assert.match(stale.body.message, /^Operation cannot be fulfilled on leases.coordination.k8s.io "l": the object has been modified/);
    const missing = await call('GET', '/api/v1/namespaces/shop/services/nope');
    assert.equal(missing.body, { kind: 'Status', apiVersion: 'v1', metadata: {}, status: 'Failure', message: 'services "nope" not found', reason: 'NotFound', details: { name: 'nope', kind: 'services' }, code: 404 });
    const noName = await call('POST', '/api/v1/namespaces/shop/services', { apiVersion: 'v1', kind: 'Service', metadata: {} });
    assert.is(noName.code, 422);
    assert.is(noName.body.details.causes[0].field, 'metadata.name');
    const again = await call('POST', LEASES, lease('2026-11-29T04:00:00.123000Z'));
    assert.is(again.code, 409);
    assert.is(again.body.reason, 'AlreadyExists');
  } finally {
    await api.close();
  }
});

test('DELETE preconditions, finalizers, generateName, empty metadata dropped', async () => {
  const { api, call } = await server();
  const blocks = '/apis/tether.dev/v1alpha1/addressblocks';
  try {
    const b = await call('POST', blocks, { apiVersion: 'tether.dev/v1alpha1', kind: 'AddressBlock', metadata: { name: 'b', labels: {}, finalizers: ['x/keep'] }, spec: { node: 'n1' } });
    assert.not.ok('labels' in b.body.metadata, 'empty labels dropped');
    const wrong = await call('DELETE', `${blocks}/b`, { preconditions: { uid: 'not-it' } });
    assert.is(wrong.code, 409);
    assert.match(wrong.body.message, /Precondition failed: UID in precondition: not-it/);
    const held = await call('DELETE', `${blocks}/b`, { preconditions: { uid: b.body.metadata.uid } });
    assert.is(held.code, 200);
    assert.ok(held.body.metadata.deletionTimestamp, 'a finalizer holds it: only marked');
    assert.ok(api.get('AddressBlock', 'b'));
    const cur = (await call('GET', `${blocks}/b`)).body;
    await call('PUT', `${blocks}/b`, { ...cur, metadata: { ...cur.metadata, finalizers: [] } });
    assert.not.ok(api.get('AddressBlock', 'b'), 'gone with its last finalizer');
    const g = await call('POST', '/apis/events.k8s.io/v1/namespaces/shop/events', { apiVersion: 'events.k8s.io/v1', kind: 'Event', metadata: { generateName: 'e.' }, eventTime: '2026-11-29T04:00:00.000000Z' });
    assert.match(g.body.metadata.name, /^e\.[0-9a-f]{5}$/);
  } finally {
    await api.close();
  }
});

test('field selectors: known fields only (400 otherwise), != works; a watch without resourceVersion starts with the current state', async () => {
  const { api, call, url } = await server();
  try {
    for (const n of ['n1', 'n2']) api.apply({ apiVersion: 'v1', kind: 'Node', metadata: { name: n } });
    const not1 = await call('GET', '/api/v1/nodes?fieldSelector=metadata.name!%3Dn1');
    assert.equal(not1.body.items.map((o: Obj) => o.metadata.name), ['n2']);
    const unknown = await call('GET', '/api/v1/nodes?fieldSelector=spec.podCIDR%3D10.0.0.0%2F24');
    assert.is(unknown.code, 400);
    assert.match(unknown.body.message, /field label not supported: spec.podCIDR/);
    const ctl = new AbortController();
    const r = await fetch(`${url}/api/v1/nodes?watch=true`, { signal: ctl.signal });
    const reader = r.body!.getReader();
    let text = '';
    while ((text.match(/\n/g) ?? []).length < 2) text += new TextDecoder().decode((await reader.read()).value);
    ctl.abort();
    assert.equal(text.trim().split('\n').map((l) => [JSON.parse(l).type, JSON.parse(l).object.metadata.name]).sort(), [['ADDED', 'n1'], ['ADDED', 'n2']]);
  } finally {
    await api.close();
  }
});

test('admission comes before storage, sees the write as the server would, and a denial is the request\'s answer', async () => {
  const { api, call } = await server();
  api.admit = (a) => (a.resource === 'services' && a.subResource === 'status' ? { allowed: false, message: 'no status', code: 403, reason: 'Forbidden' } : { allowed: true });
  try {
    const svc = { apiVersion: 'v1', kind: 'Service', metadata: { name: 'db', namespace: 'shop' }, spec: { ports: [{ port: 1 }] } };
    await call('POST', '/api/v1/namespaces/shop/services', svc);
    const denied = await call('PUT', '/api/v1/namespaces/shop/services/db/status', { ...svc, status: { loadBalancer: { ingress: [{ ip: '1.2.3.4' }] } } });
    assert.equal([denied.code, denied.body.reason, denied.body.message], [403, 'Forbidden', 'no status']);
    assert.not.ok(api.get('Service', 'db', 'shop')!.status, 'nothing stored');
    await call('PATCH', '/api/v1/namespaces/shop/services/db', { metadata: { labels: { a: 'b' } } });
    const [create, status, patch] = api.admissions;
    assert.equal([create.operation, create.subResource, create.oldObject], ['CREATE', '', null]);
    assert.equal([status.operation, status.subResource, status.allowed], ['UPDATE', 'status', false]);
    assert.equal([patch.operation, patch.object!.metadata.labels, patch.oldObject!.metadata.labels], ['UPDATE', { a: 'b' }, undefined], 'a PATCH is an UPDATE of the patched object');
  } finally {
    await api.close();
  }
});

test.run();
