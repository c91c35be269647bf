// Two nodes racing for the last free block of a pool (real Redis, real tetherds on the testbed): exactly
// one wins it; the other answers exhaustion (CNI code 106, naming the pool) and keeps nothing of the
// failed attachment. Round 1 goes through the tether-ipam executable as a runtime would; later rounds
// go through the socket API, where both requests reach Redis within a millisecond or so of each other.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { TetherError } from '../../lib/errors';
import { boundedAll, ipamApi, newContainerId, tetherIpam } from '../testbed/ipam-runtime';
import { withTestbed, type Testbed } from '../testbed/testbed';
import { inCidr } from '../testbed/topology';

// 10.244.0.0/27 in /29 blocks: 4 blocks of 7 addresses (the first of each is the gateway).
const POOL = { cidr: '10.244.0.0/27', blockSize: 29 };
const PER_BLOCK = 7;
const EACH = 3; // ADDs each node fires at the last block

const blocksOf = async (tb: Testbed, node: string) => [...(await tb.clusterBlocks())].filter(([, n]) => n === node).map(([b]) => b);

async function fill(tb: Testbed, node: string, count: number): Promise<void> {
  await boundedAll(Array.from({ length: count }, () => newContainerId()), 4, (id) => ipamApi(tb, node, 'ipam.add', { containerId: id }));
}

interface Shot {
  node: string;
  id: string;
  ok: boolean;
  ip?: string;
  code?: number | string;
  msg?: string;
}

/** Both nodes fire EACH ADDs at once; through the executable or straight at the socket. */
async function race(tb: Testbed, via: 'cni' | 'api'): Promise<Shot[]> {
  const shots = ['n1', 'n2'].flatMap((node) => Array.from({ length: EACH }, () => ({ node, id: newContainerId() })));
  return Promise.all(
    shots.map(async ({ node, id }): Promise<Shot> => {
      if (via === 'cni') {
        const r = await tetherIpam(tb, node, 'ADD', { containerId: id });
        return { node, id, ok: r.ok, ip: r.result?.ips?.[0]?.address.split('/')[0], code: r.error?.code, msg: r.error?.msg };
      }
      try {
        const r = await ipamApi<{ ips: Array<{ address: string }> }>(tb, node, 'ipam.add', { containerId: id });
        return { node, id, ok: true, ip: r.ips[0].address.split('/')[0] };
      } catch (e) {
        return { node, id, ok: false, code: (e as TetherError).code, msg: (e as Error).message };
      }
    }),
  );
}

test('two nodes racing for the last block: one wins, the other reports exhaustion and holds nothing', async () => {
  await withTestbed({ nodes: [{ name: 'n1' }, { name: 'n2' }], externals: [], tether: true, ipam: 'tether-ipam', podPool: POOL }, async (tb) => {
    // n1 fills two blocks, n2 one: one free block is left and both nodes are full.
    await fill(tb, 'n1', 2 * PER_BLOCK);
    await fill(tb, 'n2', PER_BLOCK);
    const before = { n1: await blocksOf(tb, 'n1'), n2: await blocksOf(tb, 'n2') };
    assert.is(before.n1.length + before.n2.length, 3, 'three of four blocks claimed');
    const held = { n1: 2 * PER_BLOCK, n2: PER_BLOCK };
    for (const n of ['n1', 'n2'] as const) assert.is((await tb.nodeBlocks(n)).free, 0, `${n} is full`);

    const wins: string[] = [];
    for (const [round, via] of (['cni', 'api', 'api', 'api', 'api', 'api'] as const).entries()) {
      const shots = await race(tb, via);
      const after = { n1: await blocksOf(tb, 'n1'), n2: await blocksOf(tb, 'n2') };
      const gained = (['n1', 'n2'] as const).filter((n) => after[n].length > before[n].length);
      assert.is(gained.length, 1, `round ${round} (${via}): exactly one node claimed the last block (n1 ${after.n1.length}, n2 ${after.n2.length})`);
      const winner = gained[0];
      const loser = winner === 'n1' ? 'n2' : 'n1';
      wins.push(winner);
      assert.equal(after[loser], before[loser], `round ${round}: the loser's blocks are unchanged`);
      const [block] = after[winner].filter((b) => !before[winner].includes(b));

      for (const s of shots.filter((x) => x.node === winner)) {
        assert.ok(s.ok, `round ${round}: ${winner}'s ADD failed: [${s.code}] ${s.msg}`);
        assert.ok(inCidr(s.ip!, block), `${s.ip} lies in the won block ${block}`);
      }
      assert.is(new Set(shots.filter((x) => x.ok).map((x) => x.ip)).size, EACH, 'distinct addresses');
      for (const s of shots.filter((x) => x.node === loser)) {
        assert.not.ok(s.ok, `round ${round}: ${loser} got ${s.ip} from a pool with no block left`);
        assert.is(s.code, via === 'cni' ? 106 : 'POOL_EXHAUSTED', `round ${round}: exhaustion, not: [${s.code}] ${s.msg}`);
        assert.match(s.msg ?? '', /pool "default"/, 'the message names the pool');
        // Nothing half-allocated: the failed attachment holds no address, the node's count is unchanged.
        const check = await tetherIpam(tb, loser, 'CHECK', { containerId: s.id, extra: { prevResult: { cniVersion: '1.0.0', ips: [] } } });
        assert.is(check.error?.code, 3, `the failed attachment is unknown to ${loser}: ${check.error?.msg}`);
      }
      assert.is((await tb.nodeBlocks(loser)).allocated, held[loser], `${loser} holds what it held before`);
      assert.is((await tb.nodeBlocks(winner)).allocated, held[winner] + EACH);

      // The runtime DELs everything it fired; the won block goes back and the next round starts alike.
      await Promise.all(shots.map((s) => tetherIpam(tb, s.node, 'DEL', { containerId: s.id }).then((r) => assert.ok(r.ok, `DEL: ${r.error?.msg}`))));
      assert.equal({ n1: await blocksOf(tb, 'n1'), n2: await blocksOf(tb, 'n2') }, before, 'back to one free block');
    }
    console.log(`  winners by round: ${wins.join(' ')}`);
  });
});

test.run();
