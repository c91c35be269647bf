// A loaded eBPF object file: its programs and maps, with maps pinned under <pinDir>/<object>/<map> so
// that they outlive tetherd and a restarted tetherd reuses them. A pin of another layout (an upgrade
// changed the map) is migrated into a new map at load instead of failing it (see map-layout.ts).
import * as fs from 'node:fs';
import * as path from 'node:path';
import { ensureBpffs } from './bpffs';
import { BpfMap, type MapInfo } from './map';
import { check, checkPtr, libbpf, type Ptr } from './libbpf';
import {
  UNDECLARED, catchUp, convert, converterFor, fingerprint, logMigration, recordLayout, recordedVersion, retire, sameShape, type MapLayout,
  type MapShape,
} from './map-layout';
import { log } from '../../lib/log';

/** A pin found with another layout, waiting for the new map: migrated right after the object loads. */
interface Migration {
  mapName: string;
  pin: string;
  staging: string;
  old: BpfMap;
  from: number | undefined;
  layout: MapLayout;
}

/** Suffix of the pin a new map gets while its entries are carried over ('.' is refused by bpffs). */
const STAGING = '@staging';

export interface BpfObjectOptions {
  /** Directory on a bpffs; maps are pinned at <pinDir>/<name>/<map>. Without it nothing is pinned. */
  pinDir?: string;
  /** Object name used in pin paths; default: the file name without .bpf.o. */
  name?: string;
  /** Map sizes set before loading (map name → max_entries); a pinned map of another size is migrated. */
  maxEntries?: Record<string, number>;
  /** Layout version and converter of each map (from its struct mirror); a map not listed has UNDECLARED. */
  layouts?: Record<string, MapLayout>;
  /**
   * Programs not loaded (a program this node does not use, whose helpers an older kernel may lack, must not
   * fail the load of the others).
   */
  skipPrograms?: string[];
}

/** What the object declares for a map, as the kernel will report it once created. */
function wantedShape(m: Ptr): MapShape {
  const lib = libbpf();
  return { type: lib.bpf_map__type(m), keySize: lib.bpf_map__key_size(m), valueSize: lib.bpf_map__value_size(m), maxEntries: lib.bpf_map__max_entries(m), flags: lib.bpf_map__map_flags(m) };
}

