// A holder that must let an address go (tetherd stopping, its gateway pod deleted) hands it only to a
// standby in sync with it: with none, it keeps the address and waits for one; one that comes in sync gets
// it; at the end of the wait, the best live candidate gets it anyway. The real Election and PodRoles among
// the controller's parts, whose kernel side, store and sync senders are recording stand-ins.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { Writable } from 'node:stream';
import { makeLogger } from '../../lib/log';
import { draining, isDraining, type AddressState } from '../../daemon/egress/egress-state';
import { egressParts, type EgressParts } from '../../daemon/egress/egress-controller';
import { addressSlots } from '../../daemon/egress/egress-spec';
import type { GatewayInfo, OwnershipStore } from '../../daemon/egress/ownership-store';
import type { GatewayDatapath } from '../../daemon/egress/gateway-datapath';
import type { SyncSender, SyncSenderStats } from '../../daemon/conntrack-sync';
import type { ClusterAddresses } from '../../ipam/cluster-addresses';
import type { AttachService } from '../../daemon/pod/attach-service';
import type { PodRecord } from '../../daemon/state/pod-store';
import { ADDRESS, EGRESS } from './egress-fixtures';

const lines: Array<Record<string, unknown>> = [];
const logger = makeLogger({ level: 'debug', stream: new Writable({ write: (c, _e, cb) => { for (const l of String(c).split('\n')) if (l.trim()) lines.push(JSON.parse(l)); cb(); } }) });

const gwA: GatewayInfo = { pod: 'shop/gw-a', node: 'n1', nodeAddress: '10.1.0.1', podIp: '10.244.1.5' };
const gwB: GatewayInfo = { pod: 'shop/gw-b', node: 'n2', nodeAddress: '10.1.0.2', podIp: '10.244.2.5' };
const gwC: GatewayInfo = { pod: 'shop/gw-c', node: 'n3', nodeAddress: '10.1.0.3', podIp: '10.244.3.5' };

/** A stand-in for the owner's sync stream to one standby node: its state is what the test sets. */
interface FakeSender {
  state: SyncSenderStats['state'];
}
function fakeSender(state: SyncSenderStats['state']): FakeSender {
  const s = {
    state,
    stats: () => ({ state: s.state, lagEntries: 0, version: 2, lastRejected: s.state === 'streaming' ? undefined : { reason: 'version', message: 'no version in common', at: 0 } }),
    close: async () => undefined,
  };
  return s;
}

interface Node extends EgressParts {
  st: AddressState;
  calls: string[];
  senders: Record<string, FakeSender>;
  netns: string;
}

/** Node n1 holding ADDRESS (epoch 4) on its gateway gw-a; gw-b (n2) and gw-c (n3) are live candidates, neither in sync. */
function holder(o: { conntrackSync?: boolean; handoverWaitMs?: number } = {}): Node {
  const calls: string[] = [];
  const netns = fs.mkdtempSync(path.join(os.tmpdir(), 'tether-handover-netns-'));
  const ownership = { record: async () => 'recorded', get: async () => undefined, on: () => undefined, registerGateways: async () => undefined } as unknown as OwnershipStore;
  const parts = egressParts({
    node: { name: 'n1', address: gwA.nodeAddress, uplink: 'eth0' }, pinDir: '/nonexistent', fouPort: 0, syncPort: 0, clusterKey: Buffer.alloc(32),
    egresses: [EGRESS], ownership, addresses: {} as ClusterAddresses, attach: {} as AttachService, logger, conntrackSync: o.conntrackSync, handoverWaitMs: o.handoverWaitMs,
  });
  const { s } = parts;
  const datapath = {
    own: (a: string) => calls.push(`own ${a}`), release: (a: string) => calls.push(`release ${a}`), takeUnannounced: () => undefined,
    withdrawAnnouncement: (a: string) => calls.push(`withdraw ${a}`), teardown: () => calls.push('teardown'),
  } as unknown as GatewayDatapath;
  const gw = { info: gwA, datapath, egresses: new Set([EGRESS.key]), guarded: '', netns };
  s.gateways.set(gwA.pod, gw);
  s.registry.set(EGRESS.key, [gwA, gwB, gwC]);
  const st = s.track(EGRESS, ADDRESS, addressSlots(EGRESS)[0], { egress: EGRESS.key, address: ADDRESS, owner: gwA.pod, epoch: 4, ownerNode: 'n1', ownerNodeAddress: gwA.nodeAddress, ownerPodIp: gwA.podIp });
  st.holder = gw;
  st.candidates = [gwA, gwB, gwC];
  const senders = { n2: fakeSender('resync'), n3: fakeSender('handshake') };
  st.senders.set(gwB.nodeAddress, senders.n2 as unknown as SyncSender);
  st.senders.set(gwC.nodeAddress, senders.n3 as unknown as SyncSender);
  return { ...parts, st, calls, senders, netns };
}

const done = (n: Node) => {
  n.s.stopped = true;
  fs.rmSync(n.netns, { recursive: true, force: true });
};
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const settled = <T>(p: Promise<T>) => Promise.race([p.then(() => true), sleep(0).then(() => false)]);

