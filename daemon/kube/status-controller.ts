// The cluster's controllers, run by tether-operator's leader only (leader.ts, operator/controllers.ts): status of AddressPools (Ready, or why a
// pool is refused: invalid, overlapping) and of Egresses (each address with its owner node, pod and epoch;
// the counts kubectl's columns show: wanted, allocated, held, nodes; Ready when every address has an owner,
// or why the Egress is refused), and garbage collection of the block claims of nodes that no longer exist.
// Status is written through the status subresource with the resourceVersion read (a 409 is retried on the
// next pass), and only when it changed, so conditions keep their lastTransitionTime. Services, AddressPools and Egresses are read from the leader's own watch cache
// (services, addressPools and egresses options), not with a GET each per pass: a pass over unchanged
// objects sends the API server nothing (an AddressPool or Egress the cache has no copy of is read with a
// GET). A status written is remembered over the version it was written on until the watch brings it
// back, so it is neither written again nor compared against the stale cached one meanwhile.
import * as k8s from '@kubernetes/client-node';
import type { Logger } from '../../lib/log';
import { GROUP, VERSION } from '../objects/crds';
import type { Verdicts } from '../config/kube-source';
import { NODE_LABEL } from './block-claims';
import { objectKey } from '../config/objects';
import type { NodeHealthReport } from '../health/health-controller';
import { ReconcileLoop } from '../util/reconcile-loop';
import type { TetherEvent } from './event-recorder';
import { refusalEvents } from './tether-events';
import { mergeConditions, type Condition } from './conditions';

type Obj = Record<string, any>;

export interface EgressAddressStatus {
  egress: string;
  address: string;
  owner: string;
  ownerNode?: string;
  ownerZone?: string;
  epoch: number;
  /** Flows pinned to it and bytes steered to it by every node's clients (as reported to the store). */
  flows?: number;
  bytes?: number;
}

/** What the egress controller says of one Egress as a whole (EgressController.egressSummary). */
export interface EgressSummary {
  asked: number;
  allocated: number;
  owned: number;
  ownerNodes: number;
  shortfall?: string;
  capLimited: boolean;
  zoneProblem?: string;
}

export interface StatusControllerOptions {
  kc: k8s.KubeConfig;
  logger: Logger;
  verdicts: () => Verdicts;
  /**
   * Objects the schema accepts but their subsystem refuses (an Egress over an unknown pool), keyed like
   * objectKey ("Egress ns/name"), with the reasons (one per line).
   */
  refused?: () => Record<string, string>;
  /** Every floating address this node knows of, with its owner (the egress controller's view). */
  egressAddresses: () => EgressAddressStatus[];
  /** Per Egress ("ns/name"): addresses asked, allocated and owned, and what limits them. */
  egressSummary?: () => Record<string, EgressSummary>;
  /** The load balancer's view of each tether Service (LbController.status()). */
  loadBalancers?: () => Array<Record<string, unknown>>;
  /**
   * The tether Services as this node's watch holds them (with status and resourceVersion), by
   * "namespace/name": read instead of a GET per Service per pass. Without it each Service is read (GET).
   */
  services?: () => Map<string, Obj>;
  /** The AddressPools as this node's watch holds them, by name: read instead of a GET per pool per pass. */
  addressPools?: () => Map<string, Obj>;
  /** The Egresses as this node's watch holds them, by "namespace/name": read instead of a GET per Egress per pass. */
  egresses?: () => Map<string, Obj>;
  /** Every node's health-check answers (from the store), for the Local Services' status. */
  healthReports?: () => Promise<Record<string, NodeHealthReport>>;
  /** Run before each pass (the operator reads the store's view of the egress addresses and VIPs here). */
  refresh?: () => Promise<void>;
  everyMs?: number;
  gcEveryMs?: number;
  /** Records an Event (a refusal or an address conflict written into an object's status); never waits. */
  events?: (e: TetherEvent) => void;
}

