// The node registry in the cluster store: each tetherd's node address, as a member set (member-registry.ts)
// under "{<prefix>nodes}": a node heartbeats with one script call that also brings its copy of the list up
// to date with only what changed, and a node that stopped is removed by whichever call first sees it expired.
// Receivers of FoU (egress gateways, load balancer targets) accept it only from registered node addresses.
// A registration is {"address", "release", "address6"?}: the release lets a node tell when no node of the
// previous release is left (docs/upgrade.md); 0.1.0 wrote no release and reads only the address. address6,
// the node's IPv6 address, is where FoU to an IPv6 VIP's targets comes from; readers before ignore it. A node
// on an IPv6 underlay writes its address in brackets (store-record.ts nodeAddressText), which 0.1.0 refuses.
import type Redis from 'ioredis';
import { VERSION } from '../../lib/version';
import { MemberView, memberCall } from './member-registry';
import { isCanonicalIp, isPlainName, nodeAddressText, parseObject, readNodeAddress, refuseRecord } from './store-record';

/** A node's registration as read. */
export interface NodeEntry {
  address: string;
  /** The node's tether release; undefined for a node of 0.1.0, which did not write it (or one not understood). */
  release?: string;
  /** The node's IPv6 address (FoU in outer IPv6 comes from it); undefined for a node without one or of an earlier release. */
  address6?: string;
}

/**
 * This process's IPv6 node address, registered beside its address by every registry writer that is not
 * given one (the egress and load balancer registries of one tetherd write the same node's entry and must
 * write the same value, or each beat of one would be a change for the other). Set once at start.
 */
let processAddress6: string | undefined;
export function setRegisteredAddress6(address6: string | undefined): void {
  processAddress6 = address6;
}

/** The registration this node writes: one encoder for NodeRegistry and registerNode. */
export function nodeValue(address: string, release = VERSION, address6 = processAddress6): string {
  return JSON.stringify({ address: nodeAddressText(address), release, ...(address6 ? { address6 } : {}) });
}

/** The registry's base key (hash tag included: its keys share one slot). */
export function nodesKey(prefix: string): string {
  return `{${prefix}nodes}`;
}

/** Reads one registration; undefined (after one warn line) when it is garbled. */
export function readNode(key: string, node: string, raw: string): NodeEntry | undefined {
  const { value: r, problem } = parseObject(raw);
  const address = r ? readNodeAddress(r.address) : undefined;
  const why = problem ?? (!address ? 'address is not an IPv4 address or an IPv6 one in brackets' : undefined);
  if (why) {
    // A garbled registration's address is never let through the FoU source filters.
    refuseRecord('node registry', key, node, why, raw);
    return undefined;
  }
  // The release only informs (no FoU decision rests on it): one this reader does not understand, e.g. a
  // later release's other shape, reads as unknown rather than costing the node its registration.
  // So does an address6 that is not an IPv6 address: the node's IPv4 FoU is still accepted.
  const address6 = isCanonicalIp(r!.address6) && (r!.address6 as string).includes(':') ? (r!.address6 as string) : undefined;
  return { address: address!, ...(isPlainName(r!.release, 64) ? { release: r!.release } : {}), ...(address6 ? { address6 } : {}) };
}

/**
 * A registration (node address, gateway pods) lives this long unless refreshed; it is refreshed at 0.1 of it
 * (member-registry.ts) and removed at once on a clean stop. Liveness is BFD's, not the registry's: a crashed
 * node's entry only lingers in the FoU allow-lists and candidate lists (where BFD marks it down) for up to
 * this long. Long enough that a node stalled for seconds (a loaded machine) does not drop out and come back,
 * which every node would then be sent as changes.
 */
export const REGISTRY_TTL_MS = 15_000;

/**
 * How long an address stays in addresses() after it left the registry. The registry empties when the store
 * loses its data (restarted empty) and refills as each node beats again, within a beat or two; without this
 * a receiver that beat first would drop every other node's FoU meanwhile (seen: a 3.4 s stall of every
 * connection through an LB VIP, one TCP retransmission backoff). A node that really left is dropped after it.
 */
export const LEFT_GRACE_MS = 5000;

/**
 * This node's registration and its copy of every node's address. beat() once a second: one command, whose
 * reply is a version number unless the membership changed (then only the changes).
 */
