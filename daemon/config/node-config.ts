// Node facts (zone, labels) for tetherd, read from the config source through objects.ts: Node objects or
// the legacy `{ "nodes": {...} }` JSON. The Kubernetes Node object will feed the same shape later.
import { loadConfig, type NodeFacts } from './objects';

export { loadConfig } from './objects';
export type NodeConfig = NodeFacts;

/**
 * The facts of `nodeName`; no file, or a file that does not mention the node, means no facts. The whole
 * file is validated (pools included), so tetherd refuses a broken config at start rather than at first use.
 */
export function loadNodeConfig(file: string | undefined, nodeName: string): NodeConfig {
  if (!file) return { labels: {} };
  return loadConfig(file).nodes[nodeName] ?? { labels: {} };
}
