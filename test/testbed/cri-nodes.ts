// Testbed nodes whose pods come from containerd's CRI, as kubelet makes them (UpOptions.runtime 'cri'):
// each node runs its own containerd inside the node's network namespace (so the CNI plugins it executes,
// the host ends of the pods' veths and the pods' routes belong to that node), loading the node's own CNI
// directory, where the primary conflist (what Testbed.conflist builds for the node, minus per-pod
// fields) is chained by the real `tether-install install`. Pods are RunPodSandbox'ed with their name,
// namespace and labels; what kubelet's runtime cannot pass per pod (labels, vips, encapOverhead) comes
// from where a cluster gets it: labels from Pod objects, node-wide fields from the node's conflist entry.
// Each sandbox's netns is also bind-mounted at the testbed's usual /run/netns/<prefix>-<pod key>.
import { spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { Containerd } from '../lib/cri/containerd';
import { sandboxNetns } from '../lib/cri/client';
import type { Conflist } from './cni-chain';
import { mustRun, run } from './proc';

export interface CriNodeSetup {
  node: string;
  /** The node's working directory (containerd's dir, the CNI bin/conf dirs and the installer's state go below). */
  dir: string;
  /** The node's network namespace path: containerd runs in it. */
  nsPath: string;
  /** The primary conflist (ptp with its IPAM), written as a network add-on would. */
  primary: Conflist;
  /** tether's conflist entry (node-wide fields only); without it tether is not installed. */
  tetherEntry?: Record<string, unknown>;
  /** Where the reference plugins (ptp, host-local, loopback) and tether's executables come from. */
  systemCniDir: string;
  tetherBinDir: string;
}

export interface CriSandbox {
  id: string;
  /** The address containerd reports for the sandbox (its CNI result's first). */
  ip: string;
  /** The netns containerd made for the sandbox (/var/run/netns/cni-…). */
  criNetns: string;
  /** The testbed's alias of it (/run/netns/<prefix>-<pod key>), a bind mount. */
  alias: string;
  /** Wall time of RunPodSandbox (the CNI ADD runs inside it). */
  ms: number;
}

export class CriNode {
  readonly containerd: Containerd;
  readonly binDir: string;
  readonly confDir: string;
  private readonly aliases = new Set<string>();

  constructor(readonly setup: CriNodeSetup) {
    this.binDir = path.join(setup.dir, 'cni-bin');
    this.confDir = path.join(setup.dir, 'net.d');
    this.containerd = new Containerd({ dir: path.join(setup.dir, 'containerd'), cniBinDir: this.binDir, cniConfDir: this.confDir, netns: setup.nsPath });
  }

  /** Writes the node's CNI directories (the installer chains tether) and starts its containerd. */
  async start(): Promise<void> {
    this.writeCni();
    await this.containerd.start();
  }

  private writeCni(): void {
    const { setup } = this;
    for (const d of [this.binDir, this.confDir]) fs.mkdirSync(d, { recursive: true });
    // containerd's CRI runs `loopback` for every sandbox's lo from the same bin_dir.
    for (const p of ['ptp', 'host-local', 'loopback']) {
      const to = path.join(this.binDir, p);
      if (!fs.existsSync(to)) fs.symlinkSync(path.join(setup.systemCniDir, p), to);
    }
    fs.writeFileSync(path.join(this.confDir, '10-ptp.conflist'), JSON.stringify(setup.primary, null, 2));
    if (!setup.tetherEntry) return;
    const entry = path.join(setup.dir, 'tether-entry.json');
    fs.writeFileSync(entry, JSON.stringify(setup.tetherEntry));
    const argv = [
      'install', '--src-bin-dir', setup.tetherBinDir, '--bin-dir', this.binDir, '--net-dir', this.confDir,
      '--state-dir', path.join(setup.dir, 'cni-install'), '--entry-file', entry,
    ];
    const r = spawnSync(path.join(setup.tetherBinDir, 'tether-install'), argv, { encoding: 'utf8', timeout: 60_000 });
    if (r.status !== 0) throw new Error(`${setup.node}: tether-install install failed (${r.status}): ${r.stderr}`);
  }

  /** The conflist containerd loads (the first file of the conf dir, as max_conf_num = 1 makes it). */
  loadedConflist(): Record<string, unknown> {
    const first = fs.readdirSync(this.confDir).filter((f) => /\.(conflist|conf|json)$/.test(f)).sort()[0];
    return JSON.parse(fs.readFileSync(path.join(this.confDir, first), 'utf8')) as Record<string, unknown>;
  }

  /** RunPodSandbox as kubelet does, then the sandbox's netns bind-mounted at `alias`. */
  async runPod(o: { name: string; namespace: string; labels: Record<string, string> }, alias: string): Promise<CriSandbox> {
    const t0 = Date.now();
    const { id, ip, netns } = await this.containerd.runPod({ name: o.name, namespace: o.namespace, labels: o.labels });
    const ms = Date.now() - t0;
    if (!netns) throw new Error(`${this.setup.node}: sandbox ${id} of ${o.namespace}/${o.name} reports no netns`);
    fs.writeFileSync(alias, '');
    this.aliases.add(alias);
    await mustRun(['mount', '--bind', netns, alias]);
    return { id, ip, criNetns: netns, alias, ms };
  }

  /** StopPodSandbox (CNI DEL runs inside) and RemovePodSandbox, as kubelet does when a pod is deleted. */
  async removePod(sb: CriSandbox): Promise<void> {
    await this.containerd.client.stopPodSandbox(sb.id);
    await this.dropAlias(sb.alias);
    await this.containerd.client.removePodSandbox(sb.id);
  }

  /** The sandbox's pause process (from containerd's verbose status). */
  async pausePid(id: string): Promise<number> {
    const st = await this.containerd.client.podSandboxStatus(id, true);
    const pid = (JSON.parse(st.info?.info ?? '{}') as { pid?: number }).pid;
    if (!pid) throw new Error(`${this.setup.node}: sandbox ${id} reports no pid`);
    return pid;
  }

  /** The netns path containerd reports for a sandbox now. */
  async sandboxNetns(id: string): Promise<string | undefined> {
    return sandboxNetns(await this.containerd.client.podSandboxStatus(id, true));
  }

  async dropAlias(alias: string): Promise<void> {
    if (!this.aliases.has(alias)) return;
    await run(['umount', '-l', alias]);
    fs.rmSync(alias, { force: true });
    this.aliases.delete(alias);
  }

  /** Removes every sandbox through CRI (CNI DEL runs), containerd and all it left; then the aliases. */
  async destroy(): Promise<string[]> {
    const problems = (await this.containerd.destroy()).map((p) => `${this.setup.node}: ${p}`);
    for (const a of [...this.aliases]) await this.dropAlias(a);
    return problems;
  }
}
