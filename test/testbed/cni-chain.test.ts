// The chain runner against fake plugins that record what they were given: proves the libcni contract
// (env, injected name/cniVersion, prevResult threading, DEL order and cache, CHECK, error parsing).
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { CniChain, CniError, Conflist } from './cni-chain';

interface Call {
  cmd: string;
  plugin: string;
  cid: string;
  netns: string;
  ifname: string;
  args: string;
  path: string;
  stdin: Record<string, unknown>;
}

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tb-chain-'));
const bin = path.join(dir, 'bin');
const log = path.join(dir, 'calls.jsonl');
fs.mkdirSync(bin);

// Each fake plugin appends one JSON line per call and prints a result naming itself.
function fakePlugin(name: string, body = ''): void {
  const script = `#!/bin/sh
in=$(cat)
printf '{"cmd":"%s","plugin":"%s","cid":"%s","netns":"%s","ifname":"%s","args":"%s","path":"%s","stdin":%s}\\n' \\
  "$CNI_COMMAND" "${name}" "$CNI_CONTAINERID" "$CNI_NETNS" "$CNI_IFNAME" "$CNI_ARGS" "$CNI_PATH" "$in" >> ${log}
${body}
printf '{"cniVersion":"1.0.0","ips":[{"address":"10.9.9.9/24"}],"by":"${name}"}'
`;
  fs.writeFileSync(path.join(bin, name), script, { mode: 0o755 });
}
fakePlugin('first');
fakePlugin('second');
fakePlugin('broken', `echo oops >&2; printf '{"cniVersion":"1.0.0","code":7,"msg":"bad conf","details":"field x"}'; exit 1`);
fakePlugin('crashy', 'echo segfault-ish >&2; exit 2');

const calls = (): Call[] =>
  fs.existsSync(log) ? fs.readFileSync(log, 'utf8').trim().split('\n').filter(Boolean).map((l) => JSON.parse(l) as Call) : [];

const list: Conflist = {
  cniVersion: '1.0.0',
  name: 'fake-net',
  plugins: [
    { type: 'first', cniVersion: '0.3.1', name: 'ignored', capabilities: { portMappings: true } },
    { type: 'second', extra: 42 },
  ],
};
const att = {
  containerId: 'c0ffee',
  netns: '/run/netns/fake',
  ifName: 'eth0',
  args: { IgnoreUnknown: '1', K8S_POD_NAMESPACE: 'ns1', K8S_POD_NAME: 'p1' },
  capabilityArgs: { portMappings: [{ hostPort: 80 }], bandwidth: {} },
};
const cache = path.join(dir, 'cache');

test.before.each(() => fs.rmSync(log, { force: true }));
test.after(() => fs.rmSync(dir, { recursive: true, force: true }));

test('ADD runs plugins in order with env, injected name/version and prevResult', async () => {
  const chain = new CniChain(list, { cniPath: ['/nonexistent', bin], cacheDir: cache });
  const out = await chain.add(att);
  const c = calls();
  assert.equal(c.map((x) => `${x.cmd}:${x.plugin}`), ['ADD:first', 'ADD:second']);
  assert.is(c[0].cid, 'c0ffee');
  assert.is(c[0].netns, '/run/netns/fake');
  assert.is(c[0].ifname, 'eth0');
  assert.is(c[0].args, 'IgnoreUnknown=1;K8S_POD_NAMESPACE=ns1;K8S_POD_NAME=p1');
  assert.is(c[0].path, `/nonexistent:${bin}`);
  assert.is(c[0].stdin.name, 'fake-net');
  assert.is(c[0].stdin.cniVersion, '1.0.0');
  assert.is(c[0].stdin.prevResult, undefined);
  assert.equal(c[0].stdin.runtimeConfig, { portMappings: [{ hostPort: 80 }] }, 'only declared capabilities');
  assert.is(c[1].stdin.runtimeConfig, undefined);
  assert.is((c[1].stdin.prevResult as { by: string }).by, 'first');
  assert.is(c[1].stdin.extra, 42);
  assert.is(out.result?.by, 'second');
  assert.is(out.invocations.length, 2);
  assert.ok(out.invocations.every((i) => i.ms > 0 && i.exitCode === 0));
  assert.ok(out.ms >= out.invocations[0].ms + out.invocations[1].ms);
  assert.is(chain.cachedResult(att)?.by, 'second');
});

test('CHECK runs in order with the cached result; DEL runs in reverse and drops the cache', async () => {
  const chain = new CniChain(list, { cniPath: [bin], cacheDir: cache });
  await chain.check(att);
  await chain.del(att);
  const c = calls();
  assert.equal(c.map((x) => `${x.cmd}:${x.plugin}`), ['CHECK:first', 'CHECK:second', 'DEL:second', 'DEL:first']);
  assert.ok(c.every((x) => (x.stdin.prevResult as { by: string }).by === 'second'));
  assert.is(chain.cachedResult(att), undefined);
  // A second DEL (runtimes retry) still runs, now without prevResult, like libcni with no cache.
  fs.rmSync(log, { force: true });
  await chain.del(att);
  assert.ok(calls().every((x) => x.stdin.prevResult === undefined));
  try {
    await chain.check(att);
    assert.unreachable('CHECK without a cached result must fail');
  } catch (e) {
    assert.match((e as Error).message, /no cached ADD result/);
  }
});

test('a plugin error becomes a typed CniError naming the plugin', async () => {
  const chain = new CniChain({ ...list, plugins: [{ type: 'first' }, { type: 'broken' }, { type: 'second' }] }, { cniPath: [bin], cacheDir: cache });
  try {
    await chain.add(att);
    assert.unreachable('ADD must fail');
  } catch (e) {
    assert.instance(e, CniError);
    const ce = e as CniError;
    assert.is(ce.plugin, 'broken');
    assert.is(ce.index, 1);
    assert.is(ce.command, 'ADD');
    assert.is(ce.code, 7);
    assert.is(ce.msg, 'bad conf');
    assert.is(ce.details, 'field x');
    assert.is(ce.exitCode, 1);
    assert.match(ce.stderr, /oops/);
    assert.is(ce.invocations.length, 2);
  }
  assert.equal(calls().map((x) => x.plugin), ['first', 'broken'], 'the chain stops at the failing plugin');
  assert.is(chain.cachedResult(att), undefined, 'a failed ADD caches nothing');
});

test('a plugin that prints no error JSON still yields a CniError with its stderr', async () => {
  const chain = new CniChain({ ...list, plugins: [{ type: 'crashy' }] }, { cniPath: [bin], cacheDir: cache });
  const e = await chain.del(att).then(
    () => undefined,
    (x: unknown) => x,
  );
  assert.instance(e, CniError);
  assert.is((e as CniError).code, -1);
  assert.is((e as CniError).exitCode, 2);
  assert.match((e as CniError).details ?? '', /segfault-ish/);
});

test('a missing plugin is reported by name', async () => {
  const chain = new CniChain({ ...list, plugins: [{ type: 'nope' }] }, { cniPath: [bin], cacheDir: cache });
  await chain.add(att).then(
    () => assert.unreachable('must fail'),
    (e: Error) => assert.match(e.message, /"nope" not found/),
  );
});

test.run();
