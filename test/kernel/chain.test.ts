// The real chain, as a runtime runs it: Debian's ptp + host-local, then tether, in a node namespace with
// its own tetherd. ADD → kernel state asserted (MTU both ends, VIPs, ARP sysctls, routes) → CHECK →
// DEL → the pod namespace is back as before. And tetherd killed with -9 between ADD and DEL.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { execFileSync } from 'node:child_process';
import { BIN_DIR, bin } from '../lib/binaries';
import { runCni } from '../lib/cni-exec';
import { removeDaemonDir, startDaemon, type TestDaemon } from '../lib/daemon';
import { addNetns, delNetns, ipJson, nsSysctl, snapshot, uniqueName } from '../lib/netns';
import { CniChain, CniError, type Conflist } from '../testbed/cni-chain';

const VIPS = ['198.51.100.10', '198.51.100.11'];
const POD_ROUTE = '203.0.113.0/24';

interface Fixture {
  node: string;
  pods: string[];
  dir: string;
  daemon: TestDaemon;
}

async function withNode(fn: (f: Fixture) => Promise<void>): Promise<void> {
  const node = uniqueName('tch');
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tether-chain-'));
  const f: Fixture = { node, pods: [], dir, daemon: undefined as unknown as TestDaemon };
  try {
    addNetns(node);
    execFileSync('ip', ['netns', 'exec', node, 'sysctl', '-qw', 'net.ipv4.ip_forward=1']);
    f.daemon = await startDaemon({ netns: `/run/netns/${node}`, dir: path.join(dir, 'tetherd') });
    await fn(f);
  } finally {
    await f.daemon?.stop('SIGKILL');
    delNetns(...f.pods, node);
    fs.rmSync(dir, { recursive: true, force: true });
    if (f.daemon) removeDaemonDir(f.daemon);
  }
}

function conflist(f: Fixture, version: string, subnet: string): Conflist {
  return {
    cniVersion: version,
    name: 'tether-chain-test',
    plugins: [
      {
        type: 'ptp',
        ipMasq: false,
        mtu: 1500,
        ipam: { type: 'host-local', ranges: [[{ subnet }]], routes: [{ dst: '0.0.0.0/0' }], dataDir: path.join(f.dir, 'ipam') },
      },
      {
        type: 'tether',
        socketPath: f.daemon.socket,
        encapOverhead: 28,
        vips: VIPS,
        routes: [{ dst: POD_ROUTE, gw: subnet.replace(/0\/24$/, '1'), mtu: 1400 }],
      },
    ],
  };
}

function chainFor(f: Fixture, c: Conflist): CniChain {
  return new CniChain(c, { cniPath: ['/usr/lib/cni', BIN_DIR], cacheDir: path.join(f.dir, 'cache'), runInNetns: `/run/netns/${f.node}` });
}

function hostVethOf(result: { interfaces?: Array<{ name: string; sandbox?: string }> }): string {
  const h = result.interfaces?.find((i) => !i.sandbox);
  assert.ok(h, 'ptp result names a host-side interface');
  return h!.name;
}

function assertAttached(f: Fixture, pod: string, hostVeth: string) {
  const eth0 = ipJson(pod, ['link', 'show', 'eth0'])[0];
  assert.is(eth0.mtu, 1472, 'pod eth0 MTU lowered by the FoU overhead');
  const host = ipJson(f.node, ['link', 'show', hostVeth])[0];
  assert.is(host.mtu, 1472, 'host-side veth MTU lowered too');
  const lo = ipJson(pod, ['addr', 'show', 'lo'])[0].addr_info.map((a: any) => `${a.local}/${a.prefixlen}`);
  for (const v of VIPS) assert.ok(lo.includes(`${v}/32`), `VIP ${v} on lo (no dummy driver here): ${lo}`);
  assert.is(nsSysctl(pod, 'net/ipv4/conf/all/arp_ignore'), '1');
  assert.is(nsSysctl(pod, 'net/ipv4/conf/all/arp_announce'), '2');
  assert.is(nsSysctl(pod, 'net/ipv4/conf/eth0/arp_ignore'), '1');
  const r = ipJson(pod, ['route', 'show', POD_ROUTE])[0];
  assert.ok(r, `route ${POD_ROUTE} in the pod`);
  assert.is(r.dev, 'eth0');
  assert.is(r.metrics?.[0]?.mtu ?? r.mtu, 1400, `route MTU: ${JSON.stringify(r)}`);
}

