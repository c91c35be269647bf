// ctnetlink codec without a kernel: decoding messages captured from kernel 6.18, the shape of a create
// (un-NATed reply + CTA_NAT_SRC with exact address and port, CONFIRMED, TCP flags with a full mask),
// round trips incl. IPv6 and ICMP, batched error matching, and event decoding/overrun with a fake reader.
import { EventEmitter } from 'node:events';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { IPS, type ConntrackEntry, type ConntrackEvent } from '../../daemon/conntrack';
import { decodeEntry, encodeCreate, encodeUpdate, formatTuple, natOf, nfgenmsg } from '../../daemon/conntrack/codec';
import { CTA, CTA_IP, CTA_NAT, CTA_PROTONAT, CTA_PROTOINFO_TCP, CTA_TUPLE, CTA_PROTO, IP_CT_TCP_FLAG, ctMsgType, IPCTNL_MSG } from '../../daemon/conntrack/constants';
import { CtnlSocket } from '../../daemon/conntrack/ctnl-socket';
import { ConntrackEvents, eventTypeOf, type Reader, type ReaderMessage } from '../../daemon/conntrack/events';
import { Attrs, decodeMessages, encodeMessage } from '../../daemon/netlink/codec';
import { NLM_F_CREATE, NLM_F_EXCL, NLMSG_ERROR, NLM_F_ACK } from '../../daemon/netlink/constants';
import type { NetlinkTransport } from '../../daemon/netlink/socket';
import { KERNEL_TCP_SNAT, KERNEL_UDP6_SNAT, kernelShape, ringPut, tcpSnat } from './ctnetlink-fixtures';
import { createRing } from '../../daemon/conntrack/event-ring';

test('decodes captured kernel messages: IPv4 TCP with SNAT and protoinfo, IPv6 UDP with SNAT', () => {
  const e = decodeEntry(Buffer.from(KERNEL_TCP_SNAT, 'hex'));
  assert.equal(e.orig, tcpSnat.orig);
  assert.equal(e.reply, tcpSnat.reply);
  assert.is(e.status, 0x19e);
  assert.ok(e.status & IPS.SRC_NAT);
  assert.is(e.timeout, 431998);
  assert.is(e.mark, 0);
  assert.equal(e.tcp, { state: 3, wscaleOrig: 7, wscaleReply: 7, flagsOrig: 3, flagsReply: 3 });
  assert.type(e.id, 'number');
  const six = decodeEntry(Buffer.from(KERNEL_UDP6_SNAT, 'hex'));
  assert.equal(six.orig, { family: 6, proto: 17, src: 'fd00::2', dst: 'fd00:9::1', sport: 5353, dport: 53 });
  assert.equal(six.reply, { family: 6, proto: 17, src: 'fd00:9::1', dst: 'fd00:99::1', sport: 53, dport: 25000 });
  assert.is(six.tcp, undefined);
  assert.ok(six.status & IPS.SRC_NAT);
});

