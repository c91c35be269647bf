// tetherd's side of `tether-ipam`: reads the IPAM section of a primary plugin's config, allocates through
// the PodAllocator and answers a CNI IPAM result in the config's version (0.3.x/0.4.0 carry `version`
// on each IP; 1.x do not). ADD is idempotent per attachment, DEL releases, CHECK verifies, GC reclaims.
import { ErrorCode, TetherError } from '../lib/errors';
import type { Logger } from '../lib/log';
import type { CniParams } from '../lib/api/protocol';
import { parseCidr, parseIp } from '../lib/ip';
import { ownerKey, type PodAllocation, type PodAllocator } from './pod-allocator';
import type { PodOwner } from './types';

type Json = Record<string, unknown>;

interface IpamConf {
  pool: string;
  routes: Array<{ dst: string; gw?: string }>;
  dns?: Json;
}

export class IpamService {
  constructor(
    private readonly pods: PodAllocator,
    private readonly logger: Logger,
  ) {}

  async add(p: CniParams): Promise<Json> {
    const conf = parseIpamConf(p.config);
    const owner = ownerOf(p);
    const alloc = await this.pods.allocate(conf.pool, owner);
    return ipamResult(alloc, conf, String(p.config.cniVersion));
  }

  async del(p: CniParams): Promise<void> {
    const key = ownerKey(ownerOf(p));
    const released = await this.pods.release(key);
    if (!released.length) this.logger.info('ipam: DEL for an attachment holding no address; nothing to release', { owner: key });
  }

  check(p: CniParams): void {
    const conf = parseIpamConf(p.config);
    const key = ownerKey(ownerOf(p));
    const alloc = this.pods.lookup(key);
    if (!alloc) throw new TetherError(ErrorCode.UnknownContainer, `container ${p.containerId} (${p.ifName}) holds no address of network ${p.config.name}`);
    if (alloc.pool !== conf.pool) throw new TetherError(ErrorCode.CheckFailed, `container ${p.containerId} holds addresses of pool "${alloc.pool}", config asks "${conf.pool}"`);
    const prev = p.config.prevResult as Json | undefined;
    const prevIps = Array.isArray(prev?.ips) ? (prev!.ips as Array<{ address?: string }>).map((i) => i.address?.split('/')[0]) : undefined;
    for (const ip of alloc.ips) {
      if (prevIps && !prevIps.includes(ip.address)) {
        throw new TetherError(ErrorCode.CheckFailed, `address ${ip.address} allocated to container ${p.containerId} is missing from prevResult`);
      }
    }
  }

  async gc(p: CniParams): Promise<{ released: string[] }> {
    const network = String(p.config.name);
    const raw = p.config['cni.dev/valid-attachments'] ?? [];
    if (!Array.isArray(raw)) throw new TetherError(ErrorCode.InvalidConfig, 'cni.dev/valid-attachments: must be an array');
    const valid = new Set<string>();
    raw.forEach((a: Json, i) => {
      if (!a || typeof a.containerID !== 'string' || typeof a.ifname !== 'string') {
        throw new TetherError(ErrorCode.InvalidConfig, `cni.dev/valid-attachments[${i}]: needs string containerID and ifname`);
      }
      valid.add(ownerKey({ network, containerId: a.containerID, ifName: a.ifname }));
    });
    return { released: await this.pods.gc(network, valid) };
  }
}

function ownerOf(p: CniParams): PodOwner {
  if (!p.containerId) throw new TetherError(ErrorCode.InvalidEnvironment, 'CNI_CONTAINERID is missing');
  if (!p.ifName) throw new TetherError(ErrorCode.InvalidEnvironment, 'CNI_IFNAME is missing');
  if (typeof p.config.name !== 'string' || !p.config.name) throw new TetherError(ErrorCode.InvalidConfig, 'name: missing or not a string');
  return {
    network: p.config.name,
    containerId: p.containerId,
    ifName: p.ifName,
    netns: p.netns || undefined,
    podNamespace: p.args.K8S_POD_NAMESPACE,
    podName: p.args.K8S_POD_NAME,
  };
}

/** Validates the `ipam` section; every error names the field. */
export function parseIpamConf(config: Json): IpamConf {
  const ipam = config.ipam as Json | undefined;
  if (!ipam || typeof ipam !== 'object' || Array.isArray(ipam)) throw new TetherError(ErrorCode.InvalidConfig, 'ipam: missing or not an object');
  if (typeof ipam.pool !== 'string' || !ipam.pool) throw new TetherError(ErrorCode.InvalidConfig, 'ipam.pool: missing or not a string (name an AddressPool of usage "pod")');
  const routes: IpamConf['routes'] = [];
  if (ipam.routes !== undefined) {
    if (!Array.isArray(ipam.routes)) throw new TetherError(ErrorCode.InvalidConfig, 'ipam.routes: must be an array');
    ipam.routes.forEach((r: Json, i) => {
      if (!r || typeof r.dst !== 'string' || !parseCidr(r.dst)) throw new TetherError(ErrorCode.InvalidConfig, `ipam.routes[${i}].dst: ${JSON.stringify(r?.dst)} is not a CIDR`);
      if (r.gw !== undefined && (typeof r.gw !== 'string' || !parseIp(r.gw))) throw new TetherError(ErrorCode.InvalidConfig, `ipam.routes[${i}].gw: ${JSON.stringify(r.gw)} is not an IP address`);
      routes.push({ dst: r.dst, ...(r.gw ? { gw: r.gw as string } : {}) });
    });
  }
  if (ipam.dns !== undefined && (typeof ipam.dns !== 'object' || ipam.dns === null)) throw new TetherError(ErrorCode.InvalidConfig, 'ipam.dns: must be an object');
  return { pool: ipam.pool, routes, dns: ipam.dns as Json | undefined };
}

/** The IPAM result in the config's CNI version. */
export function ipamResult(alloc: PodAllocation, conf: IpamConf, cniVersion: string): Json {
  const legacy = cniVersion.startsWith('0.');
  const out: Json = {
    cniVersion,
    ips: alloc.ips.map((ip) => ({
      ...(legacy ? { version: String(ip.family) } : {}),
      address: `${ip.address}/${ip.prefix}`,
      gateway: ip.gateway,
    })),
  };
  if (conf.routes.length) out.routes = conf.routes;
  out.dns = conf.dns ?? {};
  return out;
}
