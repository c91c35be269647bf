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

test.run();
