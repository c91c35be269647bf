// The ValidatingAdmissionPolicy of install/base (what a node's tetherd may write), evaluated as the API
// server evaluates it: match rules, match conditions, variables and validations, each CEL expression run by
// @bufbuild/cel against admission requests as the API server builds them (the node's name in the token's
// extra, the Lease as params). There is no kube-apiserver on these machines: the evaluator below is a FAKE
// of its admission step, kept to what the policy uses.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { execFileSync } from 'node:child_process';
import * as path from 'node:path';
import { parseAllDocuments } from 'yaml';
import { celEnv, parse, plan, type CelInput } from '@bufbuild/cel';

type Obj = Record<string, any>;
const root = path.join(__dirname, '../..');
const objs: Obj[] = parseAllDocuments(execFileSync('kubectl', ['kustomize', path.join(root, 'install')], { encoding: 'utf8' })).map((d) => d.toJS() as Obj).filter(Boolean);
const policy = objs.find((o) => o.kind === 'ValidatingAdmissionPolicy' && o.metadata.name === 'tether-node-writes')!;
const binding = objs.find((o) => o.kind === 'ValidatingAdmissionPolicyBinding' && o.spec.policyName === 'tether-node-writes')!;

const TETHERD = 'system:serviceaccount:tether-system:tether';

function cel(expr: string, vars: Record<string, unknown>): unknown {
  const r = (plan(celEnv(), parse(expr)) as (v: Record<string, CelInput>) => unknown)(vars as Record<string, CelInput>);
  if (r instanceof Error) throw new Error(`${expr}: ${r.message}`);
  return r;
}

interface Req {
  user?: string;
  node?: string;
  group: string;
  resource: string;
  subResource?: string;
  operation: 'CREATE' | 'UPDATE' | 'DELETE';
  name?: string;
  object?: Obj;
  oldObject?: Obj;
}

/** FAKE admission: the policy's verdict on one request, with the controllers' Lease (or none). */
function admit(r: Req, lease: Obj | undefined): { allowed: boolean; message?: string } {
  const target = r.subResource ? `${r.resource}/${r.subResource}` : r.resource;
  const matched = (policy.spec.matchConstraints.resourceRules as Obj[]).some((rule) =>
    rule.apiGroups.includes(r.group) && rule.operations.includes(r.operation) && rule.resources.includes(target));
  if (!matched) return { allowed: true };
  const request = {
    operation: r.operation,
    name: r.name ?? r.object?.metadata?.name ?? r.oldObject?.metadata?.name ?? '',
    resource: { group: r.group, version: 'v1', resource: r.resource },
    subResource: r.subResource ?? '',
    userInfo: { username: r.user ?? TETHERD, extra: r.node ? { 'authentication.kubernetes.io/node-name': [r.node] } : {} },
  };
  const base: Record<string, unknown> = { request, object: r.object ?? null, oldObject: r.oldObject ?? null };
  for (const c of policy.spec.matchConditions as Obj[]) if (cel(c.expression, base) !== true) return { allowed: true };
  if (!lease) {
    return binding.spec.paramRef.parameterNotFoundAction === 'Allow' ? { allowed: true } : { allowed: false, message: 'no params' };
  }
  const variables: Record<string, unknown> = {};
  const vars = { ...base, params: lease, variables };
  for (const v of policy.spec.variables as Obj[]) variables[v.name] = cel(v.expression, vars);
  for (const v of policy.spec.validations as Obj[]) {
    let ok: unknown;
    try {
      ok = cel(v.expression, vars);
    } catch (e) {
      // failurePolicy Fail: an expression that errors denies.
      return { allowed: false, message: `error: ${(e as Error).message}` };
    }
    if (ok !== true) return { allowed: false, message: v.messageExpression ? String(cel(v.messageExpression, vars)) : v.message };
  }
  return { allowed: true };
}

const lease = (holder: string) => ({ apiVersion: 'coordination.k8s.io/v1', kind: 'Lease', metadata: { name: 'tether-controllers', namespace: 'tether-system' }, spec: { holderIdentity: holder } });
const LEASE = lease('n9');
const block = (node: string) => ({ apiVersion: 'tether.dev/v1alpha1', kind: 'AddressBlock', metadata: { name: `default-10-244-0-0-26` }, spec: { pool: 'default', cidr: '10.244.0.0/26', node } });
const svc = (labels: Record<string, string>, cls = 'tether.dev/lb', extra: Obj = {}) => ({
  apiVersion: 'v1', kind: 'Service', metadata: { name: 'db', namespace: 'shop', labels, annotations: { a: '1' } },
  spec: { type: 'LoadBalancer', loadBalancerClass: cls, ports: [{ port: 5432 }], ...extra },
});

test('the policy and its binding are in the install, bound to the controllers\' Lease, denying', () => {
  assert.ok(policy && binding);
  assert.equal(binding.spec.validationActions, ['Deny']);
  assert.equal([binding.spec.paramRef.name, binding.spec.paramRef.namespace], ['tether-controllers', 'tether-system']);
  assert.is(policy.spec.failurePolicy, 'Fail');
});

