// Preloaded by test/run.sh into every uvu group (`-r`). uvu runs a group's files in one process, so an
// error no test awaited (a rejected promise nobody holds, a throw in a timer) would end the process and
// lose every later file's results, with nothing in the summary saying why. Here it is reported as a
// failure in the format run.sh counts (a FAIL line), with its stack, and the group goes on.
//
// A rejection Node calls unhandled may still be handled a moment later (a promise awaited after it
// failed: Node then emits 'rejectionHandled'); only one still unhandled a second later, or when the
// process ends, is reported.
'use strict';
let n = 0;
const pending = new Map(); // promise → reason
function report(kind, err) {
  n++;
  const e = err instanceof Error ? err : new Error(String(err));
  process.stdout.write(`\n   FAIL  "process-level ${kind} #${n} (no test awaited it): ${e.message.split('\n')[0]}"\n    ${(e.stack || '').split('\n').slice(1, 12).join('\n    ')}\n\n`);
  process.exitCode = 1;
}
process.on('unhandledRejection', (reason, promise) => {
  pending.set(promise, reason);
  setTimeout(() => {
    if (!pending.has(promise)) return;
    pending.delete(promise);
    report('unhandled rejection', reason);
  }, 1000);
});
process.on('rejectionHandled', (promise) => pending.delete(promise));
process.on('exit', () => {
  for (const reason of pending.values()) report('unhandled rejection', reason);
  pending.clear();
});
process.on('uncaughtException', (err) => report('uncaught exception', err));
