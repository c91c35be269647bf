// BFD session state machine on a fake clock: the §6.8.6 transition table, detection timeout, slow and
// fast transmit rates, Poll/Final, AdminDown, authentication verdicts, peer restart, and the log line.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { Writable } from 'node:stream';
import { BfdSession, type BfdSessionOptions, type BfdStateChange } from '../../daemon/bfd/session';
import { BfdDiag, BfdState, decodeControl, encodeControl, type BfdControl } from '../../daemon/bfd/packet';
import { resolveAuth, signPacket } from '../../daemon/bfd/auth';
import type { Clock } from '../../daemon/bfd/clock';
import { makeLogger, setLogger } from '../../lib/log';

const logLines: any[] = [];
// Installed when this suite starts, not at import: uvu imports the whole group first, and another file's
// logger set at import would replace this one.
test.before(() => setLogger(makeLogger({ level: 'info', stream: new Writable({ write: (c, _e, cb) => (logLines.push(JSON.parse(String(c))), cb()) }) })));

class FakeClock implements Clock {
  t = 0;
  private seq = 0;
  private timers = new Map<number, { at: number; fn: () => void }>();
  now(): number {
    return this.t;
  }
  setTimeout(fn: () => void, ms: number): unknown {
    const id = ++this.seq;
    this.timers.set(id, { at: this.t + Math.max(0, ms), fn });
    return id;
  }
  clearTimeout(h: unknown): void {
    this.timers.delete(h as number);
  }
  advance(ms: number): void {
    const end = this.t + ms;
    for (;;) {
      let next: [number, { at: number; fn: () => void }] | undefined;
      for (const e of this.timers) if (e[1].at <= end && (!next || e[1].at < next[1].at || (e[1].at === next[1].at && e[0] < next[0]))) next = e;
      if (!next) break;
      this.timers.delete(next[0]);
      this.t = next[1].at;
      next[1].fn();
    }
    this.t = end;
  }
  /** Advances until `cond` holds, in 1 ms steps; returns the time it took. */
  until(cond: () => boolean, limitMs: number): number {
    const start = this.t;
    while (!cond()) {
      if (this.t - start > limitMs) throw new Error(`condition not met within ${limitMs} ms`);
      this.advance(1);
    }
    return this.t - start;
  }
}

const KEY = Buffer.alloc(20, 0x42);
const AUTH = { keyId: 1, key: KEY };
let discr = 1000;

/** Two sessions joined by a 1 ms wire that can be cut; packets are demultiplexed like the endpoint does. */
function pair(optsA: BfdSessionOptions = { auth: AUTH }, optsB: BfdSessionOptions = optsA) {
  const clock = new FakeClock();
  const wire = { up: true, fromB: [] as Buffer[] };
  const deliver = (to: BfdSession, pkt: Buffer) => {
    const p = decodeControl(pkt);
    if (p.yourDiscr !== 0 && p.yourDiscr !== to.localDiscr) return;
    to.receive(p, pkt.subarray(0, pkt[3]));
  };
  const mk = (peer: string, opts: BfdSessionOptions, other: () => BfdSession, log?: Buffer[]) =>
    new BfdSession(
      {
        peer,
        clock,
        allocDiscr: () => ++discr,
        send: (pkt) => {
          log?.push(pkt);
          if (wire.up) clock.setTimeout(() => deliver(other(), pkt), 1);
        },
      },
      opts,
    );
  const t = { clock, wire, a: undefined as unknown as BfdSession, b: undefined as unknown as BfdSession, restartB: () => {} };
  t.a = mk('10.0.0.2', optsA, () => t.b);
  t.b = mk('10.0.0.1', optsB, () => t.a, wire.fromB);
  t.restartB = () => {
    t.b.close();
    t.wire.fromB.length = 0;
    t.b = mk('10.0.0.1', optsB, () => t.a, wire.fromB);
    t.b.start();
  };
  t.a.start();
  t.b.start();
  return t;
}

const upBoth = (t: ReturnType<typeof pair>) => t.clock.until(() => t.a.state === BfdState.Up && t.b.state === BfdState.Up, 10_000);

// --- a lone session fed hand-made packets (no auth) for the transition table ---

