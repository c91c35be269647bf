// Makes sure pins land on a bpffs: /sys/fs/bpf is not mounted at boot on every distribution (nor in
// every container), and pinning into a plain directory fails with EPERM or, worse, into a tmpfs.
import * as fs from 'node:fs';
import * as path from 'node:path';
import { koffi } from '../sys/ffi';
import { errnoName } from '../sys/libc';
import { TetherError, ErrorCode } from '../../lib/errors';
import { log } from '../../lib/log';

const BPF_FS_MAGIC = 0xcafe4a11;
export const BPFFS_ROOT = '/sys/fs/bpf';

interface Fs {
  statfs: (path: string, buf: Buffer) => number;
  mount: (src: string, target: string, type: string, flags: number, data: null) => number;
}
let fns: Fs | undefined;
function libc(): Fs {
  if (!fns) {
    const c = koffi().load('libc.so.6');
    fns = {
      statfs: c.func('int statfs(const char *path, void *buf)'),
      mount: c.func('int mount(const char *src, const char *target, const char *type, unsigned long flags, const void *data)'),
    };
  }
  return fns;
}

/** True when path (which must exist) lives on a bpffs. f_type is the first field (a long) of struct statfs. */
export function isBpffs(p: string): boolean {
  const buf = Buffer.alloc(128);
  if (libc().statfs(p, buf) < 0) {
    const e = koffi().errno();
    throw new TetherError(ErrorCode.Bpf, `statfs(${p}) failed: ${errnoName(e)} (errno ${e})`);
  }
  return Number(buf.readBigInt64LE(0)) === BPF_FS_MAGIC;
}

/**
 * 'mount' (the default, a node without a container): mount a bpffs at /sys/fs/bpf when there is none.
 * 'host' (the DaemonSet): never mount. A bpffs mounted inside tetherd's own container lives in the
 * container's mount namespace only: the host would see no pins and a restarted container would start with
 * empty maps (flow pins lost), so a missing host bpffs is an error naming the init container that mounts it.
 */
export type BpffsMode = 'mount' | 'host';
let mode: BpffsMode = 'mount';

export function setBpffsMode(m: string): void {
  if (m !== 'mount' && m !== 'host') throw new TetherError(ErrorCode.InvalidConfig, `--bpffs: ${JSON.stringify(m)} is not mount or host`);
  mode = m;
}

/**
 * Ensures pinDir is on a bpffs and exists. When it sits under /sys/fs/bpf and that is not a bpffs yet,
 * mounts one there (idempotent). Other roots must already be bpffs mounts.
 */
export function ensureBpffs(pinDir: string): void {
  const dir = path.resolve(pinDir);
  const underDefault = dir === BPFFS_ROOT || dir.startsWith(`${BPFFS_ROOT}/`);
  if (underDefault && !isBpffs(BPFFS_ROOT)) {
    if (mode === 'host') {
      throw new TetherError(ErrorCode.Bpf, `${BPFFS_ROOT} is not a bpffs: the host's bpffs must be mounted there (the DaemonSet's init container mount-bpf-fs does it, with Bidirectional propagation) and reach tetherd's container (HostToContainer); tetherd does not mount one of its own, whose pins would die with the container`);
    }
    if (libc().mount('bpf', BPFFS_ROOT, 'bpf', 0, null) < 0) {
      const e = koffi().errno();
      throw new TetherError(ErrorCode.Bpf, `mount -t bpf bpf ${BPFFS_ROOT} failed: ${errnoName(e)} (errno ${e})`);
    }
    log().info('mounted bpffs', { path: BPFFS_ROOT });
  }
  let probe = dir;
  while (!fs.existsSync(probe)) probe = path.dirname(probe);
  if (!isBpffs(probe)) {
    throw new TetherError(ErrorCode.Bpf, `pin directory ${dir} is not on a bpffs (${probe} is not); mount one with: mount -t bpf bpf ${probe}`);
  }
  fs.mkdirSync(dir, { recursive: true, mode: 0o700 });
}
