// Kernel tests of the ctnetlink library (root, real kernel, real traffic): a client and a server joined
// by two SNAT gateways A and B. The key test moves an established TCP connection (and a UDP flow) from A
// to B by inserting A's dumped entries into B, with TCP window tracking strict (be_liberal off); the
// negative control switches without inserting and must break. Namespaces are unique and always removed.
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import * as crypto from 'node:crypto';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { createInterface } from 'node:readline';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { ConntrackEvents, ConntrackHandle, IPS, type ConntrackEntry, type ConntrackEvent } from '../../daemon/conntrack';
import { IP_CT_TCP_FLAG, TCP_CONNTRACK } from '../../daemon/conntrack/constants';
import { NetlinkError } from '../../daemon/netlink';
import { applySyncedEvents, encodeEventPayload, replaceSyncedEntries } from '../../daemon/conntrack-sync';
import { Cursor, readEntry } from '../../daemon/conntrack-sync/entry-codec';
import { ipToBytes } from '../../lib/ip';

const FLOATING = '10.99.0.1';
const CLIENT = '10.0.0.2';
const SERVER = '10.9.0.1';
const TCP_PORT = 8080;
const UDP_PORT = 8053;

const namespaces: string[] = [];
const children: ChildProcess[] = [];
const closers: Array<() => unknown> = [];

test.after.each(async () => {
  for (const c of closers.splice(0).reverse()) {
    try { await c(); } catch { /* best effort */ }
  }
  for (const c of children.splice(0)) c.kill('SIGKILL');
  for (const ns of namespaces.splice(0)) {
    try { execFileSync('ip', ['netns', 'del', ns], { stdio: 'ignore' }); } catch { /* already gone */ }
  }
});

function netns(prefix: string, role: string): string {
  const name = `${prefix}-${role}`;
  execFileSync('ip', ['netns', 'add', name]);
  namespaces.push(name);
  execFileSync('ip', ['-n', name, 'link', 'set', 'lo', 'up']);
  return name;
}

function ip(ns: string, ...args: string[]): void {
  execFileSync('ip', ['-n', ns, ...args]);
}

