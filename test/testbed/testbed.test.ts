// The testbed on the real kernel: pods get node-local addresses through the CNI chain (tether-ipam blocks
// when tether is built, host-local /24s otherwise; TETHER_TESTBED_IPAM=host-local forces the latter),
// traffic flows within a node, across nodes and to and from external hosts, routes follow claimed blocks,
// DEL undoes ADD, and teardown leaves nothing behind — after success, after a throw, after Ctrl-C, and
// (via sweepStale) after a SIGKILL, Redis included.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { spawn } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { CniError } from './cni-chain';
import { bpfDir, leftovers, listNetns, runDir, sweepStale } from './cleanup';
import { pidAlive, run } from './proc';
import { binDir, tetherBinariesPresent } from './tetherd';
import { NETWORK_NAME, Testbed, withTestbed } from './testbed';
import { inCidr, Topology } from './topology';
import { peerAddress } from '../lib/traffic';

const TOPO: Topology = {
  nodes: [
    { name: 'n1', zone: 'a', pods: 2 },
    { name: 'n2', zone: 'a', pods: 2 },
    { name: 'n3', zone: 'b', pods: 2 },
    { name: 'n4', zone: 'b' }, // starts empty: the block-route test gives it a pod and takes it away
  ],
};
const PORT = 7001;
let tb: Testbed;

test.before(async () => {
  tb = await Testbed.up(TOPO);
});

test.after(async () => {
  await tb?.down();
});

/** The pod's gateway as its IPAM answered (host-local: the node's .1; tether-ipam: its block's first address). */
const gatewayOf = (key: string): string => tb.pod(key).result.ips?.[0]?.gateway ?? '';

test('every pod got an address from its own node (CIDR or claimed block), and the chain ran the expected plugins', async () => {
  const pods = tb.listPods();
  assert.is(pods.length, 6);
  const ips = new Set<string>();
  const cluster = tb.ipam === 'tether-ipam' ? await tb.clusterBlocks() : undefined;
  for (const p of pods) {
    if (cluster) {
      const { blocks } = await tb.nodeBlocks(p.node);
      const block = blocks.find((b) => inCidr(p.ip, b));
      assert.ok(block, `${p.key} has ${p.ip}, outside ${p.node}'s blocks ${blocks.join(' ')}`);
      assert.is(cluster.get(block), p.node, `Redis says ${block} belongs to ${p.node}`);
      assert.is(p.prefixLength, tb.plan.podPool.blockSize);
      assert.is(gatewayOf(p.key), block.split('/')[0], "the gateway is the block's first address");
    } else {
      assert.ok(inCidr(p.ip, tb.node(p.node).podCidr), `${p.key} has ${p.ip}, outside ${tb.node(p.node).podCidr}`);
      assert.is(gatewayOf(p.key), tb.node(p.node).podGateway);
      assert.is(p.prefixLength, 24);
    }
    assert.is.not(p.ip, gatewayOf(p.key));
    ips.add(p.ip);
    const plugins = p.add.invocations.map((i) => i.plugin);
    assert.equal(plugins, tb.tetherEnabled ? ['ptp', 'tether'] : ['ptp'], `${p.key} chain`);
    assert.ok(p.add.invocations.every((i) => i.ms > 0 && i.command === 'ADD'));
  }
  assert.is(ips.size, 6, 'addresses are unique');
  assert.is(tb.node('n3').zone, 'b');
});

test('the pod sees its address on eth0 and a default route via its node gateway', async () => {
  const p = tb.pod('n2-p1');
  const addr = await tb.mustExec(p.key, ['ip', '-4', '-o', 'addr', 'show', 'dev', 'eth0']);
  assert.match(addr.stdout, ` ${p.ip}/${p.prefixLength} `);
  const route = await tb.mustExec(p.key, ['ip', 'route', 'show', 'default']);
  assert.match(route.stdout, `via ${gatewayOf(p.key)} dev eth0`);
});

