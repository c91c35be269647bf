// What tetherd does before it answers a CNI ADD, and what follows the answer (docs/cni.md, "Before the
// answer"): the pod's changes, then one durable record of them; the action lines and the role controllers'
// 'attached' only after, on the event loop's next turn. AttachService in-process, on real namespaces (a pod
// and a "host" one holding the veth's other end), its PodStore in a temp state dir.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { execFileSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { AttachService } from '../../daemon/pod/attach-service';
import { PodStore, type PodRecord } from '../../daemon/state/pod-store';
import { setLogger, log } from '../../lib/log';
import { inNetns, readNetSysctl, writeNetSysctls } from '../../daemon/sys/netns';
import type { CniParams } from '../../lib/api/protocol';
import { captureLogger } from '../lib/log-capture';
import { addNetns, delNetns, ipJson, uniqueName } from '../lib/netns';

const made: string[] = [];
const dirs: string[] = [];
const before = log();

test.after.each(() => {
  delNetns(...made.splice(0));
  for (const d of dirs.splice(0)) fs.rmSync(d, { recursive: true, force: true });
  setLogger(before);
});

/** A pod namespace (lo down, as a runtime creates it) with eth0 1500, its veth peer `hv` in a host namespace. */
function podPair(): { pod: string; host: string; podName: string } {
  const podName = uniqueName('tan-p');
  const hostName = uniqueName('tan-h');
  execFileSync('ip', ['netns', 'add', podName]);
  made.push(podName);
  addNetns(hostName);
  made.push(hostName);
  execFileSync('ip', ['-n', hostName, 'link', 'add', 'hv', 'mtu', '1500', 'type', 'veth', 'peer', 'name', 'eth0', 'netns', podName]);
  execFileSync('ip', ['-n', hostName, 'link', 'set', 'hv', 'up']);
  execFileSync('ip', ['-n', podName, 'link', 'set', 'eth0', 'up']);
  execFileSync('ip', ['-n', podName, 'addr', 'add', '10.31.0.2/24', 'dev', 'eth0']);
  return { pod: `/run/netns/${podName}`, host: `/run/netns/${hostName}`, podName };
}

function service(hostNetns: string) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tether-attach-'));
  dirs.push(dir);
  const cap = captureLogger();
  setLogger(cap.logger);
  const store = new PodStore(dir);
  store.load();
  // Every durable write of a record, with the phase it recorded.
  const puts: Array<PodRecord['phase']> = [];
  const put = store.put.bind(store);
  store.put = (r: PodRecord) => {
    puts.push(r.phase);
    put(r);
  };
  // Every line as it is written (synchronously: the captured stream delivers later).
  const written: string[] = [];
  for (const level of ['error', 'warn', 'info', 'debug'] as const) {
    const orig = cap.logger[level].bind(cap.logger) as (...a: unknown[]) => unknown;
    (cap.logger as unknown as Record<string, unknown>)[level] = (...a: unknown[]) => {
      written.push(String(a[0]));
      return orig(...a);
    };
  }
  const attach = new AttachService(store, cap.logger, { hostNetns });
  const events: string[] = [];
  attach.on('attached', (r: PodRecord) => events.push(`attached ${r.containerId}`));
  attach.on('detached', (r: PodRecord) => events.push(`detached ${r.containerId}`));
  return { dir, store, attach, puts, events, written, lines: cap.lines, settle: cap.settle };
}

function add(netns: string, containerId = 'ctr-1'): CniParams {
  return {
    command: 'ADD',
    containerId,
    netns,
    ifName: 'eth0',
    args: { K8S_POD_NAMESPACE: 'shop', K8S_POD_NAME: 'web' },
    config: {
      cniVersion: '1.0.0',
      name: 'tnet',
      type: 'tether',
      encapOverhead: 28,
      vips: ['198.51.100.10'],
      prevResult: {
        cniVersion: '1.0.0',
        interfaces: [{ name: 'hv' }, { name: 'eth0', sandbox: netns }],
        ips: [{ address: '10.31.0.2/24', interface: 1 }],
      },
    },
  };
}

