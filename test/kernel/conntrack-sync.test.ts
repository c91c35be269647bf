// Kernel tests of incremental conntrack sync (root, real kernel): an owner namespace A with 50,000
// entries SNATed to a floating address streams them to a standby namespace B through a real SyncSender
// and SyncReceiver on 127.0.0.1, B's table written by the same functions tetherd uses. Checked: the
// transfer is applied while it streams and B ends equal to A; a steady-state consistency check sends
// O(buckets) bytes; entries B lost or gained behind the stream come back through their buckets alone; an
// entry deleted at A while the stream was down is gone from B after reconnect; a transfer cut off
// halfway deletes nothing in B. Namespaces are uniquely named and always removed.
import { execFileSync } from 'node:child_process';
import * as crypto from 'node:crypto';
import { Writable } from 'node:stream';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { ConntrackHandle, IPS, entryKey, type ConntrackEntry, type ConntrackEvent } from '../../daemon/conntrack';
import { applySyncedEvents, applyWireList, dumpScopeEncoded, SyncReceiver, SyncSender, WireList, bucketOf, sweepSyncedEntries, syncedDigests, upsertSyncedEntries, type SyncReceiverOptions } from '../../daemon/conntrack-sync';
import { MAX_EVENT_BYTES, writeEntry, writeEvent, writeList } from '../../daemon/conntrack-sync/entry-codec';
import { ipToBytes } from '../../lib/ip';
import { log, makeLogger, setLogger, type Logger } from '../../lib/log';
import { ConntrackStreams } from '../../daemon/egress/conntrack-streams';
import type { AddressState, EgressShared, LocalGateway } from '../../daemon/egress/egress-state';
import { waitFor } from '../lib/wait';

const FLOATING = '10.99.0.1';
const N = 50_000;
const K = 1024;
const KEY = crypto.randomBytes(32);

const namespaces: string[] = [];
const closers: Array<() => unknown> = [];
let saved: Logger | undefined;

test.before(() => {
  saved = log();
  setLogger(makeLogger({ stream: new Writable({ write: (_c, _e, cb) => cb() }) }));
});
test.after(() => {
  if (saved) setLogger(saved);
});
test.after.each(async () => {
  for (const c of closers.splice(0).reverse()) {
    try { await c(); } catch { /* best effort */ }
  }
  for (const ns of namespaces.splice(0)) {
    try { execFileSync('ip', ['netns', 'del', ns], { stdio: 'ignore' }); } catch { /* already gone */ }
  }
});

function ctNamespace(role: string): string {
  const ns = `tcs-${crypto.randomBytes(3).toString('hex')}-${role}`;
  execFileSync('ip', ['netns', 'add', ns]);
  namespaces.push(ns);
  // Conntrack in a namespace tracks only while a rule there uses it; the nat chain makes NAT work.
  for (const fam of ['ip', 'ip6']) {
    execFileSync('nsenter', [`--net=/run/netns/${ns}`, 'nft', `add table ${fam} tcs; add chain ${fam} tcs f { type filter hook forward priority 0; }; add rule ${fam} tcs f ct state established accept; add chain ${fam} tcs p { type nat hook postrouting priority 100; }`]);
  }
  return `/run/netns/${ns}`;
}

function flow(i: number, timeout = 600): ConntrackEntry {
  // Reply tuples must be unique too: the NAT port is what tells flows apart at the floating address.
  const port = 1024 + (i % 60000), svc = 53 + Math.floor(i / 60000);
  return {
    orig: { family: 4, proto: 17, src: '10.0.0.2', dst: '192.0.2.1', sport: port, dport: svc },
    reply: { family: 4, proto: 17, src: '192.0.2.1', dst: FLOATING, sport: svc, dport: port },
    status: IPS.SEEN_REPLY | IPS.SRC_NAT, timeout,
  };
}

function open(ns: string): ConntrackHandle {
  const h = ConntrackHandle.open(ns);
  closers.push(() => h.close());
  return h;
}

const inScope = (e: ConntrackEntry) => e.reply.dst === FLOATING;
const keysOf = (h: ConntrackHandle) => new Set(h.dump({ family: 4 }).filter(inScope).map(entryKey));

function sameKeys(a: Set<string>, b: Set<string>): string | undefined {
  if (a.size !== b.size) return `${a.size} vs ${b.size} entries`;
  for (const k of a) if (!b.has(k)) return `missing ${k}`;
  return undefined;
}

