// Events waiting to be sent, coalesced per entry key (latest wins) so a burst on a few flows costs one
// slot each rather than one per event, and a flow that came and went before it was sent costs nothing.
import { entryKey } from '../conntrack/types';
import { isEncoded, withType, type SyncEvent } from './entry-codec';

interface Slot {
  /** The peer may hold an older entry under this key that must go before `ev` is inserted. */
  destroyFirst: boolean;
  ev: SyncEvent;
  /** When the first event folded into this slot was queued (for lag). */
  since: number;
}

export class CoalescingQueue {
  private slots = new Map<string, Slot>();
  private events = 0;
  /** Events folded into an existing slot or cancelled since creation. */
  coalesced = 0;

  /** Events that would be sent now (a destroy-then-new slot counts two). */
  get size(): number {
    return this.events;
  }

  push(ev: SyncEvent, now: number): void {
    const key = isEncoded(ev) ? ev.key : entryKey(ev.entry);
    const s = this.slots.get(key);
    if (!s) {
      this.slots.set(key, { destroyFirst: false, ev, since: now });
      this.events++;
      return;
    }
    this.coalesced++;
    const prev = s.ev.type;
    if (ev.type === 'destroy') {
      if (prev === 'new' && !s.destroyFirst) {
        // Created and gone before the peer heard of it.
        this.slots.delete(key);
        this.events--;
      } else if (prev === 'new') {
        // destroy, new, destroy: the peer only needs the first destroy.
        s.destroyFirst = false;
        s.ev = ev;
        this.events--;
      } else {
        s.ev = ev;
      }
      return;
    }
    if (prev === 'destroy') {
      // The peer's entry under this key is an older flow (reused tuple): remove it, then insert anew.
      s.destroyFirst = true;
      s.ev = withType(ev, 'new');
      this.events++;
    } else {
      // new+update stays new (the peer never had it); update+update or update+new is the latest entry.
      s.ev = withType(ev, prev === 'new' ? 'new' : ev.type);
    }
  }

  /** Removes and returns up to about `max` events, oldest key first, and the oldest `since` among them. */
  take(max: number): { events: SyncEvent[]; since: number } {
    const out: SyncEvent[] = [];
    let since = Infinity;
    for (const [key, s] of this.slots) {
      if (out.length >= max) break;
      if (s.destroyFirst) out.push(withType(s.ev, 'destroy'));
      out.push(s.ev);
      if (s.since < since) since = s.since;
      this.slots.delete(key);
    }
    this.events -= out.length;
    return { events: out, since };
  }

  clear(): void {
    this.slots.clear();
    this.events = 0;
  }
}
