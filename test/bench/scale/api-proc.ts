// The scale bench's API server: test/lib/fake-apiserver.ts (a FAKE: there is no kube-apiserver here) in its
// own process, serving every simulated node's watches and lists, driven by the coordinator over IPC. Each
// node's kubeconfig carries its own bearer token (its name), so the fake tallies requests, watch events and
// bytes per node. A real API server sends watch bookmarks about once a minute; so does this one.
import { FakeApiServer } from '../../lib/fake-apiserver';

export type ApiRequest =
  | { op: 'apply'; objects: Array<Record<string, any>> }
  | { op: 'remove'; kind: string; name: string; namespace?: string }
  | { op: 'load' }
  | { op: 'exit' };

export interface ApiLoad {
  /** Per token (node name): requests, lists, watches, writes, events, bytes since start. */
  clients: Record<string, { requests: number; lists: number; watches: number; writes: number; events: number; bytes: number }>;
  openWatches: number;
  rss: number;
  cpuUserMs: number;
  cpuSystemMs: number;
}

const BOOKMARK_MS = 60_000;

async function main(): Promise<void> {
  const api = new FakeApiServer();
  api.recordCalls = false;
  const url = await listen(api);
  const bookmarks = setInterval(() => api.bookmark(), BOOKMARK_MS);
  const handle = async (m: ApiRequest): Promise<unknown> => {
    switch (m.op) {
      case 'apply':
        for (const o of m.objects) api.apply(o);
        return api.resourceVersion;
      case 'remove':
        return api.remove(m.kind, m.name, m.namespace);
      case 'load': {
        const cpu = process.cpuUsage();
        return { clients: Object.fromEntries(api.load), openWatches: api.openWatches(), rss: process.memoryUsage().rss, cpuUserMs: cpu.user / 1000, cpuSystemMs: cpu.system / 1000 } satisfies ApiLoad;
      }
      case 'exit':
        clearInterval(bookmarks);
        await api.close();
        setTimeout(() => process.exit(0), 50);
        return true;
    }
  };
  process.on('message', (msg: { id: number; req: ApiRequest }) => {
    handle(msg.req).then(
      (result) => process.send!({ id: msg.id, result }),
      (e) => process.send!({ id: msg.id, error: (e as Error).message }),
    );
  });
  process.on('disconnect', () => process.exit(0));
  process.send!({ ready: true, url });
}

async function listen(api: FakeApiServer): Promise<string> {
  const url = await api.listen({ host: '127.0.0.1', port: 0 });
  if (!url) throw new Error('fake apiserver: no URL');
  return url;
}

main().catch((e) => {
  process.stderr.write(`fake apiserver process failed: ${(e as Error).stack}\n`);
  process.exit(1);
});
