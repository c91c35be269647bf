// Kernel tests of the pod network primitives: a pod netns wired by hand with a veth to a "host" netns,
// apply -> assert via netlink and `ip -j` -> check -> tamper -> check fails -> undo -> exactly as before.
// Every test uses its own uniquely named namespaces and removes them afterwards, even on failure.
import { execFileSync } from 'node:child_process';
import * as crypto from 'node:crypto';
import * as fs from 'node:fs';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { NetlinkHandle } from '../../daemon/netlink';
import { readNetSysctl } from '../../daemon/sys/netns';
import {
  addedInterfaces, applyPodNetwork, checkPodNetwork, undoPodNetwork, validatePodNetConfig, type AppliedPodNetwork,
} from '../../daemon/pod/pod-network';
import { setLogger, makeLogger } from '../../lib/log';

// Keep test output readable: the JSON action log goes to a file instead of stderr.
setLogger(makeLogger({ stream: fs.createWriteStream('/dev/null') }));

const created: string[] = [];

function netns(): string {
  const name = `tnl-${crypto.randomBytes(4).toString('hex')}`;
  execFileSync('ip', ['netns', 'add', name]);
  created.push(name);
  return name;
}

test.after.each(() => {
  for (const ns of created.splice(0)) {
    try { execFileSync('ip', ['netns', 'del', ns], { stdio: 'ignore' }); } catch { /* already gone */ }
  }
});

function ip(ns: string, ...args: string[]): void {
  execFileSync('ip', ['-n', ns, ...args]);
}

function ipj(ns: string, ...args: string[]): any[] {
  return JSON.parse(execFileSync('ip', ['-n', ns, '-j', ...args]).toString() || '[]');
}

/**
 * Pod netns with lo up (as the CNI loopback plugin leaves it), eth0 10.20.0.2/24 + fd20::2/64, and a host
 * netns with hveth 10.20.0.1/24, MTU 1500. No IPv6 link-local addresses: they appear asynchronously when
 * carrier comes up and would make before/after snapshots race.
 */
function pod(): { pod: string; host: string; podPath: string; hostPath: string } {
  const p = netns();
  const h = netns();
  ip(h, 'link', 'add', 'hveth', 'mtu', '1500', 'type', 'veth', 'peer', 'name', 'eth0', 'netns', p);
  ip(h, 'link', 'set', 'hveth', 'addrgenmode', 'none');
  ip(p, 'link', 'set', 'eth0', 'addrgenmode', 'none');
  ip(p, 'link', 'set', 'lo', 'up');
  ip(h, 'addr', 'add', '10.20.0.1/24', 'dev', 'hveth');
  ip(h, 'link', 'set', 'hveth', 'up');
  ip(p, 'addr', 'add', '10.20.0.2/24', 'dev', 'eth0');
  ip(p, 'addr', 'add', 'fd20::2/64', 'dev', 'eth0', 'nodad');
  ip(p, 'link', 'set', 'eth0', 'up');
  // Carrier arrives through the kernel's linkwatch a little later and brings IPv6 routes (ff00::/8);
  // wait for it so the "before" snapshot is the settled state.
  const deadline = Date.now() + 3000;
  while (ipj(p, '-6', 'route', 'show', 'table', 'local', 'ff00::/8').length === 0) {
    if (Date.now() > deadline) throw new Error('pod eth0 never got carrier');
    execFileSync('sleep', ['0.02']);
  }
  return { pod: p, host: h, podPath: `/run/netns/${p}`, hostPath: `/run/netns/${h}` };
}

const SYSCTLS = ['all/arp_ignore', 'all/arp_announce', 'eth0/arp_ignore', 'eth0/arp_announce'].map((k) => `net/ipv4/conf/${k}`);

/** Everything applyPodNetwork may touch, in a comparable form. */
function snapshot(podPath: string, hostPath: string) {
  return NetlinkHandle.with(podPath, (h) => NetlinkHandle.with(hostPath, (host) => ({
    links: h.listLinks().map((l) => ({ name: l.name, mtu: l.mtu, up: l.up, kind: l.kind })),
    addrs: h.listAddresses().map((a) => `${a.index} ${a.address}/${a.prefixLen}`).sort(),
    routes: h.listRoutes().map((r) => `${r.table} ${r.dst}/${r.dstLen} ${r.gateway} ${r.index} ${r.mtu}`).sort(),
    sysctls: SYSCTLS.map((k) => `${k}=${readNetSysctl(podPath, k)}`),
    host: host.listLinks().map((l) => ({ name: l.name, mtu: l.mtu })),
  })));
}

const CFG = { encapOverhead: 28, vips: ['10.96.0.10', 'fd96::10/128'], routes: [{ dst: '10.96.0.0/24', gw: '10.20.0.1', mtu: 1472 }] };

