// The testbed driven through the Kubernetes API (the run's FAKE API server: no kube-apiserver runs on these
// machines) instead of the config file: tetherd on every node runs with --kubeconfig, pods get their roles
// from their Pod objects' labels, block claims are AddressBlock resources, and tether-operator (its
// Deployment's replicas, in container mode from its manifest) writes status; both admission policies are
// enforced on every write (a denial fails the run).
// The same Egress scenario as the file source's tests must give the same results, and each change made
// through the API (a label, an Egress deleted, a refused object) takes effect while tetherd runs.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { withTestbed, type Testbed } from './testbed';
import { runTraffic, topology, waitOwner, waitStandbyReady } from './egress-scenario';
import { CLIENT_SCRIPT } from './probe';
import { compareWithStatus, namingProblems, parseExposition } from '../lib/metrics';

const CONNS = Number(process.env.EGRESS_TEST_CONNS ?? 100);
type Obj = Record<string, any>; // eslint-disable-line @typescript-eslint/no-explicit-any

async function until<T>(what: string, fn: () => Promise<T | undefined | false> | T | undefined | false, timeoutMs = 15_000, why?: () => string): Promise<T> {
  const end = Date.now() + timeoutMs;
  for (;;) {
    const v = await Promise.resolve().then(fn).catch(() => undefined);
    if (v) return v;
    if (Date.now() > end) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}${why ? `: ${why()}` : ''}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

async function sourceSeen(tb: Testbed, pod: string): Promise<string> {
  const r = await tb.exec(pod, [process.execPath, '-e', CLIENT_SCRIPT, tb.externalIp('server'), '9100', '2000']);
  return r.code === 0 ? r.stdout.trim() : `error ${r.stderr.trim()}`;
}

const METRICS_GET = "require('http').get('http://127.0.0.1:10268/metrics', (r) => { let b = ''; r.on('data', (d) => (b += d)); r.on('end', () => process.stdout.write(b)); })";

const ready = (o: Obj | undefined) => (o?.status?.conditions as Obj[] | undefined)?.find((c) => c.type === 'Ready');

test('through the API: roles from Pod labels, steering, ownership and failover, claims as AddressBlocks, status written back, live changes', async () => {
  await withTestbed({ ...topology(), configSource: 'kubernetes' }, async (tb) => {
    // Block claims are resources: one per node with pods, and what each tetherd reports is what the API holds.
    const blocks = await until('a block claimed by every node', () => {
      const b = tb.api.list('AddressBlock');
      return new Set(b.map((x) => x.spec?.node)).size === 3 && b;
    });
    for (const n of ['n1', 'n2', 'n3']) {
      const mine = blocks.filter((b) => b.spec.node === n).map((b) => b.spec.cidr).sort();
      assert.equal((await tb.nodeBlocks(n)).blocks.slice().sort(), mine, `${n}'s blocks are its AddressBlock resources`);
    }

    // Ownership from API labels (the conflist carries none here), and the operator writes it into status.
    const first = await waitOwner(tb);
    const egress = await until('Egress status with the owner', () => {
      const e = tb.api.get('Egress', 'out', 'shop');
      return e?.status?.addresses?.[0]?.ownerNode === first.node && ready(e)?.status === 'True' && e;
    }, 15_000, () => JSON.stringify(tb.api.get('Egress', 'out', 'shop')?.status));
    const { flows: _flows, bytes: _bytes, ...addr } = egress.status.addresses[0];
    assert.equal(addr, { address: first.st.address, ownerNode: first.node, zone: first.node === 'n1' ? 'a' : 'b', ownerPod: first.st.owner, epoch: first.st.epoch });
    const complete = (egress.status.conditions as Obj[]).find((c) => c.type === 'AddressesComplete');
    assert.equal([complete?.status, complete?.reason], ['True', 'AllHeld'], JSON.stringify(egress.status.conditions));
    await until('AddressPool status Ready', () => ready(tb.api.get('AddressPool', 'float'))?.status === 'True');
    // One of the operator's replicas holds its Lease; no node ever touches one.
    const leases = tb.api.list('Lease');
    assert.equal(leases.map((l) => l.metadata.name), ['tether-operator'], 'only the operator\'s Lease');
    assert.ok(tb.operatorIdentities.includes(leases[0].spec?.holderIdentity), `held by a replica (${leases[0].spec?.holderIdentity}; replicas ${tb.operatorIdentities.join(', ')})`);

    // Failover under traffic, exactly as with the file source: the owner's gateway pod goes (its Pod
    // object too, as kubelet and the API would), every connection survives, status follows.
    const standby = first.node === 'n1' ? 'n2' : 'n1';
    await waitStandbyReady(tb, first.node, standby);
    const ownerPod = `${first.node}-gw${first.node.slice(1)}`;
    const { report } = await runTraffic(tb, CONNS, 9000, async () => {
      await tb.delPod(ownerPod);
    });
    const second = await waitOwner(tb, first.st.owner);
    process.stdout.write(`  API-driven failover: ${first.st.owner} → ${second.st.owner}, ${report.intact}/${CONNS} intact, longest gap ${report.maxGapAfterMarkMs} ms\n`);
    assert.is(report.intact, CONNS, `${report.intact}/${CONNS} intact; ${report.errors.slice(0, 4).join('; ')}`);
    await until('Egress status counts the flows of the clients', () => (tb.api.get('Egress', 'out', 'shop')?.status?.addresses?.[0]?.flows ?? 0) >= CONNS, 45_000,
      () => JSON.stringify(tb.api.get('Egress', 'out', 'shop')?.status?.addresses));
    await until('Egress status names the new owner', () => tb.api.get('Egress', 'out', 'shop')?.status?.addresses?.[0]?.ownerNode === second.node,
      15_000, () => JSON.stringify(tb.api.get('Egress', 'out', 'shop')?.status));

    // Operability, on the real tetherds in their containers. The ownership change is an Event on the Egress,
    // reported by the node that decided it, as itself.
    const moves = await until('an Event on the Egress for the ownership change', () => {
      const ev = tb.api.list('Event').filter((e) => e.regarding?.kind === 'Egress' && e.regarding?.name === 'out' && ['Handover', 'Takeover'].includes(e.reason));
      return ev.length > 0 && ev;
    }, 15_000, () => JSON.stringify(tb.api.list('Event').map((e) => [e.reason, e.regarding?.name, e.note])));
    for (const e of moves) {
      assert.is(e.reportingController, 'tether.dev/tetherd');
      assert.ok(['n1', 'n2'].includes(e.reportingInstance), `reported by a gateway node, as itself: ${e.reportingInstance}`);
      assert.match(e.note, new RegExp(first.st.address.replaceAll('.', '\\.')), e.note);
    }
    // Every node's TetherNode says it is ready, its datapath attached and its store reachable.
    await until('a Ready TetherNode per node, store reachable', () => ['n1', 'n2', 'n3'].every((n) => {
      const c = (tb.api.get('TetherNode', n)?.status?.conditions ?? []) as Obj[];
      return ['Ready', 'DatapathAttached', 'StoreReachable'].every((t) => c.find((x) => x.type === t)?.status === 'True');
    }), 15_000, () => JSON.stringify(tb.api.list('TetherNode').map((t) => [t.metadata.name, t.status?.conditions?.map((c: Obj) => `${c.type}=${c.status}`)])));
    // /metrics on each node (127.0.0.1:10268, the DaemonSet's default) agrees with that node's status; the
    // cluster-wide allocation count is re-read in the background, so the two are compared until they agree.
    for (const n of ['n1', 'n2', 'n3']) {
      let last: string[] = [];
      await until(`${n}: /metrics agrees with tetherctl status`, async () => {
        const status = await tb.status(n);
        const r = await tb.exec(n, [process.execPath, '-e', METRICS_GET]);
        const scrape = parseExposition(r.stdout);
        assert.equal(namingProblems(scrape), [], `${n}: metric names`);
        last = compareWithStatus(status as never, scrape);
        return last.length === 0 && scrape;
      }, 35_000, () => last.join('; '));
    }

    const server = tb.spawn('server', [process.execPath, '-e', "require('net').createServer((s) => { s.on('error', () => {}); s.end(s.remoteAddress + '\\n'); }).listen(9100, '0.0.0.0', () => console.log('ready'))"]);
    try {
      await until('web leaves from the floating address', async () => (await sourceSeen(tb, 'n3-web')) === first.st.address);
      // A label changed on the Pod object: web is no longer a client, without being re-attached.
      const web = tb.podObject(tb.pod('n3-web'), { app: 'other' });
      tb.api.apply(web);
      const without = await until('web no longer steered', async () => {
        const s = await sourceSeen(tb, 'n3-web');
        return s !== first.st.address && !s.startsWith('error') && s;
      });
      tb.api.apply(tb.podObject(tb.pod('n3-web'), { app: 'web' }));
      await until('web steered again', async () => (await sourceSeen(tb, 'n3-web')) === first.st.address);

      // A refused object: an Egress over a pool that does not exist. Status says why; nothing else moves.
      const ownerBefore = (await waitOwner(tb, first.st.owner)).st;
      tb.api.apply({
        apiVersion: 'tether.dev/v1alpha1', kind: 'Egress', metadata: { name: 'typo', namespace: 'shop' },
        spec: { clients: { podSelector: { matchLabels: { app: 'batch' } } }, gateways: { podSelector: { matchLabels: { role: 'egress-gw' } } }, destinations: ['198.19.0.0/16'], addresses: { pool: 'flaot', count: 1 } },
      });
      const refused = await until('the refused Egress has a reason in status', () => {
        const c = ready(tb.api.get('Egress', 'typo', 'shop'));
        return c?.status === 'False' && c;
      }, 15_000, () => JSON.stringify(tb.api.get('Egress', 'typo', 'shop')?.status));
      assert.match(refused.message, /flaot/, refused.message);
      assert.is(await sourceSeen(tb, 'n3-web'), first.st.address, 'the running Egress is untouched');
      const ownerAfter = (await waitOwner(tb, first.st.owner)).st;
      assert.equal([ownerAfter.owner, ownerAfter.epoch], [ownerBefore.owner, ownerBefore.epoch]);

      // The Egress deleted through the API: exactly its state goes (the address leaves its gateway, web
      // leaves from its node again).
      tb.api.remove('Egress', 'out', 'shop');
      await until('the Egress gone from every node', async () => {
        for (const n of ['n1', 'n2', 'n3']) if (((await tb.status(n)) as unknown as { egress: Obj[] }).egress.some((e) => e.egress === 'shop/out')) return false;
        return true;
      });
      const after = await until('web leaves from its node', async () => {
        const s = await sourceSeen(tb, 'n3-web');
        return s !== first.st.address && !s.startsWith('error') && s;
      });
      process.stdout.write(`  label removed: seen as ${without}; Egress refused: "${refused.message}"; Egress deleted: seen as ${after}\n`);
    } finally {
      server.kill('SIGTERM');
    }
  });
});

test.run();
