// Kernel tests of the DSR set-up in one place (daemon/pod/dsr-target.ts): an LB target's set-up records
// every action and its undo brings the pod back exactly as before; on a pod whose CNI config already put
// VIPs on tether0, the target adopts the link and its undo leaves the CNI's link, VIP and sysctls alone.
// Each test uses its own uniquely named namespace, removed even on failure.
import { execFileSync } from 'node:child_process';
import * as fs from 'node:fs';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { setLogger, makeLogger } from '../../lib/log';
import { NetlinkHandle } from '../../daemon/netlink';
import { setTargetVips, setUpDsrTarget, undoDsrTarget } from '../../daemon/pod/dsr-target';
import { applyPodNetwork, undoPodNetwork, validatePodNetConfig } from '../../daemon/pod/pod-network';
import { addNetns, delNetns, snapshot, uniqueName } from '../lib/netns';

setLogger(makeLogger({ stream: fs.createWriteStream('/dev/null') }));

const created: string[] = [];

test.after.each(() => delNetns(...created.splice(0)));

/** A pod netns with eth0 (a veth whose peer stays in the pod netns too: no host side). */
function pod(): { name: string; path: string } {
  const name = uniqueName('tdsr');
  created.push(name);
  const path = addNetns(name);
  execFileSync('ip', ['-n', name, 'link', 'add', 'eth0', 'type', 'veth', 'peer', 'name', 'peer0']);
  execFileSync('ip', ['-n', name, 'link', 'set', 'eth0', 'up']);
  return { name, path };
}

const dummy = NetlinkHandle.with(undefined, (h) => h.kernelHasDummy());

test('an LB target set-up is recorded action by action and undone exactly', () => {
  const p = pod();
  const before = snapshot(p.name, ['eth0']);
  const t = setUpDsrTarget({ netns: p.path, ifName: 'eth0', overhead: 50 }, { pod: 'ns/target' });
  setTargetVips(t, new Set(['198.51.100.7', '198.51.100.8']), { pod: 'ns/target' });
  const up = snapshot(p.name, ['eth0']);
  const dev = dummy ? 'tether0' : 'lo';
  assert.equal(t.vipDev, dev);
  assert.ok(up.addrs.includes(`${dev} 198.51.100.7/32`) && up.addrs.includes(`${dev} 198.51.100.8/32`), JSON.stringify(up.addrs));
  assert.is(up.sysctls['all/arp_ignore'], '1');
  assert.is(up.sysctls['eth0/arp_announce'], '2');
  if (dummy) assert.equal(t.vipLink?.name, 'tether0');
  assert.is(t.sysctls.length, 4);
  // The record is plain JSON (the pod record keeps it) and what it lists is what a later daemon undoes.
  const recorded = JSON.parse(JSON.stringify(t));
  setTargetVips(recorded, new Set(['198.51.100.8']), { pod: 'ns/target' });
  assert.not.ok(snapshot(p.name).addrs.includes(`${dev} 198.51.100.7/32`));
  undoDsrTarget(recorded, { pod: 'ns/target' });
  assert.equal(snapshot(p.name, ['eth0']), before);
  undoDsrTarget(recorded, { pod: 'ns/target' }); // idempotent
  assert.equal(snapshot(p.name, ['eth0']), before);
});

test('a target on a pod with CNI-config VIPs adopts tether0; its undo leaves the CNI set-up as it was', () => {
  if (!dummy) return; // lo holds the VIPs: nothing to adopt
  const p = pod();
  const before = snapshot(p.name, ['eth0']);
  const applied = applyPodNetwork({ netns: p.path, ifName: 'eth0' }, validatePodNetConfig({ vips: ['192.0.2.10'] }));
  const cni = snapshot(p.name, ['eth0']);
  const t = setUpDsrTarget({ netns: p.path, ifName: 'eth0', overhead: 50 }, { pod: 'ns/both' });
  assert.is(t.vipLink, undefined, 'the link is the CNI set-up\'s, not recorded as the target\'s');
  setTargetVips(t, new Set(['198.51.100.9']), { pod: 'ns/both' });
  assert.ok(snapshot(p.name).addrs.includes('tether0 198.51.100.9/32'));
  undoDsrTarget(t, { pod: 'ns/both' });
  assert.equal(snapshot(p.name, ['eth0']), cni, 'the CNI set-up is untouched');
  undoPodNetwork(applied);
  assert.equal(snapshot(p.name, ['eth0']), before);
});

