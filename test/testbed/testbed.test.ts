// The testbed on the real kernel: pods get node-local addresses through the CNI chain, traffic flows
// within a node, across nodes and to and from external hosts, DEL undoes ADD, and teardown leaves
// nothing behind — after success, after a throw, after Ctrl-C, and (via sweepStale) after a SIGKILL.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { spawn } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { CniError } from './cni-chain';
import { bpfDir, leftovers, listNetns, runDir, sweepStale } from './cleanup';
import { run } from './proc';
import { binDir } from './tetherd';
import { NETWORK_NAME, Testbed, withTestbed } from './testbed';
import { inCidr, Topology } from './topology';

const TOPO: Topology = {
  nodes: [
    { name: 'n1', zone: 'a', pods: 2 },
    { name: 'n2', zone: 'a', pods: 2 },
    { name: 'n3', zone: 'b', pods: 2 },
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

test('every pod got an address from its own node CIDR, and the chain ran the expected plugins', () => {
  const pods = tb.listPods();
  assert.is(pods.length, 6);
  const ips = new Set<string>();
  for (const p of pods) {
    assert.ok(inCidr(p.ip, tb.node(p.node).podCidr), `${p.key} has ${p.ip}, outside ${tb.node(p.node).podCidr}`);
    assert.is.not(p.ip, tb.node(p.node).podGateway);
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
  assert.match(addr.stdout, ` ${p.ip}/24 `);
  const route = await tb.mustExec(p.key, ['ip', 'route', 'show', 'default']);
  assert.match(route.stdout, `via ${tb.node('n2').podGateway} dev eth0`);
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

test('chain DEL removes the host veth, the host route, the host-local reservation and the cached result', async () => {
  const pod = await tb.addPod('n1', 'extra');
  const hostVeth = pod.result.interfaces?.find((i) => !i.sandbox)?.name;
  assert.ok(hostVeth, 'ptp reported its host-side veth');
  const reservation = path.join(tb.nodeDir('n1', 'ipam'), NETWORK_NAME, pod.ip);
  // Preconditions, so the checks after DEL mean something.
  assert.is((await tb.exec('n1', ['ip', 'link', 'show', 'dev', hostVeth])).code, 0);
  assert.match((await tb.mustExec('n1', ['ip', 'route', 'show', `${pod.ip}/32`])).stdout, hostVeth);
  assert.ok(fs.existsSync(reservation), `host-local reserved ${reservation}`);
  assert.ok(pod.chain.cachedResult(pod));

  const out = await tb.delPod(pod.key);
  assert.equal(out.invocations.map((i) => `${i.command}:${i.plugin}`), tb.tetherEnabled ? ['DEL:tether', 'DEL:ptp'] : ['DEL:ptp']);
  assert.is.not((await tb.exec('n1', ['ip', 'link', 'show', 'dev', hostVeth])).code, 0, 'host veth is gone');
  assert.is((await tb.mustExec('n1', ['ip', 'route', 'show', `${pod.ip}/32`])).stdout.trim(), '', 'host route is gone');
  assert.not.ok(fs.existsSync(reservation), 'host-local reservation is released');
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

// A child process that brings a one-node testbed up, prints its prefix and waits to be signalled.
async function childTestbed(): Promise<{ prefix: string; kill: (s: NodeJS.Signals) => Promise<NodeJS.Signals | null> }> {
  const script = path.join(fs.mkdtempSync(path.join(os.tmpdir(), 'tb-child-')), 'child.ts');
  fs.writeFileSync(
    script,
    `import { Testbed } from ${JSON.stringify(path.join(__dirname, 'testbed'))};
Testbed.up({ nodes: [{ name: 'n1', pods: 1 }], tether: false }).then((tb) => {
  process.stdout.write(tb.prefix + '\\n');
  setInterval(() => undefined, 1000);
});`,
  );
  const child = spawn(process.execPath, ['-r', 'tsx/cjs', script], { cwd: path.resolve(__dirname, '../..'), stdio: ['ignore', 'pipe', 'inherit'] });
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
  assert.ok(leftovers(c.prefix).length > 0, 'the child built something');
  const sig = await c.kill('SIGINT');
  assert.is(sig, 'SIGINT', 'the handler re-raises so the exit status still says SIGINT');
  assert.equal(leftovers(c.prefix), []);
});

test('sweepStale() removes what a SIGKILLed run left, and spares live runs', async () => {
  const c = await childTestbed();
  assert.not.ok(sweepStale().includes(c.prefix), 'a live owner is not swept');
  assert.not.ok(sweepStale().includes(tb.prefix));
  await c.kill('SIGKILL');
  assert.ok(leftovers(c.prefix).length > 0, 'SIGKILL runs no handler: leftovers remain');
  assert.ok(sweepStale().includes(c.prefix));
  assert.equal(leftovers(c.prefix), []);
  assert.equal(tb.leftovers().length > 0, true, 'the live shared testbed is untouched');
});

test.run();
