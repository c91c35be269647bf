// Raw libbpf.so.1 bindings over koffi, plus the one place that turns a libbpf failure into a TetherError.
// libbpf 1.x (strict mode) returns -errno from int functions and NULL (errno set) from pointer functions.
import { koffi } from '../sys/ffi';
import { errnoName } from '../sys/libc';
import { TetherError, ErrorCode } from '../../lib/errors';
import { log } from '../../lib/log';

/** An opaque libbpf pointer (bpf_object *, bpf_program *, bpf_map *) as koffi hands it out. */
export type Ptr = unknown;

export interface Libbpf {
  bpf_object__open_file(path: string, opts: Buffer | null): Ptr | null;
  bpf_object__load(obj: Ptr): number;
  bpf_object__close(obj: Ptr): void;
  bpf_object__find_program_by_name(obj: Ptr, name: string): Ptr | null;
  bpf_object__find_map_by_name(obj: Ptr, name: string): Ptr | null;
  bpf_object__next_map(obj: Ptr, prev: Ptr | null): Ptr | null;
  bpf_program__fd(prog: Ptr): number;
  bpf_program__set_autoload(prog: Ptr, autoload: boolean): number;
  bpf_map__name(map: Ptr): string;
  bpf_map__fd(map: Ptr): number;
  bpf_map__key_size(map: Ptr): number;
  bpf_map__value_size(map: Ptr): number;
  bpf_map__type(map: Ptr): number;
  bpf_map__max_entries(map: Ptr): number;
  bpf_map__map_flags(map: Ptr): number;
  bpf_map__set_pin_path(map: Ptr, path: string | null): number;
  bpf_map__set_max_entries(map: Ptr, n: number): number;
  bpf_map__pin(map: Ptr, path: string | null): number;
  bpf_map__unpin(map: Ptr, path: string | null): number;
  bpf_obj_get(path: string): number;
  bpf_obj_get_info_by_fd(fd: number, info: Buffer, len: Buffer): number;
  bpf_map_update_elem(fd: number, key: Buffer, value: Buffer, flags: bigint): number;
  bpf_map_lookup_elem(fd: number, key: Buffer, value: Buffer): number;
  bpf_map_delete_elem(fd: number, key: Buffer): number;
  bpf_map_get_next_key(fd: number, key: Buffer | null, next: Buffer): number;
  bpf_map_update_batch(fd: number, keys: Buffer, values: Buffer, count: Buffer, opts: Buffer): number;
  bpf_map_lookup_batch(fd: number, inBatch: Buffer | null, outBatch: Buffer, keys: Buffer, values: Buffer, count: Buffer, opts: Buffer): number;
  bpf_tc_hook_create(hook: Buffer): number;
  bpf_tc_hook_destroy(hook: Buffer): number;
  bpf_tc_attach(hook: Buffer, opts: Buffer): number;
  bpf_tc_detach(hook: Buffer, opts: Buffer): number;
  bpf_tc_query(hook: Buffer, opts: Buffer): number;
  libbpf_num_possible_cpus(): number;
}

let lib: Libbpf | undefined;

