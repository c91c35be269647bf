// The load balancer on one node, a level-triggered reconciler: from the resolved Services (lb-spec.ts) and
// the pods this node attached it converges, on every configuration, pod event and tick, to
//  - the VIP of each Service this node needs allocated from its loadBalancer pool (vip-addresses.ts): the
//    Services a local LB pod selects or a local pod is a target of (tether-operator holds every Service's,
//    for their status); the others cost this node nothing;
//  - a datapath slot for each VIP a local LB pod serves, within this node's budget (vip-slots.ts), and
//    the VIP's ports and targets programmed there (vip-programs.ts), its Maglev row switched to a new target
//    set together with the VIP's other LB nodes (table-switch.ts) — nodes without an LB pod
//    of a Service program nothing for it, so the cluster has no cap on Services;
//  - the program on each local LB pod and the VIP routed and announced through them once its mappings
//    are loaded (lb-pods.ts); with --lb-datapath=node also the program on the node's uplink, which handles
//    the VIP traffic arriving there (the LB pods then only place the VIP and serve this node's own pods);
//  - the DSR set-up of each local target pod (targets.ts);
//  - the mapping store kept in step for the VIPs served here (mapping-sync.ts).
// The shape of every subsystem: start / apply (typed desired state) / stop / status. The kernel is reached
// only through bpf/*, netlink/* and sys/* (a simulation swaps those modules for recording fakes).
import { LbDatapath, type LbDatapathMode } from '../bpf/lb';
import { LB_MAX_VIPS_DEFAULT, type LbStats } from '../bpf/lb-structs';
import type { PodRecord } from '../state/pod-store';
import type { PodMeta } from '../config/objects';
import type { LbResolution, ResolvedLoadBalancer } from './lb-spec';
import type { LbStore } from './lb-store';
import { readNetSysctl } from '../sys/netns';
import { FOU_OVERHEAD, LbShared, groupByVip, noAddress6Problem, pickableTargets, type LbControllerOptions, type NotForwardedVip } from './lb-state';
import { VipAddresses } from './vip-addresses';
import { SLOT_RELEASE_MS, VipSlots, overflowProblem } from './vip-slots';
import { VipPrograms } from './vip-programs';
import { LbPods, type Selections } from './lb-pods';
import { LbTargets } from './targets';
import { MappingSync } from './mapping-sync';
import { TableSwitch, affinityFlags, recordsOnChange } from './table-switch';
import { ReconcileLoop } from '../util/reconcile-loop';
import { FamilyTrackers, type FamilyProgramming } from '../health/proxy-health';
import { NodeRegistry, REGISTRY_TTL_MS } from '../common/node-registry';

export { FOU_OVERHEAD, type LbControllerOptions, type NotForwardedVip };

const TICK_MS = 1000;
const EVENT_POLL_MS = 20;

export class LbController {
  private lbs = new Map<string, ResolvedLoadBalancer>();
  private refused = new Map<string, string[]>();
  private unserved = new Map<string, { key: string; family: string; why: string }>();
  private readonly s: LbShared;
  private readonly addresses: VipAddresses;
  private readonly slots: VipSlots;
  private readonly programs: VipPrograms;
  private readonly pods: LbPods;
  private readonly targets: LbTargets;
  private readonly sync: MappingSync;
  private readonly tables: TableSwitch;
  /** The reconcile passes: on every configuration, pod event, store reconnect, and each TICK_MS. */
  private readonly loop: ReconcileLoop;
  /** Mappings learnt by the datapath, read every EVENT_POLL_MS. */
  private readonly poller: ReconcileLoop;
  private stopped = false;
  /**
   * The changes waiting to be programmed and the passes that programmed them, per family programmed (the
   * health checks' staleness, reported per family as kube-proxy does): IPv4 from the start, as before; a
   * family from the first pass that programs a VIP of it.
   */
  private readonly updates = new FamilyTrackers();
  private programmed: ResolvedLoadBalancer[] = [];
  /** Services whose VIP this node needs (as of the last pass). */
  private needed = new Set<string>();
  /** A configuration was applied (the Services are known: what no Service names may be collected). */
  private configured = false;
  /** When the datapath was loaded, and the VIPs of the slots a previous run left (kept a release delay at least). */
  private loadedAt = 0;
  private adopted = new Set<string>();
  /** --lb-datapath and the uplink the node program goes on. */
  private readonly mode: LbDatapathMode;
  private readonly uplink: string;
  /** The node program is on the uplink (node mode); why not, when attaching failed. */
  private uplinkAttached = false;
  private uplinkProblem?: string;

