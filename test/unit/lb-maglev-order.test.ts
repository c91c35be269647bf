// Maglev targets in both families are indexed in address-byte order, so every node builds the same row for
// an IPv6 VIP; IPv4 rows are byte for byte the rows of the release before (numeric order), so an upgrade
// moves no flow. The digests below were taken from the release before's maglevTable and patchTable.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { createHash } from 'node:crypto';
import { compareTargets, maglevTable, patchTable } from '../../daemon/lb/maglev';

const M = 65537;
const V4 = ['10.244.3.17', '10.244.1.5', '10.244.12.9', '10.244.2.250', '10.0.0.1', '192.168.1.1', '10.244.1.40'];
const digest = (t: Int32Array) => createHash('sha256').update(Buffer.from(t.buffer, t.byteOffset, t.byteLength)).digest('hex');

test('an IPv4 row is byte-identical to the release before\'s (full table and a patched one)', () => {
  const t = maglevTable(V4, M);
  assert.equal(t.targets, ['10.0.0.1', '10.244.1.5', '10.244.1.40', '10.244.2.250', '10.244.3.17', '10.244.12.9', '192.168.1.1']);
  assert.is(digest(t.table), '919903272417cdb8941e5be703b214cb1a83daaf6f609e4034b956a19018b28b');
  const p = patchTable(maglevTable(V4.slice(0, 5), M), t, new Set(V4.slice(1, 5)));
  assert.is(digest(p.table), 'efa147d83073d907c206370b50fda34bd542ab84aee494c582ae3c5ac58684ef');
});

test('IPv6 targets sort by their bytes: the row does not depend on the order nodes list them in', () => {
  const v6 = ['fd00:10:244:2::5', 'fd00:10:244:1::1a', 'fd00:10:244:1::5', 'fd00:10:244:10::5', '2001:db8::1'];
  const want = ['2001:db8::1', 'fd00:10:244:1::5', 'fd00:10:244:1::1a', 'fd00:10:244:2::5', 'fd00:10:244:10::5'];
  const a = maglevTable(v6, 251);
  assert.equal(a.targets, want);
  for (const order of [[...v6].reverse(), [v6[2], v6[4], v6[0], v6[3], v6[1]]]) {
    const b = maglevTable(order, 251);
    assert.equal(b.targets, want);
    assert.equal([...b.table], [...a.table]);
  }
  // Every target owns entries (text order would put ::1a before ::5; value order is what counts here).
  for (let i = 0; i < want.length; i++) assert.ok(a.table.includes(i), `target ${want[i]} has entries`);
  assert.ok(compareTargets('10.0.0.1', '::1') < 0, 'IPv4 before IPv6');
  assert.ok(compareTargets('fd00::2', 'fd00::10') < 0);
});

test.run();
