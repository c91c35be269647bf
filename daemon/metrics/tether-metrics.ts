// tetherd's and tether-operator's Prometheus metrics (prom-client): one set of definitions, each process
// filling the sections of the parts it runs (the operator: store, kube, status passes). Almost everything is read when scraped, from the same
// status each part gives `tetherctl status` (one snapshot per scrape, every section read without a store
// call and without waiting); only CNI requests are counted as they are answered. Names follow Prometheus:
// tether_ prefix, _total on counters, units in names, labels of bounded cardinality (an Egress and its
// floating address, a Service and its VIP, a peer node, a reason: never a pod IP, a flow or a client).
// Process metrics (process_*, nodejs_*) keep prom-client's conventional names.
import { collectDefaultMetrics, Counter, Gauge, Histogram, Registry } from 'prom-client';
import type { Logger } from '../../lib/log';
import { VERSION } from '../../lib/version';
import { STANDBY_SYNC_REASONS } from '../egress/egress-state';

type Labels = Record<string, string>;
type Sample = [Labels, number];

/** This node's pod pools, as Ipam's status reports them (PodAllocator.usage()). */
export interface PodPoolView {
  pool: string;
  families: Array<{ family: number; blocks: string[]; allocated: number; free: number }>;
}

/** A cluster-wide pool, as ClusterAddresses.usage() last reported it (allocated is text while the store is unreachable). */
export interface ClusterPoolView {
  pool: string;
  allocated: number | string;
  capacity?: number;
}

/** One floating address, as EgressController.status() reports it. */
export interface EgressAddressView {
  egress: string;
  address: string;
  ownerNode?: string;
  epoch: number;
  ownedHere: boolean;
  flows: number;
  packets: number;
  bytes: number;
  inSync: string[];
  takeovers?: Record<string, number>;
  /** On the owner: one entry per standby's node (peer: its address); on a standby: per sender (from: its node). */
  sync?: Array<{ peer?: string; state?: string; entriesSent?: number; lagEntries?: number; lagMs?: number; resyncs?: number; from?: string; entriesApplied?: number }>;
  /** When this node is a standby of the address: whether it is in sync with the owner, and why not. */
  standbySync?: { inSync: boolean; reason?: string };
}

/** EgressController.security(): rejected packets, frames and notices by reason. */
export interface EgressSecurityView {
  bfdRejected?: Record<string, number>;
  syncRejected?: Record<string, number>;
  noticesRejected?: Record<string, number>;
}

/** EgressController.bfdStatus(). */
export interface BfdView {
  threadLagMaxMs?: number;
  sessions: Array<{ peer: string; state: string; ups: number; downs: number; rx: number; tx: number }>;
}

/** One Service, as LbController.status() reports it. */
export interface LbServiceView {
  service: string;
  vip?: string;
  announced?: boolean;
  targets?: { active: number; terminating: number };
  mappings?: number;
  mappingStore?: { queued?: number };
  /** table-switch.ts: the version forwarded by, a change waiting, whether new picks are recorded. */
  table?: { mode?: string; version?: number; pending?: { version: number; waitingFor: string[] }; recording?: boolean };
  counters?: Record<string, number>;
}

/** HealthController.status(): the node's state, its answers since start by check and code, each Service's check. */
export interface HealthView {
  healthy?: boolean;
  nodeEligible?: boolean;
  answers?: Array<{ check: string; code: number; count: number }>;
  services?: Array<{ service: string; open?: boolean; localEndpoints?: number; answer?: number }>;
}

/** The Kubernetes side of this process: failed API requests, Events the recorder dropped, Leases it competes for. */
export interface KubeView {
  apiErrors?: Array<{ verb: string; resource: string; code: string; count: number }>;
  /** EventRecorder.stats: new Events refused by their object's budget, writes dropped on a full queue, writes that failed. */
  events?: { rateLimited: number; queueFull: number; failed: number };
  leadership?: Array<{ lease: string; leader: boolean; transitions: number }>;
}

/** The status controller's passes (StatusController.passes): the last one that completed, and how long it took. */
export interface StatusPassView {
  lastSuccessMs?: number;
  lastDurationMs?: number;
}

