// The load balancer on one node, a level-triggered reconciler: from the resolved Services (lb-spec.ts) and
// the pods this node attached it converges, on every configuration, pod event and tick, to
//  - each Service's VIP allocated from its loadBalancer pool (idempotent per Service; released when gone);
//  - the node's datapath (bpf/lb.bpf.c) serving each VIP: ports, targets, Maglev row;
//  - on each local LB pod (ready, selected by the Service): the program at its interface, and the VIP
//    routed to it and put in the route-export table (the BGP speaker announces it) — but only once the
//    VIP's mappings are loaded from the store, so a new or restarted LB pod never re-picks live clients;
//  - on each local target pod: the VIP on a dummy link or lo (ARP silent), FoU decapsulation accepted
//    from registered node addresses only, the MTU lowered by the encapsulation overhead;
//  - the mapping store: new mappings this node picked are written (first writer wins), mappings others
//    wrote are installed, used ones refreshed, idle ones expired; with the store down, forwarding goes on
//    from the local maps, new mappings queue, and when it is back — even empty — everything held is
//    written back.
import * as fs from 'node:fs';
import type { Logger } from '../log';
import { NetlinkHandle, isNetlinkError } from '../netlink';
import { readNetSysctl, writeNetSysctl } from '../sys/netns';
import { LbDatapath, type LbMapping } from '../bpf/lb';
import { attachFouDecap, type FouDecap } from '../bpf/fou';
import { LB_F_PER_FLOW, type LbStats, type MapKey } from '../bpf/lb-structs';
import { ErrorCode, TetherError } from '../errors';
import type { ClusterAddresses } from '../../ipam/cluster-addresses';
import type { AttachService } from '../pod/attach-service';
import { podKeyOf, type PodRecord } from '../state/pod-store';
import type { PodMeta } from '../config/objects';
import { maglevTable } from './maglev';
import { fieldOf, type MappingStore, type StoredMapping } from './mapping-store';
import type { LbResolution, ResolvedLoadBalancer } from './lb-spec';

/** FoU over IPv4: what the targets' MTU is lowered by. */
export const FOU_OVERHEAD = 28;
const TICK_MS = 1000;
const EVENT_POLL_MS = 20;
const REGISTRY_TTL_MS = 5000;
/** How long a VIP waits for its mappings before it is announced anyway (the store is down). */
const LOAD_WAIT_MS = 3000;
/** An LB pod being deleted keeps forwarding this long after its routes are withdrawn (BGP converges). */
const DRAIN_MS = 1500;

export interface LbControllerOptions {
  node: { name: string; address: string };
  pinDir: string;
  fouPort: number;
  /** Route-export table the node's BGP speaker advertises (0: none, the VIP is only routed locally). */
  exportTable: number;
  maxVips?: number;
  maglevSize?: number;
  store?: MappingStore;
  addresses: ClusterAddresses;
  attach: AttachService;
  logger: Logger;
}

interface VipState {
  key: string;
  pool: string;
  vip?: string;
  problem?: string;
  slot?: number;
  /** Active targets the Maglev row was last written for (sorted, joined). */
  row?: string;
  targets?: string;
  /** Mappings loaded from the store (or the wait for them given up). */
  loaded: boolean;
  loadStarted?: number;
  announced: boolean;
}

interface LbPod {
  pod: string;
  netns: string;
  ifName: string;
  hostIfName: string;
  ip: string;
  vips: Set<string>;
  acceptLocalBefore?: string;
}

interface TargetPod {
  pod: string;
  netns: string;
  ifName: string;
  ip: string;
  vips: Set<string>;
  decap?: FouDecap;
  mtuBefore?: number;
  vipDev: string;
}

export class LbController {
  private lbs = new Map<string, ResolvedLoadBalancer>();
  private refused = new Map<string, string[]>();
  private podMeta = new Map<string, PodMeta>();
  private readonly vips = new Map<string, VipState>();
  private readonly lbPods = new Map<string, LbPod>();
  private readonly targets = new Map<string, TargetPod>();
  private dp?: LbDatapath;
  private nodes: string[] = [];
  private timer?: NodeJS.Timeout;
  private poller?: NodeJS.Timeout;
  private running: Promise<void> = Promise.resolve();
  private again = false;
  private busy = false;
  private stopped = false;
  /** New mappings this node picked, not yet in the store: VIP → field → mapping. */
  private readonly pending = new Map<string, Map<string, StoredMapping>>();
  private lastTouchNs = 0n;
  private storeWasDown = false;
  /** The cluster store's generation last seen (a new one: the store lost its data). */
  private generation?: string;
  private readonly draining = new Set<string>();
  /** When the last reconcile pass completed without an error (programming is fresh while recent). */
  private lastGoodPass = 0;

