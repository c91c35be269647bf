// The file config source: custom-resource-shaped objects from one YAML or JSON file (several `---`
// documents, `kind: List`), plus the legacy `{ "nodes": {...} }` node-facts JSON. Every problem in the file
// is reported at once, each line naming the file and the document.
import * as fs from 'node:fs';
import { parseAllDocuments } from 'yaml';
import { ErrorCode, TetherError } from '../../lib/errors';
import { API_VERSION, describe, isDnsSubdomain, isLabelKey, isLabelValue, isObject } from '../../lib/fields';
import { checkPools } from '../../ipam/pool';
import { objectLabel, schemaKinds, schemaProblems } from '../objects/schema';
import type { ResolvedPool } from '../../ipam/types';
import { ZONE_LABEL } from '../objects/names';

export interface NodeFacts {
  zone?: string;
  labels: Record<string, string>;
  /** false when the Node is being deleted or tainted ToBeDeletedByClusterAutoscaler (absent: eligible). */
  eligible?: boolean;
}

export interface ConfigObjects {
  pools: ResolvedPool[];
  /** Node name → facts. */
  nodes: Record<string, NodeFacts>;
  /** Pod metadata ("namespace/name"): from Pod objects in a file (standalone), or this node's Pods from the API. */
  pods?: Record<string, PodMeta>;
  /**
   * Objects resolved by their own subsystems (Egress; Service and EndpointSlice for the load balancer),
   * exactly as written, each having passed its kind's schema.
   */
  others: Array<Record<string, unknown>>;
}

export interface PodMeta {
  labels: Record<string, string>;
  /** The API's Ready condition; absent (file objects) means ready. */
  ready?: boolean;
  /** It has a deletionTimestamp: terminating. */
  deleting?: boolean;
}

/** An empty configuration: no pools, nodes or objects. */
export function emptyConfig(): ConfigObjects {
  return { pools: [], nodes: {}, pods: {}, others: [] };
}

/** `Kind namespace/name`: how one object is matched with its previous version. */
export function objectKey(obj: Record<string, unknown>): string {
  const m = isObject(obj.metadata) ? obj.metadata : {};
  return `${String(obj.kind)} ${typeof m.namespace === 'string' ? `${m.namespace}/` : ''}${String(m.name)}`;
}

/** Kinds this loader hands on untouched; any other unknown kind is an error, so a misspelt kind is caught. */
export const PASSED_ON_KINDS = ['Egress', 'Service', 'EndpointSlice'];
const KNOWN_KINDS = ['AddressPool', 'Node', 'Pod', ...PASSED_ON_KINDS, 'List'];
const NODE_FIELDS = new Set(['apiVersion', 'kind', 'metadata', 'spec', 'status']);

/** Reads and validates `file`; throws TetherError(InvalidConfig) listing every problem. */
export function loadConfig(file: string, previous?: ConfigObjects): ConfigObjects {
  let text: string;
  try {
    text = fs.readFileSync(file, 'utf8');
  } catch (e) {
    throw new TetherError(ErrorCode.InvalidConfig, `config ${file}: ${(e as Error).message}`, { cause: e });
  }
  return parseConfig(text, file, previous);
}

/**
 * Parses config text; `file` is only used to name it in messages. JSON is read as the YAML subset it is.
 * Objects of a kind with a schema (crds.ts) are validated against it first; `previous` (the configuration
 * in force) supplies the old version of each object for transition rules such as immutable fields.
 */
