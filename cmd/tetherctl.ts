// tetherctl: talks to a tetherd over its socket. Its command line is checked whole before anything is
// sent: a missing or malformed flag is a usage error (exit 2) naming the flag, and tetherd never sees it.
//   tetherctl [--socket PATH] status | ping
//   tetherctl [--socket PATH] ready --net-dir DIR
//   tetherctl [--socket PATH] address allocate --pool P --owner O [--count N [--family 4|6] | --address A...]
//   tetherctl [--socket PATH] address release --pool P --owner O
import { parseArgs } from 'node:util';
import { call } from '../lib/api/client';
import { DEFAULT_SOCKET_PATH, type Method } from '../lib/api/protocol';
import { isDnsSubdomain } from '../lib/fields';
import { parseIp } from '../lib/ip';
import { ErrorCode } from '../lib/errors';
import { readiness } from '../install/cni/installer';
import { RUNTIMES, type Runtime } from '../install/cni/libcni';

const USAGE = `usage: tetherctl [--socket PATH] [--timeout MS] status | ping
       tetherctl [--socket PATH] ready [--net-dir DIR] [--runtime containerd|crio]
       tetherctl [--socket PATH] address allocate --pool P --owner O [--count N [--family 4|6] | --address A...]
       tetherctl [--socket PATH] address release --pool P --owner O
       tetherctl --help | --version
  status    what tetherd holds: pods, pools, Egress ownership and candidates, BFD, sync and security counters
  ping      whether tetherd answers
  ready     exit 0 only when tetherd answers and the CNI configuration the runtime uses chains tether
            (the DaemonSet's readiness probe; --net-dir default /etc/cni/net.d)
  address allocate / release
            cluster-wide (floating, loadBalancer) addresses of an owner (e.g. egress/ns/name#0)
  --socket  tetherd's socket (default ${DEFAULT_SOCKET_PATH})
  --timeout milliseconds to wait for tetherd's answer (default 10000)\n`;

type Command = 'status' | 'ping' | 'ready' | 'address allocate' | 'address release';

/** The options each command takes besides --socket and --timeout: any other one is a mistake, not ignored. */
const OPTIONS_OF: Record<Command, string[]> = {
  status: [],
  ping: [],
  ready: ['net-dir', 'runtime'],
  'address allocate': ['pool', 'owner', 'count', 'address', 'family'],
  'address release': ['pool', 'owner'],
};

