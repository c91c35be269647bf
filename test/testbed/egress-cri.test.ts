// The egress failover scenario (egress-scenario.ts) end to end with every pod made as kubelet makes it:
// each node's containerd, in the node's namespace, runs RunPodSandbox through the conflist that
// `tether-install` chained on that node (testbed runtime 'cri'). Pod labels reach tetherd as Pod objects
// in its config file, keyed by the namespace/name containerd passes in CNI_ARGS; the client's
// encapOverhead is its node's conflist entry. The owner gateway pod dies abruptly and its namespace
// vanishes without a CNI DEL; every connection must continue from the same floating address.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import * as fs from 'node:fs';
import { withTestbed, type Testbed } from './testbed';
import { egressOf, runTraffic, topology, waitOwner } from './egress-scenario';
import * as path from 'node:path';
import { mountsUnder } from '../lib/cri/containerd';
import { mustRun } from './proc';
import type { PodSpec, Topology } from './topology';

const CONNS = Number(process.env.EGRESS_TEST_CONNS ?? 200);

/**
 * The scenario's topology for a runtime that passes no per-pod CNI configuration: each pod keeps its
 * labels (they become Pod objects); any other per-pod tether field moves to its node's conflist entry,
 * which is only sound with one pod per node, as here.
 */
function criTopology(): Topology {
  const t = topology();
  for (const n of t.nodes) {
    const pods = (n.pods ?? []) as PodSpec[];
    for (const p of pods) {
      const { labels, ...rest } = p.tether ?? {};
      if (Object.keys(rest).length === 0) continue;
      if (pods.length !== 1) throw new Error(`node ${n.name}: per-pod fields of ${p.name} cannot become node-wide with ${pods.length} pods`);
      n.tether = { ...n.tether, ...rest };
      p.tether = labels ? { labels } : undefined;
    }
  }
  return t;
}

/** tetherd's pods on a node (its status), by namespace/name. */
async function tetherdPods(tb: Testbed, node: string): Promise<string[]> {
  const st = (await tb.status(node)) as unknown as { pods: Array<{ podNamespace?: string; podName?: string; pod?: string }> };
  return st.pods.map((p) => p.pod ?? `${p.podNamespace}/${p.podName}`);
}

/**
 * A sandbox dies abruptly and its network namespace vanishes with it, without a CNI DEL: its pause
 * process SIGKILLed, then every mount of its netns (containerd's /run/netns/cni-… and the testbed's
 * alias) removed, as `ip netns del` removes a plain testbed pod's. Nothing is asked of containerd.
 */
async function killSandboxAbruptly(tb: Testbed, key: string): Promise<void> {
  const pod = tb.pod(key);
  if (!pod.sandbox) throw new Error(`${key} was not made through CRI`);
  const cri = tb.criNode(pod.node);
  process.kill(await cri.pausePid(pod.sandbox.id), 'SIGKILL');
  await cri.dropAlias(pod.sandbox.alias);
  await mustRun(['umount', pod.sandbox.criNetns]);
  fs.rmSync(pod.sandbox.criNetns);
}

/** What each node's containerd runs and holds now; check() after teardown lists what is still there. */
async function criTraces(tb: Testbed): Promise<{ check: () => string[] }> {
  const pids: number[] = [];
  const paths: string[] = [];
  for (const n of tb.plan.nodes) {
    const c = tb.criNode(n.name).containerd;
    if (c.pid) pids.push(c.pid);
    pids.push(...c.shimPids());
    // cgroup v1 hierarchies here (v2 elsewhere): the pods' parent below each.
    const roots = ['', ...fs.readdirSync('/sys/fs/cgroup')].map((h) => path.join('/sys/fs/cgroup', h, c.cgroupParent));
    paths.push(c.dir, ...roots);
  }
  for (const p of tb.listPods()) if (p.sandbox) paths.push(p.sandbox.criNetns, p.sandbox.alias);
  // A zombie has exited (only its parent's wait is missing): not alive.
  const alive = (pid: number) => {
    try {
      const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
      return stat.slice(stat.lastIndexOf(')') + 2, stat.lastIndexOf(')') + 3) !== 'Z';
    } catch {
      return false;
    }
  };
  return {
    check: () => [
      ...pids.filter(alive).map((p) => `process ${p}`),
      ...paths.filter((p) => fs.existsSync(p)),
      ...mountsUnder(tb.runDir),
    ],
  };
}

