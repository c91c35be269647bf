// Uninstall leaves a working, clean node (issue 19, item 6). One node with tether doing real work (an
// egress gateway and a client pod: pins, tc filters on their host veths, an nft table in the gateway, the
// floating address's route and proxy ARP entry, node sysctls changed). Then docs/install.md's removal steps, in
// order, as the DaemonSets run them on the node — at EVERY step a pod is created and deleted through the
// configuration then in the node's CNI directory — and at the end nothing of ours is left.
//
// The node snapshot is taken with tetherd running but idle (the testbed starts tetherd with the node):
// tetherd changes the node only for pods with roles (every writeNetSysctl(null, …) is in role code), so
// this is the node as it was before tether did anything.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { withTestbed } from './testbed';
import { sleep } from './proc';
import {
  cleanArgs, dirBytes, filesUnder, installerRun, installerSpawn, nodeDirs, oneNodeEgressTopology, podRoundTrip, putTetherToWork, snapshotNode, stopChild, writePrimary,
} from './uninstall-steps';

const NODE = 'n1';
const WATCH_MS = 300;

test('the documented removal steps keep pods creatable and deletable at every step and leave the node clean', async () => {
  await withTestbed(oneNodeEgressTopology(NODE), async (tb) => {
    const d = nodeDirs(tb, NODE, '10.250.1.0/24');
    const before = await snapshotNode(tb, NODE);
    const primary = writePrimary(tb, NODE, d);
    const netBefore = dirBytes(d.netDir);
    assert.equal(filesUnder(d.binDir), [], 'the bin dir starts empty');
    const step = async (label: string, tether: boolean) => {
      const p = await podRoundTrip(tb, NODE, d);
      assert.is(p.plugins.includes('tether'), tether, `${label}: the runtime's configuration ${p.configFile} runs ${p.plugins.join(' → ')}`);
      process.stdout.write(`  ${label}: pod created (${p.ip}) and deleted through ${p.configFile} (${p.plugins.join(' → ')})\n`);
    };

    // ---- install, as the tetherd DaemonSet does: init container, then the cni-watch container.
    const inst = await installerRun(tb, NODE, d, 'install');
    assert.is(inst.code, 0, `install: ${inst.stderr}`);
    const watch = installerSpawn(tb, NODE, d, 'watch', [`--check-interval=${WATCH_MS}`]);
    await step('installed', true);

    // Tether at work: a gateway and a client on the node, the floating address owned here.
    await putTetherToWork(tb, NODE, d, before);

    // ---- step 1: kubectl apply -k install/uninstall — init container 1 (uninstall), then init 2 (clean-node --wait).
    const un = await installerRun(tb, NODE, d, 'uninstall');
    assert.is(un.code, 0, `uninstall: ${un.stderr}`);
    assert.equal(dirBytes(d.netDir), netBefore, 'the CNI directory holds exactly what it held before install');
    const clean = installerSpawn(tb, NODE, d, 'clean-node', ['--wait', '--gone-for=2000', ...cleanArgs(d)]);
    await sleep(WATCH_MS * 6);
    assert.equal(dirBytes(d.netDir), netBefore, `cni-watch did not put tether back after the tombstone; watch said: ${watch.output().slice(-3000)}; uninstall said: ${un.stdout} ${un.stderr}; state: ${fs.readdirSync(d.installerState).join(',')}`);
    assert.match(watch.output(), /uninstall in progress/);
    const ready = await installerRun(tb, NODE, d, 'ready');
    assert.is(ready.code, 1);
    assert.match(ready.stderr, /being uninstalled/);
    assert.ok(fs.existsSync(path.join(d.binDir, 'tether')), 'the executables stay while pods created with tether exist');
    await step('step 1 (tether out of the configuration)', false);
    // A pod created with tether is deleted while tetherd still runs (the operator restarts such workloads).
    await tb.delPod('n1-web');
    await step('step 1, old pod deleted', false);

    // ---- step 2: kubectl -n tether-system delete daemonset tetherd — cni-watch and tetherd get SIGTERM.
    assert.is(await stopChild(watch), 0, 'watch exits 0 on SIGTERM');
    await tb.killTetherd(NODE, 'SIGTERM');
    await step('step 2 (tetherd gone)', false);
    assert.is(fs.existsSync(path.join(d.binDir, 'tether')), true);

    // ---- step 3: the uninstall pod's clean-node sees tetherd gone and cleans; gw1, created with tether, still runs.
    const cleanCode = await new Promise<number | null>((r) => (clean.exitCode !== null ? r(clean.exitCode) : clean.once('exit', r)));
    assert.is(cleanCode, 0, `clean-node --wait: ${clean.output()}`);
    const report1 = JSON.parse(clean.output().split('\n').find((l) => l.startsWith('{"filtersDetached"'))!) as { livePods: string[]; executablesRemoved: boolean; filtersDetached: number; sysctlsRestored: number; routesDeleted: number; nftTablesDeleted: number };
    assert.equal(report1.livePods, ['shop/gw1']);
    assert.is(report1.executablesRemoved, false, 'a pod created with tether still runs: its DEL needs the executable');
    assert.ok(report1.filtersDetached >= 1 && report1.sysctlsRestored >= 1 && report1.routesDeleted >= 1 && report1.nftTablesDeleted === 1, JSON.stringify(report1));
    const hold = installerSpawn(tb, NODE, d, 'hold');
    await step('step 3 (node cleaned, uninstall pod holding)', false);
    // The old pod goes (tetherd away: its DEL runs the configuration cached with it, tether included).
    await tb.delPod('n1-gw1');
    await step('step 3, last old pod deleted', false);
    // The uninstall DaemonSet applied again once the old pods are gone: the same two init containers.
    assert.is((await installerRun(tb, NODE, d, 'uninstall')).code, 0);
    const again = await installerRun(tb, NODE, d, 'clean-node', cleanArgs(d));
    assert.is(again.code, 0, again.stderr);
    assert.is((JSON.parse(again.stdout.trim()) as { executablesRemoved: boolean }).executablesRemoved, true);

    // ---- step 4: kubectl delete -k install/uninstall (and install/): the hold stops and lifts the tombstone.
    assert.is(await stopChild(hold), 0);
    assert.not.ok(fs.existsSync(path.join(d.installerState, 'uninstall-tombstone')), 'tombstone removed');
    await step('step 4 (uninstall DaemonSet deleted)', false);

    // ---- the node is clean.
    const after = await snapshotNode(tb, NODE);
    assert.equal(filesUnder(path.join(d.tetherdState, 'pods')), [], 'no pod records');
    assert.not.ok(fs.existsSync(d.tetherdState), 'tetherd state dir removed');
    assert.not.ok(fs.existsSync(d.pinDir), 'no pins');
    assert.equal(after.links, before.links, 'the same interfaces as before');
    assert.equal(after.tc, before.tc, 'no tc filters of ours');
    assert.equal(after.nft, before.nft, 'no nft tables of ours');
    assert.equal(after.routes, before.routes, 'no routes of ours');
    assert.equal(after.rules, before.rules, 'no rules of ours');
    const changed = Object.keys(before.sysctls).filter((k) => after.sysctls[k] !== undefined && after.sysctls[k] !== before.sysctls[k]);
    assert.equal(changed.map((k) => `${k}: ${before.sysctls[k]} → ${after.sysctls[k]}`), [], 'sysctls as before');
    assert.equal(dirBytes(d.netDir), netBefore, 'the CNI directory byte for byte as before install');
    assert.equal(fs.readFileSync(path.join(d.netDir, '10-primary.conflist')), primary);
    assert.equal(filesUnder(d.binDir), [], 'no executables left');
    assert.equal(filesUnder(d.installerState), [], 'no installer state left');
  });
});

test.run();