/** What one scrape reads: each section from one part, absent when the part does not run on this node. */
export interface MetricsSnapshot {
  ipam?: { pods: PodPoolView[]; cluster?: ClusterPoolView[] };
  egress?: EgressAddressView[];
  egressSecurity?: EgressSecurityView;
  bfd?: BfdView;
  lb?: LbServiceView[];
  health?: HealthView;
  /** Each cluster store connection of this node (ipam, egress, lb): up now. */
  store?: Record<string, boolean>;
  /** Per subsystem (ipam, egress, lb): writes the store refused as full (common/store-full.ts). */
  storeFull?: Record<string, { full: boolean; refusals: number }>;
  kube?: KubeView;
  /** tether-operator's leader: its status passes. */
  statusPasses?: StatusPassView;
  /** Pods whose role (egress, lb pod, lb target) could not be set up in the datapath, retried: their roles. */
  roleProblems?: Array<{ role: string }>;
}

/** Where each section comes from: synchronous reads of the parts' state, never a store call. */
export type MetricSources = { [K in keyof MetricsSnapshot]?: () => MetricsSnapshot[K] | undefined };

/** The CNI plugins whose requests tetherd answers on its socket: tether (cni.*) and tether-ipam (ipam.*). */
export type CniPlugin = 'tether' | 'tether-ipam';

/** A CNI request's answer time is observed in these buckets (seconds): an ADD sets up a pod's network. */
export const CNI_DURATION_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30];

const LB_DROPS: Record<string, string> = {
  dropNoTarget: 'noTarget', dropNoPort: 'noPort', dropIcmpNoFlow: 'icmpNoFlow', dropFragment: 'fragment', dropError: 'error',
  dropBadHeader: 'badHeader', dropIpOptions: 'ipOptions', tooBig: 'tooBig', dropNoRoute: 'noRoute',
};
const BFD_STATES = ['AdminDown', 'Down', 'Init', 'Up'];

const finite = (v: unknown): v is number => typeof v === 'number' && Number.isFinite(v);
const flag = (v: unknown): number => (v ? 1 : 0);
function* counts(byKey: Record<string, number> | undefined, label: string, base: Labels = {}): Iterable<Sample> {
  for (const [k, v] of Object.entries(byKey ?? {})) if (finite(v)) yield [{ ...base, [label]: k }, v];
}

export class TetherMetrics {
  readonly registry = new Registry();
  private snap: MetricsSnapshot = {};
  /** Scrapes one after another: each reads its own snapshot. */
  private chain: Promise<unknown> = Promise.resolve();
  /** The last error of each section or metric, logged once until it changes. */
  private readonly lastError = new Map<string, string>();
  private readonly collectErrors: Counter<'section'>;
  private readonly cniRequests: Counter<'plugin' | 'command' | 'result'>;
  private readonly cniDuration: Histogram<'plugin' | 'command'>;
  private sources: MetricSources = {};

  /** Made before the parts it reads (the socket API counts CNI requests into it from the start): see use(). */
  constructor(private readonly logger: Logger) {
    const reg = this.registry;
    collectDefaultMetrics({ register: reg });
    this.collectErrors = new Counter({ name: 'tether_metrics_collect_errors_total', help: 'Sections or metrics a scrape skipped because reading them failed (the error is logged).', labelNames: ['section'], registers: [reg] });
    this.cniRequests = new Counter({ name: 'tether_cni_requests_total', help: 'CNI requests tetherd answered on its socket, by plugin, command and result (ok, or the error code).', labelNames: ['plugin', 'command', 'result'], registers: [reg] });
    this.cniDuration = new Histogram({ name: 'tether_cni_request_duration_seconds', help: 'Time tetherd took to answer a CNI request, by plugin and command.', labelNames: ['plugin', 'command'], buckets: CNI_DURATION_BUCKETS, registers: [reg] });
    this.gauge('tether_build_info', 'The version of this process (tetherd or tether-operator); always 1.', ['version'], () => [[{ version: VERSION }, 1]]);
    this.defineStore();
    this.defineIpam();
    this.defineEgress();
    this.defineBfd();
    this.defineSync();
    this.defineLb();
    this.defineHealth();
    this.defineKube();
    this.gauge('tether_pod_role_problems', 'Pods of this node whose role (egress, lb pod, lb target) could not be set up in the datapath and is retried, by role (the TetherNode\'s DatapathAttached condition names them).', ['role'], (s) => {
      const by = new Map<string, number>();
      for (const p of s.roleProblems ?? []) by.set(p.role, (by.get(p.role) ?? 0) + 1);
      return s.roleProblems ? [...by].map(([role, n]): Sample => [{ role }, n]) : [];
    });
  }

