// The node side of the installer: puts the CNI executables into the runtime's binary directory and chains
// `tether` into the primary configuration, keeps them there, and takes exactly what it added away again.
//
// Every write is atomic (a hidden temp file in the same directory, fsync, rename, fsync of the directory);
// identical bytes are never rewritten; other projects' files are never renamed or deleted. What was in a
// file before we changed it is kept in the state directory, so an uninstall restores it byte for byte.
// A file we rewrite keeps its mode and owner (a 0600 primary may hold credentials), and a primary that is
// a symbolic link stays one: the write goes to the file it points to.
import * as crypto from 'node:crypto';
import * as fs from 'node:fs';
import * as path from 'node:path';
import type { Logger } from 'winston';
import {
  TEMP_PREFIX, TEMP_SUFFIX, chainsTether, holdsTether, insertEntry, isOwnListName, pickPrimary, removeEntry,
  versionProblem, type DirFile,
} from './conflist';
import { runtimeFiles, runtimeLoad, type Runtime } from './libcni';
import { fsyncDir, writeFileAtomic } from '../../lib/atomic-file';

/** The CNI executables: `tether` is one file; `tether-ipam` is the same program under its own name (a link). */
export const EXECUTABLES = ['tether', 'tether-ipam'] as const;
const LINKS: Record<string, string> = { 'tether-ipam': 'tether' };
export const DEFAULT_ENTRY: Record<string, unknown> = { type: 'tether', socketPath: '/run/tether/tetherd.sock' };

export interface InstallerOptions {
  netDir: string;
  binDir: string;
  /** Where the executables to install are (the image's /usr/local/bin); absent for uninstall. */
  srcBinDir?: string;
  stateDir: string;
  entry?: Record<string, unknown>;
  /** Whose loading rules decide the primary and readiness (default containerd, the strict one). */
  runtime?: Runtime;
  log: Logger;
}

/** What we changed in one configuration file. */
interface FileRecord {
  /** The bytes before our first change (base64), or null when the file is our own. */
  original: string | null;
  /** sha256 of what we last wrote. */
  written: string;
}

interface State {
  files: Record<string, FileRecord>;
  executables: string[];
}

export type Outcome =
  | { state: 'installed'; primary: string; target: string; wrote: boolean }
  /** Nothing chained: no primary yet, the runtime loads nothing, or the primary is refused (`refused`). */
  | { state: 'waiting'; why: string; refused?: boolean; skipped: Array<{ name: string; why: string }> };

const sha256 = (b: Buffer) => crypto.createHash('sha256').update(b).digest('hex');

/** A temp file's name in the runtime's directories: `.tether-<random>.tmp` (uninstall sweeps them). */
export function tempName(): string {
  return `${TEMP_PREFIX}${crypto.randomBytes(6).toString('hex')}${TEMP_SUFFIX}`;
}

function readIf(file: string): Buffer | undefined {
  try {
    return fs.readFileSync(file);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw e;
  }
}

/**
 * The directory as libcni's ConfFiles lists it: every entry with a CNI extension that is not a directory
 * (a link counts, even to a directory or to nothing: the runtime then fails to read it, and so do we).
 */
export function readConfDir(dir: string): DirFile[] {
  let entries: fs.Dirent[];
  try {
    entries = fs.readdirSync(dir, { withFileTypes: true });
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') return [];
    throw e;
  }
  const out: DirFile[] = [];
  for (const e of runtimeFiles(entries)) {
    if (e.isDirectory()) continue;
    try {
      out.push({ name: e.name, bytes: fs.readFileSync(path.join(dir, e.name)) });
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code ?? (err as Error).message;
      // Gone between readdir and read: the runtime's next load will not see it either.
      if (code === 'ENOENT' && !isLink(path.join(dir, e.name))) continue;
      out.push({ name: e.name, bytes: Buffer.alloc(0), readError: code });
    }
  }
  return out;
}

function isLink(file: string): boolean {
  try {
    return fs.lstatSync(file).isSymbolicLink();
  } catch {
    return false;
  }
}

