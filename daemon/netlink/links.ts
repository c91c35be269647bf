// Link operations over rtnetlink: list/get (kind, MTU, flags, veth peer index and netns id, master),
// set MTU and up/down, create dummy and veth (peer optionally in another netns), delete.
import * as fs from 'node:fs';
import * as crypto from 'node:crypto';
import { attr, attrS32, attrStr, attrU32, Attrs, nested, NlMsg } from './codec';
import {
  AF_UNSPEC, IFF_LOWER_UP, IFF_RUNNING, IFF_UP, IFLA, IFLA_INFO_DATA, IFLA_INFO_KIND, NLM_F_CREATE, NLM_F_ECHO,
  NLM_F_EXCL, RTM, VETH_INFO_PEER,
} from './constants';
import { bytesToMac, macToBytes } from '../../lib/ip';
import { isNetlinkError, NetlinkError } from './netlink-error';
import type { NetlinkSocket } from './socket';
import { decodeIfInfoMsg, encodeIfInfoMsg } from './structs';

export interface Link {
  index: number;
  name: string;
  /** IFLA_INFO_KIND ("veth", "dummy", "bridge"…); undefined for lo and physical devices. */
  kind?: string;
  mtu: number;
  flags: number;
  up: boolean;
  mac?: string;
  /** IFLA_LINK: for a veth, the peer's ifindex (in the namespace named by linkNetnsId when set). */
  linkIndex?: number;
  /** IFLA_LINK_NETNSID: the peer lives in another namespace, known here by this id. */
  linkNetnsId?: number;
  master?: number;
}

export function decodeLink(m: NlMsg): Link {
  const hdr = decodeIfInfoMsg(m.payload);
  const a = Attrs.parse(m.payload, 16);
  const info = a.nested(IFLA.LINKINFO);
  const mac = a.get(IFLA.ADDRESS);
  const kind = info?.str(IFLA_INFO_KIND);
  const netnsId = a.s32(IFLA.LINK_NETNSID);
  let link = a.s32(IFLA.LINK);
  // The kernel omits IFLA_LINK when it equals the device's own index, which happens for a veth whose
  // peer sits in another namespace under the same ifindex: the peer index is then our own.
  if (link === undefined && kind === 'veth' && netnsId !== undefined) link = hdr.index;
  return {
    index: hdr.index,
    name: a.str(IFLA.IFNAME) ?? '',
    kind,
    mtu: a.u32(IFLA.MTU) ?? 0,
    flags: hdr.flags,
    up: (hdr.flags & IFF_UP) !== 0,
    mac: mac && mac.length === 6 ? bytesToMac(mac) : undefined,
    // 0 means a veth whose peer is already gone.
    linkIndex: link !== undefined && link !== 0 ? link : undefined,
    linkNetnsId: netnsId,
    master: a.u32(IFLA.MASTER),
  };
}

export function listLinks(s: NetlinkSocket): Link[] {
  return s.dump(RTM.GETLINK, [encodeIfInfoMsg({ family: AF_UNSPEC })], 'RTM_GETLINK dump').map(decodeLink);
}

/** The link with this name or index; undefined when it does not exist (ENODEV). */
export function getLink(s: NetlinkSocket, nameOrIndex: string | number): Link | undefined {
  const byIndex = typeof nameOrIndex === 'number';
  const body = [encodeIfInfoMsg({ index: byIndex ? nameOrIndex : 0 })];
  if (!byIndex) body.push(attrStr(IFLA.IFNAME, nameOrIndex));
  try {
    const r = s.request(RTM.GETLINK, 0, body, `RTM_GETLINK ${nameOrIndex}`);
    return r.length ? decodeLink(r[0]) : undefined;
  } catch (e) {
    if (isNetlinkError(e, 'ENODEV')) return undefined;
    throw e;
  }
}

/** Like getLink but a missing link is an error naming it. */
export function requireLink(s: NetlinkSocket, nameOrIndex: string | number): Link {
  const l = getLink(s, nameOrIndex);
  if (!l) throw new NetlinkError(`RTM_GETLINK ${nameOrIndex}`, 19 /* ENODEV */);
  return l;
}

function indexOf(s: NetlinkSocket, link: string | number): number {
  return typeof link === 'number' ? link : requireLink(s, link).index;
}

export function setLinkMtu(s: NetlinkSocket, link: string | number, mtu: number): void {
  const index = indexOf(s, link);
  s.request(RTM.NEWLINK, 0, [encodeIfInfoMsg({ index }), attrU32(IFLA.MTU, mtu)], `RTM_NEWLINK ${link} mtu ${mtu}`);
}

