// The cluster store through Redis Sentinel, with real redis-server and redis-sentinel processes: the URL
// form, and block claims that go on across a SIGKILL of the primary (the sentinels promote the replica,
// the store follows it), with nothing claimed before the crash lost and no block given twice.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { parseRedisUrl, RedisStore } from '../../ipam/store/redis-store';
import { startSentinelSet, type SentinelSet } from '../lib/sentinel';

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

let set: SentinelSet;
test.before(async () => {
  set = await startSentinelSet();
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
