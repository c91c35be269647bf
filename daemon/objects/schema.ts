// Validates an object against its kind's schema the way the API server does: the OpenAPI v3 structural
// schema (with ajv) and the CEL rules in x-kubernetes-validations (with @bufbuild/cel). Transition rules
// (those whose expression refers to oldSelf) run as the API server runs them: on an update only, and only
// at a node whose old value exists and correlates with the new one (same property path; a map-list item by
// its keys; never an item of another kind of list). A rule on an optional field therefore never sees the
// field added or removed: immutability rules that must hold across that are written on the parent.
// Unknown fields are errors, as with kubectl's strict field validation. Every problem names the field,
// e.g. `spec.addresses.count` (a rule's fieldPath, when it has one, is added to the node's path).
import Ajv, { type ErrorObject, type ValidateFunction } from 'ajv';
import addFormats from 'ajv-formats';
import { celEnv, celError, parse, plan, type CelInput } from '@bufbuild/cel';
import { isIP } from 'node:net';
import { parseCidr } from '../../lib/ip';
import { API_VERSION, DNS1123_LABEL, describe, isDnsSubdomain, isObject } from '../../lib/fields';
import { CRDS, NODE_SCHEMA } from './crds';
import { CORE_KINDS } from './core-kinds';

/**
 * Each CEL rule parsed and planned once (@bufbuild/cel's run() parses and plans on every call: every node
 * validating every Egress and AddressPool on each configuration rebuild spent most of its start-up there).
 * A rule that does not parse answers its error every time, as run() does.
 */
interface Program {
  run: (vars: Record<string, CelInput>) => unknown;
  /** The expression refers to the variable oldSelf: a transition rule. */
  transition: boolean;
}
const programs = new Map<string, Program>();
function program(rule: string): Program {
  let p = programs.get(rule);
  if (!p) {
    try {
      const parsed = parse(rule);
      const planned = plan(celEnv(), parsed) as (vars: Record<string, CelInput>) => unknown;
      const run = (v: Record<string, CelInput>) => {
        try {
          return planned(v);
        } catch (e) {
          return celError(e);
        }
      };
      p = { run, transition: identifiers(parsed).has('oldSelf') };
    } catch (e) {
      const err = celError(e);
      // Unparsed: whether it names oldSelf is read from its text; it fails either way.
      p = { run: () => err, transition: /\boldSelf\b/.test(rule) };
    }
    programs.set(rule, p);
  }
  return p;
}

/** Whether the API server treats `rule` as a transition rule (it refers to oldSelf). */
export function isTransitionRule(rule: string): boolean {
  return program(rule).transition;
}

/** The identifiers a parsed expression refers to (as the API server decides what is a transition rule: by the AST, not the text). */
function identifiers(parsed: unknown): Set<string> {
  const out = new Set<string>();
  const walk = (x: unknown): void => {
    if (Array.isArray(x)) return x.forEach(walk);
    if (!x || typeof x !== 'object') return;
    const o = x as Record<string, unknown>;
    if (o.case === 'identExpr' && isObject(o.value) && typeof o.value.name === 'string') out.add(o.value.name);
    for (const [k, v] of Object.entries(o)) if (k !== '$typeName' && k !== 'sourceInfo') walk(v);
  };
  walk(parsed);
  return out;
}

type Schema = Record<string, unknown>;
interface Rule {
  rule: string;
  message?: string;
  /** Where the API server reports a failure, relative to the rule's node (e.g. `.ipv4`). */
  fieldPath?: string;
  /**
   * Not supported here (@bufbuild/cel has no optional types): the schemas use none, and a unit test
   * refuses one, so tetherd never skips a rule that the API server would run.
   */
  optionalOldSelf?: boolean;
}

/** Kinds with a schema, and whether their objects live in a namespace. */
const KINDS: Record<string, { schema: Schema; namespaced: boolean; apiVersion?: string }> = {
  ...Object.fromEntries(CRDS.filter((d) => !d.reportOnly).map((d) => [d.kind, { schema: d.schema, namespaced: d.scope === 'Namespaced' }])),
  Node: { schema: NODE_SCHEMA, namespaced: false },
  ...CORE_KINDS,
};

export function schemaKinds(): string[] {
  return Object.keys(KINDS);
}

const ajv = new Ajv({ allErrors: true, strict: false });
addFormats(ajv, ['date-time', 'ipv4', 'ipv6']);
ajv.addFormat('cidr', { type: 'string', validate: (s: string) => parseCidr(s) !== undefined && s.includes('/') });
ajv.addFormat('ip', { type: 'string', validate: (s: string) => isIP(s) !== 0 });
// int64 is how Kubernetes marks its integers; every JS number in range is accepted.
ajv.addFormat('int64', { type: 'number', validate: (n: number) => Number.isSafeInteger(n) });

