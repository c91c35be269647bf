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
// IPv6 on the same namespaces (each test runs once per family, its IPv6 twin named "IPv6: ..."): client
// fd93:1::2.., lbnode fd93:2::2, t1 fd93:3::2, t2 fd93:4::2, t3 fd93:21::2, VIPs fd93:100::10 and ::11 (slots
// 2 and 3), FoU in outer IPv6 from the node's IPv6 address to the target's. The LB pod and the node's side of
// its link stay IPv4-only (its receive counter must count only what is sent to it, no IPv6 chatter), so the
// node's own senders are tested in IPv4 only.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { execFileSync, spawn } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { LB_HASH_SEED, LbDatapath } from '../../daemon/bpf/lb';
import { attachFouDecap, type FouDecap } from '../../daemon/bpf/fou';
import { ensureBpffs } from '../../daemon/bpf/bpffs';
import { LB_F_PER_FLOW, PROTO, type LbStats } from '../../daemon/bpf/lb-structs';
import { maglevTable, pickOf } from '../../daemon/lb/maglev';
import { close, sendto, socket, SOCK_CLOEXEC, SOCK_RAW } from '../../daemon/sys/libc';
import { inNetns } from '../../daemon/sys/netns';
import { koffi } from '../../daemon/sys/ffi';
import { addNetns, delNetns, ipJson, linkMac, uniqueName } from '../lib/netns';
import { sleep, waitFor } from '../lib/wait';
import { lbConnect, type LbAnswer } from '../lib/lb-client';
import { frame as ipFrame, udp, type FrameSpec } from '../lib/ip-frames';
import { bytesToIp } from '../../lib/ip';

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

/** One family's addresses and numbers: each test below runs once per family over the same namespaces. */
interface Family {
  /** The test name's prefix. */
  label: string;
  v6: boolean;
  vip: string; vip2: string; node: string; t1: string; t2: string; t3: string;
  routerClientSide: string;
  clients: string[];
  /** The VIPs' stats slots. */
  slot: number; slot2: number;
  /** An address on the clients' subnet by number (not on the client unless added). */
  host: (n: number) => string;
  /** The clients' prefix length. */
  prefix: number;
  /** What a client is told its MTU is over the 1500-byte links: FoU adds 28 bytes in IPv4, 48 in IPv6. */
  innerMtu: number;
  /** A client-side MTU the targets' full-size replies no longer fit (IPv6: its minimum, 1280; below it a
   * link loses its IPv6 addresses). */
  smallMtu: number;
  /** What a client is told when its packet would not fit once encapsulated. */
  tooBig: string;
}

const V4: Family = {
  label: '', v6: false, vip: VIP, vip2: VIP2, node: NODE, t1: T1, t2: T2, t3: T3, routerClientSide: ROUTER_CLIENT_SIDE, clients,
  slot: 0, slot2: 1, host: (n) => `10.93.1.${n}`, prefix: 24, innerMtu: 1472, smallMtu: 1100, tooBig: 'frag-needed',
};
const V6: Family = {
  label: 'IPv6: ', v6: true, vip: 'fd93:100::10', vip2: 'fd93:100::11', node: 'fd93:2::2', t1: 'fd93:3::2', t2: 'fd93:4::2', t3: 'fd93:21::2',
  routerClientSide: 'fd93:1::1', clients: Array.from({ length: 20 }, (_, i) => `fd93:1::${(i + 2).toString(16)}`),
  slot: 2, slot2: 3, host: (n) => `fd93:1::${n.toString(16)}`, prefix: 64, innerMtu: 1452, smallMtu: 1280, tooBig: 'Packet Too Big',
};
const FAMILIES = [V4, V6];
const NAMES: Record<string, string> = Object.fromEntries(FAMILIES.flatMap((f) => [[f.t1, 't1'], [f.t2, 't2'], [f.t3, 't3']]));
/** The mappings of the family's two VIPs. */
const mappingsOf = (f: Family) => bed.lb!.mappings().filter((m) => m.vip === f.vip || m.vip === f.vip2);
/** An extra client address (nodad: usable at once). */
const addClient = (f: Family, a: string) => sh('ip', '-n', bed.client, 'addr', 'add', `${a}/${f.prefix}`, 'dev', 'c0', ...(f.v6 ? ['nodad'] : []));

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

// Target server, both families: TCP answers each connection with "<name> <peer>\n" after the first line
// ("big": 400 KB first; "up": counts an upload); UDP on each VIP echoes each datagram (from the VIP, DSR).
const SERVER_JS = `
const net = require('net'), dgram = require('dgram');
const [name, port, vip, vip6] = process.argv.slice(1);
const serve = (s) => {
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
};
net.createServer({ allowHalfOpen: true }, serve).listen(Number(port), '0.0.0.0');
net.createServer({ allowHalfOpen: true }, serve).listen({ port: Number(port), host: '::', ipv6Only: true });
for (const [type, addr] of [['udp4', vip], ['udp6', vip6]]) {
  const u = dgram.createSocket(type);
  u.on('message', (m, r) => u.send(Buffer.concat([Buffer.from(name + ' '), m.subarray(name.length + 1)]), r.port, r.address));
  u.bind(Number(port), addr);
}
`;


type Answer = LbAnswer;

