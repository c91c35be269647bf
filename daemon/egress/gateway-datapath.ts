// The gateway side of an Egress, per gateway pod: FoU decapsulation on the pod's eth0, forwarding and a
// conntrack-active nftables table in the pod (standbys too, so synced entries work the moment they take
// over), and — while the pod owns floating addresses — the address on the pod, SNAT to it, the node's
// route to the pod's veth and the announcement. Every step is idempotent and undone on stand-down.
// Floating addresses are IPv4 or IPv6; each family has its own nftables table in the pod (`ip` and `ip6`
// tether_egress): a pod prepared by a release without IPv6 has the `ip` table, and it stays as it was.
import { execFileSync, spawn } from 'node:child_process';
import { attachFouDecap, detachFou, type FouDecap } from '../bpf/fou';
import { EgressGuard, type GuardStats } from '../bpf/egress-guard';
import { NetlinkHandle, isNetlinkError } from '../netlink';
import { writeNetSysctl } from '../sys/netns';
import { ErrorCode, TetherError } from '../../lib/errors';
import { hostPrefix, ipFamily, parseIp } from '../../lib/ip';
import { log } from '../../lib/log';
import { announceL2, withdrawL2 } from './announce-l2';
import type { AnnounceMode } from './egress-spec';

export interface GatewayPod {
  /** "namespace/name" */
  pod: string;
  netns: string;
  /** The pod's own IPv4 address; without it (an IPv6-only pod) the pod cannot own IPv4 floating addresses. */
  podIp?: string;
  /** The pod's own IPv6 address; without it the pod cannot own IPv6 floating addresses. */
  podIp6?: string;
  ifName: string;
  hostIfName: string;
}

/** What the node's guard on the pod's veth enforces: toward these destinations, owned floating sources only. */
export interface GuardedDestinations {
  destinations: string[];
  /** Ranges inside them that are not guarded (cluster ranges, excludeDestinations). */
  excluded: string[];
}

export interface NodeSide {
  /** The node's uplink on the L2 segment (l2 announcements go out here). */
  uplink: string;
  fouPort: number;
  pinDir: string;
}

const TABLE = 'tether_egress';
/** Mark of decapsulated packets naming a floating address by its low 16 bits; must match FOU_FLOAT_MARK in bpf/fou.h. */
export const FLOAT_MARK = 0x7e7e0000;

/** The mark fou-decap gives packets pinned to `address` (IPv4 or IPv6); undefined when its low 16 bits are 0. */
export function floatMark(address: string): number | undefined {
  const low = Number((parseIp(address)?.value ?? 0n) & 0xffffn);
  return low ? (FLOAT_MARK | low) >>> 0 : undefined;
}


export class GatewayDatapath {
  private decap?: FouDecap;
  private guard?: EgressGuard;
  private guarded: GuardedDestinations = { destinations: [], excluded: [] };
  private nodeAddresses: string[] = [];
  private readonly owned = new Map<string, { mode: AnnounceMode; table?: number }>();
  /** Addresses takeUnannounced() set up on the pod (SNAT written) that own() has not announced yet. */
  private readonly prepared = new Set<string>();
  /** The SNAT writer (writeSnat): changes asked for, whether an nft run is going, who waits for which change. */
  private snatWanted = 0;
  private snatRunning = false;
  private snatWaiters: Array<{ change: number; resolve: () => void; reject: (e: Error) => void }> = [];
  /** Addresses anticipate() let the pod use as a source, with the timer that takes that back. */
  private readonly anticipated = new Map<string, NodeJS.Timeout>();

  constructor(
    readonly gw: GatewayPod,
    private readonly node: NodeSide,
  ) {}

