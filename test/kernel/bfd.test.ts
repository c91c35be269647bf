// BFD between two namespaces joined by a veth, each endpoint in its own process (nsenter … node
// test/lib/bfd-peer.ts): bring-up time, detection time after SIGKILL and after link down, forged /
// replayed / garbage packets rejected and counted without holding a session Up or pulling it Down, and
// recovery after the peer restarts. Measured times are printed.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { decodeControl, encodeControl, BfdState } from '../../daemon/bfd/packet';
import { resolveAuth, signPacket } from '../../daemon/bfd/auth';
import { BfdPeerProcess as Peer } from '../lib/bfd-peer-process';

const id = randomBytes(3).toString('hex');
const NS_A = `tbfd-${id}-a`;
const NS_B = `tbfd-${id}-b`;
const ADDR_A = '10.97.0.1';
const ADDR_B = '10.97.0.2';
const PORT = 3784;
const KEY = randomBytes(20).toString('hex');
const sh = (...args: string[]) => execFileSync(args[0], args.slice(1), { stdio: ['ignore', 'pipe', 'pipe'] });

function teardown(): void {
  for (const ns of [NS_A, NS_B]) {
    try {
      execFileSync('ip', ['netns', 'del', ns], { stdio: 'ignore' });
    } catch {
      // already gone
    }
  }
}

const peers: Peer[] = [];
const start = (ns: string, cfg: object) => {
  const p = new Peer(ns, cfg);
  peers.push(p);
  return p;
};
const startA = () => start(NS_A, { address: ADDR_A, peer: ADDR_B, port: PORT, keyHex: KEY });
/** A new B; the previous one (if a failed test left it running) is killed first so the port is free. */
async function startB(): Promise<Peer> {
  if (b && b.proc.exitCode === null && b.proc.signalCode === null) {
    const gone = new Promise((r) => b.proc.once('exit', r));
    b.kill();
    await gone;
  }
  return start(NS_B, { address: ADDR_B, peer: ADDR_A, port: PORT, keyHex: KEY });
}
const isState = (to: string) => (e: any) => e.ev === 'state' && e.to === to;
const measured: Record<string, number[]> = {};
const note = (k: string, v: number) => (measured[k] ??= []).push(Math.round(v));

let a: Peer;
let b: Peer;
let attacker: Peer;

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

test.after(() => {
  for (const p of peers) p.kill();
  teardown();
  console.log('  measured (ms):', JSON.stringify(measured));
});

test('sessions come Up within 1.5 s of both endpoints running', async () => {
  a = startA();
  b = await startB();
  attacker = start(NS_B, { address: ADDR_B });
  const ready = Math.max((await a.wait((e) => e.ev === 'ready', 10_000, 'A ready')).t, (await b.wait((e) => e.ev === 'ready', 10_000, 'B ready')).t);
  await attacker.wait((e) => e.ev === 'ready', 10_000, 'attacker ready');
  const upA = await a.wait(isState('Up'), 3000, 'A Up');
  const upB = await b.wait(isState('Up'), 3000, 'B Up');
  const ms = Math.max(upA.t, upB.t) - ready;
  note('bringUp', ms);
  assert.ok(ms < 1600, `Up after ${ms} ms`);
});

test('forged, replayed and garbage packets are rejected, counted, and change nothing', async () => {
  await new Promise((r) => setTimeout(r, 300));
  const captured: Array<{ hex: string; state: string }> = (await a.ask({ cmd: 'captured' }, 'captured')).packets;
  // Bring-up packets (Down or Init, whichever B's first to reach A was) and Up packets.
  assert.ok(captured.some((p) => p.state !== 'Up') && captured.some((p) => p.state === 'Up'), `captured ${captured.map((p) => p.state)}`);
  const replays = captured.map((p) => p.hex);
  // Forgeries: the latest genuine packet turned into Down / AdminDown / Up, a fresh sequence, the wrong key.
  const latest = decodeControl(Buffer.from(replays[replays.length - 1], 'hex'));
  const wrongKey = resolveAuth({ keyId: 1, key: randomBytes(20) });
  const forged = [BfdState.Down, BfdState.AdminDown, BfdState.Up].map((state, i) =>
    signPacket(wrongKey, encodeControl({ ...latest, state, yourDiscr: state === BfdState.Down ? 0 : latest.yourDiscr, auth: { ...latest.auth!, seq: latest.auth!.seq + 5 + i } })).toString('hex'),
  );
  const garbage = [randomBytes(24), randomBytes(60), Buffer.alloc(1), Buffer.from('2000000000', 'hex')].map((x) => x.toString('hex'));
  const mark = { a: a.events.length, b: b.events.length };
  const before = (await a.ask({ cmd: 'stats' }, 'stats')).stats;
  const sent = await attacker.ask({ cmd: 'send', to: ADDR_A, port: PORT, packets: [...forged, ...replays, ...garbage], everyMs: 20, forMs: 600 }, 'sent');
  await new Promise((r) => setTimeout(r, 100));
  const after = (await a.ask({ cmd: 'stats' }, 'stats')).stats;
  const rounds = sent.n / (forged.length + replays.length + garbage.length);
  const d = (k: string) => after.sessions[0].rejected[k] - before.sessions[0].rejected[k];
  console.log(`  attack: ${sent.n} datagrams in ${rounds} rounds; session rejected totals ${JSON.stringify(after.sessions[0].rejected)}`);
  assert.is(d('badDigest'), forged.length * rounds, 'every forgery counted as badDigest');
  assert.is(d('replay'), replays.length * rounds, 'every replay counted as replay');
  assert.is(d('malformed'), garbage.length * rounds, 'every garbage datagram counted as malformed');
  assert.is(after.rejected.malformed - before.rejected.malformed, garbage.length * rounds, 'endpoint counts malformed too');
  assert.is(a.events.slice(mark.a).filter((e) => e.ev === 'state').length, 0, 'A never changed state');
  assert.is(b.events.slice(mark.b).filter((e) => e.ev === 'state').length, 0, 'B never changed state');
});

