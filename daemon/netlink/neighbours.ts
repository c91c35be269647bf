// Neighbour (ARP / NDP) entry operations over rtnetlink: add/replace/del/list.
import { attr, Attrs, NlMsg } from './codec';
import { AF_INET, AF_INET6, AF_UNSPEC, NDA, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REPLACE, NUD, RTM } from './constants';
import { bytesToIp, bytesToMac, IpFamily, ipFamily, ipToBytes, macToBytes } from '../../lib/ip';
import type { NetlinkSocket } from './socket';
import { decodeNdMsg, encodeNdMsg, NDMSG_LEN } from './structs';

export interface Neighbour {
  family: IpFamily;
  index: number;
  address: string;
  lladdr?: string;
  /** NUD_* bits. */
  state: number;
  flags: number;
}

export interface NeighbourSpec {
  address: string;
  index: number;
  lladdr?: string;
  /** Defaults to NUD_PERMANENT. */
  state?: number;
  /** A proxy entry (NTF_PROXY): the host answers ARP/NDP for `address` on this link. */
  proxy?: boolean;
}

/** ndm_flags bit for proxy entries (linux/neighbour.h). */
export const NTF_PROXY = 0x08;

function encodeNeighbour(spec: NeighbourSpec): Buffer[] {
  const fam = ipFamily(spec.address);
  if (!fam) throw new Error(`'${spec.address}' is not an IP address`);
  const parts = [
    encodeNdMsg({ family: fam === 4 ? AF_INET : AF_INET6, index: spec.index, state: spec.state ?? NUD.PERMANENT, flags: spec.proxy ? NTF_PROXY : 0 }),
    attr(NDA.DST, ipToBytes(spec.address)),
  ];
  if (spec.lladdr) parts.push(attr(NDA.LLADDR, macToBytes(spec.lladdr)));
  return parts;
}

export function decodeNeighbour(m: NlMsg): Neighbour {
  const h = decodeNdMsg(m.payload);
  const a = Attrs.parse(m.payload, NDMSG_LEN);
  const dst = a.get(NDA.DST);
  const ll = a.get(NDA.LLADDR);
  return {
    family: h.family === AF_INET6 ? 6 : 4,
    index: h.index,
    address: dst ? bytesToIp(dst) : '',
    lladdr: ll && ll.length === 6 ? bytesToMac(ll) : undefined,
    state: h.state,
    flags: h.flags,
  };
}

function describe(spec: NeighbourSpec): string {
  return `${spec.proxy ? 'proxy ' : ''}${spec.address}${spec.lladdr ? ` lladdr ${spec.lladdr}` : ''} dev #${spec.index}`;
}

export function addNeighbour(s: NetlinkSocket, spec: NeighbourSpec): void {
  s.request(RTM.NEWNEIGH, NLM_F_CREATE | NLM_F_EXCL, encodeNeighbour(spec), `RTM_NEWNEIGH ${describe(spec)}`);
}

export function replaceNeighbour(s: NetlinkSocket, spec: NeighbourSpec): void {
  s.request(RTM.NEWNEIGH, NLM_F_CREATE | NLM_F_REPLACE, encodeNeighbour(spec), `RTM_NEWNEIGH replace ${describe(spec)}`);
}

export function deleteNeighbour(s: NetlinkSocket, spec: NeighbourSpec): void {
  s.request(RTM.DELNEIGH, 0, encodeNeighbour(spec), `RTM_DELNEIGH ${describe(spec)}`);
}

/** Only IPv4/IPv6 entries (the dump may also contain bridge FDB-like families, skipped here). */
export function listNeighbours(s: NetlinkSocket, filter: { family?: IpFamily; index?: number; proxy?: boolean } = {}): Neighbour[] {
  const fam = filter.family === 4 ? AF_INET : filter.family === 6 ? AF_INET6 : AF_UNSPEC;
  // Proxy entries live in a separate table the kernel dumps only when the request carries NTF_PROXY.
  return s.dump(RTM.GETNEIGH, [encodeNdMsg({ family: fam, flags: filter.proxy ? NTF_PROXY : 0 })], 'RTM_GETNEIGH dump')
    .filter((m) => { const f = m.payload.readUInt8(0); return f === AF_INET || f === AF_INET6; })
    .map(decodeNeighbour)
    .filter((n) => (filter.family === undefined || n.family === filter.family) && (filter.index === undefined || n.index === filter.index));
}
