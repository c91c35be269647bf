// CNI input the spec constrains, rejected with the spec's code and the field named: by the thin clients
// (the built tether and tether-ipam) and again by tetherd for requests that bypass them (raw socket). No
// rejected request leaves a record behind, and pod records have fixed-length file names whatever the input.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import * as fs from 'node:fs';
import * as net from 'node:net';
import * as path from 'node:path';
import { bin } from '../lib/binaries';
import { runCni } from '../lib/cni-exec';
import { removeDaemonDir, startDaemon, type TestDaemon } from '../lib/daemon';

let d: TestDaemon;
test.before(async () => {
  d = await startDaemon();
});
test.after(async () => {
  await d?.stop('SIGTERM');
  if (d) removeDaemonDir(d);
});

const prevResult = { cniVersion: '1.0.0', interfaces: [{ name: 'eth0', sandbox: '/run/netns/none' }], ips: [{ address: '10.244.9.2/24', interface: 0 }] };
const conf = (extra: Record<string, unknown> = {}) => ({ cniVersion: '1.0.0', name: 'tether-validation', type: 'tether', socketPath: d.socket, prevResult, ipam: { type: 'tether-ipam', pool: 'default', socketPath: d.socket }, ...extra });
const env = (cmd: string, extra: Record<string, string | undefined> = {}): Record<string, string | undefined> => ({ CNI_COMMAND: cmd, CNI_CONTAINERID: 'ctr-validation', CNI_NETNS: '/run/netns/tether-validation-none', CNI_IFNAME: 'eth0', CNI_PATH: '/usr/lib/cni', ...extra });

/** [label, env overrides, config overrides, CNI code, message pattern] */
const CASES: Array<[string, Record<string, string | undefined>, Record<string, unknown>, number, RegExp]> = [
  ['network name of 100,000 characters', {}, { name: 'n'.repeat(100_000) }, 7, /^name: "n{40}"… \(100000 characters\) is longer than 255/],
  ['network name with a slash', {}, { name: 'a/b' }, 7, /^name: "a\/b" must start with a letter or digit and contain only/],
  ['network name starting with a dot', {}, { name: '.hidden' }, 7, /^name: "\.hidden"/],
  ['container ID with a slash', { CNI_CONTAINERID: '../../etc' }, {}, 4, /^CNI_CONTAINERID "\.\.\/\.\.\/etc" must start with a letter or digit/],
  ['container ID of 300 characters', { CNI_CONTAINERID: 'c'.repeat(300) }, {}, 4, /^CNI_CONTAINERID .* is longer than 255 characters/],
  ['CNI_IFNAME of 16 bytes', { CNI_IFNAME: 'abcdefghijklmnop' }, {}, 4, /^CNI_IFNAME "abcdefghijklmnop" is longer than 15 bytes/],
  ['CNI_IFNAME of 15 characters but 16 bytes', { CNI_IFNAME: 'é'.repeat(8) }, {}, 4, /^CNI_IFNAME .* is longer than 15 bytes/],
  ['CNI_IFNAME "."', { CNI_IFNAME: '.' }, {}, 4, /^CNI_IFNAME "\." is not a valid interface name/],
  ['CNI_IFNAME ".."', { CNI_IFNAME: '..' }, {}, 4, /^CNI_IFNAME "\.\." is not a valid interface name/],
  ['CNI_IFNAME with a slash', { CNI_IFNAME: 'a/b' }, {}, 4, /^CNI_IFNAME "a\/b" contains '\/'/],
  ['CNI_IFNAME with a colon', { CNI_IFNAME: 'eth0:1' }, {}, 4, /^CNI_IFNAME "eth0:1" contains ':'/],
  ['CNI_IFNAME with whitespace', { CNI_IFNAME: 'eth 0' }, {}, 4, /^CNI_IFNAME "eth 0" contains whitespace/],
  ['CNI_NETNS relative', { CNI_NETNS: 'run/netns/x' }, {}, 4, /^CNI_NETNS "run\/netns\/x" is not an absolute path/],
  ['CNI_ARGS without =', { CNI_ARGS: 'IgnoreUnknown=1;K8S_POD_NAME' }, {}, 4, /^CNI_ARGS entry "K8S_POD_NAME" is not KEY=VALUE/],
  ['CNI_ARGS with an empty key', { CNI_ARGS: '=x' }, {}, 4, /^CNI_ARGS entry "=x" has an empty key/],
];

