// Fake of daemon/conntrack (index, handle, events): empty conntrack tables that record what is applied,
// and event sources that never fire (the simulation has no flows through gateways).
import { EventEmitter } from 'node:events';
import type { ConntrackEntry } from '../../../../daemon/conntrack/types';
import { record } from './record';

export * from '../../../../daemon/conntrack/types';
export { formatTuple, natOf } from '../../../../daemon/conntrack/codec';

export interface DumpFilter {
  family?: 4 | 6;
  [k: string]: unknown;
}
export interface TableOp {
  kind: string;
  entry: ConntrackEntry;
  keepStatus?: number;
}
export interface ApplyResult {
  created: number;
  updated: number;
  deleted: number;
  failed: Array<{ op: TableOp; error: Error }>;
}
export interface InsertOptions {
  [k: string]: unknown;
}
export interface InsertManyResult {
  created: number;
  updated: number;
  failed: Array<{ entry: ConntrackEntry; error: Error }>;
}
export interface ConntrackEventsOptions {
  [k: string]: unknown;
}

export class ConntrackHandle {
  static open(): ConntrackHandle {
    record('conntrack.open');
    return new ConntrackHandle();
  }
  static with<T>(_ns: string | undefined, fn: (h: ConntrackHandle) => T): T {
    return fn(new ConntrackHandle());
  }
  close(): void {}
  dump(): ConntrackEntry[] {
    record('conntrack.dump');
    return [];
  }
  get(): undefined {
    return undefined;
  }
  insert(): 'created' {
    record('conntrack.insert');
    return 'created';
  }
  insertMany(entries: ConntrackEntry[]): InsertManyResult {
    record('conntrack.insert', entries.length);
    return { created: entries.length, updated: 0, failed: [] };
  }
  applyOps(ops: readonly TableOp[]): ApplyResult {
    record('conntrack.applyOps');
    return { created: ops.length, updated: 0, deleted: 0, failed: [] };
  }
  planReconcile(): TableOp[] {
    return [];
  }
  delete(): boolean {
    return false;
  }
  flush(): void {}
}

export class ConntrackEvents extends EventEmitter {
  static open(): ConntrackEvents {
    record('conntrack.eventsOpen');
    return new ConntrackEvents();
  }
  stats(): Record<string, number> {
    return {};
  }
  close(): Promise<void> {
    record('conntrack.eventsClose');
    return Promise.resolve();
  }
}
