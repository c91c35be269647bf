// The installer's model of how a container runtime loads /etc/cni/net.d: libcni's ConfFromBytes,
// ConfListFromBytes and ConfListFromConf (containernetworking/cni 1.1, as Debian packages it) over Go's
// encoding/json, driven by containerd's loop (go-cni: the first file that fails fails the whole load) or
// CRI-O's (ocicni: a file that fails is skipped). Error messages are libcni's and go-cni's, so what the
// installer reports is what the runtime would log. test/golden-libcni holds the Go program the model is
// tested against.
//
// What Go does that JSON.parse does not: struct fields (a .conf, and every plugin of a list) match keys
// case-insensitively ("Type" is the type), the last of two matching keys wins, null leaves a field alone,
// and a value of the wrong JSON type is an error; the list itself is read into a map, so its keys
// ("name", "cniVersion", "disableCheck", "plugins") match exactly; every number must fit a float64.
import { parseGoJson, goFieldMatches, GoSyntaxError, type GoMember, type GoValue } from './go-json';

export type Runtime = 'containerd' | 'crio';
export const RUNTIMES: readonly Runtime[] = ['containerd', 'crio'];
export const CONF_EXTENSIONS = ['.conf', '.conflist', '.json'] as const;

export interface DirFile {
  name: string;
  bytes: Buffer;
  /** Set when the runtime would list the file but cannot read it (a dangling link, a link to a directory). */
  readError?: string;
}

/** The fields of types.NetConf the installer needs (libcni decodes more, and checks their JSON types). */
export interface NetConfView {
  cniVersion: string;
  name: string;
  type: string;
}

export interface LoadedList {
  file: string;
  /** A .conflist, or a .conf/.json that libcni turned into a list of one (ConfListFromConf). */
  kind: 'list' | 'single';
  name: string;
  cniVersion: string;
  plugins: NetConfView[];
  /** The file's JSON tree, with byte offsets into its bytes. */
  tree: GoValue;
  /** A list's plugins array (the one libcni reads when the key appears twice: the last). */
  pluginsNode?: Extract<GoValue, { kind: 'array' }>;
}

type Result<T> = { ok: true; value: T } | { ok: false; error: string };

export function extension(name: string): string {
  const dot = name.lastIndexOf('.');
  return dot < 0 ? '' : name.slice(dot);
}

/** Go's %T of a value decoded into interface{}. */
function goType(v: GoValue): string {
  return { string: 'string', number: 'float64', bool: 'bool', object: 'map[string]interface {}', array: '[]interface {}', null: '<nil>' }[v.kind];
}

function typeError(v: GoValue, struct: string, field: string, type: string): string {
  return `json: cannot unmarshal ${v.kind} into Go struct field ${struct}.${field} of type ${type}`;
}

/** A map's view of an object: the last of duplicate keys wins; with `sorted`, keys in Go's marshal order. */
function mapMembers(members: GoMember[], sorted: boolean): GoMember[] {
  const byKey = new Map<string, GoMember>();
  for (const m of members) {
    byKey.delete(m.key); // a later duplicate takes the position Go's marshal would give it anyway
    byKey.set(m.key, m);
  }
  const out = [...byKey.values()];
  return sorted ? out.sort((a, b) => Buffer.compare(Buffer.from(a.key), Buffer.from(b.key))) : out;
}

/** The first number in document order that a float64 cannot hold (Go: an error into interface{}). */
function firstOverflow(v: GoValue): string | undefined {
  if (v.kind === 'number') return Number.isFinite(Number(v.raw)) ? undefined : v.raw;
  const children = v.kind === 'object' ? v.members.map((m) => m.value) : v.kind === 'array' ? v.items : [];
  for (const c of children) {
    const o = firstOverflow(c);
    if (o !== undefined) return o;
  }
  return undefined;
}

const overflowError = (raw: string) => `json: cannot unmarshal number ${raw} into Go value of type float64`;

/**
 * Decodes `v` into types.NetConf as encoding/json does: exact key match first, then folded; the first type
 * error (in the order decoded) is the error. `fromMap`: the value went through map[string]interface{}
 * and json.Marshal first (a list's plugins), so duplicate keys are gone and keys are sorted.
 */
