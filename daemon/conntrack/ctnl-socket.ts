// The NETLINK_NETFILTER socket under ConntrackHandle: NetlinkSocket's request/dump exchanges, plus
// batches that put many ctnetlink messages in one sendto and ask for a single ack (errors still come
// back one by one), which is what makes bulk insertion fast.
import * as os from 'node:os';
import { koffi } from '../sys/ffi';
import * as libc from '../sys/libc';
import { setImmediate as nextTurn } from 'node:timers/promises';
import { decodeMessages, encodeMessage, NLMSG_HDRLEN, type NlMsg } from '../netlink/codec';
import { NETLINK_CAP_ACK, NLM_F_ACK, NLM_F_DUMP, NLM_F_DUMP_INTR, NLM_F_REQUEST, NLMSG_DONE, NLMSG_ERROR, NLMSG_NOOP, NLMSG_OVERRUN } from '../netlink/constants';
import { NetlinkError } from '../netlink/netlink-error';
import { decodeError, NetlinkSocket, type NetlinkTransport } from '../netlink/socket';
import { NETLINK_NETFILTER } from './constants';
import { Writer } from './wire';

const ENOBUFS = os.constants.errno.ENOBUFS;
const ETIMEDOUT = os.constants.errno.ETIMEDOUT;
export const SO_RCVBUFFORCE = 33;

export interface CtnlSocketOptions {
  /** Upper bound for any single wait for the kernel, ms. */
  timeoutMs?: number;
  /** Receive buffer, bytes: a batch's error replies must all fit or some are lost. */
  rcvBufBytes?: number;
}

export type BatchResult = 0 | { errno: number; extAck?: string };

export interface BatchMessage {
  type: number;
  flags: number;
  body: Buffer[];
}

type GetSockName = (fd: number, addr: Buffer, len: number[]) => number;
let getsocknameFn: GetSockName | undefined;

/** The kernel-assigned netlink port id of a bound socket (replies are addressed to it). */
export function netlinkPortId(fd: number): number {
  if (!getsocknameFn) {
    getsocknameFn = koffi().load('libc.so.6').func('int getsockname(int, _Out_ void *, _Inout_ uint32_t *)') as unknown as GetSockName;
  }
  const sa = Buffer.alloc(12);
  if (getsocknameFn(fd, sa, [12]) < 0) throw new libc.SysError('getsockname', koffi().errno());
  return sa.readUInt32LE(4);
}

/** Sets a receive buffer beyond net.core.rmem_max when root (SO_RCVBUFFORCE), else as large as allowed. */
export function setRcvBuf(fd: number, bytes: number): void {
  try {
    libc.setsockoptInt(fd, libc.SOL_SOCKET, SO_RCVBUFFORCE, bytes);
  } catch {
    libc.setsockoptInt(fd, libc.SOL_SOCKET, libc.SO_RCVBUF, bytes); // capped at rmem_max without CAP_NET_ADMIN
  }
}

/** Opens and binds a NETLINK_NETFILTER socket in the calling thread's namespace; groups is the bind() group mask. */
export function openNetfilterFd(groups = 0): number {
  const fd = libc.socket(libc.AF_NETLINK, libc.SOCK_RAW | libc.SOCK_CLOEXEC, NETLINK_NETFILTER);
  try {
    const sa = Buffer.alloc(12);
    sa.writeUInt16LE(libc.AF_NETLINK, 0);
    sa.writeUInt32LE(groups >>> 0, 8);
    libc.bind(fd, sa);
    return fd;
  } catch (e) {
    libc.close(fd);
    throw e;
  }
}

export class CtnlSocket {
  readonly nl: NetlinkSocket;
  private readonly transport: NetlinkTransport;
  private readonly portId: number;
  /** Receive buffer; recv() overwrites what it reads, so it needs no zeroing. */
  private readonly rbuf = Buffer.allocUnsafe(1 << 20);
  /** Where batches are assembled (grows to the largest batch). */
  private readonly wbuf = new Writer(64 << 10);
  private seq = (Math.random() * 0x7fffffff) | 0;

  constructor(transport: NetlinkTransport, portId: number) {
    this.transport = transport;
    this.portId = portId;
    this.nl = new NetlinkSocket(transport, portId);
  }

  /** Creates the socket in the calling thread's current network namespace. */
  static open(opts: CtnlSocketOptions = {}): CtnlSocket {
    const fd = openNetfilterFd();
    try {
      libc.setRecvTimeout(fd, opts.timeoutMs ?? 5000);
      setRcvBuf(fd, opts.rcvBufBytes ?? 4 << 20);
      for (const opt of [libc.NETLINK_EXT_ACK, NETLINK_CAP_ACK]) {
        try { libc.setsockoptInt(fd, libc.SOL_NETLINK, opt, 1); } catch { /* older kernel: errno alone still tells */ }
      }
      const transport: NetlinkTransport = {
        send: (msg) => { libc.sendto(fd, msg, null); },
        recv: (buf) => libc.recv(fd, buf),
        close: () => libc.close(fd),
      };
      return new CtnlSocket(transport, netlinkPortId(fd));
    } catch (e) {
      libc.close(fd);
      throw e;
    }
  }

  close(): void {
    this.nl.close();
  }

  get closed(): boolean {
    return this.nl.closed;
  }

