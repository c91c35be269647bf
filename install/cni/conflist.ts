// What the installer decides about a CNI configuration directory, without touching it: which file the
// runtime would use (the primary), and the bytes that chain `tether` into it or take it out again.
//
// How runtimes choose (libcni/conf.go, containerd's go-cni, CRI-O's ocicni): files ending .conf, .conflist
// or .json, sorted by name; a .conflist is a list (name, non-empty plugins, each with a type); a .conf or
// .json is one plugin and must have a `type` — a list written into a .conf fails to load ("missing
// 'type'"), so a .conf primary is never rewritten: the list goes into a file of our own that sorts just
// before it, keeps the network name, and the original stays as it was.

export const CONF_EXTENSIONS = ['.conf', '.conflist', '.json'] as const;
/** Our file beside a single-plugin primary `<base>.conf`: `<base>-tether.conflist` ('-' sorts before '.'). */
export const OWN_LIST_SUFFIX = '-tether.conflist';
/** Temporary files: hidden, and no CNI extension, so no runtime ever reads one. */
export const TEMP_PREFIX = '.tether-';
export const TEMP_SUFFIX = '.tmp';
export const PLUGIN_TYPE = 'tether';

export interface DirFile {
  name: string;
  bytes: Buffer;
}

export type Parsed =
  | { ok: true; kind: 'list'; json: Record<string, unknown> }
  | { ok: true; kind: 'single'; json: Record<string, unknown> }
  | { ok: false; why: string };

function extension(name: string): string {
  const dot = name.lastIndexOf('.');
  return dot < 0 ? '' : name.slice(dot);
}

export function isConfName(name: string): boolean {
  return (CONF_EXTENSIONS as readonly string[]).includes(extension(name)) && !name.startsWith(TEMP_PREFIX);
}

export function isOwnListName(name: string): boolean {
  return name.endsWith(OWN_LIST_SUFFIX);
}

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** Parses one file as the runtime would, saying why it would be skipped. */
export function parseConf(name: string, bytes: Buffer): Parsed {
  let json: unknown;
  try {
    json = JSON.parse(bytes.toString('utf8'));
  } catch (e) {
    return { ok: false, why: `not JSON (${(e as Error).message})` };
  }
  if (!isObject(json)) return { ok: false, why: 'not a JSON object' };
  if (extension(name) === '.conflist') {
    if (typeof json.name !== 'string' || json.name === '') return { ok: false, why: 'a list without a name' };
    if (!Array.isArray(json.plugins) || json.plugins.length === 0) return { ok: false, why: 'a list without plugins' };
    for (const [i, p] of json.plugins.entries()) {
      if (!isObject(p) || typeof p.type !== 'string' || p.type === '') return { ok: false, why: `plugins[${i}] has no type` };
    }
    return { ok: true, kind: 'list', json };
  }
  if (typeof json.type !== 'string' || json.type === '') {
    return { ok: false, why: Array.isArray(json.plugins) ? 'a list in a single-plugin file (runtimes need a type here)' : 'no type' };
  }
  return { ok: true, kind: 'single', json };
}

/** A list is only ours when its plugins are all tether: such a file is never a primary. */
function onlyOurs(p: Parsed): boolean {
  return p.ok && p.kind === 'list' && (p.json.plugins as Array<Record<string, unknown>>).every((x) => x.type === PLUGIN_TYPE);
}

export interface Primary {
  name: string;
  bytes: Buffer;
  parsed: Extract<Parsed, { ok: true }>;
}

export interface Skipped {
  name: string;
  why: string;
}

/**
 * The file the runtime would use, ours excluded: the first valid configuration in name order (Go's
 * sort.Strings order: bytes). Our own `-tether.conflist` files are passed over — the primary is the file
 * they were made from.
 */
export function pickPrimary(files: DirFile[]): { primary?: Primary; skipped: Skipped[] } {
  const skipped: Skipped[] = [];
  const names = files.filter((f) => isConfName(f.name)).sort((a, b) => Buffer.compare(Buffer.from(a.name), Buffer.from(b.name)));
  for (const f of names) {
    if (isOwnListName(f.name)) continue;
    const parsed = parseConf(f.name, f.bytes);
    if (!parsed.ok) {
      skipped.push({ name: f.name, why: parsed.why });
      continue;
    }
    if (onlyOurs(parsed)) {
      skipped.push({ name: f.name, why: 'holds only tether' });
      continue;
    }
    return { primary: { name: f.name, bytes: f.bytes, parsed }, skipped };
  }
  return { skipped };
}

/** Two-space JSON with a final newline, the way most agents write their files. */
export function render(json: unknown): Buffer {
  return Buffer.from(`${JSON.stringify(json, null, 2)}\n`);
}

export interface Insertion {
  /** The file to write: the primary itself (a list) or our list beside it (a single-plugin primary). */
  target: string;
  bytes: Buffer;
}

/**
 * Chains `entry` into the primary. A list keeps every key and plugin it has, loses any older tether entry,
 * and gets ours appended. A single plugin becomes `{cniVersion, name, plugins: [original, ours]}` in our
 * own file `<base>-tether.conflist`, which sorts just before the original.
 */
export function insertEntry(primary: Primary, entry: Record<string, unknown>): Insertion {
  const json = primary.parsed.json;
  if (primary.parsed.kind === 'list') {
    const plugins = (json.plugins as Array<Record<string, unknown>>).filter((p) => p.type !== PLUGIN_TYPE);
    return { target: primary.name, bytes: render({ ...json, plugins: [...plugins, entry] }) };
  }
  const base = primary.name.slice(0, primary.name.lastIndexOf('.'));
  const list: Record<string, unknown> = { cniVersion: json.cniVersion, name: json.name, plugins: [json, entry] };
  if (list.cniVersion === undefined) delete list.cniVersion;
  return { target: `${base}${OWN_LIST_SUFFIX}`, bytes: render(list) };
}

/** The list without our entry (uninstall of a list whose original bytes we no longer know). */
export function removeEntry(bytes: Buffer): Buffer | undefined {
  let json: unknown;
  try {
    json = JSON.parse(bytes.toString('utf8'));
  } catch {
    return undefined;
  }
  if (!isObject(json) || !Array.isArray(json.plugins)) return undefined;
  const plugins = json.plugins.filter((p) => !(isObject(p) && p.type === PLUGIN_TYPE));
  if (plugins.length === json.plugins.length) return undefined;
  return render({ ...json, plugins });
}

/** Whether a configuration's bytes chain tether (the readiness check). */
export function holdsTether(bytes: Buffer): boolean {
  try {
    const json = JSON.parse(bytes.toString('utf8'));
    return isObject(json) && Array.isArray(json.plugins) && json.plugins.some((p) => isObject(p) && p.type === PLUGIN_TYPE);
  } catch {
    return false;
  }
}
