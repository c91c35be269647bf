// The event receive loop, run in a worker thread so its blocking recv never stalls the event loop.
// It is plain JavaScript in a string (started with `new Worker(src, { eval: true })`) because a bundled
// single executable has no worker script file to point at, and a function's own source would carry
// bundler-renamed references. It needs only Node built-ins: fs.readSync on the netlink fd is recv().

/** workerData: { fd, stop: Int32Array (SharedArrayBuffer; non-zero = stop), bufBytes }. */
export const EVENT_READER_SOURCE = `
'use strict';
const { parentPort, workerData } = require('node:worker_threads');
const fs = require('node:fs');
const { fd, stop, bufBytes } = workerData;
const buf = Buffer.allocUnsafe(bufBytes);
let overruns = 0;
while (Atomics.load(stop, 0) === 0) {
  let n = 0;
  try {
    n = fs.readSync(fd, buf, 0, buf.length, null);
  } catch (e) {
    // EAGAIN: the receive timeout expired, which is what lets the loop notice a stop request.
    if (e.code === 'EAGAIN' || e.code === 'EINTR') continue;
    // ENOBUFS: the kernel dropped events because the socket buffer was full; the caller must resync.
    if (e.code === 'ENOBUFS') { overruns++; parentPort.postMessage({ kind: 'overrun', overruns }); continue; }
    parentPort.postMessage({ kind: 'error', code: e.code, message: e.message });
    break;
  }
  if (n <= 0) continue;
  const copy = new Uint8Array(n);
  copy.set(buf.subarray(0, n));
  parentPort.postMessage({ kind: 'data', bytes: copy }, [copy.buffer]);
}
`;
