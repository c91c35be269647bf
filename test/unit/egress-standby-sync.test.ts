// A standby that cannot sync with its address's owner says so: in the address's status, a metric by
// reason, /readyz and an Event per transition. Node n2's real StandbySync and SyncReceiver (real TCP),
// fed by a real owner-side sender from n1: one that shares no protocol version, this release's, and the
// previous release's (ccd851b, vendored); the rest of the controller is recording stand-ins.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { Writable } from 'node:stream';
import { makeLogger, setLogger } from '../../lib/log';
import type { StandbySyncChange } from '../../daemon/egress/egress-state';
import { egressParts, type EgressParts } from '../../daemon/egress/egress-controller';
import { addressSlots } from '../../daemon/egress/egress-spec';
import type { GatewayInfo, OwnershipStore } from '../../daemon/egress/ownership-store';
import type { GatewayDatapath } from '../../daemon/egress/gateway-datapath';
import { STANDBY_SYNC_BOUND_MS } from '../../daemon/egress/standby-sync';
import { SyncReceiver, SyncSender, MAX_PROTOCOL_VERSION } from '../../daemon/conntrack-sync';
import { previousModule } from '../lib/releases';
import { readyAnswer } from '../../daemon/health/probe-server';
import { standbySyncEvent } from '../../daemon/kube/tether-events';
import { TetherMetrics, type EgressAddressView } from '../../daemon/metrics/tether-metrics';
import type { ClusterAddresses } from '../../ipam/cluster-addresses';
import type { AttachService } from '../../daemon/pod/attach-service';
import { KEY, entry, waitFor } from './conntrack-sync-fixtures';
import { ADDRESS, EGRESS } from './egress-fixtures';

const quiet = makeLogger({ level: 'error', stream: new Writable({ write: (_c, _e, cb) => cb() }) });
const STREAM = `${EGRESS.key}|${ADDRESS}`;
const gwA: GatewayInfo = { pod: 'shop/gw-a', node: 'n1', nodeAddress: '127.0.0.1', podIp: '10.244.1.5' };
const gwB: GatewayInfo = { pod: 'shop/gw-b', node: 'n2', nodeAddress: '10.1.0.2', podIp: '10.244.2.5' };

/** Node n2: gateway gw-b a standby of ADDRESS, owned (epoch 2) by gw-a on n1, live; its receiver listening. */
async function standbyNode(): Promise<{ s: EgressParts['s']; standby: EgressParts['standby']; changes: StandbySyncChange[]; port: number; close: () => Promise<void> }> {
  const changes: StandbySyncChange[] = [];
  const ownership = { record: async () => 'recorded', get: async () => undefined, on: () => undefined } as unknown as OwnershipStore;
  const { s, standby } = egressParts({
    node: { name: 'n2', address: gwB.nodeAddress, uplink: 'eth0' }, pinDir: '/nonexistent', fouPort: 0, syncPort: 0, clusterKey: KEY,
    egresses: [EGRESS], ownership, addresses: {} as ClusterAddresses, attach: {} as AttachService, logger: quiet, onStandbySyncChanged: (c) => changes.push(c),
  });
  s.gateways.set(gwB.pod, { info: gwB, datapath: {} as GatewayDatapath, egresses: new Set([EGRESS.key]), guarded: '', netns: '/nonexistent' });
  s.registry.set(EGRESS.key, [gwA, gwB]);
  const st = s.track(EGRESS, ADDRESS, addressSlots(EGRESS)[0], { egress: EGRESS.key, address: ADDRESS, owner: gwA.pod, epoch: 2, ownerNode: 'n1', ownerNodeAddress: gwA.nodeAddress, ownerPodIp: gwA.podIp });
  st.candidates = [gwA, gwB];
  const rx = new SyncReceiver({ key: KEY, id: 'n2', host: '127.0.0.1', port: 0, apply: () => undefined, upsert: () => undefined, sweep: () => 0, digests: () => undefined });
  s.receiver = rx;
  const port = await rx.listen();
  return { s, standby, changes, port, close: () => rx.close() };
}

type Standby = Pick<EgressParts, 's' | 'standby'>;
const statusOf = (n: Standby) => n.standby.statusOf([...n.s.addresses.values()][0]);
const snapshotOf = (n: Standby): EgressAddressView[] => [...n.s.addresses.values()].map((st) => ({
  egress: st.egress.key, address: st.address, epoch: st.own.epoch, ownedHere: false, flows: 0, packets: 0, bytes: 0, inSync: [], standbySync: n.standby.statusOf(st),
}));
async function gauge(n: Standby): Promise<Record<string, number>> {
  const m = new TetherMetrics(quiet);
  m.use({ egress: () => snapshotOf(n) });
  const text = await m.scrape();
  const out: Record<string, number> = {};
  for (const line of text.split('\n')) {
    const g = /^tether_egress_standby_sync_problem_addresses\{reason="(\w+)"\} (\d+)$/.exec(line);
    if (g) out[g[1]] = Number(g[2]);
  }
  return out;
}

// The previous release's sync sender (release/previous, from this repository's history), typed as this release's.
const { SyncSender: OldSender } = previousModule<typeof import('../../daemon/conntrack-sync/sender')>('daemon/conntrack-sync/sender');
const oldLog = previousModule<typeof import('../../lib/log')>('daemon/log');
oldLog.setLogger(oldLog.makeLogger({ level: 'error' }));

test.before(() => setLogger(quiet));

