// Uniquely named network namespaces for kernel tests, always removed (even after a failure), and
// read-only snapshots of a namespace's links, addresses, routes and ARP sysctls for before/after checks.
import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import * as fs from 'node:fs';
import { inNetns } from '../../daemon/sys/netns';
import { macToBytes } from '../../lib/ip';

export function uniqueName(prefix: string): string {
  return `${prefix}-${randomBytes(3).toString('hex')}`;
}

export function addNetns(name: string): string {
  execFileSync('ip', ['netns', 'add', name]);
  execFileSync('ip', ['-n', name, 'link', 'set', 'lo', 'up']);
  return `/run/netns/${name}`;
}

export function delNetns(...names: string[]): void {
  for (const n of names) {
    try {
      execFileSync('ip', ['netns', 'del', n], { stdio: 'ignore' });
    } catch {
      // already gone
    }
  }
}

export function ipJson(ns: string, args: string[]): any[] {
  return JSON.parse(execFileSync('ip', ['-n', ns, '-j', ...args], { encoding: 'utf8' }) || '[]');
}

/** A link's MAC address in a namespace, as bytes. */
export function linkMac(ns: string, ifName: string): Buffer {
  return macToBytes(ipJson(ns, ['link', 'show', ifName])[0].address as string);
}

export function nsSysctl(ns: string, key: string): string {
  return execFileSync('nsenter', [`--net=/run/netns/${ns}`, 'cat', `/proc/sys/${key}`], { encoding: 'utf8' }).trim();
}

export interface NsSnapshot {
  links: Array<{ name: string; mtu: number; kind?: string }>;
  addrs: string[];
  routes: string[];
  sysctls: Record<string, string>;
}

export function snapshot(ns: string, ifaces: string[] = []): NsSnapshot {
  const links = ipJson(ns, ['-d', 'link', 'show'])
    .map((l) => ({ name: l.ifname as string, mtu: l.mtu as number, kind: l.linkinfo?.info_kind as string | undefined }))
    .sort((a, b) => a.name.localeCompare(b.name));
  const addrs = ipJson(ns, ['addr', 'show'])
    .flatMap((l) => (l.addr_info ?? []).map((a: any) => `${l.ifname} ${a.local}/${a.prefixlen}`))
    .sort();
  const routes = [...ipJson(ns, ['route', 'show', 'table', 'all']), ...ipJson(ns, ['-6', 'route', 'show', 'table', 'all'])]
    .map((r) => JSON.stringify(r))
    .sort();
  const sysctls: Record<string, string> = {};
  for (const i of ['all', ...ifaces]) {
    if (i !== 'all' && !fs.existsSync(`/run/netns/${ns}`)) continue;
    for (const k of ['arp_ignore', 'arp_announce']) {
      try {
        sysctls[`${i}/${k}`] = nsSysctl(ns, `net/ipv4/conf/${i}/${k}`);
      } catch {
        // interface absent in this snapshot
      }
    }
  }
  return { links, addrs, routes, sysctls };
}

/**
 * Starts an async node-side step (GatewayDatapath.own, release, takeUnannounced) with this thread inside
 * the namespace `nsPath`: what it does before its first await (its netlink work in the current namespace)
 * runs there; what follows (nft in the pod's namespace, by path) does not depend on the thread's namespace.
 */
export function startInNetns<T>(nsPath: string, fn: () => Promise<T>): Promise<T> {
  let started!: Promise<T>;
  inNetns(nsPath, () => {
    started = fn();
  });
  return started;
}