/**
 * Ready: the network `runtime` loads from `netDir` runs tether after its primary plugin at a version
 * tether speaks, and every executable is in place. Otherwise the file and the reason, as the runtime
 * would give them.
 */
export function readiness(netDir: string, binDir?: string, runtime: Runtime = 'containerd'): { ready: boolean; why: string } {
  const r = runtimeLoad(readConfDir(netDir), runtime);
  const skipped = r.skipped.length ? ` (${runtime} skips ${r.skipped.map((s) => `${s.file}: ${s.why}`).join('; ')})` : '';
  if (r.failed) return { ready: false, why: `containerd loads no network: ${r.failed.error}` };
  const l = r.loaded;
  if (!l) return { ready: false, why: `no CNI configuration in ${netDir} that ${runtime} loads${skipped}` };
  if (!l.plugins.some((p) => p.type === 'tether')) {
    // Say why the installer will not chain it, when that is the reason.
    const version = versionProblem(l);
    return { ready: false, why: `${l.file} (the runtime's choice) does not chain tether${version ? `: ${version}` : ''}${skipped}` };
  }
  if (!chainsTether(l)) return { ready: false, why: `${l.file} (the runtime's choice) holds tether, but not as the last plugin after a primary (${l.plugins.map((p) => p.type).join(', ')})` };
  const version = versionProblem(l);
  if (version) return { ready: false, why: version };
  if (binDir) {
    for (const name of EXECUTABLES) {
      if (!fs.existsSync(path.join(binDir, name))) return { ready: false, why: `${path.join(binDir, name)} is missing` };
    }
  }
  return { ready: true, why: `${l.file} chains tether (${runtime} loads ${l.plugins.map((p) => p.type).join(' → ')})${skipped}` };
}

export class Installer {
  private readonly entry: Record<string, unknown>;
  private readonly statePath: string;

  constructor(private readonly o: InstallerOptions) {
    this.entry = o.entry ?? DEFAULT_ENTRY;
    this.statePath = path.join(o.stateDir, 'state.json');
  }

  private loadState(): State {
    const raw = readIf(this.statePath);
    if (!raw) return { files: {}, executables: [] };
    try {
      const s = JSON.parse(raw.toString('utf8')) as State;
      return { files: s.files ?? {}, executables: s.executables ?? [] };
    } catch (e) {
      throw new Error(`${this.statePath}: unreadable installer state (${(e as Error).message}); remove it to start over`);
    }
  }

  private saveState(s: State): void {
    fs.mkdirSync(this.o.stateDir, { recursive: true, mode: 0o700 });
    writeFileAtomic(this.statePath, Buffer.from(JSON.stringify(s, null, 2)), { mode: 0o600, tempName: tempName() });
  }

  /** Copies each executable that is missing or differs; returns the names written. */
  installExecutables(): string[] {
    const src = this.o.srcBinDir;
    if (!src) throw new Error('no --src-bin-dir: nothing to install the executables from');
    fs.mkdirSync(this.o.binDir, { recursive: true });
    const state = this.loadState();
    const wrote: string[] = [];
    for (const name of EXECUTABLES) {
      if (LINKS[name]) continue;
      const from = path.join(src, name);
      const st = fs.statSync(from); // follows a link: what is installed is the file itself
      const to = path.join(this.o.binDir, name);
      let cur: fs.Stats | undefined;
      try {
        cur = fs.statSync(to);
      } catch {
        cur = undefined;
      }
      // Same size and the mtime we gave it: unchanged. Otherwise compare the bytes before writing.
      if (cur && cur.size === st.size && cur.mtimeMs === st.mtimeMs && (cur.mode & 0o777) === 0o755) continue;
      const bytes = fs.readFileSync(from);
      if (cur && cur.size === st.size && (cur.mode & 0o777) === 0o755 && readIf(to)?.equals(bytes)) continue;
      if (!state.executables.includes(name)) {
        state.executables.push(name);
        this.saveState(state);
      }
      writeFileAtomic(to, bytes, { mode: 0o755, mtime: st.mtime, tempName: tempName() });
      wrote.push(name);
      this.o.log.info('installed CNI executable', { executable: to, bytes: bytes.length });
    }
    for (const [name, target] of Object.entries(LINKS)) {
      const to = path.join(this.o.binDir, name);
      let cur: string | undefined;
      try {
        cur = fs.readlinkSync(to);
      } catch {
        cur = undefined;
      }
      if (cur === target) continue;
      if (!state.executables.includes(name)) {
        state.executables.push(name);
        this.saveState(state);
      }
      // Atomic like the files: a link with a temp name, renamed over whatever is there.
      const tmp = path.join(this.o.binDir, tempName());
      fs.symlinkSync(target, tmp);
      try {
        fs.renameSync(tmp, to);
      } catch (e) {
        fs.rmSync(tmp, { force: true });
        throw e;
      }
      fsyncDir(this.o.binDir);
      wrote.push(name);
      this.o.log.info('installed CNI executable', { executable: to, linkTo: target });
    }
    return wrote;
  }