  constructor(private readonly o: LbControllerOptions) {}

  /**
   * The Services as last programmed (after the pass that converged to them): health checks answer from
   * this, so a node that lost its last local target withdraws its route before its health check fails.
   */
  current(): ResolvedLoadBalancer[] {
    return this.programmed;
  }

  private programmed: ResolvedLoadBalancer[] = [];

  /**
   * tether's programming is not stale: a pass converged within the last 5 s (passes run every second and
   * on every change; kube-proxy's own threshold is its healthz timeout, 2 × its sync period).
   */
  fresh(): boolean {
    return Date.now() - this.lastGoodPass < 5000;
  }

  /** The mapping store (health checks report there too). */
  get store(): MappingStore | undefined {
    return this.o.store;
  }

  async start(): Promise<void> {
    this.o.attach.on('attached', () => this.kick());
    this.o.attach.onBeforeDetach((r: PodRecord) => this.podLeaving(r));
    this.o.attach.on('detached', () => this.kick());
    this.o.store?.on('mapping', (m: StoredMapping) => this.learned(m));
    this.o.store?.on('ready', () => {
      this.storeWasDown = true; // write back everything on the next pass
      this.kick();
    });
    this.timer = setInterval(() => this.kick(), TICK_MS);
    this.timer.unref();
    this.poller = setInterval(() => this.pollEvents(), EVENT_POLL_MS);
    this.poller.unref();
    await this.kick();
  }

  /** A new configuration: the Services, EndpointSlices and pods' metadata. */
  async apply(r: LbResolution, podMeta?: Record<string, PodMeta>): Promise<void> {
    this.lbs = new Map(r.loadBalancers.map((l) => [l.key, l]));
    const refused = new Map(r.refused.map((x) => [x.key, x.problems]));
    for (const [k, p] of refused) if (JSON.stringify(this.refused.get(k)) !== JSON.stringify(p)) this.o.logger.error('lb: Service refused', { service: k, problems: p });
    this.refused = refused;
    this.podMeta = new Map(Object.entries(podMeta ?? {}));
    await this.kick();
  }

  /** Runs a pass now, or right after the one under way. */
  kick(): Promise<void> {
    if (this.stopped) return this.running;
    if (this.busy) {
      this.again = true;
      return this.running;
    }
    this.busy = true;
    this.running = (async () => {
      do {
        this.again = false;
        try {
          await this.pass();
          this.lastGoodPass = Date.now();
        } catch (e) {
          this.o.logger.error('lb: reconcile pass failed', { error: (e as Error).message, stack: (e as Error).stack });
        }
      } while (this.again && !this.stopped);
      this.busy = false;
    })();
    return this.running;
  }

  async stop(): Promise<void> {
    this.stopped = true;
    clearInterval(this.timer);
    clearInterval(this.poller);
    await this.running;
    // Programs, routes and pinned maps stay: forwarding goes on while tetherd restarts, and the restarted
    // tetherd finds the mappings in the pinned maps.
    this.dp?.close();
  }

  // ---- one pass --------------------------------------------------------------------------------------

  private async pass(): Promise<void> {
    await this.storeHousekeeping();
    await this.reassertVips();
    await this.allocateVips();
    const served = [...this.lbs.values()].filter((l) => this.vips.get(l.key)?.vip);
    if (served.length && !this.dp) this.loadDatapath();
    if (this.dp) this.programServices(served);
    await this.lbPodRoles(served);
    this.targetRoles(served);
    this.programmed = served;
    await this.syncMappings(served);
  }

  private loadDatapath(): void {
    this.dp = LbDatapath.load({ pinDir: this.o.pinDir, maxVips: this.o.maxVips, maglevSize: this.o.maglevSize });
    this.dp.configure(this.o.node.address, this.o.fouPort);
    this.dp.onEvents((e) => this.picked(e.key, e.target));
    this.o.logger.info('lb: datapath loaded', { maglevSize: this.dp.maglevSize, maxVips: this.dp.maxVips, reusedMappings: this.dp.mappings().length });
  }