function inNs(ns: string, cmd: string, ...args: string[]): string {
  return execFileSync('nsenter', [`--net=/run/netns/${ns}`, cmd, ...args], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
}

function nft(ns: string, ruleset: string): void {
  execFileSync('nsenter', [`--net=/run/netns/${ns}`, 'nft', '-f', '-'], { input: ruleset });
}

function sysctl(ns: string, key: string, value?: string): string {
  if (value !== undefined) inNs(ns, 'sh', '-c', `echo ${value} > /proc/sys/${key}`);
  return inNs(ns, 'cat', `/proc/sys/${key}`).trim();
}

function veth(a: string, aName: string, aAddr: string, b: string, bName: string, bAddr: string): void {
  ip(a, 'link', 'add', aName, 'type', 'veth', 'peer', 'name', bName, 'netns', b);
  ip(a, 'addr', 'add', aAddr, 'dev', aName);
  ip(b, 'addr', 'add', bAddr, 'dev', bName);
  ip(a, 'link', 'set', aName, 'up');
  ip(b, 'link', 'set', bName, 'up');
}

// A gateway: forwards only established/related flows and new ones from the client side, and SNATs to
// the floating address with a random port from a range outside the client's ephemeral ports, so a gateway
// without the entry picks a different port and the server sees a different connection.
function gatewayRules(ns: string): void {
  sysctl(ns, 'net/ipv4/ip_forward', '1');
  nft(ns, `
    table ip tct {
      chain gw_forward {
        type filter hook forward priority 0; policy drop;
        ct state invalid drop
        ct state established,related accept
        iifname "gc" ct state new accept
      }
      chain gw_snat {
        type nat hook postrouting priority 100; policy accept;
        oifname "gs" ip saddr ${CLIENT} meta l4proto { tcp, udp } snat to ${FLOATING}:20000-29999 random
      }
    }`);
}

interface Topology { c: string; a: string; b: string; s: string }

/**
 *   client C (10.0.0.2 on lo) ─ca/cb─ gateway A (gc 10.1.0.1, gs 10.3.0.1) ─ server S (10.9.0.1 on lo)
 *                              └──── gateway B (gc 10.2.0.1, gs 10.4.0.1) ─┘
 * The server only knows the floating address (routed to the active gateway), never the client.
 */
function topology(): Topology {
  const p = `tct-${crypto.randomBytes(3).toString('hex')}`;
  const t = { c: netns(p, 'c'), a: netns(p, 'a'), b: netns(p, 'b'), s: netns(p, 's') };
  ip(t.c, 'addr', 'add', `${CLIENT}/32`, 'dev', 'lo');
  ip(t.s, 'addr', 'add', `${SERVER}/32`, 'dev', 'lo');
  veth(t.c, 'ca', '10.1.0.2/24', t.a, 'gc', '10.1.0.1/24');
  veth(t.c, 'cb', '10.2.0.2/24', t.b, 'gc', '10.2.0.1/24');
  veth(t.s, 'sa', '10.3.0.2/24', t.a, 'gs', '10.3.0.1/24');
  veth(t.s, 'sb', '10.4.0.2/24', t.b, 'gs', '10.4.0.1/24');
  for (const [g, cSide, sSide] of [[t.a, '10.1.0.2', '10.3.0.2'], [t.b, '10.2.0.2', '10.4.0.2']]) {
    ip(g, 'route', 'add', `${CLIENT}/32`, 'via', cSide);
    ip(g, 'route', 'add', `${SERVER}/32`, 'via', sSide);
    gatewayRules(g);
  }
  ip(t.a, 'addr', 'add', `${FLOATING}/32`, 'dev', 'lo');
  ip(t.c, 'route', 'add', 'default', 'via', '10.1.0.1', 'src', CLIENT);
  ip(t.s, 'route', 'add', `${FLOATING}/32`, 'via', '10.3.0.1');
  return t;
}

/** Standby takeover: traffic crosses B from now on, A is cut off, the floating address moves to B. */
function switchToB(t: Topology): void {
  ip(t.a, 'link', 'set', 'gc', 'down');
  ip(t.a, 'link', 'set', 'gs', 'down');
  ip(t.a, 'addr', 'del', `${FLOATING}/32`, 'dev', 'lo');
  ip(t.b, 'addr', 'add', `${FLOATING}/32`, 'dev', 'lo');
  ip(t.c, 'route', 'replace', 'default', 'via', '10.2.0.1', 'src', CLIENT);
  ip(t.s, 'route', 'replace', `${FLOATING}/32`, 'via', '10.4.0.1');
}

/** A Node program in a namespace that speaks JSON lines on stdin/stdout. */
class Peer {
  private readonly proc: ChildProcess;
  private readonly lines: any[] = [];
  private waiters: Array<() => void> = [];

  constructor(ns: string, program: string, args: string[] = []) {
    this.proc = spawn('nsenter', [`--net=/run/netns/${ns}`, process.execPath, '-e', program, ...args], { stdio: ['pipe', 'pipe', 'inherit'] });
    children.push(this.proc);
    createInterface({ input: this.proc.stdout! }).on('line', (l) => {
      this.lines.push(JSON.parse(l));
      for (const w of this.waiters.splice(0)) w();
    });
  }

  send(cmd: object): void {
    this.proc.stdin!.write(`${JSON.stringify(cmd)}\n`);
  }

  /** The first line (seen before or arriving within ms) that matches, else undefined. */
  async waitFor(pred: (l: any) => boolean, ms: number): Promise<any> {
    const deadline = Date.now() + ms;
    for (;;) {
      const i = this.lines.findIndex(pred);
      if (i >= 0) return this.lines.splice(i, 1)[0];
      const left = deadline - Date.now();
      if (left <= 0) return undefined;
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, left);
        this.waiters.push(() => { clearTimeout(timer); resolve(); });
      });
    }
  }
}

