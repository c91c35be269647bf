// Address operations over rtnetlink: add/del/list, IPv4 and IPv6, with prefix length, scope and label.
import { attr, attrStr, attrU32, Attrs, NlMsg } from './codec';
import { AF_INET, AF_INET6, AF_UNSPEC, IFA, IFA_F_NODAD, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REPLACE, RTM } from './constants';
import { bytesToIp, IpFamily, ipToBytes, parsePrefix } from '../../lib/ip';
import type { NetlinkSocket } from './socket';
import { decodeIfAddrMsg, encodeIfAddrMsg, IFADDRMSG_LEN } from './structs';

export interface Address {
  family: IpFamily;
  index: number;
  /** The interface's own address (IFA_LOCAL for IPv4, IFA_ADDRESS for IPv6). */
  address: string;
  prefixLen: number;
  scope: number;
  label?: string;
  /** IFA_FLAGS (32-bit) when present, else the 8-bit ifa_flags. */
  flags: number;
}

export interface AddressSpec {
  /** "10.0.0.1/24", "fd00::1/64" or a bare address (host prefix). */
  address: string;
  /** Link index. */
  index: number;
  scope?: number;
  /** IPv4 only; must start with the device name (kernel rule), e.g. "lo:vip". */
  label?: string;
  /** IPv6: skip duplicate address detection so the address is usable at once. */
  noDad?: boolean;
  /** Replace instead of failing with EEXIST. */
  replace?: boolean;
}

export function decodeAddress(m: NlMsg): Address {
  const h = decodeIfAddrMsg(m.payload);
  const a = Attrs.parse(m.payload, IFADDRMSG_LEN);
  const raw = a.get(IFA.LOCAL) ?? a.get(IFA.ADDRESS);
  return {
    family: h.family === AF_INET6 ? 6 : 4,
    index: h.index,
    address: raw ? bytesToIp(raw) : '',
    prefixLen: h.prefixLen,
    scope: h.scope,
    label: a.str(IFA.LABEL),
    flags: a.u32(IFA.FLAGS) ?? h.flags,
  };
}

function body(spec: AddressSpec): Buffer[] {
  const p = parsePrefix(spec.address);
  const bytes = ipToBytes(p.address);
  const parts = [
    encodeIfAddrMsg({ family: p.family === 4 ? AF_INET : AF_INET6, prefixLen: p.len, scope: spec.scope ?? 0, index: spec.index }),
    attr(IFA.LOCAL, bytes),
    attr(IFA.ADDRESS, bytes),
  ];
  if (spec.label !== undefined && p.family === 4) parts.push(attrStr(IFA.LABEL, spec.label));
  if (spec.noDad && p.family === 6) parts.push(attrU32(IFA.FLAGS, IFA_F_NODAD));
  return parts;
}

export function addAddress(s: NetlinkSocket, spec: AddressSpec): void {
  const flags = NLM_F_CREATE | (spec.replace ? NLM_F_REPLACE : NLM_F_EXCL);
  s.request(RTM.NEWADDR, flags, body(spec), `RTM_NEWADDR ${spec.address} dev #${spec.index}`);
}

export function deleteAddress(s: NetlinkSocket, spec: AddressSpec): void {
  s.request(RTM.DELADDR, 0, body(spec), `RTM_DELADDR ${spec.address} dev #${spec.index}`);
}

/** Addresses, optionally of one family and/or link (filtered here, so it works without strict checking). */
export function listAddresses(s: NetlinkSocket, filter: { family?: IpFamily; index?: number } = {}): Address[] {
  const fam = filter.family === 4 ? AF_INET : filter.family === 6 ? AF_INET6 : AF_UNSPEC;
  return s.dump(RTM.GETADDR, [encodeIfAddrMsg({ family: fam })], 'RTM_GETADDR dump')
    // Only IPv4/IPv6: the kernel also dumps multicast-routing (RTNL_FAMILY_IPMR…) entries.
    .filter((m) => { const f = m.payload.readUInt8(0); return f === AF_INET || f === AF_INET6; })
    .map(decodeAddress)
    .filter((a) => (filter.family === undefined || a.family === filter.family) && (filter.index === undefined || a.index === filter.index));
}
