// The load balancer's node datapath (bpf/lb.bpf.c lb_node, at tc ingress of the node's uplink) on the real
// kernel. Topology, each a namespace:
//   client ── router ── lbnode ──── lbpod        client 10.93.1.2-.21, lbnode 10.93.2.2 (uplink n0)
//               │          └─────── t3           LB pod 10.93.20.2; t3 10.93.21.2, a target on the LB node
//               ├── t1 (10.93.3.2)               targets hold the VIPs on lo and decapsulate FoU from the
//               └── t2 (10.93.4.2)               LB node's address only
// The router sends the VIPs to the LB node. lb_node on its uplink picks the client's target and sends the
// packet straight on, encapsulated (outer source: the node's address), out the uplink for t1/t2 and into
// t3's veth for t3; the LB pod (lb_ingress on its interface, the VIP routed to it as tetherd does) only
// serves the node's own senders. Targets answer the client directly (DSR).
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { execFileSync, spawn } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { LbDatapath } from '../../daemon/bpf/lb';
import { attachFouDecap, type FouDecap } from '../../daemon/bpf/fou';
import { ensureBpffs } from '../../daemon/bpf/bpffs';
import { LB_F_PER_FLOW, PROTO, type LbStats } from '../../daemon/bpf/lb-structs';
import { maglevTable } from '../../daemon/lb/maglev';
import { close, sendto, socket, SOCK_CLOEXEC, SOCK_RAW } from '../../daemon/sys/libc';
import { inNetns } from '../../daemon/sys/netns';
import { koffi } from '../../daemon/sys/ffi';
import { addNetns, delNetns, ipJson, uniqueName } from '../lib/netns';
import { sleep, waitFor } from '../lib/wait';
import { lbConnect, type LbAnswer } from '../lib/lb-client';

const root = path.resolve(__dirname, '../..');
const VIP = '10.93.100.10';
/** A second VIP, per-flow affinity on a UDP port: the flood fills the table with its flows. */
const VIP2 = '10.93.100.11';
const NODE = '10.93.2.2';
const ROUTER_CLIENT_SIDE = '10.93.1.1';
const LBPOD = '10.93.20.2';
const T1 = '10.93.3.2';
const T2 = '10.93.4.2';
const T3 = '10.93.21.2';
const PORT = 8080;
const FLOOD_PORT = 7000;
const FOU_PORT = 5557;
const M = 251; // a small prime keeps the table writes short
/** A small table, so the flood test fills it. */
const MAX_MAPPINGS = 256;
const clients = Array.from({ length: 20 }, (_, i) => `10.93.1.${i + 2}`);
const NAMES: Record<string, string> = { [T1]: 't1', [T2]: 't2', [T3]: 't3' };

