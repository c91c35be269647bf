// Conntrack (ctnetlink) for Tether: the table of one namespace (ConntrackHandle) and its events.
export * from './types';
export { ConntrackHandle, type DumpFilter, type InsertOptions, type InsertManyResult, type TableOp, type ApplyResult } from './handle';
export { ConntrackEvents, type ConntrackEventsOptions } from './events';
export { formatTuple, natOf } from './codec';
