// The pod lifecycle behind the CNI commands: ADD applies the pod network primitives and records them,
// DEL undoes exactly what was recorded, CHECK verifies it, GC removes attachments the runtime no longer has.
// Every method is idempotent; each logs one line per action naming the pod.
import { EventEmitter } from 'node:events';
import { isLabelKey, isLabelValue } from '../../lib/fields';
import { TetherError, ErrorCode } from '../../lib/errors';
import { holdLogs, type Logger } from '../../lib/log';
import type { CniParams } from '../../lib/api/protocol';
import { isOwnNetns, netnsExists } from '../sys/netns';
import { keyString, podKeyOf, type AttachmentKey, type PodRecord, type PodStore } from '../state/pod-store';
import {
  addedInterfaces,
  applyPodNetwork,
  checkPodNetwork,
  undoPodNetwork,
  validatePodNetConfig,
  type AppliedPodNetwork,
} from './pod-network';
import { RoleProblems } from './role-problems';
import { undoDsrTarget, type DsrTarget } from './dsr-target';

type Json = Record<string, unknown>;

interface CniInterface {
  name?: string;
  mac?: string;
  sandbox?: string;
}

/** Emits 'attached' and 'detached' with the PodRecord, so role controllers (egress…) follow pods. */
export class AttachService extends EventEmitter {
  /** Roles the controllers could not set up on attached pods (reported, retried by their owners). */
  readonly roleProblems = new RoleProblems();
  /** Attachments answered whose 'attached' is still to be told (right after the answer), by ADD number. */
  private readonly announcing = new Map<string, number>();
  private adds = 0;

  constructor(
    private readonly store: PodStore,
    private readonly logger: Logger,
    /** Where the host ends of the pods' veths are; default: tetherd's own namespace. Tests use another. */
    private readonly opts: { hostNetns?: string } = {},
  ) {
    super();
  }

  /** Every attached pod (for controllers starting up). */
  /**
   * Changes an attached pod's record (durably) through `change`; false when there is none any more (a DEL
   * came first): what the change records must then not be recorded.
   */
  updateRecord(k: AttachmentKey, change: (r: PodRecord) => PodRecord): boolean {
    const rec = this.store.get(k);
    if (!rec || rec.phase !== 'attached') return false;
    this.store.put(change(rec));
    return true;
  }

  pods(): PodRecord[] {
    return this.store.all().filter((r) => r.phase === 'attached');
  }

  add(p: CniParams): Json {
    const key = this.keyOf(p);
    const conf = p.config;
    const prev = conf.prevResult as Json | undefined;
    if (!prev) throw new TetherError(ErrorCode.InvalidConfig, 'prevResult: missing; tether must follow a primary plugin');
    requireField(p.netns, 'CNI_NETNS');
    const cfg = validatePodNetConfig(conf);
    const labels = validateLabels(conf.labels);
    const who = this.who(p, key);
    const t0 = process.hrtime.bigint();

    const existing = this.store.get(key);
    if (existing?.phase === 'attached' && existing.netns === p.netns) {
      // A repeated ADD for the same attachment answers the same result instead of stacking changes.
      this.logger.info('pod already attached; repeating result', who);
      return buildResult(prev, conf.cniVersion as string, addedInterfaces(existing.applied as AppliedPodNetwork));
    }
    if (existing) {
      // Undone first, then forgotten (durably): a failure below must not leave a record of what is gone.
      this.undoRecord(existing, who);
      this.store.remove(key);
    }
    // In the DaemonSet's container tetherd has no host PID namespace: a /proc/<pid> path names one of the
    // container's own processes, or none. A pod never lives in the node's namespace (hostNetwork pods get no
    // CNI call), so that is always a wrong path, and configuring it would change the node itself.
    const procHint = p.netns.startsWith('/proc/')
      ? ' (tetherd reaches pod namespaces through /run/netns, as containerd and CRI-O name them; a runtime that names them /proc/<pid>/ns/net needs tetherd run with hostPID and SYS_PTRACE)'
      : '';
    if (!netnsExists(p.netns)) {
      throw new TetherError(ErrorCode.NetnsGone, `network namespace ${p.netns} of container ${p.containerId} does not exist${procHint}`);
    }
    if (isOwnNetns(p.netns)) {
      throw new TetherError(ErrorCode.InvalidEnvironment, `CNI_NETNS ${p.netns} of container ${p.containerId} is the node's own network namespace, not a pod's: nothing done${procHint}`);
    }

    // One durable record, written once everything is applied and before the answer. No record of the
    // intent comes first: everything ADD changes lives in the pod's namespace or on its veth (the host end's
    // MTU), which go with the pod, and a tetherd killed mid-ADD never answered it, so the runtime sees the
    // ADD fail and tears the pod down (its DEL finds nothing recorded, and nothing is left to undo).
    // The lines of each change are written after the answer (holdLogs): they are no part of it.
    let applied: AppliedPodNetwork;
    try {
      applied = holdLogs(() => applyPodNetwork({ netns: p.netns, ifName: p.ifName, hostIfName: hostInterface(prev), hostNetns: this.opts.hostNetns }, cfg));
    } catch (e) {
      // After the held lines of what was done and undone, as everything else here.
      setImmediate(() => this.logger.warn('pod attach failed; nothing left applied', { ...who, error: (e as Error).message }));
      throw e;
    }
    const rec: PodRecord = {
      ...key,
      netns: p.netns,
      podNamespace: p.args.K8S_POD_NAMESPACE,
      podName: p.args.K8S_POD_NAME,
      ips: prevIps(prev),
      hostIfName: hostInterface(prev),
      labels,
      phase: 'attached',
      applied,
      config: stripPrevResult(conf),
      createdAt: new Date().toISOString(),
    };
    try {
      this.store.put(rec);
    } catch (e) {
      undoPodNetwork(applied);
      this.store.remove(key);
      throw new TetherError(ErrorCode.IoFailure, `cannot record attachment of ${keyString(key)}: ${(e as Error).message}`, { cause: e });
    }
    const durationMs = msSince(t0);
    // The line and the role controllers follow the answer: nothing they do is part of ADD's result. A DEL
    // that came first in between has removed the record, and then there is nothing to follow.
    const ks = keyString(key);
    const seq = ++this.adds;
    this.announcing.set(ks, seq);
    setImmediate(() => {
      this.logger.info('pod attached', { ...who, applied, durationMs });
      if (this.announcing.get(ks) !== seq) return; // a DEL, or a later ADD of the same attachment, came first
      this.announcing.delete(ks);
      const now = this.store.get(key);
      if (now?.phase === 'attached') this.emit('attached', now);
    });
    return buildResult(prev, conf.cniVersion as string, addedInterfaces(applied));
  }

