// Reading records back from the cluster store (Redis): whatever is there may be garbage (a bug, an
// operator's hand edit, a corrupted restore) or from another tetherd version. Every record is validated
// before use; one that is not readable is refused with one warn line naming its key, field and problem,
// and nothing from it is applied. The field checks the readers share live here.
import { ErrorCode, TetherError } from '../../lib/errors';
import { log } from '../../lib/log';
import { formatIp, parseIp } from '../../lib/ip';
import { isDnsSubdomain } from '../../lib/fields';

/**
 * A record that cannot be trusted. It carries TRY_AGAIN_LATER: for the record it names, the caller acts
 * as if the store were unreachable (goes on without it), never as if the record said "nobody".
 */
export class UnreadableRecordError extends TetherError {
  constructor(
    readonly key: string,
    readonly field: string | undefined,
    readonly problem: string,
  ) {
    super(ErrorCode.TryAgainLater, `cluster store record ${key}${field === undefined ? '' : ` (${field})`} is unreadable: ${problem}; ignored as if the store were unreachable for it`);
    this.name = 'UnreadableRecordError';
  }
}

const warned = new Set<string>();

/**
 * Logs a refused record once (per key, field, problem and value: a record that stays garbled is not
 * reported on every read, one that changes is reported again).
 */
export function refuseRecord(store: string, key: string, field: string | undefined, problem: string, value: unknown): void {
  const shown = typeof value === 'string' ? value.slice(0, 200) : JSON.stringify(value)?.slice(0, 200);
  const sig = `${store}\0${key}\0${field ?? ''}\0${problem}\0${shown}`;
  if (warned.has(sig)) return;
  if (warned.size >= 10_000) warned.clear();
  warned.add(sig);
  log().warn(`${store}: unreadable record refused, nothing from it applied`, { key, ...(field === undefined ? {} : { field }), problem, value: shown });
}

/** Parses a JSON record; undefined with `problem` set when it is not a JSON object. */
export function parseObject(raw: string): { value?: Record<string, unknown>; problem?: string } {
  let v: unknown;
  try {
    v = JSON.parse(raw);
  } catch {
    return { problem: 'not JSON' };
  }
  if (typeof v !== 'object' || v === null || Array.isArray(v)) return { problem: `not a JSON object (${Array.isArray(v) ? 'a list' : v === null ? 'null' : typeof v})` };
  return { value: v as Record<string, unknown> };
}

/** An IP address in canonical form (as tetherd writes them). */
export function isCanonicalIp(v: unknown): v is string {
  if (typeof v !== 'string') return false;
  const ip = parseIp(v);
  return !!ip && formatIp(ip.family, ip.value) === v;
}

/**
 * A node address as the store's shared records carry it (node and gateway registries, ownership records and
 * their change notices): IPv4 as it is, IPv6 (a node on an IPv6 underlay) in brackets. Releases before
 * 0.2.0 take any canonical address there for one of their own IPv4 underlay, and would put an IPv6 one in
 * their IPv4 FoU allow-lists and BFD sessions; "[fd00::1]" is not an IP address to them, so they refuse
 * the record by that field (a logged refusal) instead, as they refuse a bracketed LB client (lb-mapping-store).
 */
export function nodeAddressText(address: string): string {
  return address.includes(':') ? `[${address}]` : address;
}

/** A node address read back (nodeAddressText): canonical IPv4, or canonical IPv6 in brackets; undefined otherwise. */
export function readNodeAddress(v: unknown): string | undefined {
  if (typeof v !== 'string') return undefined;
  if (v.startsWith('[') && v.endsWith(']')) {
    const inner = v.slice(1, -1);
    return inner.includes(':') && isCanonicalIp(inner) ? inner : undefined;
  }
  return isCanonicalIp(v) && !v.includes(':') ? v : undefined;
}

/** A non-negative safe integer, as a number or a decimal string; undefined when it is not one. */
export function nonNegativeInt(v: unknown): number | undefined {
  if (typeof v === 'number') return Number.isSafeInteger(v) && v >= 0 ? v : undefined;
  if (typeof v === 'string' && /^\d{1,15}$/.test(v)) return Number(v);
  return undefined;
}

/** A "namespace/name" of a Kubernetes object (pods, Egresses). */
export function isObjectRef(v: unknown): v is string {
  if (typeof v !== 'string') return false;
  const parts = v.split('/');
  return parts.length === 2 && isDnsSubdomain(parts[0]) && isDnsSubdomain(parts[1]);
}

/** A name tetherd writes (node names, owners): 1..max characters, no whitespace or control characters. */
export function isPlainName(v: unknown, max = 253): v is string {
  return typeof v === 'string' && v.length >= 1 && v.length <= max && !/[\s\x00-\x1f\x7f]/.test(v);
}

/** A finite number (a time in ms). */
export function isTime(v: unknown): v is number {
  return typeof v === 'number' && Number.isFinite(v);
}
