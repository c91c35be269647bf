// The load balancer's parts of the cluster store, over one connection set (StoreConnection): the flow
// mappings, their notices, the VIPs' expirer leases and table versions, each owning its own keys. The node registry
// (common/node-registry.ts, the controller's) and the health reports (health/health-reports.ts) use the
// same connection.
import { StoreConnection, type ConnectionNames } from '../common/store-connection';
import { ExpirerLeases } from './expirer-lease';
import { MappingNotices } from './mapping-notices';
import { MappingStore } from './mapping-store';
import { TableVersions } from './table-versions';

/** What the load balancer's connection is called on the server and in log lines. */
const NAMES: ConnectionNames = {
  client: 'tether-lb',
  sub: 'tether-lb-sub',
  store: 'lb mapping store',
  atStart: 'forwarding goes on from local maps',
  clientRole: 'lb mappings',
  subRole: 'lb mapping notices',
};

export interface LbStore {
  /** Reachability, and 'ready' when connected again (callers write back what they hold and reload). */
  connection: StoreConnection;
  mappings: MappingStore;
  notices: MappingNotices;
  leases: ExpirerLeases;
  /** Each VIP's Maglev table version: LB nodes switch to a new target set together. */
  tables: TableVersions;
  /** Closes the connection set (every part's commands end with it). */
  close(): Promise<void>;
}

/** Connects (without waiting for Redis: a store that is down is reconnected in the background). */
export async function connectLbStore(url: string, opts: { keyPrefix?: string; timeoutMs?: number } = {}): Promise<LbStore> {
  const connection = await StoreConnection.connect(url, NAMES, opts);
  const notices = new MappingNotices(connection);
  return {
    connection,
    mappings: new MappingStore(connection, notices),
    notices,
    leases: new ExpirerLeases(connection),
    tables: new TableVersions(connection),
    close: () => connection.close(),
  };
}

/** Removes all of vip's mappings, its expirer lease and its unsent notices (the Service is gone). */
export async function dropVip(s: LbStore, vip: string): Promise<void> {
  await s.mappings.drop(vip);
  await s.leases.drop(vip);
  await s.tables.drop(vip);
  s.notices.forget(vip);
}
