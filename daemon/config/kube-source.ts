// The Kubernetes config source: AddressPools and Egresses (tether.dev custom resources), this node's Node,
// the Pods of this node, and tether's load-balanced Services with their EndpointSlices, each followed by a
// Reflector (daemon/config/reflector.ts: list once, watch with bookmarks, resume from the last
// resourceVersion, relist only on 410 Gone, jittered backoff, a watchdog for silent watches).
// Each node watches only what it needs: Pods by spec.nodeName, its Node by metadata.name, and only the
// Services and EndpointSlices that carry TETHER_SERVICE_LABEL, which the leader puts on every Service of
// tether's loadBalancerClass (service-labeler.ts) and Kubernetes' EndpointSlice controller copies from a
// Service onto its EndpointSlices (kubernetes/endpointslice utils.go, setEndpointSliceLabels: a slice's
// labels are kept equal to its Service's, reserved keys aside). Bursts of events (10k Services created at
// once) are coalesced: one rebuild per settle period, at least one per MAX_SETTLE_MS while they last.
// Objects are validated one by one with the same schemas as the file source; an invalid one is refused
// with its reasons (log, 'verdicts' for status writers) and its last accepted version stays in force.
import { EventEmitter } from 'node:events';
import * as k8s from '@kubernetes/client-node';
import type { Logger } from '../../lib/log';
import { GROUP, VERSION } from '../objects/crds';
import { schemaProblems } from '../objects/schema';
import { checkPools } from '../../ipam/pool';
import type { ResolvedPool } from '../../ipam/types';
import { objectKey, type ConfigObjects, type NodeFacts, type PodMeta } from './objects';
import type { ConfigSource } from './source';
import { Reflector, type ReflectorStats } from './reflector';
import { KubeApiCalls } from './kube-api-calls';
import { isTetherService, SERVICE_NAME_LABEL, TETHER_SERVICE_SELECTOR, TO_BE_DELETED_TAINT, ZONE_LABEL } from '../objects/names';

type Obj = Record<string, any>;

export interface KubeSourceOptions {
  /** A kubeconfig file; without it the in-cluster service account is used. */
  kubeconfig?: string;
  nodeName: string;
  logger: Logger;
  /** How start() waits for the first complete list of every resource. Default 30 s. */
  syncTimeoutMs?: number;
  /** A watch with no event or bookmark for this long is resumed (Reflector idleMs; default 150 s). */
  watchIdleMs?: number;
  /** Retry backoff of lists and watches (jittered; default 500 ms doubling to 30 s). */
  backoffMinMs?: number;
  backoffMaxMs?: number;
}

/** Per object ("Kind namespace/name"): its problems now (empty: accepted), for status conditions. */
export type Verdicts = Map<string, { obj: Obj; problems: string[] }>;

/** Events are let settle this long before the configuration is rebuilt… */
const SETTLE_MS = 50;
/** …but while they keep coming, it is rebuilt at least this often. */
const MAX_SETTLE_MS = 1000;

export class KubeSource extends EventEmitter implements ConfigSource {
  readonly name = 'kubernetes';
  readonly kc = new k8s.KubeConfig();
  /** Failed API requests of every client made from kc (and the reflectors' watches), for the metrics. */
  readonly apiCalls = new KubeApiCalls();
  private readonly reflectors: Reflector[] = [];
  private timer?: NodeJS.Timeout;
  /** When the first change not yet built came in (0: none waiting). */
  private pendingSince = 0;
  private started = false;
  /** Configurations built and emitted (for status and tests). */
  readonly counts = { builds: 0, updates: 0 };
  private current?: ConfigObjects;
  private lastJson = '';
  /** Last accepted version of each object, kept while a newer version is refused. */
  private readonly accepted = new Map<string, Obj>();
  private verdicts: Verdicts = new Map();
  private readonly reported = new Map<string, string>();

  constructor(private readonly o: KubeSourceOptions) {
    super();
    if (o.kubeconfig) this.kc.loadFromFile(o.kubeconfig);
    else this.kc.loadFromCluster();
    this.apiCalls.instrument(this.kc);
  }