  private async storeHousekeeping(): Promise<void> {
    const s = this.o.store;
    if (!s || !s.connected) {
      if (s) this.storeWasDown = true;
      return;
    }
    try {
      await s.registerNode(this.o.node.name, this.o.node.address, REGISTRY_TTL_MS);
      const nodes = [...new Set([...(await s.listNodes()), this.o.node.address])].sort();
      if (nodes.join() !== this.nodes.join()) {
        this.nodes = nodes;
        for (const t of this.targets.values()) t.decap?.setAllowedSources(nodes);
      }
    } catch (e) {
      this.o.logger.debug('lb: store pass failed', { error: (e as Error).message });
    }
  }

  /**
   * After the store lost its data (restarted empty, FLUSHALL: a new generation), every VIP this node
   * serves is put back under its Service, before anyone may be given it (the store holds new allocations
   * back meanwhile): a Service keeps its VIP, and no other owner gets it.
   */
  private async reassertVips(): Promise<void> {
    let g: string;
    try {
      g = await this.o.addresses.generation();
    } catch {
      return; // no store, or unreachable: the next pass asks again
    }
    if (g === this.generation) return;
    const held = [...this.vips.values()].filter((v) => v.vip);
    if (this.generation !== undefined && held.length) {
      this.o.logger.warn('lb: cluster store lost its data; re-asserting the VIPs this node serves', { vips: held.map((v) => v.vip), generation: g });
      await this.o.addresses.markRestarted(g);
      for (const st of held) {
        try {
          await this.o.addresses.reassert(st.pool, ownerOf(st.key), st.vip!);
          this.o.logger.info('lb: VIP re-asserted', { service: st.key, vip: st.vip, pool: st.pool });
        } catch (e) {
          if (e instanceof TetherError && e.code === ErrorCode.AddressConflict) {
            this.o.logger.error('lb: VIP this Service uses was given to another owner while the store was empty', { service: st.key, vip: st.vip, error: e.message });
            continue;
          }
          this.o.logger.warn('lb: VIP not re-asserted yet; retried', { service: st.key, vip: st.vip, error: (e as Error).message });
          return; // the generation stays unseen: the next pass re-asserts again
        }
      }
    }
    this.generation = g;
  }

  /** Each Service's VIP: requested or from its pool, idempotently per Service; released when it goes. */
  private async allocateVips(): Promise<void> {
    for (const [key, st] of this.vips) {
      const lb = this.lbs.get(key);
      const changed = lb && (lb.vip.pool !== st.pool || (lb.vip.address !== undefined && lb.vip.address !== st.vip));
      if (lb && !changed) continue;
      if (st.vip) this.withdrawVip(st);
      try {
        await this.o.addresses.release(st.pool, ownerOf(key));
      } catch (e) {
        this.o.logger.warn('lb: VIP release failed; retried', { service: key, error: (e as Error).message });
        continue;
      }
      if (st.vip) this.o.logger.info('lb: VIP released', { service: key, vip: st.vip, pool: st.pool });
      this.vips.delete(key);
    }
    for (const lb of this.lbs.values()) {
      let st = this.vips.get(lb.key);
      if (st?.vip) continue;
      st ??= { key: lb.key, pool: lb.vip.pool, loaded: false, announced: false };
      this.vips.set(lb.key, st);
      try {
        // A VIP slot first: a node out of slots serves nothing more (and allocates nothing for it).
        const slot = this.freeSlot();
        const req = lb.vip.address ? { pool: lb.vip.pool, owner: ownerOf(lb.key), addresses: [lb.vip.address] } : { pool: lb.vip.pool, owner: ownerOf(lb.key), count: 1 };
        const { addresses } = await this.o.addresses.allocate(req);
        st.vip = addresses[0];
        st.problem = undefined;
        st.slot = slot;
        this.o.logger.info('lb: VIP allocated', { service: lb.key, vip: st.vip, pool: lb.vip.pool, slot: st.slot });
      } catch (e) {
        const msg = e instanceof TetherError && (e.code === ErrorCode.AddressConflict || e.code === ErrorCode.PoolExhausted || e.code === ErrorCode.UnknownPool)
          ? e.message : `VIP not allocated yet: ${(e as Error).message}`;
        if (st.problem !== msg) this.o.logger.error('lb: VIP refused', { service: lb.key, problem: msg });
        st.problem = msg;
      }
    }
  }

  private freeSlot(): number {
    const used = new Set([...this.vips.values()].map((v) => v.slot));
    const max = this.dp?.maxVips ?? this.o.maxVips ?? 16;
    for (let i = 0; i < max; i++) if (!used.has(i)) return i;
    throw new TetherError(ErrorCode.InvalidConfig, `more than ${max} load balancer VIPs on one node (tetherd --lb-max-vips)`);
  }

