// L2 announcement on a real segment: a "router" and two "nodes" on one bridge. The announcing node answers
// ARP for the floating address (proxy entry); when the other node takes over, its gratuitous ARP moves the
// router's ARP entry to it without waiting for the entry to age out; withdrawal stops the answers.
// In IPv6 the same with proxy NDP and unsolicited Neighbor Advertisements, captured at the router.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { execFileSync, spawn, spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { announceL2, isAnnouncedL2, withdrawL2, arpFrame, neighborAdvertFrame } from '../../daemon/egress/announce-l2';
import { ipToBytes } from '../../lib/ip';
import { addNetns, delNetns, ipJson, uniqueName } from '../lib/netns';
import { waitFor } from '../lib/wait';

const FLOAT = '198.51.100.77';

function sh(ns: string, ...args: string[]) {
  execFileSync('ip', ['-n', ns, ...args]);
}

function routerMacFor(router: string): string | undefined {
  return ipJson(router, ['neigh', 'show', FLOAT]).find((n) => n.lladdr)?.lladdr;
}

test('GARP frame layout', () => {
  const f = arpFrame(1, Buffer.from([2, 0, 0, 0, 0, 1]), Buffer.from([198, 51, 100, 77]));
  assert.is(f.length, 42);
  assert.is(f.readUInt16BE(12), 0x0806);
  assert.is(f.readUInt16BE(20), 1);
  assert.equal([...f.subarray(28, 32)], [198, 51, 100, 77]);
  assert.equal([...f.subarray(38, 42)], [198, 51, 100, 77]);
});

