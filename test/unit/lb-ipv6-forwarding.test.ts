// The node datapath's IPv6 check: its next-hop lookup works in IPv6 only with forwarding on for the uplink,
// so a node serving IPv6 VIPs says so by name when it is off (status datapath.ipv6Problem, one warn line).
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { ipv6ForwardingProblem } from '../../daemon/lb/lb-controller';

test('IPv6 forwarding on the uplink: no problem', () => {
  assert.is(ipv6ForwardingProblem('eth0', () => '1\n'), undefined);
});

test('IPv6 forwarding off: the uplink, the sysctl and its value named', () => {
  const p = ipv6ForwardingProblem('eth0', () => '0');
  assert.ok(p, 'a problem');
  for (const part of ['eth0', 'net.ipv6.conf.eth0.forwarding=0', 'IPv6 VIP']) assert.ok(p!.includes(part), `${part} in: ${p}`);
});

test('unreadable (no IPv6 on the node): said, not thrown', () => {
  const p = ipv6ForwardingProblem('eth0', () => {
    throw new Error('ENOENT: no such file');
  });
  assert.match(String(p), /could not be read \(ENOENT/);
});

test.run();
