// What the installer decides about a CNI configuration directory, without touching it: which file the
// runtime would use (the primary), whether tether can be chained into it, and the bytes that chain
// `tether` into it or take it out again.
//
// The primary is chosen by the runtime's own rules (libcni.ts): containerd fails the whole directory at
// the first file libcni cannot load, so there is no primary until that file is fixed; CRI-O skips such
// files. A .conf or .json is one plugin and a list written into one fails to load ("missing 'type'"), so
// a single-plugin primary is never rewritten: the list goes into a file of our own that sorts just before
// it, keeps the network name, and holds the original's bytes verbatim as its first plugin.
//
// Every change is a splice into the file's text, never a re-serialisation: other projects' key order,
// formatting and numbers (123456789012345678 would come back …680 through a double) stay byte for byte.
import { SUPPORTED_VERSIONS } from '../../lib/cni-spec';
import { parseGoJson, type GoValue } from './go-json';
import { decodeNetConf, loadFile, runtimeLoad, type DirFile, type LoadedList, type Runtime } from './libcni';

export { CONF_EXTENSIONS, type DirFile, type Runtime } from './libcni';
/** Our file beside a single-plugin primary `<base>.conf`: `<base>-tether.conflist` ('-' sorts before '.'). */
export const OWN_LIST_SUFFIX = '-tether.conflist';
/** Temporary files: hidden, and no CNI extension, so no runtime ever reads one. */
export const TEMP_PREFIX = '.tether-';
export const TEMP_SUFFIX = '.tmp';
export const PLUGIN_TYPE = 'tether';

export function isOwnListName(name: string): boolean {
  return name.endsWith(OWN_LIST_SUFFIX);
}

/** A list that holds tether and nothing else is never a primary (and never a working network). */
function onlyOurs(l: LoadedList): boolean {
  return l.plugins.every((p) => p.type === PLUGIN_TYPE);
}

export interface Primary {
  name: string;
  bytes: Buffer;
  list: LoadedList;
}

export interface Choice {
  primary?: Primary;
  /** Why there is none: containerd's error for the file that fails the load, or that nothing loads. */
  why?: string;
  skipped: Array<{ name: string; why: string }>;
}

/**
 * The file the runtime would use if our own files were not there: the first file libcni loads in name
 * order (Go's sort.Strings: bytes), our `-tether.conflist` files and lists of tether alone passed over.
 * With containerd, a file before it that libcni cannot load means there is none.
 */
export function pickPrimary(files: DirFile[], runtime: Runtime): Choice {
  const r = runtimeLoad(files, runtime, (f, l) => {
    if (isOwnListName(f.name)) return 'ours';
    if (l.ok && onlyOurs(l.value)) return 'holds only tether';
    return undefined;
  });
  const skipped = r.skipped.map((s) => ({ name: s.file, why: s.why }));
  if (r.failed) return { why: `${runtime} loads no network: ${r.failed.error}`, skipped };
  if (!r.loaded) return { why: 'no CNI configuration that libcni loads', skipped };
  const f = files.find((x) => x.name === r.loaded!.file)!;
  return { primary: { name: f.name, bytes: f.bytes, list: r.loaded }, skipped };
}

/**
 * Why tether cannot be chained into this network, if it cannot. libcni runs every plugin of a list with
 * the list's cniVersion and tether refuses versions it does not speak, so such a chain fails every ADD.
 *
 * A primary below 0.3.1 (or without cniVersion, which libcni runs as 0.1.0) is refused rather than written
 * at 0.3.1: chaining and prevResult only exist from CNI 0.3.0, and raising the version would make the
 * runtime call the primary's own plugin at a version it may not speak — nothing here can tell (asking its
 * executable for VERSION means running another project's binary from our container). A refusal leaves the
 * node as it was, says why in readiness and the log, and is fixed by the primary's owner raising the
 * version; a silent raise could break every pod on the node.
 */
export function versionProblem(l: LoadedList): string | undefined {
  const v = l.cniVersion;
  if ((SUPPORTED_VERSIONS as readonly string[]).includes(v)) return undefined;
  const speaks = `tether speaks ${SUPPORTED_VERSIONS.join(', ')}`;
  if (v === '') return `${l.file} has no cniVersion: libcni runs it as CNI 0.1.0, which has no chained plugins (${speaks}); set its cniVersion to 0.3.1 or later`;
  if (/^0\.[0-3]\.\d+$/.test(v)) return `${l.file} has cniVersion "${v}", older than chained plugins with prevResult as tether needs them (${speaks}); set its cniVersion to 0.3.1 or later`;
  return `${l.file} has cniVersion "${v}", which tether does not speak (${speaks})`;
}

export interface Insertion {
  /** The file to write: the primary itself (a list) or our list beside it (a single-plugin primary). */
  target: string;
  bytes: Buffer;
}

/** The byte offsets of the start of the line holding `at`, and that line's leading whitespace. */
function indentAt(text: Buffer, at: number): string {
  let s = at;
  while (s > 0 && text[s - 1] !== 0x0a) s--;
  let e = s;
  while (e < at && (text[e] === 0x20 || text[e] === 0x09)) e++;
  return text.toString('utf8', s, e);
}

/** `entry` as JSON; multi-line with two-space steps after `indent` when the array is multi-line. */
function renderEntry(entry: Record<string, unknown>, indent: string | undefined): string {
  if (indent === undefined) return JSON.stringify(entry);
  return JSON.stringify(entry, null, 2).split('\n').join(`\n${indent}`);
}