function statusOf(e: unknown): number | undefined {
  const x = e as { code?: number; statusCode?: number };
  return x.code ?? x.statusCode;
}

/** How often an Egress status that changed only in its usage counters is written. */
const COUNTS_EVERY_MS = 30_000;

export const HEALTH_CONDITION = 'tether.dev/HealthCheck';

/**
 * A Local Service's health-check condition from every node's report: True (Answering) when every node that
 * reports it has its port open, with each node's answer and local endpoint count; False (PortUnavailable)
 * naming each node that cannot open the port and why; Unknown while no node has reported it.
 */
export function healthCondition(service: string, reports: Record<string, NodeHealthReport>): Omit<Condition, 'lastTransitionTime'> {
  const nodes = Object.keys(reports).sort().flatMap((n) => (reports[n].services?.[service] ? [[n, reports[n].services[service]] as const] : []));
  if (!nodes.length) return { type: HEALTH_CONDITION, status: 'Unknown', reason: 'NoReports', message: 'no node has reported its health check yet' };
  const port = nodes[0][1].port;
  // kube-proxy opens the healthCheckNodePort of every Local LoadBalancer Service, whatever its class, and
  // answers with its own count of the same ready local endpoints: such a node is answered, by kube-proxy.
  const byKubeProxy = nodes.filter(([, r]) => !r.open && r.heldBy === KUBE_PROXY).map(([n]) => n);
  const closed = nodes.filter(([, r]) => !r.open && r.heldBy !== KUBE_PROXY);
  const up = nodes.filter(([, r]) => r.open && r.status === 200).map(([n, r]) => `${n} (${r.localEndpoints} local endpoint${r.localEndpoints === 1 ? '' : 's'})`);
  const down = nodes.filter(([, r]) => r.open && r.status !== 200).map(([n, r]) => (r.localEndpoints > 0 ? `${n} (${r.localEndpoints} local, tether's programming stale)` : n));
  const answers = [`200 on ${up.length ? up.join(', ') : 'no node'}; 503 on ${down.length ? down.join(', ') : 'no node'}`];
  if (byKubeProxy.length) answers.push(`kube-proxy answers on ${byKubeProxy.join(', ')}`);
  if (closed.length) {
    return { type: HEALTH_CONDITION, status: 'False', reason: 'PortUnavailable', message: message([`not answered on ${closed.length} of ${nodes.length} nodes: ${closed.map(([n, r]) => `${n}: ${r.problem ?? `port ${r.port} not open`}`).join(', ')}`, ...answers]) };
  }
  return { type: HEALTH_CONDITION, status: 'True', reason: 'Answering', message: message([`port ${port} answered on ${nodes.length} node${nodes.length === 1 ? '' : 's'}: ${answers[0]}`, ...answers.slice(1)]) };
}

const KUBE_PROXY = 'kube-proxy';

export const FORWARDING_CONDITION = 'tether.dev/Forwarding';

/**
 * A Service's forwarding condition from every node's report (lb-health-report's optional notForwarded):
 * False (NodeCannotForward) naming each node whose LB pods select a VIP of the Service it cannot forward
 * (an IPv6 VIP on a node without an IPv6 address, or one with no slot left there: nothing of it is
 * programmed there), with the node's own
 * words; undefined when no node reports one. Entries that are not what a node writes are passed over.
 */
export function forwardingCondition(service: string, reports: Record<string, NodeHealthReport>): Omit<Condition, 'lastTransitionTime'> | undefined {
  const problems: string[] = [];
  for (const node of Object.keys(reports).sort()) {
    const list = reports[node].notForwarded;
    if (!Array.isArray(list)) continue;
    for (const n of list) {
      if (n?.service !== service || typeof n.problem !== 'string' || typeof n.vip !== 'string') continue;
      problems.push(n.problem.includes(node) ? n.problem : `node ${node}: ${n.problem}`);
    }
  }
  if (!problems.length) return undefined;
  return { type: FORWARDING_CONDITION, status: 'False', reason: 'NodeCannotForward', message: message(problems) };
}

