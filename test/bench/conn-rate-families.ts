// Diagnostic (not a test, not part of `npm run bench`): new TCP connections per second from the external
// client straight to one target pod, IPv4 against IPv6, on a small dual-stack testbed (one node, plain
// routing). Each figure is lb.ts's storm(); with it, its errors (a refused or timed-out connection counts
// as done, so a burst against a port nobody listens on looks fast) and the counters of the client, the router,
// the node and the pod that say a SYN was dropped or retransmitted.
//  1. The target as lb-families.ts starts it (startTargets with the IPv6 VIP: the TCP server listens IPv6 only).
//  2. An IPv4 server beside it (startTargets with an IPv4 address), so both families reach a listener.
// Run: node_modules/.bin/tsx test/bench/conn-rate-families.ts (CONN_RATE_STORM, CONN_RATE_ROUNDS)
import { withTestbed, type Testbed } from '../testbed/testbed';
import { startTargets } from '../testbed/lb-scenario';
import type { IpFamily } from '../../lib/ip';
import { storm } from './lb';

const STORM = Number(process.env.CONN_RATE_STORM ?? 3000);
const ROUNDS = Number(process.env.CONN_RATE_ROUNDS ?? 3);
const WATCH = ['client', 'router', 'n1', 'n1-t1'];
/** Counters that move when a connection fails, a SYN is dropped or a segment is sent again. */
const INTERESTING = /Retrans|Drop|Discard|Overflow|Fail|Rst|NoRoute|Err|Timeout|Refused|TooBig|Reasm/i;

/** Every counter of /proc/net/{snmp,netstat,snmp6} in a namespace, by "Group.Name". */
async function counters(tb: Testbed, ns: string): Promise<Map<string, number>> {
  const r = await tb.mustExec(ns, ['cat', '/proc/net/snmp', '/proc/net/netstat', '/proc/net/snmp6']);
  const m = new Map<string, number>();
  const lines = r.stdout.split('\n');
  for (let i = 0; i < lines.length; i++) {
    const l = lines[i];
    if (/^\w+: [A-Za-z]/.test(l) && lines[i + 1]?.startsWith(l.split(':')[0] + ':')) {
      const group = l.split(':')[0];
      const names = l.split(/\s+/).slice(1);
      const vals = lines[i + 1].split(/\s+/).slice(1);
      names.forEach((n, j) => m.set(`${group}.${n}`, Number(vals[j])));
      i++;
    } else {
      const s = /^(\w+)\s+(\d+)$/.exec(l);
      if (s) m.set(s[1], Number(s[2]));
    }
  }
  return m;
}

async function measure(tb: Testbed, label: string, host: (f: IpFamily) => string): Promise<void> {
  for (let round = 0; round < ROUNDS; round++) {
    for (const f of (round % 2 ? [6, 4] : [4, 6]) as IpFamily[]) {
      const before = await Promise.all(WATCH.map((n) => counters(tb, n)));
      const r = await storm(tb, host(f), STORM, { allowErrors: true });
      const after = await Promise.all(WATCH.map((n) => counters(tb, n)));
      const moved = WATCH.flatMap((n, i) =>
        [...after[i]].filter(([k, v]) => INTERESTING.test(k) && v !== (before[i].get(k) ?? 0)).map(([k, v]) => `${n}:${k}+${v - (before[i].get(k) ?? 0)}`));
      process.stdout.write(`${label} IPv${f} round ${round + 1}: ${Math.round(r.perSecond)}/s, errors ${r.errors}${moved.length ? `; ${moved.join(' ')}` : ''}\n`);
    }
  }
}

async function main(): Promise<void> {
  await withTestbed({
    nodes: [{ name: 'n1', pods: [{ name: 't1' }] }],
    tether: true,
    ipam: 'tether-ipam',
    families: [4, 6],
  }, async (tb) => {
    const host = (f: IpFamily) => (f === 4 ? tb.podIp('n1-t1') : tb.podIp6('n1-t1'));
    // Each burst leaves TIME_WAIT ports behind for 60 s: the client gets the whole range (as in lb.ts).
    await tb.mustExec('client', ['sysctl', '-q', '-w', 'net.ipv4.ip_local_port_range=1024 65535']);
    // startTargets binds its UDP socket to the given address: the pod's own do.
    const six = await startTargets(tb, ['n1-t1'], tb.podIp6('n1-t1'));
    try {
      await measure(tb, 'IPv6-only server (lb-families)', host);
      const four = await startTargets(tb, ['n1-t1'], tb.podIp('n1-t1'));
      try {
        await measure(tb, 'both servers', host);
        if (process.env.CONN_RATE_HOLD) await new Promise((r) => setTimeout(r, Number(process.env.CONN_RATE_HOLD) * 1000));
      } finally {
        await four.stop();
      }
    } finally {
      await six.stop();
    }
  });
}

main().then(() => process.exit(0), (e) => {
  process.stderr.write(`conn-rate bench failed: ${(e as Error).stack ?? e}\n`);
  process.exit(1);
});