function lone(opts: BfdSessionOptions = {}) {
  const clock = new FakeClock();
  const sent: BfdControl[] = [];
  const s = new BfdSession({ peer: '10.0.0.2', clock, allocDiscr: () => ++discr, send: (pkt) => sent.push(decodeControl(pkt)) }, opts);
  const feed = (state: BfdState, extra: Partial<BfdControl> = {}) => {
    const p: BfdControl = {
      diag: BfdDiag.None,
      state,
      poll: false,
      final: false,
      cpi: false,
      demand: false,
      multipoint: false,
      detectMult: 3,
      myDiscr: 77,
      yourDiscr: state === BfdState.Down || state === BfdState.AdminDown ? 0 : s.localDiscr,
      desiredMinTxUs: 100_000,
      requiredMinRxUs: 100_000,
      requiredMinEchoRxUs: 0,
      ...extra,
    };
    return s.receive(p, encodeControl(p));
  };
  return { clock, s, sent, feed };
}

function into(l: ReturnType<typeof lone>, st: BfdState): void {
  if (st === BfdState.AdminDown) l.s.adminDown();
  if (st === BfdState.Init || st === BfdState.Up) l.feed(BfdState.Down);
  if (st === BfdState.Up) l.feed(BfdState.Init);
  assert.is(l.s.state, st, `set up ${BfdState[st]}`);
}

const S = BfdState;
const table: Array<[BfdState, BfdState, BfdState, BfdDiag]> = [
  [S.Down, S.Down, S.Init, BfdDiag.None],
  [S.Down, S.Init, S.Up, BfdDiag.None],
  [S.Down, S.Up, S.Down, BfdDiag.None],
  [S.Down, S.AdminDown, S.Down, BfdDiag.None],
  [S.Init, S.Down, S.Init, BfdDiag.None],
  [S.Init, S.Init, S.Up, BfdDiag.None],
  [S.Init, S.Up, S.Up, BfdDiag.None],
  [S.Init, S.AdminDown, S.Down, BfdDiag.NeighborSignaledDown],
  [S.Up, S.Down, S.Down, BfdDiag.NeighborSignaledDown],
  [S.Up, S.Init, S.Up, BfdDiag.None],
  [S.Up, S.Up, S.Up, BfdDiag.None],
  [S.Up, S.AdminDown, S.Down, BfdDiag.NeighborSignaledDown],
  [S.AdminDown, S.Down, S.AdminDown, BfdDiag.AdministrativelyDown],
  [S.AdminDown, S.Init, S.AdminDown, BfdDiag.AdministrativelyDown],
  [S.AdminDown, S.Up, S.AdminDown, BfdDiag.AdministrativelyDown],
];

test('§6.8.6 transition table', () => {
  for (const [local, received, expected, diag] of table) {
    const l = lone();
    into(l, local);
    assert.is(l.feed(received), 'accepted');
    const what = `${S[local]} + ${S[received]}`;
    assert.is(S[l.s.state], S[expected], what);
    assert.is(BfdDiag[l.s.diag], BfdDiag[diag], `${what} diag`);
  }
});

test('detection timeout: Init or Up → Down with diag 1 after remote mult × agreed interval', () => {
  for (const st of [S.Init, S.Up]) {
    const l = lone();
    into(l, st);
    const downs: BfdStateChange[] = [];
    l.s.on('state', (c: BfdStateChange) => downs.push(c));
    l.clock.advance(50);
    l.feed(st === S.Up ? S.Up : S.Down, { detectMult: 4, desiredMinTxUs: 150_000 });
    // 4 × max(our 100 ms RequiredMinRx, their 150 ms DesiredMinTx) = 600 ms
    assert.is(l.s.detectionTimeMs(), 600);
    l.clock.advance(599);
    assert.is(l.s.state, st);
    l.clock.advance(1);
    assert.is(l.s.state, S.Down);
    assert.is(l.s.diag, BfdDiag.ControlDetectionTimeExpired);
    assert.is(l.s.remoteDiscr, 0, 'peer discriminator forgotten');
    assert.is(downs[0].sinceLastRxMs, 600);
  }
});

test('slow 1 s transmission while not Up (§6.8.3), with 75–100 % jitter', () => {
  const l = lone();
  l.s.start();
  const times: number[] = [];
  let n = 0;
  while (times.length < 20) {
    l.clock.advance(1);
    if (l.sent.length > n) {
      n = l.sent.length;
      times.push(l.clock.now());
    }
  }
  for (const p of l.sent) assert.is(p.desiredMinTxUs, 1_000_000);
  const gaps = times.slice(1).map((t, i) => t - times[i]);
  assert.ok(Math.min(...gaps) >= 750 && Math.max(...gaps) <= 1000, `gaps ${gaps.join(',')}`);
});

