// A node that newly needs a VIP while the cluster store is unreachable (Redis SIGSTOPped, a real
// redis-server): it serves the VIP from where it was last recorded — the Service's status, else the node's
// own record under the state directory (lb-vips.json, versioned) — marked unconfirmed, and once the store
// answers the VIP is confirmed, or withdrawn when the store gives the Service another.
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
import { VIP_RECORD_FILE, VipRecord } from '../../daemon/lb/vip-record';
import { resolveLoadBalancers } from '../../daemon/lb/lb-spec';
import { PodStore } from '../../daemon/state/pod-store';
import { AttachService } from '../../daemon/pod/attach-service';
import { startRedis, type TestRedis } from '../lib/redis';
import { LB_CLASS } from '../../daemon/objects/names';

const quiet = makeLogger({ level: 'error', stream: new Writable({ write: (_c, _e, cb) => cb() }) });
setLogger(quiet);
const pools = validatePools([
  { apiVersion: 'tether.dev/v1alpha1', kind: 'AddressPool', metadata: { name: 'lb' }, spec: { usage: 'loadBalancer', ipv4: { cidr: '198.18.0.0/28' } } },
]);

/** Service shop/db with one target on `node`, its status naming `recorded` when given. */
function objects(node: string, recorded?: string, extra: Record<string, unknown> = {}): Array<Record<string, unknown>> {
  return [
    {
      apiVersion: 'v1', kind: 'Service', metadata: { name: 'db', namespace: 'shop', ...extra },
      spec: { type: 'LoadBalancer', loadBalancerClass: LB_CLASS, ports: [{ port: 80, protocol: 'TCP' }] },
      ...(recorded ? { status: { loadBalancer: { ingress: [{ ip: recorded, ipMode: 'Proxy' }] } } } : {}),
    },
    {
      apiVersion: 'discovery.k8s.io/v1', kind: 'EndpointSlice', metadata: { name: 'db-x', namespace: 'shop', labels: { 'kubernetes.io/service-name': 'db' } },
      addressType: 'IPv4', endpoints: [{ addresses: ['10.244.0.7'], conditions: { ready: true }, nodeName: node }],
    },
  ];
}

let redis: TestRedis;
let dir: string;
test.before(async () => {
  redis = await startRedis();
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tether-vip-record-'));
});
test.after(async () => {
  redis?.resume();
  await redis?.stop();
  if (dir) fs.rmSync(dir, { recursive: true, force: true });
});

interface Node {
  ctl: LbController;
  stateDir: string;
  close(): Promise<void>;
}

async function node(name: string, stateDir: string): Promise<Node> {
  const ipam = await RedisStore.connect(redis.url, { keyPrefix: 'rec:' });
  const store = await connectLbStore(redis.url, { keyPrefix: 'rec:' });
  fs.mkdirSync(stateDir, { recursive: true });
  const ctl = new LbController({
    node: { name, address: '127.0.0.1' }, pinDir: path.join(stateDir, 'bpf'), fouPort: 5555, exportTable: 0, maxVips: 4,
    store, addresses: new ClusterAddresses(pools, ipam, quiet, { holdOffMs: 0 }), attach: new AttachService(new PodStore(path.join(stateDir, 'pods')), quiet),
    stateDir, logger: quiet,
  });
  return {
    ctl, stateDir,
    close: async () => {
      await ctl.stop();
      await store.connection.close();
      await ipam.close();
    },
  };
}

const db = (n: Node) => n.ctl.status().find((s) => s.service === 'shop/db')!;

