// The socket API across releases, on real Unix sockets: tetherd answers every protocol version from
// MIN_PROTOCOL_VERSION to PROTOCOL_VERSION, each in its own version; a client whose version the daemon
// refuses asks once more in the older version the daemon names, as long as it speaks that one too: with
// release 0.1.0's daemon (which refuses with id "") and with a daemon that speaks only an older version.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import * as fs from 'node:fs';
import * as net from 'node:net';
import * as os from 'node:os';
import * as path from 'node:path';
import { ApiServer, type VersionRange } from '../../daemon/server';
import { callWith } from '../../lib/api/call-core';
import { nodeConnector } from '../../lib/api/client';
import { MIN_PROTOCOL_VERSION, PROTOCOL_VERSION } from '../../lib/api/protocol';
import { makeLogger } from '../../lib/log';
import { TetherError } from '../../lib/errors';
import { captureLogger } from '../lib/log-capture';

let dir: string;
test.before(() => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tether-socket-versions-'));
});
test.after(() => fs.rmSync(dir, { recursive: true, force: true }));

let n = 0;
const sockPath = () => path.join(dir, `s${++n}.sock`);

/** A tetherd of this code speaking `versions` (default: this release's range), answering ping. */
async function daemon(versions?: VersionRange, logger = makeLogger({ level: 'error' })): Promise<{ path: string; close: () => Promise<void> }> {
  const p = sockPath();
  const server = new ApiServer(p, { ping: (params) => ({ pong: true, params }) }, logger, versions);
  await server.listen();
  return { path: p, close: () => server.close() };
}

/**
 * Release 0.1.0's daemon (commit ccd851b) as it answers on the wire: a version other than 1 refused with
 * id "" (it refused before reading the id) and version 1; version 1 answered. The refusal line is the one
 * ccd851b's daemon/server.ts wrote when run against a version 2 request.
 */
async function daemon010(): Promise<{ path: string; lines: string[]; close: () => Promise<void> }> {
  const p = sockPath();
  const lines: string[] = [];
  const server = net.createServer((s) => {
    let buf = '';
    s.on('data', (c) => {
      buf += c.toString();
      let nl;
      while ((nl = buf.indexOf('\n')) >= 0) {
        const line = buf.slice(0, nl);
        buf = buf.slice(nl + 1);
        lines.push(line);
        const r = JSON.parse(line) as { version: unknown; id: string };
        s.write(
          r.version === 1
            ? JSON.stringify({ version: 1, id: r.id, result: { pong: true, release: '0.1.0' } }) + '\n'
            : `{"version":1,"id":"","error":{"code":"PROTOCOL_VERSION","message":"protocol version ${r.version} is not spoken here (tetherd speaks 1)"}}\n`,
        );
      }
    });
  });
  await new Promise<void>((r) => server.listen(p, r));
  return { path: p, lines, close: () => new Promise<void>((r) => server.close(() => r())) };
}

/** Raw request lines on one connection; the answer lines, parsed. */
function exchange(p: string, lines: string[]): Promise<any[]> {
  return new Promise((resolve, reject) => {
    const s = net.createConnection({ path: p });
    let buf = '';
    const out: any[] = [];
    s.on('connect', () => s.write(lines.map((l) => l + '\n').join('')));
    s.on('data', (c) => {
      buf += c.toString();
      let nl;
      while ((nl = buf.indexOf('\n')) >= 0) {
        out.push(JSON.parse(buf.slice(0, nl)));
        buf = buf.slice(nl + 1);
      }
      if (out.length === lines.length) {
        s.destroy();
        resolve(out);
      }
    });
    s.on('error', reject);
  });
}

test('this release answers the request line of release 0.1.0\'s CNI executables (version 1), in version 1', async () => {
  const d = await daemon();
  try {
    // Exactly what ccd851b's call-core.ts writes.
    const [a] = await exchange(d.path, ['{"version":1,"id":"4242-m0-1","method":"ping","params":{"x":1}}']);
    assert.equal(a, { version: 1, id: '4242-m0-1', result: { pong: true, params: { x: 1 } } });
    assert.ok(MIN_PROTOCOL_VERSION <= 1 && PROTOCOL_VERSION >= 1, 'version 1 stays in the range while 0.1.0 is supported');
  } finally {
    await d.close();
  }
});

