// The body every Tether CNI executable shares: check what the spec asks of a plugin (version,
// environment, config shape), forward the request to the node's tetherd, print its answer or a CNI error.
// `tether` and `tether-ipam` differ only in their ClientSpec.
import type { Connector } from '../lib/api/call-core';
import { callWith, TetherdUnreachable } from '../lib/api/call-core';
import { queueDelete, type QueuedMethod } from '../lib/api/delete-queue';
import type { CniParams, Method } from '../lib/api/protocol';
import { ErrorCode, TetherError } from '../lib/errors';
import { errorReply, parseNetConf, readEnv, readStdin, versionReply, type CniCommand, type NetConf } from '../lib/cni-spec';

/** CNI 1.1 STATUS: 50 = the plugin cannot service ADD requests. */
const CNI_PLUGIN_NOT_AVAILABLE = 50;

export interface ClientSpec {
  methods: Record<Exclude<CniCommand, 'VERSION'>, Method>;
  /** Plugin-specific checks of the parsed config; throws a TetherError naming the field. */
  validate(conf: NetConf, command: CniCommand): void;
  /** Where this plugin's tetherd listens, from its config. */
  socketPath(conf: NetConf): string;
  /** Where a DEL goes when tetherd is unreachable (lib/api/delete-queue.ts), from its config. */
  deleteQueueDir(conf: NetConf): string;
}

let connector: Connector | undefined;
let stdinReader: () => string | Promise<string> = readStdin;

/** Writes text to stdout or stderr; a promise when the write completes later (awaited before exit). */
export type Write = (text: string) => void | Promise<void>;
let writeOut: Write = (text) => void process.stdout.write(text);
let writeErr: Write = (text) => void process.stderr.write(text);

/**
 * Where the answer and the diagnostics go. The Bun build writes through Bun's own API: touching
 * process.stdout or process.stderr there builds Node's stream objects, which costs more at start than the
 * whole request (about 7 ms on 2 cores).
 */
export function useOutput(o: { out: Write; err: Write }): void {
  writeOut = o.out;
  writeErr = o.err;
}

/** How the request's stdin is read (the Bun build reads it with Bun's own API). */
export function useStdinReader(read: () => string | Promise<string>): void {
  stdinReader = read;
}

/**
 * The transport to tetherd, set by the entry point before a client runs: Bun's sockets in the Bun-built
 * CNI executable, Node's net in the Node single executable. (Importing either here would load it in both.)
 */
export function useConnector(c: Connector): void {
  connector = c;
}

export async function runCniClient(spec: ClientSpec): Promise<number> {
  let conf: NetConf | undefined;
  let command = '';
  try {
    const env = readEnv(process.env);
    command = env.command;
    const stdin = await stdinReader();
    if (env.command === 'VERSION') {
      // VERSION answers whatever version was asked: the reply lists what we support.
      await writeOut(JSON.stringify(versionReply(stdin)));
      return 0;
    }
    conf = parseNetConf(stdin, env.command);
    spec.validate(conf, env.command);
    const params: CniParams = {
      command: env.command,
      containerId: env.containerId,
      netns: env.netns,
      ifName: env.ifName,
      args: env.args,
      config: conf,
    };
    if (!connector) throw new TetherError(ErrorCode.Internal, 'no transport to tetherd (useConnector was not called)');
    // Read before the call: a bad field fails the DEL now, not after tetherd turned out to be away.
    const queueDir = env.command === 'DEL' ? spec.deleteQueueDir(conf) : '';
    let result: unknown;
    try {
      result = await callWith(connector, spec.socketPath(conf), spec.methods[env.command], params);
    } catch (e) {
      if (env.command !== 'DEL' || !(e instanceof TetherdUnreachable)) throw e;
      await queueForTetherd(queueDir, spec.methods.DEL as QueuedMethod, params, e);
      return 0;
    }
    if (env.command === 'ADD') await writeOut(JSON.stringify(result));
    return 0;
  } catch (e) {
    const unavailable = command === 'STATUS' && e instanceof TetherError && e.code === ErrorCode.TryAgainLater;
    await writeOut(JSON.stringify(errorReply(e, conf?.cniVersion, unavailable ? CNI_PLUGIN_NOT_AVAILABLE : undefined)));
    return 1;
  }
}

/**
 * DEL with tetherd away: recorded for tetherd to replay when it starts, and answered with success so the
 * chain's DEL goes on to the primary plugin (ADD, CHECK, STATUS and GC still fail: nothing may start
 * without tetherd, and the others are not needed to tear a pod down). One stderr line says what was done.
 */
function queueForTetherd(dir: string, method: QueuedMethod, params: CniParams, e: TetherdUnreachable): void | Promise<void> {
  const out = queueDelete(dir, { method, queuedAt: new Date().toISOString(), reason: e.message, params });
  const pod = params.args.K8S_POD_NAMESPACE && params.args.K8S_POD_NAME ? ` (pod ${params.args.K8S_POD_NAMESPACE}/${params.args.K8S_POD_NAME})` : '';
  const what = `DEL of container ${params.containerId} ${params.ifName}${pod}`;
  return writeErr(
    out.queued
      ? `${e.message}; ${what} queued in ${out.file} for tetherd to finish when it starts\n`
      : `${e.message}; ${what} answered without tetherd and not queued: ${out.why}\n`,
  );
}

/** An absolute path (the socket, the deletion queue) from a config field, or the default. */
export function absolutePathField(value: unknown, field: string, fallback: string): string {
  if (value === undefined) return fallback;
  if (typeof value !== 'string' || !value.startsWith('/')) throw new TetherError(ErrorCode.InvalidConfig, `${field}: must be an absolute path`);
  return value;
}
