// A real Redis Sentinel set for tests: a primary, one replica and three sentinels (quorum 2, a primary is
// down after 1 s of silence), on TCP, in a fresh temp dir, optionally inside a network namespace (the
// testbed's router, so every node reaches it). killPrimary() SIGKILLs whichever server is the primary now;
// waitFailover() waits until the sentinels name another one. stop() ends every process and removes the dir.
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { randomInt } from 'node:crypto';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';

const REDIS_SERVER = process.env.REDIS_SERVER ?? 'redis-server';
/** Debian's redis-sentinel package; without it, redis-server in sentinel mode is the same program. */
const SENTINEL_BIN = fs.existsSync('/usr/bin/redis-sentinel') ? ['/usr/bin/redis-sentinel'] : [REDIS_SERVER];
const SENTINEL_FLAG = SENTINEL_BIN[0].endsWith('redis-sentinel') ? [] : ['--sentinel'];
export const MASTER_NAME = 'tether';

export interface SentinelSet {
  /** redis+sentinel://host:s1,host:s2,host:s3/tether */
  url: string;
  host: string;
  dir: string;
  /** The primary as the sentinels see it now. */
  master(): { host: string; port: number };
  /** SIGKILLs the current primary (a crash); returns its port. */
  killPrimary(): number;
  /** Waits until the sentinels name a primary other than `oldPort`, and it answers as a master. */
  waitFailover(oldPort: number, timeoutMs?: number): Promise<{ port: number; ms: number }>;
  /** Waits until the replica holds everything the primary has (online, same replication offset). */
  waitReplicated(timeoutMs?: number): Promise<void>;
  /**
   * SIGSTOPs the replica (replication lags: what the primary acknowledges from now on is not on the
   * replica) until resumeReplica(); the port of the server stopped.
   */
  pauseReplica(): number;
  resumeReplica(): void;
  /**
   * Starts a server killed by killPrimary() again, empty, as a replica of the current primary (as an
   * operator replaces a failed node), and waits until it has caught up: the set can fail over again.
   */
  revive(port: number): Promise<void>;
  /** Runs a redis-cli command against a port (in the namespace). */
  cli(port: number, ...args: string[]): string;
  stop(): Promise<void>;
}