  private programServices(served: ResolvedLoadBalancer[]): void {
    const dp = this.dp!;
    for (const lb of served) {
      const st = this.vips.get(lb.key)!;
      const vip = st.vip!;
      dp.setService(vip, st.slot!, lb.ports.map((p) => ({ port: p.port, proto: p.proto })), lb.affinity === 'flow' ? LB_F_PER_FLOW : 0);
      const targets = new Map(lb.targets.map((t) => [t.address, t.state]));
      const tkey = JSON.stringify([...targets].sort());
      if (tkey !== st.targets) {
        // Targets first, then the row: a new target is valid before Maglev hands it clients; a removed
        // one is void (its clients re-picked) before the row forgets it.
        const removed = st.targets ? (JSON.parse(st.targets) as Array<[string, string]>).map(([a]) => a).filter((a) => !targets.has(a)) : [];
        dp.setTargets(vip, targets);
        const dropped = removed.length ? dp.deleteMappings((m) => m.vip === vip && removed.includes(m.target)) : 0;
        for (const t of removed) void this.o.store?.dropTarget(vip, t).catch(() => undefined);
        if (removed.length) this.o.logger.info('lb: targets removed; their clients move', { service: lb.key, vip, targets: removed, mappingsDropped: dropped });
        st.targets = tkey;
      }
      // Local policy: new clients go to this node's own targets only (the node announces the VIP only while
      // it has one); existing mappings to any listed target stay valid, so flows that ECMP moves here from
      // a node that withdrew keep their (possibly terminating) target.
      const active = this.pickable(lb).map((t) => t.address).sort();
      if (active.join() !== st.row) {
        const mg = maglevTable(active, dp.maglevSize);
        dp.setMaglevRow(st.slot!, mg.table, mg.targets);
        this.o.logger.info('lb: Maglev row written', { service: lb.key, vip, active: active.length, terminating: lb.targets.length - active.length });
        st.row = active.join();
      }
    }
    // VIPs no longer served here (Service gone, or refused now) are cleared from the datapath.
    for (const [key, st] of this.vips) {
      if (st.vip && st.slot !== undefined && !served.some((l) => l.key === key) && st.row !== undefined) {
        dp.removeService(st.vip, st.slot);
        st.row = undefined;
        st.targets = undefined;
      }
    }
  }

  // ---- LB pods: program, routes, announcement ----------------------------------------------------------

  private podSelected(r: PodRecord, lb: ResolvedLoadBalancer): boolean {
    const pod = podKeyOf(r);
    if (!pod || r.podNamespace !== lb.lbPods.namespace || this.draining.has(pod)) return false;
    const meta = this.podMeta.get(pod);
    if (meta?.ready === false || meta?.deleting) return false;
    const labels = meta?.labels ?? r.labels ?? {};
    return Object.entries(lb.lbPods.matchLabels).every(([k, v]) => labels[k] === v);
  }

  private async lbPodRoles(served: ResolvedLoadBalancer[]): Promise<void> {
    const want = new Map<string, { r: PodRecord; vips: Set<string> }>();
    for (const r of this.o.attach.pods()) {
      const pod = podKeyOf(r);
      const ip = r.ips?.find((i) => !i.includes(':'));
      if (!pod || !ip || !r.hostIfName || !fs.existsSync(r.netns)) continue;
      for (const lb of served) {
        if (!this.podSelected(r, lb)) continue;
        const w = want.get(pod) ?? { r, vips: new Set<string>() };
        w.vips.add(this.vips.get(lb.key)!.vip!);
        want.set(pod, w);
      }
    }
    for (const [pod, w] of want) {
      if (this.lbPods.has(pod)) {
        this.lbPods.get(pod)!.vips = w.vips;
        continue;
      }
      const r = w.r;
      const p: LbPod = { pod, netns: r.netns, ifName: r.ifName, hostIfName: r.hostIfName!, ip: r.ips!.find((i) => !i.includes(':'))!, vips: w.vips };
      try {
        // What the pod sends back (encapsulated, from the node's address) must be accepted by the node.
        p.acceptLocalBefore = readNetSysctl(null, `net/ipv4/conf/${p.hostIfName}/accept_local`);
        writeNetSysctl(null, `net/ipv4/conf/${p.hostIfName}/accept_local`, '1');
        writeNetSysctl(null, `net/ipv4/conf/${p.hostIfName}/rp_filter`, '0');
        this.dp!.attach(p.netns, p.ifName);
        this.lbPods.set(pod, p);
        this.o.logger.info('lb: LB pod serving', { pod, vips: [...p.vips], hostIfName: p.hostIfName });
        this.o.attach.roleProblems.ok(pod, 'lb pod');
      } catch (e) {
        // Retried on the next pass; reported (status, /readyz) meanwhile, logged once.
        if (this.o.attach.roleProblems.failed(pod, 'lb pod', (e as Error).message)) this.o.logger.error('lb: LB pod setup failed', { pod, error: (e as Error).message });
      }
    }
    for (const [pod, p] of this.lbPods) {
      if (want.has(pod)) continue;
      this.lbPods.delete(pod);
      this.dp?.detach(p.netns, p.ifName);
      try {
        if (p.acceptLocalBefore !== undefined) writeNetSysctl(null, `net/ipv4/conf/${p.hostIfName}/accept_local`, p.acceptLocalBefore);
      } catch {
        // the veth is gone with the pod
      }
      this.o.logger.info('lb: LB pod no longer serving', { pod });
    }
    // Routes per VIP: through every local serving LB pod, once the VIP's mappings are loaded.
    for (const lb of served) {
      const st = this.vips.get(lb.key)!;
      const pods = [...this.lbPods.values()].filter((p) => p.vips.has(st.vip!));
      if (pods.length && !st.loaded) await this.loadMappings(lb, st);
      const announce = pods.length > 0 && st.loaded && this.pickable(lb).length > 0;
      this.route(st, announce ? pods : []);
    }
  }