  constructor(private readonly o: LbControllerOptions) {
    this.mode = o.datapath ?? 'node';
    this.uplink = o.uplink ?? 'eth0';
    if (o.store) this.nodeRegistry = new NodeRegistry(o.store.connection.client, o.store.connection.prefix, o.node.name, o.node.address, o.node.address6);
    this.s = new LbShared(o);
    this.pods = new LbPods(this.s);
    this.addresses = new VipAddresses(this.s, (st) => this.pods.withdraw(st));
    this.slots = new VipSlots(o.maxVips ?? LB_MAX_VIPS_DEFAULT);
    const pickable = (lb: ResolvedLoadBalancer) => pickableTargets(lb, o.node.name);
    this.sync = new MappingSync(this.s, (vip, list) => this.tables.needsRecord(vip, list));
    this.tables = new TableSwitch(this.s, pickable, (page) => this.sync.installValid(page));
    this.programs = new VipPrograms(this.s, (lb, vip) => affinityFlags(lb) | this.tables.flags(vip), (vip) => this.sync.expires(vip));
    this.targets = new LbTargets(this.s);
    this.loop = new ReconcileLoop({
      run: async () => {
        await this.pass();
        // IPv4 is reported as it always was (from start, or the first pass); another family from the
        // first pass that programs a VIP of it.
        this.updates.track('IPv4');
        for (const lb of this.programmed) if (lb.family !== 'IPv4' && this.s.vips.get(lb.key)?.vip) this.updates.track(lb.family);
        this.updates.updated();
      },
      everyMs: TICK_MS,
      onError: (e) => this.o.logger.error('lb: reconcile pass failed', { error: e.message, stack: e.stack }),
    });
    this.poller = new ReconcileLoop({
      run: () => {
        this.sync.poll();
        this.tables.tick();
      },
      everyMs: EVENT_POLL_MS, onError: (e) => this.o.logger.warn('lb: reading mappings failed', { error: e.message }) });
  }

  /**
   * The Services as last programmed (after the pass that converged to them): health checks answer from
   * this, so a node that lost its last local target withdraws its route before its health check fails.
   * Services no local pod concerns are there too (this node holds no VIP for them, but answers their
   * health checks as kube-proxy does: no local endpoint); a Service this node needs and has no VIP for
   * yet is not.
   */
  current(): ResolvedLoadBalancer[] {
    return this.programmed;
  }

  /** Services this node needs whose VIP it does not hold yet (0: every one it needs is in place). */
  pendingVips(): number {
    let n = 0;
    for (const k of this.needed) if (!this.s.vips.get(k)?.vip) n++;
    return n;
  }

  /**
   * When a pass last completed and since when a change (configuration, a local pod) waits for one: the
   * health checks are unhealthy only when a change waits too long (kube-proxy's rule, proxy-health.ts),
   * not when a quiet node's last pass is old.
   */
  programming(): FamilyProgramming {
    return this.updates.state();
  }

  /** The load balancer's parts of the cluster store (health checks report over its connection too). */
  get store(): LbStore | undefined {
    return this.o.store;
  }

  async start(): Promise<void> {
    if (this.mode === 'pod') this.leaveUplink();
    this.o.attach.on('attached', () => this.podsChanged());
    this.o.attach.onBeforeDetach((r: PodRecord) => (this.stopped ? Promise.resolve() : this.pods.leaving(r, () => void this.podsChanged())));
    this.o.attach.on('detached', () => this.podsChanged());
    this.sync.start();
    this.o.store?.connection.on('ready', () => void this.kick());
    this.updates.track('IPv4');
    this.loop.start();
    this.poller.start();
    await this.kick();
  }

