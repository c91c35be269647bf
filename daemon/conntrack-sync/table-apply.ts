// What a candidate does with a received sync stream: writes it into a gateway namespace's conntrack
// table, in ctnetlink batches, without holding the event loop for long (a stalled loop delays BFD and
// the sync channels' own heartbeats). Shared by the egress controller and the sync benchmark.
import { setImmediate as nextTurn } from 'node:timers/promises';
import { ConntrackHandle, type ApplyResult, type TableOp } from '../conntrack/handle';
import type { ConntrackEntry, ConntrackEvent } from '../conntrack/types';

/** Ops per slice between two turns of the event loop (~10–20 ms of kernel work). */
export const SLICE_OPS = 2048;

function merge(into: ApplyResult, r: ApplyResult): void {
  into.created += r.created;
  into.updated += r.updated;
  into.deleted += r.deleted;
  for (const f of r.failed) into.failed.push(f);
}

/** Applies ops in order, a slice per event-loop turn. */
export async function applyInSlices(h: ConntrackHandle, ops: readonly TableOp[], sliceOps = SLICE_OPS): Promise<ApplyResult> {
  const res: ApplyResult = { created: 0, updated: 0, deleted: 0, failed: [] };
  for (let i = 0; i < ops.length; i += sliceOps) {
    if (i > 0) await nextTurn();
    merge(res, h.applyOps(ops.slice(i, i + sliceOps)));
  }
  return res;
}

/** Applies one frame's events (new/update upserted, destroy deleted) to the table at nsPath. */
export async function applySyncedEvents(nsPath: string, events: readonly ConntrackEvent[]): Promise<ApplyResult> {
  const h = ConntrackHandle.open(nsPath);
  try {
    return await applyInSlices(h, events.map((ev) => ({ kind: ev.type === 'destroy' ? 'delete' : ev.type === 'new' ? 'create' : 'update', entry: ev.entry })));
  } finally {
    h.close();
  }
}

/** Makes the entries in scope at nsPath equal to `entries` (a full resync): one dump, then batches. */
export async function replaceSyncedEntries(nsPath: string, entries: readonly ConntrackEntry[], inScope: (e: ConntrackEntry) => boolean): Promise<ApplyResult> {
  const h = ConntrackHandle.open(nsPath);
  try {
    const ops = h.planReconcile(entries, inScope);
    await nextTurn();
    return await applyInSlices(h, ops);
  } finally {
    h.close();
  }
}