  /**
   * Prepares the pod as a gateway (decap, forwarding, nft table, the node's source guard on its veth).
   * Idempotent. allowedSources: the node addresses FoU may come from (and that the pod may answer with its
   * own address: probes from nodes).
   */
  prepare(allowedSources: string[], guarded: GuardedDestinations = this.guarded): void {
    const ns = this.gw.netns;
    for (const [k, v] of [
      ['net/ipv4/ip_forward', '1'],
      // Decapsulated client packets leave through the interface they came in on: no redirects, no
      // reverse-path check against the pod's own routes.
      ['net/ipv4/conf/all/send_redirects', '0'],
      [`net/ipv4/conf/${this.gw.ifName}/send_redirects`, '0'],
      ['net/ipv4/conf/all/rp_filter', '0'],
      [`net/ipv4/conf/${this.gw.ifName}/rp_filter`, '0'],
      // Never adopt a TCP flow in mid-stream: a gateway forwards (and NATs) only connections it saw
      // open or received through conntrack sync, so a packet is not trusted just because it arrived.
      ['net/netfilter/nf_conntrack_tcp_loose', '0'],
      // While ownership moves, the two directions of a flow switch gateways at different moments
      // (clients steer by the store's notice, the return path by the new owner's GARP or a BGP update),
      // so each gateway sees segments acknowledging data that went through the other one. Strict window
      // tracking marks those invalid and the drop below loses them (one TCP retransmission timeout per
      // flow). Liberal tracking accepts them for flows that have an entry; packets with no entry are
      // still invalid (tcp_loose 0 above), so nothing is adopted and nothing reaches the pod's own stack.
      ['net/netfilter/nf_conntrack_tcp_be_liberal', '1'],
    ]) writeNetSysctl(ns, k, v);
    // Replies the gateway de-NATs come back with the external server as source through its veth.
    writeNetSysctl(null, `net/ipv4/conf/${this.gw.hostIfName}/rp_filter`, '2');
    // Invalid packets are dropped before routing: a reply that misses conntrack would otherwise be
    // delivered to the floating address on the pod itself, whose TCP stack answers with a RST that kills
    // the connection at the server.
    // A forwarded packet that starts a flow and finds no SNAT rule (a standby, or an owner in the
    // milliseconds before own() writes its rule) must not be let through: its conntrack entry would keep
    // that "no NAT" binding for the flow's whole life (a UDP stream, a retransmitted SYN), so every later
    // packet would leave un-NATed and be dropped by the node's guard. The unnated chain runs after the
    // SNAT chain; the kernel skips it once a binding is set, so it drops exactly the unbound ones, and
    // their entries are never confirmed: the flow's next packet starts over and is NATed once the rule is
    // there. Chains are declared with add (kept when they exist) and their rules replaced, so a restarted
    // tetherd re-running this duplicates nothing and leaves the SNAT rule of an owned address in place.
    let tables = this.gw.podIp ? tableScript('ip', this.gw.podIp, this.gw.ifName) : '';
    if (this.gw.podIp6) {
      // A forwarding IPv6 stack ignores router advertisements (accept_ra 1 applies only while not
      // forwarding): the pod's routes are the CNI's and do not move under a gateway. IPv6 has no
      // send_redirects or rp_filter knob: redirects are dropped in the ip6 table's output chain.
      writeNetSysctl(ns, 'net/ipv6/conf/all/forwarding', '1');
      tables += tableScript('ip6', this.gw.podIp6, this.gw.ifName);
    }
    this.nft(tables);
    if (!this.decap) {
      // Outer IPv6 to the pod's IPv6 address (clients reach a pod without IPv4, or any over an IPv6 underlay,
      // that way), marked by its flow label as outer IPv4 is by its IP ID.
      this.decap = attachFouDecap({
        netns: ns, ifName: this.gw.ifName, port: this.node.fouPort, allowedSources,
        ...(this.gw.podIp ? { localAddress: this.gw.podIp } : {}), ...(this.gw.podIp6 ? { localAddress6: this.gw.podIp6, markFromLabel: true } : {}),
      });
    } else this.decap.setAllowedSources(allowedSources);
    this.guarded = guarded;
    this.nodeAddresses = allowedSources;
    if (!this.guard) {
      this.guard = EgressGuard.attach({ hostIfName: this.gw.hostIfName, ...(this.gw.podIp ? { podIp: this.gw.podIp } : {}), ...(this.gw.podIp6 ? { podIp6: this.gw.podIp6 } : {}), pinDir: this.node.pinDir, ...this.guardSet() });
    } else this.setGuard();
  }

  setAllowedSources(sources: string[]): void {
    this.decap?.setAllowedSources(sources);
    this.nodeAddresses = sources;
    this.setGuard();
  }

  /** The guard's per-reason counters (undefined before prepare). */
  guardStats(): GuardStats | undefined {
    return this.guard?.stats();
  }

  /** What the guard enforces: the Egresses' destinations of both families, less what is excluded and the nodes' own addresses. */
  private guardSet(): GuardedDestinations {
    return {
      destinations: this.guarded.destinations,
      excluded: [...this.guarded.excluded, ...this.nodeAddresses.map(hostPrefix)],
    };
  }

