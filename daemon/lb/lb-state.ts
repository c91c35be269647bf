// What the load balancer's modules share on one node: the options, each Service's VIP, the local LB pods
// and target pods, and the datapath once loaded. LbController owns the one LbShared; each module
// (vip-addresses, vip-slots, vip-programs, lb-pods, targets, mapping-sync) changes only its own part.
import type { Logger } from '../../lib/log';
import { isNetlinkError } from '../netlink';
import type { LbDatapath, LbDatapathMode, LbMapping } from '../bpf/lb';
import type { FouDecap } from '../bpf/fou';
import type { ClusterAddresses } from '../../ipam/cluster-addresses';
import type { AttachService } from '../pod/attach-service';
import type { DsrTarget } from '../pod/dsr-target';
import type { AttachmentKey } from '../state/pod-store';
import type { LbStore } from './lb-store';
import type { ResolvedLoadBalancer } from './lb-spec';
import type { NotForwardedVip } from '../health/health-controller';

export type { NotForwardedVip };

/** FoU over IPv4: what the targets' MTU is lowered by (pod/dsr-target.ts lowers the IPv6 MTU by the rest of outer IPv6's). */
export const FOU_OVERHEAD = 28;

export interface LbControllerOptions {
  /**
   * The node's name and registered addresses: FoU to targets leaves from address (IPv4 VIPs) and address6
   * (IPv6 VIPs; without it this node forwards no IPv6 VIP's traffic).
   */
  node: { name: string; address: string; address6?: string };
  pinDir: string;
  fouPort: number;
  /** Route-export table the node's BGP speaker advertises (0: none, the VIP is only routed locally). */
  exportTable: number;
  /** VIP slots of this node's datapath (its maps are sized for them): VIPs with an LB pod here. */
  maxVips?: number;
  maglevSize?: number;
  /** Entries of the node's mapping table (full: new clients are forwarded by their Maglev pick unrecorded). */
  maxMappings?: number;
  /**
   * How long a target-set change waits for an LB node of the VIP that stopped answering (its membership
   * lapses; default MEMBER_TTL_MS of table-switch.ts).
   */
  changeWaitMs?: number;
  /** Where VIP traffic is handled (default pod): on the node's uplink as it arrives, or in the LB pods. */
  datapath?: LbDatapathMode;
  /** The node's uplink, where the node datapath attaches (default eth0). */
  uplink?: string;
  /** The cluster store's parts the load balancer uses (lb-store.ts). */
  store?: LbStore;
  addresses: ClusterAddresses;
  /** tetherd's state directory: the VIPs this node learned are kept there (vip-record.ts). */
  stateDir?: string;
  attach: AttachService;
  logger: Logger;
  /**
   * Told when a VIP a local LB pod selects becomes one this node cannot forward (an IPv6 VIP without
   * address6), and again only if why changes (Kubernetes Events); must not throw or wait.
   */
  onNotForwarded?: (n: NotForwardedVip & { node: string }) => void;
}

/** Why an IPv6 VIP its LB pods select is not forwarded by a node without an IPv6 address. */
export function noAddress6Problem(node: string, vip: string, pods: string[]): string {
  return `node ${node} has no IPv6 address (--node-address-6), which FoU to IPv6 targets leaves from: IPv6 VIP ${vip} is not programmed or announced there, ` +
    `though its LB pod${pods.length === 1 ? '' : 's'} ${pods.join(', ')} select${pods.length === 1 ? 's' : ''} the Service`;
}

/** One Service's VIP on this node. */
export interface VipState {
  key: string;
  pool: string;
  vip?: string;
  /** Why the Service has no VIP (allocation refused or not done yet). */
  problem?: string;
  /**
   * The VIP is not confirmed by the store: taken, while the store was unreachable, from where it was last
   * recorded (the Service's status, or this node's record); confirmed or given up once the store answers.
   */
  provisional?: 'Service status' | 'node record';
  /** The datapath slot, while a local LB pod serves the VIP (or did, within the release delay). */
  slot?: number;
  /** Why local LB pods do not serve the VIP (no slot left on this node). */
  slotProblem?: string;
  /** Why this node does not forward the VIP its local LB pods select (an IPv6 VIP, no IPv6 address here). */
  familyProblem?: string;
  targets?: string;
  /** Mappings loaded from the store (or the wait for them given up). */
  loaded: boolean;
  loadStarted?: number;
  announced: boolean;
}

export interface LbPod {
  pod: string;
  netns: string;
  ifName: string;
  hostIfName: string;
  ip: string;
  vips: Set<string>;
  acceptLocalBefore?: string;
}

export interface TargetPod {
  pod: string;
  /** Its pod record's key (the set-up is recorded there). */
  key: AttachmentKey;
  netns: string;
  ifName: string;
  ip: string;
  vips: Set<string>;
  decap?: FouDecap;
  /** What the DSR set-up changed (pod/dsr-target.ts), as in the pod record. */
  setup: DsrTarget;
}

export class LbShared {
  /** By Service key. */
  readonly vips = new Map<string, VipState>();
  readonly lbPods = new Map<string, LbPod>();
  readonly targets = new Map<string, TargetPod>();
  dp?: LbDatapath;
  /** Registered node addresses, IPv4 and IPv6 (targets accept FoU from these only). */
  nodes: string[] = [];
  /**
   * The pass's first store command (the registry beat) failed or the store is not connected: the rest of the
   * pass asks the store nothing it can do without (a hung or partitioned store would make each ask wait its
   * timeout, and a VIP taken over during the outage would wait for all of them).
   */
  storeAway = false;
  /** A node of a release before table versions is registered: every new pick is recorded (table-switch.ts). */
  earlierReleases = false;

  constructor(readonly o: LbControllerOptions) {}

  get logger(): Logger {
    return this.o.logger;
  }

  /** Route tables a VIP is routed in: main, and the export table when there is one. */
  tables(): number[] {
    return [254, ...(this.o.exportTable ? [this.o.exportTable] : [])];
  }

  /** VIP → Service key, for VIPs allocated. */
  vipKeys(): Map<string, string> {
    const m = new Map<string, string>();
    for (const st of this.vips.values()) if (st.vip) m.set(st.vip, st.key);
    return m;
  }
}

export function ownerOf(key: string): string {
  return `lb/${key}`;
}

export function groupByVip(all: LbMapping[]): Map<string, LbMapping[]> {
  const m = new Map<string, LbMapping[]>();
  for (const x of all) {
    const l = m.get(x.vip);
    if (l) l.push(x);
    else m.set(x.vip, [x]);
  }
  return m;
}

export function ignoreGone(fn: () => void): void {
  try {
    fn();
  } catch (e) {
    if (!isNetlinkError(e, 'EADDRNOTAVAIL', 'ENODEV', 'ENOENT', 'ESRCH')) throw e;
  }
}

/** CLOCK_MONOTONIC in ns, the clock of bpf_ktime_get_ns. */
export function nowNs(): bigint {
  return process.hrtime.bigint();
}

/** Targets new clients may be given on node: active ones, and with Local policy only the node's own. */
export function pickableTargets(lb: ResolvedLoadBalancer, node: string): ResolvedLoadBalancer['targets'] {
  return lb.targets.filter((t) => t.state === 'active' && (lb.externalTrafficPolicy !== 'Local' || t.node === node));
}
