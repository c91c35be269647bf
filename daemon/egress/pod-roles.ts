// Pod roles for the Egress controller: a local pod becomes a gateway (prepared datapath, registered) or a
// client (steered in eBPF to the current owners) as its labels and the Egresses say, and stops being one.
import * as fs from 'node:fs';
import { podKeyOf as podKey, type PodRecord } from '../state/pod-store';
import { canonicalIp, ipFamily } from '../../lib/ip';
import { attachEgressSteer } from '../bpf/egress-steer';
import { type ResolvedEgress } from './egress-spec';
import { GatewayDatapath } from './gateway-datapath';
import { type GatewayInfo } from './ownership-store';
import { type EgressShared, streamOf, selects, draining, type LocalGateway, type ClientPod, DRAIN_MS, HANDOVER_WAIT_MS } from './egress-state';
import type { Election } from './election';
import type { ConntrackStreams } from './conntrack-streams';
import type { StoreRecords } from './store-records';
import type { ClientSteering } from './client-steering';

export class PodRoles {
  /** A gateway pod leaving hands over through the election; its sync streams stop, the store's registrations follow. */
  constructor(
    private readonly s: EgressShared,
    private readonly election: Election,
    private readonly streams: ConntrackStreams,
    private readonly store: StoreRecords,
    private readonly steering: ClientSteering,
  ) {}

  watcher?: fs.FSWatcher;

  async podUp(r: PodRecord): Promise<void> {
    const pod = podKey(r) ?? r.containerId;
    try {
      await this.podRoles(r);
      this.s.o.attach.roleProblems.ok(pod, 'egress');
    } catch (e) {
      // One pod that cannot take its role (gone meanwhile, broken namespace) must not stop the others; it is
      // reported (status, /readyz) until a later pass sets it up.
      if (this.s.o.attach.roleProblems.failed(pod, 'egress', (e as Error).message)) {
        this.s.o.logger.error('egress: pod role setup failed', { pod, error: (e as Error).message });
      }
    }
  }

  /** Pods whose egress role failed are tried again (a transient netlink or sysctl error heals itself). */
  async retryFailedRoles(): Promise<void> {
    const failed = new Set(this.s.o.attach.roleProblems.list().filter((p) => p.role === 'egress').map((p) => p.pod));
    if (failed.size === 0) return;
    for (const r of this.s.o.attach.pods()) if (failed.has(podKey(r) ?? r.containerId) && fs.existsSync(r.netns)) await this.podUp(r);
  }

  /**
   * Makes a pod's roles what its labels and the Egresses say now, in both directions: a pod that became a
   * client is steered, one that stopped being one is not; a gateway that left an Egress hands its
   * addresses over first (make-before-break). Nothing is re-attached.
   */
  private async podRoles(r: PodRecord): Promise<void> {
    const pod = podKey(r);
    const ip = r.ips?.find((i) => !i.includes(':'));
    const v6 = r.ips?.find((i) => i.includes(':'));
    const ip6 = v6 ? canonicalIp(v6) : undefined;
    // An IPv6-only pod (no IPv4 address) takes both roles by its IPv6 address alone.
    if (!pod || (!ip && !ip6) || !r.hostIfName) return;
    const meta = this.s.podMeta.get(pod);
    const labels = meta?.labels ?? r.labels ?? {};
    // A gateway serves only while ready and not terminating: a terminating one hands over before its DEL.
    const serving = meta?.ready !== false && !meta?.deleting;
    const gwOf = serving ? [...this.s.egresses.values()].filter((e) => selects(e, 'gateways', r.podNamespace!, labels)) : [];
    const clientOf = [...this.s.egresses.values()].filter((e) => selects(e, 'clients', r.podNamespace!, labels));
    await this.gatewayRole(r, pod, ip, ip6, gwOf);
    this.clientRole(r, pod, ip, ip6, clientOf);
    await this.election.tick();
  }

