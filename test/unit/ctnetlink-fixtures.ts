// Shared by the ctnetlink codec, event ring and sync transcoding tests (no tests here): payloads captured
// from the kernel, kernel-shaped payloads built from an entry (attributes in the order and form a kernel
// event or dump carries them), and the event reader's ring producer.
import { IPS, type ConntrackEntry } from '../../daemon/conntrack';
import { nfgenmsg, writeTuple } from '../../daemon/conntrack/codec';
import { CTA, CTA_PROTOINFO_TCP } from '../../daemon/conntrack/constants';
import { RING_PRODUCER_SOURCE } from '../../daemon/conntrack/event-ring';
import { Writer } from '../../daemon/conntrack/wire';

// IPCTNL_MSG_CT_NEW payloads from a dump on kernel 6.18 (after inserting these entries with ConntrackHandle).
export const KERNEL_TCP_SNAT = '020000003400018014000180080001000a000002080002000a0900011c0002800500010006000000060002009c400000060003001f9000003400028014000180080001000a090001080002000a6300011c0002800500010006000000060002001f900000060003005ba00000080003000000019e080008000000000008000c006e6b551308000b0000000001080007000006977e300004802c000180050001000300000005000200070000000500030007000000060004000300000006000500030000001c001880080001000000000008000200000000000800030000000000';
export const KERNEL_UDP6_SNAT = '0a0000004c0001802c00018014000300fd00000000000000000000000000000214000400fd0000090000000000000000000000011c00028005000100110000000600020014e9000006000300003500004c0002802c00018014000300fd00000900000000000000000000000114000400fd0000990000000000000000000000011c000280050001001100000006000200003500000600030061a80000080003000000019a080008000000000008000c008a23d19208000b0000000001080007000000001d1c001880080001000000000008000200000000000800030000000000';

export const tcpSnat: ConntrackEntry = {
  orig: { family: 4, proto: 6, src: '10.0.0.2', dst: '10.9.0.1', sport: 40000, dport: 8080 },
  reply: { family: 4, proto: 6, src: '10.9.0.1', dst: '10.99.0.1', sport: 8080, dport: 23456 },
  status: IPS.SEEN_REPLY | IPS.ASSURED | IPS.CONFIRMED | IPS.SRC_NAT | IPS.SRC_NAT_DONE | IPS.DST_NAT_DONE,
  timeout: 431998, mark: 0, tcp: { state: 3, wscaleOrig: 7, wscaleReply: 7, flagsOrig: 0x23, flagsReply: 0x23 },
};

/** The attributes of a kernel event or dump message for `e`. */
export function kernelShape(e: ConntrackEntry): Buffer {
  const w = new Writer(64);
  w.raw(nfgenmsg(e.orig.family));
  writeTuple(w, CTA.TUPLE_ORIG, e.orig);
  writeTuple(w, CTA.TUPLE_REPLY, e.reply);
  w.be32(CTA.STATUS, e.status);
  if (e.timeout !== undefined) w.be32(CTA.TIMEOUT, e.timeout);
  if (e.mark !== undefined) w.be32(CTA.MARK, e.mark);
  if (e.zone !== undefined) w.be16(CTA.ZONE, e.zone);
  if (e.id !== undefined) w.be32(CTA.ID, e.id);
  if (e.tcp) {
    const p = w.start(CTA.PROTOINFO);
    const t = w.start(CTA_PROTOINFO_TCP);
    w.u8(1, e.tcp.state);
    w.u8(2, e.tcp.wscaleOrig!);
    w.u8(3, e.tcp.wscaleReply!);
    w.bytes(4, Buffer.from([e.tcp.flagsOrig!, 0]));
    w.bytes(5, Buffer.from([e.tcp.flagsReply!, 0]));
    w.end(t);
    w.end(p);
  }
  return w.take();
}

/** The event reader worker's ringPut, from the very source text the worker runs. */
export const ringPut = new Function(`${RING_PRODUCER_SOURCE}; return ringPut;`)() as (ctrl: Int32Array, data: Uint8Array, bytes: Uint8Array, n: number) => 'woke' | 'ok' | 'full';
