// The cluster store through Redis Sentinel, with real redis-server and redis-sentinel processes: the URL
// form, block claims that go on across a SIGKILL of the primary (the sentinels promote the replica, the
// store follows it), with nothing claimed before the crash lost and no block given twice, and a claim the
// replica has not confirmed never acknowledged, so a failover cannot take a block from under its pods.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { Writable } from 'node:stream';
import Redis from 'ioredis';
import { AllocationStore } from '../../ipam/allocation-store';
import { PodAllocator } from '../../ipam/pod-allocator';
import { validatePools } from '../../ipam/pool';
import { parseRedisUrl, RedisStore } from '../../ipam/store/redis-store';
import { makeLogger, setLogger } from '../../lib/log';
import { ErrorCode, TetherError } from '../../lib/errors';
import { MASTER_NAME, startSentinelSet, type SentinelSet } from '../lib/sentinel';
import { waitFor } from '../lib/wait';
import { OwnershipStore, type Ownership } from '../../daemon/egress/ownership-store';
import { connectLbStore } from '../../daemon/lb/lb-store';

const quiet = makeLogger({ level: 'error', stream: new Writable({ write: (_c, _e, cb) => cb() }) });
setLogger(quiet);

test('redis+sentinel:// URLs: sentinels, master name, db and passwords; malformed ones named', () => {
  assert.equal(parseRedisUrl('redis+sentinel://:s3cret@10.0.0.1,10.0.0.2:26380,[fd00::3]:26381/tether/2?sentinelPassword=sp'), {
    options: {
      sentinels: [{ host: '10.0.0.1', port: 26379 }, { host: '10.0.0.2', port: 26380 }, { host: 'fd00::3', port: 26381 }],
      name: 'tether',
      username: undefined,
      password: 's3cret',
      sentinelPassword: 'sp',
      db: 2,
      failoverDetector: true,
    },
    where: 'redis master tether/2 via sentinels 10.0.0.1:26379,10.0.0.2:26380,[fd00::3]:26381',
  });
  assert.not.match(parseRedisUrl('redis+sentinel://:s3cret@h/m').where, /s3cret/);
  for (const [url, why] of [
    ['redis+sentinel:///tether', /no sentinel address/],
    ['redis+sentinel://h1,h2', /no master name/],
    ['redis+sentinel://h1:99999/m', /port 99999/],
    ['redis+sentinel://h1:ab/m', /"h1:ab" is not host\[:port\]/],
    ['redis+sentinel://h1/m/x', /db must be a number/],
    ['redis+sentinel://h1/m/1/2', /too many path parts/],
  ] as const) {
    assert.throws(() => parseRedisUrl(url), (e: Error) => why.test(e.message) && /redis\+sentinel:\/\//.test(e.message), url);
  }
});

/**
 * A Sentinel set; started again when a port it picked at random is taken (test/lib/sentinel.ts picks from a
 * range that overlaps the kernel's ephemeral ports, so an outgoing connection can hold one).
 */
async function startSet(): Promise<SentinelSet> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await startSentinelSet();
    } catch (e) {
      if (attempt >= 3 || !/Address already in use/.test((e as Error).message)) throw e;
    }
  }
}

/** Retries a call refused while the store follows a failover ("unreachable", never a wrong answer), up to 30 s. */
async function whenConnected<T>(fn: () => Promise<T>, t0 = Date.now()): Promise<T> {
  for (;;) {
    try {
      return await fn();
    } catch (e) {
      assert.match((e as Error).message, /unreachable|timed out|try again|Connection|closed|READONLY|LOADING|master|writeable|not acknowledged|max retries/i);
      if (Date.now() - t0 > 30_000) throw e;
      await new Promise((r) => setTimeout(r, 100));
    }
  }
}