test('the node record: versioned, a file without "v" read as version 1, another version or garbage ignored', () => {
  const d = fs.mkdtempSync(path.join(dir, 'file-'));
  const file = path.join(d, VIP_RECORD_FILE);
  const r = new VipRecord(d, quiet);
  r.save(new Map([['shop/db', { pool: 'lb', vip: '198.18.0.3' }]]));
  assert.equal(JSON.parse(fs.readFileSync(file, 'utf8')), { v: 1, vips: { 'shop/db': { pool: 'lb', vip: '198.18.0.3' } } });
  assert.is(new VipRecord(d, quiet).get('shop/db', 'lb'), '198.18.0.3');
  assert.is(new VipRecord(d, quiet).get('shop/db', 'other'), undefined, 'a VIP of another pool is not the Service\'s now');
  fs.writeFileSync(file, JSON.stringify({ vips: { 'shop/db': { pool: 'lb', vip: '198.18.0.4' } } }));
  assert.is(new VipRecord(d, quiet).get('shop/db', 'lb'), '198.18.0.4', 'no "v": version 1');
  fs.writeFileSync(file, JSON.stringify({ v: 2, vips: { 'shop/db': { pool: 'lb', vip: '198.18.0.4' } } }));
  assert.is(new VipRecord(d, quiet).get('shop/db', 'lb'), undefined, 'a later version is not guessed at');
  fs.writeFileSync(file, '{"v":1,"vi');
  assert.is(new VipRecord(d, quiet).get('shop/db', 'lb'), undefined);
});

test('the Service\'s recorded VIP is read from its status only inside its pool, and only when it is the requested one', () => {
  const one = (o: Array<Record<string, unknown>>) => resolveLoadBalancers(o, pools).loadBalancers[0].vip;
  assert.equal(one(objects('n1', '198.18.0.5')), { pool: 'lb', recorded: '198.18.0.5' });
  assert.equal(one(objects('n1', '10.9.9.9')), { pool: 'lb' }, 'outside the pool: ignored');
  assert.equal(one(objects('n1')), { pool: 'lb' });
  assert.equal(one(objects('n1', '198.18.0.5', { annotations: { 'lb.tether.dev/vip': '198.18.0.6' } })), { pool: 'lb', address: '198.18.0.6' }, 'not the requested one: ignored');
});

test('with the store unreachable a node that newly needs a VIP serves it from the Service\'s status or its own record, unconfirmed; confirmed when the store is back, withdrawn when the store says otherwise', async () => {
  const a = await node('n1', path.join(dir, 'n1'));
  let vip: string;
  try {
    await a.ctl.apply(resolveLoadBalancers(objects('n1'), pools));
    vip = String(db(a).vip);
    assert.ok(vip.startsWith('198.18.0.'), `allocated with the store up: ${JSON.stringify(db(a))}`);
    assert.is(db(a).vipUnconfirmed, undefined);
    assert.equal(JSON.parse(fs.readFileSync(path.join(a.stateDir, VIP_RECORD_FILE), 'utf8')).vips['shop/db'], { pool: 'lb', vip }, 'kept in the node record');
  } finally {
    await a.close();
  }

  const fromStatus = await node('n2', path.join(dir, 'n2'));
  const restarted = await node('n1', path.join(dir, 'n1')); // n1 again, with its record
  const stale = await node('n3', path.join(dir, 'n3'));
  const other = vip.endsWith('.9') ? '198.18.0.10' : '198.18.0.9';
  redis.pause();
  try {
    await fromStatus.ctl.apply(resolveLoadBalancers(objects('n2', vip), pools));
    await restarted.ctl.apply(resolveLoadBalancers(objects('n1'), pools));
    await stale.ctl.apply(resolveLoadBalancers(objects('n3', other), pools));
    assert.is(db(fromStatus).vip, vip, `from the Service's status: ${JSON.stringify(db(fromStatus))}`);
    assert.match(String(db(fromStatus).vipUnconfirmed), /Service status/);
    assert.is(db(restarted).vip, vip, `from the node's record: ${JSON.stringify(db(restarted))}`);
    assert.match(String(db(restarted).vipUnconfirmed), /node record/);
    assert.is(db(stale).vip, other, 'a stale status is all this node has meanwhile');
    assert.is(db(stale).problem, undefined);
  } finally {
    redis.resume();
  }
  try {
    for (const n of [fromStatus, restarted, stale]) await n.ctl.kick();
    await stale.ctl.kick(); // the withdrawn one is asked for again
    for (const n of [fromStatus, restarted]) {
      assert.is(db(n).vip, vip);
      assert.is(db(n).vipUnconfirmed, undefined, 'confirmed by the store');
    }
    assert.is(db(stale).vip, vip, `the store's VIP replaces the stale one: ${JSON.stringify(db(stale))}`);
    assert.is(db(stale).vipUnconfirmed, undefined);
  } finally {
    for (const n of [fromStatus, restarted, stale]) await n.close();
  }
});

test.run();
