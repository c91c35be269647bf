// Samples, every 100 ms, which floating addresses every node really holds, from the kernel (not from
// tetherd's status): the address on a gateway pod (its lo), the pod's SNAT rule naming it, and the node's
// announcement (a proxy ARP entry on the uplink while the node routes the address to a pod's veth, which is
// when the kernel answers for it). With an IPv6 floating pool (a testbed with IPv6) the same in IPv6: the
// IPv6 address on the pod's lo, the SNAT rules of its `ip6 tether_egress` table, and a proxy NDP entry on
// the uplink while a /128 route sends the address to the pod. A sample in which one floating address is held
// on two nodes is a violation, recorded with the address, the nodes, what each holds and the time.
//
// Cheap on a 2-core machine: netlink from the test process (one socket per node namespace, kept open; a
// gateway pod's namespace is entered per sample and never held, so deleting it really removes it), and one
// long-lived `nft monitor` per gateway pod for its SNAT rules of both tables (stopped before a test deletes
// the pod: a process inside a namespace keeps it alive). What the text says is read by
// floating-kernel-view.ts (unit-tested without a testbed).
import type { ChildProcess } from 'node:child_process';
import { NetlinkHandle } from '../../daemon/netlink';
import { canonicalIp } from '../../lib/ip';
import type { IpFamily } from '../../lib/ip';
import type { Testbed } from './testbed';
import { NftSnatRules, announcedOnUplink, poolFamily, type FloatingPools } from './floating-kernel-view';

/** What one node holds of the floating pool in one sample. */
export interface NodeHold {
  /** On one of its gateway pods (lo). */
  onPod: string[];
  /** Named by a gateway pod's SNAT rule. */
  snat: string[];
  /** Answered for on the uplink (proxy ARP entry and a route to a pod's veth). */
  announced: string[];
}

export interface Violation {
  address: string;
  nodes: string[];
  /** First and last sample that showed it, and how many did. */
  from: number;
  to: number;
  samples: number;
  detail: string;
}

interface NftWatch {
  child: ChildProcess;
  /** The SNAT rules of the pod's tether_egress tables (both families). */
  rules: NftSnatRules;
}

export class FloatingSampler {
  private timer?: NodeJS.Timeout;
  private readonly handles = new Map<string, { h: NetlinkHandle; uplink: number }>();
  private readonly gateways = new Map<string, { node: string; nsPath: string; nft?: NftWatch }>();
  private readonly lost = new Set<string>();
  private readonly open = new Map<string, Violation>();
  readonly violations: Violation[] = [];
  /** address → node → times (sample instants) it was held there; kept per window. */
  private history: Array<{ at: number; holders: Map<string, string[]> }> = [];
  private lastAt = 0;
  /** What each node held in the latest sample. */
  lastPerNode = new Map<string, NodeHold>();
  samples = 0;
  /** Longest time between two samples (the test process's own stalls show here). */
  maxIntervalMs = 0;
  sampleMsMax = 0;

  /** The pools sampled: the IPv4 floating pool, and the IPv6 one when given. */
  private readonly pools: FloatingPools;
  /** The families sampled. */
  readonly families: IpFamily[];

  /** pool6: the IPv6 floating pool, sampled too (give it when the testbed has IPv6). */
  constructor(
    private readonly tb: Testbed,
    pool: string,
    private readonly nodes: string[],
    private readonly intervalMs = 100,
    pool6?: string,
  ) {
    this.pools = { 4: pool, ...(pool6 ? { 6: pool6 } : {}) };
    this.families = pool6 ? [4, 6] : [4];
  }

  /** Whether the sampler reads the kernel's state of this address (it is in a sampled pool). */
  covers(address: string): boolean {
    return poolFamily(address, this.pools) !== undefined;
  }

  start(): void {
    for (const n of this.nodes) {
      const h = NetlinkHandle.open(this.tb.nsPath(n));
      this.handles.set(n, { h, uplink: h.requireLink('eth0').index });
    }
    this.timer = setInterval(() => this.sample(), this.intervalMs);
  }

