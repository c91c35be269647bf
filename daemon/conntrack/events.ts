// ConntrackEvents: conntrack new/update/destroy events of one network namespace, delivered on the main
// thread. The socket is created and subscribed synchronously inside the namespace (so nothing after
// open() is missed); a worker thread does the blocking receive and posts datagrams back, where they are
// decoded. An event overrun (ENOBUFS) is reported as 'overrun' so the caller can resync with a dump.
import { EventEmitter } from 'node:events';
import { Worker } from 'node:worker_threads';
import { NLMSG_HDRLEN, type NlMsg } from '../netlink/codec';
import { NLM_F_CREATE, NLMSG_ERROR, NLMSG_OVERRUN } from '../netlink/constants';
import * as libc from '../sys/libc';
import { inNetns } from '../sys/netns';
import { decodeEntry } from './codec';
import { IPCTNL_MSG, NFNL_SUBSYS_CTNETLINK, NFNLGRP } from './constants';
import { openNetfilterFd, setRcvBuf } from './ctnl-socket';
import { EVENT_READER_SOURCE } from './event-reader';
import { createRing, R, ringDrainAt, type Ring } from './event-ring';
import type { ConntrackEvent, ConntrackEventType } from './types';

export interface ConntrackEventsOptions {
  /** Which events to subscribe to; all three by default. */
  types?: ConntrackEventType[];
  /** Socket receive buffer, bytes (SO_RCVBUFFORCE as root): the burst the kernel can queue before ENOBUFS. */
  rcvBufBytes?: number;
  /** Shared ring between the reader and the main thread, bytes (a burst beyond it waits in the socket buffer). */
  ringBytes?: number;
  /** Longest blocking receive, ms; bounds how long close() waits for the worker. */
  recvTimeoutMs?: number;
}

/** What the reader worker posts. */
export type ReaderMessage =
  /** Datagrams are waiting in the ring. */
  | { kind: 'wake' }
  | { kind: 'overrun'; overruns: number }
  | { kind: 'error'; code?: string; message: string };

/** The reader as ConntrackEvents sees it: a Worker in production, a plain emitter in unit tests. */
export interface Reader {
  on(event: 'message', fn: (m: ReaderMessage) => void): unknown;
  on(event: 'error', fn: (e: Error) => void): unknown;
  on(event: 'exit', fn: (code: number) => void): unknown;
  /** Asks the reader to stop; it must then emit 'exit' (within the receive timeout). */
  stop(): void;
}

/** Datagrams (one event each, as the kernel sends them) taken from the ring per turn of the event loop. */
const DRAIN_SLICE = 1024;

const GROUP_OF: Record<ConntrackEventType, number> = {
  new: NFNLGRP.CONNTRACK_NEW, update: NFNLGRP.CONNTRACK_UPDATE, destroy: NFNLGRP.CONNTRACK_DESTROY,
};

/** The event type of one ctnetlink message: NEW with NLM_F_CREATE is a new entry, NEW without is an update. */
export function eventTypeOf(m: Pick<NlMsg, 'type' | 'flags'>): ConntrackEventType | undefined {
  if (m.type >> 8 !== NFNL_SUBSYS_CTNETLINK) return undefined;
  const msg = m.type & 0xff;
  if (msg === IPCTNL_MSG.CT_DELETE) return 'destroy';
  if (msg === IPCTNL_MSG.CT_NEW) return m.flags & NLM_F_CREATE ? 'new' : 'update';
  return undefined;
}

export interface ConntrackEvents {
  on(event: 'event', fn: (e: ConntrackEvent) => void): this;
  /**
   * The undecoded payload of each event (nfgenmsg + ctnetlink attributes), for callers that transcode it
   * themselves (the sync sender); the buffer is only valid during the call. With only 'raw' listeners,
   * events are not decoded at all.
   */
  on(event: 'raw', fn: (type: ConntrackEventType, payload: Buffer) => void): this;
  /** Events were lost (kernel ENOBUFS, or a message that could not be decoded): resync with a dump. */
  on(event: 'overrun', fn: (info: { overruns: number; reason: string }) => void): this;
  /** The reader stopped for good (e.g. the socket failed); no more events will come. */
  on(event: 'error', fn: (e: Error) => void): this;
}

/**
 * The undecoded payload of one event, as bytes [start, end) of `buf` (nfgenmsg + ctnetlink attributes),
 * valid only during the call. See ConntrackEvents.sink.
 */
export type PayloadSink = (type: ConntrackEventType, buf: Buffer, start: number, end: number) => void;