export function decodeNetConf(v: GoValue, fromMap: boolean): Result<NetConfView> {
  const conf: NetConfView = { cniVersion: '', name: '', type: '' };
  if (v.kind === 'null') return { ok: true, value: conf };
  if (v.kind !== 'object') return { ok: false, error: `json: cannot unmarshal ${v.kind} into Go value of type types.NetConf` };
  let error: string | undefined;
  const fail = (e: string | undefined) => {
    if (e !== undefined && error === undefined) error = e;
  };
  const str = (x: GoValue, struct: string, field: string, set: (s: string) => void) => {
    if (x.kind === 'string') set(x.value);
    else if (x.kind !== 'null') fail(typeError(x, struct, field, 'string'));
  };
  const strings = (x: GoValue, field: string) => {
    if (x.kind === 'array') for (const it of x.items) str(it, 'DNS', field, () => undefined);
    else if (x.kind !== 'null') fail(typeError(x, 'DNS', field, '[]string'));
  };
  const members = (o: Extract<GoValue, { kind: 'object' }>) => (fromMap ? mapMembers(o.members, true) : o.members);
  const fields: Array<[string, (x: GoValue) => void]> = [
    ['cniVersion', (x) => str(x, 'NetConf', 'cniVersion', (s) => (conf.cniVersion = s))],
    ['name', (x) => str(x, 'NetConf', 'name', (s) => (conf.name = s))],
    ['type', (x) => str(x, 'NetConf', 'type', (s) => (conf.type = s))],
    ['capabilities', (x) => {
      if (x.kind === 'object') {
        for (const m of x.members) if (m.value.kind !== 'bool' && m.value.kind !== 'null') fail(typeError(m.value, 'NetConf', 'capabilities', 'bool'));
      } else if (x.kind !== 'null') fail(typeError(x, 'NetConf', 'capabilities', 'map[string]bool'));
    }],
    ['ipam', (x) => {
      if (x.kind === 'object') {
        for (const m of members(x)) if (goFieldMatches(m.key, 'type')) str(m.value, 'IPAM', 'ipam.type', () => undefined);
      } else if (x.kind !== 'null') fail(typeError(x, 'NetConf', 'ipam', 'types.IPAM'));
    }],
    ['dns', (x) => {
      if (x.kind === 'object') {
        for (const m of members(x)) {
          const f = matchField(m.key, ['nameservers', 'domain', 'search', 'options']);
          if (f === 'domain') str(m.value, 'DNS', 'dns.domain', () => undefined);
          else if (f) strings(m.value, `dns.${f}`);
        }
      } else if (x.kind !== 'null') fail(typeError(x, 'NetConf', 'dns', 'types.DNS'));
    }],
    ['prevResult', (x) => {
      if (x.kind === 'object') {
        const o = firstOverflow(x);
        if (o !== undefined) fail(overflowError(o));
      } else if (x.kind !== 'null') fail(typeError(x, 'NetConf', 'prevResult', 'map[string]interface {}'));
    }],
  ];
  const names = fields.map(([f]) => f);
  for (const m of members(v)) {
    const f = matchField(m.key, names);
    if (f) fields[names.indexOf(f)][1](m.value);
  }
  return error === undefined ? { ok: true, value: conf } : { ok: false, error };
}

/** Go's choice of struct field for a key: an exact match, else the first field that matches folded. */
function matchField(key: string, fields: string[]): string | undefined {
  return fields.find((f) => f === key) ?? fields.find((f) => goFieldMatches(key, f));
}

function parse(bytes: Buffer): Result<GoValue> {
  try {
    return { ok: true, value: parseGoJson(bytes) };
  } catch (e) {
    if (e instanceof GoSyntaxError) return { ok: false, error: e.message };
    throw e;
  }
}

/** libcni's ConfFromBytes. */
export function confFromBytes(bytes: Buffer): Result<{ conf: NetConfView; tree: GoValue }> {
  const tree = parse(bytes);
  if (!tree.ok) return { ok: false, error: `error parsing configuration: ${tree.error}` };
  const conf = decodeNetConf(tree.value, false);
  if (!conf.ok) return { ok: false, error: `error parsing configuration: ${conf.error}` };
  if (conf.value.type === '') return { ok: false, error: "error parsing configuration: missing 'type'" };
  return { ok: true, value: { conf: conf.value, tree: tree.value } };
}

/** libcni's ConfListFromBytes, from an already parsed tree. */
function confListFromTree(tree: GoValue): Result<Omit<LoadedList, 'file' | 'kind'>> {
  const err = (e: string) => ({ ok: false as const, error: `error parsing configuration list: ${e}` });
  if (tree.kind !== 'object' && tree.kind !== 'null') return err(`json: cannot unmarshal ${tree.kind} into Go value of type map[string]interface {}`);
  const overflow = firstOverflow(tree);
  if (overflow !== undefined) return err(overflowError(overflow));
  const raw = new Map(tree.kind === 'object' ? mapMembers(tree.members, false).map((m) => [m.key, m.value]) : []);
  const name = raw.get('name');
  if (!name) return err('no name');
  if (name.kind !== 'string') return err(`invalid name type ${goType(name)}`);
  const version = raw.get('cniVersion');
  if (version && version.kind !== 'string') return err(`invalid cniVersion type ${goType(version)}`);
  const disableCheck = raw.get('disableCheck');
  if (disableCheck && disableCheck.kind !== 'bool') return err(`invalid disableCheck type ${goType(disableCheck)}`);
  const plugins = raw.get('plugins');
  if (!plugins) return err("no 'plugins' key");
  if (plugins.kind !== 'array') return err(`invalid 'plugins' type ${goType(plugins)}`);
  if (plugins.items.length === 0) return err('no plugins in list');
  const confs: NetConfView[] = [];
  for (const [i, p] of plugins.items.entries()) {
    const c = decodeNetConf(p, true);
    if (!c.ok) return { ok: false, error: `failed to parse plugin config ${i}: error parsing configuration: ${c.error}` };
    if (c.value.type === '') return { ok: false, error: `failed to parse plugin config ${i}: error parsing configuration: missing 'type'` };
    confs.push(c.value);
  }
  return { ok: true, value: { name: name.value, cniVersion: version?.kind === 'string' ? version.value : '', plugins: confs, tree, pluginsNode: plugins } };
}

