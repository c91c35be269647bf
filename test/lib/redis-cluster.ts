// A real Redis Cluster for tests, from Debian's redis-server and redis-cli (the redis-server package pulls
// in redis-tools): 3 primaries and 3 replicas on 127.0.0.1, unique random TCP ports (a Cluster node
// announces host:port, so no Unix sockets), `--cluster-enabled yes`, a short cluster-node-timeout (a
// primary is failed after ~1 s of silence), no persistence, in a fresh temp dir. Created with
// `redis-cli --cluster create … --cluster-replicas 1 --cluster-yes` and ready once every node says
// cluster_state:ok and each primary's replica is online. killPrimary() SIGKILLs a primary (a crash);
// waitFailover() waits until its replica took over its slots; migrateSlot() moves one hash slot between
// primaries key by key (CLUSTER SETSLOT IMPORTING/MIGRATING, MIGRATE, SETSLOT NODE), as
// `redis-cli --cluster reshard` does. stop() ends every process and removes the dir, also when start fails.
// With { host, netns } the nodes run inside a network namespace on that address (the testbed's router, so
// every node namespace reaches them over the fabric), and every redis-cli runs there too.
import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { randomInt } from 'node:crypto';
import * as fs from 'node:fs';
import * as net from 'node:net';
import * as os from 'node:os';
import * as path from 'node:path';

const REDIS_SERVER = process.env.REDIS_SERVER ?? 'redis-server';
const REDIS_CLI = process.env.REDIS_CLI ?? 'redis-cli';
const LOOPBACK = '127.0.0.1';
export const NODE_TIMEOUT_MS = 1000;

export interface ClusterNode {
  id: string;
  port: number;
  role: 'master' | 'slave';
  /** The primary's id, for a replica. */
  primaryId?: string;
  failed: boolean;
  /** Slot ranges served (primaries). */
  slots: Array<[number, number]>;
}

export interface RedisCluster {
  /** redis+cluster://127.0.0.1:p1,127.0.0.1:p2,127.0.0.1:p3: what RedisStore.connect takes. */
  url: string;
  ports: number[];
  dir: string;
  /** Runs redis-cli against a node; stdout, trimmed. */
  cli(port: number, ...args: string[]): Promise<string>;
  /** The cluster as a live node sees it (CLUSTER NODES). */
  nodes(): Promise<ClusterNode[]>;
  /** The hash slot of a key (CLUSTER KEYSLOT). */
  slotOf(key: string): Promise<number>;
  /** The port of the primary serving `slot` now. */
  primaryOf(slot: number): Promise<number>;
  /** SIGKILLs the node on `port` (a crash). */
  kill(port: number): void;
  /** Waits until a replica of the killed primary on `port` serves its slots and the cluster is ok again. */
  waitFailover(port: number, timeoutMs?: number): Promise<{ port: number; ms: number }>;
  /** Waits until every live primary's replicas hold everything it has (same replication offset). */
  waitReplicated(timeoutMs?: number): Promise<void>;
  /**
   * Waits until every live primary's replicas hold everything it had when called (offsets at least the
   * primary's then): what waitReplicated cannot see while clients keep writing.
   */
  waitCaughtUp(timeoutMs?: number): Promise<void>;
  /**
   * Moves `slot` to the primary on `toPort`, `batch` keys at a time with `pauseMs` between batches (so
   * writes can land mid-migration); resolves when the slot is served by the new primary everywhere.
   */
  migrateSlot(slot: number, toPort: number, opts?: { batch?: number; pauseMs?: number }): Promise<{ keys: number }>;
  /** FLUSHALL on every live primary (a wipe of the whole store). */
  flushAll(): Promise<void>;
  stop(): Promise<void>;
}

function run(cmd: string, args: string[], timeoutMs = 5000, netns?: string): Promise<string> {
  const argv = netns ? ['ip', 'netns', 'exec', netns, cmd, ...args] : [cmd, ...args];
  return new Promise((resolve, reject) => {
    execFile(argv[0], argv.slice(1), { encoding: 'utf8', timeout: timeoutMs }, (err, stdout, stderr) => {
      if (err) reject(new Error(`${cmd} ${args.join(' ')}: ${err.message} ${stderr}`.trim()));
      else resolve(stdout.trim());
    });
  });
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** True when nothing listens on 127.0.0.1:port (a bind succeeds). */
function portFree(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const srv = net.createServer();
    srv.once('error', () => resolve(false));
    srv.listen(port, LOOPBACK, () => srv.close(() => resolve(true)));
  });
}

