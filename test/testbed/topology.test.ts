// The addressing plan and topology validation, without touching the kernel.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { familyOf, inCidr, nodeAddressOf, resolveTopology } from './topology';

test('plan assigns fabric, pod CIDR and external addresses by position', () => {
  const p = resolveTopology({ nodes: [{ name: 'n1', pods: 2 }, { name: 'n2', zone: 'b', pods: ['web', { name: 'db', namespace: 'prod' }] }] }, 'tb0abc');
  assert.is(p.router.ns, 'tb0abc-router');
  assert.equal(
    p.nodes.map((n) => [n.ns, n.fabricIp, n.podCidr, n.podGateway, n.zone]),
    [
      ['tb0abc-n1', '198.18.0.11', '10.244.1.0/24', '10.244.1.1', undefined],
      ['tb0abc-n2', '198.18.0.12', '10.244.2.0/24', '10.244.2.1', 'b'],
    ],
  );
  assert.equal(p.nodes[0].pods.map((x) => x.ns), ['tb0abc-n1-p1', 'tb0abc-n1-p2']);
  assert.equal(p.nodes[1].pods.map((x) => [x.key, x.namespace]), [['n2-web', 'default'], ['n2-db', 'prod']]);
  assert.equal(p.externals.map((x) => [x.name, x.ip, x.routerIp]), [['client', '198.19.1.2', '198.19.1.1'], ['server', '198.19.2.2', '198.19.2.1']]);
});

test('bad topologies are refused naming the field', () => {
  assert.throws(() => resolveTopology({ nodes: [] }, 'tb0000'), /topology.nodes/);
  assert.throws(() => resolveTopology({ nodes: [{ name: 'N_1' }] }, 'tb0000'), /nodes\[0\]\.name/);
  assert.throws(() => resolveTopology({ nodes: [{ name: 'n1' }, { name: 'n1' }] }, 'tb0000'), /duplicate name "n1"/);
  assert.throws(() => resolveTopology({ nodes: [{ name: 'router' }] }, 'tb0000'), /duplicate name "router"/);
  assert.throws(() => resolveTopology({ nodes: [{ name: 'n1', pods: ['a', 'a'] }] }, 'tb0000'), /duplicate pod "a"/);
  assert.throws(() => resolveTopology({ nodes: [{ name: 'averyverylongname' }] }, 'tb0000'), /must match/);
});

test('the tether-ipam pod pool: defaults, overrides, and bad values named', () => {
  assert.equal(resolveTopology({ nodes: [{ name: 'n1' }] }, 'tb0abc').podPool, { name: 'default', cidr: '10.244.0.0/16', blockSize: 26 });
  assert.equal(resolveTopology({ nodes: [{ name: 'n1' }], podPool: { cidr: '10.244.0.0/27', blockSize: 29 } }, 'tb0abc').podPool, { name: 'default', cidr: '10.244.0.0/27', blockSize: 29 });
  assert.throws(() => resolveTopology({ nodes: [{ name: 'n1' }], podPool: { cidr: 'nope' } }, 'tb0000'), /podPool\.cidr/);
  assert.throws(() => resolveTopology({ nodes: [{ name: 'n1' }], podPool: { blockSize: 8 } }, 'tb0000'), /podPool\.blockSize: 8/);
  assert.throws(() => resolveTopology({ nodes: [{ name: 'n1' }], ipam: 'dhcp' as never }, 'tb0000'), /topology\.ipam/);
});

test('dual-stack: the fabric, the externals and the pod pool get IPv6 as documented; IPv4 stays as it was', () => {
  const topo = { nodes: [{ name: 'n1' }, { name: 'n2' }] };
  const v4 = resolveTopology(topo, 'tb0abc');
  const p = resolveTopology({ ...topo, families: [4, 6] }, 'tb0abc');
  assert.equal(v4.families, [4]);
  assert.equal(p.families, [4, 6]);
  assert.is(v4.fabricCidr6, undefined);
  assert.is(v4.nodes[0].fabricIp6, undefined);
  assert.is(v4.externals[0].ip6, undefined);
  assert.is(v4.podPool.ipv6, undefined);
  assert.equal(p.router, { ns: 'tb0abc-router', fabricIp: '198.18.0.1', fabricIp6: 'fd00:18::1' });
  assert.is(p.fabricCidr, '198.18.0.0/24');
  assert.is(p.fabricCidr6, 'fd00:18::/64');
  assert.equal(
    p.nodes.map((n) => [n.fabricIp, n.fabricIp6, n.podCidr, n.podCidr6, n.podGateway6]),
    [
      ['198.18.0.11', 'fd00:18::11', '10.244.1.0/24', 'fd00:10:244:1::/64', 'fd00:10:244:1::1'],
      ['198.18.0.12', 'fd00:18::12', '10.244.2.0/24', 'fd00:10:244:2::/64', 'fd00:10:244:2::1'],
    ],
  );
  assert.equal(
    p.externals.map((x) => [x.ip, x.ip6, x.routerIp6, x.subnet6]),
    [['198.19.1.2', 'fd00:19:1::2', 'fd00:19:1::1', 'fd00:19:1::/64'], ['198.19.2.2', 'fd00:19:2::2', 'fd00:19:2::1', 'fd00:19:2::/64']],
  );
  assert.equal(p.podPool, { name: 'default', cidr: '10.244.0.0/16', blockSize: 26, ipv6: { cidr: 'fd00:10:244::/56', blockSize: 122 } });
  for (const n of p.nodes) {
    assert.ok(inCidr(n.fabricIp6!, p.fabricCidr6!), `${n.fabricIp6} on the fabric`);
    assert.ok(inCidr(n.podGateway6!, n.podCidr6!));
    assert.ok(inCidr(n.podCidr6!.split('/')[0], p.podPool.ipv6!.cidr), 'host-local CIDRs lie in the pool space too');
  }
  // IPv6-only pods: the same plan (the fabric keeps IPv4 for the nodes' own traffic).
  const six = resolveTopology({ ...topo, families: [6] }, 'tb0abc');
  assert.equal(six.families, [6]);
  assert.equal([six.nodes[1].fabricIp, six.nodes[1].fabricIp6], ['198.18.0.12', 'fd00:18::12']);
  assert.equal(six.podPool.ipv6, { cidr: 'fd00:10:244::/56', blockSize: 122 });
  // 200 nodes: the last node's address is still a valid one in the fabric prefix.
  const big = resolveTopology({ nodes: Array.from({ length: 200 }, (_, i) => ({ name: `n${i + 1}` })), families: [4, 6] }, 'tb0abc');
  assert.is(big.nodes[199].fabricIp6, 'fd00:18::210');
  assert.ok(inCidr(big.nodes[199].fabricIp6!, big.fabricCidr6!));
});

