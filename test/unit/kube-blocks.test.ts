// Address-block claims as AddressBlock resources (against the FAKE API server): a create is a claim, a
// conflict means another node won, a release deletes only our own claim; two nodes' allocators racing
// for a small pool never get the same block, and the claims are the durable record a restart reads.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { Writable } from 'node:stream';
import * as k8s from '@kubernetes/client-node';
import { FakeApiServer, kubeconfigFor } from '../lib/fake-apiserver';
import { KubeBlockClaims, claimName } from '../../daemon/kube/block-claims';
import { AllocationStore } from '../../ipam/allocation-store';
import { PodAllocator } from '../../ipam/pod-allocator';
import { validatePools } from '../../ipam/pool';
import { makeLogger } from '../../lib/log';

const quiet = makeLogger({ level: 'error', stream: new Writable({ write: (_c, _e, cb) => cb() }) });

async function setup() {
  const api = new FakeApiServer('fake-token');
  const url = (await api.listen({ port: 0 }))!;
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tether-blocks-'));
  fs.writeFileSync(path.join(dir, 'kubeconfig'), kubeconfigFor(url));
  const kc = new k8s.KubeConfig();
  kc.loadFromFile(path.join(dir, 'kubeconfig'));
  return { api, kc, dir, done: async () => (await api.close(), fs.rmSync(dir, { recursive: true, force: true })) };
}

test('claim, idempotent claim, conflict, list, release only by the owner', async () => {
  const { api, kc, done } = await setup();
  try {
    const s = new KubeBlockClaims(kc, undefined);
    assert.is(claimName('default', 'fd00:10:244::40/122'), 'default-fd00-10-244--40-122');
    assert.ok(await s.claimBlock('default', '10.244.0.64/26', 'n1'));
    assert.ok(await s.claimBlock('default', '10.244.0.64/26', 'n1'), 'claiming again is idempotent');
    assert.not.ok(await s.claimBlock('default', '10.244.0.64/26', 'n2'), 'n2 lost: n1 holds it');
    assert.ok(await s.claimBlock('other', '10.245.0.0/26', 'n2'));
    assert.equal([...(await s.listBlocks('default'))], [['10.244.0.64/26', 'n1']]);
    const obj = api.get('AddressBlock', 'default-10-244-0-64-26');
    assert.equal(obj?.spec, { pool: 'default', cidr: '10.244.0.64/26', node: 'n1' });
    assert.equal(obj?.metadata.labels, { 'tether.dev/pool': 'default', 'tether.dev/node': 'n1' });
    assert.not.ok(await s.releaseBlock('default', '10.244.0.64/26', 'n2'), 'n2 cannot release n1\'s claim');
    assert.ok(await s.releaseBlock('default', '10.244.0.64/26', 'n1'));
    assert.ok(await s.claimBlock('default', '10.244.0.64/26', 'n2'), 'free again');
    await assert.throws(() => s.allocateAddresses('float', 'x', { count: 1, candidates: [] }) as unknown as void);
  } finally {
    await done();
  }
});

test('two nodes racing for a pool of 4 blocks: every block claimed once; a restart reads its claims back', async () => {
  const { api, kc, dir, done } = await setup();
  try {
    const pools = validatePools([{ apiVersion: 'tether.dev/v1alpha1', kind: 'AddressPool', metadata: { name: 'small' }, spec: { usage: 'pod', ipv4: { cidr: '10.9.0.0/28', blockSize: 30 } } }]);
    const mk = (node: string) => new PodAllocator({ name: node, labels: {} }, pools, new KubeBlockClaims(kc, undefined), new AllocationStore(path.join(dir, node)), quiet);
    const a = mk('n1');
    const b = mk('n2');
    await Promise.all([a.start(), b.start()]);
    const owner = (node: string, i: number) => ({ containerId: `${node}-${i}`, ifName: 'eth0', network: 'net' });
    const got = await Promise.allSettled(Array.from({ length: 8 }, (_, i) => (i % 2 ? a : b).allocate('small', owner(i % 2 ? 'n1' : 'n2', i))));
    const addrs = got.filter((g) => g.status === 'fulfilled').map((g) => (g as PromiseFulfilledResult<{ ips: Array<{ address: string }> }>).value);
    const claims = api.list('AddressBlock');
    assert.is(claims.length, 4, 'every /30 of the /28 claimed once');
    assert.is(new Set(claims.map((c) => c.spec.cidr)).size, 4);
    assert.ok(addrs.length >= 6, `${addrs.length} allocations succeeded`);
    // A restarted allocator finds its blocks in the claims.
    const again = mk('n1');
    const r = await again.start();
    assert.is(r.conflicts.length, 0);
    assert.ok(r.blocks >= 1, `n1 recovered ${r.blocks} block(s)`);
  } finally {
    await done();
  }
});

test.run();