/** The bindings, loaded on first use so that code paths without eBPF never need libbpf installed. */
export function libbpf(): Libbpf {
  if (lib) return lib;
  const k = koffi();
  let so;
  try {
    so = k.load('libbpf.so.1');
  } catch (e) {
    throw new TetherError(ErrorCode.Bpf, `cannot load libbpf.so.1 (install libbpf1): ${(e as Error).message}`, { cause: e });
  }
  // Every struct is passed as a Buffer laid out by hand (see tc.ts, map.ts): explicit offsets next to the
  // C definition are easier to check against libbpf.h than koffi struct declarations.
  const f = (proto: string) => so.func(proto);
  lib = {
    bpf_object__open_file: f('void *bpf_object__open_file(const char *path, void *opts)'),
    bpf_object__load: f('int bpf_object__load(void *obj)'),
    bpf_object__close: f('void bpf_object__close(void *obj)'),
    bpf_object__find_program_by_name: f('void *bpf_object__find_program_by_name(void *obj, const char *name)'),
    bpf_object__find_map_by_name: f('void *bpf_object__find_map_by_name(void *obj, const char *name)'),
    bpf_object__next_map: f('void *bpf_object__next_map(void *obj, void *prev)'),
    bpf_program__fd: f('int bpf_program__fd(void *prog)'),
    bpf_program__set_autoload: f('int bpf_program__set_autoload(void *prog, bool autoload)'),
    bpf_map__name: f('const char *bpf_map__name(void *map)'),
    bpf_map__fd: f('int bpf_map__fd(void *map)'),
    bpf_map__key_size: f('uint32_t bpf_map__key_size(void *map)'),
    bpf_map__value_size: f('uint32_t bpf_map__value_size(void *map)'),
    bpf_map__type: f('int bpf_map__type(void *map)'),
    bpf_map__max_entries: f('uint32_t bpf_map__max_entries(void *map)'),
    bpf_map__map_flags: f('uint32_t bpf_map__map_flags(void *map)'),
    bpf_map__set_pin_path: f('int bpf_map__set_pin_path(void *map, const char *path)'),
    bpf_map__set_max_entries: f('int bpf_map__set_max_entries(void *map, uint32_t max_entries)'),
    bpf_map__pin: f('int bpf_map__pin(void *map, const char *path)'),
    bpf_map__unpin: f('int bpf_map__unpin(void *map, const char *path)'),
    bpf_obj_get: f('int bpf_obj_get(const char *path)'),
    bpf_obj_get_info_by_fd: f('int bpf_obj_get_info_by_fd(int fd, void *info, void *len)'),
    bpf_map_update_elem: f('int bpf_map_update_elem(int fd, void *key, void *value, uint64_t flags)'),
    bpf_map_lookup_elem: f('int bpf_map_lookup_elem(int fd, void *key, void *value)'),
    bpf_map_delete_elem: f('int bpf_map_delete_elem(int fd, void *key)'),
    bpf_map_get_next_key: f('int bpf_map_get_next_key(int fd, void *key, void *next)'),
    bpf_map_update_batch: f('int bpf_map_update_batch(int fd, void *keys, void *values, void *count, void *opts)'),
    bpf_map_lookup_batch: f('int bpf_map_lookup_batch(int fd, void *in_batch, void *out_batch, void *keys, void *values, void *count, void *opts)'),
    bpf_tc_hook_create: f('int bpf_tc_hook_create(void *hook)'),
    bpf_tc_hook_destroy: f('int bpf_tc_hook_destroy(void *hook)'),
    bpf_tc_attach: f('int bpf_tc_attach(void *hook, void *opts)'),
    bpf_tc_detach: f('int bpf_tc_detach(void *hook, void *opts)'),
    bpf_tc_query: f('int bpf_tc_query(void *hook, void *opts)'),
    libbpf_num_possible_cpus: f('int libbpf_num_possible_cpus()'),
  } as Libbpf;
  routePrints(so);
  return lib;
}

let quiet = 0;
/** Warnings of the innermost capturing() call under way, held back instead of logged. */
let held: string[] | undefined;

/** Runs fn with libbpf's warnings dropped: for probes whose failure is an expected answer. */
export function quietly<T>(fn: () => T): T {
  quiet++;
  try {
    return fn();
  } finally {
    quiet--;
  }
}

/**
 * Runs fn with libbpf's warnings held back and hands them to the caller, which decides: drop them when
 * the failure was the expected answer (e.g. EEXIST), or put them into the error it raises otherwise.
 */
export function capturing<T>(fn: () => T): { value: T; warnings: string[] } {
  const outer = held;
  const mine: string[] = [];
  held = mine;
  try {
    return { value: fn(), warnings: mine };
  } finally {
    held = outer;
  }
}