test('a create carries the un-NATed reply and CTA_NAT_SRC with the exact floating address and port', () => {
  const [body] = encodeCreate(tcpSnat);
  assert.equal([...body.subarray(0, 4)], [2, 0, 0, 0], 'nfgenmsg AF_INET, version 0');
  const a = Attrs.parse(body, 4);
  // Only the un-NATed reply makes the kernel's NAT setup see a change and set IPS_SRC_NAT.
  const reply = decodeEntry(Buffer.concat([nfgenmsg(4), ...a.list.filter((x) => x.type === CTA.TUPLE_ORIG || x.type === CTA.TUPLE_REPLY).map((x) => {
    const h = Buffer.alloc(4); h.writeUInt16LE(x.data.length + 4, 0); h.writeUInt16LE(x.type | 0x8000, 2); return Buffer.concat([h, x.data]);
  })])).reply;
  assert.equal(reply, { family: 4, proto: 6, src: '10.9.0.1', dst: '10.0.0.2', sport: 8080, dport: 40000 });
  const nat = a.nested(CTA.NAT_SRC)!;
  assert.equal([...nat.get(CTA_NAT.V4_MINIP)!], [10, 99, 0, 1]);
  assert.equal([...nat.get(CTA_NAT.V4_MAXIP)!], [10, 99, 0, 1]);
  const ports = nat.nested(CTA_NAT.PROTO)!;
  assert.is(ports.get(CTA_PROTONAT.PORT_MIN)!.readUInt16BE(0), 23456);
  assert.is(ports.get(CTA_PROTONAT.PORT_MAX)!.readUInt16BE(0), 23456);
  assert.not.ok(a.has(CTA.NAT_DST));
  const status = a.get(CTA.STATUS)!.readUInt32BE(0);
  assert.is(status, IPS.SEEN_REPLY | IPS.ASSURED | IPS.CONFIRMED, 'CONFIRMED always; NAT bits come from CTA_NAT_SRC');
  assert.is(a.get(CTA.TIMEOUT)!.readUInt32BE(0), 431998);
  const tcp = a.nested(CTA.PROTOINFO)!.nested(CTA_PROTOINFO_TCP)!;
  assert.equal([...tcp.get(4)!], [0x23 & ~IP_CT_TCP_FLAG.MAXACK_SET, 0xff], 'flags with a full mask, MAXACK_SET dropped');
  assert.is(tcp.u8(2), 7);
});

test('entries without NAT send their reply as is; DNAT gets CTA_NAT_DST; updates never carry NAT', () => {
  const plain: ConntrackEntry = {
    orig: { family: 4, proto: 17, src: '10.0.0.2', dst: '10.9.0.1', sport: 5000, dport: 53 },
    reply: { family: 4, proto: 17, src: '10.9.0.1', dst: '10.0.0.2', sport: 53, dport: 5000 }, status: 0,
  };
  assert.equal(natOf(plain), { src: false, dst: false });
  const a = Attrs.parse(encodeCreate(plain)[0], 4);
  assert.not.ok(a.has(CTA.NAT_SRC) || a.has(CTA.NAT_DST));
  assert.is(a.get(CTA.TIMEOUT)!.readUInt32BE(0), 120, 'a create always has a timeout');
  const dnat: ConntrackEntry = { ...plain, reply: { ...plain.reply, src: '10.5.0.7', sport: 5353 } };
  assert.equal(natOf(dnat), { src: false, dst: true });
  const d = Attrs.parse(encodeCreate(dnat)[0], 4).nested(CTA.NAT_DST)!;
  assert.equal([...d.get(CTA_NAT.V4_MINIP)!], [10, 5, 0, 7]);
  assert.is(d.nested(CTA_NAT.PROTO)!.get(CTA_PROTONAT.PORT_MIN)!.readUInt16BE(0), 5353);
  const u = Attrs.parse(encodeUpdate(tcpSnat, IPS.SEEN_REPLY)[0], 4);
  assert.not.ok(u.has(CTA.NAT_SRC) || u.has(CTA.TUPLE_REPLY));
  assert.is(u.get(CTA.STATUS)!.readUInt32BE(0) & IPS.CONFIRMED, IPS.CONFIRMED);
});