/** A receiver writing namespace b, as tetherd's egress controller does (timeout floor left out). */
async function receiver(b: string, opts: Partial<SyncReceiverOptions> = {}, port = 0): Promise<SyncReceiver> {
  const rx = new SyncReceiver({
    key: KEY, id: 'node-b', host: '127.0.0.1', port,
    apply: async () => undefined,
    upsert: async (entries) => void (await upsertSyncedEntries(b, entries)),
    sweep: async (keep, buckets) => (await sweepSyncedEntries(b, inScope, keep, buckets)).deleted,
    digests: async (k) => (await syncedDigests(b, inScope, k)).digests,
    ...opts,
  });
  await rx.listen();
  closers.push(() => rx.close());
  return rx;
}

function sender(a: string, port: number): SyncSender {
  const tx = new SyncSender({
    key: KEY, id: 'node-a', host: '127.0.0.1', port, stream: FLOATING, epoch: 1, buckets: K, backoffMinMs: 20, backoffMaxMs: 100,
    snapshot: () => ConntrackHandle.with(a, (h) => h.dump({ family: 4 })).filter(inScope),
  });
  closers.push(() => tx.close());
  return tx;
}

function fill(h: ConntrackHandle, from: number, to: number): void {
  const r = h.insertMany(Array.from({ length: to - from }, (_, i) => flow(from + i)));
  if (r.failed.length) throw new Error(`insert failed: ${r.failed[0].error.message}`);
}

test(`${N} entries: applied while streaming, then a consistency check costs O(buckets) bytes; lost, stray and deleted-while-down entries are fixed`, async () => {
  const a = ctNamespace('a');
  const b = ctNamespace('b');
  const ha = open(a);
  const hb = open(b);
  fill(ha, 0, N);
  let sizeAtSweep = -1;
  let rx = await receiver(b, {
    sweep: async (keep, buckets) => {
      if (sizeAtSweep < 0) sizeAtSweep = keysOf(hb).size;
      return (await sweepSyncedEntries(b, inScope, keep, buckets)).deleted;
    },
  });
  const port = rx.port;
  const tx = sender(a, port);
  const t0 = Date.now();
  tx.start();
  await waitFor(() => rx.stats().resyncs === 1, 'the first transfer', { timeoutMs: 40_000 });
  const ms = Date.now() - t0;
  assert.is(sizeAtSweep, N, 'every chunk was in the kernel before the END');
  assert.is(sameKeys(keysOf(ha), keysOf(hb)), undefined);
  console.log(`  transfer of ${N} entries into the kernel: ${ms} ms (${Math.round(N / ms * 1000)}/s), receiver key set ${rx.stats().maxKeySetBytes} bytes`);

  // Steady state: a check is the digests, nothing more (the full table would be ~N × 40 bytes).
  await waitFor(() => tx.stats().inflightFrames === 0, 'acked');
  const before = tx.stats();
  tx.checkConsistency();
  await waitFor(() => rx.stats().checks === 1, 'the check compared', { timeoutMs: 10_000 });
  await new Promise((r) => setTimeout(r, 100));
  const after = tx.stats();
  const bytes = after.bytesSent - before.bytesSent;
  assert.ok(bytes <= 4 + K * 12 + 128, `a check sent ${bytes} bytes`);
  assert.is(after.entriesSent, before.entriesSent, 'no entry sent again');
  assert.is(rx.stats().bucketsRequested, 0);
  console.log(`  steady-state check: ${bytes} bytes for ${N} entries (${K} buckets)`);

  // B loses one copy (as if expired) and gains a stray one; both come right through their buckets.
  hb.delete(flow(7).orig);
  hb.insert(flow(N + 5));
  const sentBefore = tx.stats().entriesSent;
  tx.checkConsistency();
  await waitFor(() => rx.stats().bucketResyncs === 1, 'the differing buckets', { timeoutMs: 10_000 });
  assert.is(rx.stats().bucketsRequested, new Set([bucketOf(flow(7), K), bucketOf(flow(N + 5), K)]).size);
  assert.is(sameKeys(keysOf(ha), keysOf(hb)), undefined, 'equal again');
  assert.ok(tx.stats().entriesSent - sentBefore < 200, `${tx.stats().entriesSent - sentBefore} entries sent again`);

  // The stream goes down; meanwhile A deletes 100 entries and gains 10. After reconnect B matches A.
  await rx.close();
  await waitFor(() => tx.stats().disconnects === 1, 'sender noticed');
  for (let i = 100; i < 200; i++) ha.delete(flow(i).orig);
  fill(ha, N + 100, N + 110);
  rx = await receiver(b, {}, port);
  await waitFor(() => rx.stats().resyncs === 1, 'transfer after reconnect', { timeoutMs: 40_000 });
  assert.is(sameKeys(keysOf(ha), keysOf(hb)), undefined, 'deleted while down: gone from B; created: there');
  assert.is(rx.stats().swept, 100);
});