  /** Chains tether into the primary as it is now; waits (returns 'waiting') when there is none. */
  reconcileConfig(): Outcome {
    const files = readConfDir(this.o.netDir);
    const { primary, why, skipped } = pickPrimary(files, this.o.runtime ?? 'containerd');
    const state = this.loadState();
    if (!primary) return { state: 'waiting', why: why!, skipped };
    const refused = versionProblem(primary.list);
    if (refused) return { state: 'waiting', why: `tether is not chained: ${refused}`, refused: true, skipped };
    const ins = insertEntry(primary, this.entry);
    const current = files.find((f) => f.name === ins.target)?.bytes;
    let wrote = false;
    if (!current || !current.equals(ins.bytes)) {
      const prev = state.files[ins.target];
      const ownFile = isOwnListName(ins.target);
      // The original is what the file held before we wrote it; when it still holds what we wrote last,
      // the original recorded then stays the original.
      const original = ownFile ? null : prev && current && sha256(current) === prev.written ? prev.original : (current ?? Buffer.alloc(0)).toString('base64');
      state.files[ins.target] = { original, written: sha256(ins.bytes) };
      this.saveState(state); // before the write: a crash in between still knows the original
      // Our own list beside a .conf takes the .conf's mode and owner: it holds the .conf's whole text.
      this.writeConfig(ins.target, ins.bytes, primary.name);
      wrote = true;
      this.o.log.info(current ? 'chained tether into the CNI configuration' : 'wrote the chained CNI configuration', {
        file: path.join(this.o.netDir, ins.target), primary: primary.name,
      });
    }
    // Anything we changed earlier that is no longer the target (the primary moved to another file, or
    // its agent renamed it): take tether out of it again.
    let changed = false;
    for (const name of Object.keys(state.files)) {
      if (name === ins.target) continue;
      this.undoFile(name, state.files[name]);
      delete state.files[name];
      changed = true;
    }
    for (const f of files) {
      if (isOwnListName(f.name) && f.name !== ins.target && !(f.name in state.files) && holdsTether(f.bytes)) {
        this.removeOwn(f.name, 'left by an earlier run');
      }
    }
    if (changed) this.saveState(state);
    return { state: 'installed', primary: primary.name, target: ins.target, wrote };
  }

  /**
   * Writes a configuration file atomically with the mode and owner of `like` (a file in the directory),
   * through a symbolic link when `name` is one: the link stays, the file it points to gets the bytes.
   */
  private writeConfig(name: string, bytes: Buffer, like: string): void {
    let [dir, base] = [this.o.netDir, name];
    const file = path.join(this.o.netDir, name);
    if (isLink(file)) {
      const real = fs.realpathSync(file);
      [dir, base] = [path.dirname(real), path.basename(real)];
    }
    let st: fs.Stats | undefined;
    try {
      st = fs.statSync(path.join(this.o.netDir, like));
    } catch {
      st = undefined; // the primary went away meanwhile: a new file gets the usual 0644 root
    }
    try {
      writeFileAtomic(path.join(dir, base), bytes, { mode: st ? st.mode & 0o7777 : 0o644, owner: st ? { uid: st.uid, gid: st.gid } : undefined, tempName: tempName() });
    } catch (e) {
      const via = dir === this.o.netDir ? '' : ` (through the link ${file})`;
      throw new Error(`cannot write ${path.join(dir, base)}${via}: ${(e as Error).message}`);
    }
  }

