// Egress announce mode routeTable against real BGP: GatewayDatapath puts the floating /32 in the node's
// route-export table, the node's BIRD advertises that table over eBGP, and the upstream router's BIRD
// installs it in the router's kernel FIB. Topology (each a namespace; tetherd's side runs in the node's):
//
//   pod a1 ─vga1─┐                                                          ┌─vgb1─ pod b1
//   pod a2 ─vga2─┤ node A 10.94.1.2 ─eth0──ra─ router ─rb──eth0─ node B 10.94.2.2 │
//                  (BIRD, AS 65001)          (BIRD, AS 65000)       (BIRD, AS 65002)
//
// Every assertion on the router is on its FIB (`ip route get`), polled with a timeout. The IPv6 test
// gives every link an IPv6 subnet too (router fd00:94:<n>::1, node ::2; pods fd00:95:<x>::2) and runs
// IPv6 BGP sessions between the IPv6 addresses.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { execFileSync } from 'node:child_process';
import * as fs from 'node:fs';
import { Writable } from 'node:stream';
import { ensureBpffs } from '../../daemon/bpf/bpffs';
import { GatewayDatapath } from '../../daemon/egress/gateway-datapath';
import { ipFamily } from '../../lib/ip';
import { makeLogger, setLogger } from '../../lib/log';
import { inNetns } from '../../daemon/sys/netns';
import { birdInstalled, exportTableSpeakerConfig, startBird, upstreamRouterConfig, waitBgpEstablished, type TestBird } from '../lib/bird';
import { addNetns, delNetns, startInNetns, ipJson, uniqueName } from '../lib/netns';
import { waitFor } from '../lib/wait';

const FLOAT = '198.51.100.80';
const FLOAT6 = '2001:db8:80::80';
// Above 255: the table id only fits in RTA_TABLE, which both tetherd and BIRD must use.
const TABLE = 4242;
const ANNOUNCE = { mode: 'routeTable' as const, table: TABLE };
const ROUTER_AS = 65000;
const CONVERGE_MS = 10_000;

interface FabricNode {
  ns: string;
  ip: string;
  ip6: string;
  pods: Record<string, GatewayDatapath>;
}

interface Fabric {
  router: string;
  routerBird: TestBird;
  nodes: Record<string, FabricNode>;
}