/** The plugins array libcni reads: the top object's last "plugins" member (exact key, as libcni's map). */
function pluginsArray(tree: GoValue): Extract<GoValue, { kind: 'array' }> | undefined {
  if (tree.kind !== 'object') return undefined;
  const m = [...tree.members].reverse().find((x) => x.key === 'plugins');
  return m?.value.kind === 'array' ? m.value : undefined;
}

const isTetherItem = (v: GoValue) => {
  const c = decodeNetConf(v, true);
  return c.ok && c.value.type === PLUGIN_TYPE;
};

/**
 * The text without the array items `drop` selects: each goes with the comma and space before it (or,
 * for the first item, after it), so the rest of the text is untouched.
 */
function withoutItems(text: Buffer, arr: Extract<GoValue, { kind: 'array' }>, drop: (v: GoValue) => boolean): Buffer {
  const cuts: Array<[number, number]> = [];
  const items = arr.items;
  const kept = items.filter((v) => !drop(v));
  if (kept.length === 0 && items.length > 0) {
    cuts.push([items[0].start, items[items.length - 1].end]);
  } else {
    for (const [k, v] of items.entries()) {
      if (!drop(v)) continue;
      // From the end of the nearest earlier kept item (its comma follows it), or up to the next item.
      const prevKept = items.slice(0, k).reverse().find((x) => !drop(x));
      if (prevKept) cuts.push([prevKept.end, v.end]);
      else cuts.push([v.start, items[k + 1].start]);
    }
  }
  // Merge overlapping cuts (consecutive dropped items share their earlier kept neighbour).
  const merged: Array<[number, number]> = [];
  for (const c of cuts.sort((a, b) => a[0] - b[0])) {
    const last = merged[merged.length - 1];
    if (last && c[0] <= last[1]) last[1] = Math.max(last[1], c[1]);
    else merged.push([...c]);
  }
  const parts: Buffer[] = [];
  let at = 0;
  for (const [s, e] of merged) {
    parts.push(text.subarray(at, s));
    at = e;
  }
  parts.push(text.subarray(at));
  return Buffer.concat(parts);
}

/** The text with `entry` appended to the plugins array, in the array's own layout. */
function withEntry(text: Buffer, entry: Record<string, unknown>): Buffer {
  const arr = pluginsArray(parseGoJson(text));
  if (!arr) throw new Error('no plugins array to append to'); // callers pass lists libcni loaded
  const last = arr.items[arr.items.length - 1];
  const closing = arr.end - 1;
  if (!last) return Buffer.concat([text.subarray(0, arr.start + 1), Buffer.from(renderEntry(entry, undefined)), text.subarray(closing)]);
  const multiLine = text.subarray(arr.start, last.start).includes(0x0a);
  const indent = multiLine ? indentAt(text, last.start) : undefined;
  const sep = multiLine ? `,\n${indent}` : ', ';
  return Buffer.concat([text.subarray(0, last.end), Buffer.from(sep + renderEntry(entry, indent)), text.subarray(last.end)]);
}

/**
 * Chains `entry` into the primary. A list keeps every byte it has except any older tether entry, and gets
 * ours appended after its last plugin. A single plugin becomes `{cniVersion, name, plugins: [original,
 * ours]}` in our own file `<base>-tether.conflist`, which sorts just before the original and holds the
 * original's text verbatim.
 */
export function insertEntry(primary: Primary, entry: Record<string, unknown>): Insertion {
  const l = primary.list;
  if (l.kind === 'list') {
    const clean = withoutItems(primary.bytes, l.pluginsNode!, isTetherItem);
    return { target: primary.name, bytes: withEntry(clean, entry) };
  }
  const base = primary.name.slice(0, primary.name.lastIndexOf('.'));
  const original = primary.bytes.subarray(l.tree.start, l.tree.end);
  const head = `{\n  "cniVersion": ${JSON.stringify(l.cniVersion)},\n  "name": ${JSON.stringify(l.name)},\n  "plugins": [\n`;
  const tail = `,\n    ${renderEntry(entry, '    ')}\n  ]\n}\n`;
  return { target: `${base}${OWN_LIST_SUFFIX}`, bytes: Buffer.concat([Buffer.from(head), original, Buffer.from(tail)]) };
}

/** The list without our entry (uninstall of a list whose original bytes we no longer know). */
export function removeEntry(bytes: Buffer): Buffer | undefined {
  let tree: GoValue;
  try {
    tree = parseGoJson(bytes);
  } catch {
    return undefined;
  }
  const arr = pluginsArray(tree);
  if (!arr || !arr.items.some(isTetherItem)) return undefined;
  return withoutItems(bytes, arr, isTetherItem);
}

/** Whether a file's plugins include tether as libcni reads them ("Type" counts). */
export function holdsTether(bytes: Buffer): boolean {
  try {
    return pluginsArray(parseGoJson(bytes))?.items.some(isTetherItem) ?? false;
  } catch {
    return false;
  }
}

/** Whether a loaded network runs tether after a primary plugin (what a working chain is). */
export function chainsTether(l: LoadedList): boolean {
  const last = l.plugins[l.plugins.length - 1];
  return l.plugins.length > 1 && last.type === PLUGIN_TYPE && l.plugins[0].type !== PLUGIN_TYPE;
}

export { loadFile };
