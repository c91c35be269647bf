// The CNI executables kubelet's runtime runs for every pod: `tether` and `tether-ipam` (one file, two names,
// dispatched on the name it was run by). Compiled with Bun (`bun build --compile --bytecode`,
// install/build.sh) for start-up time; it holds only the thin client (cni/client-main.ts), never daemon
// code, and reaches tetherd through Bun's own sockets. Bun loads every module a bundle imports at start,
// so nothing here imports node:net or node:path; and nothing touches process.stdout or process.stderr
// (building Node's streams there costs more than the request): output goes through Bun.write.
import { answerCommandLine, type TextSink } from '../lib/version';
import { bunConnector, bunOutput, bunReadStdin, bunRuntime } from '../cni/bun-connector';
import { useConnector, useOutput, useStdinReader } from '../cni/client-main';
import { main as tetherMain } from './tether';
import { main as ipamMain } from './tether-ipam';

async function run(): Promise<number> {
  const args = process.argv.slice(2);
  const invoked = process.env.TETHER_CALLED_AS || process.argv0 || process.argv[1] || 'tether';
  const name = invoked.slice(invoked.lastIndexOf('/') + 1);
  const bun = bunRuntime() !== undefined;
  const pending: Array<Promise<void>> = [];
  const [out, err]: [TextSink, TextSink] = bun
    ? [{ write: (t) => pending.push(bunOutput.out(t)) }, { write: (t) => pending.push(bunOutput.err(t)) }]
    : [process.stdout, process.stderr];
  const answered = answerCommandLine(name === 'tether-ipam' ? name : 'tether', args, process.env, out, err);
  await Promise.all(pending);
  if (answered !== undefined) return answered;
  // Under Node (not how it ships) cmd/node.ts is the entry; this one speaks only through Bun.
  if (!bun) throw new Error('cmd/cni-plugin.ts runs under Bun (the Node build starts at cmd/node.ts)');
  useConnector(bunConnector);
  useStdinReader(bunReadStdin);
  useOutput(bunOutput);
  return name === 'tether-ipam' ? ipamMain() : tetherMain();
}

run().then(
  (code) => {
    process.exitCode = code;
  },
  async (e) => {
    process.exitCode = 1;
    await (bunRuntime() ? bunOutput.err(`${(e as Error).stack ?? e}\n`) : process.stderr.write(`${(e as Error).stack ?? e}\n`));
  },
);
