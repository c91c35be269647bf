// The deletion queue: DEL never fails because tetherd is away, ADD still fails closed. The queue's files
// and tetherd's drain in-process; the built `tether`/`tether-ipam` against sockets that answer errors or
// hang up; then the real chain (Debian's ptp with tether-ipam as its IPAM, then tether) in a node namespace
// with a real tetherd and Redis: tetherd stopped, uninstalled, and SIGKILLed during parallel DELs.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { execFileSync } from 'node:child_process';
import { captureLogger } from '../lib/log-capture';
import { DeleteQueue, GARBLED_DIR } from '../../daemon/pod/delete-queue';
import { MAX_QUEUED_DELETES, parseQueuedDelete, queueDelete, queueFileName, type QueuedDelete } from '../../lib/api/delete-queue';
import type { CniParams } from '../../lib/api/protocol';
import { BIN_DIR, bin } from '../lib/binaries';
import { runCni } from '../lib/cni-exec';
import { fakeTetherd, reply } from '../lib/fake-tetherd';
import { removeDaemonDir, startDaemon, type TestDaemon } from '../lib/daemon';
import { addNetns, delNetns, ipJson, uniqueName } from '../lib/netns';
import { startRedis, type TestRedis } from '../lib/redis';
import { CniChain, type Attachment, type Conflist } from '../testbed/cni-chain';
import { run, sleep } from '../testbed/proc';

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'tether-delq-'));

test.after(() => fs.rmSync(tmp, { recursive: true, force: true }));

// ---------------------------------------------------------------------------------------------------
// The queue's files and tetherd's drain, in-process.

function params(containerId: string, extra: Partial<CniParams> = {}): CniParams {
  return {
    command: 'DEL',
    containerId,
    netns: '',
    ifName: 'eth0',
    args: { K8S_POD_NAMESPACE: 'ns1', K8S_POD_NAME: `pod-${containerId}` },
    config: { cniVersion: '1.0.0', name: 'net1', type: 'tether' },
    ...extra,
  };
}

const capture = captureLogger;

function queueDir(name: string): string {
  const state = path.join(tmp, name);
  fs.mkdirSync(state, { recursive: true });
  return path.join(state, 'delete-queue');
}

const requestFiles = (dir: string) => fs.readdirSync(dir).filter((n) => n.endsWith('.json')).sort();

test('file names: one per method, container and interface; a long container ID is hashed within NAME_MAX', () => {
  assert.is(queueFileName('cni.del', 'abc', 'eth0'), 'cni.del:abc:eth0.json');
  assert.is.not(queueFileName('ipam.del', 'abc', 'eth0'), queueFileName('cni.del', 'abc', 'eth0'));
  assert.is.not(queueFileName('cni.del', 'abc', 'eth1'), queueFileName('cni.del', 'abc', 'eth0'));
  const long = 'c'.repeat(255);
  const a = queueFileName('cni.del', long, 'eth0');
  const b = queueFileName('cni.del', long.slice(0, 254) + 'd', 'eth0');
  assert.ok(Buffer.byteLength(a) <= 255, a);
  assert.match(a, /^cni\.del:sha256-[0-9a-f]{64}\.json$/);
  assert.is.not(a, b, 'IDs differing in the last character get different files');
});