  private async gatewayRole(r: PodRecord, pod: string, ip: string | undefined, ip6: string | undefined, gwOf: ResolvedEgress[]): Promise<void> {
    const cur = this.s.gateways.get(pod);
    const keys = new Set(gwOf.map((e) => e.key));
    const guarded = { destinations: [...new Set(gwOf.flatMap((e) => e.destinations))], excluded: [...new Set(gwOf.flatMap((e) => e.excluded))] };
    if (!gwOf.length) {
      // Not awaited: a handover may wait for a standby to come in sync, and pod roles must not (the DEL
      // that follows waits for it: podDown).
      if (cur) void this.gatewayDown(pod, cur, 'pod no longer selected as a gateway', DRAIN_MS);
      return;
    }
    if (cur) {
      const before = [...cur.egresses].sort().join();
      const left = [...cur.egresses].filter((k) => !keys.has(k));
      for (const st of this.s.addresses.values()) {
        if (st.holder !== cur || !left.includes(st.egress.key)) continue;
        await this.s.mutex.run(streamOf(st), async () => {
          this.election.handOver(st, pod, draining(`handover: ${pod} no longer a gateway of ${st.egress.key}`));
          cur.datapath.withdrawAnnouncement(st.address);
          void this.streams.stopStreaming(st);
        });
        // Packets clients sent before they learned the new owner still leave NATed: release after a drain.
        const release = async () => {
          if (st.holder !== cur) await cur.datapath.release(st.address, st.egress.announce);
        };
        setTimeout(() => this.s.spawn(release), DRAIN_MS).unref();
      }
      cur.egresses = keys;
      // Rules are replaced in place (owned addresses keep their SNAT): the guard follows new destinations.
      if (JSON.stringify(guarded) !== cur.guarded) {
        cur.datapath.prepare(this.s.nodes, guarded);
        cur.guarded = JSON.stringify(guarded);
      }
      if ([...keys].sort().join() !== before) {
        this.s.o.logger.info('egress: gateway pod roles changed', { pod, egresses: [...keys] });
        this.s.spawn(() => this.store.register().catch((e) => this.s.storeFailed(e)));
      }
      return;
    }
    // The address clients steer to (registry, ownership records): IPv4 when the pod has one and the node
    // underlay is IPv4, else IPv6 (clients then reach it in outer IPv6).
    const podIp = ip && ipFamily(this.s.o.node.address) === 4 ? ip : ip6 ?? ip!;
    const info: GatewayInfo = {
      pod, node: this.s.o.node.name, nodeAddress: this.s.o.node.address, podIp, zone: this.s.o.node.zone,
      ...(this.s.o.node.maxEgressAddresses !== undefined ? { maxAddresses: this.s.o.node.maxEgressAddresses } : {}),
    };
    const datapath = new GatewayDatapath({ pod, netns: r.netns, ...(ip ? { podIp: ip } : {}), ...(ip6 ? { podIp6: ip6 } : {}), ifName: r.ifName, hostIfName: r.hostIfName! }, { uplink: this.s.o.node.uplink, fouPort: this.s.o.fouPort, pinDir: this.s.o.pinDir });
    datapath.prepare(this.s.nodes, guarded);
    this.s.gateways.set(pod, { info, datapath, egresses: keys, netns: r.netns, guarded: JSON.stringify(guarded) });
    // Owners already streaming to this node sent their tables before this pod existed, and events bring
    // only what changes: without a fresh resync the pod would lack every established flow and still
    // count as in sync (sync is per node). A resync in progress takes the node out of the owner's
    // in-sync set until it is applied to this pod too.
    const resyncs = this.s.receiver?.requestResync((stream) => keys.has(stream.split('|')[0])) ?? 0;
    this.s.o.logger.info('egress: gateway pod ready', { pod, egresses: [...keys], resyncsRequested: resyncs });
    // The registry is told in the background: a store that hangs must not hold a pod's set-up.
    this.s.spawn(() => this.store.register().catch((e) => this.s.storeFailed(e)));
  }

  private clientRole(r: PodRecord, pod: string, ip: string | undefined, ip6: string | undefined, clientOf: ResolvedEgress[]): void {
    const cur = this.s.clients.get(pod);
    const egressIds = clientOf.map((e) => this.s.egressIds.get(e.key)!).sort((a, b) => a - b);
    if (!egressIds.length) {
      if (cur) {
        this.clientDown(pod, cur);
        this.s.o.logger.info('egress: client pod no longer steered', { pod });
      }
      return;
    }
    // A dual-stack pod is a client by both its addresses: each family's packets carry their own source.
    if (cur) {
      if (cur.egressIds.join() === egressIds.join()) return;
      if (ip) cur.steer?.setClient(ip, egressIds);
      if (ip6) cur.steer?.setClient(ip6, egressIds);
      cur.egressIds = egressIds;
    } else {
      const steer = attachEgressSteer({
        ifName: r.hostIfName!, pinDir: this.s.o.pinDir, nodeAddress: this.s.o.node.address, port: this.s.o.fouPort,
        ...(this.s.o.node.address6 ? { nodeAddress6: this.s.o.node.address6 } : {}),
      });
      if (ip) steer.setClient(ip, egressIds);
      if (ip6) steer.setClient(ip6, egressIds);
      this.s.clients.set(pod, { ...(ip ? { ip } : {}), ...(ip6 ? { ip6 } : {}), hostIfName: r.hostIfName!, egressIds, steer });
    }
    for (const e of clientOf) this.steering.steered.delete(e.key);
    this.s.o.logger.info('egress: client pod steered', { pod, egresses: clientOf.map((e) => e.key) });
  }