  /** A new configuration: the Services, EndpointSlices and pods' metadata. */
  async apply(r: LbResolution, podMeta?: Record<string, PodMeta>): Promise<void> {
    this.lbs = new Map(r.loadBalancers.map((l) => [l.key, l]));
    this.updates.queued();
    this.configured = true;
    this.needsCache = undefined;
    const refused = new Map(r.refused.map((x) => [x.key, x.problems]));
    for (const [k, p] of refused) if (JSON.stringify(this.refused.get(k)) !== JSON.stringify(p)) this.o.logger.error('lb: Service refused', { service: k, problems: p });
    this.refused = refused;
    // Families of valid Services not served (PreferDualStack without the family's pool, a family the
    // datapath does not program: DATAPATH_FAMILIES, lb-spec.ts): logged once, in status.
    const unserved = new Map((r.unserved ?? []).map((u) => [`${u.key} ${u.family}`, u]));
    for (const [k, u] of unserved) if (!this.unserved.has(k)) this.o.logger.warn('lb: Service not served in one of its families', { service: u.key, family: u.family, why: u.why });
    this.unserved = unserved;
    this.pods.setPodMeta(podMeta);
    await this.kick();
  }

  /** Runs a pass now, or right after the one under way. */
  kick(): Promise<void> {
    return this.loop.kick();
  }

  async stop(): Promise<void> {
    this.stopped = true;
    await this.poller.stop();
    await this.loop.stop();
    await this.tables.stop();
    // Programs, routes and pinned maps stay: forwarding goes on while tetherd restarts, and the restarted
    // tetherd finds the mappings (and each VIP's slot) in the pinned maps.
    this.s.dp?.close();
  }

  // ---- one pass --------------------------------------------------------------------------------------

  private async pass(): Promise<void> {
    await this.registry();
    const needed = this.needs();
    this.needed = needed;
    const vips = await this.addresses.apply(this.lbs, needed, { keepRecord: this.configured });
    if (vips.wiped) this.sync.storeWiped();
    if (vips.more) this.loop.request(); // the next part of a large batch of new Services, right after this pass
    const served = [...this.lbs.values()].filter((l) => this.s.vips.get(l.key)?.vip);
    const sel = this.pods.selections(served);
    const forwarded = this.forwardable(served, sel);
    this.assignSlots(forwarded, sel);
    const slotted = forwarded.filter((l) => this.s.vips.get(l.key)!.slot !== undefined);
    this.programs.apply(slotted);
    // After the services are programmed: the uplink program handles exactly what the maps hold.
    if (this.mode === 'node' && this.s.dp && !this.uplinkAttached) this.attachUplink();
    // Subscribed before any load: a mapping recorded between a VIP's load and its subscription would be
    // missed, and its client re-picked here.
    await this.sync.serve(slotted);
    // Each VIP's Maglev row (a change agreed with the VIP's other LB nodes first), before it is announced.
    await this.tables.apply(slotted);
    await this.pods.apply(served, sel, (lb, st) => this.sync.ensureLoaded(lb, st));
    this.targets.apply(served);
    const programmed = [...this.lbs.values()].filter((l) => this.s.vips.get(l.key)?.vip || (!needed.has(l.key) && !this.s.vips.has(l.key)));
    // The same array while nothing in it changed: readers (health checks) may compare by identity.
    if (programmed.length !== this.programmed.length || programmed.some((l, i) => l !== this.programmed[i])) this.programmed = programmed;
    await this.sync.sync();
  }

  /**
   * The Services whose VIP this node needs: those a local LB pod selects (it serves the VIP) and those with
   * a target on this node (its DSR set-up holds the VIP).
   */
  private needs(): Set<string> {
    // Kept until the Services or the local pods change: a tick with nothing new does
    // not match every local LB pod against every Service again.
    this.needsCache ??= this.computeNeeds();
    return this.needsCache;
  }

  private needsCache?: Set<string>;
  /** This node's registration over the store's connection, and the registry's list as last returned (the same array while it does not change). */
  private readonly nodeRegistry?: NodeRegistry;
  private registered?: string[];

  /** A local pod came, is leaving or went: what this node needs is computed again. */
  private podsChanged(): Promise<void> {
    this.needsCache = undefined;
    this.updates.queued();
    return this.kick();
  }

