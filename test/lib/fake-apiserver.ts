// A FAKE Kubernetes API server for tests: there is no kube-apiserver on these machines. It is small and
// behaves like the real one only in the ways that break clients: a cluster-wide resourceVersion; list and
// watch (chunked JSON lines) from a resourceVersion, 410 Gone (an ERROR event) once that version is
// compacted away (or pushed out of its bounded history); bookmarks for watches that allow them (on
// demand: bookmark()); a mode where every watch answers 410 (a 410 loop); watches it can drop on demand;
// create → 409 AlreadyExists; update with a stale resourceVersion → 409 Conflict; a status subresource
// that changes only status (and the main resource that never changes status); generation bumped on spec
// changes; label selectors (k=v, k==v, k!=v, k, !k) and field selectors (=, ==, !=; only the fields the
// real server knows for the resource, else 400); Leases, whose MicroTime fields (and an Event's) are parsed as
// Go's RFC3339Micro (exactly six fractional digits, else 400); DELETE preconditions (uid, resourceVersion:
// 409); finalizers (a DELETE of an object with finalizers sets deletionTimestamp; it goes when the last one
// is removed); generateName; empty metadata maps and lists dropped as ObjectMeta's omitempty does; Status
// bodies with the upstream messages and details. Every request is recorded with its query (calls), every
// write as an admission plug-in sees it (admissions), and an `admit` hook can refuse writes as a
// ValidatingAdmissionPolicy does (test/lib/admission-request.ts). docs/testing.md lists what still differs. One thing of a controller is modelled because nodes depend on it:
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

/**
 * One write as an admission plug-in sees it (the API server's admission.Attributes): the object after
 * defaulting and name generation (null for a DELETE), the object before (null for a CREATE); a PATCH is an
 * UPDATE of the patched object; a status write has subResource 'status' and the old spec.
 */
export interface AdmissionAttributes {
  operation: 'CREATE' | 'UPDATE' | 'DELETE';
  group: string;
  version: string;
  resource: string;
  /** '' for the main resource. */
  subResource: string;
  kind: string;
  /** '' when unknown (a CREATE with generateName has its generated name in object.metadata.name). */
  name: string;
  /** '' for a cluster-scoped object. */
  namespace: string;
  object: Obj | null;
  oldObject: Obj | null;
  /** The bearer token of the request: who made it. */
  token?: string;
}

/** An admission verdict: a denial is answered with `code` (403 for reason Forbidden, 422 for Invalid). */
export interface AdmissionVerdict {
  allowed: boolean;
  message?: string;
  reason?: string;
  code?: number;
}

/** Fields each resource can be selected by (fieldSelector); every resource also has metadata.name and metadata.namespace. */
const SELECTABLE: Record<string, string[]> = {
  pods: ['spec.nodeName', 'spec.restartPolicy', 'spec.schedulerName', 'spec.serviceAccountName', 'spec.hostNetwork', 'status.phase', 'status.podIP', 'status.nominatedNodeName'],
  nodes: ['spec.unschedulable'],
  secrets: ['type'],
  services: ['spec.clusterIP', 'spec.type'],
  events: ['involvedObject.kind', 'involvedObject.namespace', 'involvedObject.name', 'involvedObject.uid', 'involvedObject.apiVersion', 'involvedObject.resourceVersion', 'involvedObject.fieldPath', 'reason', 'reportingComponent', 'source', 'type'],
};

/** MicroTime fields of typed objects, by kind: parsed with Go's RFC3339Micro layout (exactly six fractional digits). */
const MICRO_TIME: Record<string, string[][]> = {
  Lease: [['spec', 'acquireTime'], ['spec', 'renewTime']],
  Event: [['eventTime'], ['series', 'lastObservedTime']],
};
const MICRO = /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}(Z|[+-]\d\d:\d\d)$/;

/** metav1.Time as the server writes it: RFC 3339, whole seconds, UTC. */
const rfc3339 = (d: Date) => d.toISOString().replace(/\.\d{3}Z$/, 'Z');

