// tether: the chained CNI plugin. A thin client: it checks what the spec asks of every plugin
// (version, environment, config shape, prevResult), forwards the request to the node's tetherd over its
// Unix socket, and prints tetherd's answer or a CNI error. All pod work happens in tetherd.
import { call } from '../daemon/api/client';
import { DEFAULT_SOCKET_PATH, type CniParams, type Method } from '../daemon/api/protocol';
import { ErrorCode, TetherError } from '../daemon/errors';
import { errorReply, parseNetConf, readEnv, readStdin, versionReply, type NetConf } from './spec';

/** CNI 1.1 STATUS: 50 = the plugin cannot service ADD requests. */
const CNI_PLUGIN_NOT_AVAILABLE = 50;

const METHODS: Record<string, Method> = { ADD: 'cni.add', DEL: 'cni.del', CHECK: 'cni.check', STATUS: 'cni.status', GC: 'cni.gc' };

function socketPathOf(conf: NetConf): string {
  const p = conf.socketPath;
  if (p === undefined) return DEFAULT_SOCKET_PATH;
  if (typeof p !== 'string' || !p.startsWith('/')) throw new TetherError(ErrorCode.InvalidConfig, 'socketPath: must be an absolute path');
  return p;
}

export async function main(): Promise<number> {
  let conf: NetConf | undefined;
  let command = '';
  try {
    const env = readEnv(process.env);
    command = env.command;
    const stdin = readStdin();
    if (env.command === 'VERSION') {
      // VERSION answers whatever version was asked: the reply lists what we support.
      process.stdout.write(JSON.stringify(versionReply(stdin)));
      return 0;
    }
    conf = parseNetConf(stdin, env.command);
    if ((env.command === 'ADD' || env.command === 'CHECK') && conf.prevResult === undefined) {
      throw new TetherError(ErrorCode.InvalidConfig, `prevResult: missing; tether is a chained plugin and must follow a primary plugin in a conflist`);
    }
    const params: CniParams = {
      command: env.command,
      containerId: env.containerId,
      netns: env.netns,
      ifName: env.ifName,
      args: env.args,
      config: conf,
    };
    const result = await call(socketPathOf(conf), METHODS[env.command], params);
    if (env.command === 'ADD') process.stdout.write(JSON.stringify(result));
    return 0;
  } catch (e) {
    const unavailable = command === 'STATUS' && e instanceof TetherError && e.code === ErrorCode.TryAgainLater;
    process.stdout.write(JSON.stringify(errorReply(e, conf?.cniVersion, unavailable ? CNI_PLUGIN_NOT_AVAILABLE : undefined)));
    return 1;
  }
}
