// A single-producer single-consumer ring of datagrams in shared memory, between the event reader worker
// (producer) and the main thread (consumer). Each conntrack event is its own netlink datagram, so posting
// one message per datagram cost ~40 µs an event and capped a burst at ~22k events/s; through the ring the
// worker posts a wake-up only when the consumer has drained everything, and the consumer takes every
// datagram waiting in one go.
//
// Layout: ctrl = Int32Array [W, R, WAKE] (byte offsets into data; WAKE=1 while a wake-up is pending);
// data = records [u32 length][bytes], each padded to 4. A record never wraps: a length of WRAP means
// "continue at 0". W === R is empty, so the producer never fills the ring up to R; it also keeps 4 bytes
// at the end for the wrap marker. Lengths are little-endian (the host's, as netlink's).
// The producer side runs as plain JavaScript in the worker (no imports there), so it is source text,
// RING_PRODUCER_SOURCE (ringReserve/ringCommit, and ringPut around them); tests evaluate the same text.

export const W = 0;
export const R = 1;
export const WAKE = 2;
export const WRAP = 0xffffffff;

/**
 * Producer, as source text (the worker runs it; tests evaluate it):
 * - `ringReserve(ctrl, data, max)`: the offset where up to `max` bytes of the next datagram may be written
 *   (the worker receives straight into the ring there: no copy), or -1 when the ring is full;
 * - `ringCommit(ctrl, data, at, n)`: publishes the n bytes written at `at`; returns 'woke' when the
 *   consumer must be woken, else 'ok';
 * - `ringPut(ctrl, data, bytes, n)`: both around a copy of bytes[0, n); 'woke', 'ok' or 'full'.
 */
export const RING_PRODUCER_SOURCE = `
let ringView = null;
function ringViewOf(data) {
  // One DataView per ring, not one per datagram (the reader puts every event through here).
  if (ringView === null || ringView.buffer !== data.buffer || ringView.byteOffset !== data.byteOffset) ringView = new DataView(data.buffer, data.byteOffset, data.length);
  return ringView;
}
function ringReserve(ctrl, data, max) {
  const cap = data.length;
  const need = 4 + ((max + 3) & ~3);
  const w = Atomics.load(ctrl, ${W});
  const r = Atomics.load(ctrl, ${R});
  if (w >= r) {
    // At the end, always leaving 4 bytes for a wrap marker; else at the start, short of R.
    if (cap - w >= need + 4) return w + 4;
    if (r - need < 4) return -1;
    ringViewOf(data).setUint32(w, ${WRAP}, true);
    return 4;
  }
  return r - w - need < 4 ? -1 : w + 4;
}
function ringCommit(ctrl, data, at, n) {
  ringViewOf(data).setUint32(at - 4, n, true);
  Atomics.store(ctrl, ${W}, at + ((n + 3) & ~3));
  return Atomics.exchange(ctrl, ${WAKE}, 1) === 0 ? 'woke' : 'ok';
}
function ringPut(ctrl, data, bytes, n) {
  const at = ringReserve(ctrl, data, n);
  if (at < 0) return 'full';
  data.set(bytes.subarray(0, n), at);
  return ringCommit(ctrl, data, at, n);
}
`;

export interface Ring {
  ctrl: Int32Array;
  data: Uint8Array;
}

export function createRing(bytes: number): Ring {
  return { ctrl: new Int32Array(new SharedArrayBuffer(12)), data: new Uint8Array(new SharedArrayBuffer(bytes)) };
}

/**
 * Consumer: calls fn with a view of each waiting datagram, in order (the view is only valid during the
 * call), and frees the space; at most `max` of them. Clears WAKE first, so a datagram put during the drain
 * wakes it again. Returns how many were taken and whether more are waiting (then drain again soon: no
 * wake-up comes for those).
 */
export function ringDrain(ring: Ring, fn: (datagram: Buffer) => void, max = Infinity): { count: number; more: boolean } {
  return ringDrainAt(ring, (buf, off, len) => fn(buf.subarray(off, off + len)), max);
}

const views = new WeakMap<Uint8Array, Buffer>();

/**
 * ringDrain without a Buffer per datagram: fn gets the ring's own bytes and the datagram's offset and
 * length in them (valid only during the call). The event path's hot loop.
 */
export function ringDrainAt(ring: Ring, fn: (buf: Buffer, off: number, len: number) => void, max = Infinity): { count: number; more: boolean } {
  const { ctrl, data } = ring;
  Atomics.store(ctrl, WAKE, 0);
  let buf = views.get(data);
  if (!buf) {
    buf = Buffer.from(data.buffer, data.byteOffset, data.length);
    views.set(data, buf);
  }
  let r = Atomics.load(ctrl, R);
  let count = 0;
  let more = false;
  let w = Atomics.load(ctrl, W);
  try {
    for (;;) {
      if (r === w) {
        // Caught up with what was there at the start: look again (the producer may have put more).
        w = Atomics.load(ctrl, W);
        if (r === w) break;
      }
      if (count >= max) {
        more = true;
        break;
      }
      const n = buf.readUInt32LE(r);
      if (n === WRAP) {
        r = 0;
        continue;
      }
      const at = r;
      // Past this datagram before fn runs, so a throwing fn does not get it again.
      r += 4 + ((n + 3) & ~3);
      count++;
      fn(buf, at + 4, n);
    }
  } finally {
    // The space is freed once per drain, not per datagram; a producer waiting for room sleeps on R.
    Atomics.store(ctrl, R, r);
    Atomics.notify(ctrl, R);
  }
  return { count, more };
}