test('TCP between pods on one node, across nodes, to and from external hosts', async () => {
  const servers = await Promise.all(['n1-p2', 'n2-p1', 'n3-p2', 'server'].map((h) => tb.tcpServe(h, PORT)));
  try {
    const cases: [string, string, string][] = [
      ['n1-p1', tb.podIp('n1-p2'), 'n1-p2'], // same node
      ['n1-p1', tb.podIp('n2-p1'), 'n2-p1'], // cross node
      ['n2-p2', tb.podIp('n3-p2'), 'n3-p2'], // cross node, other zone
      ['n3-p1', tb.externalIp('server'), 'server'], // pod → external
      ['client', tb.podIp('n2-p1'), 'n2-p1'], // external → pod through the router
    ];
    const results = await Promise.all(cases.map(([from, ip]) => tb.tcpProbe(from, ip, PORT)));
    cases.forEach(([from, ip, want], i) => {
      const r = results[i];
      assert.ok(r.ok, `${from} → ${ip}: ${r.error}`);
      assert.is(r.reply, want, `${from} → ${ip} reached the wrong host`);
    });
  } finally {
    servers.forEach((s) => s.stop());
  }
});

test('a probe fails where nothing listens (the probe can tell)', async () => {
  const r = await tb.tcpProbe('n1-p1', tb.podIp('n3-p1'), PORT + 1, 1000);
  assert.not.ok(r.ok);
  assert.is(r.error, 'ECONNREFUSED');
});

test('CHECK passes on an attached pod', async () => {
  const out = await tb.checkPod('n1-p1');
  assert.equal(out.invocations.map((i) => i.command), tb.tetherEnabled ? ['CHECK', 'CHECK'] : ['CHECK']);
});

/** How many addresses the node's IPAM holds: host-local reservation files, or tetherd's allocations. */
async function heldOn(node: string): Promise<number> {
  if (tb.ipam === 'tether-ipam') return (await tb.nodeBlocks(node)).allocated;
  return fs.readdirSync(path.join(tb.nodeDir(node, 'ipam'), NETWORK_NAME)).filter((f) => /^\d+\.\d+\.\d+\.\d+$/.test(f)).length;
}

test('chain DEL removes the host veth, the host route, the IPAM reservation and the cached result', async () => {
  const before = await heldOn('n1');
  const pod = await tb.addPod('n1', 'extra');
  const hostVeth = pod.result.interfaces?.find((i) => !i.sandbox)?.name;
  assert.ok(hostVeth, 'ptp reported its host-side veth');
  const reservation = path.join(tb.nodeDir('n1', 'ipam'), NETWORK_NAME, pod.ip);
  // Preconditions, so the checks after DEL mean something.
  assert.is((await tb.exec('n1', ['ip', 'link', 'show', 'dev', hostVeth])).code, 0);
  assert.match((await tb.mustExec('n1', ['ip', 'route', 'show', `${pod.ip}/32`])).stdout, hostVeth);
  assert.is(await heldOn('n1'), before + 1, 'the IPAM holds one more address');
  if (tb.ipam === 'host-local') assert.ok(fs.existsSync(reservation), `host-local reservation ${reservation}`);
  assert.ok(pod.chain.cachedResult(pod));

  const out = await tb.delPod(pod.key);
  assert.equal(out.invocations.map((i) => `${i.command}:${i.plugin}`), tb.tetherEnabled ? ['DEL:tether', 'DEL:ptp'] : ['DEL:ptp']);
  assert.is.not((await tb.exec('n1', ['ip', 'link', 'show', 'dev', hostVeth])).code, 0, 'host veth is gone');
  assert.is((await tb.mustExec('n1', ['ip', 'route', 'show', `${pod.ip}/32`])).stdout.trim(), '', 'host route is gone');
  assert.is(await heldOn('n1'), before, 'the address is released');
  assert.not.ok(fs.existsSync(reservation), 'no host-local reservation is left');
  assert.is(pod.chain.cachedResult(pod), undefined);
  assert.not.ok(listNetns().includes(pod.ns));
  assert.throws(() => tb.pod(pod.key), /unknown pod/);
});

