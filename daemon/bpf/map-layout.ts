// Versioned layouts of pinned maps: what a tetherd does when it finds pins left by a tetherd whose maps
// were laid out differently (a struct grew, a map was resized, a field changed meaning). libbpf only
// reuses a pin whose type, sizes and flags are exactly what the object declares and fails the whole load
// otherwise; here such a pin is migrated into a new map (or replaced, visibly) so attaching never fails.
//
// A map's layout is its shape, which the kernel reports for any pin (type, key and value size, max
// entries, flags), plus a version kept by hand in the struct mirror for changes of meaning that keep
// the sizes. The version of a pin is recorded beside it, as an empty directory
// <objectPinDir>/@layout/<map>-v<version>-<type>-k<key>-v<value>-n<max>-f<flags>: bpffs holds only pins
// and directories (no files, no symlinks, no '.' in names), and a directory dies with the pin directory
// it sits in.
// A pin without a record predates versioning; it counts as version 1, the first versioned layouts: every
// earlier change also changed a size (egress_stats grew), which the shape comparison catches.
import * as fs from 'node:fs';
import * as path from 'node:path';
import { log } from '../../lib/log';
import { BPF_NOEXIST, BpfMap, type MapInfo } from './map';
import { BpfCallError } from './libbpf';

/**
 * How entries of an older pin of a map move into the new map:
 * - 'copy': keys and values are unchanged (only max entries, flags or type differ): every entry is copied.
 * - 'prefix': structs grew or shrank at their end (counters, settings): each value's common prefix is
 *   copied, new fields start at zero; keys are unchanged.
 * - 'replace': the new map starts empty: for maps tetherd rebuilds before attaching (Maglev rows) or that
 *   carry nothing across (ring buffers). A version change without a converter is replaced too, loudly.
 * - a function for anything else; it returns how many entries it carried.
 */
export type MapConverter = 'copy' | 'prefix' | 'replace' | ((from: BpfMap, to: BpfMap) => number);

export interface MapLayout {
  /** Bumped by hand when the map's meaning changes; sizes are compared on their own. */
  version: number;
  /** Converter from a pin of the same version but another shape (sizes, flags). */
  convert: MapConverter;
  /** Converters from older versions; a version not listed is replaced. */
  from?: Record<number, MapConverter>;
  /**
   * The datapath itself adds entries (flow pins, LB mappings): programs of the old tetherd still running
   * on other interfaces keep adding them to the old map until they are attached again, so each later
   * attachment copies what is new there (never overwriting what the new map already holds).
   */
  catchUp?: boolean;
}

export type MapShape = Pick<MapInfo, 'type' | 'keySize' | 'valueSize' | 'maxEntries' | 'flags'>;

/** The layout of a map no mirror declares: version 1, no converter. */
export const UNDECLARED: MapLayout = { version: 1, convert: 'replace' };

export const LAYOUT_DIR = '@layout';

// enum bpf_map_type names for the records (readable with ls); others by number.
const TYPE_NAMES: Record<number, string> = {
  1: 'hash', 2: 'array', 5: 'percpu_hash', 6: 'percpu_array', 9: 'lru_hash', 10: 'lru_percpu_hash', 11: 'lpm_trie', 27: 'ringbuf',
};

/** Arrays cannot delete and always hold max_entries entries; their keys are indices. */
const ARRAY_TYPES = new Set([2, 6]);
/** Types whose values user space reads as one slot per CPU: a value cannot move between these and the others. */
const PERCPU_TYPES = new Set([5, 6, 10]);

function shapeString(s: MapShape): string {
  return `${TYPE_NAMES[s.type] ?? `type${s.type}`}-k${s.keySize}-v${s.valueSize}-n${s.maxEntries}-f${s.flags.toString(16)}`;
}

/** The layout as logged and recorded: version and shape, e.g. v1-percpu_array-k4-v72-n1-f0. */
export function fingerprint(version: number | undefined, s: MapShape): string {
  return `${version === undefined ? 'unversioned' : `v${version}`}-${shapeString(s)}`;
}

