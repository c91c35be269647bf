// The file config source: the first load, edits applied without a restart (in place and by rename, as
// editors and config tools write), an invalid edit refused whole with its reasons while the running
// configuration stays, transition rules checked against the configuration in force, and no event after stop.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { FileSource, serialApply } from '../../daemon/config/source';
import type { ConfigObjects } from '../../daemon/config/objects';
import { Writable } from 'node:stream';
import { makeLogger } from '../../daemon/log';

const logger = makeLogger({ level: 'error', node: 'test', stream: new Writable({ write: (_c, _e, cb) => cb() }) });
const POOL = (name: string, cidr: string, usage = 'floating') =>
  `apiVersion: tether.dev/v1alpha1\nkind: AddressPool\nmetadata: { name: ${name} }\nspec: { usage: ${usage}, ipv4: { cidr: ${cidr} } }\n`;

function tmpDir(): string {
  return fs.mkdtempSync(path.join(os.tmpdir(), 'tether-source-'));
}

function next<T>(src: FileSource, event: 'update' | 'rejected', timeoutMs = 5000): Promise<T> {
  return new Promise((resolve, reject) => {
    const t = setTimeout(() => reject(new Error(`no ${event} within ${timeoutMs} ms`)), timeoutMs);
    src.once(event, (v: T) => {
      clearTimeout(t);
      resolve(v);
    });
  });
}

test('edits in place and by rename are applied; identical text is not an update', async () => {
  const dir = tmpDir();
  const file = path.join(dir, 'tether.yaml');
  fs.writeFileSync(file, POOL('a', '10.1.0.0/24'));
  const src = new FileSource(file, logger);
  try {
    const first = await src.start();
    assert.equal(first.pools.map((p) => p.name), ['a']);
    let updates = 0;
    src.on('update', () => updates++);
    const inPlace = next<ConfigObjects>(src, 'update');
    fs.writeFileSync(file, POOL('a', '10.1.0.0/24') + '---\n' + POOL('b', '10.2.0.0/24'));
    assert.equal((await inPlace).pools.map((p) => p.name), ['a', 'b']);
    const renamed = next<ConfigObjects>(src, 'update');
    fs.writeFileSync(path.join(dir, '.tmp'), POOL('b', '10.2.0.0/24'));
    fs.renameSync(path.join(dir, '.tmp'), file);
    assert.equal((await renamed).pools.map((p) => p.name), ['b']);
    const before = updates;
    fs.writeFileSync(file, POOL('b', '10.2.0.0/24'));
    await new Promise((r) => setTimeout(r, 400));
    assert.is(updates, before, 'the same text again is no update');
  } finally {
    await src.stop();
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test('an invalid edit is refused whole with every reason; a later valid edit applies', async () => {
  const dir = tmpDir();
  const file = path.join(dir, 'tether.yaml');
  fs.writeFileSync(file, POOL('a', '10.1.0.0/24'));
  const src = new FileSource(file, logger);
  try {
    await src.start();
    const updates: ConfigObjects[] = [];
    src.on('update', (c: ConfigObjects) => updates.push(c));
    // One good new pool, one broken: nothing of it applies.
    const rejected = next<string[]>(src, 'rejected');
    fs.writeFileSync(file, POOL('a', '10.1.0.0/24') + '---\n' + POOL('b', '10.2.0.0/24') + '---\n' + POOL('c', '10.3.0.5/24'));
    const problems = await rejected;
    assert.is(problems.length, 1);
    assert.match(problems[0], /document 3: AddressPool "c": spec\.ipv4\.cidr "10\.3\.0\.5\/24" is not a network address/);
    assert.is(updates.length, 0, 'the good pool b did not apply either');
    // Transition rule against the configuration in force: pool a may not change its usage.
    const immutable = next<string[]>(src, 'rejected');
    fs.writeFileSync(file, POOL('a', '10.1.0.0/24', 'loadBalancer'));
    assert.match((await immutable).join('\n'), /AddressPool "a": spec: usage is immutable/);
    const ok = next<ConfigObjects>(src, 'update');
    fs.writeFileSync(file, POOL('a', '10.1.0.0/24') + '---\n' + POOL('b', '10.2.0.0/24'));
    assert.equal((await ok).pools.map((p) => p.name), ['a', 'b']);
  } finally {
    await src.stop();
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test('a broken file at start is an error naming the problem; no event after stop', async () => {
  const dir = tmpDir();
  const file = path.join(dir, 'tether.yaml');
  fs.writeFileSync(file, 'kind: [broken\n');
  const bad = new FileSource(file, logger);
  try {
    await bad.start();
    assert.unreachable('a broken file must not start');
  } catch (e) {
    assert.match((e as Error).message, /tether\.yaml document 1: /);
  } finally {
    await bad.stop();
  }
  fs.writeFileSync(file, POOL('a', '10.1.0.0/24'));
  const src = new FileSource(file, logger);
  await src.start();
  let updates = 0;
  src.on('update', () => updates++);
  await src.stop();
  fs.writeFileSync(file, POOL('z', '10.9.0.0/24'));
  await new Promise((r) => setTimeout(r, 400));
  assert.is(updates, 0);
  fs.rmSync(dir, { recursive: true, force: true });
});

test('serialApply: one change at a time, in order; a newer change replaces one still waiting', async () => {
  const seen: string[] = [];
  let release!: () => void;
  const gate = new Promise<void>((r) => (release = r));
  const apply = serialApply(async (c) => {
    seen.push(c.pools.map((p) => p.name).join());
    if (seen.length === 1) await gate;
  }, () => {});
  const cfg = (n: string) => ({ pools: [{ name: n }], nodes: {}, others: [] }) as unknown as ConfigObjects;
  apply(cfg('1'));
  apply(cfg('2'));
  apply(cfg('3'));
  release();
  await new Promise((r) => setTimeout(r, 20));
  assert.equal(seen, ['1', '3']);
});

test.run();
