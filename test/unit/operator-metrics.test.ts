// tether-operator's /metrics, against the FAKE API server and a real redis-server, scraped over HTTP from
// two replicas started by operatorParts (as the Deployment runs them, each with --metrics-bind-address):
// tether_leader{lease} is 1 on the replica holding the Lease and 0 on the other (their sum, what the rules
// read, is 1) and follows a handover, with the transitions counted; a write the API refuses moves
// tether_kube_api_errors_total and holds the status pass's last-success time; the store connections
// are reachable, then not once Redis is gone; the Events' dropped counter has its series from the start.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { Writable } from 'node:stream';
import { FakeApiServer, kubeconfigFor } from '../lib/fake-apiserver';
import { startRedis, type TestRedis } from '../lib/redis';
import { namingProblems, scrapeMetrics, type Scrape } from '../lib/metrics';
import { makeLogger, setLogger } from '../../lib/log';
import { Lifecycle } from '../../daemon/lifecycle';
import { operatorParts, type StartedOperator } from '../../operator/main';
import { parseOperatorOptions } from '../../operator/options';
import { OPERATOR_LEASE } from '../../operator/controllers';
import { freePort } from '../lib/ports';

const quiet = makeLogger({ level: 'error', stream: new Writable({ write: (_c, _e, cb) => cb() }) });
setLogger(quiet);
const V = 'tether.dev/v1alpha1';
const LEASE = { lease: `tether-system/${OPERATOR_LEASE}` };

const until = async (what: string, fn: () => boolean | Promise<boolean>, ms = 10_000) => {
  const end = Date.now() + ms;
  while (!(await fn())) {
    if (Date.now() > end) throw new Error(`timed out: ${what}`);
    await new Promise((r) => setTimeout(r, 25));
  }
};


test('--metrics-bind-address: off by default, checked like tetherd\'s', async () => {
  assert.is(parseOperatorOptions(['--kubernetes'])['metrics-bind-address'], '');
  const opts = parseOperatorOptions(['--kubeconfig', '/nonexistent', '--metrics-bind-address', '10270']);
  const parts = operatorParts(opts, { identity: 'x', logger: quiet });
  await parts.next().then(() => assert.unreachable('a bad address is refused before anything starts'), (e: Error) => assert.match(e.message, /--metrics-bind-address: "10270" is not IP:PORT/));
});