  async start(): Promise<ConfigObjects> {
    const custom = this.kc.makeApiClient(k8s.CustomObjectsApi);
    const core = this.kc.makeApiClient(k8s.CoreV1Api);
    const discovery = this.kc.makeApiClient(k8s.DiscoveryV1Api);
    const reflector = (name: string, path: string, list: (rv: string | undefined) => Promise<unknown>, sel: { labelSelector?: string; fieldSelector?: string } = {}) =>
      new Reflector({
        name, kc: this.kc, path, list: list as (rv: string | undefined) => Promise<Obj>, ...sel, changed: () => this.soon(), logger: this.o.logger,
        watchFailed: (err) => this.apiCalls.watchFailed(name, err),
        idleMs: this.o.watchIdleMs, backoffMinMs: this.o.backoffMinMs, backoffMaxMs: this.o.backoffMaxMs,
      });
    const crd = (plural: string) => reflector(plural, `/apis/${GROUP}/${VERSION}/${plural}`, (resourceVersion) => custom.listClusterCustomObject({ group: GROUP, version: VERSION, plural, resourceVersion }));
    const nodeSel = `metadata.name=${this.o.nodeName}`;
    const podSel = `spec.nodeName=${this.o.nodeName}`;
    const lbSel = TETHER_SERVICE_SELECTOR;
    this.reflectors.push(
      crd('addresspools'),
      crd('egresses'),
      reflector('nodes', '/api/v1/nodes', (resourceVersion) => core.listNode({ fieldSelector: nodeSel, resourceVersion }), { fieldSelector: nodeSel }),
      reflector('pods', '/api/v1/pods', (resourceVersion) => core.listPodForAllNamespaces({ fieldSelector: podSel, resourceVersion }), { fieldSelector: podSel }),
      // Tether's Services only (labelled by the leader) and their EndpointSlices (the label copied by Kubernetes).
      reflector('services', '/api/v1/services', (resourceVersion) => core.listServiceForAllNamespaces({ labelSelector: lbSel, resourceVersion }), { labelSelector: lbSel }),
      reflector('endpointslices', '/apis/discovery.k8s.io/v1/endpointslices', (resourceVersion) => discovery.listEndpointSliceForAllNamespaces({ labelSelector: lbSel, resourceVersion }), { labelSelector: lbSel }),
    );
    for (const r of this.reflectors) r.start();
    const deadline = Date.now() + (this.o.syncTimeoutMs ?? 30_000);
    while (!this.reflectors.every((r) => r.listed)) {
      if (Date.now() > deadline) {
        const missing = this.reflectors.filter((r) => !r.listed).map((r) => `${r.name}${r.stats().problem ? ` (${r.stats().problem})` : ''}`);
        await this.stop();
        throw new Error(`kubernetes: no complete list of ${missing.join(', ')} within ${this.o.syncTimeoutMs ?? 30_000} ms (API server ${this.kc.getCurrentCluster()?.server ?? '?'})`);
      }
      await new Promise((r) => setTimeout(r, 100));
    }
    this.started = true;
    this.current = this.build();
    this.lastJson = fingerprint(this.current);
    this.o.logger.info('kube: synced', { server: this.kc.getCurrentCluster()?.server, pools: this.current.pools.length, objects: this.current.others.length, pods: Object.keys(this.current.pods ?? {}).length });
    return this.current;
  }

  async stop(): Promise<void> {
    this.started = false;
    clearTimeout(this.timer);
    await Promise.all(this.reflectors.map((r) => r.stop()));
  }

  /** This node's labels (from its Node object), as of the last configuration built. */
  nodeLabels(): Record<string, string> {
    return this.current?.nodes[this.o.nodeName]?.labels ?? {};
  }

  /** The objects a resource's watch holds now, as the API server sent them (the leader's status controller reads them here). */
  cachedObjects(resource: 'services' | 'addresspools' | 'egresses' | 'nodes'): Obj[] {
    return this.objectsOf(resource);
  }