test('queueDelete: a durable 0600 file that parses back; a repeat overwrites; no state dir or a full queue writes nothing', () => {
  const dir = queueDir('write');
  const first = queueDelete(dir, { method: 'cni.del', queuedAt: new Date().toISOString(), reason: 'test: ENOENT', params: params('c1') });
  assert.ok(first.queued, JSON.stringify(first));
  const file = (first as { file: string }).file;
  assert.is(fs.statSync(file).mode & 0o777, 0o600);
  assert.is(fs.statSync(dir).mode & 0o777, 0o700);
  const back = parseQueuedDelete(fs.readFileSync(file, 'utf8'));
  assert.is(back.method, 'cni.del');
  assert.is(back.params.containerId, 'c1');
  assert.is(back.reason, 'test: ENOENT');
  const again = queueDelete(dir, { method: 'cni.del', queuedAt: new Date().toISOString(), reason: 'test: again', params: params('c1') });
  assert.ok(again.queued);
  assert.equal(fs.readdirSync(dir), ['cni.del:c1:eth0.json'], 'one file per pod; no temp file left');
  assert.is(parseQueuedDelete(fs.readFileSync(file, 'utf8')).reason, 'test: again');

  // No tetherd state on the node (uninstalled): nothing to release later, nothing created.
  const gone = path.join(tmp, 'no-such-state', 'delete-queue');
  const none = queueDelete(gone, { method: 'cni.del', queuedAt: new Date().toISOString(), reason: 'x', params: params('c2') });
  assert.not.ok(none.queued);
  assert.match((none as { why: string }).why, /no tetherd state/);
  assert.not.ok(fs.existsSync(path.dirname(gone)));

  // Full: a new pod's DEL is not written; the same pod's repeat still overwrites its file.
  const full = queueDir('full');
  fs.mkdirSync(full);
  for (let i = 0; i < MAX_QUEUED_DELETES - 1; i++) fs.writeFileSync(path.join(full, `filler-${i}.json`), '');
  assert.ok(queueDelete(full, { method: 'cni.del', queuedAt: new Date().toISOString(), reason: 'x', params: params('last') }).queued);
  const over = queueDelete(full, { method: 'cni.del', queuedAt: new Date().toISOString(), reason: 'x', params: params('over') });
  assert.not.ok(over.queued);
  assert.match((over as { why: string }).why, new RegExp(`already holds ${MAX_QUEUED_DELETES} requests`));
  assert.ok(queueDelete(full, { method: 'cni.del', queuedAt: new Date().toISOString(), reason: 'y', params: params('last') }).queued);
  fs.rmSync(path.dirname(full), { recursive: true });
});

function enqueue(dir: string, method: QueuedDelete['method'], p: CniParams, queuedAt: string): string {
  const out = queueDelete(dir, { method, queuedAt, reason: 'test', params: p });
  assert.ok(out.queued, JSON.stringify(out));
  return path.basename((out as { file: string }).file);
}

test('drain: replays in queue order, removes each file, one log line per request naming the pod', async () => {
  const dir = queueDir('order');
  enqueue(dir, 'ipam.del', params('a'), '2026-01-01T00:00:02.000Z');
  enqueue(dir, 'cni.del', params('a'), '2026-01-01T00:00:01.000Z');
  enqueue(dir, 'cni.del', params('b'), '2026-01-01T00:00:03.000Z');
  const seen: string[] = [];
  const { logger, lines, settle } = capture();
  const q = new DeleteQueue(dir, { 'cni.del': (p) => void seen.push(`cni:${p.containerId}`), 'ipam.del': async (p) => void seen.push(`ipam:${p.containerId}`) }, logger);
  assert.equal(await q.drain(), { done: 3, failed: 0, garbled: 0, waiting: 0 });
  assert.equal(seen, ['cni:a', 'ipam:a', 'cni:b']);
  assert.equal(requestFiles(dir), []);
  await settle();
  const done = lines.filter((l) => l.message === 'delete queue: queued DEL done');
  assert.equal(done.map((l) => `${l.method} ${l.pod} ${l.container} ${l.ifName}`), ['cni.del ns1/pod-a a eth0', 'ipam.del ns1/pod-a a eth0', 'cni.del ns1/pod-b b eth0']);
  assert.equal(await q.drain(), { done: 0, failed: 0, garbled: 0, waiting: 0 }, 'nothing replayed twice');
});

