// A fake of tetherd's socket for tests of its clients (the CNI plugin, tetherctl): a Unix socket server that
// hands each connection's first request line to `onLine`, which answers (or hangs up) as the test needs.
import * as net from 'node:net';

/** Listens on sockPath; resolves to the function that closes it. */
export async function fakeTetherd(sockPath: string, onLine: (s: net.Socket, line: string) => void): Promise<() => Promise<void>> {
  const server = net.createServer((s) => {
    let buf = '';
    s.on('error', () => undefined);
    s.on('data', (c) => {
      buf += c.toString();
      const nl = buf.indexOf('\n');
      if (nl >= 0) onLine(s, buf.slice(0, nl));
    });
  });
  await new Promise<void>((r) => server.listen(sockPath, r));
  return () => new Promise<void>((r) => server.close(() => r()));
}

/** Writes the reply to request line `line`: tetherd's envelope around `body` ({result} or {error}). */
export function reply(s: net.Socket, line: string, body: { result: unknown } | { error: { code: string; message: string } }): void {
  const { id } = JSON.parse(line) as { id: unknown };
  s.end(JSON.stringify({ version: 1, id, ...body }) + '\n');
}