  /**
   * A dump read one receive at a time, each message handed to `each` and dropped, with a turn of the
   * event loop every `sliceMsgs` messages: a table of a million entries neither sits in memory as
   * messages nor holds the loop for seconds (sync heartbeats and BFD go on). The kernel keeps the dump's
   * place between receives. Returns false when the kernel flagged the dump as interrupted by concurrent
   * changes (NLM_F_DUMP_INTR: entries may be missing or seen twice), for the caller to start again. No
   * other request may use this socket until it settles.
   */
  async dumpEach(type: number, body: Buffer[], op: string, each: (m: NlMsg) => void, sliceMsgs = 4096): Promise<boolean> {
    return this.dumpEachAt(type, body, op, (buf, start, end, msgType, flags) => {
      each({ type: msgType, flags, seq: 0, pid: this.portId, payload: Buffer.from(buf.subarray(start, end)) });
    }, sliceMsgs);
  }

  /**
   * dumpEach without a message object or a copy per message: `each` gets each message's payload as bytes
   * [start, end) of the receive buffer, valid only during the call (the fast path for large tables).
   */
  async dumpEachAt(type: number, body: Buffer[], op: string, each: (buf: Buffer, start: number, end: number, type: number, flags: number) => void, sliceMsgs = 4096): Promise<boolean> {
    if (this.nl.closed) throw new NetlinkError(op, os.constants.errno.EBADF, undefined, { message: `${op}: netlink socket is closed` });
    this.seq = (this.seq + 1) >>> 0;
    const seq = this.seq;
    this.transport.send(encodeMessage({ type, flags: NLM_F_REQUEST | NLM_F_DUMP, seq, pid: 0 }, body));
    let interrupted = false;
    let sinceYield = 0;
    const buf = this.rbuf;
    for (;;) {
      const n = this.transport.recv(buf);
      if (n < 0) throw new NetlinkError(op, os.constants.errno.ETIMEDOUT, undefined, { message: `${op}: no answer from the kernel within the receive timeout` });
      for (let off = 0; off + NLMSG_HDRLEN <= n; ) {
        const len = buf.readUInt32LE(off);
        if (len < NLMSG_HDRLEN || off + len > n) throw new Error(`malformed netlink message: length ${len} at offset ${off} of ${n}`);
        const at = off;
        off += (len + 3) & ~3;
        if (buf.readUInt32LE(at + 8) !== seq || buf.readUInt32LE(at + 12) !== this.portId) continue;
        const mType = buf.readUInt16LE(at + 4);
        const flags = buf.readUInt16LE(at + 6);
        if (flags & NLM_F_DUMP_INTR) interrupted = true;
        if (mType === NLMSG_DONE) {
          const err = len - NLMSG_HDRLEN >= 4 ? buf.readInt32LE(at + NLMSG_HDRLEN) : 0;
          if (err < 0) throw new NetlinkError(op, -err);
          return !interrupted;
        }
        if (mType === NLMSG_ERROR) {
          const e = decodeError({ type: mType, flags, seq, pid: this.portId, payload: Buffer.from(buf.subarray(at + NLMSG_HDRLEN, at + len)) });
          throw new NetlinkError(op, e.errno || os.constants.errno.EPROTO, e.msg);
        }
        if (mType === NLMSG_NOOP || mType === NLMSG_OVERRUN) continue;
        each(buf, at + NLMSG_HDRLEN, at + len, mType, flags);
        sinceYield++;
      }
      if (sinceYield >= sliceMsgs) {
        sinceYield = 0;
        await nextTurn();
        if (this.nl.closed) throw new NetlinkError(op, os.constants.errno.EBADF, undefined, { message: `${op}: netlink socket closed during the dump` });
      }
    }
  }

  /**
   * Sends msgs in one datagram; only the last asks for an ack, and the kernel answers every failing one
   * with its own error, so one round trip covers the batch. Returns per message 0 or {errno, extAck}.
   */
  batch(msgs: BatchMessage[], op: string): BatchResult[] {
    return this.batchWrite(msgs, (w, m) => {
      for (const part of m.body) w.raw(part);
      return m;
    }, op);
  }

  /** As batch(), with each message's body written by `write` straight into the one datagram: no Buffer per message. */
  batchWrite<T>(items: readonly T[], write: (w: Writer, item: T) => { type: number; flags: number }, op: string): BatchResult[] {
    if (items.length === 0) return [];
    if (this.nl.closed) throw new NetlinkError(op, os.constants.errno.EBADF, undefined, { message: `${op}: netlink socket is closed` });
    const w = this.wbuf;
    w.off = 0;
    const first = (this.seq + 1) >>> 0;
    for (let i = 0; i < items.length; i++) {
      const at = w.msgStart();
      const { type, flags } = write(w, items[i]);
      this.seq = (this.seq + 1) >>> 0;
      w.msgEnd(at, type, NLM_F_REQUEST | (i === items.length - 1 ? NLM_F_ACK : 0) | flags, this.seq);
    }
    const last = this.seq;
    const out: BatchResult[] = new Array(items.length).fill(0);
    this.transport.send(w.buf.subarray(0, w.off));
    w.off = 0;
    for (;;) {
      let n: number;
      try {
        n = this.transport.recv(this.rbuf);
      } catch (e) {
        // Error replies overflowed the receive buffer: which messages failed is unknown.
        if ((e as libc.SysError).errno === ENOBUFS) throw new NetlinkError(op, ENOBUFS, undefined, { cause: e, message: `${op}: replies to a batch of ${items.length} overflowed the receive buffer; outcome unknown` });
        throw e;
      }
      if (n < 0) throw new NetlinkError(op, ETIMEDOUT, undefined, { message: `${op}: no answer from the kernel within the receive timeout` });
      for (const m of decodeMessages(this.rbuf, n)) {
        if (m.pid !== this.portId || m.type !== NLMSG_ERROR) continue;
        const idx = (m.seq - first) >>> 0;
        if (idx >= items.length) continue; // a stale reply to something earlier
        const err = decodeError(m);
        if (err.errno !== 0) out[idx] = { errno: err.errno, extAck: err.msg };
        if (m.seq === last) return out;
      }
    }
  }
}