  /** Where scrapes read from from now on. */
  use(sources: MetricSources): void {
    this.sources = sources;
  }

  /** One CNI request answered: `code` is the error code it failed with, undefined when it succeeded. */
  cniAnswered(plugin: CniPlugin, command: string, seconds: number, code?: string): void {
    this.cniRequests.inc({ plugin, command, result: code ?? 'ok' });
    this.cniDuration.observe({ plugin, command }, seconds);
  }

  get contentType(): string {
    return this.registry.contentType;
  }

  /** The exposition text. Never throws: a section or metric that fails is logged, counted and left out. */
  scrape(): Promise<string> {
    const run = this.chain.then(async () => {
      this.snap = this.snapshot();
      try {
        return await this.registry.metrics();
      } finally {
        this.snap = {};
      }
    });
    this.chain = run.catch(() => undefined);
    return run;
  }

  private snapshot(): MetricsSnapshot {
    const out: MetricsSnapshot = {};
    for (const key of Object.keys(this.sources) as Array<keyof MetricsSnapshot>) {
      try {
        (out as Record<string, unknown>)[key] = this.sources[key]?.();
        this.lastError.delete(key);
      } catch (e) {
        this.failed(key, e);
      }
    }
    return out;
  }

  private failed(what: string, e: unknown): void {
    this.collectErrors.inc({ section: what });
    const message = (e as Error)?.message ?? String(e);
    if (this.lastError.get(what) === message) return;
    this.lastError.set(what, message);
    this.logger.error('metrics: reading failed; left out of the scrape', { section: what, error: message });
  }

  /** A metric whose samples are read from the scrape's snapshot; a read that throws leaves it empty. */
  private define(kind: 'gauge' | 'counter', name: string, help: string, labelNames: string[], read: (s: MetricsSnapshot) => Iterable<Sample>): void {
    const fill = (m: Gauge | Counter, put: (l: Labels, v: number) => void) => {
      m.reset();
      // prom-client gives a metric without labels a 0 sample of its own: absent instead, unless read.
      if (!labelNames.length) m.remove({});
      try {
        for (const [labels, v] of read(this.snap)) if (finite(v)) put(labels, v);
      } catch (e) {
        m.reset();
        if (!labelNames.length) m.remove({});
        this.failed(name, e);
      }
    };
    if (kind === 'gauge') {
      const g: Gauge = new Gauge({ name, help, labelNames, registers: [this.registry], collect: () => fill(g, (l, v) => g.set(l, v)) });
    } else {
      const c: Counter = new Counter({ name, help, labelNames, registers: [this.registry], collect: () => fill(c, (l, v) => c.inc(l, Math.max(0, v))) });
    }
  }

  private gauge(name: string, help: string, labelNames: string[], read: (s: MetricsSnapshot) => Iterable<Sample>): void {
    this.define('gauge', name, help, labelNames, read);
  }

  private counter(name: string, help: string, labelNames: string[], read: (s: MetricsSnapshot) => Iterable<Sample>): void {
    this.define('counter', name, help, labelNames, read);
  }

  private defineStore(): void {
    this.gauge('tether_store_reachable', 'Whether this node reaches the cluster store (1) or not (0), per subsystem: ipam, egress (its last store pass), lb.', ['subsystem'], (s) =>
      Object.entries(s.store ?? {}).map(([subsystem, up]): Sample => [{ subsystem }, flag(up)]));
    this.gauge('tether_store_full', 'Whether the cluster store refused a write of this subsystem as full (Redis at its maxmemory, noeviction) in the last minute with none going through since (1) or not (0): ipam, egress, lb.', ['subsystem'], (s) =>
      Object.entries(s.storeFull ?? {}).map(([subsystem, x]): Sample => [{ subsystem }, flag(x.full)]));
    this.counter('tether_store_full_refusals_total', 'Writes the cluster store refused as full (Redis at its maxmemory, noeviction), per subsystem.', ['subsystem'], (s) =>
      Object.entries(s.storeFull ?? {}).map(([subsystem, x]): Sample => [{ subsystem }, x.refusals]));
  }