const nextTurn = () => new Promise((r) => setImmediate(r));

test('ADD: the changes, then one durable record (attached) before the answer; nothing recorded ahead of them', async () => {
  const { pod, host, podName } = podPair();
  const s = service(host);
  const result = s.attach.add(add(pod));
  assert.equal(s.puts, ['attached'], 'one write, of the finished record');
  const files = fs.readdirSync(path.join(s.dir, 'pods'));
  assert.is(files.length, 1);
  const rec = JSON.parse(fs.readFileSync(path.join(s.dir, 'pods', files[0]), 'utf8')) as PodRecord;
  assert.is(rec.phase, 'attached');
  const applied = rec.applied as { podMtu: { value: number }; hostMtu: { value: number }; sysctls: unknown[]; vips: Array<{ address: string; dev: string }>; loBroughtUp?: boolean };
  assert.is(applied.podMtu.value, 1472);
  assert.is(applied.hostMtu.value, 1472);
  assert.is(applied.sysctls.length, 4);
  assert.equal(applied.vips.map((v) => v.address), ['198.51.100.10']);
  // What the record says is what the kernel has.
  assert.is(ipJson(podName, ['link', 'show', 'eth0'])[0].mtu, 1472);
  assert.ok(ipJson(podName, ['addr', 'show']).some((l: any) => (l.addr_info ?? []).some((a: any) => a.local === '198.51.100.10')), 'the VIP is on the pod');
  assert.is(readNetSysctl(pod, 'net/ipv4/conf/eth0/arp_ignore'), '1');
  assert.equal((result.ips as unknown[]).length, 1);
  // DEL undoes it and forgets it.
  await s.attach.del({ ...add(pod), command: 'DEL' });
  assert.equal(fs.readdirSync(path.join(s.dir, 'pods')), []);
  assert.is(ipJson(podName, ['link', 'show', 'eth0'])[0].mtu, 1500);
});

test('the action lines and "pod attached" follow the answer, every one of them, in order', async () => {
  const { pod, host } = podPair();
  const s = service(host);
  s.attach.add(add(pod));
  assert.equal(s.written, [], 'no line written while answering');
  await nextTurn();
  // The VIPs sit on a dummy tether0 where the kernel has the driver, else on lo (brought up).
  const vipDev = s.written.includes('VIP link created') ? 'VIP link created' : 'pod lo brought up to hold VIPs';
  assert.equal(s.written, [
    'pod interface MTU set',
    'host-side veth MTU set',
    'pod sysctl set',
    'pod sysctl set',
    'pod sysctl set',
    'pod sysctl set',
    vipDev,
    'VIP added',
    'pod attached',
  ]);
  await s.settle();
  assert.is(s.lines.length, 9);
  assert.ok(s.lines.every((l) => l.container === 'ctr-1' || l.netns === pod), 'each line names the pod');
  assert.equal(s.lines.filter((l) => l.message === 'pod sysctl set').map((l) => `${l.key}=${l.value}`), [
    'net/ipv4/conf/all/arp_ignore=1',
    'net/ipv4/conf/eth0/arp_ignore=1',
    'net/ipv4/conf/all/arp_announce=2',
    'net/ipv4/conf/eth0/arp_announce=2',
  ]);
});

test("'attached' is told on the next turn, after the answer; a DEL that comes first cancels it", async () => {
  const a = podPair();
  const s = service(a.host);
  s.attach.add(add(a.pod, 'ctr-a'));
  assert.equal(s.events, [], 'not told while answering');
  await nextTurn();
  assert.equal(s.events, ['attached ctr-a']);

  const b = podPair();
  s.attach.add(add(b.pod, 'ctr-b'));
  await s.attach.del({ ...add(b.pod, 'ctr-b'), command: 'DEL' });
  await nextTurn();
  await nextTurn();
  assert.equal(s.events, ['attached ctr-a', 'detached ctr-b'], 'a pod gone before the turn is not announced');
});

