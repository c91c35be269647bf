// A node's CNI directories as the DaemonSet leaves them, for the CRI tests: the primary (ptp + host-local)
// written as a cluster's network add-on would, then `tether-install install` chaining tether into it, so
// the runtime loads exactly the file our installer wrote.
import { spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { BIN_DIR } from '../binaries';

/** Debian's containernetworking-plugins. */
export const SYSTEM_CNI_DIR = '/usr/lib/cni';
/** The primary's network name (the chained file keeps it). */
export const NETWORK_NAME = 'cri-test';

export interface NodeCni {
  binDir: string;
  confDir: string;
  /** host-local's dataDir: one file per allocated address while a pod holds it. */
  ipamDir: string;
  subnet: string;
  /** Files of confDir after setup (the runtime loads the first). */
  files: string[];
}

export interface NodeCniOptions {
  dir: string;
  /** The pods' subnet, e.g. 10.231.7.0/24 (host routes to the pods are made by ptp in the host namespace). */
  subnet: string;
  /** tetherd's socket; without it only the primary is installed (the baseline without tether). */
  tetherdSocket?: string;
  /** More fields of tether's conflist entry (e.g. deleteQueueDir for a tetherd with its own state dir). */
  tetherEntry?: Record<string, unknown>;
  /**
   * The primary's IPAM instead of host-local (e.g. `{type: 'tether-ipam', pool, socketPath, deleteQueueDir}`):
   * written into the ptp entry as a network add-on using tetherd's pools would. host-local stays unused.
   */
  ipam?: Record<string, unknown>;
}

export function prepareNodeCni(o: NodeCniOptions): NodeCni {
  const binDir = path.join(o.dir, 'cni-bin');
  const confDir = path.join(o.dir, 'net.d');
  const ipamDir = path.join(o.dir, 'host-local');
  const stateDir = path.join(o.dir, 'cni-install');
  for (const d of [binDir, confDir, ipamDir]) fs.mkdirSync(d, { recursive: true });
  // containerd's CRI also runs `loopback` for every sandbox's lo, from the same bin_dir.
  for (const p of ['ptp', 'host-local', 'loopback']) {
    const to = path.join(binDir, p);
    if (!fs.existsSync(to)) fs.symlinkSync(path.join(SYSTEM_CNI_DIR, p), to);
  }
  const primary = {
    cniVersion: '1.0.0',
    name: NETWORK_NAME,
    plugins: [{ type: 'ptp', ipMasq: false, ipam: o.ipam ?? { type: 'host-local', dataDir: ipamDir, ranges: [[{ subnet: o.subnet }]], routes: [{ dst: '0.0.0.0/0' }] } }],
  };
  fs.writeFileSync(path.join(confDir, '10-ptp.conflist'), JSON.stringify(primary, null, 2));
  if (o.tetherdSocket) {
    const entry = path.join(o.dir, 'tether-entry.json');
    fs.writeFileSync(entry, JSON.stringify({ type: 'tether', socketPath: o.tetherdSocket, ...o.tetherEntry }));
    const r = spawnSync(
      path.join(BIN_DIR, 'tether-install'),
      ['install', '--src-bin-dir', BIN_DIR, '--bin-dir', binDir, '--net-dir', confDir, '--state-dir', stateDir, '--entry-file', entry],
      { encoding: 'utf8', timeout: 60_000 },
    );
    if (r.status !== 0) throw new Error(`tether-install install failed (${r.status}): ${r.stderr}`);
  }
  return { binDir, confDir, ipamDir, subnet: o.subnet, files: fs.readdirSync(confDir).sort() };
}

/** The addresses host-local holds (its dataDir has one file per address, plus last_reserved_ip and a lock). */
export function hostLocalAllocations(c: NodeCni): string[] {
  const out: string[] = [];
  for (const net of fs.existsSync(c.ipamDir) ? fs.readdirSync(c.ipamDir) : []) {
    for (const f of fs.readdirSync(path.join(c.ipamDir, net))) {
      if (/^\d+\.\d+\.\d+\.\d+$/.test(f) || f.includes(':')) out.push(f);
    }
  }
  return out;
}