function podFiles(): string[] {
  const dir = path.join(d.stateDir, 'pods');
  return fs.existsSync(dir) ? fs.readdirSync(dir) : [];
}

for (const plugin of ['tether', 'tether-ipam'] as const) {
  test(`${plugin}: each malformed input is refused with the spec's code, naming the field`, () => {
    for (const [label, e, c, code, msg] of CASES) {
      for (const cmd of ['ADD', 'DEL', 'CHECK']) {
        const r = runCni(bin(plugin), env(cmd, e), JSON.stringify(conf(c)));
        assert.is.not(r.status, 0, `${plugin} ${cmd} ${label}: must fail`);
        assert.ok(r.json, `${plugin} ${cmd} ${label}: a CNI error on stdout, got ${r.stdout.slice(0, 200)}`);
        assert.is(r.json!.code, code, `${plugin} ${cmd} ${label}: code (msg ${r.json!.msg})`);
        assert.match(String(r.json!.msg), msg, `${plugin} ${cmd} ${label}: msg`);
      }
    }
  });
}

test('DEL may come without CNI_NETNS; ADD may not', () => {
  const del = runCni(bin('tether'), env('DEL', { CNI_NETNS: undefined }), JSON.stringify(conf()));
  assert.is(del.status, 0, del.stdout);
  const add = runCni(bin('tether'), env('ADD', { CNI_NETNS: undefined }), JSON.stringify(conf()));
  assert.is(add.json?.code, 4);
  assert.match(String(add.json?.msg), /CNI_NETNS is not set/);
});

/** One request straight to tetherd's socket, as a client that skipped the checks would send it. */
function raw(method: string, params: Record<string, unknown>): Promise<any> {
  return new Promise((resolve, reject) => {
    const s = net.createConnection({ path: d.socket });
    let buf = '';
    s.on('connect', () => s.write(JSON.stringify({ version: 1, id: 'v', method, params }) + '\n'));
    s.on('data', (b) => {
      buf += b.toString();
      const nl = buf.indexOf('\n');
      if (nl >= 0) {
        s.destroy();
        resolve(JSON.parse(buf.slice(0, nl)));
      }
    });
    s.on('error', reject);
  });
}

test('tetherd refuses the same input from a client that bypassed the checks', async () => {
  for (const [label, e, c, , msg] of CASES) {
    const ev = env('ADD', e);
    const params = { command: 'ADD', containerId: ev.CNI_CONTAINERID, ifName: ev.CNI_IFNAME, netns: ev.CNI_NETNS, args: Object.fromEntries((ev.CNI_ARGS ?? '').split(';').filter(Boolean).map((p: string) => [p.split('=')[0], p.split('=').slice(1).join('=')])), config: conf(c) };
    if (label.startsWith('CNI_ARGS')) continue; // the clients parse CNI_ARGS; tetherd receives an object (below)
    for (const method of ['cni.add', 'ipam.add']) {
      const a = await raw(method, params);
      assert.ok(a.error, `${method} ${label}: refused, got ${JSON.stringify(a).slice(0, 200)}`);
      assert.match(String(a.error.message), msg, `${method} ${label}`);
      assert.is(a.error.code, label.startsWith('network') ? 'INVALID_CONFIG' : 'INVALID_ENVIRONMENT', `${method} ${label}: code`);
    }
  }
  const a = await raw('cni.add', { command: 'ADD', containerId: 'ctr-validation', ifName: 'eth0', netns: '/run/netns/x', args: { '': 'x' }, config: conf() });
  assert.match(String(a.error?.message), /CNI_ARGS entry ""/);
  assert.equal(podFiles(), [], 'no refused request left a pod record');
});

test.run();
