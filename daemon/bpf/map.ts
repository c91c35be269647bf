// A BPF map by file descriptor: typed update / lookup / delete / iterate over raw Buffers (encoded by the
// struct mirrors, e.g. fou-structs.ts), batched updates with a per-element fallback, per-CPU values.
import { close as closeFd } from '../sys/libc';
import { BpfCallError, check, libbpf, possibleCpus } from './libbpf';

export const BPF_ANY = 0n;
export const BPF_NOEXIST = 1n;
export const BPF_EXIST = 2n;

const ENOENT = 2;
const EOPNOTSUPP = 95;
const ENOTSUPP = 524; // kernel-internal "no batch ops for this map type"

// enum bpf_map_type values whose values are stored once per possible CPU.
const PERCPU_TYPES = new Set([5 /* PERCPU_HASH */, 6 /* PERCPU_ARRAY */, 10 /* LRU_PERCPU_HASH */, 21 /* PERCPU_CGROUP_STORAGE */]);

export interface MapInfo {
  type: number;
  id: number;
  keySize: number;
  valueSize: number;
  maxEntries: number;
  flags: number;
  name: string;
}

/** struct bpf_map_info (uapi linux/bpf.h), first fields only: type, id, key_size, value_size, max_entries, map_flags, name[16]. */
export function mapInfoByFd(fd: number, what: string): MapInfo {
  const info = Buffer.alloc(40);
  const len = Buffer.alloc(4);
  len.writeUInt32LE(info.length);
  check(libbpf().bpf_obj_get_info_by_fd(fd, info, len), 'bpf_obj_get_info_by_fd', what);
  const raw = info.subarray(24, 40);
  const nul = raw.indexOf(0);
  return {
    type: info.readUInt32LE(0),
    id: info.readUInt32LE(4),
    keySize: info.readUInt32LE(8),
    valueSize: info.readUInt32LE(12),
    maxEntries: info.readUInt32LE(16),
    flags: info.readUInt32LE(20),
    name: raw.subarray(0, nul < 0 ? 16 : nul).toString('latin1'),
  };
}

/** struct bpf_map_batch_opts { size_t sz; __u64 elem_flags; __u64 flags; } (libbpf bpf.h). */
function batchOpts(elemFlags: bigint): Buffer {
  const b = Buffer.alloc(24);
  b.writeBigUInt64LE(24n, 0);
  b.writeBigUInt64LE(elemFlags, 8);
  return b;
}

export class BpfMap {
  readonly info: MapInfo;
  private closed = false;

  /** ownsFd: close fd in close() (true for maps opened from a pin; a BpfObject's maps die with it). */
  constructor(readonly name: string, readonly fd: number, private readonly ownsFd: boolean) {
    this.info = mapInfoByFd(fd, `map ${name}`);
  }

  /** Opens a pinned map (e.g. after a restart, without the object that created it). */
  static fromPin(pinPath: string): BpfMap {
    const fd = check(libbpf().bpf_obj_get(pinPath), 'bpf_obj_get', `pin ${pinPath}`);
    try {
      return new BpfMap(pinPath, fd, true);
    } catch (e) {
      closeFd(fd);
      throw e;
    }
  }

  get perCpu(): boolean {
    return PERCPU_TYPES.has(this.info.type);
  }

  /** Bytes of one value as user space sees it: per-CPU maps hold one 8-byte-aligned slot per possible CPU. */
  get valueBytes(): number {
    return this.perCpu ? Math.ceil(this.info.valueSize / 8) * 8 * possibleCpus() : this.info.valueSize;
  }

  private what(): string {
    return `map ${this.name}`;
  }

  private checkSizes(key: Buffer, value?: Buffer): void {
    if (key.length !== this.info.keySize) {
      throw new BpfCallError('encode key', `${this.what()}: key is ${key.length} bytes, map wants ${this.info.keySize}`, 22);
    }
    if (value && value.length !== this.valueBytes) {
      throw new BpfCallError('encode value', `${this.what()}: value is ${value.length} bytes, map wants ${this.valueBytes}`, 22);
    }
  }

  update(key: Buffer, value: Buffer, flags: bigint = BPF_ANY): void {
    this.checkSizes(key, value);
    check(libbpf().bpf_map_update_elem(this.fd, key, value, flags), 'bpf_map_update_elem', this.what());
  }

