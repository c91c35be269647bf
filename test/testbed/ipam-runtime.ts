// Drives tether-ipam the way a runtime does through a primary plugin: the executable run inside the node's
// namespace with the primary's config on stdin (exactly what ptp hands its IPAM delegate) and the CNI_*
// environment. For IPAM storms, crash tests and benchmarks, where building a pod per address would only
// measure veth creation: IPAM never touches the netns, so one real namespace per node serves every call.
import { randomBytes } from 'node:crypto';
import * as path from 'node:path';
import { call } from '../../lib/api/client';
import { CniResult, parseCniError } from './cni-chain';
import { mustRun, nsenterArgv, run } from './proc';
import { binDir } from './tetherd';
import { NETWORK_NAME, Testbed } from './testbed';

export type IpamCommand = 'ADD' | 'DEL' | 'CHECK' | 'GC';

export interface IpamOutcome {
  ok: boolean;
  /** The IPAM result of an ADD. */
  result?: CniResult;
  /** The CNI error the plugin printed (code -1 when it printed none). */
  error?: { code: number; msg: string; details?: string };
  /** Wall time of the invocation, nsenter included. */
  ms: number;
}

export interface IpamCallOptions {
  containerId?: string;
  /** CNI_NETNS; default the node's IPAM namespace (ipamNetns). */
  netns?: string;
  ifName?: string;
  cniVersion?: string;
  /** Keys merged into the network config (prevResult for CHECK, cni.dev/valid-attachments for GC…). */
  extra?: Record<string, unknown>;
}

const netnsMade = new Map<string, Promise<string>>();

/** A real, existing namespace per node to pass as CNI_NETNS (named by the run, so teardown removes it). */
export function ipamNetns(tb: Testbed, node: string): Promise<string> {
  const name = `${tb.prefix}-${node}-ipamns`;
  let made = netnsMade.get(name);
  if (!made) {
    made = mustRun(['ip', 'netns', 'add', name]).then(() => `/run/netns/${name}`);
    made.catch(() => netnsMade.delete(name));
    netnsMade.set(name, made);
  }
  return made;
}

/** The network config a node's primary plugin (ptp) is given, as libcni injects name and cniVersion. */
export function primaryConf(tb: Testbed, node: string, cniVersion = '1.0.0'): Record<string, unknown> {
  return { ...tb.conflist(node).plugins[0], name: NETWORK_NAME, cniVersion };
}

/** Runs the tether-ipam executable once, in the node's namespace. Never rejects on a CNI error. */
export async function tetherIpam(tb: Testbed, node: string, command: IpamCommand, o: IpamCallOptions = {}): Promise<IpamOutcome> {
  const conf = { ...primaryConf(tb, node, o.cniVersion ?? (command === 'GC' ? '1.1.0' : '1.0.0')), ...o.extra };
  const env: NodeJS.ProcessEnv = { ...process.env, CNI_COMMAND: command, CNI_PATH: binDir() };
  if (command !== 'GC') {
    Object.assign(env, {
      CNI_CONTAINERID: o.containerId ?? '',
      CNI_NETNS: o.netns ?? (await ipamNetns(tb, node)),
      CNI_IFNAME: o.ifName ?? 'eth0',
      CNI_ARGS: `IgnoreUnknown=1;K8S_POD_NAMESPACE=ipam;K8S_POD_NAME=${o.containerId ?? ''}`,
    });
  }
  const r = await run(nsenterArgv(tb.nsPath(node), [path.join(binDir(), 'tether-ipam')]), { input: JSON.stringify(conf), env, timeoutMs: 60_000 });
  if (r.code === 0) return { ok: true, result: command === 'ADD' ? (JSON.parse(r.stdout) as CniResult) : undefined, ms: r.ms };
  const error = parseCniError(r.stdout) ?? { code: -1, msg: r.signal ? `killed by ${r.signal}` : `exit ${r.code}`, details: r.stderr.trim() };
  return { ok: false, error, ms: r.ms };
}

/** The same request through tetherd's socket API (what the executable forwards), for fast verification. */
export function ipamApi<R = unknown>(tb: Testbed, node: string, method: 'ipam.add' | 'ipam.del' | 'ipam.check', o: IpamCallOptions = {}): Promise<R> {
  const config = { ...primaryConf(tb, node, o.cniVersion), ...o.extra };
  return call<R>(tb.socketPath(node), method, {
    command: method.split('.')[1].toUpperCase(),
    containerId: o.containerId,
    netns: o.netns ?? '',
    ifName: o.ifName ?? 'eth0',
    args: { K8S_POD_NAMESPACE: 'ipam', K8S_POD_NAME: o.containerId ?? '' },
    config,
  });
}

export function newContainerId(): string {
  return randomBytes(32).toString('hex');
}

/**
 * Runs fn over items with at most `limit` calls in flight; results in input order. After the first
 * failure no new item starts and `signal` is aborted (long retry loops should watch it); rejects with
 * that failure once everything in flight has settled, so nothing outlives the caller's teardown.
 */
export async function boundedAll<T, R>(
  items: readonly T[],
  limit: number,
  fn: (item: T, index: number, signal: AbortSignal) => Promise<R>,
): Promise<R[]> {
  const out = new Array<R>(items.length);
  const ac = new AbortController();
  let next = 0;
  let first: { e: unknown } | undefined;
  const worker = async () => {
    while (next < items.length && !ac.signal.aborted) {
      const i = next++;
      try {
        out[i] = await fn(items[i], i, ac.signal);
      } catch (e) {
        first ??= { e };
        ac.abort();
      }
    }
  };
  await Promise.all(Array.from({ length: Math.min(limit, items.length) }, worker));
  if (first) throw first.e;
  return out;
}
