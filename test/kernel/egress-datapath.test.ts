// Egress datapath against the real kernel: the steering program on a client pod's host-side veth wraps
// the pod's packets in FoU to a gateway pod, which decapsulates (fou-decap), SNATs to the floating
// address and forwards; replies come back through plain routing. Topology (each a namespace):
//
//   client 10.92.1.2 (mtu 1472) ─vcli─┐                 ┌─ gwa 10.92.2.2  (floating on lo, SNAT)
//   other  10.92.4.2            ─voth─┤ node 192.0.2.1  ├─ gwb 10.92.3.2  (floating on lo, SNAT)
//                                     └──────ns0────────┴─ server 192.0.2.10 ("external")
//
// The node routes each floating /32 to the pod that owns it. Cluster range 10.92.0.0/16 is a global
// BYPASS, the node address a BYPASS of the Egress, everything else (0.0.0.0/0) is steered.
// The IPv6 tests give every link a second, IPv6 address (fd00:92:<n>::/64, server 2001:db8:10::10 behind
// node 2001:db8:10::1) and steer ::/0 the same way; the underlay stays IPv4 (outer node -> gateway IPv4).
// The client's MTU (1472) leaves the same 28 bytes of room for IPv6 inner packets: MSS 1412.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import * as crypto from 'node:crypto';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { attachFouDecap, type FouDecap } from '../../daemon/bpf/fou';
import {
  attachEgressSteer, detachEgressSteer, openEgressMaps, readEgressStats, removeEgressPins, EGRESS_TC, type EgressSteer, type EgressStats,
} from '../../daemon/bpf/egress-steer';
import { queryTc } from '../../daemon/bpf/tc';
import { ensureBpffs } from '../../daemon/bpf/bpffs';
import { readNetSysctl } from '../../daemon/sys/netns';
import { ipToBytes } from '../../lib/ip';

const root = path.resolve(__dirname, '../..');
const NODE = '192.0.2.1';
const SERVER = '192.0.2.10';
const CLIENT = '10.92.1.2';
const OTHER = '10.92.4.2';
const GWA = '10.92.2.2';
const GWB = '10.92.3.2';
const FLOATING = '203.0.113.7';
const FLOATING2 = '203.0.113.8';
const CLUSTER = '10.92.0.0/16';
const EGRESS = 7;
const FOU_PORT = 5555;
const TCP_PORT = 8080;
const CLIENT6 = 'fd00:92:1::2';
const NODE6 = '2001:db8:10::1';
const SERVER6 = '2001:db8:10::10';
const GWA6 = 'fd00:92:2::2';
const GWB6 = 'fd00:92:3::2';
const CLUSTER6 = 'fd00:92::/32';
// Their last two bytes (the outer IP ID, and the gateway's mark) are 0x0007, 0x0008, 0x0009.
const FLOATING6 = '2001:db8:f::7';
const FLOATING6_2 = '2001:db8:f::8';
const FLOATING6_3 = '2001:db8:f::9';
const FOU_FLOAT_MARK = 0x7e7e0000;
const PAYLOAD = 600 * 1024; // several hundred KB: GSO super-packets through steer and decap

