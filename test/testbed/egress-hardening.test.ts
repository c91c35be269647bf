// Egress when things around it go wrong, on the testbed with real traffic: the cluster store gone before
// the owner's node fails (takeover between tetherds, clients told directly, epochs reconciled when the
// store is back), tetherd stopped while its subsystems have work in flight (Redis paused, a resync being
// applied, CNI ADDs under way), a gateway joining under a storm of pod ADDs, and a gateway joining while
// the store is down (no false takeover either way), the store restarted empty (nothing handed out twice),
// and the store answering garbage.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import * as fs from 'node:fs';
import { withTestbed, type Testbed } from './testbed';
import { call } from '../../lib/api/client';
import { egressOf, runTraffic, topology, waitOwner, waitStandbyReady, type EgressStatus } from './egress-scenario';
import { ConntrackHandle, IPS, type ConntrackEntry } from '../../daemon/conntrack';

const CONNS = Number(process.env.EGRESS_TEST_CONNS ?? 200);
const only = process.env.EGRESS_ONLY;
const scenario = (name: string, fn: () => Promise<void>) => (only && !name.includes(only) ? test.skip(name, fn) : test(name, fn));

const other = (node: string) => (node === 'n1' ? 'n2' : 'n1');
const podKeyOf = (owner: string, node: string) => `${node}-${owner.split('/')[1]}`;

/** The tetherd log of a node, and what a clean stop must not contain. */
function logOf(tb: Testbed, node: string): string {
  return fs.readFileSync(tb.tetherd(node).opts.paths.log, 'utf8');
}
function assertCleanStop(tb: Testbed, node: string, st: { code: number | null; signal: NodeJS.Signals | null }, what: string): void {
  const log = logOf(tb, node);
  const tail = log.split('\n').slice(-15).join('\n');
  assert.equal(st, { code: 0, signal: null }, `${what}: tetherd on ${node} exited ${JSON.stringify(st)}; log tail:\n${tail}`);
  assert.not.match(log, /write after end|Unhandled|\n\s+at [^\n]+:\d+:\d+\)?\n/, `${what}: a trace in the log of ${node}:\n${tail}`);
  assert.match(log.split('# ').pop() ?? '', /"message":"tetherd stopped"/, `${what}: the last run of ${node} logged its stop`);
}

async function views(tb: Testbed): Promise<Record<string, EgressStatus | undefined>> {
  const out: Record<string, EgressStatus | undefined> = {};
  for (const n of ['n1', 'n2', 'n3']) out[n] = await egressOf(tb, n).catch(() => undefined);
  return out;
}

