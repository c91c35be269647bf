// tetherd: the node daemon. One per node; several can run side by side (the testbed), each with its own
// socket, state dir and bpffs pin dir. Pods it attached are recorded in the state dir and survive restarts.
import * as fs from 'node:fs';
import * as os from 'node:os';
import { parseArgs } from 'node:util';
import { DEFAULT_SOCKET_PATH, type CniParams } from './api/protocol';
import { makeLogger, setLogger } from './log';
import { ApiServer } from './server';
import { PodStore } from './state/pod-store';
import { AttachService } from './pod/attach-service';
import { ErrorCode, TetherError } from './errors';
import { loadNodeConfig, type NodeConfig } from './config/node-config';

const VERSION = '0.1.0';

const USAGE = `usage: tetherd [--node-name NAME] [--socket PATH] [--state-dir DIR] [--bpf-pin-dir DIR] [--config FILE] [--log-level LEVEL]`;

export async function main(argv: string[]): Promise<number> {
  let opts;
  try {
    opts = parseArgs({
      args: argv,
      options: {
        'node-name': { type: 'string' },
        socket: { type: 'string', default: DEFAULT_SOCKET_PATH },
        'state-dir': { type: 'string', default: '/var/lib/tether' },
        'bpf-pin-dir': { type: 'string', default: '/sys/fs/bpf/tether' },
        config: { type: 'string' },
        'log-level': { type: 'string', default: 'info' },
        help: { type: 'boolean' },
      },
    }).values;
  } catch (e) {
    process.stderr.write(`tetherd: ${(e as Error).message}\n${USAGE}\n`);
    return 2;
  }
  if (opts.help) {
    process.stdout.write(USAGE + '\n');
    return 0;
  }
  process.umask(0o077);
  const nodeName = opts['node-name'] ?? process.env.NODE_NAME ?? os.hostname();
  const logger = makeLogger({ level: opts['log-level'], node: nodeName });
  setLogger(logger);

  let nodeConfig: NodeConfig;
  try {
    nodeConfig = loadNodeConfig(opts.config, nodeName);
  } catch (e) {
    logger.error('config rejected', { error: (e as Error).message });
    return 2;
  }
  const stateDir = opts['state-dir'] as string;
  fs.mkdirSync(stateDir, { recursive: true, mode: 0o700 });
  const store = new PodStore(stateDir);
  const { loaded, broken } = store.load();
  for (const b of broken) logger.error('state: unreadable pod record set aside', { file: b });
  const attach = new AttachService(store, logger);
  const started = Date.now();

  const asCni = (p: unknown): CniParams => {
    if (!p || typeof p !== 'object') throw new TetherError(ErrorCode.BadRequest, 'params must be an object');
    const c = p as CniParams;
    if (!c.config || typeof c.config !== 'object') throw new TetherError(ErrorCode.BadRequest, 'params.config must be an object');
    if (!c.args || typeof c.args !== 'object') c.args = {};
    return c;
  };
  const server = new ApiServer(
    opts.socket as string,
    {
      ping: () => ({ pong: true, node: nodeName }),
      'cni.add': (p) => attach.add(asCni(p)),
      'cni.del': (p) => attach.del(asCni(p)),
      'cni.check': (p) => attach.check(asCni(p)),
      'cni.gc': (p) => attach.gc(asCni(p)),
      'cni.status': () => ({ ready: true }),
      status: () => ({
        node: nodeName,
        zone: nodeConfig.zone,
        version: VERSION,
        uptimeSeconds: Math.round((Date.now() - started) / 1000),
        stateDir,
        bpfPinDir: opts['bpf-pin-dir'],
        pods: store.all().map((r) => ({
          network: r.network,
          containerId: r.containerId,
          ifName: r.ifName,
          pod: r.podNamespace && r.podName ? `${r.podNamespace}/${r.podName}` : undefined,
          netns: r.netns,
          phase: r.phase,
        })),
      }),
    },
    logger,
  );
  try {
    await server.listen();
  } catch (e) {
    logger.error('cannot serve socket', { socket: opts.socket, error: (e as Error).message });
    return 1;
  }
  logger.info('tetherd started', { version: VERSION, socket: opts.socket, stateDir, bpfPinDir: opts['bpf-pin-dir'], podsRecorded: loaded });

  return new Promise<number>((resolve) => {
    const stop = (signal: string) => {
      logger.info('tetherd stopping', { signal });
      void server.close().then(() => {
        logger.info('tetherd stopped', { signal });
        logger.on('finish', () => resolve(0));
        logger.end();
      });
    };
    process.once('SIGTERM', () => stop('SIGTERM'));
    process.once('SIGINT', () => stop('SIGINT'));
  });
}
