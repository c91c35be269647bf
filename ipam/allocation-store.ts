// Node-local, crash-safe record of pod address allocations and of the blocks this node owns.
// One file per allocated address (created with link(2), so an existing allocation is never overwritten)
// and one blocks file per pool; a tetherd killed at any instant restarts with exactly what was durable.
import * as fs from 'node:fs';
import * as path from 'node:path';
import { fsyncDir, removeFileDurable, sweepTempFiles, writeFileAtomic } from '../lib/atomic-file';
import type { IpFamily, PodOwner } from './types';

export interface AllocationRecord {
  pool: string;
  family: IpFamily;
  address: string;
  /** The node block the address lies in, e.g. "10.244.3.64/26". */
  block: string;
  owner: PodOwner;
  createdAt: string;
}

export class AllocationStore {
  private readonly root: string;
  /** Pool directories made (or found) by this process: made once, not on every allocation. */
  private readonly made = new Set<string>();

  constructor(stateDir: string) {
    this.root = path.join(stateDir, 'ipam');
    fs.mkdirSync(this.root, { recursive: true, mode: 0o700 });
  }

  private poolDir(pool: string): string {
    const d = path.join(this.root, encodeURIComponent(pool));
    if (!this.made.has(d)) {
      fs.mkdirSync(path.join(d, 'addrs'), { recursive: true, mode: 0o700 });
      this.made.add(d);
    }
    return d;
  }

  private addrFile(pool: string, address: string): string {
    return path.join(this.poolDir(pool), 'addrs', `${encodeURIComponent(address)}.json`);
  }

  /** Records an allocation durably; throws EEXIST if the address is already recorded (never overwrites). */
  create(rec: AllocationRecord): void {
    const file = this.addrFile(rec.pool, rec.address);
    const tmp = path.join(path.dirname(file), `.${path.basename(file)}.${process.pid}.tmp`);
    let fd: number;
    try {
      fd = fs.openSync(tmp, 'w', 0o600);
    } catch (e) {
      // The pool's directory was removed under us: made again.
      if ((e as NodeJS.ErrnoException).code !== 'ENOENT') throw e;
      this.made.clear();
      this.poolDir(rec.pool);
      fd = fs.openSync(tmp, 'w', 0o600);
    }
    try {
      fs.writeSync(fd, JSON.stringify(rec));
      fs.fsyncSync(fd);
    } finally {
      fs.closeSync(fd);
    }
    try {
      fs.linkSync(tmp, file);
    } finally {
      fs.unlinkSync(tmp);
    }
    fsyncDir(path.dirname(file));
  }

  /** Idempotent. */
  remove(pool: string, address: string): void {
    removeFileDurable(this.addrFile(pool, address));
  }

  /** Every recorded allocation; unreadable files are set aside (renamed .broken) and reported. */
  loadAll(): { records: AllocationRecord[]; broken: string[] } {
    const records: AllocationRecord[] = [];
    const broken: string[] = [];
    for (const poolEnc of fs.readdirSync(this.root)) {
      const dir = path.join(this.root, poolEnc, 'addrs');
      if (!fs.existsSync(dir)) continue;
      sweepTempFiles(dir);
      for (const name of fs.readdirSync(dir)) {
        if (!name.endsWith('.json')) continue;
        const file = path.join(dir, name);
        try {
          const rec = JSON.parse(fs.readFileSync(file, 'utf8')) as AllocationRecord;
          if (!rec.address || !rec.pool || !rec.owner?.containerId) throw new Error('incomplete');
          records.push(rec);
        } catch {
          fs.renameSync(file, `${file}.broken`);
          broken.push(file);
        }
      }
    }
    return { records, broken };
  }

  /** The blocks this node believes it owns in a pool (its own copy; the cluster store is the authority). */
  loadBlocks(pool: string): string[] {
    try {
      return JSON.parse(fs.readFileSync(path.join(this.poolDir(pool), 'blocks.json'), 'utf8')) as string[];
    } catch {
      return [];
    }
  }

  /** The cluster store generation last seen (see ClusterStore.generation). */
  loadGeneration(): string | undefined {
    try {
      return fs.readFileSync(path.join(this.root, 'store-generation'), 'utf8').trim() || undefined;
    } catch {
      return undefined;
    }
  }

  saveGeneration(g: string): void {
    writeFileAtomic(path.join(this.root, 'store-generation'), g);
  }

  saveBlocks(pool: string, blocks: string[]): void {
    writeFileAtomic(path.join(this.poolDir(pool), 'blocks.json'), JSON.stringify([...blocks].sort()));
  }
}

