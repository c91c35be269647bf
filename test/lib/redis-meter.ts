// A relay between test clients and a real redis-server that counts what one simulated node costs the
// store: the commands it sends (RESP arrays, by name) and the bytes of the replies it gets back.
import * as fs from 'node:fs';
import * as net from 'node:net';
import * as os from 'node:os';
import * as path from 'node:path';

export interface RedisMeter {
  /** unix:///…/meter.sock — what OwnershipStore.connect / RedisStore.connect take. */
  url: string;
  /** Commands sent since the last reset, by lower-case name. */
  commands: Map<string, number>;
  totalCommands(): number;
  replyBytes: number;
  reset(): void;
  close(): Promise<void>;
}

export async function meterRedis(socketPath: string): Promise<RedisMeter> {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tether-meter-'));
  const sock = path.join(dir, 'meter.sock');
  const conns = new Set<net.Socket>();
  const m: RedisMeter = {
    url: `unix://${sock}`,
    commands: new Map(),
    totalCommands: () => [...m.commands.values()].reduce((a, b) => a + b, 0),
    replyBytes: 0,
    reset() {
      m.commands.clear();
      m.replyBytes = 0;
    },
    async close() {
      for (const c of conns) c.destroy();
      await new Promise<void>((r) => server.close(() => r()));
      fs.rmSync(dir, { recursive: true, force: true });
    },
  };
  const server = net.createServer((client) => {
    const upstream = net.createConnection(socketPath);
    conns.add(client).add(upstream);
    let pending: Buffer = Buffer.alloc(0);
    client.on('data', (d) => {
      pending = Buffer.concat([pending, d]);
      pending = countCommands(pending, (name) => m.commands.set(name, (m.commands.get(name) ?? 0) + 1));
      upstream.write(d);
    });
    upstream.on('data', (d) => {
      m.replyBytes += d.length;
      client.write(d);
    });
    const end = () => {
      client.destroy();
      upstream.destroy();
      conns.delete(client);
      conns.delete(upstream);
    };
    client.on('close', end).on('error', end);
    upstream.on('close', end).on('error', end);
  });
  await new Promise<void>((r) => server.listen(sock, r));
  return m;
}

/** Counts the complete RESP arrays at the start of `buf` (their first element is the name); returns the rest. */
function countCommands(buf: Buffer, seen: (name: string) => void): Buffer {
  let at = 0;
  for (;;) {
    const line = (from: number): [string, number] | undefined => {
      const i = buf.indexOf('\r\n', from);
      return i < 0 ? undefined : [buf.toString('latin1', from, i), i + 2];
    };
    const head = line(at);
    if (!head || !head[0].startsWith('*')) return buf.subarray(at);
    let p = head[1];
    let name: string | undefined;
    const n = Number(head[0].slice(1));
    let complete = true;
    for (let k = 0; k < n; k++) {
      const len = line(p);
      if (!len) {
        complete = false;
        break;
      }
      const size = Number(len[0].slice(1));
      if (len[1] + size + 2 > buf.length) {
        complete = false;
        break;
      }
      if (k === 0) name = buf.toString('latin1', len[1], len[1] + size).toLowerCase();
      p = len[1] + size + 2;
    }
    if (!complete) return buf.subarray(at);
    seen(name ?? '');
    at = p;
  }
}

/**
 * Commands the server ran, by name, from INFO commandstats: unlike the relay's count this includes the
 * commands run inside Lua scripts (TIME, GET, ZADD…), as the scale bench counts them. Diff two reads
 * with serverDelta (the INFO of the reads themselves is left out).
 */
export async function serverCommands(client: { info(section: string): Promise<string> }): Promise<Map<string, number>> {
  const out = new Map<string, number>();
  for (const m of (await client.info('commandstats')).matchAll(/^cmdstat_([^:]+):calls=(\d+)/gm)) out.set(m[1].toLowerCase(), Number(m[2]));
  return out;
}

export function serverDelta(before: Map<string, number>, after: Map<string, number>): Record<string, number> {
  const out: Record<string, number> = {};
  for (const [k, v] of after) {
    const d = v - (before.get(k) ?? 0);
    if (d > 0 && k !== 'info') out[k] = d;
  }
  return Object.fromEntries(Object.entries(out).sort());
}

export const totalOf = (d: Record<string, number>): number => Object.values(d).reduce((a, b) => a + b, 0);
