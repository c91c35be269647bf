// A FAKE Kubernetes API server for tests: there is no kube-apiserver on these machines. It is small and
// behaves like the real one only in the ways that break clients: a cluster-wide resourceVersion; list and
// watch (chunked JSON lines) from a resourceVersion, 410 Gone (an ERROR event) once that version is
// compacted away (or pushed out of its bounded history); bookmarks for watches that allow them (on
// demand: bookmark()); a mode where every watch answers 410 (a 410 loop); watches it can drop on demand;
// create → 409 AlreadyExists; update with a stale resourceVersion → 409 Conflict; a status subresource
// that changes only status (and the main resource that never changes status); generation bumped on spec
// changes; label selectors (k=v, k==v, k!=v, k, !k) and field selectors (equality); Leases. Every request
// is recorded with its query (calls). One thing of a controller is modelled because nodes depend on it:
// the EndpointSlice controller keeps a slice's labels equal to its Service's (reserved keys aside;
// kubernetes/endpointslice setEndpointSliceLabels), for any slice naming a Service (copyServiceLabels).
// Anything else (admission, CRD schemas, auth beyond one bearer token, other controllers) is not modelled.
import * as http from 'node:http';
import { randomUUID } from 'node:crypto';

type Obj = Record<string, any>;

interface Resource {
  group: string; // '' for core
  version: string;
  plural: string;
  kind: string;
  namespaced: boolean;
  status: boolean;
}

export const RESOURCES: Resource[] = [
  { group: '', version: 'v1', plural: 'nodes', kind: 'Node', namespaced: false, status: true },
  { group: '', version: 'v1', plural: 'pods', kind: 'Pod', namespaced: true, status: true },
  { group: '', version: 'v1', plural: 'secrets', kind: 'Secret', namespaced: true, status: false },
  { group: '', version: 'v1', plural: 'services', kind: 'Service', namespaced: true, status: true },
  { group: 'discovery.k8s.io', version: 'v1', plural: 'endpointslices', kind: 'EndpointSlice', namespaced: true, status: false },
  { group: 'tether.dev', version: 'v1alpha1', plural: 'addresspools', kind: 'AddressPool', namespaced: false, status: true },
  { group: 'tether.dev', version: 'v1alpha1', plural: 'egresses', kind: 'Egress', namespaced: true, status: true },
  { group: 'tether.dev', version: 'v1alpha1', plural: 'addressblocks', kind: 'AddressBlock', namespaced: false, status: false },
  { group: 'coordination.k8s.io', version: 'v1', plural: 'leases', kind: 'Lease', namespaced: true, status: false },
  { group: 'events.k8s.io', version: 'v1', plural: 'events', kind: 'Event', namespaced: true, status: false },
  { group: 'tether.dev', version: 'v1alpha1', plural: 'tethernodes', kind: 'TetherNode', namespaced: false, status: true },
];

interface Event {
  rv: number;
  type: 'ADDED' | 'MODIFIED' | 'DELETED';
  res: Resource;
  obj: Obj;
}

interface Watcher {
  res: Resource;
  ns?: string;
  match: (o: Obj) => boolean;
  res_: http.ServerResponse;
  bookmarks: boolean;
  token?: string;
}

/** What one client (by bearer token) asked of the fake and was sent: for load measurements (the scale bench). */
export interface ClientLoad {
  /** Requests of any kind, watches included. */
  requests: number;
  lists: number;
  watches: number;
  writes: number;
  /** Events and bookmarks written to its watches. */
  events: number;
  /** Response bytes: list and object bodies, watch events. */
  bytes: number;
}

/** A request as the fake saw it. */
export interface Call {
  method: string;
  path: string;
  watch: boolean;
  query: Record<string, string>;
  at: number;
  /** The bearer token it carried (tests give each client its own to tell them apart). */
  token?: string;
}

/** Events kept for watches resumed from an older resourceVersion; older ones are gone (410). */
const HISTORY = 50_000;