/** The forwarding condition once no node reports a problem, on a Service that had one (it turns True, not away). */
const FORWARDING_OK = { type: FORWARDING_CONDITION, status: 'True' as const, reason: 'Forwarding', message: 'every node whose LB pods select the Service forwards its VIPs' };

/** Condition messages are bounded by the API (32 KiB); ours name fields, so a few lines suffice. */
const message = (problems: string[]) => problems.join('; ').slice(0, 4000);

export class StatusController {
  private readonly api: k8s.CustomObjectsApi;
  private readonly core: k8s.CoreV1Api;
  /** The status passes and the block claim collection while leading (new loops on each start). */
  private loops?: { pass: ReconcileLoop; gc: ReconcileLoop };
  private stopping = false;
  /** When each object's status was last written (for the counters' rate limit). */
  private readonly countsWritten = new Map<string, number>();
  /**
   * Per object ("Kind namespace/name"): the resourceVersion a status was last written over and the status
   * written. Until the watch brings the write back, the cache still holds the version written over: the
   * status written stands for the object's status then (not written again: it would only meet a 409).
   */
  private readonly written = new Map<string, { over: string; status: Obj }>();
  /** Objects looked at in the pass under way (what is written or counted of others is forgotten after it). */
  private seen = new Set<string>();
  /** Counters for status and tests. */
  readonly stats = { statusWrites: 0, conflicts: 0, claimsCollected: 0 };
  /** The last pass that went through to its end (the metrics): when it ended and how long it took. */
  readonly passes: { lastSuccessMs?: number; lastDurationMs?: number } = {};

  constructor(private readonly o: StatusControllerOptions) {
    this.api = o.kc.makeApiClient(k8s.CustomObjectsApi);
    this.core = o.kc.makeApiClient(k8s.CoreV1Api);
  }

  start(): void {
    if (this.loops) return;
    this.stopping = false;
    this.loops = {
      pass: new ReconcileLoop({ run: () => this.pass(), everyMs: this.o.everyMs ?? 2000, skipBusyTicks: true, onError: (e) => this.o.logger.warn('kube: status pass failed', { error: e.message }) }),
      gc: new ReconcileLoop({ run: () => this.collectClaims(), everyMs: this.o.gcEveryMs ?? 60_000, skipBusyTicks: true, onError: (e) => this.o.logger.warn('kube: block claim collection failed', { error: e.message }) }),
    };
    this.loops.pass.start().request();
    this.loops.gc.start();
  }

  async stop(): Promise<void> {
    this.stopping = true;
    const loops = this.loops;
    this.loops = undefined;
    await Promise.all([loops?.pass.stop(), loops?.gc.stop()]);
  }

  /** One pass: every AddressPool's and Egress's status as it should be now. */
  async pass(): Promise<void> {
    const began = Date.now();
    await this.o.refresh?.();
    const verdicts = this.o.verdicts();
    const addresses = this.o.egressAddresses();
    const refused = this.o.refused?.() ?? {};
    const summaries = this.o.egressSummary?.() ?? {};
    const pools = this.o.addressPools?.();
    const egresses = this.o.egresses?.();
    this.seen = new Set();
    for (const { obj, problems: schemaProblems } of verdicts.values()) {
      if (this.stopping) return;
      const why = refused[objectKey(obj)];
      const problems = why ? [...schemaProblems, ...why.split('\n')] : schemaProblems;
      if (obj.kind === 'AddressPool') await this.writePool(obj.metadata.name, problems, pools?.get(obj.metadata.name));
      else if (obj.kind === 'Egress') {
        const key = `${obj.metadata.namespace}/${obj.metadata.name}`;
        await this.writeEgress(obj.metadata.namespace, obj.metadata.name, problems, addresses.filter((a) => a.egress === key), summaries[key], egresses?.get(key));
      }
    }
    const lbs = this.o.loadBalancers?.() ?? [];
    let health: Record<string, NodeHealthReport> | undefined;
    // Read for every tether Service: the Local ones' health answers, and any node's VIPs it does not forward.
    if (this.o.healthReports && lbs.some((l) => !l.refused)) {
      health = await this.o.healthReports().catch((e: Error) => {
        this.o.logger.debug('kube: health reports not read; health conditions kept', { error: e.message });
        return undefined;
      });
    }
    const cache = this.o.services?.();
    for (const lb of lbs) {
      if (this.stopping) return;
      await this.writeService(lb, health, cache);
    }
    // Objects gone (or no longer tether's): what was remembered of them goes.
    for (const k of this.written.keys()) if (!this.seen.has(k)) this.written.delete(k);
    for (const k of this.countsWritten.keys()) if (!this.seen.has(k)) this.countsWritten.delete(k);
    this.passes.lastSuccessMs = Date.now();
    this.passes.lastDurationMs = this.passes.lastSuccessMs - began;
  }

