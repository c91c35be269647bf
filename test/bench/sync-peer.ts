// One side of the conntrack sync benchmark, run as its own process inside a namespace (as tetherd runs
// on its own node), from an esbuild bundle as in the tetherd executable. It uses the code tetherd uses:
//   sender <keyHex> <peerHost> <peerPort> <address>: conntrack events of this namespace whose reply goes
//     to <address> (the floating address), encoded from their netlink bytes in place → SyncSender, as the
//     egress owner does; a transfer's snapshot is dumped straight into wire form (dumpScopeEncoded);
//   receiver <keyHex> <host> <expected> [kernel|memory] (stdin "expect <n>" restarts the count): SyncReceiver → applyWireList/sweepSyncedEntries
//     into this namespace's table from the wire bytes, as a candidate does (kernel); or only kept in
//     memory in wire form (EntryStore, memory), which is where conntrackd's FTFW keeps a peer's entries
//     until a failover commits them.
//   listen <keyHex> - <expected>: only the event reader, counting events (the floor of event-driven sync).
// It speaks one JSON line per fact on stdout: {ready, port}, {streaming}, {applied, at} when the receiver
// has applied <expected> entries (wall clock ms, same machine as the caller).
import * as fs from 'node:fs';
import { createInterface } from 'node:readline';
import { Writable } from 'node:stream';
import { ConntrackEvents } from '../../daemon/conntrack';
import { applyWireList, Digests, dumpScopeEncoded, encodeEventAt, EntryStore, SyncReceiver, SyncSender, sweepSyncedEntries, syncedDigests } from '../../daemon/conntrack-sync';
import { ipToBytes } from '../../lib/ip';
import { makeLogger, setLogger } from '../../lib/log';
import { MAX_EVENT_BYTES } from '../../daemon/conntrack-sync/entry-codec';

setLogger(makeLogger({ stream: new Writable({ write: (_c, _e, cb) => cb() }) }));
const say = (o: Record<string, unknown>) => process.stdout.write(JSON.stringify(o) + '\n');
const [role, keyHex, host, arg3, arg4] = process.argv.slice(2);
const key = Buffer.from(keyHex, 'hex');
const NS = '/proc/self/ns/net';

/** "expect <n>" on stdin starts a new count (after a warm-up burst): fn gets n. */
function onExpect(fn: (n: number) => void): void {
  createInterface({ input: process.stdin }).on('line', (l) => {
    const m = /^expect (\d+)$/.exec(l.trim());
    if (m) fn(Number(m[1]));
  });
}

async function receiver(initial: number, memory: boolean): Promise<void> {
  let expected = initial;
  let applied = 0;
  // Memory: the entries in their wire form (EntryStore), as conntrackd's external cache holds a peer's.
  const store = new EntryStore();
  // Memory: the count is of distinct entries held (a resync after an event overrun carries some again).
  let base = 0;
  onExpect((n) => {
    expected = n;
    applied = 0;
    base = store.size;
    say({ expecting: expected });
  });
  const reached = () => {
    if (memory && applied >= 0) applied = store.size - base;
    if (applied >= expected) {
      say({ applied, at: Date.now() });
      applied = -Infinity;
    }
  };
  // The wire paths: no object per entry (kernel: table-wire.ts writes the ctnetlink messages from the bytes).
  const rx = new SyncReceiver({
    key, id: 'b', host, port: 0,
    applyWire: async (list) => {
      if (memory) store.applyEvents(list);
      else await applyWireList(NS, list);
      applied += list.count;
      reached();
    },
    // A transfer is applied as it streams (upsert), and swept at its end.
    upsertWire: async (list) => {
      if (memory) store.upsertAll(list);
      else await applyWireList(NS, list);
      applied += list.count;
      reached();
    },
    sweep: async (keep, buckets, from) => {
      if (!memory) return (await sweepSyncedEntries(NS, (e) => e.reply.dst === from.stream, keep, buckets)).deleted;
      return store.sweep(keep, buckets);
    },
    digests: async (k, from) => memory ? Digests.of(store.entries(), k) : (await syncedDigests(NS, (e) => e.reply.dst === from.stream, k)).digests,
  });
  say({ ready: true, port: await rx.listen() });
}

function sender(port: number, address: string): void {
  const snapshot = () => dumpScopeEncoded(NS, address.includes(':') ? 6 : 4, ipToBytes(address));
  const tx = new SyncSender({ key, id: 'a', host, port, stream: address, snapshot });
  const events = ConntrackEvents.open(NS);
  const scope = ipToBytes(address);
  // As the egress owner: each event's netlink bytes encoded for the wire in one scratch buffer, no objects.
  const scratch = Buffer.allocUnsafe(MAX_EVENT_BYTES);
  events.sink((type, buf, start, end) => {
    const n = encodeEventAt(buf, start, end, scope, scratch, 0);
    if (n > 0) tx.pushEncoded(type, scratch, 0, n);
  });
  events.on('overrun', () => tx.requestResync());
  tx.start();
  const t = setInterval(() => {
    if (tx.stats().state !== 'streaming') return;
    clearInterval(t);
    say({ streaming: true });
  }, 10);
}

/** CPU per thread of this process (ms), from /proc: the reader worker, the main thread, V8 and libuv threads. */
function threadCpu(): Record<string, number> {
  const out: Record<string, number> = {};
  const tck = 100;
  for (const tid of fs.readdirSync('/proc/self/task')) {
    const st = fs.readFileSync(`/proc/self/task/${tid}/stat`, 'utf8');
    const name = st.slice(st.indexOf('(') + 1, st.lastIndexOf(')'));
    const f = st.slice(st.lastIndexOf(')') + 2).split(' ');
    const ms = ((Number(f[11]) + Number(f[12])) * 1000) / tck;
    if (ms > 0) out[`${name}#${tid}`] = ms;
  }
  return out;
}

process.on('SIGTERM', () => {
  if (process.env.SYNC_PEER_THREADS) process.stderr.write(`${role} threads ${JSON.stringify(threadCpu())}\n`);
  process.exit(0);
});
/**
 * listen <expected>: the floor of event-driven sync on this machine. The same event reader the sender
 * uses (worker, ring), with a sink that only counts: {applied, at} when <expected> events were seen.
 */
function listener(initial: number): void {
  let expected = initial;
  let seen = 0;
  onExpect((n) => {
    expected = n;
    seen = 0;
    say({ expecting: expected });
  });
  const events = ConntrackEvents.open(NS);
  events.sink(() => {
    if (++seen === expected) say({ applied: seen, at: Date.now() });
  });
  say({ ready: true });
}

if (role === 'receiver') void receiver(Number(arg3), arg4 === 'memory');
else if (role === 'sender') sender(Number(arg3), arg4);
else if (role === 'listen') listener(Number(arg3));
else {
  process.stderr.write(`unknown role ${role}\n`);
  process.exit(2);
}
