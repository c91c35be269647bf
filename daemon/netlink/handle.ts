// NetlinkHandle: the entry point for rtnetlink work in one network namespace. open(nsPath) creates the
// socket inside that namespace (via inNetns) and all later calls run from the daemon's own thread,
// because a netlink socket keeps the namespace it was created in. Synchronous by design (~1 ms a call).
import { inNetns } from '../sys/netns';
import * as addresses from './addresses';
import * as links from './links';
import * as neighbours from './neighbours';
import * as routes from './routes';
import * as rules from './rules';
import { NetlinkSocket, NetlinkSocketOptions } from './socket';
import type { IpFamily } from '../../lib/ip';

export class NetlinkHandle {
  readonly socket: NetlinkSocket;
  /** The namespace path the handle was opened in; undefined means the daemon's own namespace. */
  readonly nsPath?: string;

  private constructor(socket: NetlinkSocket, nsPath?: string) {
    this.socket = socket;
    this.nsPath = nsPath;
  }

  /** Throws TetherError(NETNS_GONE) when nsPath cannot be opened. */
  static open(nsPath?: string, opts: NetlinkSocketOptions = {}): NetlinkHandle {
    const sock = nsPath ? inNetns(nsPath, () => NetlinkSocket.open(opts)) : NetlinkSocket.open(opts);
    return new NetlinkHandle(sock, nsPath);
  }

  /** Runs fn with a handle for nsPath and always closes it. */
  static with<T>(nsPath: string | undefined, fn: (h: NetlinkHandle) => T): T {
    const h = NetlinkHandle.open(nsPath);
    try {
      return fn(h);
    } finally {
      h.close();
    }
  }

  /** Idempotent. */
  close(): void {
    this.socket.close();
  }

  // Links
  listLinks(): links.Link[] { return links.listLinks(this.socket); }
  getLink(nameOrIndex: string | number): links.Link | undefined { return links.getLink(this.socket, nameOrIndex); }
  requireLink(nameOrIndex: string | number): links.Link { return links.requireLink(this.socket, nameOrIndex); }
  setLinkMtu(link: string | number, mtu: number): void { links.setLinkMtu(this.socket, link, mtu); }
  setLinkUp(link: string | number, up = true): void { links.setLinkUp(this.socket, link, up); }
  createDummy(name: string, opts?: links.CreateLinkOptions & { up?: boolean }): links.Link | undefined { return links.createDummy(this.socket, name, opts); }
  createVeth(name: string, peerName: string, opts?: links.VethOptions): void { links.createVeth(this.socket, name, peerName, opts); }
  deleteLink(link: string | number): void { links.deleteLink(this.socket, link); }
  kernelHasDummy(): boolean { return links.kernelHasDummy(this.socket); }

  // Addresses
  listAddresses(filter?: { family?: IpFamily; index?: number }): addresses.Address[] { return addresses.listAddresses(this.socket, filter); }
  addAddress(spec: addresses.AddressSpec): void { addresses.addAddress(this.socket, spec); }
  deleteAddress(spec: addresses.AddressSpec): void { addresses.deleteAddress(this.socket, spec); }

  // Routes
  listRoutes(filter?: { family?: IpFamily; table?: number }): routes.Route[] { return routes.listRoutes(this.socket, filter); }
  addRoute(spec: routes.RouteSpec): void { routes.addRoute(this.socket, spec); }
  replaceRoute(spec: routes.RouteSpec): void { routes.replaceRoute(this.socket, spec); }
  deleteRoute(spec: routes.RouteSpec): void { routes.deleteRoute(this.socket, spec); }

  // Rules
  listRules(filter?: { family?: IpFamily }): rules.Rule[] { return rules.listRules(this.socket, filter); }
  addRule(spec: rules.RuleSpec): void { rules.addRule(this.socket, spec); }
  deleteRule(spec: rules.RuleSpec): void { rules.deleteRule(this.socket, spec); }

  // Neighbours
  listNeighbours(filter?: { family?: IpFamily; index?: number; proxy?: boolean }): neighbours.Neighbour[] { return neighbours.listNeighbours(this.socket, filter); }
  addNeighbour(spec: neighbours.NeighbourSpec): void { neighbours.addNeighbour(this.socket, spec); }
  replaceNeighbour(spec: neighbours.NeighbourSpec): void { neighbours.replaceNeighbour(this.socket, spec); }
  deleteNeighbour(spec: neighbours.NeighbourSpec): void { neighbours.deleteNeighbour(this.socket, spec); }
}
