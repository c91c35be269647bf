// BFD keeps its timers while the process is busy: two endpoints in two namespaces at 50 ms × 3 (150 ms
// detection), one of them with its main thread blocked for 400 ms at a time, as a CNI ADD storm or a
// 100k-entry resync blocks tetherd's. On the BFD thread no side ever goes Down; the same endpoint on the
// main event loop (the control) goes Down on both sides, which shows the test can fail.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { BfdPeerProcess } from '../lib/bfd-peer-process';

const id = randomBytes(3).toString('hex');
const NS_A = `tbfd-${id}-ta`;
const NS_B = `tbfd-${id}-tb`;
const ADDR_A = '10.97.1.1';
const ADDR_B = '10.97.1.2';
const KEY = randomBytes(20).toString('hex');
const TIMERS = { desiredMinTxUs: 50_000, requiredMinRxUs: 50_000, detectMult: 3 };
const BLOCK_MS = 400;
const BLOCKS = 5;
const sh = (...args: string[]) => execFileSync(args[0], args.slice(1), { stdio: ['ignore', 'pipe', 'pipe'] });
const procs: BfdPeerProcess[] = [];

function teardown(): void {
  for (const p of procs) p.kill();
  for (const ns of [NS_A, NS_B]) {
    try {
      execFileSync('ip', ['netns', 'del', ns], { stdio: 'ignore' });
    } catch {
      // already gone
    }
  }
}

test.before(() => {
  process.on('exit', teardown);
  for (const ns of [NS_A, NS_B]) {
    sh('ip', 'netns', 'add', ns);
    sh('ip', '-n', ns, 'link', 'set', 'lo', 'up');
  }
  sh('ip', '-n', NS_A, 'link', 'add', 'bfd0', 'type', 'veth', 'peer', 'name', 'bfd0', 'netns', NS_B);
  sh('ip', '-n', NS_A, 'addr', 'add', `${ADDR_A}/24`, 'dev', 'bfd0');
  sh('ip', '-n', NS_B, 'addr', 'add', `${ADDR_B}/24`, 'dev', 'bfd0');
  sh('ip', '-n', NS_A, 'link', 'set', 'bfd0', 'up');
  sh('ip', '-n', NS_B, 'link', 'set', 'bfd0', 'up');
});

test.after(teardown);

/** Brings a session Up between A (threaded or not) and B (always threaded), blocks A, counts Downs. */
async function run(aThreaded: boolean, port: number): Promise<{ downsA: number; downsB: number }> {
  const a = new BfdPeerProcess(NS_A, { address: ADDR_A, peer: ADDR_B, port, keyHex: KEY, timers: TIMERS, threaded: aThreaded });
  const b = new BfdPeerProcess(NS_B, { address: ADDR_B, peer: ADDR_A, port, keyHex: KEY, timers: TIMERS, threaded: true });
  procs.push(a, b);
  try {
    const isUp = (e: any) => e.ev === 'state' && e.to === 'Up';
    await a.wait(isUp, 10_000, 'A Up');
    await b.wait(isUp, 10_000, 'B Up');
    // Let the sessions settle on the fast timers (the poll sequence after Up).
    await new Promise((r) => setTimeout(r, 500));
    const fromA = a.events.length;
    const fromB = b.events.length;
    for (let i = 0; i < BLOCKS; i++) {
      await a.ask({ cmd: 'block', ms: BLOCK_MS }, 'blocked');
      await new Promise((r) => setTimeout(r, 200));
    }
    // A's view arrives after its block ends; give any Down that happened time to be reported.
    await new Promise((r) => setTimeout(r, 300));
    const downs = (evs: any[]) => evs.filter((e) => e.ev === 'state' && e.from === 'Up').length;
    return { downsA: downs(a.events.slice(fromA)), downsB: downs(b.events.slice(fromB)) };
  } finally {
    a.kill();
    b.kill();
  }
}

test(`on the BFD thread: main thread blocked ${BLOCKS} × ${BLOCK_MS} ms at 50 ms × 3, no side goes Down`, async () => {
  const r = await run(true, 3790);
  console.log('  threaded:', JSON.stringify(r));
  assert.is(r.downsA, 0, 'the blocked side declared its peer down');
  assert.is(r.downsB, 0, 'the peer declared the blocked side down');
});

test('control: the same endpoint on the main event loop goes Down on both sides', async () => {
  const r = await run(false, 3791);
  console.log('  in-loop:', JSON.stringify(r));
  assert.ok(r.downsB >= 1, `the peer never saw the blocked side go silent: ${JSON.stringify(r)}`);
});

test.run();