/** An entry as the kernel would send it, for round trips. */
test('round trips: IPv6 TCP with protoinfo, zone and id; ICMP echo; the writer grows past its first buffer', () => {
  const v6: ConntrackEntry = {
    orig: { family: 6, proto: 6, src: '2001:db8::2', dst: '2001:db8:9::1', sport: 1, dport: 65535 },
    reply: { family: 6, proto: 6, src: '2001:db8:9::1', dst: '2001:db8:99::1', sport: 65535, dport: 20000 },
    status: 0x19e, timeout: 10, mark: 0xffffffff, zone: 7, id: 0x80000001,
    tcp: { state: 3, wscaleOrig: 14, wscaleReply: 0, flagsOrig: 0x03, flagsReply: 0x01 },
  };
  assert.equal(decodeEntry(kernelShape(v6)), v6);
  const ping: ConntrackEntry = {
    orig: { family: 4, proto: 1, src: '10.0.0.2', dst: '192.0.2.1', icmpId: 4242, icmpType: 8, icmpCode: 0 },
    reply: { family: 4, proto: 1, src: '192.0.2.1', dst: '10.99.0.1', icmpId: 777, icmpType: 0, icmpCode: 0 }, status: 0,
  };
  assert.equal(decodeEntry(kernelShape(ping)), ping);
  assert.equal(natOf(ping), { src: true, dst: false });
  const nat = Attrs.parse(encodeCreate(ping)[0], 4).nested(CTA.NAT_SRC)!;
  assert.is(nat.nested(CTA_NAT.PROTO)!.get(CTA_PROTONAT.PORT_MIN)!.readUInt16BE(0), 777, 'the NATed echo id travels');
  const ip = Attrs.parse(encodeCreate(ping)[0], 4).nested(CTA.TUPLE_ORIG)!;
  assert.is(ip.nested(CTA_TUPLE.PROTO)!.get(CTA_PROTO.ICMP_ID)!.readUInt16BE(0), 4242);
  assert.equal([...ip.nested(CTA_TUPLE.IP)!.get(CTA_IP.V4_DST)!], [192, 0, 2, 1]);
});

test('malformed input fails with an error instead of looping or returning half an entry', () => {
  assert.throws(() => decodeEntry(Buffer.from([2, 0])), /shorter than nfgenmsg/);
  assert.throws(() => decodeEntry(Buffer.from([2, 0, 0, 0, 0xff, 0, 1, 0])), /malformed ctnetlink attribute/);
  assert.throws(() => decodeEntry(nfgenmsg(4)), /without original and reply/);
});

test('tuples print as in errors and logs', () => {
  assert.is(formatTuple(tcpSnat.orig), 'tcp 10.0.0.2:40000 → 10.9.0.1:8080');
  assert.is(formatTuple({ family: 6, proto: 17, src: 'fd00::1', dst: 'fd00::2', sport: 53, dport: 53 }), 'udp [fd00::1]:53 → [fd00::2]:53');
  assert.is(formatTuple({ family: 4, proto: 1, src: '10.0.0.1', dst: '10.0.0.2', icmpId: 7 }), 'icmp 10.0.0.1 → 10.0.0.2 id 7');
});

function ackFor(seq: number, pid: number, errno: number): Buffer {
  const e = Buffer.alloc(4 + 16);
  e.writeInt32LE(-errno);
  return encodeMessage({ type: NLMSG_ERROR, flags: 0x100, seq, pid }, [e]);
}

test('a batch asks one ack and matches each error reply to its message; stale replies are skipped', () => {
  const queue: Buffer[] = [];
  let sentFlags: number[] = [];
  const t: NetlinkTransport = {
    send(msg) {
      const ms = decodeMessages(msg);
      sentFlags = ms.map((m) => m.flags);
      // The kernel answers failing messages 1 and 3 (EEXIST), then acks the last; plus a stale reply.
      queue.push(Buffer.concat([ackFor(ms[0].seq - 5, 9, 17), ackFor(ms[1].seq, 9, 17), ackFor(ms[3].seq, 9, 17), ackFor(ms[4].seq, 9, 0)]));
    },
    recv(buf) { const d = queue.shift(); if (!d) return -1; d.copy(buf); return d.length; },
    close() {},
  };
  const s = new CtnlSocket(t, 9);
  const msg = { type: ctMsgType(IPCTNL_MSG.CT_NEW), flags: NLM_F_CREATE | NLM_F_EXCL, body: encodeCreate(tcpSnat) };
  const r = s.batch([msg, msg, msg, msg, msg], 'batch');
  assert.equal(r.map((x) => (x === 0 ? 0 : x.errno)), [0, 17, 0, 17, 0]);
  assert.equal(sentFlags.map((f) => f & NLM_F_ACK), [0, 0, 0, 0, NLM_F_ACK]);
  assert.throws(() => new CtnlSocket({ ...t, send() {} }, 9).batch([msg], 'IPCTNL_MSG_CT_NEW batch of 1'), /IPCTNL_MSG_CT_NEW batch of 1: no answer/);
});