const SERVICE_NAME = 'kubernetes.io/service-name';
const RESERVED_SLICE_LABELS = [SERVICE_NAME, 'endpointslice.kubernetes.io/managed-by', 'service.kubernetes.io/headless'];

const apiVersionOf = (r: Resource) => (r.group ? `${r.group}/${r.version}` : r.version);

export class FakeApiServer {
  private rv = 1;
  private readonly store = new Map<string, { res: Resource; obj: Obj }>();
  private history: Event[] = [];
  /** Events older than this resourceVersion are gone: a watch from before it gets 410. */
  private compactedBefore = 0;
  private readonly watchers = new Set<Watcher>();
  private readonly servers: http.Server[] = [];
  /** While true, watches receive nothing (a watch that stalls without an error, as client-node users see). */
  muteWatches = false;
  /** While true, every watch answers 410 Gone at once (an API server whose watch cache cannot serve). */
  goneLoop = false;
  /** Keep EndpointSlices' labels equal to their Service's, as the EndpointSlice controller does. */
  copyServiceLabels = true;
  /** Requests seen, by "VERB path" (for assertions). */
  readonly requests: string[] = [];
  /** Requests seen with their query parameters. */
  readonly calls: Call[] = [];
  /** Keep `requests` and `calls` (false: only `load`, for long runs with many clients). */
  recordCalls = true;
  /** Per bearer token ('' without one): requests, events and bytes (see ClientLoad). */
  readonly load = new Map<string, ClientLoad>();
  private readonly tokenOf = new WeakMap<http.ServerResponse, string>();

  private tally(token: string | undefined): ClientLoad {
    const k = token ?? '';
    let l = this.load.get(k);
    if (!l) this.load.set(k, (l = { requests: 0, lists: 0, watches: 0, writes: 0, events: 0, bytes: 0 }));
    return l;
  }

  constructor(private readonly token?: string) {}

  /** Listens on `port` of `host` (0: any free port) and/or a unix socket; returns the TCP URL. */
  async listen(opts: { host?: string; port?: number; socketPath?: string }): Promise<string | undefined> {
    const handler = (req: http.IncomingMessage, res: http.ServerResponse) => this.handle(req, res);
    let url: string | undefined;
    if (opts.host !== undefined || opts.port !== undefined) {
      const s = http.createServer(handler);
      await new Promise<void>((r) => s.listen(opts.port ?? 0, opts.host ?? '127.0.0.1', r));
      const a = s.address() as { address: string; port: number };
      url = `http://${a.address}:${a.port}`;
      this.servers.push(s);
    }
    if (opts.socketPath) {
      const s = http.createServer(handler);
      await new Promise<void>((r) => s.listen(opts.socketPath, r));
      this.servers.push(s);
    }
    return url;
  }

  async close(): Promise<void> {
    this.dropWatches();
    for (const s of this.servers) {
      s.closeAllConnections();
      await new Promise((r) => s.close(r));
    }
  }

  /** Ends every open watch, as an API server restart or a load balancer timeout does. */
  dropWatches(): number {
    const n = this.watchers.size;
    for (const w of this.watchers) w.res_.destroy();
    this.watchers.clear();
    return n;
  }

  /** Forgets the event history: watches resumed from an older resourceVersion get 410 Gone. */
  compact(): void {
    this.compactedBefore = this.rv + 1;
    this.history = [];
  }

  /** Sends a BOOKMARK with the current resourceVersion to every watch that allows bookmarks. */
  bookmark(): number {
    let n = 0;
    for (const w of this.watchers) {
      if (!w.bookmarks || this.muteWatches) continue;
      const line = JSON.stringify({ type: 'BOOKMARK', object: { apiVersion: apiVersionOf(w.res), kind: w.res.kind, metadata: { resourceVersion: String(this.rv) } } }) + '\n';
      w.res_.write(line);
      const l = this.tally(w.token);
      l.events++;
      l.bytes += line.length;
      n++;
    }
    return n;
  }

  /** Open watches (optionally of one resource plural). */
  openWatches(plural?: string): number {
    return [...this.watchers].filter((w) => !plural || w.res.plural === plural).length;
  }