// Echo server: TCP echoes bytes; UDP answers with the sender's address as the server saw it.
const SERVER_PROGRAM = `
const net = require('net'), dgram = require('dgram');
net.createServer((s) => { s.on('error', () => {}); s.pipe(s); }).listen(${TCP_PORT}, '${SERVER}', () => {
  const u = dgram.createSocket('udp4');
  u.on('message', (m, r) => u.send(JSON.stringify({ data: String(m), from: r.address + ':' + r.port }), r.port, r.address));
  u.bind(${UDP_PORT}, '${SERVER}', () => console.log(JSON.stringify({ ev: 'ready' })));
});`;

// Client: one TCP connection and one UDP socket; {tcp: n} sends n bytes and reports when n more came back.
const CLIENT_PROGRAM = `
const net = require('net'), dgram = require('dgram');
const out = (o) => console.log(JSON.stringify(o));
let received = 0, target = Infinity;
const s = net.connect({ host: '${SERVER}', port: ${TCP_PORT}, localAddress: '${CLIENT}' }, () => out({ ev: 'connected', port: s.localPort }));
s.on('data', (d) => { received += d.length; if (received >= target) { out({ ev: 'echoed', total: received }); target = Infinity; } });
s.on('error', (e) => out({ ev: 'error', code: e.code }));
s.on('close', () => out({ ev: 'closed' }));
const u = dgram.createSocket('udp4');
u.bind(0, '${CLIENT}', () => out({ ev: 'udp', port: u.address().port }));
u.on('message', (m) => out({ ev: 'uecho', ...JSON.parse(String(m)) }));
require('readline').createInterface({ input: process.stdin }).on('line', (l) => {
  const c = JSON.parse(l);
  if (c.tcp) { target = received + c.tcp; s.write(Buffer.alloc(c.tcp, 120)); }
  if (c.udp) u.send(c.udp, ${UDP_PORT}, '${SERVER}');
  if (c.end) s.end();
});`;

async function startFlows(t: Topology): Promise<{ client: Peer; tcpPort: number; udpPort: number; udpFrom: string }> {
  const server = new Peer(t.s, SERVER_PROGRAM);
  assert.ok(await server.waitFor((l) => l.ev === 'ready', 10_000), 'echo server started');
  const client = new Peer(t.c, CLIENT_PROGRAM);
  const conn = await client.waitFor((l) => l.ev === 'connected', 10_000);
  assert.ok(conn, 'TCP connection through A');
  const udp = await client.waitFor((l) => l.ev === 'udp', 5_000);
  client.send({ tcp: 100_000 });
  assert.ok(await client.waitFor((l) => l.ev === 'echoed', 10_000), 'TCP echo through A');
  client.send({ udp: 'one' });
  const u = await client.waitFor((l) => l.ev === 'uecho', 5_000);
  assert.ok(u, 'UDP echo through A');
  assert.match(u.from, new RegExp(`^${FLOATING.replace(/\./g, '\\.')}:`), 'the server sees the floating address');
  return { client, tcpPort: conn.port, udpPort: udp.port, udpFrom: u.from };
}

function open(ns: string): ConntrackHandle {
  const h = ConntrackHandle.open(`/run/netns/${ns}`);
  closers.push(() => h.close());
  return h;
}

function natFlows(h: ConntrackHandle): ConntrackEntry[] {
  return h.dump({ family: 4 }).filter((e) => e.status & IPS.SRC_NAT && e.orig.src === CLIENT);
}

