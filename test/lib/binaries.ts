// Where tests find the built executables (install/build.sh puts them in dist/bin).
import * as fs from 'node:fs';
import * as path from 'node:path';

export const BIN_DIR = process.env.TETHER_BIN_DIR ?? path.resolve(__dirname, '../../dist/bin');

export function bin(name: 'tether' | 'tetherd' | 'tetherctl' | 'tether-ipam'): string {
  const p = path.join(BIN_DIR, name);
  if (!fs.existsSync(p)) throw new Error(`${p} is missing: run install/build.sh first`);
  return p;
}
