// Upgrades against the real kernel: a tetherd that finds pins of another map layout migrates them and
// attaches, while a TCP connection through the steering datapath keeps flowing. The old layouts are real:
// the steering program of a node from before flow pinning (fixtures/egress-steer-v0, from this
// repository's history) is compiled, attached and fed as that tetherd did. Topology (namespaces):
//
//   client 10.94.1.2 (mtu 1472) ─vcli─┐                 ┌─ gwa 10.94.2.2  (floating A on lo, SNAT)
//   other  10.94.4.2            ─voth─┤ node 192.0.2.1  ├─ gwb 10.94.3.2  (floating B on lo, SNAT)
//                                     └──────ns0────────┴─ server 192.0.2.10
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import * as crypto from 'node:crypto';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { Writable } from 'node:stream';
import { attachFouDecap } from '../../daemon/bpf/fou';
import { attachEgressSteer, openEgressMaps, removeEgressPins, EGRESS_TC } from '../../daemon/bpf/egress-steer';
import { EgressGuard } from '../../daemon/bpf/egress-guard';
import { LbDatapath } from '../../daemon/bpf/lb';
import { BpfMap } from '../../daemon/bpf/map';
import { attachTc } from '../../daemon/bpf/tc';
import { check, checkPtr, libbpf } from '../../daemon/bpf/libbpf';
import { LAYOUT_DIR, releaseRetired } from '../../daemon/bpf/map-layout';
import { ensureBpffs } from '../../daemon/bpf/bpffs';
import { makeLogger, setLogger } from '../../lib/log';
import { inNetns } from '../../daemon/sys/netns';

const root = path.resolve(__dirname, '../..');
const FIXTURE = path.join(__dirname, 'fixtures/egress-steer-v0');
const NODE = '192.0.2.1';
const SERVER = '192.0.2.10';
const CLIENT = '10.94.1.2';
const GWA = '10.94.2.2';
const GWB = '10.94.3.2';
const FLOATING_A = '203.0.113.21';
const FLOATING_B = '203.0.113.22';
const CLUSTER = '10.94.0.0/16';
const EGRESS = 3;
const FOU_PORT = 5556;
const TCP_PORT = 8081;