test('a block claim is acknowledged only once the replica has it: the allocator never uses an unconfirmed block, and after a failover every block it reported is on the new primary', async () => {
  const own = await startSet();
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tether-ipam-'));
  const store = await RedisStore.connect(own.url, { keyPrefix: 'ack:', commandTimeoutMs: 1000 });
  try {
    // /30 blocks: three pod addresses each, so every fourth pod needs a new block.
    const pools = validatePools([{ apiVersion: 'tether.dev/v1alpha1', kind: 'AddressPool', metadata: { name: 'pods' }, spec: { usage: 'pod', ipv4: { cidr: '10.251.0.0/24', blockSize: 30 } } }]);
    let alloc = new PodAllocator({ name: 'node-a', labels: {} }, pools, store, new AllocationStore(dir), quiet);
    await alloc.start();
    const owner = (i: number) => ({ network: 'net', containerId: `c${i}`, ifName: 'eth0' });
    const family = () => (alloc.usage()[0].families as Array<{ blocks: string[]; unconfirmed?: string[] }>)[0];
    const reported = () => [...family().blocks].sort();
    const inStore = async () => [...(await whenConnected(() => store.listBlocks('pods')))].filter(([, n]) => n === 'node-a').map(([b]) => b).sort();
    const given = new Map<string, number>(); // address → pod, of the pods that hold one
    let pods = 0;
    const add = async () => {
      const ip = (await alloc.allocate('pods', owner(pods))).ips[0];
      assert.not.ok(given.has(ip.address), `${ip.address} given twice`);
      given.set(ip.address, pods++);
      return ip;
    };
    const remove = async (i: number) => {
      for (const a of await alloc.release(`net/c${i}/eth0`)) given.delete(a);
    };
    /** The replica's process, SIGSTOPped so replication stalls (the primary keeps it connected). */
    const replicaPid = () => {
      const port = /slave0:ip=[^,]+,port=(\d+)/.exec(own.cli(own.master().port, 'info', 'replication'))?.[1];
      const pid = Number(/process_id:(\d+)/.exec(own.cli(Number(port), 'info', 'server'))?.[1]);
      assert.ok(pid > 0, 'replica pid');
      return pid;
    };
    const refusedClaim = async (): Promise<string> => {
      try {
        await add();
      } catch (e) {
        assert.instance(e, TetherError);
        assert.is((e as TetherError).code, ErrorCode.TryAgainLater);
        const m = /claim of block (\S+) of pool "pods" not acknowledged: 0 of 1 replica\(s\) confirmed it/.exec((e as Error).message);
        assert.ok(m, (e as Error).message);
        assert.is(alloc.lookup(`net/c${pods}/eth0`), undefined, 'the pod got no address');
        assert.not.ok(reported().includes(m![1]), 'the allocator does not hold the unacknowledged block');
        return m![1];
      }
      assert.unreachable('a block claim was acknowledged while the replica could not have it');
      return '';
    };

    // The replica's first sync is still under way right after set-up (diskless, 5 s delay); until it is
    // online a claim is not acknowledged either.
    await own.waitReplicated();
    for (let i = 0; i < 3; i++) await add();
    assert.is(reported().length, 1);

    // 1. Replication stalled: the claim is refused; once the replica is back, the next attempt claims the
    //    same block again (idempotently) and uses it.
    let pid = replicaPid();
    process.kill(pid, 'SIGSTOP');
    let unacked: string;
    try {
      unacked = await refusedClaim();
    } finally {
      process.kill(pid, 'SIGCONT');
    }
    await own.waitReplicated();
    assert.is((await add()).block, unacked, 're-claimed the same block');
    assert.equal(await inStore(), reported(), 'the store holds exactly the blocks the allocator uses');

    // 2. Refused, and nobody asks again: maintenance withdraws the claim, nothing leaks.
    await add();
    await add();
    pid = replicaPid();
    process.kill(pid, 'SIGSTOP');
    try {
      unacked = await refusedClaim();
    } finally {
      process.kill(pid, 'SIGCONT');
    }
    await own.waitReplicated();
    assert.ok((await inStore()).includes(unacked), 'the unacknowledged claim did reach the primary');
    await alloc.maintain();
    assert.equal(await inStore(), reported(), 'maintenance withdrew it');

    // 2b. tetherd restarts and finds a block it holds missing from the store while claims go unacknowledged:
    //     it keeps the block for the pods in it, but gives no new address from it until the store confirms.
    const held = reported()[0];
    await remove(1); // a free address in it
    await store.releaseBlock('pods', held, 'node-a'); // the store lost the claim
    await own.waitReplicated();
    pid = replicaPid();
    process.kill(pid, 'SIGSTOP');
    try {
      alloc = new PodAllocator({ name: 'node-a', labels: {} }, pools, store, new AllocationStore(dir), quiet);
      await alloc.start();
      assert.equal(family().unconfirmed, [held]);
      await refusedClaim(); // not the free address in the unconfirmed block: a new block, refused
    } finally {
      process.kill(pid, 'SIGCONT');
    }
    await own.waitReplicated();
    await alloc.maintain();
    assert.is(family().unconfirmed, undefined, 'confirmed by maintenance');
    assert.is((await add()).block, held, 'and allocated from again');
    assert.equal(await inStore(), reported());

    // 3. Refused, then the primary dies before the replica has the claim, and the replica is promoted.
    //    32 MB of ballast go first, so the claim is still in the primary's replication buffer, not already
    //    in the stopped replica's socket buffer (from where it would still reach the replica).
    pid = replicaPid();
    process.kill(pid, 'SIGSTOP');
    let old: number;
    try {
      const raw = new Redis({ host: own.host, port: own.master().port, lazyConnect: true, maxRetriesPerRequest: 0 });
      try {
        await raw.connect();
        await raw.set('ack:ballast', Buffer.alloc(32 << 20, 120));
      } finally {
        raw.disconnect();
      }
      await refusedClaim();
      old = own.killPrimary();
    } finally {
      process.kill(pid, 'SIGCONT');
    }
    await own.waitFailover(old);
    const after = await inStore();
    for (const b of reported()) assert.ok(after.includes(b), `block ${b}, reported claimed, is on the new primary (has ${after})`);
    // The pod gets its address now (from whichever block the new primary gives), and nothing leaks.
    const t0 = Date.now();
    await whenConnected(() => add(), t0);
    await whenConnected(() => alloc.maintain(), t0);
    assert.equal(await inStore(), reported());
    for (const [a, i] of given) assert.is(alloc.lookup(`net/c${i}/eth0`)?.ips[0].address, a);
  } finally {
    await store.close();
    await own.stop();
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test('store clients outlive ioredis ending them in a failover (a +switch-master while the next connection asks a sentinel): each works again', async () => {
  // ioredis ends a Sentinel client for good when the previous connection's failover detector sees a
  // +switch-master while the next attempt still waits for a sentinel's answer. Reproduced here on purpose:
  // the sentinel the clients ask first is stopped, their connections are killed, another sentinel fails
  // the master over, then the stopped one answers.
  const own = await startSet();
  const ipam = await RedisStore.connect(own.url, { keyPrefix: 'race:' });
  const owners = await OwnershipStore.connect(own.url, { keyPrefix: 'race:' });
  const lb = await connectLbStore(own.url, { keyPrefix: 'race:' });
  try {
    await own.waitReplicated();
    const sentinels = own.url.slice('redis+sentinel://'.length).split('/')[0].split(',').map((h) => Number(h.split(':')[1]));
    const masterSeenBy = (s: number) => Number(own.cli(s, 'sentinel', 'get-master-addr-by-name', MASTER_NAME).split('\n')[1]);
    const notices: Ownership[] = [];
    owners.on('change', (o: Ownership) => notices.push(o));
    const rec = (epoch: number) => ({ egress: 'shop/out', address: '198.51.100.1', owner: 'shop/gw1', epoch, cause: 'test', ownerNode: 'n1', ownerNodeAddress: '10.0.0.1', ownerPodIp: '10.244.0.5', score: 'a' });
    const vipKey = { vip: '192.0.2.10', client: '10.0.0.1', vport: 0, cport: 0, proto: 0 };
    await whenConnected(() => owners.record(rec(1)));
    await whenConnected(() => ipam.claimBlock('pods', '10.252.0.0/26', 'node-a'));
    await waitFor(() => lb.connection.connected, 'lb mapping store connected');

    const old = masterSeenBy(sentinels[1]);
    const first = Number(/process_id:(\d+)/.exec(own.cli(sentinels[0], 'info', 'server'))?.[1]);
    process.kill(first, 'SIGSTOP');
    try {
      own.cli(old, 'client', 'kill', 'type', 'normal');
      own.cli(old, 'client', 'kill', 'type', 'pubsub');
      await new Promise((r) => setTimeout(r, 300));
      // A sentinel that does not yet count the replica as good answers NOGOODSLAVE: ask again.
      const end = Date.now() + 15_000;
      for (let said = ''; said !== 'OK'; ) {
        said = own.cli(sentinels[1], 'sentinel', 'failover', MASTER_NAME);
        if (said !== 'OK' && Date.now() > end) throw new Error(`SENTINEL FAILOVER: ${said}`);
        if (said !== 'OK') await new Promise((r) => setTimeout(r, 200));
      }
      while (masterSeenBy(sentinels[1]) === old) {
        if (Date.now() > end) throw new Error('no failover');
        await new Promise((r) => setTimeout(r, 100));
      }
      await new Promise((r) => setTimeout(r, 500));
    } finally {
      process.kill(first, 'SIGCONT');
    }
    const t0 = Date.now();
    const within = <T>(fn: () => Promise<T>) => whenConnected(fn, t0 - 20_000); // 10 s
    assert.is(await within(() => owners.record(rec(2))), 'recorded');
    assert.ok(await within(() => ipam.claimBlock('pods', '10.252.0.64/26', 'node-a')));
    assert.equal(await within(() => lb.mappings.claim('192.0.2.10', [{ key: vipKey, target: '10.244.0.5' }])), [{ key: vipKey, target: '10.244.0.5' }]);
    // The notice channel is back too: a decision recorded now is heard.
    await within(() => owners.record(rec(3)));
    await waitFor(() => notices.some((n) => n.epoch === 3), 'the epoch-3 notice', { timeoutMs: 5000 });
    process.stdout.write(`  clients back ${Date.now() - t0} ms after the stopped sentinel answered\n`);
  } finally {
    await ipam.close();
    await owners.close();
    await lb.connection.close();
    await own.stop();
  }
});

let set: SentinelSet;
test.before(async () => {
  set = await startSet();
  // Claims wait for the replica, which is online only once its first sync is done.
  await set.waitReplicated();
});
test.after(async () => {
  await set?.stop();
});

test('block claims continue across a crash of the primary; nothing claimed before is lost, nothing given twice', async () => {
  const a = await RedisStore.connect(set.url, { keyPrefix: 'sent:' });
  const b = await RedisStore.connect(set.url, { keyPrefix: 'sent:' });
  try {
    const blocks = Array.from({ length: 40 }, (_, i) => `10.250.${i}.0/26`);
    for (const blk of blocks.slice(0, 20)) assert.ok(await a.claimBlock('pods', blk, 'node-a'));
    // Held by the replica before the crash (Redis replicates asynchronously: what was not yet replicated
    // when a primary dies is lost with it, with or without Tether).
    await set.waitReplicated();
    const old = set.killPrimary();
    const t0 = Date.now();
    // Keep claiming through the failover: each call either succeeds or fails with try-again (never hangs).
    let failures = 0;
    for (const blk of blocks.slice(20)) {
      for (;;) {
        try {
          assert.ok(await a.claimBlock('pods', blk, 'node-a'));
          break;
        } catch (e) {
          assert.match((e as Error).message, /unreachable|timed out|try again|Connection|closed|READONLY|LOADING|master/i);
          failures++;
          if (Date.now() - t0 > 30_000) throw new Error(`claims still failing 30 s after the crash: ${(e as Error).message}`);
          await new Promise((r) => setTimeout(r, 100));
        }
      }
    }
    const promoted = await set.waitFailover(old);
    const resumedMs = Date.now() - t0;
    assert.is.not(promoted.port, old);
    // The other store follows the switch on its own connection, possibly a moment later: its calls are
    // retried while it reconnects (a refusal then is "unreachable", never a wrong answer).
    const whenConnected = async <T>(fn: () => Promise<T>): Promise<T> => {
      for (;;) {
        try {
          return await fn();
        } catch (e) {
          assert.match((e as Error).message, /unreachable|timed out|try again|Connection|closed|READONLY|LOADING|master|writeable/i);
          if (Date.now() - t0 > 30_000) throw e;
          await new Promise((r) => setTimeout(r, 100));
        }
      }
    };
    const held = await whenConnected(() => b.listBlocks('pods'));
    for (const blk of blocks) assert.is(held.get(blk), 'node-a', `${blk} held by node-a after the failover`);
    // A block claimed before the crash is not given to another node after it.
    assert.is(await whenConnected(() => b.claimBlock('pods', blocks[3], 'node-b')), false);
    assert.is(await whenConnected(() => b.claimBlock('pods', '10.250.99.0/26', 'node-b')), true);
    process.stdout.write(`  sentinel failover: primary ${old} → ${promoted.port}; claims resumed ${resumedMs} ms after the crash (${failures} refused meanwhile)\n`);
  } finally {
    await a.close();
    await b.close();
  }
});

test.run();