  get resourceVersion(): number {
    return this.rv;
  }

  // ---- direct access for tests (same rules as HTTP) ------------------------------------------------

  apply(obj: Obj): Obj {
    const res = this.resourceOf(obj);
    const cur = this.store.get(this.key(res, obj.metadata.namespace, obj.metadata.name));
    if (!cur) return this.create(res, obj);
    return this.update(res, { ...obj, metadata: { ...obj.metadata, resourceVersion: undefined } }, false);
  }

  get(kind: string, name: string, namespace?: string): Obj | undefined {
    const res = RESOURCES.find((r) => r.kind === kind)!;
    return structuredClone(this.store.get(this.key(res, namespace, name))?.obj);
  }

  list(kind: string): Obj[] {
    return [...this.store.values()].filter((x) => x.res.kind === kind).map((x) => structuredClone(x.obj));
  }

  remove(kind: string, name: string, namespace?: string): boolean {
    const res = RESOURCES.find((r) => r.kind === kind)!;
    return this.delete(res, namespace, name) !== undefined;
  }

  // ---- HTTP ------------------------------------------------------------------------------------------

  private resourceOf(obj: Obj): Resource {
    const r = RESOURCES.find((x) => x.kind === obj.kind && apiVersionOf(x) === obj.apiVersion);
    if (!r) throw new Error(`fake apiserver: no resource for ${obj.apiVersion} ${obj.kind}`);
    return r;
  }

  private key(res: Resource, ns: string | undefined, name: string): string {
    return `${res.plural}/${res.namespaced ? ns ?? '' : ''}/${name}`;
  }

  private handle(req: http.IncomingMessage, res: http.ServerResponse): void {
    const url = new URL(req.url ?? '/', 'http://x');
    const token = req.headers.authorization?.replace(/^Bearer /, '');
    if (this.recordCalls) {
      this.requests.push(`${req.method} ${url.pathname}${url.searchParams.get('watch') ? ' (watch)' : ''}`);
      this.calls.push({ method: req.method ?? 'GET', path: url.pathname, watch: !!url.searchParams.get('watch'), query: Object.fromEntries(url.searchParams), at: Date.now(), token });
    }
    const l = this.tally(token);
    l.requests++;
    if (req.method !== 'GET') l.writes++;
    else if (url.searchParams.get('watch')) l.watches++;
    else l.lists++;
    this.tokenOf.set(res, token ?? '');
    if (this.token && req.headers.authorization !== `Bearer ${this.token}`) return this.status(res, 401, 'Unauthorized', 'bad or missing token');
    const m = /^\/(?:api\/(v1)|apis\/([^/]+)\/([^/]+))(?:\/namespaces\/([^/]+))?\/([^/]+)(?:\/([^/]+))?(?:\/(status))?$/.exec(url.pathname);
    if (!m) return this.status(res, 404, 'NotFound', `no route ${url.pathname}`);
    const [, coreV, group = '', groupV, ns, plural, name, sub] = m;
    const r = RESOURCES.find((x) => x.plural === plural && x.group === group && x.version === (coreV ?? groupV));
    if (!r) return this.status(res, 404, 'NotFound', `the server could not find the requested resource ${url.pathname}`);
    let body = '';
    req.on('data', (c: Buffer) => (body += c.toString()));
    req.on('end', () => {
      try {
        this.route(req.method ?? 'GET', r, ns, name, sub === 'status', url, body ? JSON.parse(body) : undefined, res);
      } catch (e) {
        const err = e as { code?: number; reason?: string; message: string };
        this.status(res, err.code ?? 500, err.reason ?? 'InternalError', err.message);
      }
    });
  }

