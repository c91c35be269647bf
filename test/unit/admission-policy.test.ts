// The ValidatingAdmissionPolicies of install/base (what a node's tetherd and the operator may write),
// evaluated against requests built as the API server builds them (test/lib/admission-request.ts: the
// AdmissionRequest and UserInfo Go structs' JSON tags, omitempty fields absent) with CEL's absent-key
// semantics, an error being a denial (failurePolicy Fail). There is no kube-apiserver on these machines:
// the evaluation is a FAKE of its admission step. The node's real writes are made by tetherd's own code
// (block claims, TetherNode, Events) against the FAKE API server with the policies enforced on every
// write; the operator's are built as its code writes them (the operator's Lease by the real election).
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { execFileSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { Writable } from 'node:stream';
import * as k8s from '@kubernetes/client-node';
import { parseAllDocuments } from 'yaml';
import { FakeApiServer, kubeconfigFor, type AdmissionAttributes } from '../lib/fake-apiserver';
import { admissionRequest, admitWith, evaluatePolicy, serviceAccountUser, type UserInfo } from '../lib/admission-request';
import { waitFor } from '../lib/wait';
import { makeLogger } from '../../lib/log';
import { KubeBlockClaims, claimName } from '../../daemon/kube/block-claims';
import { NodeStatusWriter } from '../../daemon/kube/node-status';
import { EventRecorder } from '../../daemon/kube/event-recorder';
import { LeaderElection } from '../../daemon/kube/leader';

type Obj = Record<string, any>;
const root = path.join(__dirname, '../..');
const quiet = makeLogger({ level: 'error', stream: new Writable({ write: (_c, _e, cb) => cb() }) });
const objs: Obj[] = parseAllDocuments(execFileSync('kubectl', ['kustomize', path.join(root, 'install')], { encoding: 'utf8' })).map((d) => d.toJS() as Obj).filter(Boolean);
const policyNamed = (n: string) => objs.find((o) => o.kind === 'ValidatingAdmissionPolicy' && o.metadata.name === n)!;
const NODE_POLICY = policyNamed('tether-node-writes');
const OPERATOR_POLICY = policyNamed('tether-operator-writes');
const POLICIES = [NODE_POLICY, OPERATOR_POLICY];

const nodeUser = (node?: string) => serviceAccountUser('tether-system', 'tether', { node });
const OPERATOR = serviceAccountUser('tether-system', 'tether-operator', { pod: 'tether-operator-5d9f-abcde' });

/** One write, as the fake API server would hand it to admission. */
function write(operation: AdmissionAttributes['operation'], resource: string, o: { group?: string; version?: string; kind?: string; sub?: string; object?: Obj | null; oldObject?: Obj | null }): AdmissionAttributes {
  const obj = operation === 'DELETE' ? o.oldObject : o.object;
  return {
    operation, group: o.group ?? '', version: o.version ?? 'v1', resource, subResource: o.sub ?? '', kind: o.kind ?? obj?.kind ?? '',
    name: obj?.metadata?.name ?? '', namespace: obj?.metadata?.namespace ?? '', object: o.object ?? null, oldObject: o.oldObject ?? null,
  };
}
const admit = (a: AdmissionAttributes, user: UserInfo) => admitWith(POLICIES, () => user)(a);

const T = { group: 'tether.dev', version: 'v1alpha1' };
const block = (node: string, extra: Obj = {}) => ({
  apiVersion: 'tether.dev/v1alpha1', kind: 'AddressBlock',
  metadata: { name: claimName('default', '10.244.0.64/26'), labels: { 'tether.dev/pool': 'default', 'tether.dev/node': node }, uid: 'u1', ...extra },
  spec: { pool: 'default', cidr: '10.244.0.64/26', node },
});
const tnode = (name: string, meta: Obj = {}) => ({ apiVersion: 'tether.dev/v1alpha1', kind: 'TetherNode', metadata: { name, ownerReferences: [{ apiVersion: 'v1', kind: 'Node', name, uid: 'nu' }], ...meta } });
const svc = (labels: Record<string, string>, meta: Obj = {}, spec: Obj = {}) => ({
  apiVersion: 'v1', kind: 'Service', metadata: { name: 'db', namespace: 'shop', uid: 's1', labels, annotations: { a: '1' }, ...meta },
  spec: { type: 'LoadBalancer', loadBalancerClass: 'tether.dev/lb', ports: [{ port: 5432, protocol: 'TCP' }], ...spec },
});
const lease = (name: string) => ({ apiVersion: 'coordination.k8s.io/v1', kind: 'Lease', metadata: { name, namespace: 'tether-system' }, spec: { holderIdentity: 'x', leaseDurationSeconds: 15 } });
const secret = (name: string, type = 'Opaque') => ({ apiVersion: 'v1', kind: 'Secret', metadata: { name, namespace: 'tether-system' }, type, data: { key: 'eA==' } });
const event = (instance: string) => ({ apiVersion: 'events.k8s.io/v1', kind: 'Event', metadata: { name: 'out.1', namespace: 'shop' }, eventTime: '2026-11-29T04:00:00.000000Z', reportingController: 'tether.dev/tetherd', reportingInstance: instance, action: 'Takeover', reason: 'Takeover', type: 'Normal', regarding: { kind: 'Egress', name: 'out' } });

test('the request is built as the API server builds it: omitempty fields absent, not empty', () => {
  const r = admissionRequest(write('CREATE', 'addressblocks', { ...T, object: block('n1') }), nodeUser('n1'), { uid: 'r1' });
  assert.equal(Object.keys(r).sort(), ['dryRun', 'kind', 'name', 'operation', 'options', 'requestKind', 'requestResource', 'resource', 'uid', 'userInfo']);
  assert.not.ok('subResource' in r || 'requestSubResource' in r || 'namespace' in r, 'no subresource, cluster-scoped: absent');
  assert.equal(r.resource, { group: 'tether.dev', version: 'v1alpha1', resource: 'addressblocks' });
  assert.equal(r.userInfo.extra['authentication.kubernetes.io/node-name'], ['n1']);
  const core = admissionRequest(write('UPDATE', 'services', { sub: 'status', object: svc({}), oldObject: svc({}) }), { username: 'system:serviceaccount:tether-system:tether-operator' });
  assert.equal(core.resource, { group: '', version: 'v1', resource: 'services' }, 'group is not omitempty: the core group is ""');
  assert.is(core.subResource, 'status');
  assert.is(core.namespace, 'shop');
  assert.equal(Object.keys(core.userInfo), ['username'], 'a user without uid, groups or extra has none of them');
  const generated = admissionRequest({ ...write('CREATE', 'events', { group: 'events.k8s.io', object: event('n1') }), name: '' }, nodeUser('n1'));
  assert.not.ok('name' in generated, 'a create with generateName has no request.name');
});

test('the policies are installed, denying, failing closed, with no params (no node leads: no Lease to read)', () => {
  for (const p of POLICIES) {
    assert.is(p.spec.failurePolicy, 'Fail');
    assert.not.ok(p.spec.paramKind, `${p.metadata.name}: no paramKind`);
    const b = objs.find((o) => o.kind === 'ValidatingAdmissionPolicyBinding' && o.spec.policyName === p.metadata.name)!;
    assert.ok(b, `${p.metadata.name} is bound`);
    assert.equal(b.spec.validationActions, ['Deny']);
    assert.not.ok(b.spec.paramRef);
  }
});

async function enforcingApi(): Promise<{ api: FakeApiServer; kc: (token: string) => k8s.KubeConfig; done: () => Promise<void> }> {
  const api = new FakeApiServer();
  const url = (await api.listen({ port: 0 }))!;
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tether-admission-'));
  const users = new Map<string, UserInfo>([['node-n1', nodeUser('n1')], ['operator', OPERATOR]]);
  api.admit = admitWith(POLICIES, (a) => users.get(a.token ?? '') ?? { username: 'kubernetes-admin', groups: ['system:masters'] });
  const kc = (token: string) => {
    const f = path.join(dir, token);
    fs.writeFileSync(f, kubeconfigFor(url, token));
    const k = new k8s.KubeConfig();
    k.loadFromFile(f);
    return k;
  };
  return { api, kc, done: async () => (await api.close(), fs.rmSync(dir, { recursive: true, force: true })) };
}

test('every write tetherd makes, made by its own code with the policies enforced, is allowed', async () => {
  const { api, kc, done } = await enforcingApi();
  const k = kc('node-n1');
  const node = api.apply({ apiVersion: 'v1', kind: 'Node', metadata: { name: 'n1' } });
  const recorder = new EventRecorder({ kc: k, nodeName: 'n1', logger: quiet });
  const status = new NodeStatusWriter({ kc: k, nodeName: 'n1', version: '9.9.9', conditions: () => [{ type: 'Ready', status: 'True', reason: 'Running', message: 'ok' }], logger: quiet, checkEveryMs: 20 });
  try {
    // Block claims: a claim, the same claim again (409, read back), a release.
    const claims = new KubeBlockClaims(k, undefined);
    assert.ok(await claims.claimBlock('default', '10.244.0.64/26', 'n1'));
    assert.ok(await claims.claimBlock('default', '10.244.0.64/26', 'n1'));
    assert.ok(await claims.claimBlock('default', 'fd00:10:244::40/122', 'n1'));
    assert.ok(await claims.releaseBlock('default', '10.244.0.64/26', 'n1'));
    // Its TetherNode: created (ownerReference to its Node), status written; an old one without the owner put right.
    status.start();
    await waitFor(() => !!api.get('TetherNode', 'n1')?.status, 'the TetherNode written');
    await status.stop();
    api.remove('TetherNode', 'n1');
    api.apply({ apiVersion: 'tether.dev/v1alpha1', kind: 'TetherNode', metadata: { name: 'n1', labels: { keep: 'me' } } });
    const again = new NodeStatusWriter({ kc: k, nodeName: 'n1', version: '9.9.9', conditions: () => [{ type: 'Ready', status: 'True', reason: 'Running', message: 'ok' }], logger: quiet, checkEveryMs: 20, nodeUid: () => node.metadata.uid });
    again.start();
    await waitFor(() => !!api.get('TetherNode', 'n1')?.metadata.ownerReferences, 'the owner put right');
    await again.stop();
    // Events: one created, then its series patched.
    const e = { regarding: { apiVersion: 'tether.dev/v1alpha1', kind: 'Egress', name: 'out', namespace: 'shop', uid: 'e1' }, type: 'Normal' as const, reason: 'Takeover', action: 'Takeover', note: 'n1 took 198.51.100.1' };
    recorder.emit(e);
    await recorder.flush();
    recorder.emit(e);
    await recorder.flush();
    await waitFor(() => api.admissions.some((a) => a.resource === 'events' && a.operation === 'UPDATE'), 'the series written');

    const made = api.admissions.filter((a) => a.token === 'node-n1');
    const kinds = [...new Set(made.map((a) => `${a.operation} ${a.resource}${a.subResource ? '/' + a.subResource : ''}`))].sort();
    assert.equal(kinds, ['CREATE addressblocks', 'CREATE events', 'CREATE tethernodes', 'DELETE addressblocks', 'UPDATE events', 'UPDATE tethernodes', 'UPDATE tethernodes/status']);
    for (const a of made) assert.ok(a.allowed, `${a.operation} ${a.resource} ${a.name}: ${a.message}`);
    assert.is(made.filter((a) => a.resource === 'addressblocks' && a.operation === 'CREATE').length, 3, 'the repeated claim reached admission too (then 409)');
  } finally {
    await recorder.stop();
    await done();
  }
});

test('the operator\'s writes are allowed: its Lease (by the real election), the Service label and status, the cluster Secrets, collecting a block', async () => {
  const { api, kc, done } = await enforcingApi();
  const election = new LeaderElection({ kc: kc('operator'), namespace: 'tether-system', name: 'tether-operator', identity: 'tether-operator-5d9f-abcde', logger: quiet, retryMs: 30 });
  try {
    election.start();
    await waitFor(() => api.admissions.filter((a) => a.resource === 'leases').length >= 2, 'the Lease created and renewed');
    await election.stop();
    for (const a of api.admissions.filter((x) => x.resource === 'leases')) assert.ok(a.allowed, a.message);
  } finally {
    await done();
  }
  const ok = (a: AdmissionAttributes, what: string) => {
    const v = admit(a, OPERATOR);
    assert.ok(v.allowed, `${what}: ${v.message}`);
  };
  const old = svc({ app: 'db' });
  ok(write('UPDATE', 'services', { object: svc({ app: 'db', 'tether.dev/load-balancer': 'true' }), oldObject: old }), 'the label added (merge patch)');
  ok(write('UPDATE', 'services', { object: svc({ app: 'db' }), oldObject: svc({ app: 'db', 'tether.dev/load-balancer': 'true' }) }), 'the label removed');
  ok(write('UPDATE', 'services', { sub: 'status', object: { ...old, status: { loadBalancer: { ingress: [{ ip: '198.51.100.7' }] } } }, oldObject: old }), 'the status');
  ok(write('CREATE', 'secrets', { object: secret('tether-cluster-key') }), 'the cluster key');
  ok(write('CREATE', 'secrets', { object: secret('tether-redis-auth') }), 'the store password');
  ok(write('DELETE', 'addressblocks', { ...T, oldObject: block('gone-node') }), 'a deleted node\'s claim collected');
  ok(write('UPDATE', 'egresses', { ...T, sub: 'status', object: { kind: 'Egress', metadata: { name: 'out', namespace: 'shop' } }, oldObject: { kind: 'Egress', metadata: { name: 'out', namespace: 'shop' } } }), 'an Egress status');
  ok(write('CREATE', 'events', { group: 'events.k8s.io', object: event('tether-operator-5d9f-abcde') }), 'an Event');
});

// [what, who, write, the rule named in the denial]
const ADVERSARIAL: Array<[string, UserInfo, AdmissionAttributes, RegExp]> = [
  ['another node\'s block created', nodeUser('n1'), write('CREATE', 'addressblocks', { ...T, object: block('n2') }), /only its own blocks: n1 may not CREATE block default-10-244-0-64-26 of node n2/],
  ['another node\'s block deleted', nodeUser('n1'), write('DELETE', 'addressblocks', { ...T, oldObject: block('n2') }), /only its own blocks: n1 may not DELETE block .* of node n2/],
  ['a block claimed under another name (a second claim of one CIDR)', nodeUser('n1'), write('CREATE', 'addressblocks', { ...T, object: { ...block('n1'), metadata: { ...block('n1').metadata, name: 'mine' } } }), /named <pool>-<cidr>/],
  ['a block relabelled into another pool', nodeUser('n1'), write('CREATE', 'addressblocks', { ...T, object: block('n1', { labels: { 'tether.dev/pool': 'other', 'tether.dev/node': 'n1' } }) }), /labelled tether.dev\/pool/],
  ['a block updated', nodeUser('n1'), write('UPDATE', 'addressblocks', { ...T, object: block('n1'), oldObject: block('n1') }), /never updates a block claim/],
  ['a finalizer on a block', nodeUser('n1'), write('CREATE', 'addressblocks', { ...T, object: block('n1', { finalizers: ['x.example/keep'] }) }), /adds no finalizers/],
  ['an ownerReference on a block', nodeUser('n1'), write('CREATE', 'addressblocks', { ...T, object: block('n1', { ownerReferences: [{ apiVersion: 'v1', kind: 'Service', name: 'db', uid: 's1', blockOwnerDeletion: true }] }) }), /no ownerReferences on a block claim/],
  ['another node\'s TetherNode status', nodeUser('n1'), write('UPDATE', 'tethernodes', { ...T, sub: 'status', object: tnode('n2'), oldObject: tnode('n2') }), /only its own TetherNode: n1 may not UPDATE TetherNode n2/],
  ['another node\'s TetherNode created', nodeUser('n1'), write('CREATE', 'tethernodes', { ...T, object: tnode('n2') }), /only its own TetherNode/],
  ['its TetherNode owned by another Node', nodeUser('n1'), write('UPDATE', 'tethernodes', { ...T, object: tnode('n1', { ownerReferences: [{ apiVersion: 'v1', kind: 'Node', name: 'n2', uid: 'x' }] }), oldObject: tnode('n1') }), /on its TetherNode only its own Node/],
  ['a finalizer on its TetherNode', nodeUser('n1'), write('UPDATE', 'tethernodes', { ...T, object: tnode('n1', { finalizers: ['x'] }), oldObject: tnode('n1') }), /adds no finalizers/],
  ['an Egress status from a node', nodeUser('n1'), write('UPDATE', 'egresses', { ...T, sub: 'status', object: { metadata: { name: 'out' } }, oldObject: { metadata: { name: 'out' } } }), /only its AddressBlocks and its TetherNode, not egresses\/status/],
  ['a Lease created by a node', nodeUser('n1'), write('CREATE', 'leases', { group: 'coordination.k8s.io', object: lease('tether-operator') }), /never writes a Lease.*n1 may not CREATE Lease tether-operator/],
  ['a Lease updated by a node', nodeUser('n1'), write('UPDATE', 'leases', { group: 'coordination.k8s.io', object: lease('tether-operator'), oldObject: lease('tether-operator') }), /never writes a Lease/],
  ['a Service label from a node', nodeUser('n1'), write('UPDATE', 'services', { object: svc({ 'tether.dev/load-balancer': 'true' }), oldObject: svc({}) }), /never writes a Service/],
  ['a Service status from a node', nodeUser('n1'), write('UPDATE', 'services', { sub: 'status', object: svc({}), oldObject: svc({}) }), /never writes a Service/],
  ['a Secret created by a node', nodeUser('n1'), write('CREATE', 'secrets', { object: secret('tether-redis-auth') }), /never writes a Secret/],
  ['an Event reporting another node', nodeUser('n1'), write('CREATE', 'events', { group: 'events.k8s.io', object: event('n2') }), /reports itself \(reportingInstance n1\)/],
  ['another node\'s Event updated as its own', nodeUser('n1'), write('UPDATE', 'events', { group: 'events.k8s.io', object: event('n1'), oldObject: event('n2') }), /reports itself/],
  ['a core Event reporting another node', nodeUser('n1'), write('CREATE', 'events', { object: { ...event('n2'), apiVersion: 'v1' } }), /reports itself/],
  ['a token without a node name', nodeUser(undefined), write('CREATE', 'addressblocks', { ...T, object: block('n1') }), /token names no node/],
  ['a token without extra at all', { username: 'system:serviceaccount:tether-system:tether', groups: ['system:serviceaccounts'] }, write('CREATE', 'addressblocks', { ...T, object: block('n1') }), /token names no node/],
  ['a service-account-token Secret by the operator', OPERATOR, write('CREATE', 'secrets', { object: secret('tether-redis-auth', 'kubernetes.io/service-account-token') }), /of type Opaque; denied: CREATE Secret tether-redis-auth of type kubernetes.io\/service-account-token/],
  ['another Secret by the operator', OPERATOR, write('CREATE', 'secrets', { object: secret('admin-token') }), /only the Secrets tether-cluster-key and tether-redis-auth/],
  ['a Secret updated by the operator', OPERATOR, write('UPDATE', 'secrets', { object: secret('tether-redis-auth'), oldObject: secret('tether-redis-auth') }), /denied: UPDATE Secret tether-redis-auth/],
  ['an ownerReference added to a Service', OPERATOR, write('UPDATE', 'services', { object: svc({}, { ownerReferences: [{ apiVersion: 'v1', kind: 'ConfigMap', name: 'gone', uid: 'c1' }] }), oldObject: svc({}) }), /changes only the tether.dev\/load-balancer label/],
  ['a finalizer added to a Service', OPERATOR, write('UPDATE', 'services', { object: svc({}, { finalizers: ['x.example/hold'] }), oldObject: svc({}) }), /finalizers kept/],
  ['a finalizer added through the Service status', OPERATOR, write('UPDATE', 'services', { sub: 'status', object: svc({}, { finalizers: ['x.example/hold'] }), oldObject: svc({}) }), /finalizers kept/],
  ['a Service label other than tether\'s', OPERATOR, write('UPDATE', 'services', { object: svc({ app: 'db', more: 'x' }), oldObject: svc({ app: 'db' }) }), /changes only the tether.dev\/load-balancer label/],
  ['a Service label removed', OPERATOR, write('UPDATE', 'services', { object: svc({}), oldObject: svc({ app: 'db' }) }), /changes only the tether.dev\/load-balancer label/],
  ['a Service annotation changed', OPERATOR, write('UPDATE', 'services', { object: svc({}, { annotations: { a: '2' } }), oldObject: svc({}) }), /annotations/],
  ['a Service spec changed', OPERATOR, write('UPDATE', 'services', { object: svc({}, {}, { ports: [{ port: 1 }] }), oldObject: svc({}) }), /never changes a Service's spec/],
  ['a Service deleted by the operator', OPERATOR, write('DELETE', 'services', { oldObject: svc({}) }), /no create or delete/],
  ['the status of another class\'s Service', OPERATOR, write('UPDATE', 'services', { sub: 'status', object: svc({}, {}, { loadBalancerClass: 'other.example/lb' }), oldObject: svc({}, {}, { loadBalancerClass: 'other.example/lb' }) }), /loadBalancerClass tether.dev\/lb only/],
  ['another Lease by the operator', OPERATOR, write('UPDATE', 'leases', { group: 'coordination.k8s.io', object: lease('kube-scheduler'), oldObject: lease('kube-scheduler') }), /only its own Lease tether-operator; denied: UPDATE Lease kube-scheduler/],
  ['a block created by the operator', OPERATOR, write('CREATE', 'addressblocks', { ...T, object: block('n1') }), /never makes one/],
];

test('adversarial writes are denied, each naming its rule', () => {
  for (const [what, user, a, rule] of ADVERSARIAL) {
    const v = admit(a, user);
    assert.not.ok(v.allowed, `${what}: allowed`);
    assert.match(v.message!, rule, `${what}: ${v.message} (all: ${v.failures.join(' | ')})`);
    assert.not.match(v.message!, /resulted in error/, `${what}: denied by an error, not by the rule: ${v.message}`);
    assert.is(v.code, 403, what);
  }
});

test('other users are not concerned; the node\'s reads and its own writes pass with every optional field absent', () => {
  const admin: UserInfo = { username: 'kubernetes-admin', groups: ['system:masters'] };
  assert.ok(admit(write('CREATE', 'addressblocks', { ...T, object: block('n2') }), admin).allowed);
  assert.ok(admit(write('UPDATE', 'services', { object: svc({ x: 'y' }, { finalizers: ['f'] }), oldObject: svc({}) }), admin).allowed);
  // A write the policies do not match at all (RBAC alone decides).
  assert.not.ok(evaluatePolicy(NODE_POLICY, write('UPDATE', 'nodes', { object: { metadata: { name: 'n1' } }, oldObject: { metadata: { name: 'n1' } } }), nodeUser('n1')).matched);
  // A TetherNode with no labels, annotations, ownerReferences or finalizers at all.
  assert.ok(admit(write('CREATE', 'tethernodes', { ...T, object: { kind: 'TetherNode', metadata: { name: 'n1' } } }), nodeUser('n1')).allowed);
  assert.ok(admit(write('DELETE', 'tethernodes', { ...T, oldObject: tnode('n1', { finalizers: ['f'] }) }), nodeUser('n1')).allowed, 'its own TetherNode deleted');
});

test('the test bites: the old unguarded reads of request.subResource and userInfo.extra deny every main-resource write', () => {
  const unguarded = structuredClone(NODE_POLICY);
  const v = (unguarded.spec.variables as Obj[]).find((x) => x.name === 'target')!;
  v.expression = "request.subResource == '' ? request.resource.resource : request.resource.resource + '/' + request.subResource";
  const claim = write('CREATE', 'addressblocks', { ...T, object: block('n1') });
  const r = evaluatePolicy(unguarded, claim, nodeUser('n1'));
  assert.not.ok(r.allowed, 'a block claim denied on a real API server');
  assert.match(r.message!, /resulted in error: .*subResource/);
  assert.ok(evaluatePolicy(NODE_POLICY, claim, nodeUser('n1')).allowed, 'the guarded policy allows it');

  const noExtra = structuredClone(NODE_POLICY);
  (noExtra.spec.variables as Obj[]).find((x) => x.name === 'node')!.expression = "request.userInfo.extra['authentication.kubernetes.io/node-name'][0]";
  const older = evaluatePolicy(noExtra, claim, { username: 'system:serviceaccount:tether-system:tether' });
  assert.match(older.message!, /resulted in error: .*extra/, 'an unguarded extra is an error, still a denial, but naming no rule');
});

test.run();