  private defineIpam(): void {
    const fams = (s: MetricsSnapshot) => (s.ipam?.pods ?? []).flatMap((p) => p.families.map((f) => ({ labels: { pool: p.pool, family: `ipv${f.family}` }, f })));
    this.gauge('tether_ipam_pod_addresses_allocated', 'Pod addresses this node has allocated from its blocks, per pool and family.', ['pool', 'family'], (s) => fams(s).map(({ labels, f }): Sample => [labels, f.allocated]));
    this.gauge('tether_ipam_pod_addresses_capacity', 'Pod addresses this node\'s blocks hold (allocated and free), per pool and family.', ['pool', 'family'], (s) => fams(s).map(({ labels, f }): Sample => [labels, f.allocated + f.free]));
    this.gauge('tether_ipam_pod_blocks', 'Address blocks this node holds, per pool and family.', ['pool', 'family'], (s) => fams(s).map(({ labels, f }): Sample => [labels, f.blocks.length]));
    this.gauge('tether_ipam_cluster_addresses_allocated', 'Addresses of a cluster-wide (floating, loadBalancer) pool allocated, as the cluster store last said (absent while it has not answered).', ['pool'], (s) =>
      (s.ipam?.cluster ?? []).map((p): Sample => [{ pool: p.pool }, typeof p.allocated === 'number' ? p.allocated : NaN]));
    this.gauge('tether_ipam_cluster_addresses_capacity', 'Addresses a cluster-wide pool can hand out (its subnets less reserved ones).', ['pool'], (s) =>
      (s.ipam?.cluster ?? []).map((p): Sample => [{ pool: p.pool }, p.capacity ?? NaN]));
  }

  private defineEgress(): void {
    const addrs = (s: MetricsSnapshot) => (s.egress ?? []).map((a) => ({ a, l: { egress: a.egress, address: a.address } }));
    this.gauge('tether_egress_address_owner_info', 'The node owning an Egress\'s floating address, as this node knows it; always 1.', ['egress', 'address', 'owner_node'], (s) =>
      addrs(s).filter(({ a }) => a.ownerNode).map(({ a, l }): Sample => [{ ...l, owner_node: a.ownerNode! }, 1]));
    this.gauge('tether_egress_address_owned', 'Whether a gateway pod on this node holds the floating address (1) or not (0).', ['egress', 'address'], (s) => addrs(s).map(({ a, l }): Sample => [l, flag(a.ownedHere)]));
    this.gauge('tether_egress_address_epoch', 'The ownership epoch of the floating address as this node knows it.', ['egress', 'address'], (s) => addrs(s).map(({ a, l }): Sample => [l, a.epoch]));
    this.gauge('tether_egress_address_in_sync_standbys', 'Standby nodes the owner last reported in sync with its connection table.', ['egress', 'address'], (s) => addrs(s).map(({ a, l }): Sample => [l, a.inSync?.length ?? 0]));
    this.counter('tether_egress_address_flows_total', 'Flows of this node\'s client pods pinned to the floating address.', ['egress', 'address'], (s) => addrs(s).map(({ a, l }): Sample => [l, a.flows]));
    this.counter('tether_egress_address_packets_total', 'Packets of this node\'s client pods steered to the floating address.', ['egress', 'address'], (s) => addrs(s).map(({ a, l }): Sample => [l, a.packets]));
    this.counter('tether_egress_address_bytes_total', 'Bytes (inner) of this node\'s client pods steered to the floating address.', ['egress', 'address'], (s) => addrs(s).map(({ a, l }): Sample => [l, a.bytes]));
    this.counter('tether_egress_address_takeovers_total', 'Ownership changes of the floating address this node decided, by cause: initial, failover, handover.', ['egress', 'address', 'cause'], (s) =>
      addrs(s).flatMap(({ a, l }) => [...counts(a.takeovers, 'cause', l)]));
    this.counter('tether_egress_notices_rejected_total', 'Ownership notices from other nodes refused, by reason.', ['reason'], (s) => counts(s.egressSecurity?.noticesRejected, 'reason'));
    // Every reason, zeros included, so an alert on one has a series to watch before it happens.
    this.gauge('tether_egress_standby_sync_problem_addresses', 'Floating addresses this node is a standby of (its gateway a candidate, the owner live elsewhere) without the owner\'s connections, by reason: unreachable, resyncing, version, auth, stale, protocol.', ['reason'], (s) => {
      const by = new Map<string, number>(STANDBY_SYNC_REASONS.map((r) => [r, 0]));
      for (const a of s.egress ?? []) if (a.standbySync && !a.standbySync.inSync && a.standbySync.reason) by.set(a.standbySync.reason, (by.get(a.standbySync.reason) ?? 0) + 1);
      return [...by].map(([reason, n]): Sample => [{ reason }, n]);
    });
  }