export function parseConfig(text: string, file: string, previous?: ConfigObjects): ConfigObjects {
  const before = new Map<string, unknown>();
  if (previous) {
    for (const p of previous.pools) before.set(objectKey(p.source as unknown as Record<string, unknown>), p.source);
    for (const o of previous.others) before.set(objectKey(o), o);
  }
  const pods: Record<string, PodMeta> = {};
  const problems: string[] = [];
  const poolRaws: unknown[] = [];
  const poolWheres: string[] = [];
  const nodes: Record<string, NodeFacts> = {};
  const nodeWhere = new Map<string, string>();
  const others: Array<Record<string, unknown>> = [];

  const addNode = (name: string, facts: NodeFacts, where: string, shown: string) => {
    const first = nodeWhere.get(name);
    if (first) return problems.push(`${where}: ${shown} is already defined in ${first}`);
    nodeWhere.set(name, where);
    nodes[name] = facts;
  };

  const take = (obj: unknown, where: string, inList: boolean): void => {
    if (!isObject(obj)) return void problems.push(`${where}: must be an object, not ${describe(obj)}`);
    // Only a document that looks like the old form is read as one; anything else without a kind is a mistake.
    const legacy = Object.keys(obj).length === 0 || 'nodes' in obj;
    if (obj.kind === undefined && obj.apiVersion === undefined && !inList && legacy) {
      return takeLegacy(obj, where, problems, addNode);
    }
    if (typeof obj.kind === 'string' && schemaKinds().includes(obj.kind)) {
      const found = schemaProblems(obj, before.get(objectKey(obj)));
      if (found.length) return void problems.push(...found.map((p) => `${where}: ${objectLabel(obj)}: ${p}`));
    }
    switch (obj.kind) {
      case 'Pod': {
        const p = checkPod(obj, where, problems);
        if (p) pods[p.key] = { labels: p.labels };
        return;
      }
      case 'AddressPool':
        poolRaws.push(obj);
        poolWheres.push(where);
        return;
      case 'Node': {
        const n = checkNode(obj, where, problems);
        if (n) addNode(n.name, n.facts, where, `Node ${JSON.stringify(n.name)}`);
        return;
      }
      case 'List':
        if (inList) return void problems.push(`${where}: a List cannot hold another List`);
        if (!Array.isArray(obj.items)) return void problems.push(`${where}: List needs items (a list of objects)`);
        obj.items.forEach((item, i) => take(item, `${where} items[${i}]`, true));
        return;
      default:
        if (typeof obj.kind === 'string' && PASSED_ON_KINDS.includes(obj.kind)) return void others.push(obj);
        problems.push(obj.kind === undefined
          ? `${where}: kind is missing (one of ${KNOWN_KINDS.join(', ')})`
          : `${where}: kind ${describe(obj.kind)} is not one of ${KNOWN_KINDS.join(', ')}`);
    }
  };

  parseAllDocuments(text).forEach((doc, i) => {
    const where = `${file} document ${i + 1}`;
    if (doc.errors.length) {
      for (const e of doc.errors) problems.push(`${where}: ${e.message.split('\n')[0]}`);
      return;
    }
    const value: unknown = doc.toJS();
    if (value === null || value === undefined) return; // an empty document, e.g. after a trailing `---`
    if (Array.isArray(value)) value.forEach((item, j) => take(item, `${where} [${j}]`, true));
    else take(value, where, false);
  });

  const checked = checkPools(poolRaws, (i) => poolWheres[i]);
  problems.push(...checked.problems);
  if (problems.length) throw new TetherError(ErrorCode.InvalidConfig, problems.join('\n'));
  return { pools: checked.pools, nodes, pods, others };
}

/** A Pod's metadata (standalone use): which Egress roles its labels give it; nothing else of a Pod is read. */
function checkPod(obj: Record<string, unknown>, where: string, problems: string[]): { key: string; labels: Record<string, string> } | undefined {
  const meta = isObject(obj.metadata) ? obj.metadata : {};
  const label = `${where}: ${objectLabel(obj)}`;
  const before = problems.length;
  if (obj.apiVersion !== 'v1') problems.push(`${label}: apiVersion ${describe(obj.apiVersion)} must be "v1"`);
  if (typeof meta.name !== 'string' || !isDnsSubdomain(meta.name)) problems.push(`${label}: metadata.name ${describe(meta.name)} must be a DNS-1123 subdomain`);
  if (typeof meta.namespace !== 'string' || !isDnsSubdomain(meta.namespace)) problems.push(`${label}: metadata.namespace ${describe(meta.namespace)} must be a DNS-1123 label`);
  const labels: Record<string, string> = {};
  if (meta.labels !== undefined && !isObject(meta.labels)) problems.push(`${label}: metadata.labels must map label names to values`);
  for (const [k, v] of Object.entries(isObject(meta.labels) ? meta.labels : {})) {
    if (!isLabelKey(k)) problems.push(`${label}: metadata.labels key ${JSON.stringify(k)} is not a valid label name`);
    else if (typeof v !== 'string' || !isLabelValue(v)) problems.push(`${label}: metadata.labels.${k} ${describe(v)} is not a valid label value`);
    else labels[k] = v;
  }
  return problems.length === before ? { key: `${meta.namespace as string}/${meta.name as string}`, labels } : undefined;
}

