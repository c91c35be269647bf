// NetlinkSocket: one NETLINK_ROUTE socket doing synchronous request/ack and dump exchanges.
// The socket belongs to the namespace it was created in, so open() may run inside inNetns and the
// socket is then used from the daemon's own namespace. Every wait is bounded by SO_RCVTIMEO.
import * as os from 'node:os';
import { koffi } from '../sys/ffi';
import * as libc from '../sys/libc';
import { Attrs, decodeMessages, encodeMessage, NlMsg, NLMSG_HDRLEN } from './codec';
import {
  NETLINK_CAP_ACK, NETLINK_ROUTE, NLM_F_ACK, NLM_F_ACK_TLVS, NLM_F_CAPPED, NLM_F_DUMP, NLM_F_DUMP_INTR, NLM_F_REQUEST,
  NLMSG_DONE, NLMSG_ERROR, NLMSG_NOOP, NLMSG_OVERRUN, NLMSGERR_ATTR_MSG,
} from './constants';
import { NetlinkError } from './netlink-error';

const EINTR = os.constants.errno.EINTR;
const ETIMEDOUT = os.constants.errno.ETIMEDOUT;
const EBADF = os.constants.errno.EBADF;
const EPROTO = os.constants.errno.EPROTO;

export interface NetlinkSocketOptions {
  /** Upper bound for any single wait for the kernel, ms. */
  timeoutMs?: number;
  /** How many times an interrupted dump (NLM_F_DUMP_INTR) is restarted before giving up. */
  dumpRetries?: number;
}

type GetSockName = (fd: number, addr: Buffer, len: number[]) => number;
let getsocknameFn: GetSockName | undefined;

function portIdOf(fd: number): number {
  if (!getsocknameFn) {
    getsocknameFn = koffi().load('libc.so.6').func('int getsockname(int, _Out_ void *, _Inout_ uint32_t *)') as unknown as GetSockName;
  }
  const sa = Buffer.alloc(12);
  const len = [12];
  if (getsocknameFn(fd, sa, len) < 0) throw new libc.SysError('getsockname', koffi().errno());
  return sa.readUInt32LE(4);
}

/** The datagram channel under a NetlinkSocket; the libc one in production, a fake kernel in unit tests. */
export interface NetlinkTransport {
  send(msg: Buffer): void;
  /** Fills buf with one datagram and returns its length, or -1 when the receive timeout expired. */
  recv(buf: Buffer): number;
  close(): void;
}

function fdTransport(fd: number): NetlinkTransport {
  return {
    send: (msg) => { libc.sendto(fd, msg, null); },
    recv: (buf) => libc.recv(fd, buf),
    close: () => libc.close(fd),
  };
}

export class NetlinkSocket {
  private transport: NetlinkTransport | undefined;
  readonly portId: number;
  private seq: number;
  /** Receive buffer; recv() overwrites what it reads, so it needs no zeroing. */
  private readonly rbuf = Buffer.allocUnsafe(1 << 20);
  private readonly dumpRetries: number;

  /** Wraps an already bound transport whose kernel-assigned port id is portId (tests use this directly). */
  constructor(transport: NetlinkTransport, portId: number, dumpRetries = 5) {
    this.transport = transport;
    this.portId = portId;
    this.dumpRetries = dumpRetries;
    // Random start so replies meant for an earlier socket reusing this port id never match.
    this.seq = (Math.random() * 0x7fffffff) | 0;
  }

  /** Creates the socket in the calling thread's current network namespace. */
  static open(opts: NetlinkSocketOptions = {}): NetlinkSocket {
    const fd = libc.socket(libc.AF_NETLINK, libc.SOCK_RAW | libc.SOCK_CLOEXEC, NETLINK_ROUTE);
    try {
      const sa = Buffer.alloc(12);
      sa.writeUInt16LE(libc.AF_NETLINK, 0);
      libc.bind(fd, sa);
      libc.setRecvTimeout(fd, opts.timeoutMs ?? 5000);
      // Extended acks give the kernel's reason in words; capped acks keep error replies small.
      // Both are best effort: without them errors still carry errno.
      for (const opt of [libc.NETLINK_EXT_ACK, NETLINK_CAP_ACK]) {
        try { libc.setsockoptInt(fd, libc.SOL_NETLINK, opt, 1); } catch { /* older kernel: informative only */ }
      }
      return new NetlinkSocket(fdTransport(fd), portIdOf(fd), opts.dumpRetries ?? 5);
    } catch (e) {
      libc.close(fd);
      throw e;
    }
  }