/** The worker's side, as the real reader does it: datagrams into the shared ring, a wake-up when due. */
class FakeReader extends EventEmitter implements Reader {
  readonly ring = createRing(64 << 10);
  stopped = 0;
  stop(): void {
    this.stopped++;
    setImmediate(() => this.emit('exit', 0));
  }
  post(m: ReaderMessage): void {
    this.emit('message', m);
  }
  datagram(bytes: Uint8Array): void {
    if (ringPut(this.ring.ctrl, this.ring.data, bytes, bytes.length) === 'woke') this.post({ kind: 'wake' });
  }
}

function eventDatagram(type: 'new' | 'update' | 'destroy', e: ConntrackEntry): Uint8Array {
  const msgType = ctMsgType(type === 'destroy' ? IPCTNL_MSG.CT_DELETE : IPCTNL_MSG.CT_NEW);
  const flags = type === 'new' ? NLM_F_CREATE | NLM_F_EXCL : 0;
  return new Uint8Array(encodeMessage({ type: msgType, flags, seq: 0, pid: 0 }, [kernelShape(e)]));
}

test('events: datagrams become typed events; ENOBUFS and undecodable data are overruns; close waits for the reader', async () => {
  const r = new FakeReader();
  let closedFd = 0;
  const ev = new ConntrackEvents(r, () => closedFd++, r.ring);
  const seen: ConntrackEvent[] = [];
  const overruns: Array<{ overruns: number; reason: string }> = [];
  ev.on('event', (e) => seen.push(e));
  ev.on('overrun', (o) => overruns.push(o));
  const plain = { ...tcpSnat, tcp: { state: 3, wscaleOrig: 7, wscaleReply: 7, flagsOrig: 3, flagsReply: 3 } };
  const two = Buffer.concat([eventDatagram('new', plain), eventDatagram('update', plain)]);
  r.datagram(new Uint8Array(two));
  r.datagram(eventDatagram('destroy', plain));
  assert.equal(seen.map((e) => e.type), ['new', 'update', 'destroy']);
  assert.equal(seen[0].entry, plain);
  r.post({ kind: 'overrun', overruns: 1 });
  r.datagram(new Uint8Array([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17]));
  r.datagram(new Uint8Array(encodeMessage({ type: ctMsgType(0), flags: NLM_F_CREATE, seq: 0, pid: 0 }, [nfgenmsg(4)])));
  assert.is(overruns.length, 3);
  assert.match(overruns[0].reason, /ENOBUFS/);
  assert.match(overruns[1].reason, /undecodable event datagram/);
  assert.match(overruns[2].reason, /undecodable new event/);
  assert.is(ev.received, 3);
  const errors: Error[] = [];
  ev.on('error', (e) => errors.push(e));
  r.post({ kind: 'error', code: 'EBADF', message: 'EBADF: bad file descriptor' });
  assert.match(errors[0].message, /conntrack event socket failed: EBADF/);
  await ev.close();
  await ev.close();
  assert.is(closedFd, 1);
  r.datagram(eventDatagram('new', plain));
  assert.is(seen.length, 3, 'nothing is delivered after close');
});

test('event type comes from message type and NLM_F_CREATE', () => {
  const m = (type: number, flags: number) => ({ type, flags, seq: 0, pid: 0, payload: Buffer.alloc(0) });
  assert.is(eventTypeOf(m(0x100, NLM_F_CREATE | NLM_F_EXCL)), 'new');
  assert.is(eventTypeOf(m(0x100, 0)), 'update');
  assert.is(eventTypeOf(m(0x102, 0)), 'destroy');
  assert.is(eventTypeOf(m(0x200, 0)), undefined, 'expectation subsystem is not conntrack');
});

test.run();
