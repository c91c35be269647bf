// Node underlays of different families (a cluster moving between them, or a misconfigured --node-address):
// a node whose registry holds one peer of its own family and one of the other starts BFD, sync streams and
// notices to the first only, throws nothing, logs the other once, and lists it in its status. Both ways
// round (an IPv4 node, an IPv6 node); then with real BFD threads over loopback.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { EventEmitter } from 'node:events';
import { createHmac } from 'node:crypto';
import { isIP } from 'node:net';
import { Writable } from 'node:stream';
import { makeLogger, setLogger } from '../../lib/log';
import { EgressController } from '../../daemon/egress/egress-controller';
import type { EgressParts } from '../../daemon/egress/egress-controller';
import { addressSlots } from '../../daemon/egress/egress-spec';
import type { GatewayInfo, OwnershipStore } from '../../daemon/egress/ownership-store';
import type { GatewayDatapath } from '../../daemon/egress/gateway-datapath';
import type { ConntrackEvents } from '../../daemon/conntrack';
import { BfdThread } from '../../daemon/bfd/threaded';
import { BFD_RETRY_MS, PeerLiveness } from '../../daemon/egress/peer-liveness';
import { BfdAuthType, BfdState } from '../../daemon/bfd';
import type { ClusterAddresses } from '../../ipam/cluster-addresses';
import type { AttachService } from '../../daemon/pod/attach-service';
import { KEY } from './conntrack-sync-fixtures';
import { ADDRESS, EGRESS } from './egress-fixtures';

const WHY = 'node underlays of different families: not reachable from here';

/** A logger whose lines are kept (parsed). */
function capture(): { logger: ReturnType<typeof makeLogger>; lines: Array<Record<string, unknown>> } {
  const lines: Array<Record<string, unknown>> = [];
  const logger = makeLogger({ level: 'debug', stream: new Writable({ write: (c, _e, cb) => (lines.push(JSON.parse(String(c))), cb()) }) });
  return { logger, lines };
}

interface Node {
  c: EgressController;
  parts: EgressParts;
  lines: Array<Record<string, unknown>>;
}

/**
 * Node n1 at `self` with gateway gw-a, a candidate of EGRESS beside gw-b on n2 (`same`, this node's family)
 * and gw-c on n3 (`other`, the other family), as the store's registry lists them. `owner` holds ADDRESS.
 */
function node(self: string, same: string, other: string, owner: 'gw-a' | 'gw-b' | 'gw-c', extraNodes: string[] = []): Node & { gws: GatewayInfo[] } {
  const { logger, lines } = capture();
  const ownership = { record: async () => 'recorded', get: async () => undefined, on: () => undefined } as unknown as OwnershipStore;
  const c = new EgressController({
    node: { name: 'n1', address: self, uplink: 'eth0' }, pinDir: '/nonexistent', fouPort: 0, syncPort: 1, clusterKey: KEY,
    egresses: [EGRESS], ownership, addresses: {} as ClusterAddresses, attach: {} as AttachService, logger,
  });
  const parts = c as unknown as EgressParts;
  const { s } = parts;
  const gws: GatewayInfo[] = [
    { pod: 'shop/gw-a', node: 'n1', nodeAddress: self, podIp: '10.244.1.5' },
    { pod: 'shop/gw-b', node: 'n2', nodeAddress: same, podIp: '10.244.2.5' },
    { pod: 'shop/gw-c', node: 'n3', nodeAddress: other, podIp: '10.244.3.5' },
  ];
  s.gateways.set(gws[0].pod, { info: gws[0], datapath: {} as GatewayDatapath, egresses: new Set([EGRESS.key]), guarded: '', netns: '/nonexistent' });
  s.registry.set(EGRESS.key, gws);
  s.nodeNames = new Map([[self, 'n1'], [same, 'n2'], [other, 'n3']]);
  s.nodes = [self, same, other, ...extraNodes].sort();
  const o = gws.find((g) => g.pod === `shop/${owner}`)!;
  const st = s.track(EGRESS, ADDRESS, addressSlots(EGRESS)[0], { egress: EGRESS.key, address: ADDRESS, owner: o.pod, epoch: 2, ownerNode: o.node, ownerNodeAddress: o.nodeAddress, ownerPodIp: o.podIp });
  st.candidates = gws;
  return { c, parts, lines, gws };
}

