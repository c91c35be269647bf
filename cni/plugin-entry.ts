// The CNI executables kubelet's runtime runs for every pod: `tether` and `tether-ipam` (one file, two names,
// dispatched on the name it was run by). Compiled with Bun (`bun build --compile`, install/build.sh) for
// start-up time; it holds only the thin client (cni/client-main.ts), never daemon code.
import * as path from 'node:path';
import { answerCommandLine } from './about';

async function run(): Promise<number> {
  const args = process.argv.slice(2);
  const name = process.env.TETHER_CALLED_AS || path.basename(process.argv0 || process.argv[1] || 'tether');
  const answered = answerCommandLine(name === 'tether-ipam' ? name : 'tether', args, process.env);
  if (answered !== undefined) return answered;
  if (name === 'tether-ipam') return (await import('../ipam/main')).main();
  return (await import('./main')).main();
}

run().then(
  (code) => {
    process.exitCode = code;
  },
  (e) => {
    process.stderr.write(`${(e as Error).stack ?? e}\n`);
    process.exitCode = 1;
  },
);
