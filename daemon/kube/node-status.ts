// This node's TetherNode (cluster-scoped, named after the node, owned by the core Node so it is collected
// with it), written by this node's tetherd only. Level-triggered: the conditions are computed from local
// state every CHECK_EVERY_MS (no API call), and the status is written when they changed, and otherwise as a
// heartbeat at most every HEARTBEAT_MS (stretched by up to 10 % at random per node, never shortened, so
// 1,000 nodes started together do not write together): one PUT per node per minute at rest. Every write
// goes over the resourceVersion last written (no GET at rest); a 409 or 404 reads (or creates) it again.
// The API away: the failure is logged once and the write made again on the next check.
import * as k8s from '@kubernetes/client-node';
import type { Logger } from '../../lib/log';
import { GROUP, VERSION } from '../objects/crds';
import { ReconcileLoop } from '../util/reconcile-loop';
import { mergeConditions, type Condition } from './conditions';
import { describeError } from '../config/reflector';

type Obj = Record<string, any>;

export type NodeCondition = Omit<Condition, 'lastTransitionTime' | 'observedGeneration'>;

export const HEARTBEAT_MS = 60_000;
export const CHECK_EVERY_MS = 2_000;
const PLURAL = 'tethernodes';

export interface NodeStatusOptions {
  kc: k8s.KubeConfig;
  nodeName: string;
  /** tetherd's version (status.version). */
  version: string;
  /** The conditions as they stand now, from local state (cheap: called on every check). */
  conditions: () => NodeCondition[];
  /** The core Node's uid from the config source's watch (read with a GET when it has none), for the ownerReference. */
  nodeUid?: () => string | undefined;
  logger: Logger;
  heartbeatMs?: number;
  checkEveryMs?: number;
  now?: () => number;
  random?: () => number;
}

export interface NodeStatusStats {
  /** Status writes (PUT of the status subresource), creates of the object, and failed requests. */
  writes: number;
  heartbeats: number;
  creates: number;
  conflicts: number;
  failures: number;
  lastWrite?: string;
  problem?: string;
}

const statusOf = (e: unknown) => (e as { code?: number }).code ?? (e as { statusCode?: number }).statusCode;

export class NodeStatusWriter {
  private readonly api: k8s.CustomObjectsApi;
  private readonly core: k8s.CoreV1Api;
  private readonly loop: ReconcileLoop;
  /** The object as last read or written (its resourceVersion is the next write's precondition). */
  private obj?: Obj;
  /** The conditions and version last written, and when. */
  private written?: string;
  private writtenAt = 0;

  /** The TetherNode's uid, once read or written (Events about this node name it). */
  get uid(): string | undefined {
    const uid = this.obj?.metadata?.uid;
    return typeof uid === 'string' && uid ? uid : undefined;
  }
  private readonly heartbeatMs: number;
  private readonly now: () => number;
  readonly stats: NodeStatusStats = { writes: 0, heartbeats: 0, creates: 0, conflicts: 0, failures: 0 };

  constructor(private readonly o: NodeStatusOptions) {
    this.api = o.kc.makeApiClient(k8s.CustomObjectsApi);
    this.core = o.kc.makeApiClient(k8s.CoreV1Api);
    this.heartbeatMs = Math.round((o.heartbeatMs ?? HEARTBEAT_MS) * (1 + 0.1 * (o.random ?? Math.random)()));
    this.now = o.now ?? Date.now;
    this.loop = new ReconcileLoop({
      run: () => this.pass(),
      everyMs: o.checkEveryMs ?? CHECK_EVERY_MS,
      skipBusyTicks: true,
      onError: (e) => this.problem(e),
    });
  }

  start(): void {
    this.loop.start().request();
  }

  /** Something the conditions depend on changed: checked (and written if so) now, not at the next check. */
  changed(): void {
    this.loop.request();
  }

  /**
   * Stops checking; with `last` (Ready False on a clean stop), writes it once more, waiting at most
   * `timeoutMs`: a node whose tetherd stopped says so rather than keep its last Ready until it goes stale.
   */
  async stop(last?: NodeCondition[], timeoutMs = 1500): Promise<void> {
    await this.loop.stop(timeoutMs);
    if (!last || !this.obj) return;
    let timer: NodeJS.Timeout | undefined;
    await Promise.race([
      this.write(last).catch((e) => this.o.logger.debug('kube: last node status not written', { tethernode: this.o.nodeName, error: describeError(e) })),
      new Promise((r) => (timer = setTimeout(r, timeoutMs))),
    ]);
    clearTimeout(timer);
  }

