// The node's side of install and uninstall, as the DaemonSets run it, for one testbed node: the installer
// commands (install, watch, uninstall, clean-node --wait, hold) run in the node's namespace with the node's
// directories, a pod created and deleted "as the runtime would" through whatever configuration the node's
// CNI directory holds at that moment, and a snapshot of what tether can leave on a node. Kept apart from
// the test so the container harness can call the same steps.
import * as assert from 'uvu/assert';
import type { ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { CniChain, type Conflist } from './cni-chain';
import { bpfDir } from './cleanup';
import { mustRun, run, type RunResult } from './proc';
import { binDir } from './tetherd';
import { until } from '../lib/wait';
import { SYSTEM_CNI_DIR, type Testbed } from './testbed';
import type { Topology } from './topology';
import { FLOAT_POOL } from './egress-scenario';

export interface NodeDirs {
  netDir: string;
  binDir: string;
  installerState: string;
  tetherdState: string;
  socket: string;
  pinDir: string;
  /** The primary's address range for pods created through netDir (host-local, apart from tether-ipam's pool). */
  primaryRange: string;
}

export function nodeDirs(tb: Testbed, node: string, primaryRange: string): NodeDirs {
  return {
    netDir: tb.nodeDir(node, 'net.d'),
    binDir: tb.nodeDir(node, 'cni-bin'),
    installerState: tb.nodeDir(node, 'cni-install'),
    tetherdState: tb.nodeDir(node, 'state'),
    socket: tb.socketPath(node),
    pinDir: path.join(bpfDir(tb.prefix), node),
    primaryRange,
  };
}

/** The node's primary CNI, as its own agent would have written it before tether came: ptp + host-local. */
export function writePrimary(tb: Testbed, node: string, d: NodeDirs): Buffer {
  fs.mkdirSync(d.netDir, { recursive: true });
  const conf = {
    cniVersion: '1.0.0',
    name: 'primary',
    plugins: [{ type: 'ptp', ipMasq: false, ipam: { type: 'host-local', dataDir: tb.nodeDir(node, 'ipam-rt'), ranges: [[{ subnet: d.primaryRange }]], routes: [{ dst: '0.0.0.0/0' }] } }],
  };
  const bytes = Buffer.from(JSON.stringify(conf, null, 2) + '\n');
  fs.writeFileSync(path.join(d.netDir, '10-primary.conflist'), bytes);
  return bytes;
}

/** tether-install's arguments for the node (the DaemonSets' flags with the testbed's paths). */
function installArgs(d: NodeDirs, entryFile: string): string[] {
  return [`--net-dir=${d.netDir}`, `--bin-dir=${d.binDir}`, `--state-dir=${d.installerState}`, `--src-bin-dir=${binDir()}`, `--entry-file=${entryFile}`];
}

export function entryFile(tb: Testbed, node: string, d: NodeDirs): string {
  const f = tb.nodeDir(node, 'tether-entry.json');
  fs.writeFileSync(f, JSON.stringify({ type: 'tether', socketPath: d.socket, deleteQueueDir: path.join(d.tetherdState, 'delete-queue') }));
  return f;
}

const installer = path.join(binDir(), 'tether-install');

/** One installer command in the node's namespace (the DaemonSet containers are hostNetwork). */
export function installerRun(tb: Testbed, node: string, d: NodeDirs, cmd: string, extra: string[] = []): Promise<RunResult> {
  return tb.exec(node, [installer, cmd, ...installArgs(d, entryFile(tb, node, d)), ...extra], { timeoutMs: 60_000 });
}

/** A long-running installer command (watch, hold, clean-node --wait) in the node's namespace. */
export function installerSpawn(tb: Testbed, node: string, d: NodeDirs, cmd: string, extra: string[] = []): ChildProcess & { output: () => string } {
  const child = tb.spawn(node, [installer, cmd, ...installArgs(d, entryFile(tb, node, d)), ...extra]) as ChildProcess & { output: () => string };
  let out = '';
  child.stdout?.on('data', (b: Buffer) => (out += b.toString()));
  child.stderr?.on('data', (b: Buffer) => (out += b.toString()));
  child.output = () => out;
  return child;
}

/** The clean-node flags for the testbed's tetherd (its state dir, socket and pin dir). */
export function cleanArgs(d: NodeDirs): string[] {
  return [`--tetherd-state-dir=${d.tetherdState}`, `--socket=${d.socket}`, `--pin-dir=${d.pinDir}`, `--run-dir=${path.dirname(d.socket)}/run`];
}

export function stopChild(child: ChildProcess, signal: NodeJS.Signals = 'SIGTERM', timeoutMs = 10_000): Promise<number | null> {
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve(child.exitCode);
  return new Promise((resolve, reject) => {
    const t = setTimeout(() => reject(new Error(`${child.spawnargs.slice(-8).join(' ')} did not stop on ${signal}`)), timeoutMs);
    child.once('exit', (code) => {
      clearTimeout(t);
      resolve(code);
    });
    child.kill(signal);
  });
}

export interface RuntimePod {
  /** The plugin types the runtime's configuration ran, in order. */
  plugins: string[];
  configFile: string;
  ip: string;
}

let seq = 0;

/**
 * The list containerd loads: the first file by name ending .conf, .conflist or .json, which must parse
 * (go-cni fails the whole load on a bad file, so a bad first file is an error here too). The directory
 * only ever holds lists in this test; a .conf would need libcni's conversion.
 */
function runtimeChoice(dir: string): { name: string; conflist: Conflist } {
  const names = fs.readdirSync(dir).filter((n) => /\.(conflist|conf|json)$/.test(n)).sort();
  if (names.length === 0) throw new Error(`no CNI configuration in ${dir}`);
  const conflist = JSON.parse(fs.readFileSync(path.join(dir, names[0]), 'utf8')) as Conflist;
  if (!Array.isArray(conflist.plugins)) throw new Error(`${names[0]}: not a list (this test writes lists only)`);
  return { name: names[0], conflist };
}

/**
 * Creates a pod and deletes it again exactly as a runtime would at this moment: the configuration it loads
 * is the first valid file in the node's CNI directory, executables from the node's bin dir then the
 * system's (tether is only found where the installer put it). Throws with the plugin's error when either fails.
 */
export async function podRoundTrip(tb: Testbed, node: string, d: NodeDirs): Promise<RuntimePod> {
  const choice = runtimeChoice(d.netDir);
  const conflist = choice.conflist;
  const chain = new CniChain(conflist, { cniPath: [d.binDir, SYSTEM_CNI_DIR], cacheDir: tb.nodeDir(node, 'cni-cache-rt'), runInNetns: tb.nsPath(node) });
  const ns = `${tb.prefix}-${node}-rt${++seq}`;
  await mustRun(['ip', 'netns', 'add', ns]);
  const att = {
    containerId: randomBytes(32).toString('hex'), netns: `/run/netns/${ns}`, ifName: 'eth0',
    args: { IgnoreUnknown: '1', K8S_POD_NAMESPACE: 'probe', K8S_POD_NAME: `rt${seq}` },
  };
  try {
    const add = await chain.add(att);
    const ip = add.result?.ips?.[0]?.address ?? '';
    if (!ip) throw new Error(`ADD returned no address: ${JSON.stringify(add.result)}`);
    await chain.del(att);
    return { plugins: conflist.plugins.map((p) => p.type), configFile: choice.name, ip };
  } finally {
    await run(['ip', 'netns', 'delete', ns]);
  }
}

// ---- what tether can leave on a node ------------------------------------------------------------------

/** Every readable net sysctl of the node (/proc/sys/net from inside its namespace), by key. */
const READ_SYSCTLS = `
const fs = require('fs'); const out = {};
(function walk(d) { for (const n of fs.readdirSync(d)) { const p = d + '/' + n; let st; try { st = fs.statSync(p); } catch { continue; }
  if (st.isDirectory()) walk(p); else { try { out[p.slice('/proc/sys/'.length)] = fs.readFileSync(p, 'utf8').trim(); } catch {} } } })('/proc/sys/net');
process.stdout.write(JSON.stringify(out));`;

export interface NodeSnapshot {
  sysctls: Record<string, string>;
  routes: string;
  rules: string;
  nft: string;
  /** tc filters per interface and direction. */
  tc: Record<string, string>;
  links: string[];
}

export async function snapshotNode(tb: Testbed, node: string): Promise<NodeSnapshot> {
  const ns = tb.nodeNs(node);
  const sysctls = JSON.parse((await tb.mustExec(node, [process.execPath, '-e', READ_SYSCTLS], { timeoutMs: 60_000 })).stdout) as Record<string, string>;
  const ip = async (...a: string[]) => (await mustRun(['ip', '-n', ns, ...a])).stdout.trim();
  // The kernel adds an interface's IPv6 link-local route only once DAD ends, a moment after the link came
  // up: whether it is there yet says nothing about tether, so it is left out.
  const routes = [await ip('-4', 'route', 'show', 'table', 'all'), await ip('-6', 'route', 'show', 'table', 'all')].join('\n')
    .split('\n').filter((l) => !/^local fe80::/.test(l)).join('\n');
  const rules = [await ip('-4', 'rule'), await ip('-6', 'rule')].join('\n');
  const nft = (await tb.mustExec(node, ['nft', 'list', 'ruleset'])).stdout.trim();
  const links = (JSON.parse(await ip('-j', 'link', 'show')) as Array<{ ifname: string }>).map((l) => l.ifname).sort();
  const tc: Record<string, string> = {};
  for (const l of links) {
    for (const dir of ['ingress', 'egress']) tc[`${l} ${dir}`] = (await mustRun(['tc', '-n', ns, 'filter', 'show', 'dev', l, dir])).stdout.trim();
  }
  return { sysctls, routes, rules, nft, tc, links };
}

/** One node under an Egress whose gateway and client pods putTetherToWork adds (tether-ipam, a floating pool). */
export function oneNodeEgressTopology(node: string): Topology {
  return {
    nodes: [{ name: node, pods: [] }],
    tether: true,
    ipam: 'tether-ipam',
    extraObjects: [
      { apiVersion: 'tether.dev/v1alpha1', kind: 'AddressPool', metadata: { name: 'float' }, spec: { usage: 'floating', ipv4: { cidr: FLOAT_POOL } } },
      {
        apiVersion: 'tether.dev/v1alpha1', kind: 'Egress', metadata: { name: 'out', namespace: 'shop' },
        spec: {
          clients: { podSelector: { matchLabels: { app: 'web' } } },
          gateways: { podSelector: { matchLabels: { role: 'egress-gw' } } },
          destinations: ['198.19.0.0/16'],
          addresses: { pool: 'float', count: 1 },
        },
      },
    ],
  };
}

/**
 * Puts tether to work on the node (an egress gateway and a client, the floating address owned here) and
 * checks that what a cleanup must take away is really there: pins, the floating route, our tc filters, the
 * gateway's nft table, a node sysctl changed and journalled, pod records. Else the end state proves nothing.
 */
export async function putTetherToWork(tb: Testbed, node: string, d: NodeDirs, before: NodeSnapshot): Promise<NodeSnapshot> {
  await tb.addPod(node, { name: 'gw1', namespace: 'shop', tether: { labels: { role: 'egress-gw' } } });
  await tb.addPod(node, { name: 'web', namespace: 'shop', tether: { labels: { app: 'web' }, encapOverhead: 28 } });
  const owned = await until(`${node} owns the floating address`, async () => {
    const st = (await tb.status(node)) as unknown as { egress: Array<{ address: string; ownedHere: boolean }> };
    return st.egress[0]?.ownedHere ? st.egress[0].address : undefined;
  });
  const working = await snapshotNode(tb, node);
  assert.ok(filesUnder(d.pinDir).length > 0, 'pins exist');
  assert.match(working.routes, new RegExp(`^${owned.replace(/\./g, '\\.')} dev `, 'm'), 'the floating address is routed to the gateway');
  assert.ok(Object.entries(working.tc).some(([k, v]) => !before.tc[k] && /egress_guard|egress_steer/.test(v)), 'our tc filters are attached');
  assert.match((await tb.mustExec(`${node}-gw1`, ['nft', 'list', 'tables'])).stdout, /tether_egress/);
  assert.is.not(working.sysctls['net/ipv4/neigh/eth0/proxy_delay'], before.sysctls['net/ipv4/neigh/eth0/proxy_delay'], 'tetherd changed a node sysctl');
  assert.ok(fs.existsSync(path.join(d.tetherdState, 'sysctl-journal.json')), 'tetherd journalled it');
  assert.ok(filesUnder(path.join(d.tetherdState, 'pods')).length >= 2, 'pod records');
  return working;
}

/** Files under a directory (relative paths), empty when it does not exist. */
export function filesUnder(dir: string): string[] {
  if (!fs.existsSync(dir)) return [];
  return (fs.readdirSync(dir, { recursive: true }) as string[]).filter((p) => !fs.statSync(path.join(dir, p)).isDirectory()).sort();
}

/** Directory contents by name → bytes (base64), for a byte-for-byte comparison. */
export function dirBytes(dir: string): Record<string, string> {
  const out: Record<string, string> = {};
  for (const f of filesUnder(dir)) out[f] = fs.readFileSync(path.join(dir, f)).toString('base64');
  return out;
}
