// What the parts of the Egress controller share on one node: its options, the state of this node's Egresses,
// gateways, clients and floating addresses, and the timings and small helpers every part uses. The
// controller owns the one EgressShared; each part (egress-controller.ts builds them, in dependency order)
// receives it and the other parts it uses in its constructor. Nothing here knows a part.
import type { Logger } from '../../lib/log';
import { storeFullFailure } from '../common/store-full';
import type { AttachService } from '../pod/attach-service';
import type { EgressMaps, EgressSteer } from '../bpf/egress-steer';
import type { BfdThread } from '../bfd/threaded';
import type { ConntrackEvents } from '../conntrack';
import type { SyncReceiver, SyncSender } from '../conntrack-sync';
import { InFlight } from '../util/in-flight';
import { KeyedMutex } from '../../lib/keyed-mutex';
import type { ClusterAddresses } from '../../ipam/cluster-addresses';
import { slotOwner, type AddressSlot, type ResolvedEgress } from './egress-spec';
import type { PodMeta } from '../config/objects';
import type { GatewayDatapath } from './gateway-datapath';
import type { NoticeChannel } from './ownership-notice';
import type { GatewayInfo, Ownership, OwnershipStore } from './ownership-store';

export interface EgressControllerOptions {
  /** maxEgressAddresses: this node's cap on the addresses of one Egress (over the Egress's own). */
  /**
   * address: IPv4 (the IPv4 underlay) or IPv6 (an IPv6 underlay); address6: over an IPv4 underlay, the
   * node's IPv6 address, outer source of FoU to gateway pods without IPv4 (and registered for their allow-lists).
   */
  node: { name: string; zone?: string; address: string; address6?: string; uplink: string; maxEgressAddresses?: number };
  pinDir: string;
  fouPort: number;
  /** TCP: conntrack sync; UDP on the same number: ownership notices. */
  syncPort: number;
  /** Shared cluster key (≥ 32 bytes): BFD keyed SHA1, conntrack sync and ownership notices derive from it. */
  clusterKey: Buffer;
  egresses: ResolvedEgress[];
  /** Pod metadata from the config source ("namespace/name"): labels override pod records' own. */
  podLabels?: Record<string, PodMeta>;
  ownership: OwnershipStore;
  addresses: ClusterAddresses;
  attach: AttachService;
  logger: Logger;
  /** For the negative control in tests: without sync, takeover loses the connections. */
  conntrackSync?: boolean;
  /** Size of the node's flow pin map (flows of client pods on this node). */
  maxFlows?: number;
  /** Told of every ownership change this node decides (Kubernetes Events); must not throw or wait. */
  onOwnershipChanged?: (c: OwnershipChange) => void;
  /**
   * How long a holder that must let an address go (tetherd stopping, its gateway pod deleted) keeps it
   * while no standby is in sync, waiting for one to be (HANDOVER_WAIT_MS).
   */
  handoverWaitMs?: number;
  /** Told when this node, a standby, cannot sync with an address's owner (reported) and when that is over; must not throw or wait. */
  onStandbySyncChanged?: (c: StandbySyncChange) => void;
}

/**
 * Why a standby is not in sync, a bounded set (a metric label): `unreachable` no sync connection from the
 * owner's node arrives; `resyncing` one does and its first transfer is under way; the others are the
 * reason this node refused the owner's connection: `version` no protocol version in common, `auth` the
 * cluster key or an identity, `stale` an older ownership epoch than seen, `protocol` a malformed stream.
 */
export type StandbySyncReason = 'unreachable' | 'resyncing' | 'version' | 'auth' | 'stale' | 'protocol';
export const STANDBY_SYNC_REASONS: readonly StandbySyncReason[] = ['unreachable', 'resyncing', 'version', 'auth', 'stale', 'protocol'];
/** A standby's sync problem turning reported, changing reason, or over after it was reported. */
export interface StandbySyncChange {
  egress: string;
  address: string;
  node: string;
  /** This node's gateway pods of the Egress (the standbys). */
  pods: string[];
  owner: { pod: string; node: string };
  inSync: boolean;
  reason?: StandbySyncReason;
  message?: string;
  /** How long it has not been in sync (ms). */
  forMs: number;
}

