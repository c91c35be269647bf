// The load balancer datapath (bpf/lb.bpf.c through daemon/bpf/lb.ts) on the real kernel. Topology, each a
// namespace:
//   client ── router ── lbnode ── lbpod        client 10.92.1.2-.20, lbnode 10.92.2.2, lbpod 10.92.20.2
//               ├── t1 (10.92.3.2)             targets hold the VIP on lo and decapsulate FoU from the
//               └── t2 (10.92.4.2)             LB node's address only
// The router sends the VIP to the LB node, which routes it to its LB pod; the program there picks the
// client's target and sends the packet back out encapsulated (outer source: the node's address). Targets
// answer the client directly (DSR).
// IPv6 on the same namespaces: client fd92:1::2.., lbnode fd92:2::2, lbpod fd92:20::2, t1 fd92:3::2, t2
// fd92:4::2, VIP fd92:100::10 (slot 1): FoU in outer IPv6 from the node's IPv6 address to the target's.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { execFileSync, spawn } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { LB_HASH_SEED, LbDatapath } from '../../daemon/bpf/lb';
import { attachFouDecap, type FouDecap } from '../../daemon/bpf/fou';
import { ensureBpffs } from '../../daemon/bpf/bpffs';
import { LB_F_PER_FLOW, LB_F_QUIET, PROTO, lbHash } from '../../daemon/bpf/lb-structs';
import { maglevTable, pickOf } from '../../daemon/lb/maglev';
import { addNetns, delNetns, uniqueName } from '../lib/netns';
import { waitFor } from '../lib/wait';
import { lbConnect, type LbAnswer } from '../lib/lb-client';
import { ipToBytes } from '../../lib/ip';

const root = path.resolve(__dirname, '../..');
const VIP = '10.92.100.10';
const NODE = '10.92.2.2';
const LBPOD = '10.92.20.2';
const T1 = '10.92.3.2';
const T2 = '10.92.4.2';
const PORT = 8080;
const FOU_PORT = 5556;
const M = 251; // a small prime keeps the test's table writes short; the default size is covered by the bench
const clients = Array.from({ length: 12 }, (_, i) => `10.92.1.${i + 2}`);
const VIP6 = 'fd92:100::10';
const NODE6 = 'fd92:2::2';
const LBPOD6 = 'fd92:20::2';
const T1_6 = 'fd92:3::2';
const T2_6 = 'fd92:4::2';
const SLOT6 = 1;
const clients6 = Array.from({ length: 12 }, (_, i) => `fd92:1::${(i + 2).toString(16)}`);

