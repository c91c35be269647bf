// CNI conformance of the `tether` executable: every command × every supported version, plus bad input.
// Runs the built single executable against a real tetherd on a temp socket; none of the cases may leave
// state behind (tetherd's status and state dir are checked after each group).
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { execFileSync } from 'node:child_process';
import { bin } from '../lib/binaries';
import { runCni, type CniRun } from '../lib/cni-exec';
import { removeDaemonDir, startDaemon, type TestDaemon } from '../lib/daemon';

const VERSIONS = ['0.3.1', '0.4.0', '1.0.0', '1.1.0'];
let d: TestDaemon;

const prevResult = (v: string) => ({
  cniVersion: v,
  interfaces: [{ name: 'veth0', mac: '02:00:00:00:00:01' }, { name: 'eth0', sandbox: '/run/netns/none' }],
  ips: [{ ...(v.startsWith('0.') ? { version: '4' } : {}), address: '10.244.9.2/24', interface: 1 }],
});

function conf(v: string, extra: Record<string, unknown> = {}): string {
  return JSON.stringify({ cniVersion: v, name: 'tether-conformance', type: 'tether', socketPath: d.socket, ...extra });
}

function env(cmd: string, extra: Record<string, string | undefined> = {}) {
  return { CNI_COMMAND: cmd, CNI_CONTAINERID: 'ctr-conformance', CNI_NETNS: '/run/netns/tether-does-not-exist', CNI_IFNAME: 'eth0', CNI_PATH: '/usr/lib/cni', ...extra };
}

function expectError(r: CniRun, code: number, msgPart: RegExp, label: string) {
  assert.is.not(r.status, 0, `${label}: must exit non-zero`);
  assert.ok(r.json, `${label}: stdout must be JSON, got ${JSON.stringify(r.stdout)}`);
  assert.is(r.json!.code, code, `${label}: code (msg: ${r.json!.msg})`);
  assert.type(r.json!.msg, 'string');
  assert.match(String(r.json!.msg), msgPart, `${label}: msg`);
}

function assertNoState(label: string) {
  const status = JSON.parse(execFileSync(bin('tetherctl'), ['--socket', d.socket, 'status'], { encoding: 'utf8' }));
  assert.equal(status.pods, [], `${label}: tetherd still records pods`);
  const podsDir = path.join(d.stateDir, 'pods');
  assert.equal(fs.existsSync(podsDir) ? fs.readdirSync(podsDir) : [], [], `${label}: state dir not empty`);
}

test.before(async () => {
  d = await startDaemon();
});
test.after(async () => {
  await d?.stop();
  removeDaemonDir(d);
});