test('tetherd runs on every node and survives kill/restart (only when tether is enabled)', async () => {
  if (!tb.tetherEnabled) {
    console.log(`  (tether binaries not in ${binDir()}: tetherd checks skipped)`);
    return;
  }
  const ctl = path.join(binDir(), 'tetherctl');
  for (const n of tb.plan.nodes) {
    const r = await run([ctl, '--socket', tb.socketPath(n.name), 'ping']);
    assert.is(r.code, 0, `tetherd on ${n.name}: ${r.stderr}`);
    assert.ok(fs.existsSync(tb.tetherdLog(n.name)));
  }
  const st = await tb.killTetherd('n2', 'SIGKILL');
  assert.is(st.signal, 'SIGKILL');
  assert.is.not((await run([ctl, '--socket', tb.socketPath('n2'), 'ping'])).code, 0, 'a killed tetherd does not answer');
  await tb.restartTetherd('n2');
  assert.is((await run([ctl, '--socket', tb.socketPath('n2'), 'ping'])).code, 0);
});

/** The routes to pool blocks in a namespace: block → via. */
async function blockRoutesIn(name: string): Promise<Map<string, string>> {
  const out = (await tb.mustExec(name, ['ip', '-4', 'route', 'show'])).stdout;
  const m = new Map<string, string>();
  for (const l of out.split('\n')) {
    const r = /^(\S+\/\d+) via (\S+)/.exec(l);
    if (r && inCidr(r[1].split('/')[0], tb.plan.podPool.cidr)) m.set(r[1], r[2]);
  }
  return m;
}

test('tether-ipam: routes follow claimed blocks on the router and the other nodes, and go when a block is returned', async () => {
  if (tb.ipam !== 'tether-ipam') {
    console.log('  (host-local testbed: block routes skipped)');
    return;
  }
  const expected = async () => new Map([...(await tb.clusterBlocks())].map(([b, n]) => [b, tb.node(n).fabricIp]));
  assert.equal(await blockRoutesIn('router'), await expected(), 'router: one route per claimed block, via its owner');
  const a = await tb.addPod('n4', 'r1');
  const [n4block] = (await tb.nodeBlocks('n4')).blocks;
  assert.ok(n4block && inCidr(a.ip, n4block));
  assert.is((await tb.clusterBlocks()).get(n4block), 'n4');
  for (const h of ['router', 'n1', 'n2', 'n3']) assert.is((await blockRoutesIn(h)).get(n4block), tb.node('n4').fabricIp, `${h} routes ${n4block} to n4`);
  assert.not.ok((await blockRoutesIn('n4')).has(n4block), 'the owner routes its pods itself (/32s)');
  const s = await tb.tcpServe(a.key, PORT + 2);
  try {
    const r = await tb.tcpProbe('n1-p1', a.ip, PORT + 2);
    assert.is(r.reply, a.key, `n1-p1 → ${a.ip} over the block route: ${r.error}`);
    const x = await tb.tcpProbe('client', a.ip, PORT + 2);
    assert.is(x.reply, a.key, `client → ${a.ip}: ${x.error}`);
  } finally {
    s.stop();
  }
  await tb.delPod(a.key);
  assert.equal((await tb.nodeBlocks('n4')).blocks, [], 'the empty block went back');
  assert.not.ok((await tb.clusterBlocks()).has(n4block));
  for (const h of ['router', 'n1', 'n2', 'n3']) assert.not.ok((await blockRoutesIn(h)).has(n4block), `${h} no longer routes ${n4block}`);
  assert.equal(await blockRoutesIn('router'), await expected());
});

test('host-local mode: addresses from the node /24s and TCP across nodes', async () => {
  await withTestbed({ nodes: [{ name: 'n1', pods: 1 }, { name: 'n2', pods: 1 }], externals: [], tether: false }, async (t) => {
    assert.is(t.ipam, 'host-local');
    assert.ok(inCidr(t.podIp('n1-p1'), '10.244.1.0/24') && inCidr(t.podIp('n2-p1'), '10.244.2.0/24'));
    assert.throws(() => t.redis, /no Redis/);
    const s = await t.tcpServe('n2-p1', PORT);
    try {
      assert.is((await t.tcpProbe('n1-p1', t.podIp('n2-p1'), PORT)).reply, 'n2-p1');
    } finally {
      s.stop();
    }
  });
});

