// The node's slot budget in the controller, with the real lb.bpf.o (pinned under a unique bpffs directory)
// and a real redis-server: an LB pod here selects 5 Services but the node has 2 slots (--lb-max-vips 2).
// The first two are programmed; the other three are named in status (nodeProblem) and in one error line
// each naming the VIP, keep their VIPs and their Service status (no 'problem'); when a slotted Service
// goes, its slot goes at once to a waiting one. The LB pod's interface does not exist, so its set-up
// fails before touching the kernel (a role problem): only the slots and maps are under test here.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { Writable } from 'node:stream';
import { makeLogger, setLogger } from '../../lib/log';
import { withLbControllerBed } from '../lib/lb-controller-bed';
import { LbDatapath } from '../../daemon/bpf/lb';
import { resolveLoadBalancers } from '../../daemon/lb/lb-spec';
import { LB_CLASS } from '../../daemon/objects/names';

setLogger(makeLogger({ level: 'error', stream: new Writable({ write: (_c, _e, cb) => cb() }) }));

function objects(names: string[]): Array<Record<string, unknown>> {
  return names.flatMap((name, i) => [
    { apiVersion: 'v1', kind: 'Service', metadata: { name, namespace: 'shop' }, spec: { type: 'LoadBalancer', loadBalancerClass: LB_CLASS, ports: [{ port: 80, protocol: 'TCP' }] } },
    {
      apiVersion: 'discovery.k8s.io/v1', kind: 'EndpointSlice', metadata: { name: `${name}-x`, namespace: 'shop', labels: { 'kubernetes.io/service-name': name } },
      addressType: 'IPv4', endpoints: [{ addresses: [`10.244.9.${i + 2}`], conditions: { ready: true }, nodeName: 'n2' }],
    },
  ]);
}

test('past the node\'s slot budget: named in status and the log, nothing else disturbed; a freed slot is taken', async () => {
  const pools = [{ apiVersion: 'tether.dev/v1alpha1', kind: 'AddressPool', metadata: { name: 'lb' }, spec: { usage: 'loadBalancer', ipv4: { cidr: '198.18.4.0/28' } } }];
  await withLbControllerBed({ name: 'lbslots', pools, podIps: ['10.244.0.9'], controller: { maxVips: 2 } }, async ({ ctl, store, pools, pinDir, logText }) => {
  const names = ['a', 'b', 'c', 'd', 'e'];
  await ctl.apply(resolveLoadBalancers(objects(names), pools));
  const st = ctl.status();
  const by = (n: string) => st.find((s) => s.service === `shop/${n}`)!;
  assert.equal(ctl.slotBudget(), { used: 2, max: 2 });
  assert.equal(names.map((n) => by(n).slot), [0, 1, undefined, undefined, undefined]);
  for (const n of ['c', 'd', 'e']) {
    const s = by(n);
    assert.ok(s.vip, `${n} keeps its VIP`);
    assert.is(s.problem, undefined, `${n}: the Service itself has no problem (other nodes may serve it)`);
    assert.match(String(s.nodeProblem), new RegExp(`no VIP slot left on node n1: all 2 .*VIP ${String(s.vip).replace(/\./g, '\\.')}`));
  }
  const errors = logText().trim().split('\n').map((l) => JSON.parse(l) as Record<string, unknown>).filter((l) => /no slot left/.test(String(l.message)));
  assert.equal(errors.map((l) => l.vip).sort(), ['c', 'd', 'e'].map((n) => by(n).vip).sort(), 'one error line per refused VIP, naming it');
  assert.equal(store.notices.subscriptions(), [by('a').vip, by('b').vip].map((v) => store.notices.channel(String(v))).sort(), 'only the slotted VIPs\' channels');
  // The datapath holds exactly the two slotted VIPs.
  const dp = LbDatapath.load({ pinDir, maxVips: 2, maglevSize: 251 });
  try {
    assert.equal([...dp.services()].sort(), [[String(by('a').vip), 0], [String(by('b').vip), 1]].sort());
  } finally {
    dp.close();
  }
  // Service a goes: its slot is free at once, and c (the first waiting) takes it.
  await ctl.apply(resolveLoadBalancers(objects(['b', 'c', 'd', 'e']), pools));
  const after = ctl.status();
  const c = after.find((s) => s.service === 'shop/c')!;
  assert.is(c.slot, 0);
  assert.is(c.nodeProblem, undefined);
  assert.is(after.find((s) => s.service === 'shop/b')!.slot, 1, 'b kept its slot');
  assert.ok(after.find((s) => s.service === 'shop/d')!.nodeProblem);
  });
});

test.run();