// IPv6: flows SNATed (SNAT66) to an IPv6 floating address, streamed by the wire path tetherd uses (the dump
// read straight into wire form, scoped by the address's 16 bytes), then checked and repaired by bucket.
const FLOATING6 = '2001:db8:f::7';
const N6 = 10_000;

function flow6(i: number): ConntrackEntry {
  const port = 1024 + (i % 60000), svc = 443 + Math.floor(i / 60000);
  return {
    orig: { family: 6, proto: 6, src: 'fd00:10:244::2', dst: '2001:db8:100::1', sport: port, dport: svc },
    reply: { family: 6, proto: 6, src: '2001:db8:100::1', dst: FLOATING6, sport: svc, dport: port },
    status: IPS.SEEN_REPLY | IPS.ASSURED | IPS.SRC_NAT, timeout: 600, tcp: { state: 3 },
  };
}

test(`IPv6: ${N6} SNAT66 entries streamed, checked in O(buckets) bytes, a lost and a stray copy fixed by bucket`, async () => {
  const a = ctNamespace('a');
  const b = ctNamespace('b');
  const ha = open(a);
  const hb = open(b);
  const r = ha.insertMany(Array.from({ length: N6 }, (_, i) => flow6(i)));
  assert.is(r.failed.length, 0, r.failed[0]?.error.message);
  const inScope6 = (e: ConntrackEntry) => e.reply.dst === FLOATING6;
  const keys6 = (h: ConntrackHandle) => new Set(h.dump({ family: 6 }).filter(inScope6).map(entryKey));
  // An IPv4 flow of another address in the same table: out of scope, never sent.
  ha.insert(flow(1));
  const rx = await receiver(b, {
    sweep: async (keep, buckets) => (await sweepSyncedEntries(b, inScope6, keep, buckets)).deleted,
    digests: async (k) => (await syncedDigests(b, inScope6, k)).digests,
  });
  const tx = new SyncSender({
    key: KEY, id: 'node-a', host: '127.0.0.1', port: rx.port, stream: FLOATING6, epoch: 1, buckets: K, backoffMinMs: 20, backoffMaxMs: 100,
    snapshot: () => dumpScopeEncoded(a, 6, ipToBytes(FLOATING6)),
  });
  closers.push(() => tx.close());
  tx.start();
  await waitFor(() => rx.stats().resyncs === 1, 'the first transfer', { timeoutMs: 40_000 });
  assert.is(sameKeys(keys6(ha), keys6(hb)), undefined);
  assert.is(hb.dump({ family: 4 }).length, 0, 'the IPv4 flow of another address stayed out');
  const copy = hb.get(flow6(9).orig)!;
  assert.is(copy.reply.dst, FLOATING6, 'the copy answers at the IPv6 floating address');
  assert.ok((copy.status & IPS.SRC_NAT) !== 0, 'as SNAT');

  await waitFor(() => tx.stats().inflightFrames === 0, 'acked');
  const before = tx.stats();
  tx.checkConsistency();
  await waitFor(() => rx.stats().checks === 1, 'the check compared', { timeoutMs: 10_000 });
  await new Promise((res) => setTimeout(res, 100));
  const bytes = tx.stats().bytesSent - before.bytesSent;
  assert.ok(bytes <= 4 + K * 12 + 128, `a check sent ${bytes} bytes`);
  assert.is(rx.stats().bucketsRequested, 0, 'the digests of IPv6 entries agree on both sides');

  hb.delete(flow6(7).orig);
  hb.insert(flow6(N6 + 5));
  tx.checkConsistency();
  await waitFor(() => rx.stats().bucketResyncs === 1, 'the differing buckets', { timeoutMs: 10_000 });
  assert.is(rx.stats().bucketsRequested, new Set([bucketOf(flow6(7), K), bucketOf(flow6(N6 + 5), K)]).size);
  assert.is(sameKeys(keys6(ha), keys6(hb)), undefined, 'equal again');
});