const compiled = new Map<string, ValidateFunction>();

/** The structural schema as JSON Schema: objects with properties reject unknown fields, x- keys dropped. */
function toJsonSchema(s: unknown): unknown {
  if (Array.isArray(s)) return s.map(toJsonSchema);
  if (!isObject(s)) return s;
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(s)) {
    if (k.startsWith('x-kubernetes-') || k === 'description') continue;
    out[k] = k === 'enum' || k === 'required' ? v : toJsonSchema(v);
  }
  if (s.type === 'object' && s.properties && s.additionalProperties === undefined && !s['x-kubernetes-preserve-unknown-fields']) {
    out.additionalProperties = false;
  }
  return out;
}

function validatorFor(kind: string): ValidateFunction {
  let v = compiled.get(kind);
  if (!v) {
    v = ajv.compile(toJsonSchema(KINDS[kind].schema) as object);
    compiled.set(kind, v);
  }
  return v;
}

/** `/spec/addresses/count` → `spec.addresses.count`; list indexes as `[i]`. */
function fieldOf(pointer: string): string {
  return pointer
    .split('/')
    .slice(1)
    .map((p) => p.replace(/~1/g, '/').replace(/~0/g, '~'))
    .reduce((acc, p) => (/^\d+$/.test(p) ? `${acc}[${p}]` : acc ? `${acc}.${p}` : p), '');
}

function valueAt(obj: unknown, pointer: string): unknown {
  let v = obj;
  for (const p of pointer.split('/').slice(1)) v = isObject(v) || Array.isArray(v) ? (v as Record<string, unknown>)[p.replace(/~1/g, '/').replace(/~0/g, '~')] : undefined;
  return v;
}

function ajvProblem(e: ErrorObject, obj: unknown): string {
  const field = fieldOf(e.instancePath);
  const at = field ? `${field} ` : '';
  const value = valueAt(obj, e.instancePath);
  switch (e.keyword) {
    case 'required':
      return `${field ? `${field}.` : ''}${(e.params as { missingProperty: string }).missingProperty} is missing`;
    case 'additionalProperties': {
      const extra = (e.params as { additionalProperty: string }).additionalProperty;
      return `unknown field ${field ? `${field}.` : ''}${extra}`;
    }
    case 'enum':
      return `${at}${describe(value)} must be one of ${((e.params as { allowedValues: unknown[] }).allowedValues).map((x) => JSON.stringify(x)).join(', ')}`;
    case 'type':
      return `${at}${describe(value)} must be ${(e.params as { type: string }).type === 'object' ? 'an object' : `of type ${(e.params as { type: string }).type}`}`;
    case 'format':
      return `${at}${describe(value)} is not ${({ cidr: 'a CIDR like "203.0.113.0/24"', ip: 'an IP address', ipv4: 'an IPv4 address', ipv6: 'an IPv6 address' } as Record<string, string>)[(e.params as { format: string }).format] ?? `in format ${(e.params as { format: string }).format}`}`;
    case 'minItems':
    case 'maxItems':
      return `${at}must list ${e.keyword === 'minItems' ? 'at least' : 'at most'} ${(e.params as { limit: number }).limit} item(s)`;
    default:
      return `${at}${describe(value)} ${e.message ?? 'is invalid'}`;
  }
}

/** CEL sees integers as int (bigint), as the API server does, so `self.count <= 16` and `x in [253]` compare ints. */
function celValue(v: unknown, s: Schema | undefined): unknown {
  if (!s) return v;
  if (s.type === 'integer' && typeof v === 'number') return BigInt(v);
  if (Array.isArray(v)) return v.map((x) => celValue(x, s.items as Schema | undefined));
  if (isObject(v)) {
    const props = (s.properties ?? {}) as Record<string, Schema>;
    const extra = isObject(s.additionalProperties) ? (s.additionalProperties as Schema) : undefined;
    return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, celValue(x, props[k] ?? extra)]));
  }
  return v;
}

/**
 * Runs the CEL rules of every schema node that has a value, depth first. `old` is the correlated old value
 * of the node (undefined on a create, where the old object has no such field, or where no old value
 * correlates): transition rules run only when it is there, as in the API server.
 */