test('two replicas\' /metrics: leadership and its handover, API errors, status passes, the store', async () => {
  const api = new FakeApiServer('fake-token');
  const url = (await api.listen({ port: 0 }))!;
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tether-opm-'));
  const kubeconfig = path.join(dir, 'kubeconfig');
  fs.writeFileSync(kubeconfig, kubeconfigFor(url));
  let redis: TestRedis | undefined;
  const lives: Lifecycle[] = [];
  try {
    redis = await startRedis();
    api.apply({ apiVersion: V, kind: 'AddressPool', metadata: { name: 'float' }, spec: { usage: 'floating', ipv4: { cidr: '198.51.100.0/28' } } });
    process.env.POD_NAMESPACE = 'tether-system';
    const start = async (identity: string) => {
      const life = new Lifecycle(quiet);
      lives.push(life);
      const port = await freePort();
      const opts = parseOperatorOptions(['--kubeconfig', kubeconfig, '--redis', redis!.url, '--lease-duration', '2', '--metrics-bind-address', `127.0.0.1:${port}`]);
      const started = (await life.start(operatorParts(opts, { identity, logger: quiet, everyMs: 100, gcEveryMs: 200, retryMs: 100 }))) as StartedOperator;
      assert.is(started.metrics?.boundAddress()?.port, port, `${identity} serves its metrics`);
      return { life, started, scrape: () => scrapeMetrics(`http://127.0.0.1:${port}/metrics`) };
    };
    const [a, b] = await Promise.all([start('op-a'), start('op-b')]);
    await until('a leader', () => a.started.leader.isLeader() || b.started.leader.isLeader());
    const [leader, other] = a.started.leader.isLeader() ? [a, b] : [b, a];

    let [sl, so]: Scrape[] = await Promise.all([leader.scrape(), other.scrape()]);
    assert.equal(namingProblems(sl), []);
    assert.is(sl.value('tether_leader', LEASE), 1, 'the leader says it leads');
    assert.is(so.value('tether_leader', LEASE), 0, 'the other says it does not');
    assert.is(sl.value('tether_leader_transitions_total', LEASE), 1);
    assert.is(so.value('tether_leader_transitions_total', LEASE), 0);
    assert.is(sl.families.get('tether_leader_transitions_total')?.type, 'counter');
    for (const s of [sl, so]) {
      assert.is(s.value('tether_store_reachable', { subsystem: 'ipam' }), 1);
      assert.is(s.value('tether_store_reachable', { subsystem: 'lb' }), 1);
      assert.is(s.value('tether_kube_events_dropped_total', { reason: 'failed' }), 0, 'the dropped Events\' series exist from the start');
      assert.ok(s.value('tether_build_info') === 1 || s.samples('tether_build_info').length === 1);
      assert.is(s.samples('tether_cni_requests_total').length, 0, 'no CNI series: the operator answers none');
      assert.is(s.samples('tether_ipam_pod_blocks').length, 0);
    }
    assert.is(so.samples('tether_status_pass_last_success_timestamp_seconds').length, 0, 'no status pass on the replica not leading');

    // The leader's status passes: the pool's status written, the last success stamped.
    await until('the pool\'s status', () => api.get('AddressPool', 'float')?.status?.conditions?.[0]?.status === 'True');
    await until('a status pass in the scrape', async () => ((await leader.scrape()).value('tether_status_pass_last_success_timestamp_seconds') ?? 0) > 0);
    sl = await leader.scrape();
    const passed = sl.value('tether_status_pass_last_success_timestamp_seconds')!;
    assert.ok(Math.abs(passed - Date.now() / 1000) < 5, `a recent Unix time in seconds: ${passed}`);
    assert.ok((sl.value('tether_status_pass_duration_seconds') ?? -1) >= 0);

    // The API refuses the status writes (as RBAC without addresspools/status would): each failed write is
    // counted by verb, resource and code, and no pass completes while one fails.
    const before = sl.value('tether_kube_api_errors_total', { verb: 'update', resource: 'addresspools/status', code: '403' }) ?? 0;
    assert.is(before, 0);
    api.admit = (x) => (x.resource === 'addresspools' && x.subResource === 'status' ? { allowed: false, code: 403, reason: 'Forbidden', message: 'no status for you' } : { allowed: true });
    api.apply({ apiVersion: V, kind: 'AddressPool', metadata: { name: 'later' }, spec: { usage: 'floating', ipv4: { cidr: '192.0.2.0/28' } } });
    await until('refused status writes counted', async () => ((await leader.scrape()).value('tether_kube_api_errors_total', { verb: 'update', resource: 'addresspools/status', code: '403' }) ?? 0) >= 2);
    const stuck = (await leader.scrape()).value('tether_status_pass_last_success_timestamp_seconds')!;
    await new Promise((r) => setTimeout(r, 400));
    assert.is((await leader.scrape()).value('tether_status_pass_last_success_timestamp_seconds'), stuck, 'no pass completes while a write is refused');
    api.admit = undefined;
    await until('passes complete again', async () => ((await leader.scrape()).value('tether_status_pass_last_success_timestamp_seconds') ?? 0) > stuck);

    // The leader stops: the other takes the Lease, and its metrics say so.
    await leader.life.stopAll();
    await until('the other leads', async () => (await other.scrape()).value('tether_leader', LEASE) === 1, 8000);
    so = await other.scrape();
    assert.is(so.value('tether_leader_transitions_total', LEASE), 1);

    // Redis gone: the store connections say so.
    await redis.kill();
    await until('the store unreachable', async () => {
      const s = await other.scrape();
      return s.value('tether_store_reachable', { subsystem: 'ipam' }) === 0 && s.value('tether_store_reachable', { subsystem: 'lb' }) === 0;
    }, 15_000);
  } finally {
    for (const l of lives.reverse()) await l.stopAll().catch(() => undefined);
    await redis?.stop().catch(() => undefined);
    await api.close();
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test.run();
