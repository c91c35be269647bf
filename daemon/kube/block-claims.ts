// Address-block claims in a cluster: one AddressBlock custom resource per claimed block, so etcd, not Redis,
// is the durable record of which node owns which block. A create is a claim; 409 AlreadyExists means the
// block is claimed already (ours if its spec names this node, another node won otherwise). A release
// deletes the claim only if it is still ours (uid precondition). Cluster-wide addresses (floating and
// loadBalancer pools) and the store generation stay in the inner store (Redis): state that can be rebuilt.
import * as k8s from '@kubernetes/client-node';
import { ErrorCode, TetherError } from '../../lib/errors';
import { GROUP, VERSION } from '../objects/crds';
import type { AddressOutcome, AddressRequest, AllocationGuard, ClusterStore, StoreGeneration } from '../../ipam/types';

const PLURAL = 'addressblocks';
export const POOL_LABEL = 'tether.dev/pool';
export const NODE_LABEL = 'tether.dev/node';

/** The claim's object name: pool and block, e.g. "default-10-244-0-64-26" (a DNS-1123 subdomain). */
export function claimName(pool: string, block: string): string {
  return `${pool}-${block.toLowerCase().replace(/[.:/]/g, '-')}`;
}

type Obj = { metadata?: { name?: string; uid?: string; labels?: Record<string, string> }; spec?: { pool?: string; cidr?: string; node?: string } };

function statusOf(e: unknown): number | undefined {
  const x = e as { code?: number; statusCode?: number };
  return x.code ?? x.statusCode;
}

function unreachable(what: string, e: unknown): TetherError {
  return new TetherError(ErrorCode.TryAgainLater, `kubernetes API: ${what}: ${(e as Error).message ?? e}`, { cause: e });
}

export class KubeBlockClaims implements ClusterStore {
  private readonly api: k8s.CustomObjectsApi;

  constructor(
    kc: k8s.KubeConfig,
    private readonly inner: ClusterStore | undefined,
  ) {
    this.api = kc.makeApiClient(k8s.CustomObjectsApi);
  }

  private async get(name: string): Promise<Obj | undefined> {
    try {
      return (await this.api.getClusterCustomObject({ group: GROUP, version: VERSION, plural: PLURAL, name })) as Obj;
    } catch (e) {
      if (statusOf(e) === 404) return undefined;
      throw unreachable(`reading block claim ${name}`, e);
    }
  }

  async claimBlock(pool: string, block: string, node: string): Promise<boolean> {
    const name = claimName(pool, block);
    const body = {
      apiVersion: `${GROUP}/${VERSION}`,
      kind: 'AddressBlock',
      metadata: { name, labels: { [POOL_LABEL]: pool, [NODE_LABEL]: node } },
      spec: { pool, cidr: block, node },
    };
    try {
      await this.api.createClusterCustomObject({ group: GROUP, version: VERSION, plural: PLURAL, body });
      return true;
    } catch (e) {
      if (statusOf(e) !== 409) throw unreachable(`claiming block ${block} of pool ${pool}`, e);
    }
    // Already claimed: by this node (idempotent) or by another (it won).
    const cur = await this.get(name);
    return cur?.spec?.node === node;
  }

  async releaseBlock(pool: string, block: string, node: string): Promise<boolean> {
    const name = claimName(pool, block);
    const cur = await this.get(name);
    if (!cur || cur.spec?.node !== node) return false;
    try {
      await this.api.deleteClusterCustomObject({ group: GROUP, version: VERSION, plural: PLURAL, name, body: { preconditions: { uid: cur.metadata?.uid } } });
      return true;
    } catch (e) {
      if (statusOf(e) === 404 || statusOf(e) === 409) return false;
      throw unreachable(`releasing block ${block} of pool ${pool}`, e);
    }
  }

  async listBlocks(pool: string): Promise<Map<string, string>> {
    let list: { items?: Obj[] };
    try {
      list = (await this.api.listClusterCustomObject({ group: GROUP, version: VERSION, plural: PLURAL, labelSelector: `${POOL_LABEL}=${pool}` })) as { items?: Obj[] };
    } catch (e) {
      throw unreachable(`listing block claims of pool ${pool}`, e);
    }
    const out = new Map<string, string>();
    for (const o of list.items ?? []) if (o.spec?.pool === pool && o.spec.cidr && o.spec.node) out.set(o.spec.cidr, o.spec.node);
    return out;
  }

  private need(): ClusterStore {
    if (!this.inner) throw new TetherError(ErrorCode.TryAgainLater, 'floating and loadBalancer addresses need the cluster store: start tetherd with --redis');
    return this.inner;
  }

  allocateAddresses(pool: string, owner: string, req: AddressRequest, guard?: AllocationGuard): Promise<AddressOutcome> {
    return this.need().allocateAddresses(pool, owner, req, guard);
  }

  releaseOwner(pool: string, owner: string): Promise<string[]> {
    return this.need().releaseOwner(pool, owner);
  }

  listAddresses(pool: string): Promise<Map<string, string>> {
    return this.need().listAddresses(pool);
  }

  /**
   * Blocks live in etcd: a Redis that restarted empty lost no claim, so the generation is constant and as
   * old as can be (the pod allocator never holds block claims off for it). Cluster-wide addresses stay in
   * Redis: ClusterAddresses asks the Redis store's own generation.
   */
  async generation(): Promise<StoreGeneration> {
    return { token: 'kubernetes', ageMs: Number.MAX_SAFE_INTEGER, restarted: false };
  }

  async close(): Promise<void> {
    await this.inner?.close();
  }
}