  private defineBfd(): void {
    const sessions = (s: MetricsSnapshot) => s.bfd?.sessions ?? [];
    this.gauge('tether_bfd_session_state', 'BFD session with a peer node (its address) in each state: 1 for the current one.', ['peer', 'state'], (s) =>
      sessions(s).flatMap((x) => BFD_STATES.map((state): Sample => [{ peer: x.peer, state }, flag(x.state === state)])));
    this.counter('tether_bfd_session_transitions_total', 'BFD session state changes to up and to down (a flap is one of each).', ['peer', 'to'], (s) =>
      sessions(s).flatMap((x): Sample[] => [[{ peer: x.peer, to: 'up' }, x.ups], [{ peer: x.peer, to: 'down' }, x.downs]]));
    this.counter('tether_bfd_received_packets_total', 'BFD control packets received from the peer.', ['peer'], (s) => sessions(s).map((x): Sample => [{ peer: x.peer }, x.rx]));
    this.counter('tether_bfd_sent_packets_total', 'BFD control packets sent to the peer.', ['peer'], (s) => sessions(s).map((x): Sample => [{ peer: x.peer }, x.tx]));
    this.counter('tether_bfd_rejected_packets_total', 'BFD packets dropped, by reason (malformed, unauthenticated, replayed, from no session).', ['reason'], (s) => counts(s.egressSecurity?.bfdRejected, 'reason'));
    this.gauge('tether_bfd_thread_lag_max_seconds', 'Worst delay of the BFD thread\'s timers since tetherd started.', [], (s) =>
      s.bfd && finite(s.bfd.threadLagMaxMs) ? [[{}, s.bfd.threadLagMaxMs / 1000]] : []);
  }

  private defineSync(): void {
    const streams = (s: MetricsSnapshot) => (s.egress ?? []).flatMap((a) => (a.sync ?? []).map((x) => ({ x, l: { egress: a.egress, address: a.address, peer: x.peer ?? x.from ?? '' } })));
    const sending = (s: MetricsSnapshot) => streams(s).filter(({ x }) => x.peer !== undefined);
    const receiving = (s: MetricsSnapshot) => streams(s).filter(({ x }) => x.from !== undefined);
    this.gauge('tether_conntrack_sync_connected', 'Owner side: whether the sync stream to a standby node (its address) is connected.', ['egress', 'address', 'peer'], (s) =>
      sending(s).map(({ x, l }): Sample => [l, flag(x.state === 'resync' || x.state === 'streaming')]));
    this.gauge('tether_conntrack_sync_lag_entries', 'Owner side: connection-table entries queued or sent to the standby and not yet acknowledged.', ['egress', 'address', 'peer'], (s) =>
      sending(s).map(({ x, l }): Sample => [l, x.lagEntries ?? NaN]));
    this.gauge('tether_conntrack_sync_lag_seconds', 'Owner side: from the first event of the last acknowledged frame to its acknowledgement.', ['egress', 'address', 'peer'], (s) =>
      sending(s).map(({ x, l }): Sample => [l, (x.lagMs ?? NaN) / 1000]));
    this.counter('tether_conntrack_sync_sent_entries_total', 'Owner side: connection-table entries sent to the standby.', ['egress', 'address', 'peer'], (s) => sending(s).map(({ x, l }): Sample => [l, x.entriesSent ?? NaN]));
    this.counter('tether_conntrack_sync_sent_resyncs_total', 'Owner side: full table transfers sent to the standby.', ['egress', 'address', 'peer'], (s) => sending(s).map(({ x, l }): Sample => [l, x.resyncs ?? NaN]));
    this.counter('tether_conntrack_sync_applied_entries_total', 'Standby side: entries received from the owner\'s node (peer: its name) and applied.', ['egress', 'address', 'peer'], (s) =>
      receiving(s).map(({ x, l }): Sample => [l, x.entriesApplied ?? NaN]));
    this.counter('tether_conntrack_sync_received_resyncs_total', 'Standby side: full table transfers received from the owner\'s node.', ['egress', 'address', 'peer'], (s) => receiving(s).map(({ x, l }): Sample => [l, x.resyncs ?? NaN]));
    this.counter('tether_conntrack_sync_rejected_frames_total', 'Sync connections or frames refused, by reason.', ['reason'], (s) => counts(s.egressSecurity?.syncRejected, 'reason'));
  }

