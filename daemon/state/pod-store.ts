// The pods this node's tetherd attached, one JSON file per attachment under <stateDir>/pods.
// Written before ADD answers and removed only after DEL has undone everything, so a restart (kill -9
// included) knows exactly what to undo.
import { createHash } from 'node:crypto';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { removeFileDurable, sweepTempFiles, writeFileAtomic } from '../../lib/atomic-file';

/** One attachment of a container to a network through an interface: CNI's identity of a pod's network. */
export interface AttachmentKey {
  network: string;
  containerId: string;
  ifName: string;
}

export interface PodRecord extends AttachmentKey {
  netns: string;
  /** Kubernetes namespace/name from CNI_ARGS when the runtime gave them. */
  podNamespace?: string;
  podName?: string;
  /** The pod's addresses from prevResult (no prefix), and its host-side interface. */
  ips?: string[];
  hostIfName?: string;
  /**
   * The pod's labels. In a cluster they come from the API server; standalone (file config, the testbed)
   * the conflist's `labels` field stands in for it.
   */
  labels?: Record<string, string>;
  /** 'applying' is written before touching the kernel; 'attached' once everything is in place. */
  phase: 'applying' | 'attached';
  /** Opaque to the store: what the pod network layer changed, with previous values. */
  applied?: unknown;
  /** Opaque to the store: the DSR set-up of a load balancer target (pod/dsr-target.ts), while it is one. */
  dsrTarget?: unknown;
  /** The plugin config the pod was attached with (for CHECK and reconciliation). */
  config: Record<string, unknown>;
  createdAt: string;
}

/** The Kubernetes name of a recorded pod (namespace/name), when the runtime passed it. */
export function podKeyOf(r: Pick<PodRecord, 'podNamespace' | 'podName'>): string | undefined {
  return r.podNamespace && r.podName ? `${r.podNamespace}/${r.podName}` : undefined;
}

export function keyString(k: AttachmentKey): string {
  return `${k.network}/${k.containerId}/${k.ifName}`;
}

/**
 * A fixed-length name (SHA-256 of the key, 64 hex digits): network names, container IDs and interface names
 * come from the runtime, so neither their length nor their characters decide a file name. Records written
 * under the earlier name (the URI-encoded fields) are renamed when loaded.
 */
export function fileName(k: AttachmentKey): string {
  return `${createHash('sha256').update(`${k.network}\0${k.containerId}\0${k.ifName}`).digest('hex')}.json`;
}

export class PodStore {
  private readonly dir: string;
  private readonly pods = new Map<string, PodRecord>();

  constructor(stateDir: string) {
    this.dir = path.join(stateDir, 'pods');
    fs.mkdirSync(this.dir, { recursive: true, mode: 0o700 });
  }

  /** Loads every record; returns the names of files that could not be read (kept aside, not lost). */
  load(): { loaded: number; broken: string[] } {
    sweepTempFiles(this.dir);
    const broken: string[] = [];
    for (const name of fs.readdirSync(this.dir)) {
      if (!name.endsWith('.json')) continue;
      const file = path.join(this.dir, name);
      let rec: PodRecord;
      try {
        rec = JSON.parse(fs.readFileSync(file, 'utf8')) as PodRecord;
        if (!rec.containerId || !rec.ifName || !rec.network) throw new Error('record lacks its key');
      } catch {
        fs.renameSync(file, `${file}.broken`);
        broken.push(name);
        continue;
      }
      this.pods.set(keyString(rec), rec);
      if (name !== fileName(rec)) {
        // Written under the earlier naming: write it under its fixed-length name, then drop the old file.
        writeFileAtomic(path.join(this.dir, fileName(rec)), JSON.stringify(rec, null, 1));
        removeFileDurable(file);
      }
    }
    return { loaded: this.pods.size, broken };
  }

  get(k: AttachmentKey): PodRecord | undefined {
    return this.pods.get(keyString(k));
  }

  all(): PodRecord[] {
    return [...this.pods.values()];
  }

  /** Idempotent: writes the record durably, replacing any earlier one for the same attachment. */
  put(rec: PodRecord): void {
    writeFileAtomic(path.join(this.dir, fileName(rec)), JSON.stringify(rec, null, 1));
    this.pods.set(keyString(rec), rec);
  }

  /** Idempotent: removing an unknown attachment is not an error. */
  remove(k: AttachmentKey): void {
    removeFileDurable(path.join(this.dir, fileName(k)));
    this.pods.delete(keyString(k));
  }
}