  /** One check: writes the status when the conditions changed or a heartbeat is due. */
  async pass(): Promise<void> {
    const conditions = this.o.conditions();
    const due = this.now() - this.writtenAt >= this.heartbeatMs;
    if (this.obj && this.signature(conditions) === this.written && !due) return;
    await this.write(conditions);
  }

  private signature(conditions: NodeCondition[]): string {
    return JSON.stringify([this.o.version, conditions.map((c) => [c.type, c.status, c.reason, c.message])]);
  }

  private async write(conditions: NodeCondition[]): Promise<void> {
    this.obj ??= await this.ensure();
    const now = this.now();
    const sig = this.signature(conditions);
    const heartbeat = sig === this.written;
    const status = {
      conditions: mergeConditions(this.obj.status?.conditions, conditions, new Date(now)),
      version: this.o.version,
      lastHeartbeatTime: new Date(now).toISOString().replace(/\.\d{3}Z$/, 'Z'),
    };
    try {
      this.obj = (await this.api.replaceClusterCustomObjectStatus({
        group: GROUP, version: VERSION, plural: PLURAL, name: this.o.nodeName,
        body: { apiVersion: `${GROUP}/${VERSION}`, kind: 'TetherNode', metadata: this.obj.metadata, status },
      })) as Obj;
    } catch (e) {
      const code = statusOf(e);
      if (code === 409 || code === 404) {
        // Changed or deleted meanwhile: read (or create) it again, and write on the next check.
        if (code === 409) this.stats.conflicts++;
        this.obj = undefined;
        this.loop.request();
        return;
      }
      throw e;
    }
    this.stats.writes++;
    if (heartbeat) this.stats.heartbeats++;
    this.stats.lastWrite = new Date(now).toISOString();
    this.written = sig;
    this.writtenAt = now;
    if (this.stats.problem) this.o.logger.info('kube: node status written again', { tethernode: this.o.nodeName, was: this.stats.problem });
    this.stats.problem = undefined;
    if (!heartbeat) {
      this.o.logger.info('kube: node status written', { tethernode: this.o.nodeName, ...Object.fromEntries(conditions.map((c) => [c.type, `${c.status} (${c.reason})`])) });
    }
  }

  /** This node's TetherNode, created when absent; its ownerReference to the Node put right when it lacks it. */
  private async ensure(): Promise<Obj> {
    const params = { group: GROUP, version: VERSION, plural: PLURAL, name: this.o.nodeName };
    const owner = await this.ownerReference();
    let cur: Obj | undefined;
    try {
      cur = (await this.api.getClusterCustomObject(params)) as Obj;
    } catch (e) {
      if (statusOf(e) !== 404) throw e;
    }
    if (!cur) {
      const created = (await this.api.createClusterCustomObject({
        group: GROUP, version: VERSION, plural: PLURAL,
        body: { apiVersion: `${GROUP}/${VERSION}`, kind: 'TetherNode', metadata: { name: this.o.nodeName, ownerReferences: [owner] } },
      })) as Obj;
      this.stats.creates++;
      this.o.logger.info('kube: node status object created', { tethernode: this.o.nodeName, owner: `Node ${this.o.nodeName} (${owner.uid})` });
      return created;
    }
    const refs = (cur.metadata?.ownerReferences ?? []) as Obj[];
    if (refs.some((r) => r.kind === 'Node' && r.uid === owner.uid)) return cur;
    // A Node of the same name recreated: the owner is the Node there is now.
    const metadata = { ...cur.metadata, ownerReferences: [...refs.filter((r) => r.kind !== 'Node'), owner] };
    return (await this.api.replaceClusterCustomObject({ ...params, body: { ...cur, metadata } })) as Obj;
  }

  /** The core Node as owner: no blockOwnerDeletion (that needs rights on the Node's finalizers). */
  private async ownerReference(): Promise<{ apiVersion: string; kind: string; name: string; uid: string }> {
    let uid = this.o.nodeUid?.();
    if (!uid) uid = String(((await this.core.readNode({ name: this.o.nodeName })) as Obj).metadata?.uid ?? '');
    if (!uid) throw new Error(`Node ${this.o.nodeName} has no uid`);
    return { apiVersion: 'v1', kind: 'Node', name: this.o.nodeName, uid };
  }

  /** A failed check: logged when a run of failures starts (warn), then at debug; retried on the next check. */
  private problem(e: Error): void {
    this.stats.failures++;
    const text = describeError(e);
    if (this.stats.problem === undefined) this.o.logger.warn('kube: node status not written; retried', { tethernode: this.o.nodeName, error: text });
    else this.o.logger.debug('kube: node status not written; retried', { tethernode: this.o.nodeName, error: text });
    this.stats.problem = text;
  }
}