  private computeNeeds(): Set<string> {
    const out = new Set<string>();
    for (const w of this.pods.selections([...this.lbs.values()]).values()) for (const k of w.services) out.add(k);
    const local = new Set<string>();
    for (const r of this.o.attach.pods()) for (const ip of r.ips ?? []) local.add(ip);
    const node = this.o.node.name;
    for (const lb of this.lbs.values()) {
      if (!out.has(lb.key) && lb.targets.some((t) => t.node === node || local.has(t.address))) out.add(lb.key);
    }
    return out;
  }

  /** Publishes this node's address and reads the others' (targets accept FoU from registered nodes only). */
  private async registry(): Promise<void> {
    const store = this.o.store;
    this.s.storeAway = !!store && !store.connection.connected;
    if (!store?.connection.connected || !this.nodeRegistry) return;
    try {
      await this.nodeRegistry.beat(REGISTRY_TTL_MS);
      // Both families' addresses: FoU to an IPv6 VIP's targets comes from the LB nodes' IPv6 addresses.
      const listed = this.nodeRegistry.addresses({ ipv6: true });
      this.earlierReleases([...this.nodeRegistry.releases()]);
      if (listed === this.registered) return; // the same list (NodeRegistry keeps it while nothing changes)
      this.registered = listed;
      const own = this.o.node.address6 ? [this.o.node.address, this.o.node.address6] : [this.o.node.address];
      const nodes = [...new Set([...listed, ...own])].sort();
      if (nodes.join() !== this.s.nodes.join()) {
        this.s.nodes = nodes;
        this.targets.setSources(nodes);
      }
    } catch (e) {
      this.s.storeAway = true;
      this.o.logger.debug('lb: node registry pass failed', { error: (e as Error).message });
    }
  }

  /**
   * While a node of a release before table versions is registered (a rolling upgrade or rollback), every
   * new pick is recorded, as that release does: it switches rows at once, so a flow this node did not
   * record could reach it under a row that moves it.
   */
  private earlierReleases(releases: Array<[string, string]>): void {
    const older = releases.filter(([, r]) => !recordsOnChange(r)).map(([n]) => n).sort();
    const was = this.s.earlierReleases;
    this.s.earlierReleases = older.length > 0;
    if (was === this.s.earlierReleases) return;
    if (older.length) this.o.logger.info('lb: nodes of a release before table versions are registered: every new pick is recorded until none is', { nodes: older.slice(0, 10), count: older.length });
    else if (was) this.o.logger.info('lb: every registered node records on change: new picks are recorded only while a table change is under way');
  }

  /**
   * The served VIPs this node can forward: every one, but for the IPv6 ones when the node has no IPv6
   * address (FoU to IPv6 targets leaves from it). Those get nothing here — no slot, so no maps, mappings,
   * table membership, LB pod program or route — rather than a program that would pass their packets to the
   * stack; the ones a local LB pod selects are reported by name (status nodeProblem, the health report
   * tether-operator's status reads, one error line and one Event). Their targets here are still set up:
   * FoU reaches a target pod's IPv6 address from the other LB nodes' IPv6 addresses.
   */
  private forwardable(served: ResolvedLoadBalancer[], sel: Selections): ResolvedLoadBalancer[] {
    if (this.o.node.address6) return served;
    const selectedBy = new Map<string, string[]>();
    for (const [pod, w] of sel) for (const k of w.services) selectedBy.set(k, [...(selectedBy.get(k) ?? []), pod]);
    const node = this.o.node.name;
    const out: ResolvedLoadBalancer[] = [];
    for (const lb of served) {
      if (lb.family !== 'IPv6') {
        out.push(lb);
        continue;
      }
      const st = this.s.vips.get(lb.key)!;
      const pods = selectedBy.get(lb.key)?.sort();
      const problem = pods ? noAddress6Problem(node, st.vip!, pods) : undefined;
      if (problem && problem !== st.familyProblem) {
        this.o.logger.error('lb: VIP not forwarded by this node: it has no IPv6 address; nothing of the VIP is programmed here', { service: lb.service, vip: st.vip, node, pods, problem });
        this.notifyNotForwarded(lb, st.vip!, problem);
      }
      if (!problem && st.familyProblem) this.o.logger.info('lb: no local LB pod selects the IPv6 VIP any more', { service: lb.service, vip: st.vip });
      st.familyProblem = problem;
    }
    return out;
  }

