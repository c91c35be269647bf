// Crash-safe file writes: write a temp file, fsync it, rename over the target, fsync the directory.
// A reader after kill -9 at any instant sees either the old or the new content, never a torn file.
import * as fs from 'node:fs';
import * as path from 'node:path';

export function writeFileAtomic(file: string, data: string | Buffer, mode = 0o600): void {
  const dir = path.dirname(file);
  const tmp = path.join(dir, `.${path.basename(file)}.${process.pid}.tmp`);
  const fd = fs.openSync(tmp, 'w', mode);
  try {
    fs.writeSync(fd, typeof data === 'string' ? Buffer.from(data) : data);
    fs.fsyncSync(fd);
  } finally {
    fs.closeSync(fd);
  }
  fs.renameSync(tmp, file);
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
