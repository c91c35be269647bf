// Lease candidates against the FAKE API server (no kube-apiserver on these machines): only the candidates
// touch the Lease (each node has its own token, so the fake tells whose requests it saw); a leader lost is
// replaced by another candidate; auto mode (a labelled node is a candidate, an unlabelled one is not when
// some node carries the label, every node is when none does); a label added at runtime makes a candidate.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { Writable } from 'node:stream';
import * as k8s from '@kubernetes/client-node';
import { FakeApiServer, kubeconfigFor } from '../lib/fake-apiserver';
import { CANDIDATE_LABEL, Candidacy, parseCandidates, type CandidateMode } from '../../daemon/kube/controllers';
import { makeLogger } from '../../lib/log';

const quiet = makeLogger({ level: 'error', stream: new Writable({ write: (_c, _e, cb) => cb() }) });

async function setup() {
  const api = new FakeApiServer();
  const url = (await api.listen({ port: 0 }))!;
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tether-cand-'));
  const kcOf = (node: string) => {
    const f = path.join(dir, `kubeconfig-${node}`);
    fs.writeFileSync(f, kubeconfigFor(url, `token-${node}`));
    const kc = new k8s.KubeConfig();
    kc.loadFromFile(f);
    return kc;
  };
  const nodes: Candidacy[] = [];
  const working = new Set<string>();
  const mk = (node: string, mode: CandidateMode, labels: Record<string, string> = {}) => {
    const c = new Candidacy({
      kc: kcOf(node), nodeName: node, mode, labels: () => labels, logger: quiet, leaseDurationSeconds: 2, retryMs: 100,
      work: { start: () => void working.add(node), stop: async () => void working.delete(node) },
    });
    nodes.push(c);
    return c;
  };
  const leaseCallsBy = (node: string) => api.calls.filter((c) => c.token === `token-${node}` && c.path.includes('/leases')).length;
  const done = async () => {
    for (const n of nodes) await n.stop();
    await api.close();
    fs.rmSync(dir, { recursive: true, force: true });
  };
  return { api, mk, working, leaseCallsBy, done };
}

const until = async (what: string, fn: () => boolean, ms = 5000) => {
  const end = Date.now() + ms;
  while (!fn()) {
    if (Date.now() > end) throw new Error(`timed out: ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
};

test('named candidates: only they touch the Lease; one leads; a leader lost is replaced by another candidate', async () => {
  const { mk, working, leaseCallsBy, done } = await setup();
  try {
    const mode = parseCandidates('n1,n2,n3');
    const all = ['n1', 'n2', 'n3', 'n4', 'n5'].map((n) => mk(n, mode));
    await Promise.all(all.map((c) => c.start()));
    await until('a leader', () => all.some((c) => c.isLeader()));
    await new Promise((r) => setTimeout(r, 600));
    assert.is(all.filter((c) => c.isLeader()).length, 1, 'exactly one leader');
    assert.is(working.size, 1, 'leader work runs on the leader only');
    for (const n of ['n1', 'n2', 'n3']) assert.ok(leaseCallsBy(n) > 0, `${n} competes`);
    for (const n of ['n4', 'n5']) assert.is(leaseCallsBy(n), 0, `${n} never touched the Lease`);
    assert.equal([all[3].leaseAttempts(), all[4].leaseAttempts()], [0, 0]);
    const leader = all.find((c) => c.isLeader())!;
    const t0 = Date.now();
    await leader.stop();
    await until('another candidate leads', () => all.some((c) => c !== leader && c.isLeader()), 3000);
    const next = all.find((c) => c.isLeader())!;
    assert.ok(all.indexOf(next) < 3, 'the new leader is a candidate');
    assert.ok(Date.now() - t0 < 1500, `replaced in ${Date.now() - t0} ms`);
    for (const n of ['n4', 'n5']) assert.is(leaseCallsBy(n), 0, `${n} still never touched the Lease`);
  } finally {
    await done();
  }
});

test('auto: labelled nodes compete; an unlabelled one makes one Node list and stays out; a label added later makes it a candidate', async () => {
  const { api, mk, leaseCallsBy, done } = await setup();
  try {
    api.apply({ apiVersion: 'v1', kind: 'Node', metadata: { name: 'n1', labels: { [CANDIDATE_LABEL]: 'true' } } });
    api.apply({ apiVersion: 'v1', kind: 'Node', metadata: { name: 'n2' } });
    const auto = parseCandidates(undefined);
    const a = mk('n1', auto, { [CANDIDATE_LABEL]: 'true' });
    const n2Labels: Record<string, string> = {};
    const b = mk('n2', auto, n2Labels);
    await a.start();
    await b.start();
    await until('n1 leads', () => a.isLeader());
    await new Promise((r) => setTimeout(r, 400));
    assert.ok(!b.candidate());
    assert.is(leaseCallsBy('n2'), 0, 'n2 never touched the Lease');
    const n2Lists = api.calls.filter((c) => c.token === 'token-n2');
    assert.equal(n2Lists.map((c) => [c.path, c.query.labelSelector, c.query.limit]), [['/api/v1/nodes', `${CANDIDATE_LABEL}=true`, '1']], 'one list of at most one labelled Node');
    // Labelled at runtime (seen through its own Node watch): it competes, and takes over when n1 goes.
    n2Labels[CANDIDATE_LABEL] = 'true';
    b.evaluate();
    await until('n2 competes', () => leaseCallsBy('n2') > 0);
    await a.stop();
    await until('n2 leads', () => b.isLeader(), 3000);
  } finally {
    await done();
  }
});

test('auto with no labelled node anywhere: every node competes (small clusters need no set-up)', async () => {
  const { api, mk, leaseCallsBy, done } = await setup();
  try {
    api.apply({ apiVersion: 'v1', kind: 'Node', metadata: { name: 'n1' } });
    const a = mk('n1', parseCandidates('auto'));
    await a.start();
    assert.ok(a.candidate());
    await until('n1 leads', () => a.isLeader());
    assert.ok(leaseCallsBy('n1') > 0);
  } finally {
    await done();
  }
});

test('--controller-candidates: bad values are refused naming the problem', () => {
  assert.equal(parseCandidates('label'), { kind: 'label' });
  assert.equal(parseCandidates(' a, b '), { kind: 'names', names: ['a', 'b'] });
  assert.throws(() => parseCandidates('Node_1'), /not a node name: Node_1/);
  assert.throws(() => parseCandidates(','), /give auto, label, all, or node names/);
});

test.run();