test('SNATed TCP and UDP flows: dump shows the floating address and NAT bits; entries move to gateway B and the connection continues', async () => {
  const t = topology();
  assert.is(sysctl(t.b, 'net/netfilter/nf_conntrack_tcp_be_liberal'), '0', 'window tracking is strict');
  const { client, tcpPort, udpPort, udpFrom } = await startFlows(t);

  const a = open(t.a);
  const flows = natFlows(a);
  const tcp = flows.find((e) => e.orig.proto === 6 && e.orig.sport === tcpPort);
  const udp = flows.find((e) => e.orig.proto === 17 && e.orig.sport === udpPort);
  assert.ok(tcp && udp, `A's dump holds both flows: ${JSON.stringify(flows)}`);
  for (const e of [tcp!, udp!]) {
    assert.is(e.reply.dst, FLOATING);
    assert.is(e.reply.src, SERVER);
    assert.ok(e.reply.dport! >= 20000 && e.reply.dport! <= 29999, 'SNAT port from the range');
    assert.ok((e.status & (IPS.SRC_NAT | IPS.SRC_NAT_DONE | IPS.CONFIRMED | IPS.SEEN_REPLY)) === (IPS.SRC_NAT | IPS.SRC_NAT_DONE | IPS.CONFIRMED | IPS.SEEN_REPLY));
  }
  assert.is(tcp!.tcp?.state, TCP_CONNTRACK.ESTABLISHED);
  assert.ok(tcp!.tcp!.flagsOrig! & IP_CT_TCP_FLAG.WINDOW_SCALE, 'window scaling negotiated, so wscale must travel');
  assert.is(`${FLOATING}:${udp!.reply.dport}`, udpFrom);

  const b = open(t.b);
  const t0 = performance.now();
  const res = b.insertMany(flows);
  const ms = performance.now() - t0;
  assert.equal(res.failed.map((f) => f.error.message), []);
  assert.is(res.created, flows.length);
  const inB = b.get(tcp!.orig)!;
  assert.equal(inB.reply, tcp!.reply, 'same NAT mapping in B');
  assert.ok(inB.status & IPS.SRC_NAT && inB.status & IPS.SRC_NAT_DONE, 'NAT bits come from CTA_NAT_SRC');
  assert.is(inB.tcp?.state, TCP_CONNTRACK.ESTABLISHED);
  assert.not.ok((inB.tcp!.flagsOrig! | inB.tcp!.flagsReply!) & IP_CT_TCP_FLAG.BE_LIBERAL, 'not liberal: windows are really tracked');
  console.log(`  inserted ${flows.length} entries into B in ${ms.toFixed(1)} ms`);

  switchToB(t);
  client.send({ tcp: 300_000 });
  assert.ok(await client.waitFor((l) => l.ev === 'echoed', 10_000), 'TCP data after the switch is echoed through B');
  client.send({ udp: 'two' });
  const u = await client.waitFor((l) => l.ev === 'uecho', 5_000);
  assert.ok(u, 'UDP echo through B');
  assert.is(u.from, udpFrom, 'the server still sees the same floating address and port');
  assert.not.ok(await client.waitFor((l) => l.ev === 'error' || l.ev === 'closed', 200), 'connection never broke');
  const after = b.get(tcp!.orig)!;
  assert.is(after.tcp?.state, TCP_CONNTRACK.ESTABLISHED);
  assert.ok(after.id === inB.id, 'traffic used the inserted entry, not a new one');
});

test('negative control: switching to B without inserting the entries breaks the TCP connection', async () => {
  const t = topology();
  const { client } = await startFlows(t);
  switchToB(t);
  client.send({ tcp: 10_000 });
  const r = await client.waitFor((l) => l.ev === 'echoed' || l.ev === 'error' || l.ev === 'closed', 4_000);
  assert.ok(r === undefined || r.ev !== 'echoed', `no echo without the entries (got ${JSON.stringify(r)})`);
  console.log(`  without the entries: ${r ? r.ev + (r.code ? ' ' + r.code : '') : 'no answer within 4 s'}`);
});