test('a daemon answers every version of its range, each in its own version, and refuses the rest naming the range and echoing the id', async () => {
  const d = await daemon({ min: 1, max: 3 });
  try {
    const a = await exchange(d.path, [1, 2, 3, 4, 0, '2'].map((v, i) => JSON.stringify({ version: v, id: `r${i}`, method: 'ping', params: {} })));
    assert.equal(a.slice(0, 3).map((x) => [x.version, x.id, x.result?.pong]), [[1, 'r0', true], [2, 'r1', true], [3, 'r2', true]]);
    for (const [i, x] of a.slice(3).entries()) {
      assert.is(x.error?.code, 'PROTOCOL_VERSION', JSON.stringify(x));
      assert.is(x.version, 3, 'a refusal names the highest version spoken');
      assert.is(x.id, `r${i + 3}`);
      assert.match(x.error.message, /tetherd speaks 1 to 3/);
    }
  } finally {
    await d.close();
  }
});

test('a refused version is logged, one warn line naming the version', async () => {
  const cap = captureLogger();
  const d = await daemon({ min: 1, max: 1 }, cap.logger);
  try {
    await exchange(d.path, [JSON.stringify({ version: 7, id: 'v', method: 'ping', params: {} }), JSON.stringify({ version: 1, id: 'w', method: 'ping', params: {} })]);
    await cap.settle();
    const warned = cap.lines.filter((l) => l.level === 'warn');
    assert.is(warned.length, 1, JSON.stringify(cap.lines));
    assert.match(warned[0].error, /protocol version 7 is not spoken here/);
  } finally {
    await d.close();
  }
});

test('a next-release client (version 2) falls back to version 1 with release 0.1.0\'s daemon, which refuses with id ""', async () => {
  const d = await daemon010();
  try {
    const r = await callWith<any>(nodeConnector, d.path, 'ping', { x: 2 }, { version: 2, minVersion: 1 });
    assert.equal(r, { pong: true, release: '0.1.0' });
    assert.equal(d.lines.map((l) => JSON.parse(l).version), [2, 1], 'asked in 2, then once in 1');
    assert.equal(JSON.parse(d.lines[1]).params, { x: 2 }, 'the same request');
  } finally {
    await d.close();
  }
});

test('this release\'s client works with release 0.1.0\'s daemon without a fallback', async () => {
  const d = await daemon010();
  try {
    assert.equal(await callWith<any>(nodeConnector, d.path, 'ping', {}), { pong: true, release: '0.1.0' });
    assert.equal(d.lines.map((l) => JSON.parse(l).version), [PROTOCOL_VERSION]);
  } finally {
    await d.close();
  }
});

test('a newer client falls back to the older version a daemon of this code speaks; the answer is in that version', async () => {
  const d = await daemon({ min: 1, max: 1 });
  try {
    const r = await callWith<any>(nodeConnector, d.path, 'ping', { y: 1 }, { version: 2, minVersion: 1 });
    assert.equal(r, { pong: true, params: { y: 1 } });
  } finally {
    await d.close();
  }
});

test('an older client (version 1) is answered by a newer daemon (1..2) in version 1', async () => {
  const d = await daemon({ min: 1, max: 2 });
  try {
    const [a] = await exchange(d.path, [JSON.stringify({ version: 1, id: 'o', method: 'ping', params: {} })]);
    assert.is(a.version, 1);
    assert.equal(await callWith<any>(nodeConnector, d.path, 'ping', {}, { version: 1, minVersion: 1 }), { pong: true, params: {} });
  } finally {
    await d.close();
  }
});

test('no fallback below the client\'s own minimum, and none upwards: a clear PROTOCOL_VERSION error', async () => {
  const old = await daemon({ min: 1, max: 1 });
  const newer = await daemon({ min: 3, max: 4 });
  try {
    const e1 = await callWith(nodeConnector, old.path, 'ping', {}, { version: 3, minVersion: 2 }).then(() => undefined, (e: unknown) => e);
    assert.ok(e1 instanceof TetherError, String(e1));
    assert.is(e1.code, 'PROTOCOL_VERSION');
    assert.match(e1.message, /protocol version 3 is not spoken here \(tetherd speaks 1\)/);
    const e2 = await callWith(nodeConnector, newer.path, 'ping', {}, { version: 2, minVersion: 1 }).then(() => undefined, (e: unknown) => e);
    assert.ok(e2 instanceof TetherError, String(e2));
    assert.is(e2.code, 'PROTOCOL_VERSION');
    assert.match(e2.message, /tetherd speaks 3 to 4/);
  } finally {
    await old.close();
    await newer.close();
  }
});

test.run();
