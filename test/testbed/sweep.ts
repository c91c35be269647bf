// Removes what earlier, killed test runs left behind, run by test/run.sh before any test starts: testbed
// namespaces, run dirs, pins and Redis of dead runs (cleanup.ts), and the uniquely named namespaces of
// kernel tests (which delete their own in finally, unless the runner itself was killed).
import { execFileSync } from 'node:child_process';
import { sweepStale } from './cleanup';

const KERNEL_TEST_NS = /^(tnc|tmu|tgd|tnl|tfou|tct|tbfd|teg|tch|tchp|tchk|tchg|tchc|tl2|trt|tbs|smk)-[0-9a-f]+(-.*)?$/;

const removed = sweepStale();
const names = execFileSync('ip', ['netns', 'list'], { encoding: 'utf8' })
  .split('\n')
  .map((l) => l.split(' ')[0])
  .filter((n) => KERNEL_TEST_NS.test(n));
for (const n of names) {
  try {
    execFileSync('ip', ['netns', 'del', n], { stdio: 'ignore' });
    removed.push(n);
  } catch {
    // gone meanwhile
  }
}
if (removed.length) process.stdout.write(`swept leftovers of earlier runs: ${removed.join(', ')}\n`);
