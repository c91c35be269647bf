// How a mapping is written in the store and in its notices: the hash field that names the client (and, per
// flow, the tuple), and the bucket that field falls in. Every node reads and writes the same, so nothing
// here may change without a new store format (daemon/formats.ts).
//
// IPv6 clients (format 2 of lb-mapping-store and lb-mapping-notice): IPv6 text holds the ':' that separates
// the field's parts, so an IPv6 client is written in brackets, as a URI writes an IPv6 host (RFC 3986):
// "c:[<client>]", "f:[<client>]:<proto>:<vport>:<cport>", the client in its canonical text (inet_ntop's, as
// the datapath's records print it), so one mapping has one field and one bucket on every node. IPv4 fields
// are as they were, byte for byte. A release before reads a bracketed field as no mapping (its split on ':'
// finds the wrong number of parts) and names it refused, never as another client's; and it never serves an
// IPv6 VIP, the only VIP whose hashes hold such fields.
import { canonicalIp, ipFamily } from '../../lib/ip';
import type { MapKey } from '../bpf/lb-structs';

/**
 * Buckets per VIP. Every node must use the same count (a mapping's bucket is where every node looks for
 * it), so it is a constant, not an option.
 */
export const LB_STORE_BUCKETS = 16;

/** A mapping as stored: the hash field names the client (and, per flow, the tuple). */
export interface StoredMapping {
  key: MapKey;
  target: string;
}

/** "c:<client>" (client affinity) or "f:<client>:<proto>:<vport>:<cport>" (per flow); an IPv6 client in brackets. */
export function fieldOf(k: MapKey): string {
  const client = k.client.includes(':') ? `[${k.client}]` : k.client;
  return k.vport || k.cport || k.proto ? `f:${client}:${k.proto}:${k.vport}:${k.cport}` : `c:${client}`;
}

/** The bucket of a field: FNV-1a, the same on every node. */
export function bucketOf(field: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < field.length; i++) h = Math.imul(h ^ field.charCodeAt(i), 0x01000193);
  return (h >>> 0) % LB_STORE_BUCKETS;
}

/**
 * The mapping key of a hash field of vip's mappings; undefined when the field is not one: malformed, an
 * IPv6 client not in brackets or not in its canonical text, or a client of another family than vip's.
 */
export function keyOf(vip: string, field: string): MapKey | undefined {
  const num = (s: string | undefined, max: number) => (s !== undefined && /^\d{1,5}$/.test(s) && Number(s) <= max ? Number(s) : undefined);
  const kind = field.slice(0, 2);
  if (kind !== 'c:' && kind !== 'f:') return undefined;
  let client: string;
  let rest: string[];
  if (field.charCodeAt(2) === 91 /* [ */) {
    const end = field.indexOf(']', 3);
    if (end < 0) return undefined;
    client = field.slice(3, end);
    if (ipFamily(client) !== 6 || client.includes('%') || canonicalIp(client) !== client || ipFamily(vip) !== 6) return undefined;
    const tail = field.slice(end + 1);
    if (kind === 'c:') return tail === '' ? { vip, client, vport: 0, cport: 0, proto: 0 } : undefined;
    if (tail.charCodeAt(0) !== 58 /* : */) return undefined;
    rest = tail.slice(1).split(':');
  } else {
    const p = field.split(':');
    client = p[1];
    if (ipFamily(client) !== 4 || ipFamily(vip) === 6) return undefined;
    if (kind === 'c:') return p.length === 2 ? { vip, client, vport: 0, cport: 0, proto: 0 } : undefined;
    if (p.length !== 5) return undefined;
    rest = p.slice(2);
  }
  if (rest.length !== 3) return undefined;
  const proto = num(rest[0], 255);
  const vport = num(rest[1], 65535);
  const cport = num(rest[2], 65535);
  if (proto !== undefined && vport !== undefined && cport !== undefined) return { vip, client, vport, cport, proto };
  return undefined;
}

/** Whether `address` is an address (a target, a VIP) of the same family as vip. */
export function sameFamily(address: unknown, vip: string): address is string {
  if (typeof address !== 'string') return false;
  const f = ipFamily(address);
  return f !== 0 && f === ipFamily(vip) && !address.includes('%');
}

/** "IPv4" or "IPv6": the family vip's targets must be of (what a refused record names). */
export function familyOf(vip: string): string {
  return ipFamily(vip) === 6 ? 'IPv6' : 'IPv4';
}
