// The leader's Service labeller: puts TETHER_SERVICE_LABEL on every Service of tether's loadBalancerClass
// and takes it off any other, so every other node can watch only tether's Services and their EndpointSlices
// by label (Kubernetes' EndpointSlice controller copies a Service's labels onto its slices). Only the
// leader watches every Service of the cluster; the nodes watch a label selector. Level-triggered: each pass
// compares the cached Services with what they should carry and patches the difference (a JSON merge patch
// of that one label, so nothing else of the Service is rewritten); a pass with a failed patch is retried
// after a jittered backoff (the reconcile loop's).
import * as k8s from '@kubernetes/client-node';
import type { Logger } from '../../lib/log';
import { Backoff } from '../../lib/backoff';
import { Reflector, describeError } from '../config/reflector';
import { isTetherService, LB_CLASS, TETHER_SERVICE_LABEL } from '../objects/names';
import { ReconcileLoop } from '../util/reconcile-loop';

type Obj = Record<string, any>;


export interface ServiceLabelerOptions {
  kc: k8s.KubeConfig;
  logger: Logger;
  /** Patches in flight at once (default 4): 10k new Services are labelled steadily, not all at once. */
  parallel?: number;
  settleMs?: number;
}

/** A pass some of whose patches failed (each logged already): retried after the loop's backoff. */
class PatchesFailed extends Error {}

export class ServiceLabeler {
  private readonly reflector: Reflector;
  private readonly core: k8s.CoreV1Api;
  /** Changes settle this long before a pass (every change restarts the wait). */
  private settle?: NodeJS.Timeout;
  /** Made anew at each start (the leader's work stops and starts it again). */
  private loop?: ReconcileLoop;
  readonly stats = { patches: 0, failures: 0 };

  constructor(private readonly o: ServiceLabelerOptions) {
    this.core = o.kc.makeApiClient(k8s.CoreV1Api);
    this.reflector = new Reflector({
      name: 'services (leader: every Service)',
      kc: o.kc,
      path: '/api/v1/services',
      list: (resourceVersion) => this.core.listServiceForAllNamespaces({ resourceVersion }) as unknown as Promise<Obj>,
      changed: () => this.changed(),
      logger: o.logger,
    });
  }

  start(): void {
    this.loop = new ReconcileLoop({
      run: () => this.pass(),
      backoff: new Backoff(500, 30_000),
      holdsProcess: true,
      onError: (e) => {
        if (!(e instanceof PatchesFailed)) this.o.logger.warn('kube: Service labelling pass failed', { error: e.message });
      },
    });
    this.reflector.start();
  }

  async stop(): Promise<void> {
    const loop = this.loop;
    this.loop = undefined;
    clearTimeout(this.settle);
    // Patches not sent yet are dropped at once; the pass under way is waited for after the watch stops.
    const passDone = loop?.stop();
    await this.reflector.stop();
    await passDone;
  }

  private changed(): void {
    if (!this.loop) return;
    clearTimeout(this.settle);
    this.settle = setTimeout(() => this.loop?.request(), this.o.settleMs ?? 50);
  }

  /** Services whose label is not what their class says, with the value they should have (null: none). */
  mismatches(): Array<{ namespace: string; name: string; want: 'true' | null }> {
    const out: Array<{ namespace: string; name: string; want: 'true' | null }> = [];
    for (const s of this.reflector.objects()) {
      const tether = isTetherService({ ...s, kind: 'Service' });
      const has = s.metadata?.labels?.[TETHER_SERVICE_LABEL] !== undefined;
      if (tether && s.metadata?.labels?.[TETHER_SERVICE_LABEL] !== 'true') out.push({ namespace: s.metadata.namespace, name: s.metadata.name, want: 'true' });
      else if (!tether && has) out.push({ namespace: s.metadata.namespace, name: s.metadata.name, want: null });
    }
    return out;
  }

  private async pass(): Promise<void> {
    const loop = this.loop;
    const todo = this.mismatches();
    let failed = 0;
    const one = async (t: { namespace: string; name: string; want: 'true' | null }) => {
      if (!loop || loop.stopping) return;
      try {
        await this.core.patchNamespacedService(
          { name: t.name, namespace: t.namespace, body: { metadata: { labels: { [TETHER_SERVICE_LABEL]: t.want } } } },
          k8s.setHeaderOptions('Content-Type', k8s.PatchStrategy.MergePatch),
        );
        this.stats.patches++;
        this.o.logger.info(t.want ? 'kube: Service labelled as tether\'s' : 'kube: tether label removed from Service', { service: `${t.namespace}/${t.name}`, label: TETHER_SERVICE_LABEL, class: LB_CLASS });
      } catch (e) {
        const code = (e as { code?: number }).code;
        if (code === 404) return; // gone meanwhile
        failed++;
        this.stats.failures++;
        this.o.logger.warn('kube: Service label not written; retried', { service: `${t.namespace}/${t.name}`, error: describeError(e) });
      }
    };
    const queue = [...todo];
    await Promise.all(Array.from({ length: Math.min(this.o.parallel ?? 4, queue.length) }, async () => {
      for (let t = queue.shift(); t; t = queue.shift()) await one(t);
    }));
    if (failed) throw new PatchesFailed(`${failed} Service labels not written`);
  }
}
