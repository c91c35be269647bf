// Every example in the docs is checked, so a newcomer's first copy-paste is never refused (issue 22):
// README.md and docs/*.md are read with markdown-it, and each fenced block is checked by its language:
// - yaml: every document validates as tetherd validates it — tether's kinds and the core kinds the file
//   source takes through daemon/config/objects.ts (the one schema in daemon/objects/, CEL rules included),
//   an Egress or a tether Service also through its resolver (daemon/egress/egress-spec.ts,
//   daemon/lb/lb-spec.ts) against the pools the docs define; any other Kubernetes kind against its
//   kubernetes-models schema;
// - sh, bash, console: each command is parsed by the program's own parser (tetherctl, tetherd,
//   tether-install: nothing runs against a node), `kubectl kustomize` / `apply -k` / `delete -k` render for
//   real (offline), `kubectl apply -f FILE` needs FILE to exist and validate, a kubectl command naming an
//   object needs the object in the rendered manifests, `bash FILE` / `npm run NAME` need the file or script;
// - json: a conflist loads as libcni loads it and runs tether last.
// A block that cannot be checked is marked `<!-- not-checked: reason -->` on the line before it; there
// may be only a few. Measured figures cite results/: `<!-- results: results/FILE.json#json.path -->` right
// after a figure checks that the figure is the value at that path (rounded as shown), a
// `<!-- results-table: FILE#path -->` before a table that each of its numbers is a value under the path,
// and every cited file is named in the page with the date of its run; each benchmark block (written by
// test/bench/*) is preceded by the marker of its file. The ports table of docs/operations.md must match
// tetherd's defaults and the DaemonSet. The README stays short. Links between the pages must resolve.
// docs/README.md ("Writing these docs") says the same for writers.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { execFileSync } from 'node:child_process';
import { parseArgs } from 'node:util';
import MarkdownIt from 'markdown-it';
import { parse as shellParse } from 'shell-quote';
import { parseAllDocuments, stringify } from 'yaml';
import { parseConfig } from '../../daemon/config/objects';
import { schemaKinds, schemaProblems } from '../../daemon/objects/schema';
import { CRDS } from '../../daemon/objects/crds';
import { validateEgress } from '../../daemon/egress/egress-spec';
import { resolveLoadBalancers } from '../../daemon/lb/lb-spec';
import { parseCommandLine as parseTetherctl } from '../../cmd/tetherctl';
import { checkRedisOption, flowsOption, lbOptions, parseOptions, portOption } from '../../daemon/options';
import { parseOperatorOptions } from '../../operator/options';
import { checkCommandLine as checkTetherInstall } from '../../install/cni/main';
import { confListFromBytes } from '../../install/cni/libcni';
import { BFD_CONTROL_PORT } from '../../daemon/bfd/endpoint';
import { FORMATS } from '../../daemon/formats';
import type { ResolvedPool } from '../../ipam/types';

type Obj = Record<string, any>;
const ROOT = path.join(__dirname, '../..');
/** At most this many blocks may be marked not-checked. */
const MAX_NOT_CHECKED = 5;

// ---------------------------------------------------------------------------------------------------
// Pages and their fenced blocks

interface Block {
  page: string;
  /** 1-based line of the opening fence. */
  line: number;
  lang: string;
  text: string;
  /** The reason given in a `<!-- not-checked: reason -->` on the line before it. */
  notChecked?: string;
}

const md = new MarkdownIt({ html: true });

function pages(): string[] {
  const docs = fs.readdirSync(path.join(ROOT, 'docs')).filter((f) => f.endsWith('.md')).sort().map((f) => `docs/${f}`);
  return ['README.md', ...docs];
}

function read(page: string): string {
  return fs.readFileSync(path.join(ROOT, page), 'utf8');
}

function blocksOf(page: string, text = read(page)): Block[] {
  const lines = text.split('\n');
  return md.parse(text, {}).filter((t) => t.type === 'fence').map((t) => {
    const line = t.map![0] + 1;
    let before = line - 2;
    while (before >= 0 && lines[before].trim() === '') before--;
    const m = before >= 0 ? /^\s*<!--\s*not-checked:\s*(.*?)\s*-->\s*$/.exec(lines[before]) : null;
    return { page, line, lang: t.info.trim().split(/\s+/)[0], text: t.content, notChecked: m ? m[1] || '(no reason)' : undefined };
  });
}

const where = (b: Block) => `${b.page}:${b.line}`;

// ---------------------------------------------------------------------------------------------------
// YAML: what tetherd (or the API server) would say about each document

/** The kinds tetherd's file source reads (daemon/config/objects.ts); the others are checked as Kubernetes objects. */
const CONFIG_KINDS = new Set(['AddressPool', 'Egress', 'Node', 'Pod', 'Service', 'EndpointSlice', 'List']);

function yamlDocs(text: string, label: string): Obj[] {
  const out: Obj[] = [];
  for (const d of parseAllDocuments(text)) {
    if (d.errors.length) throw new Error(`${label}: YAML: ${d.errors[0].message.split('\n')[0]}`);
    const v = d.toJS() as Obj | null;
    if (v !== null && v !== undefined) out.push(v);
  }
  return out;
}

