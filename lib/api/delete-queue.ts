// The node's deletion queue, as the CNI clients write it and tetherd reads it: when tetherd cannot be
// reached on DEL, `tether` and `tether-ipam` record the request here and answer success, so the rest of the
// chain's DEL (ptp releasing the veth, host-local or tether-ipam the address) still runs; tetherd replays
// the requests when it starts (daemon/pod/delete-queue.ts). Part of the wire contract: the Bun-built CNI
// executables load this file at start, so node:fs and node:crypto are required only when a DEL is queued.
import type { CniParams } from './protocol';

/**
 * Beside tetherd's default state dir (--state-dir /var/lib/tether, a hostPath in the DaemonSet, so the
 * host's CNI executables and tetherd's container see the same directory). tetherd reads
 * <state-dir>/delete-queue; a plugin config for a tetherd with another state dir sets `deleteQueueDir`.
 */
export const DEFAULT_DELETE_QUEUE_DIR = '/var/lib/tether/delete-queue';

export const DELETE_QUEUE_FORMAT = 1;

/**
 * At most this many queued requests: one is written per container torn down while tetherd is away, and a
 * long outage with pods whose sandboxes keep failing (kubelet retries them, each with a new container ID)
 * would otherwise grow the directory without end. Past it a DEL still succeeds, unrecorded (see
 * queueDelete). 10,000 requests of a few KB each stay within tens of MB.
 */
export const MAX_QUEUED_DELETES = 10_000;

/** The socket methods a queued request replays. */
export const QUEUED_METHODS = ['cni.del', 'ipam.del'] as const;
export type QueuedMethod = (typeof QUEUED_METHODS)[number];

/** One queued request, one JSON file. */
export interface QueuedDelete {
  format: typeof DELETE_QUEUE_FORMAT;
  method: QueuedMethod;
  /** When the client queued it (ISO 8601). */
  queuedAt: string;
  /** Why tetherd was not reached (the client's error message). */
  reason: string;
  /** Exactly what the client would have sent on the socket. */
  params: CniParams;
}

/** Longest file name Linux takes (NAME_MAX). */
const NAME_MAX = 255;

/**
 * The file of a request: one per method, container and interface, so a DEL repeated for the same pod
 * overwrites its earlier copy (the DEL handlers are idempotent; one replay is enough). Container IDs and
 * interface names never contain ':' (lib/cni-validate.ts), so the readable name is unambiguous; a name past
 * NAME_MAX (container IDs may be 255 characters) becomes a SHA-256 of the same fields.
 */
export function queueFileName(method: QueuedMethod, containerId: string, ifName: string): string {
  const readable = `${method}:${containerId}:${ifName}.json`;
  if (new TextEncoder().encode(readable).length <= NAME_MAX) return readable;
  const { createHash } = require('node:crypto') as typeof import('node:crypto');
  return `${method}:sha256-${createHash('sha256').update(`${containerId}\0${ifName}`).digest('hex')}.json`;
}

/** True for the names queueDelete leaves while writing (and a killed writer leaves behind). */
export function isQueueTempName(name: string): boolean {
  return name.startsWith('.') && name.endsWith('.tmp');
}

export type QueueOutcome =
  | { queued: true; file: string }
  | { queued: false; why: string };

/**
 * Records a DEL durably (lib/atomic-file.ts: a temp file, fsync, rename over the request's file, fsync of the
 * directory), so a crash at any instant leaves the old file, the new one, or a temp file tetherd removes;
 * never a torn request.
 * Never throws: the caller answers the DEL with success either way, because a failing DEL stops the chain
 * before the primary plugin releases the pod's veth and address, for every pod on the node. What could not
 * be recorded is said in `why`, which the client prints on stderr (the runtime logs it).
 *
 * The directory is created, its parent is not: with no tetherd state dir on the node (tetherd uninstalled,
 * its state removed) there is nothing a replayed DEL could release, so nothing is written.
 */
export function queueDelete(dir: string, entry: Omit<QueuedDelete, 'format'>): QueueOutcome {
  const fs = require('node:fs') as typeof import('node:fs');
  const name = queueFileName(entry.method, entry.params.containerId, entry.params.ifName);
  const file = `${dir}/${name}`;
  const parent = dir.slice(0, dir.lastIndexOf('/')) || '/';
  try {
    if (!fs.existsSync(parent)) return { queued: false, why: `${parent} does not exist (no tetherd state on this node): nothing to release later` };
    try {
      fs.mkdirSync(dir, { mode: 0o700 });
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== 'EEXIST') throw e;
    }
    if (!fs.existsSync(file)) {
      const queued = fs.readdirSync(dir).filter((n) => !isQueueTempName(n)).length;
      if (queued >= MAX_QUEUED_DELETES) return { queued: false, why: `${dir} already holds ${queued} requests (limit ${MAX_QUEUED_DELETES})` };
    }
    // Loaded here, not at the top: the CNI executables load only what a request uses.
    const { writeFileAtomic } = require('../atomic-file') as typeof import('../atomic-file');
    writeFileAtomic(file, JSON.stringify({ format: DELETE_QUEUE_FORMAT, ...entry }) + '\n', { mode: 0o600 });
    return { queued: true, file };
  } catch (e) {
    return { queued: false, why: `cannot write ${file}: ${(e as Error).message}` };
  }
}

/** Reads a queued request; throws an Error naming what is wrong with it (tetherd sets such files aside). */
export function parseQueuedDelete(text: string): QueuedDelete {
  let raw: unknown;
  try {
    raw = JSON.parse(text);
  } catch (e) {
    throw new Error(`not JSON: ${(e as Error).message}`);
  }
  if (!raw || typeof raw !== 'object' || Array.isArray(raw)) throw new Error('not a JSON object');
  const q = raw as Record<string, unknown>;
  if (q.format !== DELETE_QUEUE_FORMAT) throw new Error(`format: ${JSON.stringify(q.format)} is not ${DELETE_QUEUE_FORMAT}`);
  if (!(QUEUED_METHODS as readonly unknown[]).includes(q.method)) throw new Error(`method: ${JSON.stringify(q.method)} is not one of ${QUEUED_METHODS.join(', ')}`);
  if (typeof q.queuedAt !== 'string' || Number.isNaN(Date.parse(q.queuedAt))) throw new Error('queuedAt: missing or not a date');
  if (typeof q.reason !== 'string') throw new Error('reason: missing or not a string');
  const p = q.params as Record<string, unknown> | undefined;
  if (!p || typeof p !== 'object' || Array.isArray(p)) throw new Error('params: missing or not an object');
  if (p.command !== 'DEL') throw new Error(`params.command: ${JSON.stringify(p.command)} is not DEL`);
  for (const f of ['containerId', 'ifName', 'netns'] as const) {
    if (typeof p[f] !== 'string') throw new Error(`params.${f}: missing or not a string`);
  }
  if (!p.config || typeof p.config !== 'object' || Array.isArray(p.config)) throw new Error('params.config: missing or not an object');
  if (p.args !== undefined && (!p.args || typeof p.args !== 'object' || Array.isArray(p.args))) throw new Error('params.args: not an object');
  return q as unknown as QueuedDelete;
}
