// A gateway pod's NAT on the real kernel (GatewayDatapath): a client flow that reaches a gateway before it
// has SNAT to a floating address (a standby, or an owner in the milliseconds before its rule is written)
// is dropped in the pod without a conntrack entry, so the same flow is NATed once the pod owns the address
// (a "no NAT" entry would keep the flow un-NATed for its whole life, and the node's guard would drop every
// packet of it). A second prepare (a tetherd restart) duplicates no rule and keeps an owned address's SNAT.
//
//   client 10.96.1.2 ─vcl─ node ─vgw─ gw pod 10.96.2.2 (eth0)        node ─vsv─ server 192.0.2.20
//   node: packets from the client's veth go to the gw pod (policy route); the pod forwards them back out
//   of eth0, SNATed; replies to the floating address are routed to the pod by own().
//
// The IPv6 tests add fd00:96:1::2, fd00:96:2::2 and 2001:db8:20::20 to the same namespaces. IPv6 packets
// reach the gateway pod by the node's policy route alone, not through FoU (the pod's IPv6 FoU decap is
// not used here), and the mark fou-decap would set for a flow pinned to an address is set by a small
// nft rule of the test's own in the pod (table ip6 test_mark).
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import * as fs from 'node:fs';
import { ensureBpffs } from '../../daemon/bpf/bpffs';
import { floatMark, GatewayDatapath } from '../../daemon/egress/gateway-datapath';
import { inNetns } from '../../daemon/sys/netns';
import { addNetns, delNetns, startInNetns, ipJson, nsSysctl, uniqueName } from '../lib/netns';
import { waitFor } from '../lib/wait';

const CLIENT = '10.96.1.2';
const GW = '10.96.2.2';
const SERVER = '192.0.2.20';
const FLOATING = '203.0.113.77';
const PORT = 7001;
const CLIENT_PORT = 40123;
const CLIENT6 = 'fd00:96:1::2';
const GW6 = 'fd00:96:2::2';
const SERVER6 = '2001:db8:20::20';
const FLOATING6 = '2001:db8:77::77';
/** Low 16 bits 0x78, unlike FLOATING6's 0x77: its own entry in the SNAT mark map. */
const FLOATING6_B = '2001:db8:77::1:78';
const MARKED_PORT = 40124;

interface Bed {
  node: string;
  client: string;
  gw: string;
  server: string;
  pinDir: string;
  datapath(): GatewayDatapath;
}

