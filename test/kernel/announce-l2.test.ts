// L2 announcement on a real segment: a "router" and two "nodes" on one bridge. The announcing node answers
// ARP for the floating address (proxy entry); when the other node takes over, its gratuitous ARP moves the
// router's ARP entry to it without waiting for the entry to age out; withdrawal stops the answers.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { execFileSync, spawnSync } from 'node:child_process';
import { announceL2, isAnnouncedL2, withdrawL2, arpFrame } from '../../daemon/egress/announce-l2';
import { addNetns, delNetns, ipJson, uniqueName } from '../lib/netns';

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

test.run();