test('apply: MTU on both ends, VIPs, sysctls, route; check; tamper; undo restores the snapshot', () => {
  const t = pod();
  const before = snapshot(t.podPath, t.hostPath);
  const cfg = validatePodNetConfig({ cniVersion: '1.0.0', type: 'tether', ...CFG });
  const applied = applyPodNetwork({ netns: t.podPath, ifName: 'eth0', hostIfName: 'hveth', hostNetns: t.hostPath }, cfg);

  const dummy = NetlinkHandle.with(t.podPath, (h) => h.kernelHasDummy());
  const vipDev = dummy ? 'tether0' : 'lo';
  NetlinkHandle.with(t.podPath, (h) => {
    assert.is(h.requireLink('eth0').mtu, 1472);
    const idx = h.requireLink(vipDev).index;
    const vips = h.listAddresses({ index: idx }).map((a) => `${a.address}/${a.prefixLen}`);
    assert.ok(vips.includes('10.96.0.10/32'), `VIP v4 on ${vipDev}`);
    assert.ok(vips.includes('fd96::10/128'), `VIP v6 on ${vipDev}`);
    const r = h.listRoutes({ family: 4, table: 254 }).find((x) => x.dst === '10.96.0.0');
    assert.equal([r?.gateway, r?.mtu, r?.index], ['10.20.0.1', 1472, h.requireLink('eth0').index]);
  });
  NetlinkHandle.with(t.hostPath, (h) => assert.is(h.requireLink('hveth').mtu, 1472));
  // The same through iproute2.
  assert.is(ipj(t.pod, 'link', 'show', 'eth0')[0].mtu, 1472);
  assert.is(ipj(t.host, 'link', 'show', 'hveth')[0].mtu, 1472);
  const ipVips = (ipj(t.pod, 'addr', 'show', 'dev', vipDev)[0].addr_info as any[]).map((a) => `${a.local}/${a.prefixlen}`);
  assert.ok(ipVips.includes('10.96.0.10/32') && ipVips.includes('fd96::10/128'));
  const ipRoute = ipj(t.pod, 'route', 'show', '10.96.0.0/24')[0];
  assert.equal([ipRoute.gateway, ipRoute.dev, ipRoute.metrics?.[0]?.mtu], ['10.20.0.1', 'eth0', 1472]);
  assert.equal(SYSCTLS.map((k) => readNetSysctl(t.podPath, k)), ['1', '2', '1', '2']);
  assert.equal(addedInterfaces(applied).map((i) => i.name), dummy ? ['tether0'] : []);
  assert.not.ok(applied.loBroughtUp, 'lo was already up');

  checkPodNetwork(applied);

  // Tamper with three things; check must name each.
  ip(t.pod, 'link', 'set', 'eth0', 'mtu', '1400');
  ip(t.pod, 'addr', 'del', '10.96.0.10/32', 'dev', vipDev);
  execFileSync('ip', ['netns', 'exec', t.pod, 'sysctl', '-qw', 'net.ipv4.conf.all.arp_ignore=0']);
  try {
    checkPodNetwork(applied);
    assert.unreachable('check must fail');
  } catch (e) {
    assert.is((e as { code?: string }).code, 'CHECK_FAILED');
    const msg = (e as Error).message;
    assert.match(msg, /eth0 MTU is 1400, expected 1472/);
    assert.match(msg, /VIP 10\.96\.0\.10\/32 is missing/);
    assert.match(msg, /net\/ipv4\/conf\/all\/arp_ignore is 0, expected 1/);
  }
  // The host side too.
  ip(t.host, 'link', 'set', 'hveth', 'mtu', '1500');
  assert.throws(() => checkPodNetwork(applied), /host-side hveth MTU is 1500/);

  // Undo from the persisted (JSON) record, as a restarted daemon would; twice to show idempotency.
  const persisted = JSON.parse(JSON.stringify(applied)) as AppliedPodNetwork;
  undoPodNetwork(persisted);
  undoPodNetwork(persisted);
  assert.equal(snapshot(t.podPath, t.hostPath), before);
});

test('host peer found by IFLA_LINK when hostIfName is not given', () => {
  const t = pod();
  const before = snapshot(t.podPath, t.hostPath);
  const applied = applyPodNetwork({ netns: t.podPath, ifName: 'eth0', hostNetns: t.hostPath }, { mtu: 1400 });
  assert.is(applied.hostMtu?.ifName, 'hveth');
  assert.is(ipj(t.host, 'link', 'show', 'hveth')[0].mtu, 1400);
  assert.is(ipj(t.pod, 'link', 'show', 'eth0')[0].mtu, 1400);
  undoPodNetwork(applied);
  assert.equal(snapshot(t.podPath, t.hostPath), before);
});