function udpEntry(i: number, mark?: number): ConntrackEntry {
  return {
    orig: { family: 4, proto: 17, src: '10.0.0.2', dst: '192.0.2.1', sport: 1024 + (i % 60000), dport: 53 + Math.floor(i / 60000) },
    reply: { family: 4, proto: 17, src: '192.0.2.1', dst: FLOATING, sport: 53 + Math.floor(i / 60000), dport: 1024 + (i % 60000) },
    status: IPS.SEEN_REPLY, timeout: 600, mark,
  };
}

function ctNamespace(): string {
  const ns = netns(`tct-${crypto.randomBytes(3).toString('hex')}`, 'x');
  // Conntrack in a namespace tracks only while a rule there uses it; the nat chain makes NAT work.
  inNs(ns, 'nft', 'add table ip tct; add chain ip tct f { type filter hook forward priority 0; }; add rule ip tct f ct state established accept; add chain ip tct p { type nat hook postrouting priority 100; }');
  return ns;
}

test('insert of an existing entry is a clear EEXIST; update replaces; delete is idempotent; IPv6 and ICMP', () => {
  const h = open(ctNamespace());
  const e = { ...udpEntry(1, 5), orig: { ...udpEntry(1).orig, proto: 6 }, reply: { ...udpEntry(1).reply, proto: 6 }, status: IPS.SEEN_REPLY | IPS.ASSURED,
    tcp: { state: TCP_CONNTRACK.ESTABLISHED, wscaleOrig: 7, wscaleReply: 9, flagsOrig: 3, flagsReply: 3 } };
  assert.is(h.insert(e), 'created');
  try {
    h.insert(e);
    assert.unreachable('second insert must fail');
  } catch (err) {
    assert.instance(err, NetlinkError);
    assert.is((err as NetlinkError).errnoName, 'EEXIST');
    assert.is((err as Error).message, `IPCTNL_MSG_CT_NEW tcp 10.0.0.2:1025 → 192.0.2.1:53: EEXIST (File exists)`);
  }
  assert.is(h.insert({ ...e, mark: 6, timeout: 900 }, { update: true }), 'updated');
  let got = h.get(e.orig)!;
  assert.is(got.mark, 6);
  assert.ok(got.timeout! > 600);
  assert.equal(got.tcp, { state: 3, wscaleOrig: 7, wscaleReply: 9, flagsOrig: 3, flagsReply: 3 });
  // A different NAT mapping cannot be changed in place: update deletes and creates again.
  assert.is(h.insert({ ...e, reply: { ...e.reply, dport: 40000 } }, { update: true }), 'updated');
  got = h.get(e.orig)!;
  assert.is(got.reply.dport, 40000);
  assert.is(h.insert(udpEntry(2), { update: true }), 'created');

  const six: ConntrackEntry = {
    orig: { family: 6, proto: 6, src: 'fd00::2', dst: 'fd00:9::1', sport: 4000, dport: 443 },
    reply: { family: 6, proto: 6, src: 'fd00:9::1', dst: 'fd00:99::1', sport: 443, dport: 24000 },
    status: IPS.SEEN_REPLY | IPS.ASSURED, timeout: 300, tcp: { state: TCP_CONNTRACK.ESTABLISHED, flagsOrig: 0, flagsReply: 0 },
  };
  h.insert(six);
  const g6 = h.dump({ family: 6 });
  assert.is(g6.length, 1);
  assert.equal(g6[0].reply, six.reply);
  assert.ok(g6[0].status & IPS.SRC_NAT);
  const ping: ConntrackEntry = {
    orig: { family: 4, proto: 1, src: '10.0.0.2', dst: '192.0.2.1', icmpId: 99, icmpType: 8, icmpCode: 0 },
    reply: { family: 4, proto: 1, src: '192.0.2.1', dst: FLOATING, icmpId: 99, icmpType: 0, icmpCode: 0 },
    status: 0, timeout: 30,
  };
  h.insert(ping);
  assert.equal(h.get(ping.orig)!.reply, ping.reply);
  assert.match(inNs(h.nsPath!.split('/').pop()!, 'conntrack', '-L', '-p', 'icmp'), `dst=${FLOATING}`);

  assert.is(h.dump({ mark: { value: 5, mask: 0xff } }).length, 1, 'kernel mark filter (the re-created entry has mark 5 again)');
  assert.ok(h.delete(e.orig));
  assert.not.ok(h.delete(e.orig), 'deleting what is gone is not an error');
  assert.is(h.get(e.orig), undefined);
  h.flush();
  assert.is(h.dump().length, 0);
});