export class NodeRegistry {
  private readonly view: MemberView<NodeEntry>;
  /**
   * Addresses the registry listed before and no longer does, with since when (dropped LEFT_GRACE_MS later)
   * and whether it was a node's IPv6 address (address6).
   */
  private readonly left = new Map<string, { since: number; six: boolean }>();
  private listed = new Map<string, boolean>();

  /** address6: this node's IPv6 address to register (default: the process's, setRegisteredAddress6). */
  constructor(client: Redis, prefix: string, private readonly node: string, private readonly address: string, private readonly address6?: string) {
    const key = nodesKey(prefix);
    this.view = new MemberView(client, key, (n, raw) => readNode(key, n, raw));
  }

  /**
   * Registers (refreshes) this node for `ttlMs` and returns every registered node's address, sorted: the
   * same array as before while the registry did not change (a caller may compare by identity).
   */
  async beat(ttlMs: number, nowMs = Date.now()): Promise<string[]> {
    if (await this.view.beat(this.node, nodeValue(this.address, VERSION, this.address6 ?? processAddress6), ttlMs)) {
      const listed = new Map<string, boolean>();
      for (const e of this.view.entries().values()) {
        if (e.address6) listed.set(e.address6, true);
        listed.set(e.address, false);
      }
      for (const [a, six] of this.listed) if (!listed.has(a) && !this.left.has(a)) this.left.set(a, { since: nowMs, six });
      for (const a of listed.keys()) this.left.delete(a);
      this.listed = listed;
      this.sorted = undefined;
    }
    for (const [a, l] of this.left) {
      if (nowMs - l.since < LEFT_GRACE_MS) continue;
      this.left.delete(a);
      this.sorted = undefined;
    }
    return this.addresses();
  }

  private sorted?: { plain: string[]; all: string[] };

  /** Removes this node's registration (a clean stop): the others drop it at once instead of at expiry. */
  async leave(): Promise<void> {
    await this.view.beat(this.node, undefined, 0);
    this.sorted = undefined;
  }

  /**
   * Every registered node's address as of the last beat, and those that left less than LEFT_GRACE_MS ago,
   * sorted; with ipv6, the nodes' registered IPv6 addresses (address6) too. The same array while nothing
   * changed.
   */
  addresses(o: { ipv6?: boolean } = {}): string[] {
    if (!this.sorted) {
      const all = new Map([...[...this.left].map(([a, l]) => [a, l.six] as const), ...this.listed]);
      const list = (keep: (six: boolean) => boolean) => Object.freeze([...all].filter(([, six]) => keep(six)).map(([a]) => a).sort()) as string[];
      this.sorted = { plain: list((six) => !six), all: list(() => true) };
    }
    return o.ipv6 ? this.sorted.all : this.sorted.plain;
  }

  /**
   * Each registered node's node address (not its address6) with the node's name, as of the last beat (a new
   * map each call): whom a node talks to, and by what name it says so.
   */
  nodeNames(): Map<string, string> {
    return new Map([...this.view.entries()].map(([node, e]) => [e.address, node]));
  }

  /**
   * Each registered node's release as of the last beat ('' for a node that wrote none: 0.1.0). Whether a
   * release's nodes are all gone, e.g. before old store keys may be removed, is read here.
   */
  releases(): Map<string, string> {
    return new Map([...this.view.entries()].map(([node, e]) => [node, e.release ?? '']));
  }
}

/** Registers a node for `ttlMs` (one call). Kept for callers that do not hold a NodeRegistry. */
export async function registerNode(client: Redis, prefix: string, node: string, address: string, ttlMs: number): Promise<void> {
  await memberCall(client, nodesKey(prefix), node, nodeValue(address), ttlMs, -1);
}

/**
 * Registered nodes' addresses, read whole (expired ones pruned first). Kept for callers that do not hold a
 * NodeRegistry: its reply grows with the cluster, where NodeRegistry.beat()'s does not.
 */
export async function listNodes(client: Redis, prefix: string): Promise<string[]> {
  const key = nodesKey(prefix);
  const [, , data] = await memberCall(client, key, '', undefined, 0, 0);
  const out: string[] = [];
  for (let i = 0; i + 1 < (data ?? []).length; i += 2) {
    const e = readNode(key, data![i], data![i + 1]);
    if (e) out.push(e.address);
  }
  return out;
}
