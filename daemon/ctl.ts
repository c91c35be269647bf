// tetherctl: asks a tetherd for its status (JSON on stdout) or whether it is alive (exit code).
import { parseArgs } from 'node:util';
import { call } from './api/client';
import { DEFAULT_SOCKET_PATH } from './api/protocol';

export async function main(argv: string[]): Promise<number> {
  const { values, positionals } = parseArgs({
    args: argv,
    allowPositionals: true,
    options: { socket: { type: 'string', default: DEFAULT_SOCKET_PATH }, timeout: { type: 'string', default: '5000' } },
  });
  const cmd = positionals[0] ?? 'status';
  if (cmd !== 'status' && cmd !== 'ping') {
    process.stderr.write(`usage: tetherctl [--socket PATH] status|ping\n`);
    return 2;
  }
  try {
    const out = await call(values.socket as string, cmd, {}, { timeoutMs: Number(values.timeout) });
    process.stdout.write(JSON.stringify(out, null, 2) + '\n');
    return 0;
  } catch (e) {
    process.stderr.write(`tetherctl: ${(e as Error).message}\n`);
    return 1;
  }
}
