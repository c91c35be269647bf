// Each VIP's expirer lease in the cluster store (<prefix>lb:{<vip>}:expirer, SET NX PX): one node per VIP
// expires its idle mappings and drops a removed target's, however many nodes serve it; when that node
// goes, the lease lapses and the next node to ask takes over. The lease is taken and renewed on a full store
// too (RUNS_WHEN_FULL): expiring idle mappings is what frees it.
import type Redis from 'ioredis';
import type { StoreConnection } from '../common/store-connection';
import { RUNS_WHEN_FULL } from '../common/store-full';

// KEYS: the VIP's expirer lease. ARGV: holder, lease ms. Taken when free, renewed by its holder; 1 when
// the caller holds it now.
const LEASE = `
local cur = redis.call('GET', KEYS[1])
if cur == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if cur then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])
return 1
`;

interface Scripted extends Redis {
  tetherLbLease(key: string, holder: string, ms: string): Promise<number>;
}

export class ExpirerLeases {
  private readonly client: Scripted;
  private readonly prefix: string;

  constructor(conn: StoreConnection) {
    this.client = conn.client as Scripted;
    this.prefix = conn.prefix;
    this.client.defineCommand('tetherLbLease', { numberOfKeys: 1, lua: RUNS_WHEN_FULL + LEASE });
  }

  private key(vip: string): string {
    return `${this.prefix}lb:{${vip}}:expirer`;
  }

  /**
   * Takes or renews the VIP's expirer lease for holder (a node name); true when holder is the expirer. When
   * the holder goes, the lease lapses after leaseMs and the next node to ask takes over.
   */
  async take(vip: string, holder: string, leaseMs: number): Promise<boolean> {
    return (await this.client.tetherLbLease(this.key(vip), holder, String(Math.max(1, Math.round(leaseMs))))) === 1;
  }

  /** Removes the VIP's lease (the Service is gone). */
  async drop(vip: string): Promise<void> {
    await this.client.del(this.key(vip));
  }
}