/** Six ports, each free with its cluster bus port (port + 10000, so below 55535). */
async function freePorts(inNetns: boolean): Promise<number[]> {
  for (let attempt = 0; attempt < 20; attempt++) {
    const base = randomInt(20000, 45000);
    const ports = Array.from({ length: 6 }, (_, i) => base + i);
    // A namespace of its own (the testbed's router) has nothing else listening: any ports do.
    if (inNetns) return ports;
    const free = await Promise.all(ports.flatMap((p) => [portFree(p), portFree(p + 10000)]));
    if (free.every(Boolean)) return ports;
  }
  throw new Error('no six free ports (with their bus ports) found');
}

/** Starts the cluster; a start that fails (e.g. a port taken meanwhile) is cleaned up and tried once more. */
export async function startRedisCluster(opts: ClusterPlace = {}): Promise<RedisCluster> {
  try {
    return await startOnce(opts);
  } catch (e) {
    console.warn(`redis cluster did not start (${(e as Error).message}); trying once more on other ports`);
    return startOnce(opts);
  }
}

/** Where the nodes run: an address (default 127.0.0.1) and, optionally, the network namespace that has it. */
export interface ClusterPlace {
  host?: string;
  netns?: string;
}

async function startOnce(opts: ClusterPlace): Promise<RedisCluster> {
  const HOST = opts.host ?? LOOPBACK;
  const netns = opts.netns;
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tether-rcluster-'));
  const ports = await freePorts(netns !== undefined);
  const procs = new Map<number, ChildProcess>();
  /** Replica port → its primary's id, as last seen before a kill (what waitFailover looks for). */
  const wasReplicaOf = new Map<number, string>();
  const noteReplicas = (nodes: ClusterNode[]) => {
    for (const n of nodes) if (n.role === 'slave' && n.primaryId) wasReplicaOf.set(n.port, n.primaryId);
  };

  const alive = (port: number) => {
    const p = procs.get(port);
    return !!p && p.exitCode === null && p.signalCode === null;
  };
  const cli = (port: number, ...args: string[]) => run(REDIS_CLI, ['-h', HOST, '-p', String(port), ...args], 5000, netns);
  const logTail = (port: number) => {
    try {
      return fs.readFileSync(path.join(dir, `${port}.log`), 'utf8').trim().split('\n').slice(-5).join(' | ');
    } catch {
      return '(no log)';
    }
  };
  const launch = (port: number) => {
    const out = fs.openSync(path.join(dir, `${port}.log`), 'a');
    const args = [
      '--bind', HOST, '--port', String(port), '--protected-mode', 'no', '--dir', dir, '--save', '', '--appendonly', 'no',
      '--dbfilename', `${port}.rdb`, '--cluster-enabled', 'yes', '--cluster-config-file', `nodes-${port}.conf`,
      '--cluster-node-timeout', String(NODE_TIMEOUT_MS),
      // A replica may take over however long it was cut off from its primary (tests kill at any time).
      '--cluster-replica-validity-factor', '0',
    ];
    // `ip netns exec` execs the server: the child's pid is the server's, so kill() reaches it.
    const argv = netns ? ['ip', 'netns', 'exec', netns, REDIS_SERVER, ...args] : [REDIS_SERVER, ...args];
    const p = spawn(argv[0], argv.slice(1), { stdio: ['ignore', out, out] });
    fs.closeSync(out);
    p.on('error', () => undefined);
    procs.set(port, p);
  };
  const anyLive = () => {
    const port = ports.find(alive);
    if (port === undefined) throw new Error('no live cluster node');
    return port;
  };

  const parseNodes = (text: string): ClusterNode[] =>
    text
      .split('\n')
      .filter((l) => l.trim())
      .map((l) => {
        const f = l.trim().split(' ');
        const flags = f[2].split(',');
        const slots: Array<[number, number]> = [];
        for (const s of f.slice(8)) {
          if (s.startsWith('[')) continue; // a slot being imported/migrated
          const [a, b] = s.split('-').map(Number);
          slots.push([a, b ?? a]);
        }
        return {
          id: f[0],
          port: Number(f[1].split('@')[0].split(':').pop()),
          role: flags.includes('master') ? 'master' : 'slave',
          primaryId: f[3] === '-' ? undefined : f[3],
          failed: flags.includes('fail') || flags.includes('fail?'),
          slots,
        } as ClusterNode;
      });

  const c: RedisCluster = {
    url: `redis+cluster://${ports.slice(0, 3).map((p) => `${HOST}:${p}`).join(',')}`,
    ports,
    dir,
    cli,
    async nodes() {
      const nodes = parseNodes(await cli(anyLive(), 'cluster', 'nodes'));
      noteReplicas(nodes.filter((n) => !n.failed));
      return nodes;
    },
    async slotOf(key) {
      return Number(await cli(anyLive(), 'cluster', 'keyslot', key));
    },
    async primaryOf(slot) {
      const n = (await c.nodes()).find((x) => x.role === 'master' && !x.failed && x.slots.some(([a, b]) => slot >= a && slot <= b));
      if (!n) throw new Error(`no live primary serves slot ${slot}`);
      return n.port;
    },
    kill(port) {
      const p = procs.get(port);
      if (!p || !alive(port)) throw new Error(`no running node on ${port}`);
      p.kill('SIGKILL');
    },
    async waitFailover(port, timeoutMs = 20_000) {
      const t0 = Date.now();
      for (;;) {
        try {
          // Done when a live node sees the dead one failed and without slots, a live primary that was its
          // replica serves slots, and every live node says the cluster is whole.
          const nodes = await c.nodes();
          const dead = nodes.find((n) => n.port === port);
          const promoted = dead && nodes.find((n) => n.role === 'master' && !n.failed && alive(n.port) && n.slots.length > 0 && n.port !== port && wasReplicaOf.get(n.port) === dead.id);
          if (dead?.failed && dead.slots.length === 0 && promoted) {
            const states = await Promise.all(ports.filter(alive).map((p) => cli(p, 'cluster', 'info').catch(() => '')));
            if (states.every((s) => /cluster_state:ok/.test(s))) return { port: promoted.port, ms: Date.now() - t0 };
          }
        } catch {
          // a node going down may not answer; ask again
        }
        if (Date.now() - t0 > timeoutMs) throw new Error(`no failover away from ${port} within ${timeoutMs} ms: ${await cli(anyLive(), 'cluster', 'nodes').catch((e) => String(e))}`);
        await sleep(100);
      }
    },
    async waitReplicated(timeoutMs = 10_000) {
      const end = Date.now() + timeoutMs;
      for (;;) {
        const primaries = (await c.nodes()).filter((n) => n.role === 'master' && !n.failed && alive(n.port));
        const infos = await Promise.all(primaries.map((n) => cli(n.port, 'info', 'replication')));
        const caughtUp = infos.every((info) => {
          const own = /master_repl_offset:(\d+)/.exec(info)?.[1];
          const reps = [...info.matchAll(/^slave\d+:.*state=(\w+),offset=(\d+)/gm)];
          return reps.length > 0 && reps.every((r) => r[1] === 'online' && r[2] === own);
        });
        if (caughtUp) return;
        if (Date.now() > end) throw new Error(`replicas did not catch up: ${infos.map((i) => i.replace(/\s+/g, ' ').slice(0, 200)).join(' || ')}`);
        await sleep(50);
      }
    },
    async waitCaughtUp(timeoutMs = 10_000) {
      const end = Date.now() + timeoutMs;
      const primaries = (await c.nodes()).filter((n) => n.role === 'master' && !n.failed && alive(n.port));
      const want = new Map<number, number>();
      for (const n of primaries) want.set(n.port, Number(/master_repl_offset:(\d+)/.exec(await cli(n.port, 'info', 'replication'))?.[1] ?? NaN));
      for (;;) {
        const infos = await Promise.all(primaries.map((n) => cli(n.port, 'info', 'replication')));
        const caughtUp = infos.every((info, i) => {
          const reps = [...info.matchAll(/^slave\d+:.*state=(\w+),offset=(\d+)/gm)];
          return reps.length > 0 && reps.every((r) => r[1] === 'online' && Number(r[2]) >= want.get(primaries[i].port)!);
        });
        if (caughtUp) return;
        if (Date.now() > end) throw new Error(`replicas did not catch up with ${JSON.stringify([...want])}: ${infos.map((i) => i.replace(/\s+/g, ' ').slice(0, 200)).join(' || ')}`);
        await sleep(50);
      }
    },
    async migrateSlot(slot, toPort, opts = {}) {
      const batch = opts.batch ?? 1;
      const pauseMs = opts.pauseMs ?? 0;
      const nodes = await c.nodes();
      const fromPort = await c.primaryOf(slot);
      const from = nodes.find((n) => n.port === fromPort)!;
      const to = nodes.find((n) => n.port === toPort);
      if (!to || to.role !== 'master') throw new Error(`${toPort} is not a primary`);
      if (from.id === to.id) return { keys: 0 };
      await cli(toPort, 'cluster', 'setslot', String(slot), 'importing', from.id);
      await cli(fromPort, 'cluster', 'setslot', String(slot), 'migrating', to.id);
      let moved = 0;
      for (;;) {
        const keys = (await cli(fromPort, 'cluster', 'getkeysinslot', String(slot), String(batch))).split('\n').filter(Boolean);
        if (!keys.length) break;
        const out = await cli(fromPort, 'migrate', HOST, String(toPort), '', '0', '5000', 'KEYS', ...keys);
        if (!/OK|NOKEY/.test(out)) throw new Error(`MIGRATE of slot ${slot} failed: ${out}`);
        moved += keys.length;
        if (pauseMs) await sleep(pauseMs);
      }
      // The new owner first, then the old one, then everyone (as redis-cli --cluster reshard does).
      await cli(toPort, 'cluster', 'setslot', String(slot), 'node', to.id);
      await cli(fromPort, 'cluster', 'setslot', String(slot), 'node', to.id);
      for (const n of nodes) if (n.role === 'master' && alive(n.port) && n.port !== toPort && n.port !== fromPort) await cli(n.port, 'cluster', 'setslot', String(slot), 'node', to.id).catch(() => '');
      return { keys: moved };
    },
    async flushAll() {
      const primaries = (await c.nodes()).filter((n) => n.role === 'master' && !n.failed && alive(n.port));
      await Promise.all(primaries.map((n) => cli(n.port, 'flushall')));
    },
    async stop() {
      await Promise.all(
        [...procs.values()].map(
          (p) =>
            new Promise<void>((resolve) => {
              if (p.exitCode !== null || p.signalCode !== null) return resolve();
              p.once('exit', () => resolve());
              p.kill('SIGKILL');
            }),
        ),
      );
      process.removeListener('exit', onExit);
      fs.rmSync(dir, { recursive: true, force: true });
    },
  };

  // If the test process exits without stop() (a crash in a test), leave no server or dir behind.
  const onExit = () => {
    for (const p of procs.values()) p.kill('SIGKILL');
    fs.rmSync(dir, { recursive: true, force: true });
  };
  process.once('exit', onExit);

  try {
    for (const port of ports) launch(port);
    for (const port of ports) {
      const end = Date.now() + 5000;
      while ((await cli(port, 'ping').catch(() => '')) !== 'PONG') {
        if (!alive(port)) throw new Error(`redis-server on ${port} exited: ${logTail(port)}`);
        if (Date.now() > end) throw new Error(`redis-server on ${port} did not answer PING: ${logTail(port)}`);
        await sleep(30);
      }
    }
    await run(REDIS_CLI, ['--cluster', 'create', ...ports.map((p) => `${HOST}:${p}`), '--cluster-replicas', '1', '--cluster-yes'], 30_000, netns);
    const end = Date.now() + 20_000;
    for (;;) {
      const infos = await Promise.all(ports.map((p) => cli(p, 'cluster', 'info').catch(() => '')));
      const nodes = parseNodes(await cli(ports[0], 'cluster', 'nodes'));
      const ok = infos.every((i) => /cluster_state:ok/.test(i) && /cluster_known_nodes:6\b/.test(i)) && nodes.filter((n) => n.role === 'master').length === 3;
      if (ok) break;
      if (Date.now() > end) throw new Error(`cluster not ok within 20 s: ${infos.map((i) => /cluster_state:\w+/.exec(i)?.[0]).join(',')}`);
      await sleep(100);
    }
    await c.waitReplicated(20_000);
    await c.nodes(); // notes which replica serves which primary
  } catch (e) {
    await c.stop();
    throw e;
  }
  return c;
}
