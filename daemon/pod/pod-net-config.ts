// PodNetConfig: the pod network options of a Tether network config, and their validation. Every error
// names the bad field ("vips[1]: '10.0.0.300' is not an IP address") so a wrong config is easy to fix.
import { ErrorCode, TetherError } from '../../lib/errors';
import { canonicalIp, formatPrefix, ipFamily, networkOf, parsePrefix } from '../../lib/ip';

export interface PodNetConfig {
  /** Absolute MTU for the pod interface (and its host-side veth); takes precedence over encapOverhead. */
  mtu?: number;
  /** Lower the pod interface MTU (and its host-side veth) by this many bytes, e.g. 28 for FoU/IPv4. */
  encapOverhead?: number;
  /** Addresses (v4/v6, bare or /32 /128) the pod holds for DSR; stored canonical, without prefix. */
  vips?: string[];
  /** Routes added in the pod; dst stored as "network/len"; table defaults to main. */
  routes?: Array<{ dst: string; gw?: string; mtu?: number; table?: number }>;
}

export const MIN_MTU = 576;
export const MAX_MTU = 65535;

function bad(field: string, msg: string): never {
  throw new TetherError(ErrorCode.InvalidConfig, `${field}: ${msg}`);
}

function int(v: unknown, field: string, min: number, max: number): number {
  if (typeof v !== 'number' || !Number.isInteger(v) || v < min || v > max) bad(field, `must be an integer ${min}..${max} (got ${JSON.stringify(v)})`);
  return v;
}

function str(v: unknown, field: string): string {
  if (typeof v !== 'string' || v === '') bad(field, `must be a non-empty string (got ${JSON.stringify(v)})`);
  return v;
}

/**
 * Reads the pod network fields from a network config (other keys such as cniVersion, type or prevResult
 * are ignored) and returns them checked and normalised. Throws TetherError(INVALID_CONFIG).
 */
export function validatePodNetConfig(raw: Record<string, unknown>): PodNetConfig {
  if (raw === null || typeof raw !== 'object' || Array.isArray(raw)) bad('config', 'must be an object');
  const out: PodNetConfig = {};
  if (raw.mtu !== undefined) out.mtu = int(raw.mtu, 'mtu', MIN_MTU, MAX_MTU);
  if (raw.encapOverhead !== undefined) out.encapOverhead = int(raw.encapOverhead, 'encapOverhead', 0, 1024);

  if (raw.vips !== undefined) {
    if (!Array.isArray(raw.vips)) bad('vips', 'must be an array of IP addresses');
    const seen = new Set<string>();
    out.vips = raw.vips.map((v, i) => {
      const field = `vips[${i}]`;
      const s = str(v, field);
      const slash = s.indexOf('/');
      const addr = slash < 0 ? s : s.slice(0, slash);
      const fam = ipFamily(addr);
      if (!fam) bad(field, `'${addr}' is not an IP address`);
      if (slash >= 0 && s.slice(slash + 1) !== (fam === 4 ? '32' : '128')) bad(field, `'${s}' must be a single address (/32 or /128)`);
      const c = canonicalIp(addr);
      if (seen.has(c)) bad(field, `'${s}' is listed twice`);
      seen.add(c);
      return c;
    });
  }

  if (raw.routes !== undefined) {
    if (!Array.isArray(raw.routes)) bad('routes', 'must be an array of {dst, gw?, mtu?, table?}');
    out.routes = raw.routes.map((r, i) => {
      const f = `routes[${i}]`;
      if (r === null || typeof r !== 'object' || Array.isArray(r)) bad(f, 'must be an object {dst, gw?, mtu?, table?}');
      const o = r as Record<string, unknown>;
      for (const k of Object.keys(o)) if (!['dst', 'gw', 'mtu', 'table'].includes(k)) bad(`${f}.${k}`, 'unknown field');
      const dstText = str(o.dst, `${f}.dst`);
      let dst;
      try {
        dst = networkOf(parsePrefix(dstText));
      } catch (e) {
        bad(`${f}.dst`, (e as Error).message);
      }
      const route: { dst: string; gw?: string; mtu?: number; table?: number } = { dst: formatPrefix(dst) };
      if (o.gw !== undefined) {
        const gw = str(o.gw, `${f}.gw`);
        const fam = ipFamily(gw);
        if (!fam) bad(`${f}.gw`, `'${gw}' is not an IP address`);
        if (fam !== dst.family) bad(`${f}.gw`, `'${gw}' is IPv${fam} but dst '${dstText}' is IPv${dst.family}`);
        route.gw = canonicalIp(gw);
      }
      if (o.mtu !== undefined) route.mtu = int(o.mtu, `${f}.mtu`, MIN_MTU, MAX_MTU);
      // 0 means "unspecified" to the kernel, so it is refused rather than silently meaning main.
      if (o.table !== undefined) route.table = int(o.table, `${f}.table`, 1, 0xffffffff);
      return route;
    });
  }
  return out;
}
