// Kernel tests of the rtnetlink library (root, real kernel): every test works in its own uniquely named
// namespaces, removed after each test even when it fails; results are cross-checked with `ip -j`.
import { execFileSync } from 'node:child_process';
import * as crypto from 'node:crypto';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { NetlinkError, NetlinkHandle } from '../../daemon/netlink';
import { canonicalIp } from '../../lib/ip';

const created: string[] = [];
const handles: NetlinkHandle[] = [];

function netns(): string {
  const name = `tnl-${crypto.randomBytes(4).toString('hex')}`;
  execFileSync('ip', ['netns', 'add', name]);
  created.push(name);
  return name;
}

function open(ns: string): NetlinkHandle {
  const h = NetlinkHandle.open(`/run/netns/${ns}`);
  handles.push(h);
  return h;
}

function ipj(ns: string, ...args: string[]): any[] {
  return JSON.parse(execFileSync('ip', ['-n', ns, '-j', ...args]).toString() || '[]');
}

test.after.each(() => {
  for (const h of handles.splice(0)) h.close();
  for (const ns of created.splice(0)) {
    try { execFileSync('ip', ['netns', 'del', ns]); } catch { /* already gone */ }
  }
});

test('veth pair across namespaces: list, get, MTU, up, peer index and netns id, delete', () => {
  const a = netns();
  const b = netns();
  const h = open(a);
  const hb = open(b);
  h.createVeth('pa', 'pb', { peerNetns: `/run/netns/${b}`, mtu: 1450 });
  const pa = h.requireLink('pa');
  const pb = hb.requireLink('pb');
  assert.is(pa.kind, 'veth');
  assert.is(pa.mtu, 1450);
  assert.is(pb.mtu, 1450);
  assert.is(pa.linkIndex, pb.index);
  assert.is(pb.linkIndex, pa.index);
  assert.ok(pa.linkNetnsId !== undefined, 'peer in another netns has a netns id');
  assert.ok(h.listLinks().some((l) => l.name === 'pa' && l.index === pa.index));
  assert.not.ok(h.listLinks().some((l) => l.name === 'pb'), 'peer is not in namespace a');
  assert.is(h.getLink('nope'), undefined);
  assert.is(h.getLink(pa.index)?.name, 'pa');

  h.setLinkMtu('pa', 1400);
  h.setLinkUp('pa', true);
  const ip = ipj(a, 'link', 'show', 'pa')[0];
  assert.is(ip.mtu, 1400);
  assert.ok(ip.flags.includes('UP'));
  h.setLinkUp('pa', false);
  assert.not.ok(h.requireLink('pa').up);

  h.deleteLink('pa');
  assert.is(h.getLink('pa'), undefined);
  assert.is(hb.getLink('pb'), undefined, 'deleting one end removes the peer');
});

test('dummy support is detected, not a crash; creating one fails cleanly when absent', () => {
  const h = open(netns());
  const has = h.kernelHasDummy();
  assert.type(has, 'boolean');
  if (has) {
    h.createDummy('d0');
    assert.is(h.requireLink('d0').kind, 'dummy');
  } else {
    try {
      h.createDummy('d0');
      assert.unreachable('dummy creation should fail on this kernel');
    } catch (e) {
      assert.instance(e, NetlinkError);
      assert.is((e as NetlinkError).errnoName, 'EOPNOTSUPP');
      assert.match((e as Error).message, /RTM_NEWLINK d0 type dummy: EOPNOTSUPP/);
    }
  }
  assert.equal(h.listLinks().map((l) => l.name), ['lo'], 'the probe left nothing behind');
});

function vethIn(ns: string, h: NetlinkHandle): number {
  const peer = netns();
  h.createVeth('v0', 'v1', { peerNetns: `/run/netns/${peer}` });
  h.setLinkUp('v0');
  h.setLinkUp('lo');
  return h.requireLink('v0').index;
}

test('addresses v4 and v6 with prefix, scope and label; delete', () => {
  const ns = netns();
  const h = open(ns);
  const v0 = vethIn(ns, h);
  h.addAddress({ address: '10.9.0.1/24', index: v0, label: 'v0:a' });
  h.addAddress({ address: '10.9.1.1/32', index: v0, scope: 253 });
  h.addAddress({ address: 'fd00:9::1/64', index: v0, noDad: true });
  const mine = h.listAddresses({ index: v0 });
  const v4 = mine.find((a) => a.address === '10.9.0.1');
  assert.equal([v4?.prefixLen, v4?.label, v4?.family], [24, 'v0:a', 4]);
  assert.is(mine.find((a) => a.address === '10.9.1.1')?.scope, 253);
  assert.is(mine.find((a) => a.address === 'fd00:9::1')?.prefixLen, 64);
  const ip = ipj(ns, 'addr', 'show', 'dev', 'v0')[0].addr_info as any[];
  assert.ok(ip.some((x) => x.local === '10.9.0.1' && x.prefixlen === 24 && x.label === 'v0:a'));
  assert.ok(ip.some((x) => x.local === '10.9.1.1' && x.scope === 'link'));
  assert.ok(ip.some((x) => x.local === 'fd00:9::1' && x.prefixlen === 64));
  assert.equal(h.listAddresses({ family: 6, index: v0 }).every((a) => a.family === 6), true);

  h.deleteAddress({ address: '10.9.0.1/24', index: v0 });
  h.deleteAddress({ address: 'fd00:9::1/64', index: v0 });
  const left = h.listAddresses({ index: v0 }).map((a) => a.address);
  assert.not.ok(left.includes('10.9.0.1'));
  assert.not.ok(left.includes('fd00:9::1'));
});