const sh = (cmd: string, ...args: string[]) => execFileSync(cmd, args, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
const inNs = (ns: string, ...cmd: string[]) => sh('ip', 'netns', 'exec', ns, ...cmd);
const onNode = <T>(b: Bed, fn: () => T): T => inNetns(`/run/netns/${b.node}`, fn);
const startOnNode = <T>(b: Bed, fn: () => Promise<T>): Promise<T> => startInNetns(`/run/netns/${b.node}`, fn);

async function withBed(fn: (b: Bed) => Promise<void>, o: { ipv6?: boolean } = {}): Promise<void> {
  const base = uniqueName('tgn');
  const b: Bed = {
    node: `${base}-node`,
    client: `${base}-cl`,
    gw: `${base}-gw`,
    server: `${base}-sv`,
    pinDir: `/sys/fs/bpf/tether-test/${base}`,
    datapath: () => new GatewayDatapath(
      { pod: 'egress-test/gw', netns: `/run/netns/${b.gw}`, podIp: GW, ...(o.ipv6 ? { podIp6: GW6 } : {}), ifName: 'eth0', hostIfName: 'vgw' },
      { uplink: 'vsv', fouPort: 5555, pinDir: b.pinDir },
    ),
  };
  const made: GatewayDatapath[] = [];
  const orig = b.datapath;
  b.datapath = () => {
    const d = orig();
    made.push(d);
    return d;
  };
  try {
    for (const ns of [b.node, b.client, b.gw, b.server]) addNetns(ns);
    inNs(b.node, 'sysctl', '-qw', 'net.ipv4.ip_forward=1', 'net.ipv4.conf.all.rp_filter=0');
    if (o.ipv6) {
      inNs(b.node, 'sysctl', '-qw', 'net.ipv6.conf.all.forwarding=1');
      // No duplicate address detection on the test's links: their addresses are usable at once.
      for (const ns of [b.node, b.client, b.gw, b.server]) inNs(ns, 'sysctl', '-qw', 'net.ipv6.conf.default.accept_dad=0', 'net.ipv6.conf.all.accept_dad=0');
    }
    const link = (ns: string, hostIf: string, hostAddr: string, addr: string) => {
      sh('ip', '-n', b.node, 'link', 'add', hostIf, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', ns);
      sh('ip', '-n', b.node, 'addr', 'add', `${hostAddr}/24`, 'dev', hostIf);
      sh('ip', '-n', b.node, 'link', 'set', hostIf, 'up');
      sh('ip', '-n', ns, 'addr', 'add', `${addr}/24`, 'dev', 'eth0');
      sh('ip', '-n', ns, 'link', 'set', 'eth0', 'up');
      sh('ip', '-n', ns, 'route', 'add', 'default', 'via', hostAddr);
      inNs(b.node, 'sysctl', '-qw', `net.ipv4.conf.${hostIf}.rp_filter=0`);
    };
    link(b.client, 'vcl', '10.96.1.1', CLIENT);
    link(b.gw, 'vgw', '10.96.2.1', GW);
    link(b.server, 'vsv', '192.0.2.1', SERVER);
    if (o.ipv6) {
      const link6 = (ns: string, hostIf: string, hostAddr: string, addr: string) => {
        sh('ip', '-n', b.node, '-6', 'addr', 'add', `${hostAddr}/64`, 'dev', hostIf, 'nodad');
        sh('ip', '-n', ns, '-6', 'addr', 'add', `${addr}/64`, 'dev', 'eth0', 'nodad');
        sh('ip', '-n', ns, '-6', 'route', 'add', 'default', 'via', hostAddr);
      };
      link6(b.client, 'vcl', 'fd00:96:1::1', CLIENT6);
      link6(b.gw, 'vgw', 'fd00:96:2::1', GW6);
      link6(b.server, 'vsv', '2001:db8:20::1', SERVER6);
      sh('ip', '-n', b.node, '-6', 'route', 'add', 'default', 'via', GW6, 'dev', 'vgw', 'table', '100');
      sh('ip', '-n', b.node, '-6', 'rule', 'add', 'iif', 'vcl', 'lookup', '100');
    }
    // The client's packets take the gateway pod as their way out (what FoU steering does on a node).
    sh('ip', '-n', b.node, 'route', 'add', 'default', 'via', GW, 'table', '100');
    sh('ip', '-n', b.node, 'rule', 'add', 'iif', 'vcl', 'lookup', '100');
    ensureBpffs(b.pinDir);
    await fn(b);
  } finally {
    for (const d of made) {
      try {
        onNode(b, () => d.teardown());
      } catch {
        // the namespaces go next, and everything in them
      }
    }
    delNetns(b.node, b.client, b.gw, b.server);
    fs.rmSync(b.pinDir, { recursive: true, force: true });
  }
}

/** A UDP echo server that records each datagram's source address. */
function udpServer(b: Bed): { proc: ChildProcess; sources: string[] } {
  const script = `const u = require('dgram').createSocket('udp4');
u.on('message', (m, r) => { process.stdout.write(r.address + '\\n'); u.send(m, r.port, r.address); });
u.bind(${PORT}, '0.0.0.0', () => process.stdout.write('ready\\n'));`;
  const proc = spawn('ip', ['netns', 'exec', b.server, process.execPath, '-e', script], { stdio: ['ignore', 'pipe', 'ignore'] });
  const sources: string[] = [];
  proc.stdout!.on('data', (d: Buffer) => sources.push(...d.toString().split('\n').filter(Boolean)));
  return { proc, sources };
}

/** Sends `count` datagrams from the client's fixed source port (one flow); resolves with the echoes received. */
function udpFlow(b: Bed, count: number): number {
  const script = `const u = require('dgram').createSocket('udp4'); let got = 0, sent = 0;
u.on('message', () => got++);
u.bind(${CLIENT_PORT}, () => { const t = setInterval(() => { if (sent === ${count}) { clearInterval(t); setTimeout(() => { process.stdout.write(String(got)); process.exit(0); }, 300); return; } u.send('x', ${PORT}, '${SERVER}'); sent++; }, 20); });`;
  return Number(inNs(b.client, process.execPath, '-e', script));
}

function clientEntries(b: Bed): string[] {
  return inNs(b.gw, 'conntrack', '-L', '-p', 'udp', '--orig-src', CLIENT)
    .split('\n')
    .filter((l) => l.includes(`sport=${CLIENT_PORT}`));
}

/** A UDP echo server on the server's IPv6 address that records each datagram's "source port". */
function udpServer6(b: Bed): { proc: ChildProcess; lines: string[]; seen: () => string[] } {
  const script = `const u = require('dgram').createSocket('udp6');
u.on('message', (m, r) => { process.stdout.write(r.address + ' ' + r.port + '\\n'); u.send(m, r.port, r.address); });
u.bind(${PORT}, '::', () => process.stdout.write('ready\\n'));`;
  const proc = spawn('ip', ['netns', 'exec', b.server, process.execPath, '-e', script], { stdio: ['ignore', 'pipe', 'ignore'] });
  const lines: string[] = [];
  proc.stdout!.on('data', (d: Buffer) => lines.push(...d.toString().split('\n').filter(Boolean)));
  return { proc, lines, seen: () => lines.filter((l) => l !== 'ready') };
}

/** `count` datagrams over IPv6 from the client's port `sport` (one flow); the echoes received. */
function udpFlow6(b: Bed, count: number, sport: number): number {
  const script = `const u = require('dgram').createSocket('udp6'); let got = 0, sent = 0;
u.on('message', () => got++);
u.bind(${sport}, () => { const t = setInterval(() => { if (sent === ${count}) { clearInterval(t); setTimeout(() => { process.stdout.write(String(got)); process.exit(0); }, 300); return; } u.send('x', ${PORT}, '${SERVER6}'); sent++; }, 20); });`;
  return Number(inNs(b.client, process.execPath, '-e', script));
}

function clientEntries6(b: Bed, sport: number): string[] {
  return inNs(b.gw, 'conntrack', '-L', '-f', 'ipv6', '-p', 'udp', '--orig-src', CLIENT6)
    .split('\n')
    .filter((l) => l.includes(`sport=${sport}`));
}

/** The bed with the UDP server listening and the gateway prepared toward 192.0.2.0/24 (owning nothing yet). */
async function withPreparedGateway(fn: (b: Bed, srv: ReturnType<typeof udpServer>, dp: GatewayDatapath) => Promise<void>): Promise<void> {
  await withBed(async (b) => {
    const srv = udpServer(b);
    try {
      await waitFor(() => srv.sources.includes('ready'), 'the UDP server to listen');
      const dp = b.datapath();
      onNode(b, () => dp.prepare(['192.0.2.1'], { destinations: ['192.0.2.0/24'], excluded: [] }));
      await fn(b, srv, dp);
    } finally {
      srv.proc.kill();
    }
  });
}

test('a flow that reaches the gateway before its SNAT rule gets no conntrack entry, and is NATed once the pod owns the address', async () => {
  await withPreparedGateway(async (b, srv, dp) => {
    // Standby: the flow's packets die in the pod, and nothing is remembered about the flow.
    assert.is(udpFlow(b, 5), 0, 'no echo through a gateway that owns no address');
    await new Promise((r) => setTimeout(r, 200)); // anything the server printed is read by now
    assert.equal(srv.sources.filter((s) => s !== 'ready'), [], 'the server saw nothing');
    assert.equal(clientEntries(b), [], 'no conntrack entry for the client flow in the pod');
    const unnated = inNs(b.gw, 'nft', 'list', 'chain', 'ip', 'tether_egress', 'unnated');
    assert.match(unnated, /counter packets [1-9]/, `the pod dropped them itself: ${unnated}`);

    // Owner: the same flow (same 5-tuple) now leaves with the floating address and its echoes return.
    await startOnNode(b, () => dp.own(FLOATING, { mode: 'l2' }));
    assert.is(udpFlow(b, 5), 5, 'every echo through the owner');
    const seen = () => srv.sources.filter((s) => s !== 'ready');
    await waitFor(() => seen().length >= 5, 'the server to log the datagrams', { timeoutMs: 2000, describe: () => String(seen()) });
    assert.ok(seen().every((s) => s === FLOATING), `the server saw only the floating address: ${seen()}`);
    const entries = clientEntries(b);
    assert.is(entries.length, 1, `one entry for the flow: ${entries}`);
    assert.match(entries[0], new RegExp(`dst=${FLOATING.replace(/\./g, '\\.')}`), `NATed to the floating address: ${entries[0]}`);
    assert.is(dp.guardStats()?.droppedOtherSource, 0, 'the node guard dropped nothing');
  });
});

/** One datagram from the pod itself with the floating address as its source (as a synced flow's would leave). */
function sendFromFloating(b: Bed): void {
  inNs(b.gw, process.execPath, '-e', `const u = require('dgram').createSocket('udp4'); u.bind(0, '${FLOATING}', () => u.send('x', ${PORT}, '${SERVER}', (e) => { u.close(); if (e) { console.error(e.message); process.exit(1); } }));`);
}

test('anticipate: the node guard lets the pod use an address it is not handed yet, for the given time only, with nothing announced; own() in that time keeps it', async () => {
  await withPreparedGateway(async (b, srv, dp) => {
    // The address on the pod, and the pod's own datagrams from it untracked: so they leave as a synced
    // flow's forwarded packets do (the pod's unnated chain drops a new flow's first packet otherwise).
    inNs(b.gw, 'ip', 'addr', 'add', `${FLOATING}/32`, 'dev', 'lo');
    // The node's veth resolved from the pod's own address first (an ARP request from the floating address
    // gets no answer from a node that does not route it back).
    inNs(b.gw, 'sysctl', '-qw', 'net.ipv4.conf.all.arp_announce=2');
    execFileSync('ip', ['netns', 'exec', b.gw, 'nft', '-f', '-'], { input: `add table ip anticipate_test\nadd chain ip anticipate_test out { type filter hook output priority raw; }\nadd rule ip anticipate_test out ip saddr ${FLOATING} notrack\n` });
    const seen = () => srv.sources.filter((x) => x === FLOATING).length;
    const dropped = () => dp.guardStats()?.droppedOtherSource ?? 0;

    sendFromFloating(b);
    await waitFor(() => dropped() >= 1, 'the guard to drop the unowned source', { timeoutMs: 2000, describe: () => JSON.stringify({ guard: dp.guardStats(), seen: srv.sources, routes: inNs(b.gw, 'ip', 'route') }) });
    assert.is(seen(), 0, 'nothing from the floating address reached the server before anticipate');

    assert.ok(dp.anticipate(FLOATING, 400), 'anticipated');
    const allowed = () => dp.guardStats()?.allowed ?? 0;
    const before = dropped();
    sendFromFloating(b);
    // Past the guard: the node itself does not route the address back yet (its reverse-path check drops
    // the datagram here, where the bed's node has no default route), so the guard's count says it.
    await waitFor(() => allowed() === 1, 'the guard to let the anticipated source through', { timeoutMs: 2000, describe: () => JSON.stringify(dp.guardStats()) });
    assert.is(dropped(), before, 'the guard dropped nothing while anticipated');
    assert.equal(dp.ownedAddresses(), [], 'anticipated is not owned');
    assert.equal(ipJson(b.node, ['route', 'show', `${FLOATING}/32`]), [], 'no node route: nothing attracts traffic');
    assert.equal(ipJson(b.node, ['neigh', 'show', 'proxy']), [], 'no proxy ARP entry');

    await new Promise((r) => setTimeout(r, 500));
    sendFromFloating(b);
    await waitFor(() => dropped() > before, 'the guard to drop the source again once the time is over', { timeoutMs: 2000 });
    assert.is(allowed(), 1, 'no more let through');

    // Anticipated, then handed over within the time: the owner keeps its source after the timer.
    assert.ok(dp.anticipate(FLOATING, 200), 'anticipated again');
    await startOnNode(b, () => dp.own(FLOATING, { mode: 'l2' }));
    assert.not.ok(dp.anticipate(FLOATING, 200), 'an owned address is not anticipated');
    await new Promise((r) => setTimeout(r, 300));
    const held = dropped();
    sendFromFloating(b);
    await waitFor(() => seen() === 1, 'the owner\'s datagram at the server', { timeoutMs: 2000, describe: () => JSON.stringify(dp.guardStats()) });
    assert.is(dropped(), held, 'the timer did not take the owner\'s source away');
  });
});

test('prepare again on the same pod (a tetherd restart) duplicates no rule and keeps the SNAT of an owned address', async () => {
  await withBed(async (b) => {
    const guarded = { destinations: ['192.0.2.0/24'], excluded: [] };
    const first = b.datapath();
    onNode(b, () => first.prepare(['192.0.2.1'], guarded));
    await startOnNode(b, () => first.own(FLOATING, { mode: 'l2' }));
    const before = inNs(b.gw, 'nft', 'list', 'table', 'ip', 'tether_egress');
    const second = b.datapath();
    onNode(b, () => second.prepare(['192.0.2.1'], guarded));
    const after = inNs(b.gw, 'nft', 'list', 'table', 'ip', 'tether_egress');
    const rules = (t: string) => t.split('\n').filter((l) => /drop|accept;?$|snat/.test(l) && !/policy/.test(l)).map((l) => l.trim().replace(/counter packets \d+ bytes \d+ /, ''));
    assert.equal(rules(after), rules(before), `the same rules:\n${before}\n---\n${after}`);
    assert.match(after, new RegExp(`snat to ${FLOATING.replace(/\./g, '\\.')}`), 'the SNAT rule is kept');
    assert.is(rules(after).filter((r) => /ct state invalid/.test(r)).length, 2, 'one invalid-drop per chain (pre, forward)');
  });
});

const GUARDED6 = { destinations: ['192.0.2.0/24', '2001:db8:20::/64'], excluded: [] };
const re = (s: string) => new RegExp(s.replace(/[.:]/g, (c) => `\\${c}`));
const podAddresses6 = (b: Bed) => ipJson(b.gw, ['-6', 'addr', 'show', 'dev', 'lo']).flatMap((l) => l.addr_info.map((a: { local: string }) => a.local));
const nodeRoutes6 = (b: Bed, address: string) => ipJson(b.node, ['-6', 'route', 'show', `${address}/128`]);

test('IPv6: a flow that reaches the gateway before its SNAT rule gets no conntrack entry, and leaves SNATed to the IPv6 floating address once the pod owns it', async () => {
  await withBed(async (b) => {
    const srv = udpServer6(b);
    try {
      await waitFor(() => srv.lines.includes('ready'), 'the UDP6 server to listen');
      const dp = b.datapath();
      onNode(b, () => dp.prepare(['192.0.2.1'], GUARDED6));

      assert.is(udpFlow6(b, 5, CLIENT_PORT), 0, 'no echo through a gateway that owns no address');
      await new Promise((r) => setTimeout(r, 200));
      assert.equal(srv.seen(), [], 'the server saw nothing');
      assert.equal(clientEntries6(b, CLIENT_PORT), [], 'no conntrack entry for the client flow in the pod');
      const unnated = inNs(b.gw, 'nft', 'list', 'chain', 'ip6', 'tether_egress', 'unnated');
      assert.match(unnated, /counter packets [1-9]/, `the pod dropped them itself: ${unnated}`);
      assert.match(unnated, re(`ip6 saddr != ${GW6} oifname "eth0"`), 'the pod\'s own IPv6 address is not dropped');

      await startOnNode(b, () => dp.own(FLOATING6, { mode: 'l2' }));
      assert.ok(podAddresses6(b).includes(FLOATING6), 'the address is on the pod');
      const route = nodeRoutes6(b, FLOATING6);
      assert.equal(route.map((r) => [r.dev, r.gateway]), [['vgw', GW6]], `the node routes it to the pod: ${JSON.stringify(route)}`);
      assert.is(udpFlow6(b, 5, CLIENT_PORT), 5, 'every echo through the owner');
      await waitFor(() => srv.seen().length >= 5, 'the server to log the datagrams', { timeoutMs: 2000, describe: () => String(srv.seen()) });
      assert.ok(srv.seen().every((l) => l.startsWith(`${FLOATING6} `)), `the server saw only the floating address: ${srv.seen()}`);
      const entries = clientEntries6(b, CLIENT_PORT);
      assert.is(entries.length, 1, `one entry for the flow: ${entries}`);
      assert.match(entries[0], re(`dst=${FLOATING6} `), `NATed to the floating address: ${entries[0]}`);

      // The IPv4 table is untouched by IPv6 ownership: no SNAT rule in it.
      assert.not.match(inNs(b.gw, 'nft', 'list', 'chain', 'ip', 'tether_egress', 'postrouting'), /snat/, 'no IPv4 SNAT');

      await startOnNode(b, () => dp.release(FLOATING6));
      assert.not.ok(podAddresses6(b).includes(FLOATING6), 'release: the address is gone from the pod');
      assert.equal(nodeRoutes6(b, FLOATING6), [], 'release: the node route is gone');
      assert.not.match(inNs(b.gw, 'nft', 'list', 'chain', 'ip6', 'tether_egress', 'postrouting'), /snat/, 'release: no IPv6 SNAT left');
    } finally {
      srv.proc.kill();
    }
  }, { ipv6: true });
});

test('IPv6: with two owned addresses, a flow marked for the second leaves with it, an unmarked one with the first', async () => {
  await withBed(async (b) => {
    const srv = udpServer6(b);
    try {
      await waitFor(() => srv.lines.includes('ready'), 'the UDP6 server to listen');
      // What fou-decap does for a flow its client pinned to FLOATING6_B: FLOAT_MARK | the address's low 16 bits.
      const mark = floatMark(FLOATING6_B)!;
      assert.is(mark, 0x7e7e0078, 'the mark of an IPv6 address is FLOAT_MARK | its last 16 bits');
      assert.is(floatMark(FLOATING6), 0x7e7e0077);
      execFileSync('ip', ['netns', 'exec', b.gw, 'nft', '-f', '-'], {
        input: `table ip6 test_mark {
  chain pre { type filter hook prerouting priority -300; policy accept; ip6 saddr ${CLIENT6} udp sport ${MARKED_PORT} meta mark set 0x${mark.toString(16)}; }
}
`,
      });
      const dp = b.datapath();
      onNode(b, () => dp.prepare(['192.0.2.1'], GUARDED6));
      await startOnNode(b, () => dp.own(FLOATING6, { mode: 'l2' }));
      await startOnNode(b, () => dp.own(FLOATING6_B, { mode: 'l2' }));
      assert.is(udpFlow6(b, 3, CLIENT_PORT), 3, 'unmarked flow: every echo');
      assert.is(udpFlow6(b, 3, MARKED_PORT), 3, 'marked flow: every echo');
      await waitFor(() => srv.seen().length >= 6, 'the server to log the datagrams', { timeoutMs: 2000, describe: () => String(srv.seen()) });
      // The flow's reply tuple says what it was NATed to; the server saw exactly that source and port.
      const natOf = (port: number) => {
        const entries = clientEntries6(b, port);
        assert.is(entries.length, 1, `one entry for the flow from port ${port}: ${entries}`);
        const m = new RegExp(`src=${SERVER6} dst=(\\S+) sport=${PORT} dport=(\\d+)`).exec(entries[0]);
        assert.ok(m, `a reply tuple: ${entries[0]}`);
        assert.ok(srv.seen().includes(`${m![1]} ${m![2]}`), `the server saw ${m![1]} ${m![2]}: ${srv.seen()}`);
        return m![1];
      };
      assert.is(natOf(CLIENT_PORT), FLOATING6, 'unmarked: the first owned address');
      assert.is(natOf(MARKED_PORT), FLOATING6_B, 'marked: the address the mark names');
      const postrouting = inNs(b.gw, 'nft', 'list', 'chain', 'ip6', 'tether_egress', 'postrouting');
      assert.match(postrouting, re(`0x7e7e0078 : ${FLOATING6_B}`), `the mark map names the second address: ${postrouting}`);
    } finally {
      srv.proc.kill();
    }
  }, { ipv6: true });
});

test('IPv6: prepare again (a tetherd restart) duplicates no rule in either table and keeps the SNAT of owned addresses', async () => {
  await withBed(async (b) => {
    const first = b.datapath();
    onNode(b, () => first.prepare(['192.0.2.1'], GUARDED6));
    await startOnNode(b, () => first.own(FLOATING, { mode: 'l2' }));
    await startOnNode(b, () => first.own(FLOATING6, { mode: 'l2' }));
    const list = (family: string) => inNs(b.gw, 'nft', 'list', 'table', family, 'tether_egress');
    const before = { ip: list('ip'), ip6: list('ip6') };
    const second = b.datapath();
    onNode(b, () => second.prepare(['192.0.2.1'], GUARDED6));
    const after = { ip: list('ip'), ip6: list('ip6') };
    const rules = (t: string) => t.split('\n').filter((l) => /drop|accept;?$|snat/.test(l) && !/policy/.test(l)).map((l) => l.trim().replace(/counter packets \d+ bytes \d+ /, ''));
    assert.equal(rules(after.ip), rules(before.ip), `the same ip rules:\n${before.ip}\n---\n${after.ip}`);
    assert.equal(rules(after.ip6), rules(before.ip6), `the same ip6 rules:\n${before.ip6}\n---\n${after.ip6}`);
    assert.match(after.ip, re(`snat to ${FLOATING}`), 'the IPv4 SNAT rule is kept');
    assert.match(after.ip6, re(`snat to ${FLOATING6}`), 'the IPv6 SNAT rule is kept');
    assert.is(rules(after.ip6).filter((r) => /ct state invalid/.test(r)).length, 2, 'one invalid-drop per chain (pre, forward)');
    assert.is(rules(after.ip6).filter((r) => /nd-redirect/.test(r)).length, 1, 'one redirect drop');
    assert.is(nsSysctl(b.gw, 'net/ipv6/conf/all/forwarding'), '1', 'the pod forwards IPv6');
  }, { ipv6: true });
});

test('a gateway pod without IPv6 refuses an IPv6 address, naming the pod and the address, and changes nothing', async () => {
  await withBed(async (b) => {
    const dp = b.datapath();
    onNode(b, () => dp.prepare(['192.0.2.1'], { destinations: ['192.0.2.0/24'], excluded: [] }));
    const before = inNs(b.gw, 'nft', 'list', 'ruleset');
    for (const step of [() => dp.own(FLOATING6, { mode: 'l2' }), () => dp.takeUnannounced(FLOATING6, { mode: 'l2' })]) {
      const error = await startOnNode(b, step).then(() => undefined, (e: Error) => e);
      assert.ok(error && error.message.includes('egress-test/gw') && error.message.includes(FLOATING6) && /no IPv6 address/.test(error.message), `refused by name: ${error?.message}`);
    }
    assert.equal(dp.ownedAddresses(), [], 'not counted as owned');
    assert.not.ok(podAddresses6(b).includes(FLOATING6), 'not on the pod');
    assert.equal(nodeRoutes6(b, FLOATING6), [], 'no node route');
    assert.equal(ipJson(b.node, ['-6', 'neigh', 'show', 'proxy']), [], 'no proxy NDP entry');
    assert.is(inNs(b.gw, 'nft', 'list', 'ruleset'), before, 'the pod\'s nftables unchanged (and no ip6 table)');
    assert.not.match(before, /table ip6/, 'no ip6 table on a pod without IPv6');
  });
});

test.run();
