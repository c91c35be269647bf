// tetherd's socket API: the methods the CNI clients and tetherctl call, and the status it reports.
import type { CniParams } from '../../lib/api/protocol';
import { asTetherError, ErrorCode, TetherError } from '../../lib/errors';
import { ApiServer, type Handler } from '../server';
import type { CniPlugin } from '../metrics/tether-metrics';
import type { Logger } from '../../lib/log';
import type { PodStore } from '../state/pod-store';
import type { AttachService } from '../pod/attach-service';
import type { OwnerRequest } from '../../ipam/cluster-addresses';
import type { LoopLag } from '../util/loop-lag';
import { VERSION } from '../../lib/version';
import { validateCniRequest, type CniRequestFields } from '../../lib/cni-validate';
import type { Ipam } from './ipam';
import type { CurrentConfig } from './source';
import type { Subsystem } from './subsystem';
import { ProbeServer } from '../health/probe-server';
import { readiness } from '../../install/cni/installer';
import { RUNTIMES, type Runtime } from '../../install/cni/libcni';
import { portOption } from '../options';
import { StartError, type Part } from '../lifecycle';

const asObject = <T>(p: unknown): T => {
  if (!p || typeof p !== 'object' || Array.isArray(p)) throw new TetherError(ErrorCode.BadRequest, 'params must be an object');
  return p as T;
};

const asCni = (p: unknown, requireNetns = true): CniParams => {
  if (!p || typeof p !== 'object') throw new TetherError(ErrorCode.BadRequest, 'params must be an object');
  const c = p as CniParams;
  if (!c.config || typeof c.config !== 'object') throw new TetherError(ErrorCode.BadRequest, 'params.config must be an object');
  if (c.args === undefined || c.args === null) c.args = {};
  // The thin clients checked all of this; a request that bypassed them is checked the same way.
  validateCniRequest(c as unknown as CniRequestFields, { requireNetns });
  return c;
};

export interface ApiDeps {
  socket: string;
  nodeName: string;
  stateDir: string;
  bpfPinDir: string;
  current: CurrentConfig;
  podStore: PodStore;
  attach: AttachService;
  ipam: Ipam;
  /** Every subsystem, in the order their fields appear in the status answer (health checks join once started). */
  subsystems: ReadonlyArray<Subsystem<never>>;
  loopLag: LoopLag;
  logger: Logger;
  /** The Kubernetes source's watches (each resource followed, and what keeps one from being followed). */
  kubernetes?: () => Record<string, unknown>;
  /** Told of every CNI request answered (metrics): the plugin, its command, seconds taken, the error code if it failed. */
  cniAnswered?: (plugin: CniPlugin, command: string, seconds: number, code?: string) => void;
}

/** A CNI method's handler, timed and its result told to `answered` (one place for every CNI request). */
function timed(plugin: CniPlugin, command: string, h: Handler, answered: ApiDeps['cniAnswered']): Handler {
  if (!answered) return h;
  return async (p) => {
    const t0 = process.hrtime.bigint();
    const seconds = () => Number(process.hrtime.bigint() - t0) / 1e9;
    try {
      const r = await h(p);
      answered(plugin, command, seconds());
      return r;
    } catch (e) {
      answered(plugin, command, seconds(), asTetherError(e).code);
      throw e;
    }
  };
}