scenario('cluster store down before the owner node fails: the standby takes over, clients follow, the store is reconciled after', async () => {
  await withTestbed(topology(), async (tb) => {
    const first = await waitOwner(tb);
    const survivor = other(first.node);
    // A healthy pair before the store goes: the survivor knows the owner (registry, BFD Up) and is in sync.
    await waitStandbyReady(tb, first.node, survivor);
    // Paused, not killed: connections hang rather than fail, the harder case for anything that awaits it.
    process.kill(tb.redis.pid!, 'SIGSTOP');
    let resumed = false;
    try {
      const { report } = await runTraffic(tb, CONNS, 9000, async () => {
        await tb.killTetherd(first.node, 'SIGKILL');
        await tb.mustExec(first.node, ['ip', 'link', 'set', 'eth0', 'down']);
      });
      const st = await egressOf(tb, survivor);
      const client = await egressOf(tb, 'n3');
      assert.ok(st?.ownedHere, `the surviving gateway node owns the address without the store: ${JSON.stringify(st)}`);
      assert.match(String(st?.lastTakeover?.cause), /failover: owner .* is down/);
      assert.is(client?.owner, st?.owner, 'the client node learned the new owner without the store');
      assert.is(client?.epoch, st?.epoch);
      assert.is(report.intact, CONNS, `${report.intact}/${CONNS} intact; ${report.errors.slice(0, 4).join('; ')}`);
      // The event's gap (set-up stalls before the mark are the harness's, see egress-failover.test.ts).
      assert.ok(report.maxGapAfterMarkMs !== undefined && report.maxGapAfterMarkMs < 1000, `longest gap during the event ${report.maxGapAfterMarkMs} ms`);
      process.stdout.write(`  store down, node down: longest gap ${report.maxGapAfterMarkMs} ms during the failover over ${CONNS} connections, takeover ${JSON.stringify(st?.lastTakeover)}\n`);
      process.kill(tb.redis.pid!, 'SIGCONT');
      resumed = true;
      // The store is back: the decision made without it is written, and everyone agrees with the record.
      const deadline = Date.now() + 8000;
      let rec: Record<string, string> = {};
      for (;;) {
        rec = await tb.withRedisClient((r) => r.hgetall(`${tb.redisPrefix}egress:shop/out:owner:${first.st.address}`));
        if (Number(rec.epoch) === st?.epoch && rec.owner === st?.owner) break;
        if (Date.now() > deadline) assert.unreachable(`store record not reconciled: ${JSON.stringify(rec)} vs ${JSON.stringify(st)}`);
        await new Promise((r) => setTimeout(r, 200));
      }
      // The record is written in the middle of the survivor's store pass, and the pass says the store is
      // reachable again only at its end: the status is asked until it says both (a pass runs every second).
      const passDeadline = Date.now() + 5000;
      let after = await egressOf(tb, survivor);
      while (!(after?.recorded && after.storeReachable) && Date.now() < passDeadline) {
        await new Promise((r) => setTimeout(r, 200));
        after = await egressOf(tb, survivor);
      }
      assert.ok(after?.recorded && after.storeReachable, `the owner sees its decision recorded: ${JSON.stringify(after)}`);
    } finally {
      if (!resumed) process.kill(tb.redis.pid!, 'SIGCONT');
    }
  });
});

