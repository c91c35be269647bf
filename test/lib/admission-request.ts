// The CEL variables of a ValidatingAdmissionPolicy built as the API server builds them, and a FAKE of its
// admission step (there is no kube-apiserver on these machines) evaluating a policy with @bufbuild/cel.
//
// `request` is admission/v1.AdmissionRequest filled by the CEL admission library
// (k8s.io/apiserver/pkg/admission/plugin/cel: CreateAdmissionRequest) and converted to unstructured by the
// Go structs' JSON tags (ToUnstructured, or UnstructuredReflectToVal in newer releases, which mimics it):
// an `omitempty` field whose value is empty ('' , an empty map or list, a nil pointer) is ABSENT, and in CEL
// a select on an absent key is an error. Tags as upstream (k8s.io/api admission/v1 and authentication/v1,
// k8s.io/apimachinery meta/v1):
//   AdmissionRequest: uid, kind{group,version,kind}, resource{group,version,resource}, subResource omitempty,
//     requestKind omitempty (set), requestResource omitempty (set), requestSubResource omitempty,
//     name omitempty, namespace omitempty, operation, userInfo, object omitempty, oldObject omitempty,
//     dryRun omitempty (a *bool, always set), options omitempty.
//   UserInfo: username, uid, groups, extra: all omitempty (extra is map[string][]string).
// CreateAdmissionRequest leaves request.object and request.oldObject unset (policies read the top-level
// `object` and `oldObject`): here they are absent. `object` is null for a DELETE, `oldObject` null for a
// CREATE; `params` is null without a paramKind.
//
// The evaluation: matchConstraints.resourceRules (group, version, operation, resource with "*", "*/*",
// "res/*"), matchConditions, variables, validations in order; an expression that errors is, with
// failurePolicy Fail, a denial ("expression '...' resulted in error: ..."), as are a matchCondition that
// errors and a variable that errors once a validation reads it. Not modelled: namespaceSelector,
// objectSelector, matchPolicy Equivalent, excludeResourceRules, auditAnnotations, type checking and cost
// limits at policy creation, and the Kubernetes CEL libraries beyond the standard ones and the strings
// extension (lowerAscii, replace ...).
import { randomUUID } from 'node:crypto';
import { celEnv, parse, plan, type CelInput } from '@bufbuild/cel';
import { strings } from '@bufbuild/cel/ext';
import type { AdmissionAttributes, AdmissionVerdict } from './fake-apiserver';

type Obj = Record<string, any>;

/** authentication/v1.UserInfo as the authenticator made it (Go values: '' and empty are "unset"). */
export interface UserInfo {
  username?: string;
  uid?: string;
  groups?: string[];
  extra?: Record<string, string[]>;
}

/** The user of a pod-bound ServiceAccount token (Kubernetes 1.32+: it names the node; `node` undefined: an older token). */
export function serviceAccountUser(namespace: string, name: string, pod?: { node?: string; pod?: string }): UserInfo {
  const extra: Record<string, string[]> = {};
  if (pod) {
    extra['authentication.kubernetes.io/credential-id'] = [`JTI=${randomUUID()}`];
    extra['authentication.kubernetes.io/pod-name'] = [pod.pod ?? `${name}-x1`];
    extra['authentication.kubernetes.io/pod-uid'] = [randomUUID()];
    if (pod.node) {
      extra['authentication.kubernetes.io/node-name'] = [pod.node];
      extra['authentication.kubernetes.io/node-uid'] = [randomUUID()];
    }
  }
  return { username: `system:serviceaccount:${namespace}:${name}`, uid: randomUUID(), groups: ['system:serviceaccounts', `system:serviceaccounts:${namespace}`, 'system:authenticated'], extra };
}

/** Go's encoding/json and ToUnstructured "empty" for omitempty. */
function isEmpty(v: unknown): boolean {
  if (v === undefined || v === null || v === '' || v === false || v === 0) return true;
  if (Array.isArray(v)) return v.length === 0;
  if (typeof v === 'object') return Object.keys(v as object).length === 0;
  return false;
}

/** A Go struct to unstructured: fields in declaration order, [json name, omitempty, value]. */
function struct(fields: Array<[string, boolean, unknown]>): Obj {
  const out: Obj = {};
  for (const [name, omitempty, v] of fields) {
    if (omitempty && isEmpty(v)) continue;
    // A non-omitempty field has its Go zero value when unset.
    out[name] = v === undefined ? '' : v;
  }
  return out;
}

const OPTIONS_KIND = { CREATE: 'CreateOptions', UPDATE: 'UpdateOptions', DELETE: 'DeleteOptions' } as const;

/** The CEL `request` for one write, as CreateAdmissionRequest builds it and the conversion leaves it. */
export function admissionRequest(a: AdmissionAttributes, user: UserInfo, o: { uid?: string; dryRun?: boolean } = {}): Obj {
  const gvk = struct([['group', false, a.group], ['version', false, a.version], ['kind', false, a.kind]]);
  const gvr = struct([['group', false, a.group], ['version', false, a.version], ['resource', false, a.resource]]);
  const userInfo = struct([['username', true, user.username], ['uid', true, user.uid], ['groups', true, user.groups], ['extra', true, user.extra]]);
  return struct([
    ['uid', false, o.uid ?? randomUUID()],
    ['kind', false, gvk],
    ['resource', false, gvr],
    ['subResource', true, a.subResource],
    // Pointers, always set by CreateAdmissionRequest (not empty: a non-nil pointer is kept).
    ['requestKind', false, { ...gvk }],
    ['requestResource', false, { ...gvr }],
    ['requestSubResource', true, a.subResource],
    ['name', true, a.name],
    ['namespace', true, a.namespace],
    ['operation', false, a.operation],
    ['userInfo', false, userInfo],
    ['dryRun', false, o.dryRun ?? false],
    ['options', true, { kind: OPTIONS_KIND[a.operation], apiVersion: 'meta.k8s.io/v1' }],
  ]);
}