test('drain: a failing DEL is kept and retried after its backoff; garbled files are set aside; stale temp files go, fresh ones stay', async () => {
  const dir = queueDir('faults');
  const failing = enqueue(dir, 'cni.del', params('fails'), '2026-01-01T00:00:01.000Z');
  enqueue(dir, 'cni.del', params('works'), '2026-01-01T00:00:02.000Z');
  fs.writeFileSync(path.join(dir, 'cni.del:junk:eth0.json'), '{"format":1,"method":"cni.del"'); // torn JSON
  fs.writeFileSync(path.join(dir, 'ipam.del:bad:eth0.json'), JSON.stringify({ format: 1, method: 'ipam.del', queuedAt: 'x', reason: '', params: {} }));
  fs.writeFileSync(path.join(dir, 'cni.del:badid:eth0.json'), JSON.stringify({ format: 1, method: 'cni.del', queuedAt: new Date().toISOString(), reason: '', params: params('bad/id') }));
  fs.writeFileSync(path.join(dir, 'stray.txt'), 'hello');
  const stale = path.join(dir, '.cni.del:old:eth0.json.123.tmp');
  const fresh = path.join(dir, '.cni.del:new:eth0.json.124.tmp');
  fs.writeFileSync(stale, '{');
  fs.utimesSync(stale, new Date(Date.now() - 120_000), new Date(Date.now() - 120_000));
  fs.writeFileSync(fresh, '{');
  let fail = true;
  const replayed: string[] = [];
  const { logger, lines, settle } = capture();
  const q = new DeleteQueue(
    dir,
    {
      'cni.del': (p) => {
        if (p.containerId === 'fails' && fail) throw new Error('netlink says no');
        replayed.push(p.containerId);
      },
      'ipam.del': () => undefined,
    },
    logger,
    50, // retry interval: the first backoff is 50 ms
  );
  assert.equal(await q.drain(), { done: 1, failed: 1, garbled: 4, waiting: 0 });
  assert.equal(requestFiles(dir), [failing], 'the failed request is kept; the others are gone or set aside');
  const aside = fs.readdirSync(path.join(dir, GARBLED_DIR)).sort();
  assert.is(aside.length, 4);
  for (const n of ['cni.del:junk:eth0.json', 'ipam.del:bad:eth0.json', 'cni.del:badid:eth0.json', 'stray.txt']) assert.ok(aside.some((a) => a.startsWith(`${n}.`)), `${n} set aside: ${aside}`);
  assert.not.ok(fs.existsSync(stale), 'a temp file of a killed client is removed');
  assert.ok(fs.existsSync(fresh), 'a client writing right now keeps its temp file');
  await settle();
  const moved = lines.filter((l) => l.message === 'delete queue: unreadable request moved aside, not replayed');
  assert.is(moved.length, 4);
  assert.ok(moved.some((l) => l.file === 'cni.del:junk:eth0.json' && /not JSON/.test(l.error)), JSON.stringify(moved));
  assert.ok(moved.some((l) => l.file === 'ipam.del:bad:eth0.json' && /queuedAt/.test(l.error)));
  assert.ok(moved.some((l) => l.file === 'cni.del:badid:eth0.json' && /CNI_CONTAINERID/.test(l.error)));
  const warn = lines.find((l) => l.message === 'delete queue: queued DEL failed; kept for retry');
  assert.is(warn?.pod, 'ns1/pod-fails');
  assert.is(warn?.error, 'netlink says no');

  // Within its backoff the failed request waits; after it, it is replayed and removed.
  assert.equal(await q.drain(), { done: 0, failed: 0, garbled: 0, waiting: 1 });
  fail = false;
  await sleep(60);
  assert.equal(await q.drain(), { done: 1, failed: 0, garbled: 0, waiting: 0 });
  assert.equal(replayed, ['works', 'fails']);
  assert.equal(requestFiles(dir), []);
});

test('a request queued again while it was being replayed is kept for the next drain', async () => {
  const dir = queueDir('requeue');
  enqueue(dir, 'cni.del', params('r'), '2026-01-01T00:00:01.000Z');
  let calls = 0;
  const q = new DeleteQueue(
    dir,
    {
      'cni.del': (p) => {
        // The runtime retried this pod's DEL while tetherd was still away: the client rewrote the file.
        if (++calls === 1) enqueue(dir, 'cni.del', p, '2026-01-01T00:00:05.000Z');
      },
      'ipam.del': () => undefined,
    },
    capture().logger,
  );
  await q.drain();
  assert.equal(requestFiles(dir), ['cni.del:r:eth0.json'], 'the newer copy was not removed unseen');
  await q.drain();
  assert.is(calls, 2);
  assert.equal(requestFiles(dir), []);
});

