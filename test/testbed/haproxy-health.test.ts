// A real external load balancer in front of the nodes: HAProxy (Debian's package) in the external client's
// namespace, one server per node, HTTP health checks against each node's health-check port every second
// (2 failures mark a node down, 1 success up). Target pods pinned to nodes are added and deleted at random;
// HAProxy's view must follow exactly the nodes with a ready local target, a node must go down within
// (failures + 1) × interval of its last local target going, and the transition times are recorded.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import * as fs from 'node:fs';
import * as net from 'node:net';
import * as os from 'node:os';
import * as path from 'node:path';
import { withTestbed, type Testbed } from './testbed';
import { pool, service, slice, until } from './lb-scenario';
import type { Topology } from './topology';

const HC = 32200;
const INTERVAL_MS = 1000;
const FALL = 2;
const ROUNDS = Number(process.env.HAPROXY_ROUNDS ?? 8);
const NODES = ['n1', 'n2', 'n3'];
const APP = { tether: { labels: { app: 'db' } }, namespace: 'shop' };

function topology(): Topology {
  return { nodes: NODES.map((name) => ({ name, pods: [] })), tether: true, ipam: 'tether-ipam', extraObjects: [pool] };
}

function localService(): Record<string, unknown> {
  const s = service() as { metadata: Record<string, unknown>; spec: Record<string, unknown> };
  return { ...s, spec: { ...s.spec, externalTrafficPolicy: 'Local', healthCheckNodePort: HC } };
}

function haproxyConfig(tb: Testbed, sock: string): string {
  return `global
  stats socket ${sock} mode 600 level admin
defaults
  mode http
  timeout connect 1s
  timeout client 5s
  timeout server 5s
  timeout check 1s
backend nodes
  option httpchk GET /
  http-check expect status 200
  default-server inter ${INTERVAL_MS} fall ${FALL} rise 1
${NODES.map((n) => `  server ${n} ${tb.node(n).fabricIp}:9000 check port ${HC}`).join('\n')}
frontend f
  bind 127.0.0.1:18080
  default_backend nodes
`;
}

/** HAProxy's view of each node server: UP or DOWN (from `show stat` on its admin socket). */
function servers(sock: string): Promise<Record<string, string>> {
  return new Promise((resolve, reject) => {
    const c = net.connect(sock);
    let out = '';
    c.on('connect', () => c.write('show stat\n'));
    c.on('data', (d) => (out += d));
    c.on('error', reject);
    c.on('end', () => {
      const lines = out.split('\n').filter((l) => l && !l.startsWith('#'));
      const st: Record<string, string> = {};
      for (const l of lines) {
        const f = l.split(',');
        if (f[0] === 'nodes' && NODES.includes(f[1])) st[f[1]] = f[17].split(' ')[0];
      }
      resolve(st);
    });
  });
}

test('HAProxy health checks follow the nodes with ready local targets as pods come and go; down within (fall + 1) × interval', async () => {
  await withTestbed(topology(), async (tb) => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tether-haproxy-'));
    const sock = path.join(dir, 'admin.sock');
    fs.writeFileSync(path.join(dir, 'haproxy.cfg'), haproxyConfig(tb, sock));
    const hap = tb.spawn('client', ['haproxy', '-db', '-f', path.join(dir, 'haproxy.cfg')]);
    try {
      const pods = new Map<string, string>(); // pod key -> node
      let seq = 0;
      const write = () => tb.rewriteConfig({ extraObjects: [pool, localService(), slice(tb, [...pods.keys()])] });
      write();
      await until('HAProxy admin socket', async () => fs.existsSync(sock) && Object.keys(await servers(sock)).length === NODES.length, 10_000);
      const expected = () => Object.fromEntries(NODES.map((n) => [n, [...pods.values()].includes(n) ? 'UP' : 'DOWN']));
      await until('all nodes down with no targets', async () => JSON.stringify(await servers(sock)) === JSON.stringify(expected()), 15_000);

      const up: number[] = [];
      const down: number[] = [];
      let rnd = 7;
      const next = () => (rnd = (rnd * 1103515245 + 12345) % 2 ** 31) / 2 ** 31;
      for (let i = 0; i < ROUNDS; i++) {
        // Add a pod to a random node, or delete a random existing one (at least one add when none exist).
        const add = pods.size === 0 || next() < 0.55;
        let node: string;
        let t0: number;
        if (add) {
          node = NODES[Math.floor(next() * NODES.length)];
          const p = await tb.addPod(node, { name: `t${++seq}`, ...APP });
          pods.set(p.key, node);
          t0 = Date.now(); // the pod is ready: its endpoint goes into the slice now
          write();
        } else {
          const key = [...pods.keys()][Math.floor(next() * pods.size)];
          node = pods.get(key)!;
          pods.delete(key);
          t0 = Date.now(); // the endpoint leaves the slice, then the pod goes
          write();
          await tb.delPod(key);
        }
        const want = expected();
        const ms = await until(`HAProxy view ${JSON.stringify(want)}`, async () => {
          const st = await servers(sock);
          return JSON.stringify(st) === JSON.stringify(want) ? Date.now() - t0 : undefined;
        }, 15_000);
        const flipped = want[node] === 'UP' ? up : down;
        // Only a node whose state changed is a transition (a second pod on a node flips nothing).
        const onNode = [...pods.values()].filter((n) => n === node).length;
        const changed = add ? onNode === 1 : onNode === 0;
        if (changed) flipped.push(ms);
        process.stdout.write(`  ${add ? 'added' : 'deleted'} a pod on ${node}: HAProxy ${JSON.stringify(want)} after ${ms} ms${changed ? '' : ' (no change for the node)'}\n`);
        if (changed && want[node] === 'DOWN') assert.ok(ms <= (FALL + 1) * INTERVAL_MS, `${node} down within (fall + 1) × interval: ${ms} ms`);
      }
      const fmt = (xs: number[]) => (xs.length ? `${xs.length} transitions, ${Math.min(...xs)}–${Math.max(...xs)} ms` : 'none');
      process.stdout.write(`  pod ready → node healthy in HAProxy: ${fmt(up)}; last pod gone → node unhealthy: ${fmt(down)}\n`);
      assert.ok(up.length > 0 && down.length > 0, 'both kinds of transition happened');
    } finally {
      hap.kill('SIGKILL');
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
});

test.run();