test('SIGKILL of the peer: Down (diag 1) within detection time although replays and forgeries keep coming', async () => {
  const captured: Array<{ hex: string; state: string }> = (await a.ask({ cmd: 'captured' }, 'captured')).packets;
  const ups = captured.filter((p) => p.state === 'Up').map((p) => p.hex);
  const latest = decodeControl(Buffer.from(ups[ups.length - 1], 'hex'));
  const wrongKey = resolveAuth({ keyId: 1, key: randomBytes(20) });
  const forgedUp = signPacket(wrongKey, encodeControl({ ...latest, auth: { ...latest.auth!, seq: latest.auth!.seq + 1 } })).toString('hex');
  const mark = a.events.length;
  // Replay every 10 ms through detection and well past the point where A forgets the old sequence.
  attacker.proc.stdin!.write(JSON.stringify({ cmd: 'send', to: ADDR_A, port: PORT, packets: [...ups, ...captured.map((p) => p.hex), forgedUp], everyMs: 10, forMs: 2000 }) + '\n');
  await new Promise((r) => setTimeout(r, 50));
  const t0 = Date.now();
  b.kill();
  const down = await a.wait(isState('Down'), 2000, 'A Down', mark);
  const ms = down.t - t0;
  note('sigkillDetection', ms);
  assert.is(down.diag, 'ControlDetectionTimeExpired');
  assert.ok(ms < 600, `Down after ${ms} ms`);
  await attacker.wait((e) => e.ev === 'sent', 5000, 'attack over', attacker.events.length);
  const states = a.events.slice(mark).filter((e) => e.ev === 'state');
  assert.not.ok(states.some((e) => e.to === 'Up'), `replays brought A back Up: ${JSON.stringify(states)}`);
  const st = (await a.ask({ cmd: 'stats' }, 'stats')).stats;
  assert.ok(st.sessions[0].rejected.replay > 0 && st.rejected.noSession > 0 && st.sessions[0].rejected.badDigest > 0, JSON.stringify(st.rejected));
});

test('peer restarts: Up again; repeated kills are detected in time', async () => {
  for (let round = 0; round < 3; round++) {
    const mark = a.events.length;
    b = await startB();
    const ready = (await b.wait((e) => e.ev === 'ready', 10_000, 'B ready')).t;
    const up = await a.wait(isState('Up'), 5000, 'A Up again', mark);
    await b.wait(isState('Up'), 3000, 'B Up');
    note('upAfterRestart', up.t - ready);
    await new Promise((r) => setTimeout(r, 400 + 37 * round));
    const upAt = a.events.indexOf(up);
    const t0 = Date.now();
    b.kill();
    const down = await a.wait((e) => isState('Down')(e) && e.from === 'Up', 2000, 'A Down', upAt);
    note('sigkillDetection', down.t - t0);
    assert.ok(down.t - t0 < 600, `Down after ${down.t - t0} ms`);
    // Let A forget the dead peer's sequence before the next one starts (2 × detection time).
    await new Promise((r) => setTimeout(r, 700));
  }
});

test('link down: both sides Down within detection time; link up: Up again', async () => {
  b = await startB();
  await b.wait(isState('Up'), 8000, 'B Up');
  await a.wait(isState('Up'), 3000, 'A Up', a.events.length - 3);
  await new Promise((r) => setTimeout(r, 300));
  const mark = { a: a.events.length, b: b.events.length };
  const t0 = Date.now();
  sh('ip', '-n', NS_B, 'link', 'set', 'bfd0', 'down');
  const downA = await a.wait(isState('Down'), 2000, 'A Down', mark.a);
  const downB = await b.wait(isState('Down'), 2000, 'B Down', mark.b);
  note('linkDownDetection', downA.t - t0);
  note('linkDownDetection', downB.t - t0);
  assert.ok(downA.t - t0 < 600 && downB.t - t0 < 600, `A ${downA.t - t0} ms, B ${downB.t - t0} ms`);
  const t1 = Date.now();
  sh('ip', '-n', NS_B, 'link', 'set', 'bfd0', 'up');
  const upA = await a.wait(isState('Up'), 5000, 'A Up', mark.a);
  note('upAfterLinkUp', upA.t - t1);
});

test.run();
