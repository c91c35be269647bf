// Route operations over rtnetlink: add/replace/del/list with table, scope, gateway, device, preferred
// source, metric, MTU (RTA_METRICS/RTAX_MTU) and ECMP (RTA_MULTIPATH), IPv4 and IPv6.
import { attr, attrU32, Attrs, nested, NlMsg } from './codec';
import {
  AF_INET, AF_INET6, AF_UNSPEC, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REPLACE, RT_SCOPE, RT_TABLE_COMPAT, RT_TABLE_MAIN,
  RTA, RTAX_MTU, RTM, RTN, RTPROT_STATIC,
} from './constants';
import { bytesToIp, IpFamily, ipFamily, ipToBytes, networkOf, parsePrefix } from '../../lib/ip';
import type { NetlinkSocket } from './socket';
import { decodeRtMsg, encodeRtMsg, encodeRtNexthop, RTMSG_LEN, RTNEXTHOP_LEN } from './structs';

export interface Nexthop {
  gateway?: string;
  /** Output link index. */
  index?: number;
  /** ECMP weight, 1..256. */
  weight?: number;
}

export interface Route {
  family: IpFamily;
  /** Network address; "0.0.0.0"/"::" with dstLen 0 for a default route. */
  dst: string;
  dstLen: number;
  table: number;
  protocol: number;
  scope: number;
  type: number;
  gateway?: string;
  /** Output link index (RTA_OIF). */
  index?: number;
  prefSrc?: string;
  priority?: number;
  mtu?: number;
  /** Present for ECMP routes (RTA_MULTIPATH). */
  nexthops?: Nexthop[];
}

export interface RouteSpec {
  /** "10.1.0.0/24", "fd00::/64", a bare address, or "default" (IPv4; "default" with a v6 gateway is v6). */
  dst: string;
  table?: number;
  gateway?: string;
  index?: number;
  /** Defaults to link scope for a device route without gateway, else universe. */
  scope?: number;
  prefSrc?: string;
  priority?: number;
  mtu?: number;
  protocol?: number;
  type?: number;
  nexthops?: Nexthop[];
}

function familyOf(spec: RouteSpec): IpFamily {
  if (spec.dst !== 'default') return parsePrefix(spec.dst).family;
  const gw = spec.gateway ?? spec.nexthops?.find((n) => n.gateway)?.gateway;
  return gw && ipFamily(gw) === 6 ? 6 : 4;
}

/** Human name used in errors and logs: "10.1.0.0/24 via 10.0.0.1 table 100". */
export function describeRoute(spec: RouteSpec): string {
  let d = spec.dst;
  if (spec.gateway) d += ` via ${spec.gateway}`;
  if (spec.nexthops) d += ` nexthops ${spec.nexthops.map((n) => n.gateway ?? `#${n.index}`).join(',')}`;
  if (spec.index !== undefined) d += ` dev #${spec.index}`;
  if (spec.table !== undefined && spec.table !== RT_TABLE_MAIN) d += ` table ${spec.table}`;
  return d;
}

export function encodeRoute(spec: RouteSpec, forDelete = false): Buffer[] {
  const family = familyOf(spec);
  const p = networkOf(parsePrefix(spec.dst, family));
  const table = spec.table ?? RT_TABLE_MAIN;
  const hasGw = spec.gateway !== undefined || (spec.nexthops ?? []).some((n) => n.gateway);
  const parts = [encodeRtMsg({
    family: family === 4 ? AF_INET : AF_INET6,
    dstLen: p.len,
    // Tables above 255 only fit in RTA_TABLE; rtm_table then says "look at the attribute".
    table: table > 255 ? RT_TABLE_COMPAT : table,
    protocol: forDelete ? 0 : spec.protocol ?? RTPROT_STATIC,
    scope: forDelete && spec.scope === undefined ? RT_SCOPE.NOWHERE : spec.scope ?? (hasGw ? RT_SCOPE.UNIVERSE : RT_SCOPE.LINK),
    type: forDelete && spec.type === undefined ? RTN.UNSPEC : spec.type ?? RTN.UNICAST,
  })];
  parts.push(attrU32(RTA.TABLE, table));
  if (p.len > 0) parts.push(attr(RTA.DST, ipToBytes(p.address)));
  if (spec.gateway) parts.push(attr(RTA.GATEWAY, ipToBytes(spec.gateway)));
  if (spec.index !== undefined) parts.push(attrU32(RTA.OIF, spec.index));
  if (spec.prefSrc) parts.push(attr(RTA.PREFSRC, ipToBytes(spec.prefSrc)));
  if (spec.priority !== undefined) parts.push(attrU32(RTA.PRIORITY, spec.priority));
  if (spec.mtu !== undefined) parts.push(nested(RTA.METRICS, [attrU32(RTAX_MTU, spec.mtu)]));
  if (spec.nexthops?.length) {
    const hops = spec.nexthops.map((n) => encodeRtNexthop(
      { hops: (n.weight ?? 1) - 1, index: n.index ?? 0 },
      n.gateway ? [attr(RTA.GATEWAY, ipToBytes(n.gateway))] : [],
    ));
    parts.push(attr(RTA.MULTIPATH, Buffer.concat(hops)));
  }
  return parts;
}

