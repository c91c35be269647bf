// The floors of the code base (docs/architecture.md): every source file belongs to one floor, and a file
// imports only files of its own floor or of floors below it, with no cycle between files. The order is
// written here once; docs/architecture.md lists the same floors in the same order (checked below), so the
// page a newcomer reads is the rule the build keeps.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import * as fs from 'node:fs';
import * as path from 'node:path';

const ROOT = path.resolve(__dirname, '../..');

/**
 * Bottom to top. A floor is a folder (ending in '/') or one file. A file may import its own floor and
 * every floor listed before it; nothing listed after it.
 */
export const FLOORS: readonly string[] = [
  'lib/', // shared by the CNI clients and tetherd: errors, log, version, CNI spec, socket API, IP, files
  'cni/', // the CNI clients' core (request, socket call, delete queue), no daemon code
  'daemon/util/',
  'daemon/sys/',
  'daemon/state/',
  'daemon/netlink/',
  'daemon/bpf/',
  'daemon/conntrack/',
  'daemon/conntrack-sync/',
  'daemon/bfd/',
  'daemon/lifecycle.ts',
  'daemon/objects/', // CRDs, the one schema, core-object names
  'daemon/common/', // the store's clients and registries
  'install/', // tether-install and the node clean-up
  'ipam/',
  'daemon/config/', // the config source: files or the Kubernetes API
  'daemon/pod/',
  'daemon/health/',
  'daemon/lb/',
  'daemon/egress/',
  'daemon/kube/',
  'daemon/metrics/',
  'daemon/server.ts',
  'daemon/formats.ts',
  'daemon/options.ts',
  'daemon/parts/',
  'daemon/main.ts',
  'operator/', // tether-operator: the cluster's controllers, wired like daemon/main.ts
  'cmd/', // entry points: thin mains
];

/** Folders holding the project's own TypeScript (tests, fixtures and generated code are not floors). */
const SOURCE_ROOTS = ['cmd', 'lib', 'cni', 'ipam', 'daemon', 'install', 'operator'];

export function floorOf(file: string, floors: readonly string[] = FLOORS): number {
  let best = -1;
  let bestLen = -1;
  floors.forEach((f, i) => {
    const hit = f.endsWith('/') ? file.startsWith(f) : file === f;
    if (hit && f.length > bestLen) {
      best = i;
      bestLen = f.length;
    }
  });
  return best;
}

const IMPORT_RE = /(?:^|[^\w.$])(?:import|export)\s+(?:type\s+)?(?:[\w*${}\s,]+?\s+from\s+)?['"](\.{1,2}\/[^'"]+)['"]|(?:require|import)\s*\(\s*['"](\.{1,2}\/[^'"]+)['"]\s*\)/g;

/** The project files a source file imports (relative specifiers resolved to repository paths). */
export function importsOf(file: string, text: string, exists: (p: string) => boolean): string[] {
  const out = new Set<string>();
  // Comment lines are not imports (a header may quote one); an import never shares a line with a comment's start.
  const code = text.split('\n').filter((l) => !/^\s*(\/\/|\/\*|\*)/.test(l)).join('\n');
  for (const m of code.matchAll(IMPORT_RE)) {
    const spec = m[1] ?? m[2];
    const base = path.posix.normalize(path.posix.join(path.posix.dirname(file), spec));
    const hit = [`${base}.ts`, base, `${base}/index.ts`, `${base}.js`].find(exists);
    if (hit !== undefined) out.add(hit);
  }
  return [...out];
}

/** Every import that runs against the floor order, and every file outside the floors. */
export function againstTheGrain(graph: Map<string, string[]>, floors: readonly string[] = FLOORS): string[] {
  const problems: string[] = [];
  for (const [file, targets] of graph) {
    const from = floorOf(file, floors);
    if (from < 0) {
      problems.push(`${file}: on no floor (add its folder to FLOORS and docs/architecture.md)`);
      continue;
    }
    for (const t of targets) {
      const to = floorOf(t, floors);
      if (to < 0) continue; // package.json and other data
      if (to > from) problems.push(`${file} (${floors[from]}) imports ${t} (${floors[to]}), a floor above it`);
    }
  }
  return problems.sort();
}

/** File cycles (strongly connected components of more than one file, or a file importing itself). */
export function cycles(graph: Map<string, string[]>): string[][] {
  let index = 0;
  const idx = new Map<string, number>();
  const low = new Map<string, number>();
  const stack: string[] = [];
  const on = new Set<string>();
  const found: string[][] = [];
  const visit = (v: string): void => {
    idx.set(v, index);
    low.set(v, index++);
    stack.push(v);
    on.add(v);
    for (const w of graph.get(v) ?? []) {
      if (!graph.has(w)) continue;
      if (!idx.has(w)) {
        visit(w);
        low.set(v, Math.min(low.get(v)!, low.get(w)!));
      } else if (on.has(w)) low.set(v, Math.min(low.get(v)!, idx.get(w)!));
    }
    if (low.get(v) === idx.get(v)) {
      const scc: string[] = [];
      let w: string;
      do {
        w = stack.pop()!;
        on.delete(w);
        scc.push(w);
      } while (w !== v);
      if (scc.length > 1 || (graph.get(v) ?? []).includes(v)) found.push(scc.sort());
    }
  };
  for (const v of [...graph.keys()].sort()) if (!idx.has(v)) visit(v);
  return found;
}

