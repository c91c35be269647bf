// The node's guarantee on a gateway pod's way out (bpf/egress-guard.bpf.c at tc ingress of its host-side
// veth): toward the destinations of its Egresses, only floating addresses the pod owns right now may be
// the source. Maps are per veth, pinned under <pinDir>/egress-guard-<veth>/, so a restarted tetherd keeps
// enforcing (and updating) what the running program uses; a new attachment resets them. IPv4 and IPv6 have
// maps of their own; the methods take addresses and prefixes of both and dispatch by family.
import * as fs from 'node:fs';
import * as path from 'node:path';
import { log } from '../../lib/log';
import { bytesToIp } from '../../lib/ip';
import { BpfObject } from './object';
import { bpfObjectDir } from './fou';
import { addressFamily, ipBytes, ipv4Bytes, ipv6Bytes } from './fou-structs';
import { parseIpPrefix } from './egress-structs';
import { attachTc, detachTc, type TcAttachment } from './tc';
import type { MapLayout } from './map-layout';

/** tc filter id of the guard: after steering (0x110) in priority order, though the two never share a veth. */
export const GUARD_TC = { handle: 1, priority: 0x120, object: 'egress-guard', program: 'egress_guard' } as const;

const ACTION_GUARD = 1;
const ACTION_BYPASS = 2;
const KEY0 = Buffer.alloc(4);

/** Layout versions of the guard's maps (bpf/egress-guard.bpf.c) and how an older pin is carried over (map-layout.ts). */
export const GUARD_MAP_LAYOUTS: Record<string, MapLayout> = {
  guard_dest: { version: 1, convert: 'copy' },
  guard_owned: { version: 1, convert: 'copy' }, // what the pod owns: its SNAT keeps working across an upgrade
  guard_cfg: { version: 1, convert: 'prefix' },
  guard_stats: { version: 1, convert: 'prefix' }, // grows at its end only (ipv6 was appended)
  // IPv6, added beside the maps above: created empty over the pins of the release before.
  guard_dest6: { version: 1, convert: 'copy' },
  guard_owned6: { version: 1, convert: 'copy' },
  guard_cfg6: { version: 1, convert: 'prefix' },
};
// must match struct guard_stats in bpf/egress-guard.bpf.c. notIpv4 counts packets of neither family (ARP);
// the name predates IPv6. ipv6 counts IPv6 packets, which are also counted by outcome.
export const GUARD_STATS_FIELDS = ['allowed', 'notGuarded', 'notIpv4', 'droppedPodSource', 'droppedOtherSource', 'droppedTruncated', 'ipv6'] as const;
export type GuardStats = Record<(typeof GUARD_STATS_FIELDS)[number], number>;

export interface EgressGuardOptions {
  netns?: string | null;
  /** The gateway pod's host-side veth (packets the pod sends arrive at its ingress). */
  hostIfName: string;
  /** The gateway pod's own IPv4 address (its drops are counted apart); absent for an IPv6-only pod. */
  podIp?: string;
  /** The gateway pod's own IPv6 address, when it has one (its drops are counted apart likewise). */
  podIp6?: string;
  /** Destinations of the Egresses the pod is a gateway of, and the ranges excluded from them (IPv4 and IPv6 mixed). */
  destinations: string[];
  excluded: string[];
  pinDir: string;
  objectPath?: string;
}

function pinName(hostIfName: string): string {
  return `${GUARD_TC.object}-${hostIfName}`;
}

/** LPM key of guard_dest (IPv4: 4 + 4 bytes) or guard_dest6 (IPv6: 4 + 16 bytes). */
function destKey(cidr: string, field: string): { family: 4 | 6; key: Buffer } {
  const p = parseIpPrefix(cidr, field);
  const addr = p.family === 4 ? ipv4Bytes(p.address, field) : ipv6Bytes(p.address, field);
  const k = Buffer.alloc(4 + addr.length);
  k.writeUInt32LE(p.length, 0);
  addr.copy(k, 4);
  return { family: p.family, key: k };
}

const OWNED = { 4: 'guard_owned', 6: 'guard_owned6' } as const;
// An owned map's value: the program lets a source through for any entry; the value says why it is there.
// OWNED_BY_POD: the pod owns the address (kept across a restart). ANTICIPATED: for a moment only, before
// the address is handed to the pod (GatewayDatapath.anticipate); a process that did not write it cannot
// take it back in time, so a new attachment removes it.
const OWNED_BY_POD = 1;
const ANTICIPATED = 2;

export class EgressGuard {
  private constructor(
    private readonly obj: BpfObject,
    readonly attachment: TcAttachment,
    private readonly o: EgressGuardOptions,
  ) {}