  /** The Event for a VIP this node's LB pods select but it cannot forward (informative: a failure is logged, the pass goes on). */
  private notifyNotForwarded(lb: ResolvedLoadBalancer, vip: string, problem: string): void {
    try {
      this.o.onNotForwarded?.({ key: lb.key, service: lb.service, family: lb.family, vip, node: this.o.node.name, problem });
    } catch (e) {
      this.o.logger.warn('lb: not-forwarded notice failed', { service: lb.service, error: (e as Error).message });
    }
  }

  /**
   * The VIPs local LB pods select that this node does not forward, and why (for the health report): an IPv6
   * VIP on a node without IPv6 (see forwardable), or one with no slot left in the datapath (assignSlots).
   */
  notForwarded(): NotForwardedVip[] {
    const out: NotForwardedVip[] = [];
    for (const lb of this.lbs.values()) {
      const st = this.s.vips.get(lb.key);
      const problem = st?.familyProblem ?? st?.slotProblem;
      if (st?.vip && problem) out.push({ key: lb.key, service: lb.service, family: lb.family, vip: st.vip, problem });
    }
    return out;
  }

  /**
   * Slots for the VIPs a local LB pod selects, in Service order; the datapath is loaded with the first one
   * (and a previous run's slots adopted from its pinned maps).
   */
  private assignSlots(served: ResolvedLoadBalancer[], sel: Selections): void {
    const selected = new Set<string>();
    for (const w of sel.values()) for (const k of w.services) selected.add(k);
    const wanted = served.filter((l) => selected.has(l.key)).map((l) => this.s.vips.get(l.key)!.vip!);
    if (wanted.length && !this.s.dp) this.loadDatapath();
    if (!this.s.dp) return;
    // While a Service still waits for its VIP, a VIP a previous run left here may be its own: kept (until
    // the release delay) rather than cleared at once. So are the slots a previous run left, for the release
    // delay after the datapath loads: this node does not ask for the VIPs it does not need, so an adopted
    // slot's VIP is unknown here while its LB pod is being re-created, and must not lose its slot for that.
    const allocated = [...this.needed].every((k) => this.s.vips.get(k)?.vip);
    const known = new Set(served.map((l) => this.s.vips.get(l.key)!.vip!));
    const adopting = Date.now() - this.loadedAt < SLOT_RELEASE_MS;
    for (const v of this.slots.held()) if (!allocated || (adopting && this.adopted.has(v))) known.add(v);
    const ch = this.slots.apply(wanted, known);
    const byVip = new Map(served.map((l) => [this.s.vips.get(l.key)!.vip!, this.s.vips.get(l.key)!]));
    const lbOf = new Map(served.map((l) => [this.s.vips.get(l.key)!.vip!, l]));
    for (const { vip, slot } of ch.released) {
      this.programs.clear(vip, slot);
      const st = [...this.s.vips.values()].find((v) => v.vip === vip);
      if (st) {
        st.slot = undefined;
        this.sync.released(st);
      }
    }
    const over = new Set(ch.overflow);
    for (const [vip, st] of byVip) {
      st.slot = this.slots.slotOf(vip);
      const problem = over.has(vip) ? overflowProblem(this.o.node.name, vip, this.slots.max) : undefined;
      if (problem && problem !== st.slotProblem) {
        this.o.logger.error('lb: VIP not served by this node\'s LB pods: no slot left', { service: st.key, vip, slots: this.slots.max, problem });
        // As for a VIP of a family the node cannot forward: the Service's Forwarding condition (through the
        // health report) and a Warning Event say so, not only this node's status.
        const lb = lbOf.get(vip);
        if (lb) this.notifyNotForwarded(lb, vip, problem);
      }
      if (!problem && st.slotProblem) this.o.logger.info('lb: VIP has a slot on this node now', { service: st.key, vip, slot: st.slot });
      st.slotProblem = problem;
    }
    for (const { vip, slot } of ch.assigned) this.o.logger.info('lb: VIP given a slot (an LB pod here serves it)', { service: byVip.get(vip)?.key, vip, slot });
  }