function sourceFiles(): string[] {
  const out: string[] = [];
  const walk = (dir: string): void => {
    for (const e of fs.readdirSync(path.join(ROOT, dir), { withFileTypes: true })) {
      const rel = `${dir}/${e.name}`;
      if (e.isDirectory()) {
        if (e.name !== 'node_modules') walk(rel);
      } else if (/\.(ts|js)$/.test(e.name) && !e.name.endsWith('.d.ts')) out.push(rel);
    }
  };
  for (const r of SOURCE_ROOTS) walk(r);
  return out.sort();
}

function projectGraph(): Map<string, string[]> {
  const exists = (p: string): boolean => fs.existsSync(path.join(ROOT, p)) && fs.statSync(path.join(ROOT, p)).isFile();
  const graph = new Map<string, string[]>();
  for (const f of sourceFiles()) graph.set(f, importsOf(f, fs.readFileSync(path.join(ROOT, f), 'utf8'), exists));
  return graph;
}

test('no import runs against the floor order, and every source file is on a floor', () => {
  const graph = projectGraph();
  assert.ok(graph.size > 150, `read ${graph.size} source files`);
  const problems = againstTheGrain(graph);
  assert.equal(problems, [], `imports against the floors (docs/architecture.md):\n${problems.join('\n')}`);
});

test('no two source files import each other, directly or around a circle', () => {
  const found = cycles(projectGraph());
  assert.equal(found, [], `file cycles:\n${found.map((c) => c.join(' -> ')).join('\n')}`);
});

test('the checks catch an import up a floor, a file on no floor, a cycle, and read every import form', () => {
  const files = new Set(['lib/a.ts', 'daemon/lb/b.ts', 'daemon/egress/c.ts', 'daemon/egress/d.ts', 'cmd/e.ts']);
  const exists = (p: string): boolean => files.has(p);
  const text = [
    "import { x } from '../../lib/a';",
    "import type { Y } from '../egress/c';",
    "export { z } from './d';",
    "const m = require('../../cmd/e') as typeof import('../../cmd/e');",
    "// import { q } from '../lb/b';  (a comment, not an import)",
    "const lazy = () => import('../lb/b');",
  ].join('\n');
  assert.equal(importsOf('daemon/egress/d.ts', text, exists).sort(), ['cmd/e.ts', 'daemon/egress/c.ts', 'daemon/egress/d.ts', 'daemon/lb/b.ts', 'lib/a.ts']);
  const graph = new Map<string, string[]>([
    ['lib/a.ts', ['daemon/lb/b.ts']],
    ['daemon/lb/b.ts', ['lib/a.ts']],
    ['daemon/egress/c.ts', ['daemon/egress/d.ts']],
    ['daemon/egress/d.ts', ['daemon/egress/c.ts']],
    ['elsewhere/f.ts', []],
  ]);
  const problems = againstTheGrain(graph);
  assert.ok(problems.some((p) => p.startsWith('lib/a.ts (lib/) imports daemon/lb/b.ts')), problems.join('\n'));
  assert.ok(problems.some((p) => p.startsWith('elsewhere/f.ts: on no floor')), problems.join('\n'));
  assert.not.ok(problems.some((p) => p.startsWith('daemon/lb/b.ts')), 'a downward import is allowed');
  assert.equal(cycles(graph), [['daemon/egress/c.ts', 'daemon/egress/d.ts'], ['daemon/lb/b.ts', 'lib/a.ts']]);
  assert.equal(floorOf('daemon/main.ts'), FLOORS.indexOf('daemon/main.ts'));
  assert.equal(floorOf('daemon/lb/maglev.ts'), FLOORS.indexOf('daemon/lb/'));
});

test('every floor names a folder or file that exists', () => {
  const missing = FLOORS.filter((f) => !fs.existsSync(path.join(ROOT, f)));
  assert.equal(missing, [], 'floors that name nothing');
});

test('docs/architecture.md lists the floors in this order, top floor first', () => {
  const page = fs.readFileSync(path.join(ROOT, 'docs/architecture.md'), 'utf8');
  const table = page.split('\n').filter((l) => /^\|\s*\d+\s*\|/.test(l));
  const listed = table.map((l) => l.split('|')[2].trim().replace(/`/g, ''));
  assert.equal(listed, [...FLOORS].reverse(), 'the floors table of docs/architecture.md (floor | path | …)');
});

test.run();