/** A BFD endpoint that records sessions and, like BfdEndpoint, throws for a peer of the other family. */
function fakeEndpoint(self: string): { endpoint: BfdThread; sessions: string[] } {
  const sessions: string[] = [];
  const endpoint = {
    session: (peer: string) => {
      if (isIP(peer) !== isIP(self)) throw new Error(`bfd peer: ${peer} is not an IPv${isIP(self)} address`);
      sessions.push(peer);
      return Object.assign(new EventEmitter(), { state: BfdState.Down, setTimers: () => undefined, close: () => undefined });
    },
    stats: () => ({ rx: 0, rejected: {}, sessions: sessions.map((peer) => ({ peer, state: 'Down', ups: 0, downs: 0, rx: 0, tx: 0 })), loopLagMaxMs: 0, loopLagPerSecondMs: [] }),
  } as unknown as BfdThread;
  return { endpoint, sessions };
}

const skippedLines = (lines: Array<Record<string, unknown>>) => lines.filter((l) => l.level === 'warn' && String(l.message).includes(WHY));

for (const [self, same, other, address6] of [['10.1.0.1', '10.1.0.2', 'fd00::3', '2001:db8::2'], ['fd00::1', 'fd00::2', '10.1.0.3', undefined]] as const) {
  test(`an IPv${isIP(self)} node with one peer of each family: BFD, sync and notices to the same family only, nothing thrown, one warn line, status says it`, async () => {
    // On the IPv4 node, n2 also registered an IPv6 address beside its IPv4 one (FoU in outer IPv6): no peer.
    const n = node(self, same, other, 'gw-a', address6 ? [address6] : []);
    const { s, peers, streams } = n.parts;
    const { endpoint, sessions } = fakeEndpoint(self);
    s.endpoint = endpoint;
    for (let i = 0; i < 5; i++) peers.ensureBfd(); // every election tick
    assert.equal(sessions, [same], 'one session, to the peer of this node\'s family');
    assert.equal(peers.peerAddresses().sort(), [same], 'a change of owner goes to the reachable peer only');
    assert.equal([...peers.gatewayPeers(EGRESS.key)], [same], 'announcements too');
    assert.equal([...peers.heartbeatPeers(EGRESS.key)], [same], 'the owner\'s heartbeat too');

    // The owner's sync streams: to the reachable standby only.
    const st = [...s.addresses.values()][0];
    st.holder = s.gateways.get('shop/gw-a');
    st.events = {} as ConntrackEvents;
    streams.ensureSenders(st);
    assert.equal([...st.senders.keys()], [same], 'a sync stream to the reachable standby only');
    for (const x of st.senders.values()) await x.close();
    st.senders.clear();
    st.holder = undefined;
    st.events = undefined;

    const warns = skippedLines(n.lines);
    assert.is(warns.length, 1, `one warn line, not one per tick or consumer: ${JSON.stringify(warns)}`);
    assert.equal({ node: warns[0].node, nodeAddress: warns[0].nodeAddress, thisNode: warns[0].thisNode, thisNodeAddress: warns[0].thisNodeAddress }, { node: 'n3', nodeAddress: other, thisNode: 'n1', thisNodeAddress: self });
    assert.not.ok(n.lines.some((l) => l.level === 'error'), 'nothing failed');

    // Status: the BFD section lists the skipped peer, the address's candidate says why it has no session.
    assert.equal(n.c.bfdStatus()?.skippedPeers, [{ node: 'n3', nodeAddress: other, why: WHY }]);
    const cands = n.c.status()[0].candidates as Array<{ node: string; bfd: string; live: boolean }>;
    assert.equal(cands.find((x) => x.node === 'n3'), { pod: 'shop/gw-c', node: 'n3', live: false, bfd: 'otherFamily', inSync: false });
    assert.is(cands.find((x) => x.node === 'n2')?.bfd, 'Down', 'the reachable peer has its session');
    assert.is(skippedLines(n.lines).length, 1, 'status logs nothing more');
  });
}

test('a standby whose owner is of the other family: not counted alive from here, the owner kept while registered, and its sync status says why', () => {
  const n = node('10.1.0.1', '10.1.0.2', 'fd00::3', 'gw-c');
  const { s, peers, standby } = n.parts;
  s.endpoint = fakeEndpoint('10.1.0.1').endpoint;
  peers.ensureBfd();
  const st = [...s.addresses.values()][0];
  assert.is(peers.alive(n.gws[2]), false, 'never seen alive from here: nothing is handed to it');
  assert.is(peers.ownerAlive(st), true, 'still registered: this node does not take the address from it');
  standby.update();
  const sync = standby.statusOf(st);
  assert.is(sync?.reason, 'unreachable');
  assert.match(String(sync?.message), `no sync connection from n3 (fd00::3) arrives: ${WHY}`);
  assert.is(skippedLines(n.lines).length, 1);
});