test('an owner that shares no protocol version: status, metric (version), /readyz 503 naming it and one Event, at once; then in sync: one Event back, ready', async () => {
  const n = await standbyNode();
  const snap = () => [{ ...entry(1) }];
  const bad = new SyncSender({ key: KEY, id: 'n1', host: '127.0.0.1', port: n.port, stream: STREAM, epoch: 2, snapshot: snap, backoffMinMs: 20, backoffMaxMs: 50, versions: { min: MAX_PROTOCOL_VERSION + 1, max: MAX_PROTOCOL_VERSION + 1 } });
  let good: SyncSender | undefined;
  try {
    n.standby.update();
    assert.is(statusOf(n)?.reason, 'unreachable', 'no stream yet');
    assert.is(statusOf(n)?.reported, false, 'not reported within the bound');
    assert.equal(n.standby.readinessProblems(), []);
    bad.start();
    await waitFor(() => (n.s.receiver!.stats().rejected.version ?? 0) >= 1, 'the owner\'s connection refused for its version');
    for (let i = 0; i < 5; i++) n.standby.update();
    const st = statusOf(n)!;
    assert.is(st.inSync, false);
    assert.is(st.reason, 'version');
    assert.is(st.reported, true, 'a refusal is reported at once');
    assert.is(st.ownerNode, 'n1');
    assert.match(st.message!, /speaks sync protocol versions 3, this node 2: none in common/);
    assert.equal(await gauge(n), { unreachable: 0, resyncing: 0, version: 1, auth: 0, stale: 0, protocol: 0 });
    const ready = readyAnswer({ started: () => true, roleProblems: () => [], egressSync: () => n.standby.readinessProblems() });
    assert.is(ready.status, 503);
    assert.match(ready.body, /egress shop\/out address 198\.51\.100\.7: this standby cannot sync with its owner shop\/gw-a on n1 for \d+ s: version: /);
    assert.is(n.changes.length, 1, `one change per transition, not per pass: ${JSON.stringify(n.changes)}`);
    const ev = standbySyncEvent(n.changes[0]);
    assert.equal([ev.type, ev.reason, ev.regarding.kind, ev.regarding.namespace, ev.regarding.name], ['Warning', 'StandbyOutOfSync', 'Egress', 'shop', 'out']);
    for (const part of ['198.51.100.7', 'shop/gw-b on node n2', 'shop/gw-a on node n1', '(version)']) assert.ok(ev.note.includes(part), `note names ${part}: ${ev.note}`);
    // The owner gets a release that speaks this one's version: the transfer arrives, it is in sync.
    await bad.close();
    good = new SyncSender({ key: KEY, id: 'n1', host: '127.0.0.1', port: n.port, stream: STREAM, epoch: 2, snapshot: snap, backoffMinMs: 20, backoffMaxMs: 50 });
    good.start();
    await waitFor(() => n.s.receiver!.stats().resyncs >= 1, 'the transfer applied');
    n.standby.update();
    n.standby.update();
    assert.equal(statusOf(n), { inSync: true, ownerNode: 'n1' });
    assert.equal(await gauge(n), { unreachable: 0, resyncing: 0, version: 0, auth: 0, stale: 0, protocol: 0 });
    assert.is(readyAnswer({ started: () => true, roleProblems: () => [], egressSync: () => n.standby.readinessProblems() }).status, 200);
    assert.is(n.changes.length, 2);
    assert.is(n.changes[1].inSync, true);
    assert.is(standbySyncEvent(n.changes[1]).reason, 'StandbyInSync');
  } finally {
    await bad.close();
    await good?.close();
    await n.close();
  }
});

test('no stream from the owner: not ready only after the bound, then once; a standby of no live owner or the owner itself is no standby', async () => {
  const n = await standbyNode();
  try {
    const t0 = Date.now();
    n.standby.update(t0);
    n.standby.update(t0 + STANDBY_SYNC_BOUND_MS - 1);
    assert.is(n.changes.length, 0);
    assert.equal(await gauge(n), { unreachable: 1, resyncing: 0, version: 0, auth: 0, stale: 0, protocol: 0 }, 'the metric counts it at once');
    n.standby.update(t0 + STANDBY_SYNC_BOUND_MS);
    n.standby.update(t0 + STANDBY_SYNC_BOUND_MS + 1000);
    assert.is(n.changes.length, 1);
    assert.is(n.changes[0].reason, 'unreachable');
    assert.is(n.standby.readinessProblems().length, 1);
    // This node holds the address now (say it took it over): no standby of it, the problem is over.
    const st = [...n.s.addresses.values()][0];
    st.holder = n.s.gateways.get(gwB.pod);
    n.standby.update();
    assert.is(statusOf(n), undefined);
    assert.equal(n.standby.readinessProblems(), []);
    assert.is(n.changes.length, 2);
    assert.is(n.changes[1].inSync, true);
  } finally {
    await n.close();
  }
});

test('the previous release (ccd851b) as the owner: this standby is in sync with it', async () => {
  const n = await standbyNode();
  const old = new OldSender({ key: KEY, id: 'n1', host: '127.0.0.1', port: n.port, stream: STREAM, epoch: 2, snapshot: () => [entry(1), entry(2)], backoffMinMs: 20, backoffMaxMs: 50 });
  try {
    old.start();
    await waitFor(() => n.s.receiver!.stats().resyncs >= 1, 'the old owner\'s transfer applied');
    n.standby.update();
    assert.equal(statusOf(n), { inSync: true, ownerNode: 'n1' });
    assert.is(n.s.receiver!.stats().peers[0].version, 2);
    assert.is(n.changes.length, 0);
  } finally {
    await old.close();
    await n.close();
  }
});

test.run();