/** A pod's addresses as its eth0 holds them (global scope), per family. */
async function podAddrs(t: Testbed, key: string): Promise<{ v4: string[]; v6: string[] }> {
  const j = JSON.parse((await t.mustExec(key, ['ip', '-j', 'addr', 'show', 'dev', 'eth0'])).stdout) as Array<{ addr_info: Array<{ family: string; local: string; prefixlen: number; scope: string }> }>;
  const of = (f: string) => j[0].addr_info.filter((a) => a.family === f && a.scope === 'global').map((a) => `${a.local}/${a.prefixlen}`);
  return { v4: of('inet'), v6: of('inet6') };
}

test('dual-stack pods (tether-ipam): IPv6 blocks claimed and routed, TCP and UDP over IPv6 with real sources, IPv4 as before', async () => {
  if (!tetherBinariesPresent()) {
    console.log(`  (tether binaries not in ${binDir()}: dual-stack tether-ipam skipped)`);
    return;
  }
  let prefix = '';
  await withTestbed({ nodes: [{ name: 'n1', pods: 1 }, { name: 'n2', pods: 1 }], families: [4, 6] }, async (t) => {
    prefix = t.prefix;
    assert.is(t.ipam, 'tether-ipam');
    const cluster = await t.clusterBlocks();
    for (const p of t.listPods()) {
      assert.ok(p.ip6, `${p.key} has an IPv6 address`);
      assert.ok(inCidr(p.ip, t.plan.podPool.cidr), `${p.key}: ip stays the IPv4 address (${p.ip})`);
      const [v6block] = (await t.nodeBlocks(p.node, undefined, 6)).blocks;
      assert.ok(v6block && inCidr(p.ip6!, v6block), `${p.key}'s ${p.ip6} lies in ${p.node}'s IPv6 block ${v6block}`);
      assert.ok(inCidr(p.ip6!, t.plan.podPool.ipv6!.cidr));
      assert.is(p.prefixLength6, t.plan.podPool.ipv6!.blockSize);
      assert.is(cluster.get(v6block), p.node, `Redis says ${v6block} belongs to ${p.node}`);
      assert.equal(await podAddrs(t, p.key), { v4: [`${p.ip}/${p.prefixLength}`], v6: [`${p.ip6}/${p.prefixLength6}`] }, `${p.key}'s eth0 holds both`);
      const gw6 = p.result.ips?.find((i) => i.address?.includes(':'))?.gateway;
      assert.match((await t.mustExec(p.key, ['ip', '-6', 'route', 'show', 'default'])).stdout, `via ${gw6} dev eth0`);
      assert.match((await t.mustExec(p.key, ['ip', '-4', 'route', 'show', 'default'])).stdout, 'dev eth0');
      // The node routes its own pod's IPv6 address to the pod's veth; the router and the other node route the block to it.
      assert.match((await t.mustExec(p.node, ['ip', '-6', 'route', 'show', `${p.ip6}/128`])).stdout, /dev veth/);
      const other = p.node === 'n1' ? 'n2' : 'n1';
      for (const h of ['router', other]) {
        assert.match((await t.mustExec(h, ['ip', '-6', 'route', 'show', v6block])).stdout, `via ${t.node(p.node).fabricIp6} `, `${h} routes ${v6block} to ${p.node}`);
      }
    }
    // Pod to pod across nodes and pod to an external host over IPv6: the far end records the pod's own address.
    const a = t.pod('n1-p1');
    const PORT6 = PORT + 10;
    for (const [to, ip] of [['n2-p1', t.podIp6('n2-p1')], ['server', t.externalIp6('server')]] as const) {
      const server = await t.echoServe(to, PORT6);
      let peers: string[];
      try {
        const report = await t.traffic(a.key, ip, PORT6, { conns: 3, durationMs: 1500, udp: true });
        assert.is(report.intact, 3, `n1-p1 → ${to} [${ip}]: ${report.errors.join('; ')}`);
        assert.ok(report.echoes > 10, `echoes went both ways (${report.echoes})`);
        assert.ok((report.udp?.received ?? 0) > 0, `UDP over IPv6 came back (${JSON.stringify(report.udp)})`);
      } finally {
        peers = await server.stop();
      }
      const tcp = peers.filter((x) => !x.startsWith('udp '));
      assert.is(tcp.length, 3, `${to} saw each connection: ${peers.join(', ')}`);
      assert.ok(tcp.every((x) => x.startsWith(`[${a.ip6}]:`)), `${to} saw the pod's IPv6 source: ${peers.join(', ')}`);
      assert.equal([...new Set(peers.map(peerAddress))], [a.ip6], 'TCP and UDP alike');
    }
    // The external's side in: client → pod over IPv6 through the router; IPv4 in the same testbed as before.
    const s = await t.tcpServe('n2-p1', PORT);
    const x = await t.tcpServe('server', PORT);
    try {
      const cases: [string, string, string][] = [
        ['client', t.podIp6('n2-p1'), 'n2-p1'],
        ['n1-p1', t.podIp('n2-p1'), 'n2-p1'],
        ['n1-p1', t.externalIp('server'), 'server'],
        ['client', t.podIp('n2-p1'), 'n2-p1'],
      ];
      for (const [from, ip, want] of cases) {
        const r = await t.tcpProbe(from, ip, PORT);
        assert.is(r.reply, want, `${from} → ${ip}: ${r.error}`);
      }
    } finally {
      s.stop();
      x.stop();
    }
    // IPv4 sources keep their plain "addr:port" form.
    const v4server = await t.echoServe('server', PORT6);
    let v4peers: string[] = [];
    const r4 = await t.traffic(a.key, t.externalIp('server'), PORT6, { conns: 1, durationMs: 500 }).finally(async () => {
      v4peers = await v4server.stop();
    });
    assert.is(r4.intact, 1, r4.errors.join('; '));
    assert.equal(v4peers.map((p) => p.slice(0, p.lastIndexOf(':'))), [a.ip]);
    // DEL gives both addresses back: a pod added and removed leaves the node's IPv6 allocations as they were.
    const before = (await t.nodeBlocks('n1', undefined, 6)).allocated;
    const extra = await t.addPod('n1', 'extra');
    assert.is((await t.nodeBlocks('n1', undefined, 6)).allocated, before + 1);
    assert.match((await t.mustExec('n1', ['ip', '-6', 'route', 'show', `${extra.ip6}/128`])).stdout, /dev veth/);
    await t.delPod(extra.key);
    assert.is((await t.nodeBlocks('n1', undefined, 6)).allocated, before, 'the IPv6 address is released');
    assert.is((await t.mustExec('n1', ['ip', '-6', 'route', 'show', `${extra.ip6}/128`])).stdout.trim(), '', 'its host route is gone');
  });
  assert.equal(leftovers(prefix), [], 'nothing of the dual-stack run is left');
});