  /**
   * Role controllers that must finish before a pod's network goes away (a gateway hands its floating
   * addresses over while it still forwards: make before break).
   */
  private readonly beforeDetach: Array<(rec: PodRecord) => Promise<void>> = [];

  onBeforeDetach(fn: (rec: PodRecord) => Promise<void>): void {
    this.beforeDetach.push(fn);
  }

  async del(p: CniParams): Promise<void> {
    const key = this.keyOf(p);
    const rec = this.store.get(key);
    const who = this.who(p, key);
    const t0 = process.hrtime.bigint();
    this.announcing.delete(keyString(key));
    if (!rec) {
      this.logger.info('pod detach: nothing recorded, nothing to undo', who);
      return;
    }
    // Roles first (a gateway hands its addresses over while its network still works), then the pod network.
    for (const fn of this.beforeDetach) {
      await fn(rec).catch((e) => this.logger.error('pod role teardown failed; detaching anyway', { ...who, error: (e as Error).message }));
    }
    this.emit('detached', rec);
    this.roleProblems.forget(podKeyOf(rec) ?? rec.containerId);
    // Read again: a role controller may have changed the record while the hooks ran (dsrTarget).
    this.undoRecord(this.store.get(key) ?? rec, who);
    this.store.remove(key);
    this.logger.info('pod detached', { ...who, durationMs: msSince(t0) });
  }

  check(p: CniParams): void {
    const key = this.keyOf(p);
    const rec = this.store.get(key);
    if (!rec || rec.phase !== 'attached') {
      throw new TetherError(ErrorCode.UnknownContainer, `container ${p.containerId} (${p.ifName}) is not attached to network ${key.network} by tether`);
    }
    if (!netnsExists(rec.netns)) {
      throw new TetherError(ErrorCode.CheckFailed, `network namespace ${rec.netns} of container ${p.containerId} is gone`);
    }
    checkPodNetwork(rec.applied as AppliedPodNetwork);
    this.logger.info('pod check passed', this.who(p, key));
  }

  /** CNI 1.1 GC: every attachment of this network not in cni.dev/valid-attachments is undone. */
  gc(p: CniParams): { removed: string[] } {
    const network = networkName(p.config);
    const validRaw = p.config['cni.dev/valid-attachments'] ?? [];
    if (!Array.isArray(validRaw)) throw new TetherError(ErrorCode.InvalidConfig, 'cni.dev/valid-attachments: must be an array');
    const valid = new Set<string>();
    validRaw.forEach((a, i) => {
      const att = a as Json;
      if (!att || typeof att.containerID !== 'string' || typeof att.ifname !== 'string') {
        throw new TetherError(ErrorCode.InvalidConfig, `cni.dev/valid-attachments[${i}]: needs string containerID and ifname`);
      }
      valid.add(keyString({ network, containerId: att.containerID, ifName: att.ifname }));
    });
    const removed: string[] = [];
    for (const rec of this.store.all()) {
      if (rec.network !== network || valid.has(keyString(rec))) continue;
      const who = { container: rec.containerId, ifName: rec.ifName, pod: podName(rec), network };
      this.announcing.delete(keyString(rec));
      this.emit('detached', rec);
      this.undoRecord(rec, who);
      this.store.remove(rec);
      removed.push(keyString(rec));
      this.logger.info('gc: stale attachment removed', who);
    }
    return { removed };
  }