  async stop(): Promise<void> {
    if (this.timer) clearInterval(this.timer);
    this.timer = undefined;
    for (const { h } of this.handles.values()) h.close();
    this.handles.clear();
    await Promise.all([...this.gateways.keys()].map((k) => this.dropGateway(k)));
    this.closeOpen();
  }

  /** Starts watching a gateway pod (its lo addresses per sample, its SNAT rules through nft monitor). */
  async addGateway(podKey: string): Promise<void> {
    const pod = this.tb.pod(podKey);
    const g: { node: string; nsPath: string; nft?: NftWatch } = { node: pod.node, nsPath: pod.nsPath };
    this.gateways.set(podKey, g);
    g.nft = await this.watchNft(podKey);
  }

  /** Stops watching a gateway pod; call before deleting its namespace. */
  async dropGateway(podKey: string): Promise<void> {
    const g = this.gateways.get(podKey);
    this.gateways.delete(podKey);
    const child = g?.nft?.child;
    if (!child || child.exitCode !== null || child.signalCode !== null) return;
    const exited = new Promise<void>((r) => child.once('exit', () => r()));
    // SIGTERM: the shell's trap ends nft monitor too (a surviving nft would keep the pod's namespace alive).
    child.kill('SIGTERM');
    const timer = setTimeout(() => child.kill('SIGKILL'), 2000);
    await exited;
    clearTimeout(timer);
  }

  /** The node is lost (cut off from everything): what it still holds in its kernel no longer counts. */
  loseNode(node: string): void {
    this.lost.add(node);
    this.handles.get(node)?.h.close();
    this.handles.delete(node);
  }

  /** Every node seen holding each address since `t` (ms epoch). */
  holdersSince(t: number): Map<string, Set<string>> {
    const out = new Map<string, Set<string>>();
    for (const s of this.history) {
      if (s.at < t) continue;
      for (const [a, nodes] of s.holders) for (const n of nodes) out.set(a, (out.get(a) ?? new Set()).add(n));
    }
    return out;
  }

  /** The first instant at or after `t` at which `address` was held on a node other than `not`. */
  firstHeldElsewhere(address: string, not: string, t: number): { at: number; node: string } | undefined {
    for (const s of this.history) {
      if (s.at < t) continue;
      const n = s.holders.get(address)?.find((x) => x !== not);
      if (n) return { at: s.at, node: n };
    }
    return undefined;
  }

  /** What a node holds of an address in the latest sample, in words. */
  describe(node: string, address: string): string {
    const v = this.lastPerNode.get(node);
    return v ? [v.onPod.includes(address) && 'on its pod', v.snat.includes(address) && 'SNAT', v.announced.includes(address) && 'announced'].filter(Boolean).join(', ') : 'nothing';
  }

  /** Holders per address in the latest sample. */
  latest(): Map<string, string[]> {
    return this.history[this.history.length - 1]?.holders ?? new Map();
  }

  /** Violations seen since `t` (still open ones included). */
  violationsSince(t: number): Violation[] {
    return [...this.violations, ...this.open.values()].filter((v) => v.to >= t);
  }

  /** Forgets history before `t` (a new cell). */
  trim(t: number): void {
    this.history = this.history.filter((s) => s.at >= t);
  }