/** libcni's ConfListFromBytes. */
export function confListFromBytes(bytes: Buffer): Result<Omit<LoadedList, 'file' | 'kind'>> {
  const tree = parse(bytes);
  if (!tree.ok) return { ok: false, error: `error parsing configuration list: ${tree.error}` };
  return confListFromTree(tree.value);
}

function readErrorText(name: string, code: string): string {
  if (code === 'ENOENT') return `error reading ${name}: open ${name}: no such file or directory`;
  if (code === 'EISDIR') return `error reading ${name}: read ${name}: is a directory`;
  if (code === 'EACCES') return `error reading ${name}: open ${name}: permission denied`;
  return `error reading ${name}: ${code}`;
}

/** One file as both runtimes load it (go-cni's and ocicni's body), or go-cni's message for why not. */
export function loadFile(f: DirFile): Result<LoadedList> {
  if (extension(f.name) === '.conflist') {
    const l = f.readError ? { ok: false as const, error: readErrorText(f.name, f.readError) } : confListFromBytes(f.bytes);
    if (!l.ok) return { ok: false, error: `failed to load CNI config list file ${f.name}: ${l.error}` };
    return { ok: true, value: { ...l.value, file: f.name, kind: 'list' } };
  }
  const c = f.readError ? { ok: false as const, error: readErrorText(f.name, f.readError) } : confFromBytes(f.bytes);
  if (!c.ok) return { ok: false, error: `failed to load CNI config file ${f.name}: ${c.error}` };
  // ConfListFromConf: the file again through a map, as the only plugin of a list named like it.
  const overflow = firstOverflow(c.value.tree);
  const p = overflow === undefined ? decodeNetConf(c.value.tree, true) : undefined;
  const convertError = overflow !== undefined ? overflowError(overflow)
    : !p!.ok ? `failed to parse plugin config 0: error parsing configuration: ${p!.error}`
    : p!.value.type === '' ? "failed to parse plugin config 0: error parsing configuration: missing 'type'" : undefined;
  if (convertError) return { ok: false, error: `failed to convert CNI config file ${f.name} to list: ${convertError}` };
  const { conf, tree } = c.value;
  return { ok: true, value: { file: f.name, kind: 'single', name: conf.name, cniVersion: conf.cniVersion, plugins: [(p as { value: NetConfView }).value], tree } };
}

export interface RuntimeLoad {
  /** The network the runtime uses for pods. */
  loaded?: LoadedList;
  /** containerd only: the file whose error failed the whole load. */
  failed?: { file: string; error: string };
  /** Files passed over: CRI-O's skipped files, and those `passOver` names. */
  skipped: Array<{ file: string; why: string }>;
}

/** Files a runtime reads, in its order: .conf/.conflist/.json by Go's sort.Strings (bytes). */
export function runtimeFiles<T extends { name: string }>(files: T[]): T[] {
  return files
    .filter((f) => (CONF_EXTENSIONS as readonly string[]).includes(extension(f.name)))
    .sort((a, b) => Buffer.compare(Buffer.from(a.name), Buffer.from(b.name)));
}

/**
 * What `runtime` loads from these files: containerd stops at the first file that fails (and loads
 * nothing); CRI-O skips it. `passOver` lets the installer ask "what would it load without our own
 * files": a file it names (with a reason) is treated as absent.
 */
export function runtimeLoad(files: DirFile[], runtime: Runtime, passOver?: (f: DirFile, l: Result<LoadedList>) => string | undefined): RuntimeLoad {
  const skipped: RuntimeLoad['skipped'] = [];
  for (const f of runtimeFiles(files)) {
    const l = loadFile(f);
    const why = passOver?.(f, l);
    if (why) {
      skipped.push({ file: f.name, why });
      continue;
    }
    if (!l.ok) {
      if (runtime === 'containerd') return { failed: { file: f.name, error: l.error }, skipped };
      skipped.push({ file: f.name, why: l.error });
      continue;
    }
    return { loaded: l.value, skipped };
  }
  return { skipped };
}