const sh = (cmd: string, ...args: string[]) => execFileSync(cmd, args, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
const nsPath = (ns: string) => `/run/netns/${ns}`;
const inNs = (ns: string, ...cmd: string[]) => sh('nsenter', `--net=${nsPath(ns)}`, ...cmd);

// What the process logs, as JSON lines: migrations and libbpf's warnings are read from here.
const logLines: string[] = [];
// Set when this suite starts, not at import: uvu imports every file of a group before running any, and a
// later file's own logger (pod-network's) would otherwise be the one in force here.
test.before(() => setLogger(makeLogger({ stream: new Writable({ write(c, _e, cb) { logLines.push(...String(c).split('\n').filter(Boolean)); cb(); } }) })));
test.after(() => setLogger(makeLogger()));
const logged = (from: number) => logLines.slice(from).map((l) => JSON.parse(l) as Record<string, unknown>);
const libbpfWarnings = (from: number) => logged(from).filter((l) => String(l.message).startsWith('libbpf:'));

interface Topology {
  node: string;
  server: string;
  client: string;
  other: string;
  gwa: string;
  gwb: string;
  pinDir: string;
  children: ChildProcess[];
  cleanup: Array<() => void>;
}

function build(): Topology {
  const id = crypto.randomBytes(3).toString('hex');
  const n = (s: string) => `tmu-${id}-${s}`;
  const t: Topology = {
    node: n('node'), server: n('server'), client: n('client'), other: n('other'), gwa: n('gwa'), gwb: n('gwb'),
    pinDir: `/sys/fs/bpf/tether-test/upgrade-${id}`, children: [], cleanup: [],
  };
  try {
    for (const ns of [t.node, t.server, t.client, t.other, t.gwa, t.gwb]) {
      sh('ip', 'netns', 'add', ns);
      sh('ip', '-n', ns, 'link', 'set', 'lo', 'up');
    }
    inNs(t.node, 'sysctl', '-qw', 'net.ipv4.ip_forward=1');
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
    link(t.client, 'vcli', '10.94.1.1', CLIENT, 1500 - 28);
    link(t.other, 'voth', '10.94.4.1', '10.94.4.2');
    link(t.gwa, 'vgwa', '10.94.2.1', GWA);
    link(t.gwb, 'vgwb', '10.94.3.1', GWB);
    inNs(t.node, 'sysctl', '-qw', 'net.ipv4.conf.vgwa.rp_filter=0', 'net.ipv4.conf.vgwb.rp_filter=0', 'net.ipv4.conf.all.rp_filter=0');
    for (const [ns, gw, floating] of [[t.gwa, GWA, FLOATING_A], [t.gwb, GWB, FLOATING_B]] as const) {
      for (const k of ['net.ipv4.ip_forward=1', 'net.ipv4.conf.all.rp_filter=0', 'net.ipv4.conf.eth0.rp_filter=0']) inNs(ns, 'sysctl', '-qw', k);
      sh('ip', '-n', ns, 'addr', 'add', `${floating}/32`, 'dev', 'lo');
      execFileSync('nsenter', [`--net=${nsPath(ns)}`, 'nft', '-f', '-'], {
        input: `table ip tmu {
  chain forward { type filter hook forward priority 0; policy accept; ct state established,related accept; }
  chain postrouting { type nat hook postrouting priority 100; oifname "eth0" ip saddr 10.94.1.0/24 snat to ${floating}; }
}`,
      });
      sh('ip', '-n', t.node, 'route', 'add', `${floating}/32`, 'via', gw);
      const d = attachFouDecap({ netns: nsPath(ns), ifName: 'eth0', port: FOU_PORT, localAddress: gw, allowedSources: [NODE] });
      t.cleanup.push(() => d.detach());
    }
    ensureBpffs(t.pinDir);
    return t;
  } catch (e) {
    teardown(t);
    throw e;
  }
}

function teardown(t: Topology): void {
  for (const c of t.children) c.kill('SIGKILL');
  for (const f of t.cleanup.reverse()) {
    try {
      f();
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
  releaseRetired();
  removeEgressPins(t.pinDir);
  fs.rmSync(t.pinDir, { recursive: true, force: true });
}

/** Echo server; the returned function yields {peer, bytes} of each closed connection. */
async function echoServer(t: Topology): Promise<() => Array<{ peer: string; bytes: number }>> {
  const js = `require('net').createServer({ allowHalfOpen: true }, (s) => { let n = 0; const peer = s.remoteAddress;
    s.on('data', (d) => { n += d.length; }); s.pipe(s); s.on('close', () => console.log(JSON.stringify({ peer, bytes: n }))); })
    .listen(${TCP_PORT}, '0.0.0.0', () => console.log('listening'));`;
  const child = spawn('nsenter', [`--net=${nsPath(t.server)}`, process.execPath, '-e', js], { stdio: ['ignore', 'pipe', 'pipe'] });
  t.children.push(child);
  const seen: Array<{ peer: string; bytes: number }> = [];
  await new Promise<void>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('echo server did not start')), 5000);
    child.stdout.on('data', (d: Buffer) => {
      for (const line of String(d).split('\n')) {
        if (line === 'listening') {
          clearTimeout(timer);
          resolve();
        } else if (line.startsWith('{')) seen.push(JSON.parse(line));
      }
    });
  });
  return () => seen;
}

interface StreamResult {
  sent: number;
  received: number;
  same: boolean;
  maxGapMs: number;
  error?: string;
}

/**
 * A long-lived connection: 1 KB every 20 ms for ms, every byte echoed back; the largest silence between
 * echoes says whether it stalled. connected resolves once its first echo is back (the flow is pinned).
 */