test('announce → router resolves to node A; B announces → router moves to B at once; withdraw', async () => {
  const base = uniqueName('tl2');
  const [r, a, b] = [`${base}-r`, `${base}-a`, `${base}-b`];
  try {
    for (const n of [r, a, b]) addNetns(n);
    sh(r, 'link', 'add', 'br0', 'type', 'bridge');
    sh(r, 'link', 'set', 'br0', 'up');
    sh(r, 'addr', 'add', '198.51.100.1/24', 'dev', 'br0');
    // A router that follows gratuitous ARP immediately (Linux's default locktime would hold it for 1 s).
    execFileSync('nsenter', [`--net=/run/netns/${r}`, 'sysctl', '-qw', 'net.ipv4.neigh.br0.locktime=0']);
    for (const [n, ip] of [[a, '198.51.100.11'], [b, '198.51.100.12']]) {
      sh(r, 'link', 'add', `p-${n.slice(-1)}`, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', n);
      sh(r, 'link', 'set', `p-${n.slice(-1)}`, 'master', 'br0', 'up');
      sh(n, 'addr', 'add', `${ip}/24`, 'dev', 'eth0');
      sh(n, 'link', 'set', 'eth0', 'up');
      // As on an owner node: forwarding on, and the floating address routed to a gateway pod's link.
      execFileSync('nsenter', [`--net=/run/netns/${n}`, 'sysctl', '-qw', 'net.ipv4.ip_forward=1']);
      sh(n, 'link', 'add', 'gw0', 'type', 'veth', 'peer', 'name', 'gw1');
      sh(n, 'link', 'set', 'gw0', 'up');
      sh(n, 'link', 'set', 'gw1', 'up');
      sh(n, 'route', 'add', `${FLOAT}/32`, 'dev', 'gw0');
    }
    const macA = ipJson(a, ['link', 'show', 'eth0'])[0].address;
    const macB = ipJson(b, ['link', 'show', 'eth0'])[0].address;
    await new Promise((res) => setTimeout(res, 300));

    announceL2({ netns: `/run/netns/${a}`, ifName: 'eth0', address: FLOAT });
    assert.ok(isAnnouncedL2({ netns: `/run/netns/${a}`, ifName: 'eth0', address: FLOAT }));
    // The router asks (arping-free: a TCP connect triggers ARP resolution) and gets A's MAC.
    spawnSync('nsenter', [`--net=/run/netns/${r}`, process.execPath, '-e', `require('net').connect(9, '${FLOAT}').on('error',()=>{}); setTimeout(()=>process.exit(0), 300)`]);
    assert.is(routerMacFor(r), macA, 'router resolved the floating address to node A');

    announceL2({ netns: `/run/netns/${b}`, ifName: 'eth0', address: FLOAT });
    withdrawL2({ netns: `/run/netns/${a}`, ifName: 'eth0', address: FLOAT });
    await new Promise((res) => setTimeout(res, 100));
    assert.is(routerMacFor(r), macB, 'gratuitous ARP moved the router to node B');
    assert.not.ok(isAnnouncedL2({ netns: `/run/netns/${a}`, ifName: 'eth0', address: FLOAT }));
    withdrawL2({ netns: `/run/netns/${a}`, ifName: 'eth0', address: FLOAT }); // idempotent

    // Two gateway pods of node B hand the address over: B answers until the last of them withdraws.
    const onB = (holder: string) => ({ netns: `/run/netns/${b}`, ifName: 'eth0', address: FLOAT, holder });
    withdrawL2({ netns: `/run/netns/${b}`, ifName: 'eth0', address: FLOAT });
    announceL2(onB('shop/gw1'));
    announceL2(onB('shop/gw2'));
    withdrawL2(onB('shop/gw1'));
    assert.ok(isAnnouncedL2(onB('')), 'still announced for the other local gateway pod');
    withdrawL2(onB('shop/gw2'));
    assert.not.ok(isAnnouncedL2(onB('')), 'withdrawn with the last holder');
  } finally {
    for (const n of [a, b]) {
      try {
        withdrawL2({ netns: `/run/netns/${n}`, ifName: 'eth0', address: FLOAT });
      } catch {
        // namespace already gone
      }
    }
    delNetns(r, a, b);
  }
});

const FLOAT6 = '2001:db8:51::77';
const MAC_A = Buffer.from([2, 0, 0, 0, 0, 0xa]);

/** The one's-complement sum of an ICMPv6 message with its pseudo-header: 0xffff when the checksum is right. */
function icmpv6SumOk(frame: Buffer): boolean {
  const ip = frame.subarray(14, 54);
  const msg = frame.subarray(54, 54 + ip.readUInt16BE(4));
  const words = Buffer.concat([ip.subarray(8, 40), Buffer.from([0, 0, 0, msg.length, 0, 0, 0, 58]), msg]);
  let sum = 0;
  for (let i = 0; i < words.length; i += 2) sum += words.readUInt16BE(i);
  while (sum > 0xffff) sum = (sum & 0xffff) + (sum >>> 16);
  return sum === 0xffff;
}

/** What a receiver checks of an unsolicited NA (RFC 4861 7.1.2, 7.2.6), as [field, value] pairs. */
function naFields(f: Buffer) {
  const icmp = f.subarray(54);
  return {
    ethDst: [...f.subarray(0, 6)],
    ethType: f.readUInt16BE(12),
    nextHeader: f[20],
    hopLimit: f[21],
    ipDst: [...f.subarray(38, 54)],
    type: icmp[0],
    code: icmp[1],
    flags: icmp[4] & 0xe0,
    target: [...icmp.subarray(8, 24)],
    option: [icmp[24], icmp[25]],
    optionMac: [...icmp.subarray(26, 32)],
    checksumOk: icmpv6SumOk(f),
  };
}

test('unsolicited Neighbor Advertisement frame layout', () => {
  const f = neighborAdvertFrame(MAC_A, ipToBytes('fe80::a'), ipToBytes(FLOAT6));
  assert.is(f.length, 86);
  assert.equal(naFields(f), {
    ethDst: [0x33, 0x33, 0, 0, 0, 1],
    ethType: 0x86dd,
    nextHeader: 58,
    hopLimit: 255,
    ipDst: [...ipToBytes('ff02::1')],
    type: 136,
    code: 0,
    flags: 0x20, // Override only: not Solicited, not Router
    target: [...ipToBytes(FLOAT6)],
    option: [2, 1],
    optionMac: [...MAC_A],
    checksumOk: true,
  });
  assert.equal([...f.subarray(6, 12)], [...MAC_A], 'from the uplink MAC');
  assert.equal([...f.subarray(22, 38)], [...ipToBytes('fe80::a')], 'from the given source');
  f[60]++; // a changed target byte no longer matches the checksum
  assert.not.ok(icmpv6SumOk(f));
});

/** Frames of a pcap file (tcpdump -w: microsecond timestamps, this host's byte order). */
function pcapFrames(file: string): Array<{ t: number; frame: Buffer }> {
  const b = fs.readFileSync(file);
  if (b.length < 24) return [];
  assert.is(b.readUInt32LE(0), 0xa1b2c3d4, 'a little-endian microsecond pcap');
  const out: Array<{ t: number; frame: Buffer }> = [];
  for (let o = 24; o + 16 <= b.length;) {
    const len = b.readUInt32LE(o + 8);
    if (o + 16 + len > b.length) break;
    out.push({ t: b.readUInt32LE(o) * 1000 + b.readUInt32LE(o + 4) / 1000, frame: b.subarray(o + 16, o + 16 + len) });
    o += 16 + len;
  }
  return out;
}

test('IPv6: announce → router resolves to node A by proxy NDP; B announces → its unsolicited NA moves the router to B at once; withdraw', async () => {
  const base = uniqueName('tl6');
  const [r, a, b] = [`${base}-r`, `${base}-a`, `${base}-b`];
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tl6-'));
  const pcap = path.join(dir, 'na.pcap');
  let capture: ReturnType<typeof spawn> | undefined;
  const sysctl = (ns: string, ...kv: string[]) => execFileSync('nsenter', [`--net=/run/netns/${ns}`, 'sysctl', '-qw', ...kv]);
  const routerNeigh = () => ipJson(r, ['-6', 'neigh', 'show', FLOAT6, 'dev', 'br0']).find((n) => n.lladdr);
  try {
    for (const n of [r, a, b]) {
      addNetns(n);
      // Links made here come up without duplicate address detection (its second of tentative addresses).
      sysctl(n, 'net.ipv6.conf.default.accept_dad=0', 'net.ipv6.conf.all.accept_dad=0');
    }
    sh(r, 'link', 'add', 'br0', 'type', 'bridge');
    sh(r, 'link', 'set', 'br0', 'up');
    sh(r, '-6', 'addr', 'add', '2001:db8:51::1/64', 'dev', 'br0', 'nodad');
    for (const [n, ip] of [[a, '2001:db8:51::11'], [b, '2001:db8:51::12']]) {
      sh(r, 'link', 'add', `p-${n.slice(-1)}`, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', n);
      sh(r, 'link', 'set', `p-${n.slice(-1)}`, 'master', 'br0', 'up');
      sh(n, '-6', 'addr', 'add', `${ip}/64`, 'dev', 'eth0', 'nodad');
      sh(n, 'link', 'set', 'eth0', 'up');
      // As on an owner node: IPv6 forwarding on (proxy NDP needs it), the address routed to a gateway pod's link.
      sysctl(n, 'net.ipv6.conf.all.forwarding=1');
      sh(n, 'link', 'add', 'gw0', 'type', 'veth', 'peer', 'name', 'gw1');
      sh(n, 'link', 'set', 'gw0', 'up');
      sh(n, 'link', 'set', 'gw1', 'up');
      sh(n, '-6', 'route', 'add', `${FLOAT6}/128`, 'dev', 'gw0');
    }
    const macA = ipJson(a, ['link', 'show', 'eth0'])[0].address;
    const macB = ipJson(b, ['link', 'show', 'eth0'])[0].address;
    const linkLocal = (n: string): string | undefined => ipJson(n, ['-6', 'addr', 'show', 'dev', 'eth0'])[0]?.addr_info?.find((i: { scope?: string }) => i.scope === 'link')?.local;
    await waitFor(() => !!linkLocal(a) && !!linkLocal(b), 'the nodes\' link-local addresses');
    const linkLocalB = linkLocal(b)!;
    await waitFor(() => ipJson(r, ['link', 'show', 'br0'])[0].operstate === 'UP', 'the bridge to forward');

    const onA = { netns: `/run/netns/${a}`, ifName: 'eth0', address: FLOAT6 };
    announceL2(onA);
    assert.ok(isAnnouncedL2(onA), 'A has the proxy entry');
    assert.is(ipJson(a, ['-6', 'neigh', 'show', 'proxy'])[0]?.dst, FLOAT6);
    // The router asks (a UDP datagram to the address makes it solicit) and node A answers for the address.
    const ask = () => spawnSync('nsenter', [`--net=/run/netns/${r}`, process.execPath, '-e', `const u = require('dgram').createSocket('udp6'); u.send('x', 9, '${FLOAT6}', () => setTimeout(() => process.exit(0), 50));`]);
    ask();
    await waitFor(() => routerNeigh()?.lladdr === macA, 'the router to resolve the floating address to node A', { timeoutMs: 3000, describe: () => JSON.stringify(routerNeigh()) });

    capture = spawn('ip', ['netns', 'exec', r, 'tcpdump', '-i', 'br0', '--immediate-mode', '-U', '-n', '-w', pcap, 'icmp6'], { stdio: ['ignore', 'ignore', 'pipe'] });
    let listening = false;
    capture.stderr!.on('data', (d: Buffer) => { if (d.toString().includes('listening on')) listening = true; });
    await waitFor(() => listening, 'tcpdump to listen');

    const t0 = Date.now();
    announceL2({ netns: `/run/netns/${b}`, ifName: 'eth0', address: FLOAT6 });
    withdrawL2(onA);
    const moved = await waitFor(() => routerNeigh()?.lladdr === macB, 'the router to move the address to node B', { timeoutMs: 150, intervalMs: 5, describe: () => JSON.stringify(routerNeigh()) });
    assert.ok(Date.now() - t0 < 150, `moved in ${moved} ms, without a solicitation timing out first`);
    assert.not.ok(isAnnouncedL2(onA), 'A withdrew');
    assert.equal(ipJson(a, ['-6', 'neigh', 'show', 'proxy']), [], 'A has no proxy entry left');
    withdrawL2(onA); // idempotent

    // The repeats: 0, 200 and 1000 ms, like gratuitous ARP.
    await new Promise((res) => setTimeout(res, 1300));
    capture.kill('SIGINT');
    await new Promise((res) => capture!.once('exit', res));
    capture = undefined;
    const nas = pcapFrames(pcap).filter(({ frame }) => frame.readUInt16BE(12) === 0x86dd && frame[20] === 58 && frame[54] === 136 && frame.subarray(6, 12).equals(Buffer.from(macB.split(':').map((x: string) => parseInt(x, 16)))));
    assert.is(nas.length, 3, `three unsolicited NAs from node B (${pcapFrames(pcap).map((p) => `${(p.t - t0).toFixed(0)}ms ${p.frame.subarray(6, 12).toString('hex')} type ${p.frame[54]}`)} captured)`);
    for (const { frame } of nas) {
      assert.equal(naFields(frame), {
        ethDst: [0x33, 0x33, 0, 0, 0, 1], ethType: 0x86dd, nextHeader: 58, hopLimit: 255, ipDst: [...ipToBytes('ff02::1')],
        type: 136, code: 0, flags: 0x20, target: [...ipToBytes(FLOAT6)], option: [2, 1],
        optionMac: macB.split(':').map((x: string) => parseInt(x, 16)), checksumOk: true,
      });
      assert.equal([...frame.subarray(22, 38)], [...ipToBytes(linkLocalB)], 'sent from B\'s link-local address');
    }
    const gaps = [nas[1].t - nas[0].t, nas[2].t - nas[0].t];
    assert.ok(gaps[0] > 150 && gaps[0] < 500 && gaps[1] > 900 && gaps[1] < 1400, `repeated at about 200 and 1000 ms: ${gaps.map((g) => g.toFixed(0))}`);

    // B answers solicitations too: once its entry goes stale the router asks B directly and keeps B.
    ask();
    await waitFor(() => routerNeigh()?.lladdr === macB && /REACHABLE|DELAY|PROBE|STALE/.test(String(routerNeigh()?.state)), 'the router to keep node B');

    const onB = { netns: `/run/netns/${b}`, ifName: 'eth0', address: FLOAT6 };
    withdrawL2(onB);
    assert.not.ok(isAnnouncedL2(onB), 'withdrawn from B');
    assert.equal(ipJson(b, ['-6', 'neigh', 'show', 'proxy']), [], 'B has no proxy entry left');
  } finally {
    if (capture) capture.kill('SIGKILL');
    for (const n of [a, b]) {
      try {
        withdrawL2({ netns: `/run/netns/${n}`, ifName: 'eth0', address: FLOAT6 });
      } catch {
        // namespace already gone
      }
    }
    delNetns(r, a, b);
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test.run();