export function decodeRoute(m: NlMsg): Route {
  const h = decodeRtMsg(m.payload);
  const a = Attrs.parse(m.payload, RTMSG_LEN);
  const family: IpFamily = h.family === AF_INET6 ? 6 : 4;
  const dst = a.get(RTA.DST);
  const gw = a.get(RTA.GATEWAY);
  const src = a.get(RTA.PREFSRC);
  const r: Route = {
    family,
    dst: dst ? bytesToIp(dst) : family === 4 ? '0.0.0.0' : '::',
    dstLen: h.dstLen,
    table: a.u32(RTA.TABLE) ?? h.table,
    protocol: h.protocol,
    scope: h.scope,
    type: h.type,
    gateway: gw ? bytesToIp(gw) : undefined,
    index: a.u32(RTA.OIF),
    prefSrc: src ? bytesToIp(src) : undefined,
    priority: a.u32(RTA.PRIORITY),
  };
  const metrics = a.nested(RTA.METRICS);
  if (metrics) r.mtu = metrics.u32(RTAX_MTU);
  const mp = a.get(RTA.MULTIPATH);
  if (mp) {
    r.nexthops = [];
    let off = 0;
    while (off + RTNEXTHOP_LEN <= mp.length) {
      const len = mp.readUInt16LE(off);
      if (len < RTNEXTHOP_LEN || off + len > mp.length) break;
      const na = Attrs.parse(mp, off + RTNEXTHOP_LEN, off + len);
      const ngw = na.get(RTA.GATEWAY);
      r.nexthops.push({ gateway: ngw ? bytesToIp(ngw) : undefined, index: mp.readInt32LE(off + 4), weight: mp.readUInt8(off + 3) + 1 });
      off += (len + 3) & ~3;
    }
  }
  return r;
}

export function addRoute(s: NetlinkSocket, spec: RouteSpec): void {
  s.request(RTM.NEWROUTE, NLM_F_CREATE | NLM_F_EXCL, encodeRoute(spec), `RTM_NEWROUTE ${describeRoute(spec)}`);
}

export function replaceRoute(s: NetlinkSocket, spec: RouteSpec): void {
  s.request(RTM.NEWROUTE, NLM_F_CREATE | NLM_F_REPLACE, encodeRoute(spec), `RTM_NEWROUTE replace ${describeRoute(spec)}`);
}

/** Deletes the route matching dst/table and whatever else the spec names (gateway, device, metric). */
export function deleteRoute(s: NetlinkSocket, spec: RouteSpec): void {
  s.request(RTM.DELROUTE, 0, encodeRoute(spec, true), `RTM_DELROUTE ${describeRoute(spec)}`);
}

/** Routes of one family (or both), optionally of one table (filtered here; the dump covers all tables). */
export function listRoutes(s: NetlinkSocket, filter: { family?: IpFamily; table?: number } = {}): Route[] {
  const fam = filter.family === 4 ? AF_INET : filter.family === 6 ? AF_INET6 : AF_UNSPEC;
  return s.dump(RTM.GETROUTE, [encodeRtMsg({ family: fam })], 'RTM_GETROUTE dump')
    // Only IPv4/IPv6: the kernel also dumps multicast-routing (RTNL_FAMILY_IPMR…) entries.
    .filter((m) => { const f = m.payload.readUInt8(0); return f === AF_INET || f === AF_INET6; })
    .map(decodeRoute)
    .filter((r) => (filter.family === undefined || r.family === filter.family) && (filter.table === undefined || r.table === filter.table));
}
