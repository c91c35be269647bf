// The contract between tetherd and its clients (tether, tether-ipam, tetherctl), in one file.
// Transport: a Unix stream socket (mode 0600, root only); one JSON object per line each way.
// Every request carries `version`; a daemon answers a version it does not speak with an error (code
// PROTOCOL_VERSION) whose `version` is the highest it speaks, and a client that also speaks that one asks
// again with it (call-core.ts): release N's CNI executables and tetherd work beside N−1's both ways.
import type { ErrorCode } from '../errors';

/** The version this release writes. */
export const PROTOCOL_VERSION = 1;
/**
 * The oldest version this release still answers and falls back to: the previous release's, until the
 * release after next (docs/upgrade.md). Raise it only once no supported release speaks the older one.
 */
export const MIN_PROTOCOL_VERSION = 1;
export const DEFAULT_SOCKET_PATH = '/run/tether/tetherd.sock';

export type Method =
  | 'cni.add'
  | 'cni.del'
  | 'cni.check'
  | 'cni.status'
  | 'cni.gc'
  | 'ipam.add'
  | 'ipam.del'
  | 'ipam.check'
  | 'ipam.gc'
  | 'address.allocate'
  | 'address.release'
  | 'status'
  | 'ping';

/** What a CNI executable forwards: the environment it was run with and the network config it read. */
export interface CniParams {
  command: 'ADD' | 'DEL' | 'CHECK' | 'STATUS' | 'GC';
  containerId: string;
  netns: string;
  ifName: string;
  /** CNI_ARGS as key/value pairs (K8S_POD_NAMESPACE, K8S_POD_NAME, …). */
  args: Record<string, string>;
  /** The plugin's network config exactly as read from stdin (cniVersion, name, type, prevResult, …). */
  config: Record<string, unknown>;
}

export interface Request<P = unknown> {
  version: number;
  id: string;
  method: Method;
  params: P;
}

export interface WireError {
  code: ErrorCode;
  message: string;
  details?: string;
}

export interface Response<R = unknown> {
  version: number;
  id: string;
  result?: R;
  error?: WireError;
}

/** Largest request or response line either side accepts; a longer line is a protocol error. */
export const MAX_LINE_BYTES = 4 * 1024 * 1024;