  private setGuard(): void {
    const g = this.guardSet();
    this.guard?.setDestinations(g.destinations, g.excluded);
  }

  /**
   * The pod side of taking an address, without attracting any traffic: the guard, the address on the pod
   * and SNAT to it. A first owner does this before its claim is recorded (the store publishes the record
   * at once, and clients that steered to a pod without its SNAT rule lost their first SYNs to the pod's
   * unNATed drop: a 1 s retransmission timeout); own() then adds the route and the announcement. A lost
   * claim is undone with release().
   */
  async takeUnannounced(address: string, announce: { mode: AnnounceMode; table?: number }): Promise<void> {
    const t0 = process.hrtime.bigint();
    this.checkCanOwn(address);
    this.owned.set(address, announce);
    this.guardOwn(address);
    this.addPodAddress(address);
    await this.writeSnat();
    this.prepared.add(address);
    log().info('egress: floating address prepared on gateway (not announced)', { pod: this.gw.pod, address, ms: Number(process.hrtime.bigint() - t0) / 1e6 });
  }

  /**
   * Lets the pod use `address` as a source for `ms` before it is handed the address, unless own() takes it
   * meanwhile. For a failover from a pod that held several addresses: their notices reach every node at
   * once, clients steer each to this pod as soon as they read it, and this node reads (and takes) them one
   * after the other, so its guard would drop what the pod forwards from the later ones in between. Only
   * the guard entry: no address, route, announcement or SNAT, so nothing attracts traffic here, and the
   * entry goes after `ms` if the address went elsewhere.
   */
  anticipate(address: string, ms: number): boolean {
    if (this.owned.has(address) || !this.guard) return false;
    this.checkCanOwn(address);
    this.guard.anticipate(address);
    // One timer per address: anticipated again, the entry lasts from now; owned or released, it is the
    // owner's (guardOwn and release cancel the timer), so a late timer never takes a source away.
    this.cancelAnticipation(address);
    const timer = setTimeout(() => {
      this.anticipated.delete(address);
      try {
        this.guard?.release(address);
      } catch (e) {
        log().warn('egress: guard release failed', { pod: this.gw.pod, address, error: (e as Error).message });
      }
    }, ms);
    timer.unref();
    this.anticipated.set(address, timer);
    return true;
  }

  /**
   * Takes a floating address: on the pod, SNAT to it, node route, announcement. Idempotent. Everything but
   * SNAT is done when the call returns its promise (netlink, synchronously); the promise resolves once SNAT
   * is written too. The nft run is not waited for synchronously: when a dying pod held several addresses,
   * their notices reach this node together, and each address's guard, route and announcement must not
   * wait behind the previous address's nft run (20-40 ms on a busy node), while clients already steer all
   * of them here and this node's guard drops what the pod sends from an address not yet taken.
   */
  async own(address: string, announce: { mode: AnnounceMode; table?: number }): Promise<void> {
    const t0 = process.hrtime.bigint();
    const since = () => Number(process.hrtime.bigint() - t0) / 1e6;
    this.checkCanOwn(address);
    const prepared = this.prepared.delete(address);
    this.owned.set(address, announce);
    // The node lets the pod use the address as a source before anything can send with it.
    this.guardOwn(address);
    const guardMs = since();
    // Established flows need only the address on the pod (the node's /32 route to the veth resolves the
    // address itself there), the node's route and the announcement: the pod de-NATs their replies from
    // the synced conntrack entries. So these go first, all netlink; every millisecond before the router
    // moves is a millisecond of replies lost at the old owner's node.
    this.addPodAddress(address);
    const podMs = since();
    NetlinkHandle.with(undefined, (h) => {
      const veth = h.requireLink(this.gw.hostIfName);
      // IPv6 goes through the pod's own address: the pod answers neighbour solicitations only for
      // addresses on the link they arrive on, and the floating address is on its lo.
      const via = ipFamily(address) === 6 ? { gateway: this.gw.podIp6 } : {};
      h.replaceRoute({ dst: hostPrefix(address), index: veth.index, ...via });
      if (announce.mode === 'routeTable') h.replaceRoute({ dst: hostPrefix(address), index: veth.index, table: announce.table, ...via });
    });
    const routeMs = since();
    if (announce.mode === 'l2') announceL2({ ifName: this.node.uplink, address, holder: this.gw.pod });
    const announcedMs = since();
    // Then what only new flows need: the SNAT rule (an nft run, the slow part), unless takeUnannounced() wrote it.
    if (!prepared) await this.writeSnat();
    log().info('egress: floating address taken by gateway', { pod: this.gw.pod, address, announce: announce.mode, table: exportTable(announce), guardMs, podMs, routeMs, announcedMs, ms: since() });
  }



