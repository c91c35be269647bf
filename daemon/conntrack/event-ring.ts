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
// RING_PRODUCER_SOURCE, defining `ringPut(ctrl, data, bytes, n)`; tests evaluate the same text.

export const W = 0;
export const R = 1;
export const WAKE = 2;
export const WRAP = 0xffffffff;

/** Producer: copies bytes[0, n) in; returns 'woke' when the consumer must be woken, 'ok', or 'full'. */
export const RING_PRODUCER_SOURCE = `
function ringPut(ctrl, data, bytes, n) {
  const cap = data.length;
  const need = 4 + ((n + 3) & ~3);
  let w = Atomics.load(ctrl, ${W});
  const r = Atomics.load(ctrl, ${R});
  const view = new DataView(data.buffer, data.byteOffset, cap);
  if (w >= r) {
    // At the end, always leaving 4 bytes for a wrap marker; else at the start, short of R.
    if (cap - w < need + 4) {
      if (r - need < 4) return 'full';
      view.setUint32(w, ${WRAP}, true);
      w = 0;
    }
  } else if (r - w - need < 4) {
    return 'full';
  }
  view.setUint32(w, n, true);
  data.set(bytes.subarray(0, n), w + 4);
  Atomics.store(ctrl, ${W}, w + need);
  return Atomics.exchange(ctrl, ${WAKE}, 1) === 0 ? 'woke' : 'ok';
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
  const { ctrl, data } = ring;
  Atomics.store(ctrl, WAKE, 0);
  const buf = Buffer.from(data.buffer, data.byteOffset, data.length);
  let r = Atomics.load(ctrl, R);
  let count = 0;
  let more = false;
  for (;;) {
    const w = Atomics.load(ctrl, W);
    if (r === w) break;
    if (count >= max) {
      more = true;
      break;
    }
    const n = buf.readUInt32LE(r);
    if (n === WRAP) {
      r = 0;
      Atomics.store(ctrl, R, r);
      continue;
    }
    try {
      fn(buf.subarray(r + 4, r + 4 + n));
    } finally {
      r += 4 + ((n + 3) & ~3);
      Atomics.store(ctrl, R, r);
    }
    count++;
  }
  // A producer waiting for room (ring full) sleeps on R.
  Atomics.notify(ctrl, R);
  return { count, more };
}