  /**
   * A tether Service's status: its VIPs in status.loadBalancer.ingress, one entry per family in its
   * ipFamilies order, with ipMode Proxy (kube-proxy then leaves VIP traffic to tether's datapath), and a
   * tether.dev/Ready condition saying why not when it is not, and which family it is not served in.
   */
  private async writeService(lb: Record<string, unknown>, health?: Record<string, NodeHealthReport>, cache?: Map<string, Obj>): Promise<void> {
    const key = String(lb.service);
    const [namespace, name] = key.split('/');
    const what = `Service ${key}`;
    this.seen.add(what);
    const refused = lb.refused as string[] | undefined;
    // This node does not know the VIP yet (just elected, its first passes still asking): the status
    // stays as written rather than flapping to NoVIP.
    if (!refused && lb.vipHere) return;
    let cur: Obj;
    if (cache) {
      const c = cache.get(key);
      if (!c) return; // not in the watch (deleted, or not labelled yet): as a 404
      cur = c;
    } else {
      try {
        cur = (await this.core.readNamespacedServiceStatus({ name, namespace })) as unknown as Obj;
      } catch (e) {
        if (statusOf(e) === 404) return;
        throw e;
      }
    }
    const prev = this.statusNow(what, cur);
    const gen = cur.metadata?.generation;
    // Every VIP of the Service, in its ipFamilies order (one entry per family served); an entry without
    // `vips` (a node's own status) has its one `vip`.
    const vips = Array.isArray(lb.vips) ? (lb.vips as string[]) : lb.vip ? [String(lb.vip)] : [];
    const unserved = lb.unserved as string[] | undefined;
    const notes = (lb.notes as string[] | undefined) ?? [];
    const ready = refused
      ? { type: 'tether.dev/Ready', status: 'False' as const, reason: 'Invalid', message: message(refused) }
      : unserved
        ? { type: 'tether.dev/Ready', status: 'False' as const, reason: 'FamilyNotServed', message: message(unserved) }
        : !lb.vip
          ? { type: 'tether.dev/Ready', status: 'False' as const, reason: 'NoVIP', message: message([String(lb.problem || 'no VIP allocated yet'), ...notes]) }
          : lb.vipProblem
            ? { type: 'tether.dev/Ready', status: 'False' as const, reason: 'NoVIP', message: message([`served at ${vips.join(', ')}; ${String(lb.vipProblem)}`, ...notes]) }
            : lb.problem
              ? { type: 'tether.dev/Ready', status: 'False' as const, reason: 'NoTargets', message: message([String(lb.problem), ...notes]) }
              : { type: 'tether.dev/Ready', status: 'True' as const, reason: 'Serving', message: message([`VIP${vips.length > 1 ? 's' : ''} ${vips.join(', ')} served by tether's load balancer`, ...notes]) };
    const conditions: Array<Omit<Condition, 'lastTransitionTime'>> = [{ ...ready, observedGeneration: gen }];
    if (lb.externalTrafficPolicy === 'Local' && !refused) {
      // Read failed: the condition stays as it was rather than flapping away.
      const hc = health ? healthCondition(String(lb.service), health) : (prev.conditions as Condition[] | undefined)?.find((c) => c.type === HEALTH_CONDITION);
      if (hc) conditions.push({ type: hc.type, status: hc.status, reason: hc.reason, message: hc.message, observedGeneration: gen });
    }
    if (!refused) {
      // Only on a Service some node reported (additive: the others' status is as before); kept as it was
      // when the reports were not read; True, not gone, once no node reports one.
      const had = (prev.conditions as Condition[] | undefined)?.find((c) => c.type === FORWARDING_CONDITION);
      const fc = health ? forwardingCondition(key, health) ?? (had ? FORWARDING_OK : undefined) : had;
      if (fc) conditions.push({ type: fc.type, status: fc.status, reason: fc.reason, message: fc.message, observedGeneration: gen });
    }
    const status: Obj = {
      ...prev,
      loadBalancer: vips.length && !refused && !unserved ? { ingress: vips.map((ip) => ({ ip, ipMode: 'Proxy' })) } : {},
      conditions: mergeConditions(prev.conditions, conditions),
    };
    await this.write(what, cur, status, () => this.core.replaceNamespacedServiceStatus({ name, namespace, body: { ...cur, apiVersion: 'v1', kind: 'Service', status } as k8s.V1Service }), { vip: vips.join(',') || undefined });
  }