test('detect mult 1: jitter keeps the interval within 75–90 %', () => {
  const l = lone({ detectMult: 1 });
  l.s.start();
  const times: number[] = [];
  for (let n = 0; times.length < 20; ) {
    l.clock.advance(1);
    if (l.sent.length > n) (n = l.sent.length), times.push(l.clock.now());
  }
  const gaps = times.slice(1).map((t, i) => t - times[i]);
  assert.ok(Math.min(...gaps) >= 750 && Math.max(...gaps) <= 900, `gaps ${gaps.join(',')}`);
});

test('two sessions come Up, then run at 100 ms after a completed Poll', () => {
  const t = pair();
  const ms = upBoth(t);
  assert.ok(ms <= 1100, `up after ${ms} ms`);
  t.clock.advance(200); // poll completes
  const tx0 = t.b.stats().tx;
  t.clock.advance(1000);
  const perSecond = t.b.stats().tx - tx0;
  assert.ok(perSecond >= 10 && perSecond <= 14, `${perSecond} packets/s`);
  assert.is(t.a.detectionTimeMs(), 300);
  const last = decodeControl(t.wire.fromB[t.wire.fromB.length - 1]);
  assert.is(last.poll, false, 'poll finished');
  assert.is(last.desiredMinTxUs, 100_000);
  assert.is(t.a.stats().rejected.replay + t.a.stats().rejected.badDigest, 0);
});

test('cut link: both sides Down (diag 1) within detection time; heal: Up again', () => {
  const t = pair();
  upBoth(t);
  t.clock.advance(500);
  t.wire.up = false;
  const ms = t.clock.until(() => t.a.state === S.Down && t.b.state === S.Down, 1000);
  assert.ok(ms <= 302, `down after ${ms} ms`); // +1 ms wire delay of the last packet in flight
  assert.is(t.a.diag, BfdDiag.ControlDetectionTimeExpired);
  t.clock.advance(2000);
  t.wire.up = true;
  const back = upBoth(t);
  assert.ok(back <= 2100, `up again after ${back} ms`);
});

test('peer restart (new discriminator, new random sequence): Up again', () => {
  const t = pair();
  upBoth(t);
  t.clock.advance(300);
  const changes: BfdStateChange[] = [];
  t.a.on('state', (c: BfdStateChange) => changes.push(c));
  t.restartB();
  // The old B said AdminDown when it closed: A goes Down at once with diag 3.
  t.clock.advance(5);
  assert.is(changes[0].to, S.Down);
  assert.is(changes[0].diag, BfdDiag.NeighborSignaledDown);
  assert.ok(changes[0].sinceLastRxMs < 1, 'on the AdminDown packet itself');
  // A is not Up, so the new B's Down packet (Your Discriminator 0) re-anchors the sequence window at once
  // instead of after 2 × detection time: the ordinary slow-rate handshake follows.
  const ms = upBoth(t);
  assert.ok(ms <= 2100, `up after ${ms} ms`);
});

test('peer vanishes without a word and comes back: Up again once the old sequence is forgotten', () => {
  const t = pair();
  upBoth(t);
  t.clock.advance(500);
  t.wire.up = false;
  t.clock.until(() => t.a.state === S.Down, 400);
  const oldDiscr = t.a.localDiscr;
  t.clock.advance(100);
  t.restartB(); // wire still cut: the old B's parting AdminDown is lost, as with SIGKILL
  t.wire.up = true;
  const ms = upBoth(t);
  assert.ok(ms <= 2100, `up after ${ms} ms`);
  assert.is.not(t.a.localDiscr, oldDiscr, 'a new incarnation uses a new discriminator');
});

test('2 × detection time of silence: sequence and both discriminators are forgotten', () => {
  const t = pair();
  upBoth(t);
  t.clock.advance(500);
  const oldDiscr = t.a.localDiscr;
  t.wire.up = false;
  // The last packet arrived up to 100 ms before the cut: Down by +300, forgotten in (+500, +600].
  t.clock.advance(450);
  assert.is(t.a.state, S.Down);
  assert.is(t.a.localDiscr, oldDiscr);
  t.clock.advance(151);
  assert.is.not(t.a.localDiscr, oldDiscr, 'captures naming the old discriminator no longer reach the session');
  assert.is(t.a.remoteDiscr, 0);
  t.wire.up = true;
  upBoth(t);
});

