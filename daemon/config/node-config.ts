// Node facts from the config source (a JSON file for now; the Kubernetes Node object later): zone, labels.
import * as fs from 'node:fs';
import { TetherError, ErrorCode } from '../errors';

export interface NodeConfig {
  zone?: string;
  labels: Record<string, string>;
}

/** Reads `{ "nodes": { "<name>": { "zone": "...", "labels": {...} } } }`; an absent file means no facts. */
export function loadNodeConfig(file: string | undefined, nodeName: string): NodeConfig {
  if (!file) return { labels: {} };
  let raw: unknown;
  try {
    raw = JSON.parse(fs.readFileSync(file, 'utf8'));
  } catch (e) {
    throw new TetherError(ErrorCode.InvalidConfig, `config ${file}: ${(e as Error).message}`);
  }
  const nodes = (raw as { nodes?: Record<string, unknown> })?.nodes ?? {};
  if (typeof nodes !== 'object') throw new TetherError(ErrorCode.InvalidConfig, `config ${file}: nodes must be an object`);
  const mine = (nodes as Record<string, { zone?: unknown; labels?: unknown }>)[nodeName] ?? {};
  if (mine.zone !== undefined && typeof mine.zone !== 'string') {
    throw new TetherError(ErrorCode.InvalidConfig, `config ${file}: nodes.${nodeName}.zone must be a string`);
  }
  const labels = (mine.labels ?? {}) as Record<string, string>;
  if (typeof labels !== 'object' || Object.values(labels).some((v) => typeof v !== 'string')) {
    throw new TetherError(ErrorCode.InvalidConfig, `config ${file}: nodes.${nodeName}.labels must map strings to strings`);
  }
  return { zone: mine.zone as string | undefined, labels };
}
