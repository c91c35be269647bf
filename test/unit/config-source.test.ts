// The file config source: the first load, edits applied without a restart (in place and by rename, as
// editors and config tools write), an invalid edit refused whole with its reasons while the running
// configuration stays, transition rules checked against the configuration in force, and no event after stop.
// What a write or a save leaves on the way is not the operator's intent: an empty file, one cut short and
// one that is gone for a moment change nothing (one warn line each); an empty List is "no objects" on purpose.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { feedResolved, FileSource, serialApply } from '../../daemon/config/source';
import { objectKey } from '../../daemon/config/objects';
import type { ConfigObjects } from '../../daemon/config/objects';
import { Writable } from 'node:stream';
import { makeLogger } from '../../lib/log';
import { captureLogger } from '../lib/log-capture';
import { SourcePart } from '../../daemon/parts/source';
import { Lifecycle } from '../../daemon/lifecycle';
import { parseOptions } from '../../daemon/options';

const logger = makeLogger({ level: 'error', node: 'test', stream: new Writable({ write: (_c, _e, cb) => cb() }) });
const POOL = (name: string, cidr: string, usage = 'floating') =>
  `apiVersion: tether.dev/v1alpha1\nkind: AddressPool\nmetadata: { name: ${name} }\nspec: { usage: ${usage}, ipv4: { cidr: ${cidr} } }\n`;

const EMPTY_LIST = 'apiVersion: v1\nkind: List\nitems: []\n';
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

const capture = captureLogger;

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
    assert.match((await immutable).join('\n'), /AddressPool "a": spec\.usage: usage is immutable/);
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

