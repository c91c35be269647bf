// Address text <-> bytes on the codec's hot path, without the regexes and arrays of netlink/ip-bytes
// (which took a quarter of resync CPU). Output is the same canonical inet_ntop text; a test checks that.

export class AddressError extends Error {
  constructor(text: string, family: 4 | 6) {
    super(`'${text}' is not an IPv${family} address`);
    this.name = 'AddressError';
  }
}

/** Parses dotted-quad `s` from index `from` into 4 bytes at `o`; returns false when it isn't one. */
function parseV4(s: string, from: number, buf: Buffer, o: number): boolean {
  let part = 0, digits = 0, n = 0;
  for (let i = from; i <= s.length; i++) {
    const c = i < s.length ? s.charCodeAt(i) : 46;
    if (c === 46) {
      if (digits === 0 || part > 255 || n > 3) return false;
      buf[o + n++] = part;
      part = 0;
      digits = 0;
    } else if (c >= 48 && c <= 57 && digits < 3) {
      // A leading zero ("01") is refused, as inet_pton does.
      if (digits === 1 && part === 0) return false;
      part = part * 10 + (c - 48);
      digits++;
    } else return false;
  }
  return n === 4;
}

export function writeV4(buf: Buffer, o: number, s: string): void {
  if (!parseV4(s, 0, buf, o)) throw new AddressError(s, 4);
}

function hexVal(c: number): number {
  if (c >= 48 && c <= 57) return c - 48;
  if (c >= 97 && c <= 102) return c - 87;
  if (c >= 65 && c <= 70) return c - 55;
  return -1;
}

// Scratch space: the codec is synchronous, so one set of groups is enough.
const G = new Uint16Array(8);
const V4 = Buffer.alloc(4);

export function writeV6(buf: Buffer, o: number, s: string): void {
  const n = s.length;
  let i = 0, count = 0, gap = -1;
  if (n >= 2 && s.charCodeAt(0) === 58) {
    if (s.charCodeAt(1) !== 58) throw new AddressError(s, 6);
    gap = 0;
    i = 2;
  }
  while (i < n) {
    if (count === 8) throw new AddressError(s, 6);
    let v = 0, d = 0, j = i;
    for (; j < n; j++) {
      const h = hexVal(s.charCodeAt(j));
      if (h < 0) break;
      v = v * 16 + h;
      d++;
    }
    if (j < n && s.charCodeAt(j) === 46) {
      // Embedded dotted quad: the last 32 bits.
      if (count > 6 || !parseV4(s, i, V4, 0)) throw new AddressError(s, 6);
      G[count++] = (V4[0] << 8) | V4[1];
      G[count++] = (V4[2] << 8) | V4[3];
      break;
    }
    if (d === 0 || d > 4) throw new AddressError(s, 6);
    G[count++] = v;
    i = j;
    if (i === n) break;
    if (s.charCodeAt(i) !== 58) throw new AddressError(s, 6);
    i++;
    if (i < n && s.charCodeAt(i) === 58) {
      if (gap >= 0) throw new AddressError(s, 6);
      gap = count;
      i++;
    } else if (i === n) throw new AddressError(s, 6);
  }
  if (gap < 0 ? count !== 8 : count > 7) throw new AddressError(s, 6);
  const head = gap < 0 ? 8 : gap;
  const tail = gap < 0 ? 0 : count - gap;
  buf.fill(0, o, o + 16);
  for (let k = 0; k < head; k++) {
    buf[o + 2 * k] = G[k] >>> 8;
    buf[o + 2 * k + 1] = G[k];
  }
  for (let k = 0; k < tail; k++) {
    const at = o + 2 * (8 - tail + k);
    buf[at] = G[gap + k] >>> 8;
    buf[at + 1] = G[gap + k];
  }
}

export function formatV4(b: Buffer, o: number): string {
  return `${b[o]}.${b[o + 1]}.${b[o + 2]}.${b[o + 3]}`;
}

/** inet_ntop text of 16 bytes at `o`: longest run (≥ 2) of zero groups as "::", first on ties. */
export function formatV6(b: Buffer, o: number): string {
  let best = -1, bestLen = 0;
  for (let i = 0; i < 8; ) {
    if (b[o + 2 * i] !== 0 || b[o + 2 * i + 1] !== 0) {
      i++;
      continue;
    }
    let j = i;
    while (j < 8 && b[o + 2 * j] === 0 && b[o + 2 * j + 1] === 0) j++;
    if (j - i > bestLen && j - i >= 2) {
      best = i;
      bestLen = j - i;
    }
    i = j;
  }
  // IPv4-compatible and IPv4-mapped addresses end in a dotted quad, as inet_ntop prints them.
  if (best === 0 && (bestLen === 6 || (bestLen === 5 && b[o + 10] === 0xff && b[o + 11] === 0xff))) {
    return `::${bestLen === 5 ? 'ffff:' : ''}${formatV4(b, o + 12)}`;
  }
  let s = '';
  let sep = false;
  for (let i = 0; i < 8; i++) {
    if (i === best) {
      s += '::';
      sep = false;
      i += bestLen - 1;
      continue;
    }
    if (sep) s += ':';
    s += ((b[o + 2 * i] << 8) | b[o + 2 * i + 1]).toString(16);
    sep = true;
  }
  return s;
}