  /**
   * First step of a planned handover: stop attracting traffic to this node at once while SNAT and the
   * route to the pod stay for the drain. l2: stop answering ARP for the address (the new owner's
   * gratuitous ARP must not be undone by this node's proxy answers); routeTable: take the /32 out of the
   * route-export table, so the BGP speaker withdraws it upstream. Idempotent.
   */
  withdrawAnnouncement(address: string): void {
    const announce = this.owned.get(address);
    if (announce?.mode === 'l2') withdrawL2({ ifName: this.node.uplink, address, holder: this.gw.pod });
    const table = announce && exportTable(announce);
    if (table === undefined) return;
    const removed = NetlinkHandle.with(undefined, (h) => this.deletePodRoute(h, address, table));
    log().info('egress: floating address withdrawn from the route-export table', { pod: this.gw.pod, address, table, removed });
  }

  /**
   * Gives a floating address up. Idempotent; tolerates a pod that is already gone and an export route
   * that withdrawAnnouncement() already removed.
   */
  async release(address: string, configured?: { mode: AnnounceMode; table?: number }): Promise<void> {
    const { announce, table, exportRouteRemoved, routeRemoved } = this.unannounce(address, configured);
    try {
      await this.writeSnat();
      this.deletePodAddress(address);
    } catch (e) {
      // The pod (and its namespace) may be gone: then there is nothing left in it to undo.
      log().debug('egress: pod side of release skipped', { pod: this.gw.pod, address, error: (e as Error).message });
    }
    // Only now that SNAT to it is gone: from here on a packet with this source is dropped at the node.
    this.cancelAnticipation(address);
    try {
      this.guard?.release(address);
    } catch (e) {
      log().warn('egress: guard release failed', { pod: this.gw.pod, address, error: (e as Error).message });
    }
    log().info('egress: floating address released by gateway', { pod: this.gw.pod, address, announce: announce.mode, table, exportRouteRemoved, routeRemoved });
  }

  /** The node side of giving an address up: no longer owned here, its announcement and routes removed. */
  private unannounce(address: string, configured?: { mode: AnnounceMode; table?: number }) {
    // An address this process did not take (e.g. taken before a tetherd restart) is released as the
    // Egress configures it, so a route-export entry is not left behind.
    const announce = this.owned.get(address) ?? configured ?? { mode: 'l2' as const };
    this.owned.delete(address);
    this.prepared.delete(address);
    if (announce.mode === 'l2') withdrawL2({ ifName: this.node.uplink, address, holder: this.gw.pod });
    const table = exportTable(announce);
    // The announcement goes before the route it attracts traffic to.
    const [exportRouteRemoved, routeRemoved] = NetlinkHandle.with(undefined, (h) => [
      table === undefined ? undefined : this.deletePodRoute(h, address, table),
      this.deletePodRoute(h, address, undefined),
    ]);
    return { announce, table, exportRouteRemoved, routeRemoved };
  }

  private deletePodAddress(address: string): void {
    NetlinkHandle.with(this.gw.netns, (h) => {
      const lo = h.requireLink('lo');
      h.deleteAddress({ address: hostPrefix(address), index: lo.index });
    });
  }

  ownedAddresses(): string[] {
    return [...this.owned.keys()];
  }

  decapStats(): ReturnType<FouDecap['stats']> | undefined {
    return this.decap?.stats();
  }

  /** Removes everything: owned addresses, decap, nft table. Idempotent. */
  teardown(): void {
    // Synchronous: the nft tables (SNAT with them) and the guard go below, so only each address's
    // announcement, routes and place on the pod are undone one by one.
    for (const a of [...this.anticipated.keys()]) this.cancelAnticipation(a);
    for (const a of [...this.owned.keys()]) {
      this.unannounce(a);
      try {
        this.deletePodAddress(a);
      } catch {
        // the pod is gone, and the address with it
      }
    }
    try {
      this.decap?.detach();
    } catch {
      detachFou({ which: 'decap', netns: this.gw.netns, ifName: this.gw.ifName });
    }
    this.decap = undefined;
    this.guard?.detach();
    this.guard = undefined;
    for (const family of ['ip', 'ip6']) {
      try {
        this.nft(`delete table ${family} ${TABLE}`);
      } catch {
        // already gone with the pod (or an ip6 table never made: a pod without IPv6)
      }
    }
  }

