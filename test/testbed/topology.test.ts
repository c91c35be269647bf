// The addressing plan and topology validation, without touching the kernel.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { inCidr, resolveTopology } from './topology';

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

test('inCidr', () => {
  assert.ok(inCidr('10.244.1.7', '10.244.1.0/24'));
  assert.not.ok(inCidr('10.244.2.7', '10.244.1.0/24'));
  assert.ok(inCidr('1.2.3.4', '0.0.0.0/0'));
  assert.not.ok(inCidr('198.18.1.1', '198.18.0.0/24'));
});

test.run();
