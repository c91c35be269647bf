// `tether-ipam` as a runtime's primary plugin runs it: the built executable against a real tetherd and a
// real Redis. Results per CNI version, DEL/CHECK/GC, and bad input: every bad config gets the right code and
// a message naming the field, and nothing stays allocated after a failure.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { execFileSync } from 'node:child_process';
import { bin } from '../lib/binaries';
import { runCni, type CniRun } from '../lib/cni-exec';
import { removeDaemonDir, startDaemon, type TestDaemon } from '../lib/daemon';
import { startRedis, type TestRedis } from '../lib/redis';

let redis: TestRedis;
let d: TestDaemon;

const POOLS = `
apiVersion: tether.dev/v1alpha1
kind: AddressPool
metadata: { name: default }
spec: { usage: pod, ipv4: { cidr: 10.70.0.0/24, blockSize: 28 }, ipv6: { cidr: "fd00:70::/120", blockSize: 124 } }
---
apiVersion: tether.dev/v1alpha1
kind: AddressPool
metadata: { name: tiny }
spec: { usage: pod, ipv4: { cidr: 10.71.0.0/29, blockSize: 29 }, ipv6: { cidr: "fd00:71::/126", blockSize: 126 } }
---
apiVersion: tether.dev/v1alpha1
kind: AddressPool
metadata: { name: v4only }
spec: { usage: pod, ipv4: { cidr: 10.72.0.0/29, blockSize: 29 } }
---
apiVersion: tether.dev/v1alpha1
kind: AddressPool
metadata: { name: float }
spec: { usage: floating, ipv4: { cidr: 198.51.100.0/29 } }
`;

function conf(version: string, ipam: Record<string, unknown> | undefined, extra: Record<string, unknown> = {}): string {
  return JSON.stringify({ cniVersion: version, name: 'ipamnet', type: 'ptp', ...(ipam ? { ipam: { type: 'tether-ipam', socketPath: d.socket, ...ipam } } : {}), ...extra });
}
function env(cmd: string, id: string, extra: Record<string, string | undefined> = {}) {
  return { CNI_COMMAND: cmd, CNI_CONTAINERID: id, CNI_NETNS: '/proc/self/ns/net', CNI_IFNAME: 'eth0', CNI_PATH: '/usr/lib/cni', CNI_ARGS: `IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=${id}`, ...extra };
}
const ipam = (cmd: string, id: string, stdin: string, extra: Record<string, string | undefined> = {}) => runCni(bin('tether-ipam'), env(cmd, id, extra), stdin);

function expectError(r: CniRun, code: number, msg: RegExp) {
  assert.is.not(r.status, 0, r.stdout);
  assert.is(r.json?.code, code, `code for ${r.stdout}`);
  assert.match(String(r.json?.msg), msg);
}

function usage(): any[] {
  return JSON.parse(execFileSync(bin('tetherctl'), ['--socket', d.socket, 'status'], { encoding: 'utf8' })).ipam.pods;
}
function allocated(pool: string): number {
  return usage().find((p) => p.pool === pool).families.reduce((n: number, f: any) => n + f.allocated, 0);
}

test.before(async () => {
  redis = await startRedis();
  const dir = fs.mkdtempSync('/tmp/tether-ipam-cni-');
  fs.writeFileSync(path.join(dir, 'pools.yaml'), POOLS);
  d = await startDaemon({ dir, extraArgs: ['--config', path.join(dir, 'pools.yaml'), '--redis', redis.url] });
});
test.after(async () => {
  await d?.stop();
  if (d) removeDaemonDir(d);
  await redis?.stop();
});

for (const version of ['0.3.1', '0.4.0', '1.0.0', '1.1.0']) {
  test(`${version}: ADD gives a dual-stack result in the version's format; ADD again is the same; CHECK; DEL frees`, () => {
    const id = `ctr-${version}`;
    const stdin = conf(version, { pool: 'default', routes: [{ dst: '0.0.0.0/0' }], dns: { nameservers: ['10.96.0.10'] } });
    const r = ipam('ADD', id, stdin);
    assert.is(r.status, 0, r.stdout);
    const res = r.json as any;
    assert.is(res.cniVersion, version);
    assert.is(res.ips.length, 2);
    const legacy = version.startsWith('0.');
    assert.equal(res.ips.map((i: any) => i.version), legacy ? ['4', '6'] : [undefined, undefined]);
    assert.match(res.ips[0].address, /^10\.70\.0\.\d+\/28$/);
    assert.match(res.ips[1].address, /^fd00:70::[0-9a-f]+\/124$/);
    assert.match(res.ips[0].gateway, /^10\.70\.0\.\d+$/);
    assert.equal(res.routes, [{ dst: '0.0.0.0/0' }]);
    assert.equal(res.dns, { nameservers: ['10.96.0.10'] });
    assert.equal(ipam('ADD', id, stdin).json, res, 'idempotent');
    if (version !== '0.3.1') {
      const ck = ipam('CHECK', id, conf(version, { pool: 'default' }, { prevResult: res }));
      assert.is(ck.status, 0, ck.stdout);
      const wrong = ipam('CHECK', id, conf(version, { pool: 'default' }, { prevResult: { ...res, ips: [{ address: '10.99.9.9/24' }] } }));
      expectError(wrong, 105, /missing from prevResult/);
    }
    assert.is(ipam('DEL', id, conf(version, { pool: 'default' })).status, 0);
    assert.is(ipam('DEL', id, conf(version, { pool: 'default' })).status, 0, 'DEL twice');
    assert.is(ipam('DEL', id, conf(version, {}), { CNI_NETNS: undefined }).status, 0, 'DEL without pool or netns');
    assert.is(allocated('default'), 0);
  });
}