function connect(srcs: string[], opts: { port?: number; req?: string; timeoutMs?: number; ns?: string; vip?: string } = {}): Answer[] {
  return lbConnect(opts.ns ?? bed.client, opts.vip ?? VIP, opts.port ?? PORT, srcs, opts);
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
  // No IPv6 chatter (router solicitations, MLD) towards the LB pod: its receive counter must count only what
  // is sent to it. The LB node's links are IPv6-less unless enabled below (the uplink and t3's veth).
  inNs(b.lbpod, 'sysctl', '-qw', 'net.ipv6.conf.all.disable_ipv6=1', 'net.ipv6.conf.default.disable_ipv6=1');
  inNs(b.lbnode, 'sysctl', '-qw', 'net.ipv6.conf.default.disable_ipv6=1');
  for (const ns of [b.router, b.lbnode]) {
    // IPv6 forwarding on the uplink is also what lets the datapath's IPv6 FIB lookups succeed (as ip_forward does IPv4's).
    for (const k of ['net.ipv4.ip_forward=1', 'net.ipv6.conf.all.forwarding=1', 'net.ipv4.conf.all.rp_filter=0', 'net.ipv4.conf.default.rp_filter=0', 'net.ipv4.conf.all.send_redirects=0']) inNs(ns, 'sysctl', '-qw', k);
  }
  const addr6 = (ns: string, a: string, dev: string) => sh('ip', '-n', ns, 'addr', 'add', a, 'dev', dev, 'nodad');
  const link = (ns: string, ifName: string, addr: string, routerIf: string, routerAddr: string, a6: string, routerA6: string) => {
    sh('ip', '-n', b.router, 'link', 'add', routerIf, 'type', 'veth', 'peer', 'name', ifName, 'netns', ns);
    if (ns === b.lbnode) inNs(ns, 'sysctl', '-qw', `net.ipv6.conf.${ifName}.disable_ipv6=0`);
    sh('ip', '-n', b.router, 'addr', 'add', `${routerAddr}/24`, 'dev', routerIf);
    addr6(b.router, `${routerA6}/64`, routerIf);
    sh('ip', '-n', b.router, 'link', 'set', routerIf, 'up');
    sh('ip', '-n', ns, 'addr', 'add', `${addr}/24`, 'dev', ifName);
    addr6(ns, `${a6}/64`, ifName);
    sh('ip', '-n', ns, 'link', 'set', ifName, 'up');
    sh('ip', '-n', ns, 'route', 'add', 'default', 'via', routerAddr);
    sh('ip', '-n', ns, '-6', 'route', 'add', 'default', 'via', routerA6);
  };
  link(b.client, 'c0', clients[0], 'rc', ROUTER_CLIENT_SIDE, V6.clients[0], V6.routerClientSide);
  for (const c of clients.slice(1)) sh('ip', '-n', b.client, 'addr', 'add', `${c}/24`, 'dev', 'c0');
  for (const c of V6.clients.slice(1)) addr6(b.client, `${c}/64`, 'c0');
  link(b.lbnode, 'n0', NODE, 'rn', '10.93.2.1', V6.node, 'fd93:2::1');
  link(b.t1, 'eth0', T1, 'r1', '10.93.3.1', V6.t1, 'fd93:3::1');
  link(b.t2, 'eth0', T2, 'r2', '10.93.4.1', V6.t2, 'fd93:4::1');
  // The VIPs, and the LB node's own pod t3 (reached directly only by the readiness check), via the LB node.
  for (const f of FAMILIES) {
    for (const v of [f.vip, f.vip2, f.t3]) sh('ip', '-n', b.router, ...(f.v6 ? ['-6'] : []), 'route', 'add', `${v}/${f.v6 ? 128 : 32}`, 'via', f.node);
  }

  // Pods on the LB node as ptp wires them: a veth whose host side holds the gateway address, a /32 route
  // (and, with IPv6, the same in /128s).
  const pod = (ns: string, hostIf: string, gw: string, addr: string, v6?: { gw: string; addr: string }) => {
    sh('ip', '-n', b.lbnode, 'link', 'add', hostIf, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', ns);
    sh('ip', '-n', b.lbnode, 'addr', 'add', `${gw}/32`, 'dev', hostIf);
    sh('ip', '-n', b.lbnode, 'link', 'set', hostIf, 'up');
    sh('ip', '-n', b.lbnode, 'route', 'add', `${addr}/32`, 'dev', hostIf);
    sh('ip', '-n', ns, 'addr', 'add', `${addr}/32`, 'dev', 'eth0');
    sh('ip', '-n', ns, 'link', 'set', 'eth0', 'up');
    sh('ip', '-n', ns, 'route', 'add', `${gw}/32`, 'dev', 'eth0');
    sh('ip', '-n', ns, 'route', 'add', 'default', 'via', gw, 'dev', 'eth0');
    if (!v6) return;
    inNs(b.lbnode, 'sysctl', '-qw', `net.ipv6.conf.${hostIf}.disable_ipv6=0`);
    addr6(b.lbnode, `${v6.gw}/128`, hostIf);
    sh('ip', '-n', b.lbnode, '-6', 'route', 'add', `${v6.addr}/128`, 'dev', hostIf);
    addr6(ns, `${v6.addr}/128`, 'eth0');
    sh('ip', '-n', ns, '-6', 'route', 'add', `${v6.gw}/128`, 'dev', 'eth0');
    sh('ip', '-n', ns, '-6', 'route', 'add', 'default', 'via', v6.gw, 'dev', 'eth0');
  };
  pod(b.lbpod, 'lbv', '10.93.20.1', LBPOD);
  pod(b.t3, 'lt3', '10.93.21.1', T3, { gw: 'fd93:21::1', addr: V6.t3 });
  // What tetherd does for an LB pod, in either mode: the VIPs routed to it (the node's own senders take
  // this path), the node accepting its own address as the source of what the pod sends back.
  for (const v of [VIP, VIP2]) sh('ip', '-n', b.lbnode, 'route', 'add', `${v}/32`, 'via', LBPOD, 'dev', 'lbv', 'onlink');
  inNs(b.lbnode, 'sysctl', '-qw', 'net.ipv4.conf.lbv.accept_local=1', 'net.ipv4.conf.lbv.rp_filter=0');

  ensureBpffs(b.pinDir);
  const targets = [[b.t1, 't1', T1, b.router, 'r1'], [b.t2, 't2', T2, b.router, 'r2'], [b.t3, 't3', T3, b.lbnode, 'lt3']] as const;
  for (const [ns, name, addr, hostNs, hostIf] of targets) {
    for (const v of [VIP, VIP2]) sh('ip', '-n', ns, 'addr', 'add', `${v}/32`, 'dev', 'lo');
    for (const v of [V6.vip, V6.vip2]) addr6(ns, `${v}/128`, 'lo');
    for (const k of ['all', 'eth0']) inNs(ns, 'sysctl', '-qw', `net.ipv4.conf.${k}.arp_ignore=1`, `net.ipv4.conf.${k}.arp_announce=2`);
    sh('ip', '-n', ns, 'link', 'set', 'eth0', 'mtu', '1472');
    // IPv6 in FoU over outer IPv6 has 48 bytes less (not 28): the target's IPv6 MTU, and so its MSS, says so
    // (set after the link's, which resets it).
    inNs(ns, 'sysctl', '-qw', 'net.ipv6.conf.eth0.mtu=1452');
    const addr6of = { t1: V6.t1, t2: V6.t2, t3: V6.t3 }[name];
    // Decapsulated at the egress of the link into the target, as tetherd does on a target pod's host-side veth.
    b.decaps.push(attachFouDecap({
      netns: `/run/netns/${hostNs}`, ifName: hostIf, direction: 'egress', port: FOU_PORT, localAddress: addr, localAddress6: addr6of, allowedSources: [NODE, V6.node],
    }));
    b.servers.push(spawn('nsenter', [`--net=/run/netns/${ns}`, process.execPath, '-e', SERVER_JS, name, String(PORT), VIP, V6.vip], { stdio: ['ignore', 'pipe', 'ignore'] }));
  }
  b.lb = LbDatapath.load({ pinDir: b.pinDir, maxVips: 4, maglevSize: M, maxMappings: MAX_MAPPINGS });
  b.lb.configure(NODE, FOU_PORT, V6.node);
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
  if (!macs.has(k)) macs.set(k, linkMac(ns, ifName));
  return macs.get(k)!;
};
type LbFrame = Omit<FrameSpec, 'dstMac' | 'srcMac'> & {
  /** Destination MAC (default: the LB node's uplink). */
  dstMac?: Buffer;
};

/** A frame from the router to the LB node's uplink (ip-frames.ts). UDP checksum 0: over IPv6 the target drops it, after the LB counted it. */
function frame(f: LbFrame): Buffer {
  return ipFrame({ ...f, dstMac: f.dstMac ?? macOf(bed.lbnode, 'n0'), srcMac: macOf(bed.router, 'rn') });
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
    addr.writeInt32LE(ifindex, 4);
    addr.writeUInt8(6, 11);
    macOf(bed.lbnode, 'n0').copy(addr, 12);
    for (let i = 0; i < frames.length; i += 64) {
      for (const f of frames.slice(i, i + 64)) {
        addr.writeUInt16BE(f.readUInt16BE(12), 2); // the frame's EtherType
        sendto(fd, f, addr);
      }
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
  for (const f of FAMILIES) {
    bed.lb!.setService(f.vip, f.slot, [{ port: PORT, proto: PROTO.TCP }, { port: PORT, proto: PROTO.UDP }], 0);
    bed.lb!.setService(f.vip2, f.slot2, [{ port: FLOOD_PORT, proto: PROTO.UDP }], LB_F_PER_FLOW);
    setTargets([f.t1, f.t2, f.t3], [], f.vip, f.slot);
    setTargets([f.t1, f.t2], [], f.vip2, f.slot2);
  }
  // Servers are up once each answers on its own address, in each family.
  await waitFor(() => FAMILIES.every((f) => lbConnect(bed.client, f.t1, PORT, [f.clients[0]], { timeoutMs: 1000 })[0].ok &&
    lbConnect(bed.client, f.t2, PORT, [f.clients[0]], { timeoutMs: 1000 })[0].ok && lbConnect(bed.client, f.t3, PORT, [f.clients[0]], { timeoutMs: 1000 })[0].ok),
  'target servers listening', { timeoutMs: 15000, intervalMs: 200 });
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

/** An encapsulated packet seen on the wire: the outer addresses and UDP header, and the inner source. */
interface Outer { family: 4 | 6; src: string; dst: string; dport: number; udpCsum: number; udpLen: number; innerLen: number; innerSrc: string }

/**
 * Runs fn while tcpdump records the FoU packets the LB node sends out its uplink (on the router's side of
 * it: t1's and t2's, not t3's, which never leave the node), and returns them parsed.
 */
async function captureFou(fn: () => void): Promise<Outer[]> {
  // The capture comes on stdout (tcpdump writing a file would drop its privileges to the file's new owner
  // first), each packet as it comes (--immediate-mode: not held in a ring block that SIGINT discards).
  const td = spawn('nsenter', [`--net=/run/netns/${bed.router}`, 'tcpdump', '-i', 'rn', '-nn', '--immediate-mode', '-U', '-w', '-', `udp dst port ${FOU_PORT}`], { stdio: ['ignore', 'pipe', 'pipe'] });
  const exited = new Promise((r) => td.on('exit', r));
  const chunks: Buffer[] = [];
  let err = '';
  td.stdout!.on('data', (d: Buffer) => chunks.push(d));
  td.stderr!.on('data', (d) => (err += d));
  try {
    await waitFor(() => err.includes('listening on'), 'tcpdump listening', { timeoutMs: 5000, intervalMs: 50 });
    fn();
  } finally {
    await sleep(200);
    td.kill('SIGINT');
    await exited;
  }
  const pcap = Buffer.concat(chunks);
  const out: Outer[] = [];
  for (let off = 24; off + 16 <= pcap.length;) {
    const len = pcap.readUInt32LE(off + 8);
    const p = pcap.subarray(off + 16, off + 16 + len);
    off += 16 + len;
    const v6 = p.readUInt16BE(12) === 0x86dd;
    const ipLen = v6 ? 40 : 20;
    const udpOff = 14 + ipLen;
    const inner = p.subarray(udpOff + 8);
    const innerV6 = inner[0] >> 4 === 6;
    out.push({
      family: v6 ? 6 : 4,
      src: bytesToIp(p.subarray(v6 ? 22 : 26, v6 ? 38 : 30)),
      dst: bytesToIp(p.subarray(v6 ? 38 : 30, v6 ? 54 : 34)),
      dport: p.readUInt16BE(udpOff + 2),
      udpLen: p.readUInt16BE(udpOff + 4),
      udpCsum: p.readUInt16BE(udpOff + 6),
      innerLen: innerV6 ? 40 + inner.readUInt16BE(4) : inner.readUInt16BE(2),
      innerSrc: bytesToIp(inner.subarray(innerV6 ? 8 : 12, innerV6 ? 24 : 16)),
    });
  }
  return out;
}

// ---- the tests, as functions of the family: registered below, all IPv4 ones first, then their IPv6 twins ----

const sticks = (f: Family) => async () => {
  const events: Array<{ client: string; target: string }> = [];
  // Reports of the tests before wait unread: drained first, so what follows is this test's.
  bed.lb!.onEvents(() => undefined);
  bed.lb!.pollEvents();
  bed.lb!.onEvents((e) => {
    if (e.key.vip === f.vip) events.push({ client: e.key.client, target: e.target });
  });
  const podRx = lbPodRx();
  let first: Answer[] = [];
  const wire = await captureFou(() => (first = connect(f.clients, { vip: f.vip })));
  const second = connect(f.clients, { vip: f.vip });
  for (const a of [...first, ...second]) {
    assert.ok(a.ok, `connection from ${a.src}: ${a.error}`);
    assert.is(a.peer, a.src, 'the target saw the real client address');
  }
  const byClient = new Map(first.map((a) => [a.src, a.who]));
  for (const a of second) assert.is(a.who, byClient.get(a.src), `client ${a.src} went to the same target twice`);
  assert.equal([...new Set(first.map((a) => a.who))].sort(), ['t1', 't2', 't3'], 'clients spread over the remote targets and the local one');
  assert.is(lbPodRx(), podRx, 'no packet entered the LB pod');
  // On the wire to t1 and t2: FoU in an outer header of the family (IPv4 20 + 8 bytes, IPv6 40 + 8), from
  // the node's address to the target's; the outer UDP checksum 0 (RFC 6935 for IPv6); the inner packet whole.
  const remote = first.filter((a) => a.who !== 't3').length;
  assert.ok(wire.length >= remote * 2, `encapsulated packets seen on the uplink: ${wire.length} for ${remote} connections`);
  for (const o of wire) {
    assert.equal([o.family, o.src, o.dport, o.udpCsum], [f.v6 ? 6 : 4, f.node, FOU_PORT, 0], `outer header ${JSON.stringify(o)}`);
    assert.ok(o.dst === f.t1 || o.dst === f.t2, `to a remote target: ${o.dst}`);
    assert.is(o.udpLen, 8 + o.innerLen, 'the UDP payload is the inner packet');
    assert.ok(f.clients.includes(o.innerSrc), `the inner source is a client: ${o.innerSrc}`);
    assert.is(NAMES[o.dst], byClient.get(o.innerSrc), `${o.innerSrc}'s packets went to the target that answered`);
  }

  const maps = mappingsOf(f).filter((m) => m.vip === f.vip);
  assert.is(maps.length, f.clients.length, 'one mapping per client (client affinity)');
  for (const m of maps) assert.is(NAMES[m.target], byClient.get(m.client), `mapping of ${m.client} names the target that answered`);
  bed.lb!.pollEvents();
  assert.is(events.length, f.clients.length, 'each new mapping reported once on the ring buffer');
  for (const e of events) assert.is(NAMES[e.target], byClient.get(e.client));
  const st = stats(f.slot);
  assert.is(st.misses, BigInt(f.clients.length));
  assert.ok(st.packets > 0n && st.dropError === 0n && st.dropNoRoute === 0n && st.reportLost === 0n && st.dropBadHeader === 0n, show(st));
};

const ownSenders = () => {
  const podRx = lbPodRx();
  const [a] = connect([NODE], { ns: bed.lbnode });
  assert.ok(a.ok, `from the LB node itself: ${a.error}`);
  assert.is(a.peer, NODE);
  assert.ok(lbPodRx() > podRx, 'the node\'s own connection went through the LB pod');
  const m = bed.lb!.mappings().find((x) => x.vip === VIP && x.client === NODE);
  assert.is(m && NAMES[m.target], a.who, 'the LB pod\'s program recorded its pick in the shared table');
};

const installed = (f: Family) => () => {
  const c = f.clients[11];
  const natural = connect([c], { vip: f.vip })[0].who;
  const forced = natural === 't1' ? f.t2 : f.t1;
  bed.lb!.installMappings([{ key: { vip: f.vip, client: c, vport: 0, cport: 0, proto: 0 }, target: forced }]);
  for (const a of connect([c, c, c], { vip: f.vip })) assert.is(a.who, NAMES[forced], 'the installed mapping is followed');
};

const removed = (f: Family) => () => {
  const before = new Map(connect(f.clients, { vip: f.vip }).map((a) => [a.src, a.who]));
  setTargets([f.t2, f.t3], [], f.vip, f.slot);
  for (const a of connect(f.clients, { vip: f.vip })) {
    assert.ok(a.ok, `${a.src}: ${a.error}`);
    if (before.get(a.src) !== 't1') assert.is(a.who, before.get(a.src), `${a.src} stays where it was`);
    else assert.ok(a.who === 't2' || a.who === 't3', `${a.src} moved off the removed target`);
  }
  bed.lb!.installMappings(f.clients.slice(0, 3).map((client) => ({ key: { vip: f.vip, client, vport: 0, cport: 0, proto: 0 }, target: f.t1 })));
  setTargets([f.t2, f.t3], [f.t1], f.vip, f.slot);
  for (const a of connect(f.clients.slice(0, 3), { vip: f.vip })) assert.is(a.who, 't1', `${a.src} stays on the terminating target`);
  setTargets([f.t1, f.t2, f.t3], [], f.vip, f.slot);
};

// The row changes under live mappings: a target added moves some clients' Maglev pick, but their mappings
// keep them where they are; a new client follows the new row.
const tableChange = (f: Family) => () => {
  bed.lb!.deleteMappings((m) => m.vip === f.vip);
  setTargets([f.t1, f.t2], [], f.vip, f.slot);
  try {
    const before = new Map(connect(f.clients, { vip: f.vip }).map((a) => [a.src, a.who]));
    const row = maglevTable([f.t1, f.t2, f.t3], M);
    const pick = (client: string) => NAMES[pickOf(row, { vip: f.vip, client, vport: 0, cport: 0, proto: 0 }, LB_HASH_SEED)!];
    const moved = f.clients.filter((c) => pick(c) !== before.get(c));
    assert.ok(moved.length > 0, 'the new row alone would move some clients');
    setTargets([f.t1, f.t2, f.t3], [], f.vip, f.slot);
    for (const a of connect(f.clients, { vip: f.vip })) assert.is(a.who, before.get(a.src), `${a.src} kept its target by its mapping`);
    const fresh = f.host(60);
    addClient(f, fresh);
    assert.is(connect([fresh], { vip: f.vip })[0].who, pick(fresh), 'a new client takes the new row');
  } finally {
    setTargets([f.t1, f.t2, f.t3], [], f.vip, f.slot);
  }
};

const dsr = (f: Family) => () => {
  const before = stats(f.slot);
  const a = connect([f.clients[0]], { vip: f.vip, req: 'big', timeoutMs: 10000 })[0];
  assert.ok(a.ok, a.error);
  assert.ok((a.bytes ?? 0) > 400 * 1024, `downloaded ${a.bytes}`);
  const through = Number(stats(f.slot).bytes - before.bytes);
  assert.ok(through < 40 * 1024, `only client-to-target bytes pass the LB (${through} B for a 400 KB download)`);
};

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

const uploads = (f: Family) => () => {
  const before = stats(f.slot);
  for (let i = 0; i < 3; i++) {
    const out = inNs(bed.client, process.execPath, '-e', UPLOAD_JS, f.vip, String(PORT), '16');
    const r = JSON.parse(out.trim().split('\n').pop()!);
    assert.ok(r.answer, `upload ${i + 1}: ${out}`);
    assert.is(Number(r.answer.split(' ')[1]), 16 * 1024 * 1024, `upload ${i + 1} byte count`);
  }
  const after = stats(f.slot);
  assert.is(after.tooBig, before.tooBig, 'segments sized by the target\'s MSS fit once encapsulated');
  assert.ok(after.bytes - before.bytes >= 3n * 16n * 1024n * 1024n, `the uploads passed the node datapath (${show(after)})`);
  assert.is(after.dropError, before.dropError);
};

const noPort = (f: Family) => () => {
  const before = stats(f.slot).dropNoPort;
  const a = connect([f.clients[0]], { vip: f.vip, port: 9999, timeoutMs: 1500 })[0];
  assert.not.ok(a.ok, 'no answer on an unserved port');
  assert.ok(stats(f.slot).dropNoPort > before);
};

const errorBehindTarget = (f: Family) => () => {
  // The router's link to the client shrinks: the target's full-size replies no longer fit, and the router's
  // frag-needed (Packet Too Big) goes to the VIP, i.e. to the LB node.
  sh('ip', '-n', bed.router, 'link', 'set', 'rc', 'mtu', String(f.smallMtu));
  try {
    const before = stats(f.slot);
    const a = connect([f.clients[1]], { vip: f.vip, req: 'big', timeoutMs: 15000 })[0];
    assert.ok(a.ok, `download through the smaller MTU: ${a.error}`);
    assert.ok((a.bytes ?? 0) > 400 * 1024);
    const after = stats(f.slot);
    assert.ok(after.icmpForwarded > before.icmpForwarded, `the node forwarded the ICMP error (${show(after)})`);
    assert.is(after.dropIcmpNoFlow, before.dropIcmpNoFlow);
  } finally {
    sh('ip', '-n', bed.router, 'link', 'set', 'rc', 'mtu', '1500');
    // An MTU below 1280 took the link's IPv6 addresses away.
    sh('ip', '-n', bed.router, 'addr', 'replace', `${V6.routerClientSide}/64`, 'dev', 'rc', 'nodad');
  }
};

// A connected UDP socket sends full-size datagrams (a 1500-byte packet: 1472 bytes of data over IPv4, DF
// set; 1452 over IPv6) until one is echoed; prints the attempts. "warm": a 64-byte datagram goes first, the
// first full-size one right behind it (so the node has just looked the target's next hop up).
const UDP_JS = `
const dgram = require('dgram');
const [host, port, src, size, warm] = process.argv.slice(1);
const s = dgram.createSocket(host.includes(':') ? 'udp6' : 'udp4');
let n = 0;
const t0 = Date.now();
s.on('message', (m) => { if (m.length === Number(size)) { console.log(JSON.stringify({ attempts: n, who: String(m.subarray(0, 2)) })); process.exit(0); } });
s.on('error', () => {});
s.bind(0, src, () => s.connect(Number(port), host, () => {
  const send = () => { n++; s.send(Buffer.alloc(Number(size), 65)); if (Date.now() - t0 > 8000) { console.log(JSON.stringify({ attempts: n })); process.exit(0); } };
  if (warm) s.send(Buffer.alloc(64, 66), send);
  else send();
  setInterval(send, 300);
}));`;

const tooBig = (f: Family) => () => {
  const src = f.clients[4];
  const before = stats(f.slot);
  const out = inNs(bed.client, process.execPath, '-e', UDP_JS, f.vip, String(PORT), src, String(1500 - (f.v6 ? 48 : 28)));
  const r = JSON.parse(out.trim().split('\n').pop()!) as { attempts: number; who?: string };
  const after = stats(f.slot);
  assert.ok(after.tooBig > before.tooBig, `${f.tooBig} sent (${show(after)})`);
  // The MTU the client was told: the uplink's 1500 less the encapsulation.
  assert.match(inNs(bed.client, 'ip', ...(f.v6 ? ['-6'] : []), 'route', 'get', f.vip, 'from', src), new RegExp(`mtu ${f.innerMtu}\\b`), 'the client learnt the path MTU from the VIP\'s answer');
  assert.ok(r.who, `a datagram was echoed after ${r.attempts} attempts`);
  assert.ok(after.fragments > before.fragments, 'later fragments were forwarded after their first');
  assert.is(after.dropFragment, before.dropFragment);
};

// The node program keeps the FIB's answer towards a target for 100 ms (bpf/lb-nexthop.h): a neighbour or route
// change still reaches the packets after that, and a packet over the path MTU of the cached answer is
// answered with that MTU, as the FIB itself would.
const NH_TTL_MS = 100;
const nextHopChange = (f: Family) => async () => {
  const c = f.clients[12];
  const gw = f.v6 ? 'fd93:2::1' : '10.93.2.1';
  const fam = f.v6 ? ['-6'] : [];
  bed.lb!.installMappings([{ key: { vip: f.vip, client: c, vport: 0, cport: 0, proto: 0 }, target: f.t1 }]);
  assert.is(connect([c], { vip: f.vip })[0].who, 't1', 'through the next hop as resolved');
  // The router's MAC as the LB node knows it becomes one nobody has.
  inNs(bed.lbnode, 'ip', 'neigh', 'replace', gw, 'lladdr', '02:00:5e:00:53:01', 'dev', 'n0', 'nud', 'permanent');
  try {
    await sleep(NH_TTL_MS + 50);
    const lost = connect([c], { vip: f.vip, timeoutMs: 1500 })[0];
    assert.not.ok(lost.ok, 'once the cached answer expired, packets went to the new neighbour entry');
  } finally {
    inNs(bed.lbnode, 'ip', 'neigh', 'del', gw, 'dev', 'n0');
  }
  await sleep(NH_TTL_MS + 50);
  const back = connect([c], { vip: f.vip })[0];
  assert.ok(back.ok, `the neighbour resolved again: ${back.error}`);
  assert.is(back.who, 't1');

  // A route with a smaller MTU towards the target (locked: forwarding, which the FIB lookup is, ignores a
  // route's MTU otherwise): clients are told that MTU less the encapsulation. The client's learnt path MTUs
  // are forgotten first (earlier tests taught it the uplink's).
  const mtu = 1400;
  const told = mtu - (f.v6 ? 48 : 28);
  inNs(bed.client, 'ip', ...fam, 'route', 'flush', 'cache');
  inNs(bed.lbnode, 'ip', ...fam, 'route', 'add', `${f.t1}/${f.v6 ? 128 : 32}`, 'via', gw, 'dev', 'n0', 'mtu', 'lock', String(mtu));
  try {
    await sleep(NH_TTL_MS + 50);
    const before = stats(f.slot);
    // The small datagram makes the node look the route up and cache it; the full-size one right behind it
    // finds the cached answer over its MTU.
    const out = inNs(bed.client, process.execPath, '-e', UDP_JS, f.vip, String(PORT), c, String(1500 - (f.v6 ? 48 : 28)), 'warm');
    const r = JSON.parse(out.trim().split('\n').pop()!) as { attempts: number; who?: string };
    const after = stats(f.slot);
    assert.ok(after.tooBig > before.tooBig, `${f.tooBig} sent (${show(after)})`);
    const learnt = inNs(bed.client, 'ip', ...fam, 'route', 'get', f.vip, 'from', c);
    assert.match(learnt, new RegExp(`mtu ${told}\\b`), `the client was told the route's MTU less the encapsulation (${told}): ${learnt}`);
    assert.is(r.who, 't1', `a datagram was echoed by t1 after ${r.attempts} attempts`);
    // Over the cached MTU the first full-size datagram was answered at once, so the second (300 ms later,
    // fragmented by the client) was echoed; a cache hit that skipped the check would have sent the first out
    // too big to be delivered, and only a later one, past the cache's lifetime, would have been answered.
    assert.is(r.attempts, 2, 'the first full-size datagram was answered from the cached answer');
  } finally {
    inNs(bed.lbnode, 'ip', ...fam, 'route', 'del', `${f.t1}/${f.v6 ? 128 : 32}`);
    inNs(bed.client, 'ip', ...fam, 'route', 'flush', 'cache');
  }
};

const badInput = (f: Family) => async () => {
  const before = stats(f.slot);
  const spoofed = [f.host(201), f.host(202), f.host(203)];
  await sendFrames([
    frame({ src: spoofed[0], dst: f.vip, proto: PROTO.TCP, payload: syn(40001, PORT), badHeader: true }),
    frame({ src: spoofed[1], dst: f.vip, proto: PROTO.TCP, payload: syn(40002, PORT), options: true }),
    frame({ src: spoofed[2], dst: f.vip, proto: PROTO.UDP, payload: Buffer.alloc(64), fragOffset: 100, id: 0x4242 }),
  ]);
  const after = stats(f.slot);
  assert.is(after.dropBadHeader - before.dropBadHeader, 1n, f.v6 ? 'a payload length past the frame' : 'bad header checksum');
  assert.is(after.dropIpOptions - before.dropIpOptions, 1n, f.v6 ? 'a Hop-by-Hop header' : 'IP options');
  assert.is(after.dropFragment - before.dropFragment, 1n, 'a later fragment whose first was not seen');
  assert.is(after.misses, before.misses, 'no target was picked for any of them');
  assert.not.ok(bed.lb!.mappings().some((m) => spoofed.includes(m.client)), 'no mapping for their sources');
};

// A bridge floods a frame whose destination MAC it has forgotten to every port, and a promiscuous uplink
// sees frames for other hosts: the stack drops them (PACKET_OTHERHOST), so the datapath must too, or every LB
// node on the segment (a drained one included) forwards the same frame.
const notForHost = (f: Family) => async () => {
  inNs(bed.lbnode, 'ip', 'link', 'set', 'n0', 'promisc', 'on');
  try {
    const before = stats(f.slot);
    const notHostBefore = bed.lb!.nodeStats().notForHost;
    const foreign = [f.host(211), f.host(212)];
    await sendFrames([
      frame({ src: foreign[0], dst: f.vip, proto: PROTO.TCP, payload: syn(40011, PORT), dstMac: Buffer.from([0x02, 0x00, 0x5e, 0x10, 0x20, 0x30]) }),
      frame({ src: foreign[1], dst: f.vip, proto: PROTO.TCP, payload: syn(40012, PORT), dstMac: Buffer.alloc(6, 0xff) }),
    ]);
    const mid = stats(f.slot);
    assert.is(mid.packets, before.packets, `nothing forwarded to a target (${show(mid)})`);
    assert.is(mid.misses, before.misses, 'no target picked');
    assert.not.ok(bed.lb!.mappings().some((m) => foreign.includes(m.client)), 'no mapping for their sources');
    assert.is(bed.lb!.nodeStats().notForHost - notHostBefore, 2n, 'both counted as not for this host');
    // The same frame to the node's own MAC is balanced.
    const own = f.host(213);
    await sendFrames([frame({ src: own, dst: f.vip, proto: PROTO.TCP, payload: syn(40013, PORT) })]);
    const after = stats(f.slot);
    assert.is(after.packets - mid.packets, 1n, 'forwarded to a target');
    assert.ok(bed.lb!.mappings().some((m) => m.client === own), 'a mapping for the frame addressed to the node');
  } finally {
    inNs(bed.lbnode, 'ip', 'link', 'set', 'n0', 'promisc', 'off');
  }
};

const flood = (f: Family) => async () => {
  // Existing flows: mappings installed from the store and not used here yet (flows ECMP is about to move to
  // this node), each to the target Maglev would NOT pick, so a lost mapping shows as a moved connection.
  const pinned = [f.host(50), f.host(51), f.host(52), f.host(53)];
  for (const c of pinned) addClient(f, c);
  const natural = new Map(connect(pinned, { vip: f.vip }).map((a) => [a.src, a.who!]));
  bed.lb!.deleteMappings((m) => m.vip === f.vip && pinned.includes(m.client));
  const forced = new Map(pinned.map((c) => [c, natural.get(c) === 't1' ? f.t2 : f.t1]));
  const before = stats(f.slot2);
  const n = MAX_MAPPINGS * 4;
  await onOneCpu(async () => {
    bed.lb!.installMappings(pinned.map((client) => ({ key: { vip: f.vip, client, vport: 0, cport: 0, proto: 0 }, target: forced.get(client)! })));
    await sendFrames(Array.from({ length: n }, (_, i) => frame({ src: f.clients[i % f.clients.length], dst: f.vip2, proto: PROTO.UDP, payload: udp(20000 + i, FLOOD_PORT) })));
  });
  const after = stats(f.slot2);
  assert.is(mappingsOf(f).length, MAX_MAPPINGS, 'the table is full');
  assert.ok(after.mappingFull - before.mappingFull > 0n, `counted (${show(after)})`);
  assert.is(after.packets - before.packets, BigInt(n), 'every flood packet was still forwarded');
  for (const a of connect(pinned, { vip: f.vip })) assert.is(a.who, NAMES[forced.get(a.src)!], `${a.src} kept its target through the flood`);
  const maps = new Map(mappingsOf(f).filter((m) => m.vip === f.vip).map((m) => [m.client, m.target]));
  for (const c of pinned) assert.is(maps.get(c), forced.get(c), `${c}'s mapping is still there`);
  // Installing into the full table leaves out what does not fit, without failing.
  const extra = bed.lb!.installMappings([{ key: { vip: f.vip2, client: f.host(99), vport: FLOOD_PORT, cport: 1, proto: PROTO.UDP }, target: f.t1 }]);
  assert.equal(extra, { installed: 0, full: 1 });
};

const noTarget = (f: Family) => () => {
  // The flood left the table full: clear the VIP's other mappings first, so this is about targets only.
  bed.lb!.deleteMappings((m) => m.vip === f.vip2);
  const fresh = f.host(40);
  addClient(f, fresh);
  setTargets([], [], f.vip, f.slot);
  try {
    const before = stats(f.slot).dropNoTarget;
    const a = connect([fresh], { vip: f.vip, timeoutMs: 1500 })[0];
    assert.not.ok(a.ok);
    assert.ok(stats(f.slot).dropNoTarget > before);
  } finally {
    setTargets([f.t1, f.t2, f.t3], [], f.vip, f.slot);
  }
};

for (const f of FAMILIES) {
  const t = (name: string, fn: () => void | Promise<void>) => test(f.label + name, fn);
  t('clients stick to their targets (on other nodes and on this one), targets see the client, and nothing enters the LB pod', sticks(f));
  // The LB pod has no IPv6 here (see the top).
  if (!f.v6) t('the node\'s own senders take the LB pod\'s path, into the same mapping table', ownSenders);
  t('an installed mapping (from the store) decides over the Maglev table', installed(f));
  t('a removed target voids its mappings: its clients move, the others stay; a terminating one keeps its clients', removed(f));
  t('a table change (a target added) moves no mapped client; a new client follows the new row', tableChange(f));
  t('replies bypass the LB node (DSR): a 400 KB download passes ~no reply bytes through it', dsr(f));
  t('uploads (GSO super-packets encapsulated at the uplink): 3 x 16 MB arrive whole, with no MTU answer', uploads(f));
  t('a port the VIP does not serve is dropped and counted', noPort(f));
  t('a path MTU drop behind the target: the ICMP error reaches the target holding the flow', errorBehindTarget(f));
  t(`an MTU-sized packet that would not fit once encapsulated: ${f.tooBig} (MTU ${f.innerMtu}) to the client, which then fragments, and the fragments follow the first`, tooBig(f));
  t('a neighbour or route change reaches the packets once the cached next hop expires; a route\'s smaller MTU is told to the client', nextHopChange(f));
  t(`bad input is dropped and counted, and makes no mapping: ${f.v6 ? 'a bad payload length, a Hop-by-Hop header' : 'bad header checksum, IP options'}, a later fragment alone`, badInput(f));
  t('a VIP frame not addressed to the node (flooded, or seen by a promiscuous uplink) is not balanced, and is counted; one to the node\'s MAC is', notForHost(f));
  t('a flood of new flows fills the table: existing flows keep their targets, new ones are still forwarded, and it is counted', flood(f));
  t('no active target: new clients are dropped and counted', noTarget(f));
}

test.run();