  /** Targets new clients may be given here: active ones, and with Local policy only this node's. */
  private pickable(lb: ResolvedLoadBalancer): ResolvedLoadBalancer['targets'] {
    return lb.targets.filter((t) => t.state === 'active' && (lb.externalTrafficPolicy !== 'Local' || t.node === this.o.node.name));
  }

  private route(st: VipState, pods: LbPod[]): void {
    const vip = st.vip!;
    NetlinkHandle.with(undefined, (h) => {
      const hops = pods.flatMap((p) => {
        const veth = h.getLink(p.hostIfName);
        if (!veth) return [];
        const mac = NetlinkHandle.with(p.netns, (ph) => ph.getLink(p.ifName)?.mac);
        // The pod does not hold the VIP (it only forwards), so it would not answer ARP for it: a
        // permanent neighbour entry on the pod's veth says where the VIP's packets go.
        if (mac) h.replaceNeighbour({ address: vip, index: veth.index, lladdr: mac });
        return mac ? [{ index: veth.index }] : [];
      });
      const tables = [254, ...(this.o.exportTable ? [this.o.exportTable] : [])];
      if (hops.length) {
        for (const table of tables) {
          if (hops.length === 1) h.replaceRoute({ dst: `${vip}/32`, index: hops[0].index, table });
          else h.replaceRoute({ dst: `${vip}/32`, nexthops: hops, table });
        }
        if (!st.announced) this.o.logger.info('lb: VIP routed to local LB pods and announced', { service: st.key, vip, pods: pods.map((p) => p.pod), exportTable: this.o.exportTable || undefined });
        st.announced = true;
      } else if (st.announced) {
        this.unroute(h, vip, tables);
        this.o.logger.info('lb: VIP withdrawn (no serving local LB pod, or no active target)', { service: st.key, vip });
        st.announced = false;
      }
    });
  }

  private unroute(h: NetlinkHandle, vip: string, tables: number[]): void {
    for (const table of [...tables].reverse()) {
      try {
        h.deleteRoute({ dst: `${vip}/32`, table });
      } catch (e) {
        if (!isNetlinkError(e, 'ESRCH', 'ENOENT')) throw e;
      }
    }
  }

  private withdrawVip(st: VipState): void {
    if (!st.vip) return;
    NetlinkHandle.with(undefined, (h) => this.unroute(h, st.vip!, [254, ...(this.o.exportTable ? [this.o.exportTable] : [])]));
    st.announced = false;
  }

  /** An LB pod about to be deleted: withdraw its routes first, keep forwarding while BGP converges. */
  private async podLeaving(r: PodRecord): Promise<void> {
    const pod = podKeyOf(r);
    if (!pod || !this.lbPods.has(pod) || this.stopped) return;
    this.draining.add(pod);
    await this.kick();
    this.o.logger.info('lb: LB pod leaving; routes withdrawn, draining', { pod, ms: DRAIN_MS });
    await new Promise((res) => setTimeout(res, DRAIN_MS));
    this.draining.delete(pod);
  }

  // ---- targets ---------------------------------------------------------------------------------------