/** The pinned map when it must be migrated (other shape or version), else undefined (libbpf reuses it). */
function checkPin(pin: string, objDir: string, mapName: string, want: MapShape, layout: MapLayout): Omit<Migration, 'mapName' | 'pin' | 'staging'> | undefined {
  const old = BpfMap.fromPin(pin);
  const info: MapInfo = old.info;
  const from = recordedVersion(objDir, mapName, info);
  if (sameShape(info, want) && (from ?? 1) === layout.version) {
    old.close();
    return undefined;
  }
  return { old, from, layout };
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

  /**
   * Opens and loads file (programs verified, maps created or reused from pins). A pin whose shape or
   * recorded version differs from what the object declares is migrated: libbpf creates the new map at a
   * staging pin, the map's converter carries the entries over, and a rename puts the new pin in place of
   * the old one in a single step (bpffs renames atomically), so the pin path always names a complete map
   * and a crash at any point leaves either the old pin or the new one. The old map stays alive as long as
   * programs already attached use it; attaching this object's program moves the interface over, and
   * settle() then copies what old programs added meanwhile.
   */
  static load(file: string, opts: BpfObjectOptions = {}): BpfObject {
    const lib = libbpf();
    const name = opts.name ?? path.basename(file).replace(/\.bpf\.o$|\.o$/, '');
    const what = `object ${file}`;
    if (!fs.existsSync(file)) checkPtr(null, 'bpf_object__open_file', `${what} (missing; run bpf/build.sh)`, 2);
    const obj = checkPtr(lib.bpf_object__open_file(file, null), 'bpf_object__open_file', what);
    const migrations: Migration[] = [];
    try {
      for (const progName of opts.skipPrograms ?? []) {
        const prog = checkPtr(lib.bpf_object__find_program_by_name(obj, progName), 'bpf_object__find_program_by_name', `${what} program ${progName}`);
        check(lib.bpf_program__set_autoload(prog, false), 'bpf_program__set_autoload', `${what} program ${progName}`);
      }
      // Sizes first: they are part of the shape a pin is compared with.
      for (const [mapName, n] of Object.entries(opts.maxEntries ?? {})) {
        const m = checkPtr(lib.bpf_object__find_map_by_name(obj, mapName), 'bpf_object__find_map_by_name', `${what} map ${mapName}`);
        check(lib.bpf_map__set_max_entries(m, n), 'bpf_map__set_max_entries', `${what} map ${mapName} (${n})`);
      }
      let pinDir: string | undefined;
      if (opts.pinDir) {
        pinDir = path.join(opts.pinDir, name);
        ensureBpffs(pinDir);
        for (let m = lib.bpf_object__next_map(obj, null); m; m = lib.bpf_object__next_map(obj, m)) {
          const mapName = lib.bpf_map__name(m);
          // .rodata/.bss maps of global variables are per-load; only pin declared maps.
          if (mapName.includes('.')) continue;
          const pin = path.join(pinDir, mapName);
          const staging = pin + STAGING;
          // A staging pin is only left by a tetherd that died before the rename: nothing ever attached to it.
          fs.rmSync(staging, { force: true });
          let target = pin;
          const mig = fs.existsSync(pin) ? checkPin(pin, pinDir, mapName, wantedShape(m), opts.layouts?.[mapName] ?? UNDECLARED) : undefined;
          if (mig) {
            migrations.push({ ...mig, mapName, pin, staging });
            target = staging;
          }
          check(lib.bpf_map__set_pin_path(m, target), 'bpf_map__set_pin_path', `${what} map ${mapName}`);
        }
      }
      check(lib.bpf_object__load(obj), 'bpf_object__load', `${what} (libbpf's reasons, e.g. the verifier log, are logged just before)`);
      const loaded = new BpfObject(obj, name, pinDir);
      // Each one done leaves the list: its old map is retired and its pin replaced, nothing to undo.
      while (migrations.length) {
        loaded.migrate(migrations[0]);
        migrations.shift();
      }
      if (pinDir) loaded.recordLayouts(opts.layouts ?? {});
      return loaded;
    } catch (e) {
      for (const mig of migrations) {
        mig.old.close();
        fs.rmSync(mig.staging, { force: true });
      }
      lib.bpf_object__close(obj);
      throw e;
    }
  }

  /** Carries mig's old map into this object's new map, then puts the new map at the pin path. */
  private migrate(mig: Migration): void {
    const next = this.map(mig.mapName);
    const { convert: c, why } = converterFor(mig.layout, mig.from ?? 1, mig.old.info, next.info);
    let oldEntries: number | undefined;
    if (c === 'replace') {
      try {
        oldEntries = mig.old.keys().length;
      } catch {
        oldEntries = undefined; // ring buffers have no keys
      }
    }
    const result = convert(c, mig.old, next);
    fs.renameSync(mig.staging, mig.pin);
    logMigration(mig.pin, fingerprint(mig.from, mig.old.info), fingerprint(mig.layout.version, next.info), c, result, oldEntries, why);
    retire(mig.pin, mig.old, mig.layout, c);
  }

  /** Writes the layout record of every pinned map (a no-op when it is already there). */
  private recordLayouts(layouts: Record<string, MapLayout>): void {
    const lib = libbpf();
    for (let m = lib.bpf_object__next_map(this.handle(), null); m; m = lib.bpf_object__next_map(this.handle(), m)) {
      const mapName = lib.bpf_map__name(m);
      if (mapName.includes('.')) continue;
      recordLayout(this.pinDir!, mapName, (layouts[mapName] ?? UNDECLARED).version, this.map(mapName).info);
    }
  }

  /**
   * Call after attaching this object's program: copies into this object's maps the entries that programs
   * of the previous layout added to their old maps since the migration (flow pins, LB mappings) and this
   * object's maps lack. Cheap when nothing was migrated.
   */
  settle(): void {
    if (!this.pinDir) return;
    for (const [mapName, m] of this.pinnedMaps()) {
      const n = catchUp(path.join(this.pinDir, mapName), m);
      if (n > 0) log().info('bpf map caught up after migration', { pin: path.join(this.pinDir, mapName), copied: n });
    }
  }

  private pinnedMaps(): Array<[string, BpfMap]> {
    const lib = libbpf();
    const out: Array<[string, BpfMap]> = [];
    for (let m = lib.bpf_object__next_map(this.handle(), null); m; m = lib.bpf_object__next_map(this.handle(), m)) {
      const mapName = lib.bpf_map__name(m);
      if (!mapName.includes('.')) out.push([mapName, this.map(mapName)]);
    }
    return out;
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