test('AddressBlocks: a node creates and deletes only its own; the leader also collects a deleted node\'s', () => {
  const create = (node: string, of: string) => admit({ node, group: 'tether.dev', resource: 'addressblocks', operation: 'CREATE', object: block(of) }, LEASE);
  const del = (node: string, of: string, l = LEASE) => admit({ node, group: 'tether.dev', resource: 'addressblocks', operation: 'DELETE', oldObject: block(of) }, l);
  assert.ok(create('n1', 'n1').allowed);
  const other = create('n1', 'n2');
  assert.not.ok(other.allowed);
  assert.match(other.message!, /only its own blocks: n1 may not CREATE a block of node n2/);
  assert.ok(del('n1', 'n1').allowed);
  assert.not.ok(del('n1', 'n2').allowed, 'a node releases another node\'s block');
  assert.ok(del('n9', 'n2').allowed, 'the leader collects a claim');
});

test('status of Services, Egresses, AddressPools and the Service label: the leader only, and on a Service only what tether owns', () => {
  const status = (node: string, resource: string, group = 'tether.dev') => admit({ node, group, resource, subResource: 'status', operation: 'UPDATE', object: { metadata: { name: 'x' } }, oldObject: { metadata: { name: 'x' } } }, LEASE);
  assert.not.ok(status('n1', 'egresses').allowed);
  assert.match(status('n1', 'egresses').message!, /only the leader .* writes egresses\/status; n1 is not it/);
  assert.ok(status('n9', 'egresses').allowed);
  assert.not.ok(status('n1', 'addresspools').allowed);

  const svcStatus = (node: string, cls: string) => admit({ node, group: '', resource: 'services', subResource: 'status', operation: 'UPDATE', object: svc({}, cls), oldObject: svc({}, cls) }, LEASE);
  assert.ok(svcStatus('n9', 'tether.dev/lb').allowed);
  assert.not.ok(svcStatus('n1', 'tether.dev/lb').allowed, 'a node hijacking a LoadBalancer IP');
  assert.match(svcStatus('n9', 'other.example/lb').message!, /loadBalancerClass tether.dev\/lb only/);

  const label = (next: Obj) => admit({ node: 'n9', group: '', resource: 'services', operation: 'UPDATE', object: next, oldObject: svc({ app: 'db' }) }, LEASE);
  assert.ok(label(svc({ app: 'db', 'tether.dev/load-balancer': 'true' })).allowed, 'the leader labels a tether Service');
  assert.not.ok(label(svc({ app: 'db', 'tether.dev/load-balancer': 'true', more: 'x' })).allowed, 'another label added');
  assert.not.ok(label(svc({ 'tether.dev/load-balancer': 'true' })).allowed, 'a label removed');
  assert.not.ok(label(svc({ app: 'db' }, 'tether.dev/lb', { ports: [{ port: 1 }] })).allowed, 'the spec changed');
  assert.not.ok(admit({ node: 'n1', group: '', resource: 'services', operation: 'UPDATE', object: svc({ app: 'db', 'tether.dev/load-balancer': 'true' }), oldObject: svc({ app: 'db' }) }, LEASE).allowed, 'not the leader');
});

test('TetherNodes, Events and Secrets: a node writes its own, reports as itself, creates only tether\'s two Secrets', () => {
  const tnode = (node: string, name: string) => admit({ node, group: 'tether.dev', resource: 'tethernodes', subResource: 'status', operation: 'UPDATE', object: { metadata: { name } }, oldObject: { metadata: { name } } }, LEASE);
  assert.ok(tnode('n1', 'n1').allowed);
  assert.not.ok(tnode('n1', 'n2').allowed);
  const event = (node: string, instance: string) => admit({ node, group: 'events.k8s.io', resource: 'events', operation: 'CREATE', object: { metadata: { name: 'e', namespace: 'shop' }, reportingController: 'tether.dev/tetherd', reportingInstance: instance } }, LEASE);
  assert.ok(event('n1', 'n1').allowed);
  assert.not.ok(event('n1', 'n2').allowed, 'an Event posing as another node');
  const secret = (name: string) => admit({ node: 'n1', group: '', resource: 'secrets', operation: 'CREATE', object: { metadata: { name, namespace: 'tether-system' } } }, LEASE);
  assert.ok(secret('tether-cluster-key').allowed && secret('tether-redis-auth').allowed);
  assert.match(secret('something-else').message!, /only the Secrets tether-cluster-key and tether-redis-auth, not something-else/);
});

test('a token without a node name is refused; other users are not concerned; before any Lease nothing is checked', () => {
  const r = admit({ group: 'tether.dev', resource: 'addressblocks', operation: 'CREATE', object: block('n1') }, LEASE);
  assert.not.ok(r.allowed);
  assert.match(r.message!, /token names no node/);
  assert.ok(admit({ user: 'kubernetes-admin', group: 'tether.dev', resource: 'addressblocks', operation: 'CREATE', object: block('n2') }, LEASE).allowed);
  assert.ok(admit({ node: 'n1', group: 'tether.dev', resource: 'addressblocks', operation: 'CREATE', object: block('n2') }, undefined).allowed, 'no Lease yet (parameterNotFoundAction Allow)');
});

test.run();