export interface PolicyVerdict extends AdmissionVerdict {
  /** Whether the policy's match rules and conditions selected the request at all. */
  matched: boolean;
  /** Every failed validation's message (the first is `message`). */
  failures: string[];
}

const env = celEnv({ funcs: strings } as Parameters<typeof celEnv>[0]);
const programs = new Map<string, (v: Record<string, CelInput>) => unknown>();

/** One CEL expression: its value, or an Error (a select on an absent key, a null, a bad overload ...). */
export function celEval(expr: string, vars: Record<string, unknown>): unknown {
  let p = programs.get(expr);
  if (!p) programs.set(expr, (p = plan(env, parse(expr)) as (v: Record<string, CelInput>) => unknown));
  try {
    return p(vars as Record<string, CelInput>);
  } catch (e) {
    return e instanceof Error ? e : new Error(String(e));
  }
}

function ruleMatches(rule: Obj, a: AdmissionAttributes): boolean {
  const target = a.subResource ? `${a.resource}/${a.subResource}` : a.resource;
  const groupOk = (rule.apiGroups as string[]).some((g) => g === '*' || g === a.group);
  const versionOk = (rule.apiVersions as string[]).some((v) => v === '*' || v === a.version);
  const opOk = (rule.operations as string[]).some((op) => op === '*' || op === a.operation);
  const resOk = (rule.resources as string[]).some((r) => {
    if (r === '*') return !a.subResource;
    if (r === '*/*') return true;
    const [res, sub] = r.split('/');
    if (sub === '*') return res === a.resource && !!a.subResource;
    if (res === '*' && sub !== undefined) return sub === a.subResource;
    return r === target;
  });
  return groupOk && versionOk && opOk && resOk;
}

/** FAKE admission: `policy`'s verdict on one write by `user`, its request built as the API server builds it. */
export function evaluatePolicy(policy: Obj, a: AdmissionAttributes, user: UserInfo): PolicyVerdict {
  const spec = policy.spec as Obj;
  const name = policy.metadata.name as string;
  const fail = (message: string, reason = 'Forbidden', failures = [message]): PolicyVerdict => ({
    allowed: false, matched: true, reason, code: reason === 'Forbidden' ? 403 : 422, failures,
    message: `ValidatingAdmissionPolicy '${name}' with binding '${name}' denied request: ${message}`,
  });
  if (!(spec.matchConstraints.resourceRules as Obj[]).some((r) => ruleMatches(r, a))) return { allowed: true, matched: false, failures: [] };
  const base: Record<string, unknown> = { request: admissionRequest(a, user), object: a.object, oldObject: a.oldObject, params: null };
  const errorOf = (expr: string, e: Error) => `expression '${expr}' resulted in error: ${e.message}`;
  for (const c of (spec.matchConditions ?? []) as Obj[]) {
    const r = celEval(c.expression, base);
    if (r instanceof Error) {
      if (spec.failurePolicy === 'Ignore') return { allowed: true, matched: false, failures: [] };
      return fail(`failed to evaluate matchCondition ${c.name}: ${errorOf(c.expression, r)}`, 'InternalError');
    }
    if (r !== true) return { allowed: true, matched: false, failures: [] };
  }
  // Variables in order, each seeing those before it; one that errors fails whatever reads it.
  const variables: Record<string, unknown> = {};
  const broken = new Map<string, Error>();
  const vars = { ...base, variables };
  const reads = (expr: string) => [...broken.keys()].find((k) => new RegExp(`\\bvariables\\.${k}\\b`).test(expr));
  for (const v of (spec.variables ?? []) as Obj[]) {
    const bad = reads(v.expression);
    const r = bad ? broken.get(bad)! : celEval(v.expression, vars);
    if (r instanceof Error) broken.set(v.name, r);
    else variables[v.name] = r;
  }
  const failures: string[] = [];
  let reason = 'Invalid';
  for (const v of spec.validations as Obj[]) {
    const bad = reads(v.expression);
    const r = bad ? broken.get(bad)! : celEval(v.expression, vars);
    if (r instanceof Error) {
      if (spec.failurePolicy === 'Ignore') continue;
      failures.push(errorOf(v.expression, r));
      continue;
    }
    if (r === true) continue;
    let msg: string | undefined;
    if (v.messageExpression) {
      const m = reads(v.messageExpression) ? undefined : celEval(v.messageExpression, vars);
      if (typeof m === 'string' && m.trim()) msg = m.trim();
    }
    failures.push(msg ?? (v.message as string | undefined)?.trim() ?? `failed expression: ${String(v.expression).trim()}`);
    if (failures.length === 1) reason = v.reason ?? 'Invalid';
  }
  if (failures.length) return fail(failures[0], failures[0].startsWith('expression ') ? 'Forbidden' : reason, failures);
  return { allowed: true, matched: true, failures: [] };
}

/** Several policies, as the API server runs every bound one: the first denial wins. */
export function admitWith(policies: Obj[], userOf: (a: AdmissionAttributes) => UserInfo): (a: AdmissionAttributes) => PolicyVerdict {
  return (a) => {
    const user = userOf(a);
    for (const p of policies) {
      const v = evaluatePolicy(p, a, user);
      if (!v.allowed) return v;
    }
    return { allowed: true, matched: false, failures: [] };
  };
}
