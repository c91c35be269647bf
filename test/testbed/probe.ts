// Tiny TCP echo probes run with Node inside a namespace: the image has no ping, and a real TCP handshake
// plus a reply naming the server proves the path both ways, to the intended host.

/**
 * Listens on 0.0.0.0:port and [::]:port (IPv6 only, so IPv4 peers keep their plain addresses) and answers
 * every connection with `name\n`; prints "ready" once listening. A namespace without IPv6 serves IPv4 alone.
 */
export const SERVER_SCRIPT = `
const net = require('net');
const [port, name] = process.argv.slice(1);
const serve = (s) => { s.on('error', () => {}); s.end(name + '\\n'); };
net.createServer(serve).listen(Number(port), '0.0.0.0', () => {
  const v6 = net.createServer(serve);
  v6.once('error', () => process.stdout.write('ready\\n'));
  v6.listen({ port: Number(port), host: '::', ipv6Only: true }, () => process.stdout.write('ready\\n'));
});
`;

/** Connects to ip:port, prints what the server sent; exits 1 with the error on failure or timeout. */
export const CLIENT_SCRIPT = `
const [ip, port, timeout] = process.argv.slice(1);
let got = '';
const s = require('net').connect({ host: ip, port: Number(port) });
s.setTimeout(Number(timeout), () => { process.stderr.write('timeout'); process.exit(1); });
s.on('data', (b) => { got += b; });
s.on('end', () => { process.stdout.write(got); process.exit(0); });
s.on('error', (e) => { process.stderr.write(e.code || e.message); process.exit(1); });
`;

export interface ProbeResult {
  ok: boolean;
  /** The server's name as it answered (trimmed), when ok. */
  reply?: string;
  /** Error code (ECONNREFUSED, EHOSTUNREACH, timeout…), when not ok. */
  error?: string;
  ms: number;
}