export async function startSentinelSet(opts: { host?: string; netns?: string } = {}): Promise<SentinelSet> {
  const host = opts.host ?? '127.0.0.1';
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tether-sentinel-'));
  const base = randomInt(20000, 40000);
  const [primary, replica] = [base, base + 1];
  const sentinelPorts = [base + 2, base + 3, base + 4];
  const procs = new Map<number, ChildProcess>();
  const paused = new Set<number>();
  const wrap = (argv: string[]) => (opts.netns ? ['ip', 'netns', 'exec', opts.netns, ...argv] : argv);
  const cli = (port: number, ...args: string[]): string => {
    const argv = wrap(['redis-cli', '-h', host, '-p', String(port), ...args]);
    const r = spawnSync(argv[0], argv.slice(1), { encoding: 'utf8', timeout: 3000 });
    return (r.stdout ?? '').trim();
  };
  const launch = (port: number, argv: string[]) => {
    const out = fs.openSync(path.join(dir, `${port}.log`), 'a');
    const full = wrap(argv);
    const p = spawn(full[0], full.slice(1), { stdio: ['ignore', out, out] });
    fs.closeSync(out);
    procs.set(port, p);
  };
  const waitPing = async (port: number) => {
    const end = Date.now() + 5000;
    while (cli(port, 'ping') !== 'PONG') {
      if (Date.now() > end) throw new Error(`redis on ${host}:${port} did not answer: ${fs.readFileSync(path.join(dir, `${port}.log`), 'utf8').slice(-400)}`);
      await new Promise((r) => setTimeout(r, 50));
    }
  };
  const server = (port: number, extra: string[]) => [REDIS_SERVER, '--bind', host, '--port', String(port), '--save', '', '--appendonly', 'no', '--dir', dir, '--dbfilename', `${port}.rdb`, '--protected-mode', 'no', ...extra];

  const set: SentinelSet = {
    url: `redis+sentinel://${sentinelPorts.map((p) => `${host}:${p}`).join(',')}/${MASTER_NAME}`,
    host,
    dir,
    master() {
      const [h, p] = cli(sentinelPorts[0], 'sentinel', 'get-master-addr-by-name', MASTER_NAME).split('\n');
      return { host: h, port: Number(p) };
    },
    killPrimary() {
      const { port } = set.master();
      const p = procs.get(port);
      if (!p) throw new Error(`no process for the primary on port ${port}`);
      p.kill('SIGKILL');
      return port;
    },
    async waitFailover(oldPort, timeoutMs = 20_000) {
      const t0 = Date.now();
      for (;;) {
        // Every sentinel that answers must agree, and the new primary must say it is one.
        const views = sentinelPorts.map((p) => Number(cli(p, 'sentinel', 'get-master-addr-by-name', MASTER_NAME).split('\n')[1]));
        const port = views[0];
        if (port && port !== oldPort && views.every((v) => v === port) && /role:master/.test(cli(port, 'info', 'replication'))) return { port, ms: Date.now() - t0 };
        if (Date.now() - t0 > timeoutMs) throw new Error(`no failover away from ${oldPort} within ${timeoutMs} ms (sentinels say ${views})`);
        await new Promise((r) => setTimeout(r, 100));
      }
    },
    async waitReplicated(timeoutMs = 10_000) {
      const end = Date.now() + timeoutMs;
      for (;;) {
        const info = cli(set.master().port, 'info', 'replication');
        const own = /master_repl_offset:(\d+)/.exec(info)?.[1];
        const rep = /slave0:.*state=online,offset=(\d+)/.exec(info)?.[1];
        if (own && rep === own) return;
        if (Date.now() > end) throw new Error(`the replica did not catch up: ${info.replace(/\s+/g, ' ').slice(0, 300)}`);
        await new Promise((r) => setTimeout(r, 50));
      }
    },
    pauseReplica() {
      const primaryPort = set.master().port;
      const port = [primary, replica].find((p) => p !== primaryPort && procs.get(p)?.exitCode === null && procs.get(p)?.signalCode === null);
      if (port === undefined) throw new Error(`no live replica beside the primary on ${primaryPort}`);
      procs.get(port)!.kill('SIGSTOP');
      paused.add(port);
      return port;
    },
    resumeReplica() {
      for (const port of paused) procs.get(port)?.kill('SIGCONT');
      paused.clear();
    },
    async revive(port) {
      const p = procs.get(port);
      if (p && p.exitCode === null && p.signalCode === null) throw new Error(`the server on ${port} still runs`);
      fs.rmSync(path.join(dir, `${port}.rdb`), { force: true });
      launch(port, server(port, ['--replicaof', host, String(set.master().port)]));
      await waitPing(port);
      const end = Date.now() + 15_000;
      while (!/slave0:.*state=online/.test(cli(set.master().port, 'info', 'replication'))) {
        if (Date.now() > end) throw new Error(`the revived server on ${port} did not come online as a replica`);
        await new Promise((r) => setTimeout(r, 100));
      }
      await set.waitReplicated();
    },
    cli,
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
      fs.rmSync(dir, { recursive: true, force: true });
    },
  };

  try {
    launch(primary, server(primary, []));
    await waitPing(primary);
    launch(replica, server(replica, ['--replicaof', host, String(primary)]));
    await waitPing(replica);
    for (const sp of sentinelPorts) {
      const conf = path.join(dir, `sentinel-${sp}.conf`);
      fs.writeFileSync(
        conf,
        [
          `bind ${host}`,
          `port ${sp}`,
          `dir ${dir}`,
          'protected-mode no',
          `sentinel monitor ${MASTER_NAME} ${host} ${primary} 2`,
          `sentinel down-after-milliseconds ${MASTER_NAME} 1000`,
          `sentinel failover-timeout ${MASTER_NAME} 5000`,
          `sentinel parallel-syncs ${MASTER_NAME} 1`,
          '',
        ].join('\n'),
      );
      launch(sp, [...SENTINEL_BIN, conf, ...SENTINEL_FLAG]);
    }
    for (const sp of sentinelPorts) await waitPing(sp);
    // The sentinels know the replica (through the primary's INFO) before a failover can pick it.
    const end = Date.now() + 15_000;
    while (!/num-slaves\n1\b/.test(cli(sentinelPorts[0], 'sentinel', 'master', MASTER_NAME)) || !/num-other-sentinels\n2\b/.test(cli(sentinelPorts[0], 'sentinel', 'master', MASTER_NAME))) {
      if (Date.now() > end) throw new Error(`sentinels did not discover the replica and each other: ${cli(sentinelPorts[0], 'sentinel', 'master', MASTER_NAME)}`);
      await new Promise((r) => setTimeout(r, 100));
    }
  } catch (e) {
    await set.stop();
    throw e;
  }
  return set;
}