for (const v of VERSIONS) {
  test(`VERSION ${v}: lists all supported versions and echoes the asked one`, () => {
    const r = runCni(bin('tether'), { CNI_COMMAND: 'VERSION' }, JSON.stringify({ cniVersion: v }));
    assert.is(r.status, 0, r.stdout);
    assert.equal(r.json, { cniVersion: v, supportedVersions: VERSIONS });
  });

  test(`ADD ${v}: refuses to run without prevResult (code 7)`, () => {
    expectError(runCni(bin('tether'), env('ADD'), conf(v)), 7, /prevResult/, `ADD ${v}`);
  });

  test(`ADD ${v}: namespace that does not exist is reported, nothing recorded`, () => {
    const r = runCni(bin('tether'), env('ADD'), conf(v, { prevResult: prevResult(v) }));
    expectError(r, 102, /tether-does-not-exist/, `ADD ${v}`);
    assertNoState(`ADD ${v}`);
  });

  test(`ADD ${v}: invalid tether fields are named (code 7), nothing recorded`, () => {
    const r = runCni(bin('tether'), env('ADD'), conf(v, { prevResult: prevResult(v), vips: ['10.0.0.300'] }));
    expectError(r, 7, /vips\[0\]/, `ADD ${v} bad vip`);
    const r2 = runCni(bin('tether'), env('ADD'), conf(v, { prevResult: prevResult(v), encapOverhead: 'lots' }));
    expectError(r2, 7, /encapOverhead/, `ADD ${v} bad encapOverhead`);
    assertNoState(`ADD ${v} invalid`);
  });

  test(`DEL ${v}: succeeds for a container tether never saw and for an empty CNI_NETNS`, () => {
    const r = runCni(bin('tether'), env('DEL'), conf(v, { prevResult: prevResult(v) }));
    assert.is(r.status, 0, r.stdout);
    assert.is(r.stdout, '');
    const r2 = runCni(bin('tether'), env('DEL', { CNI_NETNS: undefined }), conf(v));
    assert.is(r2.status, 0, r2.stdout);
  });

  if (v === '0.3.1') {
    test(`CHECK ${v}: not part of that version (code 1)`, () => {
      expectError(runCni(bin('tether'), env('CHECK'), conf(v, { prevResult: prevResult(v) })), 1, /CHECK needs cniVersion 0\.4\.0/, 'CHECK 0.3.1');
    });
  } else {
    test(`CHECK ${v}: unknown container is code 3; without prevResult code 7`, () => {
      expectError(runCni(bin('tether'), env('CHECK'), conf(v, { prevResult: prevResult(v) })), 3, /not attached/, `CHECK ${v}`);
      expectError(runCni(bin('tether'), env('CHECK'), conf(v)), 7, /prevResult/, `CHECK ${v} no prevResult`);
    });
  }

  if (v === '1.1.0') {
    test('STATUS 1.1.0: ready daemon → exit 0, no output', () => {
      const r = runCni(bin('tether'), { CNI_COMMAND: 'STATUS', CNI_PATH: '/usr/lib/cni' }, conf(v));
      assert.is(r.status, 0, r.stdout);
      assert.is(r.stdout, '');
    });
    test('GC 1.1.0: with no attachments, nothing to remove → exit 0', () => {
      const r = runCni(bin('tether'), { CNI_COMMAND: 'GC', CNI_PATH: '/usr/lib/cni' }, conf(v, { 'cni.dev/valid-attachments': [{ containerID: 'x', ifname: 'eth0' }] }));
      assert.is(r.status, 0, r.stdout);
      expectError(
        runCni(bin('tether'), { CNI_COMMAND: 'GC' }, conf(v, { 'cni.dev/valid-attachments': [{ containerID: 1 }] })),
        7,
        /valid-attachments\[0\]/,
        'GC bad attachments',
      );
    });
  } else {
    test(`STATUS and GC ${v}: need cniVersion 1.1.0 (code 1)`, () => {
      expectError(runCni(bin('tether'), { CNI_COMMAND: 'STATUS' }, conf(v)), 1, /STATUS needs cniVersion 1\.1\.0/, `STATUS ${v}`);
      expectError(runCni(bin('tether'), { CNI_COMMAND: 'GC' }, conf(v)), 1, /GC needs cniVersion 1\.1\.0/, `GC ${v}`);
    });
  }

  test(`${v}: tetherd down → ADD/CHECK/GC code 11, STATUS code 50, DEL queued and answered with success`, () => {
    const queue = path.join(d.dir, 'down-queue');
    const down = JSON.stringify({ cniVersion: v, name: 'n', type: 'tether', socketPath: path.join(d.dir, 'nobody.sock'), deleteQueueDir: queue, prevResult: prevResult(v) });
    for (const cmd of ['ADD', 'DEL', 'CHECK', 'STATUS', 'GC']) {
      const r = runCni(bin('tether'), env(cmd), down);
      const needs = cmd === 'CHECK' ? '0.4.0' : cmd === 'STATUS' || cmd === 'GC' ? '1.1.0' : '0.0.0';
      if (v.localeCompare(needs, undefined, { numeric: true }) < 0) continue;
      if (cmd === 'DEL') {
        // The chain's DEL must go on to the primary plugin (test/cni/del-queue.test.ts covers the queue).
        assert.is(r.status, 0, `DEL ${v} down: ${r.stdout}`);
        assert.ok(fs.readdirSync(queue).some((n) => n.startsWith('cni.del:')), `DEL ${v} down: queued`);
        continue;
      }
      expectError(r, cmd === 'STATUS' ? 50 : 11, /tetherd is not reachable at .*nobody\.sock/, `${cmd} ${v} down`);
    }
  });
}

