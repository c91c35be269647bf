// Long-lived traffic for failover tests, run with Node inside namespaces: a server that echoes numbered
// lines and records each connection's source address, and a client that keeps N TCP connections (and an
// optional UDP stream) in request/response with sequence checks, then reports gaps and errors as JSON.
// Both take either family: the server listens on both, the client connects to the address it is given.

/**
 * argv: port. Listens on 0.0.0.0 and [::] (IPv6 only, so an IPv4 peer keeps its plain address), TCP and UDP.
 * On SIGTERM prints {peers}: one entry per TCP connection and per UDP source, "addr:port" for IPv4 and
 * "[addr]:port" for IPv6 (peerAddress() takes the address back out), UDP ones prefixed "udp ". Prints
 * "ready" once listening (IPv4 alone in a namespace without IPv6).
 */
export const ECHO_SERVER = `
const net = require('net'), dgram = require('dgram');
const port = Number(process.argv[1]);
const peers = new Map();
const peerOf = (addr, p) => (addr.includes(':') ? '[' + addr + ']' : addr) + ':' + p;
const onConn = (s) => {
  const peer = peerOf(s.remoteAddress, s.remotePort);
  peers.set(peer, 0);
  s.setNoDelay(true);
  s.on('data', (b) => { peers.set(peer, peers.get(peer) + 1); s.write(b); });
  s.on('error', () => {});
};
const onDatagram = (u) => (m, r) => { const k = 'udp ' + peerOf(r.address, r.port); peers.set(k, (peers.get(k) || 0) + 1); u.send(m, r.port, r.address); };
net.createServer(onConn).listen(port, '0.0.0.0', () => {
  const v6 = net.createServer(onConn);
  v6.once('error', () => process.stdout.write('ready\\n'));
  v6.listen({ port, host: '::', ipv6Only: true }, () => process.stdout.write('ready\\n'));
});
const u = dgram.createSocket('udp4');
u.on('message', onDatagram(u));
u.bind(port, '0.0.0.0');
const u6 = dgram.createSocket({ type: 'udp6', ipv6Only: true });
u6.on('message', onDatagram(u6));
u6.on('error', () => {});
u6.bind(port, '::');
process.on('SIGTERM', () => { process.stdout.write(JSON.stringify({ peers: [...peers.keys()] }) + '\\n'); process.exit(0); });
`;

/** The source address of an ECHO_SERVER peer entry ("1.2.3.4:5", "[fd00::1]:5", "udp …"), without port or brackets. */
export function peerAddress(peer: string): string {
  const p = peer.startsWith('udp ') ? peer.slice(4) : peer;
  const v6 = /^\[([^\]]+)\]:\d+$/.exec(p);
  return v6 ? v6[1] : p.slice(0, p.lastIndexOf(':'));
}

export interface TrafficReport {
  connections: number;
  /** Connections that stayed open to the end with every echo in order. */
  intact: number;
  errors: string[];
  /** Longest time without an echo on any connection, ms. */
  maxGapMs: number;
  /** Per connection: the longest gap, ms. */
  gaps: number[];
  /** The longest any connection took to connect (a lost SYN is resent after 1 s), ms. */
  maxConnectMs?: number;
  /** The longest gap on any connection after its first echo (connection set-up left out), ms. */
  maxGapEstablishedMs?: number;
  /**
   * Longest gap on any connection among the gaps that ended after the client got SIGUSR2 (the whole gap,
   * also the part before the signal), ms; absent without the signal. runTraffic() sends it as the event
   * under test starts, so connection set-up and warm-up stalls do not count.
   */
  maxGapAfterMarkMs?: number;
  /** When that longest gap ended (Date.now() of the client, which shares the caller's clock). */
  maxGapAfterMarkEndedAt?: number;
  echoes: number;
  udp?: { sent: number; received: number; maxGapMs: number };
}

/**
 * argv: host port connections durationMs intervalMs udp(0|1); host is an IPv4 or an IPv6 address. Each connection sends "<conn> <seq>\\n" every
 * intervalMs once the previous echo arrived; a reply out of order, a reset or a close is an error.
 * Prints "ready" once SIGUSR2 (the mark, see TrafficReport.maxGapAfterMarkMs) and SIGINT (end now) are handled,
 * and "connected" once every connection is.
 */
