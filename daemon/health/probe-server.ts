// tetherd's own probes for kubelet (the DaemonSet's startupProbe, livenessProbe and readinessProbe), on a
// port bound to the loopback address only: an httpGet is cheap where an exec of tetherctl would start a
// 100 MB executable every few seconds. Not kube-proxy's health contract (health-server.ts): that one
// answers external load balancers about Services and the node.
//   /livez   200 while the event loop answers (a wedged tetherd is restarted)
//   /readyz  200 only when the socket serves, the runtime's CNI configuration chains tether (when
//            --cni-net-dir is given), no pod's role failed to be set up and no egress standby of this
//            node cannot sync with its owner (a rollout then stops on this node); else 503 naming why
import * as http from 'node:http';
import type { AddressInfo } from 'node:net';
import type { RoleProblem } from '../pod/role-problems';

export interface ProbeSources {
  /** Whether tetherd finished starting (socket served, subsystems started). */
  started: () => boolean;
  /** Who answers (default tetherd; tether-operator serves the same probes). */
  what?: string;
  /** The installer's verdict on the runtime's CNI configuration, when tetherd is told where it is. */
  cniConfig?: () => { ready: boolean; why: string };
  roleProblems: () => RoleProblem[];
  /** Egress standbys that cannot sync with their owner (EgressController.standbyProblems), one line each. */
  egressSync?: () => string[];
}

export interface ProbeAnswer {
  status: number;
  body: string;
}

/** What /readyz answers, as a pure function of its sources (tested without a listener). */
export function readyAnswer(s: ProbeSources): ProbeAnswer {
  const why: string[] = [];
  if (!s.started()) why.push(`${s.what ?? 'tetherd'} is starting`);
  const cni = s.cniConfig?.();
  if (cni && !cni.ready) why.push(`CNI configuration: ${cni.why}`);
  for (const p of s.roleProblems()) why.push(`pod ${p.pod}: ${p.role} role not set up since ${p.since}: ${p.error}`);
  why.push(...(s.egressSync?.() ?? []));
  return why.length ? { status: 503, body: `not ready:\n${why.join('\n')}\n` } : { status: 200, body: 'ready\n' };
}

export class ProbeServer {
  private server?: http.Server;

  constructor(private readonly sources: ProbeSources) {}

  async listen(port: number, host = '127.0.0.1'): Promise<number> {
    const server = http.createServer((req, res) => {
      const path = (req.url ?? '/').split('?')[0];
      const a: ProbeAnswer = path === '/livez' ? { status: 200, body: 'ok\n' } : path === '/readyz' ? readyAnswer(this.sources) : { status: 404, body: 'unknown path: /livez or /readyz\n' };
      res.writeHead(a.status, { 'Content-Type': 'text/plain; charset=utf-8', 'X-Content-Type-Options': 'nosniff' });
      res.end(a.body);
    });
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(port, host, () => {
        server.off('error', reject);
        resolve();
      });
    });
    this.server = server;
    return (server.address() as AddressInfo).port;
  }

  async close(): Promise<void> {
    const s = this.server;
    this.server = undefined;
    if (!s) return;
    s.closeAllConnections();
    await new Promise<void>((resolve) => s.close(() => resolve()));
  }
}