// ---------------------------------------------------------------------------------------------------
// The built CNI executables against sockets that are not a working tetherd.

const TETHER_PREV = { cniVersion: '1.0.0', interfaces: [{ name: 'eth0', sandbox: '/proc/self/ns/net' }], ips: [{ address: '10.1.0.2/24', interface: 0 }] };

function cniEnv(cmd: string, id: string): Record<string, string> {
  return { CNI_COMMAND: cmd, CNI_CONTAINERID: id, CNI_NETNS: '/proc/self/ns/net', CNI_IFNAME: 'eth0', CNI_PATH: BIN_DIR, CNI_ARGS: `K8S_POD_NAMESPACE=ns1;K8S_POD_NAME=${id}` };
}
const tetherConf = (socketPath: string, deleteQueueDir: string, extra: Record<string, unknown> = {}) =>
  JSON.stringify({ cniVersion: '1.0.0', name: 'net1', type: 'tether', socketPath, deleteQueueDir, prevResult: TETHER_PREV, ...extra });
const ipamConf = (socketPath: string, deleteQueueDir: string) =>
  JSON.stringify({ cniVersion: '1.0.0', name: 'net1', type: 'ptp', ipam: { type: 'tether-ipam', pool: 'default', socketPath, deleteQueueDir } });

/** runCni without blocking this process's event loop (the fake tetherd below runs in it). */
async function runCniAsync(plugin: string, env: Record<string, string>, stdin: string): Promise<{ status: number | null; stdout: string; stderr: string; json?: Record<string, unknown> }> {
  const r = await run([plugin], { input: stdin, env: { PATH: process.env.PATH ?? '/usr/bin:/bin', ...env }, timeoutMs: 30_000 });
  let json: Record<string, unknown> | undefined;
  try {
    json = r.stdout.trim() ? (JSON.parse(r.stdout) as Record<string, unknown>) : undefined;
  } catch {
    json = undefined;
  }
  return { status: r.code, stdout: r.stdout, stderr: r.stderr, json };
}

test('tether DEL: a tetherd answering an error fails the DEL (code 11, nothing queued); one hanging up before answering gets it queued', async () => {
  const dir = queueDir('fake');
  const sock = path.join(tmp, 'fake.sock');
  let close = await fakeTetherd(sock, (s, line) => reply(s, line, { error: { code: 'TRY_AGAIN_LATER', message: 'tetherd is stopping; try again' } }));
  const answered = await runCniAsync(bin('tether'), cniEnv('DEL', 'err1'), tetherConf(sock, dir));
  await close();
  assert.is(answered.status, 1, answered.stdout);
  assert.is(answered.json?.code, 11);
  assert.match(String(answered.json?.msg), /stopping/);
  assert.not.ok(fs.existsSync(dir) && requestFiles(dir).length, 'an error answer is not "unreachable": nothing queued');

  // Killed while handling the request: the connection ends with no answer.
  close = await fakeTetherd(sock, (s) => s.destroy());
  const lost = await runCniAsync(bin('tether'), cniEnv('DEL', 'lost1'), tetherConf(sock, dir));
  const lostIpam = await runCniAsync(bin('tether-ipam'), cniEnv('DEL', 'lost1'), ipamConf(sock, dir));
  await close();
  assert.is(lost.status, 0, lost.stdout + lost.stderr);
  assert.is(lost.stdout, '', 'a DEL prints nothing on success');
  assert.match(lost.stderr, /closed the connection before answering cni\.del.*DEL of container lost1 eth0 \(pod ns1\/lost1\) queued in/);
  assert.is(lostIpam.status, 0, lostIpam.stdout + lostIpam.stderr);
  assert.equal(requestFiles(dir), ['cni.del:lost1:eth0.json', 'ipam.del:lost1:eth0.json']);
  const q = parseQueuedDelete(fs.readFileSync(path.join(dir, 'ipam.del:lost1:eth0.json'), 'utf8'));
  assert.is((q.params.config.ipam as { pool: string }).pool, 'default', 'the primary config travels whole');
});

