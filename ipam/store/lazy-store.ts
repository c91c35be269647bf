// A ClusterStore that connects on first use and again after a failed connect, so tetherd starts (and
// serves pods from blocks it already owns) while the cluster store is still down.
import type { AddressOutcome, AddressRequest, AllocationGuard, ClusterStore, StoreGeneration } from '../types';

export class LazyStore implements ClusterStore {
  private inner?: ClusterStore;
  private connecting?: Promise<ClusterStore>;
  private closed = false;

  constructor(private readonly open: () => Promise<ClusterStore>) {}

  /** Tries to connect now (e.g. at start-up); failures are left for the next call to retry. */
  async warmUp(): Promise<boolean> {
    try {
      await this.get();
      return true;
    } catch {
      return false;
    }
  }

  /** Whether the store is connected now (read without a round trip): false before the first connect. */
  get connected(): boolean {
    return !this.closed && (this.inner as { connected?: boolean } | undefined)?.connected === true;
  }

  private get(): Promise<ClusterStore> {
    if (this.inner) return Promise.resolve(this.inner);
    this.connecting ??= this.open().then(
      (s) => {
        if (this.closed) void s.close();
        this.inner = s;
        return s;
      },
      (e) => {
        this.connecting = undefined;
        throw e;
      },
    );
    return this.connecting;
  }

  async claimBlock(pool: string, block: string, node: string): Promise<boolean> {
    return (await this.get()).claimBlock(pool, block, node);
  }
  async releaseBlock(pool: string, block: string, node: string): Promise<boolean> {
    return (await this.get()).releaseBlock(pool, block, node);
  }
  async listBlocks(pool: string): Promise<Map<string, string>> {
    return (await this.get()).listBlocks(pool);
  }
  async allocateAddresses(pool: string, owner: string, req: AddressRequest, guard?: AllocationGuard): Promise<AddressOutcome> {
    return (await this.get()).allocateAddresses(pool, owner, req, guard);
  }
  async releaseOwner(pool: string, owner: string): Promise<string[]> {
    return (await this.get()).releaseOwner(pool, owner);
  }
  async listAddresses(pool: string): Promise<Map<string, string>> {
    return (await this.get()).listAddresses(pool);
  }
  async generation(opts?: { markRestarted?: string }): Promise<StoreGeneration> {
    return (await this.get()).generation(opts);
  }
  async generationToken(): Promise<string | undefined> {
    const inner = await this.get();
    return inner.generationToken ? inner.generationToken() : (await inner.generation()).token;
  }
  async close(): Promise<void> {
    this.closed = true;
    await this.inner?.close();
  }
}
