// Runs a CNI conflist the way libcni (containerd, CRI-O) does: ADD in order with prevResult threading,
// the final result cached per container, DEL in reverse order and CHECK in order from that cache.
// Every plugin invocation is timed, so benchmarks can report per-plugin and per-chain latency.
import * as fs from 'node:fs';
import * as path from 'node:path';
import { nsenterArgv, run } from './proc';

export type CniCommand = 'ADD' | 'DEL' | 'CHECK';

/** A network configuration list as found in /etc/cni/net.d/*.conflist. */
export interface Conflist {
  cniVersion: string;
  name: string;
  disableCheck?: boolean;
  plugins: PluginConf[];
}

export interface PluginConf {
  type: string;
  capabilities?: Record<string, boolean>;
  [key: string]: unknown;
}

/** What a runtime knows about one attachment. */
export interface Attachment {
  containerId: string;
  /** Path of the pod's network namespace, e.g. /run/netns/tb1a2b-n1-p1. */
  netns: string;
  ifName: string;
  /** CNI_ARGS as key/value pairs (joined with ';') or a ready string. */
  args?: Record<string, string> | string;
  /** Runtime capability arguments; passed as runtimeConfig to plugins that declare the capability. */
  capabilityArgs?: Record<string, unknown>;
}

export interface Invocation {
  plugin: string;
  index: number;
  command: CniCommand;
  /** Wall time of the plugin process (including nsenter when runInNetns is set). */
  ms: number;
  exitCode: number | null;
  stderr: string;
}

export interface ChainOutcome {
  /** The final result (ADD), the cached result used (CHECK/DEL), or undefined (DEL without cache). */
  result?: CniResult;
  invocations: Invocation[];
  /** Wall time of the whole chain. */
  ms: number;
}

/** The subset of a CNI result the testbed reads; the rest passes through untouched. */
export interface CniResult {
  cniVersion: string;
  interfaces?: { name: string; mac?: string; sandbox?: string; mtu?: number }[];
  ips?: { address: string; gateway?: string; interface?: number }[];
  routes?: { dst: string; gw?: string; mtu?: number }[];
  dns?: unknown;
  [key: string]: unknown;
}

/** A plugin failed; carries the CNI error object it printed (or a synthetic one when it printed none). */
export class CniError extends Error {
  constructor(
    readonly plugin: string,
    readonly index: number,
    readonly command: CniCommand,
    /** CNI error code (1–11 well known, 100+ plugin specific); -1 when the plugin printed no error JSON. */
    readonly code: number,
    readonly msg: string,
    readonly details: string | undefined,
    readonly exitCode: number | null,
    readonly stderr: string,
    readonly invocations: Invocation[],
  ) {
    super(`CNI ${command} failed in plugin #${index} ${plugin}: [${code}] ${msg}${details ? ` (${details})` : ''}`);
    this.name = 'CniError';
  }
}

export interface ChainOptions {
  /** Directories searched for plugin executables, in order (becomes CNI_PATH). */
  cniPath: string[];
  /** Where ADD results are cached (libcni uses /var/lib/cni/results). */
  cacheDir: string;
  /** Run every plugin inside this network namespace (path), as a node's runtime would run. */
  runInNetns?: string;
  /** Kills a plugin that runs longer than this. */
  timeoutMs?: number;
}

interface CacheEntry {
  kind: 'cniCacheV1';
  containerId: string;
  ifName: string;
  networkName: string;
  cniArgs: string;
  config: Conflist;
  result: CniResult;
}

export class CniChain {
  constructor(
    readonly conflist: Conflist,
    readonly opts: ChainOptions,
  ) {
    if (!conflist.name || !conflist.cniVersion || !Array.isArray(conflist.plugins) || conflist.plugins.length === 0) {
      throw new Error('conflist needs name, cniVersion and at least one plugin');
    }
  }

  /** ADD each plugin in order; on success caches and returns the last plugin's result. Not idempotent. */
  async add(att: Attachment): Promise<ChainOutcome> {
    const t0 = process.hrtime.bigint();
    const invocations: Invocation[] = [];
    let prev: CniResult | undefined;
    for (const [i, plugin] of this.conflist.plugins.entries()) {
      const stdout = await this.invoke('ADD', i, plugin, att, prev, invocations);
      try {
        prev = JSON.parse(stdout) as CniResult;
      } catch {
        throw new CniError(plugin.type, i, 'ADD', -1, 'plugin printed no valid result JSON', stdout.slice(0, 500), 0, '', invocations);
      }
    }
    this.writeCache(att, prev as CniResult);
    return { result: prev, invocations, ms: msSince(t0) };
  }

  /** DEL each plugin in reverse order with the cached ADD result; drops the cache. Idempotent if the plugins are. */
  async del(att: Attachment): Promise<ChainOutcome> {
    const t0 = process.hrtime.bigint();
    const invocations: Invocation[] = [];
    const cached = this.readCache(att)?.result;
    const plugins = [...this.conflist.plugins.entries()].reverse();
    for (const [i, plugin] of plugins) {
      await this.invoke('DEL', i, plugin, att, cached, invocations);
    }
    fs.rmSync(this.cachePath(att), { force: true });
    return { result: cached, invocations, ms: msSince(t0) };
  }

  /** CHECK each plugin in order against the cached ADD result. Idempotent. */
  async check(att: Attachment): Promise<ChainOutcome> {
    const t0 = process.hrtime.bigint();
    const invocations: Invocation[] = [];
    if (this.conflist.disableCheck) return { invocations, ms: msSince(t0) };
    if (versionLess(this.conflist.cniVersion, '0.4.0')) {
      throw new Error(`CHECK needs cniVersion >= 0.4.0, conflist has ${this.conflist.cniVersion}`);
    }
    const cached = this.readCache(att)?.result;
    if (!cached) throw new Error(`CHECK: no cached ADD result for ${att.containerId}/${att.ifName}`);
    for (const [i, plugin] of this.conflist.plugins.entries()) {
      await this.invoke('CHECK', i, plugin, att, cached, invocations);
    }
    return { result: cached, invocations, ms: msSince(t0) };
  }

