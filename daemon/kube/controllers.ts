// The cluster's controllers (status of AddressPools, Egresses and tether Services, collection of dead nodes'
// block claims, the label that scopes every node's Service and EndpointSlice watches) run on one tetherd at
// a time, the holder of a Lease in tetherd's own namespace. Only a few nodes are candidates for it: the
// others never read or write the Lease and run none of this (at 1,000 nodes, 1,000 nodes polling one Lease
// was load for nothing). Which nodes are candidates (--controller-candidates):
//   auto (default)  nodes labelled tether.dev/controller-candidate=true; when no node of the cluster carries
//                   the label (checked once at start, one list of at most one Node), every node is one, as
//                   small clusters want with no set-up
//   label           only nodes labelled tether.dev/controller-candidate=true
//   all             every node
//   n1,n2,n3        the nodes named
// A node learns its own label from the Node it already watches, so labelling or unlabelling a node takes
// effect at once with no polling; a leader that stops being a candidate hands the Lease over.
import * as k8s from '@kubernetes/client-node';
import type { Logger } from '../../lib/log';
import { LeaderElection } from './leader';
import { describeError } from '../config/reflector';

export const CANDIDATE_LABEL = 'tether.dev/controller-candidate';

export type CandidateMode = { kind: 'auto' | 'label' | 'all' } | { kind: 'names'; names: string[] };

/** --controller-candidates: auto, label, all, or node names separated by commas; throws naming what is wrong. */
export function parseCandidates(text: string | undefined): CandidateMode {
  const t = (text ?? 'auto').trim();
  if (t === 'auto' || t === 'label' || t === 'all') return { kind: t };
  const names = t.split(',').map((n) => n.trim()).filter(Boolean);
  const bad = names.filter((n) => !/^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$/.test(n));
  if (!names.length || bad.length) throw new Error(`--controller-candidates ${JSON.stringify(text)}: give auto, label, all, or node names separated by commas${bad.length ? ` (not a node name: ${bad.join(', ')})` : ''}`);
  return { kind: 'names', names };
}

/** The leader's work, started on election and stopped on loss. */
export interface LeaderWork {
  start(): void;
  stop(): Promise<void>;
}

export interface CandidacyOptions {
  kc: k8s.KubeConfig;
  nodeName: string;
  mode: CandidateMode;
  /** This node's labels now (from the Node the config source watches). */
  labels: () => Record<string, string>;
  work: LeaderWork;
  logger: Logger;
  namespace?: string;
  leaseName?: string;
  leaseDurationSeconds?: number;
  retryMs?: number;
}

/** Runs a LeaderElection while this node is a candidate, and the leader's work while it leads. */
export class Candidacy {
  private election?: LeaderElection;
  /** auto mode: whether some node of the cluster carries the label (undefined until known). */
  private labelledAnywhere?: boolean;
  private stopped = false;
  private chain: Promise<void> = Promise.resolve();

  constructor(private readonly o: CandidacyOptions) {}

  async start(): Promise<void> {
    if (this.o.mode.kind === 'auto' && this.o.labels()[CANDIDATE_LABEL] !== 'true') {
      try {
        const l = await this.o.kc.makeApiClient(k8s.CoreV1Api).listNode({ labelSelector: `${CANDIDATE_LABEL}=true`, limit: 1 });
        this.labelledAnywhere = l.items.length > 0;
      } catch (e) {
        // Not knowing, this node competes: a cluster with no leader writes no status at all.
        this.o.logger.warn('kube: could not tell whether any node is a labelled controller candidate; this one competes', { error: describeError(e) });
        this.labelledAnywhere = false;
      }
    }
    this.o.logger.info(this.candidate() ? 'kube: controller candidate' : 'kube: not a controller candidate; the Lease is left to the candidates', { node: this.o.nodeName, mode: this.describeMode() });
    this.evaluate();
  }

  /** Whether this node competes for the Lease now. */
  candidate(): boolean {
    const m = this.o.mode;
    if (m.kind === 'all') return true;
    if (m.kind === 'names') return m.names.includes(this.o.nodeName);
    if (this.o.labels()[CANDIDATE_LABEL] === 'true') return true;
    return m.kind === 'auto' && this.labelledAnywhere === false;
  }

  isLeader(): boolean {
    return this.election?.isLeader() ?? false;
  }

  /** Lease attempts this node made (0 for a node that never was a candidate). */
  leaseAttempts(): number {
    return this.attempts + (this.election?.attempts ?? 0);
  }

  private attempts = 0;

  /** Re-checks candidacy (after this node's labels changed): starts or stops competing. */
  evaluate(): void {
    this.chain = this.chain.then(async () => {
      const want = !this.stopped && this.candidate();
      if (want && !this.election) {
        const e = new LeaderElection({
          kc: this.o.kc, namespace: this.o.namespace ?? 'tether-system', name: this.o.leaseName ?? 'tether-controllers', identity: this.o.nodeName,
          logger: this.o.logger, leaseDurationSeconds: this.o.leaseDurationSeconds, retryMs: this.o.retryMs,
        });
        e.on('elected', () => this.o.work.start());
        e.on('lost', () => void this.o.work.stop());
        this.election = e;
        e.start();
      } else if (!want && this.election) {
        const e = this.election;
        this.election = undefined;
        if (!this.stopped) this.o.logger.info('kube: no longer a controller candidate; handing the Lease over', { node: this.o.nodeName });
        await this.o.work.stop();
        await e.stop();
        this.attempts += e.attempts;
      }
    });
  }

  async stop(): Promise<void> {
    this.stopped = true;
    this.evaluate();
    await this.chain;
  }

  private describeMode(): string {
    const m = this.o.mode;
    if (m.kind === 'names') return `named: ${m.names.join(', ')}`;
    if (m.kind === 'auto') return this.labelledAnywhere === false ? `auto: no node labelled ${CANDIDATE_LABEL}=true, every node competes` : `auto: nodes labelled ${CANDIDATE_LABEL}=true`;
    return m.kind;
  }
}