test('Poll/Final: a slower TX rate takes effect only after Final; peer detection follows', () => {
  const t = pair();
  upBoth(t);
  t.clock.advance(300);
  t.a.setTimers({ desiredMinTxUs: 400_000 });
  // Still 100 ms until B answers the Poll (1 ms away), then 400 ms.
  t.clock.advance(150);
  assert.is(t.a.txIntervalMs(), 400);
  assert.is(t.b.detectionTimeMs(), 1200);
  const tx0 = t.a.stats().tx;
  t.clock.advance(2000);
  const n = t.a.stats().tx - tx0;
  assert.ok(n >= 5 && n <= 7, `${n} packets in 2 s`);
  assert.is(t.a.state, S.Up);
  assert.is(t.b.state, S.Up);
});

test('Poll/Final: a smaller RequiredMinRx keeps the old detection time until Final', () => {
  const l = lone();
  l.s.start();
  into(l, S.Up);
  l.clock.advance(1);
  l.feed(S.Up, { final: true }); // ends the Poll started by going Up
  l.s.setTimers({ requiredMinRxUs: 50_000 });
  l.feed(S.Up, { desiredMinTxUs: 10_000 });
  assert.is(l.s.detectionTimeMs(), 300, 'old 100 ms RequiredMinRx still in force');
  l.clock.advance(150);
  assert.ok(l.sent.some((p) => p.poll && p.requiredMinRxUs === 50_000), 'Poll carries the new value');
  l.feed(S.Up, { final: true, desiredMinTxUs: 10_000 });
  assert.is(l.s.detectionTimeMs(), 150);
});

test('a Poll is answered at once with Final and without Poll', () => {
  const l = lone();
  into(l, S.Up);
  const n = l.sent.length;
  l.feed(S.Up, { poll: true });
  assert.is(l.sent.length, n + 1);
  assert.is(l.sent[n].final, true);
  assert.is(l.sent[n].poll, false);
});

test('AdminDown: peer goes Down with diag 3; adminUp brings both Up again', () => {
  const t = pair();
  upBoth(t);
  t.a.adminDown();
  t.clock.advance(1100);
  assert.is(t.a.state, S.AdminDown);
  assert.is(t.a.diag, BfdDiag.AdministrativelyDown);
  assert.is(t.b.state, S.Down);
  assert.is(t.b.diag, BfdDiag.NeighborSignaledDown);
  t.clock.advance(3000);
  assert.is(t.a.state, S.AdminDown, 'stays down');
  t.a.adminUp();
  upBoth(t);
});

test('authentication verdicts are counted and change nothing', () => {
  const t = pair();
  upBoth(t);
  t.clock.advance(500);
  const a = t.a;
  const genuine = t.wire.fromB.slice(-3);
  const forge = (key: Buffer, patch: Partial<BfdControl>, keyId = 1) => {
    const p = { ...decodeControl(genuine[2]), ...patch };
    p.auth = { ...p.auth!, keyId, seq: p.auth!.seq + 1, digest: Buffer.alloc(20) };
    return signPacket(resolveAuth({ keyId, key }), encodeControl(p));
  };
  const feed = (pkt: Buffer) => a.receive(decodeControl(pkt), pkt);
  const ups = a.stats().ups;
  for (let i = 0; i < 3; i++) assert.is(feed(forge(Buffer.alloc(20, 1), { state: S.Down, yourDiscr: 0 })), 'badDigest');
  assert.is(feed(forge(KEY, { state: S.AdminDown }, 2)), 'badKeyId');
  const plain = encodeControl({ ...decodeControl(genuine[2]), auth: undefined, state: S.Down });
  assert.is(feed(plain), 'authMismatch');
  for (const g of genuine) assert.is(feed(g), 'replay');
  assert.is(a.state, S.Up);
  const r = a.stats().rejected;
  assert.equal([r.badDigest, r.badKeyId, r.authMismatch, r.replay], [3, 1, 1, 3]);
  // Forged and replayed Up packets do not keep it alive either.
  t.wire.up = false;
  const start = t.clock.now();
  while (a.state === S.Up && t.clock.now() - start < 1000) {
    feed(forge(Buffer.alloc(20, 1), {}));
    for (const g of genuine) feed(g);
    t.clock.advance(10);
  }
  assert.ok(t.clock.now() - start <= 310, `down after ${t.clock.now() - start} ms`);
  assert.is(a.diag, BfdDiag.ControlDetectionTimeExpired);
  assert.is(a.stats().ups, ups);
});