  /**
   * Deletes this pod's /32 route for the address from one table (main when undefined); false when it was
   * not there. Only the route through this pod's veth: when another gateway pod of the node took the
   * address over, own() replaced the route with one through that pod's veth, and that one must stay.
   */
  private deletePodRoute(h: NetlinkHandle, address: string, table: number | undefined): boolean {
    const veth = h.getLink(this.gw.hostIfName);
    // The kernel removed the veth's routes with the veth.
    if (!veth) return false;
    try {
      h.deleteRoute({ dst: hostPrefix(address), table, index: veth.index });
      return true;
    } catch (e) {
      if (isNetlinkError(e, 'ESRCH', 'ENOENT')) return false;
      throw e;
    }
  }

  /**
   * SNAT of forwarded (decapsulated client) traffic; none while standby. A client pins each flow to one of
   * the Egress's addresses and its steering program puts the address's low 16 bits in the FoU packet's
   * outer IP ID, which fou-decap turns into the mark FLOAT_MARK | bits: the first packet of a flow is
   * SNATed to the owned address with those bits (later packets follow their conntrack entry). Unmarked
   * flows (or an address this pod does not hold) get the first owned address.
   */
  /**
   * Writes SNAT for the addresses owned now; resolves once an nft run that started after this call has
   * committed (rejects with its error). Runs are serialised per pod, so an older set never lands after a
   * newer one, and coalesced: one run covers every change asked for while the previous one ran.
   */
  private writeSnat(): Promise<void> {
    const change = ++this.snatWanted;
    const done = new Promise<void>((resolve, reject) => this.snatWaiters.push({ change, resolve, reject }));
    if (!this.snatRunning) void this.runSnatWrites();
    return done;
  }

  private async runSnatWrites(): Promise<void> {
    this.snatRunning = true;
    try {
      while (this.snatWaiters.length) {
        const upTo = this.snatWanted;
        let error: Error | undefined;
        try {
          await nftAsync(this.gw.netns, this.snatScriptOwned());
        } catch (e) {
          error = e as Error;
        }
        const settled = this.snatWaiters.filter((w) => w.change <= upTo);
        this.snatWaiters = this.snatWaiters.filter((w) => w.change > upTo);
        for (const w of settled) {
          if (error) w.reject(error);
          else w.resolve();
        }
      }
    } finally {
      this.snatRunning = false;
    }
  }

  private snatScriptOwned(): string {
    const owned = [...this.owned.keys()];
    let script = this.gw.podIp ? this.snatScript('ip', this.gw.podIp, owned.filter((a) => ipFamily(a) === 4)) : '';
    if (this.gw.podIp6) script += this.snatScript('ip6', this.gw.podIp6, owned.filter((a) => ipFamily(a) === 6));
    return script;
  }

  /** One family's postrouting chain: SNAT by mark, then the first owned address of that family. */
  private snatScript(family: NftFamily, podIp: string, owned: string[]): string {
    const base = `add rule ${family} ${TABLE} postrouting ${family} saddr != ${podIp} oifname "${this.gw.ifName}"`;
    const byMark = new Map<number, string>();
    for (const a of owned) {
      const m = floatMark(a);
      if (m === undefined) continue;
      if (byMark.has(m)) log().warn('egress: two owned addresses share their low 16 bits; flows pinned to the second get the first', { pod: this.gw.pod, first: byMark.get(m), second: a });
      else byMark.set(m, a);
    }
    let rules = '';
    if (byMark.size) rules += `${base} meta mark & 0xffff0000 == 0x${FLOAT_MARK.toString(16)} snat to meta mark map { ${[...byMark].map(([m, a]) => `0x${m.toString(16)} : ${a}`).join(', ')} }\n`;
    if (owned.length) rules += `${base} snat to ${owned[0]}\n`;
    return `flush chain ${family} ${TABLE} postrouting\n${rules}`;
  }

