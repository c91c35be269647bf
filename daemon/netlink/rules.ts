// Policy routing rule operations over rtnetlink: add/del/list with priority, table, from/to, fwmark, iif.
import { attr, attrStr, attrU32, Attrs, NlMsg } from './codec';
import { AF_INET, AF_INET6, AF_UNSPEC, FR_ACT_TO_TBL, FRA, NLM_F_CREATE, NLM_F_EXCL, RT_TABLE_COMPAT, RTM, RTPROT_STATIC } from './constants';
import { bytesToIp, IpFamily, ipToBytes, networkOf, parsePrefix } from '../../lib/ip';
import type { NetlinkSocket } from './socket';
import { decodeFibRuleHdr, encodeFibRuleHdr, FIB_RULE_HDR_LEN } from './structs';

export interface Rule {
  family: IpFamily;
  priority: number;
  table: number;
  action: number;
  src?: string;
  srcLen: number;
  dst?: string;
  dstLen: number;
  fwmark?: number;
  fwmask?: number;
  iifName?: string;
  oifName?: string;
}

export interface RuleSpec {
  family?: IpFamily;
  priority?: number;
  table: number;
  /** Prefixes; their family decides the rule's family when given. */
  from?: string;
  to?: string;
  fwmark?: number;
  fwmask?: number;
  iifName?: string;
}

function familyOf(spec: RuleSpec): IpFamily {
  if (spec.from) return parsePrefix(spec.from).family;
  if (spec.to) return parsePrefix(spec.to).family;
  return spec.family ?? 4;
}

export function describeRule(spec: RuleSpec): string {
  const parts = [`pref ${spec.priority ?? 'auto'}`];
  if (spec.from) parts.push(`from ${spec.from}`);
  if (spec.to) parts.push(`to ${spec.to}`);
  if (spec.fwmark !== undefined) parts.push(`fwmark 0x${spec.fwmark.toString(16)}`);
  if (spec.iifName) parts.push(`iif ${spec.iifName}`);
  parts.push(`table ${spec.table}`);
  return parts.join(' ');
}

function encodeRule(spec: RuleSpec): Buffer[] {
  const family = familyOf(spec);
  const from = spec.from ? networkOf(parsePrefix(spec.from)) : undefined;
  const to = spec.to ? networkOf(parsePrefix(spec.to)) : undefined;
  const parts = [encodeFibRuleHdr({
    family: family === 4 ? AF_INET : AF_INET6,
    srcLen: from?.len ?? 0,
    dstLen: to?.len ?? 0,
    table: spec.table > 255 ? RT_TABLE_COMPAT : spec.table,
    action: FR_ACT_TO_TBL,
  })];
  parts.push(attrU32(FRA.TABLE, spec.table));
  if (spec.priority !== undefined) parts.push(attrU32(FRA.PRIORITY, spec.priority));
  if (from && from.len > 0) parts.push(attr(FRA.SRC, ipToBytes(from.address)));
  if (to && to.len > 0) parts.push(attr(FRA.DST, ipToBytes(to.address)));
  if (spec.fwmark !== undefined) parts.push(attrU32(FRA.FWMARK, spec.fwmark));
  if (spec.fwmask !== undefined) parts.push(attrU32(FRA.FWMASK, spec.fwmask));
  if (spec.iifName) parts.push(attrStr(FRA.IIFNAME, spec.iifName));
  return parts;
}

export function decodeRule(m: NlMsg): Rule {
  const h = decodeFibRuleHdr(m.payload);
  const a = Attrs.parse(m.payload, FIB_RULE_HDR_LEN);
  const src = a.get(FRA.SRC);
  const dst = a.get(FRA.DST);
  return {
    family: h.family === AF_INET6 ? 6 : 4,
    // The kernel leaves FRA_PRIORITY out for priority 0 (the local-table rule).
    priority: a.u32(FRA.PRIORITY) ?? 0,
    table: a.u32(FRA.TABLE) ?? h.table,
    action: h.action,
    src: src ? bytesToIp(src) : undefined,
    srcLen: h.srcLen,
    dst: dst ? bytesToIp(dst) : undefined,
    dstLen: h.dstLen,
    fwmark: a.u32(FRA.FWMARK),
    fwmask: a.u32(FRA.FWMASK),
    iifName: a.str(FRA.IIFNAME),
    oifName: a.str(FRA.OIFNAME),
  };
}

export function addRule(s: NetlinkSocket, spec: RuleSpec): void {
  // FRA_PROTOCOL marks the rule as configured (not kernel default) for anyone reading `ip rule`.
  s.request(RTM.NEWRULE, NLM_F_CREATE | NLM_F_EXCL, [...encodeRule(spec), attr(FRA.PROTOCOL, Buffer.from([RTPROT_STATIC]))],
    `RTM_NEWRULE ${describeRule(spec)}`);
}

export function deleteRule(s: NetlinkSocket, spec: RuleSpec): void {
  s.request(RTM.DELRULE, 0, encodeRule(spec), `RTM_DELRULE ${describeRule(spec)}`);
}

export function listRules(s: NetlinkSocket, filter: { family?: IpFamily } = {}): Rule[] {
  const fam = filter.family === 4 ? AF_INET : filter.family === 6 ? AF_INET6 : AF_UNSPEC;
  return s.dump(RTM.GETRULE, [encodeFibRuleHdr({ family: fam })], 'RTM_GETRULE dump')
    // Only IPv4/IPv6: the kernel also dumps multicast-routing (RTNL_FAMILY_IPMR…) entries.
    .filter((m) => { const f = m.payload.readUInt8(0); return f === AF_INET || f === AF_INET6; })
    .map(decodeRule)
    .filter((r) => filter.family === undefined || r.family === filter.family);
}
