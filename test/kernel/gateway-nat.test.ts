// A gateway pod's NAT on the real kernel (GatewayDatapath): a client flow that reaches a gateway before it
// has SNAT to a floating address (a standby, or an owner in the milliseconds before its rule is written)
// is dropped in the pod without a conntrack entry, so the same flow is NATed once the pod owns the address
// (a "no NAT" entry would keep the flow un-NATed for its whole life, and the node's guard would drop every
// packet of it). A second prepare (a tetherd restart) duplicates no rule and keeps an owned address's SNAT.
//
//   client 10.96.1.2 ─vcl─ node ─vgw─ gw pod 10.96.2.2 (eth0)        node ─vsv─ server 192.0.2.20
//   node: packets from the client's veth go to the gw pod (policy route); the pod forwards them back out
//   of eth0, SNATed; replies to the floating address are routed to the pod by own().
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import * as fs from 'node:fs';
import { ensureBpffs } from '../../daemon/bpf/bpffs';
import { GatewayDatapath } from '../../daemon/egress/gateway-datapath';
import { inNetns } from '../../daemon/sys/netns';
import { addNetns, delNetns, uniqueName } from '../lib/netns';
import { waitFor } from '../lib/wait';

const CLIENT = '10.96.1.2';
const GW = '10.96.2.2';
const SERVER = '192.0.2.20';
const FLOATING = '203.0.113.77';
const PORT = 7001;
const CLIENT_PORT = 40123;

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

async function withBed(fn: (b: Bed) => Promise<void>): Promise<void> {
  const base = uniqueName('tgn');
  const b: Bed = {
    node: `${base}-node`,
    client: `${base}-cl`,
    gw: `${base}-gw`,
    server: `${base}-sv`,
    pinDir: `/sys/fs/bpf/tether-test/${base}`,
    datapath: () => new GatewayDatapath({ pod: 'egress-test/gw', netns: `/run/netns/${b.gw}`, podIp: GW, ifName: 'eth0', hostIfName: 'vgw' }, { uplink: 'vsv', fouPort: 5555, pinDir: b.pinDir }),
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

test('a flow that reaches the gateway before its SNAT rule gets no conntrack entry, and is NATed once the pod owns the address', async () => {
  await withBed(async (b) => {
    const srv = udpServer(b);
    try {
      await waitFor(() => srv.sources.includes('ready'), 'the UDP server to listen');
      const dp = b.datapath();
      onNode(b, () => dp.prepare(['192.0.2.1'], { destinations: ['192.0.2.0/24'], excluded: [] }));

      // Standby: the flow's packets die in the pod, and nothing is remembered about the flow.
      assert.is(udpFlow(b, 5), 0, 'no echo through a gateway that owns no address');
      await new Promise((r) => setTimeout(r, 200)); // anything the server printed is read by now
      assert.equal(srv.sources.filter((s) => s !== 'ready'), [], 'the server saw nothing');
      assert.equal(clientEntries(b), [], 'no conntrack entry for the client flow in the pod');
      const unnated = inNs(b.gw, 'nft', 'list', 'chain', 'ip', 'tether_egress', 'unnated');
      assert.match(unnated, /counter packets [1-9]/, `the pod dropped them itself: ${unnated}`);

      // Owner: the same flow (same 5-tuple) now leaves with the floating address and its echoes return.
      onNode(b, () => dp.own(FLOATING, { mode: 'l2' }));
      assert.is(udpFlow(b, 5), 5, 'every echo through the owner');
      const seen = () => srv.sources.filter((s) => s !== 'ready');
      await waitFor(() => seen().length >= 5, 'the server to log the datagrams', { timeoutMs: 2000, describe: () => String(seen()) });
      assert.ok(seen().every((s) => s === FLOATING), `the server saw only the floating address: ${seen()}`);
      const entries = clientEntries(b);
      assert.is(entries.length, 1, `one entry for the flow: ${entries}`);
      assert.match(entries[0], new RegExp(`dst=${FLOATING.replace(/\./g, '\\.')}`), `NATed to the floating address: ${entries[0]}`);
      assert.is(dp.guardStats()?.droppedOtherSource, 0, 'the node guard dropped nothing');
    } finally {
      srv.proc.kill();
    }
  });
});

test('prepare again on the same pod (a tetherd restart) duplicates no rule and keeps the SNAT of an owned address', async () => {
  await withBed(async (b) => {
    const guarded = { destinations: ['192.0.2.0/24'], excluded: [] };
    const first = b.datapath();
    onNode(b, () => first.prepare(['192.0.2.1'], guarded));
    onNode(b, () => first.own(FLOATING, { mode: 'l2' }));
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

test.run();
