// The Kubernetes config source: AddressPools and Egresses (tether.dev custom resources), this node's Node
// and the Pods of this node, each followed by a @kubernetes/client-node informer (list, then watch from
// the list's resourceVersion; a 410 Gone relists). Informers do not restart themselves after an error and
// can stall silently (kubernetes-client/javascript#958, #596), so each runs under a watchdog: an error
// restarts it with exponential backoff, and a periodic full resync replaces it with a fresh one (a new
// list) so a missed event never leaves a difference behind.
// Objects are validated one by one with the same schemas as the file source; an invalid one is refused
// with its reasons (log, 'verdicts' for status writers) and its last accepted version stays in force.
import { EventEmitter } from 'node:events';
import * as k8s from '@kubernetes/client-node';
import type { Logger } from '../log';
import { ZONE_LABEL } from '../common/fields';
import { GROUP, VERSION } from '../objects/crds';
import { schemaProblems } from '../objects/schema';
import { checkPools } from '../../ipam/pool';
import type { ResolvedPool } from '../../ipam/types';
import { objectKey, type ConfigObjects, type NodeFacts, type PodMeta } from './objects';
import type { ConfigSource } from './source';
import { isTetherService } from '../lb/lb-spec';
import { TO_BE_DELETED_TAINT } from '../health/health-server';

type Obj = Record<string, any>;

export interface KubeSourceOptions {
  /** A kubeconfig file; without it the in-cluster service account is used. */
  kubeconfig?: string;
  nodeName: string;
  logger: Logger;
  /** Full relist of every resource (safety net). Default 5 minutes. */
  resyncMs?: number;
  /** How long start() waits for the first complete list of every resource. Default 30 s. */
  syncTimeoutMs?: number;
}

/** Per object ("Kind namespace/name"): its problems now (empty: accepted), for status conditions. */
export type Verdicts = Map<string, { obj: Obj; problems: string[] }>;

const BACKOFF_MIN_MS = 500;
const BACKOFF_MAX_MS = 30_000;
const SETTLE_MS = 50;

/** One informer under a watchdog: restarted with backoff after an error, replaced on resync. */
class Reflector {
  private informer?: k8s.ListWatch<Obj>;
  private backoffMs = BACKOFF_MIN_MS;
  private restartTimer?: NodeJS.Timeout;
  private stopped = false;
  listed = false;
  restarts = 0;

  constructor(
    readonly name: string,
    private readonly kc: k8s.KubeConfig,
    private readonly path: string,
    private readonly list: () => Promise<Obj>,
    private readonly fieldSelector: string | undefined,
    private readonly changed: () => void,
    private readonly logger: Logger,
  ) {}

  async start(): Promise<void> {
    this.stopped = false;
    await this.replace();
  }

  /** A fresh informer (a new list): the safety net against a watch that stalled without an error. */
  async replace(): Promise<void> {
    const listFn = async () => {
      const l = (await this.list()) as k8s.KubernetesListObject<Obj>;
      this.listed = true;
      this.backoffMs = BACKOFF_MIN_MS;
      return l;
    };
    const next = new k8s.ListWatch<Obj>(this.path, new k8s.Watch(this.kc), listFn, false, undefined, this.fieldSelector);
    next.on('add', () => this.changed());
    next.on('update', () => this.changed());
    next.on('delete', () => this.changed());
    next.on('error', (err: unknown) => this.failed(next, err));
    const old = this.informer;
    this.informer = next;
    await next.start();
    if (old) {
      await old.stop();
      this.changed();
    }
  }

  private failed(which: k8s.ListWatch<Obj>, err: unknown): void {
    if (this.stopped || which !== this.informer) return;
    const inMs = this.backoffMs;
    this.backoffMs = Math.min(this.backoffMs * 2, BACKOFF_MAX_MS);
    this.restarts++;
    this.logger.warn('kube: list/watch failed; restarting', { resource: this.name, error: describeError(err), inMs });
    clearTimeout(this.restartTimer);
    this.restartTimer = setTimeout(() => {
      if (!this.stopped && which === this.informer) void which.start();
    }, inMs);
    this.restartTimer.unref();
  }

  objects(): readonly Obj[] {
    return this.informer?.list() ?? [];
  }

  async stop(): Promise<void> {
    this.stopped = true;
    clearTimeout(this.restartTimer);
    await this.informer?.stop();
  }
}

function describeError(e: unknown): string {
  const x = e as { code?: unknown; statusCode?: unknown; message?: string; body?: unknown };
  return [x.statusCode ?? x.code, x.message ?? String(e)].filter((v) => v !== undefined && v !== '').join(' ');
}