  private route(method: string, r: Resource, ns: string | undefined, name: string | undefined, status: boolean, url: URL, body: Obj | undefined, res: http.ServerResponse): void {
    if (!name) {
      if (method === 'GET' && (url.searchParams.get('watch') === 'true' || url.searchParams.get('watch') === '1')) return this.watch(r, ns, url, res);
      if (method === 'GET') return this.send(res, 200, this.listBody(r, ns, url));
      if (method === 'POST') return this.send(res, 201, this.create(r, { ...body, metadata: { ...body?.metadata, namespace: r.namespaced ? ns : undefined } }));
      return this.status(res, 405, 'MethodNotAllowed', method);
    }
    const cur = this.store.get(this.key(r, ns, name));
    if (method === 'GET') return cur ? this.send(res, 200, cur.obj) : this.notFound(res, r, name);
    if (method === 'DELETE') {
      const gone = this.delete(r, ns, name);
      return gone ? this.send(res, 200, gone) : this.notFound(res, r, name);
    }
    if (!cur) return this.notFound(res, r, name);
    if (method === 'PUT') return this.send(res, 200, this.update(r, { ...body, metadata: { ...body?.metadata, name, namespace: r.namespaced ? ns : undefined } }, status));
    if (method === 'PATCH') {
      // JSON merge patch (RFC 7386), enough for status and label patches.
      const merged = mergePatch(structuredClone(cur.obj), body ?? {});
      merged.metadata.resourceVersion = body?.metadata?.resourceVersion;
      return this.send(res, 200, this.update(r, merged, status));
    }
    this.status(res, 405, 'MethodNotAllowed', method);
  }

  private matcher(url: URL): (o: Obj) => boolean {
    const pairs = (s: string | null) => (s ? s.split(',').filter(Boolean).map((p) => p.split('=') as [string, string]) : []);
    const labels = (url.searchParams.get('labelSelector') ?? '').split(',').filter(Boolean).map(labelTerm);
    const fields = pairs(url.searchParams.get('fieldSelector'));
    return (o) =>
      labels.every((t) => t(o.metadata?.labels ?? {})) &&
      fields.every(([k, v]) => String(k.split('.').reduce((x: any, p) => x?.[p], o) ?? '') === v);
  }

  private listBody(r: Resource, ns: string | undefined, url: URL): Obj {
    const match = this.matcher(url);
    const items = [...this.store.values()]
      .filter((x) => x.res === r && (!ns || x.obj.metadata.namespace === ns) && match(x.obj))
      .map((x) => x.obj);
    return { apiVersion: apiVersionOf(r), kind: `${r.kind}List`, metadata: { resourceVersion: String(this.rv) }, items };
  }

  private watch(r: Resource, ns: string | undefined, url: URL, res: http.ServerResponse): void {
    const from = Number(url.searchParams.get('resourceVersion') || this.rv);
    res.writeHead(200, { 'content-type': 'application/json', 'transfer-encoding': 'chunked' });
    res.flushHeaders();
    const match = this.matcher(url);
    if (this.goneLoop || from < this.compactedBefore - 1) {
      res.end(JSON.stringify({ type: 'ERROR', object: { kind: 'Status', apiVersion: 'v1', status: 'Failure', reason: 'Expired', code: 410, message: `too old resource version: ${from} (${this.compactedBefore})` } }) + '\n');
      return;
    }
    const w: Watcher = { res: r, ns, match, res_: res, bookmarks: url.searchParams.get('allowWatchBookmarks') === 'true', token: this.tokenOf.get(res) };
    for (const e of this.history) if (e.rv > from && e.res === r && (!ns || e.obj.metadata.namespace === ns) && match(e.obj)) this.deliver(w, JSON.stringify({ type: e.type, object: e.obj }) + '\n');
    this.watchers.add(w);
    res.on('close', () => this.watchers.delete(w));
  }

  private emit(type: Event['type'], res: Resource, obj: Obj): void {
    this.history.push({ rv: this.rv, type, res, obj });
    if (this.history.length > HISTORY) this.compactedBefore = this.history.shift()!.rv + 1;
    let line: string | undefined;
    for (const w of this.watchers) {
      if (this.muteWatches) break;
      if (w.res !== res || (w.ns && w.ns !== obj.metadata.namespace) || !w.match(obj)) continue;
      this.deliver(w, (line ??= JSON.stringify({ type, object: obj }) + '\n'));
    }
  }

