// Public surface of Tether's rtnetlink library.
export { NetlinkHandle } from './handle';
export { NetlinkSocket, type NetlinkSocketOptions } from './socket';
export { NetlinkError, isNetlinkError } from './netlink-error';
export type { Link, CreateLinkOptions, VethOptions } from './links';
export type { Address, AddressSpec } from './addresses';
export type { Route, RouteSpec, Nexthop } from './routes';
export type { Rule, RuleSpec } from './rules';
export type { Neighbour, NeighbourSpec } from './neighbours';
export { RT_SCOPE, RT_TABLE_MAIN, RT_TABLE_LOCAL, NUD, IFF_UP } from './constants';