test('bad IPAM configs: code 7 naming the field, nothing allocated', () => {
  const cases: Array<[string, RegExp]> = [
    [conf('1.0.0', undefined), /ipam: missing/],
    [conf('1.0.0', { pool: undefined }), /ipam\.pool: missing/],
    [conf('1.0.0', { pool: 42 }), /ipam\.pool: missing or not a string/],
    [conf('1.0.0', { pool: 'nope' }), /unknown pod pool "nope"/],
    [conf('1.0.0', { pool: 'float' }), /unknown pod pool "float"/],
    [conf('1.0.0', { pool: 'default', routes: 'all' }), /ipam\.routes: must be an array/],
    [conf('1.0.0', { pool: 'default', routes: [{ dst: '10.0.0.0/33' }] }), /ipam\.routes\[0\]\.dst/],
    [conf('1.0.0', { pool: 'default', routes: [{ dst: '0.0.0.0/0', gw: 'router' }] }), /ipam\.routes\[0\]\.gw/],
    [conf('1.0.0', { pool: 'default', socketPath: 'tetherd.sock' }), /ipam\.socketPath: must be an absolute path/],
  ];
  for (const [stdin, re] of cases) expectError(ipam('ADD', 'bad', stdin), 7, re);
  for (const p of ['default', 'tiny', 'v4only']) assert.is(allocated(p), 0, p);
});

test('exhaustion: code 106 naming the pool; dual-stack all or nothing', () => {
  // tiny: 10.71.0.0/29 (7 usable after the gateway) but fd00:71::/126 (3 usable): the 4th ADD gets an
  // IPv4 address and then fails on IPv6, so the IPv4 one must be given back.
  for (const i of [1, 2, 3]) assert.is(ipam('ADD', `tiny-${i}`, conf('1.0.0', { pool: 'tiny' })).status, 0);
  expectError(ipam('ADD', 'tiny-4', conf('1.0.0', { pool: 'tiny' })), 106, /pool "tiny" is exhausted for IPv6/);
  assert.is(allocated('tiny'), 6, 'tiny-4 holds nothing: its IPv4 address went back');
  for (const i of [1, 2, 3]) assert.is(ipam('DEL', `tiny-${i}`, conf('1.0.0', { pool: 'tiny' })).status, 0);
  assert.is(allocated('tiny'), 0);
});

test('GC (1.1.0) releases attachments the runtime no longer lists, keeps the rest', () => {
  for (const id of ['gc-a', 'gc-b', 'gc-c']) assert.is(ipam('ADD', id, conf('1.1.0', { pool: 'v4only' })).status, 0);
  const gc = runCni(bin('tether-ipam'), { CNI_COMMAND: 'GC', CNI_PATH: '/usr/lib/cni' }, conf('1.1.0', { pool: 'v4only' }, { 'cni.dev/valid-attachments': [{ containerID: 'gc-b', ifname: 'eth0' }] }));
  assert.is(gc.status, 0, gc.stdout);
  assert.is(allocated('v4only'), 1);
  assert.match(d.log(), /gc released addresses/);
  assert.is(ipam('DEL', 'gc-b', conf('1.1.0', { pool: 'v4only' })).status, 0);
  assert.is(allocated('v4only'), 0);
});

test('tetherd down → ADD 11, DEL queued with success; STATUS → 50', () => {
  const queue = path.join(d.dir, 'down-queue');
  const down = JSON.stringify({ cniVersion: '1.1.0', name: 'n', type: 'ptp', ipam: { type: 'tether-ipam', pool: 'default', socketPath: '/tmp/nobody-here.sock', deleteQueueDir: queue } });
  expectError(ipam('ADD', 'x', down), 11, /tetherd is not reachable/);
  // The primary's DEL must still release the veth (test/cni/del-queue.test.ts covers the queue).
  assert.is(ipam('DEL', 'x', down).status, 0);
  assert.equal(fs.readdirSync(queue), ['ipam.del:x:eth0.json']);
  expectError(runCni(bin('tether-ipam'), { CNI_COMMAND: 'STATUS' }, down), 50, /not reachable/);
});

test('VERSION', () => {
  const r = runCni(bin('tether-ipam'), { CNI_COMMAND: 'VERSION' }, '{"cniVersion":"0.4.0"}');
  assert.equal(r.json, { cniVersion: '0.4.0', supportedVersions: ['0.3.1', '0.4.0', '1.0.0', '1.1.0'] });
});

test.run();
