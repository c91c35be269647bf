// Pure encoding/decoding tests for the rtnetlink codec: framing, attributes, fixed headers, addresses,
// route/link decoding from hand-built messages, and NLMSG_ERROR with extended ack.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { align4, attr, attrStr, attrU32, Attrs, decodeMessages, encodeMessage, nested, NLA_F_NESTED } from '../../daemon/netlink/codec';
import { NLM_F_ACK_TLVS, NLM_F_CAPPED, NLMSG_ERROR, RTA, RTAX_MTU, IFLA, IFLA_INFO_KIND } from '../../daemon/netlink/constants';
import { decodeError } from '../../daemon/netlink/socket';
import { decodeRoute, encodeRoute } from '../../daemon/netlink/routes';
import { decodeLink } from '../../daemon/netlink/links';
import * as s from '../../daemon/netlink/structs';
import { NetlinkError, isNetlinkError } from '../../daemon/netlink/netlink-error';

test('align4', () => {
  assert.equal([0, 1, 3, 4, 5, 8].map(align4), [0, 4, 4, 4, 8, 8]);
});

test('message header round trip and length', () => {
  const m = encodeMessage({ type: 24, flags: 0x605, seq: 0xfffffffe, pid: 7 }, [attrU32(15, 100)]);
  assert.is(m.length, 16 + 8);
  assert.is(m.readUInt32LE(0), 24);
  const [d] = decodeMessages(m);
  assert.equal({ type: d.type, flags: d.flags, seq: d.seq, pid: d.pid }, { type: 24, flags: 0x605, seq: 0xfffffffe, pid: 7 });
  assert.is(d.payload.length, 8);
});

test('several messages in one datagram, and a malformed length throws', () => {
  const a = encodeMessage({ type: 16, flags: 2, seq: 1, pid: 0 }, [attrStr(3, 'abc')]);
  const b = encodeMessage({ type: 3, flags: 2, seq: 1, pid: 0 }, [Buffer.alloc(4)]);
  const ms = decodeMessages(Buffer.concat([a, b]));
  assert.equal(ms.map((m) => m.type), [16, 3]);
  const bad = Buffer.from(a);
  bad.writeUInt32LE(1000, 0);
  assert.throws(() => decodeMessages(bad), /malformed/);
});

test('attribute padding: rta_len excludes padding, next attribute aligned', () => {
  const x = attrStr(3, 'eth0'); // 4 + 5 = 9 -> padded 12
  assert.is(x.readUInt16LE(0), 9);
  assert.is(x.length, 12);
  const both = Buffer.concat([x, attrU32(4, 1500)]);
  const a = Attrs.parse(both);
  assert.is(a.str(3), 'eth0');
  assert.is(a.u32(4), 1500);
  assert.is(a.u32(99), undefined);
});

test('nested attributes and the NESTED flag is masked on decode', () => {
  const n = nested(18, [attrStr(1, 'veth')], true);
  assert.is(n.readUInt16LE(2), 18 | NLA_F_NESTED);
  const a = Attrs.parse(n);
  assert.is(a.nested(18)?.str(1), 'veth');
  assert.throws(() => Attrs.parse(Buffer.from([200, 0, 1, 0])), /malformed/);
});

test('repeated attribute: get returns last, all returns every one', () => {
  const a = Attrs.parse(Buffer.concat([attrU32(1, 1), attrU32(1, 2)]));
  assert.is(a.u32(1), 2);
  assert.is(a.all(1).length, 2);
});

test('fixed headers have kernel sizes and round trip', () => {
  assert.is(s.encodeIfInfoMsg().length, 16);
  assert.is(s.encodeIfAddrMsg().length, 8);
  assert.is(s.encodeRtMsg().length, 12);
  assert.is(s.encodeFibRuleHdr().length, 12);
  assert.is(s.encodeNdMsg().length, 12);
  assert.equal(s.decodeIfInfoMsg(s.encodeIfInfoMsg({ family: 0, type: 1, index: 7, flags: 1, change: 1 })), { family: 0, type: 1, index: 7, flags: 1, change: 1 });
  const rt = { family: 2, dstLen: 24, srcLen: 0, tos: 0, table: 100, protocol: 4, scope: 253, type: 1, flags: 0 };
  assert.equal(s.decodeRtMsg(s.encodeRtMsg(rt)), rt);
  const fr = { family: 10, dstLen: 0, srcLen: 64, tos: 0, table: 5, action: 1, flags: 0 };
  assert.equal(s.decodeFibRuleHdr(s.encodeFibRuleHdr(fr)), fr);
  const nd = { family: 2, index: 3, state: 0x80, flags: 0, type: 0 };
  assert.equal(s.decodeNdMsg(s.encodeNdMsg(nd)), nd);
  assert.equal(s.decodeIfAddrMsg(s.encodeIfAddrMsg({ family: 10, prefixLen: 128, flags: 0, scope: 254, index: 1 })),
    { family: 10, prefixLen: 128, flags: 0, scope: 254, index: 1 });
});