const sh = (cmd: string, ...args: string[]) => execFileSync(cmd, args, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
const nsPath = (ns: string) => `/run/netns/${ns}`;
const inNs = (ns: string, ...cmd: string[]) => sh('nsenter', `--net=${nsPath(ns)}`, ...cmd);

interface Topology {
  node: string;
  server: string;
  client: string;
  other: string;
  gwa: string;
  gwb: string;
  pinDir: string;
  handles: Array<{ detach(): void }>;
  children: ChildProcess[];
}

function sysctls(ns: string, ...kv: string[]): void {
  for (const k of kv) inNs(ns, 'sysctl', '-qw', k);
}

function build(): Topology {
  const id = crypto.randomBytes(3).toString('hex');
  const n = (s: string) => `teg-${id}-${s}`;
  const t: Topology = {
    node: n('node'), server: n('server'), client: n('client'), other: n('other'), gwa: n('gwa'), gwb: n('gwb'),
    pinDir: `/sys/fs/bpf/tether-test/egress-${id}`, handles: [], children: [],
  };
  const all = [t.node, t.server, t.client, t.other, t.gwa, t.gwb];
  try {
    for (const ns of all) {
      sh('ip', 'netns', 'add', ns);
      sh('ip', '-n', ns, 'link', 'set', 'lo', 'up');
      // Duplicate address detection would hold IPv6 addresses back for a second or two.
      sysctls(ns, 'net.ipv6.conf.all.accept_dad=0', 'net.ipv6.conf.default.accept_dad=0');
    }
    // Strict reverse-path filtering on the node, as many hosts have it: steering must cope (it makes
    // the client veth loose and accept its own address as a source).
    sysctls(t.node, 'net.ipv4.ip_forward=1', 'net.ipv4.conf.all.rp_filter=1', 'net.ipv4.conf.default.rp_filter=1', 'net.ipv4.conf.all.send_redirects=0');
    const link = (ns: string, hostIf: string, hostAddr: string, podAddr: string, mtu?: number) => {
      sh('ip', '-n', t.node, 'link', 'add', hostIf, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', ns);
      sh('ip', '-n', t.node, 'addr', 'add', `${hostAddr}/24`, 'dev', hostIf);
      sh('ip', '-n', t.node, 'link', 'set', hostIf, 'up');
      sh('ip', '-n', ns, 'addr', 'add', `${podAddr}/24`, 'dev', 'eth0');
      if (mtu) sh('ip', '-n', ns, 'link', 'set', 'eth0', 'mtu', String(mtu));
      sh('ip', '-n', ns, 'link', 'set', 'eth0', 'up');
      sh('ip', '-n', ns, 'route', 'add', 'default', 'via', hostAddr);
    };
    link(t.server, 'ns0', NODE, SERVER);
    link(t.client, 'vcli', '10.92.1.1', CLIENT, 1500 - 28); // room for the FoU headers the node adds
    link(t.other, 'voth', '10.92.4.1', OTHER);
    link(t.gwa, 'vgwa', '10.92.2.1', GWA);
    link(t.gwb, 'vgwb', '10.92.3.1', GWB);
    // Gateway pods forward de-NATed replies whose source is the external server: the node must not
    // reverse-path-filter them strictly on the gateways' veths (gateway setup's job, not steering's).
    sysctls(t.node, 'net.ipv4.conf.vgwa.rp_filter=2', 'net.ipv4.conf.vgwb.rp_filter=2');
    ensureBpffs(t.pinDir);
    return t;
  } catch (e) {
    teardown(t);
    throw e;
  }
}

function teardown(t: Topology): void {
  for (const c of t.children) c.kill('SIGKILL');
  for (const h of t.handles) {
    try {
      h.detach();
    } catch {
      // the namespaces go next, and with them every filter
    }
  }
  for (const ns of [t.node, t.server, t.client, t.other, t.gwa, t.gwb]) {
    try {
      sh('ip', 'netns', 'del', ns);
    } catch {
      // not created or already gone
    }
  }
  removeEgressPins(t.pinDir);
  fs.rmSync(t.pinDir, { recursive: true, force: true });
}

/** IPv6 on every link of the topology (the IPv6 tests): pods fd00:92:<n>::2, the node ::1, the server behind ns0. */
function addIpv6(t: Topology): void {
  sysctls(t.node, 'net.ipv6.conf.all.forwarding=1');
  const links: Array<[string, string, string, string]> = [
    [t.server, 'ns0', NODE6, SERVER6], [t.client, 'vcli', 'fd00:92:1::1', CLIENT6], [t.other, 'voth', 'fd00:92:4::1', 'fd00:92:4::2'],
    [t.gwa, 'vgwa', 'fd00:92:2::1', GWA6], [t.gwb, 'vgwb', 'fd00:92:3::1', GWB6],
  ];
  for (const [ns, hostIf, hostAddr, podAddr] of links) {
    sh('ip', '-n', t.node, 'addr', 'add', `${hostAddr}/64`, 'dev', hostIf, 'nodad');
    sh('ip', '-n', ns, 'addr', 'add', `${podAddr}/64`, 'dev', 'eth0', 'nodad');
    sh('ip', '-n', ns, '-6', 'route', 'add', 'default', 'via', hostAddr);
  }
}

/**
 * An IPv6 gateway pod: forwarding, its floating addresses on lo, and SNAT of client traffic to the address
 * the decapsulated packet's mark names (FOU_FLOAT_MARK | its last two bytes), as the gateway datapath does.
 * An unmarked or wrongly marked packet leaves un-NATed, with the client's address: the server would see it.
 * A counter per mark shows what arrived.
 */
function gatewayNat6(ns: string, floatings: string[]): void {
  sysctls(ns, 'net.ipv6.conf.all.forwarding=1');
  for (const f of floatings) sh('ip', '-n', ns, 'addr', 'replace', `${f}/128`, 'dev', 'lo', 'nodad');
  try {
    inNs(ns, 'nft', 'delete', 'table', 'ip6', 'tether-gw6');
  } catch {
    // first configuration
  }
  const mark = (f: string) => `0x${(FOU_FLOAT_MARK | ipToBytes(f).readUInt16BE(14)).toString(16)}`;
  const rules = `table ip6 tether-gw6 {
  chain prerouting { type filter hook prerouting priority -150; policy accept;
${floatings.map((f) => `    meta mark ${mark(f)} counter comment "${f}"`).join('\n')}
  }
  chain postrouting { type nat hook postrouting priority 100;
${floatings.map((f) => `    oifname "eth0" ip6 saddr fd00:92:1::/64 meta mark ${mark(f)} snat to ${f}`).join('\n')}
  }
}`;
  execFileSync('nsenter', [`--net=${nsPath(ns)}`, 'nft', '-f', '-'], { input: rules });
}

/** Packets the gateway's prerouting counted with the mark of `floating`. */
function markedPackets(ns: string, floating: string): number {
  const out = JSON.parse(inNs(ns, 'nft', '-j', 'list', 'chain', 'ip6', 'tether-gw6', 'prerouting')) as { nftables: Array<Record<string, { comment?: string; expr?: Array<Record<string, { packets?: number }>> }>> };
  const rule = out.nftables.map((o) => o.rule).find((r) => r?.comment === floating);
  return rule?.expr?.find((e) => e.counter)?.counter?.packets ?? -1;
}

/** A gateway pod: forwarding, the floating address on lo, SNAT of client traffic to it, conntrack on. */
function gatewayNat(ns: string, floating: string): void {
  sysctls(ns, 'net.ipv4.ip_forward=1', 'net.ipv4.conf.all.send_redirects=0', 'net.ipv4.conf.eth0.send_redirects=0',
    'net.ipv4.conf.all.rp_filter=0', 'net.ipv4.conf.eth0.rp_filter=0');
  sh('ip', '-n', ns, 'addr', 'replace', `${floating}/32`, 'dev', 'lo');
  try {
    inNs(ns, 'nft', 'delete', 'table', 'ip', 'tether-gw');
  } catch {
    // first configuration
  }
  const rules = `table ip tether-gw {
  chain forward { type filter hook forward priority 0; policy accept; ct state established,related accept; }
  chain postrouting { type nat hook postrouting priority 100; oifname "eth0" ip saddr 10.92.1.0/24 snat to ${floating}; }
}`;
  execFileSync('nsenter', [`--net=${nsPath(ns)}`, 'nft', '-f', '-'], { input: rules });
}

function gatewayDecap(t: Topology, ns: string, addr: string): FouDecap {
  const d = attachFouDecap({ netns: nsPath(ns), ifName: 'eth0', port: FOU_PORT, localAddress: addr, allowedSources: [NODE] });
  t.handles.push(d);
  return d;
}

function steer(t: Topology, ifName: string): EgressSteer {
  const s = attachEgressSteer({ netns: nsPath(t.node), ifName, pinDir: t.pinDir, nodeAddress: NODE, port: FOU_PORT });
  t.handles.push(s);
  return s;
}

/** Long-lived echo server; prints one JSON line per finished connection (peer it saw, bytes echoed). */
const SERVER_JS = `
const net = require('net');
net.createServer({ allowHalfOpen: true }, (s) => {
  let n = 0;
  const peer = s.remoteAddress;
  s.on('data', (d) => { n += d.length; });
  s.pipe(s);
  s.on('close', () => console.log(JSON.stringify({ peer, bytes: n })));
}).listen({ port: Number(process.argv[1]), host: process.argv[2], ipv6Only: process.argv[2] === '::' }, () => console.log('listening'));
`;

// Client: sends a random payload, half-closes, and compares what comes back.
const CLIENT_JS = `
const net = require('net'); const crypto = require('crypto');
const [host, port, size, timeout] = process.argv.slice(1);
const payload = crypto.randomBytes(Number(size));
const chunks = [];
const s = net.connect({ host, port: Number(port), allowHalfOpen: true });
const t = setTimeout(() => { console.log(JSON.stringify({ error: 'timeout' })); process.exit(2); }, Number(timeout));
s.on('connect', () => s.end(payload));
s.on('data', (d) => chunks.push(d));
s.on('error', (e) => { console.log(JSON.stringify({ error: e.code })); process.exit(3); });
s.on('end', () => {
  clearTimeout(t);
  const back = Buffer.concat(chunks);
  console.log(JSON.stringify({ sent: payload.length, received: back.length, same: back.equals(payload) }));
  process.exit(0);
});
`;

type Json = Record<string, unknown>;

/** Starts the echo server in ns; the returned function yields the connections it has reported so far. */
async function echoServer(t: Topology, ns: string, host = '0.0.0.0'): Promise<() => Json[]> {
  const child = spawn('nsenter', [`--net=${nsPath(ns)}`, process.execPath, '-e', SERVER_JS, String(TCP_PORT), host], { stdio: ['ignore', 'pipe', 'pipe'] });
  t.children.push(child);
  const seen: Json[] = [];
  let buf = '';
  await new Promise<void>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`echo server in ${ns} did not start`)), 5000);
    child.stdout.on('data', (d: Buffer) => {
      buf += d;
      let i;
      while ((i = buf.indexOf('\n')) >= 0) {
        const line = buf.slice(0, i);
        buf = buf.slice(i + 1);
        if (line === 'listening') {
          clearTimeout(timer);
          resolve();
        } else if (line.startsWith('{')) seen.push(JSON.parse(line));
      }
    });
    child.on('error', reject);
  });
  return () => seen;
}