test('CRI pods: owner gateway killed abruptly: every TCP connection continues from the same floating address', async () => {
  let traces: { check: () => string[] } | undefined;
  await withTestbed(
    criTopology(),
    async (tb) => {
      traces = await criTraces(tb);
      assert.ok(traces.check().length >= 3 * 3, `the check sees what the containerds hold while they run: ${traces.check().join(', ')}`);
      // Every pod is a containerd sandbox on its own node, chained by tether-install.
      for (const key of ['n1-gw1', 'n2-gw2', 'n3-web']) {
        const pod = tb.pod(key);
        assert.ok(pod.sandbox, `${key} was made through CRI`);
        assert.match(pod.sandbox!.criNetns, /\/netns\/cni-/, `${key}'s netns is containerd's`);
        const plugins = (tb.criNode(pod.node).loadedConflist().plugins as Array<{ type: string }>).map((p) => p.type);
        assert.equal(plugins, ['ptp', 'tether'], `${pod.node}'s containerd loads ptp → tether`);
        // The host end of the pod's veth is in the node's namespace: containerd ran ptp there.
        const route = await tb.mustExec(pod.node, ['ip', '-j', 'route', 'show', `${pod.ip}/32`]);
        assert.ok((JSON.parse(route.stdout) as unknown[]).length === 1, `${pod.node} routes ${pod.ip} to its pod`);
      }
      const webEntry = (tb.criNode('n3').loadedConflist().plugins as Array<Record<string, unknown>>)[1];
      assert.is(webEntry.encapOverhead, 28, "n3's tether entry carries the client's encapOverhead");
      assert.is(webEntry.labels, undefined, 'no labels in any conflist');
      // (ip, not /sys: nsenter --net leaves /sys showing the host's namespace)
      const link = JSON.parse((await tb.mustExec('n3-web', ['ip', '-j', 'link', 'show', 'eth0'])).stdout) as Array<{ mtu: number }>;
      assert.is(link[0]?.mtu, 1472, 'tether applied encapOverhead 28 to the client pod (1500 − 28)');

      const first = await waitOwner(tb, undefined, 20_000);
      const floating = first.st.address;
      const ownerKey = `${first.node}-${first.st.owner.split('/')[1]}`;
      const { report, peers } = await runTraffic(tb, CONNS, 9000, async () => {
        await killSandboxAbruptly(tb, ownerKey);
      });
      const next = await waitOwner(tb, first.st.owner);
      assert.is.not(next.node, first.node, 'the other gateway took over');
      assert.ok(next.st.epoch > first.st.epoch, `epoch grew: ${first.st.epoch} → ${next.st.epoch}`);
      assert.is(report.intact, CONNS, `${report.intact}/${CONNS} connections intact; first errors: ${report.errors.slice(0, 6).join('; ')}`);
      assert.equal(report.errors, [], 'no connection error');
      assert.ok(report.maxGapAfterMarkMs !== undefined && report.maxGapAfterMarkMs < 1000, `longest gap during the event ${report.maxGapAfterMarkMs} ms`);
      const tcpPeers = peers.filter((p) => !p.startsWith('udp'));
      assert.is(tcpPeers.length, CONNS);
      assert.ok(tcpPeers.every((p) => p.startsWith(`${floating}:`)), `server saw only the floating address: ${tcpPeers.slice(0, 3)}`);
      assert.ok(report.udp && report.udp.received > report.udp.sent * 0.8, `UDP continued: ${JSON.stringify(report.udp)}`);
      process.stdout.write(
        `  CRI failover: longest gap ${report.maxGapAfterMarkMs} ms during the failover (${report.maxGapMs} ms over the whole run) over ${CONNS} connections, ` +
          `UDP ${report.udp?.received}/${report.udp?.sent}, epoch ${first.st.epoch} → ${next.st.epoch}, takeover ${JSON.stringify(next.st.lastTakeover)}\n`,
      );

      // kubelet then finds the sandbox dead and deletes the pod: StopPodSandbox + RemovePodSandbox. Nothing
      // of the dead pod may stay with tetherd or its IPAM.
      const before = { pods: await tetherdPods(tb, first.node), allocated: (await tb.nodeBlocks(first.node)).allocated };
      await tb.delPod(ownerKey);
      const after = { pods: await tetherdPods(tb, first.node), allocated: (await tb.nodeBlocks(first.node)).allocated };
      process.stdout.write(`  ${first.node} before kubelet's cleanup ${JSON.stringify(before)}, after ${JSON.stringify(after)}\n`);
      assert.not.ok(after.pods.includes(first.st.owner), `${first.node}'s tetherd keeps no record of ${first.st.owner}: ${JSON.stringify(after.pods)}`);
      assert.is(after.allocated, 0, `${first.node}'s pod addresses all released`);
      const stillOwner = await egressOf(tb, next.node);
      assert.is(stillOwner?.owner, next.st.owner, 'the new owner keeps the address after the dead sandbox is removed');
    },
    { runtime: 'cri' },
  );
  // down() destroyed every containerd (the remaining sandboxes through CRI first): nothing of them is left.
  // A shim of a removed sandbox exits on its own, shortly after: processes get 5 s to finish exiting.
  const t0 = Date.now();
  while ((traces?.check().length ?? 0) > 0 && Date.now() - t0 < 5000) await new Promise((r) => setTimeout(r, 100));
  assert.equal(traces?.check(), [], 'containerds, shims, sandboxes, netns, cgroups and mounts all gone');
  process.stdout.write(`  after teardown: nothing of the containerds left (${Date.now() - t0} ms after down())\n`);
});