test('tetherd away: ADD (tether and tether-ipam) and CHECK fail with code 11 and queue nothing; a bad deleteQueueDir fails DEL with code 7', () => {
  const dir = queueDir('closed');
  const sock = path.join(tmp, 'nobody.sock');
  for (const [plugin, stdin] of [
    ['tether', tetherConf(sock, dir)],
    ['tether-ipam', ipamConf(sock, dir)],
  ] as const) {
    const r = runCni(bin(plugin), cniEnv('ADD', 'add1'), stdin);
    assert.is(r.status, 1, `${plugin}: ${r.stdout}`);
    assert.is(r.json?.code, 11);
    assert.match(String(r.json?.msg), /tetherd is not reachable at .*nobody\.sock: ENOENT/);
  }
  const ck = runCni(bin('tether'), cniEnv('CHECK', 'add1'), tetherConf(sock, dir));
  assert.is(ck.json?.code, 11);
  assert.not.ok(fs.existsSync(dir), 'nothing queued, not even the directory');
  const bad = runCni(bin('tether'), cniEnv('DEL', 'add1'), tetherConf(sock, 'relative/queue'));
  assert.is(bad.status, 1);
  assert.is(bad.json?.code, 7);
  assert.match(String(bad.json?.msg), /deleteQueueDir: must be an absolute path/);
  const badIpam = runCni(bin('tether-ipam'), cniEnv('DEL', 'add1'), JSON.stringify({ cniVersion: '1.0.0', name: 'net1', type: 'ptp', ipam: { type: 'tether-ipam', socketPath: sock, deleteQueueDir: 7 } }));
  assert.is(badIpam.json?.code, 7);
  assert.match(String(badIpam.json?.msg), /ipam\.deleteQueueDir: must be an absolute path/);
});

// ---------------------------------------------------------------------------------------------------
// The real chain: ptp (tether-ipam as its IPAM), then tether, as a runtime runs it, in a node namespace.

// Three usable addresses (the block's first is the gateway): a leaked one shows as a failing fourth ADD.
const POOLS = `
apiVersion: tether.dev/v1alpha1
kind: AddressPool
metadata: { name: small }
spec: { usage: pod, ipv4: { cidr: 10.77.0.0/30, blockSize: 30 } }
`;

interface Node {
  ns: string;
  dir: string;
  daemon: TestDaemon;
  queue: string;
  chain: CniChain;
  pods: string[];
}

/** A node namespace with its own tetherd and Redis (block claims of one test never meet another's). */
async function withNode(fn: (n: Node) => Promise<void>, pools = POOLS): Promise<void> {
  let redis: TestRedis | undefined;
  const ns = uniqueName('tdq');
  const dir = fs.mkdtempSync(path.join(tmp, 'node-'));
  const n: Node = { ns, dir, pods: [], queue: '', daemon: undefined as unknown as TestDaemon, chain: undefined as unknown as CniChain };
  try {
    addNetns(ns);
    execFileSync('ip', ['netns', 'exec', ns, 'sysctl', '-qw', 'net.ipv4.ip_forward=1']);
    fs.writeFileSync(path.join(dir, 'pools.yaml'), pools);
    redis = await startRedis();
    n.daemon = await startDaemon({ netns: `/run/netns/${ns}`, dir: path.join(dir, 'tetherd'), node: ns, extraArgs: ['--config', path.join(dir, 'pools.yaml'), '--redis', redis.url] });
    n.queue = path.join(n.daemon.stateDir, 'delete-queue');
    const socketPath = n.daemon.socket;
    const list: Conflist = {
      cniVersion: '1.0.0',
      name: 'delq-net',
      plugins: [
        { type: 'ptp', ipMasq: false, mtu: 1500, ipam: { type: 'tether-ipam', pool: 'small', socketPath, deleteQueueDir: n.queue, routes: [{ dst: '0.0.0.0/0' }] } },
        { type: 'tether', socketPath, deleteQueueDir: n.queue },
      ],
    };
    n.chain = new CniChain(list, { cniPath: ['/usr/lib/cni', BIN_DIR], cacheDir: path.join(dir, 'cache'), runInNetns: `/run/netns/${ns}` });
    await fn(n);
  } finally {
    await n.daemon?.stop('SIGKILL');
    delNetns(...n.pods, ns);
    if (n.daemon) removeDaemonDir(n.daemon);
    fs.rmSync(dir, { recursive: true, force: true });
    await redis?.stop();
  }
}