// Debian's reference plugins speak up to 1.0.0, so the whole chain runs at 0.3.1–1.0.0; 1.1.0 (STATUS, GC)
// is driven below with ptp's 1.0.0 result, whose format 1.1.0 kept unchanged.
for (const [i, version] of ['0.3.1', '0.4.0', '1.0.0'].entries()) {
  test(`chain ${version}: ptp+host-local+tether ADD → state → CHECK → DEL → namespace as before`, async () => {
    await withNode(async (f) => {
      const pod = uniqueName('tchp');
      f.pods.push(pod);
      const nsPath = addNetns(pod);
      const before = snapshot(pod);
      const chain = chainFor(f, conflist(f, version, `10.99.${i}.0/24`));
      const att = { containerId: `ctr-${pod}`, netns: nsPath, ifName: 'eth0', args: { IgnoreUnknown: '1', K8S_POD_NAMESPACE: 'default', K8S_POD_NAME: pod } };
      const added = await chain.add(att);
      assert.is(added.result!.cniVersion, version, 'result speaks the config version');
      assert.ok(added.result!.ips?.length, 'prevResult IPs passed on');
      const hostVeth = hostVethOf(added.result!);
      assertAttached(f, pod, hostVeth);

      const status = JSON.parse(execFileSync(bin('tetherctl'), ['--socket', f.daemon.socket, 'status'], { encoding: 'utf8' }));
      assert.is(status.pods.length, 1);
      assert.is(status.pods[0].pod, `default/${pod}`);
      assert.match(f.daemon.log(), /"message":"pod attached"/);

      if (version !== '0.3.1') {
        await chain.check(att);
        // CHECK must notice drift: take a VIP away by hand.
        execFileSync('ip', ['-n', pod, 'addr', 'del', `${VIPS[1]}/32`, 'dev', 'lo']);
        try {
          await chain.check(att);
          assert.unreachable('CHECK passed with a VIP missing');
        } catch (e) {
          assert.instance(e, CniError);
          assert.is((e as CniError).plugin, 'tether');
          assert.match((e as CniError).msg, new RegExp(VIPS[1].replace(/\./g, '\\.')));
        }
        execFileSync('ip', ['-n', pod, 'addr', 'add', `${VIPS[1]}/32`, 'dev', 'lo']);
        await chain.check(att);
      }

      await chain.del(att);
      assert.equal(snapshot(pod), before, 'pod namespace back as before');
      assert.equal(ipJson(f.node, ['link', 'show']).filter((l) => l.ifname === hostVeth), [], 'host veth gone');
      const status2 = JSON.parse(execFileSync(bin('tetherctl'), ['--socket', f.daemon.socket, 'status'], { encoding: 'utf8' }));
      assert.equal(status2.pods, []);
      // A second DEL (runtimes retry) still succeeds.
      await chain.del(att);
    });
  });
}

test('tetherd killed with -9 between ADD and DEL: DEL after restart undoes everything', async () => {
  await withNode(async (f) => {
    const pod = uniqueName('tchk');
    f.pods.push(pod);
    const nsPath = addNetns(pod);
    const c = conflist(f, '1.0.0', '10.99.9.0/24');
    const chain = chainFor(f, c);
    const att = { containerId: `ctr-${pod}`, netns: nsPath, ifName: 'eth0' };
    const added = await chain.add(att);
    const hostVeth = hostVethOf(added.result!);
    const afterPtp = { eth0: 1500, vips: 0 };
    assertAttached(f, pod, hostVeth);

    await f.daemon.stop('SIGKILL');
    f.daemon = await f.daemon.restart();
    assert.match(f.daemon.log(), /"podsRecorded":1/);

    // tether's DEL alone (as the runtime's reverse walk reaches it first), then check its undo.
    const tetherConf = { ...c.plugins[1], name: c.name, cniVersion: c.cniVersion, prevResult: added.result };
    const del = runCni(bin('tether'), { CNI_COMMAND: 'DEL', CNI_CONTAINERID: att.containerId, CNI_NETNS: nsPath, CNI_IFNAME: 'eth0', CNI_PATH: BIN_DIR }, JSON.stringify(tetherConf), { netns: `/run/netns/${f.node}` });
    assert.is(del.status, 0, del.stdout);
    assert.is(ipJson(pod, ['link', 'show', 'eth0'])[0].mtu, afterPtp.eth0, 'pod MTU restored');
    assert.is(ipJson(f.node, ['link', 'show', hostVeth])[0].mtu, 1500, 'host veth MTU restored');
    const lo = ipJson(pod, ['addr', 'show', 'lo'])[0].addr_info.filter((a: any) => a.family === 'inet' && a.local !== '127.0.0.1');
    assert.is(lo.length, afterPtp.vips, 'VIPs removed');
    assert.is(nsSysctl(pod, 'net/ipv4/conf/all/arp_ignore'), '0', 'arp_ignore restored');
    assert.equal(ipJson(pod, ['route', 'show', POD_ROUTE]), [], 'pod route removed');
    await chain.del(att);
  });
});

test('DEL when the pod namespace is already gone succeeds and forgets the pod', async () => {
  await withNode(async (f) => {
    const pod = uniqueName('tchg');
    f.pods.push(pod);
    const nsPath = addNetns(pod);
    const chain = chainFor(f, conflist(f, '1.0.0', '10.99.8.0/24'));
    const att = { containerId: `ctr-${pod}`, netns: nsPath, ifName: 'eth0' };
    await chain.add(att);
    delNetns(pod);
    await chain.del(att);
    const status = JSON.parse(execFileSync(bin('tetherctl'), ['--socket', f.daemon.socket, 'status'], { encoding: 'utf8' }));
    assert.equal(status.pods, []);
  });
});