test('an empty file written live is refused: the objects in force stay applied, one warn line each names the file and the explicit form', async () => {
  const dir = tmpDir();
  const file = path.join(dir, 'tether.yaml');
  const inForce = POOL('a', '10.1.0.0/24') + '---\n' + POOL('b', '10.2.0.0/24');
  fs.writeFileSync(file, inForce);
  const { logger: log, lines } = capture();
  const src = new FileSource(file, log);
  const applied: string[][] = [];
  try {
    await src.start();
    // The live path tetherd runs: every accepted configuration goes to the reconcilers (Egress, LB…).
    const feed = feedResolved(src, (c) => c, [{ name: 'recorder', apply: (c) => void applied.push(c.pools.map((p) => p.name)) }], log);
    const empties: Array<[string, () => void]> = [
      ['zero bytes (truncated)', () => fs.truncateSync(file, 0)],
      ['whitespace', () => fs.writeFileSync(file, '  \n\n')],
      ['comments only', () => fs.writeFileSync(file, '# tether objects\n# (being edited)\n')],
      ['a stream with no objects', () => fs.writeFileSync(file, '---\n# none\n---\n')],
    ];
    for (const [what, write] of empties) {
      const rejected = next<string[]>(src, 'rejected');
      write();
      const problems = await rejected.catch((e) => assert.unreachable(`${what}: ${(e as Error).message}`));
      assert.match(problems!.join('\n'), /tether\.yaml holds no objects/, what);
    }
    // Past one periodic check: a refused text is not refused (nor logged) again.
    await sleep(2300);
    const warns = lines.filter((l) => l.level === 'warn' && /holds no objects/.test(l.message));
    assert.is(warns.length, empties.length, warns.map((w) => w.message).join('\n'));
    assert.ok(warns[0].message.startsWith(`config: ${file} holds no objects (`), warns[0].message);
    assert.match(warns[0].message, /; refused, the running configuration stays\. To have no objects on purpose, write `apiVersion: v1` \/ `kind: List` \/ `items: \[\]`$/);
    assert.is(warns[0].file, file);
    assert.equal(applied, [], 'nothing was applied: the pools (and every Egress) stay as they were');
    // The text in force again is no change; a real edit applies.
    fs.writeFileSync(file, inForce);
    await sleep(400);
    assert.equal(applied, []);
    fs.writeFileSync(file, POOL('a', '10.1.0.0/24'));
    const until = Date.now() + 5000;
    while (applied.length === 0 && Date.now() < until) await sleep(20);
    assert.equal(applied, [['a']]);
    await feed.stop();
  } finally {
    await src.stop();
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test('"no objects" on purpose: an empty List applies as empty, live and at start; an empty file at start is refused naming the explicit form', async () => {
  const dir = tmpDir();
  const file = path.join(dir, 'tether.yaml');
  try {
    for (const text of ['', '\n', '# nothing yet\n', '{}\n', 'nodes: {}\n']) {
      fs.writeFileSync(file, text);
      const s = new FileSource(file, logger);
      try {
        await s.start();
        assert.unreachable(`${JSON.stringify(text)} must not start`);
      } catch (e) {
        assert.match((e as Error).message, /tether\.yaml holds no objects .*refused\. To have no objects on purpose, write `apiVersion: v1` \/ `kind: List` \/ `items: \[\]`/, JSON.stringify(text));
      } finally {
        await s.stop();
      }
    }
    for (const text of [EMPTY_LIST, '{"apiVersion":"v1","kind":"List","items":[]}', '# on purpose\n---\napiVersion: v1\nkind: List\nitems: []\n']) {
      fs.writeFileSync(file, text);
      const s = new FileSource(file, logger);
      const c = await s.start();
      await s.stop();
      assert.equal([c.pools.length, Object.keys(c.nodes).length, c.others.length], [0, 0, 0], JSON.stringify(text));
    }
    fs.writeFileSync(file, POOL('a', '10.1.0.0/24'));
    const src = new FileSource(file, logger);
    try {
      await src.start();
      const update = next<ConfigObjects>(src, 'update');
      fs.writeFileSync(file, EMPTY_LIST);
      assert.equal((await update).pools, []);
    } finally {
      await src.stop();
    }
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

// The example objects: three pools, two Nodes and an Egress, block-style YAML as people write it.
const EXAMPLE = fs.readFileSync(path.join(__dirname, '../../conf/pools.yaml'), 'utf8') + '---\n' + fs.readFileSync(path.join(__dirname, '../../conf/egress.yaml'), 'utf8');

test('a file truncated mid-document is refused (cut mid-line, or unparsable); the objects in force stay', async () => {
  const dir = tmpDir();
  const file = path.join(dir, 'tether.yaml');
  fs.writeFileSync(file, EXAMPLE + '---\n' + POOL('flow', '10.3.0.0/24'));
  const src = new FileSource(file, logger);
  try {
    const first = await src.start();
    const updates: ConfigObjects[] = [];
    src.on('update', (c: ConfigObjects) => updates.push(c));
    // Real truncations of the file in place, each shorter than the last. Before the cut-short rule the
    // first three were applied: an Egress on pool "floati", a pool without its IPv6 half, Node "no".
    const at = (marker: string, keep: number) => EXAMPLE.indexOf(marker) + keep;
    const cuts: Array<[string, number, RegExp]> = [
      ['inside a flow mapping', EXAMPLE.length + '---\n'.length + POOL('flow', '10.3.0.0/24').indexOf('cidr') + 2, /document 7: /],
      ['in a value, last document', at('pool: floating', 'pool: floati'.length), /looks cut short: its last line does not end with a newline/],
      ['in a Node name', at('name: node-2', 'name: no'.length), /looks cut short/],
      // The pool left without its blockSize and IPv6 half: refused against the pool in force (a family is
      // immutable once set), before the cut-short check.
      ['in the indentation before a field', at('cidr: 10.244.0.0/16\n', 'cidr: 10.244.0.0/16\n    '.length), /AddressPool "default": spec\.ipv6: ipv6 cannot be removed once set/],
      ['in the opening comment', 3, /holds no objects/],
    ];
    for (const [what, length, reason] of cuts) {
      const rejected = next<string[]>(src, 'rejected');
      fs.truncateSync(file, length);
      const problems = await rejected.catch((e) => assert.unreachable(`${what}: ${(e as Error).message}`));
      assert.match(problems!.join('\n'), reason, what);
    }
    assert.is(updates.length, 0, 'nothing of a cut file was applied');
    // The same file whole again applies (it is what is in force: no change), and a whole edit applies.
    const ok = next<ConfigObjects>(src, 'update');
    fs.writeFileSync(file, EXAMPLE);
    assert.equal((await ok).pools.map((p) => p.name), first.pools.map((p) => p.name).filter((n) => n !== 'flow'));
  } finally {
    await src.stop();
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test('every cut of the example file that does not end a line is refused at start; a cut at a line end loses whole lines only', async () => {
  const dir = tmpDir();
  const file = path.join(dir, 'tether.yaml');
  const whole = new Map<string, string>();
  const s0 = new FileSource((fs.writeFileSync(file, EXAMPLE), file), logger);
  const full = await s0.start();
  await s0.stop();
  for (const o of [...full.pools.map((p) => p.source as unknown as Record<string, unknown>), ...full.others]) whole.set(objectKey(o), JSON.stringify(o));
  const acceptedMidLine: string[] = [];
  let atLineEnd = 0;
  let changedAtLineEnd = 0;
  try {
    for (let n = 0; n < EXAMPLE.length; n++) {
      fs.writeFileSync(file, EXAMPLE.slice(0, n));
      const s = new FileSource(file, logger);
      let c: ConfigObjects | undefined;
      try {
        c = await s.start();
      } catch {
        // refused
      } finally {
        await s.stop();
      }
      if (!c) continue;
      if (EXAMPLE[n - 1] !== '\n') {
        acceptedMidLine.push(JSON.stringify(EXAMPLE.slice(Math.max(0, n - 30), n)));
        continue;
      }
      atLineEnd++;
      const objects = [...c.pools.map((p) => p.source as unknown as Record<string, unknown>), ...c.others];
      const nodesSame = Object.entries(c.nodes).every(([k, v]) => JSON.stringify(v) === JSON.stringify(full.nodes[k]));
      if (!nodesSame || objects.some((o) => whole.get(objectKey(o)) !== JSON.stringify(o))) changedAtLineEnd++;
    }
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
  assert.is(acceptedMidLine.length, 0, `a cut inside a line is never applied; applied: ${acceptedMidLine.slice(0, 5).join(', ')}…`);
  // What remains: a cut right after a whole line, before the object's optional trailing fields.
  console.log(`  ${EXAMPLE.length} cut points: ${atLineEnd} at a line end accepted, ${changedAtLineEnd} of them with an object missing optional trailing fields`);
});

test('a file that is gone mid-save (renamed away, then written anew) changes nothing until it is back: one warn line', async () => {
  const dir = tmpDir();
  const file = path.join(dir, 'tether.yaml');
  fs.writeFileSync(file, POOL('a', '10.1.0.0/24'));
  const { logger: log, lines } = capture();
  const src = new FileSource(file, log);
  try {
    await src.start();
    const updates: ConfigObjects[] = [];
    src.on('update', (c: ConfigObjects) => updates.push(c));
    // An editor's save: the old file renamed to a backup, a new one created (empty at first), then written.
    fs.renameSync(file, `${file}~`);
    await sleep(2300); // past the settle and one periodic check
    assert.is(updates.length, 0, 'a file that is gone deletes nothing');
    const gone = lines.filter((l) => l.level === 'warn' && /is gone/.test(l.message));
    assert.is(gone.length, 1, 'logged once, not on every check');
    assert.match(gone[0].message, /tether\.yaml is gone; the running configuration stays until the file is back \(deleting it removes nothing: to remove every object, write `apiVersion: v1` \/ `kind: List` \/ `items: \[\]`\)/);
    const rejected = next<string[]>(src, 'rejected');
    fs.closeSync(fs.openSync(file, 'w'));
    assert.match((await rejected).join(), /holds no objects/);
    const update = next<ConfigObjects>(src, 'update');
    fs.writeFileSync(file, POOL('a', '10.1.0.0/24') + '---\n' + POOL('b', '10.2.0.0/24'));
    assert.equal((await update).pools.map((p) => p.name), ['a', 'b']);
    assert.ok(lines.some((l) => l.level === 'info' && l.message === 'config: the file can be read again' && l.was === 'ENOENT'));
    // Deleted, then back with the text in force: nothing to apply.
    fs.rmSync(file);
    await sleep(300);
    fs.writeFileSync(file, POOL('a', '10.1.0.0/24') + '---\n' + POOL('b', '10.2.0.0/24'));
    await sleep(400);
    assert.is(updates.length, 1);
  } finally {
    await src.stop();
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test('a YAML parse error keeps the configuration in force; undoing the edit is no change', async () => {
  const dir = tmpDir();
  const file = path.join(dir, 'tether.yaml');
  const inForce = POOL('a', '10.1.0.0/24');
  fs.writeFileSync(file, inForce);
  const src = new FileSource(file, logger);
  try {
    await src.start();
    const updates: ConfigObjects[] = [];
    src.on('update', (c: ConfigObjects) => updates.push(c));
    const rejected = next<string[]>(src, 'rejected');
    fs.writeFileSync(file, inForce + '---\nkind: [broken\n');
    assert.match((await rejected).join('\n'), /tether\.yaml document 2: /);
    fs.writeFileSync(file, inForce);
    await sleep(400);
    assert.is(updates.length, 0, 'neither the broken text nor the text in force again is an update');
    const ok = next<ConfigObjects>(src, 'update');
    fs.writeFileSync(file, POOL('b', '10.2.0.0/24'));
    assert.equal((await ok).pools.map((p) => p.name), ['b']);
  } finally {
    await src.stop();
    fs.rmSync(dir, { recursive: true, force: true });
  }
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


test('an update that comes while the parts start (before the feed subscribes) is held and applied when the feed starts, not lost', async () => {
  const dir = tmpDir();
  const file = path.join(dir, 'tether.yaml');
  fs.writeFileSync(file, POOL('a', '10.1.0.0/24'));
  const life = new Lifecycle(logger);
  try {
    const part = new SourcePart(parseOptions(['--config', file, '--node-name', 'n1']), 'n1', logger);
    await life.start((async function* () {
      yield part;
    })());
    const { source, config, takeMissed } = part;
    assert.equal(config.pools.map((p) => p.name), ['a']);
    // tetherd starts its parts from `config` now; meanwhile the configuration changes (seen in the cluster:
    // a Pod object arriving just then, its pod left without its roles until an unrelated update).
    const seen = next<ConfigObjects>(source as FileSource, 'update');
    fs.writeFileSync(file, POOL('a', '10.1.0.0/24') + '---\n' + POOL('b', '10.2.0.0/24'));
    await seen;
    const applied: string[][] = [];
    const feed = feedResolved(source, (c) => c, [{ name: 'recorder', apply: (c) => void applied.push(c.pools.map((p) => p.name)) }], logger, takeMissed);
    for (let i = 0; i < 50 && !applied.length; i++) await sleep(10);
    await feed.stop();
    assert.equal(applied, [['a', 'b']], 'the change made before the feed subscribed reaches the reconcilers');
    assert.is(takeMissed(), undefined, 'held once');
  } finally {
    await life.stopAll();
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test.run();