export class KubeSource extends EventEmitter implements ConfigSource {
  readonly name = 'kubernetes';
  readonly kc = new k8s.KubeConfig();
  private readonly reflectors: Reflector[] = [];
  private timer?: NodeJS.Timeout;
  private resync?: NodeJS.Timeout;
  private started = false;
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
  }

  async start(): Promise<ConfigObjects> {
    const custom = this.kc.makeApiClient(k8s.CustomObjectsApi);
    const core = this.kc.makeApiClient(k8s.CoreV1Api);
    const discovery = this.kc.makeApiClient(k8s.DiscoveryV1Api);
    const changed = () => this.soon();
    const crd = (plural: string) =>
      new Reflector(plural, this.kc, `/apis/${GROUP}/${VERSION}/${plural}`, () => custom.listClusterCustomObject({ group: GROUP, version: VERSION, plural }), undefined, changed, this.o.logger);
    const nodeSel = `metadata.name=${this.o.nodeName}`;
    const podSel = `spec.nodeName=${this.o.nodeName}`;
    this.reflectors.push(
      crd('addresspools'),
      crd('egresses'),
      new Reflector('nodes', this.kc, '/api/v1/nodes', () => core.listNode({ fieldSelector: nodeSel }) as Promise<Obj>, nodeSel, changed, this.o.logger),
      new Reflector('pods', this.kc, '/api/v1/pods', () => core.listPodForAllNamespaces({ fieldSelector: podSel }) as Promise<Obj>, podSel, changed, this.o.logger),
      // The load balancer's objects: Services (those of tether's class are used) and their EndpointSlices.
      new Reflector('services', this.kc, '/api/v1/services', () => core.listServiceForAllNamespaces() as Promise<Obj>, undefined, changed, this.o.logger),
      new Reflector('endpointslices', this.kc, '/apis/discovery.k8s.io/v1/endpointslices', () => discovery.listEndpointSliceForAllNamespaces() as Promise<Obj>, undefined, changed, this.o.logger),
    );
    await Promise.all(this.reflectors.map((r) => r.start()));
    const deadline = Date.now() + (this.o.syncTimeoutMs ?? 30_000);
    while (!this.reflectors.every((r) => r.listed)) {
      if (Date.now() > deadline) {
        const missing = this.reflectors.filter((r) => !r.listed).map((r) => r.name);
        await this.stop();
        throw new Error(`kubernetes: no complete list of ${missing.join(', ')} within ${this.o.syncTimeoutMs ?? 30_000} ms (API server ${this.kc.getCurrentCluster()?.server ?? '?'})`);
      }
      await new Promise((r) => setTimeout(r, 100));
    }
    this.started = true;
    this.current = this.build();
    this.lastJson = fingerprint(this.current);
    const every = this.o.resyncMs ?? 300_000;
    this.resync = setInterval(() => {
      for (const r of this.reflectors) void r.replace().catch((e) => this.o.logger.warn('kube: resync failed', { resource: r.name, error: describeError(e) }));
    }, every);
    this.resync.unref();
    this.o.logger.info('kube: synced', { server: this.kc.getCurrentCluster()?.server, pools: this.current.pools.length, objects: this.current.others.length, pods: Object.keys(this.current.pods ?? {}).length });
    return this.current;
  }

  async stop(): Promise<void> {
    this.started = false;
    clearTimeout(this.timer);
    clearInterval(this.resync);
    await Promise.all(this.reflectors.map((r) => r.stop()));
  }

  /** Each object's current verdict (for the status controller). */
  currentVerdicts(): Verdicts {
    return this.verdicts;
  }

  stats(): Array<{ resource: string; restarts: number; objects: number }> {
    return this.reflectors.map((r) => ({ resource: r.name, restarts: r.restarts, objects: r.objects().length }));
  }

  private soon(): void {
    if (!this.started) return;
    clearTimeout(this.timer);
    this.timer = setTimeout(() => {
      const next = this.build();
      const json = fingerprint(next);
      if (json === this.lastJson) return;
      this.lastJson = json;
      this.current = next;
      this.emit('update', next);
    }, SETTLE_MS);
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
    const services: Obj[] = this.objectsOf('services').map((o) => ({ ...o, apiVersion: 'v1', kind: 'Service' })).filter((o) => isTetherService(o));
    const named = new Set(services.map((o) => `${o.metadata?.namespace}/${o.metadata?.name}`));
    others.push(...services);
    for (const o of this.objectsOf('endpointslices')) {
      const svc = o.metadata?.labels?.['kubernetes.io/service-name'];
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
function fingerprint(c: ConfigObjects): string {
  return JSON.stringify(c, (_k, v: unknown) => (typeof v === 'bigint' ? v.toString() : v));
}

/** A custom resource as the schemas see it: what the user wrote (spec), without server-set metadata. */
function crObject(raw: Obj, kind: string): Obj {
  const m = raw.metadata ?? {};
  const metadata: Obj = { name: m.name };
  if (m.namespace) metadata.namespace = m.namespace;
  if (m.labels) metadata.labels = m.labels;
  return { apiVersion: raw.apiVersion ?? `${GROUP}/${VERSION}`, kind: raw.kind ?? kind, metadata, spec: raw.spec };
}
