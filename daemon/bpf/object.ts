// A loaded eBPF object file: its programs and maps, with maps pinned under <pinDir>/<object>/<map> so
// that they outlive tetherd and a restarted tetherd reuses them (libbpf reuses a compatible pin on load).
import * as fs from 'node:fs';
import * as path from 'node:path';
import { ensureBpffs } from './bpffs';
import { BpfMap } from './map';
import { check, checkPtr, libbpf, type Ptr } from './libbpf';

export interface BpfObjectOptions {
  /** Directory on a bpffs; maps are pinned at <pinDir>/<name>/<map>. Without it nothing is pinned. */
  pinDir?: string;
  /** Object name used in pin paths; default: the file name without .bpf.o. */
  name?: string;
  /** Map sizes set before loading (map name → max_entries); a pinned map of another size is a mismatch. */
  maxEntries?: Record<string, number>;
}

export class BpfObject {
  readonly name: string;
  readonly pinDir?: string;
  private obj: Ptr | null;
  private readonly maps = new Map<string, BpfMap>();

  private constructor(obj: Ptr, name: string, pinDir: string | undefined) {
    this.obj = obj;
    this.name = name;
    this.pinDir = pinDir;
  }

  /** Opens and loads file (programs verified, maps created or reused from pins). */
  static load(file: string, opts: BpfObjectOptions = {}): BpfObject {
    const lib = libbpf();
    const name = opts.name ?? path.basename(file).replace(/\.bpf\.o$|\.o$/, '');
    const what = `object ${file}`;
    if (!fs.existsSync(file)) checkPtr(null, 'bpf_object__open_file', `${what} (missing; run bpf/build.sh)`, 2);
    const obj = checkPtr(lib.bpf_object__open_file(file, null), 'bpf_object__open_file', what);
    try {
      let pinDir: string | undefined;
      if (opts.pinDir) {
        pinDir = path.join(opts.pinDir, name);
        ensureBpffs(pinDir);
        for (let m = lib.bpf_object__next_map(obj, null); m; m = lib.bpf_object__next_map(obj, m)) {
          const mapName = lib.bpf_map__name(m);
          // .rodata/.bss maps of global variables are per-load; only pin declared maps.
          if (mapName.includes('.')) continue;
          check(lib.bpf_map__set_pin_path(m, path.join(pinDir, mapName)), 'bpf_map__set_pin_path', `${what} map ${mapName}`);
        }
      }
      for (const [mapName, n] of Object.entries(opts.maxEntries ?? {})) {
        const m = checkPtr(lib.bpf_object__find_map_by_name(obj, mapName), 'bpf_object__find_map_by_name', `${what} map ${mapName}`);
        check(lib.bpf_map__set_max_entries(m, n), 'bpf_map__set_max_entries', `${what} map ${mapName} (${n})`);
      }
      check(lib.bpf_object__load(obj), 'bpf_object__load', `${what} (libbpf's reasons, e.g. the verifier log or a pinned map mismatch, are logged just before)`);
      return new BpfObject(obj, name, pinDir);
    } catch (e) {
      lib.bpf_object__close(obj);
      throw e;
    }
  }

  private handle(): Ptr {
    if (!this.obj) throw checkPtr(null, 'use', `object ${this.name} (already closed)`, 9 /* EBADF */);
    return this.obj;
  }

  /** File descriptor of the program (the C function name), valid until close(). */
  programFd(progName: string): number {
    const prog = checkPtr(libbpf().bpf_object__find_program_by_name(this.handle(), progName),
      'bpf_object__find_program_by_name', `object ${this.name} program ${progName}`);
    return check(libbpf().bpf_program__fd(prog), 'bpf_program__fd', `object ${this.name} program ${progName}`);
  }

  /** The map by its C name, valid until close(). */
  map(mapName: string): BpfMap {
    let m = this.maps.get(mapName);
    if (!m) {
      const what = `object ${this.name} map ${mapName}`;
      const ptr = checkPtr(libbpf().bpf_object__find_map_by_name(this.handle(), mapName), 'bpf_object__find_map_by_name', what);
      m = new BpfMap(`${this.name}/${mapName}`, check(libbpf().bpf_map__fd(ptr), 'bpf_map__fd', what), false);
      this.maps.set(mapName, m);
    }
    return m;
  }

  /** Pin path of a map of this object, when pinned. */
  pinPath(mapName: string): string | undefined {
    return this.pinDir ? path.join(this.pinDir, mapName) : undefined;
  }

  /** Removes this object's pins (the maps then die with their last user). Idempotent. */
  unpinMaps(): void {
    if (!this.pinDir) return;
    fs.rmSync(this.pinDir, { recursive: true, force: true });
  }

  /** Releases programs and maps held by this process; pinned maps and attached programs stay alive. */
  close(): void {
    if (!this.obj) return;
    for (const m of this.maps.values()) m.close();
    this.maps.clear();
    libbpf().bpf_object__close(this.obj);
    this.obj = null;
  }
}
