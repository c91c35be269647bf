// Egress objects of a configuration → the Egresses the controller serves. Each object is resolved against
// the configuration's pools on its own: one that fails (an unknown pool, an address outside its pool) is
// logged with every reason and keeps its last good version, if it had one; the others go ahead.
import type { Logger } from '../../lib/log';
import type { ConfigObjects } from '../config/objects';
import { objectKey } from '../config/objects';
import { validateEgress, type ResolvedEgress } from './egress-spec';

export class EgressObjects {
  private readonly last = new Map<string, ResolvedEgress>();
  private readonly rejected = new Map<string, string>();

  constructor(private readonly logger: Logger) {}

  resolve(config: ConfigObjects): ResolvedEgress[] {
    const out: ResolvedEgress[] = [];
    const seen = new Set<string>();
    for (const obj of config.others.filter((o) => o.kind === 'Egress')) {
      const key = objectKey(obj);
      seen.add(key);
      try {
        const e = validateEgress(obj, { pools: config.pools });
        this.last.set(key, e);
        if (this.rejected.delete(key)) this.logger.info('egress: Egress accepted again', { egress: e.key });
        out.push(e);
      } catch (err) {
        const why = (err as Error).message;
        const kept = this.last.get(key);
        if (this.rejected.get(key) !== why) {
          this.logger.error('egress: Egress rejected', { object: key, problems: why.split('\n'), keeps: kept ? 'its last accepted version' : 'nothing (never accepted)' });
        }
        this.rejected.set(key, why);
        if (kept) out.push(kept);
      }
    }
    for (const key of [...this.last.keys()]) if (!seen.has(key)) this.last.delete(key);
    for (const key of [...this.rejected.keys()]) if (!seen.has(key)) this.rejected.delete(key);
    return out;
  }

  /** Egresses rejected now, with the reason (for status). */
  problems(): Record<string, string> {
    return Object.fromEntries(this.rejected);
  }
}