const MSG_NEW = (NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG.CT_NEW;
const MSG_DELETE = (NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG.CT_DELETE;

export class ConntrackEvents extends EventEmitter {
  private readonly reader: Reader;
  private payloadSink: PayloadSink | undefined;
  private readonly exited: Promise<void>;
  private overruns = 0;
  private closing = false;
  private drainScheduled = false;
  /** Events delivered so far (all types). */
  received = 0;

  /** Wraps a reader and the ring it fills; open() is the production entry point, tests pass a fake reader. */
  constructor(reader: Reader, onExit: () => void, private readonly ring: Ring) {
    super();
    this.reader = reader;
    this.exited = new Promise((resolve) => {
      reader.on('exit', () => { onExit(); resolve(); });
    });
    reader.on('message', (m) => this.onMessage(m));
    reader.on('error', (e) => { if (!this.closing) this.emit('error', e); });
  }

  /** Subscribes in the namespace at nsPath (the daemon's own when undefined); events after this call are seen. */
  static open(nsPath?: string, opts: ConntrackEventsOptions = {}): ConntrackEvents {
    const types = opts.types ?? ['new', 'update', 'destroy'];
    const groups = types.reduce((mask, t) => mask | (1 << (GROUP_OF[t] - 1)), 0);
    const make = () => openNetfilterFd(groups);
    const fd = nsPath ? inNetns(nsPath, make) : make();
    try {
      setRcvBuf(fd, opts.rcvBufBytes ?? 16 << 20);
      libc.setRecvTimeout(fd, opts.recvTimeoutMs ?? 200);
    } catch (e) {
      libc.close(fd);
      throw e;
    }
    const stop = new Int32Array(new SharedArrayBuffer(4));
    const ring = createRing(opts.ringBytes ?? 8 << 20);
    // execArgv [] so the worker does not inherit loaders such as tsx: it runs plain JavaScript.
    const worker = new Worker(EVENT_READER_SOURCE, { eval: true, execArgv: [], workerData: { fd, stop, bufBytes: 1 << 16, ctrl: ring.ctrl, data: ring.data } });
    const reader: Reader = Object.assign(worker, {
      stop: () => {
        Atomics.store(stop, 0, 1);
        Atomics.notify(ring.ctrl, R);
      },
    });
    // The fd is closed only after the worker has left its read loop, so it is never reused under it.
    return new ConntrackEvents(reader, () => libc.close(fd), ring);
  }

  /**
   * The hot path for callers that transcode events themselves (the sync sender): `fn` is called directly
   * (not through the emitter, and with no Buffer made per event) with each event's payload as a range of
   * the shared ring. One sink at a time; it replaces the previous one. 'raw' and 'event' listeners still
   * get their events too.
   */
  sink(fn: PayloadSink | undefined): void {
    this.payloadSink = fn;
  }

  /** Stops the worker and closes the socket; resolves within about the receive timeout. Idempotent. */
  close(): Promise<void> {
    this.closing = true;
    this.reader.stop();
    return this.exited;
  }

  private onMessage(m: ReaderMessage): void {
    if (this.closing) return;
    if (m.kind === 'overrun') return this.overrun('kernel dropped events (ENOBUFS)');
    if (m.kind === 'error') {
      this.emit('error', new Error(`conntrack event socket failed: ${m.message}`));
      return;
    }
    this.drain();
  }

  /**
   * Takes a bounded slice of the ring per turn of the event loop: listeners (the sync sender) get to send
   * what they were given before the next slice, so a burst's decoded entries die young instead of all
   * waiting in memory at once (which made garbage collection a large share of the work).
   */
  private drain(): void {
    if (this.closing) return;
    // Which consumers there are is looked up once per slice, not per event.
    const raw = this.listenerCount('raw') > 0;
    const decoded = this.listenerCount('event') > 0;
    const { more } = ringDrainAt(this.ring, (buf, off, len) => this.onDatagram(buf, off, off + len, raw, decoded), DRAIN_SLICE);
    if (more && !this.drainScheduled) {
      this.drainScheduled = true;
      setImmediate(() => {
        this.drainScheduled = false;
        this.drain();
      });
    }
  }

  /** The events of one datagram, bytes [off, end) of d, handed on in place (the bytes are not kept). */
  private onDatagram(d: Buffer, off: number, end: number, raw: boolean, decoded: boolean): void {
    while (off < end) {
      if (end - off < NLMSG_HDRLEN) return this.overrun(`undecodable event datagram: ${end - off} trailing bytes`);
      const len = d.readUInt32LE(off);
      if (len < NLMSG_HDRLEN || off + len > end) return this.overrun(`undecodable event datagram: malformed netlink message: length ${len} at offset ${off} of ${end}`);
      const msgType = d.readUInt16LE(off + 4);
      const flags = d.readUInt16LE(off + 6);
      const start = off + NLMSG_HDRLEN;
      const stop = off + len;
      off += (len + 3) & ~3;
      if (msgType === NLMSG_OVERRUN || msgType === NLMSG_ERROR) continue;
      const type: ConntrackEventType | undefined = msgType === MSG_DELETE ? 'destroy' : msgType === MSG_NEW ? (flags & NLM_F_CREATE ? 'new' : 'update') : undefined;
      if (!type) continue;
      this.received++;
      if (this.payloadSink) this.payloadSink(type, d, start, stop);
      if (!raw && !decoded) continue;
      const payload = d.subarray(start, stop);
      if (raw) this.emit('raw', type, payload);
      if (!decoded) continue;
      let entry;
      try {
        entry = decodeEntry(payload);
      } catch (e) {
        this.received--;
        this.overrun(`undecodable ${type} event: ${(e as Error).message}`);
        continue;
      }
      this.emit('event', { type, entry } satisfies ConntrackEvent);
    }
  }

  private overrun(reason: string): void {
    this.overruns++;
    this.emit('overrun', { overruns: this.overruns, reason });
  }
}
