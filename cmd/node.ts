// One executable, several names: dispatches on the name it was invoked by (the installer links
// tether-ipam, tetherd, tether-operator, tetherctl and tether-install to tether). Each branch is required lazily so the CNI client
// never initialises daemon code (winston, koffi) and starts as fast as a bare Node.
import * as path from 'node:path';
import { answerCommandLine } from '../lib/version';

/** The CNI clients of this build reach tetherd through Node's net. */
function useNodeConnector(): void {
  const { useConnector } = require('../cni/client-main') as typeof import('../cni/client-main');
  useConnector((require('../lib/api/client') as typeof import('../lib/api/client')).nodeConnector);
}

function calledAs(): { name: string; args: string[] } {
  const args = process.argv.slice(2);
  const name = process.env.TETHER_CALLED_AS || path.basename(process.argv0 || process.argv[1] || 'tether');
  return { name, args };
}

async function run(): Promise<number> {
  const { name, args } = calledAs();
  const answered = answerCommandLine(name, args, process.env);
  if (answered !== undefined) return answered;
  switch (name) {
    case 'tetherd':
      return (require('../daemon/main') as typeof import('../daemon/main')).main(args);
    case 'tether-operator':
      return (require('../operator/main') as typeof import('../operator/main')).main(args);
    case 'tetherctl':
      return (require('./tetherctl') as typeof import('./tetherctl')).main(args);
    case 'tether-install':
      return (require('../install/cni/main') as typeof import('../install/cni/main')).main(args);
    case 'tether-ipam':
      useNodeConnector();
      return (require('./tether-ipam') as typeof import('./tether-ipam')).main();
    default:
      useNodeConnector();
      return (require('./tether') as typeof import('./tether')).main();
  }
}

run().then(
  (code) => {
    process.exitCode = code;
    // tetherd's and the operator's main() return only once everything they started was stopped (or failed
    // to start): exit now, so a connection or timer some library keeps (a Redis client reconnecting) cannot keep it alive.
    if (calledAs().name === 'tetherd' || calledAs().name === 'tether-operator') process.exit(code);
  },
  (e) => {
    process.stderr.write(`${(e as Error).stack ?? e}\n`);
    process.exitCode = 1;
  },
);
