// BfdEndpoint over real UDP on loopback (127.0.0.1 ↔ 127.0.0.2): sessions come Up, source ports are in the
// RFC 5881 range, garbage and unknown discriminators are counted, and close() tells the peer at once.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import * as dgram from 'node:dgram';
import { randomInt } from 'node:crypto';
import { BfdEndpoint, BfdState, BfdDiag, type BfdDatagramEvent, type BfdSession } from '../../daemon/bfd';
import { encodeControl, decodeControl } from '../../daemon/bfd/packet';
import { makeLogger, setLogger } from '../../lib/log';

setLogger(makeLogger({ level: 'warn' }));
const AUTH = { keyId: 3, key: Buffer.alloc(20, 0x33) };

const waitFor = async (cond: () => boolean, ms: number, what: string) => {
  const end = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 5));
  }
};

const sendRaw = (buf: Buffer, port: number, from = '127.0.0.2') =>
  new Promise<void>((resolve) => {
    const s = dgram.createSocket('udp4');
    s.bind(0, from, () => s.send(buf, port, '127.0.0.1', () => s.close(() => resolve())));
  });

test('sessions over loopback: Up, counters, source ports, close tells the peer', async () => {
  const port = randomInt(20000, 40000);
  const a = await BfdEndpoint.open({ address: '127.0.0.1', port });
  const b = await BfdEndpoint.open({ address: '127.0.0.2', port });
  try {
    const seen: BfdDatagramEvent[] = [];
    a.on('datagram', (ev: BfdDatagramEvent) => seen.push(ev));
    const sa = a.session('127.0.0.2', { auth: AUTH });
    const sb: BfdSession = b.session('127.0.0.1', { auth: AUTH });
    await waitFor(() => sa.state === BfdState.Up && sb.state === BfdState.Up, 3000, 'Up');
    const fromB = seen.filter((e) => e.verdict === 'accepted');
    assert.ok(fromB.length > 0);
    for (const e of fromB) assert.ok(e.from.port >= 49152 && e.from.port <= 65535, `source port ${e.from.port}`);
    assert.is(new Set(fromB.map((e) => e.from.port)).size, 1, 'one source port per session');

    assert.throws(() => a.session('127.0.0.2'), /already exists/);
    assert.throws(() => a.session('::1'), /not an IPv4 address/);

    await sendRaw(Buffer.from('not bfd at all, just noise'), port);
    await sendRaw(Buffer.alloc(3), port, '127.0.0.3');
    const stranger = encodeControl({ ...decodeControl(fromB[0].data), yourDiscr: 12345, auth: undefined });
    await sendRaw(stranger, port);
    await waitFor(() => a.stats().rejected.noSession >= 1, 1000, 'noSession');
    const st = a.stats();
    assert.is(st.rejected.malformed, 2);
    assert.is(st.sessions[0].rejected.malformed, 1, 'only the one from the peer address lands on the session');
    assert.is(sa.state, BfdState.Up);

    const t0 = Date.now();
    const down = new Promise<number>((r) => sa.once('down', () => r(Date.now() - t0)));
    sb.close();
    const ms = await down;
    assert.ok(ms < 100, `peer noticed the close after ${ms} ms`);
    assert.is(sa.diag, BfdDiag.NeighborSignaledDown);
  } finally {
    await a.close();
    await b.close();
  }
});

test('open() fails with IoFailure on an address that is not local', async () => {
  try {
    await BfdEndpoint.open({ address: '192.0.2.1', port: 3784 });
    assert.unreachable();
  } catch (e: any) {
    assert.is(e.code, 'IO_FAILURE');
    assert.match(e.message, /192\.0\.2\.1/);
  }
});

test.run();
