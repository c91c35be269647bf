// The file config source: custom-resource-shaped objects from one YAML or JSON file (several `---`
// documents, `kind: List`), plus the legacy `{ "nodes": {...} }` node-facts JSON. Every problem in the file
// is reported at once, each line naming the file and the document.
import * as fs from 'node:fs';
import { parseAllDocuments } from 'yaml';
import { ErrorCode, TetherError } from '../errors';
import { API_VERSION, ZONE_LABEL, describe, isDnsSubdomain, isLabelKey, isLabelValue, isObject } from '../common/fields';
import { checkPools } from '../../ipam/pool';
import type { ResolvedPool } from '../../ipam/types';

export interface NodeFacts {
  zone?: string;
  labels: Record<string, string>;
}

export interface ConfigObjects {
  pools: ResolvedPool[];
  /** Node name → facts. */
  nodes: Record<string, NodeFacts>;
  /** Objects of kinds validated by their own subsystems (Egress, LoadBalancer), exactly as written. */
  others: Array<Record<string, unknown>>;
}

/** Kinds this loader hands on untouched; any other unknown kind is an error, so a misspelt kind is caught. */
export const PASSED_ON_KINDS = ['Egress', 'LoadBalancer'];
const KNOWN_KINDS = ['AddressPool', 'Node', ...PASSED_ON_KINDS, 'List'];
const NODE_FIELDS = new Set(['apiVersion', 'kind', 'metadata', 'spec', 'status']);

/** Reads and validates `file`; throws TetherError(InvalidConfig) listing every problem. */
export function loadConfig(file: string): ConfigObjects {
  let text: string;
  try {
    text = fs.readFileSync(file, 'utf8');
  } catch (e) {
    throw new TetherError(ErrorCode.InvalidConfig, `config ${file}: ${(e as Error).message}`, { cause: e });
  }
  return parseConfig(text, file);
}

/** Parses config text; `file` is only used to name it in messages. JSON is read as the YAML subset it is. */
export function parseConfig(text: string, file: string): ConfigObjects {
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
    switch (obj.kind) {
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
  return { pools: checked.pools, nodes, others };
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
