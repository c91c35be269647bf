// Node cleanup after tetherd is gone for good (the uninstall DaemonSet's second step): takes off the node
// what tetherd left there, without tetherd, the API server or the store — only the node's own files and
// kernel. Every step is idempotent, so a cleanup interrupted at any point is simply run again.
//
// What tetherd leaves and where this finds it:
//   tc filters   our programs at our (handle, priority) on the host-side veths (egress steering and guard,
//                FoU decap), on the uplink (the LB's node datapath) and, in pods still running, on their
//                interfaces (FoU decap, the LB program):
//                detached only when the program there carries one of our names;
//   routes       floating-address and VIP /32 (IPv6: unicast /128) routes (any table) through the host veth
//                of a pod tetherd recorded, other than the pod's own address (the primary's route); proxy
//                ARP and NDP entries of those addresses;
//   nft          the tables ip and ip6 tether_egress, only ever inside gateway pods: deleted in those still
//                running;
//   sysctls      node sysctls put back from tetherd's journal (daemon/sys/sysctl-journal.ts) where the value
//                is still what tetherd wrote;
//   pins         the pin directory, removed whole (after the filters: a pin alone keeps nothing attached);
//   files        pod records, the deletion queue, the rest of tetherd's state and its runtime directory.
// Pods created with tether that still run keep the executables installed: a DEL of such a pod runs the
// configuration the runtime cached for it, which names tether (istio/istio#58572). Their records stay too,
// so the next cleanup (re-apply install/uninstall once they are gone) finishes the job.
import { execFileSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as net from 'node:net';
import * as path from 'node:path';
import type { Logger } from 'winston';
import { koffi } from '../../daemon/sys/ffi';
import { close as closeFd } from '../../daemon/sys/libc';
import { netnsExists, procSysNet, readNetSysctl } from '../../daemon/sys/netns';
import { ifIndexOf, interfaceOf, readSysctlJournal } from '../../daemon/sys/sysctl-journal';
import { NetlinkHandle } from '../../daemon/netlink';
import { RTN } from '../../daemon/netlink/constants';
import { detachTc, queryTc, type TcDirection } from '../../daemon/bpf/tc';
import { FOU_TC } from '../../daemon/bpf/fou';
import { EGRESS_TC } from '../../daemon/bpf/egress-steer';
import { GUARD_TC } from '../../daemon/bpf/egress-guard';
import { LB_NODE_TC, LB_TC } from '../../daemon/bpf/lb';
import type { PodRecord } from '../../daemon/state/pod-store';
import { Installer } from './installer';

/** Every tc filter tetherd attaches: its (handle, priority) and the program's name (the kernel keeps 15 characters). */
const OUR_FILTERS = [FOU_TC.encap, FOU_TC.decap, EGRESS_TC, GUARD_TC, LB_TC, LB_NODE_TC].map((f) => ({ handle: f.handle, priority: f.priority, program: f.program.slice(0, 15) }));
const DIRECTIONS: TcDirection[] = ['ingress', 'egress'];
/** The nft table a gateway pod gets (daemon/egress/gateway-datapath.ts). */
export const NFT_TABLE = 'tether_egress';
export const SYSCTL_JOURNAL = 'sysctl-journal.json';

export interface CleanNodeOptions {
  /** tetherd's --state-dir (pods/, delete-queue/, the sysctl journal…). */
  tetherdStateDir: string;
  /** tetherd's socket: it must not answer (tetherd gone) unless force. */
  socket: string;
  /** tetherd's runtime directory (the socket's, /run/tether); its contents are removed. */
  runDir?: string;
  pinDir: string;
  /** The installer's directories: executables and its state (which holds the tombstone, kept). */
  binDir: string;
  netDir: string;
  installerStateDir: string;
  log: Logger;
  force?: boolean;
}

export interface CleanReport {
  filtersDetached: number;
  routesDeleted: number;
  proxyEntriesDeleted: number;
  nftTablesDeleted: number;
  sysctlsRestored: number;
  sysctlsLeft: number;
  pinsRemoved: boolean;
  /** Pods created with tether whose namespace still exists (their records and the executables stay). */
  livePods: string[];
  executablesRemoved: boolean;
  queuedDeletes: number;
}

/** True when something accepts connections on the socket (tetherd runs). */
export function tetherdAnswers(socket: string, timeoutMs = 1000): Promise<boolean> {
  return new Promise((resolve) => {
    const c = net.connect(socket);
    const done = (v: boolean) => {
      c.destroy();
      resolve(v);
    };
    c.setTimeout(timeoutMs, () => done(true)); // connected to something that is slow: it is there
    c.once('connect', () => done(true));
    c.once('error', () => done(false));
  });
}

function readRecords(stateDir: string, log: Logger): PodRecord[] {
  const dir = path.join(stateDir, 'pods');
  let names: string[];
  try {
    names = fs.readdirSync(dir);
  } catch {
    return [];
  }
  const out: PodRecord[] = [];
  for (const n of names) {
    if (!n.endsWith('.json')) continue;
    try {
      out.push({ ...(JSON.parse(fs.readFileSync(path.join(dir, n), 'utf8')) as PodRecord), file: path.join(dir, n) } as PodRecord);
    } catch (e) {
      log.warn('clean-node: unreadable pod record ignored', { file: path.join(dir, n), error: (e as Error).message });
    }
  }
  return out;
}

let progFns: { getFd: (id: number) => number; info: (fd: number, info: Buffer, len: Buffer) => number } | undefined;

/** The name of a loaded eBPF program by id (struct bpf_prog_info: name[16] at offset 64), or undefined. */
function programName(id: number): string | undefined {
  if (!progFns) {
    const so = koffi().load('libbpf.so.1');
    progFns = { getFd: so.func('int bpf_prog_get_fd_by_id(uint32_t id)'), info: so.func('int bpf_obj_get_info_by_fd(int fd, void *info, void *len)') };
  }
  const fd = progFns.getFd(id);
  if (fd < 0) return undefined;
  try {
    const info = Buffer.alloc(256);
    const len = Buffer.alloc(4);
    len.writeUInt32LE(info.length);
    if (progFns.info(fd, info, len) < 0) return undefined;
    const raw = info.subarray(64, 80);
    const nul = raw.indexOf(0);
    return raw.subarray(0, nul < 0 ? raw.length : nul).toString('latin1');
  } finally {
    closeFd(fd);
  }
}

/** Detaches our filters from every interface of a namespace (null: the node's). */
function detachOurFilters(netns: string | null, log: Logger): number {
  const links = NetlinkHandle.with(netns ?? undefined, (h) => h.listLinks());
  let n = 0;
  for (const link of links) {
    for (const direction of DIRECTIONS) {
      for (const f of OUR_FILTERS) {
        const id = { netns, ifindex: link.index, direction, handle: f.handle, priority: f.priority };
        const progId = queryTc(id);
        if (progId === undefined) continue;
        const name = programName(progId);
        // Another project's filter at the same place is left alone.
        if (name !== f.program) continue;
        if (detachTc(id)) {
          n++;
          log.info('clean-node: tc filter detached', { netns: netns ?? 'node', ifName: link.name, direction, program: name, priority: f.priority });
        }
      }
    }
  }
  return n;
}

/** Our /32 and /128 routes (any table) through recorded pods' host veths, and proxy ARP/NDP entries for their addresses. */
function deleteOurRoutes(records: PodRecord[], log: Logger): { routes: number; proxies: number } {
  return NetlinkHandle.with(undefined, (h) => {
    const byName = new Map(h.listLinks().map((l) => [l.name, l.index]));
    const podIfs = new Map<number, Set<string>>();
    for (const r of records) {
      const idx = r.hostIfName ? byName.get(r.hostIfName) : undefined;
      if (idx !== undefined) podIfs.set(idx, new Set(r.ips ?? []));
    }
    let routes = 0;
    const addresses = new Set<string>();
    for (const rt of [...h.listRoutes({ family: 4 }), ...h.listRoutes({ family: 6 })]) {
      if (rt.dstLen !== (rt.family === 6 ? 128 : 32)) continue;
      // IPv6 puts the node's own addresses on a veth in the local table as /128s through it: unicast only.
      if (rt.family === 6 && rt.type !== RTN.UNICAST) continue;
      const oifs = rt.nexthops ? rt.nexthops.map((x) => x.index) : [rt.index];
      const ours = oifs.some((i) => i !== undefined && podIfs.has(i));
      // The pod's own address is the primary's route to it (ptp, bridge): not ours.
      if (!ours || oifs.some((i) => i !== undefined && podIfs.get(i)?.has(rt.dst))) continue;
      const dst = `${rt.dst}/${rt.dstLen}`;
      h.deleteRoute({ dst, table: rt.table });
      routes++;
      addresses.add(rt.dst);
      log.info('clean-node: route deleted', { dst, table: rt.table });
    }
    let proxies = 0;
    for (const nb of [...h.listNeighbours({ family: 4, proxy: true }), ...h.listNeighbours({ family: 6, proxy: true })]) {
      if (!addresses.has(nb.address)) continue;
      h.deleteNeighbour({ address: nb.address, index: nb.index, proxy: true });
      proxies++;
      log.info(nb.family === 6 ? 'clean-node: proxy NDP entry deleted' : 'clean-node: proxy ARP entry deleted', { address: nb.address, ifindex: nb.index });
    }
    return { routes, proxies };
  });
}

/** Puts node sysctls back from the journal where the value is still the one tetherd wrote. */
function restoreSysctls(journalFile: string, log: Logger): { restored: number; left: number } {
  const j = readSysctlJournal(journalFile);
  let restored = 0;
  let left = 0;
  for (const [key, e] of Object.entries(j)) {
    const dev = interfaceOf(key);
    if (dev && ifIndexOf(dev) !== e.ifindex) continue; // the interface went with its pod, and its setting with it
    const file = `${procSysNet()}/${key.slice('net/'.length)}`;
    const now = readNetSysctl(null, key);
    if (now !== e.wrote) {
      left++;
      log.warn('clean-node: sysctl changed since tetherd wrote it; left as it is', { key, now, tetherdWrote: e.wrote, before: e.before });
      continue;
    }
    fs.writeFileSync(file, e.before);
    restored++;
    log.info('clean-node: sysctl restored', { key, value: e.before, tetherdWrote: e.wrote });
  }
  fs.rmSync(journalFile, { force: true });
  return { restored, left };
}

function countFiles(dir: string): number {
  try {
    return fs.readdirSync(dir).filter((n) => !n.startsWith('.')).length;
  } catch {
    return 0;
  }
}

/** Removes a directory's contents except `keep` (names), then the directory when it is empty and not a mount point. */
function emptyDir(dir: string, keep: Set<string>, log: Logger): void {
  let names: string[];
  try {
    names = fs.readdirSync(dir);
  } catch {
    return;
  }
  for (const n of names) if (!keep.has(n)) fs.rmSync(path.join(dir, n), { recursive: true, force: true });
  if (keep.size > 0) return;
  try {
    fs.rmdirSync(dir);
  } catch (e) {
    // A hostPath mounted into this container (EBUSY): the directory stays, empty.
    log.info('clean-node: directory emptied, not removed', { dir, why: (e as NodeJS.ErrnoException).code });
  }
}

export async function cleanNode(o: CleanNodeOptions): Promise<CleanReport> {
  const log = o.log;
  if (!o.force && (await tetherdAnswers(o.socket))) {
    throw new Error(`tetherd still answers on ${o.socket}: delete the tetherd DaemonSet first (or pass --force)`);
  }
  const records = readRecords(o.tetherdStateDir, log);
  const live = records.filter((r) => r.netns && netnsExists(r.netns));
  const report: CleanReport = {
    filtersDetached: 0, routesDeleted: 0, proxyEntriesDeleted: 0, nftTablesDeleted: 0, sysctlsRestored: 0, sysctlsLeft: 0,
    pinsRemoved: false, livePods: live.map((r) => r.podNamespace && r.podName ? `${r.podNamespace}/${r.podName}` : r.containerId), executablesRemoved: false, queuedDeletes: 0,
  };
  // Filters first: a program stays attached (and its maps alive) as long as a filter holds it, pins or not.
  report.filtersDetached += detachOurFilters(null, log);
  for (const r of live) {
    try {
      report.filtersDetached += detachOurFilters(r.netns, log);
      const tables = execFileSync('nsenter', [`--net=${r.netns}`, 'nft', 'list', 'tables'], { encoding: 'utf8' });
      // An IPv6 gateway pod has an ip6 table beside the ip one.
      for (const family of ['ip', 'ip6']) {
        if (!new RegExp(`^table ${family} ${NFT_TABLE}$`, 'm').test(tables)) continue;
        execFileSync('nsenter', [`--net=${r.netns}`, 'nft', 'delete', 'table', family, NFT_TABLE]);
        report.nftTablesDeleted++;
        log.info('clean-node: nft table deleted in a running pod', { netns: r.netns, table: NFT_TABLE, family });
      }
    } catch (e) {
      // The pod may be going away right now; its namespace takes all of it along then.
      log.warn('clean-node: running pod not cleaned', { netns: r.netns, error: (e as Error).message });
    }
  }
  const rt = deleteOurRoutes(records, log);
  report.routesDeleted = rt.routes;
  report.proxyEntriesDeleted = rt.proxies;
  const sc = restoreSysctls(path.join(o.tetherdStateDir, SYSCTL_JOURNAL), log);
  report.sysctlsRestored = sc.restored;
  report.sysctlsLeft = sc.left;
  if (fs.existsSync(o.pinDir)) {
    fs.rmSync(o.pinDir, { recursive: true, force: true });
    report.pinsRemoved = true;
    log.info('clean-node: pins removed', { pinDir: o.pinDir });
  }

  const queueDir = path.join(o.tetherdStateDir, 'delete-queue');
  report.queuedDeletes = countFiles(queueDir);
  const installerRel = path.relative(o.tetherdStateDir, o.installerStateDir);
  const keepInState = new Set<string>();
  if (!installerRel.startsWith('..') && !path.isAbsolute(installerRel)) keepInState.add(installerRel.split(path.sep)[0]);
  if (live.length > 0) {
    // Their DEL still runs tether (the runtime's cached configuration): keep the executables, their records
    // and any DEL they queue, for the cleanup that runs once they are gone.
    const liveFiles = new Set(live.map((r) => path.basename((r as PodRecord & { file: string }).file)));
    for (const r of records) {
      const f = (r as PodRecord & { file: string }).file;
      if (!liveFiles.has(path.basename(f))) fs.rmSync(f, { force: true });
    }
    keepInState.add('pods').add('delete-queue');
    log.warn('clean-node: pods created with tether still run on this node: the tether executables stay until they are gone; delete or restart them, then delete this node\'s tether-uninstall pod (the DaemonSet starts a new one, which cleans again)', { pods: report.livePods });
  } else {
    if (report.queuedDeletes > 0) {
      // Nothing is left to release: the cleanup above covers what each queued DEL would have undone.
      log.warn('clean-node: queued DELs dropped (tetherd will not come back to replay them)', { dir: queueDir, requests: report.queuedDeletes });
    }
    new Installer({ netDir: o.netDir, binDir: o.binDir, stateDir: o.installerStateDir, log }).removeExecutables();
    report.executablesRemoved = true;
  }
  emptyDir(o.tetherdStateDir, keepInState, log);
  if (o.runDir) emptyDir(o.runDir, new Set(), log);
  log.info('clean-node: done', { ...report });
  return report;
}