function pod(n: Node, i: number): Attachment {
  const name = uniqueName('tdqp');
  n.pods.push(name);
  return { containerId: `ctr-${name}`, netns: addNetns(name), ifName: 'eth0', args: { IgnoreUnknown: '1', K8S_POD_NAMESPACE: 'default', K8S_POD_NAME: `p${i}-${name}` } };
}

function status(n: Node): any {
  return JSON.parse(execFileSync(bin('tetherctl'), ['--socket', n.daemon.socket, 'status'], { encoding: 'utf8' }));
}
const allocated = (s: any): number => s.ipam.pods.find((p: any) => p.pool === 'small').families.reduce((k: number, f: any) => k + f.allocated, 0);
const hostVeth = (r: { interfaces?: Array<{ name: string; sandbox?: string }> }) => r.interfaces!.find((i) => !i.sandbox)!.name;
const links = (ns: string) => new Set(ipJson(ns, ['link', 'show']).map((l) => l.ifname as string));
const logLines = (d: TestDaemon): Array<Record<string, any>> =>
  d
    .log()
    .split('\n')
    .filter((l) => l.startsWith('{'))
    .map((l) => JSON.parse(l) as Record<string, any>);
const queued = (n: Node) => (fs.existsSync(n.queue) ? requestFiles(n.queue) : []);

test('real chain: tetherd stopped → DEL succeeds and ptp removes the veth; tetherd back → queue drained, record and address released', async () => {
  await withNode(async (n) => {
    const p1 = pod(n, 1);
    const added = await n.chain.add(p1);
    const addr = added.result!.ips![0].address;
    const veth = hostVeth(added.result!);
    assert.ok(links(n.ns).has(veth));
    assert.is(status(n).pods.length, 1);

    await n.daemon.stop('SIGTERM');
    assert.not.ok(fs.existsSync(n.daemon.socket), 'a clean stop removes the socket');
    const del = await n.chain.del(p1);
    assert.equal(del.invocations.map((i) => `${i.plugin}:${i.exitCode}`), ['tether:0', 'ptp:0'], 'every plugin of the chain ran and succeeded');
    assert.match(del.invocations[0].stderr, /ENOENT; DEL of container .* queued in/);
    assert.not.ok(links(n.ns).has(veth), 'ptp removed the host-side veth');
    assert.equal(queued(n), [`cni.del:${p1.containerId}:eth0.json`, `ipam.del:${p1.containerId}:eth0.json`]);
    // A garbled request beside them must not stop tetherd or the others.
    fs.writeFileSync(path.join(n.queue, 'cni.del:garbage:eth0.json'), 'not json');

    n.daemon = await n.daemon.restart();
    assert.equal(queued(n), [], 'nothing left in the queue');
    assert.equal(fs.readdirSync(path.join(n.queue, GARBLED_DIR)).length, 1, 'the garbled file is set aside');
    const s = status(n);
    assert.equal(s.pods, [], 'the pod record is gone');
    assert.is(allocated(s), 0, 'the address is released');
    const log = logLines(n.daemon);
    for (const m of ['cni.del', 'ipam.del']) {
      const line = log.find((l) => l.message === 'delete queue: queued DEL done' && l.method === m);
      assert.is(line?.pod, `default/${(p1.args as Record<string, string>).K8S_POD_NAME}`, `${m} drained, naming the pod`);
      assert.is(line?.container, p1.containerId);
    }
    const aside = log.find((l) => l.message === 'delete queue: unreadable request moved aside, not replayed');
    assert.is(aside?.file, 'cni.del:garbage:eth0.json');
    assert.match(String(aside?.error), /not JSON/);
    // The released address is given again: three pods take the whole pool, one of them p1's address.
    const again: string[] = [];
    for (let i = 2; i <= 4; i++) again.push((await n.chain.add(pod(n, i))).result!.ips![0].address);
    assert.ok(again.includes(addr), `${addr} reused: ${again}`);
  });
});