  private async writePool(name: string, problems: string[], cached?: Obj): Promise<void> {
    const what = `AddressPool ${name}`;
    this.seen.add(what);
    const params = { group: GROUP, version: VERSION, plural: 'addresspools', name };
    const cur = cached ?? (await this.read(() => this.api.getClusterCustomObject(params)));
    if (!cur) return;
    const prev = this.statusNow(what, cur);
    const ready = problems.length
      ? { type: 'Ready', status: 'False' as const, reason: problems.some((p) => p.includes(' overlaps ')) ? 'Overlaps' : 'Invalid', message: message(problems) }
      : { type: 'Ready', status: 'True' as const, reason: 'Valid', message: 'the pool is in use' };
    const status = { ...prev, observedGeneration: cur.metadata?.generation, conditions: mergeConditions(prev.conditions, [{ ...ready, observedGeneration: cur.metadata?.generation }]) };
    await this.write(what, cur, status, () => this.api.replaceClusterCustomObjectStatus({ ...params, body: { apiVersion: `${GROUP}/${VERSION}`, kind: 'AddressPool', ...cur, status } }));
  }

  private async writeEgress(namespace: string, name: string, problems: string[], addrs: EgressAddressStatus[], sum?: EgressSummary, cached?: Obj): Promise<void> {
    const what = `Egress ${namespace}/${name}`;
    this.seen.add(what);
    const params = { group: GROUP, version: VERSION, plural: 'egresses', namespace, name };
    const cur = cached ?? (await this.read(() => this.api.getNamespacedCustomObject(params)));
    if (!cur) return;
    const prev = this.statusNow(what, cur);
    const owned = addrs.filter((a) => a.owner);
    const gen = cur.metadata?.generation;
    const ready = problems.length
      ? { type: 'Ready', status: 'False' as const, reason: 'Invalid', message: message(problems) }
      : addrs.length === 0
        ? { type: 'Ready', status: 'False' as const, reason: 'NoAddress', message: 'no floating address allocated yet' }
        : owned.length < addrs.length
          ? { type: 'Ready', status: 'False' as const, reason: 'NoOwner', message: `${addrs.length - owned.length} of ${addrs.length} addresses have no live gateway` }
          : { type: 'Ready', status: 'True' as const, reason: 'Owned', message: `${owned.length} address(es), each held by a gateway` };
    const more: Array<Omit<Condition, 'lastTransitionTime'>> = [];
    if (sum && !problems.length) {
      const short = sum.allocated < sum.asked || sum.owned < sum.asked;
      more.push(short
        ? { type: 'AddressesComplete', status: 'False', reason: 'FewerAddresses', message: `${sum.owned} of ${sum.asked} addresses held${sum.allocated < sum.asked ? ` (${sum.asked - sum.allocated} not allocated${sum.shortfall ? `: ${sum.shortfall}` : ''})` : ''}`.slice(0, 4000), observedGeneration: gen }
        : { type: 'AddressesComplete', status: 'True', reason: 'AllHeld', message: `${sum.asked} address(es) on ${sum.ownerNodes} node(s)`, observedGeneration: gen });
      more.push(sum.capLimited
        ? { type: 'Spread', status: 'False', reason: 'CapPreventsSpread', message: 'the per-node cap (maxAddressesPerNode, or a node\'s tether.dev/max-egress-addresses) keeps addresses off live nodes or without an owner', observedGeneration: gen }
        : { type: 'Spread', status: 'True', reason: 'Spread', message: `addresses on ${sum.ownerNodes} node(s)`, observedGeneration: gen });
      if (sum.zoneProblem) more.push({ type: 'ZonePolicy', status: 'False', reason: 'NoZone', message: sum.zoneProblem, observedGeneration: gen });
    }
    // The counts kubectl shows (printer columns cannot count a list): wanted only when the egress
    // controller serves the Egress (it knows what spec.addresses asks for, pools resolved).
    const status = {
      observedGeneration: gen,
      ...(sum ? { wanted: sum.asked } : {}),
      allocated: addrs.length,
      held: owned.length,
      nodes: new Set(owned.map((a) => a.ownerNode).filter(Boolean)).size,
      addresses: addrs.map((a) => ({
        address: a.address, ...(a.ownerNode ? { ownerNode: a.ownerNode } : {}), ...(a.ownerZone ? { zone: a.ownerZone } : {}), ...(a.owner ? { ownerPod: a.owner } : {}), epoch: a.epoch,
        ...(a.flows !== undefined ? { flows: a.flows, bytes: a.bytes ?? 0 } : {}),
      })),
      conditions: mergeConditions(prev.conditions, [{ ...ready, observedGeneration: gen }, ...more]),
    };
    await this.write(what, cur, status, () => this.api.replaceNamespacedCustomObjectStatus({ ...params, body: { apiVersion: `${GROUP}/${VERSION}`, kind: 'Egress', ...cur, status } }));
  }