test('a stale record of the same attachment (a tetherd killed mid-ADD) is dropped; a failed ADD leaves no record', async () => {
  const { pod, host } = podPair();
  const s = service(host);
  // An earlier tetherd's records, still "applying" when it was killed.
  const stale = (containerId: string, ifName: string): PodRecord => ({
    network: 'tnet', containerId, ifName, netns: '/run/netns/gone', phase: 'applying', config: {}, createdAt: new Date(0).toISOString(),
  });
  s.store.put(stale('ctr-1', 'eth0'));
  s.store.put(stale('ctr-2', 'eth9'));
  s.puts.length = 0;
  s.attach.add(add(pod));
  assert.equal(s.puts, ['attached']);
  assert.is(s.store.get({ network: 'tnet', containerId: 'ctr-1', ifName: 'eth0' })?.netns, pod);
  const failing = add(pod, 'ctr-2');
  failing.ifName = 'eth9'; // no such interface in the pod
  assert.throws(() => s.attach.add(failing), /eth9/);
  assert.equal(s.puts, ['attached'], 'nothing written for the failed ADD');
  assert.is(s.store.get({ network: 'tnet', containerId: 'ctr-2', ifName: 'eth9' }), undefined, 'the stale record is gone');
  assert.is(fs.readdirSync(path.join(s.dir, 'pods')).length, 1, 'only ctr-1 is recorded');
  assert.is(new PodStore(s.dir).load().loaded, 1, 'and so after a restart');
});

test('writeNetSysctls: one entry into the namespace; each write told as made, so a failure part way leaves none unknown', () => {
  const { pod } = podPair();
  const told: string[] = [];
  const was = readNetSysctl(pod, 'net/ipv4/conf/all/arp_ignore');
  assert.throws(
    () =>
      writeNetSysctls(
        pod,
        [
          ['net/ipv4/conf/all/arp_ignore', '1'],
          ['net/ipv4/conf/eth0/arp_ignore', '1'],
          ['net/ipv4/conf/nosuchdev/arp_ignore', '1'],
          ['net/ipv4/conf/all/arp_announce', '2'],
        ],
        (key, value, previous) => told.push(`${key}=${value} (was ${previous})`),
      ),
    /nosuchdev|ENOENT/,
  );
  assert.equal(told, [`net/ipv4/conf/all/arp_ignore=1 (was ${was})`, 'net/ipv4/conf/eth0/arp_ignore=1 (was 0)']);
  assert.is(readNetSysctl(pod, 'net/ipv4/conf/all/arp_ignore'), '1');
  assert.is(readNetSysctl(pod, 'net/ipv4/conf/all/arp_announce'), '0', 'nothing after the failure was written');
});

test('inNetns returns to where it was entered from, nested or not, and keeps no descriptor per entry', () => {
  const a = podPair();
  const b = podPair();
  const here = () => fs.statSync('/proc/thread-self/ns/net').ino;
  const ino = (p: string) => fs.statSync(p).ino;
  const own = here();
  const fds = () => fs.readdirSync('/proc/self/fd').length;
  inNetns(a.pod, () => undefined); // the first entry opens the thread's own namespace once
  const before = fds();
  const seen: number[] = [];
  for (let i = 0; i < 5; i++) {
    inNetns(a.pod, () => {
      seen.push(here());
      inNetns(b.pod, () => seen.push(here()));
      seen.push(here());
    });
    seen.push(here());
  }
  assert.equal(seen.slice(0, 4), [ino(a.pod), ino(b.pod), ino(a.pod), own]);
  assert.is(fds(), before, 'no descriptor left behind');
  assert.throws(() => inNetns('/run/netns/no-such-ns', () => undefined), /cannot be opened/);
  assert.is(here(), own);
});

test.run();
