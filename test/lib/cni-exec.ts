// Runs a CNI executable the way a runtime does: CNI_* environment, config on stdin, result on stdout.
import { spawnSync } from 'node:child_process';

export interface CniRun {
  status: number | null;
  stdout: string;
  stderr: string;
  json?: Record<string, unknown>;
  ms: number;
}

export function runCni(plugin: string, env: Record<string, string | undefined>, stdin: string, opts: { netns?: string } = {}): CniRun {
  const clean: Record<string, string> = { PATH: process.env.PATH ?? '/usr/sbin:/usr/bin:/sbin:/bin' };
  for (const [k, v] of Object.entries(env)) if (v !== undefined) clean[k] = v;
  const argv = opts.netns ? ['nsenter', `--net=${opts.netns}`, plugin] : [plugin];
  const t0 = process.hrtime.bigint();
  const r = spawnSync(argv[0], argv.slice(1), { input: stdin, env: clean, encoding: 'utf8', timeout: 30_000 });
  const ms = Number(process.hrtime.bigint() - t0) / 1e6;
  let json: Record<string, unknown> | undefined;
  try {
    json = r.stdout.trim() ? (JSON.parse(r.stdout) as Record<string, unknown>) : undefined;
  } catch {
    json = undefined;
  }
  return { status: r.status, stdout: r.stdout, stderr: r.stderr, json, ms };
}
