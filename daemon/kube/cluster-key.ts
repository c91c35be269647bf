// The cluster key (authenticating tetherd-to-tetherd traffic), and the store's password, as Secrets in tetherd's namespace, created
// by whichever tetherd comes first: a create is atomic, so racing nodes get one winner (409 for the others)
// and all read the same key. `kubectl apply -k install/` then needs no key prepared by hand; an operator
// who wants to choose it creates the Secret first (key: "key", ≥ 32 bytes, hex or base64).
import { randomBytes } from 'node:crypto';
import * as k8s from '@kubernetes/client-node';

function statusOf(e: unknown): number | undefined {
  const x = e as { code?: number; statusCode?: number };
  return x.code ?? x.statusCode;
}

/** The key's text (as the key file would hold it), creating the Secret when it does not exist. */
export function clusterKeyFromSecret(kc: k8s.KubeConfig, namespace: string, name: string): Promise<string> {
  return secretEntry(kc, namespace, name, 'key', () => randomBytes(32).toString('hex'));
}

/**
 * The store's password from Secret `name` (entry "password"), created by the first tetherd like the cluster
 * key: the manifests' Redis pods mount the same Secret and start once it exists. An operator who wants to
 * choose the password creates the Secret first.
 */
export function redisPasswordFromSecret(kc: k8s.KubeConfig, namespace: string, name: string): Promise<string> {
  return secretEntry(kc, namespace, name, 'password', () => randomBytes(24).toString('base64url'));
}

/**
 * One entry of a Secret in tetherd's namespace, creating the Secret with a generated value when it does
 * not exist: a create is atomic, so racing nodes get one winner (409 for the others) and all read the same.
 */
async function secretEntry(kc: k8s.KubeConfig, namespace: string, name: string, entry: string, generate: () => string): Promise<string> {
  const core = kc.makeApiClient(k8s.CoreV1Api);
  const read = async (): Promise<string | undefined> => {
    try {
      const s = await core.readNamespacedSecret({ name, namespace });
      const v = s.data?.[entry];
      if (!v) throw new Error(`Secret ${namespace}/${name} has no ${JSON.stringify(entry)} entry`);
      return Buffer.from(v, 'base64').toString('utf8');
    } catch (e) {
      if (statusOf(e) === 404) return undefined;
      throw e;
    }
  };
  const have = await read();
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
  const winner = await read();
  if (winner === undefined) throw new Error(`Secret ${namespace}/${name} was created by another node but cannot be read`);
  return winner;
}