  private deliver(w: Watcher, line: string): void {
    w.res_.write(line);
    const l = this.tally(w.token);
    l.events++;
    l.bytes += line.length;
  }

  private create(r: Resource, obj: Obj): Obj {
    const name = obj.metadata?.name;
    if (!name) throw Object.assign(new Error('metadata.name: Required value'), { code: 422, reason: 'Invalid' });
    if (r.namespaced && !obj.metadata.namespace) throw Object.assign(new Error('namespace required'), { code: 422, reason: 'Invalid' });
    const k = this.key(r, obj.metadata.namespace, name);
    if (this.store.has(k)) throw Object.assign(new Error(`${r.plural}.${r.group} "${name}" already exists`), { code: 409, reason: 'AlreadyExists' });
    this.rv++;
    const stored: Obj = structuredClone({ ...obj, apiVersion: apiVersionOf(r), kind: r.kind });
    stored.metadata = { ...stored.metadata, uid: randomUUID(), resourceVersion: String(this.rv), generation: 1, creationTimestamp: new Date().toISOString() };
    if (r.plural === 'endpointslices') {
      stored.metadata.labels = this.sliceLabels(stored);
      this.indexSlice(stored, k);
    }
    this.store.set(k, { res: r, obj: stored });
    this.emit('ADDED', r, stored);
    if (r.plural === 'services') this.relabelSlices(stored);
    return stored;
  }

  private update(r: Resource, obj: Obj, statusOnly: boolean): Obj {
    const k = this.key(r, obj.metadata.namespace, obj.metadata.name);
    const cur = this.store.get(k);
    if (!cur) throw Object.assign(new Error('not found'), { code: 404, reason: 'NotFound' });
    const want = obj.metadata.resourceVersion;
    if (want !== undefined && want !== cur.obj.metadata.resourceVersion) {
      throw Object.assign(new Error(`Operation cannot be fulfilled on ${r.plural}.${r.group} "${obj.metadata.name}": the object has been modified; please apply your changes to the latest version and try again`), { code: 409, reason: 'Conflict' });
    }
    const next: Obj = structuredClone(cur.obj);
    if (statusOnly) next.status = obj.status;
    else {
      // With a status subresource the main resource never changes status.
      for (const [key, v] of Object.entries(obj)) if (key !== 'metadata' && key !== 'status' && key !== 'apiVersion' && key !== 'kind') next[key] = v;
      for (const key of Object.keys(next)) if (!(key in obj) && !['metadata', 'status', 'apiVersion', 'kind'].includes(key)) delete next[key];
      if (!r.status && obj.status !== undefined) next.status = obj.status;
      next.metadata.labels = obj.metadata.labels;
      next.metadata.annotations = obj.metadata.annotations;
      if (obj.metadata.deletionTimestamp) next.metadata.deletionTimestamp = obj.metadata.deletionTimestamp;
      if (JSON.stringify(next.spec) !== JSON.stringify(cur.obj.spec)) next.metadata.generation = (cur.obj.metadata.generation ?? 1) + 1;
    }
    if (r.plural === 'endpointslices') {
      next.metadata.labels = this.sliceLabels(next);
      this.indexSlice(next, k);
    }
    if (JSON.stringify(next) === JSON.stringify(cur.obj)) return cur.obj;
    this.rv++;
    next.metadata.resourceVersion = String(this.rv);
    cur.obj = next;
    this.emit('MODIFIED', r, next);
    if (r.plural === 'services') this.relabelSlices(next);
    return next;
  }

  /** A slice's labels as the EndpointSlice controller keeps them: its reserved ones plus its Service's. */
  private sliceLabels(slice: Obj): Record<string, string> | undefined {
    const own = slice.metadata?.labels as Record<string, string> | undefined;
    const svcName = own?.[SERVICE_NAME];
    if (!this.copyServiceLabels || !svcName) return own;
    const svc = this.store.get(this.key(RESOURCES.find((x) => x.plural === 'services')!, slice.metadata.namespace, svcName))?.obj;
    if (!svc) return own;
    const out: Record<string, string> = {};
    for (const [k, v] of Object.entries(own ?? {})) if (RESERVED_SLICE_LABELS.includes(k)) out[k] = v;
    for (const [k, v] of Object.entries((svc.metadata?.labels ?? {}) as Record<string, string>)) if (!RESERVED_SLICE_LABELS.includes(k)) out[k] = v;
    return out;
  }