/** An ownership change this node decided: a first owner, a failover takeover or a planned handover. */
export interface OwnershipChange {
  /** "namespace/name" */
  egress: string;
  address: string;
  /** The owner before (absent for the first owner). */
  from?: { pod: string; node?: string };
  to: { pod: string; node?: string };
  cause: string;
  epoch: number;
  decidedBy: string;
}

export interface LocalGateway {
  info: GatewayInfo;
  datapath: GatewayDatapath;
  egresses: Set<string>;
  /** The destinations its guard and rules were last prepared for (JSON), so an unchanged set is not rewritten. */
  guarded: string;
  netns: string;
}

export interface ClientPod {
  /** The pod's IPv4 address; absent for an IPv6-only pod. */
  ip?: string;
  /** The pod's IPv6 address (dual-stack or IPv6-only): its IPv6 traffic is steered by it. */
  ip6?: string;
  hostIfName: string;
  egressIds: number[];
  steer?: EgressSteer;
}

export interface AddressState {
  egress: ResolvedEgress;
  address: string;
  /** The slot of spec.addresses it fills, and its allocation owner in the cluster store. */
  slot: AddressSlot;
  slotOwner: string;
  own: Ownership;
  candidates: GatewayInfo[];
  /** The local gateway holding it, when this node owns it. */
  holder?: LocalGateway;
  events?: ConntrackEvents;
  senders: Map<string, SyncSender>;
  /** Nodes the owner last reported in sync (from its heartbeat; computed here while this node owns). */
  inSync: Set<string>;
  /** When this node first saw the current owner dead (for the out-of-sync hold-down). */
  ownerDownSince?: number;
  /** This node is waiting out the hold-down (logged once per wait). */
  waiting?: boolean;
  /** The store holds `own` (this node decided or learned it there). */
  recorded: boolean;
  lastTakeover?: { at: string; cause: string; ms: number; epoch: number; from: string; to: string; decidedBy: string };
  /** Ownership changes of the address this node decided, by kind of cause (takeoverCause): status and metrics. */
  takeovers?: Partial<Record<TakeoverCause, number>>;
  /** Clients re-steer when the new owner confirms (or at this timer): see adopt(). */
  steerTimer?: NodeJS.Timeout;
  /**
   * The holder must let the address go (its pod leaving, or tetherd stopping) and keeps serving it until
   * a standby is in sync or `until` (Election.handOverWhenInSync); the election pass leaves it alone.
   */
  handingOver?: { pod: string; since: number; until: number };
}

/**
 * A peer whose BFD session has not come Up yet (just discovered, or this tetherd just started) counts as
 * alive for this long: otherwise every node would see every other as dead at start and claim.
 */
export const BFD_STARTUP_GRACE_MS = 3000;
/**
 * A node whose authenticated notices (heartbeats, gateway announcements) arrived this recently is alive as
 * far as this node can tell, while no BFD session with it has come Up yet.
 */
export const HEARD_MS = 3000;
/** A gateway announced by its node's notices (not the store) is a candidate this long after the last one. */
export const ANNOUNCED_TTL_MS = 3000;
/**
 * A gateway pod deleted through CNI DEL keeps forwarding (its conntrack and SNAT intact) this long after
 * handing its addresses over, so packets clients sent before they learned the new owner still get
 * through instead of waiting for a TCP retransmission timeout.
 */
export const DRAIN_MS = 300;
/**
 * A holder that must let an address go with no standby in sync keeps it this long at most, waiting for
 * one (a standby that just restarted resyncs in well under a second per 100,000 flows). It fits in the
 * DaemonSet's terminationGracePeriodSeconds (30) with the rest of tetherd's stop, and in a CNI DEL's
 * 60 s answer timeout (call-core.ts).
 */
