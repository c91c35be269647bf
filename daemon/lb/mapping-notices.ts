// New mappings' notices: each VIP's new mappings are published on the VIP's own channel ({<vip>} tagged;
// SPUBLISH on a Cluster, PUBLISH elsewhere), and only nodes serving the VIP subscribe to it. A notice that
// could not be published (on a Cluster the channel's primary may be down while the buckets' are up) is kept
// and sent before the VIP's next claim, so the serving nodes never lose it for good.
import type Redis from 'ioredis';
import { EventEmitter } from 'node:events';
import { ipFamily } from '../../lib/ip';
import { log } from '../../lib/log';
import type { StoreConnection } from '../common/store-connection';
import { keyOf, sameFamily, type StoredMapping } from './mapping-fields';

/** Channels per (un)subscribe command on one server. */
const PART = 500;
/** Mappings per notice message (a pass's new mappings go in one; a backlog after an outage in several). */
const NOTICE_PART = 2000;

export class MappingNotices extends EventEmitter {
  /** Notice channels wanted (the VIPs this node serves) and the ones subscribed now. */
  private wanted = new Set<string>();
  private readonly subscribed = new Set<string>();
  private syncing?: Promise<void>;
  /** New mappings recorded whose notice could not be published: VIP → field → target. */
  private readonly unsent = new Map<string, Map<string, string>>();
  private readonly prefix: string;

  /**
   * Events: 'mapping' (a StoredMapping another LB pod recorded), 'resubscribed' (a Cluster's notice
   * subscriptions were made again: notices may have been missed, callers read back what changed), 'garbled'
   * (a notice that is not a mapping; logged and ignored).
   */
  constructor(private readonly conn: StoreConnection) {
    super();
    this.prefix = conn.prefix;
    const sub: Redis = conn.sub;
    sub.on('smessage', (_ch: string, msg: string) => this.onNotice(msg));
    sub.on('ready', () => void this.syncSubscriptions());
    // A Cluster's sharded subscribers were set up again (a shard's primary failed over, slots moved):
    // notices published meanwhile never arrived here, so callers read back what changed.
    sub.on('subscribersReady', () => this.emit('resubscribed'));
    // ioredis resubscribes what it had after a reconnect; a connection that ended for good starts empty.
    sub.on('end', () => this.subscribed.clear());
    sub.on('message', (_ch: string, msg: string) => this.onNotice(msg));
  }

  /** The VIP's own notice channel, in the VIP's slot. */
  channel(vip: string): string {
    return `${this.prefix}lb:{${vip}}:notices`;
  }

  /**
   * The VIPs whose new mappings this node wants (those it serves): their channels are subscribed, the
   * others' left. Idempotent; with the store away it takes effect on the next connection.
   */
  async serve(vips: Iterable<string>): Promise<void> {
    this.wanted = new Set([...vips].map((v) => this.channel(v)));
    await this.syncSubscriptions();
  }

  /** Channels this node is subscribed to now (status and tests). */
  subscriptions(): string[] {
    return [...this.subscribed].sort();
  }

  /** Whether this node receives vip's new mappings now. */
  hears(vip: string): boolean {
    return this.subscribed.has(this.channel(vip));
  }

  private async syncSubscriptions(): Promise<void> {
    while (this.syncing) await this.syncing;
    const sub = this.conn.sub;
    if (this.conn.closed || sub.status !== 'ready') return;
    const add = [...this.wanted].filter((c) => !this.subscribed.has(c));
    const del = [...this.subscribed].filter((c) => !this.wanted.has(c));
    if (!add.length && !del.length) return;
    const sharded = this.conn.sharded;
    this.syncing = (async () => {
      try {
        // A Cluster takes one sharded channel per command (channels of one command share a slot).
        const parts = (l: string[]) => (sharded ? l.map((c) => [c]) : Array.from({ length: Math.ceil(l.length / PART) }, (_, i) => l.slice(i * PART, (i + 1) * PART)));
        for (const p of parts(add)) {
          await (sharded ? sub.ssubscribe(...p) : sub.subscribe(...p));
          for (const c of p) this.subscribed.add(c);
        }
        for (const p of parts(del)) {
          await (sharded ? sub.sunsubscribe(...p) : sub.unsubscribe(...p));
          for (const c of p) this.subscribed.delete(c);
        }
      } catch (e) {
        log().warn('lb mapping store: (un)subscribing notice channels failed; retried on the next change or connection', { error: (e as Error).message });
      } finally {
        this.syncing = undefined;
      }
    })();
    await this.syncing;
  }

  /** A notice: {"vip": …, "mappings": [[field, target], …]}, the VIP and targets of one family. Bad ones are named and ignored. */
  private onNotice(msg: string): void {
    let n: { vip?: unknown; mappings?: unknown };
    try {
      n = JSON.parse(msg) as typeof n;
    } catch {
      n = {};
    }
    const vip = typeof n.vip === 'string' && ipFamily(n.vip) && !n.vip.includes('%') ? n.vip : undefined;
    const list = Array.isArray(n.mappings) ? n.mappings : undefined;
    if (!vip || !list) {
      this.garbled(msg);
      return;
    }
    for (const e of list) {
      const key = Array.isArray(e) && typeof e[0] === 'string' ? keyOf(vip, e[0]) : undefined;
      const target = Array.isArray(e) ? e[1] : undefined;
      // A target of the VIP's family only (an IPv6 VIP's mappings are to IPv6 targets).
      if (!key || !sameFamily(target, vip)) this.garbled(JSON.stringify(e));
      else this.emit('mapping', { key, target } satisfies StoredMapping);
    }
  }

  private garbled(msg: string): void {
    log().warn('lb mapping store: garbled mapping notice ignored', { notice: msg.slice(0, 200) });
    this.emit('garbled', msg);
  }

  private async publish(vip: string, mappings: Array<[string, string]>): Promise<void> {
    const msg = JSON.stringify({ vip, mappings });
    const ch = this.channel(vip);
    const client = this.conn.client;
    await (this.conn.sharded ? client.spublish(ch, msg) : client.publish(ch, msg));
  }

  /**
   * Publishes vip's new mappings (field, target), NOTICE_PART per message: a node hears a pass's new
   * mappings in one message, not one per bucket. What cannot go is kept for sendUnsent(); returns that
   * failure (undefined when all went).
   */
  async announce(vip: string, fresh: Array<[string, string]>): Promise<unknown> {
    for (let i = 0; i < fresh.length; i += NOTICE_PART) {
      try {
        await this.publish(vip, fresh.slice(i, i + NOTICE_PART));
      } catch (e) {
        const q = this.unsent.get(vip) ?? new Map<string, string>();
        for (const [f, t] of fresh.slice(i)) q.set(f, t);
        this.unsent.set(vip, q);
        return e ?? new Error('publish failed');
      }
    }
    return undefined;
  }

  /** Publishes the notices of vip that a failed publish left behind, in parts; kept when it fails again. */
  async sendUnsent(vip: string): Promise<void> {
    const q = this.unsent.get(vip);
    if (!q) return;
    const all = [...q];
    for (let i = 0; i < all.length; i += NOTICE_PART) {
      const part = all.slice(i, i + NOTICE_PART);
      await this.publish(vip, part);
      for (const [f, t] of part) if (q.get(f) === t) q.delete(f);
    }
    if (!q.size) this.unsent.delete(vip);
    log().info('lb mapping store: notices that failed to publish sent again', { vip, mappings: all.length });
  }

  /** Forgets vip's unsent notices (its mappings are gone from the store). */
  forget(vip: string): void {
    this.unsent.delete(vip);
  }
}
