// A fake API server (no kube-apiserver on these machines) holding some objects, and a started KubeSource of
// node n1 following it: what the leader's controllers read from. close() stops the source and the server
// and removes the kubeconfig's directory.
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { FakeApiServer, kubeconfigFor } from './fake-apiserver';
import { KubeSource } from '../../daemon/config/kube-source';
import type { Logger } from '../../lib/log';

export async function apiWithSource(objects: Array<Record<string, any>>, logger: Logger): Promise<{ api: FakeApiServer; source: KubeSource; close: () => Promise<void> }> {
  const api = new FakeApiServer('fake-token');
  const url = (await api.listen({ port: 0 }))!;
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tether-kube-fixture-'));
  fs.writeFileSync(path.join(dir, 'kubeconfig'), kubeconfigFor(url));
  for (const o of objects) api.apply(o);
  const source = new KubeSource({ kubeconfig: path.join(dir, 'kubeconfig'), nodeName: 'n1', logger, syncTimeoutMs: 10_000 });
  const close = async () => {
    await source.stop();
    await api.close();
    fs.rmSync(dir, { recursive: true, force: true });
  };
  try {
    await source.start();
  } catch (e) {
    await close();
    throw e;
  }
  return { api, source, close };
}