test('an IPv6 VIP: /128 without DAD on the VIP device, the IPv6 MTU lowered by 20 more, no neighbour advertisement on eth0, all undone', () => {
  const p = pod();
  const host = uniqueName('tdsr-host');
  created.push(host);
  addNetns(host);
  // A host side this time: the pod's eth0 paired with hostv in another namespace, both with IPv6.
  execFileSync('ip', ['-n', p.name, 'link', 'del', 'eth0']);
  execFileSync('ip', ['-n', p.name, 'link', 'add', 'eth0', 'type', 'veth', 'peer', 'name', 'hostv', 'netns', host]);
  // No DAD of the link-local address either: its local route appearing mid-test would differ the snapshots.
  execFileSync('nsenter', [`--net=${p.path}`, 'sysctl', '-qw', 'net.ipv6.conf.eth0.accept_dad=0']);
  execFileSync('ip', ['-n', p.name, 'link', 'set', 'eth0', 'mtu', '1450', 'up']);
  execFileSync('ip', ['-n', p.name, 'addr', 'add', 'fd93::2/64', 'dev', 'eth0', 'nodad']);
  execFileSync('ip', ['-n', host, 'link', 'set', 'hostv', 'up']);
  execFileSync('ip', ['-n', host, 'addr', 'add', 'fd93::1/64', 'dev', 'hostv', 'nodad']);
  const before = snapshot(p.name, ['eth0']);
  const mtu6 = () => execFileSync('nsenter', [`--net=${p.path}`, 'sysctl', '-n', 'net.ipv6.conf.eth0.mtu'], { encoding: 'utf8' }).trim();
  assert.is(mtu6(), '1450');

  const t = setUpDsrTarget({ netns: p.path, ifName: 'eth0', overhead: 28 }, { pod: 'ns/v6' });
  setTargetVips(t, new Set(['198.51.100.7', 'fd93:100::7']), { pod: 'ns/v6' });
  const dev = dummy ? 'tether0' : 'lo';
  const addrs = execFileSync('ip', ['-n', p.name, '-6', '-j', 'addr', 'show', 'dev', dev], { encoding: 'utf8' });
  const vip = (JSON.parse(addrs)[0].addr_info as Array<{ local: string; prefixlen: number; tentative?: boolean; nodad?: boolean }>).find((a) => a.local === 'fd93:100::7');
  assert.ok(vip, `the IPv6 VIP is on ${dev}: ${addrs}`);
  assert.is(vip!.prefixlen, 128);
  assert.ok(vip!.nodad && !vip!.tentative, 'no DAD: usable at once');
  assert.is(mtu6(), '1430', 'IPv6 MTU: the link\'s 1450 less 20 (outer IPv6 is 48 bytes, outer IPv4 28)');

  // The node asks for the VIP on the pod's link (as it would if it routed the VIP there): the pod must not
  // answer; it does answer for its own address on eth0 (the control).
  execFileSync('ip', ['-n', host, '-6', 'route', 'add', 'fd93:100::7/128', 'dev', 'hostv']);
  const ping = (a: string) => {
    try {
      execFileSync('nsenter', [`--net=/run/netns/${host}`, 'ping', '-6', '-c', '1', '-W', '3', a], { stdio: 'ignore' });
      return true;
    } catch {
      return false;
    }
  };
  assert.ok(ping('fd93::2'), 'the pod answers for its own address');
  assert.not.ok(ping('fd93:100::7'), 'nothing answers for the VIP on eth0');
  const neigh = execFileSync('ip', ['-n', host, '-6', 'neigh', 'show', 'fd93:100::7'], { encoding: 'utf8' });
  assert.not.match(neigh, /lladdr/, `no neighbour advertisement for the VIP: ${neigh}`);

  undoDsrTarget(JSON.parse(JSON.stringify(t)), { pod: 'ns/v6' });
  assert.equal(snapshot(p.name, ['eth0']), before);
  assert.is(mtu6(), '1450', 'the IPv6 MTU restored');
});

test.run();