/** Runs the client in ns against host; resolves with its JSON result. */
function connect(ns: string, host: string, size: number, timeoutMs: number): Promise<Json> {
  return new Promise((resolve, reject) => {
    const child = spawn('nsenter', [`--net=${nsPath(ns)}`, process.execPath, '-e', CLIENT_JS, host, String(TCP_PORT), String(size), String(timeoutMs)], { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    let err = '';
    const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs + 3000);
    child.stdout.on('data', (d: Buffer) => (out += d));
    child.stderr.on('data', (d: Buffer) => (err += d));
    child.on('error', reject);
    child.on('close', () => {
      clearTimeout(timer);
      const line = out.split('\n').filter((l) => l.startsWith('{')).pop();
      if (!line) reject(new Error(`client in ${ns} gave no result: ${out} ${err}`));
      else resolve(JSON.parse(line));
    });
  });
}

/** The server's report of the connection just made (it prints on close, shortly after the client ends). */
async function lastPeer(seen: () => Json[], count: number): Promise<Json> {
  for (let i = 0; i < 100 && seen().length < count; i++) await new Promise((r) => setTimeout(r, 20));
  assert.is(seen().length, count, 'server reported the connection');
  return seen()[count - 1];
}

function delta(after: EgressStats, before: EgressStats): Record<keyof EgressStats, bigint> {
  return Object.fromEntries(Object.keys(after).map((k) => [k, after[k as keyof EgressStats] - before[k as keyof EgressStats]])) as Record<keyof EgressStats, bigint>;
}

/** The Egress of the tests: client pod CLIENT steered for everything but the cluster and the node. */
function configureEgress(s: EgressSteer, gateways: Array<{ gatewayIp: string; floatingIp: string; epoch: number }>): void {
  s.setDestinations(0, [], [CLUSTER]);
  s.setDestinations(EGRESS, ['0.0.0.0/0'], [`${NODE}/32`]);
  s.setClient(CLIENT, [EGRESS]);
  s.setGateways(EGRESS, gateways);
}

test.before(() => {
  execFileSync('bash', [path.join(root, 'bpf/build.sh')], { stdio: 'ignore' });
});

test('steered: client reaches the server through the gateway, seen as the floating address; bypass and non-clients untouched', async () => {
  const t = build();
  try {
    gatewayNat(t.gwa, FLOATING);
    sh('ip', '-n', t.node, 'route', 'add', `${FLOATING}/32`, 'via', GWA);
    const decap = gatewayDecap(t, t.gwa, GWA);
    const s = steer(t, 'vcli');
    const other = steer(t, 'voth'); // a second veth on the node: same pinned maps
    configureEgress(s, [{ gatewayIp: GWA, floatingIp: FLOATING, epoch: 1 }]);
    assert.is(readNetSysctl(nsPath(t.node), 'net/ipv4/conf/vcli/accept_local'), '1');
    assert.is(readNetSysctl(nsPath(t.node), 'net/ipv4/conf/vcli/rp_filter'), '2', 'strict rp_filter loosened on the client veth');
    assert.equal(other.clients(), new Map([[CLIENT, [EGRESS]]]), 'attachments share the maps');
    assert.equal(s.destinations(EGRESS), new Map([['0.0.0.0/0', 'steer'], [`${NODE}/32`, 'bypass']]));
    assert.equal(s.gateways(EGRESS), [{ gatewayIp: GWA, floatingIp: FLOATING, epoch: 1n, zone: 0, tier: 0 }]);

    const server = await echoServer(t, t.server);
    const nodeSrv = await echoServer(t, t.node);

    // Steered, both ways, with GSO-sized segments.
    let before = s.stats();
    const c1 = await connect(t.client, SERVER, PAYLOAD, 15000);
    assert.equal(c1, { sent: PAYLOAD, received: PAYLOAD, same: true }, 'payload echoed intact');
    assert.equal(await lastPeer(server, 1), { peer: FLOATING, bytes: PAYLOAD }, 'server sees the floating address');
    let d = delta(s.stats(), before);
    assert.ok(d.steered > 0n && d.steeredBytes >= BigInt(PAYLOAD), `steered ${d.steered} packets ${d.steeredBytes} bytes`);
    assert.is(d.errors + d.noGateway, 0n);
    assert.ok(d.steeredBytes / d.steered > 1500n, `steered GSO super-packets (avg ${d.steeredBytes / d.steered} bytes)`);
    const ds = decap.stats();
    assert.ok(ds.packets > 0n && ds.bytes >= BigInt(PAYLOAD), `gateway decapsulated ${ds.packets} packets ${ds.bytes} bytes`);
    assert.is(ds.errors + ds.rejectedSource, 0n);

    // BYPASS prefixes: the Egress's own (the node address) and the global cluster range.
    for (const [host, n] of [[NODE, 1], ['10.92.1.1', 2]] as const) {
      before = s.stats();
      const before_decap = decap.stats().packets;
      assert.equal(await connect(t.client, host, 64 * 1024, 10000), { sent: 65536, received: 65536, same: true });
      assert.equal(await lastPeer(nodeSrv, n), { peer: CLIENT, bytes: 65536 }, `${host}: the node sees the pod itself`);
      d = delta(s.stats(), before);
      assert.is(d.steered, 0n, `${host} not steered`);
      assert.ok(d.bypassed > 0n, `${host} counted as bypassed`);
      assert.is(decap.stats().packets, before_decap, `${host}: nothing reached the gateway`);
    }

    // A pod that is no client: plain routing, the server sees the pod address.
    before = s.stats();
    assert.equal(await connect(t.other, SERVER, 64 * 1024, 10000), { sent: 65536, received: 65536, same: true });
    assert.equal(await lastPeer(server, 2), { peer: OTHER, bytes: 65536 });
    d = delta(s.stats(), before);
    assert.is(d.steered, 0n);
    assert.ok(d.notClient > 0n, `notClient ${d.notClient}`);

    // The pins hold the same maps (what a restarted tetherd opens); detach by tc id works without objects.
    assert.equal(readEgressStats(t.pinDir), s.stats());
    const pinned = openEgressMaps(t.pinDir);
    assert.equal(pinned.config(), { nodeAddress: NODE, port: FOU_PORT });
    assert.equal(pinned.gateways(EGRESS), s.gateways(EGRESS));
    pinned.close();
    assert.is(detachEgressSteer({ netns: nsPath(t.node), ifName: 'voth' }), true);
    assert.is(detachEgressSteer({ netns: nsPath(t.node), ifName: 'voth' }), false);
    assert.is(queryTc({ netns: nsPath(t.node), ifName: 'vcli', direction: 'ingress', ...EGRESS_TC }) !== undefined, true, 'the other veth keeps its filter');
    s.detach();
    assert.is(queryTc({ netns: nsPath(t.node), ifName: 'vcli', direction: 'ingress', ...EGRESS_TC }), undefined);
    assert.ok(fs.existsSync(path.join(t.pinDir, 'egress', 'egress_gateways')), 'detach keeps the shared pins');
  } finally {
    teardown(t);
  }
});

test('gateway change: new connections follow setGateways; no slots drops; two slots spread flows', async () => {
  const t = build();
  try {
    gatewayNat(t.gwa, FLOATING);
    gatewayNat(t.gwb, FLOATING); // the standby SNATs to the same floating address
    sh('ip', '-n', t.node, 'route', 'add', `${FLOATING}/32`, 'via', GWA);
    const da = gatewayDecap(t, t.gwa, GWA);
    const db = gatewayDecap(t, t.gwb, GWB);
    const s = steer(t, 'vcli');
    configureEgress(s, [{ gatewayIp: GWA, floatingIp: FLOATING, epoch: 1 }]);
    const server = await echoServer(t, t.server);
    const ok = { sent: 128 * 1024, received: 128 * 1024, same: true };

    assert.equal(await connect(t.client, SERVER, 128 * 1024, 10000), ok);
    assert.is((await lastPeer(server, 1)).peer, FLOATING);
    const aAfterFirst = da.stats().packets;
    assert.ok(aAfterFirst > 0n && db.stats().packets === 0n, 'first connection went via gateway A');

    // Ownership moves to B (epoch 2): the controller rewrites the slots, the floating route moves.
    s.setGateways(EGRESS, [{ gatewayIp: GWB, floatingIp: FLOATING, epoch: 2 }]);
    sh('ip', '-n', t.node, 'route', 'replace', `${FLOATING}/32`, 'via', GWB);
    assert.equal(await connect(t.client, SERVER, 128 * 1024, 10000), ok);
    assert.is((await lastPeer(server, 2)).peer, FLOATING, 'server still sees the floating address');
    assert.ok(db.stats().packets > 0n, 'second connection went via gateway B');
    assert.is(da.stats().packets, aAfterFirst, 'nothing more reached gateway A');

    // No owner (takeover in progress): packets are dropped and counted, never sent out unNATed.
    s.setGateways(EGRESS, []);
    let before = s.stats();
    assert.equal(await connect(t.client, SERVER, 16 * 1024, 1500), { error: 'timeout' });
    await new Promise((r) => setTimeout(r, 200));
    assert.is(server().length, 2, 'nothing reached the server while the egress had no gateway');
    let d = delta(s.stats(), before);
    assert.ok(d.noGateway > 0n && d.steered === 0n, `noGateway ${d.noGateway}, steered ${d.steered}`);

    // Two addresses, one on each gateway: flows spread by hash over both slots.
    gatewayNat(t.gwb, FLOATING2);
    sh('ip', '-n', t.node, 'route', 'replace', `${FLOATING}/32`, 'via', GWA);
    sh('ip', '-n', t.node, 'route', 'add', `${FLOATING2}/32`, 'via', GWB);
    s.setGateways(EGRESS, [{ gatewayIp: GWA, floatingIp: FLOATING, epoch: 3 }, { gatewayIp: GWB, floatingIp: FLOATING2, epoch: 1 }]);
    before = s.stats();
    const peers = new Set<unknown>();
    let n = 2;
    for (let i = 0; i < 32 && peers.size < 2; i++) {
      assert.equal(await connect(t.client, SERVER, 4096, 10000), { sent: 4096, received: 4096, same: true });
      peers.add((await lastPeer(server, ++n)).peer);
    }
    assert.equal([...peers].sort(), [FLOATING, FLOATING2], 'both floating addresses carried flows');
    d = delta(s.stats(), before);
    assert.is(d.errors, 0n);
  } finally {
    teardown(t);
  }
});

// Long-lived connections: each sends 64 bytes every 40 ms and checks the echo; prints one JSON report.
const LONG_CLIENT_JS = `
const net = require('net');
const [host, port, conns, ms] = process.argv.slice(1).map((x, i) => (i ? Number(x) : x));
let done = 0; const report = { intact: 0, broken: [] };
for (let c = 0; c < conns; c++) {
  const s = net.connect({ host, port });
  let expect = 0, got = 0, seq = 0, dead = false;
  const tick = setInterval(() => { if (!dead) { s.write(Buffer.alloc(64, seq++ % 256)); expect += 64; } }, 40);
  s.on('data', (d) => { got += d.length; });
  const finish = (why) => { if (dead) return; dead = true; clearInterval(tick); s.destroy();
    if (why) report.broken.push(why); else report.intact++;
    if (++done === conns) { console.log(JSON.stringify(report)); process.exit(0); } };
  s.on('error', (e) => finish(e.code || e.message));
  s.on('close', () => finish('closed by peer'));
  // At the end writes stop and every byte must come back: a flow that lost its path never catches up (or is
  // reset), while one that only stalled with the machine (2 busy cores) does, within the grace.
  setTimeout(() => { clearInterval(tick); const until = Date.now() + 2000;
    const check = () => { if (dead) return; if (got >= expect) finish(); else if (Date.now() > until) finish('echo behind: ' + got + '/' + expect); else setTimeout(check, 20); };
    check(); }, ms);
}`;

/** Starts long-lived connections from ns; the promise resolves with the report when they end. */
function longConnections(ns: string, host: string, conns: number, ms: number): Promise<{ intact: number; broken: string[] }> {
  return new Promise((resolve, reject) => {
    const child = spawn('nsenter', [`--net=${nsPath(ns)}`, process.execPath, '-e', LONG_CLIENT_JS, host, String(TCP_PORT), String(conns), String(ms)], { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    child.stdout.on('data', (d: Buffer) => (out += d));
    child.on('error', reject);
    child.on('close', () => {
      const line = out.split('\n').find((l) => l.startsWith('{'));
      if (line) resolve(JSON.parse(line));
      else reject(new Error(`long client gave no report: ${out}`));
    });
  });
}

const FLOATING3 = '203.0.113.9';

test('flows are pinned: adding an address moves no live flow, removing one moves only its flows; tiers; counters per address', async () => {
  const t = build();
  try {
    // Gateway A SNATs to FLOATING, gateway B to FLOATING2; FLOATING3 (added later) is routed to A, which
    // SNATs every flow to FLOATING: a flow that moved to FLOATING3's slot would change gateway or source
    // and break, so a surviving connection proves it stayed.
    gatewayNat(t.gwa, FLOATING);
    gatewayNat(t.gwb, FLOATING2);
    sh('ip', '-n', t.node, 'route', 'add', `${FLOATING}/32`, 'via', GWA);
    sh('ip', '-n', t.node, 'route', 'add', `${FLOATING2}/32`, 'via', GWB);
    gatewayDecap(t, t.gwa, GWA);
    gatewayDecap(t, t.gwb, GWB);
    const s = steer(t, 'vcli');
    const two = [{ gatewayIp: GWA, floatingIp: FLOATING, epoch: 1 }, { gatewayIp: GWB, floatingIp: FLOATING2, epoch: 1 }];
    configureEgress(s, two);
    const server = await echoServer(t, t.server);

    // 24 live connections; while they run, a third address (owned by gateway B, which SNATs to
    // FLOATING2) joins: with rendezvous alone a third of the flows would move to it and break.
    const live = longConnections(t.client, SERVER, 24, 2500);
    await new Promise((r) => setTimeout(r, 800));
    const pinsBefore = s.flows().filter((f) => f.dport === TCP_PORT);
    assert.is(pinsBefore.length, 24, 'every connection pinned');
    s.setGateways(EGRESS, [...two, { gatewayIp: GWB, floatingIp: FLOATING3, epoch: 1 }]);
    const r1 = await live;
    assert.equal(r1, { intact: 24, broken: [] }, 'no live connection moved when an address was added');
    const pinsAfter = new Map(s.flows().map((f) => [`${f.sport}`, f.floatingIp]));
    for (const p of pinsBefore) assert.is(pinsAfter.get(`${p.sport}`), p.floatingIp, `flow from port ${p.sport} kept its address`);
    const perAddr = s.addressStats();
    const onA = pinsBefore.filter((p) => p.floatingIp === FLOATING).length;
    assert.ok(onA > 0 && onA < 24, `both addresses carried flows (${onA} on A)`);
    assert.is(perAddr.get(FLOATING)?.flows, BigInt(onA), 'flows counted per address');
    assert.ok((perAddr.get(FLOATING)?.bytes ?? 0n) > 0n);
    await new Promise((r) => setTimeout(r, 300));
    assert.ok(server().every((c) => c.peer === FLOATING || c.peer === FLOATING2), 'the server saw only the two floating addresses');

    // Removing B's address: the flows on it are pinned again elsewhere (they break: a new source address
    // is a stranger to the server, which resets them — a clean failure); the flows on A go on.
    s.setGateways(EGRESS, two);
    const live2 = longConnections(t.client, SERVER, 24, 3000);
    await new Promise((r) => setTimeout(r, 800));
    const pins2 = s.flows().filter((f) => f.dport === TCP_PORT && !pinsAfter.has(`${f.sport}`));
    assert.is(pins2.length, 24, "this round's connections pinned");
    const before = s.stats();
    s.setGateways(EGRESS, [two[0]]);
    const r2 = await live2;
    const wereOnB = pins2.filter((p) => p.floatingIp === FLOATING2).length;
    assert.ok(r2.broken.length <= wereOnB, `only flows on the removed address broke: ${r2.broken.length} broke, ${wereOnB} pins were on it (${r2.broken.join(', ')})`);
    assert.ok(r2.intact >= 24 - wereOnB, `${r2.intact} intact`);
    assert.ok(r2.broken.every((b) => !b.startsWith('echo behind')), `broken ones failed cleanly, not hung: ${r2.broken.join(', ')}`);
    if (r2.broken.length) assert.ok(delta(s.stats(), before).repinned > 0n, 'their flows were pinned again');

    // Tiers: new flows take the preferred tier; with every slot excluded they are dropped and counted.
    s.setGateways(EGRESS, [{ gatewayIp: GWA, floatingIp: FLOATING, epoch: 2, tier: 1 }, { gatewayIp: GWB, floatingIp: FLOATING2, epoch: 2, tier: 0 }]);
    for (let i = 0; i < 6; i++) assert.equal(await connect(t.client, SERVER, 2048, 5000), { sent: 2048, received: 2048, same: true });
    await new Promise((r) => setTimeout(r, 200));
    assert.ok(server().slice(-6).every((c) => c.peer === FLOATING2), 'every new flow took the preferred tier');
    s.setGateways(EGRESS, [{ gatewayIp: GWA, floatingIp: FLOATING, epoch: 3, tier: 255 }, { gatewayIp: GWB, floatingIp: FLOATING2, epoch: 3, tier: 255 }]);
    const b3 = s.stats();
    assert.equal(await connect(t.client, SERVER, 2048, 1500), { error: 'timeout' });
    const d3 = delta(s.stats(), b3);
    // (Trailing packets of the earlier, pinned flows may still be steered: pins outrank tiers.)
    assert.ok(d3.excluded > 0n, `excluded ${d3.excluded}, steered ${d3.steered}`);
  } finally {
    teardown(t);
  }
});

/** The Egress of the IPv6 tests: both families of CLIENT steered but for the cluster and the node; slots mixed. */
function configureEgress6(s: EgressSteer, gateways: Array<{ gatewayIp: string; floatingIp: string; epoch: number }>): void {
  s.setDestinations(0, [], [CLUSTER, CLUSTER6]);
  s.setDestinations(EGRESS, ['0.0.0.0/0', '::/0'], [`${NODE}/32`, `${NODE6}/128`]);
  s.setClient(CLIENT, [EGRESS]);
  s.setClient(CLIENT6, [EGRESS]);
  s.setGateways(EGRESS, gateways);
}

/** Sends one raw Ethernet frame from ns's eth0 to its peer: ethertype IPv6, `payload` bytes after it. */
function sendFrame(t: Topology, ns: string, hostIf: string, payload: Buffer): void {
  const mac = (n: string, ifName: string) => JSON.parse(sh('ip', '-n', n, '-j', 'link', 'show', ifName))[0].address.replace(/:/g, '');
  const frame = Buffer.concat([Buffer.from(mac(t.node, hostIf), 'hex'), Buffer.from(mac(ns, 'eth0'), 'hex'), Buffer.from([0x86, 0xdd]), payload]);
  const py = `import socket,sys; s=socket.socket(socket.AF_PACKET, socket.SOCK_RAW); s.bind(('eth0', 0)); s.send(bytes.fromhex(sys.argv[1]))`;
  inNs(ns, 'python3', '-c', py, frame.toString('hex'));
}

test('IPv6: steered through FoU over IPv4, decapsulated as IPv6 with the mark of its floating address; GSO; bypass; malformed dropped', async () => {
  const t = build();
  try {
    addIpv6(t);
    gatewayNat(t.gwa, FLOATING);
    gatewayNat6(t.gwa, [FLOATING6]);
    sh('ip', '-n', t.node, 'route', 'add', `${FLOATING}/32`, 'via', GWA);
    sh('ip', '-n', t.node, '-6', 'route', 'add', `${FLOATING6}/128`, 'via', GWA6);
    const decap = gatewayDecap(t, t.gwa, GWA);
    const s = steer(t, 'vcli');
    // One IPv4 and one IPv6 slot on the same gateway: setGateways splits them by family.
    configureEgress6(s, [{ gatewayIp: GWA, floatingIp: FLOATING, epoch: 1 }, { gatewayIp: GWA, floatingIp: FLOATING6, epoch: 1 }]);
    assert.equal(s.gateways(EGRESS), [
      { gatewayIp: GWA, floatingIp: FLOATING, epoch: 1n, zone: 0, tier: 0 }, { gatewayIp: GWA, floatingIp: FLOATING6, epoch: 1n, zone: 0, tier: 0 },
    ]);
    assert.equal(s.destinations(EGRESS), new Map([['0.0.0.0/0', 'steer'], [`${NODE}/32`, 'bypass'], ['::/0', 'steer'], [`${NODE6}/128`, 'bypass']]));
    assert.equal(s.destinations(0), new Map([[CLUSTER, 'bypass'], [CLUSTER6, 'bypass']]));
    assert.equal(s.clients(), new Map([[CLIENT, [EGRESS]], [CLIENT6, [EGRESS]]]));

    const server = await echoServer(t, t.server, '::');
    const nodeSrv = await echoServer(t, t.node, '::');
    const MB = 1024 * 1024;
    const before = s.stats();
    const c1 = await connect(t.client, SERVER6, MB, 20000);
    assert.equal(c1, { sent: MB, received: MB, same: true }, '1 MB echoed intact over IPv6');
    assert.equal(await lastPeer(server, 1), { peer: FLOATING6, bytes: MB }, 'the server sees the IPv6 floating address: the gateway got the packets marked for it');
    const d = delta(s.stats(), before);
    assert.ok(d.steered > 0n && d.steeredBytes >= BigInt(MB), `steered ${d.steered} packets ${d.steeredBytes} bytes`);
    assert.ok(d.steeredBytes / d.steered > 1500n, `steered GSO super-packets (avg ${d.steeredBytes / d.steered} bytes)`);
    assert.is(d.errors + d.noGateway, 0n);
    assert.is(d.pinned, 1n, 'one new IPv6 flow pinned');
    const ds = decap.stats();
    assert.ok(ds.packets > 0n && ds.bytes >= BigInt(MB), `gateway decapsulated ${ds.packets} packets ${ds.bytes} bytes`);
    assert.is(ds.errors + ds.rejectedSource, 0n);
    const marked = markedPackets(t.gwa, FLOATING6);
    assert.ok(marked > 0, `decapsulated packets carried mark 0x7e7e0007 (${marked})`);
    const flows = s.flows().filter((f) => f.dport === TCP_PORT);
    assert.equal(flows.map((f) => [f.src, f.dst, f.proto, f.egressId, f.floatingIp]), [[CLIENT6, SERVER6, 6, EGRESS, FLOATING6]], 'the flow pinned in the IPv6 map');
    const perAddr = s.addressStats().get(FLOATING6);
    assert.ok(perAddr && perAddr.flows === 1n && perAddr.bytes >= BigInt(MB), `per-address counters of the IPv6 address: ${JSON.stringify(perAddr, (_, v) => (typeof v === 'bigint' ? String(v) : v))}`);

    // IPv4 from the same client still takes the IPv4 slot.
    const server4 = await echoServer(t, t.server);
    assert.equal(await connect(t.client, SERVER, 64 * 1024, 10000), { sent: 65536, received: 65536, same: true });
    assert.is((await lastPeer(server4, 1)).peer, FLOATING);

    // A BYPASS prefix inside the IPv6 destination: the node's own address is reached directly.
    const b2 = s.stats();
    const decapBefore = decap.stats().packets;
    assert.equal(await connect(t.client, NODE6, 64 * 1024, 10000), { sent: 65536, received: 65536, same: true });
    assert.equal(await lastPeer(nodeSrv, 1), { peer: CLIENT6, bytes: 65536 }, 'the node sees the pod itself');
    const d2 = delta(s.stats(), b2);
    assert.is(d2.steered, 0n, 'bypassed prefix not steered');
    assert.ok(d2.bypassed > 0n, `bypassed ${d2.bypassed}`);
    assert.is(decap.stats().packets, decapBefore, 'nothing reached the gateway');

    // IPv6 by its ethertype but shorter than its header: dropped and counted, never passed.
    const b3 = s.stats();
    const drops = () => JSON.parse(sh('tc', '-n', t.node, '-s', '-j', 'qdisc', 'show', 'dev', 'vcli')).find((q: { kind: string }) => q.kind === 'clsact').drops as number;
    const dropsBefore = drops();
    sendFrame(t, t.client, 'vcli', Buffer.from([0x60, 0, 0, 0, 0, 0, 6, 64, 0xfd, 0, 0, 0x92]));
    assert.is(delta(s.stats(), b3).errors, 1n, 'the short IPv6 frame counted');
    assert.is(drops() - dropsBefore, 1, 'and dropped at the filter');
  } finally {
    teardown(t);
  }
});

test('IPv6: flows stay pinned when an address is added; per-address marks pick the SNAT address', async () => {
  const t = build();
  try {
    addIpv6(t);
    // Gateway B holds two addresses and SNATs each flow to the one its mark names: a flow moved to the
    // third slot would change gateway or source address mid-stream and break.
    gatewayNat6(t.gwa, [FLOATING6]);
    gatewayNat6(t.gwb, [FLOATING6_2, FLOATING6_3]);
    sh('ip', '-n', t.node, '-6', 'route', 'add', `${FLOATING6}/128`, 'via', GWA6);
    sh('ip', '-n', t.node, '-6', 'route', 'add', `${FLOATING6_2}/128`, 'via', GWB6);
    sh('ip', '-n', t.node, '-6', 'route', 'add', `${FLOATING6_3}/128`, 'via', GWB6);
    gatewayDecap(t, t.gwa, GWA);
    gatewayDecap(t, t.gwb, GWB);
    const s = steer(t, 'vcli');
    const two = [{ gatewayIp: GWA, floatingIp: FLOATING6, epoch: 1 }, { gatewayIp: GWB, floatingIp: FLOATING6_2, epoch: 1 }];
    configureEgress6(s, two);
    const server = await echoServer(t, t.server, '::');

    const live = longConnections(t.client, SERVER6, 16, 2500);
    await new Promise((r) => setTimeout(r, 800));
    const pinsBefore = s.flows().filter((f) => f.dport === TCP_PORT);
    assert.is(pinsBefore.length, 16, 'every connection pinned');
    const onA = pinsBefore.filter((p) => p.floatingIp === FLOATING6).length;
    assert.ok(onA > 0 && onA < 16, `both addresses carried flows (${onA} on A)`);
    s.setGateways(EGRESS, [...two, { gatewayIp: GWB, floatingIp: FLOATING6_3, epoch: 1 }]);
    assert.equal(await live, { intact: 16, broken: [] }, 'no live connection moved when an address was added');
    const pinsAfter = new Map(s.flows().map((f) => [f.sport, f.floatingIp]));
    for (const p of pinsBefore) assert.is(pinsAfter.get(p.sport), p.floatingIp, `flow from port ${p.sport} kept its address`);
    await new Promise((r) => setTimeout(r, 300));
    assert.ok(server().every((c) => c.peer === FLOATING6 || c.peer === FLOATING6_2), 'the server saw only the two floating addresses');
    assert.is(markedPackets(t.gwb, FLOATING6_3), 0, 'nothing arrived marked for the added address');

    // New connections spread over all three; the third one's flows reach the server from it.
    const peers = new Set<unknown>();
    let n = server().length;
    for (let i = 0; i < 40 && peers.size < 3; i++) {
      assert.equal(await connect(t.client, SERVER6, 2048, 10000), { sent: 2048, received: 2048, same: true });
      peers.add((await lastPeer(server, ++n)).peer);
    }
    assert.equal([...peers].sort(), [FLOATING6, FLOATING6_2, FLOATING6_3].sort(), 'every address carried new flows, each SNATed by its mark');
    assert.ok(markedPackets(t.gwb, FLOATING6_3) > 0);
  } finally {
    teardown(t);
  }
});

test('IPv6 gateways: outer IPv6 FoU from the node\'s IPv6 address, the flow label naming the floating address; mixed with an IPv4 gateway', async () => {
  const t = build();
  try {
    addIpv6(t);
    // Outer IPv6 is 48 bytes, not 28: the client's MTU leaves room for it (the CNI's encapOverhead).
    sh('ip', '-n', t.client, 'link', 'set', 'eth0', 'mtu', String(1500 - 48));
    gatewayNat6(t.gwa, [FLOATING6]);
    gatewayNat6(t.gwb, [FLOATING6_2, FLOATING6_3]);
    sh('ip', '-n', t.node, '-6', 'route', 'add', `${FLOATING6}/128`, 'via', GWA6);
    sh('ip', '-n', t.node, '-6', 'route', 'add', `${FLOATING6_2}/128`, 'via', GWB6);
    sh('ip', '-n', t.node, '-6', 'route', 'add', `${FLOATING6_3}/128`, 'via', GWB6);
    const decap = (ns: string, addr: string, addr6: string) => {
      const d = attachFouDecap({ netns: nsPath(ns), ifName: 'eth0', port: FOU_PORT, localAddress: addr, localAddress6: addr6, markFromLabel: true, allowedSources: [NODE, NODE6] });
      t.handles.push(d);
      return d;
    };
    const da = decap(t.gwa, GWA, GWA6);
    const db = decap(t.gwb, GWB, GWB6);
    const s = attachEgressSteer({ netns: nsPath(t.node), ifName: 'vcli', pinDir: t.pinDir, nodeAddress: NODE, nodeAddress6: NODE6, port: FOU_PORT });
    t.handles.push(s);
    assert.equal(s.config6(), { nodeAddress6: NODE6, port: FOU_PORT });
    const v6gw = [
      { gatewayIp: GWA6, floatingIp: FLOATING6, epoch: 1 }, { gatewayIp: GWB6, floatingIp: FLOATING6_2, epoch: 1 }, { gatewayIp: GWB6, floatingIp: FLOATING6_3, epoch: 1 },
    ];
    configureEgress6(s, v6gw);
    assert.equal(s.gateways(EGRESS), v6gw.map((g) => ({ ...g, epoch: 1n, zone: 0, tier: 0 })), 'IPv6 gateways read back');

    const server = await echoServer(t, t.server, '::');
    const MB = 1024 * 1024;
    const before = s.stats();
    assert.equal(await connect(t.client, SERVER6, MB, 20000), { sent: MB, received: MB, same: true }, '1 MB echoed intact through outer IPv6');
    const d = delta(s.stats(), before);
    assert.is(d.errors + d.noGateway, 0n);
    assert.ok(d.steeredBytes / d.steered > 1500n, `steered GSO super-packets (avg ${d.steeredBytes / d.steered} bytes)`);
    const peers = new Set<unknown>([(await lastPeer(server, 1)).peer]);
    let n = 1;
    for (let i = 0; i < 40 && peers.size < 3; i++) {
      assert.equal(await connect(t.client, SERVER6, 4096, 10000), { sent: 4096, received: 4096, same: true });
      peers.add((await lastPeer(server, ++n)).peer);
    }
    assert.equal([...peers].sort(), [FLOATING6, FLOATING6_2, FLOATING6_3].sort(), 'each address carried flows, SNATed by the mark its flow label named');
    assert.ok(markedPackets(t.gwb, FLOATING6_2) > 0 && markedPackets(t.gwb, FLOATING6_3) > 0, 'gateway B saw both marks');
    const sa = da.stats();
    const sb = db.stats();
    assert.ok(sa.packets > 0n && sb.packets > 0n, `both gateways unwrapped outer IPv6 (${sa.packets}, ${sb.packets})`);
    assert.is(sa.errors + sa.rejectedSource + sb.errors + sb.rejectedSource, 0n);
    // The IPv4 maps of the Egress are untouched: the IPv6-gateway slots are in their own map.
    assert.equal(s.gateways(EGRESS)!.filter((g) => !g.floatingIp.includes(':')), []);

    // Mixed: one IPv4 gateway (outer IPv4, the IP ID) beside an IPv6 one in the same Egress.
    gatewayNat(t.gwa, FLOATING);
    gatewayNat6(t.gwa, [FLOATING6]);
    const mixed = [{ gatewayIp: GWA, floatingIp: FLOATING6, epoch: 2 }, { gatewayIp: GWB6, floatingIp: FLOATING6_2, epoch: 2 }];
    s.setGateways(EGRESS, mixed);
    assert.equal(s.gateways(EGRESS), mixed.map((g) => ({ ...g, epoch: 2n, zone: 0, tier: 0 })));
    const peers2 = new Set<unknown>();
    for (let i = 0; i < 40 && peers2.size < 2; i++) {
      assert.equal(await connect(t.client, SERVER6, 4096, 10000), { sent: 4096, received: 4096, same: true });
      peers2.add((await lastPeer(server, ++n)).peer);
    }
    assert.equal([...peers2].sort(), [FLOATING6, FLOATING6_2].sort(), 'the IPv4 and the IPv6 gateway both carried flows');

    // Back to IPv4 gateways only: the IPv6-gateway map entry goes, the Egress reads as before.
    s.setGateways(EGRESS, [{ gatewayIp: GWA, floatingIp: FLOATING6, epoch: 3 }]);
    assert.equal(s.gateways(EGRESS), [{ gatewayIp: GWA, floatingIp: FLOATING6, epoch: 3n, zone: 0, tier: 0 }]);
    assert.equal(await connect(t.client, SERVER6, 4096, 10000), { sent: 4096, received: 4096, same: true });
    assert.is((await lastPeer(server, ++n)).peer, FLOATING6);
  } finally {
    teardown(t);
  }
});

test('negative control: without the decap program on the gateway the connection fails', async () => {
  const t = build();
  try {
    gatewayNat(t.gwa, FLOATING);
    sh('ip', '-n', t.node, 'route', 'add', `${FLOATING}/32`, 'via', GWA);
    const s = steer(t, 'vcli');
    configureEgress(s, [{ gatewayIp: GWA, floatingIp: FLOATING, epoch: 1 }]);
    const server = await echoServer(t, t.server);
    const c = await connect(t.client, SERVER, 4096, 3000);
    assert.ok(c.error, `client must fail, got ${JSON.stringify(c)}`);
    assert.equal(server(), [], 'server never saw a connection');
    assert.ok(s.stats().steered > 0n, 'the SYNs were steered (the failure is the missing decap)');
  } finally {
    teardown(t);
  }
});

test.run();
