// tetherd --lb-datapath: where VIP traffic is handled (daemon/options.ts). node is the default (the packet is
// handled on the uplink as it arrives); pod is kept; anything else is refused at start, naming the flag.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { lbOptions, parseOptions } from '../../daemon/options';
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

test.run();