  private relabelSlices(svc: Obj): void {
    if (!this.copyServiceLabels) return;
    const slices = RESOURCES.find((x) => x.plural === 'endpointslices')!;
    for (const k of this.slicesOf.get(`${svc.metadata.namespace}/${svc.metadata.name}`) ?? []) {
      const obj = this.store.get(k)?.obj;
      if (!obj || obj.metadata.labels?.[SERVICE_NAME] !== svc.metadata.name) continue;
      this.update(slices, { ...structuredClone(obj), metadata: { ...structuredClone(obj.metadata), resourceVersion: undefined } }, false);
    }
  }

  /** Slices (store keys) by "namespace/service" they named when written (checked again on use). */
  private readonly slicesOf = new Map<string, Set<string>>();

  private indexSlice(obj: Obj, k: string): void {
    const svcName = obj.metadata?.labels?.[SERVICE_NAME];
    if (!svcName) return;
    const key = `${obj.metadata.namespace}/${svcName}`;
    if (!this.slicesOf.has(key)) this.slicesOf.set(key, new Set());
    this.slicesOf.get(key)!.add(k);
  }

  private delete(r: Resource, ns: string | undefined, name: string): Obj | undefined {
    const k = this.key(r, ns, name);
    const cur = this.store.get(k);
    if (!cur) return undefined;
    this.store.delete(k);
    this.rv++;
    const gone = { ...cur.obj, metadata: { ...cur.obj.metadata, resourceVersion: String(this.rv) } };
    this.emit('DELETED', r, gone);
    return gone;
  }

  private notFound(res: http.ServerResponse, r: Resource, name: string): void {
    this.status(res, 404, 'NotFound', `${r.plural}.${r.group} "${name}" not found`);
  }

  private status(res: http.ServerResponse, code: number, reason: string, message: string): void {
    this.send(res, code, { kind: 'Status', apiVersion: 'v1', metadata: {}, status: 'Failure', message, reason, code });
  }

  private send(res: http.ServerResponse, code: number, body: unknown): void {
    const text = JSON.stringify(body);
    this.tally(this.tokenOf.get(res)).bytes += text.length;
    res.writeHead(code, { 'content-type': 'application/json' });
    res.end(text);
  }
}

/** A kubeconfig for `url` (with the token, if any), as tetherd --kubeconfig reads it. */
export function kubeconfigFor(url: string, token = 'fake-token'): string {
  return [
    'apiVersion: v1', 'kind: Config', 'current-context: fake',
    'clusters:', `- name: fake`, `  cluster: { server: "${url}", insecure-skip-tls-verify: true }`,
    'users:', `- name: fake`, `  user: { token: "${token}" }`,
    'contexts:', '- name: fake', '  context: { cluster: fake, user: fake }', '',
  ].join('\n');
}

/** One term of a label selector: k=v, k==v, k!=v, k (exists), !k (does not exist). */
function labelTerm(term: string): (labels: Record<string, string>) => boolean {
  const ne = /^([^!=]+)!=(.*)$/.exec(term);
  if (ne) return (l) => l[ne[1]] !== ne[2];
  const eq = /^([^!=]+)==?(.*)$/.exec(term);
  if (eq) return (l) => l[eq[1]] === eq[2];
  if (term.startsWith('!')) return (l) => !(term.slice(1) in l);
  return (l) => term in l;
}

function mergePatch(target: Obj, patch: Obj): Obj {
  for (const [k, v] of Object.entries(patch)) {
    if (v === null) delete target[k];
    else if (typeof v === 'object' && !Array.isArray(v) && typeof target[k] === 'object' && target[k] !== null && !Array.isArray(target[k])) target[k] = mergePatch(target[k], v);
    else target[k] = v;
  }
  return target;
}
