// tetherd --lb-datapath: where VIP traffic is handled, and --uplink, where it arrives (daemon/options.ts). node is the default (the packet is
// handled on the uplink as it arrives); pod is kept; anything else is refused at start, naming the flag.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import * as os from 'node:os';
import { lbOptions, parseOptions, uplinkOption } from '../../daemon/options';
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

test.run();