/** Pools an Egress or a Service of the docs may name: the block's, the page's, then conf/pools.yaml's. */
function resolvePools(candidates: Obj[]): ResolvedPool[] {
  const byName = new Map<string, Obj>();
  for (const p of candidates) if (!byName.has(p.metadata?.name)) byName.set(p.metadata?.name, p);
  if (!byName.size) return [];
  return parseConfig([...byName.values()].map((p) => stringify(p)).join('---\n'), 'the pools of the docs').pools;
}

const confPools = () => yamlDocs(fs.readFileSync(path.join(ROOT, 'conf/pools.yaml'), 'utf8'), 'conf/pools.yaml').filter((o) => o.kind === 'AddressPool');

function kubernetesModelProblems(o: Obj): string[] {
  let Model: (new (x: Obj) => { validate(): void }) | undefined;
  try {
    const mod = require(`kubernetes-models/${o.apiVersion}/${o.kind}`) as Record<string, new (x: Obj) => { validate(): void }>;
    Model = mod[o.kind] ?? mod.default;
  } catch {
    return [`${o.apiVersion} ${o.kind}: no schema to check it against (tether's kinds: ${schemaKinds().join(', ')}; or a Kubernetes kind)`];
  }
  try {
    new Model!(o).validate();
    return [];
  } catch (e) {
    return [(e as Error).message.slice(0, 400)];
  }
}

/** Every problem of one YAML text (a block or a file) as tetherd and the API server would see it. */
function yamlProblems(text: string, label: string, pagePools: Obj[]): string[] {
  let docs: Obj[];
  try {
    docs = yamlDocs(text, label);
  } catch (e) {
    return [(e as Error).message];
  }
  if (!docs.length) return [`${label}: no YAML document`];
  const problems: string[] = [];
  const config = docs.filter((o) => CONFIG_KINDS.has(o.kind));
  if (config.length) {
    try {
      parseConfig(config.map((o) => stringify(o)).join('---\n'), label);
    } catch (e) {
      problems.push((e as Error).message);
    }
  }
  for (const o of docs.filter((d) => !CONFIG_KINDS.has(d.kind))) {
    if (typeof o.kind !== 'string') problems.push(`${label}: a document without kind`);
    else if (schemaKinds().includes(o.kind)) problems.push(...schemaProblems(o).map((p) => `${label}: ${o.kind}: ${p}`));
    else problems.push(...kubernetesModelProblems(o).map((p) => `${label}: ${p}`));
  }
  if (problems.length) return problems;
  // What a schema cannot say: the pools an Egress or Service names exist and are of the right usage.
  const items = config.flatMap((o) => (o.kind === 'List' ? (o.items as Obj[]) : [o]));
  const blockPools = items.filter((o) => o.kind === 'AddressPool');
  const pools = resolvePools([...blockPools, ...pagePools, ...confPools()]);
  for (const e of items.filter((o) => o.kind === 'Egress')) {
    try {
      validateEgress(e, { pools });
    } catch (err) {
      problems.push(`${label}: ${(err as Error).message}`);
    }
  }
  for (const r of resolveLoadBalancers(items, pools).refused) problems.push(`${label}: Service ${r.key}: ${r.problems.join('; ')}`);
  return problems;
}

// ---------------------------------------------------------------------------------------------------
// Commands

/** The commands of a block: console blocks' `$ ` lines, every line of sh/bash; `\` continues a line. */
function commandLines(b: Block): string[] {
  const raw = b.text.replace(/\\\n/g, ' ').split('\n');
  const lines = b.lang === 'console' ? raw.filter((l) => l.startsWith('$ ')).map((l) => l.slice(2)) : raw;
  return lines.map((l) => l.trim()).filter((l) => l && !l.startsWith('#'));
}

/** Each simple command of a line as argv (shell-quote: quotes, comments, && ; | split). */
function argvs(line: string): string[][] {
  const out: string[][] = [[]];
  for (const t of shellParse(line, (k) => `$${k}`)) {
    if (typeof t === 'string') out[out.length - 1].push(t);
    else if ('comment' in t) {
      // shell-quote starts a comment at a # inside a word too, where the shell reads it literally.
      const at = line.lastIndexOf(`#${t.comment}`);
      if (at > 0 && !/\s/.test(line[at - 1])) throw new Error(`quote the word holding "#" (${line.slice(0, at + 1).split(/\s/).pop()}…)`);
      break;
    }
    else if ('op' in t && t.op === 'glob') out[out.length - 1].push((t as { pattern: string }).pattern);
    else out.push([]);
  }
  return out.filter((a) => a.length);
}