test('a transfer cut off halfway deletes nothing in the standby', async () => {
  const a = ctNamespace('a');
  const b = ctNamespace('b');
  const ha = open(a);
  const hb = open(b);
  fill(ha, 0, 20_000);
  // B holds 1,000 entries A no longer has: a complete transfer would delete them, a cut one must not.
  fill(hb, 100_000, 101_000);
  let chunks = 0;
  const rx: SyncReceiver = await receiver(b, {
    upsert: async (entries) => {
      await upsertSyncedEntries(b, entries);
      if (++chunks === 2) void rx.close();
    },
  });
  const tx = sender(a, rx.port);
  tx.start();
  await waitFor(() => chunks >= 2 && rx.stats().connectedPeers === 0, 'the cut', { timeoutMs: 20_000 });
  await new Promise((r) => setTimeout(r, 200));
  const inB = keysOf(hb);
  assert.is(rx.stats().resyncs, 0, 'never completed');
  assert.ok(Array.from({ length: 1000 }, (_, i) => entryKey(flow(100_000 + i))).every((k) => inB.has(k)), 'nothing deleted');
  assert.ok(inB.size >= 1000 + 4000 && inB.size < 21_000, `${inB.size} entries: the chunks received were applied`);
});

test('standby copies: a short timeout is raised to the floor on write and re-armed by the check', async () => {
  const b = ctNamespace('b');
  const hb = open(b);
  await upsertSyncedEntries(b, [flow(1, 30)], 600);
  assert.ok(hb.get(flow(1).orig)!.timeout! > 500, `written with ${hb.get(flow(1).orig)!.timeout} s`);
  hb.insert(flow(2, 100));
  const { digests, refreshed } = await syncedDigests(b, inScope, 64, 600);
  assert.is(refreshed, 1, 'only the copy under half the floor');
  assert.ok(hb.get(flow(2).orig)!.timeout! > 500, `re-armed to ${hb.get(flow(2).orig)!.timeout} s`);
  assert.is(digests.entries, 2);
});

test('the wire paths: a dump read straight into wire form is the decoded dump encoded; a list written from its bytes leaves the table as the decoded apply does', async () => {
  const a = ctNamespace('a');
  const b = ctNamespace('b');
  const c = ctNamespace('c');
  const ha = open(a);
  fill(ha, 0, 3000);
  ha.insert({ ...flow(5000), reply: { ...flow(5000).reply, dst: '10.99.0.9' } }); // another address: not in the transfer
  const enc = await dumpScopeEncoded(a, 4, ipToBytes(FLOATING));
  const decoded = ConntrackHandle.with(a, (h) => h.dump({ family: 4 })).filter(inScope);
  assert.is(enc.count, decoded.length);
  // The same entries (timeouts tick between the two dumps, so they are left out of the comparison), and
  // each entry's bytes are exactly its decoded form encoded.
  const buf = Buffer.alloc(MAX_EVENT_BYTES);
  const sorted = (_k: string, x: unknown) => (x && typeof x === 'object' && !Array.isArray(x) ? Object.fromEntries(Object.entries(x).sort(([p], [q]) => (p < q ? -1 : 1))) : x);
  const noTimeout = (e: ConntrackEntry) => JSON.stringify({ ...e, timeout: undefined }, sorted);
  const want = new Set(decoded.map(noTimeout));
  for (let i = 0; i < enc.count; i++) {
    const e = enc.entry(i);
    assert.ok(want.has(noTimeout(e)), `entry ${i} is in the decoded dump`);
    assert.ok(buf.subarray(0, writeEntry(buf, 0, e)).equals(enc.buf.subarray(enc.offsets[i], enc.offsets[i + 1])), `entry ${i}: its bytes are its decoded form encoded`);
  }
  // Events against tables holding some of the flows already: new meets existing (→ update), update meets
  // none (→ create), destroy of a missing one is fine; B through the wire path, C through the decoded one.
  const events: ConntrackEvent[] = [
    ...Array.from({ length: 300 }, (_, i) => ({ type: 'new' as const, entry: flow(i) })),
    ...Array.from({ length: 100 }, (_, i) => ({ type: 'update' as const, entry: flow(1000 + i, 300) })),
    ...Array.from({ length: 50 }, (_, i) => ({ type: 'destroy' as const, entry: flow(i * 2) })),
    { type: 'destroy', entry: flow(9999) },
  ];
  for (const ns of [b, c]) ConntrackHandle.with(ns, (h) => fill(h, 0, 100));
  const list = Buffer.alloc(MAX_EVENT_BYTES * events.length + 4);
  const end = writeList(list, 0, list.length, events, 0, events.length, writeEvent, () => assert.unreachable()).end;
  const rb = await applyWireList(b, WireList.parse(list.subarray(0, end), events.length, true), 600);
  const rc = await applySyncedEvents(c, events, 600);
  assert.equal(rb, rc, 'the same counts: created, updated, deleted, none failed');
  assert.is(rb.failed.length, 0);
  const table = (ns: string) => ConntrackHandle.with(ns, (h) => h.dump({ family: 4 })).map((e) => `${entryKey(e)} ${e.status & ~IPS.DYING} ${e.timeout! > 500}`).sort();
  assert.equal(table(b), table(c));
  assert.is(table(b).length, 100 + 200 + 100 - 50);
});