  /** An object read with a GET (the cache has no copy of it); undefined when it is gone (404). */
  private async read(get: () => Promise<unknown>): Promise<Obj | undefined> {
    try {
      return (await get()) as Obj;
    } catch (e) {
      if (statusOf(e) === 404) return undefined;
      throw e;
    }
  }

  /**
   * An object's status as it stands: the one last written over this very resourceVersion when the watch
   * has not brought that write back yet (the cache still holds the version written over), else the one read.
   */
  private statusNow(what: string, cur: Obj): Obj {
    const last = this.written.get(what);
    return last && last.over === String(cur.metadata?.resourceVersion ?? '') ? last.status : (cur.status ?? {});
  }

  /**
   * Writes `status` over `cur` (with cur's resourceVersion: an object changed since is refused with a 409,
   * counted, and read again on the next pass) when it differs from the status as it stands (statusNow).
   */
  private async write(what: string, cur: Obj, status: Obj, put: () => Promise<unknown>, log: Record<string, unknown> = {}): Promise<void> {
    const prev = this.statusNow(what, cur);
    if (sameJson(prev, status)) return;
    // Usage counters change all the time: a status that differs only in them is written at most every
    // COUNTS_EVERY_MS, so the API server is not written to on every pass.
    const withoutCounts = (x: Obj) => ({ ...x, addresses: (x.addresses as Obj[] | undefined)?.map(({ flows: _f, bytes: _b, ...rest }) => rest) });
    // Only changed numbers wait: counts that appear (or go) where the written status has none are written now.
    const hasCounts = (x: Obj) => JSON.stringify((x.addresses as Obj[] | undefined)?.map((a) => a.flows !== undefined) ?? []);
    const last = this.countsWritten.get(what) ?? 0;
    if (sameJson(withoutCounts(prev), withoutCounts(status)) && hasCounts(prev) === hasCounts(status) && Date.now() - last < COUNTS_EVERY_MS) return;
    const over = String(cur.metadata?.resourceVersion ?? '');
    try {
      await put();
      this.countsWritten.set(what, Date.now());
      this.written.set(what, { over, status });
      this.stats.statusWrites++;
      const ready = (status.conditions as Condition[]).find((c) => c.type === 'Ready' || c.type === 'tether.dev/Ready');
      this.o.logger.info('kube: status written', { object: what, ...log, ready: ready?.status, reason: ready?.reason });
      this.refusals(what, cur, prev, status);
    } catch (e) {
      if (statusOf(e) === 409) this.stats.conflicts++;
      else if (statusOf(e) !== 404) throw e;
    }
  }