  private targetRoles(served: ResolvedLoadBalancer[]): void {
    const byIp = new Map<string, Set<string>>();
    for (const lb of served) for (const t of lb.targets) {
      const s = byIp.get(t.address) ?? new Set<string>();
      s.add(this.vips.get(lb.key)!.vip!);
      byIp.set(t.address, s);
    }
    const seen = new Set<string>();
    for (const r of this.o.attach.pods()) {
      const pod = podKeyOf(r) ?? r.containerId;
      const ip = r.ips?.find((i) => !i.includes(':'));
      const vips = ip ? byIp.get(ip) : undefined;
      if (!ip || !vips || !fs.existsSync(r.netns)) continue;
      seen.add(pod);
      try {
        this.targetUp(pod, r, ip, vips);
        this.o.attach.roleProblems.ok(pod, 'lb target');
      } catch (e) {
        if (this.o.attach.roleProblems.failed(pod, 'lb target', (e as Error).message)) this.o.logger.error('lb: target setup failed', { pod, error: (e as Error).message });
      }
    }
    for (const [pod, t] of this.targets) if (!seen.has(pod)) this.targetDown(pod, t);
  }

  private targetUp(pod: string, r: PodRecord, ip: string, vips: Set<string>): void {
    let t = this.targets.get(pod);
    if (!t) {
      t = { pod, netns: r.netns, ifName: r.ifName, ip, vips: new Set(), vipDev: 'lo' };
      const tt = t;
      NetlinkHandle.with(r.netns, (h) => {
        if (h.kernelHasDummy()) {
          if (!h.getLink('tether0')) h.createDummy('tether0');
          h.setLinkUp('tether0', true);
          tt.vipDev = 'tether0';
        } else h.setLinkUp('lo', true);
        // The MSS the target advertises must leave room for the encapsulation on the way in.
        const link = h.requireLink(r.ifName);
        const host = r.hostIfName ? NetlinkHandle.with(undefined, (hh) => hh.getLink(r.hostIfName!)) : undefined;
        const want = (host?.mtu ?? link.mtu) - FOU_OVERHEAD;
        if (host && link.mtu > want) {
          tt.mtuBefore = link.mtu;
          h.setLinkMtu(link.index, want);
        }
      });
      for (const dev of ['all', r.ifName]) {
        writeNetSysctl(r.netns, `net/ipv4/conf/${dev}/arp_ignore`, '1');
        writeNetSysctl(r.netns, `net/ipv4/conf/${dev}/arp_announce`, '2');
      }
      // Decapsulated on the host side, before the pod: a full-size encapsulated frame would exceed the
      // pod interface's lowered MTU, and a veth drops what is longer than its peer's MTU.
      const sources = this.nodes.length ? this.nodes : [this.o.node.address];
      t.decap = r.hostIfName
        ? attachFouDecap({ ifName: r.hostIfName, direction: 'egress', port: this.o.fouPort, localAddress: ip, allowedSources: sources })
        : attachFouDecap({ netns: r.netns, ifName: r.ifName, port: this.o.fouPort, localAddress: ip, allowedSources: sources });
      this.targets.set(pod, t);
      this.o.logger.info('lb: target pod ready for DSR', { pod, ip, vipDev: t.vipDev, mtuLoweredFrom: t.mtuBefore });
    }
    const cur = t;
    const add = [...vips].filter((v) => !cur.vips.has(v));
    const del = [...cur.vips].filter((v) => !vips.has(v));
    if (add.length || del.length) {
      NetlinkHandle.with(r.netns, (h) => {
        const dev = h.requireLink(cur.vipDev);
        for (const v of add) h.addAddress({ address: `${v}/32`, index: dev.index, replace: true, noDad: true });
        for (const v of del) ignoreGone(() => h.deleteAddress({ address: `${v}/32`, index: dev.index }));
      });
      cur.vips = new Set(vips);
      this.o.logger.info('lb: target VIPs', { pod, added: add, removed: del });
    }
  }

  private targetDown(pod: string, t: TargetPod): void {
    this.targets.delete(pod);
    try {
      t.decap?.detach();
    } catch {
      // the pod (and its veth, with the filter) is gone
    }
    if (fs.existsSync(t.netns)) {
      try {
        NetlinkHandle.with(t.netns, (h) => {
          const dev = h.getLink(t.vipDev);
          if (dev) for (const v of t.vips) ignoreGone(() => h.deleteAddress({ address: `${v}/32`, index: dev.index }));
          if (t.vipDev === 'tether0') ignoreGone(() => h.deleteLink('tether0'));
          const link = h.getLink(t.ifName);
          if (link && t.mtuBefore) h.setLinkMtu(link.index, t.mtuBefore);
        });
      } catch (e) {
        this.o.logger.debug('lb: target teardown: pod gone', { pod, error: (e as Error).message });
      }
    }
    this.o.logger.info('lb: pod no longer a target', { pod });
  }