  clientDown(pod: string, client: ClientPod): void {
    if (client.ip) this.s.maps?.removeClient(client.ip);
    if (client.ip6) this.s.maps?.removeClient(client.ip6);
    try {
      client.steer?.detach();
    } catch {
      // the veth went with the pod
    }
    this.s.clients.delete(pod);
  }

  async podDown(r: PodRecord, cause: string, drainMs = 0): Promise<void> {
    const pod = podKey(r);
    if (!pod) return;
    const client = this.s.clients.get(pod);
    if (client) this.clientDown(pod, client);
    const gw = this.s.gateways.get(pod);
    if (gw) await this.gatewayDown(pod, gw, cause, drainMs);
    // A gateway already leaving (it stopped being one: terminating, unready) hands over first: its network
    // must stay until then.
    else await this.leaving.get(pod);
  }

  /** Gateway pods handing their addresses over, until done (podDown waits for them). */
  private readonly leaving = new Map<string, Promise<void>>();

  private gatewayDown(pod: string, gw: LocalGateway, cause: string, drainMs = 0): Promise<void> {
    if (this.s.gateways.get(pod) !== gw) return Promise.resolve();
    this.s.gateways.delete(pod);
    // Not tracked as work: a stop joins the handovers under way itself (Election.handOverWhenInSync).
    const done = this.handOff(pod, gw, cause, drainMs).catch((e) => {
      this.s.o.logger.error('egress: gateway handover failed', { pod, error: (e as Error).message, stack: (e as Error).stack });
    }).finally(() => {
      if (this.leaving.get(pod) === done) this.leaving.delete(pod);
    });
    this.leaving.set(pod, done);
    return done;
  }

  private async handOff(pod: string, gw: LocalGateway, cause: string, drainMs: number): Promise<void> {
    // Hand every address it held to the next live candidate instead of waiting for detection. Before the
    // pod's network goes (a DEL: drainMs), it still forwards: with no standby in sync, it keeps the address
    // until one is (handOverWhenInSync). A namespace already gone took its connections with it: at once.
    const until = Date.now() + (drainMs ? this.s.o.handoverWaitMs ?? HANDOVER_WAIT_MS : 0);
    const held = [...this.s.addresses.values()].filter((st) => st.holder === gw);
    await Promise.all(held.map(async (st) => {
      // A pod already gone forwards nothing: its node stops attracting the address's traffic before the
      // handover is decided, so it no longer announces the address when the new owner does (their
      // announcements overlapped for a few ms once the new owner took addresses faster).
      if (!drainMs) {
        await this.s.mutex.run(streamOf(st), async () => {
          if (st.holder === gw) gw.datapath.withdrawAnnouncement(st.address);
        });
      }
      await this.election.handOverWhenInSync(st, pod, drainMs ? draining(`handover: ${cause} (${pod})`) : `handover: ${cause} (${pod})`, { until });
      await this.s.mutex.run(streamOf(st), async () => {
        if (st.holder === gw) return;
        gw.datapath.withdrawAnnouncement(st.address);
        // Closing the event reader waits out its receive timeout: not on the handover's critical path.
        void this.streams.stopStreaming(st);
      });
    }));
    this.s.spawn(() => this.store.register().catch((e) => this.s.storeFailed(e)));
    if (drainMs) await new Promise((res) => setTimeout(res, drainMs));
    try {
      gw.datapath.teardown();
    } catch (e) {
      this.s.o.logger.debug('egress: gateway teardown after the pod left', { pod, error: (e as Error).message });
    }
  }

  /** A gateway pod whose namespace vanishes without a DEL (killed) is noticed at once, not at GC time. */
  watchNetns(): void {
    try {
      this.watcher = fs.watch('/run/netns', () => this.s.spawn(() => this.dropVanishedGateways()));
    } catch {
      // no inotify on this path: the tick checks too
    }
  }

  async dropVanishedGateways(): Promise<void> {
    for (const [pod, gw] of [...this.s.gateways]) {
      if (fs.existsSync(gw.netns)) continue;
      this.s.o.logger.warn('egress: gateway pod namespace disappeared', { pod, netns: gw.netns });
      const [podNamespace, podName] = pod.split('/');
      await this.podDown({ podNamespace, podName } as PodRecord, 'gateway pod namespace gone');
    }
  }
}
