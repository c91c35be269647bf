// Crash-safe file writes: write a temp file, fsync it, rename over the target, fsync the directory.
// A reader after kill -9 at any instant sees either the old or the new content, never a torn file.
// The CNI executables use it too (a queued DEL), and they load a Node module only when a request needs it:
// a static import would be loaded at every start (Bun hoists them), so node:fs is required on first use.
import type * as Fs from 'node:fs';

let fsModule: typeof Fs | undefined;
function fsm(): typeof Fs {
  return (fsModule ??= require('node:fs') as typeof Fs);
}
const dirOf = (file: string): string => file.slice(0, file.lastIndexOf('/')) || (file.startsWith('/') ? '/' : '.');
const baseOf = (file: string): string => file.slice(file.lastIndexOf('/') + 1);

export interface AtomicWriteOptions {
  /** The file's mode, set exactly (fchmod, so the umask does not narrow it); default 0600. */
  mode?: number;
  /** Owner the file gets before it appears under its name; refused ownership fails the write. */
  owner?: { uid: number; gid: number };
  /** Modification time the file gets before it appears under its name. */
  mtime?: Date;
  /**
   * Name of the temp file in the same directory, which must not exist yet. Default `.<name>.<pid>.tmp`,
   * which a writer of the same pid killed earlier may have left: that one is overwritten.
   */
  tempName?: string;
}

export function writeFileAtomic(file: string, data: string | Buffer, o: AtomicWriteOptions = {}): void {
  const mode = o.mode ?? 0o600;
  const fs = fsm();
  const dir = dirOf(file);
  const tmp = `${dir}/${o.tempName ?? `.${baseOf(file)}.${process.pid}.tmp`}`;
  const fd = fs.openSync(tmp, o.tempName ? 'wx' : 'w', mode);
  try {
    fs.writeSync(fd, typeof data === 'string' ? Buffer.from(data) : data);
    if (o.owner) {
      try {
        fs.fchownSync(fd, o.owner.uid, o.owner.gid);
      } catch (e) {
        throw new Error(`${file}: cannot keep its owner (uid ${o.owner.uid}, gid ${o.owner.gid}): ${(e as Error).message}`);
      }
    }
    fs.fchmodSync(fd, mode);
    fs.fsyncSync(fd);
  } catch (e) {
    fs.closeSync(fd);
    fs.rmSync(tmp, { force: true });
    throw e;
  }
  fs.closeSync(fd);
  try {
    if (o.mtime) fs.utimesSync(tmp, o.mtime, o.mtime);
    fs.renameSync(tmp, file);
  } catch (e) {
    fs.rmSync(tmp, { force: true });
    throw e;
  }
  fsyncDir(dir);
}

export function removeFileDurable(file: string): boolean {
  const fs = fsm();
  try {
    fs.unlinkSync(file);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') return false;
    throw e;
  }
  fsyncDir(dirOf(file));
  return true;
}

export function fsyncDir(dir: string): void {
  const fs = fsm();
  const fd = fs.openSync(dir, 'r');
  try {
    fs.fsyncSync(fd);
  } finally {
    fs.closeSync(fd);
  }
}

/** Removes temp files a killed writer left behind. */
export function sweepTempFiles(dir: string): number {
  const fs = fsm();
  let n = 0;
  for (const name of fs.readdirSync(dir)) {
    if (name.startsWith('.') && name.endsWith('.tmp')) {
      fs.unlinkSync(`${dir}/${name}`);
      n++;
    }
  }
  return n;
}