const nsPath = (ns: string) => `/run/netns/${ns}`;
const ip = (ns: string, ...args: string[]) => execFileSync('ip', ['-n', ns, ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
/** `ip` arguments that pick the address's family (none for IPv4: the commands stay as they were). */
const fam = (address: string) => (ipFamily(address) === 6 ? ['-6'] : []);
const sysctl = (ns: string, ...kv: string[]) => execFileSync('nsenter', [`--net=${nsPath(ns)}`, 'sysctl', '-qw', ...kv]);

/** tetherd's node-side work (own namespace = the node's) runs with this thread inside the node namespace. */
function onNode<T>(node: FabricNode, fn: () => T): T {
  return inNetns(nsPath(node.ns), fn);
}
function startOnNode<T>(node: FabricNode, fn: () => Promise<T>): Promise<T> {
  return startInNetns(nsPath(node.ns), fn);
}

/**
 * Builds router + nodes (each with its gateway pods, prepared by GatewayDatapath) and BIRDs with
 * Established sessions, runs fn, and always removes everything: datapaths, BIRDs, namespaces, temp dir.
 */
async function withFabric(spec: Record<string, string[]>, fn: (f: Fabric) => Promise<void>, o: { ipv6?: boolean } = {}): Promise<void> {
  assert.ok(birdInstalled(), 'bird is not installed (Debian package bird2; install/deps.sh installs it)');
  const base = uniqueName('trt');
  const router = `${base}-r`;
  const namespaces = [router];
  const birds: TestBird[] = [];
  const datapaths: Array<[FabricNode, GatewayDatapath]> = [];
  // The gateway datapath pins its source guard's maps: a directory on the bpffs.
  const pinDir = `/sys/fs/bpf/tether-test/${base}`;
  ensureBpffs(pinDir);
  try {
    addNetns(router);
    // The IPv6 addresses are given with nodad; this spares the link-local ones the second of DAD.
    if (o.ipv6) sysctl(router, 'net.ipv6.conf.default.accept_dad=0', 'net.ipv6.conf.all.accept_dad=0');
    const nodes: Record<string, FabricNode> = {};
    Object.entries(spec).forEach(([name, pods], i) => {
      const n = i + 1;
      const node: FabricNode = { ns: `${base}-${name}`, ip: `10.94.${n}.2`, ip6: `fd00:94:${n}::2`, pods: {} };
      nodes[name] = node;
      namespaces.push(node.ns);
      addNetns(node.ns);
      if (o.ipv6) sysctl(node.ns, 'net.ipv6.conf.default.accept_dad=0', 'net.ipv6.conf.all.accept_dad=0', 'net.ipv6.conf.all.forwarding=1');
      ip(router, 'link', 'add', `r${name}`, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', node.ns);
      ip(router, 'addr', 'add', `10.94.${n}.1/24`, 'dev', `r${name}`);
      ip(router, 'link', 'set', `r${name}`, 'up');
      ip(node.ns, 'addr', 'add', `${node.ip}/24`, 'dev', 'eth0');
      ip(node.ns, 'link', 'set', 'eth0', 'up');
      execFileSync('nsenter', [`--net=${nsPath(node.ns)}`, 'sysctl', '-qw', 'net.ipv4.ip_forward=1']);
      if (o.ipv6) {
        ip(router, '-6', 'addr', 'add', `fd00:94:${n}::1/64`, 'dev', `r${name}`, 'nodad');
        ip(node.ns, '-6', 'addr', 'add', `${node.ip6}/64`, 'dev', 'eth0', 'nodad');
      }
      pods.forEach((pod, j) => {
        const podNs = `${base}-${pod}`;
        const hostIf = `vg${pod}`;
        const net = `10.95.${n * 10 + j}`;
        namespaces.push(podNs);
        addNetns(podNs);
        ip(node.ns, 'link', 'add', hostIf, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', podNs);
        ip(node.ns, 'addr', 'add', `${net}.1/24`, 'dev', hostIf);
        ip(node.ns, 'link', 'set', hostIf, 'up');
        ip(podNs, 'addr', 'add', `${net}.2/24`, 'dev', 'eth0');
        ip(podNs, 'link', 'set', 'eth0', 'up');
        ip(podNs, 'route', 'add', 'default', 'via', `${net}.1`);
        const net6 = `fd00:95:${n * 10 + j}:`;
        if (o.ipv6) {
          ip(node.ns, '-6', 'addr', 'add', `${net6}:1/64`, 'dev', hostIf, 'nodad');
          ip(podNs, '-6', 'addr', 'add', `${net6}:2/64`, 'dev', 'eth0', 'nodad');
          ip(podNs, '-6', 'route', 'add', 'default', 'via', `${net6}:1`);
        }
        const dp = new GatewayDatapath(
          { pod: `egress-test/${pod}`, netns: nsPath(podNs), podIp: `${net}.2`, ...(o.ipv6 ? { podIp6: `${net6}:2` } : {}), ifName: 'eth0', hostIfName: hostIf },
          { uplink: 'eth0', fouPort: 5555, pinDir },
        );
        datapaths.push([node, dp]);
        onNode(node, () => dp.prepare([node.ip]));
        node.pods[pod] = dp;
      });
    });
    const family = o.ipv6 ? { family: 6 as const } : {};
    const routerBird = await startBird(router, upstreamRouterConfig({
      routerId: '10.94.1.1',
      as: ROUTER_AS,
      peers: Object.entries(nodes).map(([name, node], i) => ({ name: `node_${name}`, address: o.ipv6 ? node.ip6 : node.ip, as: ROUTER_AS + i + 1 })),
      ...family,
    }));
    birds.push(routerBird);
    for (const [i, node] of Object.values(nodes).entries()) {
      birds.push(await startBird(node.ns, exportTableSpeakerConfig({
        routerId: node.ip,
        as: ROUTER_AS + i + 1,
        table: TABLE,
        peers: [{ name: 'upstream', address: o.ipv6 ? `fd00:94:${i + 1}::1` : `10.94.${i + 1}.1`, as: ROUTER_AS }],
        ...family,
      })));
    }
    await waitBgpEstablished(birds);
    await fn({ router, routerBird, nodes });
  } finally {
    for (const [node, dp] of datapaths) {
      try {
        onNode(node, () => dp.teardown());
      } catch {
        // the namespaces go next, and everything in them
      }
    }
    for (const b of birds) await b.stop();
    delNetns(...namespaces);
    fs.rmSync(pinDir, { recursive: true, force: true });
  }
}

/** The router's forwarding decision for the floating address: its next hop, or undefined without a route. */
function routerNextHop(f: Fabric, address = FLOAT): string | undefined {
  try {
    const r = JSON.parse(ip(f.router, ...fam(address), '-j', 'route', 'get', address).toString())[0];
    return r?.gateway ?? (r ? `dev ${r.dev}` : undefined);
  } catch {
    return undefined; // "Network is unreachable": the router has no default route, only what BGP gave it
  }
}

async function routerConverges(f: Fabric, nextHop: string | undefined, what: string, address = FLOAT): Promise<void> {
  await waitFor(() => routerNextHop(f, address) === nextHop, what, {
    timeoutMs: CONVERGE_MS,
    describe: () => `router next hop ${routerNextHop(f, address) ?? 'none'}; router BIRD:\n${f.routerBird.birdc('show', 'route', 'all')}`,
  });
  if (nextHop) {
    // Learned through BGP (installed by the router's BIRD), not left over from anything else.
    const routes = ipJson(f.router, [...fam(address), 'route', 'show', hostRoute(address)]);
    assert.equal(routes.map((r) => [r.gateway, r.protocol]), [[nextHop, 'bird']], `router's route for ${address} is BIRD's`);
  }
}

const hostRoute = (address: string) => `${address}/${ipFamily(address) === 6 ? 128 : 32}`;

/** The device of the node's route for the floating address in a table ('main' or the export table), if any. */
function nodeRouteDev(node: FabricNode, table: number | 'main', address = FLOAT): string | undefined {
  const routes = ipJson(node.ns, [...fam(address), 'route', 'show', 'table', String(table), hostRoute(address)]);
  assert.ok(routes.length <= 1, `at most one route for ${address} in table ${table}: ${JSON.stringify(routes)}`);
  return routes[0]?.dev;
}

function snatTarget(podNs: string, family: 'ip' | 'ip6' = 'ip'): string | undefined {
  const out = execFileSync('nsenter', [`--net=${podNs}`, 'nft', 'list', 'chain', family, 'tether_egress', 'postrouting'], { encoding: 'utf8' });
  return /snat to ([0-9a-f.:]+)/.exec(out)?.[1];
}

function podHasAddress(podNs: string, address = FLOAT): boolean {
  return execFileSync('nsenter', [`--net=${podNs}`, 'ip', '-j', 'addr', 'show', 'dev', 'lo'], { encoding: 'utf8' }).includes(`"${address}"`);
}

/** Collects tetherd's JSON log lines for the test's duration. */
function captureLog(): { lines: Array<Record<string, unknown>>; restore(): void } {
  const lines: Array<Record<string, unknown>> = [];
  const sink = new Writable({
    write(chunk, _enc, cb) {
      for (const l of String(chunk).split('\n')) if (l.trim()) lines.push(JSON.parse(l));
      cb();
    },
  });
  setLogger(makeLogger({ stream: sink }));
  return { lines, restore: () => setLogger(makeLogger()) };
}

async function logged(lines: Array<Record<string, unknown>>, message: RegExp, fields: Record<string, unknown>): Promise<void> {
  const match = (l: Record<string, unknown>) => message.test(String(l.message)) && Object.entries(fields).every(([k, v]) => l[k] === v);
  await waitFor(() => lines.some(match), `a log line ${message} with ${JSON.stringify(fields)}`, { timeoutMs: 2000, describe: () => JSON.stringify(lines.slice(-5)) });
}

test('own → router routes via the node; release and withdrawal take it back; another node takes over', async () => {
  const log = captureLog();
  try {
    await withFabric({ a: ['a1'], b: ['b1'] }, async (f) => {
      const [A, B] = [f.nodes.a, f.nodes.b];
      const [a1, b1] = [A.pods.a1, B.pods.b1];
      assert.is(routerNextHop(f), undefined, 'router starts without a route for the floating address');

      await startOnNode(A, () => a1.own(FLOAT, ANNOUNCE));
      assert.is(nodeRouteDev(A, TABLE), 'vga1', 'own(): /32 in the export table through the pod veth');
      assert.is(nodeRouteDev(A, 'main'), 'vga1', 'own(): /32 in the main table through the pod veth');
      await routerConverges(f, A.ip, 'router to route the floating address via node A');

      await startOnNode(A, () => a1.release(FLOAT));
      assert.is(nodeRouteDev(A, TABLE), undefined, 'release(): export route gone');
      assert.is(nodeRouteDev(A, 'main'), undefined, 'release(): main route gone');
      await routerConverges(f, undefined, 'router to drop the route after release()');
      await logged(log.lines, /released/, { pod: 'egress-test/a1', address: FLOAT, table: TABLE, exportRouteRemoved: true, routeRemoved: true });

      // Planned handover A → B: A withdraws the announcement first and keeps forwarding for the drain.
      await startOnNode(A, () => a1.own(FLOAT, ANNOUNCE));
      await routerConverges(f, A.ip, 'router to route via node A again');
      onNode(A, () => a1.withdrawAnnouncement(FLOAT));
      assert.is(nodeRouteDev(A, TABLE), undefined, 'withdrawAnnouncement(): export route gone at once');
      assert.is(nodeRouteDev(A, 'main'), 'vga1', 'withdrawAnnouncement(): main route stays for the drain');
      assert.is(snatTarget(a1.gw.netns), FLOAT, 'withdrawAnnouncement(): SNAT stays for the drain');
      assert.ok(podHasAddress(a1.gw.netns), 'withdrawAnnouncement(): the address stays on the pod');
      await routerConverges(f, undefined, 'router to drop the route after withdrawAnnouncement()');
      await logged(log.lines, /withdrawn from the route-export table/, { address: FLOAT, table: TABLE, removed: true });
      onNode(A, () => a1.withdrawAnnouncement(FLOAT)); // idempotent
      await logged(log.lines, /withdrawn from the route-export table/, { address: FLOAT, table: TABLE, removed: false });

      await startOnNode(B, () => b1.own(FLOAT, ANNOUNCE));
      await routerConverges(f, B.ip, 'router to route via node B after it took over');
      // A's release finds its export route already gone.
      await startOnNode(A, () => a1.release(FLOAT));
      assert.is(nodeRouteDev(A, 'main'), undefined, 'release() after withdrawal: main route gone');
      assert.is(snatTarget(a1.gw.netns), undefined, 'release(): no SNAT left on A');
      assert.not.ok(podHasAddress(a1.gw.netns), 'release(): address gone from A\'s pod');
      assert.is(nodeRouteDev(B, TABLE), 'vgb1', 'B keeps its export route');
      assert.is(routerNextHop(f), B.ip, 'router still routes via node B');
      await logged(log.lines, /released/, { pod: 'egress-test/a1', address: FLOAT, table: TABLE, exportRouteRemoved: false, routeRemoved: true });

      await startOnNode(B, () => b1.release(FLOAT));
      await routerConverges(f, undefined, 'router to drop the route after B released it');
    });
  } finally {
    log.restore();
  }
});

test('handover between two gateway pods of one node keeps the node\'s announcement', async () => {
  await withFabric({ a: ['a1', 'a2'] }, async (f) => {
    const A = f.nodes.a;
    const [a1, a2] = [A.pods.a1, A.pods.a2];
    await startOnNode(A, () => a1.own(FLOAT, ANNOUNCE));
    await routerConverges(f, A.ip, 'router to route via node A');

    // The controller's order when a gateway pod leaves: the next owner (here on the same node) takes the
    // address, then the old one withdraws and later releases. Neither may remove the new owner's routes.
    await startOnNode(A, () => a2.own(FLOAT, ANNOUNCE));
    onNode(A, () => a1.withdrawAnnouncement(FLOAT));
    assert.is(nodeRouteDev(A, TABLE), 'vga2', 'the new owner\'s export route survives the old owner\'s withdrawal');
    await startOnNode(A, () => a1.release(FLOAT));
    assert.is(nodeRouteDev(A, TABLE), 'vga2', 'the new owner\'s export route survives the old owner\'s release');
    assert.is(nodeRouteDev(A, 'main'), 'vga2', 'the new owner\'s main route survives the old owner\'s release');
    assert.is(routerNextHop(f), A.ip, 'router still routes via node A');

    await startOnNode(A, () => a2.release(FLOAT));
    await routerConverges(f, undefined, 'router to drop the route after the last release');
  });
});

test('IPv6: own → the /128 in both tables via the pod\'s IPv6 address and the router routes via the node; withdrawal and release take it back; another node takes over', async () => {
  await withFabric({ a: ['a1'], b: ['b1'] }, async (f) => {
    const [A, B] = [f.nodes.a, f.nodes.b];
    const [a1, b1] = [A.pods.a1, B.pods.b1];
    assert.is(routerNextHop(f, FLOAT6), undefined, 'router starts without a route for the floating address');

    await startOnNode(A, () => a1.own(FLOAT6, ANNOUNCE));
    for (const table of [TABLE, 'main'] as const) {
      const routes = ipJson(A.ns, ['-6', 'route', 'show', 'table', String(table), `${FLOAT6}/128`]);
      assert.equal(routes.map((r) => [r.dev, r.gateway]), [['vga1', a1.gw.podIp6]], `own(): /128 in table ${table} via the pod's IPv6 address`);
    }
    assert.ok(podHasAddress(a1.gw.netns, FLOAT6), 'own(): the address is on the pod');
    assert.is(snatTarget(a1.gw.netns, 'ip6'), FLOAT6, 'own(): SNAT to it in the ip6 table');
    assert.is(snatTarget(a1.gw.netns, 'ip'), undefined, 'own(): nothing in the ip table');
    await routerConverges(f, A.ip6, 'router to route the floating address via node A', FLOAT6);

    onNode(A, () => a1.withdrawAnnouncement(FLOAT6));
    assert.is(nodeRouteDev(A, TABLE, FLOAT6), undefined, 'withdrawAnnouncement(): export route gone at once');
    assert.is(nodeRouteDev(A, 'main', FLOAT6), 'vga1', 'withdrawAnnouncement(): main route stays for the drain');
    assert.is(snatTarget(a1.gw.netns, 'ip6'), FLOAT6, 'withdrawAnnouncement(): SNAT stays for the drain');
    await routerConverges(f, undefined, 'router to drop the route after withdrawAnnouncement()', FLOAT6);

    await startOnNode(B, () => b1.own(FLOAT6, ANNOUNCE));
    await routerConverges(f, B.ip6, 'router to route via node B after it took over', FLOAT6);
    await startOnNode(A, () => a1.release(FLOAT6));
    assert.is(nodeRouteDev(A, 'main', FLOAT6), undefined, 'release(): main route gone');
    assert.is(snatTarget(a1.gw.netns, 'ip6'), undefined, 'release(): no SNAT left on A');
    assert.not.ok(podHasAddress(a1.gw.netns, FLOAT6), 'release(): address gone from A\'s pod');
    assert.is(routerNextHop(f, FLOAT6), B.ip6, 'router still routes via node B');

    await startOnNode(B, () => b1.release(FLOAT6));
    assert.is(nodeRouteDev(B, TABLE, FLOAT6), undefined, 'release(): B\'s export route gone');
    await routerConverges(f, undefined, 'router to drop the route after B released it', FLOAT6);
  }, { ipv6: true });
});

test.run();