function stream(t: Topology, ms: number): { connected: Promise<void>; done: Promise<StreamResult> } {
  const js = `const net = require('net'), crypto = require('crypto');
const s = net.connect({ host: '${SERVER}', port: ${TCP_PORT}, allowHalfOpen: true });
const out = [], back = []; let got = 0, last = 0, maxGap = 0;
s.on('connect', () => {
  const iv = setInterval(() => { const b = crypto.randomBytes(1024); out.push(b); s.write(b); }, 20);
  setTimeout(() => { clearInterval(iv); s.end(); }, ${ms});
});
s.on('data', (d) => { const now = Date.now(); if (last) maxGap = Math.max(maxGap, now - last); else console.log('connected'); last = now; got += d.length; back.push(d); });
s.on('error', (e) => { console.log(JSON.stringify({ error: e.code, sent: 0, received: got, same: false, maxGapMs: maxGap })); process.exit(3); });
s.on('end', () => { const a = Buffer.concat(out); console.log(JSON.stringify({ sent: a.length, received: got, same: Buffer.concat(back).equals(a), maxGapMs: maxGap })); process.exit(0); });
setTimeout(() => { console.log(JSON.stringify({ error: 'timeout', sent: 0, received: got, same: false, maxGapMs: maxGap })); process.exit(2); }, ${ms + 10000});`;
  const child = spawn('nsenter', [`--net=${nsPath(t.client)}`, process.execPath, '-e', js], { stdio: ['ignore', 'pipe', 'pipe'] });
  t.children.push(child);
  let out = '';
  let onConnected: () => void = () => {};
  const connected = new Promise<void>((resolve) => (onConnected = resolve));
  const done = new Promise<StreamResult>((resolve, reject) => {
    child.stdout.on('data', (d: Buffer) => {
      out += d;
      if (out.includes('connected')) onConnected();
    });
    child.on('close', () => {
      const line = out.split('\n').find((l) => l.startsWith('{'));
      if (line) resolve(JSON.parse(line));
      else reject(new Error(`stream client gave no result: ${out}`));
    });
  });
  // A test that fails before awaiting done kills the client in its cleanup: that rejection must not end
  // the whole run as an unhandled one (the test's own failure is what is reported).
  done.catch(() => undefined);
  return { connected, done };
}