export function setLinkUp(s: NetlinkSocket, link: string | number, up: boolean): void {
  const index = indexOf(s, link);
  s.request(RTM.NEWLINK, 0, [encodeIfInfoMsg({ index, flags: up ? IFF_UP : 0, change: IFF_UP })], `RTM_NEWLINK ${link} ${up ? 'up' : 'down'}`);
}

export interface CreateLinkOptions {
  mtu?: number;
  mac?: string;
}

/**
 * Creates a dummy link, up at once with `up` (one request instead of two). Returns the new link as the
 * kernel echoes it (NLM_F_ECHO: index and MAC without another request; Linux 6.3 and later), or undefined
 * where the kernel does not echo a created link.
 */
export function createDummy(s: NetlinkSocket, name: string, opts: CreateLinkOptions & { up?: boolean } = {}): Link | undefined {
  const replies = s.request(RTM.NEWLINK, NLM_F_CREATE | NLM_F_EXCL | NLM_F_ECHO, [
    encodeIfInfoMsg(opts.up ? { flags: IFF_UP, change: IFF_UP } : {}),
    attrStr(IFLA.IFNAME, name),
    ...commonAttrs(opts),
    nested(IFLA.LINKINFO, [attrStr(IFLA_INFO_KIND, 'dummy')]),
  ], `RTM_NEWLINK ${name} type dummy`);
  for (const m of replies) {
    if (m.type !== RTM.NEWLINK) continue;
    const l = decodeLink(m);
    if (l.name === name && l.index > 0) return l;
  }
  return undefined;
}

export interface VethOptions extends CreateLinkOptions {
  peerMac?: string;
  /** Open fd of a network namespace (e.g. fs.openSync('/run/netns/x')) to create the peer in. */
  peerNetnsFd?: number;
  /** Same, by path; opened and closed here. */
  peerNetns?: string;
}

export function createVeth(s: NetlinkSocket, name: string, peerName: string, opts: VethOptions = {}): void {
  let fd = opts.peerNetnsFd;
  const opened = fd === undefined && opts.peerNetns !== undefined;
  if (opened) fd = fs.openSync(opts.peerNetns!, 'r');
  try {
    const peerAttrs = [attrStr(IFLA.IFNAME, peerName), ...commonAttrs({ mtu: opts.mtu, mac: opts.peerMac })];
    if (fd !== undefined) peerAttrs.push(attrS32(IFLA.NET_NS_FD, fd));
    // VETH_INFO_PEER carries a whole ifinfomsg followed by the peer's attributes.
    const peer = attr(VETH_INFO_PEER, Buffer.concat([encodeIfInfoMsg(), ...peerAttrs]));
    s.request(RTM.NEWLINK, NLM_F_CREATE | NLM_F_EXCL, [
      encodeIfInfoMsg(),
      attrStr(IFLA.IFNAME, name),
      ...commonAttrs(opts),
      nested(IFLA.LINKINFO, [attrStr(IFLA_INFO_KIND, 'veth'), nested(IFLA_INFO_DATA, [peer])]),
    ], `RTM_NEWLINK ${name} type veth peer ${peerName}${opts.peerNetns ? ` netns ${opts.peerNetns}` : ''}`);
  } finally {
    if (opened && fd !== undefined) fs.closeSync(fd);
  }
}

function commonAttrs(o: CreateLinkOptions): Buffer[] {
  const out: Buffer[] = [];
  if (o.mtu !== undefined) out.push(attrU32(IFLA.MTU, o.mtu));
  if (o.mac !== undefined) out.push(attr(IFLA.ADDRESS, macToBytes(o.mac)));
  return out;
}

export function deleteLink(s: NetlinkSocket, link: string | number): void {
  const index = indexOf(s, link);
  s.request(RTM.DELLINK, 0, [encodeIfInfoMsg({ index })], `RTM_DELLINK ${link}`);
}

let dummyCache: boolean | undefined;

/**
 * Whether the kernel can create `dummy` links (built in or loadable). Probed once per process by
 * creating and deleting a randomly named dummy; a kernel without it answers EOPNOTSUPP
 * ("Unknown device type"). Other errors are real failures and are thrown.
 */
export function kernelHasDummy(s: NetlinkSocket): boolean {
  if (dummyCache !== undefined) return dummyCache;
  const name = `tdp${crypto.randomBytes(4).toString('hex')}`;
  try {
    createDummy(s, name);
  } catch (e) {
    if (isNetlinkError(e, 'EOPNOTSUPP')) return (dummyCache = false);
    throw e;
  }
  deleteLink(s, name);
  return (dummyCache = true);
}

export function linkIsRunning(l: Link): boolean {
  return (l.flags & IFF_RUNNING) !== 0 && (l.flags & IFF_LOWER_UP) !== 0;
}
