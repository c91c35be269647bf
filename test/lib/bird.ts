// Real BIRD 2 for kernel tests: the configuration of a node's BGP speaker that advertises a kernel
// route-export table (what Egress announce mode routeTable relies on), that of an upstream router that
// installs what it learns in its kernel FIB, and a runner that starts `bird` inside a network namespace
// with its config, control socket and log in a private temp dir, waits for BGP sessions, and kills it.
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { waitFor } from './wait';

const BIRD = process.env.BIRD ?? 'bird';
const BIRDC = process.env.BIRDC ?? 'birdc';

export interface BgpPeer {
  /** BIRD protocol name: letters, digits, underscores. */
  name: string;
  address: string;
  as: number;
}

interface SpeakerBase {
  routerId: string;
  as: number;
  peers: BgpPeer[];
  /** The routes' family (IPv4 when not given); IPv6 sessions run between IPv6 peer addresses. */
  family?: 4 | 6;
}

const channelOf = (o: SpeakerBase) => (o.family === 6 ? 'ipv6' : 'ipv4');

/**
 * Short BGP timers so a test sees sessions come up and routes move within seconds. No fixed waits follow
 * from them: tests poll the state they expect.
 */
function bgpProtocol(self: SpeakerBase, peer: BgpPeer, channel: string): string {
  return `protocol bgp ${peer.name} {
  local as ${self.as};
  neighbor ${peer.address} as ${peer.as};
  connect delay time 1;
  connect retry time 1;
  error wait time 1, 5;
  hold time 6;
  ${channelOf(self)} { ${channel} };
}
`;
}

/**
 * A node's BGP speaker: learns the host /32 (/128) routes of kernel table `table` (routes other programs put
 * there, hence `learn`) and advertises exactly those to its peers; it installs nothing in the kernel.
 * BIRD follows the table through netlink notifications; the short scan is only a backstop.
 */
export function exportTableSpeakerConfig(o: SpeakerBase & { table: number }): string {
  return `router id ${o.routerId};
log stderr all;
protocol device { scan time 10; }
protocol kernel export_table {
  kernel table ${o.table};
  learn;
  scan time 5;
  ${channelOf(o)} { import where net.len = ${o.family === 6 ? 128 : 32}; export none; };
}
${o.peers.map((p) => bgpProtocol(o, p, 'import none; export where proto = "export_table";')).join('')}`;
}

/** An upstream router: installs every BGP-learned route in its main kernel table (proto bird). */
export function upstreamRouterConfig(o: SpeakerBase): string {
  return `router id ${o.routerId};
log stderr all;
protocol device { scan time 10; }
protocol kernel fib {
  ${channelOf(o)} { import none; export where source = RTS_BGP; };
}
${o.peers.map((p) => bgpProtocol(o, p, 'import all; export none;')).join('')}`;
}

export interface TestBird {
  /** Namespace name (under /run/netns). */
  netns: string;
  dir: string;
  socketPath: string;
  /** birdc output for one command, e.g. birdc('show', 'route'). */
  birdc(...args: string[]): string;
  /** Names of the BGP protocols whose session is not Established (empty: all are). */
  bgpNotEstablished(): string[];
  /** BIRD's own log so far (for failure messages). */
  log(): string;
  /** SIGTERM, SIGKILL after 2 s; removes the temp dir. Idempotent; never throws. */
  stop(): Promise<void>;
}

export function birdInstalled(): boolean {
  try {
    execFileSync(BIRD, ['--version'], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
}

/** Starts BIRD in namespace `netns` with `config` (checked with `bird -p` first); resolves once it answers birdc. */
export async function startBird(netns: string, config: string, readyTimeoutMs = 5000): Promise<TestBird> {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tether-bird-'));
  const conf = path.join(dir, 'bird.conf');
  const socketPath = path.join(dir, 'bird.ctl');
  const logPath = path.join(dir, 'bird.log');
  fs.writeFileSync(conf, config);
  const readLog = () => {
    try {
      return fs.readFileSync(logPath, 'utf8');
    } catch {
      return '';
    }
  };
  let proc: ChildProcess | undefined;
  // A test process that dies without stop() must not leave BIRD running in a namespace.
  const onExit = () => proc?.kill('SIGKILL');
  const stop = async () => {
    const p = proc;
    proc = undefined;
    process.removeListener('exit', onExit);
    if (p && p.exitCode === null && p.signalCode === null) {
      const exited = new Promise<void>((r) => p.once('exit', () => r()));
      p.kill('SIGTERM');
      const timer = setTimeout(() => p.kill('SIGKILL'), 2000);
      await exited;
      clearTimeout(timer);
    }
    fs.rmSync(dir, { recursive: true, force: true });
  };
  const birdc = (...args: string[]) => execFileSync(BIRDC, ['-s', socketPath, ...args], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });

  try {
    try {
      execFileSync(BIRD, ['-p', '-c', conf], { stdio: ['ignore', 'pipe', 'pipe'] });
    } catch (e) {
      throw new Error(`bird rejected its configuration: ${(e as { stderr?: Buffer }).stderr?.toString().trim()}\n${config}`);
    }
    const out = fs.openSync(logPath, 'a');
    // nsenter execs bird (no fork for a network namespace), so the child is BIRD itself; -f keeps it in
    // the foreground so that killing the child stops it.
    proc = spawn('nsenter', [`--net=/run/netns/${netns}`, BIRD, '-f', '-c', conf, '-s', socketPath, '-P', path.join(dir, 'bird.pid')], { stdio: ['ignore', out, out] });
    fs.closeSync(out);
    process.once('exit', onExit);
    const p = proc;
    await waitFor(
      () => {
        if (p.exitCode !== null || p.signalCode !== null) throw new Error(`bird in ${netns} exited (${p.exitCode ?? p.signalCode}): ${readLog()}`);
        if (!fs.existsSync(socketPath)) return false;
        try {
          birdc('show', 'status');
          return true;
        } catch {
          return false;
        }
      },
      `bird in ${netns} to answer on its control socket`,
      { timeoutMs: readyTimeoutMs, describe: readLog },
    );
  } catch (e) {
    await stop();
    throw e;
  }

  return {
    netns,
    dir,
    socketPath,
    birdc,
    bgpNotEstablished() {
      // "name  BGP  ---  up  12:00:00.000  Established" per protocol; a session still connecting says
      // start/Active/Connect/OpenSent instead.
      return birdc('show', 'protocols')
        .split('\n')
        .map((l) => l.trim().split(/\s+/))
        .filter((f) => f[1] === 'BGP' && !f.includes('Established'))
        .map((f) => f[0]);
    },
    log: readLog,
    stop: () => stop().catch(() => undefined),
  };
}

/** Waits until every BGP session of every given BIRD is Established. */
export async function waitBgpEstablished(birds: TestBird[], timeoutMs = 20_000): Promise<number> {
  const pending = () => birds.flatMap((b) => b.bgpNotEstablished().map((n) => `${b.netns}:${n}`));
  return waitFor(() => pending().length === 0, 'BGP sessions to be Established', {
    timeoutMs,
    intervalMs: 100,
    describe: () => `${pending().join(', ')}\n${birds.map((b) => `--- ${b.netns}\n${b.birdc('show', 'protocols')}`).join('\n')}`,
  });
}