  /** The cached ADD result of an attachment, if any (what the runtime would hand to DEL). */
  cachedResult(att: Pick<Attachment, 'containerId' | 'ifName'>): CniResult | undefined {
    return this.readCache(att)?.result;
  }

  private async invoke(
    command: CniCommand,
    index: number,
    plugin: PluginConf,
    att: Attachment,
    prevResult: CniResult | undefined,
    invocations: Invocation[],
  ): Promise<string> {
    const exe = this.findPlugin(plugin.type);
    const input = JSON.stringify(this.pluginStdin(plugin, att, prevResult));
    const env: NodeJS.ProcessEnv = {
      ...process.env,
      CNI_COMMAND: command,
      CNI_CONTAINERID: att.containerId,
      CNI_NETNS: att.netns,
      CNI_IFNAME: att.ifName,
      CNI_ARGS: cniArgsString(att.args),
      CNI_PATH: this.opts.cniPath.join(':'),
    };
    const argv = this.opts.runInNetns ? nsenterArgv(this.opts.runInNetns, [exe]) : [exe];
    const r = await run(argv, { input, env, timeoutMs: this.opts.timeoutMs ?? 60_000 });
    invocations.push({ plugin: plugin.type, index, command, ms: r.ms, exitCode: r.code, stderr: r.stderr });
    if (r.code !== 0) {
      const e = parseCniError(r.stdout);
      const msg = e?.msg ?? (r.signal ? `killed by ${r.signal}` : `exit status ${r.code}`);
      const details = e ? e.details : r.stderr.trim() || r.stdout.trim() || undefined;
      throw new CniError(plugin.type, index, command, e?.code ?? -1, msg, details, r.code, r.stderr, invocations);
    }
    return r.stdout;
  }

  /** libcni injects name and cniVersion from the list, runtimeConfig for declared capabilities, and prevResult. */
  private pluginStdin(plugin: PluginConf, att: Attachment, prevResult: CniResult | undefined): Record<string, unknown> {
    const conf: Record<string, unknown> = { ...plugin, name: this.conflist.name, cniVersion: this.conflist.cniVersion };
    const runtimeConfig: Record<string, unknown> = {};
    for (const [cap, on] of Object.entries(plugin.capabilities ?? {})) {
      if (on && att.capabilityArgs && cap in att.capabilityArgs) runtimeConfig[cap] = att.capabilityArgs[cap];
    }
    if (Object.keys(runtimeConfig).length > 0) conf.runtimeConfig = runtimeConfig;
    if (prevResult !== undefined) conf.prevResult = prevResult;
    return conf;
  }

  private findPlugin(type: string): string {
    for (const dir of this.opts.cniPath) {
      const p = path.join(dir, type);
      try {
        fs.accessSync(p, fs.constants.X_OK);
        return p;
      } catch {
        // Not in this directory: keep looking, like libcni's FindInPath.
      }
    }
    throw new Error(`CNI plugin "${type}" not found in ${this.opts.cniPath.join(':')}`);
  }

  private cachePath(att: Pick<Attachment, 'containerId' | 'ifName'>): string {
    return path.join(this.opts.cacheDir, `${this.conflist.name}-${att.containerId}-${att.ifName}.json`);
  }

  private writeCache(att: Attachment, result: CniResult): void {
    const entry: CacheEntry = {
      kind: 'cniCacheV1',
      containerId: att.containerId,
      ifName: att.ifName,
      networkName: this.conflist.name,
      cniArgs: cniArgsString(att.args),
      config: this.conflist,
      result,
    };
    fs.mkdirSync(this.opts.cacheDir, { recursive: true });
    const p = this.cachePath(att);
    fs.writeFileSync(`${p}.tmp`, JSON.stringify(entry));
    fs.renameSync(`${p}.tmp`, p);
  }

  private readCache(att: Pick<Attachment, 'containerId' | 'ifName'>): CacheEntry | undefined {
    try {
      return JSON.parse(fs.readFileSync(this.cachePath(att), 'utf8')) as CacheEntry;
    } catch {
      return undefined;
    }
  }
}

export function cniArgsString(args: Attachment['args']): string {
  if (args === undefined) return '';
  if (typeof args === 'string') return args;
  return Object.entries(args)
    .map(([k, v]) => `${k}=${v}`)
    .join(';');
}

/** Parses a CNI error object ({code, msg, details}) printed on stdout; undefined if there is none. */
export function parseCniError(stdout: string): { code: number; msg: string; details?: string } | undefined {
  try {
    const o = JSON.parse(stdout) as { code?: unknown; msg?: unknown; details?: unknown };
    if (typeof o.code !== 'number') return undefined;
    return { code: o.code, msg: typeof o.msg === 'string' ? o.msg : '', details: typeof o.details === 'string' ? o.details : undefined };
  } catch {
    return undefined;
  }
}

function versionLess(a: string, b: string): boolean {
  const pa = a.split('.').map(Number);
  const pb = b.split('.').map(Number);
  for (let i = 0; i < 3; i++) {
    if ((pa[i] ?? 0) !== (pb[i] ?? 0)) return (pa[i] ?? 0) < (pb[i] ?? 0);
  }
  return false;
}

function msSince(t0: bigint): number {
  return Number(process.hrtime.bigint() - t0) / 1e6;
}
