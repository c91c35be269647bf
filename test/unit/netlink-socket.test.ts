// NetlinkSocket exchange logic against a scripted fake kernel: ack handling, extended-ack errors,
// stale replies skipped by sequence number and port id, bounded dump restarts on NLM_F_DUMP_INTR, timeouts.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { attrStr, decodeMessages, encodeMessage } from '../../daemon/netlink/codec';
import { NLM_F_ACK_TLVS, NLM_F_CAPPED, NLM_F_DUMP_INTR, NLM_F_MULTI, NLMSG_DONE, NLMSG_ERROR } from '../../daemon/netlink/constants';
import { NetlinkError } from '../../daemon/netlink/netlink-error';
import { NetlinkSocket, type NetlinkTransport } from '../../daemon/netlink/socket';

const PORT = 4242;

/** A fake kernel: for each request, `reply(seq, attempt)` returns the datagrams to queue. */
function fake(reply: (seq: number, n: number) => Buffer[]): { t: NetlinkTransport; sent: number; closed: number } {
  const queue: Buffer[] = [];
  const state = { sent: 0, closed: 0, t: undefined as unknown as NetlinkTransport };
  state.t = {
    send(msg) {
      const [m] = decodeMessages(msg);
      queue.push(...reply(m.seq, state.sent++));
    },
    recv(buf) {
      const d = queue.shift();
      if (!d) return -1;
      d.copy(buf);
      return d.length;
    },
    close() { state.closed++; },
  };
  return state;
}

function ack(seq: number, errno = 0, text?: string, pid = PORT): Buffer {
  const e = Buffer.alloc(4);
  e.writeInt32LE(-errno);
  const echoed = Buffer.alloc(16);
  return encodeMessage({ type: NLMSG_ERROR, flags: NLM_F_CAPPED | (text ? NLM_F_ACK_TLVS : 0), seq, pid },
    [e, echoed, ...(text ? [attrStr(1, text)] : [])]);
}

function entry(seq: number, flags = NLM_F_MULTI, pid = PORT): Buffer {
  return encodeMessage({ type: 16, flags, seq, pid }, [Buffer.alloc(16)]);
}

function done(seq: number, flags = NLM_F_MULTI): Buffer {
  return encodeMessage({ type: NLMSG_DONE, flags, seq, pid: PORT }, [Buffer.alloc(4)]);
}

test('request returns replies before the ack and skips stale sequence numbers and foreign port ids', () => {
  const f = fake((seq) => [ack(seq - 1), entry(seq, 0, 999), Buffer.concat([entry(seq, 0), ack(seq)])]);
  const s = new NetlinkSocket(f.t, PORT);
  const r = s.request(18, 0, [], 'RTM_GETLINK x');
  assert.is(r.length, 1);
});

test('an error ack becomes a NetlinkError with errno name, op and extended ack text', () => {
  const s = new NetlinkSocket(fake((seq) => [ack(seq, 17, 'Route exists')]).t, PORT);
  try {
    s.request(24, 0, [], 'RTM_NEWROUTE 10.1.0.0/24 table 100');
    assert.unreachable();
  } catch (e) {
    assert.instance(e, NetlinkError);
    assert.is((e as Error).message, 'RTM_NEWROUTE 10.1.0.0/24 table 100: EEXIST (File exists): Route exists');
  }
});

test('dump collects multipart messages across datagrams until NLMSG_DONE', () => {
  const s = new NetlinkSocket(fake((seq) => [Buffer.concat([entry(seq), entry(seq)]), Buffer.concat([entry(seq), done(seq)])]).t, PORT);
  assert.is(s.dump(18, [], 'RTM_GETLINK dump').length, 3);
});

test('interrupted dump is restarted, and the clean attempt is returned', () => {
  const f = fake((seq, n) => (n < 2 ? [Buffer.concat([entry(seq, NLM_F_MULTI | NLM_F_DUMP_INTR), done(seq, NLM_F_MULTI | NLM_F_DUMP_INTR)])]
    : [Buffer.concat([entry(seq), entry(seq), done(seq)])]));
  const s = new NetlinkSocket(f.t, PORT, 5);
  assert.is(s.dump(18, [], 'RTM_GETLINK dump').length, 2);
  assert.is(f.sent, 3);
});

test('a dump interrupted every time fails after the bounded number of attempts', () => {
  const f = fake((seq) => [Buffer.concat([entry(seq, NLM_F_MULTI | NLM_F_DUMP_INTR), done(seq, NLM_F_MULTI | NLM_F_DUMP_INTR)])]);
  const s = new NetlinkSocket(f.t, PORT, 4);
  assert.throws(() => s.dump(26, [], 'RTM_GETROUTE dump'), /RTM_GETROUTE dump: dump interrupted 5 times/);
  assert.is(f.sent, 5);
});

test('no answer hits the receive timeout instead of hanging; close is idempotent', () => {
  const f = fake(() => []);
  const s = new NetlinkSocket(f.t, PORT);
  assert.throws(() => s.request(18, 0, [], 'RTM_GETLINK x'), /RTM_GETLINK x: no answer from the kernel/);
  s.close();
  s.close();
  assert.is(f.closed, 1);
  assert.ok(s.closed);
  assert.throws(() => s.dump(18, [], 'RTM_GETLINK dump'), /socket is closed/);
});

test.run();
