// lib/ip.ts: address text <-> bytes <-> bigints for IPv4, IPv6 and IPv4-mapped IPv6, prefixes, block
// arithmetic and refusals. The hand-written parser and printer are checked against node's own (net.isIP
// for what is an address, net.SocketAddress, i.e. libuv's inet_pton/inet_ntop, for the canonical text).
import { randomBytes } from 'node:crypto';
import * as net from 'node:net';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import {
  AddressError, bytesToIp, bytesToMac, canonicalIp, clearHostBits, familyBits, formatCidr, formatIp, formatPrefix, formatV4,
  formatV6, inSubnet, ipFamily, ipToBytes, macToBytes, networkOf, parseCidr, parseIp, parsePrefix, prefixMask, rangeOf,
  cidrInside, cidrsOverlap, sizeOf, tryWriteV4, tryWriteV6, v4ToUint32, writeV4, writeV6,
} from '../../lib/ip';

const inetNtop = (text: string) => new net.SocketAddress({ address: text, family: 'ipv6' }).address;

test('IPv4: text <-> bytes <-> bigint', () => {
  assert.equal([...ipToBytes('10.1.2.3')], [10, 1, 2, 3]);
  assert.is(bytesToIp(Buffer.from([192, 0, 2, 255])), '192.0.2.255');
  assert.equal(parseIp('10.0.0.1'), { family: 4, value: 0x0a000001n });
  assert.equal(parseIp('255.255.255.255'), { family: 4, value: 0xffffffffn });
  assert.is(formatIp(4, 0n), '0.0.0.0');
  assert.is(formatIp(4, 0xc0000201n), '192.0.2.1');
  assert.is(ipFamily('10.0.0.1'), 4);
  assert.is(v4ToUint32('10.0.0.1'), 0x0a000001);
  assert.is(v4ToUint32('255.255.255.255'), 0xffffffff);
  const b = Buffer.alloc(8);
  writeV4(b, 2, '1.2.3.4');
  assert.equal([...b], [0, 0, 1, 2, 3, 4, 0, 0]);
  assert.is(formatV4(b, 2), '1.2.3.4');
});

test('IPv6: inet_ntop text, any case in, lower case out', () => {
  assert.is(bytesToIp(ipToBytes('fd00:0:0:0:0:0:0:1')), 'fd00::1');
  assert.is(canonicalIp('2001:db8:0:1:0:0:0:1'), '2001:db8:0:1::1');
  assert.is(canonicalIp('2001:db8:0:1:1:1:1:1'), '2001:db8:0:1:1:1:1:1'); // single zero group stays
  assert.is(canonicalIp('::'), '::');
  assert.is(canonicalIp('1:0:0:2:0:0:0:3'), '1:0:0:2::3'); // the longest run
  assert.is(canonicalIp('1:0:0:2:0:0:3:4'), '1::2:0:0:3:4'); // the first of equal runs
  assert.is(canonicalIp('FD00::ABCD'), 'fd00::abcd');
  assert.is(canonicalIp('fe80::1%eth0'), 'fe80::1'); // a zone is allowed and dropped
  assert.equal(parseIp('fd00::1'), { family: 6, value: 0xfd000000000000000000000000000001n });
  assert.equal(parseIp('ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff'), { family: 6, value: (1n << 128n) - 1n });
  assert.is(formatIp(6, 1n), '::1');
  assert.is(formatIp(6, 0xfd000000000000000000000000010000n), 'fd00::1:0');
  assert.is(ipFamily('fd00::1'), 6);
  assert.is(v4ToUint32('::1'), undefined);
});

test('IPv4-mapped and IPv4-compatible IPv6 print the last 32 bits dotted', () => {
  assert.is(canonicalIp('::ffff:10.0.0.1'), '::ffff:10.0.0.1');
  assert.is(canonicalIp('0:0:0:0:0:ffff:a00:1'), '::ffff:10.0.0.1');
  assert.is(canonicalIp('::1.2.3.4'), '::1.2.3.4');
  assert.is(canonicalIp('1:2:3:4:5:6:1.2.3.4'), '1:2:3:4:5:6:102:304');
  assert.is(canonicalIp('::ffff:0:0'), '::ffff:0.0.0.0');
  assert.is(canonicalIp('::1'), '::1');
  assert.equal(parseIp('::ffff:10.0.0.1'), { family: 6, value: 0xffff0a000001n });
  assert.is(formatIp(6, 0xffff0a000001n), '::ffff:10.0.0.1');
  assert.equal([...ipToBytes('::ffff:1.2.3.4')], [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 255, 255, 1, 2, 3, 4]);
  const mapped = parseCidr('::ffff:0:0/96')!;
  assert.ok(inSubnet(parseIp('::ffff:192.0.2.1')!, mapped));
  assert.not.ok(inSubnet(parseIp('192.0.2.1')!, mapped), 'an IPv4 address is not in IPv6 space');
});