scenario('tetherd stops cleanly with work in flight (Redis paused, a resync being applied, CNI ADDs under way) and restarts with nothing lost', async () => {
  await withTestbed(topology(), async (tb) => {
    const first = await waitOwner(tb);
    const standby = other(first.node);
    const floating = first.st.address;

    // 1. A resync being applied: 60k flows in the owner's gateway, the standby's tetherd restarted (a full
    //    resync streams in) and stopped while it arrives or is written.
    const ownerNs = tb.pod(podKeyOf(first.st.owner, first.node)).nsPath;
    const entries: ConntrackEntry[] = Array.from({ length: 60_000 }, (_, i) => ({
      orig: { family: 4, proto: 17, src: `10.250.${(i >> 8) & 255}.${i & 255}`, dst: '198.19.0.9', sport: 2000 + i, dport: 53 },
      reply: { family: 4, proto: 17, src: '198.19.0.9', dst: floating, sport: 53, dport: 2000 + i },
      status: IPS.SEEN_REPLY,
      timeout: 600,
    }));
    ConntrackHandle.with(ownerNs, (h) => h.insertMany(entries));
    await tb.restartTetherd(standby);
    await new Promise((r) => setTimeout(r, 400));
    assertCleanStop(tb, standby, await tb.killTetherd(standby, 'SIGTERM'), 'during a resync');
    await tb.tetherd(standby).start();
    const standbyNs = tb.pod(`${standby}-gw${standby.slice(1)}`).nsPath;
    const deadline = Date.now() + 20_000;
    let have = 0;
    while ((have = ConntrackHandle.with(standbyNs, (h) => h.dump({ family: 4 })).filter((e) => e.reply.dst === floating).length) < 60_000) {
      if (Date.now() > deadline) assert.unreachable(`after the restart the standby holds ${have}/60000 synced flows`);
      await new Promise((r) => setTimeout(r, 250));
    }

    // 2. Redis paused while the owner's tetherd stops: its reconcile and store writes hang on it. First
    //    the owner must see the restarted standby live again (BFD Up), or there is nobody to hand over to.
    const bfdUp = Date.now() + 10_000;
    while (!((await egressOf(tb, first.node)) as unknown as { candidates: Array<{ node: string; bfd: string }> }).candidates.some((c) => c.node === standby && c.bfd === 'Up')) {
      if (Date.now() > bfdUp) assert.unreachable('the owner never saw the restarted standby Up');
      await new Promise((r) => setTimeout(r, 100));
    }
    process.kill(tb.redis.pid!, 'SIGSTOP');
    try {
      await new Promise((r) => setTimeout(r, 1200));
      assertCleanStop(tb, first.node, await tb.killTetherd(first.node, 'SIGTERM'), 'with Redis paused');
      // The stopping owner handed the address to the in-sync standby, without the store.
      const st = await egressOf(tb, standby);
      assert.ok(st?.ownedHere, `the standby owns the address after the owner's tetherd stopped: ${JSON.stringify(st)}`);
      assert.match(String(st?.lastTakeover?.cause), /tetherd stopping/);
    } finally {
      process.kill(tb.redis.pid!, 'SIGCONT');
    }
    await tb.tetherd(first.node).start();

    // 3. CNI ADDs under way on the client node when its tetherd stops.
    const adds = Array.from({ length: 6 }, (_, i) =>
      tb.addPod('n3', { name: `late${i}`, namespace: 'shop', tether: { labels: { app: 'late' } } }).then(
        (p) => ({ ok: true as const, key: p.key }),
        (e: Error) => ({ ok: false as const, error: e.message }),
      ),
    );
    // Stop once tetherd is working on them (an address allocated for one of them), not before they arrive.
    const busy = Date.now() + 15_000;
    while (!/"pod":"shop\/late\d"/.test(logOf(tb, 'n3').split('# ').pop() ?? '')) {
      if (Date.now() > busy) assert.unreachable('tetherd on n3 never started on the late pods');
      await new Promise((r) => setTimeout(r, 5));
    }
    assertCleanStop(tb, 'n3', await tb.killTetherd('n3', 'SIGTERM'), 'with CNI ADDs under way');
    const outcomes = await Promise.all(adds);
    await tb.tetherd('n3').start();
    // The runtime retries the DEL of each failed ADD whose first DEL found tetherd gone.
    const retried = await tb.retryTeardowns();
    const ok = outcomes.filter((o) => o.ok) as Array<{ ok: true; key: string }>;
    // Every ADD that succeeded is recorded and checks out after the restart; the others failed cleanly.
    for (const o of ok) {
      await tb.checkPod(o.key).catch((e: Error) => assert.unreachable(`CHECK of ${o.key} after the restart: ${e.message}`));
    }
    const n3 = (await tb.status('n3')) as unknown as { pods: Array<{ pod?: string }>; ipam: { pods: Array<{ pool: string; families: Array<{ allocated: number }> }> } };
    const recorded = n3.pods.map((p) => p.pod);
    // Nothing leaked: an ADD cut short by the stop holds no address after the restart.
    const allocated = n3.ipam.pods.find((p) => p.pool === 'default')?.families.reduce((a, f) => a + f.allocated, 0);
    assert.is(allocated, recorded.length, `addresses allocated on n3 (${allocated}) = pods recorded (${recorded.length}): ${recorded}`);
    for (const o of ok) assert.ok(recorded.includes(`shop/${o.key.split('-').slice(1).join('-')}`), `${o.key} recorded after the restart: ${recorded}`);
    process.stdout.write(`  stop with CNI ADDs under way: ${ok.length} of ${outcomes.length} ADDs completed (${retried} teardowns retried after the restart), the rest failed with: ${[...new Set(outcomes.filter((o) => !o.ok).map((o) => (o as { error: string }).error.slice(0, 120)))].join(' | ') || '-'}\n`);

    // After all of it: one owner, and every node agrees.
    await new Promise((r) => setTimeout(r, 1500));
    const v = await views(tb);
    const owners = Object.entries(v).filter(([, s]) => s?.ownedHere);
    assert.is(owners.length, 1, `exactly one node holds the address: ${JSON.stringify(v)}`);
    for (const [n, s] of Object.entries(v)) assert.is(s?.epoch, owners[0][1]?.epoch, `${n} agrees on the epoch`);
  });
});