// kubelet deletes the owner gateway pod: StopPodSandbox runs the CNI DEL (tether's goodbye), a planned
// handover; the thresholds are egress-failover.test.ts's for the handover through the chain.
test('CRI pods: owner gateway pod deleted through StopPodSandbox: no connection lost, gap under 200 ms', async () => {
  await withTestbed(
    criTopology(),
    async (tb) => {
      const first = await waitOwner(tb, undefined, 20_000);
      const ownerKey = `${first.node}-${first.st.owner.split('/')[1]}`;
      let stopMs = 0;
      const { report, peers } = await runTraffic(tb, CONNS, 8000, async () => {
        stopMs = (await tb.delPod(ownerKey)).ms;
      });
      const next = await waitOwner(tb, first.st.owner);
      assert.match(String(next.st.lastTakeover?.cause ?? ''), /handover/);
      assert.is(report.intact, CONNS, `${report.intact}/${CONNS} intact; ${report.errors.slice(0, 4).join('; ')}`);
      assert.ok(report.maxGapAfterMarkMs !== undefined && report.maxGapAfterMarkMs < 200, `longest gap during the handover ${report.maxGapAfterMarkMs} ms`);
      assert.ok(peers.filter((p) => !p.startsWith('udp')).every((p) => p.startsWith(`${first.st.address}:`)), 'server saw only the floating address');
      const left = { pods: await tetherdPods(tb, first.node), allocated: (await tb.nodeBlocks(first.node)).allocated };
      assert.not.ok(left.pods.includes(first.st.owner), `${first.node}'s tetherd keeps no record of ${first.st.owner}`);
      assert.is(left.allocated, 0, `${first.node}'s pod addresses all released`);
      // Negative control: the gateways' labels reach tetherd only through the Pod objects (containerd passes
      // none to CNI); with them gone from the config file no node has a gateway candidate left.
      const cfg = JSON.parse(fs.readFileSync(tb.ipamConfigPath, 'utf8')) as { items: Array<{ kind: string }> };
      assert.ok(cfg.items.some((o) => o.kind === 'Pod'), 'the config file holds the pods\' Pod objects');
      fs.writeFileSync(`${tb.ipamConfigPath}.tmp`, JSON.stringify({ ...cfg, items: cfg.items.filter((o) => o.kind !== 'Pod') }));
      fs.renameSync(`${tb.ipamConfigPath}.tmp`, tb.ipamConfigPath);
      const end = Date.now() + 10_000;
      let seen: string[] = [];
      for (;;) {
        seen = (await Promise.all(['n1', 'n2', 'n3'].map(async (n) => ((await egressOf(tb, n)) as { candidates?: unknown[] } | undefined)?.candidates?.length ?? 0))).map(String);
        if (seen.every((c) => c === '0') || Date.now() > end) break;
        await new Promise((r) => setTimeout(r, 200));
      }
      assert.equal(seen, ['0', '0', '0'], 'without Pod objects no gateway candidate on n1, n2, n3');
      process.stdout.write(
        `  CRI planned handover: StopPodSandbox + RemovePodSandbox ${stopMs} ms, longest gap ${report.maxGapAfterMarkMs} ms during the handover ` +
          `(${report.maxGapMs} ms over the whole run) over ${CONNS} connections, takeover ${JSON.stringify(next.st.lastTakeover)}\n`,
      );
    },
    { runtime: 'cri' },
  );
});

test.run();
