// Encoding and decoding of netlink framing: nlmsghdr and (nested) rtattr TLVs, 4-byte aligned, host
// (little-endian) byte order. Fixed per-family headers live in structs.ts.

export const NLMSG_HDRLEN = 16;
export const NLA_HDRLEN = 4;
// Upper two bits of an attribute type are NLA_F_NESTED / NLA_F_NET_BYTEORDER, not part of the type.
const NLA_TYPE_MASK = 0x3fff;
export const NLA_F_NESTED = 0x8000;

export function align4(n: number): number {
  return (n + 3) & ~3;
}

export interface NlMsgHeader {
  type: number;
  flags: number;
  seq: number;
  pid: number;
}

export interface NlMsg extends NlMsgHeader {
  /** Bytes after the 16-byte header, exactly nlmsg_len - 16 long. */
  payload: Buffer;
}

/** One netlink message: header plus the already-encoded body parts (each padded by its producer). */
export function encodeMessage(h: NlMsgHeader, parts: Buffer[]): Buffer {
  const body = Buffer.concat(parts);
  const out = Buffer.alloc(NLMSG_HDRLEN + body.length);
  out.writeUInt32LE(out.length, 0);
  out.writeUInt16LE(h.type, 4);
  out.writeUInt16LE(h.flags, 6);
  out.writeUInt32LE(h.seq >>> 0, 8);
  out.writeUInt32LE(h.pid >>> 0, 12);
  body.copy(out, NLMSG_HDRLEN);
  return out;
}

/** Splits one received datagram into messages; throws on a malformed length (never loops forever). */
export function decodeMessages(buf: Buffer, len = buf.length): NlMsg[] {
  const out: NlMsg[] = [];
  let off = 0;
  while (off + NLMSG_HDRLEN <= len) {
    const mlen = buf.readUInt32LE(off);
    if (mlen < NLMSG_HDRLEN || off + mlen > len) throw new Error(`malformed netlink message: length ${mlen} at offset ${off} of ${len}`);
    out.push({
      type: buf.readUInt16LE(off + 4),
      flags: buf.readUInt16LE(off + 6),
      seq: buf.readUInt32LE(off + 8),
      pid: buf.readUInt32LE(off + 12),
      payload: Buffer.from(buf.subarray(off + NLMSG_HDRLEN, off + mlen)),
    });
    off += align4(mlen);
  }
  return out;
}

/** One rtattr with its payload, padded to 4 bytes (rta_len excludes the padding, as the kernel expects). */
export function attr(type: number, payload: Buffer): Buffer {
  const len = NLA_HDRLEN + payload.length;
  const out = Buffer.alloc(align4(len));
  out.writeUInt16LE(len, 0);
  out.writeUInt16LE(type, 2);
  payload.copy(out, NLA_HDRLEN);
  return out;
}

export function attrU8(type: number, v: number): Buffer {
  return attr(type, Buffer.from([v & 0xff]));
}

export function attrU16(type: number, v: number): Buffer {
  const b = Buffer.alloc(2);
  b.writeUInt16LE(v);
  return attr(type, b);
}

export function attrU32(type: number, v: number): Buffer {
  const b = Buffer.alloc(4);
  b.writeUInt32LE(v >>> 0);
  return attr(type, b);
}

export function attrS32(type: number, v: number): Buffer {
  const b = Buffer.alloc(4);
  b.writeInt32LE(v);
  return attr(type, b);
}

/** NUL-terminated string attribute (IFLA_IFNAME, IFA_LABEL, FRA_IIFNAME…). */
export function attrStr(type: number, s: string): Buffer {
  return attr(type, Buffer.concat([Buffer.from(s, 'utf8'), Buffer.from([0])]));
}

/** Nested attribute. The NLA_F_NESTED flag is optional because older attributes (IFLA_LINKINFO) predate it. */
export function nested(type: number, children: Buffer[], flagNested = false): Buffer {
  return attr(flagNested ? type | NLA_F_NESTED : type, Buffer.concat(children));
}

/** Decoded attributes of one level; a type may repeat, get() returns the last like the kernel's nla_parse. */
export class Attrs {
  readonly list: Array<{ type: number; data: Buffer }>;

  constructor(list: Array<{ type: number; data: Buffer }>) {
    this.list = list;
  }

  static parse(buf: Buffer, offset = 0, end = buf.length): Attrs {
    const list: Array<{ type: number; data: Buffer }> = [];
    let off = offset;
    while (off + NLA_HDRLEN <= end) {
      const len = buf.readUInt16LE(off);
      if (len < NLA_HDRLEN || off + len > end) throw new Error(`malformed attribute: length ${len} at offset ${off}`);
      list.push({ type: buf.readUInt16LE(off + 2) & NLA_TYPE_MASK, data: buf.subarray(off + NLA_HDRLEN, off + len) });
      off += align4(len);
    }
    return new Attrs(list);
  }

  get(type: number): Buffer | undefined {
    for (let i = this.list.length - 1; i >= 0; i--) if (this.list[i].type === type) return this.list[i].data;
    return undefined;
  }

  has(type: number): boolean {
    return this.get(type) !== undefined;
  }

  all(type: number): Buffer[] {
    return this.list.filter((a) => a.type === type).map((a) => a.data);
  }

  u8(type: number): number | undefined {
    const d = this.get(type);
    return d && d.length >= 1 ? d.readUInt8(0) : undefined;
  }

  u16(type: number): number | undefined {
    const d = this.get(type);
    return d && d.length >= 2 ? d.readUInt16LE(0) : undefined;
  }

  u32(type: number): number | undefined {
    const d = this.get(type);
    return d && d.length >= 4 ? d.readUInt32LE(0) : undefined;
  }

  s32(type: number): number | undefined {
    const d = this.get(type);
    return d && d.length >= 4 ? d.readInt32LE(0) : undefined;
  }

  str(type: number): string | undefined {
    const d = this.get(type);
    if (!d) return undefined;
    const nul = d.indexOf(0);
    return d.subarray(0, nul < 0 ? d.length : nul).toString('utf8');
  }

  nested(type: number): Attrs | undefined {
    const d = this.get(type);
    return d ? Attrs.parse(d) : undefined;
  }
}
