// The shared reconcile loop (daemon/util/reconcile-loop.ts): requests during a pass coalesce into exactly
// one more pass, passes never overlap, a failing pass is reported and retried after a capped exponential
// backoff (requests meanwhile join the retry), the period runs passes by itself, and stop() waits for the
// pass under way and starts nothing after, not even a retry.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { ReconcileLoop } from '../../daemon/util/reconcile-loop';
import { Backoff } from '../../lib/backoff';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
/** `p`, with the process held up until it settles (the loop's own timers never hold it). */
const held = <T>(p: Promise<T>) => {
  const t = setInterval(() => {}, 1000);
  return p.finally(() => clearInterval(t));
};

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
    backoff: new Backoff(1, 1),
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
  await held(loop.kick());
  await held(loop.kick());
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

/** Fixed delays (no jitter): 30, 60, 120, 120… ms. */
const steps = () => new Backoff(30, 120, Math.random, 0);
/** Timer slack allowed on a shared, loaded machine (well under the next step's doubling). */
const SLACK = 45;

/** A loop whose passes fail while `fail` says so, noting when each pass starts. */
function failing(fail: (pass: number) => boolean) {
  const starts: number[] = [];
  const errors: string[] = [];
  const loop = new ReconcileLoop({
    backoff: steps(),
    run: () => {
      starts.push(Date.now());
      if (fail(starts.length)) throw new Error(`pass ${starts.length} failed`);
    },
    onError: (e) => errors.push(e.message),
  });
  const gaps = () => starts.slice(1).map((t, i) => t - starts[i]);
  return { loop, starts, errors, gaps };
}

test('a failing pass is retried after the backoff, which doubles up to its cap', async () => {
  const f = failing(() => true);
  await f.loop.kick();
  assert.is(f.starts.length, 1);
  assert.ok(f.loop.backingOff);
  await sleep(20);
  assert.is(f.starts.length, 1, 'not retried before the first delay');
  while (f.starts.length < 5) await sleep(10);
  await f.loop.stop();
  const gaps = f.gaps();
  [30, 60, 120, 120].forEach((want, i) => assert.ok(gaps[i] >= want - 1 && gaps[i] < want + SLACK, `retry ${i + 1} after ${gaps[i]} ms, ${want} wanted (gaps ${gaps})`));
  assert.equal(f.errors, ['pass 1 failed', 'pass 2 failed', 'pass 3 failed', 'pass 4 failed', 'pass 5 failed']);
});

test('a pass that succeeds resets the backoff', async () => {
  // Passes 1 and 2 fail, 3 succeeds, 4 (requested) fails: its retry waits the first delay again.
  const f = failing((n) => n !== 3);
  await f.loop.kick();
  while (f.starts.length < 3) await sleep(5);
  await f.loop.idle();
  assert.not.ok(f.loop.backingOff, 'a success leaves nothing to retry');
  await sleep(150);
  assert.is(f.starts.length, 3, 'no pass after the success until one is requested');
  f.loop.request();
  while (f.starts.length < 5) await sleep(5);
  await f.loop.stop();
  const gaps = f.gaps();
  assert.ok(gaps[3] >= 29 && gaps[3] < 30 + SLACK, `retry after the success waited ${gaps[3]} ms, 30 wanted (not 120)`);
});

test('requests during the backoff wait join the retry: one pass, and they resolve with it', async () => {
  const f = failing((n) => n === 1);
  const t0 = Date.now();
  await f.loop.kick();
  const resolved: number[] = [];
  for (let i = 0; i < 2; i++) void f.loop.kick().then(() => resolved.push(Date.now() - t0));
  f.loop.request();
  f.loop.request();
  await sleep(5);
  assert.is(f.starts.length, 1, 'the requests wait for the retry');
  assert.is(resolved.length, 0);
  await sleep(30 + SLACK);
  assert.is(resolved.length, 2);
  assert.ok(resolved.every((ms) => ms >= 29), `they resolved with the retry (${resolved})`);
  assert.is(f.starts.length, 2, 'one retry for all of them');
  await sleep(80);
  assert.is(f.starts.length, 2);
  assert.not.ok(f.loop.backingOff);
  await f.loop.stop();
});

test('a request made during a failing pass is owed the retry, not a pass at once', async () => {
  let release!: () => void;
  const starts: number[] = [];
  const loop = new ReconcileLoop({
    backoff: steps(),
    run: async () => {
      starts.push(Date.now());
      if (starts.length === 1) {
        await new Promise<void>((r) => (release = r));
        throw new Error('store down');
      }
    },
    onError: () => {},
  });
  void loop.kick();
  let owedDone = false;
  void loop.kick().then(() => (owedDone = true));
  release();
  await sleep(10);
  assert.is(starts.length, 1, 'no pass right after the failed one');
  assert.not.ok(owedDone, 'the request waits for the retry');
  await sleep(30 + SLACK);
  assert.ok(owedDone);
  assert.is(starts.length, 2);
  assert.ok(starts[1] - starts[0] >= 29, 'the request ran with the retry');
  await loop.stop();
});

test('stop() during a backoff wait runs nothing more, and the requests waiting resolve', async () => {
  const f = failing(() => true);
  await f.loop.kick();
  const waiting = f.loop.kick();
  assert.ok(f.loop.backingOff);
  assert.is(await f.loop.stop(), true);
  await waiting;
  assert.not.ok(f.loop.backingOff);
  await f.loop.kick();
  await sleep(100);
  assert.is(f.starts.length, 1, 'no retry, no pass after stop');
});

test('a period with periodAfterPass counts from the end of the pass; a retry stands in for it', async () => {
  const starts: number[] = [];
  const ends: number[] = [];
  const loop = new ReconcileLoop({
    everyMs: 40,
    periodAfterPass: true,
    backoff: new Backoff(15, 15, Math.random, 0),
    run: async () => {
      starts.push(Date.now());
      await sleep(60);
      ends.push(Date.now());
      if (starts.length === 2) throw new Error('failed once');
    },
    onError: () => {},
  });
  loop.start().request();
  while (starts.length < 4) await sleep(5);
  await loop.stop();
  // A period on its own clock would have fallen due during the first pass and started the second at its end.
  assert.ok(starts[1] - ends[0] >= 39, `second pass ${starts[1] - ends[0]} ms after the first ended`);
  assert.ok(starts[2] - ends[1] >= 14 && starts[2] - ends[1] < 39, `the retry ${starts[2] - ends[1]} ms after the failure, not a period`);
  assert.ok(starts[3] - ends[2] >= 39, 'the period again after a success');
});

test('backoff: equal jitter, ± a fraction, or none; the cap holds', () => {
  const at = (r: number, jitter?: number) => {
    const b = new Backoff(100, 1000, () => r, jitter);
    return Array.from({ length: 6 }, () => b.next());
  };
  assert.equal(at(0), [50, 100, 200, 400, 500, 500]);
  assert.equal(at(1, 0.25), [125, 250, 500, 1000, 1250, 1250]);
  assert.equal(at(0, 0.25), [75, 150, 300, 600, 750, 750]);
  assert.equal(at(0.3, 0), [100, 200, 400, 800, 1000, 1000]);
  assert.throws(() => new Backoff(1, 2, Math.random, 1), /jitter/);
});

test.run();