test('bad input: the exact refusals', () => {
  for (const t of ['', '10.0.0.300', '1.2.3', '1.2.3.4.5', '01.2.3.4', ' 1.2.3.4', '1.2.3.4%eth0', 'nope', ':::', '1::2::3', '12345::', 'fd00::1 ']) {
    assert.throws(() => ipToBytes(t), (e: Error) => e.message === `'${t}' is not an IP address`, JSON.stringify(t));
    assert.is(parseIp(t), undefined, JSON.stringify(t));
    assert.is(ipFamily(t), 0, JSON.stringify(t));
  }
  assert.is(parseIp(undefined as unknown as string), undefined);
  assert.is(parseIp(42 as unknown as string), undefined);
  assert.throws(() => bytesToIp(Buffer.alloc(5)), (e: Error) => e.message === 'address of 5 bytes');
  const b = Buffer.alloc(16);
  for (const t of ['', '1.2.3', '1.2.3.4.5', '256.1.1.1', '01.2.3.4', '1..2.3', 'a.b.c.d', ' 1.2.3.4']) {
    assert.throws(() => writeV4(b, 0, t), (e: Error) => e instanceof AddressError && e.message === `'${t}' is not an IPv4 address`, JSON.stringify(t));
    assert.not.ok(tryWriteV4(b, 0, t));
    assert.is(v4ToUint32(t), undefined);
  }
  for (const t of ['', ':', ':::', '1:2:3:4:5:6:7:8:9', '1:2:3:4:5:6:7', ':1::', '1::2::3', 'g::1', '12345::', '1:', '1.2.3.4', '::1.2.3', '::256.1.1.1', '1:2:3:4:5:6:7:1.2.3.4', '::1 ', 'fe80::1%eth0']) {
    assert.throws(() => writeV6(b, 0, t), (e: Error) => e instanceof AddressError && e.message === `'${t}' is not an IPv6 address`, JSON.stringify(t));
    assert.not.ok(tryWriteV6(b, 0, t));
  }
  assert.throws(() => macToBytes('02:00:00:00:00'), (e: Error) => e.message === "'02:00:00:00:00' is not a MAC address");
});

test('text <-> bytes agrees with inet_ntop and inet_pton on random addresses', () => {
  const b = Buffer.alloc(16);
  for (let i = 0; i < 3000; i++) {
    const x = randomBytes(16);
    // Zero runs of every length and place, so "::" placement and the dotted forms get exercised.
    const start = i % 8;
    const len = (i >> 3) % 9;
    x.fill(0, 2 * start, Math.min(16, 2 * (start + len)));
    if (i % 11 === 0) x.fill(0, 0, 10).writeUInt16BE(0xffff, 10);
    const text = bytesToIp(x);
    assert.is(text, inetNtop(text), text);
    assert.is(formatV6(x, 0), text);
    writeV6(b, 0, text);
    assert.ok(b.equals(x), text);
    writeV6(b, 0, text.toUpperCase());
    assert.ok(b.equals(x), text.toUpperCase());
    assert.ok(ipToBytes(text).equals(x), text);
    assert.is(formatIp(6, parseIp(text)!.value), text);
    const v4 = formatV4(x, 12);
    assert.ok(ipToBytes(v4).equals(x.subarray(12)), v4);
  }
  // What is an address: the same answer as net.isIP on strings near addresses.
  const alphabet = '0123456789abcdefABCDEF:.:.::x ';
  for (let i = 0; i < 20000; i++) {
    let s = '';
    for (let j = 1 + (i % 40); j > 0; j--) s += alphabet[Math.floor(Math.random() * alphabet.length)];
    const f = ipFamily(s);
    assert.is(f, net.isIP(s), JSON.stringify(s));
    assert.is(parseIp(s)?.family ?? 0, f, JSON.stringify(s));
  }
});

