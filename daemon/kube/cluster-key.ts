// The cluster key (authenticating tetherd-to-tetherd traffic), and the store's password, as Secrets in
// tether's namespace (type Opaque). The operator creates them (ensureClusterSecrets): a create is atomic, so
// racing replicas get one winner (409 for the others) and all read the same value. `kubectl apply -k
// install/` then needs no key prepared by hand; whoever wants to choose a value creates the Secret first
// (the cluster key: entry "key", ≥ 32 bytes, hex or base64; the store's: entry "password"). tetherd only
// reads them (get by name): it never creates a Secret, and waits for one the operator has not created yet.
import { randomBytes } from 'node:crypto';
import * as k8s from '@kubernetes/client-node';
import type { Logger } from '../../lib/log';

function statusOf(e: unknown): number | undefined {
  const x = e as { code?: number; statusCode?: number };
  return x.code ?? x.statusCode;
}

/** The cluster Secrets and how each value is made: the key's text (as the key file would hold it), the store's password. */
export const CLUSTER_SECRETS = {
  clusterKey: { entry: 'key', generate: () => randomBytes(32).toString('hex') },
  redisPassword: { entry: 'password', generate: () => randomBytes(24).toString('base64url') },
} as const;

export type ClusterSecret = keyof typeof CLUSTER_SECRETS;

/** One entry of a Secret; undefined when the Secret does not exist (a Secret without the entry throws, naming it). */
async function readEntry(core: k8s.CoreV1Api, namespace: string, name: string, entry: string): Promise<string | undefined> {
  try {
    const s = await core.readNamespacedSecret({ name, namespace });
    const v = s.data?.[entry];
    if (!v) throw new Error(`Secret ${namespace}/${name} has no ${JSON.stringify(entry)} entry`);
    return Buffer.from(v, 'base64').toString('utf8');
  } catch (e) {
    if (statusOf(e) === 404) return undefined;
    throw e;
  }
}

/**
 * tetherd: a cluster Secret's value, read by name; while the Secret does not exist (the operator has not
 * created it yet) read again every `everyMs`, saying so every `logEveryMs`. Any other error throws.
 */
export async function awaitClusterSecret(
  kc: k8s.KubeConfig, namespace: string, name: string, which: ClusterSecret, o: { logger: Logger; everyMs?: number; logEveryMs?: number; signal?: AbortSignal },
): Promise<string> {
  const core = kc.makeApiClient(k8s.CoreV1Api);
  const since = Date.now();
  let said = 0;
  for (;;) {
    const v = await readEntry(core, namespace, name, CLUSTER_SECRETS[which].entry);
    if (v !== undefined) return v;
    if (o.signal?.aborted) throw new Error(`Secret ${namespace}/${name} does not exist (stopped waiting for it)`);
    if (Date.now() - said >= (o.logEveryMs ?? 30_000)) {
      said = Date.now();
      o.logger.warn('waiting for a cluster Secret the operator creates (is tether-operator running?)', { secret: `${namespace}/${name}`, waitedS: Math.round((Date.now() - since) / 1000) });
    }
    await new Promise((r) => setTimeout(r, o.everyMs ?? 2000));
  }
}

/**
 * The operator: a cluster Secret's value, creating the Secret (type Opaque) with a generated value when it
 * does not exist. Racing creators get one winner and all read the same value.
 */
export async function ensureClusterSecret(kc: k8s.KubeConfig, namespace: string, name: string, which: ClusterSecret): Promise<string> {
  const core = kc.makeApiClient(k8s.CoreV1Api);
  const { entry, generate } = CLUSTER_SECRETS[which];
  const have = await readEntry(core, namespace, name, entry);
  if (have !== undefined) return have;
  const value = generate();
  try {
    await core.createNamespacedSecret({
      namespace,
      body: { apiVersion: 'v1', kind: 'Secret', metadata: { name, namespace, labels: { 'app.kubernetes.io/name': 'tether' } }, type: 'Opaque', data: { [entry]: Buffer.from(value).toString('base64') } },
    });
    return value;
  } catch (e) {
    if (statusOf(e) !== 409) throw e;
  }
  const winner = await readEntry(core, namespace, name, entry);
  if (winner === undefined) throw new Error(`Secret ${namespace}/${name} was created by another replica but cannot be read`);
  return winner;
}