  /**
   * Refuses an address the pod cannot hold before anything is changed: an IPv6 address needs the pod's
   * own IPv6 address (its ip6 table's rules and the node's route go through it).
   */
  private checkCanOwn(address: string): void {
    const family = ipFamily(address);
    if (!family) throw new TetherError(ErrorCode.InvalidConfig, `gateway pod ${this.gw.pod}: floating address '${address}' is not an IP address`);
    if (family === 4 && !this.gw.podIp) {
      throw new TetherError(ErrorCode.InvalidConfig, `gateway pod ${this.gw.pod} has no IPv4 address: it cannot own the IPv4 floating address ${address}`);
    }
    if (family === 6 && !this.gw.podIp6) {
      throw new TetherError(ErrorCode.InvalidConfig, `gateway pod ${this.gw.pod} has no IPv6 address: it cannot own the IPv6 floating address ${address}`);
    }
  }

  private cancelAnticipation(address: string): void {
    clearTimeout(this.anticipated.get(address));
    this.anticipated.delete(address);
  }

  private guardOwn(address: string): void {
    this.cancelAnticipation(address);
    this.guard?.own(address);
  }

  /** The address on the pod's lo; IPv6 without duplicate address detection, so it is usable at once. */
  private addPodAddress(address: string): void {
    NetlinkHandle.with(this.gw.netns, (h) => {
      const lo = h.requireLink('lo');
      h.addAddress({ address: hostPrefix(address), index: lo.index, replace: true, ...(ipFamily(address) === 6 ? { noDad: true } : {}) });
    });
  }

  private nft(script: string): void {
    execFileSync('nsenter', [`--net=${this.gw.netns}`, 'nft', '-f', '-'], { input: script, stdio: ['pipe', 'ignore', 'pipe'] });
  }
}

/** nft -f - in a network namespace without blocking the event loop; rejects with nft's own message. */
function nftAsync(netns: string, script: string): Promise<void> {
  return new Promise((resolve, reject) => {
    const child = spawn('nsenter', [`--net=${netns}`, 'nft', '-f', '-'], { stdio: ['pipe', 'ignore', 'pipe'] });
    let stderr = '';
    child.stderr.on('data', (b: Buffer) => {
      stderr += b.toString();
    });
    child.on('error', reject);
    child.on('close', (code) => {
      if (code === 0) resolve();
      else reject(new Error(`nft in ${netns} exited with ${code}: ${stderr.trim()}`));
    });
    child.stdin.on('error', () => undefined); // a child that failed to start: its 'error' or 'close' says why
    child.stdin.end(script);
  });
}

type NftFamily = 'ip' | 'ip6';

/**
 * One family's tether_egress table, chains declared with add (kept when they exist) and their rules
 * replaced, so running it again duplicates nothing and leaves the postrouting (SNAT) chain as it is.
 */
function tableScript(family: NftFamily, podIp: string, ifName: string): string {
  let script = `add table ${family} ${TABLE}
add chain ${family} ${TABLE} pre { type filter hook prerouting priority -150; policy accept; }
flush chain ${family} ${TABLE} pre
add rule ${family} ${TABLE} pre ct state invalid counter drop
add chain ${family} ${TABLE} forward { type filter hook forward priority 0; policy accept; }
flush chain ${family} ${TABLE} forward
add rule ${family} ${TABLE} forward ct state invalid drop
add rule ${family} ${TABLE} forward ct state established,related accept
add chain ${family} ${TABLE} postrouting { type nat hook postrouting priority 100; policy accept; }
add chain ${family} ${TABLE} unnated { type nat hook postrouting priority 110; policy accept; }
flush chain ${family} ${TABLE} unnated
add rule ${family} ${TABLE} unnated ${family} saddr != ${podIp} oifname "${ifName}" counter drop
`;
  // Decapsulated client packets leave through the interface they came in on, and IPv6 has no sysctl
  // that stops the redirect the kernel would send the client for that.
  if (family === 'ip6') {
    script += `add chain ip6 ${TABLE} output { type filter hook output priority 0; policy accept; }
flush chain ip6 ${TABLE} output
add rule ip6 ${TABLE} output icmpv6 type nd-redirect drop
`;
  }
  return script;
}

/** The routing table an announcement puts the address's /32 (/128) in, if it uses one. */
export function exportTable(announce: { mode: AnnounceMode; table?: number }): number | undefined {
  return announce.mode === 'routeTable' ? announce.table : undefined;
}
