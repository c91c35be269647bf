// The store-fault matrix's sampler (test/testbed/floating-sampler.ts) in both families, its text and
// netlink reading without a testbed: the SNAT rules of a gateway pod's `ip` and `ip6 tether_egress` tables
// from `nft -a monitor` and `nft -a list table` (lines as nft 1.0.6 prints them), whose handles overlap
// across the two tables, and the addresses a node answers for on its uplink (proxy ARP / NDP entry and a
// /32 / /128 route to another link).
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { NftSnatRules, announcedOnUplink, poolFamily } from '../testbed/floating-kernel-view';

const pools = { 4: '198.18.0.0/24', 6: 'fd00:18::200/125' };

// `nft -a monitor` while writeSnat (daemon/egress/gateway-datapath.ts) ran twice, then a listing of the ip6 table.
const MONITOR = [
  'add table ip6 tether_egress # handle 1',
  'add chain ip6 tether_egress postrouting { type nat hook postrouting priority srcnat; policy accept; } # handle 1',
  'add table ip tether_egress # handle 2',
  'add chain ip tether_egress postrouting { type nat hook postrouting priority srcnat; policy accept; } # handle 1',
  'add rule ip tether_egress postrouting ip saddr != 10.244.0.5 oifname "eth0" meta mark 0x54450000/16 snat to meta mark map { 0x00000001 : 198.18.0.1 } # handle 3',
  'add rule ip tether_egress postrouting ip saddr != 10.244.0.5 oifname "eth0" snat to 198.18.0.1 # handle 4',
  'add rule ip6 tether_egress postrouting ip6 saddr != fd00:244::5 oifname "eth0" meta mark 0x54450000/16 snat to meta mark map { 0x00000201 : fd00:18::201, 0x00000202 : fd00:18::202 } # handle 3',
  'add rule ip6 tether_egress postrouting ip6 saddr != fd00:244::5 oifname "eth0" snat to fd00:18::201 # handle 4',
  '# new generation 2 by process 16326 (nft)',
];

test('monitor: both tables\' SNAT rules, by family and handle (the two tables\' handles overlap)', () => {
  const r = new NftSnatRules(pools);
  for (const l of MONITOR) r.line(l);
  assert.equal(r.addresses().sort(), ['198.18.0.1', 'fd00:18::201', 'fd00:18::202']);
  // The IPv6 rules replaced (flush chain + add): handles 3 and 4 of the ip6 table go, the ip table's stay.
  for (const l of ['delete rule ip6 tether_egress postrouting handle 3', 'delete set ip6 tether_egress __map0', 'delete rule ip6 tether_egress postrouting handle 4']) r.line(l);
  assert.equal(r.addresses(), ['198.18.0.1'], 'the IPv4 rules of the same handles are still there');
  r.line('add rule ip6 tether_egress postrouting ip6 saddr != fd00:244::5 oifname "eth0" snat to fd00:18::202 # handle 5');
  assert.equal(r.addresses().sort(), ['198.18.0.1', 'fd00:18::202']);
  r.line('delete rule ip tether_egress postrouting handle 4');
  r.line('delete rule ip tether_egress postrouting handle 3');
  assert.equal(r.addresses(), ['fd00:18::202']);
  r.line('delete table ip6 tether_egress');
  assert.equal(r.addresses(), []);
});

test('listing: the table line says the family; only the postrouting chain counts; a monitor line amid it is the monitor\'s', () => {
  const r = new NftSnatRules(pools);
  const lines = [
    'table ip6 tether_egress { # handle 1',
    '\tchain pre { # handle 2',
    '\t\ttype filter hook prerouting priority -150; policy accept;',
    '\t\tct state invalid counter packets 0 bytes 0 drop # handle 7',
    '\t}',
    '\tchain postrouting { # handle 1',
    '\t\ttype nat hook postrouting priority srcnat; policy accept;',
    // The monitor's line, printed in the middle of the ip6 listing: an IPv4 rule, not an IPv6 one.
    'add rule ip tether_egress postrouting ip saddr != 10.244.0.5 oifname "eth0" snat to 198.18.0.7 # handle 9',
    '\t\tip6 saddr != fd00:244::5 oifname "eth0" snat to fd00:18::0203 # handle 5',
    '\t}',
    '\tchain unnated { # handle 3',
    // Not SNAT to a floating address: a later chain's rule is not counted.
    '\t\tip6 saddr != fd00:244::5 oifname "eth0" counter packets 0 bytes 0 drop # handle 8',
    '\t}',
    '}',
    // After the listing: a rule line without `add rule` is not read.
    '\t\tip6 saddr != fd00:244::5 oifname "eth0" snat to fd00:18::204 # handle 6',
  ];
  for (const l of lines) r.line(l);
  assert.equal(r.addresses().sort(), ['198.18.0.7', 'fd00:18::203'], 'canonical text; the stray line after the table is not read');
  r.line('delete rule ip6 tether_egress postrouting handle 5');
  assert.equal(r.addresses(), ['198.18.0.7'], 'the listed IPv6 rule is the ip6 table\'s handle 5');
});

test('addresses outside the pools are passed over; without an IPv6 pool no IPv6 address is read', () => {
  const r = new NftSnatRules(pools);
  r.line('add rule ip6 tether_egress postrouting ip6 saddr != fd00:244::5 oifname "eth0" snat to fd00:99::1 # handle 4');
  r.line('add rule ip tether_egress postrouting ip saddr != 10.244.0.5 oifname "eth0" snat to 10.9.9.9 # handle 4');
  assert.equal(r.addresses(), []);
  const v4 = new NftSnatRules({ 4: pools[4] });
  for (const l of MONITOR) v4.line(l);
  assert.equal(v4.addresses(), ['198.18.0.1'], 'the IPv4-only sampler reads what it read before');
  assert.is(poolFamily('fd00:18::201', { 4: pools[4] }), undefined);
  assert.is(poolFamily('fd00:18::201', pools), 6);
  assert.is(poolFamily('198.18.0.9', pools), 4);
});

test('announced: a proxy entry on the uplink and a /32 or /128 route through another link, per family', () => {
  const uplink = 2;
  const proxied = [
    { address: 'fd00:18::201', index: 2 },
    { address: 'fd00:18:0::202', index: 2 }, // not canonical text: canonical in the answer
    { address: 'fd00:18::203', index: 2 }, // routed through the uplink itself: not answered for
    { address: 'fd00:18::204', index: 7 }, // a proxy entry on another link
    { address: 'fd00:18::205', index: 2 }, // no route
    { address: 'fd00:99::1', index: 2 }, // outside the pool
    { address: '198.18.0.1', index: 2 },
  ];
  const routes = [
    { dst: 'fd00:18::201', dstLen: 128, index: 9 },
    { dst: 'fd00:18::202', dstLen: 128, index: 10 },
    { dst: 'fd00:18::203', dstLen: 128, index: 2 },
    { dst: 'fd00:18::204', dstLen: 128, index: 9 },
    { dst: 'fd00:18::200', dstLen: 125, index: 9 },
    { dst: 'fd00:99::1', dstLen: 128, index: 9 },
    { dst: '198.18.0.1', dstLen: 32, index: 9 },
  ];
  assert.equal(announcedOnUplink(6, proxied, routes, uplink, pools), ['fd00:18::201', 'fd00:18::202']);
  assert.equal(announcedOnUplink(4, proxied, routes, uplink, pools), ['198.18.0.1']);
  assert.equal(announcedOnUplink(6, proxied, routes, uplink, { 4: pools[4] }), [], 'no IPv6 pool: nothing IPv6');
});

test.run();