const sh = (cmd: string, ...args: string[]) => execFileSync(cmd, args, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
const inNs = (ns: string, ...cmd: string[]) => sh('nsenter', `--net=/run/netns/${ns}`, ...cmd);

interface Bed {
  client: string; router: string; lbnode: string; lbpod: string; t1: string; t2: string; t3: string;
  pinDir: string;
  lb?: LbDatapath;
  decaps: FouDecap[];
  servers: Array<ReturnType<typeof spawn>>;
}

let bed: Bed;

// Target server: TCP answers each connection with "<name> <peer>\n" after the first line ("big": 400 KB
// first; "up": counts an upload); UDP on the VIP echoes each datagram (from the VIP, DSR).
const SERVER_JS = `
const net = require('net'), dgram = require('dgram');
const [name, port, vip] = process.argv.slice(1);
net.createServer({ allowHalfOpen: true }, (s) => {
  s.on('error', () => {});
  s.once('data', (d) => {
    if (String(d).startsWith('up')) {
      let n = d.length - 3;
      s.on('data', (x) => (n += x.length));
      s.on('end', () => s.end(name + ' ' + n + '\\n'));
      return;
    }
    if (String(d).startsWith('big')) s.write(Buffer.alloc(400 * 1024, 120));
    s.end(name + ' ' + s.remoteAddress + '\\n');
  });
}).listen(Number(port), '0.0.0.0');
const u = dgram.createSocket('udp4');
u.on('message', (m, r) => u.send(Buffer.concat([Buffer.from(name + ' '), m.subarray(name.length + 1)]), r.port, r.address));
u.bind(Number(port), vip);
`;


type Answer = LbAnswer;

function connect(srcs: string[], opts: { port?: number; req?: string; timeoutMs?: number; ns?: string } = {}): Answer[] {
  return lbConnect(opts.ns ?? bed.client, VIP, opts.port ?? PORT, srcs, opts);
}

const stats = (slot = 0): LbStats => bed.lb!.stats(slot);
const show = (s: LbStats) => JSON.stringify(s, (_k, v) => (typeof v === 'bigint' ? String(v) : v));

/** Packets the LB pod's interface received so far. */
function lbPodRx(): number {
  const [l] = ipJson(bed.lbpod, ['-s', 'link', 'show', 'eth0']);
  return l.stats64.rx.packets as number;
}

function build(): Bed {
  const b: Bed = {
    client: uniqueName('tln-client'), router: uniqueName('tln-router'), lbnode: uniqueName('tln-node'), lbpod: uniqueName('tln-pod'),
    t1: uniqueName('tln-t1'), t2: uniqueName('tln-t2'), t3: uniqueName('tln-t3'), pinDir: `/sys/fs/bpf/tether-test/${uniqueName('lbn')}`, decaps: [], servers: [],
  };
  bed = b;
  for (const ns of [b.client, b.router, b.lbnode, b.lbpod, b.t1, b.t2, b.t3]) addNetns(ns);
  // No IPv6 chatter (router solicitations, MLD) on the LB node's links: the LB pod's receive counter must
  // count only what is sent to it.
  for (const ns of [b.lbnode, b.lbpod]) inNs(ns, 'sysctl', '-qw', 'net.ipv6.conf.all.disable_ipv6=1', 'net.ipv6.conf.default.disable_ipv6=1');
  for (const ns of [b.router, b.lbnode]) {
    for (const k of ['net.ipv4.ip_forward=1', 'net.ipv4.conf.all.rp_filter=0', 'net.ipv4.conf.default.rp_filter=0', 'net.ipv4.conf.all.send_redirects=0']) inNs(ns, 'sysctl', '-qw', k);
  }
  const link = (ns: string, ifName: string, addr: string, routerIf: string, routerAddr: string) => {
    sh('ip', '-n', b.router, 'link', 'add', routerIf, 'type', 'veth', 'peer', 'name', ifName, 'netns', ns);
    sh('ip', '-n', b.router, 'addr', 'add', `${routerAddr}/24`, 'dev', routerIf);
    sh('ip', '-n', b.router, 'link', 'set', routerIf, 'up');
    sh('ip', '-n', ns, 'addr', 'add', `${addr}/24`, 'dev', ifName);
    sh('ip', '-n', ns, 'link', 'set', ifName, 'up');
    sh('ip', '-n', ns, 'route', 'add', 'default', 'via', routerAddr);
  };
  link(b.client, 'c0', clients[0], 'rc', ROUTER_CLIENT_SIDE);
  for (const c of clients.slice(1)) sh('ip', '-n', b.client, 'addr', 'add', `${c}/24`, 'dev', 'c0');
  link(b.lbnode, 'n0', NODE, 'rn', '10.93.2.1');
  link(b.t1, 'eth0', T1, 'r1', '10.93.3.1');
  link(b.t2, 'eth0', T2, 'r2', '10.93.4.1');
  // The VIPs, and the LB node's own pod t3 (reached directly only by the readiness check), via the LB node.
  for (const v of [VIP, VIP2, T3]) sh('ip', '-n', b.router, 'route', 'add', `${v}/32`, 'via', NODE);

  // Pods on the LB node as ptp wires them: a veth whose host side holds the gateway address, a /32 route.
  const pod = (ns: string, hostIf: string, gw: string, addr: string) => {
    sh('ip', '-n', b.lbnode, 'link', 'add', hostIf, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', ns);
    sh('ip', '-n', b.lbnode, 'addr', 'add', `${gw}/32`, 'dev', hostIf);
    sh('ip', '-n', b.lbnode, 'link', 'set', hostIf, 'up');
    sh('ip', '-n', b.lbnode, 'route', 'add', `${addr}/32`, 'dev', hostIf);
    sh('ip', '-n', ns, 'addr', 'add', `${addr}/32`, 'dev', 'eth0');
    sh('ip', '-n', ns, 'link', 'set', 'eth0', 'up');
    sh('ip', '-n', ns, 'route', 'add', `${gw}/32`, 'dev', 'eth0');
    sh('ip', '-n', ns, 'route', 'add', 'default', 'via', gw, 'dev', 'eth0');
  };
  pod(b.lbpod, 'lbv', '10.93.20.1', LBPOD);
  pod(b.t3, 'lt3', '10.93.21.1', T3);
  // What tetherd does for an LB pod, in either mode: the VIPs routed to it (the node's own senders take
  // this path), the node accepting its own address as the source of what the pod sends back.
  for (const v of [VIP, VIP2]) sh('ip', '-n', b.lbnode, 'route', 'add', `${v}/32`, 'via', LBPOD, 'dev', 'lbv', 'onlink');
  inNs(b.lbnode, 'sysctl', '-qw', 'net.ipv4.conf.lbv.accept_local=1', 'net.ipv4.conf.lbv.rp_filter=0');

  ensureBpffs(b.pinDir);
  const targets = [[b.t1, 't1', T1, b.router, 'r1'], [b.t2, 't2', T2, b.router, 'r2'], [b.t3, 't3', T3, b.lbnode, 'lt3']] as const;
  for (const [ns, name, addr, hostNs, hostIf] of targets) {
    for (const v of [VIP, VIP2]) sh('ip', '-n', ns, 'addr', 'add', `${v}/32`, 'dev', 'lo');
    for (const k of ['all', 'eth0']) inNs(ns, 'sysctl', '-qw', `net.ipv4.conf.${k}.arp_ignore=1`, `net.ipv4.conf.${k}.arp_announce=2`);
    sh('ip', '-n', ns, 'link', 'set', 'eth0', 'mtu', '1472');
    // Decapsulated at the egress of the link into the target, as tetherd does on a target pod's host-side veth.
    b.decaps.push(attachFouDecap({ netns: `/run/netns/${hostNs}`, ifName: hostIf, direction: 'egress', port: FOU_PORT, localAddress: addr, allowedSources: [NODE] }));
    b.servers.push(spawn('nsenter', [`--net=/run/netns/${ns}`, process.execPath, '-e', SERVER_JS, name, String(PORT), VIP], { stdio: ['ignore', 'pipe', 'ignore'] }));
  }
  b.lb = LbDatapath.load({ pinDir: b.pinDir, maxVips: 4, maglevSize: M, maxMappings: MAX_MAPPINGS });
  b.lb.configure(NODE, FOU_PORT);
  b.lb.attach(`/run/netns/${b.lbpod}`, 'eth0');
  b.lb.attachNode('n0', `/run/netns/${b.lbnode}`);
  return b;
}

function setTargets(targets: string[], terminating: string[] = [], vip = VIP, slot = 0): void {
  const lb = bed.lb!;
  lb.setTargets(vip, new Map([...targets.map((t) => [t, 'active'] as const), ...terminating.map((t) => [t, 'terminating'] as const)]));
  const mg = maglevTable(targets, M);
  lb.setMaglevRow(slot, mg.table, mg.targets);
}

// ---- hand-made frames, put on the LB node's uplink by the router's side of the link (what a misbehaving
// sender could get there: a router in between would itself drop some of them, e.g. a bad header checksum) ----

const macs = new Map<string, Buffer>();
const macOf = (ns: string, ifName: string): Buffer => {
  const k = `${ns} ${ifName}`;
  if (!macs.has(k)) macs.set(k, Buffer.from((ipJson(ns, ['link', 'show', ifName])[0].address as string).split(':').map((x) => parseInt(x, 16))));
  return macs.get(k)!;
};
const ipBytes = (a: string) => Buffer.from(a.split('.').map(Number));

function ipChecksum(h: Buffer): number {
  let sum = 0;
  for (let i = 0; i < h.length; i += 2) sum += h.readUInt16BE(i);
  while (sum > 0xffff) sum = (sum & 0xffff) + (sum >>> 16);
  return ~sum & 0xffff;
}

interface FrameSpec {
  src: string; dst: string; proto: number; payload: Buffer;
  options?: Buffer; fragOffset?: number; moreFragments?: boolean; id?: number; badChecksum?: boolean;
  /** Destination MAC (default: the LB node's uplink). */
  dstMac?: Buffer;
}

function frame(f: FrameSpec): Buffer {
  const opts = f.options ?? Buffer.alloc(0);
  const ip = Buffer.alloc(20 + opts.length);
  ip.writeUInt8(0x40 | ((20 + opts.length) / 4), 0);
  ip.writeUInt16BE(ip.length + f.payload.length, 2);
  ip.writeUInt16BE(f.id ?? 0x1234, 4);
  ip.writeUInt16BE((f.moreFragments ? 0x2000 : 0) | (f.fragOffset ?? 0), 6);
  ip.writeUInt8(64, 8);
  ip.writeUInt8(f.proto, 9);
  ipBytes(f.src).copy(ip, 12);
  ipBytes(f.dst).copy(ip, 16);
  opts.copy(ip, 20);
  ip.writeUInt16BE(ipChecksum(ip) ^ (f.badChecksum ? 0x5a5a : 0), 10);
  const eth = Buffer.alloc(14);
  (f.dstMac ?? macOf(bed.lbnode, 'n0')).copy(eth, 0);
  macOf(bed.router, 'rn').copy(eth, 6);
  eth.writeUInt16BE(0x0800, 12);
  return Buffer.concat([eth, ip, f.payload]);
}

/** A UDP header (checksum 0: none, allowed over IPv4) and payload. */
function udp(sport: number, dport: number, data = Buffer.alloc(8)): Buffer {
  const u = Buffer.alloc(8);
  u.writeUInt16BE(sport, 0);
  u.writeUInt16BE(dport, 2);
  u.writeUInt16BE(8 + data.length, 4);
  return Buffer.concat([u, data]);
}

/** A TCP SYN header without options (checksum left 0: these tests never get as far as a target's check). */
function syn(sport: number, dport: number): Buffer {
  const t = Buffer.alloc(20);
  t.writeUInt16BE(sport, 0);
  t.writeUInt16BE(dport, 2);
  t.writeUInt32BE(1, 4);
  t.writeUInt8(5 << 4, 12);
  t.writeUInt8(0x02, 13);
  t.writeUInt16BE(64240, 14);
  return t;
}

const AF_PACKET = 17;
/** Sends the frames in bursts small enough for the receiving backlog (netdev_max_backlog) to take whole. */
async function sendFrames(frames: Buffer[]): Promise<void> {
  const ifindex = ipJson(bed.router, ['link', 'show', 'rn'])[0].ifindex as number;
  const fd = inNetns(`/run/netns/${bed.router}`, () => socket(AF_PACKET, SOCK_RAW | SOCK_CLOEXEC, 0));
  try {
    const addr = Buffer.alloc(20);
    addr.writeUInt16LE(AF_PACKET, 0);
    addr.writeUInt16BE(0x0800, 2);
    addr.writeInt32LE(ifindex, 4);
    addr.writeUInt8(6, 11);
    macOf(bed.lbnode, 'n0').copy(addr, 12);
    for (let i = 0; i < frames.length; i += 64) {
      for (const f of frames.slice(i, i + 64)) sendto(fd, f, addr);
      await sleep(5);
    }
  } finally {
    close(fd);
  }
}

/**
 * Runs fn with this (main) thread held on the CPU it is on: the map updates it makes and the frames it
 * sends, which the receiving veth processes on the sending CPU, then all meet one CPU's share of the kernel's
 * per-CPU structures (an LRU's local lists would otherwise hide one CPU's entries from another's evictions).
 */
async function onOneCpu(fn: () => Promise<void>): Promise<void> {
  const libc = koffi().load('libc.so.6');
  const getcpu = libc.func('int sched_getcpu(void)');
  const setaff = libc.func('int sched_setaffinity(int pid, size_t size, void *mask)');
  const getaff = libc.func('int sched_getaffinity(int pid, size_t size, _Out_ void *mask)');
  const saved = Buffer.alloc(128);
  assert.ok(getaff(0, saved.length, saved) >= 0, 'sched_getaffinity');
  const one = Buffer.alloc(128);
  const cpu = getcpu() as number;
  one[cpu >> 3] |= 1 << (cpu & 7);
  assert.ok(setaff(0, one.length, one) === 0, 'sched_setaffinity');
  try {
    await fn();
  } finally {
    setaff(0, saved.length, saved);
  }
}

test.before(async () => {
  if (!fs.existsSync(path.join(root, 'dist/bpf/lb.bpf.o'))) execFileSync('bash', [path.join(root, 'bpf/build.sh')], { stdio: 'inherit' });
  build();
  bed.lb!.setService(VIP, 0, [{ port: PORT, proto: PROTO.TCP }, { port: PORT, proto: PROTO.UDP }], 0);
  bed.lb!.setService(VIP2, 1, [{ port: FLOOD_PORT, proto: PROTO.UDP }], LB_F_PER_FLOW);
  setTargets([T1, T2, T3]);
  setTargets([T1, T2], [], VIP2, 1);
  // Servers are up once each answers on its own address.
  await waitFor(() => {
    try {
      inNs(bed.client, 'bash', '-c', `exec 3<>/dev/tcp/${T1}/${PORT} && exec 4<>/dev/tcp/${T2}/${PORT} && exec 5<>/dev/tcp/${T3}/${PORT}`);
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
    bed.lb?.detachNode('n0', `/run/netns/${bed.lbnode}`);
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
  delNetns(bed.client, bed.router, bed.lbnode, bed.lbpod, bed.t1, bed.t2, bed.t3);
  fs.rmSync(bed.pinDir, { recursive: true, force: true });
});

test('clients stick to their targets (on other nodes and on this one), targets see the client, and nothing enters the LB pod', () => {
  const events: Array<{ client: string; target: string }> = [];
  bed.lb!.onEvents((e) => events.push({ client: e.key.client, target: e.target }));
  const podRx = lbPodRx();
  const first = connect(clients);
  const second = connect(clients);
  for (const a of [...first, ...second]) {
    assert.ok(a.ok, `connection from ${a.src}: ${a.error}`);
    assert.is(a.peer, a.src, 'the target saw the real client address');
  }
  const byClient = new Map(first.map((a) => [a.src, a.who]));
  for (const a of second) assert.is(a.who, byClient.get(a.src), `client ${a.src} went to the same target twice`);
  assert.equal([...new Set(first.map((a) => a.who))].sort(), ['t1', 't2', 't3'], 'clients spread over the remote targets and the local one');
  assert.is(lbPodRx(), podRx, 'no packet entered the LB pod');

  const maps = bed.lb!.mappings().filter((m) => m.vip === VIP);
  assert.is(maps.length, clients.length, 'one mapping per client (client affinity)');
  for (const m of maps) assert.is(NAMES[m.target], byClient.get(m.client), `mapping of ${m.client} names the target that answered`);
  bed.lb!.pollEvents();
  assert.is(events.length, clients.length, 'each new mapping reported once on the ring buffer');
  const st = stats();
  assert.is(st.misses, BigInt(clients.length));
  assert.ok(st.packets > 0n && st.dropError === 0n && st.dropNoRoute === 0n && st.reportLost === 0n, show(st));
});

test('the node\'s own senders take the LB pod\'s path, into the same mapping table', () => {
  const podRx = lbPodRx();
  const [a] = connect([NODE], { ns: bed.lbnode });
  assert.ok(a.ok, `from the LB node itself: ${a.error}`);
  assert.is(a.peer, NODE);
  assert.ok(lbPodRx() > podRx, 'the node\'s own connection went through the LB pod');
  const m = bed.lb!.mappings().find((x) => x.vip === VIP && x.client === NODE);
  assert.is(m && NAMES[m.target], a.who, 'the LB pod\'s program recorded its pick in the shared table');
});

test('an installed mapping (from the store) decides over the Maglev table', () => {
  const c = clients[11];
  const natural = connect([c])[0].who;
  const forced = natural === 't1' ? T2 : T1;
  bed.lb!.installMappings([{ key: { vip: VIP, client: c, vport: 0, cport: 0, proto: 0 }, target: forced }]);
  for (const a of connect([c, c, c])) assert.is(a.who, NAMES[forced], 'the installed mapping is followed');
});

test('a removed target voids its mappings: its clients move, the others stay; a terminating one keeps its clients', () => {
  const before = new Map(connect(clients).map((a) => [a.src, a.who]));
  setTargets([T2, T3]);
  for (const a of connect(clients)) {
    assert.ok(a.ok, `${a.src}: ${a.error}`);
    if (before.get(a.src) !== 't1') assert.is(a.who, before.get(a.src), `${a.src} stays where it was`);
    else assert.ok(a.who === 't2' || a.who === 't3', `${a.src} moved off the removed target`);
  }
  bed.lb!.installMappings(clients.slice(0, 3).map((client) => ({ key: { vip: VIP, client, vport: 0, cport: 0, proto: 0 }, target: T1 })));
  setTargets([T2, T3], [T1]);
  for (const a of connect(clients.slice(0, 3))) assert.is(a.who, 't1', `${a.src} stays on the terminating target`);
  setTargets([T1, T2, T3]);
});

test('replies bypass the LB node (DSR): a 400 KB download passes ~no reply bytes through it', () => {
  const before = stats();
  const a = connect([clients[0]], { req: 'big', timeoutMs: 10000 })[0];
  assert.ok(a.ok, a.error);
  assert.ok((a.bytes ?? 0) > 400 * 1024, `downloaded ${a.bytes}`);
  const through = Number(stats().bytes - before.bytes);
  assert.ok(through < 40 * 1024, `only client-to-target bytes pass the LB (${through} B for a 400 KB download)`);
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

test('uploads (GSO super-packets encapsulated at the uplink): 3 x 16 MB arrive whole, with no MTU answer', () => {
  const before = stats().tooBig;
  for (let i = 0; i < 3; i++) {
    const out = inNs(bed.client, process.execPath, '-e', UPLOAD_JS, VIP, String(PORT), '16');
    const r = JSON.parse(out.trim().split('\n').pop()!);
    assert.ok(r.answer, `upload ${i + 1}: ${out}`);
    assert.is(Number(r.answer.split(' ')[1]), 16 * 1024 * 1024, `upload ${i + 1} byte count`);
  }
  assert.is(stats().tooBig, before, 'segments sized by the target\'s MSS fit once encapsulated');
});

test('a port the VIP does not serve is dropped and counted', () => {
  const before = stats().dropNoPort;
  const a = connect([clients[0]], { port: 9999, timeoutMs: 1500 })[0];
  assert.not.ok(a.ok, 'no answer on an unserved port');
  assert.ok(stats().dropNoPort > before);
});

test('a path MTU drop behind the target: the ICMP error reaches the target holding the flow', () => {
  sh('ip', '-n', bed.router, 'link', 'set', 'rc', 'mtu', '1100');
  try {
    const before = stats().icmpForwarded;
    const a = connect([clients[1]], { req: 'big', timeoutMs: 15000 })[0];
    assert.ok(a.ok, `download through the smaller MTU: ${a.error}`);
    assert.ok((a.bytes ?? 0) > 400 * 1024);
    assert.ok(stats().icmpForwarded > before, 'the node forwarded the ICMP error');
  } finally {
    sh('ip', '-n', bed.router, 'link', 'set', 'rc', 'mtu', '1500');
  }
});

// A connected UDP socket sends full-size datagrams (1472 bytes of data: a 1500-byte packet, DF set) until
// one is echoed; prints the attempts.
const UDP_JS = `
const dgram = require('dgram');
const [host, port, src] = process.argv.slice(1);
const s = dgram.createSocket('udp4');
let n = 0;
const t0 = Date.now();
s.on('message', (m) => { console.log(JSON.stringify({ attempts: n, who: String(m.subarray(0, 2)) })); process.exit(0); });
s.on('error', () => {});
s.bind(0, src, () => s.connect(Number(port), host, () => {
  const send = () => { n++; s.send(Buffer.alloc(1472, 65)); if (Date.now() - t0 > 8000) { console.log(JSON.stringify({ attempts: n })); process.exit(0); } };
  send();
  setInterval(send, 300);
}));`;

test('an MTU-sized packet that would not fit once encapsulated: frag-needed to the client, which then fragments, and the fragments follow the first', () => {
  const src = clients[4];
  const before = stats();
  const out = inNs(bed.client, process.execPath, '-e', UDP_JS, VIP, String(PORT), src);
  const r = JSON.parse(out.trim().split('\n').pop()!) as { attempts: number; who?: string };
  const after = stats();
  assert.ok(after.tooBig > before.tooBig, `frag-needed sent (${show(after)})`);
  assert.match(inNs(bed.client, 'ip', 'route', 'get', VIP, 'from', src), /mtu 1472/, 'the client learnt the path MTU from the VIP\'s answer');
  assert.ok(r.who, `a datagram was echoed after ${r.attempts} attempts`);
  assert.ok(after.fragments > before.fragments, 'later fragments were forwarded after their first');
  assert.is(after.dropFragment, before.dropFragment);
});

test('bad input is dropped and counted, and makes no mapping: bad header checksum, IP options, a later fragment alone', async () => {
  const before = stats();
  const spoofed = ['10.93.1.201', '10.93.1.202', '10.93.1.203'];
  await sendFrames([
    frame({ src: spoofed[0], dst: VIP, proto: PROTO.TCP, payload: syn(40001, PORT), badChecksum: true }),
    frame({ src: spoofed[1], dst: VIP, proto: PROTO.TCP, payload: syn(40002, PORT), options: Buffer.from([1, 1, 1, 0]) }),
    frame({ src: spoofed[2], dst: VIP, proto: PROTO.UDP, payload: Buffer.alloc(64), fragOffset: 100, id: 0x4242 }),
  ]);
  const after = stats();
  assert.is(after.dropBadHeader - before.dropBadHeader, 1n, 'bad header checksum');
  assert.is(after.dropIpOptions - before.dropIpOptions, 1n, 'IP options');
  assert.is(after.dropFragment - before.dropFragment, 1n, 'a later fragment whose first was not seen');
  assert.is(after.misses, before.misses, 'no target was picked for any of them');
  assert.not.ok(bed.lb!.mappings().some((m) => spoofed.includes(m.client)), 'no mapping for their sources');
});

// A bridge floods a frame whose destination MAC it has forgotten to every port, and a promiscuous uplink
// sees frames for other hosts: the stack drops them (PACKET_OTHERHOST), so the datapath must too, or every LB
// node on the segment (a drained one included) forwards the same frame.
test('a VIP frame not addressed to the node (flooded, or seen by a promiscuous uplink) is not balanced, and is counted; one to the node\'s MAC is', async () => {
  inNs(bed.lbnode, 'ip', 'link', 'set', 'n0', 'promisc', 'on');
  try {
    const before = stats();
    const notHostBefore = bed.lb!.nodeStats?.().notForHost ?? 0n;
    const foreign = ['10.93.1.211', '10.93.1.212'];
    await sendFrames([
      frame({ src: foreign[0], dst: VIP, proto: PROTO.TCP, payload: syn(40011, PORT), dstMac: Buffer.from([0x02, 0x00, 0x5e, 0x10, 0x20, 0x30]) }),
      frame({ src: foreign[1], dst: VIP, proto: PROTO.TCP, payload: syn(40012, PORT), dstMac: Buffer.alloc(6, 0xff) }),
    ]);
    const mid = stats();
    assert.is(mid.packets, before.packets, `nothing forwarded to a target (${show(mid)})`);
    assert.is(mid.misses, before.misses, 'no target picked');
    assert.not.ok(bed.lb!.mappings().some((m) => foreign.includes(m.client)), 'no mapping for their sources');
    assert.is(bed.lb!.nodeStats().notForHost - notHostBefore, 2n, 'both counted as not for this host');
    // The same frame to the node's own MAC is balanced.
    const own = '10.93.1.213';
    await sendFrames([frame({ src: own, dst: VIP, proto: PROTO.TCP, payload: syn(40013, PORT) })]);
    const after = stats();
    assert.is(after.packets - mid.packets, 1n, 'forwarded to a target');
    assert.ok(bed.lb!.mappings().some((m) => m.client === own), 'a mapping for the frame addressed to the node');
  } finally {
    inNs(bed.lbnode, 'ip', 'link', 'set', 'n0', 'promisc', 'off');
  }
});

test('a flood of new flows fills the table: existing flows keep their targets, new ones are still forwarded, and it is counted', async () => {
  // Existing flows: mappings installed from the store and not used here yet (flows ECMP is about to move to
  // this node), each to the target Maglev would NOT pick, so a lost mapping shows as a moved connection.
  const pinned = ['10.93.1.50', '10.93.1.51', '10.93.1.52', '10.93.1.53'];
  for (const c of pinned) sh('ip', '-n', bed.client, 'addr', 'add', `${c}/24`, 'dev', 'c0');
  const natural = new Map(connect(pinned).map((a) => [a.src, a.who!]));
  bed.lb!.deleteMappings((m) => m.vip === VIP && pinned.includes(m.client));
  const forced = new Map(pinned.map((c) => [c, natural.get(c) === 't1' ? T2 : T1]));
  const before = stats(1);
  const n = MAX_MAPPINGS * 4;
  await onOneCpu(async () => {
    bed.lb!.installMappings(pinned.map((client) => ({ key: { vip: VIP, client, vport: 0, cport: 0, proto: 0 }, target: forced.get(client)! })));
    await sendFrames(Array.from({ length: n }, (_, i) => frame({ src: clients[i % clients.length], dst: VIP2, proto: PROTO.UDP, payload: udp(20000 + i, FLOOD_PORT) })));
  });
  const after = stats(1);
  assert.is(bed.lb!.mappings().length, MAX_MAPPINGS, 'the table is full');
  assert.ok(after.mappingFull - before.mappingFull > 0n, `counted (${show(after)})`);
  assert.is(after.packets - before.packets, BigInt(n), 'every flood packet was still forwarded');
  for (const a of connect(pinned)) assert.is(a.who, NAMES[forced.get(a.src)!], `${a.src} kept its target through the flood`);
  const maps = new Map(bed.lb!.mappings().filter((m) => m.vip === VIP).map((m) => [m.client, m.target]));
  for (const c of pinned) assert.is(maps.get(c), forced.get(c), `${c}'s mapping is still there`);
  // Installing into the full table leaves out what does not fit, without failing.
  const extra = bed.lb!.installMappings([{ key: { vip: VIP2, client: '10.93.1.99', vport: FLOOD_PORT, cport: 1, proto: PROTO.UDP }, target: T1 }]);
  assert.equal(extra, { installed: 0, full: 1 });
});

test('no active target: new clients are dropped and counted', () => {
  // The flood left the table full: clear the VIP's other mappings first, so this is about targets only.
  bed.lb!.deleteMappings((m) => m.vip === VIP2);
  const fresh = '10.93.1.40';
  sh('ip', '-n', bed.client, 'addr', 'add', `${fresh}/24`, 'dev', 'c0');
  setTargets([]);
  try {
    const before = stats().dropNoTarget;
    const a = connect([fresh], { timeoutMs: 1500 })[0];
    assert.not.ok(a.ok);
    assert.ok(stats().dropNoTarget > before);
  } finally {
    setTargets([T1, T2, T3]);
  }
});

test.run();