test('5,000 entries: batched insert and dump are quick; conntrack(8) agrees', () => {
  const ns = ctNamespace();
  const h = open(ns);
  const entries = Array.from({ length: 5000 }, (_, i) => udpEntry(i, i % 2));
  let t0 = performance.now();
  const res = h.insertMany(entries);
  const insertMs = performance.now() - t0;
  assert.is(res.created, 5000);
  assert.is(res.failed.length, 0);
  t0 = performance.now();
  const all = h.dump();
  const dumpMs = performance.now() - t0;
  assert.is(all.length, 5000);
  assert.is(h.dump({ mark: { value: 1, mask: 1 } }).length, 2500);
  const again = h.insertMany(entries.slice(0, 300));
  assert.is(again.failed.length, 300, 'every duplicate in a batch is reported');
  assert.ok(again.failed.every((f) => f.error.errnoName === 'EEXIST'));
  assert.is(h.insertMany(entries.slice(0, 300), { update: true }).updated, 300);
  const count = inNs(ns, 'conntrack', '-C').trim();
  assert.is(count, '5000');
  console.log(`  insertMany 5000: ${insertMs.toFixed(0)} ms (${Math.round(5000 / insertMs * 1000)}/s); dump 5000: ${dumpMs.toFixed(0)} ms (load ${os.loadavg()[0].toFixed(1)})`);
  assert.ok(dumpMs < 2000 && insertMs < 4000, 'quick even on a loaded machine');
});

test('synced events in batches: new/update/destroy in order, create↔update fallbacks, a status bit that cannot be cleared', async () => {
  const ns = ctNamespace();
  const h = open(ns);
  h.insertMany([udpEntry(1), udpEntry(2)]);
  const events: ConntrackEvent[] = [
    { type: 'new', entry: { ...udpEntry(1), timeout: 900, mark: 7 } }, // exists: becomes an update
    { type: 'update', entry: udpEntry(3) }, // missing: becomes a create
    { type: 'destroy', entry: udpEntry(2) },
    { type: 'destroy', entry: udpEntry(4) }, // never there: fine
    { type: 'new', entry: udpEntry(5) },
    { type: 'destroy', entry: udpEntry(5) },
    { type: 'new', entry: { ...udpEntry(5), mark: 9 } }, // destroy then new under one key keeps the order
    // SEEN_REPLY cannot be cleared in place (EBUSY): falls back to replace (delete + create).
    { type: 'update', entry: { ...udpEntry(1), status: 0, mark: 8 } },
  ];
  const r = await applySyncedEvents(`/run/netns/${ns}`, events);
  assert.equal(r.failed.map((f) => f.error.message), []);
  const byPort = new Map(h.dump().map((e) => [e.orig.sport, e]));
  assert.equal([...byPort.keys()].sort(), [1025, 1027, 1029]);
  assert.is(byPort.get(1025)!.mark, 8);
  assert.is(byPort.get(1029)!.mark, 9);
  assert.is(r.deleted, 2);

  // A full resync of the scope: entry 1 re-mapped, 3 gone, 6 added; an out-of-scope entry untouched.
  const other = { ...udpEntry(7), reply: { ...udpEntry(7).reply, dst: '10.99.0.2' } };
  h.insert(other);
  const want = [{ ...udpEntry(1), reply: { ...udpEntry(1).reply, dport: 40001 } }, udpEntry(5), udpEntry(6)];
  const rr = await replaceSyncedEntries(`/run/netns/${ns}`, want, (e) => e.reply.dst === FLOATING);
  assert.equal(rr.failed, []);
  const after = h.dump();
  assert.equal(after.filter((e) => e.reply.dst === FLOATING).map((e) => e.orig.sport).sort(), [1025, 1029, 1030]);
  assert.is(after.find((e) => e.orig.sport === 1025)!.reply.dport, 40001, 'a changed NAT mapping is deleted and created again');
  assert.ok(after.some((e) => e.reply.dst === '10.99.0.2'), 'out of scope stays');
  assert.is(rr.deleted, 2);
});