export function sameShape(a: MapShape, b: MapShape): boolean {
  return a.type === b.type && a.keySize === b.keySize && a.valueSize === b.valueSize && a.maxEntries === b.maxEntries && a.flags === b.flags;
}

function records(objDir: string, mapName: string): string[] {
  try {
    return fs.readdirSync(path.join(objDir, LAYOUT_DIR)).filter((n) => n.startsWith(`${mapName}-v`));
  } catch {
    return [];
  }
}

/**
 * The recorded version of the pin objDir/mapName, whose shape is `pinned`; undefined without a record.
 * A crash between writing a new record and removing the old one leaves two: the one matching the pin wins.
 */
export function recordedVersion(objDir: string, mapName: string, pinned: MapShape): number | undefined {
  const parsed = records(objDir, mapName).map((r) => /^v(\d+)-(.*)$/.exec(r.slice(mapName.length + 1))).filter((m) => m !== null);
  const m = parsed.find((p) => p[2] === shapeString(pinned)) ?? parsed[0];
  return m ? Number(m[1]) : undefined;
}

/** Records the layout of the pin objDir/mapName; the new record goes in before the old ones leave. */
export function recordLayout(objDir: string, mapName: string, version: number, shape: MapShape): void {
  const name = `${mapName}-${fingerprint(version, shape)}`;
  const dir = path.join(objDir, LAYOUT_DIR);
  fs.mkdirSync(path.join(dir, name), { recursive: true, mode: 0o700 });
  for (const r of records(objDir, mapName)) if (r !== name) fs.rmSync(path.join(dir, r), { recursive: true, force: true });
}

const DECLARED_REPLACE = 'declared replace';

/** The converter that applies to a pin of version `from` and shape `old`, and why when it is 'replace'. */
export function converterFor(layout: MapLayout, from: number, old: MapShape, want: MapShape): { convert: MapConverter; why?: string } {
  const c = from === layout.version ? layout.convert : layout.from?.[from];
  if (c === undefined) return { convert: 'replace', why: `no converter from version ${from} to ${layout.version}` };
  if (c === 'replace') return { convert: c, why: DECLARED_REPLACE };
  if (typeof c === 'function') return { convert: c };
  if (PERCPU_TYPES.has(old.type) !== PERCPU_TYPES.has(want.type)) return { convert: 'replace', why: 'per-CPU values on one side only' };
  if (old.keySize !== want.keySize) return { convert: 'replace', why: `key size changed (${old.keySize} -> ${want.keySize})` };
  if (c === 'copy' && old.valueSize !== want.valueSize) return { convert: 'replace', why: `value size changed (${old.valueSize} -> ${want.valueSize}) and the map is declared copy, not prefix` };
  return { convert: c };
}

/** Stride of one CPU's slot in a per-CPU value as user space sees it. */
const stride = (valueSize: number) => Math.ceil(valueSize / 8) * 8;

/** old's value re-laid for `to`: the common prefix of each (per-CPU) slot, the rest zero. */
function widen(value: Buffer, from: BpfMap, to: BpfMap): Buffer {
  if (!from.perCpu) {
    const out = Buffer.alloc(to.valueBytes);
    value.copy(out, 0, 0, Math.min(from.info.valueSize, to.info.valueSize));
    return out;
  }
  const out = Buffer.alloc(to.valueBytes);
  const n = Math.min(from.info.valueSize, to.info.valueSize);
  const cpus = to.valueBytes / stride(to.info.valueSize);
  for (let cpu = 0; cpu < cpus; cpu++) value.copy(out, cpu * stride(to.info.valueSize), cpu * stride(from.info.valueSize), cpu * stride(from.info.valueSize) + n);
  return out;
}

/**
 * Writes entries one by one where a batch cannot do: a smaller new map fills up (E2BIG) and the rest
 * are counted as dropped; with BPF_NOEXIST an entry the new map already holds is kept (EEXIST).
 */
