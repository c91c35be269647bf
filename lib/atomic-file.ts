// Crash-safe file writes: write a temp file, fsync it, rename over the target, fsync the directory.
// A reader after kill -9 at any instant sees either the old or the new content, never a torn file.
import * as fs from 'node:fs';
import * as path from 'node:path';

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
  const dir = path.dirname(file);
  const tmp = path.join(dir, o.tempName ?? `.${path.basename(file)}.${process.pid}.tmp`);
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
  try {
    fs.unlinkSync(file);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') return false;
    throw e;
  }
  fsyncDir(path.dirname(file));
  return true;
}

export function fsyncDir(dir: string): void {
  const fd = fs.openSync(dir, 'r');
  try {
    fs.fsyncSync(fd);
  } finally {
    fs.closeSync(fd);
  }
}

/** Removes temp files a killed writer left behind. */
export function sweepTempFiles(dir: string): number {
  let n = 0;
  for (const name of fs.readdirSync(dir)) {
    if (name.startsWith('.') && name.endsWith('.tmp')) {
      fs.unlinkSync(path.join(dir, name));
      n++;
    }
  }
  return n;
}
