// tetherd's socket through Bun's own sockets (Bun.connect), for the CNI executables compiled with Bun:
// importing node:net costs a Bun executable about 6 ms at start, more than the request itself.
import type { Connector } from '../lib/api/call-core';

interface BunSocket {
  write(data: Uint8Array): number;
  end(): void;
}

interface BunRuntime {
  stdin: { text(): Promise<string> };
  stdout: unknown;
  stderr: unknown;
  write(destination: unknown, data: string): Promise<number>;
  connect(o: {
    unix: string;
    socket: {
      open(s: BunSocket): void;
      data(s: BunSocket, d: Uint8Array): void;
      drain(s: BunSocket): void;
      error(s: BunSocket, e: Error & { code?: string }): void;
      connectError(s: BunSocket, e: Error & { code?: string }): void;
      close(s: BunSocket): void;
    };
  }): Promise<BunSocket>;
}

/** Bun's runtime object when running under Bun, else undefined. */
export function bunRuntime(): BunRuntime | undefined {
  return (globalThis as { Bun?: BunRuntime }).Bun;
}

export const bunConnector: Connector = (socketPath, ev) => {
  const bun = bunRuntime();
  if (!bun) throw new Error('bunConnector needs the Bun runtime');
  const decoder = new TextDecoder();
  let sock: BunSocket | undefined;
  let out: Uint8Array | undefined;
  let destroyed = false;
  // Bun writes what the socket takes now and says how much; the rest goes on drain.
  const flush = () => {
    if (!sock || !out) return;
    const n = sock.write(out);
    out = n >= out.length ? undefined : out.subarray(Math.max(n, 0));
  };
  bun
    .connect({
      unix: socketPath,
      socket: {
        open(s) {
          sock = s;
          if (destroyed) return s.end();
          ev.open();
        },
        data(_s, d) {
          ev.data(decoder.decode(d, { stream: true }));
        },
        drain() {
          flush();
        },
        error(_s, e) {
          ev.error({ code: e.code, message: e.message });
        },
        connectError(_s, e) {
          ev.error({ code: e.code, message: e.message });
        },
        close() {
          ev.close();
        },
      },
    })
    .catch((e: Error & { code?: string }) => ev.error({ code: e.code, message: e.message }));
  return {
    write(text) {
      out = new TextEncoder().encode(text);
      flush();
    },
    destroy() {
      destroyed = true;
      sock?.end();
    },
  };
};

/**
 * stdout and stderr through Bun.write: process.stdout and process.stderr would build Node's stream objects,
 * about 7 ms of a Bun executable's start. A write that fails (the reader went away) is dropped, as Node drops
 * an EPIPE on a closed stdout; the exit code still tells the runtime what happened.
 */
export const bunOutput = {
  out: (text: string): Promise<void> => bunWrite('stdout', text),
  err: (text: string): Promise<void> => bunWrite('stderr', text),
};

function bunWrite(to: 'stdout' | 'stderr', text: string): Promise<void> {
  const bun = bunRuntime();
  if (!bun) throw new Error('bunOutput needs the Bun runtime');
  return bun.write(bun[to], text).then(
    () => undefined,
    () => undefined,
  );
}

/** The request on stdin through Bun's API (no node:fs); a closed stdin reads as empty, as in readStdin. */
export async function bunReadStdin(): Promise<string> {
  try {
    return await bunRuntime()!.stdin.text();
  } catch {
    return '';
  }
}
