// The IPAM vocabulary shared by tetherd's allocator, the cluster stores and the tether-ipam client.
// AddressPool has exactly the shape of the custom resource (apiVersion/kind/metadata/spec), so file
// objects and Kubernetes objects load through one validator.

export type PoolUsage = 'pod' | 'floating' | 'loadBalancer';
export type { IpFamily } from '../lib/ip';
import type { IpFamily } from '../lib/ip';

export interface PoolFamilySpec {
  /** The pool's subnet, a network address with prefix, e.g. "10.244.0.0/16" or "fd00:10:244::/56". */
  cidr: string;
  /** Prefix length of the blocks nodes claim (pod pools only), e.g. 26 for /26 blocks. */
  blockSize?: number;
}

export interface AddressPool {
  apiVersion: 'tether.dev/v1alpha1';
  kind: 'AddressPool';
  metadata: { name: string };
  spec: {
    ipv4?: PoolFamilySpec;
    ipv6?: PoolFamilySpec;
    usage: PoolUsage;
    /** Only nodes whose labels match all of these may use the pool. */
    nodeSelector?: Record<string, string>;
    /** Shorthand for nodeSelector {"topology.kubernetes.io/zone": zone}. */
    zone?: string;
    /** Addresses or CIDRs inside the pool that are never handed out. */
    reserved?: string[];
  };
}

/** A pool after validation: parsed numbers ready for allocation. */
export interface ResolvedPool {
  name: string;
  usage: PoolUsage;
  families: ResolvedFamily[];
  nodeSelector: Record<string, string>;
  source: AddressPool;
}

export interface ResolvedFamily {
  family: IpFamily;
  cidr: string;
  /** First address of the subnet and its prefix length. */
  base: bigint;
  prefix: number;
  /** Prefix length of node blocks (pod pools); equals `prefix` for cluster-wide pools. */
  blockSize: number;
  /** Reserved ranges as [first, last] inclusive. */
  reserved: Array<[bigint, bigint]>;
}

/** Who holds an address: a pod attachment (pod pools) or an owner string like "egress/ns/name#2". */
export interface PodOwner {
  containerId: string;
  ifName: string;
  network: string;
  netns?: string;
  podNamespace?: string;
  podName?: string;
}

/**
 * The cluster-wide store of block claims and cluster-wide (floating / LB) addresses.
 * Redis in standalone mode; a Kubernetes custom-resource store slots in behind the same interface.
 * Every method is atomic on its own; "idempotent" is noted where repeating a call changes nothing.
 */
export interface ClusterStore {
  /** Claims `block` of `pool` for `node`; true when the node owns it afterwards. Idempotent. */
  claimBlock(pool: string, block: string, node: string): Promise<boolean>;
  /** Releases `block` only when `node` owns it; true when it was released. Idempotent. */
  releaseBlock(pool: string, block: string, node: string): Promise<boolean>;
  /** Every claimed block of `pool`: block CIDR → node name. */
  listBlocks(pool: string): Promise<Map<string, string>>;

  /**
   * Gives `owner` addresses of a cluster-wide pool, atomically. Idempotent: an owner that already holds
   * addresses gets exactly those back (explicit: each requested one must be free or already the owner's).
   * `candidates` are addresses the caller believes free, tried in order; `count` is how many the owner
   * should hold in total. With `guard.generation`, nothing is written unless the store's generation is
   * still that token (else `staleGeneration`); with `guard.holdOff`, nothing new is handed out (else
   * `holdOff`), while an owner asking for what it already holds is answered as usual.
   */
  allocateAddresses(pool: string, owner: string, req: AddressRequest, guard?: AllocationGuard): Promise<AddressOutcome>;
  /** Frees every address of `owner` in `pool`; returns them. Idempotent. */
  releaseOwner(pool: string, owner: string): Promise<string[]>;
  /** Every allocated cluster-wide address of `pool`: address → owner. */
  listAddresses(pool: string): Promise<Map<string, string>>;

  /**
   * The store's generation: a random token created the first time anyone asks and kept for the store's
   * life, and how long ago that was by the store's own clock. A different token than last time means the
   * store lost its data (restarted empty), so nodes must re-assert what they own before anyone claims
   * anything new; the age tells even a node that never saw the previous generation that holders may still
   * be re-asserting.
   */
  generation(opts?: { markRestarted?: string }): Promise<StoreGeneration>;

  /**
   * The generation token alone, read with one plain command (undefined: none yet): what a holder that
   * polls for a wipe asks first; generation() only when it differs from the one it saw. Optional: a store
   * without it is asked generation() every time.
   */
  generationToken?(): Promise<string | undefined>;

  close(): Promise<void>;
}

export type AddressRequest = { count: number; candidates: string[] } | { explicit: string[] };

export interface StoreGeneration {
  token: string;
  /** Milliseconds since the token was created (0 for a generation created by this call, or read from an older schema). */
  ageMs: number;
  /**
   * A node that saw an older token said this one replaced it (markRestarted): the store lost data nodes
   * hold, and new cluster-wide addresses wait for the hold-off. A generation nobody marked is a new store
   * (a fresh install), whose first allocations need not wait.
   */
  restarted: boolean;
}

export interface AllocationGuard {
  /** Write only while the store's generation is this token. */
  generation?: string;
  /** Hand out no address the owner does not hold already. */
  holdOff?: boolean;
}

export type AddressOutcome =
  /** The owner's addresses (all of them, in allocation order). */
  | { ok: true; addresses: string[] }
  /** An explicit address is held by someone else. Nothing was claimed. */
  | { ok: false; conflict: { address: string; holder: string } }
  /** Not enough of the candidates were free (others raced); nothing was claimed; ask again with fresh ones. */
  | { ok: false; needCandidates: true; have: string[] }
  /** The guard's hold-off: the owner would get new addresses. Nothing was claimed. */
  | { ok: false; holdOff: true; have: string[] }
  /** The store's generation is not the guard's (it lost its data meanwhile). Nothing was claimed. */
  | { ok: false; staleGeneration: true };
