// One leader among the tetherds, through a coordination.k8s.io Lease (client-node has no leader election):
// acquire when the Lease is free or expired, renew well before leaseDurationSeconds, step down as soon as a
// renewal cannot be confirmed within the lease duration (another node may then take it). Every write
// carries the resourceVersion read, so two candidates racing for it get one success and one 409.
// Only candidates run this (controllers.ts decides which nodes are): the others never touch the Lease.
// Retries are jittered (candidates that started together do not hit the Lease together), and a candidate
// whose attempts fail backs off exponentially, never past the lease duration, so a lost leader is still
// replaced within about one lease duration.
import { microTime } from './micro-time';
import { EventEmitter } from 'node:events';
import * as k8s from '@kubernetes/client-node';
import type { Logger } from '../../lib/log';
import { Backoff } from '../../lib/backoff';
import { ReconcileLoop } from '../util/reconcile-loop';

export interface LeaderOptions {
  kc: k8s.KubeConfig;
  namespace: string;
  name: string;
  identity: string;
  logger: Logger;
  leaseDurationSeconds?: number;
  /** How often the Lease is tried or renewed. Default: a third of the duration. */
  retryMs?: number;
}

type Lease = {
  metadata?: { resourceVersion?: string };
  spec?: { holderIdentity?: string; leaseDurationSeconds?: number; acquireTime?: string; renewTime?: string; leaseTransitions?: number };
};

function statusOf(e: unknown): number | undefined {
  const x = e as { code?: number; statusCode?: number };
  return x.code ?? x.statusCode;
}

/** An attempt that failed for a candidate (the API away, or an error other than a lost race): backed off. */
class AttemptFailed extends Error {}

/** Emits 'elected' and 'lost'. */
export class LeaderElection extends EventEmitter {
  private readonly api: k8s.CoordinationV1Api;
  private leader = false;
  private lastRenew = 0;
  private readonly durationS: number;
  /** One attempt per pass: the next one a retry period (±10%) after it, or its backoff after a failure. */
  private readonly loop: ReconcileLoop;
  /** Attempts made (for tests: a non-candidate makes none). */
  attempts = 0;
  /** Times this process became leader or stopped being it (the metrics' transitions). */
  transitions = 0;

  constructor(private readonly o: LeaderOptions) {
    super();
    this.api = o.kc.makeApiClient(k8s.CoordinationV1Api);
    this.durationS = o.leaseDurationSeconds ?? 15;
    const every = this.o.retryMs ?? Math.round((this.durationS * 1000) / 3);
    this.loop = new ReconcileLoop({
      run: async () => {
        const ok = await this.attempt();
        // A leader renews on time whatever happened; a candidate whose attempts fail backs off.
        if (!ok && !this.leader) throw new AttemptFailed();
      },
      everyMs: every,
      jitter: 0.1,
      periodAfterPass: true,
      backoff: new Backoff(every, this.durationS * 1000),
      holdsProcess: true,
      onError: () => {}, // attempt() logs its failures
    });
  }

  isLeader(): boolean {
    return this.leader;
  }

  /** The Lease ("namespace/name"), whether this process holds it, and how often that changed. */
  leadership(): { lease: string; leader: boolean; transitions: number } {
    return { lease: `${this.o.namespace}/${this.o.name}`, leader: this.leader, transitions: this.transitions };
  }

  start(): void {
    this.loop.start().request();
  }

  /** Stops; a leader gives the Lease up (holder cleared) so another node takes over at once. */
  async stop(): Promise<void> {
    await this.loop.stop();
    if (!this.leader) return;
    try {
      const cur = (await this.api.readNamespacedLease({ name: this.o.name, namespace: this.o.namespace })) as Lease;
      if (cur.spec?.holderIdentity === this.o.identity) {
        await this.api.replaceNamespacedLease({ name: this.o.name, namespace: this.o.namespace, body: { ...cur, spec: { ...cur.spec, holderIdentity: undefined, renewTime: undefined } } as k8s.V1Lease });
      }
    } catch {
      // it expires on its own
    }
    this.setLeader(false, 'stopping');
  }

  private setLeader(v: boolean, why: string): void {
    if (v === this.leader) return;
    this.leader = v;
    this.transitions++;
    this.o.logger.info(v ? 'kube: elected leader' : 'kube: no longer leader', { lease: `${this.o.namespace}/${this.o.name}`, identity: this.o.identity, why });
    this.emit(v ? 'elected' : 'lost');
  }

  /** One try: false when the API could not be reached or answered an error other than a lost race. */
  private async attempt(): Promise<boolean> {
    this.attempts++;
    const now = new Date();
    try {
      let cur: Lease | undefined;
      try {
        cur = (await this.api.readNamespacedLease({ name: this.o.name, namespace: this.o.namespace })) as Lease;
      } catch (e) {
        if (statusOf(e) !== 404) throw e;
      }
      const spec = cur?.spec ?? {};
      const mine = spec.holderIdentity === this.o.identity;
      const renewed = spec.renewTime ? Date.parse(spec.renewTime) : 0;
      const expired = !spec.holderIdentity || renewed + (spec.leaseDurationSeconds ?? this.durationS) * 1000 < now.getTime();
      if (!mine && !expired) {
        this.setLeader(false, `held by ${spec.holderIdentity}`);
        return true;
      }
      const body = {
        apiVersion: 'coordination.k8s.io/v1',
        kind: 'Lease',
        metadata: { name: this.o.name, namespace: this.o.namespace, resourceVersion: cur?.metadata?.resourceVersion },
        spec: {
          holderIdentity: this.o.identity,
          leaseDurationSeconds: this.durationS,
          acquireTime: mine ? spec.acquireTime : microTime(now.getTime()),
          renewTime: microTime(now.getTime()),
          leaseTransitions: (spec.leaseTransitions ?? 0) + (mine || !cur ? 0 : 1),
        },
      } as unknown as k8s.V1Lease;
      if (cur) await this.api.replaceNamespacedLease({ name: this.o.name, namespace: this.o.namespace, body });
      else await this.api.createNamespacedLease({ namespace: this.o.namespace, body });
      this.lastRenew = now.getTime();
      this.setLeader(true, mine ? 'renewed' : cur ? `took over from ${spec.holderIdentity ?? 'nobody'}` : 'created the lease');
      return true;
    } catch (e) {
      // A 409 is another candidate's write winning; anything else is the API being away.
      // A leader steps down before its lease can expire (renew deadline: two thirds of it), so two never overlap.
      if (this.leader && Date.now() - this.lastRenew > (this.durationS * 2000) / 3) this.setLeader(false, `renewal not confirmed within the renew deadline: ${(e as Error).message}`);
      else if (statusOf(e) !== 409) this.o.logger.debug('kube: lease attempt failed', { error: (e as Error).message });
      return statusOf(e) === 409;
    }
  }
}