test('CIDRs as bigints: base, network-ness, masks, sizes, containment, overlap', () => {
  assert.equal(parseCidr('10.1.2.3/16'), { family: 4, value: 0x0a010203n, base: 0x0a010000n, prefix: 16, isNetwork: false });
  assert.equal(parseCidr(' 10.1.0.0/16 '), { family: 4, value: 0x0a010000n, base: 0x0a010000n, prefix: 16, isNetwork: true });
  assert.equal(parseCidr('0.0.0.0/0'), { family: 4, value: 0n, base: 0n, prefix: 0, isNetwork: true });
  assert.equal(parseCidr('fd00::1:2/112'), { family: 6, value: 0xfd000000000000000000000000010002n, base: 0xfd000000000000000000000000010000n, prefix: 112, isNetwork: false });
  assert.equal(parseCidr('::/0')?.base, 0n);
  for (const t of ['10.0.0.0', '10.0.0.0/33', 'fd00::/129', '10.0.0.0/', '10.0.0.0/1234', '10.0.0.0/-1', 'nope/8', '10.0.0.0/8/8', '']) {
    assert.is(parseCidr(t), undefined, t);
  }
  assert.is(familyBits(4), 32);
  assert.is(familyBits(6), 128);
  assert.is(prefixMask(4, 0), 0n);
  assert.is(prefixMask(4, 24), 0xffffff00n);
  assert.is(prefixMask(4, 32), 0xffffffffn);
  assert.is(prefixMask(6, 64), 0xffffffffffffffff0000000000000000n);
  assert.is(sizeOf(4, 24), 256n);
  assert.is(sizeOf(6, 64), 1n << 64n);
  assert.equal(rangeOf(4, 0x0a000000n, 24), [0x0a000000n, 0x0a0000ffn]);
  const c = (t: string) => parseCidr(t)!;
  assert.ok(cidrsOverlap(c('10.0.0.0/24'), c('10.0.0.128/25')), 'a subnet overlaps its parent');
  assert.ok(cidrsOverlap(c('10.0.0.0/8'), c('10.255.0.0/16')));
  assert.not.ok(cidrsOverlap(c('10.0.0.0/24'), c('10.0.1.0/24')), 'neighbours do not overlap');
  assert.not.ok(cidrsOverlap(c('10.0.0.0/8'), c('::ffff:10.0.0.0/104')), 'never across families');
  assert.ok(cidrsOverlap(c('fd00::/56'), c('fd00:0:0:ff::/64')));
  assert.not.ok(cidrsOverlap(c('fd00::/56'), c('fd00:0:0:100::/64')));
  assert.ok(cidrInside(c('fd00:0:0:ff::/64'), c('fd00::/56')));
  assert.not.ok(cidrInside(c('fd00::/56'), c('fd00:0:0:ff::/64')), 'a parent is not inside its subnet');
  assert.ok(cidrInside(c('::ffff:10.0.0.0/104'), c('::ffff:0:0/96')));
  assert.ok(cidrInside(c('10.0.0.7/32'), c('10.0.0.0/29')));
  assert.not.ok(cidrInside(c('10.0.0.8/32'), c('10.0.0.0/29')));
  const net4 = parseCidr('10.0.0.0/24')!;
  assert.ok(inSubnet(parseIp('10.0.0.255')!, net4));
  assert.not.ok(inSubnet(parseIp('10.0.1.0')!, net4));
  assert.not.ok(inSubnet(parseIp('::ffff:10.0.0.1')!, net4), 'a mapped address is not in IPv4 space');
  assert.is(formatCidr(4, net4.base, 24), '10.0.0.0/24');
  assert.is(formatCidr(6, parseCidr('fd00:0::/48')!.base, 48), 'fd00::/48');
});

test('prefixes as text (netlink): parse, network, format', () => {
  assert.equal(parsePrefix('10.1.0.5/24'), { family: 4, address: '10.1.0.5', len: 24 });
  assert.equal(networkOf(parsePrefix('10.1.0.5/24')), { family: 4, address: '10.1.0.0', len: 24 });
  assert.equal(networkOf(parsePrefix('fd00::1:2/112')), { family: 6, address: 'fd00::1:0', len: 112 });
  assert.equal(networkOf(parsePrefix('10.255.255.255/0')), { family: 4, address: '0.0.0.0', len: 0 });
  assert.equal(parsePrefix('fd00:0::1'), { family: 6, address: 'fd00::1', len: 128 });
  assert.equal(parsePrefix('::ffff:10.0.0.1/120'), { family: 6, address: '::ffff:10.0.0.1', len: 120 });
  assert.equal(parsePrefix('default'), { family: 4, address: '0.0.0.0', len: 0 });
  assert.equal(parsePrefix('default', 6), { family: 6, address: '::', len: 0 });
  assert.is(formatPrefix(parsePrefix('fd00::/64')), 'fd00::/64');
  assert.throws(() => parsePrefix('10.0.0.0/33'), (e: Error) => e.message === "'10.0.0.0/33' has an invalid prefix length (0..32)");
  assert.throws(() => parsePrefix('fd00::/129'), (e: Error) => e.message === "'fd00::/129' has an invalid prefix length (0..128)");
  assert.throws(() => parsePrefix('10.0.0.0/x'), (e: Error) => e.message === "'10.0.0.0/x' has an invalid prefix length (0..32)");
  assert.throws(() => parsePrefix('nope/8'), (e: Error) => e.message === "'nope' is not an IP address");
  const b = Buffer.from([10, 1, 255, 255]);
  clearHostBits(b, 12);
  assert.equal([...b], [10, 0, 0, 0]);
});

test('MAC text <-> bytes', () => {
  assert.equal([...macToBytes('02:AB:00:00:00:01')], [2, 0xab, 0, 0, 0, 1]);
  assert.is(bytesToMac(Buffer.from([2, 0xab, 0, 0, 0, 1])), '02:ab:00:00:00:01');
});

test.run();
