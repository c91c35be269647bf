// What the CNI specification asks of every plugin executable: versions, environment, errors on stdout.
// Shared by `tether` and `tether-ipam`; kept free of heavy imports so the executables start fast.
import { cniCodeFor, TetherError, ErrorCode } from './errors';
import { parseCniArgs, validateContainerId, validateIfName, validateNetns, validateNetworkName } from './cni-validate';

export const SUPPORTED_VERSIONS = ['0.3.1', '0.4.0', '1.0.0', '1.1.0'] as const;
export const LATEST_VERSION = '1.1.0';

export type CniCommand = 'ADD' | 'DEL' | 'CHECK' | 'VERSION' | 'STATUS' | 'GC';
const COMMANDS: readonly string[] = ['ADD', 'DEL', 'CHECK', 'VERSION', 'STATUS', 'GC'];

/** Numeric comparison of dotted versions ("0.4.0" < "1.0.0"). */
export function compareVersions(a: string, b: string): number {
  const pa = a.split('.').map(Number);
  const pb = b.split('.').map(Number);
  for (let i = 0; i < Math.max(pa.length, pb.length); i++) {
    const d = (pa[i] ?? 0) - (pb[i] ?? 0);
    if (d !== 0) return d;
  }
  return 0;
}

/** The first CNI version that knows each command: CHECK came with 0.4.0, STATUS and GC with 1.1.0. */
const SINCE: Partial<Record<CniCommand, string>> = { CHECK: '0.4.0', STATUS: '1.1.0', GC: '1.1.0' };

export interface CniEnv {
  command: CniCommand;
  containerId: string;
  netns: string;
  ifName: string;
  args: Record<string, string>;
  path: string;
}

/** Reads CNI_* variables; names the missing one (error 4) as the spec requires per command. */
export function readEnv(env: NodeJS.ProcessEnv): CniEnv {
  const command = env.CNI_COMMAND ?? '';
  if (!command) throw new TetherError(ErrorCode.InvalidEnvironment, 'CNI_COMMAND is not set');
  if (!COMMANDS.includes(command)) {
    throw new TetherError(ErrorCode.InvalidEnvironment, `CNI_COMMAND '${command}' is not one of ${COMMANDS.join(', ')}`);
  }
  const cmd = command as CniCommand;
  const need = (name: string): string => {
    const v = env[name];
    if (!v) throw new TetherError(ErrorCode.InvalidEnvironment, `${name} is not set (required for ${cmd})`);
    return v;
  };
  let containerId = '';
  let ifName = '';
  let netns = '';
  if (cmd === 'ADD' || cmd === 'DEL' || cmd === 'CHECK') {
    containerId = need('CNI_CONTAINERID');
    validateContainerId(containerId);
    ifName = need('CNI_IFNAME');
    validateIfName(ifName);
    // DEL may come after the namespace is gone, so the runtime is allowed to leave CNI_NETNS empty.
    netns = cmd === 'DEL' ? (env.CNI_NETNS ?? '') : need('CNI_NETNS');
    validateNetns(netns, cmd);
  }
  return { command: cmd, containerId, netns, ifName, args: parseArgs(env.CNI_ARGS ?? ''), path: env.CNI_PATH ?? '' };
}

/** CNI_ARGS is "K1=V1;K2=V2"; a pair without '=' or with an empty key is malformed (error 4). */
export const parseArgs = parseCniArgs;

export interface NetConf {
  cniVersion: string;
  name: string;
  type: string;
  prevResult?: Record<string, unknown>;
  [k: string]: unknown;
}

/** Parses stdin into a network config: 6 when it is not JSON, 1 for an unsupported version, 7 for bad fields. */
export function parseNetConf(stdin: string, command: CniCommand): NetConf {
  let raw: unknown;
  try {
    raw = JSON.parse(stdin);
  } catch (e) {
    throw new TetherError(ErrorCode.DecodeFailure, `network config on stdin is not valid JSON: ${(e as Error).message}`);
  }
  if (!raw || typeof raw !== 'object' || Array.isArray(raw)) {
    throw new TetherError(ErrorCode.DecodeFailure, 'network config on stdin must be a JSON object');
  }
  const conf = raw as Record<string, unknown>;
  const version = conf.cniVersion;
  if (typeof version !== 'string' || !version) {
    throw new TetherError(ErrorCode.InvalidConfig, 'cniVersion: missing or not a string');
  }
  if (!(SUPPORTED_VERSIONS as readonly string[]).includes(version)) {
    throw new TetherError(ErrorCode.IncompatibleVersion, `cniVersion ${version} is not supported`, {
      details: `supported versions: ${SUPPORTED_VERSIONS.join(', ')}`,
    });
  }
  const since = SINCE[command];
  if (since && compareVersions(version, since) < 0) {
    throw new TetherError(ErrorCode.IncompatibleVersion, `${command} needs cniVersion ${since} or later; config has ${version}`);
  }
  if (command === 'VERSION') return conf as NetConf;
  for (const field of ['name', 'type'] as const) {
    if (typeof conf[field] !== 'string' || !conf[field]) {
      throw new TetherError(ErrorCode.InvalidConfig, `${field}: missing or not a string`);
    }
  }
  validateNetworkName(conf.name as string);
  if (conf.prevResult !== undefined && (typeof conf.prevResult !== 'object' || conf.prevResult === null || Array.isArray(conf.prevResult))) {
    throw new TetherError(ErrorCode.InvalidConfig, 'prevResult: must be an object');
  }
  return conf as NetConf;
}

export function versionReply(stdin: string): Record<string, unknown> {
  let requested: unknown;
  try {
    requested = (JSON.parse(stdin.trim() || '{}') as Record<string, unknown> | null)?.cniVersion;
  } catch (e) {
    throw new TetherError(ErrorCode.DecodeFailure, `VERSION input on stdin is not valid JSON: ${(e as Error).message}`);
  }
  const cniVersion = typeof requested === 'string' && (SUPPORTED_VERSIONS as readonly string[]).includes(requested) ? requested : LATEST_VERSION;
  return { cniVersion, supportedVersions: [...SUPPORTED_VERSIONS] };
}

/** The CNI error object; `cniVersion` echoes the config's when known. */
export function errorReply(err: unknown, cniVersion: string | undefined, codeOverride?: number): Record<string, unknown> {
  const te = err instanceof TetherError ? err : new TetherError(ErrorCode.Internal, err instanceof Error ? err.message : String(err));
  const out: Record<string, unknown> = {
    cniVersion: cniVersion && (SUPPORTED_VERSIONS as readonly string[]).includes(cniVersion) ? cniVersion : LATEST_VERSION,
    code: codeOverride ?? cniCodeFor(te.code),
    msg: te.message,
  };
  if (te.details) out.details = te.details;
  return out;
}

/** Reads all of stdin synchronously: cheaper at start-up than a stream, and the runtime closes it. */
export function readStdin(): string {
  try {
    // Required here, not imported: a Bun-built executable loads every imported module at start.
    return (require('node:fs') as typeof import('node:fs')).readFileSync(0, 'utf8');
  } catch (e) {
    // No stdin at all (closed descriptor) reads as empty; anything else is an I/O failure.
    if ((e as NodeJS.ErrnoException).code === 'EBADF' || (e as NodeJS.ErrnoException).code === 'EAGAIN') return '';
    throw new TetherError(ErrorCode.IoFailure, `cannot read stdin: ${(e as Error).message}`);
  }
}