function put(to: BpfMap, entries: Array<[Buffer, Buffer]>, flags: bigint): { copied: number; dropped: number } {
  let copied = 0;
  let dropped = 0;
  for (const [k, v] of entries) {
    try {
      to.update(k, v, flags);
      copied++;
    } catch (e) {
      const errno = e instanceof BpfCallError ? e.errno : 0;
      if (errno === 17 /* EEXIST */) continue;
      if (errno === 7 /* E2BIG */ || errno === 12 /* ENOMEM */) dropped++;
      else throw e;
    }
  }
  return { copied, dropped };
}

/** Entries of from that fit `to` (array indices beyond a smaller array's size go). */
function carried(from: BpfMap, to: BpfMap): Array<[Buffer, Buffer]> {
  const all = from.entries();
  if (!ARRAY_TYPES.has(to.info.type) || to.info.keySize !== 4) return all;
  return all.filter(([k]) => k.readUInt32LE(0) < to.info.maxEntries);
}

/** Runs a converter; returns the entries carried and those that did not fit. */
export function convert(c: MapConverter, from: BpfMap, to: BpfMap): { copied: number; dropped: number } {
  if (c === 'replace') return { copied: 0, dropped: 0 };
  if (typeof c === 'function') return { copied: c(from, to), dropped: 0 };
  const entries = carried(from, to).map(([k, v]) => [k, c === 'prefix' ? widen(v, from, to) : v] as [Buffer, Buffer]);
  try {
    to.updateBatch(entries);
    return { copied: entries.length, dropped: 0 };
  } catch {
    // A batch stops at the first entry that does not fit; one by one, what fits goes in.
    return put(to, entries, 0n);
  }
}

/**
 * Old maps that were migrated, kept open for a while so that attachments made after the migration can
 * copy what the old programs still added (catchUp layouts). Keyed by canonical pin path.
 */
interface Retired {
  map: BpfMap;
  convert: MapConverter;
  timer: NodeJS.Timeout;
}
const retired = new Map<string, Retired>();

/** How long an old map stays open for catch-up: tetherd attaches every pod again within seconds of start. */
export const RETIRE_MS = 60_000;

export function retire(pinPath: string, map: BpfMap, layout: MapLayout, c: MapConverter): void {
  releaseRetired(pinPath);
  if (!layout.catchUp || c === 'replace' || typeof c === 'function') {
    map.close();
    return;
  }
  const timer = setTimeout(() => releaseRetired(pinPath), RETIRE_MS);
  timer.unref();
  retired.set(pinPath, { map, convert: c, timer });
}

/** Closes the old map kept for pinPath (all of them without an argument); the kernel frees it with its last program. */
export function releaseRetired(pinPath?: string): void {
  for (const [p, r] of [...retired]) {
    if (pinPath !== undefined && p !== pinPath) continue;
    clearTimeout(r.timer);
    r.map.close();
    retired.delete(p);
  }
}

/** Copies into `to` the entries the retired map of pinPath holds and `to` does not; returns how many. */
export function catchUp(pinPath: string, to: BpfMap): number {
  const r = retired.get(pinPath);
  if (!r) return 0;
  const c = r.convert;
  const entries = carried(r.map, to).map(([k, v]) => [k, c === 'prefix' ? widen(v, r.map, to) : v] as [Buffer, Buffer]);
  return put(to, entries, BPF_NOEXIST).copied;
}

/** A migration's log line: one per map, with both layouts and what was carried. */
export function logMigration(pinPath: string, from: string, to: string, c: MapConverter, result: { copied: number; dropped: number }, oldEntries: number | undefined, why?: string): void {
  if (c === 'replace') {
    // A map declared 'replace' is rebuilt by tetherd before it matters; otherwise entries are lost: say so loudly.
    if (why === DECLARED_REPLACE) log().info('bpf map replaced: tetherd rebuilds it', { pin: pinPath, from, to, oldEntries });
    else log().warn('bpf map replaced: no converter, the new map starts empty', { pin: pinPath, from, to, oldEntries, why });
    return;
  }
  log().info('bpf map migrated', {
    pin: pinPath, from, to, converter: typeof c === 'function' ? 'custom' : c, copied: result.copied, ...(result.dropped ? { dropped: result.dropped } : {}),
  });
}