test('IPv6-only pods (tether-ipam): one IPv6 address, no IPv4, TCP across nodes and to an external', async () => {
  if (!tetherBinariesPresent()) {
    console.log(`  (tether binaries not in ${binDir()}: IPv6-only tether-ipam skipped)`);
    return;
  }
  await withTestbed({ nodes: [{ name: 'n1', pods: 1 }, { name: 'n2', pods: 1 }], families: [6] }, async (t) => {
    for (const p of t.listPods()) {
      assert.is(p.ip, p.ip6, `${p.key}: ip is its IPv6 address when pods have no IPv4`);
      assert.equal(await podAddrs(t, p.key), { v4: [], v6: [`${p.ip6}/${p.prefixLength6}`] });
      assert.equal((await t.nodeBlocks(p.node)).blocks, [], `${p.node} claimed no IPv4 block`);
    }
    const s = await t.tcpServe('n2-p1', PORT);
    const x = await t.tcpServe('server', PORT);
    try {
      for (const [from, ip, want] of [['n1-p1', t.podIp6('n2-p1'), 'n2-p1'], ['n1-p1', t.externalIp6('server'), 'server'], ['client', t.podIp6('n2-p1'), 'n2-p1']]) {
        const r = await t.tcpProbe(from, ip, PORT);
        assert.is(r.reply, want, `${from} → ${ip}: ${r.error}`);
      }
    } finally {
      s.stop();
      x.stop();
    }
  });
});

