// Each node's TetherNode, against the FAKE API server (test/lib/fake-apiserver.ts): created by the node's
// reporting part with an ownerReference to the core Node and the conditions Ready, DatapathAttached and
// StoreReachable (each with reason, message and lastTransitionTime), its version and heartbeat; Ready
// False while tetherd starts and True once started; StoreReachable False as soon as a subsystem reports the
// store down and True when it answers again; a pod role that failed is DatapathAttached False; with
// nothing changing, the status is written no more often than the heartbeat (checked on a virtual clock);
// a clean stop says so; an object deleted behind its back is made again.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { Writable } from 'node:stream';
import { apiWithSource } from '../lib/kube-fixture';
import { waitFor } from '../lib/wait';
import { makeLogger } from '../../lib/log';
import { KubeReporting } from '../../daemon/parts/kube-reporting';
import { NodeStatusWriter } from '../../daemon/kube/node-status';
import type { RoleProblem } from '../../daemon/pod/role-problems';

type Obj = Record<string, any>;
const quiet = makeLogger({ level: 'error', stream: new Writable({ write: (_c, _e, cb) => cb() }) });
const node = { apiVersion: 'v1', kind: 'Node', metadata: { name: 'n1' } };
const cond = (o: Obj | undefined, type: string): Obj => (o?.status?.conditions as Obj[] | undefined)?.find((c) => c.type === type) as Obj;
const show = (o: Obj | undefined) => JSON.stringify(o?.status?.conditions?.map((c: Obj) => `${c.type}=${c.status} (${c.reason})`));

test('TetherNode: created with an ownerReference to the Node, Ready once started, StoreReachable following the store, DatapathAttached following the pod roles', async () => {
  const { api, source, close } = await apiWithSource([node], quiet);
  let storeUp = true;
  let problems: RoleProblem[] = [];
  const r = new KubeReporting({
    source, nodeName: 'n1', version: '9.9.9', storeConfigured: true, bpfPinDir: '/sys/fs/bpf/tether', roleProblems: () => problems, logger: quiet, checkEveryMs: 50,
  });
  r.servesDatapath('egress');
  r.watchStore('egress controller', () => storeUp);
  const tnode = () => api.get('TetherNode', 'n1');
  try {
    await r.start();
    await waitFor(() => !!cond(tnode(), 'Ready'), 'the TetherNode written');
    const t = tnode()!;
    assert.equal(t.metadata.ownerReferences, [{ apiVersion: 'v1', kind: 'Node', name: 'n1', uid: api.get('Node', 'n1')!.metadata.uid }], 'owned by the Node: collected with it');
    assert.is(t.status.version, '9.9.9');
    assert.ok(Date.parse(t.status.lastHeartbeatTime) > Date.now() - 60_000, t.status.lastHeartbeatTime);
    assert.equal([cond(t, 'Ready').status, cond(t, 'Ready').reason], ['False', 'Starting']);
    assert.equal([cond(t, 'DatapathAttached').status, cond(t, 'DatapathAttached').reason], ['True', 'Attached']);
    assert.equal([cond(t, 'StoreReachable').status, cond(t, 'StoreReachable').reason], ['True', 'Reachable']);
    for (const c of t.status.conditions as Obj[]) assert.ok(c.message && c.lastTransitionTime, `${c.type} has a message and a lastTransitionTime`);

    r.markStarted();
    await waitFor(() => cond(tnode(), 'Ready')?.status === 'True', 'Ready True once started', { describe: () => show(tnode()) });
    assert.is(cond(tnode(), 'Ready').reason, 'Running');
    const storeSince = cond(tnode(), 'StoreReachable').lastTransitionTime;

    // The store reported down, and back: the status says so each time, with a new transition time.
    await new Promise((res) => setTimeout(res, 5)); // a later millisecond than the first write
    storeUp = false;
    await waitFor(() => cond(tnode(), 'StoreReachable')?.status === 'False', 'StoreReachable False', { describe: () => show(tnode()) });
    const down = cond(tnode(), 'StoreReachable');
    assert.is(down.reason, 'Unreachable');
    assert.ok(down.message.includes('egress controller'), down.message);
    assert.not.equal(down.lastTransitionTime, storeSince);
    assert.is(cond(tnode(), 'Ready').status, 'True', 'the rest of the status unchanged');
    storeUp = true;
    await waitFor(() => cond(tnode(), 'StoreReachable')?.status === 'True', 'StoreReachable True again', { describe: () => show(tnode()) });

    // A pod role that could not be set up.
    problems = [{ pod: 'shop/gw-a', role: 'egress', error: 'attach tc egress program: ENOENT', since: new Date().toISOString() }];
    await waitFor(() => cond(tnode(), 'DatapathAttached')?.status === 'False', 'DatapathAttached False', { describe: () => show(tnode()) });
    assert.is(cond(tnode(), 'DatapathAttached').reason, 'RoleSetupFailed');
    assert.ok(cond(tnode(), 'DatapathAttached').message.includes('shop/gw-a (egress): attach tc egress program: ENOENT'));

    // Deleted behind its back: made again.
    api.remove('TetherNode', 'n1');
    problems = [];
    await waitFor(() => cond(tnode(), 'DatapathAttached')?.status === 'True', 'the TetherNode made again', { describe: () => show(tnode()) });
    assert.is(r.nodeStatus.stats.creates, 2);

    // A clean stop: Ready False (Stopped) rather than a Ready that only goes stale.
    await r.stop();
    assert.equal([cond(tnode(), 'Ready').status, cond(tnode(), 'Ready').reason], ['False', 'Stopped']);
  } finally {
    await r.stop();
    await close();
  }
});

test('nothing changing: the status is written no more often than the heartbeat (a virtual clock over 10 minutes of 2 s checks)', async () => {
  const { api, source, close } = await apiWithSource([node], quiet);
  let now = Date.parse('2026-01-01T00:00:00Z');
  const w = new NodeStatusWriter({
    kc: source.kc, nodeName: 'n1', version: '9.9.9', logger: quiet, heartbeatMs: 60_000, now: () => now, random: () => 0.5,
    conditions: () => [{ type: 'Ready', status: 'True', reason: 'Running', message: 'runs' }],
  });
  const puts = () => api.requests.filter((q) => q === 'PUT /apis/tether.dev/v1alpha1/tethernodes/n1/status').length;
  try {
    await w.pass();
    assert.is(puts(), 1, 'the first check writes');
    const beats: string[] = [];
    for (let t = 2000; t <= 600_000; t += 2000) {
      now += 2000;
      const before = puts();
      await w.pass();
      if (puts() > before) beats.push(`${t / 1000}s`);
    }
    // Heartbeat 60 s stretched by 5 % (random 0.5 of the 10 % spread): every 63 s, never sooner.
    assert.equal(beats, ['64s', '128s', '192s', '256s', '320s', '384s', '448s', '512s', '576s']);
    assert.is(w.stats.heartbeats, 9);
    const t = api.get('TetherNode', 'n1')!;
    assert.is(t.status.lastHeartbeatTime, '2026-01-01T00:09:36Z');
    assert.is(cond(t, 'Ready').lastTransitionTime, '2026-01-01T00:00:00.000Z', 'a heartbeat keeps the transition time');
  } finally {
    await w.stop();
    await close();
  }
});

test.run();