const sh = (cmd: string, ...args: string[]) => execFileSync(cmd, args, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
const inNs = (ns: string, ...cmd: string[]) => sh('nsenter', `--net=/run/netns/${ns}`, ...cmd);

interface Bed {
  client: string; router: string; lbnode: string; lbpod: string; t1: string; t2: string;
  pinDir: string;
  lb?: LbDatapath;
  decaps: FouDecap[];
  servers: Array<ReturnType<typeof spawn>>;
}

let bed: Bed;

// Target server: answers each connection with "<name> <peer>\n" after the first line; "big" gets 400 KB first.
const SERVER_JS = `
const net = require('net');
const name = process.argv[1];
const serve = (s) => {
  s.on('error', () => {});
  s.once('data', (d) => {
    if (String(d).startsWith('up')) {
      // An upload: count bytes until the client half-closes, then answer with the count.
      let n = d.length - 3;
      s.on('data', (x) => (n += x.length));
      s.on('end', () => s.end(name + ' ' + n + '\\n'));
      return;
    }
    if (String(d).startsWith('big')) s.write(Buffer.alloc(400 * 1024, 120));
    s.end(name + ' ' + s.remoteAddress + '\\n');
  });
};
net.createServer({ allowHalfOpen: true }, serve).listen(Number(process.argv[2]), '0.0.0.0', () => console.log('listening'));
net.createServer({ allowHalfOpen: true }, serve).listen({ port: Number(process.argv[2]), host: '::', ipv6Only: true });
`;


type Answer = LbAnswer;

function connect(srcs: string[], opts: { port?: number; req?: string; timeoutMs?: number } = {}): Answer[] {
  return lbConnect(bed.client, VIP, opts.port ?? PORT, srcs, opts);
}

function build(): Bed {
  const b: Bed = {
    client: uniqueName('tlb-client'), router: uniqueName('tlb-router'), lbnode: uniqueName('tlb-node'), lbpod: uniqueName('tlb-pod'),
    t1: uniqueName('tlb-t1'), t2: uniqueName('tlb-t2'), pinDir: `/sys/fs/bpf/tether-test/${uniqueName('lb')}`, decaps: [], servers: [],
  };
  bed = b;
  for (const ns of [b.client, b.router, b.lbnode, b.lbpod, b.t1, b.t2]) addNetns(ns);
  for (const ns of [b.router, b.lbnode]) {
    for (const k of ['net.ipv6.conf.all.forwarding=1', 'net.ipv4.ip_forward=1', 'net.ipv4.conf.all.rp_filter=0', 'net.ipv4.conf.default.rp_filter=0', 'net.ipv4.conf.all.send_redirects=0']) inNs(ns, 'sysctl', '-qw', k);
  }
  const link = (ns: string, ifName: string, addr: string, routerIf: string, routerAddr: string, addr6: string, routerAddr6: string) => {
    sh('ip', '-n', b.router, 'link', 'add', routerIf, 'type', 'veth', 'peer', 'name', ifName, 'netns', ns);
    sh('ip', '-n', b.router, 'addr', 'add', `${routerAddr}/24`, 'dev', routerIf);
    sh('ip', '-n', b.router, 'addr', 'add', `${routerAddr6}/64`, 'dev', routerIf, 'nodad');
    sh('ip', '-n', b.router, 'link', 'set', routerIf, 'up');
    sh('ip', '-n', ns, 'addr', 'add', `${addr}/24`, 'dev', ifName);
    sh('ip', '-n', ns, 'addr', 'add', `${addr6}/64`, 'dev', ifName, 'nodad');
    sh('ip', '-n', ns, 'link', 'set', ifName, 'up');
    sh('ip', '-n', ns, 'route', 'add', 'default', 'via', routerAddr);
    sh('ip', '-n', ns, '-6', 'route', 'add', 'default', 'via', routerAddr6);
  };
  link(b.client, 'c0', clients[0], 'rc', '10.92.1.1', clients6[0], 'fd92:1::1');
  for (const c of clients.slice(1)) sh('ip', '-n', b.client, 'addr', 'add', `${c}/24`, 'dev', 'c0');
  for (const c of clients6.slice(1)) sh('ip', '-n', b.client, 'addr', 'add', `${c}/64`, 'dev', 'c0', 'nodad');
  link(b.lbnode, 'n0', NODE, 'rn', '10.92.2.1', NODE6, 'fd92:2::1');
  link(b.t1, 'eth0', T1, 'r1', '10.92.3.1', T1_6, 'fd92:3::1');
  link(b.t2, 'eth0', T2, 'r2', '10.92.4.1', T2_6, 'fd92:4::1');
  sh('ip', '-n', b.router, 'route', 'add', `${VIP}/32`, 'via', NODE);
  sh('ip', '-n', b.router, '-6', 'route', 'add', `${VIP6}/128`, 'via', NODE6);

  // The LB pod as ptp wires one: a veth whose host side holds the gateway address, a /32 route to the pod.
  sh('ip', '-n', b.lbnode, 'link', 'add', 'lbv', 'type', 'veth', 'peer', 'name', 'eth0', 'netns', b.lbpod);
  sh('ip', '-n', b.lbnode, 'addr', 'add', '10.92.20.1/32', 'dev', 'lbv');
  sh('ip', '-n', b.lbnode, 'link', 'set', 'lbv', 'up');
  sh('ip', '-n', b.lbnode, 'route', 'add', `${LBPOD}/32`, 'dev', 'lbv');
  sh('ip', '-n', b.lbpod, 'addr', 'add', `${LBPOD}/32`, 'dev', 'eth0');
  sh('ip', '-n', b.lbpod, 'link', 'set', 'eth0', 'up');
  sh('ip', '-n', b.lbpod, 'route', 'add', '10.92.20.1/32', 'dev', 'eth0');
  sh('ip', '-n', b.lbpod, 'route', 'add', 'default', 'via', '10.92.20.1', 'dev', 'eth0');
  sh('ip', '-n', b.lbnode, 'addr', 'add', 'fd92:20::1/128', 'dev', 'lbv', 'nodad');
  sh('ip', '-n', b.lbnode, '-6', 'route', 'add', `${LBPOD6}/128`, 'dev', 'lbv');
  sh('ip', '-n', b.lbpod, 'addr', 'add', `${LBPOD6}/128`, 'dev', 'eth0', 'nodad');
  sh('ip', '-n', b.lbpod, '-6', 'route', 'add', 'fd92:20::1/128', 'dev', 'eth0');
  sh('ip', '-n', b.lbpod, '-6', 'route', 'add', 'default', 'via', 'fd92:20::1', 'dev', 'eth0');
  // What tetherd does for an LB pod: the VIP routed to it, and the node accepting its own address as the
  // source of what the pod sends back (the encapsulated packets).
  sh('ip', '-n', b.lbnode, 'route', 'add', `${VIP}/32`, 'via', LBPOD, 'dev', 'lbv', 'onlink');
  inNs(b.lbnode, 'sysctl', '-qw', 'net.ipv4.conf.lbv.accept_local=1', 'net.ipv4.conf.lbv.rp_filter=0');
  sh('ip', '-n', b.lbnode, '-6', 'route', 'add', `${VIP6}/128`, 'via', LBPOD6, 'dev', 'lbv');

  ensureBpffs(b.pinDir);
  for (const [ns, name, addr, addr6] of [[b.t1, 't1', T1, T1_6], [b.t2, 't2', T2, T2_6]] as const) {
    sh('ip', '-n', ns, 'addr', 'add', `${VIP}/32`, 'dev', 'lo');
    sh('ip', '-n', ns, 'addr', 'add', `${VIP6}/128`, 'dev', 'lo', 'nodad');
    for (const k of ['all', 'eth0']) inNs(ns, 'sysctl', '-qw', `net.ipv4.conf.${k}.arp_ignore=1`, `net.ipv4.conf.${k}.arp_announce=2`);
    sh('ip', '-n', ns, 'link', 'set', 'eth0', 'mtu', '1472');
    // IPv6 in FoU over outer IPv6 has 48 bytes less (not 28): the target's IPv6 MTU, and so its MSS, says so
    // (set after the link's, which resets it).
    inNs(ns, 'sysctl', '-qw', 'net.ipv6.conf.eth0.mtu=1452');
    // Decapsulated before the target, at the egress of the link into it (as tetherd does on a target
    // pod's host-side veth): the 1500-byte encapsulated frame never meets the target's 1472-byte MTU.
    b.decaps.push(attachFouDecap({
      netns: `/run/netns/${b.router}`, ifName: name === 't1' ? 'r1' : 'r2', direction: 'egress', port: FOU_PORT, localAddress: addr, localAddress6: addr6, allowedSources: [NODE, NODE6],
    }));
    const srv = spawn('nsenter', [`--net=/run/netns/${ns}`, process.execPath, '-e', SERVER_JS, name, String(PORT)], { stdio: ['ignore', 'pipe', 'ignore'] });
    b.servers.push(srv);
  }
  b.lb = LbDatapath.load({ pinDir: b.pinDir, maxVips: 4, maglevSize: M });
  b.lb.configure(NODE, FOU_PORT, NODE6);
  b.lb.attach(`/run/netns/${b.lbpod}`, 'eth0');
  return b;
}

function setTargets(targets: string[], terminating: string[] = []): void {
  const lb = bed.lb!;
  lb.setTargets(VIP, new Map([...targets.map((t) => [t, 'active'] as const), ...terminating.map((t) => [t, 'terminating'] as const)]));
  const mg = maglevTable(targets, M);
  lb.setMaglevRow(0, mg.table, mg.targets);
}

const whoIs = (target: string) => (target === T1 || target === T1_6 ? 't1' : 't2');

/** The IPv6 VIP's targets and Maglev row (slot SLOT6); targets listed in address order, as maglevTable orders IPv4 ones. */
function setTargets6(targets: string[], terminating: string[] = []): void {
  const lb = bed.lb!;
  lb.setTargets(VIP6, new Map([...targets.map((t) => [t, 'active'] as const), ...terminating.map((t) => [t, 'terminating'] as const)]));
  const mg = maglevTable(targets, M);
  lb.setMaglevRow(SLOT6, mg.table, mg.targets);
}

function connect6(srcs: string[], opts: { port?: number; req?: string; timeoutMs?: number } = {}): Answer[] {
  return lbConnect(bed.client, VIP6, opts.port ?? PORT, srcs, opts);
}

test.before(async () => {
  if (!fs.existsSync(path.join(root, 'dist/bpf/lb.bpf.o'))) execFileSync('bash', [path.join(root, 'bpf/build.sh')], { stdio: 'inherit' });
  build();
  bed.lb!.setService(VIP, 0, [{ port: PORT, proto: PROTO.TCP }], 0);
  setTargets([T1, T2]);
  bed.lb!.setService(VIP6, SLOT6, [{ port: PORT, proto: PROTO.TCP }, { port: 9000, proto: PROTO.UDP }], 0);
  setTargets6([T1_6, T2_6]);
  // Servers are up once both answer on their own addresses.
  await waitFor(() => {
    try {
      inNs(bed.client, 'bash', '-c', `exec 3<>/dev/tcp/${T1}/${PORT} && exec 4<>/dev/tcp/${T2}/${PORT}`);
      return true;
    } catch {
      return false;
    }
  }, 'target servers listening', { timeoutMs: 10000, intervalMs: 100 });
});

test.after(() => {
  if (!bed) return;
  for (const s of bed.servers) s.kill('SIGKILL');
  try {
    bed.lb?.close({ unpin: true });
  } catch {
    // namespaces go next
  }
  for (const d of bed.decaps) {
    try {
      d.detach();
    } catch {
      // ditto
    }
  }
  delNetns(bed.client, bed.router, bed.lbnode, bed.lbpod, bed.t1, bed.t2);
  fs.rmSync(bed.pinDir, { recursive: true, force: true });
});

test('each client sticks to one target, targets see the client, new mappings are recorded and reported', () => {
  const events: Array<{ client: string; target: string }> = [];
  bed.lb!.onEvents((e) => events.push({ client: e.key.client, target: e.target }));
  const first = connect(clients);
  const second = connect(clients);
  for (const a of [...first, ...second]) {
    assert.ok(a.ok, `connection from ${a.src}: ${a.error}`);
    assert.is(a.peer, a.src, 'the target saw the real client address');
  }
  const byClient = new Map(first.map((a) => [a.src, a.who]));
  for (const a of second) assert.is(a.who, byClient.get(a.src), `client ${a.src} went to the same target twice`);
  const used = new Set(first.map((a) => a.who));
  assert.equal([...used].sort(), ['t1', 't2'], `12 clients spread over both targets (got ${[...used]})`);

  const maps = bed.lb!.mappings();
  assert.is(maps.length, clients.length, 'one mapping per client (client affinity)');
  for (const m of maps) {
    assert.is(m.vport, 0);
    assert.is(whoIs(m.target), byClient.get(m.client), `mapping of ${m.client} names the target that answered`);
  }
  bed.lb!.pollEvents();
  assert.is(events.length, clients.length, 'each new mapping reported once on the ring buffer');
  for (const e of events) assert.is(whoIs(e.target), byClient.get(e.client));
  const st = bed.lb!.stats(0);
  assert.is(st.misses, BigInt(clients.length));
  assert.ok(st.packets > 0n && st.dropError === 0n && st.reportLost === 0n, JSON.stringify(st, (_k, v) => (typeof v === 'bigint' ? String(v) : v)));
});

test('quiet (record on change): new picks are kept in the map and not reported; tetherd computes the same pick the program made', () => {
  const events: string[] = [];
  const table = maglevTable([T1, T2], M);
  try {
    for (const flags of [LB_F_QUIET, LB_F_PER_FLOW | LB_F_QUIET]) {
      bed.lb!.deleteMappings(() => true);
      bed.lb!.setService(VIP, 0, [{ port: PORT, proto: PROTO.TCP }], 0);
      bed.lb!.setServiceFlags(VIP, flags);
      bed.lb!.onEvents((e) => events.push(e.key.client));
      const answers = connect(clients);
      for (const a of answers) assert.ok(a.ok, `${a.src}: ${a.error}`);
      bed.lb!.pollEvents();
      const maps = bed.lb!.mappings();
      assert.is(maps.length, clients.length, `one local mapping per new client (flags ${flags})`);
      assert.equal(events, [], 'nothing reported on the ring buffer');
      const byClient = new Map(answers.map((a) => [a.src, a.who]));
      for (const m of maps) {
        assert.is(m.vport !== 0, (flags & LB_F_PER_FLOW) !== 0, 'the key is the tuple exactly when per flow');
        assert.is(pickOf(table, m, LB_HASH_SEED), m.target, `tetherd's pick for ${m.client}:${m.cport} is the program's`);
        assert.is(whoIs(m.target), byClient.get(m.client), 'and the target that answered');
      }
    }
  } finally {
    bed.lb!.onEvents(() => undefined);
    bed.lb!.setServiceFlags(VIP, 0);
    bed.lb!.deleteMappings(() => true);
  }
});

test('an installed mapping (from the store) decides over the Maglev table', () => {
  const c = '10.92.1.13';
  const other = '10.92.1.12';
  const natural = connect([c])[0].who; // the mapping Maglev chose
  const forced = natural === 't1' ? T2 : T1;
  bed.lb!.installMappings([{ key: { vip: VIP, client: c, vport: 0, cport: 0, proto: 0 }, target: forced }]);
  const after = connect([c, c, c]);
  for (const a of after) assert.is(a.who, whoIs(forced), 'the installed mapping is followed');
  assert.ok(connect([other])[0].ok);
});

test('a removed target voids its mappings: its clients move, the others stay', () => {
  const before = new Map(connect(clients).map((a) => [a.src, a.who]));
  setTargets([T2]);
  const after = connect(clients);
  for (const a of after) {
    assert.ok(a.ok, `${a.src}: ${a.error}`);
    assert.is(a.who, 't2', `${a.src} now on the remaining target`);
  }
  // Those that were on t2 never moved (same mapping); those on t1 were re-picked and recorded anew.
  const maps = new Map(bed.lb!.mappings().map((m) => [m.client, m.target]));
  for (const c of clients) assert.is(maps.get(c), T2);
  assert.ok([...before.values()].includes('t1'), 'some clients were on t1 before');
  setTargets([T1, T2], []);
});

test('a terminating target keeps its clients; new clients go to active targets only', () => {
  const onT1 = clients.slice(0, 4);
  bed.lb!.installMappings(onT1.map((client) => ({ key: { vip: VIP, client, vport: 0, cport: 0, proto: 0 }, target: T1 })));
  const fresh = Array.from({ length: 6 }, (_, i) => `10.92.1.${30 + i}`);
  for (const f of fresh) sh('ip', '-n', bed.client, 'addr', 'add', `${f}/24`, 'dev', 'c0');
  setTargets([T2], [T1]);
  for (const a of connect(onT1)) assert.is(a.who, 't1', `${a.src} stays on the terminating target`);
  for (const a of connect(fresh)) assert.is(a.who, 't2', `new client ${a.src} goes to an active target`);
  setTargets([T1, T2]);
});

test('replies bypass the LB pod (DSR): a 400 KB download passes ~no reply bytes through it', () => {
  const before = bed.lb!.stats(0);
  const a = connect([clients[0]], { req: 'big', timeoutMs: 10000 })[0];
  assert.ok(a.ok, a.error);
  assert.ok((a.bytes ?? 0) > 400 * 1024, `downloaded ${a.bytes}`);
  const after = bed.lb!.stats(0);
  const through = Number(after.bytes - before.bytes);
  assert.ok(through < 40 * 1024, `only client-to-target bytes pass the LB pod (${through} B for a 400 KB download)`);
});

test('a port the VIP does not serve is dropped and counted', () => {
  const before = bed.lb!.stats(0).dropNoPort;
  const a = connect([clients[0]], { port: 9999, timeoutMs: 1500 })[0];
  assert.not.ok(a.ok, 'no answer on an unserved port');
  assert.ok(bed.lb!.stats(0).dropNoPort > before);
});

test('a path MTU drop behind the target: the ICMP error reaches the target holding the flow', () => {
  // The router's link to the client shrinks: the target's full-size replies now need fragmenting, and the
  // router's "fragmentation needed" goes to the VIP, i.e. to the LB node.
  sh('ip', '-n', bed.router, 'link', 'set', 'rc', 'mtu', '1100');
  try {
    const before = bed.lb!.stats(0).icmpForwarded;
    const a = connect([clients[1]], { req: 'big', timeoutMs: 15000 })[0];
    assert.ok(a.ok, `download through the smaller MTU: ${a.error}`);
    assert.ok((a.bytes ?? 0) > 400 * 1024);
    assert.ok(bed.lb!.stats(0).icmpForwarded > before, 'the LB pod forwarded the ICMP error');
  } finally {
    sh('ip', '-n', bed.router, 'link', 'set', 'rc', 'mtu', '1500');
  }
});

test('no active target: new clients are dropped and counted', () => {
  setTargets([]);
  try {
    const before = bed.lb!.stats(0).dropNoTarget;
    const a = connect(['10.92.1.35'], { timeoutMs: 1500 })[0];
    assert.not.ok(a.ok);
    assert.ok(bed.lb!.stats(0).dropNoTarget > before);
  } finally {
    setTargets([T1, T2]);
  }
});

const UPLOAD_JS = `
const net = require('net');
const [host, port, mb] = process.argv.slice(1);
const s = net.connect({ host, port: Number(port), allowHalfOpen: true });
let got = '';
const t = setTimeout(() => { console.log(JSON.stringify({ error: 'timeout' })); process.exit(1); }, 30000);
s.on('connect', () => { s.write('up\\n'); s.end(Buffer.alloc(Number(mb) * 1024 * 1024, 7)); });
s.on('data', (d) => (got += d));
s.on('end', () => { clearTimeout(t); console.log(JSON.stringify({ answer: got.trim() })); process.exit(0); });
s.on('error', (e) => { console.log(JSON.stringify({ error: e.code })); process.exit(1); });`;

test('uploads through the LB pod (GSO super-packets encapsulated): 3 x 16 MB arrive whole', () => {
  for (let i = 0; i < 3; i++) {
    const out = inNs(bed.client, process.execPath, '-e', UPLOAD_JS, VIP, String(PORT), '16');
    const r = JSON.parse(out.trim().split('\n').pop()!);
    assert.ok(r.answer, `upload ${i + 1}: ${out}`);
    assert.is(Number(r.answer.split(' ')[1]), 16 * 1024 * 1024, `upload ${i + 1} byte count`);
  }
});

// ---- IPv6 VIP -----------------------------------------------------------------------------------------

const mappings6 = () => bed.lb!.mappings().filter((m) => m.vip === VIP6);
const json = (v: unknown) => JSON.stringify(v, (_k, x) => (typeof x === 'bigint' ? String(x) : x));

test('IPv6: each client sticks to one IPv6 target, which sees the real client address; picks reported on the IPv6 ring', async () => {
  // The IPv4 path MTU test took the router's client link below 1280, which removes its IPv6 addresses.
  sh('ip', '-n', bed.router, 'addr', 'replace', 'fd92:1::1/64', 'dev', 'rc', 'nodad');
  await waitFor(() => lbConnect(bed.client, T1_6, PORT, [clients6[0]], { timeoutMs: 1000 })[0].ok && lbConnect(bed.client, T2_6, PORT, [clients6[0]], { timeoutMs: 1000 })[0].ok, 'IPv6 servers', { timeoutMs: 10000, intervalMs: 200 });
  const events: Array<{ vip: string; client: string; target: string }> = [];
  // Earlier tests' IPv4 reports may wait unread: drained first, so what follows is this test's.
  bed.lb!.onEvents(() => undefined);
  bed.lb!.pollEvents();
  bed.lb!.onEvents((e) => events.push({ vip: e.key.vip, client: e.key.client, target: e.target }));
  try {
    const first = connect6(clients6);
    const second = connect6(clients6);
    for (const a of [...first, ...second]) {
      assert.ok(a.ok, `connection from ${a.src}: ${a.error}`);
      assert.is(a.peer, a.src, 'the target saw the real client IPv6 address');
    }
    const byClient = new Map(first.map((a) => [a.src, a.who]));
    for (const a of second) assert.is(a.who, byClient.get(a.src), `client ${a.src} went to the same target twice`);
    assert.equal([...new Set(first.map((a) => a.who))].sort(), ['t1', 't2'], 'IPv6 clients spread over both targets');
    const maps = mappings6();
    assert.is(maps.length, clients6.length, 'one IPv6 mapping per client (client affinity)');
    for (const m of maps) assert.is(whoIs(m.target), byClient.get(m.client), `mapping of ${m.client} names the target that answered`);
    bed.lb!.pollEvents();
    assert.is(events.length, clients6.length, `each new IPv6 mapping reported once (${json(events.slice(0, 2))})`);
    for (const e of events) {
      assert.is(e.vip, VIP6);
      assert.is(whoIs(e.target), byClient.get(e.client));
    }
    const st = bed.lb!.stats(SLOT6);
    assert.is(st.misses, BigInt(clients6.length));
    assert.ok(st.packets > 0n && st.dropError === 0n && st.dropBadHeader === 0n, json(st));
  } finally {
    bed.lb!.onEvents(() => undefined);
  }
});

test('IPv6: quiet reports nothing, not quiet reports; the lbHash mirror is the program\'s pick, both affinities', () => {
  const table = maglevTable([T1_6, T2_6], M);
  const events: string[] = [];
  try {
    for (const flags of [LB_F_QUIET, LB_F_PER_FLOW | LB_F_QUIET, 0, LB_F_PER_FLOW]) {
      bed.lb!.deleteMappings((m) => m.vip === VIP6);
      bed.lb!.setServiceFlags(VIP6, flags);
      events.length = 0;
      bed.lb!.onEvents((e) => events.push(e.key.client));
      const answers = connect6(clients6);
      for (const a of answers) assert.ok(a.ok, `${a.src}: ${a.error}`);
      bed.lb!.pollEvents();
      const maps = mappings6();
      assert.is(maps.length, clients6.length, `one local mapping per new client (flags ${flags})`);
      if (flags & LB_F_QUIET) assert.equal(events, [], 'quiet: nothing reported on the ring buffers');
      else assert.is(events.length, clients6.length, `not quiet: every pick reported (flags ${flags})`);
      const byClient = new Map(answers.map((a) => [a.src, a.who]));
      for (const m of maps) {
        assert.is(m.vport !== 0, (flags & LB_F_PER_FLOW) !== 0, 'the key is the tuple exactly when per flow');
        assert.is(table.targets[table.table[lbHash(m, LB_HASH_SEED) % M]], m.target, `the mirror's pick for ${m.client}:${m.cport} is the program's`);
        assert.is(pickOf(table, m, LB_HASH_SEED), m.target);
        assert.is(whoIs(m.target), byClient.get(m.client), 'and the target that answered');
      }
    }
  } finally {
    bed.lb!.onEvents(() => undefined);
    bed.lb!.setServiceFlags(VIP6, 0);
  }
});

test('IPv6: a mapping keeps its client on its target when the Maglev row changes; a new client follows the new row', () => {
  bed.lb!.deleteMappings((m) => m.vip === VIP6);
  const before = new Map(connect6(clients6).map((a) => [a.src, a.who]));
  const onT1 = [...before].filter(([, w]) => w === 't1').map(([c]) => c);
  assert.ok(onT1.length > 0, 'some clients on t1');
  // The row now names t2 only, while t1 stays a (terminating) target: its mappings are still valid.
  setTargets6([T2_6], [T1_6]);
  try {
    for (const a of connect6(onT1)) assert.is(a.who, 't1', `${a.src} stays on t1 by its mapping`);
    const fresh = 'fd92:1::40';
    sh('ip', '-n', bed.client, 'addr', 'add', `${fresh}/64`, 'dev', 'c0', 'nodad');
    assert.is(connect6([fresh])[0].who, 't2', 'a new client takes the new row');
  } finally {
    setTargets6([T1_6, T2_6]);
  }
});

test('IPv6: an installed mapping decides over the Maglev row, and removing a target voids its mappings', () => {
  const c = clients6[3];
  const natural = connect6([c])[0].who;
  const forced = natural === 't1' ? T2_6 : T1_6;
  bed.lb!.installMappings([{ key: { vip: VIP6, client: c, vport: 0, cport: 0, proto: 0 }, target: forced }]);
  for (const a of connect6([c, c])) assert.is(a.who, whoIs(forced), 'the installed IPv6 mapping is followed');
  assert.ok(bed.lb!.targetsOf(VIP6).has(T1_6) && bed.lb!.targetsOf(VIP6).has(T2_6));
  setTargets6([T2_6]);
  try {
    for (const a of connect6(clients6)) assert.is(a.who, 't2', `${a.src} moved to the remaining target`);
    assert.ok(bed.lb!.maglevRow(SLOT6).every((t) => t === T2_6), 'the IPv6 row names t2 only');
  } finally {
    setTargets6([T1_6, T2_6]);
  }
});

test('IPv6: replies bypass the LB pod (DSR): a 400 KB download passes ~no reply bytes through it', () => {
  const before = bed.lb!.stats(SLOT6);
  const a = connect6([clients6[0]], { req: 'big', timeoutMs: 10000 })[0];
  assert.ok(a.ok, a.error);
  assert.ok((a.bytes ?? 0) > 400 * 1024, `downloaded ${a.bytes}`);
  const through = Number(bed.lb!.stats(SLOT6).bytes - before.bytes);
  assert.ok(through < 40 * 1024, `only client-to-target bytes pass the LB pod (${through} B for a 400 KB download)`);
});

test('IPv6: a Packet Too Big about a live flow reaches the target holding it', () => {
  // The router's link to the client shrinks to IPv6's minimum: the target's 1452-byte replies no longer
  // fit, and the router's Packet Too Big goes to the VIP, i.e. to the LB pod.
  sh('ip', '-n', bed.router, 'link', 'set', 'rc', 'mtu', '1280');
  try {
    const before = bed.lb!.stats(SLOT6);
    const a = connect6([clients6[1]], { req: 'big', timeoutMs: 15000 })[0];
    assert.ok(a.ok, `download through the smaller MTU: ${a.error}`);
    assert.ok((a.bytes ?? 0) > 400 * 1024);
    const after = bed.lb!.stats(SLOT6);
    assert.ok(after.icmpForwarded > before.icmpForwarded, `the LB pod forwarded the Packet Too Big: ${json(after)}`);
    assert.is(after.dropIcmpNoFlow, before.dropIcmpNoFlow);
  } finally {
    sh('ip', '-n', bed.router, 'link', 'set', 'rc', 'mtu', '1500');
  }
});

test('IPv6: a 1 MB upload through the VIP (GSO super-packets encapsulated in outer IPv6) arrives whole', () => {
  const before = bed.lb!.stats(SLOT6);
  const out = inNs(bed.client, process.execPath, '-e', UPLOAD_JS, VIP6, String(PORT), '1');
  const r = JSON.parse(out.trim().split('\n').pop()!);
  assert.ok(r.answer, out);
  assert.is(Number(r.answer.split(' ')[1]), 1024 * 1024, 'byte count at the target');
  const after = bed.lb!.stats(SLOT6);
  assert.ok(after.bytes - before.bytes >= 1024n * 1024n, json(after));
  assert.is(after.dropError, before.dropError);
});

/** Sends one raw Ethernet frame into the LB pod's interface (from its host side, addressed to its MAC). */
function sendToLbPod(ipPacket: Buffer): void {
  const mac = (ns: string, dev: string) => Buffer.from(JSON.parse(sh('ip', '-n', ns, '-j', 'link', 'show', dev))[0].address.split(':').map((h: string) => parseInt(h, 16)));
  const frame = Buffer.concat([mac(bed.lbpod, 'eth0'), mac(bed.lbnode, 'lbv'), Buffer.from([0x86, 0xdd]), ipPacket]);
  inNs(bed.lbnode, 'python3', '-c', 'import socket,sys; s=socket.socket(socket.AF_PACKET, socket.SOCK_RAW); s.bind(("lbv", 0)); s.send(bytes.fromhex(sys.argv[1]))', frame.toString('hex'));
}

function ipv6Header(payloadLen: number, nexthdr: number, src: string, dst: string): Buffer {
  const h = Buffer.alloc(40);
  h.writeUInt32BE(0x60000000, 0);
  h.writeUInt16BE(payloadLen, 4);
  h[6] = nexthdr;
  h[7] = 64;
  ipToBytes(src).copy(h, 8);
  ipToBytes(dst).copy(h, 24);
  return h;
}

test('IPv6: malformed packets to the VIP are dropped and counted (bad length, extension header, unserved port)', async () => {
  const tcp = Buffer.alloc(20);
  tcp.writeUInt16BE(40000, 0);
  tcp.writeUInt16BE(PORT, 2);
  tcp[12] = 0x50;
  tcp[13] = 0x02; // SYN
  const before = bed.lb!.stats(SLOT6);
  // A payload length past the end of the frame.
  sendToLbPod(Buffer.concat([ipv6Header(1000, 6, clients6[0], VIP6), tcp]));
  // A Hop-by-Hop header (8 bytes, PadN) before TCP: refused as IPv4 options are.
  sendToLbPod(Buffer.concat([ipv6Header(28, 0, clients6[0], VIP6), Buffer.from([6, 0, 1, 4, 0, 0, 0, 0]), tcp]));
  // Another port of the VIP.
  const other = Buffer.from(tcp);
  other.writeUInt16BE(9999, 2);
  sendToLbPod(Buffer.concat([ipv6Header(20, 6, clients6[0], VIP6), other]));
  await waitFor(() => bed.lb!.stats(SLOT6).dropNoPort > before.dropNoPort, 'the raw frames handled', { timeoutMs: 3000, intervalMs: 50 });
  const after = bed.lb!.stats(SLOT6);
  assert.is(after.dropBadHeader - before.dropBadHeader, 1n, `bad length: ${json(after)}`);
  assert.is(after.dropIpOptions - before.dropIpOptions, 1n, 'extension header');
  assert.is(after.dropNoPort - before.dropNoPort, 1n, 'unserved port');
  assert.is(after.misses, before.misses, 'none of them made a mapping');
});

test('IPv6: UDP fragments follow their first fragment to the same target', async () => {
  // A 3000-byte datagram from a client whose route to the VIP says 1280: its stack fragments it, and every
  // fragment must reach the target of the first (which reassembles it).
  const c = clients6[5];
  const before = bed.lb!.stats(SLOT6);
  const who = mappings6().find((m) => m.client === c)?.target ?? pickOf(maglevTable([T1_6, T2_6], M), { vip: VIP6, client: c, vport: 0, cport: 0, proto: 0 }, LB_HASH_SEED)!;
  const tns = whoIs(who) === 't1' ? bed.t1 : bed.t2;
  sh('ip', '-n', bed.client, '-6', 'route', 'add', `${VIP6}/128`, 'via', 'fd92:1::1', 'mtu', '1280');
  const rx = spawn('nsenter', [`--net=/run/netns/${tns}`, 'python3', '-c', `import socket; s=socket.socket(socket.AF_INET6, socket.SOCK_DGRAM); s.bind(("${VIP6}", 9000)); s.settimeout(5); d,a=s.recvfrom(65535); print(len(d), a[0])`], { stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  rx.stdout!.on('data', (d) => (out += d));
  const exited = new Promise((r) => rx.on('exit', r));
  try {
    await new Promise((r) => setTimeout(r, 300)); // the receiver bound
    inNs(bed.client, 'python3', '-c', `import socket; s=socket.socket(socket.AF_INET6, socket.SOCK_DGRAM); s.bind(("${c}", 0)); s.sendto(b"x"*3000, ("${VIP6}", 9000))`);
    await Promise.race([exited, new Promise((r) => setTimeout(r, 6000))]);
    const after = bed.lb!.stats(SLOT6);
    assert.ok(after.fragments - before.fragments >= 2n, `later fragments forwarded: ${json(after)}`);
    assert.is(after.dropFragment, before.dropFragment);
  } finally {
    rx.kill('SIGKILL');
    sh('ip', '-n', bed.client, '-6', 'route', 'del', `${VIP6}/128`);
  }
  assert.match(out, new RegExp(`^3000 ${c}`), `the target reassembled the datagram from ${c} (${out})`);
});

test.run();
