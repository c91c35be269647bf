// The config source tetherd runs on: the Kubernetes API, a watched file, or nothing (no pools, no Egress).
import type { Logger } from '../../lib/log';
import { Lifecycle, StartError } from '../lifecycle';
import type { ConfigObjects } from '../config/objects';
import { EmptySource, FileSource, type ConfigSource } from '../config/source';
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

export async function startSource(opts: Options, nodeName: string, logger: Logger, life: Lifecycle): Promise<{ source: ConfigSource; config: ConfigObjects; takeMissed: () => ConfigObjects | undefined }> {
  const kube = kubeMode(opts);
  if (kube && opts.config) throw new StartError(2, '--config and --kubernetes/--kubeconfig are two config sources: give one');
  let source: ConfigSource;
  try {
    source = kube ? new KubeSource({ kubeconfig: opts.kubeconfig, nodeName, logger }) : opts.config ? new FileSource(opts.config, logger) : new EmptySource();
  } catch (e) {
    throw new StartError(2, `config source: ${(e as Error).message}`);
  }
  let config: ConfigObjects;
  try {
    config = await source.start();
  } catch (e) {
    await source.stop();
    throw new StartError(kube ? 1 : 2, `config rejected: ${(e as Error).message}`);
  }
  life.started('config source', () => source.stop());
  // Updates until the feed subscribes (the parts start meanwhile, from `config`) are held, not lost: a Pod
  // seen in that window (its pod's ADD arriving just then) would otherwise get its roles only at the
  // next, unrelated update.
  let missed: ConfigObjects | undefined;
  const hold = (c: ConfigObjects) => (missed = c);
  source.on('update', hold);
  const takeMissed = () => {
    source.off('update', hold);
    const m = missed;
    missed = undefined;
    return m;
  };
  return { source, config, takeMissed };
}