  private defineLb(): void {
    const vips = (s: MetricsSnapshot) => (s.lb ?? []).filter((x) => x.vip).map((x) => ({ x, l: { service: x.service, vip: x.vip! } }));
    const counter = (name: string, help: string, key: string) =>
      this.counter(name, help, ['service', 'vip'], (s) => vips(s).filter(({ x }) => x.counters).map(({ x, l }): Sample => [l, x.counters![key]]));
    counter('tether_lb_packets_total', 'Packets to the VIP this node forwarded to a target.', 'packets');
    counter('tether_lb_bytes_total', 'Bytes (inner) to the VIP this node forwarded to a target.', 'bytes');
    counter('tether_lb_mapping_misses_total', 'Packets to the VIP with no valid client mapping: target picked from the Maglev table.', 'misses');
    counter('tether_lb_icmp_forwarded_packets_total', 'ICMP errors about a VIP\'s flow sent to the target holding it.', 'icmpForwarded');
    counter('tether_lb_lost_reports_total', 'New mappings the datapath could not report (ring buffer full): not stored cluster-wide.', 'reportLost');
    counter('tether_lb_mapping_table_full_total', 'New flows forwarded by their Maglev pick without a mapping on this node: its table was full.', 'mappingFull');
    counter('tether_lb_fragments_forwarded_total', 'Later fragments of datagrams to the VIP sent after their first fragment.', 'fragments');
    this.counter('tether_lb_dropped_packets_total', 'Packets to the VIP dropped, by reason.', ['service', 'vip', 'reason'], (s) =>
      vips(s).filter(({ x }) => x.counters).flatMap(({ x, l }) => Object.entries(LB_DROPS).map(([key, reason]): Sample => [{ ...l, reason }, x.counters![key]])));
    this.gauge('tether_lb_mappings', 'Client mappings of the VIP in this node\'s table.', ['service', 'vip'], (s) => vips(s).map(({ x, l }): Sample => [l, x.mappings ?? NaN]));
    this.gauge('tether_lb_store_queued_mappings', 'New mappings of the VIP waiting to be written to the cluster store.', ['service', 'vip'], (s) =>
      vips(s).filter(({ x }) => x.mappingStore).map(({ x, l }): Sample => [l, x.mappingStore!.queued ?? NaN]));
    this.gauge('tether_lb_table_version', 'The Maglev table version (target set agreed through the store) the VIP is forwarded by on this node.', ['service', 'vip'],
      (s) => vips(s).filter(({ x }) => x.table?.version !== undefined).map(({ x, l }): Sample => [l, x.table!.version!]));
    this.gauge('tether_lb_table_change_pending', 'A target-set change of the VIP waits for LB nodes to record the flows it moves: 1, else 0.', ['service', 'vip'],
      (s) => vips(s).filter(({ x }) => x.table?.mode === 'change').map(({ x, l }): Sample => [l, x.table!.pending ? 1 : 0]));
    this.gauge('tether_lb_recording_every_pick', 'New picks of the VIP are reported and written to the store (a change under way, externalTrafficPolicy Local, or a node of an earlier release registered): 1, else 0.', ['service', 'vip'],
      (s) => vips(s).filter(({ x }) => x.table).map(({ x, l }): Sample => [l, x.table!.recording ? 1 : 0]));
    this.gauge('tether_lb_vip_announced', 'Whether this node announces the VIP (1) or not (0).', ['service', 'vip'], (s) => vips(s).map(({ x, l }): Sample => [l, flag(x.announced)]));
    this.gauge('tether_lb_targets', 'Targets of the Service, by state (active, terminating).', ['service', 'state'], (s) =>
      (s.lb ?? []).filter((x) => x.targets).flatMap((x): Sample[] => [[{ service: x.service, state: 'active' }, x.targets!.active], [{ service: x.service, state: 'terminating' }, x.targets!.terminating]]));
  }