export function apiServer(d: ApiDeps): ApiServer {
  const started = Date.now();
  const { attach, ipam } = d;
  const cni = (command: string, h: Handler) => timed('tether', command, h, d.cniAnswered);
  const cniIpam = (command: string, h: Handler) => timed('tether-ipam', command, h, d.cniAnswered);
  return new ApiServer(
    d.socket,
    {
      ping: () => ({ pong: true, node: d.nodeName }),
      'cni.add': cni('ADD', (p) => attach.add(asCni(p))),
      'cni.del': cni('DEL', (p) => attach.del(asCni(p))),
      'cni.check': cni('CHECK', (p) => attach.check(asCni(p))),
      'cni.gc': cni('GC', (p) => attach.gc(asCni(p))),
      'cni.status': cni('STATUS', () => ({ ready: true })),
      'ipam.add': cniIpam('ADD', (p) => ipam.service.add(asCni(p, false))),
      'ipam.del': cniIpam('DEL', (p) => ipam.service.del(asCni(p, false))),
      'ipam.check': cniIpam('CHECK', (p) => ipam.service.check(asCni(p, false))),
      'ipam.gc': cniIpam('GC', (p) => ipam.service.gc(asCni(p, false))),
      'address.allocate': (p) => ipam.addresses.allocate(asObject<OwnerRequest>(p)),
      'address.release': (p) => {
        const r = asObject<{ pool: string; owner: string }>(p);
        return ipam.addresses.release(r.pool, r.owner).then((released) => ({ released }));
      },
      status: async () => ({
        node: d.nodeName,
        zone: d.current.node.zone,
        version: VERSION,
        uptimeSeconds: Math.round((Date.now() - started) / 1000),
        stateDir: d.stateDir,
        bpfPinDir: d.bpfPinDir,
        pools: d.current.config.pools.map((p) => p.name),
        ...Object.assign({}, ...(await Promise.all(d.subsystems.map((s) => s.status())))),
        kubernetes: d.kubernetes?.(),
        roleProblems: attach.roleProblems.list(),
        eventLoop: { lagMaxMs: d.loopLag.maxMs(), lagMaxPerSecondMs: d.loopLag.series() },
        pods: d.podStore.all().map((r) => ({
          network: r.network,
          containerId: r.containerId,
          ifName: r.ifName,
          pod: r.podNamespace && r.podName ? `${r.podNamespace}/${r.podName}` : undefined,
          netns: r.netns,
          phase: r.phase,
        })),
      }),
    },
    d.logger,
  );
}

/** The socket API as a part: served from its start (a socket it cannot serve fails the start, exit 1). */
export function socketApi(d: ApiDeps): Part {
  const server = apiServer(d);
  return {
    name: 'socket API',
    start: async () => {
      try {
        await server.listen();
      } catch (e) {
        throw new StartError(1, `cannot serve socket ${d.socket}: ${(e as Error).message}`);
      }
    },
    stop: () => server.close(),
  };
}

/**
 * kubelet's probes (--probe-port on 127.0.0.1): opened first, so a startupProbe sees a starting tetherd
 * (/livez 200, /readyz 503 "starting") rather than a refused connection; `markStarted` flips /readyz on.
 * With --probe-port 0 there is nothing to start (`serves` is false) and the rest are no-ops.
 */
export class Probes implements Part {
  readonly name = 'probes';
  private isStarted = false;
  /** The egress controller is created after the probes listen: its standbys' sync joins /readyz then. */
  private egressProblems?: () => string[];
  private readonly port?: number;
  private readonly netDir?: string;
  private readonly server?: ProbeServer;

  constructor(
    opts: { 'probe-port': string; 'cni-net-dir'?: string; 'cni-runtime': string },
    attach: AttachService,
    private readonly logger: Logger,
  ) {
    if (opts['probe-port'] === '0') return;
    this.port = portOption('probe-port', opts['probe-port']);
    const netDir = (this.netDir = opts['cni-net-dir']);
    const runtime = opts['cni-runtime'] as Runtime;
    if (!RUNTIMES.includes(runtime)) throw new StartError(2, `--cni-runtime ${runtime}: must be one of ${RUNTIMES.join(', ')}`);
    this.server = new ProbeServer({
      started: () => this.isStarted,
      cniConfig: netDir ? () => readiness(netDir, undefined, runtime) : undefined,
      roleProblems: () => attach.roleProblems.list(),
      egressSync: () => this.egressProblems?.() ?? [],
    });
  }

  /** Whether there is a listener to start (--probe-port is not 0). */
  get serves(): boolean {
    return this.server !== undefined;
  }

  async start(): Promise<void> {
    if (!this.server) return;
    try {
      await this.server.listen(this.port!);
    } catch (e) {
      throw new StartError(1, `--probe-port ${this.port}: cannot listen on 127.0.0.1: ${(e as Error).message}`);
    }
    this.logger.info('probes listening', { address: `127.0.0.1:${this.port}`, paths: ['/livez', '/readyz'], cniNetDir: this.netDir });
  }

  async stop(): Promise<void> {
    await this.server?.close();
  }

  markStarted(): void {
    this.isStarted = true;
  }

  egressSync(problems: () => string[]): void {
    this.egressProblems = problems;
  }
}