// libbpf prints warnings (and the verifier log when a load fails) to stderr; route them into our logs.
// The callback gets a va_list, which on x86-64 and arm64 is passed as a pointer: vsnprintf formats it.
// The registered callback is kept in a module variable so it is never garbage-collected.
let printCb: unknown;
function routePrints(so: ReturnType<ReturnType<typeof koffi>['load']>): void {
  const k = koffi();
  const vsnprintf = k.load('libc.so.6').func('int vsnprintf(_Out_ uint8_t *buf, size_t n, const char *fmt, void *ap)');
  const proto = k.proto('int tether_libbpf_print_fn(int level, const char *fmt, void *ap)');
  const setPrint = so.func('void *libbpf_set_print(tether_libbpf_print_fn *fn)');
  printCb = k.register((level: number, fmt: string, ap: unknown) => {
    // enum libbpf_print_level: 0 WARN, 1 INFO, 2 DEBUG; INFO and DEBUG are libbpf's chatter.
    if (level !== 0 || quiet > 0) return 0;
    const buf = Buffer.alloc(16384);
    const n = vsnprintf(buf, buf.length, fmt, ap);
    const text = buf.subarray(0, Math.max(0, Math.min(n, buf.length - 1))).toString().trimEnd(); // already prefixed "libbpf: "
    if (held) held.push(text);
    else log().warn(text);
    return 0;
  }, k.pointer(proto));
  setPrint(printCb);
}

/** errno of the last libbpf call that returned NULL (libbpf 1.x sets it). */
export function lastErrno(): number {
  return koffi().errno();
}

/** A failed libbpf operation: names the operation, what it was about, and the errno. */
export class BpfCallError extends TetherError {
  readonly errno: number;
  constructor(op: string, what: string, errno: number, cause?: unknown) {
    super(ErrorCode.Bpf, `${op} (${what}) failed: ${errnoName(errno)} (errno ${errno})`, { cause });
    this.name = 'BpfCallError';
    this.errno = errno;
  }
}

/** Throws BpfCallError when an int-returning libbpf call failed; returns the value otherwise. */
export function check(ret: number, op: string, what: string): number {
  if (ret < 0) throw new BpfCallError(op, what, -ret);
  return ret;
}

/** Throws BpfCallError when a pointer-returning libbpf call gave NULL. */
export function checkPtr<T>(p: T | null, op: string, what: string, errnoIfUnset = 2 /* ENOENT */): T {
  if (p === null || p === undefined) throw new BpfCallError(op, what, lastErrno() || errnoIfUnset);
  return p;
}

let cpus: number | undefined;

/** Possible CPUs: the stride count of per-CPU map values. */
export function possibleCpus(): number {
  if (cpus === undefined) cpus = check(libbpf().libbpf_num_possible_cpus(), 'libbpf_num_possible_cpus', 'cpu count');
  return cpus;
}

/** A BPF ring buffer read with libbpf's ring_buffer__consume: each record is handed to onRecord (copied). */
export class RingBufferReader {
  private rb: Ptr | null;
  private cb: unknown;
  private static fns?: {
    create(fd: number, cb: unknown, ctx: null, opts: null): Ptr | null;
    consume(rb: Ptr): number;
    free(rb: Ptr): void;
  };

  constructor(mapFd: number, onRecord: (data: Buffer) => void, what: string) {
    const k = koffi();
    if (!RingBufferReader.fns) {
      libbpf();
      const so = k.load('libbpf.so.1');
      k.proto('int tether_ring_buffer_sample_fn(void *ctx, void *data, size_t size)');
      RingBufferReader.fns = {
        create: so.func('void *ring_buffer__new(int map_fd, tether_ring_buffer_sample_fn *cb, void *ctx, void *opts)'),
        consume: so.func('int ring_buffer__consume(void *rb)'),
        free: so.func('void ring_buffer__free(void *rb)'),
      };
    }
    this.cb = k.register((_ctx: unknown, data: unknown, size: number | bigint) => {
      // The record lives in the ring only during the callback: copy it out.
      onRecord(Buffer.from(k.view(data, Number(size)) as ArrayBuffer).subarray(0, Number(size)));
      return 0;
    }, k.pointer(k.resolve('tether_ring_buffer_sample_fn')));
    this.rb = checkPtr(RingBufferReader.fns.create(mapFd, this.cb, null, null), 'ring_buffer__new', what);
  }

  /** Hands every record waiting now to onRecord, on this thread; returns how many there were. */
  consume(): number {
    if (!this.rb) return 0;
    return check(RingBufferReader.fns!.consume(this.rb), 'ring_buffer__consume', 'lb events');
  }

  close(): void {
    if (this.rb) RingBufferReader.fns!.free(this.rb);
    this.rb = null;
    if (this.cb) koffi().unregister(this.cb as Parameters<ReturnType<typeof koffi>['unregister']>[0]);
    this.cb = undefined;
  }
}