scenario('a gateway joining during a 100-pod ADD storm takes nothing from the live owner', async () => {
  await withTestbed(topology(), async (tb) => {
    const first = await waitOwner(tb);
    const { report } = await runTraffic(tb, 50, 20_000, async () => {
      // The joining gateway lands on the client's node, whose tetherd is also busy with the storm.
      const storm = async (node: string, from: number, n: number) => {
        for (let i = from; i < from + n; i += 5) {
          await Promise.all(Array.from({ length: Math.min(5, from + n - i) }, (_, k) => tb.addPod(node, { name: `storm${i + k}`, namespace: 'load' })));
        }
      };
      await Promise.all([storm('n3', 0, 50), storm(other(first.node), 50, 50), tb.addPod('n3', { name: 'gw3', namespace: 'shop', tether: { labels: { role: 'egress-gw' } } })]);
    });
    const v = await views(tb);
    assert.is(v[first.node]?.owner, first.st.owner, `the owner kept the address: ${JSON.stringify(v[first.node])}`);
    assert.is(v[first.node]?.epoch, first.st.epoch, 'no takeover happened (same epoch)');
    assert.not.ok(v.n3?.ownedHere, 'the joining gateway holds nothing');
    assert.is(report.intact, 50, `${report.intact}/50 intact`);
    const log = logOf(tb, 'n3') + logOf(tb, other(first.node));
    assert.not.match(log, /"message":"egress: ownership changed"[^\n]*"cause":"failover/, 'no failover was decided anywhere');
    process.stdout.write(`  joining gateway under a 100-pod ADD storm: owner kept (epoch ${first.st.epoch}), longest gap ${report.maxGapAfterMarkMs} ms\n`);
  });
});

scenario('a gateway joining while the store is down takes nothing from the live owner, which learns it and streams to it', async () => {
  // One gateway at first (n1's gw1), so the owner has no in-sync standby whose reports would hold the
  // newcomer back: before, the newcomer's BFD session never came Up (the owner knew candidates only from
  // the store), and when its 3 s start-up grace ended it saw the owner "down" and took the address (0/50).
  const topo = topology();
  // n2 keeps a plain pod, so its block has room for the gateway that joins while no block can be claimed.
  topo.nodes[1].pods = [{ name: 'idle', namespace: 'shop' }];
  await withTestbed(topo, async (tb) => {
    const first = await waitOwner(tb);
    assert.is(first.node, 'n1');
    await tb.killRedis({ keepData: true });
    try {
      const { report } = await runTraffic(tb, 50, 12_000, async () => {
        await tb.addPod('n2', { name: 'gw2', namespace: 'shop', tether: { labels: { role: 'egress-gw' } } });
        // Well past the newcomer's start-up grace (3 s) and the hold-down (1 s).
        await new Promise((r) => setTimeout(r, 6000));
      });
      const v = await views(tb);
      assert.is(v.n1?.owner, first.st.owner, `the owner kept the address: ${JSON.stringify(v.n1)}`);
      assert.is(v.n1?.epoch, first.st.epoch, 'no takeover happened (same epoch)');
      assert.not.ok(v.n2?.ownedHere, `the joining gateway holds nothing: ${JSON.stringify(v.n2)}`);
      assert.is(report.intact, 50, `${report.intact}/50 intact; ${report.errors.slice(0, 3).join('; ')}`);
      assert.not.match(logOf(tb, 'n2'), /"message":"egress: ownership changed"/, 'the newcomer decided nothing');
      // The owner learned the newcomer from its announcements: BFD Up both ways and streaming to it.
      await waitStandbyReady(tb, 'n1', 'n2', 10_000, true, 'shop/gw2');
      assert.match(logOf(tb, 'n1'), /"message":"egress: gateway candidate learned from its node"[^\n]*"pod":"shop\/gw2"/);
      process.stdout.write(`  gateway joining with the store down: owner kept (epoch ${first.st.epoch}), 50/50 intact, longest gap ${report.maxGapAfterMarkMs} ms\n`);
    } finally {
      await tb.restartRedis();
    }
  });
});

scenario('the store wiped (FLUSHALL) under an Egress: its address is re-asserted, never handed to anyone else, and a restarted tetherd gets the same one', async () => {
  // Before: `tetherctl address allocate` got the Egress's address at once, and a tetherd restarted
  // afterwards allocated a second address for the same slot (an Egress with count 1 owned on two nodes).
  await withTestbed(topology(), async (tb) => {
    const first = await waitOwner(tb);
    const a = first.st.address;
    const addrs = `${tb.redisPrefix}pool:{float}:addrs`;
    const slotOwner = (await tb.withRedisClient((r) => r.hget(addrs, a))) ?? '';
    assert.match(slotOwner, /^egress\/shop\/out#/);
    const allocate = (owner: string, node = 'n3') => call(tb.socketPath(node), 'address.allocate', { pool: 'float', owner, count: 1 }, { timeoutMs: 5000 }) as Promise<{ addresses: string[] }>;
    const { report } = await runTraffic(tb, 20, 9000, async () => {
      await tb.withRedisClient((r) => r.flushall());
      const t0 = Date.now();
      // Right away and through the hold-off: nobody new gets an address, the holders put theirs back.
      let given: string[] | undefined;
      for (let i = 0; i < 6; i++) {
        given = await allocate('tetherctl/probe').then((x) => x.addresses, (e: Error & { code?: string }) => (assert.is(e.code, 'TRY_AGAIN_LATER', e.message), undefined));
        if (given) break;
        await new Promise((r) => setTimeout(r, 500));
      }
      assert.is(given, undefined, `an allocation went through ${Date.now() - t0} ms after the wipe: ${given}`);
      const back = await tb.withRedisClient((r) => r.hget(addrs, a));
      assert.is(back, slotOwner, 'the address is back under its slot');
      // A tetherd restarted now (not the owner's) tracks the same address for the slot, not a second one.
      await tb.restartTetherd('n3');
    });
    const end = Date.now() + 20_000;
    for (;;) {
      const st = await egressOf(tb, 'n3').catch(() => undefined);
      if (st?.address === a && st.owner === first.st.owner) break;
      if (Date.now() > end) throw new Error(`restarted n3 tracks ${JSON.stringify(st)}, not ${a} owned by ${first.st.owner}`);
      await new Promise((r) => setTimeout(r, 200));
    }
    // After the hold-off a new owner gets an address — another one.
    let other: string[] = [];
    for (let i = 0; i < 30 && !other.length; i++) {
      other = await allocate('tetherctl/probe').then((x) => x.addresses, () => []);
      if (!other.length) await new Promise((r) => setTimeout(r, 500));
    }
    assert.ok(other.length === 1 && other[0] !== a, `after the hold-off: ${other} (the Egress holds ${a})`);
    const all = await tb.withRedisClient((r) => r.hgetall(addrs));
    const ofSlot = Object.entries(all).filter(([, o]) => o.startsWith('egress/shop/out#'));
    assert.equal(ofSlot, [[a, slotOwner]], 'the Egress holds exactly its one address');
    const v = await views(tb);
    assert.equal(['n1', 'n2'].filter((n) => v[n]?.ownedHere), [first.node], 'owned on one node');
    assert.is(v[first.node]?.epoch, first.st.epoch, 'no takeover');
    assert.is(report.intact, 20, `${report.intact}/20 intact`);
    process.stdout.write(`  store wiped: ${a} re-asserted for ${slotOwner}, new owners held off, then given ${other[0]}; 20/20 intact\n`);
  });
});

/** Sends one authenticated ownership notice (argv: cluster key hex, notice JSON, node addresses…) to port 3785 of each. */
const FORGED_NOTICE = `
const { createHmac, randomBytes } = require('node:crypto');
const dgram = require('node:dgram');
const [key, notice, ...to] = process.argv.slice(1);
const nk = createHmac('sha256', Buffer.from(key, 'hex')).update('tether ownership notice').digest();
const body = Buffer.from(JSON.stringify({ from: 'n9', boot: randomBytes(8).toString('hex'), seq: 1, at: Date.now(), notices: [JSON.parse(notice)] }));
const header = Buffer.from([0x54, 0x4f, 0x57, 0x4e, 1, 0, 0, 0]);
const data = Buffer.concat([header, createHmac('sha256', nk).update(header).update(body).digest(), body]);
const s = dgram.createSocket('udp4');
let left = to.length * 3;
for (let i = 0; i < 3; i++) for (const a of to) s.send(data, 3785, a, () => --left === 0 && s.close());
`;

scenario('the store answering garbage, and a notice from an unknown node: nothing in either is applied, the owner keeps the address and repairs its record', async () => {
  await withTestbed(topology(), async (tb) => {
    const first = await waitOwner(tb);
    await waitStandbyReady(tb, first.node, other(first.node));
    const recordKey = `${tb.redisPrefix}egress:shop/out:owner:${first.st.address}`;
    const { report } = await runTraffic(tb, 20, 9000, async () => {
      await tb.withRedisClient(async (r) => {
        // An epoch that is no number, an owner that is no pod, a registration that is no JSON, a node
        // entry that is no address: what a bug, an older schema or a hand edit could leave.
        await r.hset(recordKey, 'epoch', 'seven', 'owner', '!!');
        await r.hset(`{${tb.redisPrefix}egress:shop/out}:gateways`, 'n9', '{"gateways": [garbage');
      });
      // An authentic notice (it has the cluster key) from a node nobody knows — the external server's
      // address — naming a pod of its own as owner with a far larger epoch: refused, nothing applied.
      const key = fs.readFileSync(tb.clusterKeyPath(), 'utf8').trim();
      const notice = { egress: 'shop/out', address: first.st.address, owner: 'shop/evil', epoch: 99, ownerNode: 'n9', ownerNodeAddress: tb.externalIp('server'), ownerPodIp: tb.externalIp('server'), cause: 'forged', inSync: [] };
      const sender = tb.spawn('server', [process.execPath, '-e', FORGED_NOTICE, key, JSON.stringify(notice), ...['n1', 'n2', 'n3'].map((n) => tb.node(n).fabricIp)]);
      await new Promise((res) => sender.once('exit', res));
      await new Promise((res) => setTimeout(res, 4000));
    });
    const v = await views(tb);
    assert.is(v[first.node]?.owner, first.st.owner, `the owner kept the address: ${JSON.stringify(v[first.node])}`);
    assert.is(v[first.node]?.epoch, first.st.epoch, 'no takeover (same epoch)');
    assert.is(v[other(first.node)]?.owner, first.st.owner, 'the standby follows nothing from the garbage');
    assert.is(v.n3?.owner, first.st.owner, 'nor does the client node');
    assert.is(report.intact, 20, `${report.intact}/20 intact`);
    const rec = await tb.withRedisClient((r) => r.hgetall(recordKey));
    if (rec.owner !== first.st.owner) process.stdout.write(logOf(tb, first.node).split('\n').filter((l) => /garbl|refus|unread|record|store/i.test(l)).slice(-15).join('\n') + '\n');
    assert.is(rec.owner, first.st.owner, `the holder wrote its decision over the garbage: ${JSON.stringify(rec)}`);
    assert.is(Number(rec.epoch), first.st.epoch);
    const logs = logOf(tb, 'n1') + logOf(tb, 'n2') + logOf(tb, 'n3');
    assert.match(logs, /"level":"warn"[^\n]*refused[^\n]*seven|seven[^\n]*refused/i, 'a log line names the refused epoch');
    assert.not.match(logs, /"message":"egress: cluster store unreachable/, 'garbage is not taken for an unreachable store');
    for (const n of ['n1', 'n2', 'n3']) {
      assert.match(logOf(tb, n), /"message":"egress: ownership notice refused; nothing in it applied"[^\n]*"why":"sender n9 at [^"]* is not a known node"/, `${n} refused the unknown node's notice`);
      assert.not.match(logOf(tb, n), /shop\/evil"[^\n]*"message":"egress: ownership (learned|changed)"|"message":"egress: ownership (learned|changed)"[^\n]*shop\/evil/, `${n} applied nothing of it`);
    }
    process.stdout.write(`  store answering garbage: owner kept (epoch ${first.st.epoch}), record repaired, 20/20 intact\n`);
  });
});

test.run();