test('routes: table, scope, gateway, src, MTU metric, ECMP v4+v6, replace, delete; cross-checked with ip -j', () => {
  const ns = netns();
  const h = open(ns);
  const v0 = vethIn(ns, h);
  h.addAddress({ address: '10.9.0.1/24', index: v0 });
  h.addAddress({ address: 'fd00:9::1/64', index: v0, noDad: true });
  h.addRoute({ dst: '10.1.0.0/24', gateway: '10.9.0.2', table: 100, mtu: 1300 });
  h.addRoute({ dst: '10.5.0.0/16', index: v0, prefSrc: '10.9.0.1' });
  h.addRoute({ dst: '10.2.0.0/24', nexthops: [{ gateway: '10.9.0.2', index: v0 }, { gateway: '10.9.0.3', index: v0, weight: 2 }] });
  h.addRoute({ dst: 'fd01::/64', nexthops: [{ gateway: 'fd00:9::2', index: v0 }, { gateway: 'fd00:9::3', index: v0 }] });
  h.addRoute({ dst: 'fd02::/64', gateway: 'fd00:9::2', mtu: 1280, table: 70000 });

  const t100 = h.listRoutes({ family: 4, table: 100 });
  assert.is(t100.length, 1);
  assert.equal([t100[0].dst, t100[0].dstLen, t100[0].gateway, t100[0].mtu, t100[0].index], ['10.1.0.0', 24, '10.9.0.2', 1300, v0]);
  const ipT100 = ipj(ns, 'route', 'show', 'table', '100');
  assert.equal([ipT100[0].dst, ipT100[0].gateway, ipT100[0].metrics?.[0]?.mtu], ['10.1.0.0/24', '10.9.0.2', 1300]);

  const main = h.listRoutes({ family: 4, table: 254 });
  const dev = main.find((r) => r.dst === '10.5.0.0');
  assert.equal([dev?.scope, dev?.prefSrc, dev?.gateway], [253, '10.9.0.1', undefined]);
  const ecmp = main.find((r) => r.dst === '10.2.0.0');
  assert.equal(ecmp?.nexthops, [{ gateway: '10.9.0.2', index: v0, weight: 1 }, { gateway: '10.9.0.3', index: v0, weight: 2 }]);
  const ipEcmp = ipj(ns, 'route', 'show', '10.2.0.0/24')[0];
  assert.equal(ipEcmp.nexthops.map((n: any) => [n.gateway, n.dev, n.weight]), [['10.9.0.2', 'v0', 1], ['10.9.0.3', 'v0', 2]]);

  const ecmp6 = h.listRoutes({ family: 6 }).find((r) => r.dst === 'fd01::');
  assert.equal(ecmp6?.nexthops?.map((n) => n.gateway), ['fd00:9::2', 'fd00:9::3']);
  const ipEcmp6 = ipj(ns, '-6', 'route', 'show', 'fd01::/64')[0];
  assert.equal(ipEcmp6.nexthops.map((n: any) => canonicalIp(n.gateway)), ['fd00:9::2', 'fd00:9::3']);
  const big = h.listRoutes({ family: 6, table: 70000 });
  assert.equal(big.map((r) => [r.dst, r.dstLen, r.gateway, r.mtu]), [['fd02::', 64, 'fd00:9::2', 1280]]);

  h.replaceRoute({ dst: '10.1.0.0/24', gateway: '10.9.0.3', table: 100 });
  assert.equal(h.listRoutes({ family: 4, table: 100 }).map((r) => [r.gateway, r.mtu]), [['10.9.0.3', undefined]]);
  h.deleteRoute({ dst: '10.1.0.0/24', table: 100 });
  h.deleteRoute({ dst: '10.2.0.0/24' });
  assert.is(h.listRoutes({ family: 4, table: 100 }).length, 0);
  assert.is(ipj(ns, 'route', 'show', '10.2.0.0/24').length, 0);
});

test('adding the same route twice fails with EEXIST naming the operation', () => {
  const ns = netns();
  const h = open(ns);
  const v0 = vethIn(ns, h);
  h.addAddress({ address: '10.9.0.1/24', index: v0 });
  h.addRoute({ dst: '10.1.0.0/24', gateway: '10.9.0.2', table: 100 });
  try {
    h.addRoute({ dst: '10.1.0.0/24', gateway: '10.9.0.2', table: 100 });
    assert.unreachable('second add must fail');
  } catch (e) {
    assert.instance(e, NetlinkError);
    const ne = e as NetlinkError;
    assert.is(ne.errnoName, 'EEXIST');
    assert.is(ne.errno, 17);
    assert.is(ne.code, 'NETLINK');
    assert.is(ne.message, 'RTM_NEWROUTE 10.1.0.0/24 via 10.9.0.2 table 100: EEXIST (File exists)');
  }
  try {
    h.addRoute({ dst: '10.3.0.0/24', gateway: '10.99.0.1' });
    assert.unreachable('unreachable gateway must fail');
  } catch (e) {
    assert.is((e as NetlinkError).errnoName, 'ENETUNREACH');
    assert.match((e as Error).message, /Nexthop has invalid gateway/, 'extended ack text is included');
  }
});

