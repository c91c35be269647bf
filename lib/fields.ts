// Field checks every object kind shares (names, labels, values in messages), for the schema's semantic
// checks and the subsystems' own.

export const API_VERSION = 'tether.dev/v1alpha1';
export const DNS1123_LABEL = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/;
const DNS1123_SUBDOMAIN = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;
const LABEL_NAME = /^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$/;

export function isLabelKey(k: string): boolean {
  const slash = k.indexOf('/');
  const prefix = slash < 0 ? undefined : k.slice(0, slash);
  const name = slash < 0 ? k : k.slice(slash + 1);
  if (prefix !== undefined && (prefix.length > 253 || !DNS1123_SUBDOMAIN.test(prefix))) return false;
  return name.length <= 63 && LABEL_NAME.test(name);
}

export function isLabelValue(v: string): boolean {
  return v === '' || (v.length <= 63 && LABEL_NAME.test(v));
}

export function isDnsSubdomain(s: string): boolean {
  return s.length <= 253 && DNS1123_SUBDOMAIN.test(s);
}

export function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** A value as shown in messages (strings quoted, objects by their kind). */
export function describe(v: unknown): string {
  if (v === undefined) return 'missing';
  if (typeof v === 'string') return JSON.stringify(v);
  if (Array.isArray(v)) return 'a list';
  if (v === null) return 'null';
  if (typeof v === 'object') return 'an object';
  return String(v);
}