function checkNode(obj: Record<string, unknown>, where: string, problems: string[]): { name: string; facts: NodeFacts } | undefined {
  const meta = obj.metadata;
  const name = isObject(meta) ? meta.name : undefined;
  const label = `${where}: Node ${typeof name === 'string' && name ? JSON.stringify(name) : '(no name)'}`;
  const before = problems.length;
  const bad = (msg: string) => void problems.push(`${label}: ${msg}`);

  if (obj.apiVersion !== API_VERSION) bad(`apiVersion ${describe(obj.apiVersion)} must be ${API_VERSION}`);
  for (const k of Object.keys(obj)) if (!NODE_FIELDS.has(k)) bad(`unknown field ${k}`);
  if (!isObject(meta)) bad('metadata must be an object with a name');
  else if (name === undefined) bad('metadata.name is missing');
  else if (typeof name !== 'string' || !isDnsSubdomain(name)) bad(`metadata.name ${describe(name)} must be a DNS-1123 subdomain`);

  const labels: Record<string, string> = {};
  const rawLabels = isObject(meta) ? meta.labels : undefined;
  if (rawLabels !== undefined) {
    if (!isObject(rawLabels)) bad(`metadata.labels must map label names to values, not ${describe(rawLabels)}`);
    else {
      for (const [k, v] of Object.entries(rawLabels)) {
        if (!isLabelKey(k)) bad(`metadata.labels key ${JSON.stringify(k)} is not a valid label name`);
        else if (typeof v !== 'string' || !isLabelValue(v)) bad(`metadata.labels.${k} ${describe(v)} is not a valid label value`);
        else labels[k] = v;
      }
    }
  }

  // The zone may come from spec.zone or from the well-known label, as on a Kubernetes Node; both must agree.
  let zone = labels[ZONE_LABEL];
  const spec = obj.spec;
  if (spec !== undefined) {
    if (!isObject(spec)) bad(`spec must be an object, not ${describe(spec)}`);
    else {
      for (const k of Object.keys(spec)) if (k !== 'zone') bad(`unknown field spec.${k}`);
      if (spec.zone !== undefined) {
        if (typeof spec.zone !== 'string' || spec.zone === '' || !isLabelValue(spec.zone)) {
          bad(`spec.zone ${describe(spec.zone)} must be a non-empty label value`);
        } else if (zone !== undefined && zone !== spec.zone) {
          bad(`spec.zone "${spec.zone}" contradicts metadata.labels.${ZONE_LABEL} "${zone}"`);
        } else zone = spec.zone;
      }
    }
  }
  if (problems.length !== before) return undefined;
  return { name: name as string, facts: zone === undefined ? { labels } : { zone, labels } };
}

/** `{ "nodes": { "<name>": { "zone": "...", "labels": {...} } } }`, the form before custom-resource objects. */
function takeLegacy(
  obj: Record<string, unknown>,
  where: string,
  problems: string[],
  addNode: (name: string, facts: NodeFacts, where: string, shown: string) => unknown,
): void {
  // Other top-level keys were ignored by the old loader; they stay ignored so existing files keep working.
  const nodes = obj.nodes ?? {};
  if (!isObject(nodes)) return void problems.push(`${where}: nodes must be an object`);
  for (const [name, raw] of Object.entries(nodes)) {
    const entry = raw ?? {};
    if (!isObject(entry)) {
      problems.push(`${where}: nodes.${name} must be an object`);
      continue;
    }
    const { zone, labels = {} } = entry;
    if (zone !== undefined && typeof zone !== 'string') {
      problems.push(`${where}: nodes.${name}.zone must be a string`);
      continue;
    }
    if (!isObject(labels) || Object.values(labels).some((v) => typeof v !== 'string')) {
      problems.push(`${where}: nodes.${name}.labels must map strings to strings`);
      continue;
    }
    const facts: NodeFacts = { labels: labels as Record<string, string> };
    if (zone !== undefined) facts.zone = zone;
    addNode(name, facts, where, `nodes.${name}`);
  }
}
