// The config source tetherd runs on: the Kubernetes API, a watched file, or nothing (no pools, no Egress),
// the configuration in force, and the feed of its changes to the subsystems.
import type { Logger } from '../../lib/log';
import { StartError, type Part } from '../lifecycle';
import type { ConfigObjects } from '../config/objects';
import { EmptySource, feedResolved, FileSource, type ConfigSource, type Reconciler } from '../config/source';
import { KubeSource } from '../config/kube-source';
import { kubeMode, type Options } from '../options';

/** The configuration in force, for the parts that read it between updates (status). */
export class CurrentConfig {
  constructor(
    public config: ConfigObjects,
    private readonly nodeName: string,
  ) {}

  readonly name = 'current configuration';

  get node() {
    return this.config.nodes[this.nodeName] ?? { labels: {} };
  }

  apply(c: ConfigObjects): void {
    this.config = c;
  }
}

/**
 * The config source, as a part: built from the options (a bad choice exits 2), its first configuration
 * read at start (rejected: exit 2, or 1 from the Kubernetes API), stopped last.
 */
export class SourcePart implements Part {
  readonly name = 'config source';
  readonly source: ConfigSource;
  private readonly kube: boolean;
  private first?: ConfigObjects;
  private missed?: ConfigObjects;
  private readonly hold = (c: ConfigObjects) => {
    this.missed = c;
  };

  constructor(opts: Pick<Options, 'kubernetes' | 'kubeconfig' | 'config'>, nodeName: string, logger: Logger) {
    this.kube = kubeMode(opts);
    if (this.kube && opts.config) throw new StartError(2, '--config and --kubernetes/--kubeconfig are two config sources: give one');
    try {
      this.source = this.kube ? new KubeSource({ kubeconfig: opts.kubeconfig, nodeName, logger }) : opts.config ? new FileSource(opts.config, logger) : new EmptySource();
    } catch (e) {
      throw new StartError(2, `config source: ${(e as Error).message}`);
    }
  }

  async start(): Promise<void> {
    try {
      this.first = await this.source.start();
    } catch (e) {
      await this.source.stop();
      throw new StartError(this.kube ? 1 : 2, `config rejected: ${(e as Error).message}`);
    }
    // Updates until the feed subscribes (the parts start meanwhile, from `config`) are held, not lost: a Pod
    // seen in that window (its pod's ADD arriving just then) would otherwise get its roles only at the
    // next, unrelated update.
    this.source.on('update', this.hold);
  }

  /** The first configuration, which the other parts start from. */
  get config(): ConfigObjects {
    if (!this.first) throw new Error('config source: not started');
    return this.first;
  }

  /** The update held since start, if one came (once: the feed takes it as it subscribes). */
  readonly takeMissed = (): ConfigObjects | undefined => {
    this.source.off('update', this.hold);
    const m = this.missed;
    this.missed = undefined;
    return m;
  };

  stop(): Promise<void> {
    return this.source.stop();
  }
}

/**
 * Every accepted configuration change of `source`, resolved once, fed to the reconcilers in order
 * (feedResolved), from its start (with the update held since the source started) to its stop.
 */
export function configFeed<D>(source: SourcePart, resolve: (c: ConfigObjects) => D, reconcilers: Array<Reconciler<D>>, logger: Logger): Part {
  let feed: { stop(): Promise<void> } | undefined;
  return {
    name: 'config updates',
    start: () => {
      feed = feedResolved(source.source, resolve, reconcilers, logger, source.takeMissed);
    },
    stop: () => feed?.stop(),
  };
}
