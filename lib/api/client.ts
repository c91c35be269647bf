// A one-shot client for tetherd's socket over Node's net (tetherctl, tests, benchmarks; the Node build of
// the CNI clients). The request logic is call-core.ts, shared with the Bun-built CNI executables.
import * as net from 'node:net';
import type { Method } from './protocol';
import { callWith, type CallOptions, type Connector } from './call-core';

export type { CallOptions } from './call-core';

export const nodeConnector: Connector = (socketPath, ev) => {
  const sock = net.createConnection({ path: socketPath });
  sock.setEncoding('utf8'); // a character split across chunks is decoded whole
  sock.on('connect', () => ev.open());
  sock.on('data', (text: string) => ev.data(text));
  sock.on('error', (e: NodeJS.ErrnoException) => ev.error(e));
  sock.on('close', () => ev.close());
  return { write: (text) => void sock.write(text), destroy: () => void sock.destroy() };
};

export function call<R = unknown>(socketPath: string, method: Method, params: unknown, opts: CallOptions = {}): Promise<R> {
  return callWith<R>(nodeConnector, socketPath, method, params, opts);
}
