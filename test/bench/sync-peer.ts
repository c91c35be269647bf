// One side of the conntrack sync benchmark, run as its own process inside a namespace (as tetherd runs
// on its own node), from an esbuild bundle as in the tetherd executable. It uses the code tetherd uses:
//   sender <keyHex> <peerHost> <peerPort> <address>: conntrack events of this namespace whose reply goes
//     to <address> (the floating address), encoded from their netlink bytes → SyncSender, as the egress owner does;
//   receiver <keyHex> <host> <expected> [kernel|memory] (stdin "expect <n>" restarts the count): SyncReceiver → applySyncedEvents/upsertSyncedEntries/sweepSyncedEntries
//     into this namespace's table, as a candidate does (kernel); or only kept in a Map keyed like the
//     table (memory), which is where conntrackd's FTFW keeps a peer's entries until a failover commits them.
// It speaks one JSON line per fact on stdout: {ready, port}, {streaming}, {applied, at} when the receiver
// has applied <expected> entries (wall clock ms, same machine as the caller).
import { createInterface } from 'node:readline';
import { Writable } from 'node:stream';
import { ConntrackEvents, ConntrackHandle, entryKey, type ConntrackEntry } from '../../daemon/conntrack';
import { applySyncedEvents, Digests, encodeEventPayload, inBuckets, keyHash, SyncReceiver, SyncSender, sweepSyncedEntries, syncedDigests, upsertSyncedEntries } from '../../daemon/conntrack-sync';
import { ipToBytes } from '../../daemon/netlink/ip-bytes';
import { makeLogger, setLogger } from '../../daemon/log';

setLogger(makeLogger({ stream: new Writable({ write: (_c, _e, cb) => cb() }) }));
const say = (o: Record<string, unknown>) => process.stdout.write(JSON.stringify(o) + '\n');
const [role, keyHex, host, arg3, arg4] = process.argv.slice(2);
const key = Buffer.from(keyHex, 'hex');
const NS = '/proc/self/ns/net';

async function receiver(initial: number, memory: boolean): Promise<void> {
  let expected = initial;
  let applied = 0;
  const cache = new Map<string, ConntrackEntry>();
  // Memory: the count is of distinct entries held (a resync after an event overrun carries some again).
  let base = 0;
  // "expect <n>" on stdin starts a new count (after a warm-up burst).
  createInterface({ input: process.stdin }).on('line', (l) => {
    const m = /^expect (\d+)$/.exec(l.trim());
    if (!m) return;
    expected = Number(m[1]);
    applied = 0;
    base = cache.size;
    say({ expecting: expected });
  });
  const reached = () => {
    if (memory && applied >= 0) applied = cache.size - base;
    if (applied >= expected) {
      say({ applied, at: Date.now() });
      applied = -Infinity;
    }
  };
  const rx = new SyncReceiver({
    key, id: 'b', host, port: 0,
    apply: async (evs) => {
      if (memory) {
        for (const ev of evs) {
          if (ev.type === 'destroy') cache.delete(entryKey(ev.entry));
          else cache.set(entryKey(ev.entry), ev.entry);
        }
      } else await applySyncedEvents(NS, evs);
      applied += evs.length;
      reached();
    },
    // A transfer is applied as it streams (upsert), and swept at its end.
    upsert: async (entries) => {
      if (memory) for (const e of entries) cache.set(entryKey(e), e);
      else await upsertSyncedEntries(NS, entries);
      applied += entries.length;
      reached();
    },
    sweep: async (keep, buckets, from) => {
      if (!memory) return (await sweepSyncedEntries(NS, (e) => e.reply.dst === from.stream, keep, buckets)).deleted;
      for (const [k, e] of cache) {
        if (!inBuckets(buckets, e)) continue;
        const [hi, lo] = keyHash(e);
        if (!keep.has(hi, lo)) cache.delete(k);
      }
    },
    digests: async (k, from) => memory ? Digests.of(cache.values(), k) : (await syncedDigests(NS, (e) => e.reply.dst === from.stream, k)).digests,
  });
  say({ ready: true, port: await rx.listen() });
}

function sender(port: number, address: string): void {
  const snapshot = () => ConntrackHandle.with(NS, (h) => h.dump({ family: 4 })).filter((e) => e.reply.dst === address);
  const tx = new SyncSender({ key, id: 'a', host, port, stream: address, snapshot });
  const events = ConntrackEvents.open(NS);
  const scope = ipToBytes(address);
  events.on('raw', (type, payload) => {
    const ev = encodeEventPayload(type, payload, scope);
    if (ev) tx.push(ev);
  });
  events.on('overrun', () => tx.requestResync());
  tx.start();
  const t = setInterval(() => {
    if (tx.stats().state !== 'streaming') return;
    clearInterval(t);
    say({ streaming: true });
  }, 10);
}

process.on('SIGTERM', () => process.exit(0));
if (role === 'receiver') void receiver(Number(arg3), arg4 === 'memory');
else if (role === 'sender') sender(Number(arg3), arg4);
else {
  process.stderr.write(`unknown role ${role}\n`);
  process.exit(2);
}
