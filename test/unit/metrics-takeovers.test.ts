// Egress takeovers by cause, from the decision to the scrape: a real EgressController (not started: no BFD
// thread, no BPF) whose election hands an address over from its local gateway pod to a live candidate on
// another node; its status counts the handover, and the metrics read from that status show it. A scrape
// reads the status without asking the store passes for the cluster-wide use (tetherctl status does ask).
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { Writable } from 'node:stream';
import { makeLogger, setLogger } from '../../lib/log';
import { ClusterAddresses } from '../../ipam/cluster-addresses';
import { validatePools } from '../../ipam/pool';
import { RedisStore } from '../../ipam/store/redis-store';
import { EgressController } from '../../daemon/egress/egress-controller';
import { OwnershipStore, type GatewayInfo } from '../../daemon/egress/ownership-store';
import { takeoverCause, draining, type EgressShared } from '../../daemon/egress/egress-state';
import type { Election } from '../../daemon/egress/election';
import type { GatewayDatapath } from '../../daemon/egress/gateway-datapath';
import type { ResolvedEgress } from '../../daemon/egress/egress-spec';
import type { AttachService } from '../../daemon/pod/attach-service';
import { metricSources } from '../../daemon/parts/metrics';
import { TetherMetrics } from '../../daemon/metrics/tether-metrics';
import { startRedis } from '../lib/redis';
import { parseExposition } from '../lib/metrics';

const quiet = makeLogger({ level: 'error', stream: new Writable({ write: (_c, _e, cb) => cb() }) });
setLogger(quiet);

const EGRESS: ResolvedEgress = {
  key: 'shop/out', name: 'out', namespace: 'shop',
  clients: { matchLabels: { app: 'client' } }, gateways: { matchLabels: { app: 'gw' } },
  families: [4], destinations: ['203.0.113.0/24'], excluded: [], addresses: [{ pool: 'float', count: 1 }], zonePolicy: 'any',
  failover: { intervalMs: 50, detectMultiplier: 3 }, announce: { mode: 'l2' },
};
const gw = (i: number): GatewayInfo => ({ pod: `shop/gw-${i}`, node: `n${i}`, nodeAddress: `10.1.0.${i}`, podIp: `10.244.0.${i}` });

test('the kinds of cause: a claim is initial or failover, anything handed on is a handover', () => {
  assert.is(takeoverCause('initial', false), 'initial');
  assert.is(takeoverCause('failover: owner shop/gw-2 on n2 is down', false), 'failover');
  assert.is(takeoverCause('failover: owner shop/gw-2 is no longer a live gateway (no in-sync candidate is live)', false), 'failover');
  assert.is(takeoverCause(draining('tetherd stopping'), true), 'handover');
});

test('a handover this node decides is counted by cause in its status and in the scrape; the scrape does not ask for cluster-wide use', async () => {
  const redis = await startRedis();
  const pools = validatePools([{ apiVersion: 'tether.dev/v1alpha1', kind: 'AddressPool', metadata: { name: 'float' }, spec: { usage: 'floating', ipv4: { cidr: '198.51.100.0/28' } } }]);
  const ownership = await OwnershipStore.connect(redis.url, { keyPrefix: 't:' });
  const store = await RedisStore.connect(redis.url, { keyPrefix: 't:' });
  const ctl = new EgressController({
    node: { name: 'n1', address: '10.1.0.1', uplink: 'eth0' }, pinDir: '/nonexistent', fouPort: 0, syncPort: 0, clusterKey: Buffer.alloc(32),
    egresses: [EGRESS], ownership, addresses: new ClusterAddresses(pools, store, quiet), attach: {} as AttachService, logger: quiet,
  });
  try {
    // Its shared state, as the started controller would have it: gw-1 here owns the address, gw-2 on n2 is a live candidate.
    const { s, election } = ctl as unknown as { s: EgressShared; election: Election };
    s.gateways.set('shop/gw-1', { info: gw(1), datapath: { guardStats: () => ({}) } as unknown as GatewayDatapath, egresses: new Set([EGRESS.key]), guarded: '', netns: '' });
    s.registry.set(EGRESS.key, [gw(1), gw(2)]);
    const st = s.track(EGRESS, '198.51.100.5', { pool: 'float', index: 0 }, { egress: EGRESS.key, address: '198.51.100.5', owner: 'shop/gw-1', epoch: 4, ownerNode: 'n1', ownerNodeAddress: '10.1.0.1', ownerPodIp: gw(1).podIp });
    assert.equal(ctl.status({ observe: false })[0].takeovers, {}, 'nothing decided yet');

    const next = election.handOver(st, 'shop/gw-1', 'handover: gateway pod deleted (shop/gw-1)');
    assert.is(next?.pod, 'shop/gw-2');
    const status = ctl.status({ observe: false })[0];
    assert.equal(status.takeovers, { handover: 1 });
    assert.is(status.ownerNode, 'n2');
    assert.is(s.observedUntil, 0, 'status({ observe: false }) leaves the store passes alone');

    const metrics = new TetherMetrics(quiet);
    metrics.use(metricSources({ egress: ctl }, quiet).sources);
    const scrape = parseExposition(await metrics.scrape());
    const l = { egress: 'shop/out', address: '198.51.100.5' };
    assert.is(scrape.value('tether_egress_address_takeovers_total', { ...l, cause: 'handover' }), 1);
    assert.is(scrape.value('tether_egress_address_owner_info', { ...l, owner_node: 'n2' }), 1);
    assert.is(scrape.value('tether_egress_address_owned', l), 0);
    assert.is(scrape.value('tether_egress_address_epoch', l), 5);
    assert.is(s.observedUntil, 0, 'a scrape does not make the store passes read every node\'s use');
    ctl.status();
    assert.ok(s.observedUntil > Date.now(), 'tetherctl status does (its clusterFlows, clusterBytes)');
  } finally {
    await s_records(ctl);
    await ownership.close();
    await store.close();
    await redis.stop();
  }
});

/** The handover's store write runs in the background: let it finish before the store goes. */
async function s_records(ctl: EgressController): Promise<void> {
  await (ctl as unknown as { s: EgressShared }).s.records.close(2000);
}

test.run();