test('no standby in sync: the holder keeps the address (owner, epoch, datapath) and waits', async () => {
  const n = holder();
  try {
    const p = n.election.handOverWhenInSync(n.st, gwA.pod, 'handover: tetherd stopping', { until: Date.now() + 10_000 });
    await sleep(600);
    assert.is(await settled(p), false, 'still waiting');
    assert.is(n.st.holder?.info.pod, gwA.pod);
    assert.is(n.st.own.owner, gwA.pod);
    assert.is(n.st.own.epoch, 4);
    assert.ok(n.st.handingOver, 'marked as handing over');
    assert.equal(n.calls, [], 'nothing released, withdrawn or torn down');
    const warned = lines.find((l) => l.message === 'egress: must hand over, but no standby is in sync: keeping the address until one is');
    assert.ok(warned, 'the wait is logged');
    assert.is((warned!.standbys as Array<{ rejected?: string }>)[0].rejected, 'version', 'naming why each standby is not in sync');
    n.senders.n3.state = 'streaming';
    await p;
  } finally {
    done(n);
  }
});

test('a standby that comes in sync during the wait gets the address, though it is not first in order', async () => {
  const n = holder();
  try {
    const t0 = Date.now();
    const p = n.election.handOverWhenInSync(n.st, gwA.pod, 'handover: tetherd stopping', { until: Date.now() + 10_000 });
    await sleep(400);
    n.senders.n3.state = 'streaming';
    const next = await p;
    assert.is(next?.pod, gwC.pod);
    assert.ok(Date.now() - t0 < 2000, 'handed over within a poll of it coming in sync');
    assert.is(n.st.own.owner, gwC.pod);
    assert.is(n.st.own.epoch, 5);
    assert.is(n.st.own.cause, 'handover: tetherd stopping');
    assert.is(n.st.holder, undefined);
    assert.is(n.st.handingOver, undefined);
  } finally {
    done(n);
  }
});

test('an in-sync standby from the start: handed over at once (the existing make-before-break)', async () => {
  const n = holder();
  try {
    n.senders.n2.state = 'streaming';
    const t0 = Date.now();
    const next = await n.election.handOverWhenInSync(n.st, gwA.pod, 'handover: tetherd stopping', { until: Date.now() + 10_000 });
    assert.is(next?.pod, gwB.pod);
    assert.ok(Date.now() - t0 < 100);
  } finally {
    done(n);
  }
});

test('the wait ends with none in sync: the best live candidate gets it anyway, the cause says why', async () => {
  const n = holder();
  try {
    const t0 = Date.now();
    const next = await n.election.handOverWhenInSync(n.st, gwA.pod, draining('tetherd stopping'), { until: Date.now() + 500 });
    assert.ok(Date.now() - t0 >= 490, `waited ${Date.now() - t0} ms`);
    assert.is(next?.pod, gwB.pod, 'the first live candidate');
    assert.match(n.st.own.cause!, /^tetherd stopping; no standby in sync within \d+ ms \(old gateway draining\)$/);
    assert.ok(isDraining(n.st.own.cause), 'still a draining handover to every node (clients wait for the new owner\'s confirmation)');
    assert.ok(lines.some((l) => l.message === 'egress: no standby came in sync: handed over anyway; the connections it lacks break' && l.to === gwB.pod));
  } finally {
    done(n);
  }
});

test('without conntrack sync there is nothing to wait for: handed over at once', async () => {
  const n = holder({ conntrackSync: false });
  try {
    const t0 = Date.now();
    const next = await n.election.handOverWhenInSync(n.st, gwA.pod, 'handover: tetherd stopping', { until: Date.now() + 10_000 });
    assert.is(next?.pod, gwB.pod);
    assert.ok(Date.now() - t0 < 100);
  } finally {
    done(n);
  }
});

test('gateway pod deleted (DEL): the pod keeps forwarding while waiting, the election pass does not stand it down, the DEL returns after the handover', async () => {
  const n = holder({ handoverWaitMs: 10_000 });
  try {
    const rec = { podNamespace: 'shop', podName: 'gw-a' } as PodRecord;
    const del = n.roles.podDown(rec, 'gateway pod deleted', 50);
    await sleep(300);
    // The pod is no longer one of this node's gateways, yet it holds the address: a pass must leave it.
    await n.election.tick();
    assert.is(await settled(del), false, 'the DEL waits');
    assert.is(n.st.holder?.info.pod, gwA.pod);
    assert.equal(n.calls, [], 'nothing released, withdrawn or torn down while waiting');
    n.senders.n2.state = 'streaming';
    await del;
    assert.is(n.st.own.owner, gwB.pod);
    assert.equal(n.calls, [`withdraw ${ADDRESS}`, 'teardown'], 'announcement withdrawn, then the pod torn down after the drain');
  } finally {
    done(n);
  }
});

test('a standby stopping while the pod leaves (the wait joined, not run twice) and a vanished namespace hands over at once', async () => {
  const n = holder({ handoverWaitMs: 10_000 });
  try {
    const a = n.election.handOverWhenInSync(n.st, gwA.pod, 'handover: gateway pod deleted', { until: Date.now() + 10_000 });
    const b = n.election.handOverWhenInSync(n.st, gwA.pod, 'tetherd stopping', { until: Date.now() + 10_000, elsewhere: true });
    assert.is(a, b, 'one handover per address');
    n.senders.n2.state = 'streaming';
    assert.is((await b)?.pod, gwB.pod);
    assert.is(n.st.own.epoch, 5, 'one epoch step');
  } finally {
    done(n);
  }
  const m = holder({ handoverWaitMs: 10_000 });
  try {
    const t0 = Date.now();
    await m.roles.podDown({ podNamespace: 'shop', podName: 'gw-a' } as PodRecord, 'gateway pod namespace gone');
    assert.ok(Date.now() - t0 < 200, 'no wait: its connections went with its namespace');
    assert.is(m.st.own.owner, gwB.pod);
  } finally {
    done(m);
  }
});

test.run();
