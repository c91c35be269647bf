// Percentiles and machine facts for benchmark reports.
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';

export function percentile(xs: number[], p: number): number {
  if (!xs.length) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  const i = Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1));
  return s[i];
}

export function summary(xs: number[]): { n: number; p50: number; p95: number; mean: number } {
  const r = (v: number) => Math.round(v * 10) / 10;
  return { n: xs.length, p50: r(percentile(xs, 50)), p95: r(percentile(xs, 95)), mean: r(xs.reduce((a, b) => a + b, 0) / (xs.length || 1)) };
}

export function machine(): Record<string, unknown> {
  const cpus = os.cpus();
  return {
    host: os.hostname(),
    cpu: cpus[0]?.model,
    cores: cpus.length,
    memoryGiB: Math.round(os.totalmem() / 2 ** 30),
    kernel: os.release(),
    node: process.version,
    date: new Date().toISOString(),
  };
}

/**
 * Replaces the text between <!-- bench:NAME:start --> and <!-- bench:NAME:end --> in the page that holds
 * them: `readme` (the repository's README.md) or one of the docs/*.md pages beside it (the figures live in
 * docs/performance.md). A block found nowhere is appended to docs/performance.md (or to `readme` when
 * there is no docs/).
 */
export function updateReadme(readme: string, name: string, body: string): void {
  const start = `<!-- bench:${name}:start -->`;
  const end = `<!-- bench:${name}:end -->`;
  const docs = path.join(path.dirname(readme), 'docs');
  const pages = [readme, ...(fs.existsSync(docs) ? fs.readdirSync(docs).filter((f) => f.endsWith('.md')).sort().map((f) => path.join(docs, f)) : [])];
  const page = pages.find((p) => fs.readFileSync(p, 'utf8').includes(start)) ?? (pages.length > 1 ? path.join(docs, 'performance.md') : readme);
  let text = fs.existsSync(page) ? fs.readFileSync(page, 'utf8') : '';
  const block = `${start}\n${body.trim()}\n${end}`;
  const i = text.indexOf(start);
  const j = text.indexOf(end);
  text = i >= 0 && j > i ? text.slice(0, i) + block + text.slice(j + end.length) : `${text.trimEnd()}\n\n${block}\n`;
  fs.writeFileSync(page, text);
}