function celProblems(s: Schema, v: unknown, old: unknown, field: string, out: string[]): void {
  if (v === undefined || v === null) return;
  const rules = (s['x-kubernetes-validations'] ?? []) as Rule[];
  for (const r of rules) {
    const p = program(r.rule);
    if (p.transition && (old === undefined || old === null)) continue;
    const vars = (p.transition ? { self: celValue(v, s), oldSelf: celValue(old, s) } : { self: celValue(v, s) }) as Record<string, CelInput>;
    const result = p.run(vars);
    if (result !== true) {
      const why = result instanceof Error ? ` (rule ${JSON.stringify(r.rule)} failed: ${result.message.split('\n')[0]})` : '';
      const at = r.fieldPath ? `${field}${r.fieldPath}`.replace(/^\./, '') : field;
      out.push(`${at || 'object'}: ${r.message ?? `failed rule ${r.rule}`}${why}`);
    }
  }
  if (isObject(v)) {
    const props = (s.properties ?? {}) as Record<string, Schema>;
    for (const [k, sub] of Object.entries(props)) {
      celProblems(sub, v[k], isObject(old) ? old[k] : undefined, field ? `${field}.${k}` : k, out);
    }
  } else if (Array.isArray(v) && isObject(s.items)) {
    // An item correlates with an old one only in a map list (by its keys); items of other lists have no old value.
    const keys = s['x-kubernetes-list-type'] === 'map' ? ((s['x-kubernetes-list-map-keys'] ?? []) as string[]) : undefined;
    const olds = keys && Array.isArray(old) ? old.filter(isObject) : [];
    const keyOf = (x: unknown) => (isObject(x) ? JSON.stringify(keys!.map((k) => x[k])) : undefined);
    v.forEach((x, i) => {
      const was = keys ? olds.find((o) => keyOf(o) === keyOf(x)) : undefined;
      celProblems(s.items as Schema, x, was, `${field}[${i}]`, out);
    });
  }
}

/** The CEL problems of `v` against `schema` alone (`old`: its old version, for transition rules). */
export function celProblemsOf(schema: Schema, v: unknown, old?: unknown): string[] {
  const out: string[] = [];
  celProblems(schema, v, old, '', out);
  return out;
}

/** metadata as the API server checks it: a name of the right shape; a namespace for namespaced kinds. */
function metadataProblems(obj: Record<string, unknown>, namespaced: boolean, out: string[]): void {
  const meta = obj.metadata;
  if (!isObject(meta)) return void out.push('metadata must be an object with a name');
  const name = meta.name;
  if (name === undefined) out.push('metadata.name is missing');
  else if (typeof name !== 'string' || !(namespaced || obj.kind === 'Node' ? isDnsSubdomain(name) : name.length <= 63 && DNS1123_LABEL.test(name))) {
    out.push(`metadata.name ${describe(name)} must be a DNS-1123 ${namespaced || obj.kind === 'Node' ? 'subdomain' : 'label'}`);
  }
  if (namespaced && meta.namespace !== undefined && (typeof meta.namespace !== 'string' || meta.namespace.length > 63 || !DNS1123_LABEL.test(meta.namespace))) {
    out.push(`metadata.namespace ${describe(meta.namespace)} must be a DNS-1123 label`);
  }
  if (!namespaced && meta.namespace !== undefined) out.push(`metadata.namespace: a ${String(obj.kind)} is cluster-scoped and has no namespace`);
}

/**
 * Every problem of `obj` against its kind's schema (empty when valid). `old` is the version it replaces,
 * for transition rules (immutable fields). Unknown kinds and a wrong apiVersion are problems too.
 */
export function schemaProblems(obj: unknown, old?: unknown): string[] {
  if (!isObject(obj)) return [`must be an object, not ${describe(obj)}`];
  const kind = typeof obj.kind === 'string' ? KINDS[obj.kind] : undefined;
  if (!kind) return [`kind ${describe(obj.kind)} has no schema (one of ${Object.keys(KINDS).join(', ')})`];
  const out: string[] = [];
  const apiVersion = kind.apiVersion ?? API_VERSION;
  if (obj.apiVersion !== apiVersion) out.push(`apiVersion ${describe(obj.apiVersion)} must be ${JSON.stringify(apiVersion)}`);
  metadataProblems(obj, kind.namespaced, out);
  const validate = validatorFor(obj.kind as string);
  if (!validate(obj)) {
    // ajv reports a failed `type` beside each of its siblings' errors; one line per field is enough.
    const seen = new Set<string>();
    for (const e of validate.errors ?? []) {
      const line = ajvProblem(e, obj);
      if (!seen.has(line)) out.push(line);
      seen.add(line);
    }
  }
  // CEL rules run on a structurally valid object only, as in the API server.
  if (out.length === 0) celProblems(kind.schema, obj, old, '', out);
  return out;
}

/** The object's name as messages show it: `Egress "shop/out"`, `AddressPool "blue"`. */
export function objectLabel(obj: unknown): string {
  const o = isObject(obj) ? obj : {};
  const m = isObject(o.metadata) ? o.metadata : {};
  const ns = typeof m.namespace === 'string' ? `${m.namespace}/` : '';
  const name = typeof m.name === 'string' && m.name ? m.name : '(no name)';
  return `${typeof o.kind === 'string' ? o.kind : 'object'} ${JSON.stringify(ns + name)}`;
}