  /** One sample now (also used to get a fresh view before a check). */
  sample(): void {
    const t0 = Date.now();
    if (this.lastAt) this.maxIntervalMs = Math.max(this.maxIntervalMs, t0 - this.lastAt);
    this.lastAt = t0;
    const per = new Map<string, NodeHold>();
    const view = (n: string) => {
      let v = per.get(n);
      if (!v) per.set(n, (v = { onPod: [], snat: [], announced: [] }));
      return v;
    };
    for (const [node, { h, uplink }] of this.handles) {
      for (const family of this.families) {
        try {
          const proxied = h.listNeighbours({ family, proxy: true });
          if (!proxied.some((x) => x.index === uplink)) continue;
          // The kernel answers for a proxy entry only while it routes the address through another link.
          view(node).announced.push(...announcedOnUplink(family, proxied, h.listRoutes({ family, table: 254 }), uplink, this.pools));
        } catch {
          // a node namespace being torn down: nothing to count
        }
      }
    }
    for (const g of this.gateways.values()) {
      if (this.lost.has(g.node)) continue;
      try {
        const on = NetlinkHandle.with(g.nsPath, (h) => this.families.flatMap((family) => h.listAddresses({ family, index: 1 })));
        view(g.node).onPod.push(...on.map((a) => a.address).filter((a) => this.covers(a)).map(canonicalIp));
      } catch {
        // the pod's namespace is gone
      }
      view(g.node).snat.push(...(g.nft?.rules.addresses() ?? []));
    }
    const holders = new Map<string, string[]>();
    for (const [node, v] of per) {
      for (const a of new Set([...v.onPod, ...v.snat, ...v.announced])) holders.set(a, [...(holders.get(a) ?? []), node]);
    }
    this.history.push({ at: t0, holders });
    this.lastPerNode = per;
    this.samples++;
    const seen = new Set<string>();
    for (const [a, nodes] of holders) {
      if (nodes.length < 2) continue;
      const key = `${a}|${[...nodes].sort().join('+')}`;
      seen.add(key);
      const cur = this.open.get(key);
      if (cur) {
        cur.to = t0;
        cur.samples++;
        continue;
      }
      const detail = nodes.map((n) => {
        const v = per.get(n)!;
        const what = [v.onPod.includes(a) && 'on its pod', v.snat.includes(a) && 'SNAT', v.announced.includes(a) && 'announced'].filter(Boolean).join(', ');
        return `${n} (${what})`;
      }).join(' and ');
      this.open.set(key, { address: a, nodes: [...nodes].sort(), from: t0, to: t0, samples: 1, detail });
    }
    for (const [key, v] of this.open) {
      if (seen.has(key)) continue;
      this.open.delete(key);
      this.violations.push(v);
    }
    this.sampleMsMax = Math.max(this.sampleMsMax, Date.now() - t0);
  }

  private closeOpen(): void {
    for (const v of this.open.values()) this.violations.push(v);
    this.open.clear();
  }

  /**
   * `nft monitor` in the pod, then one listing of its tables (both with rule handles): the listing gives the
   * rules that existed before, the monitor every change after (a rule seen twice is the same handle). The
   * IPv6 table is listed only when the IPv6 pool is sampled (a pod without it has none: the listing fails, quietly).
   */
  private async watchNft(podKey: string): Promise<NftWatch> {
    const list = this.families.map((f) => `nft -a list table ${f === 4 ? 'ip' : 'ip6'} tether_egress 2>/dev/null`).join('; ');
    const script = `nft -a monitor & m=$!; trap 'kill $m; exit 0' TERM; sleep 0.3; echo __LIST__; ${list}; echo __LISTED__; wait $m`;
    const child = this.tb.spawn(podKey, ['sh', '-c', script]);
    const w: NftWatch = { child, rules: new NftSnatRules(this.pools) };
    let buf = '';
    let listed: () => void = () => undefined;
    const done = new Promise<void>((r) => (listed = r));
    child.stdout?.on('data', (b: Buffer) => {
      buf += b.toString();
      let nl: number;
      while ((nl = buf.indexOf('\n')) >= 0) {
        const line = buf.slice(0, nl);
        buf = buf.slice(nl + 1);
        if (line === '__LISTED__') listed();
        w.rules.line(line);
      }
    });
    child.once('exit', () => listed());
    await Promise.race([done, new Promise((r) => setTimeout(r, 5000))]);
    return w;
  }
}