test('a 20,000-entry resync into a populated table yields to the event loop and leaves it exact', async () => {
  const ns = ctNamespace();
  const h = open(ns);
  h.insertMany(Array.from({ length: 10000 }, (_, i) => udpEntry(i)));
  const want = Array.from({ length: 20000 }, (_, i) => udpEntry(i + 5000, 3));
  let turns = 0;
  const ticker = setInterval(() => turns++, 5);
  const t0 = performance.now();
  const r = await replaceSyncedEntries(`/run/netns/${ns}`, want, (e) => e.reply.dst === FLOATING);
  const ms = performance.now() - t0;
  clearInterval(ticker);
  assert.equal([r.created, r.updated, r.deleted, r.failed.length], [15000, 5000, 5000, 0]);
  const all = h.dump();
  assert.is(all.length, 20000);
  assert.ok(all.every((e) => e.mark === 3));
  assert.ok(turns >= 3, `the event loop ran ${turns} times during ${ms.toFixed(0)} ms`);
  console.log(`  resync 20000 over 10000: ${ms.toFixed(0)} ms (${Math.round(20000 / ms * 1000)}/s), event-loop turns ${turns}`);
});

function eventsOf(ev: ConntrackEvents): ConntrackEvent[] {
  const seen: ConntrackEvent[] = [];
  ev.on('event', (e) => seen.push(e));
  return seen;
}

async function until(pred: () => boolean, ms: number): Promise<boolean> {
  const deadline = Date.now() + ms;
  while (!pred()) {
    if (Date.now() > deadline) return false;
    await new Promise((r) => setTimeout(r, 50));
  }
  return true;
}

test('events: new, update and destroy of a real flow, received off the event loop; close is bounded', async () => {
  const t = topology();
  // Short TIME_WAIT/CLOSE so the closed flow's entry expires (and its destroy event comes) within the test.
  sysctl(t.a, 'net/netfilter/nf_conntrack_tcp_timeout_time_wait', '1');
  sysctl(t.a, 'net/netfilter/nf_conntrack_tcp_timeout_close', '1');
  const ev = ConntrackEvents.open(`/run/netns/${t.a}`);
  closers.push(() => ev.close());
  const seen = eventsOf(ev);
  // The sync sender's fast path sees the same events undecoded: its encoding must match the decoded one.
  const encoded: Array<{ type: string; bytes: Buffer }> = [];
  ev.on('raw', (type, payload) => {
    const e = encodeEventPayload(type, payload, ipToBytes(FLOATING));
    if (e) encoded.push({ type, bytes: e.bytes });
  });
  // The event loop stays free while the worker blocks in recv.
  let maxLag = 0;
  let last = performance.now();
  const tick = setInterval(() => { const now = performance.now(); maxLag = Math.max(maxLag, now - last - 20); last = now; }, 20);
  try {
    const { client, tcpPort } = await startFlows(t);
    const mine = (type: string) => seen.some((e) => e.type === type && e.entry.orig.proto === 6 && e.entry.orig.sport === tcpPort);
    assert.ok(await until(() => mine('new') && mine('update'), 5_000), 'new and update events');
    const created = seen.find((e) => e.type === 'new' && e.entry.orig.sport === tcpPort)!;
    assert.is(created.entry.orig.dst, SERVER);
    assert.is(created.entry.reply.dst, FLOATING, 'the new event already carries the NAT mapping');
    client.send({ end: true });
    assert.ok(await client.waitFor((l) => l.ev === 'closed', 5_000));
    // An expired entry is removed by the kernel's gc, which may sleep up to a minute; a dump evicts
    // expired entries at once (as conntrack sync's periodic resync would), so poll with dumps.
    const a = open(t.a);
    assert.ok(await until(() => { a.dump(); return mine('destroy'); }, 15_000), 'destroy event after close');
  } finally {
    clearInterval(tick);
  }
  assert.ok(maxLag < 500, `event loop never blocked (max lag ${maxLag.toFixed(0)} ms)`);
  const natted = seen.filter((e) => e.entry.reply.dst === FLOATING);
  assert.is(encoded.length, natted.length, 'the fast path saw every event of the floating address');
  natted.forEach((e, i) => {
    assert.is(encoded[i].type, e.type);
    assert.equal(readEntry(new Cursor(encoded[i].bytes)), e.entry);
  });
  const t0 = performance.now();
  await ev.close();
  await ev.close();
  assert.ok(performance.now() - t0 < 2_000, 'close returns within about the receive timeout');
});

