// Removes what earlier, killed test runs left behind (testbed namespaces, run dirs, pins). Run by test/run.sh.
import { sweepStale } from './cleanup';

const removed = sweepStale();
if (removed.length) process.stdout.write(`swept leftovers of earlier runs: ${removed.join(', ')}\n`);