test('undo after the pod netns was deleted succeeds', () => {
  const t = pod();
  const applied = applyPodNetwork({ netns: t.podPath, ifName: 'eth0', hostIfName: 'hveth', hostNetns: t.hostPath }, validatePodNetConfig(CFG));
  execFileSync('ip', ['netns', 'del', t.pod]);
  undoPodNetwork(applied);
  undoPodNetwork(applied);
  // The veth dies with the pod namespace (the kernel cleans namespaces up asynchronously, so wait).
  const deadline = Date.now() + 3000;
  let names: string[] = [];
  while (Date.now() < deadline) {
    names = NetlinkHandle.with(t.hostPath, (h) => h.listLinks().map((l) => l.name));
    if (names.length === 1) break;
    execFileSync('sleep', ['0.05']);
  }
  assert.equal(names, ['lo']);
  assert.throws(() => checkPodNetwork(applied), /netns is gone/);
  // Even the host namespace vanishing (a test or a node teardown) does not make undo fail.
  execFileSync('ip', ['netns', 'del', t.host]);
  undoPodNetwork(applied);
});

test('apply failing half-way (route via an unreachable gateway) leaves pod and host as before', () => {
  const t = pod();
  const before = snapshot(t.podPath, t.hostPath);
  const cfg = validatePodNetConfig({ ...CFG, routes: [{ dst: '10.97.0.0/24', gw: '10.20.0.1' }, { dst: '10.98.0.0/24', gw: '10.55.0.1' }] });
  try {
    applyPodNetwork({ netns: t.podPath, ifName: 'eth0', hostIfName: 'hveth', hostNetns: t.hostPath }, cfg);
    assert.unreachable('apply must fail');
  } catch (e) {
    assert.is((e as { code?: string }).code, 'NETLINK');
    assert.match((e as Error).message, /RTM_NEWROUTE 10\.98\.0\.0\/24 via 10\.55\.0\.1.*ENETUNREACH/);
  }
  assert.equal(snapshot(t.podPath, t.hostPath), before);
});

test('apply on a missing interface or netns fails clearly and changes nothing', () => {
  const t = pod();
  const before = snapshot(t.podPath, t.hostPath);
  assert.throws(() => applyPodNetwork({ netns: t.podPath, ifName: 'eth9', hostNetns: t.hostPath }, { mtu: 1400 }), /eth9.*ENODEV/);
  assert.throws(() => applyPodNetwork({ netns: '/run/netns/tnl-missing', ifName: 'eth0' }, { mtu: 1400 }), (e: unknown) => (e as { code?: string }).code === 'NETNS_GONE');
  assert.equal(snapshot(t.podPath, t.hostPath), before);
});

test('validatePodNetConfig names the bad field', () => {
  const cases: Array<[Record<string, unknown>, RegExp]> = [
    [{ mtu: 100 }, /^mtu: must be an integer 576\.\.65535/],
    [{ mtu: 1500.5 }, /^mtu: must be an integer/],
    [{ encapOverhead: -1 }, /^encapOverhead: must be an integer 0\.\.1024/],
    [{ vips: ['10.0.0.1', '10.0.0.300'] }, /^vips\[1\]: '10\.0\.0\.300' is not an IP address/],
    [{ vips: ['10.0.0.1/24'] }, /^vips\[0\]: '10\.0\.0\.1\/24' must be a single address/],
    [{ vips: ['fd00::1', 'fd00:0::1'] }, /^vips\[1\]: 'fd00:0::1' is listed twice/],
    [{ vips: 'x' }, /^vips: must be an array/],
    [{ routes: [{ dst: 'nope' }] }, /^routes\[0\]\.dst: 'nope' is not an IP address/],
    [{ routes: [{ dst: '10.0.0.0/24' }, { dst: '10.0.0.0/24', gw: 'fd00::1' }] }, /^routes\[1\]\.gw: 'fd00::1' is IPv6/],
    [{ routes: [{ dst: '10.0.0.0/24', mtu: 10 }] }, /^routes\[0\]\.mtu: must be an integer 576/],
    [{ routes: [{ dst: '10.0.0.0/24', table: 0 }] }, /^routes\[0\]\.table: must be an integer 1\.\./],
    [{ routes: [{ dst: '10.0.0.0/24', via: '10.0.0.1' }] }, /^routes\[0\]\.via: unknown field/],
  ];
  for (const [raw, re] of cases) {
    try {
      validatePodNetConfig(raw);
      assert.unreachable(`${JSON.stringify(raw)} must be refused`);
    } catch (e) {
      assert.is((e as { code?: string }).code, 'INVALID_CONFIG', JSON.stringify(raw));
      assert.match((e as Error).message, re);
    }
  }
  assert.equal(validatePodNetConfig({ type: 'tether', vips: ['fd96:0::10/128', '10.96.0.10'], routes: [{ dst: '10.96.0.7/24', gw: '10.20.0.1', table: 100 }] }),
    { vips: ['fd96::10', '10.96.0.10'], routes: [{ dst: '10.96.0.0/24', gw: '10.20.0.1', table: 100 }] });
});

test.run();