test('families and the IPv6 pod pool: overrides, and bad values named', () => {
  const p = resolveTopology({ nodes: [{ name: 'n1' }], families: [6, 4], podPool: { ipv6: { cidr: 'fd00:44::/64', blockSize: 120 } } }, 'tb0abc');
  assert.equal(p.families, [6, 4]);
  assert.equal(p.podPool.ipv6, { cidr: 'fd00:44::/64', blockSize: 120 });
  const bad = (families: unknown) => () => resolveTopology({ nodes: [{ name: 'n1' }], families: families as never }, 'tb0000');
  assert.throws(bad([]), /topology\.families/);
  assert.throws(bad([4, 4]), /topology\.families/);
  assert.throws(bad([5]), /topology\.families/);
  assert.throws(bad('4'), /topology\.families/);
  assert.throws(() => resolveTopology({ nodes: [{ name: 'n1' }], podPool: { ipv6: {} } }, 'tb0000'), /podPool\.ipv6: pods have no IPv6/);
  assert.throws(() => resolveTopology({ nodes: [{ name: 'n1' }], families: [4, 6], podPool: { ipv6: { cidr: '10.0.0.0/8' } } }, 'tb0000'), /podPool\.ipv6\.cidr: "10\.0\.0\.0\/8" is not an IPv6 network/);
  assert.throws(() => resolveTopology({ nodes: [{ name: 'n1' }], families: [4, 6], podPool: { ipv6: { cidr: 'fd00::1/64' } } }, 'tb0000'), /podPool\.ipv6\.cidr/);
  assert.throws(() => resolveTopology({ nodes: [{ name: 'n1' }], families: [4, 6], podPool: { ipv6: { blockSize: 127 } } }, 'tb0000'), /podPool\.ipv6\.blockSize: 127 must be an integer from 56 to 126/);
  assert.throws(() => resolveTopology({ nodes: [{ name: 'n1' }], podPool: { cidr: 'fd00::/64' } }, 'tb0000'), /podPool\.cidr: "fd00::\/64" is not an IPv4 network/);
});

test('underlay: 4 by default, 6 on the fabric IPv6 addresses, and only where the fabric carries IPv6', () => {
  const nodes = [{ name: 'n1' }, { name: 'n2' }];
  const four = resolveTopology({ nodes, families: [6] }, 'tb0abc');
  assert.is(four.underlay, 4);
  assert.is(nodeAddressOf(four, four.nodes[1]), '198.18.0.12');
  const six = resolveTopology({ nodes, families: [6], underlay: 6 }, 'tb0abc');
  assert.is(six.underlay, 6);
  assert.equal(six.nodes.map((n) => nodeAddressOf(six, n)), ['fd00:18::11', 'fd00:18::12']);
  assert.throws(() => resolveTopology({ nodes, underlay: 6 }, 'tb0000'), /topology\.underlay: 6 needs IPv6 on the fabric/);
  assert.throws(() => resolveTopology({ nodes, families: [6], underlay: 5 as never }, 'tb0000'), /topology\.underlay: 5 must be 4 or 6/);
});

test('inCidr', () => {
  assert.ok(inCidr('10.244.1.7', '10.244.1.0/24'));
  assert.not.ok(inCidr('10.244.2.7', '10.244.1.0/24'));
  assert.ok(inCidr('1.2.3.4', '0.0.0.0/0'));
  assert.not.ok(inCidr('198.18.1.1', '198.18.0.0/24'));
  assert.ok(inCidr('fd00:10:244:39::3641', 'fd00:10:244::/56'));
  assert.not.ok(inCidr('fd00:10:245::1', 'fd00:10:244::/56'));
  assert.not.ok(inCidr('10.244.0.1', '::/0'), 'never across families');
  assert.not.ok(inCidr('::ffff:10.244.0.1', '10.244.0.0/16'));
  assert.is(familyOf('fd00:18::11'), 6);
  assert.is(familyOf('198.18.0.0/24'), 4);
});

test.run();