  /** Each object's current verdict (for the status controller). */
  currentVerdicts(): Verdicts {
    return this.verdicts;
  }

  /** Each followed resource: objects held, lists, watches, events, 410s, and what is wrong, if anything. */
  stats(): ReflectorStats[] {
    return this.reflectors.map((r) => r.stats());
  }

  /** What keeps resources from being followed now (a 410 loop, the API away), for tetherd's status. */
  problems(): string[] {
    return this.reflectors.flatMap((r) => {
      const p = r.stats().problem;
      return p ? [`${r.name}: ${p}`] : [];
    });
  }

  /** Rebuilds after changes settle: one build for a burst, not one per event. */
  private soon(): void {
    if (!this.started) return;
    const now = Date.now();
    if (!this.pendingSince) this.pendingSince = now;
    clearTimeout(this.timer);
    const wait = Math.max(0, Math.min(SETTLE_MS, this.pendingSince + MAX_SETTLE_MS - now));
    this.timer = setTimeout(() => this.rebuild(), wait);
  }

  private rebuild(): void {
    this.pendingSince = 0;
    if (!this.started) return;
    this.counts.builds++;
    const next = this.build();
    const json = fingerprint(next);
    if (json === this.lastJson) return;
    this.lastJson = json;
    this.current = next;
    this.counts.updates++;
    this.emit('update', next);
  }

  private objectsOf(name: string): Obj[] {
    return [...(this.reflectors.find((r) => r.name === name)?.objects() ?? [])];
  }

  /** The desired configuration from the informers' caches; each object judged on its own. */
  private build(): ConfigObjects {
    const verdicts: Verdicts = new Map();
    const judge = (obj: Obj, problems: string[]): Obj | undefined => {
      const key = objectKey(obj);
      verdicts.set(key, { obj, problems });
      const shown = problems.join('\n');
      if (this.reported.get(key) !== shown) {
        if (problems.length) this.o.logger.error('kube: object refused; its last accepted version stays', { object: key, problems, keeps: this.accepted.has(key) ? 'last accepted version' : 'nothing' });
        else if (this.reported.get(key)) this.o.logger.info('kube: object accepted again', { object: key });
        this.reported.set(key, shown);
      }
      if (!problems.length) this.accepted.set(key, obj);
      return problems.length ? this.accepted.get(key) : obj;
    };
    const live = new Set<string>();
    // Pools in creation order: a pool that overlaps an older one is the one refused.
    const pools = this.objectsOf('addresspools').sort((a, b) => String(a.metadata?.creationTimestamp).localeCompare(String(b.metadata?.creationTimestamp)) || String(a.metadata?.name).localeCompare(String(b.metadata?.name)));
    const inForce: Obj[] = [];
    for (const raw of pools) {
      const obj = crObject(raw, 'AddressPool');
      live.add(objectKey(obj));
      let problems = schemaProblems(obj);
      if (!problems.length) problems = checkPools([...inForce.map((p) => p), obj], (i) => (i === inForce.length ? 'this pool' : `AddressPool "${inForce[i]?.metadata?.name}"`)).problems.filter((p) => p.startsWith('this pool'));
      const use = judge(obj, problems.map((p) => p.replace(/^this pool: /, '')));
      if (use) inForce.push(use);
    }
    const resolved: ResolvedPool[] = inForce.length ? checkPools(inForce).pools : [];
    const others: Obj[] = [];
    for (const raw of this.objectsOf('egresses')) {
      const obj = crObject(raw, 'Egress');
      live.add(objectKey(obj));
      const use = judge(obj, schemaProblems(obj));
      if (use) others.push(use);
    }
    // Services of tether's class and the EndpointSlices naming them, as the API server validated them
    // (lb-spec.ts judges tether's own meaning; a refused one is reported in the Service's status).
    // Only what tether reads of a Service (its spec, labels and annotations): a status write (the leader's
    // VIP and conditions) or any other metadata change is then no new configuration on every node.
    const services: Obj[] = this.objectsOf('services').map((o) => serviceObject(o)).filter((o) => isTetherService(o));
    const named = new Set(services.map((o) => `${o.metadata?.namespace}/${o.metadata?.name}`));
    others.push(...services);
    for (const o of this.objectsOf('endpointslices')) {
      const svc = o.metadata?.labels?.[SERVICE_NAME_LABEL];
      if (svc && named.has(`${o.metadata?.namespace}/${svc}`)) others.push({ ...o, apiVersion: 'discovery.k8s.io/v1', kind: 'EndpointSlice' });
    }
    for (const key of [...this.accepted.keys()]) if (!live.has(key)) this.accepted.delete(key);
    for (const key of [...this.reported.keys()]) if (!live.has(key)) this.reported.delete(key);
    this.verdicts = verdicts;

    const nodes: Record<string, NodeFacts> = {};
    for (const n of this.objectsOf('nodes')) {
      const labels = (n.metadata?.labels ?? {}) as Record<string, string>;
      // kube-proxy's node eligibility (KEP-3836): not deleted, not tainted for removal by the autoscaler.
      const leaving = !!n.metadata?.deletionTimestamp || ((n.spec?.taints ?? []) as Obj[]).some((t) => t.key === TO_BE_DELETED_TAINT);
      nodes[n.metadata.name] = { ...(labels[ZONE_LABEL] ? { zone: labels[ZONE_LABEL] } : {}), labels, ...(leaving ? { eligible: false } : {}) };
    }
    const pods: Record<string, PodMeta> = {};
    for (const p of this.objectsOf('pods')) {
      const ready = (p.status?.conditions ?? []).some((c: Obj) => c.type === 'Ready' && c.status === 'True');
      pods[`${p.metadata.namespace}/${p.metadata.name}`] = { labels: p.metadata?.labels ?? {}, ready, deleting: !!p.metadata?.deletionTimestamp };
    }
    return { pools: resolved, nodes, pods, others: others as Array<Record<string, unknown>> };
  }
}