test('an IPv6-underlay client node does not steer to a gateway pod published by its IPv4 address (an IPv4-underlay owner): left out and logged', () => {
  const n = node('fd00::1', 'fd00::2', '10.1.0.3', 'gw-c');
  const { s, steering } = n.parts;
  const written: unknown[] = [];
  s.maps = { setGateways: (_id: number, slots: unknown[]) => written.push(slots) } as unknown as typeof s.maps;
  s.clients.set('shop/web', { ip6: 'fd00:244::9', hostIfName: 'veth9', egressIds: [1] });
  steering.updateClients([...s.addresses.values()][0]);
  assert.equal(written, [[]], 'no slot with an IPv4 gateway: this node has no outer IPv4 source');
  const line = n.lines.find((l) => l.message === 'egress: client steering updated');
  assert.equal(line?.unreachableIpv4Gateway, [ADDRESS]);
});

test('real BFD threads over loopback: the session to the same-family peer comes Up, none is tried to the other, no error', async () => {
  const port = 20000 + Math.floor(Math.random() * 10000);
  const n = node('127.0.0.1', '127.0.0.2', 'fd00::3', 'gw-a');
  const { s, peers } = n.parts;
  // The thread logs through the process logger: a session it could not start would say so there.
  const root = capture();
  setLogger(root.logger);
  s.endpoint = await BfdThread.open({ address: '127.0.0.1', port });
  const peer = await BfdThread.open({ address: '127.0.0.2', port });
  try {
    const key = createHmac('sha256', KEY).update('tether bfd').digest().subarray(0, 20);
    const timers = { desiredMinTxUs: 50_000, requiredMinRxUs: 50_000, detectMult: 3 };
    const remote = peer.session('127.0.0.1', { ...timers, auth: { type: BfdAuthType.MeticulousKeyedSha1, keyId: 1, key } });
    peers.ensureBfd();
    const deadline = Date.now() + 5000;
    // Each side's state is what its thread last reported: wait for both reports, not only this node's.
    while ((peers.bfdState(n.gws[1]) !== 'Up' || remote.state !== BfdState.Up) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
    assert.is(peers.bfdState(n.gws[1]), 'Up', 'the same-family peer\'s session came Up');
    assert.is(remote.state, BfdState.Up);
    assert.is(peers.bfdState(n.gws[2]), 'otherFamily');
    await new Promise((r) => setTimeout(r, 600)); // the thread's next stats report
    assert.equal(s.endpoint.stats().sessions.map((x) => x.peer), ['127.0.0.2'], 'one session on the thread');
    assert.not.ok([...root.lines, ...n.lines].some((l) => l.level === 'error'), `an error was logged: ${JSON.stringify([...root.lines, ...n.lines].filter((l) => l.level === 'error'))}`);
    assert.is(skippedLines(n.lines).length, 1);
    assert.equal(n.c.bfdStatus()?.skippedPeers, [{ node: 'n3', nodeAddress: 'fd00::3', why: WHY }]);
  } finally {
    await s.endpoint.close();
    await peer.close();
  }
});

test('a BFD session that ends on its own (it could not start in the BFD thread) is started again after BFD_RETRY_MS, not left without one', async () => {
  const n = node('10.1.0.1', '10.1.0.2', 'fd00::3', 'gw-a');
  const { s } = n.parts;
  // Its own PeerLiveness, whose ticks are counted: the controller's would reconcile the fake gateways away.
  let ticks = 0;
  const peers = new PeerLiveness(s, () => ticks++);
  const made: EventEmitter[] = [];
  s.endpoint = {
    session: () => {
      const e = Object.assign(new EventEmitter(), { state: BfdState.Down, setTimers: () => undefined, close: () => undefined });
      made.push(e);
      return e;
    },
    stats: () => ({ rx: 0, rejected: {}, sessions: [], loopLagMaxMs: 0, loopLagPerSecondMs: [] }),
  } as unknown as BfdThread;
  peers.ensureBfd();
  assert.is(made.length, 1, 'a session to the reachable peer');
  made[0].emit('close'); // as BfdThread does on 'sessionFailed'
  peers.ensureBfd();
  assert.is(made.length, 1, 'not at once: a failing start is not retried in a tight loop');
  assert.ok(n.lines.some((l) => l.level === 'warn' && String(l.message).includes('BFD session to peer ended') && l.peer === '10.1.0.2'), 'logged with its peer');
  await new Promise((r) => setTimeout(r, BFD_RETRY_MS + 50));
  assert.is(ticks, 1, 'the election looks again once the retry is due');
  peers.ensureBfd();
  assert.is(made.length, 2, 'started again after BFD_RETRY_MS');
  peers.ensureBfd();
  assert.is(made.length, 2, 'one session per peer');
});

test.run();
