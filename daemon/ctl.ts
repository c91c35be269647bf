// tetherctl: talks to a tetherd over its socket.
//   tetherctl [--socket PATH] status | ping
//   tetherctl [--socket PATH] ready --net-dir DIR
//   tetherctl [--socket PATH] address allocate --pool P --owner O [--count N] [--address A]... [--family 4|6]
//   tetherctl [--socket PATH] address release --pool P --owner O
import { parseArgs } from 'node:util';
import { call } from './api/client';
import { DEFAULT_SOCKET_PATH, type Method } from './api/protocol';
import { readiness } from '../install/cni/installer';
import { RUNTIMES, type Runtime } from '../install/cni/libcni';

const USAGE = `usage: tetherctl [--socket PATH] [--timeout MS] status | ping
       tetherctl [--socket PATH] ready [--net-dir DIR] [--runtime containerd|crio]
       tetherctl [--socket PATH] address allocate --pool P --owner O [--count N] [--address A]... [--family 4|6]
       tetherctl [--socket PATH] address release --pool P --owner O
       tetherctl --help | --version
  status    what tetherd holds: pods, pools, Egress ownership and candidates, BFD, sync and security counters
  ping      whether tetherd answers
  ready     exit 0 only when tetherd answers and the CNI configuration the runtime uses chains tether
            (the DaemonSet's readiness probe; --net-dir default /etc/cni/net.d)
  --socket  tetherd's socket (default ${DEFAULT_SOCKET_PATH})\n`;

export async function main(argv: string[]): Promise<number> {
  let parsed;
  try {
    parsed = parseArgs({
      args: argv,
      allowPositionals: true,
      options: {
        socket: { type: 'string', default: DEFAULT_SOCKET_PATH },
        timeout: { type: 'string', default: '10000' },
        pool: { type: 'string' },
        owner: { type: 'string' },
        count: { type: 'string' },
        address: { type: 'string', multiple: true },
        family: { type: 'string' },
        'net-dir': { type: 'string', default: '/etc/cni/net.d' },
        runtime: { type: 'string', default: 'containerd' },
        help: { type: 'boolean', short: 'h' },
      },
    });
  } catch (e) {
    process.stderr.write(`tetherctl: ${(e as Error).message}\n${USAGE}`);
    return 2;
  }
  const { values: v, positionals } = parsed;
  if (v.help) {
    process.stdout.write(USAGE);
    return 0;
  }
  const [cmd = 'status', sub] = positionals;
  let method: Method;
  let params: Record<string, unknown> = {};
  if (cmd === 'ready') {
    try {
      await call(v.socket as string, 'ping', {}, { timeoutMs: Number(v.timeout) });
    } catch (e) {
      process.stderr.write(`not ready: tetherd does not answer on ${v.socket}: ${(e as Error).message}\n`);
      return 1;
    }
    const runtime = v.runtime as Runtime;
    if (!RUNTIMES.includes(runtime)) {
      process.stderr.write(`tetherctl: --runtime ${runtime}: must be one of ${RUNTIMES.join(', ')}\n`);
      return 2;
    }
    const r = readiness(v['net-dir'] as string, undefined, runtime);
    (r.ready ? process.stdout : process.stderr).write(`${r.ready ? 'ready' : 'not ready'}: ${r.why}\n`);
    return r.ready ? 0 : 1;
  }
  if (cmd === 'status' || cmd === 'ping') {
    method = cmd;
  } else if (cmd === 'address' && (sub === 'allocate' || sub === 'release')) {
    method = sub === 'allocate' ? 'address.allocate' : 'address.release';
    params = { pool: v.pool, owner: v.owner };
    if (sub === 'allocate') {
      if (v.count !== undefined) params.count = Number(v.count);
      if (v.address) params.addresses = v.address;
      if (v.family !== undefined) params.family = Number(v.family);
    }
  } else {
    process.stderr.write(USAGE);
    return 2;
  }
  try {
    const out = await call(v.socket as string, method, params, { timeoutMs: Number(v.timeout) });
    process.stdout.write(JSON.stringify(out, null, 2) + '\n');
    return 0;
  } catch (e) {
    const code = (e as { code?: string }).code;
    process.stderr.write(`tetherctl: ${code ? `[${code}] ` : ''}${(e as Error).message}\n`);
    return 1;
  }
}
