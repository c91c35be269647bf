// The scale benchmark's simulation (test/bench/scale): its bundle swaps tetherd's kernel-facing modules for
// recording fakes and the rest is tetherd's own code. Three simulated nodes against a real Redis converge:
// each sees the Egress's address owned by one gateway node, the owner's fake gateway datapath recorded
// taking the address, the LB node's fake load balancer datapath recorded the Service; a node lost (its
// fake BFD goes Down at the peers) moves the address to a live gateway, seen the same on every node.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { startRedis, type TestRedis } from '../lib/redis';
import { until } from '../lib/wait';
import { addressBase, apiObjects, commonFor, nodeSpec, placePods, Sim, SimApi, writeScenario, type Scenario } from '../bench/scale/sim';

let redis: TestRedis;
let sim: Sim;

test.before(async () => {
  redis = await startRedis();
  sim = await Sim.create();
});
test.after(async () => {
  await sim?.stop();
  await redis?.stop();
});

test('3 simulated nodes converge on the real controllers, with the datapath faked', async () => {
  assert.ok(sim.substituted.includes('daemon/bfd/threaded.ts'), `BFD thread substituted: ${sim.substituted.join(', ')}`);
  assert.ok(sim.substituted.includes('daemon/egress/gateway-datapath.ts'));
  const s: Scenario = { egresses: 1, gatewaysPerEgress: 2, services: 1, lbPodsPerService: 1, targetsPerService: 1 };
  const n = 3;
  const configFile = path.join(sim.dir, 'config.yaml');
  writeScenario(configFile, s, n);
  const base = addressBase(); // this run's own 127.<base>.0.x addresses: another run at once binds others
  const specs = Array.from({ length: n }, (_, i) => nodeSpec(i, base));
  const w = await sim.fork(path.join(sim.dir, 'worker.log'));
  const r = await w.ask<{ started: string[]; failed: unknown[] }>({ op: 'start', common: commonFor(sim, redis.url, configFile), nodes: specs, alive: specs.map((x) => x.address) });
  assert.equal(r.failed, [], fs.existsSync(path.join(sim.dir, 'worker.log')) ? fs.readFileSync(path.join(sim.dir, 'worker.log'), 'utf8').slice(-3000) : '');
  await w.ask({ op: 'addPods', pods: placePods(s, n).map((p) => ({ node: specs[p.node].name, pod: p.pod })) });
  const agreed = async (avoid?: string) => {
    const view = await w.ask<Record<string, Record<string, string>>>({ op: 'egressView' });
    const owners = new Set(Object.entries(view).filter(([node]) => node !== avoid).flatMap(([, v]) => Object.values(v)));
    const seen = Object.entries(view).filter(([node, v]) => node !== avoid && Object.keys(v).length > 0).length;
    return owners.size === 1 && !owners.has('') && !owners.has(avoid ?? '-') && seen === n - (avoid ? 1 : 0) ? [...owners][0] : undefined;
  };
  const owner = await until('every node sees one owner', () => agreed(), 15_000);
  type Stats = { calls: Record<string, number>; commandsSent: number };
  // The LB node programs the Service once its VIP is allocated and its LB pod seen: on its own pass, not
  // necessarily before the Egress converged.
  let stats: Stats = await w.ask<Stats>({ op: 'stats' });
  await until('the LB node programmed the Service', async () => ((stats = await w.ask<Stats>({ op: 'stats' })).calls['lb.setService'] ?? 0) >= 1, 15_000).catch(() => undefined);
  assert.ok((stats.calls['gateway.own'] ?? 0) >= 1, `fake gateway datapath recorded own(): ${JSON.stringify(stats.calls)}`);
  assert.ok((stats.calls['lb.setService'] ?? 0) >= 1, `fake lb datapath recorded setService(): ${JSON.stringify(stats.calls)}`);
  assert.ok(stats.commandsSent > 0, 'store commands counted');
  // Lose the owner: stop it and tell the peers' fake BFD it is gone.
  const lost = specs.find((x) => x.name === owner)!;
  await w.ask({ op: 'stopNode', name: lost.name });
  await w.ask({ op: 'alive', address: lost.address, alive: false });
  const next = await until('every live node sees the new owner', () => agreed(lost.name), 15_000);
  assert.is.not(next, owner);
});

test('kube mode: the nodes read the fake API server, each with its own token; the fake tallies their lists, watches and events', async () => {
  const s: Scenario = { egresses: 1, gatewaysPerEgress: 2, services: 1, lbPodsPerService: 1, targetsPerService: 1 };
  const n = 3;
  const base = addressBase();
  const specs = Array.from({ length: n }, (_, i) => nodeSpec(i, base));
  const api = await SimApi.start(path.join(sim.dir, 'apiserver.log'));
  try {
    await api.apply(apiObjects(s, n, base));
    const w = await sim.fork(path.join(sim.dir, 'worker-kube.log'));
    const r = await w.ask<{ failed: unknown[] }>({ op: 'start', common: commonFor(sim, redis.url, undefined, { apiUrl: api.url, redisPrefix: 'kube:' }), nodes: specs, alive: specs.map((x) => x.address) });
    assert.equal(r.failed, []);
    // The cluster's controllers: tether-operator, built as operator/main.ts builds it, in the same worker.
    await w.ask({ op: 'startOperator', common: commonFor(sim, redis.url, undefined, { apiUrl: api.url, redisPrefix: 'kube:' }) });
    await until('the operator leads', () => w.ask<boolean>({ op: 'operatorLeads' }), 15_000);
    await w.ask({ op: 'addPods', pods: placePods(s, n).map((p) => ({ node: specs[p.node].name, pod: p.pod })) });
    await until('every node sees one owner', async () => {
      const view = await w.ask<Record<string, Record<string, string>>>({ op: 'egressView' });
      const owners = new Set(Object.values(view).flatMap((v) => Object.values(v)));
      return owners.size === 1 && !owners.has('') && Object.values(view).every((v) => Object.keys(v).length > 0);
    }, 15_000);
    const load = await api.load();
    for (const x of specs) {
      const l = load.clients[x.name];
      assert.ok(l && l.lists >= 6 && l.watches >= 6, `${x.name} listed and watched its 6 resources: ${JSON.stringify(l)}`);
    }
    assert.ok(load.openWatches >= 6 * n, `open watches ${load.openWatches}`);
    // The operator reads (its own token) and writes status; the nodes write no status (their writes are their blocks).
    const op = load.clients['tether-operator'];
    assert.ok(op && op.lists >= 6 && op.writes >= 1, `tether-operator listed and wrote: ${JSON.stringify(op)}`);
    await w.ask({ op: 'exit' }).catch(() => undefined);
  } finally {
    await api.stop();
  }
});

test.run();
