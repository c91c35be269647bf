// The simulation's tether-operator (kube mode): operator/main.ts's operatorParts(), started as the operator
// starts them, against the fake API server (its own token, so the fake tallies its load apart from the
// nodes') and the run's store. Probes are off. Only ever run bundled (bundle.ts), like sim-node.ts.
import type { Logger } from '../../../lib/log';
import { Lifecycle } from '../../../daemon/lifecycle';
import { operatorParts, type StartedOperator } from '../../../operator/main';
import { parseOperatorOptions } from '../../../operator/options';

export class SimOperator {
  private constructor(
    private readonly life: Lifecycle,
    readonly started: StartedOperator,
  ) {}

  static async start(o: { identity: string; kubeconfig: string; redisUrl: string; redisPrefix: string; logger: Logger }): Promise<SimOperator> {
    const opts = parseOperatorOptions(['--kubeconfig', o.kubeconfig, '--redis', o.redisUrl, '--redis-prefix', o.redisPrefix, '--log-level', 'warn']);
    const life = new Lifecycle(o.logger);
    try {
      const started = await life.start(operatorParts(opts, { identity: o.identity, logger: o.logger }));
      return new SimOperator(life, started);
    } catch (e) {
      await life.stopAll();
      throw e;
    }
  }

  isLeader(): boolean {
    return this.started.leader.isLeader();
  }

  stop(): Promise<void> {
    return this.life.stopAll();
  }
}
