// How a mapping is written in the store and in its notices: the hash field that names the client (and, per
// flow, the tuple), and the bucket that field falls in. Every node reads and writes the same, so nothing
// here may change without a new store format (daemon/formats.ts).
import { isIPv4 } from 'node:net';
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

/** "c:<client>" (client affinity) or "f:<client>:<proto>:<vport>:<cport>" (per flow). */
export function fieldOf(k: MapKey): string {
  return k.vport || k.cport || k.proto ? `f:${k.client}:${k.proto}:${k.vport}:${k.cport}` : `c:${k.client}`;
}

/** The bucket of a field: FNV-1a, the same on every node. */
export function bucketOf(field: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < field.length; i++) h = Math.imul(h ^ field.charCodeAt(i), 0x01000193);
  return (h >>> 0) % LB_STORE_BUCKETS;
}

/** The mapping key of a hash field of vip's mappings; undefined when the field is not one. */
export function keyOf(vip: string, field: string): MapKey | undefined {
  const p = field.split(':');
  const num = (s: string | undefined, max: number) => (s !== undefined && /^\d{1,5}$/.test(s) && Number(s) <= max ? Number(s) : undefined);
  if (p[0] === 'c' && p.length === 2 && isIPv4(p[1])) return { vip, client: p[1], vport: 0, cport: 0, proto: 0 };
  if (p[0] === 'f' && p.length === 5 && isIPv4(p[1])) {
    const proto = num(p[2], 255);
    const vport = num(p[3], 65535);
    const cport = num(p[4], 65535);
    if (proto !== undefined && vport !== undefined && cport !== undefined) return { vip, client: p[1], vport, cport, proto };
  }
  return undefined;
}