test('an ADD naming the node\'s own namespace (a /proc/<pid> path seen from a container without the host PID namespace) is refused and changes nothing on the node', async () => {
  await withNode(async (f) => {
    const nodeNs = `/run/netns/${f.node}`;
    const before = nsSysctl(f.node, 'net/ipv4/conf/all/arp_ignore');
    const conf = {
      type: 'tether', name: 'tether-chain-test', cniVersion: '1.0.0', socketPath: f.daemon.socket, vips: VIPS,
      prevResult: { cniVersion: '1.0.0', interfaces: [{ name: 'eth0', sandbox: nodeNs }], ips: [{ address: '10.99.9.2/24', interface: 0 }] },
    };
    // tetherd's own namespace, named by its /run/netns path and, as a container's /proc/<pid> would, by
    // tetherd's own /proc entry.
    for (const netns of [nodeNs, `/proc/${f.daemon.proc.pid}/ns/net`]) {
      const r = runCni(bin('tether'), { CNI_COMMAND: 'ADD', CNI_CONTAINERID: 'ctr-own-ns', CNI_NETNS: netns, CNI_IFNAME: 'eth0', CNI_PATH: BIN_DIR }, JSON.stringify(conf), { netns: nodeNs });
      assert.is(r.status, 1, r.stdout);
      assert.is((r.json as { code: number }).code, 4, r.stdout);
      assert.match(String((r.json as { msg: string }).msg), /is the node's own network namespace, not a pod's: nothing done/);
    }
    assert.is(nsSysctl(f.node, 'net/ipv4/conf/all/arp_ignore'), before, 'the node\'s ARP sysctls untouched');
    const status = JSON.parse(execFileSync(bin('tetherctl'), ['--socket', f.daemon.socket, 'status'], { encoding: 'utf8' }));
    assert.equal(status.pods, [], 'nothing recorded');
  });
});

test('1.1.0: tether ADD/CHECK/STATUS after ptp, then GC removes an attachment the runtime no longer lists', async () => {
  await withNode(async (f) => {
    const pod = uniqueName('tchc');
    f.pods.push(pod);
    const nsPath = addNetns(pod);
    const c = conflist(f, '1.0.0', '10.99.7.0/24');
    const ptpOnly = chainFor(f, { ...c, plugins: [c.plugins[0]] });
    const att = { containerId: `ctr-${pod}`, netns: nsPath, ifName: 'eth0' };
    const ptp = await ptpOnly.add(att);
    const hostVeth = hostVethOf(ptp.result!);
    const tetherConf = (extra: Record<string, unknown>) => JSON.stringify({ ...c.plugins[1], name: c.name, cniVersion: '1.1.0', ...extra });
    const env = (cmd: string) => ({ CNI_COMMAND: cmd, CNI_CONTAINERID: att.containerId, CNI_NETNS: nsPath, CNI_IFNAME: 'eth0', CNI_PATH: BIN_DIR });
    const run = (cmd: string, extra: Record<string, unknown>) => runCni(bin('tether'), env(cmd), tetherConf(extra), { netns: `/run/netns/${f.node}` });

    const add = run('ADD', { prevResult: { ...ptp.result, cniVersion: '1.1.0' } });
    assert.is(add.status, 0, add.stdout);
    assert.is(add.json!.cniVersion, '1.1.0');
    assert.equal(add.json!.ips, ptp.result!.ips, 'prevResult IPs unchanged');
    assertAttached(f, pod, hostVeth);
    assert.is(run('CHECK', { prevResult: add.json }).status, 0);
    assert.is(run('STATUS', {}).status, 0);

    // GC that still lists the attachment keeps it …
    const keep = run('GC', { 'cni.dev/valid-attachments': [{ containerID: att.containerId, ifname: 'eth0' }] });
    assert.is(keep.status, 0, keep.stdout);
    assertAttached(f, pod, hostVeth);
    // … and one that does not list it undoes it.
    const gc = run('GC', { 'cni.dev/valid-attachments': [] });
    assert.is(gc.status, 0, gc.stdout);
    assert.is(ipJson(pod, ['link', 'show', 'eth0'])[0].mtu, 1500, 'GC restored the MTU');
    assert.equal(ipJson(pod, ['route', 'show', POD_ROUTE]), [], 'GC removed the pod route');
    const status = JSON.parse(execFileSync(bin('tetherctl'), ['--socket', f.daemon.socket, 'status'], { encoding: 'utf8' }));
    assert.equal(status.pods, []);
    assert.match(f.daemon.log(), /gc: stale attachment removed/);
    await ptpOnly.del(att);
  });
});

test.run();
