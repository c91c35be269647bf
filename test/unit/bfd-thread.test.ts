// BfdThread (tetherd's BFD endpoint on a worker thread) over loopback: two threads bring a session Up and
// report it to the main thread; a close tells the peer (AdminDown, it goes Down); an address that is not
// local fails open() with a clear error and leaves no thread behind.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { randomBytes, randomInt } from 'node:crypto';
import { BfdThread } from '../../daemon/bfd/threaded';
import { BfdState } from '../../daemon/bfd';

const auth = { keyId: 1, key: randomBytes(20) };
const timers = { desiredMinTxUs: 50_000, requiredMinRxUs: 50_000, detectMult: 3 };

function when(emitter: { once(ev: string, fn: (...a: unknown[]) => void): unknown }, ev: string, ms: number): Promise<unknown> {
  return new Promise((resolve, reject) => {
    const t = setTimeout(() => reject(new Error(`no '${ev}' within ${ms} ms`)), ms);
    emitter.once(ev, (x) => (clearTimeout(t), resolve(x)));
  });
}

test('two threads bring a session Up, the main thread sees it, and a close brings the peer Down', async () => {
  const port = randomInt(20000, 30000);
  const a = await BfdThread.open({ address: '127.0.0.1', port });
  const b = await BfdThread.open({ address: '127.0.0.2', port });
  try {
    const sa = a.session('127.0.0.2', { ...timers, auth });
    const sb = b.session('127.0.0.1', { ...timers, auth });
    assert.is(sa.state, BfdState.Down);
    await Promise.all([when(sa, 'up', 5000), when(sb, 'up', 5000)]);
    assert.is(sa.state, BfdState.Up);
    const down = when(sb, 'down', 2000);
    sa.close();
    await when(sa, 'close', 2000);
    await down;
    assert.is.not(sb.state, BfdState.Up);
    await new Promise((r) => setTimeout(r, 600));
    assert.ok(b.stats().sessions.some((s) => s.ups === 1 && s.downs === 1), JSON.stringify(b.stats()));
  } finally {
    await a.close();
    await b.close();
  }
});

test('an address that is not local: open() fails naming it', async () => {
  try {
    await BfdThread.open({ address: '192.0.2.77', port: 3784 });
    assert.unreachable('opened');
  } catch (e) {
    assert.match((e as Error).message, /192\.0\.2\.77/);
  }
});

test.run();