export const HANDOVER_WAIT_MS = 20_000;
/** While it waits, the holder looks for an in-sync standby this often. */
export const HANDOVER_POLL_MS = 200;
/** Clients told of a new owner by another node re-steer on the owner's confirmation, or after this. */
export const CONFIRM_WAIT_MS = 150;
/**
 * The cause of a planned handover whose old gateway keeps forwarding through a drain: its clients can wait
 * for the new owner's confirmation. (When the old gateway is gone, they switch at once: every packet
 * still sent to it is lost.)
 */
export const draining = (cause: string) => `${cause} (old gateway draining)`;
/** The kinds of ownership change, for counting: a cause's text names pods and nodes, its kind does not. */
export type TakeoverCause = 'initial' | 'failover' | 'handover';
/** The kind of a change this node decided: a claim is the first placement or a failover, anything handed on a handover. */
export const takeoverCause = (cause: string, handedOver: boolean): TakeoverCause => (handedOver ? 'handover' : cause === 'initial' ? 'initial' : 'failover');
/** One more change of `st` decided here, of this kind. */
export function countTakeover(st: AddressState, kind: TakeoverCause): void {
  const t = (st.takeovers ??= {});
  t[kind] = (t[kind] ?? 0) + 1;
}
export const isDraining = (cause: string | undefined) => !!cause?.endsWith(DRAINING);
const DRAINING = ' (old gateway draining)';
/** `cause` with a note added, before the draining mark that nodes of every release look for at its end. */
export const causeWithNote = (cause: string, note: string) => (isDraining(cause) ? `${cause.slice(0, -DRAINING.length)}; ${note}${DRAINING}` : `${cause}; ${note}`);
export const TICK_MS = 250;
/** The candidate set of an Egress must be unchanged this long before its addresses are first placed. */
export const INITIAL_SETTLE_MS = 2000;
/** Store pass (registry, node list, records) and the owner's heartbeat notice. */
export const STORE_EVERY_MS = 1000;
export const HEARTBEAT_MS = 1000;
/** A decision is sent twice: UDP may lose one datagram, a retransmission timeout costs far more. */
export const NOTICE_REPEAT_MS = 20;
/** How often an owner checks each standby against its table (bucket digests; no full re-send). */
export const CONSISTENCY_EVERY_MS = 30_000;
/** A sync peer with fewer entries than this waiting is "in sync" (its standby has the connections). */
export const IN_SYNC_MAX_LAG = 1000;

export class EgressShared {
  readonly egresses = new Map<string, ResolvedEgress>();

  readonly egressIds = new Map<string, number>();

  readonly gateways = new Map<string, LocalGateway>();

  readonly clients = new Map<string, ClientPod>();

  readonly addresses = new Map<string, AddressState>();

  /** Last known registry and node list: kept while the store is unreachable. */
  readonly registry = new Map<string, GatewayInfo[]>();

  nodes: string[] = [];

  /**
   * The registered nodes' node addresses (--node-address) with their names, from the store's last pass:
   * `nodes` also holds the IPv6 addresses registered beside IPv4 ones (FoU sources), which are no peers.
   */
  nodeNames = new Map<string, string>();

  /** Why an Egress has fewer addresses than it asks for (allocation failures), by Egress. */
  readonly shortfall = new Map<string, string>();

  readonly mutex = new KeyedMutex();

  /** Every piece of work started by a timer or an event; stop() waits for it. */
  readonly work = new InFlight();

  /** Background writes of decisions to the store; awaited last, briefly, on stop. */
  readonly records = new InFlight();

  endpoint?: BfdThread;

  receiver?: SyncReceiver;

  notices?: NoticeChannel;

  maps?: EgressMaps;

  /** Pod metadata from the config source ("namespace/name"); labels override a pod record's own. */
  podMeta = new Map<string, PodMeta>();

  stopped = false;

  storeDown = false;

