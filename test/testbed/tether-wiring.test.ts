// The testbed's tether wiring, checked with stand-in binaries (fixtures/fake-bin) so it is proven before
// the real tether/tetherd exist: the tether step's config, tetherd's flags, readiness, logs, pins,
// kill/restart, and that down() stops tetherd and removes its pins.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { bpfDir, leftovers } from './cleanup';
import { pidAlive, run } from './proc';
import { Testbed } from './testbed';

const FAKE_BIN = path.join(__dirname, 'fixtures', 'fake-bin');
const savedBinDir = process.env.TETHER_BIN_DIR;
let tb: Testbed;

interface Req {
  cmd: string;
  args: string;
  conf: { name: string; cniVersion: string; socketPath: string; prevResult?: { ips: { address: string }[] }; [k: string]: unknown };
}
const requests = (node: string): Req[] =>
  fs.readFileSync(`${tb.socketPath(node)}.requests`, 'utf8').trim().split('\n').map((l) => JSON.parse(l) as Req);
const ping = (node: string) => run([path.join(FAKE_BIN, 'tetherctl'), '--socket', tb.socketPath(node), 'ping']);

test.before(async () => {
  process.env.TETHER_BIN_DIR = FAKE_BIN;
  tb = await Testbed.up({
    tether: true,
    ipam: 'host-local', // the stand-in tetherd speaks no IPAM
    nodes: [
      { name: 'n1', pods: [{ name: 'lb', tether: { vips: ['203.0.113.10'] } }] },
      { name: 'n2', pods: 1, tether: { encapOverhead: 28 } },
    ],
  });
});

test.after(async () => {
  if (savedBinDir === undefined) delete process.env.TETHER_BIN_DIR;
  else process.env.TETHER_BIN_DIR = savedBinDir;
  await tb?.down();
});

test('tether ends the chain with the node socket, merged node/pod config and prevResult', () => {
  assert.ok(tb.tetherEnabled);
  assert.equal(tb.pod('n1-lb').add.invocations.map((i) => i.plugin), ['ptp', 'tether']);
  const [r1] = requests('n1');
  assert.is(r1.cmd, 'ADD');
  assert.is(r1.conf.socketPath, tb.socketPath('n1'));
  assert.equal(r1.conf.vips, ['203.0.113.10']);
  assert.is(r1.conf.name, 'tether-testbed');
  assert.is(r1.conf.cniVersion, '1.0.0');
  assert.is(r1.conf.prevResult?.ips[0].address, `${tb.podIp('n1-lb')}/24`);
  assert.match(r1.args, 'K8S_POD_NAMESPACE=default;K8S_POD_NAME=lb;');
  const [r2] = requests('n2');
  assert.is(r2.conf.encapOverhead, 28);
  assert.is(r2.conf.vips, undefined, "a node's pods do not inherit another pod's config");
});

test('tetherd runs in its node with a log and a pin dir under the run prefix', async () => {
  for (const n of ['n1', 'n2']) {
    assert.is((await ping(n)).code, 0);
    assert.match(fs.readFileSync(tb.tetherdLog(n), 'utf8'), '"msg":"ready"');
    assert.ok(fs.existsSync(path.join(bpfDir(tb.prefix), n)), 'pin dir');
    const pid = tb.tetherd(n).pid as number;
    const nodeNsIno = fs.statSync(`/run/netns/${tb.nodeNs(n)}`).ino;
    assert.is(fs.statSync(`/proc/${pid}/ns/net`).ino, nodeNsIno, `tetherd on ${n} runs in the node namespace`);
    assert.is.not(fs.statSync('/proc/self/ns/net').ino, nodeNsIno);
  }
});

test('the chain still connects pods across nodes with tether in it', async () => {
  const s = await tb.tcpServe('n2-p1', 7100);
  try {
    const r = await tb.tcpProbe('n1-lb', tb.podIp('n2-p1'), 7100);
    assert.is(r.reply, 'n2-p1', r.error);
  } finally {
    s.stop();
  }
});

test('killTetherd and restartTetherd', async () => {
  const killed = await tb.killTetherd('n1');
  assert.is(killed.signal, 'SIGKILL');
  assert.is.not((await ping('n1')).code, 0);
  await tb.restartTetherd('n1');
  assert.is((await ping('n1')).code, 0);
  const stopped = await tb.killTetherd('n1', 'SIGTERM');
  assert.is(stopped.code, 0, 'SIGTERM is a clean exit');
  assert.match(fs.readFileSync(tb.tetherdLog('n1'), 'utf8'), '"msg":"stopping"');
  await tb.restartTetherd('n1');
  assert.is((await ping('n1')).code, 0);
  assert.is(fs.readFileSync(tb.tetherdLog('n1'), 'utf8').match(/testbed: starting/g)?.length, 3, 'log appended across restarts');
});

test('DEL runs tether first; down() stops tetherds and removes pins', async () => {
  const out = await tb.delPod('n2-p1');
  assert.equal(out.invocations.map((i) => i.plugin), ['tether', 'ptp']);
  assert.is(requests('n2').at(-1)?.cmd, 'DEL');
  const pids = ['n1', 'n2'].map((n) => tb.tetherd(n).pid as number);
  await tb.down();
  assert.ok(pids.every((p) => !pidAlive(p)), 'tetherds are gone');
  assert.equal(leftovers(tb.prefix), []);
});

test.run();
