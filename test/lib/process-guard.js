// Preloaded by test/run.sh into every uvu group (`-r`). uvu runs a group's files in one process, so an
// error no test awaited (a rejected promise nobody holds, a throw in a timer) would end the process and
// lose every later file's results, with nothing in the summary saying why. Here it is reported as a
// failure in the format run.sh counts (a FAIL line), with its stack, and the group goes on.
'use strict';
let n = 0;
function report(kind, err) {
  n++;
  const e = err instanceof Error ? err : new Error(String(err));
  process.stdout.write(`\n   FAIL  "process-level ${kind} #${n} (no test awaited it): ${e.message.split('\n')[0]}"\n    ${(e.stack || '').split('\n').slice(1, 12).join('\n    ')}\n\n`);
  process.exitCode = 1;
}
process.on('unhandledRejection', (reason) => report('unhandled rejection', reason));
process.on('uncaughtException', (err) => report('uncaught exception', err));