export const TRAFFIC_CLIENT = `
let markAt = 0;
process.on('SIGUSR2', () => { if (!markAt) markAt = Date.now(); });
// SIGINT ends the run early (the caller's event is over): each connection ends at its next exchange, and one
// still stalled 5 s later is reported by the watchdog as not finished.
process.on('SIGINT', () => { duration = Math.min(duration, Date.now() - start); clearTimeout(watchdog); watchdog = setTimeout(onWatchdog, 5000); });
process.stdout.write('ready\\n');
const net = require('net'), dgram = require('dgram');
let [host, port, n, duration, interval, udpOn] = process.argv.slice(1).map((v, i) => (i === 0 ? v : Number(v)));
const errors = []; const gaps = []; const marked = []; const connects = []; const established = []; let longest = { ms: 0, endedAt: 0 }; let echoes = 0; let intact = 0; let done = 0;
const start = Date.now();
function conn(i) {
  let seq = 0, expect = 0, last = Date.now(), maxGap = 0, maxMarked = 0, maxEst = 0, hadEcho = false, buf = '', ok = true, waiting = false;
  const opened = Date.now();
  const gapEnds = (now) => {
    maxGap = Math.max(maxGap, now - last);
    if (hadEcho) maxEst = Math.max(maxEst, now - last);
    if (markAt && now >= markAt) { maxMarked = Math.max(maxMarked, now - last); if (now - last > longest.ms) longest = { ms: now - last, endedAt: now }; }
  };
  const s = net.connect({ host, port });
  s.setNoDelay(true);
  const send = () => { if (Date.now() - start > duration) { finish(); return; } s.write(i + ' ' + seq++ + '\\n'); waiting = true; };
  const timer = setInterval(() => { if (!waiting) send(); }, interval);
  s.on('connect', () => { connects.push(Date.now() - opened); if (connects.length === n) process.stdout.write('connected\\n'); send(); });
  s.on('data', (b) => {
    buf += b;
    let nl;
    while ((nl = buf.indexOf('\\n')) >= 0) {
      const line = buf.slice(0, nl); buf = buf.slice(nl + 1);
      const [c, q] = line.split(' ').map(Number);
      if (c !== i || q !== expect) { ok = false; errors.push('conn ' + i + ': got ' + line + ' expected ' + expect); }
      expect++; echoes++;
      const now = Date.now(); gapEnds(now); last = now; hadEcho = true; waiting = false;
    }
  });
  let finished = false;
  function finish() {
    if (finished) return; finished = true; clearInterval(timer);
    if (Date.now() - last > interval * 4) gapEnds(Date.now());
    gaps.push(maxGap); marked.push(maxMarked); established.push(maxEst); if (ok) intact++; s.destroy(); if (++done === n) report();
  }
  s.on('error', (e) => { ok = false; errors.push('conn ' + i + ': ' + e.code); finish(); });
  s.on('close', () => { if (Date.now() - start < duration) { ok = false; errors.push('conn ' + i + ': closed early'); } finish(); });
}
let udp;
if (udpOn) {
  const u = dgram.createSocket(net.isIPv6(host) ? 'udp6' : 'udp4'); let sent = 0, received = 0, last = Date.now(), maxGap = 0;
  u.on('message', () => { received++; const now = Date.now(); maxGap = Math.max(maxGap, now - last); last = now; });
  const t = setInterval(() => { if (Date.now() - start > duration) { clearInterval(t); udp = { sent, received, maxGapMs: maxGap }; u.close(); return; } u.send(String(sent++), port, host); }, interval);
}
function report() {
  setTimeout(() => process.stdout.write(JSON.stringify({ connections: n, intact, errors: errors.slice(0, 20), maxGapMs: Math.max(0, ...gaps), gaps, maxConnectMs: Math.max(0, ...connects), maxGapEstablishedMs: Math.max(0, ...established), maxGapAfterMarkMs: markAt ? Math.max(0, ...marked) : undefined, maxGapAfterMarkEndedAt: markAt ? longest.endedAt : undefined, echoes, udp }) + '\\n'), interval * 2);
}
const finishers = [];
for (let i = 0; i < n; i++) conn(i);
// Watchdog: a connection that never connects or never ends must not hang the report.
function onWatchdog() { errors.push('watchdog: ' + (n - done) + ' connections did not finish'); gaps.push(duration); process.stdout.write(JSON.stringify({ connections: n, intact, errors: errors.slice(0, 20), maxGapMs: Math.max(0, ...gaps), gaps, echoes, udp }) + '\\n'); process.exit(0); }
let watchdog = setTimeout(onWatchdog, duration + 5000);
`;
