// The event receive loop, run in a worker thread so its blocking recv never stalls the event loop.
// It is plain JavaScript in a string (started with `new Worker(src, { eval: true })`) because a bundled
// single executable has no worker script file to point at, and a function's own source would carry
// bundler-renamed references. It needs only Node built-ins: fs.readSync on the netlink fd is recv().
// Datagrams go to the main thread through a shared-memory ring (event-ring.ts), not one message each.
import { R, RING_PRODUCER_SOURCE } from './event-ring';

/** workerData: { fd, stop: Int32Array (SharedArrayBuffer; non-zero = stop), bufBytes, ctrl, data (the ring, event-ring.ts) }. */
export const EVENT_READER_SOURCE = `
'use strict';
const { parentPort, workerData } = require('node:worker_threads');
const fs = require('node:fs');
const { fd, stop, bufBytes, ctrl, data } = workerData;
${RING_PRODUCER_SOURCE}
// Datagrams are received straight into the ring (no copy): room for the largest is reserved first.
const ring = Buffer.from(data.buffer, data.byteOffset, data.length);
let overruns = 0;
while (Atomics.load(stop, 0) === 0) {
  const at = ringReserve(ctrl, data, bufBytes);
  if (at < 0) {
    // The main thread is behind: wait for it to free room (the kernel queues meanwhile, up to ENOBUFS).
    Atomics.wait(ctrl, ${R}, Atomics.load(ctrl, ${R}), 100);
    continue;
  }
  let n = 0;
  try {
    n = fs.readSync(fd, ring, at, bufBytes, null);
  } catch (e) {
    // EAGAIN: the receive timeout expired, which is what lets the loop notice a stop request.
    if (e.code === 'EAGAIN' || e.code === 'EINTR') continue;
    // ENOBUFS: the kernel dropped events because the socket buffer was full; the caller must resync.
    if (e.code === 'ENOBUFS') { overruns++; parentPort.postMessage({ kind: 'overrun', overruns }); continue; }
    parentPort.postMessage({ kind: 'error', code: e.code, message: e.message });
    break;
  }
  if (n <= 0) continue;
  if (ringCommit(ctrl, data, at, n) === 'woke') parentPort.postMessage({ kind: 'wake' });
}
`;
