// The load balancer controller with 1,000 tether LoadBalancer Services in the cluster, against a real
// redis-server (VIPs from ClusterAddresses, the mapping store), every Service's target on this node and no
// LB pod: every Service is accepted and given its VIP (the one tether-operator's view holds too), and the
// node programs nothing for them — no datapath, no slot, no subscription — so the cluster's Service count
// is not capped by any node's --lb-max-vips.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { Writable } from 'node:stream';
import { makeLogger, setLogger } from '../../lib/log';
import { ClusterAddresses } from '../../ipam/cluster-addresses';
import { validatePools } from '../../ipam/pool';
import { RedisStore } from '../../ipam/store/redis-store';
import { LbController } from '../../daemon/lb/lb-controller';
import { connectLbStore } from '../../daemon/lb/lb-store';
import { resolveLoadBalancers } from '../../daemon/lb/lb-spec';
import { PodStore } from '../../daemon/state/pod-store';
import { AttachService } from '../../daemon/pod/attach-service';
import { lbServiceObjects } from '../lib/lb-objects';
import { LbView } from '../../operator/cluster-view';
import { startRedis } from '../lib/redis';

const quiet = makeLogger({ level: 'error', stream: new Writable({ write: (_c, _e, cb) => cb() }) });
setLogger(quiet);
const N = 1000;

const objects = () => lbServiceObjects(N, () => 'n1');

test('1,000 Services accepted with VIPs; a node without their LB pods programs, slots and subscribes nothing', async () => {
  const redis = await startRedis();
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tether-lb-ctl-'));
  const pools = validatePools([
    { apiVersion: 'tether.dev/v1alpha1', kind: 'AddressPool', metadata: { name: 'lb' }, spec: { usage: 'loadBalancer', ipv4: { cidr: '198.18.0.0/22' } } },
  ]);
  const ipam = await RedisStore.connect(redis.url, { keyPrefix: 'ctl:' });
  const store = await connectLbStore(redis.url, { keyPrefix: 'ctl:' });
  const ctl = new LbController({
    node: { name: 'n1', address: '127.0.0.1' }, pinDir: path.join(dir, 'bpf'), fouPort: 5555, exportTable: 0, maxVips: 16,
    store, addresses: new ClusterAddresses(pools, ipam, quiet), attach: new AttachService(new PodStore(path.join(dir, 'state')), quiet), logger: quiet,
  });
  try {
    const r = resolveLoadBalancers(objects(), pools);
    assert.is(r.loadBalancers.length, N);
    // Every Service has its target on n1: n1 needs every VIP (its targets' DSR set-up holds it).
    assert.equal(ctl.programming(), {}, 'nothing programmed or waiting yet: no family reported');
    await ctl.apply(r);
    assert.equal(Object.keys(ctl.programming()), ['IPv4'], 'IPv4 reported from the start (an IPv6 VIP would add IPv6)');
    const prog = ctl.programming().IPv4!;
    assert.ok(prog.lastUpdated !== undefined && prog.pendingSince === undefined, 'the applied Services are programmed: no change waits (the health checks\' staleness)');
    const st = ctl.status();
    assert.is(st.length, N);
    assert.equal(st.filter((s) => s.refused || s.problem || s.nodeProblem), [], 'no Service refused or with a problem');
    const vips = new Set(st.map((s) => s.vip));
    assert.is(vips.size, N, 'a distinct VIP each');
    assert.equal(ctl.slotBudget(), { used: 0, max: 16 });
    assert.ok(st.every((s) => s.slot === undefined && s.announced === false));
    assert.equal(store.notices.subscriptions(), [], 'no VIP is served here: no notice channel subscribed');
    assert.not.ok(fs.existsSync(path.join(dir, 'bpf')), 'no datapath loaded');
    assert.is(ctl.current().length, N, 'health checks still know every Service');
    // The node and tether-operator (which holds every Service's VIP for their status) agree on the VIPs.
    const view = new LbView({ identity: 'tether-operator-0', addresses: new ClusterAddresses(pools, ipam, quiet), store, logger: quiet });
    await view.refresh(r, pools);
    assert.equal(view.status().map((s) => s.vip), st.map((s) => s.vip));
  } finally {
    await ctl.stop();
    await store.connection.close();
    await ipam.close();
    await redis.stop();
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test.run();
