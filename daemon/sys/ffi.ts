// Loads koffi, the FFI used for libc (netlink sockets, setns) and libbpf.
// In a Node single executable the koffi native module travels as a SEA asset: it is written once to a
// root-only runtime directory (content-addressed, so a stale or tampered file is never loaded) and
// opened with process.dlopen. Under plain node it comes from node_modules as usual.
import * as crypto from 'node:crypto';
import * as fs from 'node:fs';
import * as path from 'node:path';
import type * as KoffiNs from 'koffi';
import { writeFileAtomic } from '../../lib/atomic-file';

export type Koffi = typeof KoffiNs;

let cached: Koffi | undefined;

function isSea(): boolean {
  try {
    // eslint-disable-next-line @typescript-eslint/no-var-requires
    return require('node:sea').isSea() as boolean;
  } catch {
    return false;
  }
}

function runtimeDir(): string {
  return process.env.TETHER_RUNTIME_DIR ?? '/run/tether/lib';
}

function loadFromSea(): Koffi {
  // eslint-disable-next-line @typescript-eslint/no-var-requires
  const sea = require('node:sea');
  const bytes = Buffer.from(sea.getRawAsset('koffi.node') as ArrayBuffer);
  const digest = crypto.createHash('sha256').update(bytes).digest('hex').slice(0, 16);
  const dir = runtimeDir();
  fs.mkdirSync(dir, { recursive: true, mode: 0o700 });
  const file = path.join(dir, `koffi-${digest}.node`);
  let ok = false;
  try {
    const st = fs.lstatSync(file);
    ok = st.isFile() && st.uid === process.getuid?.() && (st.mode & 0o022) === 0 &&
      crypto.createHash('sha256').update(fs.readFileSync(file)).digest('hex').slice(0, 16) === digest;
  } catch {
    ok = false;
  }
  if (!ok) {
    writeFileAtomic(file, bytes, { mode: 0o700 });
  }
  const mod = { exports: {} as Koffi };
  process.dlopen(mod, file);
  return mod.exports;
}

export function koffi(): Koffi {
  if (!cached) {
    // eslint-disable-next-line @typescript-eslint/no-var-requires
    cached = isSea() ? loadFromSea() : (require('koffi') as Koffi);
  }
  return cached;
}