test('malformed JSON on stdin → code 6 naming the problem', () => {
  expectError(runCni(bin('tether'), env('ADD'), '{"cniVersion": "1.0.0", '), 6, /not valid JSON/, 'malformed');
  expectError(runCni(bin('tether'), env('ADD'), '[1,2]'), 6, /JSON object/, 'array');
  expectError(runCni(bin('tether'), { CNI_COMMAND: 'VERSION' }, '{nope'), 6, /not valid JSON/, 'VERSION malformed');
});

test('unsupported cniVersion → code 1 listing what is supported', () => {
  for (const v of ['0.2.0', '2.0.0', '1.0']) {
    const r = runCni(bin('tether'), env('ADD'), conf(v, { prevResult: prevResult('1.0.0') }));
    expectError(r, 1, new RegExp(`cniVersion ${v.replace('.', '\\.')} is not supported`), v);
    assert.match(String(r.json!.details), /0\.3\.1, 0\.4\.0, 1\.0\.0, 1\.1\.0/);
  }
});

test('missing or bad CNI_* variables → code 4 naming the variable', () => {
  // Without CNI_COMMAND (unset or empty) it is being run by hand: see test/cni/cli.test.ts.
  expectError(runCni(bin('tether'), env('FROB'), conf('1.0.0')), 4, /CNI_COMMAND 'FROB'/, 'bad command');
  for (const v of ['CNI_CONTAINERID', 'CNI_IFNAME', 'CNI_NETNS']) {
    expectError(runCni(bin('tether'), env('ADD', { [v]: undefined }), conf('1.0.0', { prevResult: prevResult('1.0.0') })), 4, new RegExp(`${v} is not set`), v);
  }
  expectError(runCni(bin('tether'), env('ADD', { CNI_ARGS: 'K8S_POD_NAME' }), conf('1.0.0', { prevResult: prevResult('1.0.0') })), 4, /CNI_ARGS entry "K8S_POD_NAME" is not KEY=VALUE/, 'CNI_ARGS');
});

test('missing name/type, bad socketPath → code 7', () => {
  expectError(runCni(bin('tether'), env('DEL'), JSON.stringify({ cniVersion: '1.0.0', type: 'tether' })), 7, /name: missing/, 'no name');
  expectError(runCni(bin('tether'), env('DEL'), JSON.stringify({ cniVersion: '1.0.0', name: 'n', type: 'tether', socketPath: 'relative.sock' })), 7, /socketPath/, 'relative socket');
});

test('a 3 MB request (multi-byte characters) reaches tetherd whole: written across many socket writes, answered', () => {
  // The socket takes a few hundred KB at a time: the rest of the request goes out as it drains.
  const pad = 'é'.repeat(1_500_000);
  const r = runCni(bin('tether'), env('DEL', { CNI_CONTAINERID: 'ctr-big' }), conf('1.0.0', { pad }));
  assert.is(r.status, 0, `DEL with a 3 MB config: ${r.stdout.slice(0, 300)}`);
  assert.is(r.stdout, '');
  // Over tetherd's line limit (4 MiB): tetherd refuses it, by name, rather than the client hanging.
  const tooBig = runCni(bin('tether'), env('DEL', { CNI_CONTAINERID: 'ctr-big' }), conf('1.0.0', { pad: 'x'.repeat(5 * 1024 * 1024) }));
  assert.is.not(tooBig.status, 0);
  assert.ok(tooBig.json, `stdout is a CNI error: ${tooBig.stdout.slice(0, 200)}`);
});

test('no case above left state behind', () => {
  assertNoState('final');
});

test.run();