  private removeOwn(name: string, why: string): void {
    const file = path.join(this.o.netDir, name);
    if (!fs.existsSync(file)) return;
    fs.rmSync(file, { force: true });
    fsyncDir(this.o.netDir);
    this.o.log.info('removed our CNI configuration', { file, why });
  }

  /** Puts a file back as it was before us (byte for byte when it still holds what we wrote). */
  private undoFile(name: string, rec: FileRecord): void {
    if (rec.original === null || isOwnListName(name)) {
      this.removeOwn(name, 'tether is no longer chained there');
      return;
    }
    const file = path.join(this.o.netDir, name);
    const current = readIf(file);
    if (!current) return; // its agent removed it: nothing of ours is left in it
    let restored: Buffer | undefined;
    if (sha256(current) === rec.written) {
      restored = Buffer.from(rec.original, 'base64');
      if (holdsTether(restored)) restored = removeEntry(restored) ?? restored;
    } else {
      restored = removeEntry(current); // rewritten by someone since: take out only our entry
    }
    if (!restored || restored.equals(current)) return;
    this.writeConfig(name, restored, name);
    this.o.log.info('took tether out of the CNI configuration', { file, restored: sha256(current) === rec.written ? 'original bytes' : 'entry removed' });
  }

  /** Install = executables, then the configuration. */
  reconcile(): Outcome {
    if (this.o.srcBinDir) this.installExecutables();
    return this.reconcileConfig();
  }

  /** Removes only our entry (restoring the files we changed) and then our executables and state. */
  uninstall(): void {
    this.uninstallConfig();
    this.removeExecutables();
  }

  /**
   * Takes tether out of the CNI configuration only. The executables stay: a DEL of a pod created with
   * tether runs the configuration the runtime cached for that pod, which still names tether, and fails
   * when the executable is gone (istio/istio#58572). The state keeps listing them for removeExecutables.
   */
  uninstallConfig(): void {
    const state = this.loadState();
    for (const [name, rec] of Object.entries(state.files)) this.undoFile(name, rec);
    for (const f of readConfDir(this.o.netDir)) {
      if (isOwnListName(f.name) && holdsTether(f.bytes)) this.removeOwn(f.name, 'uninstall');
    }
    if (Object.keys(state.files).length > 0) this.saveState({ ...state, files: {} });
    this.o.log.info('uninstall: no CNI configuration chains tether any more', { netDir: this.o.netDir });
  }

  /** Removes our executables, leftover temp files and the installer's state. */
  removeExecutables(): void {
    const state = this.loadState();
    for (const name of new Set([...state.executables, ...EXECUTABLES])) {
      const file = path.join(this.o.binDir, name);
      let present = true;
      try {
        fs.lstatSync(file); // a link counts even when what it points to is gone
      } catch {
        present = false;
      }
      if (present) {
        fs.rmSync(file, { force: true });
        this.o.log.info('removed CNI executable', { executable: file });
      }
    }
    for (const dir of [this.o.netDir, this.o.binDir]) {
      let names: string[] = [];
      try {
        names = fs.readdirSync(dir);
      } catch {
        continue;
      }
      for (const n of names) if (n.startsWith(TEMP_PREFIX) && n.endsWith(TEMP_SUFFIX)) fs.rmSync(path.join(dir, n), { force: true });
    }
    fs.rmSync(this.statePath, { force: true });
    this.o.log.info('uninstalled', { netDir: this.o.netDir, binDir: this.o.binDir });
  }
}