test('host-local dual-stack: a static IPv6 /64 per node as well, TCP across nodes in both families', async () => {
  await withTestbed({ nodes: [{ name: 'n1', pods: 1 }, { name: 'n2', pods: 1 }], externals: [], tether: false, families: [4, 6] }, async (t) => {
    assert.is(t.ipam, 'host-local');
    assert.ok(inCidr(t.podIp6('n1-p1'), 'fd00:10:244:1::/64') && inCidr(t.podIp6('n2-p1'), 'fd00:10:244:2::/64'));
    const s = await t.tcpServe('n2-p1', PORT);
    try {
      assert.is((await t.tcpProbe('n1-p1', t.podIp6('n2-p1'), PORT)).reply, 'n2-p1');
      assert.is((await t.tcpProbe('n1-p1', t.podIp('n2-p1'), PORT)).reply, 'n2-p1');
    } finally {
      s.stop();
    }
  });
});

test('down() leaves no namespace, run dir or pin dir of the run', async () => {
  const other = await Testbed.up({ nodes: [{ name: 'n1', pods: 1 }], tether: false });
  const prefix = other.prefix;
  assert.ok(listNetns().filter((n) => n.startsWith(`${prefix}-`)).length >= 5, 'router, node, 2 externals, pod exist');
  assert.ok(fs.existsSync(runDir(prefix)));
  other.spawn('n1', ['sleep', '600']); // a stray process must not keep anything alive
  await other.down();
  const ipList = (await run(['ip', 'netns', 'list'])).stdout;
  assert.not.match(ipList, prefix);
  assert.not.ok(fs.existsSync(runDir(prefix)));
  assert.not.ok(fs.existsSync(bpfDir(prefix)));
  assert.equal(leftovers(prefix), []);
});

test('a test that throws mid-way still tears down', async () => {
  let prefix = '';
  const err = await withTestbed({ nodes: [{ name: 'n1', pods: 1 }, { name: 'n2' }], tether: false }, async (t) => {
    prefix = t.prefix;
    await t.addPod('n2');
    throw new Error('simulated failure');
  }).then(
    () => undefined,
    (e: Error) => e,
  );
  assert.match(err?.message ?? '', 'simulated failure');
  assert.ok(prefix);
  assert.equal(leftovers(prefix), []);
});

test('a failing bring-up removes what it built and reports the CNI error', async () => {
  const before = new Set(listNetns());
  // ptp cannot create a veth with MTU 10: the ADD fails in the middle of bring-up.
  const err = await Testbed.up({ nodes: [{ name: 'n1', pods: 1 }], podMtu: 10, tether: false }).then(
    (t) => t.down().then(() => undefined),
    (e: unknown) => e,
  );
  assert.instance(err, CniError);
  assert.is((err as CniError).plugin, 'ptp');
  const added = listNetns().filter((n) => !before.has(n) && /^tb[0-9a-f]{4}-/.test(n));
  assert.equal(added, []);
});

// With tether built, the child runs tether-ipam, so it owns a redis-server (outside its namespaces) too.
const CHILD_TOPO: Topology = tetherBinariesPresent()
  ? { nodes: [{ name: 'n1', pods: 1 }], externals: [], tether: true, ipam: 'tether-ipam' }
  : { nodes: [{ name: 'n1', pods: 1 }], tether: false };

