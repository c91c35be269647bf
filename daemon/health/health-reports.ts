// Every node's health-check answers in the cluster store, for the Services' status: each node writes its
// own (hash <prefix>lb:health, node → {"report", "expiresAt"}), and the controllers' leader reads them all.
import { log } from '../../lib/log';
import type Redis from 'ioredis';
import type { StoreConnection } from '../common/store-connection';
import type { NodeHealthReport } from './health-controller';

export class HealthReports {
  private readonly client: Redis;
  private readonly key: string;

  constructor(conn: StoreConnection) {
    this.client = conn.client;
    const prefix = conn.prefix;
    this.key = `${prefix}lb:health`;
  }

  /** This node's health-check answers, counting for ttlMs. */
  async write(node: string, report: NodeHealthReport, ttlMs: number): Promise<void> {
    await this.client.hset(this.key, node, JSON.stringify({ report, expiresAt: Date.now() + ttlMs }));
  }

  /** Every node's latest health report that has not expired; expired and garbled entries are removed. */
  async read(nowMs = Date.now()): Promise<Record<string, NodeHealthReport>> {
    const key = this.key;
    const client = this.client;
    const out: Record<string, NodeHealthReport> = {};
    const stale: string[] = [];
    for (const [node, v] of Object.entries(await client.hgetall(key))) {
      let r: { report?: NodeHealthReport; expiresAt?: number } | undefined;
      try {
        r = JSON.parse(v) as typeof r;
      } catch {
        r = undefined;
      }
      if (!r || typeof r.expiresAt !== 'number' || typeof r.report?.services !== 'object' || r.report.services === null) {
        log().warn('lb mapping store: garbled health report removed', { node, report: v.slice(0, 200) });
        stale.push(node);
      } else if (r.expiresAt <= nowMs) stale.push(node);
      else out[node] = r.report;
    }
    if (stale.length) await client.hdel(key, ...stale);
    return out;
  }
}
