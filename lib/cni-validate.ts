// What the CNI specification constrains in a request, checked by the thin clients (lib/cni-spec.ts) and again by
// tetherd for requests that reach its socket (daemon/main.ts): the same rules as libcni's
// ValidateContainerID / ValidateNetworkName / ValidateInterfaceName, plus CNI_NETNS and CNI_ARGS. Each
// failure names the field and answers the spec's code: 4 for CNI_* variables, 7 for the network config.
import { ErrorCode, TetherError } from './errors';

/** libcni: container IDs and network names start with an alphanumeric, then alphanumerics, '_', '.', '-'. */
const ID_CHARS = /^[a-zA-Z0-9][a-zA-Z0-9_.-]*$/;
/**
 * Our bound on both (the spec sets none): 255 bytes, a file name's limit, far above what runtimes use
 * (containerd: 64 hex digits) and above a Kubernetes object name (253).
 */
export const MAX_ID_LENGTH = 255;
/** IFNAMSIZ is 16 with the terminating NUL. */
export const MAX_IFNAME_BYTES = 15;
/** A path the kernel accepts (PATH_MAX 4096). */
const MAX_PATH = 4095;

function shown(v: string): string {
  return v.length > 40 ? `${JSON.stringify(v.slice(0, 40))}… (${v.length} characters)` : JSON.stringify(v);
}

function env(msg: string): TetherError {
  return new TetherError(ErrorCode.InvalidEnvironment, msg);
}

export function validateContainerId(id: string): void {
  if (!id) throw env('CNI_CONTAINERID is empty');
  if (id.length > MAX_ID_LENGTH) throw env(`CNI_CONTAINERID ${shown(id)} is longer than ${MAX_ID_LENGTH} characters`);
  if (!ID_CHARS.test(id)) throw env(`CNI_CONTAINERID ${shown(id)} must start with a letter or digit and contain only letters, digits, '_', '.' and '-'`);
}

export function validateNetworkName(name: string): void {
  const bad = (why: string) => new TetherError(ErrorCode.InvalidConfig, `name: ${why}`);
  if (!name) throw bad('is empty');
  if (name.length > MAX_ID_LENGTH) throw bad(`${shown(name)} is longer than ${MAX_ID_LENGTH} characters`);
  if (!ID_CHARS.test(name)) throw bad(`${shown(name)} must start with a letter or digit and contain only letters, digits, '_', '.' and '-'`);
}

export function validateIfName(name: string): void {
  if (!name) throw env('CNI_IFNAME is empty');
  if (Buffer.byteLength(name) > MAX_IFNAME_BYTES) throw env(`CNI_IFNAME ${shown(name)} is longer than ${MAX_IFNAME_BYTES} bytes`);
  if (name === '.' || name === '..') throw env(`CNI_IFNAME ${shown(name)} is not a valid interface name`);
  for (const ch of ['/', ':']) if (name.includes(ch)) throw env(`CNI_IFNAME ${shown(name)} contains '${ch}'`);
  if (/\s/u.test(name)) throw env(`CNI_IFNAME ${shown(name)} contains whitespace`);
}

/** CNI_NETNS: an absolute path; DEL may come without one (the namespace is gone). */
export function validateNetns(netns: string, command: string): void {
  if (!netns) {
    if (command === 'DEL') return;
    throw env(`CNI_NETNS is empty (required for ${command})`);
  }
  if (!netns.startsWith('/')) throw env(`CNI_NETNS ${shown(netns)} is not an absolute path`);
  if (netns.length > MAX_PATH || netns.includes('\0')) throw env(`CNI_NETNS ${shown(netns)} is not a usable path`);
}

/** CNI_ARGS is "K1=V1;K2=V2"; an empty key, or a pair without '=', is malformed. */
export function parseCniArgs(raw: string): Record<string, string> {
  const out: Record<string, string> = {};
  for (const part of raw.split(';')) {
    if (!part) continue;
    const eq = part.indexOf('=');
    if (eq < 0) throw env(`CNI_ARGS entry ${shown(part)} is not KEY=VALUE`);
    if (eq === 0) throw env(`CNI_ARGS entry ${shown(part)} has an empty key`);
    out[part.slice(0, eq)] = part.slice(eq + 1);
  }
  return out;
}

/** What tetherd receives on its socket for a CNI command, checked with the same rules. */
export interface CniRequestFields {
  command: string;
  containerId?: string;
  ifName?: string;
  netns?: string;
  args?: unknown;
  config: Record<string, unknown>;
}

/**
 * Validates a request that arrived on tetherd's socket; STATUS and GC carry no attachment. requireNetns:
 * whether an empty CNI_NETNS is refused for ADD and CHECK (the pod plugin works in the namespace; IPAM
 * does not use it, so its requests are only checked for a well-formed path).
 */
export function validateCniRequest(p: CniRequestFields, opts: { requireNetns?: boolean } = {}): void {
  if (typeof p.config.name !== 'string') throw new TetherError(ErrorCode.InvalidConfig, 'name: missing or not a string');
  validateNetworkName(p.config.name);
  if (p.command === 'STATUS' || p.command === 'GC') return;
  if (!['ADD', 'DEL', 'CHECK'].includes(p.command)) throw env(`CNI_COMMAND ${shown(String(p.command))} is not one of ADD, DEL, CHECK, STATUS, GC`);
  validateContainerId(String(p.containerId ?? ''));
  validateIfName(String(p.ifName ?? ''));
  const netns = String(p.netns ?? '');
  if (netns || opts.requireNetns !== false) validateNetns(netns, p.command);
  if (p.args !== undefined) {
    if (!p.args || typeof p.args !== 'object' || Array.isArray(p.args)) throw env('CNI_ARGS: must be an object of strings');
    for (const [k, v] of Object.entries(p.args)) {
      if (!k || typeof v !== 'string') throw env(`CNI_ARGS entry ${shown(k)}: must be a non-empty key with a string value`);
    }
  }
}