test('an out-of-window sequence re-anchors only for Your Discriminator 0 while not Up', () => {
  const t = pair();
  upBoth(t);
  t.clock.advance(500);
  const key = resolveAuth(AUTH);
  const g = decodeControl(t.wire.fromB[t.wire.fromB.length - 1]);
  const mk = (patch: Partial<BfdControl>, seq: number) => signPacket(key, encodeControl({ ...g, ...patch, auth: { ...g.auth!, seq, digest: Buffer.alloc(20) } }));
  const feed = (pkt: Buffer) => t.a.receive(decodeControl(pkt), pkt);
  const old = (g.auth!.seq - 100) >>> 0;
  assert.is(feed(mk({ state: S.Down, yourDiscr: 0 }, old)), 'replay', 'Up: strict even for Your Discriminator 0');
  assert.is(t.a.state, S.Up);
  t.wire.up = false;
  t.clock.until(() => t.a.state === S.Down, 400);
  assert.is(feed(mk({ state: S.Init, yourDiscr: t.a.localDiscr }, old)), 'replay', 'naming our discriminator: strict');
  assert.is(t.a.state, S.Down);
  const before = t.a.localDiscr;
  assert.is(feed(mk({ state: S.Down, yourDiscr: 0 }, old)), 'accepted');
  assert.is(t.a.state, S.Init, 'the most a replayed Down packet can do');
  assert.is.not(t.a.localDiscr, before, 'new incarnation, new discriminator');
  // The captured handshake continued with an Init naming the old discriminator: it can no longer match.
  assert.is.not(mk({ state: S.Init, yourDiscr: before }, old + 1).readUInt32BE(8), t.a.localDiscr);
});

test('replaying the whole captured conversation, in order, never brings a dead peer back Up', () => {
  for (let round = 0; round < 20; round++) {
    const t = pair();
    upBoth(t);
    t.clock.advance(300 + round * 13);
    const capture = [...t.wire.fromB];
    t.wire.up = false;
    t.b.close();
    const ups = t.a.stats().ups;
    // Replay in order, one packet every 10 ms, from the moment of death until long after.
    for (let i = 0; i < 600; i++) {
      const pkt = capture[i % capture.length];
      const p = decodeControl(pkt);
      if (p.yourDiscr === 0 || p.yourDiscr === t.a.localDiscr) t.a.receive(p, pkt);
      t.clock.advance(10);
    }
    assert.is(t.a.stats().ups, ups, `round ${round}: came Up on replays`);
    assert.is.not(t.a.state, S.Up);
  }
});

test('meticulous sequence: every transmitted packet has a new number', () => {
  const t = pair();
  upBoth(t);
  t.clock.advance(500);
  const seqs = t.wire.fromB.map((b) => decodeControl(b).auth!.seq);
  for (let i = 1; i < seqs.length; i++) assert.is(seqs[i], (seqs[i - 1] + 1) >>> 0);
});

test('unauthenticated sessions reject packets with the A bit', () => {
  const t = pair({});
  upBoth(t);
  const l = lone({});
  const p = { ...decodeControl(encodeControl({ ...decodeControl(t.wire.fromB[0]) })), auth: { type: 5, keyId: 1, seq: 1, digest: Buffer.alloc(20) } };
  assert.is(l.s.receive(p, encodeControl(p)), 'authMismatch');
});

test('one JSON log line per state change, with peer, discriminators, diag and detection', () => {
  logLines.length = 0;
  const l = lone();
  into(l, S.Up);
  l.clock.advance(300);
  assert.equal(
    logLines.map((x) => [x.message, x.from, x.to, x.diag]),
    [
      ['bfd session state changed', 'Down', 'Init', 'None'],
      ['bfd session state changed', 'Init', 'Up', 'None'],
      ['bfd session state changed', 'Up', 'Down', 'ControlDetectionTimeExpired'],
    ],
  );
  const down = logLines[2];
  assert.is(down.peer, '10.0.0.2');
  assert.is(down.localDiscr, l.s.localDiscr);
  assert.is(down.remoteDiscr, 77);
  assert.is(down.sinceLastRxMs, 300);
  assert.is(down.detectionTimeMs, 300);
});

test('timer options are validated', () => {
  for (const o of [{ desiredMinTxUs: 0 }, { requiredMinRxUs: 10 }, { detectMult: 0 }, { detectMult: 256 }]) {
    assert.throws(() => lone(o), (e: Error) => /bfd (desiredMinTxUs|requiredMinRxUs|detectMult)/.test(e.message));
  }
});

test.run();