  /**
   * Loads the guard over the veth's pins and attaches it, guarding the given destinations. What the pins
   * hold as owned stays: after a tetherd restart the pod keeps the addresses it owns (and its SNAT) until
   * the controller decides otherwise, so its traffic is not cut meanwhile. A new veth starts with nothing.
   */
  static attach(o: EgressGuardOptions): EgressGuard {
    const file = o.objectPath ?? path.join(bpfObjectDir(), `${GUARD_TC.object}.bpf.o`);
    const obj = BpfObject.load(file, { pinDir: o.pinDir, name: pinName(o.hostIfName), layouts: GUARD_MAP_LAYOUTS });
    try {
      // 0.0.0.0 when the pod has no IPv4: then no IPv4 source is counted as the pod's.
      obj.map('guard_cfg').update(KEY0, o.podIp ? ipv4Bytes(o.podIp, 'podIp') : Buffer.alloc(4));
      // :: when the pod has no IPv6: then no IPv6 source is counted as the pod's.
      obj.map('guard_cfg6').update(KEY0, o.podIp6 ? ipv6Bytes(o.podIp6, 'podIp6') : Buffer.alloc(16));
      setDestinations(obj, o.destinations, o.excluded);
      const dropped = dropAnticipated(obj);
      if (dropped.length) log().info('egress guard: anticipated sources of the previous process removed', { ifName: o.hostIfName, addresses: dropped });
      const attachment = attachTc({ netns: o.netns, ifName: o.hostIfName, direction: 'ingress', progFd: obj.programFd(GUARD_TC.program), handle: GUARD_TC.handle, priority: GUARD_TC.priority });
      obj.settle();
      log().info('egress guard attached', { ifName: o.hostIfName, podIp: o.podIp, podIp6: o.podIp6, destinations: o.destinations, excluded: o.excluded.length });
      return new EgressGuard(obj, attachment, o);
    } catch (e) {
      obj.close();
      throw e;
    }
  }

  /** Replaces the guarded destinations (new entries first, so a prefix kept is never unguarded). */
  setDestinations(destinations: string[], excluded: string[]): void {
    setDestinations(this.obj, destinations, excluded);
  }

  /** Allows `address` (IPv4 or IPv6) as a source: call before the address is used (before SNAT to it). */
  own(address: string): void {
    this.obj.map(OWNED[addressFamily(address)]).update(ipBytes(address), Buffer.from([OWNED_BY_POD]));
  }

  /**
   * Allows `address` as a source for a moment, before it is handed to the pod: own() makes it the pod's,
   * release() takes it back. Unlike an owned entry, a new attachment (a tetherd restart) removes it.
   */
  anticipate(address: string): void {
    this.obj.map(OWNED[addressFamily(address)]).update(ipBytes(address), Buffer.from([ANTICIPATED]));
  }

  /** Forbids `address` as a source again: call after SNAT to it is gone. */
  release(address: string): void {
    this.obj.map(OWNED[addressFamily(address)]).delete(ipBytes(address));
  }

  /** Owned addresses, IPv4 then IPv6 (not the anticipated ones). */
  owned(): string[] {
    return this.sources(OWNED_BY_POD);
  }

  /** Anticipated addresses, IPv4 then IPv6. */
  anticipated(): string[] {
    return this.sources(ANTICIPATED);
  }

  private sources(why: number): string[] {
    return sourcesWith(this.obj, why).map(([, k]) => bytesToIp(k));
  }

  /** Counters summed over CPUs. */
  stats(): GuardStats {
    const out = Object.fromEntries(GUARD_STATS_FIELDS.map((f) => [f, 0])) as GuardStats;
    for (const v of this.obj.map('guard_stats').lookupPerCpu(KEY0) ?? []) {
      GUARD_STATS_FIELDS.forEach((f, i) => (out[f] += Number(v.readBigUInt64LE(i * 8))));
    }
    return out;
  }

  /** Releases this process's hold on the object; the filter and its pins stay (tetherd stopping or restarting). */
  close(): void {
    this.obj.close();
  }

  /** Removes the filter (the veth may already be gone with its pod), the pins and the object. Idempotent. */
  detach(): void {
    const a = this.attachment;
    try {
      detachTc({ netns: a.netns, ifindex: a.ifindex, direction: a.direction, handle: a.handle, priority: a.priority });
    } catch (e) {
      // The veth went with its pod, and its filter with it.
      log().debug('egress guard: detach skipped', { ifName: this.o.hostIfName, error: (e as Error).message });
    }
    this.obj.close();
    fs.rmSync(path.join(this.o.pinDir, pinName(this.o.hostIfName)), { recursive: true, force: true });
  }
}

function setDestinations(obj: BpfObject, destinations: string[], excluded: string[]): void {
  const want = { 4: new Map<string, [Buffer, number]>(), 6: new Map<string, [Buffer, number]>() };
  destinations.forEach((c, i) => {
    const { family, key } = destKey(c, `destinations[${i}]`);
    want[family].set(key.toString('hex'), [key, ACTION_GUARD]);
  });
  // An excluded range equal to a destination leaves it unguarded, as steering does.
  excluded.forEach((c, i) => {
    const { family, key } = destKey(c, `excluded[${i}]`);
    want[family].set(key.toString('hex'), [key, ACTION_BYPASS]);
  });
  for (const [family, name] of [[4, 'guard_dest'], [6, 'guard_dest6']] as const) {
    const map = obj.map(name);
    for (const [k, action] of want[family].values()) map.update(k, Buffer.from([action]));
    for (const k of map.keys()) if (!want[family].has(k.toString('hex'))) map.delete(k);
  }
}

/** The entries of both owned maps (IPv4, then IPv6) whose value says `why`: each with its map's name and key. */
function sourcesWith(obj: BpfObject, why: number): Array<[string, Buffer]> {
  const out: Array<[string, Buffer]> = [];
  for (const name of [OWNED[4], OWNED[6]]) {
    const m = obj.map(name);
    for (const k of m.keys()) if (m.lookup(k)?.[0] === why) out.push([name, k]);
  }
  return out;
}

/** Removes the anticipated entries a previous process left in the pinned owned maps; what it removed. */
function dropAnticipated(obj: BpfObject): string[] {
  const found = sourcesWith(obj, ANTICIPATED);
  for (const [name, k] of found) obj.map(name).delete(k);
  return found.map(([, k]) => bytesToIp(k));
}