  /** The value for key, or undefined when absent. Per-CPU maps: all CPUs' slots back to back. */
  lookup(key: Buffer): Buffer | undefined {
    this.checkSizes(key);
    const value = Buffer.alloc(this.valueBytes);
    const ret = libbpf().bpf_map_lookup_elem(this.fd, key, value);
    if (ret === -ENOENT) return undefined;
    check(ret, 'bpf_map_lookup_elem', this.what());
    return value;
  }

  /** Per-CPU value split into one Buffer per possible CPU. */
  lookupPerCpu(key: Buffer): Buffer[] | undefined {
    const all = this.lookup(key);
    if (!all) return undefined;
    const stride = Math.ceil(this.info.valueSize / 8) * 8;
    const out: Buffer[] = [];
    for (let off = 0; off < all.length; off += stride) out.push(all.subarray(off, off + this.info.valueSize));
    return out;
  }

  /** Removes key; false when it was not there (idempotent). */
  delete(key: Buffer): boolean {
    this.checkSizes(key);
    const ret = libbpf().bpf_map_delete_elem(this.fd, key);
    if (ret === -ENOENT) return false;
    check(ret, 'bpf_map_delete_elem', this.what());
    return true;
  }

  /** All keys (a snapshot that may miss or repeat keys changed concurrently, as get_next_key does). */
  keys(): Buffer[] {
    const out: Buffer[] = [];
    let prev: Buffer | null = null;
    for (;;) {
      const next = Buffer.alloc(this.info.keySize);
      const ret = libbpf().bpf_map_get_next_key(this.fd, prev, next);
      if (ret === -ENOENT) return out;
      check(ret, 'bpf_map_get_next_key', this.what());
      out.push(next);
      prev = next;
    }
  }

  /** Updates many entries in one syscall where the kernel supports it, else one by one. */
  updateBatch(entries: Array<[Buffer, Buffer]>, flags: bigint = BPF_ANY): void {
    if (entries.length === 0) return;
    for (const [k, v] of entries) this.checkSizes(k, v);
    const keys = Buffer.concat(entries.map((e) => e[0]));
    const values = Buffer.concat(entries.map((e) => e[1]));
    const count = Buffer.alloc(4);
    count.writeUInt32LE(entries.length);
    const ret = libbpf().bpf_map_update_batch(this.fd, keys, values, count, batchOpts(flags));
    if (ret === -ENOTSUPP || ret === -EOPNOTSUPP) {
      // count says how many went in before the kernel gave up; nothing, for an unsupported map type.
      for (const [k, v] of entries.slice(count.readUInt32LE())) this.update(k, v, flags);
      return;
    }
    check(ret, 'bpf_map_update_batch', `${this.what()}, ${count.readUInt32LE()}/${entries.length} applied`);
  }

  /** Every entry, batched where supported (hash and array maps), else by iterating keys. */
  entries(): Array<[Buffer, Buffer]> {
    const ks = this.info.keySize;
    const vs = this.valueBytes;
    const chunk = Math.max(1, Math.min(this.info.maxEntries, 1024));
    const out: Array<[Buffer, Buffer]> = [];
    // The batch cursor is opaque: a bucket index for hash maps, a key for arrays; 8 bytes or a key covers both.
    let inBatch: Buffer | null = null;
    for (;;) {
      const outBatch = Buffer.alloc(Math.max(ks, 8));
      const keys = Buffer.alloc(ks * chunk);
      const values = Buffer.alloc(vs * chunk);
      const count = Buffer.alloc(4);
      count.writeUInt32LE(chunk);
      const ret = libbpf().bpf_map_lookup_batch(this.fd, inBatch, outBatch, keys, values, count, batchOpts(0n));
      if (ret === -ENOTSUPP || ret === -EOPNOTSUPP) {
        return this.keys().flatMap((k) => {
          const v = this.lookup(k);
          return v ? [[k, v] as [Buffer, Buffer]] : [];
        });
      }
      if (ret < 0 && ret !== -ENOENT) check(ret, 'bpf_map_lookup_batch', this.what());
      const n = count.readUInt32LE();
      for (let i = 0; i < n; i++) out.push([keys.subarray(i * ks, (i + 1) * ks), values.subarray(i * vs, (i + 1) * vs)]);
      if (ret === -ENOENT) return out; // the kernel's way of saying "that was the last batch"
      inBatch = outBatch;
    }
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    if (this.ownsFd) closeFd(this.fd);
  }
}