  private loadDatapath(): void {
    const dp = LbDatapath.load({ pinDir: this.o.pinDir, maxVips: this.slots.max, maglevSize: this.o.maglevSize, maxMappings: this.o.maxMappings, nodeProgram: this.mode === 'node' });
    // IPv6 VIPs are forwarded (FoU in outer IPv6) only with the node's IPv6 address; without, they pass to the stack.
    dp.configure(this.o.node.address, this.o.fouPort, this.o.node.address6);
    if (!this.o.node.address6) this.o.logger.info('lb: this node has no IPv6 address (--node-address-6): its LB pods forward no IPv6 VIP');
    dp.onEvents((e) => this.sync.picked(e.key, e.target));
    this.s.dp = dp;
    this.loadedAt = Date.now();
    const prior = dp.services();
    this.slots.adopt(prior);
    this.adopted = new Set(prior.keys());
    this.o.logger.info('lb: datapath loaded', { mode: this.mode, maglevSize: dp.maglevSize, maxVips: dp.maxVips, reusedMappings: dp.mappings().length, reusedSlots: prior.size });
  }

  /** Node mode: the program on the uplink (retried every pass while it fails; VIP traffic meanwhile takes the LB pods' path). */
  private attachUplink(): void {
    try {
      this.s.dp!.attachNode(this.uplink);
      this.uplinkAttached = true;
      this.uplinkProblem = undefined;
      this.o.logger.info('lb: node datapath attached: VIP traffic is handled on the uplink as it arrives', { uplink: this.uplink });
      if (this.o.node.address6) {
        this.ipv6Problem = ipv6ForwardingProblem(this.uplink, () => readNetSysctl(null, `net/ipv6/conf/${this.uplink}/forwarding`));
        if (this.ipv6Problem) this.o.logger.warn('lb: IPv6 VIPs are not forwarded by the node datapath', { uplink: this.uplink, problem: this.ipv6Problem });
      }
    } catch (e) {
      const problem = `node datapath not attached to ${this.uplink}: ${(e as Error).message}; VIP traffic takes the LB pods' path meanwhile`;
      if (problem !== this.uplinkProblem) this.o.logger.error('lb: node datapath not attached; retried', { uplink: this.uplink, error: (e as Error).message });
      this.uplinkProblem = problem;
    }
  }

  /** Why the node datapath cannot forward IPv6 VIPs (IPv6 forwarding off on the uplink), if it cannot. */
  private ipv6Problem: string | undefined;

  /** Pod mode: a node program an earlier tetherd (in node mode) left on the uplink goes. */
  private leaveUplink(): void {
    try {
      if (LbDatapath.detachNodeFrom(this.uplink)) {
        this.o.logger.info('lb: node datapath detached from the uplink (--lb-datapath=pod): VIP traffic goes to the LB pods', { uplink: this.uplink });
      }
    } catch (e) {
      this.o.logger.warn('lb: could not check the uplink for a node datapath left by an earlier run', { uplink: this.uplink, error: (e as Error).message });
    }
  }

  /** Where this node handles VIP traffic, for status. */
  datapathStatus(): Record<string, unknown> {
    // VIP frames the datapath saw that were not addressed to this host (flooded, or a promiscuous uplink): not balanced.
    const notForHost = this.s.dp?.nodeStats().notForHost;
    return {
      mode: this.mode,
      ...(this.mode === 'node' ? { uplink: this.uplink, attached: this.uplinkAttached, ...(this.uplinkProblem ? { problem: this.uplinkProblem } : {}), ...(this.ipv6Problem ? { ipv6Problem: this.ipv6Problem } : {}) } : {}),
      ...(notForHost !== undefined ? { notForHost: Number(notForHost) } : {}),
    };
  }

  // ---- status ------------------------------------------------------------------------------------------