/** One short connection; resolves with the address the server saw. */
async function peerOfNewConnection(t: Topology, seen: () => Array<{ peer: string }>): Promise<string> {
  const before = seen().length;
  inNs(t.client, process.execPath, '-e', `const s = require('net').connect(${TCP_PORT}, '${SERVER}', () => s.end('x')); s.on('data', () => {}); s.on('end', () => process.exit(0)); setTimeout(() => process.exit(2), 5000);`);
  for (let i = 0; i < 100 && seen().length === before; i++) await sleep(20);
  return seen()[before]?.peer;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

function pinnedId(pin: string): number {
  const m = BpfMap.fromPin(pin);
  try {
    return m.info.id;
  } finally {
    m.close();
  }
}

/** True once no map has this id: its last user (program, pin, fd) is gone (freed after an RCU grace period). */
async function mapGone(id: number): Promise<boolean> {
  for (let i = 0; i < 100; i++) {
    try {
      sh('bpftool', 'map', 'show', 'id', String(id));
    } catch {
      return true;
    }
    await sleep(20);
  }
  return false;
}

/** The old tetherd: its object loaded over <pinDir>/egress as it did (libbpf's own pinning), its filter on ifName. */
function attachLegacySteer(t: Topology, ifName: string): () => void {
  // Compiled as bpf/build.sh does, against the running kernel's vmlinux.h that build.sh just wrote.
  const objFile = `/tmp/${path.basename(t.pinDir)}-egress-steer-v0.bpf.o`;
  execFileSync('clang', ['-O2', '-g', '-target', 'bpf', '-D__TARGET_ARCH_x86', '-Wall', '-Werror', `-I${path.join(root, 'bpf')}`, '-c', path.join(FIXTURE, 'egress-steer.bpf.c'), '-o', objFile]);
  const lib = libbpf();
  const o = checkPtr(lib.bpf_object__open_file(objFile, null), 'bpf_object__open_file', objFile);
  fs.rmSync(objFile); // libbpf has read it
  ensureBpffs(path.join(t.pinDir, 'egress'));
  for (let m = lib.bpf_object__next_map(o, null); m; m = lib.bpf_object__next_map(o, m)) {
    const name = lib.bpf_map__name(m);
    if (!name.includes('.')) check(lib.bpf_map__set_pin_path(m, path.join(t.pinDir, 'egress', name)), 'bpf_map__set_pin_path', name);
  }
  check(lib.bpf_object__load(o), 'bpf_object__load', 'legacy egress-steer');
  const prog = checkPtr(lib.bpf_object__find_program_by_name(o, 'egress_steer'), 'find program', 'egress_steer');
  inNs(t.node, 'sysctl', '-qw', `net.ipv4.conf.${ifName}.accept_local=1`);
  attachTc({ netns: nsPath(t.node), ifName, direction: 'ingress', progFd: lib.bpf_program__fd(prog), handle: EGRESS_TC.handle, priority: EGRESS_TC.priority });
  let closed = false;
  return () => {
    if (!closed) lib.bpf_object__close(o);
    closed = true;
  };
}

/** The Egress of the tests, written through the pins as any tetherd does. */
function configure(pinDir: string, slots: Array<{ gatewayIp: string; floatingIp: string; epoch: number; tier?: number }>): void {
  const m = openEgressMaps(pinDir);
  try {
    m.setConfig({ nodeAddress: NODE, port: FOU_PORT });
    m.setDestinations(0, [], [CLUSTER]);
    m.setDestinations(EGRESS, ['0.0.0.0/0'], [`${NODE}/32`]);
    m.setClient(CLIENT, [EGRESS]);
    m.setGateways(EGRESS, slots);
  } finally {
    m.close();
  }
}

test.before(() => {
  execFileSync('bash', [path.join(root, 'bpf/build.sh')], { stdio: 'ignore' });
});

test('pins of the layout before flow pinning: a new tetherd migrates them and attaches while a connection flows', async () => {
  const t = build();
  try {
    const closeLegacy = attachLegacySteer(t, 'vcli');
    t.cleanup.push(closeLegacy);
    configure(t.pinDir, [{ gatewayIp: GWA, floatingIp: FLOATING_A, epoch: 1 }]);
    const dir = path.join(t.pinDir, 'egress');
    assert.equal(fs.readdirSync(dir).sort(), ['egress_cfg', 'egress_clients', 'egress_dest', 'egress_gateways', 'egress_stats'], 'the old node has the old maps only');
    const old = BpfMap.fromPin(path.join(dir, 'egress_stats'));
    assert.is(old.info.valueSize, 48, 'fixture: egress_stats of the old layout');
    const oldIds = { stats: old.info.id, clients: pinnedId(path.join(dir, 'egress_clients')) };

    const seen = await echoServer(t);
    const s1 = stream(t, 3000);
    await s1.connected;
    await sleep(300);
    const oldSteered = old.lookupPerCpu(Buffer.alloc(4))!.reduce((n, b) => n + b.readBigUInt64LE(0), 0n);
    old.close();
    assert.ok(oldSteered > 0n, `the old program steers the connection (${oldSteered} packets)`);

    // The new tetherd's start: the controller opens the maps (creating and migrating), then attaches.
    const mark = logLines.length;
    openEgressMaps(t.pinDir, { create: true }).close();
    const s = attachEgressSteer({ netns: nsPath(t.node), ifName: 'vcli', pinDir: t.pinDir, nodeAddress: NODE, port: FOU_PORT });
    t.cleanup.push(() => s.detach());
    closeLegacy();

    const migrated = logged(mark).filter((l) => l.message === 'bpf map migrated');
    assert.equal(migrated.map((l) => [path.basename(String(l.pin)), l.from, l.to, l.copied]),
      [['egress_stats', 'unversioned-percpu_array-k4-v48-n1-f0', 'v1-percpu_array-k4-v72-n1-f0', 1]], 'one line for the one map whose layout changed');
    assert.equal(libbpfWarnings(mark), [], 'no libbpf warning during the upgrade');

    const r = await s1.done;
    assert.is(r.error, undefined, `stream: ${JSON.stringify(r)}`);
    assert.ok(r.same && r.received === r.sent && r.sent > 100 * 1024, `every byte echoed across the upgrade (${r.received}/${r.sent})`);
    assert.ok(r.maxGapMs < 500, `no stall across the upgrade (largest gap ${r.maxGapMs} ms)`);
    for (let i = 0; i < 100 && seen().length < 1; i++) await sleep(20);
    assert.equal(seen()[0], { peer: FLOATING_A, bytes: r.sent }, 'the server saw the floating address throughout');

    assert.equal(s.clients(), new Map([[CLIENT, [EGRESS]]]), 'clients carried');
    assert.equal(s.destinations(EGRESS), new Map([['0.0.0.0/0', 'steer'], [`${NODE}/32`, 'bypass']]), 'destinations carried');
    assert.equal(s.gateways(EGRESS), [{ gatewayIp: GWA, floatingIp: FLOATING_A, epoch: 1n, zone: 0, tier: 0 }], 'gateways carried');
    const st = s.stats();
    assert.ok(st.steered > oldSteered, `old counters carried and counting on (${oldSteered} -> ${st.steered})`);
    assert.is(st.pinned, 1n, 'the new program pinned the live flow (a counter the old layout lacked, from zero)');
    assert.equal(s.flows().map((f) => [f.src, f.dst, f.dport, f.floatingIp]), [[CLIENT, SERVER, TCP_PORT, FLOATING_A]], 'the live flow pinned to its address');

    assert.is(pinnedId(path.join(dir, 'egress_clients')), oldIds.clients, 'a map of unchanged layout is reused, not copied');
    assert.ok(await mapGone(oldIds.stats), 'the old egress_stats is freed once its program is replaced');
    assert.equal(fs.readdirSync(dir).filter((n) => n.includes('@staging')), [], 'no staging pin left');
    assert.equal(fs.readdirSync(path.join(dir, LAYOUT_DIR)).sort(), [
      'egress_addr_stats-v1-percpu_hash-k4-v24-n8192-f0', 'egress_addr_stats6-v1-percpu_hash-k16-v24-n8192-f0', 'egress_cfg-v1-array-k4-v8-n1-f0', 'egress_cfg6-v1-array-k4-v20-n1-f0',
      'egress_clients-v1-hash-k4-v20-n16384-f0', 'egress_clients6-v1-hash-k16-v20-n16384-f0',
      'egress_dest-v1-lpm_trie-k12-v4-n16384-f1', 'egress_dest6-v1-lpm_trie-k24-v4-n16384-f1',
      'egress_flows-v1-lru_hash-k20-v8-n65536-f0', 'egress_flows6-v1-lru_hash-k44-v16-n65536-f0',
      'egress_gateways-v1-hash-k4-v200-n1024-f1', 'egress_gateways6-v1-hash-k4-v328-n1024-f1', 'egress_gateways66-v1-hash-k4-v392-n1024-f1',
      'egress_stats-v1-percpu_array-k4-v72-n1-f0',
    ], 'every map\'s layout recorded beside the pins (the IPv6 maps created beside the old ones)');
  } finally {
    teardown(t);
  }
});

test('resized flow map under a live connection whose new pick would differ: its pin survives; later attachments catch up', async () => {
  const t = build();
  try {
    const first = attachEgressSteer({ netns: nsPath(t.node), ifName: 'vcli', pinDir: t.pinDir, nodeAddress: NODE, port: FOU_PORT, maxFlows: 1024 });
    configure(t.pinDir, [{ gatewayIp: GWA, floatingIp: FLOATING_A, epoch: 1 }]);
    const seen = await echoServer(t);
    const s1 = stream(t, 3000);
    await s1.connected;
    assert.equal(first.flows().map((f) => f.floatingIp), [FLOATING_A], 'the connection is pinned to A');
    // B becomes preferred: new flows go to B; a flow whose pin were lost would move to B and break.
    configure(t.pinDir, [{ gatewayIp: GWA, floatingIp: FLOATING_A, epoch: 1, tier: 1 }, { gatewayIp: GWB, floatingIp: FLOATING_B, epoch: 1, tier: 0 }]);
    assert.is(await peerOfNewConnection(t, seen), FLOATING_B, 'a new connection takes B');
    const flowsPin = path.join(t.pinDir, 'egress', 'egress_flows');
    const oldFlows = BpfMap.fromPin(flowsPin); // held like a program of the old tetherd still attached elsewhere
    first.close(); // the old tetherd's handle; its filter stays attached

    const mark = logLines.length;
    openEgressMaps(t.pinDir, { create: true, maxFlows: 4096 }).close();
    const s = attachEgressSteer({ netns: nsPath(t.node), ifName: 'vcli', pinDir: t.pinDir, nodeAddress: NODE, port: FOU_PORT, maxFlows: 4096 });
    t.cleanup.push(() => s.detach());
    const migrated = logged(mark).filter((l) => l.message === 'bpf map migrated');
    assert.equal(migrated.map((l) => [path.basename(String(l.pin)), l.from, l.to]), [
      ['egress_flows', 'v1-lru_hash-k20-v8-n1024-f0', 'v1-lru_hash-k20-v8-n4096-f0'],
      ['egress_flows6', 'v1-lru_hash-k44-v16-n1024-f0', 'v1-lru_hash-k44-v16-n4096-f0'],
    ], 'only the flow maps changed (maxFlows sizes both families)');
    assert.ok(Number(migrated[0].copied) >= 2, `flows copied (${migrated[0].copied})`);
    const pinned = BpfMap.fromPin(flowsPin);
    assert.is(pinned.info.maxEntries, 4096, 'the pin is the resized map');
    assert.is.not(pinned.info.id, oldFlows.info.id);
    pinned.close();
    assert.ok(s.flows().some((f) => f.dport === TCP_PORT && f.floatingIp === FLOATING_A && f.sport !== 0), 'the live flow kept its pin to A');

    const r = await s1.done;
    assert.is(r.error, undefined, `stream: ${JSON.stringify(r)}`);
    assert.ok(r.same && r.received === r.sent && r.sent > 100 * 1024, `every byte echoed across the upgrade (${r.received}/${r.sent})`);
    assert.ok(r.maxGapMs < 500, `no stall (largest gap ${r.maxGapMs} ms)`);
    for (let i = 0; i < 100 && seen().length < 2; i++) await sleep(20);
    assert.equal(seen()[1], { peer: FLOATING_A, bytes: r.sent }, 'the long connection stayed on A');

    // A program of the old layout still attached elsewhere pins a flow in the old map after the migration:
    // the next attachment copies it over (and leaves what the new map holds alone).
    const key = Buffer.alloc(20);
    key.set([10, 94, 1, 2, 198, 51, 100, 9], 0);
    key.writeUInt16BE(40000, 8);
    key.writeUInt16BE(443, 10);
    key[12] = 6;
    key.writeUInt32LE(EGRESS, 16);
    oldFlows.update(key, Buffer.from([203, 0, 113, 21, 0, 0, 0, 0]));
    const other = attachEgressSteer({ netns: nsPath(t.node), ifName: 'voth', pinDir: t.pinDir, nodeAddress: NODE, port: FOU_PORT, maxFlows: 4096 });
    t.cleanup.push(() => other.detach());
    assert.ok(s.flows().some((f) => f.dst === '198.51.100.9' && f.sport === 40000 && f.floatingIp === FLOATING_A), 'a flow pinned in the old map after the migration is caught up');
    const oldId = oldFlows.info.id;
    oldFlows.close();
    releaseRetired();
    assert.ok(await mapGone(oldId), 'the old flow map is freed once nothing uses it');
  } finally {
    teardown(t);
  }
});

test('a normal restart (same layouts) re-attaches without a libbpf warning and reuses every map', () => {
  const t = build();
  try {
    const attachAll = () => {
      const s = attachEgressSteer({ netns: nsPath(t.node), ifName: 'vcli', pinDir: t.pinDir, nodeAddress: NODE, port: FOU_PORT });
      const g = EgressGuard.attach({ netns: nsPath(t.node), hostIfName: 'vgwa', podIp: GWA, destinations: ['0.0.0.0/0'], excluded: [], pinDir: t.pinDir });
      const lb = LbDatapath.load({ pinDir: t.pinDir, maxVips: 4, maglevSize: 251 });
      lb.attach(nsPath(t.other), 'eth0');
      return () => {
        s.close();
        g.close();
        lb.close();
      };
    };
    attachAll()(); // the first tetherd: creates pins and filters; its process ends, they stay
    const ids = () => Object.fromEntries(['egress/egress_flows', 'egress-guard-vgwa/guard_owned', 'lb/lb_mappings', 'lb/lb_maglev'].map((p) => [p, pinnedId(path.join(t.pinDir, p))]));
    const before = ids();
    const mark = logLines.length;
    const release = attachAll(); // the restarted tetherd
    t.cleanup.push(release);
    assert.equal(libbpfWarnings(mark), [], 'no libbpf warning on re-attach');
    assert.equal(logged(mark).filter((l) => String(l.message).startsWith('bpf map')), [], 'nothing migrated');
    assert.equal(ids(), before, 'the same maps');

    // The capture sees libbpf's warnings when there are some: the qdisc request libbpf makes on every
    // attach, without the handling in tc.ts, prints the kernel's refusal.
    const hook = Buffer.alloc(24);
    hook.writeBigUInt64LE(24n, 0);
    hook.writeInt32LE(JSON.parse(sh('ip', '-n', t.node, '-j', 'link', 'show', 'vcli'))[0].ifindex, 8);
    hook.writeUInt32LE(1, 12);
    const m2 = logLines.length;
    const ret = inNetns(nsPath(t.node), () => libbpf().bpf_tc_hook_create(hook));
    assert.is(ret, -17, 'clsact exists: EEXIST');
    assert.ok(libbpfWarnings(m2).some((l) => String(l.message).includes('Exclusivity flag on')), `the raw call warns: ${JSON.stringify(logged(m2))}`);
  } finally {
    teardown(t);
  }
});

test('load balancer maps resized (more VIP slots): mappings and services carried, Maglev rows rebuilt', () => {
  const pinDir = `/sys/fs/bpf/tether-test/upgrade-lb-${crypto.randomBytes(3).toString('hex')}`;
  try {
    const a = LbDatapath.load({ pinDir, maxVips: 4, maglevSize: 251 });
    a.configure(NODE, FOU_PORT);
    a.setService('198.51.100.1', 2, [{ port: 80, proto: 6 }], 0);
    a.setTargets('198.51.100.1', new Map([['10.94.9.1', 'active']]));
    const mappings = Array.from({ length: 50 }, (_, i) => ({ key: { vip: '198.51.100.1', client: `10.94.8.${i + 1}`, vport: 80, cport: 0, proto: 6 }, target: '10.94.9.1' }));
    a.installMappings(mappings);
    a.close();
    const mark = logLines.length;
    const b = LbDatapath.load({ pinDir, maxVips: 8, maglevSize: 251 });
    try {
      const lines = logged(mark).filter((l) => String(l.message).startsWith('bpf map'));
      assert.equal(lines.map((l) => [l.message, path.basename(String(l.pin)), l.copied]).sort(), [
        ['bpf map migrated', 'lb_stats', 4],
        ['bpf map replaced: tetherd rebuilds it', 'lb_maglev', undefined],
        // The IPv6 VIPs' rows are sized by the slots too.
        ['bpf map replaced: tetherd rebuilds it', 'lb_maglev6', undefined],
      ].sort());
      assert.equal(b.mappings().map((m) => m.client).sort(), mappings.map((m) => m.key.client).sort(), 'every mapping carried');
      const stats = BpfMap.fromPin(path.join(pinDir, 'lb', 'lb_stats'));
      assert.is(stats.info.maxEntries, 8);
      stats.close();
      assert.equal(libbpfWarnings(mark), []);
    } finally {
      b.close();
    }
  } finally {
    releaseRetired();
    fs.rmSync(pinDir, { recursive: true, force: true });
  }
});

test.run();