  /** Cluster-wide use of each Egress's addresses (every node's clients), from the store's last pass. */
  readonly usage = new Map<string, Record<string, { flows: number; bytes: number }>>();

  /** Until when someone reads the cluster-wide status (status(), egressSummary()): the store pass reads usage meanwhile. */
  observedUntil = 0;

  /** The Egresses this node has client pods of. */
  clientEgresses(): Set<string> {
    const byId = new Map([...this.egressIds].map(([k, id]) => [id, k]));
    const out = new Set<string>();
    for (const c of this.clients.values()) for (const id of c.egressIds) {
      const k = byId.get(id);
      if (k) out.add(k);
    }
    return out;
  }

  /**
   * The Egresses this node plays a part in: it has a gateway or a client pod of them, or holds one of their
   * addresses (one walk). Only those does the store pass read periodically and the election tick evaluate.
   */
  involvedSet(): Set<string> {
    const out = this.clientEgresses();
    for (const g of this.gateways.values()) for (const e of g.egresses) out.add(e);
    for (const st of this.addresses.values()) if (st.holder) out.add(st.egress.key);
    return out;
  }

  /** Runs event- or timer-driven work unless stopping; its failure is logged, never thrown. */
  spawn(fn: () => Promise<void>): void {
    if (this.stopped) return;
    void this.work.run(fn).catch((e) => this.o.logger.error('egress: work failed', { error: (e as Error).message, stack: (e as Error).stack }));
  }

  track(e: ResolvedEgress, address: string, slot: AddressSlot, own?: Ownership): AddressState {
    const key = `${e.key}|${address}`;
    let st = this.addresses.get(key);
    if (!st) {
      st = {
        egress: e, address, slot, slotOwner: slotOwner(e.key, slot), own: own ?? { egress: e.key, address, owner: '', epoch: 0 },
        candidates: [], senders: new Map(), inSync: new Set(), recorded: !!own,
      };
      this.addresses.set(key, st);
    }
    return st;
  }

  /** Tells the ownership-change listener, if any; it is informative: its failure changes nothing. */
  ownershipChanged(c: OwnershipChange): void {
    try {
      this.o.onOwnershipChanged?.(c);
    } catch (e) {
      this.o.logger.debug('egress: ownership change listener failed', { egress: c.egress, address: c.address, error: (e as Error).message });
    }
  }

  /**
   * A store call failed. A full store (it refused a write: its maxmemory reached) is not a store that is
   * down: it answers reads, so ownership goes on following its records and nothing moves because of it;
   * the refusal is counted and reported (common/store-full.ts) and the write tried again on a later pass.
   */
  storeFailed(e: unknown): void {
    if (storeFullFailure('egress', 'ownership store', 'an egress write', e)) return;
    if (this.storeDown) return;
    this.storeDown = true;
    this.o.logger.warn('egress: cluster store unreachable; ownership is decided between tetherds meanwhile', { error: (e as Error).message });
  }

  /** The configured Egresses are numbered from 1, in their order. */
  constructor(readonly o: EgressControllerOptions) {
    o.egresses.forEach((e, i) => {
      this.egresses.set(e.key, e);
      this.egressIds.set(e.key, i + 1);
    });
    this.podMeta = new Map(Object.entries(o.podLabels ?? {}));
  }
}

/** One floating address of one Egress: its sync stream name and its lock key. */
export function streamOf(st: AddressState): string {
  return `${st.egress.key}|${st.address}`;
}

/**
 * Whether `e` takes the pod of namespace `ns` with `labels` as one of its clients or gateways: a pod of the
 * Egress's own namespace whose labels match (a selector has no namespace of its own: egress-spec.ts).
 */
export function selects(e: Pick<ResolvedEgress, 'namespace' | 'clients' | 'gateways'>, role: 'clients' | 'gateways', ns: string, labels: Record<string, string>): boolean {
  return e.namespace === ns && Object.entries(e[role].matchLabels).every(([k, v]) => labels[k] === v);
}