  status(): Array<Record<string, unknown>> {
    const out: Array<Record<string, unknown>> = [];
    const dp = this.s.dp;
    const counts = dp && this.slots.used ? groupByVip(dp.mappings()) : undefined;
    for (const lb of this.lbs.values()) {
      const st = this.s.vips.get(lb.key);
      const vip = st?.vip;
      const stats: LbStats | undefined = st?.slot !== undefined && dp ? dp.stats(st.slot) : undefined;
      const mine = <T extends { vips: Set<string> }>(m: Map<string, T>) => [...m.values()].filter((x) => vip && x.vips.has(vip));
      // No VIP state here: not needed (no local LB pod or target; tether-operator holds it), or
      // needed and not asked for yet. Either way this node does not know the VIP — not "no VIP".
      const vipHere = st ? undefined : this.needed.has(lb.key) ? 'pending: not asked for yet' : 'not needed on this node (no local LB pod or target)';
      out.push({
        service: lb.key,
        family: lb.family,
        vip,
        ...(st?.provisional ? { vipUnconfirmed: `taken from the ${st.provisional} while the cluster store is unreachable; confirmed when it answers` } : {}),
        ...(vipHere ? { vipHere } : {}),
        pool: lb.vip.pool,
        ports: lb.ports.map((p) => `${p.port}/${p.protocol}`),
        affinity: lb.affinity,
        externalTrafficPolicy: lb.externalTrafficPolicy,
        ...(lb.healthCheckNodePort ? { healthCheckNodePort: lb.healthCheckNodePort } : {}),
        idleTimeoutSeconds: lb.idleTimeoutS,
        targets: { active: lb.targets.filter((t) => t.state === 'active').length, terminating: lb.targets.filter((t) => t.state === 'terminating').length },
        localLbPods: mine(this.s.lbPods).map((p) => p.pod),
        localTargets: mine(this.s.targets).map((t) => t.pod),
        // FoU arriving at local targets: decapsulated, and refused for coming from an unregistered source.
        targetFou: Object.fromEntries(mine(this.s.targets).map((t) => {
          const f = t.decap?.stats();
          return [t.pod, f && { packets: Number(f.packets), rejectedSource: Number(f.rejectedSource), errors: Number(f.errors) }];
        })),
        announced: st?.announced ?? false,
        ...(st?.slot !== undefined ? { slot: st.slot, mappingStore: this.sync.status(vip), table: this.tables.status(vip!) } : {}),
        mappings: vip ? counts?.get(vip)?.length ?? 0 : 0,
        problem: st?.problem ?? (lb.targets.length === 0 ? 'no targets: accepted, nothing announced' : undefined),
        // This node's own trouble with the Service (others may serve it): no slot left for its VIP here, or
        // an IPv6 VIP on a node without an IPv6 address.
        ...(st?.slotProblem || st?.familyProblem ? { nodeProblem: st.slotProblem ?? st.familyProblem } : {}),
        counters: stats && Object.fromEntries(Object.entries(stats).map(([k, v]) => [k, Number(v)])),
      });
    }
    for (const u of this.unserved.values()) out.push({ service: u.key, family: u.family, unserved: u.why });
    for (const [key, problems] of this.refused) out.push({ service: key, refused: problems });
    return out;
  }

  /** The node's slot budget: how many VIPs its datapath holds, of how many. */
  slotBudget(): { used: number; max: number } {
    return { used: this.slots.used, max: this.slots.max };
  }
}

/**
 * Why the node datapath cannot forward IPv6 VIPs, or undefined: its route lookup for a target's next hop
 * (bpf_fib_lookup) succeeds in IPv6 only with forwarding on for the uplink, and a node may not forward IPv6
 * (turning it on is the node's choice: a forwarding uplink ignores router advertisements). Off, IPv6 VIP
 * packets are counted as "no route" and dropped.
 */
export function ipv6ForwardingProblem(uplink: string, readForwarding: () => string): string | undefined {
  let v: string;
  try {
    v = readForwarding().trim();
  } catch (e) {
    return `IPv6 forwarding on ${uplink} could not be read (${(e as Error).message}): IPv6 VIPs may not be forwarded`;
  }
  return v === '1' ? undefined : `IPv6 forwarding is off on ${uplink} (net.ipv6.conf.${uplink}.forwarding=${v}): the node datapath cannot route IPv6 VIP packets to their targets; turn it on to serve IPv6 VIPs`;
}