  // ---- mappings ----------------------------------------------------------------------------------------

  private pollEvents(): void {
    try {
      this.dp?.pollEvents();
      if (this.learnt.length) {
        const batch = this.learnt;
        this.learnt = [];
        this.installValid(batch);
      }
    } catch (e) {
      this.o.logger.warn('lb: reading or installing mappings failed', { error: (e as Error).message });
    }
    if (this.pending.size && this.o.store?.connected) void this.flushPending();
  }

  /** The datapath picked a target for a new client: queue it for the store. */
  private picked(key: MapKey, target: string): void {
    const q = this.pending.get(key.vip) ?? new Map<string, StoredMapping>();
    q.set(fieldOf(key), { key, target });
    this.pending.set(key.vip, q);
  }

  private flushing = false;
  private async flushPending(): Promise<void> {
    if (this.flushing || !this.o.store) return;
    this.flushing = true;
    try {
      for (const [vip, q] of [...this.pending]) {
        const list = [...q.values()];
        const got = await this.o.store.claim(vip, list);
        // Another LB pod was first for some clients: follow its choice.
        const lost = got.filter((m, i) => m.target !== list[i].target);
        if (lost.length) this.installValid(lost);
        for (const m of list) q.delete(fieldOf(m.key));
        if (!q.size) this.pending.delete(vip);
      }
    } catch (e) {
      this.o.logger.debug('lb: writing new mappings failed; kept queued', { error: (e as Error).message });
    } finally {
      this.flushing = false;
    }
  }

  /**
   * Another LB pod recorded a mapping: queued, and installed in one batch with the others of the next
   * poll — only on a node with a local LB pod for the VIP (others load the VIP's mappings from the store
   * when an LB pod of theirs starts serving it).
   */
  private learned(m: StoredMapping): void {
    if (!this.dp || ![...this.lbPods.values()].some((p) => p.vips.has(m.key.vip))) return;
    this.learnt.push(m);
  }

  private learnt: StoredMapping[] = [];

  /** Installs mappings whose VIP this node serves and whose target the VIP still has. */
  private installValid(list: StoredMapping[]): number {
    const targets = new Map<string, Set<string>>();
    for (const l of this.lbs.values()) {
      const vip = this.vips.get(l.key)?.vip;
      if (vip) targets.set(vip, new Set(l.targets.map((t) => t.address)));
    }
    const ok = list.filter((m) => targets.get(m.key.vip)?.has(m.target));
    this.dp?.installMappings(ok);
    return ok.length;
  }

  private async loadMappings(lb: ResolvedLoadBalancer, st: VipState): Promise<void> {
    st.loadStarted ??= Date.now();
    const s = this.o.store;
    if (!s) {
      st.loaded = true;
      return;
    }
    if (!s.connected) {
      if (Date.now() - st.loadStarted > LOAD_WAIT_MS) {
        st.loaded = true;
        this.o.logger.warn('lb: mapping store unreachable; VIP announced with the mappings this node holds', { service: lb.key, vip: st.vip });
      }
      return;
    }
    try {
      const t0 = Date.now();
      const { mappings, garbled } = await s.load(st.vip!);
      const installed = this.installValid(mappings);
      st.loaded = true;
      this.o.logger.info('lb: mappings loaded before announcing', { service: lb.key, vip: st.vip, installed, stale: mappings.length - installed, garbled, ms: Date.now() - t0 });
    } catch (e) {
      this.o.logger.warn('lb: loading mappings failed; retried', { service: lb.key, error: (e as Error).message });
    }
  }