/** What tetherd accepts as an owner (ipam/cluster-addresses.ts checks the same); refused here before sending. */
const OWNER_RE = /^[A-Za-z0-9][A-Za-z0-9._\-/#:]{0,252}$/;

/** A command line tetherctl cannot run: said on stderr with the usage, exit 2, nothing sent. */
class UsageError extends Error {}

interface Invocation {
  command: Command;
  socket: string;
  timeoutMs: number;
  params: Record<string, unknown>;
  netDir: string;
  runtime: Runtime;
}

/** The whole command line checked: every flag the command needs is there and well-formed, no other one. */
export function parseCommandLine(argv: string[]): Invocation | 'help' {
  let parsed;
  try {
    parsed = parseArgs({
      args: argv,
      allowPositionals: true,
      options: {
        socket: { type: 'string' },
        timeout: { type: 'string' },
        pool: { type: 'string' },
        owner: { type: 'string' },
        count: { type: 'string' },
        address: { type: 'string', multiple: true },
        family: { type: 'string' },
        'net-dir': { type: 'string' },
        runtime: { type: 'string' },
        help: { type: 'boolean', short: 'h' },
      },
    });
  } catch (e) {
    throw new UsageError((e as Error).message);
  }
  const { values: v, positionals } = parsed;
  if (v.help) return 'help';
  const [first = 'status', second, ...rest] = positionals;
  let command: Command;
  let extra: string[];
  if (first === 'address') {
    if (second !== 'allocate' && second !== 'release') {
      throw new UsageError(second === undefined ? 'address needs a subcommand: allocate or release' : `address ${JSON.stringify(second)}: not a subcommand (allocate or release)`);
    }
    command = `address ${second}`;
    extra = rest;
  } else if (first === 'status' || first === 'ping' || first === 'ready') {
    command = first;
    extra = positionals.slice(1);
  } else {
    throw new UsageError(`${JSON.stringify(first)} is not a command (status, ping, ready, address)`);
  }
  if (extra.length) throw new UsageError(`${command}: unexpected argument ${JSON.stringify(extra[0])}`);
  const given = (Object.keys(v) as Array<keyof typeof v>).filter((k) => v[k] !== undefined && k !== 'socket' && k !== 'timeout' && k !== 'help');
  for (const k of given) if (!OPTIONS_OF[command].includes(k)) throw new UsageError(`${command} takes no --${k}`);

  const socket = v.socket ?? DEFAULT_SOCKET_PATH;
  if (socket === '') throw new UsageError('--socket: must be a path, not empty');
  const timeout = v.timeout ?? '10000';
  // setTimeout takes at most 2^31-1 ms (a larger one fires at once).
  if (!/^[1-9][0-9]*$/.test(timeout) || Number(timeout) > 2 ** 31 - 1) throw new UsageError(`--timeout ${JSON.stringify(timeout)}: must be a number of milliseconds, 1 to ${2 ** 31 - 1}`);
  const inv: Invocation = { command, socket, timeoutMs: Number(timeout), params: {}, netDir: v['net-dir'] ?? '/etc/cni/net.d', runtime: (v.runtime ?? 'containerd') as Runtime };

  if (command === 'ready') {
    if (!RUNTIMES.includes(inv.runtime)) throw new UsageError(`--runtime ${JSON.stringify(inv.runtime)}: must be one of ${RUNTIMES.join(', ')}`);
    if (inv.netDir === '') throw new UsageError('--net-dir: must be a directory, not empty');
  }
  if (command === 'address allocate' || command === 'address release') {
    if (v.pool === undefined) throw new UsageError(`${command} needs --pool (the AddressPool the addresses come from)`);
    if (!isDnsSubdomain(v.pool)) throw new UsageError(`--pool ${JSON.stringify(v.pool)}: not a pool name (a DNS-1123 subdomain, e.g. floating)`);
    if (v.owner === undefined) throw new UsageError(`${command} needs --owner (who holds the addresses, e.g. egress/shop/web-out#0)`);
    if (!OWNER_RE.test(v.owner)) throw new UsageError(`--owner ${JSON.stringify(v.owner)}: must be 1-253 characters of letters, digits and . _ - / # :, starting with a letter or digit`);
    inv.params = { pool: v.pool, owner: v.owner };
  }
  if (command === 'address allocate') {
    if (v.address !== undefined) {
      if (v.count !== undefined) throw new UsageError('--count and --address are alternatives: give one');
      if (v.family !== undefined) throw new UsageError('--family goes with --count: an --address names its own family');
      for (const a of v.address) if (!parseIp(a)) throw new UsageError(`--address ${JSON.stringify(a)}: not an IP address`);
      inv.params.addresses = v.address;
    }
    if (v.count !== undefined) {
      if (!/^[1-9][0-9]*$/.test(v.count)) throw new UsageError(`--count ${JSON.stringify(v.count)}: must be a whole number of addresses, at least 1`);
      inv.params.count = Number(v.count);
    }
    if (v.family !== undefined) {
      if (v.family !== '4' && v.family !== '6') throw new UsageError(`--family ${JSON.stringify(v.family)}: must be 4 or 6`);
      inv.params.family = Number(v.family);
    }
  }
  return inv;
}

export async function main(argv: string[]): Promise<number> {
  let inv: Invocation | 'help';
  try {
    inv = parseCommandLine(argv);
  } catch (e) {
    if (!(e instanceof UsageError)) throw e;
    process.stderr.write(`tetherctl: ${e.message}\n${USAGE}`);
    return 2;
  }
  if (inv === 'help') {
    process.stdout.write(USAGE);
    return 0;
  }
  if (inv.command === 'ready') {
    try {
      await call(inv.socket, 'ping', {}, { timeoutMs: inv.timeoutMs });
    } catch (e) {
      const denied = (e as { code?: string }).code === ErrorCode.PermissionDenied;
      process.stderr.write(`not ready: ${denied ? '' : `tetherd does not answer on ${inv.socket}: `}${(e as Error).message}\n`);
      return 1;
    }
    const r = readiness(inv.netDir, undefined, inv.runtime);
    (r.ready ? process.stdout : process.stderr).write(`${r.ready ? 'ready' : 'not ready'}: ${r.why}\n`);
    return r.ready ? 0 : 1;
  }
  const method: Method = inv.command === 'address allocate' ? 'address.allocate' : inv.command === 'address release' ? 'address.release' : inv.command;
  try {
    const out = await call(inv.socket, method, inv.params, { timeoutMs: inv.timeoutMs });
    process.stdout.write(JSON.stringify(out, null, 2) + '\n');
    return 0;
  } catch (e) {
    const code = (e as { code?: string }).code;
    process.stderr.write(`tetherctl: ${code ? `[${code}] ` : ''}${(e as Error).message}\n`);
    return 1;
  }
}
