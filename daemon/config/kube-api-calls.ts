// Kubernetes API requests that failed, by verb, resource and HTTP code ("network" when no answer came):
// counted where every client of one KubeConfig sends them (its makeApiClient's HTTP library), so the
// reflectors' lists, the status writers, the Event recorder and the leader election are all counted
// without each of them knowing. Watches are sent by client-node's Watch on its own fetch: the reflector
// reports their failures with watchFailed(). Nothing here changes a request or its answer.
import * as k8s from '@kubernetes/client-node';

export interface ApiErrorCount {
  verb: string;
  resource: string;
  code: string;
  count: number;
}

/** Kubernetes' verb and resource of a request, from its method and URL (resource "pods/status" for a subresource). */
export function verbAndResource(method: string, url: string): { verb: string; resource: string } {
  const u = new URL(url, 'http://x');
  const segs = u.pathname.split('/').filter(Boolean);
  // /api/v1/… or /apis/<group>/<version>/…
  let rest = segs[0] === 'api' ? segs.slice(2) : segs[0] === 'apis' ? segs.slice(3) : segs;
  if (rest[0] === 'namespaces' && rest.length >= 3) rest = rest.slice(2);
  const [resource = 'unknown', name, sub] = rest;
  const m = method.toUpperCase();
  let verb: string;
  if (m === 'GET') verb = name ? 'get' : u.searchParams.get('watch') === 'true' || u.searchParams.get('watch') === '1' ? 'watch' : 'list';
  else if (m === 'POST') verb = 'create';
  else if (m === 'PUT') verb = 'update';
  else if (m === 'PATCH') verb = 'patch';
  else if (m === 'DELETE') verb = name ? 'delete' : 'deletecollection';
  else verb = m.toLowerCase();
  return { verb, resource: sub ? `${resource}/${sub}` : resource };
}

export class KubeApiCalls {
  private readonly errors = new Map<string, ApiErrorCount>();

  /** One failed request (an HTTP code of 400 or more, or "network"). */
  failed(verb: string, resource: string, code: string): void {
    const key = `${verb} ${resource} ${code}`;
    const e = this.errors.get(key);
    if (e) e.count++;
    else this.errors.set(key, { verb, resource, code, count: 1 });
  }

  /** A watch that ended with an error: its HTTP code, or "network" without one. */
  watchFailed(resource: string, err: unknown): void {
    const code = Number((err as { statusCode?: unknown; code?: unknown })?.statusCode ?? (err as { code?: unknown })?.code);
    this.failed('watch', resource, Number.isInteger(code) && code >= 100 ? String(code) : 'network');
  }

  /** Every failed request so far (counters: they only grow). */
  list(): ApiErrorCount[] {
    return [...this.errors.values()].map((e) => ({ ...e }));
  }

  /**
   * Counts the failed requests of every API client `kc` makes from now on: its makeApiClient builds the same
   * configuration as client-node's, with the default HTTP library wrapped.
   */
  instrument(kc: k8s.KubeConfig): void {
    const inner = new k8s.IsomorphicFetchHttpLibrary();
    const httpApi = k8s.wrapHttpLibrary({
      send: async (req: k8s.RequestContext): Promise<k8s.ResponseContext> => {
        const { verb, resource } = verbAndResource(String(req.getHttpMethod()), req.getUrl());
        let res: k8s.ResponseContext;
        try {
          res = await inner.send(req).toPromise();
        } catch (e) {
          if ((e as { name?: string })?.name !== 'AbortError') this.failed(verb, resource, 'network');
          throw e;
        }
        if (res.httpStatusCode >= 400) this.failed(verb, resource, String(res.httpStatusCode));
        return res;
      },
    });
    kc.makeApiClient = function makeApiClient<T extends k8s.ApiType>(this: k8s.KubeConfig, apiClientType: k8s.ApiConstructor<T>): T {
      const cluster = this.getCurrentCluster();
      if (!cluster) throw new Error('No active cluster!');
      const config = k8s.createConfiguration({ baseServer: new k8s.ServerConfiguration(cluster.server, {}), authMethods: { default: this }, httpApi });
      return new apiClientType(config);
    };
  }
}
