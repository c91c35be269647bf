// tetherd --lb-datapath: where VIP traffic is handled, and --uplink, where it arrives (daemon/options.ts). node is the default (the packet is
// handled on the uplink as it arrives); pod is kept; anything else is refused at start, naming the flag.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import * as os from 'node:os';
import { lbOptions, nodeAddress6Option, parseOptions, uplinkOption } from '../../daemon/options';
import { StartError } from '../../daemon/lifecycle';

test('default node; node and pod accepted', () => {
  assert.is(lbOptions(parseOptions([])).datapath, 'node');
  assert.is(lbOptions(parseOptions(['--lb-datapath', 'node'])).datapath, 'node');
  assert.is(lbOptions(parseOptions(['--lb-datapath=pod'])).datapath, 'pod');
});

test('another value is refused at start with the flag named', () => {
  try {
    lbOptions(parseOptions(['--lb-datapath', 'xdp']));
    assert.unreachable('accepted');
  } catch (e) {
    assert.instance(e, StartError);
    assert.match((e as Error).message, /--lb-datapath: "xdp" is not node or pod/);
  }
});

test('--uplink: given, it wins; else the interface holding --node-address (on this machine and in a given list); else eth0', () => {
  const ifs = { lo: [{ address: '127.0.0.1' }], ens3: [{ address: '10.0.0.11' }, { address: 'fd00::11' }] } as unknown as NodeJS.Dict<os.NetworkInterfaceInfo[]>;
  assert.is(uplinkOption(parseOptions(['--uplink', 'bond0', '--node-address', '10.0.0.11']), ifs), 'bond0');
  assert.is(uplinkOption(parseOptions(['--node-address', '10.0.0.11']), ifs), 'ens3');
  assert.is(uplinkOption(parseOptions(['--node-address', 'fd00::11']), ifs), 'ens3');
  assert.is(uplinkOption(parseOptions(['--node-address', '10.9.9.9']), ifs), 'eth0', 'an address no interface holds');
  assert.is(uplinkOption(parseOptions([]), ifs), 'eth0', 'no node address');
  // The real interfaces: loopback holds 127.0.0.1.
  const lo = Object.entries(os.networkInterfaces()).find(([, l]) => (l ?? []).some((a) => a.address === '127.0.0.1'))?.[0];
  assert.ok(lo, 'this machine has 127.0.0.1');
  assert.is(uplinkOption(parseOptions(['--node-address', '127.0.0.1'])), lo);
});

test('--node-address-6: given, checked and kept; else the one global IPv6 address of the node address\'s interface; else none', () => {
  const v6 = (address: string, internal = false) => ({ address, family: 'IPv6', internal });
  const v4 = (address: string) => ({ address, family: 'IPv4', internal: false });
  const ifs = {
    ens3: [v4('10.0.0.11'), v6('fd00:18::11'), v6('fe80::1')],
    ens4: [v4('10.1.0.11'), v6('fd00:20::1'), v6('fd00:21::1')],
    ens5: [v4('10.2.0.11'), v6('fe80::5')],
  } as unknown as NodeJS.Dict<os.NetworkInterfaceInfo[]>;
  const opt = (args: string[]) => nodeAddress6Option(parseOptions(args), ifs);
  assert.is(opt(['--node-address', '10.0.0.11', '--node-address-6', 'fd00:20::1']), 'fd00:20::1', 'given wins, on any interface');
  assert.is(opt(['--node-address', '10.0.0.11']), 'fd00:18::11', 'the only global one (link-local left out)');
  assert.is(opt(['--node-address', '10.1.0.11']), undefined, 'two: not guessed');
  assert.is(opt(['--node-address', '10.2.0.11']), undefined, 'link-local only');
  assert.is(opt(['--node-address', 'fd00:18::11']), 'fd00:18::11', 'an IPv6 node address is its own');
  assert.is(opt([]), undefined);
  for (const [bad, why] of [['10.0.0.11', /not an IPv6 address/], ['fd00:99::1', /not an address of any local interface/]] as const) {
    try {
      opt(['--node-address', '10.0.0.11', '--node-address-6', bad]);
      assert.unreachable(bad);
    } catch (e) {
      assert.instance(e, StartError);
      assert.match((e as Error).message, why);
    }
  }
});

test.run();