  private defineHealth(): void {
    const services = (s: MetricsSnapshot) => s.health?.services ?? [];
    this.gauge('tether_health_node_healthy', 'Whether the node health check answers healthy (1) or not (0).', [], (s) => (s.health ? [[{}, flag(s.health.healthy)]] : []));
    this.gauge('tether_health_node_eligible', 'Whether the node may take load-balanced traffic (not being deleted or drained).', [], (s) => (s.health ? [[{}, flag(s.health.nodeEligible)]] : []));
    this.gauge('tether_health_service_local_endpoints', 'Local endpoints the Service\'s health check counts on this node.', ['service'], (s) => services(s).map((x): Sample => [{ service: x.service }, x.localEndpoints ?? 0]));
    this.gauge('tether_health_service_healthy', 'Whether the Service\'s health check answers 200 on this node (1) or not (0).', ['service'], (s) => services(s).map((x): Sample => [{ service: x.service }, flag(x.answer === 200)]));
    this.gauge('tether_health_service_port_open', 'Whether the Service\'s health-check port is open on this node.', ['service'], (s) => services(s).map((x): Sample => [{ service: x.service }, flag(x.open)]));
    this.counter('tether_health_answers_total', 'Health-check answers this node gave, by check (healthz, livez: the node\'s; service: the Services\' checks) and HTTP code.', ['check', 'code'], (s) =>
      (s.health?.answers ?? []).map((a): Sample => [{ check: a.check, code: String(a.code) }, a.count]));
  }

  private defineKube(): void {
    this.counter('tether_kube_api_errors_total', 'Kubernetes API requests that failed, by verb, resource and HTTP code (network: no answer); watches included.', ['verb', 'resource', 'code'], (s) =>
      (s.kube?.apiErrors ?? []).map((e): Sample => [{ verb: e.verb, resource: e.resource, code: e.code }, e.count]));
    // Every reason, zeros included, so an alert on one has a series to watch before it happens.
    this.counter('tether_kube_events_dropped_total', 'Kubernetes Events not written, by reason: rate_limited (the object\'s budget spent), queue_full, failed (the API refused or was away).', ['reason'], (s) => {
      const e = s.kube?.events;
      return e ? [[{ reason: 'rate_limited' }, e.rateLimited], [{ reason: 'queue_full' }, e.queueFull], [{ reason: 'failed' }, e.failed]] : [];
    });
    this.gauge('tether_leader', 'Whether this process holds the Lease (1) or not (0), per Lease it competes for.', ['lease'], (s) =>
      (s.kube?.leadership ?? []).map((l): Sample => [{ lease: l.lease }, flag(l.leader)]));
    this.counter('tether_leader_transitions_total', 'Times this process became leader or stopped being it, per Lease.', ['lease'], (s) =>
      (s.kube?.leadership ?? []).map((l): Sample => [{ lease: l.lease }, l.transitions]));
    this.gauge('tether_status_pass_last_success_timestamp_seconds', 'When tether-operator\'s leader last completed a status pass (AddressPools, Egresses, Services), Unix time; absent before its first.', [], (s) =>
      finite(s.statusPasses?.lastSuccessMs) ? [[{}, s.statusPasses.lastSuccessMs / 1000]] : []);
    this.gauge('tether_status_pass_duration_seconds', 'How long tether-operator\'s last completed status pass took.', [], (s) =>
      finite(s.statusPasses?.lastDurationMs) ? [[{}, s.statusPasses.lastDurationMs / 1000]] : []);
  }
}