  private undoRecord(rec: PodRecord, who: Json): void {
    // Newest first: the load balancer's target set-up sits on top of the pod network.
    if (rec.dsrTarget) undoDsrTarget(rec.dsrTarget as DsrTarget, who);
    if (rec.phase === 'attached' && rec.applied) {
      undoPodNetwork(rec.applied as AppliedPodNetwork);
    } else {
      // Killed mid-ADD: the runtime saw that ADD fail and is now tearing the pod down; its namespace and
      // veth go with it, so there is nothing left on the node that needs the half-made record.
      this.logger.warn('pod record was still applying (daemon stopped mid-ADD); dropping it', who);
    }
  }

  private keyOf(p: CniParams): AttachmentKey {
    requireField(p.containerId, 'CNI_CONTAINERID');
    requireField(p.ifName, 'CNI_IFNAME');
    return { network: networkName(p.config), containerId: p.containerId, ifName: p.ifName };
  }

  private who(p: CniParams, key: AttachmentKey): Json {
    const pod = p.args.K8S_POD_NAMESPACE && p.args.K8S_POD_NAME ? `${p.args.K8S_POD_NAMESPACE}/${p.args.K8S_POD_NAME}` : undefined;
    return { container: key.containerId, ifName: key.ifName, network: key.network, pod, netns: p.netns || undefined };
  }
}

function msSince(t0: bigint): number {
  return Math.round(Number(process.hrtime.bigint() - t0) / 1e4) / 100;
}

function requireField(v: unknown, name: string): void {
  if (typeof v !== 'string' || !v) throw new TetherError(ErrorCode.InvalidEnvironment, `${name} is missing`);
}

function networkName(conf: Json): string {
  if (typeof conf.name !== 'string' || !conf.name) throw new TetherError(ErrorCode.InvalidConfig, 'name: missing or not a string');
  return conf.name;
}

function podName(rec: PodRecord): string | undefined {
  return rec.podNamespace && rec.podName ? `${rec.podNamespace}/${rec.podName}` : undefined;
}

function stripPrevResult(conf: Json): Json {
  const { prevResult: _drop, ...rest } = conf;
  return rest;
}

/** The pod's addresses as the primary plugin reported them, without prefix length. */
function prevIps(prev: Json): string[] {
  const ips = Array.isArray(prev.ips) ? (prev.ips as Array<{ address?: unknown }>) : [];
  return ips.map((i) => (typeof i?.address === 'string' ? i.address.split('/')[0] : '')).filter(Boolean);
}

function validateLabels(raw: unknown): Record<string, string> | undefined {
  if (raw === undefined) return undefined;
  if (!raw || typeof raw !== 'object' || Array.isArray(raw)) throw new TetherError(ErrorCode.InvalidConfig, 'labels: must map label names to values');
  for (const [k, v] of Object.entries(raw)) {
    if (!isLabelKey(k)) throw new TetherError(ErrorCode.InvalidConfig, `labels: ${JSON.stringify(k)} is not a valid label name`);
    if (typeof v !== 'string' || !isLabelValue(v)) throw new TetherError(ErrorCode.InvalidConfig, `labels.${k}: ${JSON.stringify(v)} is not a valid label value`);
  }
  return raw as Record<string, string>;
}

/** The host side of the pod's link: the primary plugin lists it in prevResult without a sandbox. */
function hostInterface(prev: Json): string | undefined {
  const ifs = Array.isArray(prev.interfaces) ? (prev.interfaces as CniInterface[]) : [];
  return ifs.find((i) => i && typeof i.name === 'string' && !i.sandbox)?.name;
}

/** prevResult passed on unchanged, plus the interfaces tether created, in the config's version. */
export function buildResult(prev: Json, cniVersion: string, added: Array<{ name: string; mac?: string; sandbox: string }>): Json {
  const out: Json = { ...prev, cniVersion };
  if (added.length) {
    const ifs = Array.isArray(prev.interfaces) ? [...(prev.interfaces as CniInterface[])] : [];
    for (const a of added) if (!ifs.some((i) => i.name === a.name && i.sandbox === a.sandbox)) ifs.push(a);
    out.interfaces = ifs;
  }
  return out;
}