test('real chain: tetherd uninstalled (socket and state dir gone, binaries still there) → DEL succeeds, nothing written', async () => {
  await withNode(async (n) => {
    const p1 = pod(n, 1);
    const veth = hostVeth((await n.chain.add(p1)).result!);
    await n.daemon.stop('SIGTERM');
    fs.rmSync(n.daemon.stateDir, { recursive: true, force: true });
    const del = await n.chain.del(p1);
    assert.equal(del.invocations.map((i) => `${i.plugin}:${i.exitCode}`), ['tether:0', 'ptp:0']);
    assert.match(del.invocations[0].stderr, /not queued: .*does not exist \(no tetherd state on this node\)/);
    assert.not.ok(links(n.ns).has(veth), 'ptp removed the host-side veth');
    assert.not.ok(fs.existsSync(n.daemon.stateDir), 'no state dir recreated');
    // The runtime retries nothing and deletes the next pod the same way.
    await n.chain.del(p1);
  });
});

test('real chain: tetherd SIGKILLed while 10 DELs run in parallel → every DEL succeeds; after restart nothing leaks', async () => {
  await withNode(async (n) => {
    const pods: Attachment[] = [];
    const veths: string[] = [];
    for (let i = 0; i < 10; i++) {
      const p = pod(n, i);
      pods.push(p);
      veths.push(hostVeth((await n.chain.add(p)).result!));
    }
    assert.is(status(n).pods.length, 10);
    const logBefore = n.daemon.log().length;
    const dels = pods.map((p) => n.chain.del(p).then(
      (o) => o,
      (e: Error) => e,
    ));
    // Kill it as soon as the first DEL was handled: the rest are under way or not yet connected.
    const deadline = Date.now() + 20_000;
    while (!n.daemon.log().slice(logBefore).includes('"message":"pod detached"') && Date.now() < deadline) await sleep(5);
    await n.daemon.stop('SIGKILL');
    const outcomes = await Promise.all(dels);
    for (const o of outcomes) assert.not.instance(o, Error, String(o));
    const stderr = outcomes.flatMap((o) => (o as Awaited<ReturnType<CniChain['del']>>).invocations.map((i) => i.stderr)).join('');
    const queuedNow = queued(n);
    assert.ok(queuedNow.length > 0, `some DELs found tetherd gone and were queued: ${stderr}`);
    for (const v of veths) assert.not.ok(links(n.ns).has(v), `${v} removed by ptp`);

    n.daemon = await n.daemon.restart();
    assert.equal(queued(n), []);
    const s = status(n);
    assert.equal(s.pods, [], 'no pod record left');
    assert.is(allocated(s), 0, 'no address left allocated');
    assert.not.ok(logLines(n.daemon).some((l) => l.message === 'delete queue: queued DEL failed; kept for retry'));
    assert.ok(logLines(n.daemon).filter((l) => l.message === 'delete queue: queued DEL done').length >= queuedNow.length);
    console.log(`  SIGKILL during DELs: ${queuedNow.length} requests queued (${[...new Set(stderr.match(/: (ENOENT|ECONNREFUSED|closed the connection|connection to tetherd)/g) ?? [])].join(', ')})`);
  }, POOLS.replace('cidr: 10.77.0.0/30, blockSize: 30', 'cidr: 10.77.0.0/27, blockSize: 27')); // ten pods
});

test.run();