/** The redis-server a run recorded, if any: its pid and temp dir. */
function recordedRedis(prefix: string): { pid: number; dir: string } | undefined {
  try {
    return JSON.parse(fs.readFileSync(path.join(runDir(prefix), 'redis.json'), 'utf8')) as { pid: number; dir: string };
  } catch {
    return undefined;
  }
}

// A child process that brings a one-node testbed up, prints its prefix and waits to be signalled.
async function childTestbed(): Promise<{ prefix: string; kill: (s: NodeJS.Signals) => Promise<NodeJS.Signals | null> }> {
  const script = path.join(fs.mkdtempSync(path.join(os.tmpdir(), 'tb-child-')), 'child.ts');
  fs.writeFileSync(
    script,
    `import { Testbed } from ${JSON.stringify(path.join(__dirname, 'testbed'))};
Testbed.up(${JSON.stringify(CHILD_TOPO)}).then((tb) => {
  process.stdout.write(tb.prefix + '\\n');
  setInterval(() => undefined, 1000);
});`,
  );
  // The child's tetherd runs as a plain process: its teardown on SIGINT and the sweep after SIGKILL reach
  // what lives in the run's namespaces, not the private containerd of a containerized run (which would be
  // left running, orphaned).
  const child = spawn(process.execPath, ['-r', 'tsx/cjs', script], {
    cwd: path.resolve(__dirname, '../..'), stdio: ['ignore', 'pipe', 'inherit'], env: { ...process.env, TETHER_TESTBED_CONTAINERS: '0' },
  });
  const exited = new Promise<NodeJS.Signals | null>((r) => child.once('exit', (_c, s) => r(s)));
  const prefix = await new Promise<string>((resolve, reject) => {
    child.stdout.on('data', (b: Buffer) => resolve(b.toString().trim()));
    child.once('exit', (c) => reject(new Error(`child exited ${c} before up`)));
  });
  return {
    prefix,
    kill: (s) => {
      child.kill(s);
      return exited.finally(() => fs.rmSync(path.dirname(script), { recursive: true, force: true }));
    },
  };
}

test('Ctrl-C (SIGINT) in the owning process tears its testbed down', async () => {
  const c = await childTestbed();
  try {
    assert.ok(leftovers(c.prefix).length > 0, 'the child built something');
    const redis = recordedRedis(c.prefix);
    if (CHILD_TOPO.tether) assert.ok(redis && pidAlive(redis.pid), 'the tether-ipam child runs a Redis');
    const sig = await c.kill('SIGINT');
    assert.is(sig, 'SIGINT', 'the handler re-raises so the exit status still says SIGINT');
    assert.equal(leftovers(c.prefix), []);
    if (redis) {
      assert.not.ok(pidAlive(redis.pid), 'its redis-server is gone');
      assert.not.ok(fs.existsSync(redis.dir));
    }
  } finally {
    await c.kill('SIGKILL'); // no-op when it is gone; otherwise the sweep below cleans up after it
    sweepStale();
  }
});

test('sweepStale() removes what a SIGKILLed run left, and spares live runs', async () => {
  const c = await childTestbed();
  try {
    assert.not.ok(sweepStale().includes(c.prefix), 'a live owner is not swept');
    assert.not.ok(sweepStale().includes(tb.prefix));
    await c.kill('SIGKILL');
    assert.ok(leftovers(c.prefix).length > 0, 'SIGKILL runs no handler: leftovers remain');
    const redis = recordedRedis(c.prefix);
    if (CHILD_TOPO.tether) assert.ok(redis && pidAlive(redis.pid), 'the orphaned redis-server still runs');
    assert.ok(sweepStale().includes(c.prefix));
    assert.equal(leftovers(c.prefix), []);
    if (redis) {
      assert.not.ok(pidAlive(redis.pid), "the sweep killed the dead run's redis-server");
      assert.not.ok(fs.existsSync(redis.dir));
    }
    assert.equal(tb.leftovers().length > 0, true, 'the live shared testbed is untouched');
  } finally {
    await c.kill('SIGKILL');
    sweepStale();
  }
});

test.run();