  get closed(): boolean {
    return this.transport === undefined;
  }

  /** Idempotent. */
  close(): void {
    const t = this.transport;
    this.transport = undefined;
    t?.close();
  }

  /**
   * Sends one request with NLM_F_ACK and returns the messages the kernel answered before the ack
   * (e.g. the RTM_NEWLINK of a get). Throws NetlinkError naming `op` when the kernel refuses.
   */
  request(type: number, flags: number, body: Buffer[], op: string): NlMsg[] {
    const seq = this.send(type, NLM_F_REQUEST | NLM_F_ACK | flags, body, op);
    const replies: NlMsg[] = [];
    for (;;) {
      for (const m of this.receive(op)) {
        if (m.seq !== seq || m.pid !== this.portId) continue; // late reply to an earlier, timed-out request
        if (m.type === NLMSG_ERROR) {
          const err = decodeError(m);
          if (err.errno !== 0) throw new NetlinkError(op, err.errno, err.msg);
          return replies;
        }
        if (m.type === NLMSG_NOOP) continue;
        replies.push(m);
      }
    }
  }

  /** Runs a dump to NLMSG_DONE, restarting when the kernel marks it interrupted by a concurrent change. */
  dump(type: number, body: Buffer[], op: string): NlMsg[] {
    for (let attempt = 0; attempt <= this.dumpRetries; attempt++) {
      const seq = this.send(type, NLM_F_REQUEST | NLM_F_DUMP, body, op);
      const out: NlMsg[] = [];
      let interrupted = false;
      let done = false;
      while (!done) {
        for (const m of this.receive(op)) {
          if (m.seq !== seq || m.pid !== this.portId) continue;
          if (m.flags & NLM_F_DUMP_INTR) interrupted = true;
          if (m.type === NLMSG_DONE) {
            const err = m.payload.length >= 4 ? m.payload.readInt32LE(0) : 0;
            if (err < 0) throw new NetlinkError(op, -err);
            done = true;
            break;
          }
          if (m.type === NLMSG_ERROR) {
            const e = decodeError(m);
            throw new NetlinkError(op, e.errno || EPROTO, e.msg);
          }
          if (m.type === NLMSG_NOOP || m.type === NLMSG_OVERRUN) continue;
          out.push(m);
        }
      }
      if (!interrupted) return out;
    }
    throw new NetlinkError(op, EINTR, undefined, {
      message: `${op}: dump interrupted ${this.dumpRetries + 1} times in a row by concurrent changes; giving up`,
    });
  }

  private send(type: number, flags: number, body: Buffer[], op: string): number {
    if (!this.transport) throw new NetlinkError(op, EBADF, undefined, { message: `${op}: netlink socket is closed` });
    this.seq = (this.seq + 1) >>> 0;
    this.transport.send(encodeMessage({ type, flags, seq: this.seq, pid: 0 }, body));
    return this.seq;
  }

  private receive(op: string): NlMsg[] {
    if (!this.transport) throw new NetlinkError(op, EBADF, undefined, { message: `${op}: netlink socket is closed` });
    const n = this.transport.recv(this.rbuf);
    if (n < 0) throw new NetlinkError(op, ETIMEDOUT, undefined, { message: `${op}: no answer from the kernel within the receive timeout` });
    return decodeMessages(this.rbuf, n);
  }
}

/** Decodes struct nlmsgerr and, when present, the extended-ack message TLV after it. */
export function decodeError(m: NlMsg): { errno: number; msg?: string } {
  const p = m.payload;
  if (p.length < 4) return { errno: EPROTO };
  const errno = -p.readInt32LE(0);
  // The echoed request is cut to its header when capped; otherwise the whole request is echoed.
  let tlvStart = 4 + NLMSG_HDRLEN;
  if (!(m.flags & NLM_F_CAPPED) && p.length >= 4 + NLMSG_HDRLEN) tlvStart = 4 + ((p.readUInt32LE(4) + 3) & ~3);
  let msg: string | undefined;
  if (m.flags & NLM_F_ACK_TLVS && tlvStart < p.length) {
    try {
      msg = Attrs.parse(p, tlvStart).str(NLMSGERR_ATTR_MSG);
    } catch {
      msg = undefined; // malformed TLVs only lose the text, never the errno
    }
  }
  return { errno, msg };
}
