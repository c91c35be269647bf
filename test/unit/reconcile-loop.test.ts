// The shared reconcile loop (daemon/util/reconcile-loop.ts): requests during a pass coalesce into exactly
// one more pass, passes never overlap, a failing pass is reported and the loop goes on, the period runs
// passes by itself, and stop() waits for the pass under way and starts nothing after.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { ReconcileLoop } from '../../daemon/util/reconcile-loop';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** A pass that waits until released, counting passes and the most that ran at once. */
function gated() {
  let release: () => void = () => {};
  const st = { passes: 0, active: 0, maxActive: 0 };
  const run = async () => {
    st.passes++;
    st.active++;
    st.maxActive = Math.max(st.maxActive, st.active);
    await new Promise<void>((r) => (release = r));
    st.active--;
  };
  return { st, run, release: () => release() };
}

test('requests during a pass coalesce into exactly one more pass, never overlapping', async () => {
  const g = gated();
  const loop = new ReconcileLoop({ run: g.run, onError: () => assert.unreachable('no error') });
  const first = loop.kick();
  assert.ok(loop.running);
  const more = [loop.kick(), loop.kick(), loop.kick()];
  loop.request();
  assert.is(g.st.passes, 1, 'the requests wait for the pass under way');
  g.release();
  await sleep(5);
  assert.is(g.st.passes, 2, 'one more pass for all the requests made during the first');
  g.release();
  await Promise.all([first, ...more]);
  assert.is(g.st.passes, 2);
  assert.is(g.st.maxActive, 1);
  assert.not.ok(loop.running);
  await loop.stop();
});

test('kick() resolves only after the pass that covers it', async () => {
  const g = gated();
  const loop = new ReconcileLoop({ run: g.run, onError: () => {} });
  void loop.kick();
  let done = false;
  const p = loop.kick().then(() => (done = true));
  g.release();
  await sleep(5);
  assert.not.ok(done, 'the pass that covers the second kick is still running');
  g.release();
  await p;
  assert.ok(done);
  await loop.stop();
});

test('a request made by the pass itself runs one more pass', async () => {
  let passes = 0;
  const loop = new ReconcileLoop({
    run: () => {
      passes++;
      if (passes < 3) loop.request();
    },
    onError: () => {},
  });
  await loop.kick();
  assert.is(passes, 3);
  await loop.stop();
});

test('a failing pass is reported and the loop goes on', async () => {
  const errors: string[] = [];
  let passes = 0;
  const loop = new ReconcileLoop({
    run: async () => {
      passes++;
      if (passes === 1) throw new Error('store down');
      if (passes === 2) throw 'not an Error';
    },
    onError: (e) => {
      errors.push(e.message);
      if (errors.length === 2) throw new Error('a broken handler');
    },
  });
  await loop.kick();
  await loop.kick();
  await loop.kick();
  assert.equal(errors, ['store down', 'not an Error']);
  assert.is(passes, 3);
  await loop.stop();
});

test('the period runs passes by itself, one at a time', async () => {
  const g = gated();
  const loop = new ReconcileLoop({ run: g.run, everyMs: 10, onError: () => {} }).start();
  await sleep(35);
  assert.is(g.st.passes, 1, 'ticks during a pass do not start another');
  g.release();
  await sleep(5);
  assert.is(g.st.passes, 2, 'the ticks during the pass became one more pass');
  g.release();
  await sleep(40);
  assert.ok(g.st.passes >= 3, `periodic passes go on (${g.st.passes})`);
  assert.is(g.st.maxActive, 1);
  g.release();
  await loop.stop();
});

test('skipBusyTicks: periodic passes due during a pass are dropped, requests still queue one', async () => {
  const g = gated();
  // setImmediate runs after the microtasks that would start a queued pass, and before any timer.
  const settle = () => new Promise((r) => setImmediate(r));
  const loop = new ReconcileLoop({ run: g.run, everyMs: 10, skipBusyTicks: true, onError: () => {} }).start();
  void loop.kick();
  await sleep(45);
  assert.is(g.st.passes, 1);
  g.release();
  await settle();
  assert.is(g.st.passes, 1, 'the ticks during the pass were dropped');
  assert.not.ok(loop.running);
  await sleep(40);
  assert.is(g.st.passes, 2, 'the next tick after the pass runs one');
  loop.request();
  g.release();
  await settle();
  assert.is(g.st.passes, 3, 'a request during a pass still queues one');
  g.release();
  await loop.stop();
});

test('jitter spreads the period within its bounds', async () => {
  let passes = 0;
  const loop = new ReconcileLoop({ run: () => void passes++, everyMs: 20, jitter: 0.5, onError: () => {} }).start();
  await sleep(205);
  await loop.stop();
  // Waits of 10..30 ms: between 6 and 20 passes in ~205 ms (timer slack makes it fewer, never more).
  assert.ok(passes >= 4 && passes <= 20, `passes ${passes}`);
  assert.throws(() => new ReconcileLoop({ run: () => {}, jitter: 1, onError: () => {} }), /jitter/);
  assert.throws(() => new ReconcileLoop({ run: () => {}, everyMs: 0, onError: () => {} }), /everyMs/);
});

test('stop() waits for the pass under way, drops the pending one, and starts nothing after', async () => {
  const g = gated();
  const loop = new ReconcileLoop({ run: g.run, everyMs: 5, onError: () => {} }).start();
  void loop.kick();
  void loop.kick(); // pending: dropped by the stop
  let stopped = false;
  const s = loop.stop().then((ok) => {
    stopped = ok;
  });
  await sleep(20);
  assert.not.ok(stopped, 'stop waits for the pass');
  g.release();
  await s;
  assert.ok(stopped);
  await loop.kick();
  await sleep(20);
  assert.is(g.st.passes, 1, 'no pass after stop: not the pending one, not a kick, not the period');
  assert.not.ok(loop.running);
});

test('stop(timeout) gives up on a pass that hangs and says so', async () => {
  const g = gated();
  const loop = new ReconcileLoop({ run: g.run, onError: () => {} });
  void loop.kick();
  assert.is(await loop.stop(20), false);
  g.release();
  await sleep(1);
  assert.is(await loop.stop(20), true);
});

test.run();