test('one conntrack event socket per gateway namespace, however many addresses it holds; events reach their own address\'s peers', async () => {
  const a = ctNamespace('a');
  const ha = open(a);
  const got = new Map<string, Set<string>>();
  const note = (stream: string, dsts: string[]) => {
    const s = got.get(stream) ?? new Set<string>();
    for (const d of dsts) s.add(d);
    got.set(stream, s);
  };
  // A flow reaches its stream's peer as an event, or inside a snapshot when the stream (re)connects around
  // its insertion (a busy machine): either way it is the address's stream that carries it, and no other.
  const rx = await receiver(a, {
    apply: (events, from) => note(from.stream, events.map((e) => e.entry.reply.dst)),
    upsert: (entries, from) => note(from.stream, entries.map((e) => e.reply.dst)),
  });
  const addresses = ['10.99.0.1', '10.99.0.2', '10.99.0.3'];
  const gw = { netns: a, egresses: new Set(['default/eg']), info: { pod: 'gw-0' } } as unknown as LocalGateway;
  const ctx = {
    o: { conntrackSync: true, node: { name: 'node-a' }, clusterKey: KEY, syncPort: rx.port, logger: log() },
    addresses: new Map<string, AddressState>(), gateways: new Map([['gw-0', gw]]),
  } as unknown as EgressShared;
  const streams = new ConntrackStreams(ctx, { reachable: () => true });
  const sts = addresses.map((address) => ({
    egress: { key: 'default/eg' }, address, own: { epoch: 1 }, holder: gw, senders: new Map(),
    candidates: [{ node: 'node-a', nodeAddress: '127.0.0.2' }, { node: 'node-b', nodeAddress: '127.0.0.1' }],
  }) as unknown as AddressState);
  for (const st of sts) ctx.addresses.set(`default/eg|${st.address}`, st);
  try {
    for (const st of sts) await streams.startStreaming(st);
    assert.is(streams.eventSockets, 1, 'three addresses, one namespace, one socket');
    await waitFor(() => sts.every((st) => [...st.senders.values()].every((s) => s.stats().state === 'streaming')), 'streams up', { timeoutMs: 10_000 });
    for (const [i, address] of addresses.entries()) ha.insert({ ...flow(10 + i), reply: { ...flow(10 + i).reply, dst: address } });
    ha.insert({ ...flow(20), reply: { ...flow(20).reply, dst: '10.99.0.9' } }); // no stream has it
    await waitFor(() => addresses.every((x) => got.get(`default/eg|${x}`)?.has(x)), 'each address\'s flow at its stream (as an event, or in a snapshot)', { timeoutMs: 10_000 });
    for (const x of addresses) assert.equal([...got.get(`default/eg|${x}`)!], [x], `stream of ${x} got its own flows only`);
    await streams.stopStreaming(sts[0]);
    assert.is(streams.eventSockets, 1, 'still used by the other addresses');
    await streams.stopStreaming(sts[1]);
    await streams.stopStreaming(sts[2]);
    assert.is(streams.eventSockets, 0, 'closed with the last address');
  } finally {
    for (const st of sts) await streams.stopStreaming(st);
  }
});

test.run();