const renders = new Map<string, Obj[]>();
/** `kubectl kustomize DIR`, for real (offline); the objects it renders. */
function kustomize(dir: string): Obj[] {
  const key = path.normalize(dir);
  if (!renders.has(key)) {
    let out: string;
    try {
      out = execFileSync('kubectl', ['kustomize', path.join(ROOT, dir)], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
    } catch (e) {
      throw new Error(`kubectl kustomize ${dir} failed: ${((e as { stderr?: string }).stderr ?? (e as Error).message).trim()}`);
    }
    renders.set(key, yamlDocs(out, `kubectl kustomize ${dir}`));
  }
  return renders.get(key)!;
}

const KINDS_BY_RESOURCE: Record<string, string> = {
  daemonset: 'DaemonSet', daemonsets: 'DaemonSet', ds: 'DaemonSet',
  deployment: 'Deployment', deployments: 'Deployment', deploy: 'Deployment',
  statefulset: 'StatefulSet', statefulsets: 'StatefulSet', sts: 'StatefulSet',
  configmap: 'ConfigMap', configmaps: 'ConfigMap', cm: 'ConfigMap',
  secret: 'Secret', secrets: 'Secret',
  serviceaccount: 'ServiceAccount', sa: 'ServiceAccount',
  service: 'Service', services: 'Service', svc: 'Service',
  namespace: 'Namespace', ns: 'Namespace',
};
/** Resources `kubectl get` may list without naming one of our objects. */
const LISTABLE = new Set([
  ...CRDS.flatMap((c) => [c.plural, c.singular, ...c.shortNames]),
  ...Object.keys(KINDS_BY_RESOURCE), 'pods', 'pod', 'po', 'nodes', 'node', 'no', 'endpointslices', 'endpointslice', 'events', 'event', 'ev', 'leases', 'lease',
]);

/** An object of the install's manifests (install/, install/ha, install/uninstall), by kind, namespace and name. */
function manifestObject(kind: string, namespace: string | undefined, name: string): Obj {
  for (const dir of ['install', 'install/ha', 'install/uninstall']) {
    const o = kustomize(dir).find((x) => x.kind === kind && x.metadata?.name === name && (namespace === undefined || x.metadata?.namespace === namespace));
    if (o) return o;
  }
  throw new Error(`no ${kind} ${namespace ? `${namespace}/` : ''}${name} in the install manifests`);
}

/** `ds/tetherd` or `daemonset tetherd` → the manifest's object. */
function target(ref: string, ns: string | undefined): Obj {
  const [res, name] = ref.split('/');
  const kind = KINDS_BY_RESOURCE[res];
  if (!kind || !name) throw new Error(`${ref}: not RESOURCE/NAME of a kind the install has`);
  return manifestObject(kind, ns, name);
}

function hasContainer(o: Obj, c: string | undefined): void {
  if (c === undefined) return;
  const spec = o.spec?.template?.spec ?? {};
  const names = [...(spec.containers ?? []), ...(spec.initContainers ?? [])].map((x: Obj) => x.name);
  if (!names.includes(c)) throw new Error(`${o.kind} ${o.metadata.name} has no container ${c} (${names.join(', ')})`);
}

function checkKubectl(args: string[], pagePools: Obj[]): void {
  const dash = args.indexOf('--');
  const own = dash >= 0 ? args.slice(0, dash) : args;
  const { values: v, positionals: p } = parseArgs({
    args: own,
    allowPositionals: true,
    strict: true,
    options: {
      namespace: { type: 'string', short: 'n' },
      kustomize: { type: 'string', short: 'k' },
      filename: { type: 'string', short: 'f', multiple: true },
      container: { type: 'string', short: 'c' },
      output: { type: 'string', short: 'o' },
      selector: { type: 'string', short: 'l' },
      'all-namespaces': { type: 'boolean', short: 'A' },
      watch: { type: 'boolean', short: 'w' },
      wait: { type: 'boolean' },
      timeout: { type: 'string' },
      for: { type: 'string' },
      tail: { type: 'string' },
    },
  });
  const [verb, ...rest] = p;
  const ns = v.namespace;
  switch (verb) {
    case 'kustomize':
      if (rest.length !== 1) throw new Error('kubectl kustomize takes one directory');
      kustomize(rest[0]);
      return;
    case 'apply':
    case 'create':
    case 'delete':
      if (v.kustomize !== undefined) return void kustomize(v.kustomize);
      if (v.filename) {
        for (const f of v.filename) {
          const file = path.join(ROOT, f);
          if (!fs.existsSync(file)) throw new Error(`-f ${f}: no such file in the repository`);
          const text = fs.readFileSync(file, 'utf8');
          const problems = yamlProblems(text, f, pagePools);
          // A cluster knows tether.dev's custom resources only; Node and Pod objects of tetherd's file are not.
          for (const o of yamlDocs(text, f)) {
            if (String(o.apiVersion).startsWith('tether.dev/') && !CRDS.some((c) => c.kind === o.kind)) problems.push(`${f}: ${o.kind} ${o.metadata?.name}: not a custom resource (tetherd's config file only)`);
          }
          if (problems.length) throw new Error(problems.join('\n'));
        }
        return;
      }
      if (verb === 'delete' && v.selector !== undefined) {
        // RESOURCE -l key=value: must select at least one object of the install's manifests.
        const kind = KINDS_BY_RESOURCE[rest[0] ?? ''];
        if (rest.length !== 1 || !kind) throw new Error(`kubectl delete -l: give one RESOURCE of a kind the install has`);
        const [key, value] = v.selector.split('=');
        const hit = ['install', 'install/ha', 'install/uninstall'].some((dir) => kustomize(dir).some((x) => x.kind === kind && (ns === undefined || x.metadata?.namespace === ns) && x.metadata?.labels?.[key] === value));
        if (!hit) throw new Error(`kubectl delete ${rest[0]} -l ${v.selector}: selects no object of the install`);
        return;
      }
      if (verb === 'delete' && rest.length === 2 && !rest[0].includes('/')) return void manifestObject(KINDS_BY_RESOURCE[rest[0]] ?? '?', ns, rest[1]);
      if (verb === 'delete' && rest.length >= 1 && rest.every((r) => r.includes('/'))) return void rest.forEach((r) => target(r, ns));
      throw new Error(`kubectl ${verb}: give -k DIR, -f FILE or an object of the install`);
    case 'get':
    case 'describe':
      if (!rest.length || !LISTABLE.has(rest[0].split('/')[0])) throw new Error(`kubectl ${verb} ${rest[0] ?? ''}: not a resource tether has or uses`);
      return;
    case 'events':
      if (v.for !== undefined && !LISTABLE.has(v.for.split('/')[0])) throw new Error(`kubectl events --for ${v.for}: not a resource tether has or uses`);
      return;
    case 'rollout':
      if (!['restart', 'status', 'undo'].includes(rest[0])) throw new Error(`kubectl rollout ${rest[0]}: not checked here`);
      target(rest[1], ns);
      return;
    case 'exec':
    case 'logs': {
      const o = target(rest[0], ns);
      hasContainer(o, v.container);
      if (verb === 'exec') {
        if (dash < 0) throw new Error('kubectl exec: the command goes after --');
        checkArgv(args.slice(dash + 1), pagePools);
      }
      return;
    }
    default:
      throw new Error(`kubectl ${verb}: no check for this subcommand (mark the block not-checked, or add one)`);
  }
}

function checkTetherd(args: string[]): void {
  const o = parseOptions(args);
  if (o.help) return;
  portOption('fou-port', o['fou-port']);
  portOption('sync-port', o['sync-port']);
  if (o['probe-port'] !== '0') portOption('probe-port', o['probe-port']);
  if (o['health-port'] !== '0') portOption('health-port', o['health-port']);
  flowsOption(o['egress-flows']);
  checkRedisOption(o);
  lbOptions(o);
  if (!['mount', 'host'].includes(o.bpffs)) throw new Error(`--bpffs ${o.bpffs}: mount or host`);
  if (o.config !== undefined && !fs.existsSync(path.join(ROOT, o.config)) && !path.isAbsolute(o.config)) throw new Error(`--config ${o.config}: no such file`);
}

/** One command, checked without running anything on a node. */
function checkArgv(argv: string[], pagePools: Obj[]): void {
  const a = [...argv];
  while (a.length && /^[A-Z_][A-Z0-9_]*=/.test(a[0])) a.shift(); // environment assignments
  if (a[0] === 'sudo') a.shift();
  const [cmd, ...args] = a;
  switch (path.basename(cmd)) {
    case 'tetherctl': {
      parseTetherctl(args);
      return;
    }
    case 'tetherd':
      return checkTetherd(args);
    case 'tether-operator':
      parseOperatorOptions(args);
      return;
    case 'tether-install':
      return checkTetherInstall(args);
    case 'kubectl':
      return checkKubectl(args, pagePools);
    case 'bash':
    case 'sh':
    case 'tsx':
      if (!args[0] || !fs.existsSync(path.join(ROOT, args[0]))) throw new Error(`${cmd} ${args[0] ?? ''}: no such file in the repository`);
      return;
    case 'cd':
      if (!args[0] || !fs.statSync(path.join(ROOT, args[0]), { throwIfNoEntry: false })?.isDirectory()) throw new Error(`cd ${args[0] ?? ''}: no such directory`);
      return;
    case 'npm': {
      const scripts = (JSON.parse(fs.readFileSync(path.join(ROOT, 'package.json'), 'utf8')) as Obj).scripts as Record<string, string>;
      const name = args[0] === 'run' ? args[1] : args[0];
      if (args[0] === 'ci' || args[0] === 'install') return;
      if (!scripts[name]) throw new Error(`npm ${args.join(' ')}: package.json has no script ${name}`);
      return;
    }
    default:
      throw new Error(`${cmd}: no check for this program (mark the block not-checked, or add one)`);
  }
}

function commandProblems(b: Block, pagePools: Obj[]): string[] {
  const problems: string[] = [];
  const lines = commandLines(b);
  if (!lines.length) problems.push(`${where(b)}: a ${b.lang} block without a command`);
  for (const line of lines) {
    try {
      for (const argv of argvs(line)) checkArgv(argv, pagePools);
    } catch (e) {
      problems.push(`${where(b)}: \`${line}\`: ${(e as Error).message}`);
    }
  }
  return problems;
}

// ---------------------------------------------------------------------------------------------------
// All blocks

function pagePoolsOf(page: string): Obj[] {
  return blocksOf(page)
    .filter((b) => b.lang === 'yaml' && !b.notChecked)
    .flatMap((b) => {
      try {
        return yamlDocs(b.text, where(b));
      } catch {
        return [];
      }
    })
    .flatMap((o) => (o.kind === 'List' && Array.isArray(o.items) ? o.items : [o]))
    .filter((o) => o?.kind === 'AddressPool');
}

/** Every problem of one block; `undefined` for a block of a language that holds no example (text output). */
function blockProblems(b: Block, pagePools: Obj[]): string[] | undefined {
  switch (b.lang) {
    case 'yaml':
    case 'yml':
      return yamlProblems(b.text, where(b), pagePools);
    case 'sh':
    case 'bash':
    case 'shell':
    case 'console':
      return commandProblems(b, pagePools);
    case 'json': {
      let v: Obj;
      try {
        v = JSON.parse(b.text) as Obj;
      } catch (e) {
        return [`${where(b)}: JSON: ${(e as Error).message}`];
      }
      if (!Array.isArray(v.plugins)) return [`${where(b)}: a JSON block is a conflist here (plugins), nothing else is checked`];
      const r = confListFromBytes(Buffer.from(b.text));
      if (!r.ok) return [`${where(b)}: libcni: ${r.error}`];
      const last = (v.plugins as Obj[])[v.plugins.length - 1];
      return last?.type === 'tether' ? [] : [`${where(b)}: the conflist does not run tether last`];
    }
    case 'text':
      return undefined;
    default:
      return [`${where(b)}: fenced block of language "${b.lang}": give yaml, sh, bash, console, json, or text for output`];
  }
}

test('every fenced yaml, command and conflist in README.md and docs/ is accepted', () => {
  const problems: string[] = [];
  const counts: Record<string, number> = {};
  for (const page of pages()) {
    const pagePools = pagePoolsOf(page);
    for (const b of blocksOf(page)) {
      if (b.notChecked) continue;
      const p = blockProblems(b, pagePools);
      if (p === undefined) continue;
      counts[b.lang] = (counts[b.lang] ?? 0) + 1;
      problems.push(...p);
    }
  }
  assert.equal(problems, [], problems.join('\n'));
  // The docs hold examples of each kind: a test that found none would pass vacuously.
  assert.ok((counts.yaml ?? 0) >= 8, `only ${counts.yaml ?? 0} yaml blocks checked`);
  assert.ok((counts.sh ?? 0) + (counts.console ?? 0) + (counts.bash ?? 0) >= 8, `only ${JSON.stringify(counts)} command blocks checked`);
});

test(`at most ${MAX_NOT_CHECKED} blocks are marked not-checked, each with its reason`, () => {
  const marked = pages().flatMap((p) => blocksOf(p)).filter((b) => b.notChecked);
  assert.ok(marked.length <= MAX_NOT_CHECKED, `${marked.length} blocks not checked:\n${marked.map((b) => `${where(b)}: ${b.notChecked}`).join('\n')}`);
  for (const b of marked) assert.ok(b.notChecked!.length >= 10, `${where(b)}: say why it cannot be checked`);
});

// The checks themselves fail on what tetherd refuses (a check that cannot fail proves nothing).
test('the checks refuse a bad example of each kind', () => {
  const b = (lang: string, text: string): Block => ({ page: 'x.md', line: 1, lang, text });
  const bad = (lang: string, text: string, re: RegExp) => {
    const p = blockProblems(b(lang, text), []) ?? [];
    assert.ok(p.some((x) => re.test(x)), `${lang} ${JSON.stringify(text)} gave ${JSON.stringify(p)}`);
  };
  const egress = (clients: string, pool = 'floating') => `apiVersion: tether.dev/v1alpha1
kind: Egress
metadata: { name: out, namespace: shop }
spec:
  clients: ${clients}
  gateways: { podSelector: { matchLabels: { role: egress-gw } } }
  addresses: { pool: ${pool}, count: 1 }
`;
  assert.equal(blockProblems(b('yaml', egress('{ podSelector: { matchLabels: { app: web } } }')), []), []);
  // The README's old example (issue 22): selectors are matchLabels.
  bad('yaml', egress('{ podSelector: { app: web } }'), /unknown field spec\.clients\.podSelector\.app/);
  bad('yaml', egress('{ podSelector: { matchLabels: { app: web } } }', 'float'), /float/);
  bad('yaml', 'apiVersion: tether.dev/v1alpha1\nkind: AddressPool\nmetadata: { name: p }\nspec: { usage: floating, ipv4: { cidr: 10.9.0.0/24, blockSize: 26 } }\n', /blockSize applies to pod pools only/);
  bad('yaml', 'apiVersion: apps/v1\nkind: DaemonSet\nmetadata: { name: x }\nspec: { template: {} }\n', /selector/);
  bad('yaml', 'apiVersion: example.com/v1\nkind: Widget\nmetadata: { name: x }\n', /no schema/);
  bad('sh', 'tetherctl address allocate --pool floating', /--owner/);
  bad('sh', 'tetherctl stauts', /not a command/);
  bad('sh', 'tetherctl address allocate --pool floating --owner egress/shop/out#0 --count one', /quote the word/);
  bad('sh', "tetherctl address allocate --pool floating --owner 'egress/shop/out#0' --count one", /--count "one"/);
  bad('sh', 'tetherd --fou-port 70000', /fou-port/);
  bad('sh', 'tetherd --no-such-flag', /no-such-flag/);
  bad('sh', 'tether-install install --runtime docker', /runtime/);
  bad('sh', 'kubectl apply -k install/nowhere', /kubectl kustomize install\/nowhere failed/);
  bad('sh', 'kubectl apply -f conf/nowhere.yaml', /no such file/);
  bad('sh', 'kubectl apply -f conf/pools.yaml', /Node node-1: not a custom resource/);
  bad('sh', 'kubectl -n tether-system delete daemonset tetherdd', /no DaemonSet tether-system\/tetherdd/);
  bad('sh', 'kubectl -n tether-system exec ds/tetherd -c tetherd -- tetherctl statsu', /not a command/);
  bad('sh', 'kubectl -n tether-system logs ds/tetherd -c nope', /no container nope/);
  bad('sh', 'kubectl -n shop events --for egres/out', /not a resource/);
  bad('sh', 'bash test/nowhere.sh', /no such file/);
  bad('sh', 'npm run nowhere', /no script nowhere/);
  bad('sh', 'curl http://example.com', /no check for this program/);
  bad('console', '$ tetherctl --count 1\n{ "output": "not checked" }', /takes no --count/);
  bad('json', '{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"tether"},{"type":"ptp"}]}', /tether last/);
  bad('python', 'print(1)', /language "python"/);
  // A not-checked mark is read from the line before the fence.
  const marked = blocksOf('x.md', 'a\n\n<!-- not-checked: needs a node with containerd -->\n```sh\nctr images ls\n```\n\n```sh\nctr images ls\n```\n');
  assert.equal(marked.map((m) => m.notChecked), ['needs a node with containerd', undefined]);
});

// ---------------------------------------------------------------------------------------------------
// The README: short, and the two commands as CI runs them

test('README.md is short and gives the two commands exactly; .ci/run runs the test command', () => {
  const readme = read('README.md');
  const lines = readme.split('\n').length;
  assert.ok(lines < 250, `README.md has ${lines} lines`);
  const sh = blocksOf('README.md').filter((b) => b.lang === 'sh').map((b) => commandLines(b)).flat();
  assert.ok(sh.some((l) => /^bash test\/demo\.sh(\s|$)/.test(l)), 'the demo command');
  assert.ok(sh.some((l) => /^bash test\/run\.sh(\s|$)/.test(l)), 'the test command');
  assert.match(fs.readFileSync(path.join(ROOT, '.ci/run'), 'utf8'), /^bash test\/run\.sh$/m);
});

// ---------------------------------------------------------------------------------------------------
// Links between the pages

/** GitHub's anchor of a heading. */
function slug(heading: string): string {
  return heading.trim().toLowerCase().replace(/[^\p{L}\p{N}\s_-]/gu, '').replace(/\s/g, '-');
}

function anchorsOf(page: string): Set<string> {
  const seen = new Map<string, number>();
  const out = new Set<string>();
  const tokens = md.parse(read(page), {});
  tokens.forEach((t, i) => {
    if (t.type !== 'heading_open') return;
    const text = (tokens[i + 1].children ?? []).filter((c) => c.type === 'text' || c.type === 'code_inline').map((c) => c.content).join('');
    const s = slug(text);
    const n = seen.get(s) ?? 0;
    seen.set(s, n + 1);
    out.add(n ? `${s}-${n}` : s);
  });
  return out;
}

test('every link between the pages (and to files of the repository) resolves', () => {
  const problems: string[] = [];
  let links = 0;
  for (const page of pages()) {
    const walk = (ts: ReturnType<typeof md.parse>) => {
      for (const t of ts) {
        if (t.children) walk(t.children);
        if (t.type !== 'link_open') continue;
        const href = String(t.attrGet('href') ?? '');
        if (/^[a-z]+:/i.test(href)) continue;
        links++;
        const [file, anchor] = href.split('#');
        const target = file ? path.normalize(path.join(path.dirname(page), file)) : page;
        if (!fs.existsSync(path.join(ROOT, target))) {
          problems.push(`${page}: link ${href}: no ${target}`);
          continue;
        }
        if (anchor && target.endsWith('.md') && !anchorsOf(target).has(anchor)) problems.push(`${page}: link ${href}: no heading #${anchor} in ${target}`);
      }
    };
    walk(md.parse(read(page), {}));
  }
  assert.equal(problems, [], problems.join('\n'));
  assert.ok(links >= 20, `only ${links} links`);
});

test('every repository path docs/architecture.md names in code spans exists', () => {
  const text = read('docs/architecture.md');
  const named = [...text.matchAll(/`([a-z][\w.-]*\/[\w./-]*)`/g)].map((m) => m[1]).filter((p) => /\.(ts|c|md)$|\/$/.test(p));
  assert.ok(named.length >= 25, `only ${named.length} paths named`);
  const missing = named.filter((p) => !fs.existsSync(path.join(ROOT, p)));
  assert.equal(missing, [], `named in docs/architecture.md but absent: ${missing.join(', ')}`);
});

// ---------------------------------------------------------------------------------------------------
// Measured figures cite results/

interface Citation {
  page: string;
  line: number;
  file: string;
  jsonPath?: string;
  /** The text before the marker (up to 200 characters, other markers left out): the figure is its last number. */
  before: string;
  /** A `results-table` marker: every number of the table after it (but its first column) is in the file. */
  table?: string[][];
}

/** `<!-- results: FILE#PATH -->` after a figure, `<!-- results-table: FILE#PATH -->` on the line before a table. */
function citations(page: string, text = read(page)): Citation[] {
  const out: Citation[] = [];
  const re = /<!--\s*(results|results-table):\s*(\S+?)(?:#(\S+))?\s*-->/g;
  let m;
  while ((m = re.exec(text))) {
    if (text[m.index - 1] === '`') continue; // shown in a code span, as docs/README.md explains the markers
    const line = text.slice(0, m.index).split('\n').length;
    const before = text.slice(Math.max(0, m.index - 200), m.index).replace(/<!--[\s\S]*?-->/g, '');
    const c: Citation = { page, line, file: m[2], jsonPath: m[3], before };
    if (m[1] === 'results-table') {
      const rows = text.slice(m.index + m[0].length).replace(/^\s*\n/, '').split('\n');
      const end = rows.findIndex((r) => !r.startsWith('|'));
      c.table = rows.slice(2, end < 0 ? undefined : end).map((r) => r.split('|').slice(2, -1));
    }
    out.push(c);
  }
  return out;
}

function at(json: unknown, p: string): unknown {
  let v: unknown = json;
  for (const k of p.split('.')) {
    const idx = /^(.*?)\[(\d+)\]$/.exec(k);
    if (idx) v = ((v as Obj)?.[idx[1]] as unknown[])?.[Number(idx[2])];
    else v = (v as Obj)?.[k];
  }
  return v;
}

/** Every number under `v`. */
function leaves(v: unknown): number[] {
  if (typeof v === 'number') return [v];
  if (v && typeof v === 'object') return Object.values(v).flatMap(leaves);
  return [];
}

/** The date (YYYY-MM-DD) of the run a value at `p` came from: the nearest `date` on its path, else machine.date. */
function runDate(json: Obj, p: string | undefined): string | undefined {
  const parts = p ? p.split('.') : [];
  for (let n = parts.length - 1; n >= 1; n--) {
    const d = at(json, [...parts.slice(0, n), 'date'].join('.'));
    if (typeof d === 'string') return d.slice(0, 10);
  }
  const d = json.machine?.date ?? json.date;
  return typeof d === 'string' ? d.slice(0, 10) : undefined;
}

/** The last number written before the marker: `56 ms`, `1,234`, `**0.96×**`, `100 %`. */
function lastFigure(text: string): string | undefined {
  const nums = text.replace(/\*\*/g, '').match(/-?\d[\d,]*(?:\.\d+)?/g);
  return nums?.[nums.length - 1];
}

/** Whether `shown` is `value` as written: `value` rounded to the decimals shown. */
function sameFigure(shown: string, value: unknown): boolean {
  if (typeof value !== 'number') return false;
  const decimals = (shown.split('.')[1] ?? '').length;
  return Number(value.toFixed(decimals)) === Number(shown.replace(/,/g, ''));
}

function citationProblems(cs: Citation[], pageText: (page: string) => string): string[] {
  const problems: string[] = [];
  for (const c of cs) {
    const label = `${c.page}:${c.line}`;
    if (!/^results\/[^/]+\.json$/.test(c.file)) {
      problems.push(`${label}: ${c.file}: cite a file of results/`);
      continue;
    }
    const file = path.join(ROOT, c.file);
    if (!fs.existsSync(file)) {
      problems.push(`${label}: ${c.file} does not exist`);
      continue;
    }
    const json = JSON.parse(fs.readFileSync(file, 'utf8')) as Obj;
    const date = runDate(json, c.jsonPath);
    // What a reader sees: the page without its comments (the markers).
    const text = pageText(c.page).replace(/<!--[\s\S]*?-->/g, '');
    if (!text.includes(c.file)) problems.push(`${label}: ${c.page} does not name ${c.file} for its readers`);
    if (date && !text.includes(date)) problems.push(`${label}: ${c.page} does not give the date of the run ${c.file} holds (${date})`);
    if (c.jsonPath === undefined) continue;
    const v = at(json, c.jsonPath);
    if (v === undefined) {
      problems.push(`${label}: ${c.file} has nothing at ${c.jsonPath}`);
      continue;
    }
    if (c.table) {
      const values = leaves(v);
      if (!c.table.length) problems.push(`${label}: no table after the results-table marker`);
      for (const row of c.table) {
        for (const cell of row) {
          for (const shown of cell.replace(/\*\*/g, '').match(/-?\d[\d,]*(?:\.\d+)?/g) ?? []) {
            if (!values.some((x) => sameFigure(shown, x))) problems.push(`${label}: ${shown} (row ${row.join('|').trim()}) is nowhere in ${c.file}#${c.jsonPath}`);
          }
        }
      }
      continue;
    }
    const shown = lastFigure(c.before);
    if (shown === undefined) problems.push(`${label}: no figure before the marker for ${c.file}#${c.jsonPath}`);
    else if (!sameFigure(shown, v)) problems.push(`${label}: the docs say ${shown}, ${c.file}#${c.jsonPath} says ${JSON.stringify(v)}`);
  }
  return problems;
}

test('every figure cited from results/ is the value in the cited file, and the page names the file and its run', () => {
  const all = pages().flatMap((p) => citations(p));
  const problems = citationProblems(all, read);
  assert.equal(problems, [], problems.join('\n'));
  assert.ok(all.filter((c) => c.jsonPath).length >= 15, `only ${all.filter((c) => c.jsonPath).length} figures cited`);
  // Every benchmark block (written by test/bench/*) names the file its figures are in.
  for (const page of pages()) {
    const text = read(page);
    for (const m of text.matchAll(/<!-- bench:([\w-]+):start -->([\s\S]*?)<!-- bench:\1:end -->/g)) {
      const before = text.slice(0, m.index).trimEnd().split('\n').pop() ?? '';
      const cited = /<!--\s*results:\s*(\S+?)\s*-->/.exec(before);
      assert.ok(cited, `${page}: bench block ${m[1]}: put <!-- results: results/FILE.json --> on the line before it`);
    }
  }
});

test('a figure that is not the value in its results file is caught', () => {
  const page = 'x.md';
  const text = 'Gap p50 57 ms <!-- results: results/bench-egress.json#withSync.gapMs.p50 --> (`results/bench-egress.json`, run of 2026-11-24).\n';
  const p = citationProblems(citations(page, text), () => text);
  assert.match(p.join('\n'), /the docs say 57, results\/bench-egress\.json#withSync\.gapMs\.p50 says 56/);
  const ok = text.replace('57 ms', '56 ms');
  assert.equal(citationProblems(citations(page, ok), () => ok), []);
  const noDate = ok.replace('2026-11-24', 'November');
  assert.match(citationProblems(citations(page, noDate), () => noDate).join('\n'), /date of the run/);
  const gone = 'x 1 <!-- results: results/bench-nowhere.json#a --> `results/bench-nowhere.json`\n';
  assert.match(citationProblems(citations(page, gone), () => gone).join('\n'), /does not exist/);
  assert.ok(sameFigure('0.96', 0.96) && sameFigure('33,270', 33269.8) && sameFigure('1.4', 1.37) && sameFigure('13', 12.5));
  assert.not.ok(sameFigure('1.3', 1.37) || sameFigure('12', 12.5) || sameFigure('56', '56'));
});

// ---------------------------------------------------------------------------------------------------
// The ports tetherd opens (docs/operations.md) are the code's and the DaemonSet's

test('the ports table in docs/operations.md matches the defaults, the DaemonSet and the BFD port', () => {
  const text = read('docs/operations.md');
  const table = /<!-- ports:start -->([\s\S]*?)<!-- ports:end -->/.exec(text);
  assert.ok(table, 'docs/operations.md: the ports table between <!-- ports:start --> and <!-- ports:end -->');
  const rows = table![1].split('\n').filter((l) => /^\|\s*`?\d+\/(udp|tcp)/i.test(l) || /^\|\s*`?127\.0\.0\.1:\d+/.test(l));
  const ds = manifestObject('DaemonSet', 'tether-system', 'tetherd');
  const c = (ds.spec.template.spec.containers as Obj[]).find((x) => x.name === 'tetherd')!;
  const flagValue = (flag: string): string | undefined => {
    const arg = (c.command as string[]).find((a) => a.startsWith(`${flag}=`));
    if (arg) return arg.slice(flag.length + 1);
    return (parseOptions([]) as Record<string, unknown>)[flag.slice(2)] as string | undefined;
  };
  const problems: string[] = [];
  const documented = new Set<string>();
  for (const r of rows) {
    const m = /(\d+)\/(udp|tcp)/i.exec(r)!;
    const port = m[1];
    const proto = m[2].toUpperCase();
    documented.add(`${port}/${proto}`);
    const cells = r.split('|');
    const flag = /`(--[a-z-]+)`/.exec(cells[cells.length - 2] ?? '')?.[1]; // the "set by" column
    if (flag) {
      const v = flagValue(flag)?.split(':').pop(); // a port, or HOST:PORT
      if (v !== port) problems.push(`${port}/${proto}: ${flag} is ${v} in the DaemonSet (or by default)`);
    } else if (Number(port) !== BFD_CONTROL_PORT) problems.push(`${port}/${proto}: name the flag that sets it`);
  }
  for (const p of (c.ports ?? []) as Obj[]) {
    if (!documented.has(`${p.containerPort}/${p.protocol ?? 'TCP'}`)) problems.push(`the DaemonSet declares ${p.containerPort}/${p.protocol}, the table does not list it`);
  }
  assert.equal(problems, [], problems.join('\n'));
  assert.ok(documented.has(`${BFD_CONTROL_PORT}/UDP`), 'the BFD port');
});

test('docs/upgrade.md\'s formats table names every entry of daemon/formats.ts with its kind and versions', () => {
  const text = read('docs/upgrade.md');
  const m = /<!-- formats:start -->\n([\s\S]*?)<!-- formats:end -->/.exec(text);
  assert.ok(m, 'docs/upgrade.md has a table between <!-- formats:start --> and <!-- formats:end -->');
  const rows = new Map<string, string[]>();
  for (const line of m[1].split('\n').slice(2).filter((l) => l.startsWith('|'))) {
    const cells = line.split('|').slice(1, -1).map((c) => c.trim());
    const name = /^`([^`]+)`$/.exec(cells[0])?.[1];
    assert.ok(name, `a row's first cell is a format name in backticks: ${line}`);
    assert.not.ok(rows.has(name), `${name} has one row`);
    rows.set(name, cells);
  }
  for (const f of FORMATS) {
    const r = rows.get(f.name);
    assert.ok(r, `docs/upgrade.md has no row for ${f.name}`);
    assert.equal([r[1], r[2], r[3]], [f.kind, String(f.version), f.reads.join(', ')], `${f.name}: kind, version and reads as in the registry`);
  }
  for (const name of rows.keys()) assert.ok(FORMATS.some((f) => f.name === name), `docs/upgrade.md lists ${name}, which the registry does not`);
});

test('no section is left unwritten (no TODO marker in README.md or docs/)', () => {
  const files = ['README.md', ...fs.readdirSync(path.join(ROOT, 'docs')).filter((f) => f.endsWith('.md')).map((f) => `docs/${f}`)];
  const left = files.flatMap((f) => fs.readFileSync(path.join(ROOT, f), 'utf8').split('\n').map((l, i) => (/\bTODO\b/.test(l) ? `${f}:${i + 1}: ${l.trim()}` : '')).filter(Boolean));
  assert.equal(left, []);
});

test.run();
