// The node's source guard on a gateway pod's host-side veth, against the real kernel: toward an Egress
// destination only a floating address the pod owns may be the source; the pod's own address and any other
// address (a client's, leaking un-NATed) are dropped and counted by reason; other destinations pass; an
// address released is refused again. tcpdump on the "external" server proves what reached it.
//
//   gw 10.93.2.2 (+ floating 203.0.113.9, + leaked client 10.92.1.2 on lo) ─vgw─ node ─ns0─ server 192.0.2.10
//   IPv6 beside it: gw fd00:93:2::2 (+ floating 2001:db8:f::9 on lo), server 2001:db8:10::10 behind node ::1
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { execFileSync, spawn } from 'node:child_process';
import * as crypto from 'node:crypto';
import * as fs from 'node:fs';
import { EgressGuard, type GuardStats } from '../../daemon/bpf/egress-guard';
import { ensureBpffs } from '../../daemon/bpf/bpffs';
import { queryTc } from '../../daemon/bpf/tc';

const id = crypto.randomBytes(3).toString('hex');
const NS = { node: `tgd-${id}-node`, gw: `tgd-${id}-gw`, server: `tgd-${id}-srv` };
const NODE = '192.0.2.1';
const SERVER = '192.0.2.10';
const GW = '10.93.2.2';
const FLOATING = '203.0.113.9';
const LEAKED = '10.92.1.2';
const NODE6 = '2001:db8:10::1';
const SERVER6 = '2001:db8:10::10';
const GW6 = 'fd00:93:2::2';
const FLOATING6 = '2001:db8:f::9';
const pinDir = `/sys/fs/bpf/tether-test/guard-${id}`;
const sh = (cmd: string, ...args: string[]) => execFileSync(cmd, args, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
const inNs = (ns: string, ...cmd: string[]) => sh('ip', 'netns', 'exec', ns, ...cmd);
let guard: EgressGuard | undefined;

function teardown(): void {
  try {
    guard?.detach();
  } catch {
    // namespace already gone
  }
  for (const ns of Object.values(NS)) {
    try {
      execFileSync('ip', ['netns', 'del', ns], { stdio: 'ignore' });
    } catch {
      // already gone
    }
  }
  fs.rmSync(pinDir, { recursive: true, force: true });
}

/** One ping from the gateway pod with a chosen source; true when the reply came back. */
function ping(src: string, dst = SERVER): boolean {
  try {
    inNs(NS.gw, 'ping', src.includes(':') ? '-6' : '-4', '-c', '1', '-W', '1', '-I', src, dst);
    return true;
  } catch {
    return false;
  }
}

const delta = (a: GuardStats, b: GuardStats) => Object.fromEntries(Object.keys(a).map((k) => [k, b[k as keyof GuardStats] - a[k as keyof GuardStats]])) as GuardStats;

test.before(() => {
  process.on('exit', teardown);
  for (const ns of Object.values(NS)) {
    sh('ip', 'netns', 'add', ns);
    sh('ip', '-n', ns, 'link', 'set', 'lo', 'up');
    inNs(ns, 'sysctl', '-qw', 'net.ipv6.conf.all.accept_dad=0', 'net.ipv6.conf.default.accept_dad=0');
  }
  inNs(NS.node, 'sysctl', '-qw', 'net.ipv4.ip_forward=1', 'net.ipv6.conf.all.forwarding=1');
  const link = (ns: string, hostIf: string, hostAddr: string, addr: string) => {
    sh('ip', '-n', NS.node, 'link', 'add', hostIf, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', ns);
    sh('ip', '-n', NS.node, 'addr', 'add', `${hostAddr}/24`, 'dev', hostIf);
    sh('ip', '-n', NS.node, 'link', 'set', hostIf, 'up');
    sh('ip', '-n', ns, 'addr', 'add', `${addr}/24`, 'dev', 'eth0');
    sh('ip', '-n', ns, 'link', 'set', 'eth0', 'up');
    sh('ip', '-n', ns, 'route', 'add', 'default', 'via', hostAddr);
  };
  link(NS.server, 'ns0', NODE, SERVER);
  link(NS.gw, 'vgw', '10.93.2.1', GW);
  for (const [ns, hostIf, hostAddr, addr] of [[NS.server, 'ns0', NODE6, SERVER6], [NS.gw, 'vgw', 'fd00:93:2::1', GW6]]) {
    sh('ip', '-n', NS.node, 'addr', 'add', `${hostAddr}/64`, 'dev', hostIf, 'nodad');
    sh('ip', '-n', ns, 'addr', 'add', `${addr}/64`, 'dev', 'eth0', 'nodad');
    sh('ip', '-n', ns, '-6', 'route', 'add', 'default', 'via', hostAddr);
  }
  sh('ip', '-n', NS.gw, 'addr', 'add', `${FLOATING6}/128`, 'dev', 'lo', 'nodad');
  sh('ip', '-n', NS.node, '-6', 'route', 'add', `${FLOATING6}/128`, 'via', GW6);
  for (const a of [FLOATING, LEAKED]) {
    sh('ip', '-n', NS.gw, 'addr', 'add', `${a}/32`, 'dev', 'lo');
    sh('ip', '-n', NS.node, 'route', 'add', `${a}/32`, 'dev', 'vgw');
  }
  inNs(NS.node, 'sysctl', '-qw', 'net.ipv4.conf.vgw.rp_filter=0', 'net.ipv4.conf.all.rp_filter=0');
  ensureBpffs(pinDir);
});

test.after(teardown);

test('toward a guarded destination only an owned floating address leaves; the server sees nothing else', async () => {
  const cap = spawn('ip', ['netns', 'exec', NS.server, 'tcpdump', '-n', '-l', '-i', 'eth0', 'icmp'], { stdio: ['ignore', 'pipe', 'pipe'] });
  let seen = '';
  cap.stdout.on('data', (b: Buffer) => (seen += b.toString()));
  await new Promise((r) => setTimeout(r, 800)); // tcpdump attached
  try {
    // Before the guard: everything reaches the server (the control that shows the test can fail).
    assert.ok(ping(LEAKED), 'without the guard the leaked source reaches the server');
    guard = EgressGuard.attach({ netns: `/run/netns/${NS.node}`, hostIfName: 'vgw', podIp: GW, destinations: ['192.0.2.0/24'], excluded: [`${NODE}/32`], pinDir });
    assert.ok(queryTc({ netns: `/run/netns/${NS.node}`, ifName: 'vgw', direction: 'ingress', handle: 1, priority: 0x120 }), 'filter attached');
    const s0 = guard.stats();
    const t0 = Date.now();
    assert.not.ok(ping(FLOATING), 'a floating address not owned (yet) is refused');
    assert.not.ok(ping(GW), "the pod's own address is refused toward the destination");
    assert.not.ok(ping(LEAKED), 'a client address leaking un-NATed is refused');
    const s1 = guard.stats();
    const d1 = delta(s0, s1);
    assert.is(d1.droppedPodSource, 1, JSON.stringify(d1));
    assert.is(d1.droppedOtherSource, 2, JSON.stringify(d1));
    assert.is(d1.allowed, 0);

    guard.own(FLOATING);
    assert.equal(guard.owned(), [FLOATING]);
    assert.ok(ping(FLOATING), 'an owned floating address leaves and its reply comes back');
    assert.not.ok(ping(GW), 'the pod address is still refused');
    assert.ok(ping(GW, NODE), 'an excluded destination (the node) is not guarded');
    assert.ok(ping(GW, '10.93.2.1'), 'a destination outside the guarded ones passes');
    const d2 = delta(s1, guard.stats());
    assert.ok(d2.allowed >= 1 && d2.notGuarded >= 2 && d2.droppedPodSource === 1, JSON.stringify(d2));

    guard.release(FLOATING);
    const t1 = Date.now();
    assert.not.ok(ping(FLOATING), 'a released address is refused again');
    assert.ok(delta(s1, guard.stats()).droppedOtherSource >= 1);
    await new Promise((r) => setTimeout(r, 300));
    const lines = seen.split('\n').filter((l) => / IP /.test(l));
    // Echo requests that reached the server while the guard was on: only from the floating address, and only while owned.
    const requests = lines.filter((l) => /echo request/.test(l));
    const fromPodOrClient = requests.filter((l) => l.includes(`IP ${GW} >`) && l.includes(`> ${SERVER}`) || l.includes(`IP ${LEAKED} > ${SERVER}`));
    assert.is(fromPodOrClient.length, 1, `only the control ping (before the guard) from a pod or client address reached the server: ${fromPodOrClient.join(' | ')}`);
    assert.ok(requests.some((l) => l.includes(`IP ${FLOATING} > ${SERVER}`)), 'the owned floating address reached the server');
    void t0;
    void t1;
  } finally {
    cap.kill('SIGTERM');
  }
});

test('a new attachment over the same pins keeps what is owned (a tetherd restart) and drops what was only anticipated; detach removes filter and pins', () => {
  guard!.own(FLOATING);
  // Anticipated by the process before (a failover in progress when it stopped): a source for a moment only,
  // which only that process could have taken back.
  guard!.anticipate(LEAKED);
  assert.equal(guard!.anticipated(), [LEAKED]);
  assert.ok(ping(LEAKED), 'an anticipated address passes the guard while anticipated');
  const again = EgressGuard.attach({ netns: `/run/netns/${NS.node}`, hostIfName: 'vgw', podIp: GW, destinations: ['192.0.2.0/24'], excluded: [`${NODE}/32`], pinDir });
  assert.equal(again.owned(), [FLOATING]);
  assert.equal(again.anticipated(), [], 'the new attachment removed the anticipated entry');
  assert.not.ok(ping(LEAKED), 'the address once anticipated is refused again');
  assert.ok(ping(FLOATING));
  again.detach();
  guard = undefined;
  assert.not.ok(queryTc({ netns: `/run/netns/${NS.node}`, ifName: 'vgw', direction: 'ingress', handle: 1, priority: 0x120 }), 'filter gone');
  assert.not.ok(fs.existsSync(`${pinDir}/egress-guard-vgw`), 'pins gone');
  assert.ok(ping(GW), 'without the guard the pod address passes again');
});

/** Sends one raw Ethernet frame of ethertype IPv6 from the gateway pod's eth0 to the node. */
function sendIpv6Frame(payload: Buffer): void {
  const mac = (ns: string, ifName: string) => JSON.parse(sh('ip', '-n', ns, '-j', 'link', 'show', ifName))[0].address.replace(/:/g, '');
  const frame = Buffer.concat([Buffer.from(mac(NS.node, 'vgw'), 'hex'), Buffer.from(mac(NS.gw, 'eth0'), 'hex'), Buffer.from([0x86, 0xdd]), payload]);
  inNs(NS.gw, 'python3', '-c', `import socket,sys; s=socket.socket(socket.AF_PACKET, socket.SOCK_RAW); s.bind(('eth0', 0)); s.send(bytes.fromhex(sys.argv[1]))`, frame.toString('hex'));
}

test('IPv6: the pod\'s own IPv6 is refused toward a guarded IPv6 destination, an owned IPv6 floating address passes; short frames are dropped', () => {
  guard = EgressGuard.attach({
    netns: `/run/netns/${NS.node}`, hostIfName: 'vgw', podIp: GW, podIp6: GW6, pinDir,
    destinations: ['192.0.2.0/24', '2001:db8:10::/64'], excluded: [`${NODE}/32`, `${NODE6}/128`],
  });
  // Control first: a destination outside the guarded ones, which also proves neighbour discovery from the
  // pod's own address gets through (ff02::1:ff… is inside no guarded prefix, but ::/0 would cover it).
  assert.ok(ping(GW6, NODE6), 'an excluded IPv6 destination (the node) is not guarded');
  const s0 = guard.stats();
  assert.not.ok(ping(GW6, SERVER6), "the pod's own IPv6 is refused toward the destination");
  assert.not.ok(ping(FLOATING6, SERVER6), 'an IPv6 floating address not owned (yet) is refused');
  const d1 = delta(s0, guard.stats());
  assert.is(d1.droppedPodSource, 1, JSON.stringify(d1));
  assert.is(d1.droppedOtherSource, 1, JSON.stringify(d1));
  assert.ok(d1.ipv6 >= 2, JSON.stringify(d1));

  guard.own(FLOATING6);
  guard.own(FLOATING);
  assert.equal(guard.owned(), [FLOATING, FLOATING6]);
  const s1 = guard.stats();
  assert.ok(ping(FLOATING6, SERVER6), 'an owned IPv6 floating address leaves and its reply comes back');
  assert.ok(ping(FLOATING), 'IPv4 keeps working beside it');
  assert.ok(delta(s1, guard.stats()).allowed >= 2);
  guard.release(FLOATING6);
  assert.equal(guard.owned(), [FLOATING]);
  assert.not.ok(ping(FLOATING6, SERVER6), 'a released IPv6 address is refused again');

  // ::/0 guarded: neighbour discovery with the pod's own address still passes (link scope is never guarded).
  guard.setDestinations(['::/0'], []);
  inNs(NS.gw, 'ip', '-6', 'neigh', 'flush', 'dev', 'eth0');
  assert.ok(ping(FLOATING), 'IPv4 is unaffected by an IPv6 destination');
  guard.own(FLOATING6);
  assert.ok(ping(FLOATING6, SERVER6), 'with ::/0 guarded the pod still resolves its router and the owned address passes');

  // Shorter than an IPv6 header, and a full-length header of version 4 under the IPv6 ethertype.
  const s2 = guard.stats();
  sendIpv6Frame(Buffer.from([0x60, 0, 0, 0, 0, 8, 17, 64]));
  sendIpv6Frame(Buffer.concat([Buffer.from([0x40]), Buffer.alloc(47)]));
  const d2 = delta(s2, guard.stats());
  assert.is(d2.droppedTruncated, 2, `malformed IPv6 dropped and counted: ${JSON.stringify(d2)}`);
  assert.is(d2.notGuarded + d2.allowed, 0, 'and not passed');
  guard.detach();
  guard = undefined;
});

test.run();
