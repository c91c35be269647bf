// The VIPs this node learned from the store, kept under the state directory (crash-safe, versioned): after a
// restart while the store is unreachable the node still knows the VIPs of the Services it serves or hosts
// targets of. Not authoritative: a VIP taken from here is confirmed with the store once it is back.
//
// Format (lb-vips.json), version 1: {"v":1,"vips":{"<key>":{"pool":"<pool>","vip":"<address>"}}}, the key
// a VIP's (lb-spec.ts familyKey): "<namespace>/<name>" for a Service's IPv4 VIP, "<namespace>/<name>#IPv6"
// for its IPv6 VIP. A reader takes a file without "v" as version 1 and ignores one of a later version
// (logged): it only loses a fallback, never a VIP the store holds. A release before takes IPv4 VIPs only
// and passes over an IPv6 entry (its key is no Service it serves either), so IPv6 entries need no new version.
import * as fs from 'node:fs';
import * as path from 'node:path';
import { ipFamily } from '../../lib/ip';
import { writeFileAtomic } from '../../lib/atomic-file';
import type { Logger } from '../../lib/log';

export const VIP_RECORD_FILE = 'lb-vips.json';
export const VIP_RECORD_VERSION = 1;

export interface RecordedVip {
  pool: string;
  vip: string;
}

export class VipRecord {
  private vips = new Map<string, RecordedVip>();
  private written = '';

  /** dir: the state directory; without one nothing is kept. */
  constructor(
    private readonly dir: string | undefined,
    private readonly logger: Logger,
  ) {
    if (dir) this.load(path.join(dir, VIP_RECORD_FILE));
  }

  private load(file: string): void {
    let text: string;
    try {
      text = fs.readFileSync(file, 'utf8');
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== 'ENOENT') this.logger.warn('lb: VIP record not readable; starting without it', { file, error: (e as Error).message });
      return;
    }
    try {
      const raw = JSON.parse(text) as { v?: unknown; vips?: unknown };
      const v = raw.v ?? 1;
      if (v !== VIP_RECORD_VERSION) {
        this.logger.warn('lb: VIP record of another version; ignored (rewritten when a VIP is learned)', { file, version: v, known: VIP_RECORD_VERSION });
        return;
      }
      const vips = raw.vips && typeof raw.vips === 'object' ? (raw.vips as Record<string, unknown>) : {};
      for (const [key, r] of Object.entries(vips)) {
        const x = r as Partial<RecordedVip> | null;
        if (x && typeof x.pool === 'string' && typeof x.vip === 'string' && ipFamily(x.vip) && !x.vip.includes('%')) this.vips.set(key, { pool: x.pool, vip: x.vip });
      }
      this.written = this.serialize();
    } catch (e) {
      this.logger.warn('lb: VIP record garbled; starting without it', { file, error: (e as Error).message });
    }
  }

  /** The VIP this node last learned for a Service, if it was from this pool. */
  get(key: string, pool: string): string | undefined {
    const r = this.vips.get(key);
    return r && r.pool === pool ? r.vip : undefined;
  }

  /** The store's VIPs for the Services this node holds now (the others are forgotten); written when it changed. */
  save(held: Map<string, RecordedVip>): void {
    this.vips = new Map(held);
    if (!this.dir) return;
    const text = this.serialize();
    if (text === this.written) return;
    try {
      writeFileAtomic(path.join(this.dir, VIP_RECORD_FILE), text);
      this.written = text;
    } catch (e) {
      // Only the fallback is lost; retried on the next change.
      this.logger.warn('lb: VIP record not written', { error: (e as Error).message });
    }
  }

  private serialize(): string {
    const vips = Object.fromEntries([...this.vips].sort(([a], [b]) => (a < b ? -1 : 1)));
    return `${JSON.stringify({ v: VIP_RECORD_VERSION, vips })}\n`;
  }
}