test('events: a burst larger than a tiny receive buffer is reported as overrun, then events flow again', async () => {
  const ns = ctNamespace();
  const ev = ConntrackEvents.open(`/run/netns/${ns}`, { rcvBufBytes: 4096, types: ['new'] });
  closers.push(() => ev.close());
  const seen = eventsOf(ev);
  const overruns: string[] = [];
  ev.on('overrun', (o) => overruns.push(o.reason));
  const h = open(ns);
  h.insertMany(Array.from({ length: 3000 }, (_, i) => udpEntry(i)));
  assert.ok(await until(() => overruns.length > 0, 5_000), 'ENOBUFS surfaced as overrun');
  assert.ok(seen.length < 3000, 'some events were really lost');
  await new Promise((r) => setTimeout(r, 300));
  const before = seen.length;
  h.insert(udpEntry(4000));
  assert.ok(await until(() => seen.length > before, 5_000), 'events still arrive after an overrun');
});

test('events work from an esbuild CommonJS bundle run by plain node (the tetherd executable\'s path)', () => {
  const ns = ctNamespace();
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tct-bundle-'));
  closers.push(() => fs.rmSync(dir, { recursive: true, force: true }));
  const entry = path.join(dir, 'entry.ts');
  const lib = path.resolve(__dirname, '../../daemon/conntrack');
  fs.writeFileSync(entry, `
import { ConntrackEvents, ConntrackHandle } from ${JSON.stringify(lib)};
const ns = process.argv[2];
const ev = ConntrackEvents.open(ns);
ev.on('event', async (e) => { console.log(JSON.stringify(e)); await ev.close(); });
const h = ConntrackHandle.open(ns);
h.insert({ orig: { family: 4, proto: 17, src: '10.0.0.2', dst: '192.0.2.1', sport: 7, dport: 7 },
  reply: { family: 4, proto: 17, src: '192.0.2.1', dst: '10.0.0.2', sport: 7, dport: 7 }, status: 0, timeout: 30 });
h.close();
setTimeout(() => { console.log('timeout'); process.exit(1); }, 5000).unref();
`);
  const root = path.resolve(__dirname, '../..');
  execFileSync(path.join(root, 'node_modules/.bin/esbuild'), [entry, '--bundle', '--platform=node', '--target=node20', '--format=cjs', '--minify',
    '--external:koffi', `--outfile=${dir}/bundle.js`, '--log-level=warning']);
  // koffi stays external as in install/build.sh; resolve it from the repository.
  const out = execFileSync(process.execPath, [`${dir}/bundle.js`, `/run/netns/${ns}`], { encoding: 'utf8', env: { ...process.env, NODE_PATH: path.join(root, 'node_modules') }, timeout: 10_000 });
  const e = JSON.parse(out.trim().split('\n')[0]);
  assert.is(e.type, 'new');
  assert.is(e.entry.orig.sport, 7);
});

test.run();