/** What a configuration holds, comparable (pools carry bigints). */
/**
 * The configuration's identity, with object keys sorted: a list answer (decoded by client-node's models,
 * which order fields their way) and a watch event (the server's order) of the same object are the same
 * configuration.
 */
function fingerprint(c: ConfigObjects): string {
  return JSON.stringify(c, (_k, v: unknown) => {
    if (typeof v === 'bigint') return v.toString();
    if (v && typeof v === 'object' && !Array.isArray(v)) return Object.fromEntries(Object.entries(v).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)));
    return v;
  });
}

/** A custom resource as the schemas see it: what the user wrote (spec), without server-set metadata. */
function crObject(raw: Obj, kind: string): Obj {
  const m = raw.metadata ?? {};
  const metadata: Obj = { name: m.name };
  if (m.namespace) metadata.namespace = m.namespace;
  if (m.labels) metadata.labels = m.labels;
  return { apiVersion: raw.apiVersion ?? `${GROUP}/${VERSION}`, kind: raw.kind ?? kind, metadata, spec: raw.spec };
}

/**
 * A Service as the configuration holds it: spec, name, namespace, labels and annotations, and of its status
 * only the ingress addresses (the VIP the leader recorded, which a node uses while the store is away; it
 * changes only with the VIP, so the leader's other status writes are no new configuration).
 */
function serviceObject(raw: Obj): Obj {
  const m = raw.metadata ?? {};
  const metadata: Obj = { name: m.name, namespace: m.namespace };
  if (m.labels) metadata.labels = m.labels;
  if (m.annotations) metadata.annotations = m.annotations;
  const ips = ((raw.status?.loadBalancer?.ingress ?? []) as Obj[]).map((i) => i?.ip).filter((ip): ip is string => typeof ip === 'string');
  return { apiVersion: 'v1', kind: 'Service', metadata, spec: raw.spec, ...(ips.length ? { status: { loadBalancer: { ingress: ips.map((ip) => ({ ip })) } } } : {}) };
}