class ApiError extends Error {
  constructor(readonly code: number, readonly reason: string, message: string, readonly details?: Obj) {
    super(message);
  }
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
  /** Writes as admission sees them, with the verdict (kept while recordCalls). */
  readonly admissions: Array<AdmissionAttributes & { allowed: boolean; message?: string }> = [];
  /** Validating admission of HTTP writes (direct apply/remove are not admitted): a denial fails the request. */
  admit?: (a: AdmissionAttributes) => AdmissionVerdict;
  /** The request being served (its token), while a write is admitted. */
  private serving?: { token?: string };

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
      this.serving = { token };
      try {
        let parsed: Obj | undefined;
        try {
          parsed = body ? JSON.parse(body) : undefined;
        } catch (e) {
          throw new ApiError(400, 'BadRequest', `the body of the request was in an unknown format: ${(e as Error).message}`);
        }
        this.route(req.method ?? 'GET', r, ns, name, sub === 'status', url, parsed, res);
      } catch (e) {
        const err = e as { code?: number; reason?: string; message: string; details?: Obj };
        this.status(res, err.code ?? 500, err.reason ?? 'InternalError', err.message, err.details);
      } finally {
        this.serving = undefined;
      }
    });
  }

  private route(method: string, r: Resource, ns: string | undefined, name: string | undefined, status: boolean, url: URL, body: Obj | undefined, res: http.ServerResponse): void {
    if (!name) {
      if (method === 'GET' && (url.searchParams.get('watch') === 'true' || url.searchParams.get('watch') === '1')) return this.watch(r, ns, url, res);
      if (method === 'GET') return this.send(res, 200, this.listBody(r, ns, url));
      if (method === 'POST') {
        if (r.namespaced && body?.metadata?.namespace && body.metadata.namespace !== ns) {
          throw new ApiError(400, 'BadRequest', 'the namespace of the provided object does not match the namespace sent on the request');
        }
        if (body?.metadata?.resourceVersion) throw new ApiError(500, 'InternalError', 'resourceVersion should not be set on objects to be created');
        return this.send(res, 201, this.create(r, { ...body, metadata: { ...body?.metadata, namespace: r.namespaced ? ns : undefined } }));
      }
      return this.status(res, 405, 'MethodNotAllowed', method);
    }
    const cur = this.store.get(this.key(r, ns, name));
    if (method === 'GET') return cur ? this.send(res, 200, cur.obj) : this.notFound(res, r, name);
    if (method === 'DELETE') {
      if (!cur) return this.notFound(res, r, name);
      const pre = body?.preconditions as { uid?: string; resourceVersion?: string } | undefined;
      if (pre?.uid && pre.uid !== cur.obj.metadata.uid) {
        throw new ApiError(409, 'Conflict', `Operation cannot be fulfilled on ${qualified(r)} "${name}": Precondition failed: UID in precondition: ${pre.uid}, UID in object meta: ${cur.obj.metadata.uid}`, { name, group: r.group, kind: r.plural });
      }
      if (pre?.resourceVersion && pre.resourceVersion !== cur.obj.metadata.resourceVersion) {
        throw new ApiError(409, 'Conflict', `Operation cannot be fulfilled on ${qualified(r)} "${name}": Precondition failed: ResourceVersion in precondition: ${pre.resourceVersion}, ResourceVersion in object meta: ${cur.obj.metadata.resourceVersion}`, { name, group: r.group, kind: r.plural });
      }
      return this.send(res, 200, this.delete(r, ns, name)!);
    }
    if (!cur) return this.notFound(res, r, name);
    if (method === 'PUT') {
      if (body?.metadata?.name && body.metadata.name !== name) throw new ApiError(400, 'BadRequest', `the name of the object (${body.metadata.name}) does not match the name on the URL (${name})`);
      return this.send(res, 200, this.update(r, { ...body, metadata: { ...body?.metadata, name, namespace: r.namespaced ? ns : undefined } }, status));
    }
    if (method === 'PATCH') {
      // JSON merge patch (RFC 7386), enough for status and label patches.
      const merged = mergePatch(structuredClone(cur.obj), body ?? {});
      merged.metadata.resourceVersion = body?.metadata?.resourceVersion;
      return this.send(res, 200, this.update(r, merged, status));
    }
    this.status(res, 405, 'MethodNotAllowed', method);
  }

  private matcher(r: Resource, url: URL): (o: Obj) => boolean {
    const labels = (url.searchParams.get('labelSelector') ?? '').split(',').filter(Boolean).map(labelTerm);
    const known = ['metadata.name', 'metadata.namespace', ...(SELECTABLE[r.plural] ?? [])];
    const fields = (url.searchParams.get('fieldSelector') ?? '').split(',').filter(Boolean).map((term) => {
      const m = /^([^!=]+)(!=|==|=)(.*)$/.exec(term);
      if (!m) throw new ApiError(400, 'BadRequest', `invalid selector: '${term}'; can't understand '${term}'`);
      const [, k, op, v] = m;
      if (!known.includes(k)) throw new ApiError(400, 'BadRequest', `field label not supported: ${k}`);
      const get = (o: Obj) => String(k.split('.').reduce((x: any, p) => x?.[p], o) ?? '');
      return op === '!=' ? (o: Obj) => get(o) !== v : (o: Obj) => get(o) === v;
    });
    return (o) => labels.every((t) => t(o.metadata?.labels ?? {})) && fields.every((f) => f(o));
  }

  private listBody(r: Resource, ns: string | undefined, url: URL): Obj {
    const match = this.matcher(r, url);
    const items = [...this.store.values()]
      .filter((x) => x.res === r && (!ns || x.obj.metadata.namespace === ns) && match(x.obj))
      .map((x) => x.obj);
    return { apiVersion: apiVersionOf(r), kind: `${r.kind}List`, metadata: { resourceVersion: String(this.rv) }, items };
  }

  private watch(r: Resource, ns: string | undefined, url: URL, res: http.ServerResponse): void {
    const rvParam = url.searchParams.get('resourceVersion') ?? '';
    const match = this.matcher(r, url);
    // No resourceVersion (or "0"): the current state as ADDED events, then what follows (as upstream).
    const fromNow = rvParam === '' || rvParam === '0';
    const from = fromNow ? this.rv : Number(rvParam);
    res.writeHead(200, { 'content-type': 'application/json', 'transfer-encoding': 'chunked' });
    res.flushHeaders();
    if (this.goneLoop || (!fromNow && from < this.compactedBefore - 1)) {
      res.end(JSON.stringify({ type: 'ERROR', object: { kind: 'Status', apiVersion: 'v1', status: 'Failure', reason: 'Expired', code: 410, message: `too old resource version: ${from} (${this.compactedBefore})` } }) + '\n');
      return;
    }
    const w: Watcher = { res: r, ns, match, res_: res, bookmarks: url.searchParams.get('allowWatchBookmarks') === 'true', token: this.tokenOf.get(res) };
    if (fromNow) for (const x of this.store.values()) if (x.res === r && (!ns || x.obj.metadata.namespace === ns) && match(x.obj)) this.deliver(w, JSON.stringify({ type: 'ADDED', object: x.obj }) + '\n');
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
    this.checkTimes(r, obj);
    let name = obj.metadata?.name as string | undefined;
    if (!name && obj.metadata?.generateName) name = `${obj.metadata.generateName}${randomUUID().replace(/-/g, '').slice(0, 5)}`;
    if (!name) {
      throw new ApiError(422, 'Invalid', `${r.kind} "" is invalid: metadata.name: Required value: name or generateName is required`, { group: r.group, kind: r.kind, causes: [{ reason: 'FieldValueRequired', message: 'Required value: name or generateName is required', field: 'metadata.name' }] });
    }
    if (r.namespaced && !obj.metadata.namespace) throw new ApiError(422, 'Invalid', `${r.kind} "${name}" is invalid: metadata.namespace: Required value`, { name, group: r.group, kind: r.kind });
    const k = this.key(r, obj.metadata.namespace, name);
    const stored: Obj = structuredClone({ ...obj, apiVersion: apiVersionOf(r), kind: r.kind });
    stored.metadata = { ...stored.metadata, name, uid: randomUUID(), generation: 1, creationTimestamp: rfc3339(new Date()) };
    tidyMeta(stored.metadata);
    // Admission comes before storage: a create of an existing name is admitted, then refused (409).
    this.admitWrite({ operation: 'CREATE', r, sub: false, name, object: stored, oldObject: null });
    if (this.store.has(k)) throw new ApiError(409, 'AlreadyExists', `${qualified(r)} "${name}" already exists`, { name, group: r.group, kind: r.plural });
    this.rv++;
    stored.metadata.resourceVersion = String(this.rv);
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
    if (!cur) throw new ApiError(404, 'NotFound', `${qualified(r)} "${obj.metadata.name}" not found`, { name: obj.metadata.name, group: r.group, kind: r.plural });
    this.checkTimes(r, obj);
    const want = obj.metadata.resourceVersion;
    if (want !== undefined && want !== cur.obj.metadata.resourceVersion) {
      throw new ApiError(409, 'Conflict', `Operation cannot be fulfilled on ${qualified(r)} "${obj.metadata.name}": the object has been modified; please apply your changes to the latest version and try again`, { name: obj.metadata.name, group: r.group, kind: r.plural });
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
      next.metadata.ownerReferences = obj.metadata.ownerReferences;
      next.metadata.finalizers = obj.metadata.finalizers;
      // deletionTimestamp is the server's: a client cannot set it (a test's direct apply can, to stage a terminating object).
      if (!this.serving && obj.metadata.deletionTimestamp) next.metadata.deletionTimestamp = obj.metadata.deletionTimestamp;
      tidyMeta(next.metadata);
      if (JSON.stringify(next.spec) !== JSON.stringify(cur.obj.spec)) next.metadata.generation = (cur.obj.metadata.generation ?? 1) + 1;
    }
    if (r.plural === 'endpointslices') {
      next.metadata.labels = this.sliceLabels(next);
      this.indexSlice(next, k);
    }
    this.admitWrite({ operation: 'UPDATE', r, sub: statusOnly, name: obj.metadata.name, object: next, oldObject: cur.obj });
    // The last finalizer removed from an object being deleted: it goes.
    if (cur.obj.metadata.deletionTimestamp && !next.metadata.finalizers?.length) return this.delete(r, obj.metadata.namespace, obj.metadata.name, true)!;
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
    // The EndpointSlice controller's writes, not the request's: not admitted as the caller.
    const serving = this.serving;
    this.serving = undefined;
    try {
      this.relabel(svc);
    } finally {
      this.serving = serving;
    }
  }

  private relabel(svc: Obj): void {
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

  /** A delete (admitted unless `admitted`); an object with finalizers only gets its deletionTimestamp. */
  private delete(r: Resource, ns: string | undefined, name: string, admitted = false): Obj | undefined {
    const k = this.key(r, ns, name);
    const cur = this.store.get(k);
    if (!cur) return undefined;
    if (!admitted) this.admitWrite({ operation: 'DELETE', r, sub: false, name, object: null, oldObject: cur.obj });
    if (!admitted && cur.obj.metadata.finalizers?.length) {
      if (cur.obj.metadata.deletionTimestamp) return cur.obj;
      this.rv++;
      cur.obj = { ...cur.obj, metadata: { ...cur.obj.metadata, deletionTimestamp: rfc3339(new Date()), deletionGracePeriodSeconds: 0, resourceVersion: String(this.rv) } };
      this.emit('MODIFIED', r, cur.obj);
      return cur.obj;
    }
    this.store.delete(k);
    this.rv++;
    const gone = { ...cur.obj, metadata: { ...cur.obj.metadata, resourceVersion: String(this.rv) } };
    this.emit('DELETED', r, gone);
    return gone;
  }

  /** Validating admission of a write made over HTTP (recorded, and refused when `admit` says so). */
  private admitWrite(w: { operation: AdmissionAttributes['operation']; r: Resource; sub: boolean; name: string; object: Obj | null; oldObject: Obj | null }): void {
    if (!this.serving || (!this.admit && !this.recordCalls)) return;
    const a: AdmissionAttributes = {
      operation: w.operation, group: w.r.group, version: w.r.version, resource: w.r.plural, subResource: w.sub ? 'status' : '', kind: w.r.kind,
      name: w.name, namespace: (w.object ?? w.oldObject)?.metadata?.namespace ?? '',
      object: w.object && structuredClone(w.object), oldObject: w.oldObject && structuredClone(w.oldObject), token: this.serving.token,
    };
    const v = this.admit?.(a) ?? { allowed: true };
    if (this.recordCalls) this.admissions.push({ ...a, allowed: v.allowed, message: v.message });
    if (!v.allowed) throw new ApiError(v.code ?? 403, v.reason ?? 'Forbidden', v.message ?? 'denied by admission');
  }

  /** MicroTime fields as the server decodes them (Go's RFC3339Micro): anything else is a 400. */
  private checkTimes(r: Resource, obj: Obj): void {
    for (const p of MICRO_TIME[r.kind] ?? []) {
      const v = p.reduce((x: any, k) => x?.[k], obj);
      if (v === undefined || v === null) continue;
      if (typeof v !== 'string' || !MICRO.test(v)) {
        throw new ApiError(400, 'BadRequest', `${r.kind} in version "${r.version}" cannot be handled as a ${r.kind}: parsing time ${JSON.stringify(JSON.stringify(v))} as "2006-01-02T15:04:05.000000Z07:00": cannot parse ${p.join('.')}`);
      }
    }
  }

  private notFound(res: http.ServerResponse, r: Resource, name: string): void {
    this.status(res, 404, 'NotFound', `${qualified(r)} "${name}" not found`, { name, group: r.group, kind: r.plural });
  }

  private status(res: http.ServerResponse, code: number, reason: string, message: string, details?: Obj): void {
    const d = details && Object.fromEntries(Object.entries(details).filter(([, v]) => v !== '' && v !== undefined));
    this.send(res, code, { kind: 'Status', apiVersion: 'v1', metadata: {}, status: 'Failure', message, reason, ...(d ? { details: d } : {}), code });
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

/** A resource as the API server names it in messages: "services", "addressblocks.tether.dev". */
function qualified(r: Resource): string {
  return r.group ? `${r.plural}.${r.group}` : r.plural;
}

/** ObjectMeta's omitempty: empty maps and lists (labels, annotations, ownerReferences, finalizers) are not kept. */
function tidyMeta(m: Obj): void {
  for (const k of ['labels', 'annotations', 'ownerReferences', 'finalizers']) {
    const v = m[k];
    if (v === undefined || v === null || (Array.isArray(v) ? v.length === 0 : typeof v === 'object' && Object.keys(v).length === 0)) delete m[k];
  }
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