test('rules: add with priority, from/to, fwmark, iif, table; list; delete', () => {
  const ns = netns();
  const h = open(ns);
  h.addRule({ priority: 100, table: 100, from: '10.9.0.0/24', to: '10.8.0.0/16', fwmark: 0x5, fwmask: 0xff, iifName: 'lo' });
  h.addRule({ priority: 200, table: 1000, from: 'fd00::/64' });
  const r = h.listRules({ family: 4 }).find((x) => x.priority === 100);
  assert.equal([r?.table, r?.src, r?.srcLen, r?.dst, r?.dstLen, r?.fwmark, r?.fwmask, r?.iifName], [100, '10.9.0.0', 24, '10.8.0.0', 16, 5, 0xff, 'lo']);
  const r6 = h.listRules({ family: 6 }).find((x) => x.priority === 200);
  assert.equal([r6?.table, r6?.src, r6?.srcLen], [1000, 'fd00::', 64]);
  const ip = ipj(ns, 'rule', 'show').find((x: any) => x.priority === 100);
  assert.equal([ip?.src, ip?.srclen, ip?.dst, ip?.table, ip?.iif], ['10.9.0.0', 24, '10.8.0.0', '100', 'lo']);
  h.deleteRule({ priority: 100, table: 100, from: '10.9.0.0/24', to: '10.8.0.0/16', fwmark: 0x5, fwmask: 0xff, iifName: 'lo' });
  assert.not.ok(h.listRules().some((x) => x.priority === 100));
  assert.ok(h.listRules().some((x) => x.priority === 200));
});

test('neighbours: add, replace, list, delete (v4 and v6)', () => {
  const ns = netns();
  const h = open(ns);
  const v0 = vethIn(ns, h);
  h.addNeighbour({ address: '10.9.0.7', index: v0, lladdr: '02:00:00:00:00:07' });
  h.addNeighbour({ address: 'fd00:9::7', index: v0, lladdr: '02:00:00:00:00:08' });
  let n = h.listNeighbours({ index: v0 });
  assert.equal(n.find((x) => x.address === '10.9.0.7')?.lladdr, '02:00:00:00:00:07');
  assert.is(n.find((x) => x.address === '10.9.0.7')?.state, 0x80);
  assert.is(n.find((x) => x.address === 'fd00:9::7')?.family, 6);
  assert.throws(() => h.addNeighbour({ address: '10.9.0.7', index: v0, lladdr: '02:00:00:00:00:09' }), /EEXIST/);
  h.replaceNeighbour({ address: '10.9.0.7', index: v0, lladdr: '02:00:00:00:00:09' });
  const ip = ipj(ns, 'neigh', 'show', 'dev', 'v0').find((x: any) => x.dst === '10.9.0.7');
  assert.is(ip?.lladdr, '02:00:00:00:00:09');
  h.deleteNeighbour({ address: '10.9.0.7', index: v0 });
  n = h.listNeighbours({ index: v0 });
  assert.not.ok(n.some((x) => x.address === '10.9.0.7'));
});

test('dump of a namespace with 2000 addresses and 2000 routes is complete', () => {
  const ns = netns();
  const h = open(ns);
  const v0 = vethIn(ns, h);
  for (let i = 0; i < 2000; i++) h.addAddress({ address: `10.${100 + (i >> 8)}.${i & 255}.1/32`, index: v0 });
  h.addAddress({ address: '10.9.0.1/24', index: v0 });
  for (let i = 0; i < 2000; i++) h.addRoute({ dst: `172.${16 + (i >> 8)}.${i & 255}.0/24`, gateway: '10.9.0.2', table: 200 });
  const addrs = h.listAddresses({ family: 4, index: v0 });
  assert.is(addrs.length, 2001);
  assert.is(new Set(addrs.map((a) => a.address)).size, 2001);
  const routes = h.listRoutes({ family: 4, table: 200 });
  assert.is(routes.length, 2000);
  assert.is(ipj(ns, 'route', 'show', 'table', '200').length, 2000);
});

test('close is idempotent and a closed handle refuses work; a missing netns is NETNS_GONE', () => {
  const h = NetlinkHandle.open(`/run/netns/${netns()}`);
  h.close();
  h.close();
  assert.throws(() => h.listLinks(), /closed/);
  try {
    NetlinkHandle.open('/run/netns/tnl-does-not-exist');
    assert.unreachable();
  } catch (e) {
    assert.is((e as { code?: string }).code, 'NETNS_GONE');
  }
});

test.run();