test('route encode -> decode keeps table > 255, gateway, MTU metric and ECMP nexthops', () => {
  const body = Buffer.concat(encodeRoute({ dst: '10.1.0.9/24', table: 1000, mtu: 1472, nexthops: [
    { gateway: '10.0.0.1', index: 3 }, { gateway: '10.0.0.2', index: 4, weight: 3 },
  ] }));
  const hdr = s.decodeRtMsg(body);
  assert.is(hdr.table, 252); // RT_TABLE_COMPAT, real table in RTA_TABLE
  assert.is(hdr.dstLen, 24);
  const r = decodeRoute({ type: 24, flags: 0, seq: 0, pid: 0, payload: body });
  assert.is(r.dst, '10.1.0.0');
  assert.is(r.table, 1000);
  assert.is(r.mtu, 1472);
  assert.equal(r.nexthops, [{ gateway: '10.0.0.1', index: 3, weight: 1 }, { gateway: '10.0.0.2', index: 4, weight: 3 }]);
  const a = Attrs.parse(body, 12);
  assert.is(a.nested(RTA.METRICS)?.u32(RTAX_MTU), 1472);
  const v6 = decodeRoute({ type: 24, flags: 0, seq: 0, pid: 0, payload: Buffer.concat(encodeRoute({ dst: 'default', gateway: 'fd00::1', index: 2 })) });
  assert.equal([v6.family, v6.dst, v6.dstLen, v6.gateway, v6.index, v6.scope], [6, '::', 0, 'fd00::1', 2, 0]);
  const dev = s.decodeRtMsg(Buffer.concat(encodeRoute({ dst: '10.2.0.0/16', index: 2 })));
  assert.is(dev.scope, 253); // device route without gateway is link scope
});

test('link decode: kind from IFLA_LINKINFO, veth peer index', () => {
  const payload = Buffer.concat([
    s.encodeIfInfoMsg({ index: 5, flags: 1 }),
    attrStr(IFLA.IFNAME, 'veth0'), attrU32(IFLA.MTU, 1400), attrU32(IFLA.LINK, 9),
    nested(IFLA.LINKINFO, [attrStr(IFLA_INFO_KIND, 'veth')]),
  ]);
  const l = decodeLink({ type: 16, flags: 0, seq: 0, pid: 0, payload });
  assert.equal([l.index, l.name, l.kind, l.mtu, l.up, l.linkIndex], [5, 'veth0', 'veth', 1400, true, 9]);
});

test('NLMSG_ERROR with extended ack message, capped and uncapped', () => {
  const req = encodeMessage({ type: 24, flags: 5, seq: 9, pid: 0 }, [attrU32(15, 100)]);
  const err = Buffer.alloc(4);
  err.writeInt32LE(-17);
  const capped = Buffer.concat([err, req.subarray(0, 16), attrStr(1, 'Route exists')]);
  assert.equal(decodeError({ type: NLMSG_ERROR, flags: NLM_F_CAPPED | NLM_F_ACK_TLVS, seq: 9, pid: 1, payload: capped }), { errno: 17, msg: 'Route exists' });
  const full = Buffer.concat([err, req, attrStr(1, 'Nope')]);
  assert.equal(decodeError({ type: NLMSG_ERROR, flags: NLM_F_ACK_TLVS, seq: 9, pid: 1, payload: full }), { errno: 17, msg: 'Nope' });
  assert.equal(decodeError({ type: NLMSG_ERROR, flags: 0, seq: 9, pid: 1, payload: Buffer.concat([err, req]) }), { errno: 17, msg: undefined });
});

test('NetlinkError message, code and errno names', () => {
  const e = new NetlinkError('RTM_NEWROUTE 10.1.0.0/24 table 100', 17);
  assert.is(e.message, 'RTM_NEWROUTE 10.1.0.0/24 table 100: EEXIST (File exists)');
  assert.is(e.code, 'NETLINK');
  assert.is(e.errnoName, 'EEXIST');
  const u = new NetlinkError('RTM_NEWLINK x type dummy', 95, 'Unknown device type');
  assert.is(u.errnoName, 'EOPNOTSUPP');
  assert.match(u.message, /: Unknown device type$/);
  assert.ok(isNetlinkError(u, 'EOPNOTSUPP'));
  assert.ok(isNetlinkError(u, 'ENOTSUP'));
  assert.not.ok(isNetlinkError(u, 'EEXIST'));
  assert.not.ok(isNetlinkError(new Error('x')));
  assert.ok(attr(1, Buffer.alloc(0)).length === 4);
});

test.run();