  /**
   * The store side of the mappings, every pass: after the store was away, write back everything this node
   * holds (first writer wins keeps others' choices) and install what is there; refresh the mappings used
   * since the last pass; expire idle ones here and in the store.
   */
  private async syncMappings(served: ResolvedLoadBalancer[]): Promise<void> {
    const s = this.o.store;
    const dp = this.dp;
    if (!dp) return;
    const now = nowNs();
    // Local idle expiry by each VIP's timeout, from the one read of the map this pass makes.
    const idle = new Map(served.map((l) => [this.vips.get(l.key)!.vip!, BigInt(l.idleTimeoutS) * 1_000_000_000n]));
    const isIdle = (m: LbMapping) => {
      const limit = idle.get(m.vip);
      return limit !== undefined && m.lastNs > 0n && now - m.lastNs > limit;
    };
    const all = dp.mappings();
    const expired = dp.deleteMappingKeys(all.filter(isIdle));
    if (expired) this.o.logger.info('lb: idle mappings expired', { count: expired });
    if (!s || !s.connected) return;
    const byVip = groupByVip(all.filter((m) => !isIdle(m)));
    try {
      if (this.storeWasDown) {
        let written = 0;
        for (const [vip, list] of byVip) {
          if (!idle.has(vip)) continue;
          const got = await s.claim(vip, list.map((m) => ({ key: m, target: m.target })));
          written += list.length;
          const differ = got.filter((g, i) => g.target !== list[i].target);
          if (differ.length) this.installValid(differ);
        }
        for (const lb of served) {
          const st = this.vips.get(lb.key)!;
          if (st.loaded) this.installValid((await s.load(st.vip!)).mappings);
        }
        this.storeWasDown = false;
        this.o.logger.info('lb: mapping store back: local mappings written back and reloaded', { written });
      }
      const since = this.lastTouchNs;
      this.lastTouchNs = now;
      for (const [vip, list] of byVip) {
        const used = list.filter((m) => m.lastNs > since);
        if (used.length) await s.touch(vip, used);
      }
      for (const lb of served) await s.expire(this.vips.get(lb.key)!.vip!, lb.idleTimeoutS);
    } catch (e) {
      this.storeWasDown = true;
      this.o.logger.debug('lb: mapping store pass failed', { error: (e as Error).message });
    }
  }

  // ---- status ------------------------------------------------------------------------------------------

  status(): Array<Record<string, unknown>> {
    const out: Array<Record<string, unknown>> = [];
    const counts = this.dp ? groupByVip(this.dp.mappings()) : new Map<string, LbMapping[]>();
    for (const lb of this.lbs.values()) {
      const st = this.vips.get(lb.key);
      const stats: LbStats | undefined = st?.slot !== undefined && this.dp ? this.dp.stats(st.slot) : undefined;
      out.push({
        service: lb.key,
        vip: st?.vip,
        pool: lb.vip.pool,
        ports: lb.ports.map((p) => `${p.port}/${p.protocol}`),
        affinity: lb.affinity,
        externalTrafficPolicy: lb.externalTrafficPolicy,
        ...(lb.healthCheckNodePort ? { healthCheckNodePort: lb.healthCheckNodePort } : {}),
        idleTimeoutSeconds: lb.idleTimeoutS,
        targets: { active: lb.targets.filter((t) => t.state === 'active').length, terminating: lb.targets.filter((t) => t.state === 'terminating').length },
        localLbPods: [...this.lbPods.values()].filter((p) => st?.vip && p.vips.has(st.vip)).map((p) => p.pod),
        localTargets: [...this.targets.values()].filter((t) => st?.vip && t.vips.has(st.vip)).map((t) => t.pod),
        // FoU arriving at local targets: decapsulated, and refused for coming from an unregistered source.
        targetFou: Object.fromEntries([...this.targets.values()].filter((t) => st?.vip && t.vips.has(st.vip)).map((t) => {
          const f = t.decap?.stats();
          return [t.pod, f && { packets: Number(f.packets), rejectedSource: Number(f.rejectedSource), errors: Number(f.errors) }];
        })),
        announced: st?.announced ?? false,
        mappings: st?.vip ? counts.get(st.vip)?.length ?? 0 : 0,
        problem: st?.problem ?? (lb.targets.length === 0 ? 'no targets: accepted, nothing announced' : undefined),
        counters: stats && Object.fromEntries(Object.entries(stats).map(([k, v]) => [k, Number(v)])),
      });
    }
    for (const [key, problems] of this.refused) out.push({ service: key, refused: problems });
    return out;
  }
}

function ownerOf(key: string): string {
  return `lb/${key}`;
}

function groupByVip(all: LbMapping[]): Map<string, LbMapping[]> {
  const m = new Map<string, LbMapping[]>();
  for (const x of all) {
    const l = m.get(x.vip);
    if (l) l.push(x);
    else m.set(x.vip, [x]);
  }
  return m;
}

function ignoreGone(fn: () => void): void {
  try {
    fn();
  } catch (e) {
    if (!isNetlinkError(e, 'EADDRNOTAVAIL', 'ENODEV', 'ENOENT', 'ESRCH')) throw e;
  }
}

/** CLOCK_MONOTONIC in ns, the clock of bpf_ktime_get_ns. */
function nowNs(): bigint {
  return process.hrtime.bigint();
}