  /** Events for the refusals and address conflicts this write records (once: against the status it replaced). */
  private refusals(what: string, cur: Obj, prev: Obj, status: Obj): void {
    if (!this.o.events) return;
    const [kind, key] = [what.slice(0, what.indexOf(' ')), what.slice(what.indexOf(' ') + 1)];
    const [a, b] = key.split('/');
    const regarding = { apiVersion: kind === 'Service' ? 'v1' : `${GROUP}/${VERSION}`, kind, ...(b !== undefined ? { namespace: a, name: b } : { name: a }), uid: cur.metadata?.uid };
    for (const e of refusalEvents(regarding, prev.conditions as Condition[] | undefined, status.conditions as Condition[])) this.o.events(e);
  }

  /** Deletes the block claims of nodes that are gone (a node deleted while holding blocks). */
  async collectClaims(): Promise<number> {
    const nodes = new Set(((await this.core.listNode()) as Obj).items.map((n: Obj) => n.metadata.name));
    const claims = ((await this.api.listClusterCustomObject({ group: GROUP, version: VERSION, plural: 'addressblocks' })) as Obj).items as Obj[];
    let n = 0;
    for (const c of claims) {
      const node = c.spec?.node ?? c.metadata?.labels?.[NODE_LABEL];
      if (!node || nodes.has(node)) continue;
      try {
        await this.api.deleteClusterCustomObject({ group: GROUP, version: VERSION, plural: 'addressblocks', name: c.metadata.name, body: { preconditions: { uid: c.metadata.uid } } });
        n++;
        this.o.logger.info('kube: block claim of a deleted node collected', { claim: c.metadata.name, node, block: c.spec?.cidr, pool: c.spec?.pool });
      } catch (e) {
        if (statusOf(e) !== 404 && statusOf(e) !== 409) throw e;
      }
    }
    this.stats.claimsCollected += n;
    return n;
  }
}

/**
 * Equal as JSON whatever the order of keys: a status read back through client-node comes with its keys in
 * the model's order (conditions: lastTransitionTime, message, observedGeneration, reason, status, type),
 * not the order it was built in, so a plain JSON.stringify comparison saw a change on every pass and
 * rewrote every Service's status every 2 s.
 */
export function sameJson(a: unknown, b: unknown): boolean {
  const canon = (v: unknown): unknown =>
    Array.isArray(v) ? v.map(canon) : v && typeof v === 'object' ? Object.fromEntries(Object.keys(v as object).sort().filter((k) => (v as Record<string, unknown>)[k] !== undefined).map((k) => [k, canon((v as Record<string, unknown>)[k])])) : v;
  return JSON.stringify(canon(a)) === JSON.stringify(canon(b));
}
